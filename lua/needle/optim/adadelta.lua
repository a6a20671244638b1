-- needle.optim.Adadelta (PyTorch's torch.optim.Adadelta, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   s = rho * s + (1 - rho) * g * g
--   delta = sqrt(a + eps) / sqrt(s + eps) * g
--   a = rho * a + (1 - rho) * delta * delta
--   p -= lr * delta
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"

local fmt = Optimizer._fmt
local zeros_like = core.zeros_like

return Optimizer:extend{
  name = "Adadelta",
  defaults = {lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0, maximize = false},
  state_keys = {step = "number", square_avg = "tensor", acc_delta = "tensor"},
  check = function(g, fail)
    if not (g.rho >= 0 and g.rho <= 1) then
      fail(("invalid rho %s (expected 0 <= rho <= 1)"):format(fmt(g.rho)))
    end
  end,
  update = function(self, group)
    local lr, rho, eps = group.lr, group.rho, group.eps
    self:each_param(group, function(p) return {square_avg = zeros_like(p), acc_delta = zeros_like(p)} end,
      function(p, g, st)
        local s, a = st.square_avg, st.acc_delta
        s:mul_(rho):add_((g * (1 - rho)):mul_(g))
        local delta = (a + eps):sqrt():div_((s + eps):sqrt()):mul_(g)
        a:mul_(rho):add_((delta * (1 - rho)):mul_(delta))
        p:add_(delta * -lr)
      end)
  end,
}
