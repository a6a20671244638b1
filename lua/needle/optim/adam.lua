-- needle.optim.Adam (PyTorch's torch.optim.Adam, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
--   vmax = max(vmax, v) with amsgrad (v below is then vmax)
--   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
-- AdamW (needle.optim.adamw) shares this update with decoupled weight decay.
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local capture = require "needle.compile.state"
local errors = require "needle.errors"

local fmt = Optimizer._fmt
local sqrt, maximum, zeros_like = math.sqrt, core.maximum, core.zeros_like
local fused_step = core.adam_step_

local M = {}

function M.check(g, fail)
  local b = g.betas
  if type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    fail(("betas must be a table of two numbers, got %s"):format(fmt(b)))
  end
  if not (b[1] >= 0 and b[1] < 1) then
    fail(("invalid beta parameter at index 1: %s (expected 0 <= beta < 1)"):format(fmt(b[1])))
  end
  if not (b[2] >= 0 and b[2] < 1) then
    fail(("invalid beta parameter at index 2: %s (expected 0 <= beta < 1)"):format(fmt(b[2])))
  end
end

M.state_keys = {step = "number", exp_avg = "tensor", exp_avg_sq = "tensor", max_exp_avg_sq = "tensor"}

-- Under nd.compile the per-step factors (which change with the step count,
-- the lr and the betas, which one-cycle cycles) are 0-dim tensors on the parameter's device, refreshed before
-- every replay by a hook that also advances st.step, exactly as an eager
-- step would: the recorded kernels read the tensors, never a constant.
local function scalar_like(p)
  return core.full({}, 0, {dtype = p.dtype, device = p.device})
end

local function compiled_factors(st, p, group, decoupled)
  if st._captured_by == capture.active then
    errors.fail("optim.Adam", "two steps of one parameter in one compiled call: a replay would "
                .. "give both the factors of the last (step once per compiled call)")
  end
  st._captured_by = capture.active
  local was = core._graph_pause(true) -- made and filled outside the graph
  local f = st._compiled
  if f == nil then
    local ok, made = pcall(function()
      return {step_size = scalar_like(p), bc2_sqrt = scalar_like(p), decay = scalar_like(p),
              beta1 = scalar_like(p), one_minus_beta1 = scalar_like(p), beta2 = scalar_like(p),
              one_minus_beta2 = scalar_like(p)}
    end)
    if not ok then core._graph_pause(was); error(made, 0) end
    f = made
    st._compiled = f
  end
  local function refresh()
    local lr, beta1, beta2, step = group.lr, group.betas[1], group.betas[2], st.step
    f.step_size:fill_(-(lr / (1 - beta1 ^ step)))
    f.bc2_sqrt:fill_(sqrt(1 - beta2 ^ step))
    f.beta1:fill_(beta1)
    f.one_minus_beta1:fill_(1 - beta1)
    f.beta2:fill_(beta2)
    f.one_minus_beta2:fill_(1 - beta2)
    if decoupled then f.decay:fill_(1 - lr * group.weight_decay) end
  end
  refresh()
  core._graph_pause(was)
  capture.on_replay(function()
    st.step = st.step + 1
    refresh()
  end, function() st.step = st.step - 1 end)
  return f
end

-- one step for one group; decoupled = true is AdamW
function M.update(self, group, decoupled)
  local state = self.state
  local lr, eps, wd, amsgrad, maximize = group.lr, group.eps, group.weight_decay, group.amsgrad,
                                         group.maximize
  local beta1, beta2 = group.betas[1], group.betas[2]
  for _, p in ipairs(group.params) do
    local g = p.grad
    if g ~= nil then
      local st = state[p]
      if st == nil or st.exp_avg == nil then
        self:_refuse_fresh_state()
        st = {step = 0, exp_avg = zeros_like(p), exp_avg_sq = zeros_like(p)}
        state[p] = st
      end
      if amsgrad and st.max_exp_avg_sq == nil then
        self:_refuse_fresh_state()
        st.max_exp_avg_sq = zeros_like(p)
      end
      local step = st.step + 1
      st.step = step
      local f = capture.active and compiled_factors(st, p, group, decoupled)
      -- eagerly (CPU, float, contiguous, without amsgrad) one fused pass with
      -- the roundings of the ops below: the same bits (cpu_optim.c)
      local done = false
      if fused_step and not f and not amsgrad then
        done = fused_step(p, g, st.exp_avg, st.exp_avg_sq, {
          beta1 = beta1, beta2 = beta2, one_minus_beta1 = 1 - beta1, one_minus_beta2 = 1 - beta2,
          eps = eps, weight_decay = wd, decay = 1 - lr * wd, step_size = -(lr / (1 - beta1 ^ step)),
          bc2_sqrt = sqrt(1 - beta2 ^ step), decoupled = decoupled == true, maximize = maximize == true})
      end
      if not done then
        if maximize then g = -g end
        if decoupled then
          if wd ~= 0 then p:mul_(f and f.decay or 1 - lr * wd) end
        elseif wd ~= 0 then
          g = g + p * wd
        end
        local m, v = st.exp_avg, st.exp_avg_sq
        m:mul_(f and f.beta1 or beta1):add_(g * (f and f.one_minus_beta1 or 1 - beta1))
        v:mul_(f and f.beta2 or beta2):add_((g * (f and f.one_minus_beta2 or 1 - beta2)):mul_(g))
        local step_size = lr / (1 - beta1 ^ step)
        local bc2_sqrt = sqrt(1 - beta2 ^ step)
        local denom
        if amsgrad then
          local vmax = st.max_exp_avg_sq
          vmax:copy_(maximum(vmax, v))
          denom = vmax:sqrt()
        else
          denom = v:sqrt()
        end
        denom:div_(f and f.bc2_sqrt or bc2_sqrt):add_(eps)
        p:add_((m * (f and f.step_size or -step_size)):div_(denom))
      end
    end
  end
end

M.Adam = Optimizer:extend{
  name = "Adam",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, amsgrad = false,
              maximize = false},
  state_keys = M.state_keys,
  check = M.check,
  dynamic = {lr = true, betas = true},
  capturable = true,
  update = function(self, group) return M.update(self, group, false) end,
}

return M
