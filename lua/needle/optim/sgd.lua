-- needle.optim.SGD: stochastic gradient descent with momentum (PyTorch's
-- torch.optim.SGD, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   buf = g on the first step, else momentum * buf + (1 - dampening) * g
--   g = nesterov and g + momentum * buf or buf
--   p = p - lr * g
-- On the CPU (float32/float64, contiguous) the whole update of a parameter is
-- one fused pass (core.sgd_step_, needle.h nd_sgd_step_) with the same
-- roundings as the formulas above; elsewhere it is composed from tensor ops.
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local capture = require "needle.compile.state"

local fused_step, zeros_like = core.sgd_step_, core.zeros_like

local fmt = Optimizer._fmt

-- Under nd.compile the update is the composed one (bit for bit the fused
-- one's, cpu_optim.c) with -lr and the momentum read from 0-dim tensors that
-- a hook refreshes before every replay: a scheduler can change both (one-cycle
-- cycles the momentum) without a retrace. compiled_scalars -> {neg_lr, momentum}
local function compiled_scalars(self, group, p)
  self._compiled_scalars = self._compiled_scalars or setmetatable({}, {__mode = "k"})
  local per_group = self._compiled_scalars[group] or {}
  self._compiled_scalars[group] = per_group
  local key = p.dtype .. "@" .. p.device
  local f = per_group[key]
  local function refresh()
    f.neg_lr:fill_(-group.lr)
    f.momentum:fill_(group.momentum)
  end
  local was = core._graph_pause(true) -- made and filled outside the graph
  local ok, err = pcall(function()
    if f == nil then
      f = {neg_lr = core.full({}, 0, {dtype = p.dtype, device = p.device}),
           momentum = core.full({}, 0, {dtype = p.dtype, device = p.device})}
      per_group[key] = f
    end
    refresh()
  end)
  core._graph_pause(was)
  if not ok then error(err, 0) end
  if f.hooked ~= capture.active then -- one hook per capture
    f.hooked = capture.active
    capture.on_replay(refresh)
    -- whether there is momentum at all shapes the graph: that retraces
    capture.guard(function() return group.momentum ~= 0 end)
  end
  return f
end

return Optimizer:extend{
  name = "SGD",
  defaults = {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
              maximize = false},
  state_keys = {momentum_buffer = "tensor"},
  capturable = true,
  dynamic = {lr = true, momentum = true},
  check = function(g, fail)
    if g.momentum < 0 or g.momentum > 1 then
      fail(("invalid momentum %s (expected 0 <= momentum <= 1)"):format(fmt(g.momentum)))
    end
    if g.dampening < 0 or g.dampening > 1 then
      fail(("invalid dampening %s (expected 0 <= dampening <= 1)"):format(fmt(g.dampening)))
    end
    if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
      fail(("nesterov momentum requires a momentum > 0 and zero dampening (got momentum %s, " ..
            "dampening %s)"):format(fmt(g.momentum), fmt(g.dampening)))
    end
  end,
  update = function(self, group)
    local state = self.state
    local lr, momentum, dampening, wd = group.lr, group.momentum, group.dampening, group.weight_decay
    local nesterov, maximize = group.nesterov, group.maximize
    local hyper = {lr = lr, momentum = momentum, dampening = dampening, weight_decay = wd,
                   nesterov = nesterov, maximize = maximize, first = false}
    for _, p in ipairs(group.params) do
      local g = p.grad
      local done = false
      if g ~= nil and fused_step and not capture.active then
        local st, buf
        hyper.first = false
        if momentum ~= 0 then
          st = state[p]
          buf = st and st.momentum_buffer
          if buf == nil then
            self:_refuse_fresh_state()
            buf, hyper.first = zeros_like(p), true
          end
        end
        done = fused_step(p, g, buf, hyper)
        if done and hyper.first then
          if st == nil then st = {}; state[p] = st end
          st.momentum_buffer = buf
        end
      end
      if g ~= nil and not done then
        local f = capture.active and compiled_scalars(self, group, p)
        if maximize then g = -g end
        if wd ~= 0 then g = g + p * wd end
        if momentum ~= 0 then
          local st = state[p]
          if st == nil then st = {}; state[p] = st end
          local buf = st.momentum_buffer
          if buf == nil then
            self:_refuse_fresh_state()
            buf = g:clone()
            st.momentum_buffer = buf
          else
            buf:mul_(f and f.momentum or momentum)
            buf:add_(dampening ~= 0 and g * (1 - dampening) or g)
          end
          if nesterov then g = g + buf * (f and f.momentum or momentum) else g = buf end
        end
        p:add_(g * (f and f.neg_lr or -lr))
      end
    end
  end,
}
