-- needle.optim.SGD: stochastic gradient descent with momentum (PyTorch's
-- torch.optim.SGD, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   buf = g on the first step, else momentum * buf + (1 - dampening) * g
--   g = nesterov and g + momentum * buf or buf
--   p = p - lr * g
local Optimizer = require "needle.optim.optimizer"

local fmt = Optimizer._fmt

return Optimizer:extend{
  name = "SGD",
  defaults = {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
              maximize = false},
  state_keys = {momentum_buffer = "tensor"},
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
    for _, p in ipairs(group.params) do
      local g = p.grad
      if g ~= nil then
        if maximize then g = -g end
        if wd ~= 0 then g = g + p * wd end
        if momentum ~= 0 then
          local st = state[p]
          if st == nil then st = {}; state[p] = st end
          local buf = st.momentum_buffer
          if buf == nil then
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
