-- needle.optim.RMSprop (PyTorch's torch.optim.RMSprop, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   s = alpha * s + (1 - alpha) * g * g
--   centered: a = alpha * a + (1 - alpha) * g;  avg = sqrt(s - a * a) + eps
--   otherwise avg = sqrt(s) + eps
--   momentum > 0: buf = momentum * buf + g / avg;  p = p - lr * buf
--   otherwise p = p - lr * g / avg
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"

local fmt = Optimizer._fmt
local zeros_like = core.zeros_like

return Optimizer:extend{
  name = "RMSprop",
  defaults = {lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = false,
              maximize = false},
  state_keys = {step = "number", square_avg = "tensor", momentum_buffer = "tensor",
                grad_avg = "tensor"},
  check = function(g, fail)
    if g.momentum < 0 or g.momentum > 1 then
      fail(("invalid momentum %s (expected 0 <= momentum <= 1)"):format(fmt(g.momentum)))
    end
    if g.alpha < 0 or g.alpha > 1 then fail(("invalid alpha %s (expected 0 <= alpha <= 1)"):format(fmt(g.alpha))) end
  end,
  update = function(self, group)
    local state = self.state
    local lr, alpha, eps, wd = group.lr, group.alpha, group.eps, group.weight_decay
    local momentum, centered, maximize = group.momentum, group.centered, group.maximize
    for _, p in ipairs(group.params) do
      local g = p.grad
      if g ~= nil then
        local st = state[p]
        if st == nil or st.square_avg == nil then
          st = {step = 0, square_avg = zeros_like(p)}
          state[p] = st
        end
        if momentum > 0 and st.momentum_buffer == nil then st.momentum_buffer = zeros_like(p) end
        if centered and st.grad_avg == nil then st.grad_avg = zeros_like(p) end
        st.step = st.step + 1
        if maximize then g = -g end
        if wd ~= 0 then g = g + p * wd end
        local sq = st.square_avg
        sq:mul_(alpha):add_((g * (1 - alpha)):mul_(g))
        local avg
        if centered then
          local ga = st.grad_avg
          ga:mul_(alpha):add_(g * (1 - alpha))
          avg = (sq - ga * ga):sqrt()
        else
          avg = sq:sqrt()
        end
        avg:add_(eps)
        if momentum > 0 then
          local buf = st.momentum_buffer
          buf:mul_(momentum):add_(g / avg)
          p:add_(buf * -lr)
        else
          p:add_((g * -lr):div_(avg))
        end
      end
    end
  end,
}
