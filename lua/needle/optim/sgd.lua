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
-- one's, cpu_optim.c) with -lr read from a 0-dim tensor that a hook
-- refreshes before every replay: a scheduler can change lr without a retrace.
local function compiled_neg_lr(self, group, p)
  self._compiled_lr = self._compiled_lr or setmetatable({}, {__mode = "k"})
  local per_group = self._compiled_lr[group] or {}
  self._compiled_lr[group] = per_group
  local key = p.dtype .. "@" .. p.device
  local t = per_group[key]
  local was = core._graph_pause(true) -- made and filled outside the graph
  local ok, err = pcall(function()
    if t == nil then
      t = core.full({}, 0, {dtype = p.dtype, device = p.device})
      per_group[key] = t
    end
    t:fill_(-group.lr)
  end)
  core._graph_pause(was)
  if not ok then error(err, 0) end
  if not per_group[key .. "#hooked"] or per_group[key .. "#hooked"] ~= capture.active then
    per_group[key .. "#hooked"] = capture.active
    capture.on_replay(function() t:fill_(-group.lr) end)
  end
  return t
end

return Optimizer:extend{
  name = "SGD",
  defaults = {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
              maximize = false},
  state_keys = {momentum_buffer = "tensor"},
  capturable = true,
  dynamic = {lr = true},
  check = function(g, fail)
    if g.momentum < 0 then fail(("invalid momentum %s (expected >= 0)"):format(fmt(g.momentum))) end
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
            buf:mul_(momentum)
            buf:add_(dampening ~= 0 and g * (1 - dampening) or g)
          end
          if nesterov then g = g + buf * momentum else g = buf end
        end
        p:add_(g * (capture.active and compiled_neg_lr(self, group, p) or -lr))
      end
    end
  end,
}
