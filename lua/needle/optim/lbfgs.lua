-- needle.optim.LBFGS (PyTorch's torch.optim.LBFGS, the same algorithm step
-- for step, so trajectories match PyTorch's): limited-memory BFGS over all
-- parameters as one flat vector, with a fixed step (lr) or PyTorch's
-- strong-Wolfe line search (needle.optim.line_search).
--
--   local opt = nd.optim.LBFGS(model:parameters(), {line_search_fn = "strong_wolfe"})
--   opt:step(function()
--     opt:zero_grad()
--     local loss = loss_fn(model(x), y)
--     loss:backward()
--     return loss
--   end)
--
-- step(closure) runs up to max_iter iterations (max_eval evaluations of the
-- closure) and returns the loss of the first evaluation. One parameter group
-- only, as PyTorch. Its state (the direction d, the step t, the history
-- old_dirs / old_stps / ro, H_diag, prev_flat_grad, prev_loss, func_evals,
-- n_iter) lives in the state of the first parameter, as PyTorch keeps it; the
-- flat vectors hold one value per element of all parameters.
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local capture = require "needle.compile.state"
local errors = require "needle.errors"
local line_search = require "needle.optim.line_search"

local fmt = Optimizer._fmt
local is_tensor = core.is_tensor

local function is_int(v) return type(v) == "number" and math.tointeger(v) ~= nil end

local function dot(a, b) return (a * b):sum():item() end
local function abs_max(v) return v:abs():max():item() end

local LBFGS = Optimizer:extend{
  name = "LBFGS",
  defaults = {lr = 1, max_iter = 20, max_eval = 25, tolerance_grad = 1e-7, tolerance_change = 1e-9,
              history_size = 100, line_search_fn = false},
  -- line_search_fn is nil/false (PyTorch's None) or "strong_wolfe": checked below
  untyped = {line_search_fn = true},
  state_keys = {func_evals = "number", n_iter = "number", d = "flat", t = "number",
                old_dirs = "flat_list", old_stps = "flat_list", ro = "number_list", H_diag = "number",
                prev_flat_grad = "flat", prev_loss = "number", al = "ignored"},
  check = function(g, fail)
    for _, k in ipairs({"max_iter", "max_eval", "history_size"}) do
      if not is_int(g[k]) or g[k] < 1 then
        fail(("%s must be a positive integer, got %s"):format(k, fmt(g[k])))
      end
    end
    local ls = g.line_search_fn
    if ls ~= nil and ls ~= false and ls ~= "strong_wolfe" then
      fail(("line_search_fn must be nil or \"strong_wolfe\" (the only line search), got %s"):format(fmt(ls)))
    end
  end,
  update = function() end, -- step is LBFGS's own
}

-- LBFGS(params, {lr = 1, max_iter = 20, max_eval = max_iter * 5 // 4,
-- tolerance_grad = 1e-7, tolerance_change = 1e-9, history_size = 100,
-- line_search_fn = nil})
function LBFGS.new(cls, params, opts)
  if type(opts) == "table" and getmetatable(opts) == nil and opts.max_eval == nil then
    local copy = {}
    for k, v in pairs(opts) do copy[k] = v end
    local max_iter = opts.max_iter == nil and 20 or opts.max_iter
    if is_int(max_iter) then copy.max_eval = max_iter * 5 // 4 end
    opts = copy
  end
  local self = Optimizer.new(cls, params, opts)
  if #self.param_groups ~= 1 then
    self:_error(("LBFGS doesn't support per-parameter options (parameter groups): got %d groups"):format(
      #self.param_groups))
  end
  local p1 = self.param_groups[1].params[1]
  for i, p in ipairs(self.param_groups[1].params) do
    if p.device ~= p1.device or p.dtype ~= p1.dtype then
      self:_error(("all parameters must have one device and dtype (they form one flat vector): " ..
                   "params[1] is %s on %s, params[%d] %s on %s"):format(p1.dtype, p1.device, i, p.dtype,
                                                                      p.device))
    end
  end
  return self
end

function LBFGS:add_param_group()
  self:_error("LBFGS doesn't support per-parameter options (parameter groups)")
end

local function params_of(self) return self.param_groups[1].params end

-- all gradients as one flat vector (zeros for a parameter without one)
local function gather_flat_grad(self)
  local views = {}
  for i, p in ipairs(params_of(self)) do
    local g = p.grad
    views[i] = g ~= nil and g:reshape({-1}) or core.zeros({p:numel()}, {dtype = p.dtype, device = p.device})
  end
  -- cat copies; a single parameter's gradient is copied too, as torch.cat would
  return #views == 1 and views[1]:clone() or core.cat(views, 1)
end

-- p += step * update (its slice of the flat vector)
local function add_grad(self, step, update)
  local offset = 0
  for _, p in ipairs(params_of(self)) do
    local n = p:numel()
    p:add_(update:narrow(1, offset + 1, n):view(p.shape) * step)
    offset = offset + n
  end
end

local function clone_params(self)
  local out = {}
  for i, p in ipairs(params_of(self)) do out[i] = p:clone() end
  return out
end

local function set_params(self, values)
  for i, p in ipairs(params_of(self)) do p:copy_(values[i]) end
end

-- the closure's loss as a Lua number (it may return a tensor or a number)
local function loss_number(self, loss)
  if is_tensor(loss) then
    if loss:numel() ~= 1 then
      self:_error(("the closure must return the loss (one number), got a tensor of shape %s"):format(
        errors.shape_str(loss)))
    end
    return loss:item()
  elseif type(loss) ~= "number" then
    self:_error(("the closure must return the loss (a tensor or a number), got %s"):format(type(loss)))
  end
  return loss
end

-- opt:step(closure): up to max_iter L-BFGS iterations; returns the loss of
-- the closure's first evaluation (what it returned)
function LBFGS:step(closure)
  if not (type(closure) == "function" or (getmetatable(closure) or {}).__call) then
    self:_error(("step needs a closure that re-evaluates the model and returns the loss, got %s"):format(
      type(closure)))
  end
  if capture.active then
    errors.fail("optim.LBFGS", "cannot step inside nd.compile (it calls the closure and reads back " ..
                "scalars every iteration)")
  end
  local function evaluate() return core.enable_grad(closure) end
  return core.no_grad(function()
    local group = self.param_groups[1]
    local lr, max_iter, max_eval = group.lr, group.max_iter, group.max_eval
    local tolerance_grad, tolerance_change = group.tolerance_grad, group.tolerance_change
    local line_search_fn, history_size = group.line_search_fn, group.history_size

    -- the state is kept on the first parameter, as PyTorch does
    local p1 = params_of(self)[1]
    local state = self.state[p1]
    if state == nil then state = {}; self.state[p1] = state end
    state.func_evals = state.func_evals or 0
    state.n_iter = state.n_iter or 0

    -- the loss and gradient at the start
    local orig_loss = evaluate()
    local loss = loss_number(self, orig_loss)
    local current_evals = 1
    state.func_evals = state.func_evals + 1
    local flat_grad = gather_flat_grad(self)
    local opt_cond = abs_max(flat_grad) <= tolerance_grad
    if opt_cond then return orig_loss end -- already optimal

    local d, t = state.d, state.t
    local old_dirs, old_stps, ro = state.old_dirs, state.old_stps, state.ro
    local H_diag, prev_flat_grad, prev_loss = state.H_diag, state.prev_flat_grad, state.prev_loss

    local n_iter = 0
    while n_iter < max_iter do
      n_iter = n_iter + 1
      state.n_iter = state.n_iter + 1

      -- the descent direction
      if state.n_iter == 1 then
        d = -flat_grad
        old_dirs, old_stps, ro = {}, {}, {}
        H_diag = 1
      else
        -- update the memory
        local y = flat_grad - prev_flat_grad
        local s = d * t
        local ys = dot(y, s)
        if ys > 1e-10 then
          if #old_dirs == history_size then -- forget the oldest pair
            table.remove(old_dirs, 1)
            table.remove(old_stps, 1)
            table.remove(ro, 1)
          end
          old_dirs[#old_dirs + 1] = y
          old_stps[#old_stps + 1] = s
          ro[#ro + 1] = 1 / ys
          -- the scale of the initial inverse Hessian
          H_diag = ys / dot(y, y)
        end
        -- the two-loop recursion: d = -H g
        local num_old = #old_dirs
        local al = {}
        local q = -flat_grad
        for i = num_old, 1, -1 do
          al[i] = dot(old_stps[i], q) * ro[i]
          q:add_(old_dirs[i] * -al[i])
        end
        local r = q * H_diag
        d = r
        for i = 1, num_old do
          local be_i = dot(old_dirs[i], r) * ro[i]
          r:add_(old_stps[i] * (al[i] - be_i))
        end
      end

      if prev_flat_grad == nil then prev_flat_grad = flat_grad:clone() else prev_flat_grad:copy_(flat_grad) end
      prev_loss = loss

      -- the step length: a guess from the gradient's size on the first iteration
      if state.n_iter == 1 then
        t = math.min(1, 1 / flat_grad:abs():sum():item()) * lr
      else
        t = lr
      end

      local gtd = dot(flat_grad, d) -- the directional derivative
      if gtd > -tolerance_change then break end -- below the tolerance

      local ls_func_evals = 0
      if line_search_fn == "strong_wolfe" then
        local x_init = clone_params(self)
        local function obj_func(x, step, dir)
          add_grad(self, step, dir)
          local f = loss_number(self, evaluate())
          local g = gather_flat_grad(self)
          set_params(self, x)
          return f, g
        end
        loss, flat_grad, t, ls_func_evals = line_search.strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd)
        add_grad(self, t, d)
        opt_cond = abs_max(flat_grad) <= tolerance_grad
      else
        -- a fixed step; the loss is evaluated again except after the last
        -- iteration (in a stochastic setting it would be of no use)
        add_grad(self, t, d)
        if n_iter ~= max_iter then
          loss = loss_number(self, evaluate())
          flat_grad = gather_flat_grad(self)
          opt_cond = abs_max(flat_grad) <= tolerance_grad
          ls_func_evals = 1
        end
      end
      current_evals = current_evals + ls_func_evals
      state.func_evals = state.func_evals + ls_func_evals

      -- the conditions to stop
      if n_iter == max_iter then break end
      if current_evals >= max_eval then break end
      if opt_cond then break end
      if abs_max(d * t) <= tolerance_change then break end -- lack of progress
      if math.abs(loss - prev_loss) < tolerance_change then break end
    end

    state.d, state.t = d, t
    state.old_dirs, state.old_stps, state.ro = old_dirs, old_stps, ro
    state.H_diag, state.prev_flat_grad, state.prev_loss = H_diag, prev_flat_grad, prev_loss
    return orig_loss
  end)
end

return LBFGS
