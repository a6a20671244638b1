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

local fused_step, zeros_like = core.sgd_step_, core.zeros_like

local fmt = Optimizer._fmt

return Optimizer:extend{
  name = "SGD",
  defaults = {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
              maximize = false},
  state_keys = {momentum_buffer = "tensor"},
  capturable = true,
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
      if g ~= nil and fused_step then
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
        p:add_(g * -lr)
      end
    end
  end,
}
