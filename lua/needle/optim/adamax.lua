-- needle.optim.Adamax (PyTorch's torch.optim.Adamax, same update): Adam with
-- the infinity norm in place of the second moment.
--   g = grad (negated when maximize) + weight_decay * p
--   m = beta1 * m + (1 - beta1) * g;  u = max(beta2 * u, |g| + eps)
--   p -= lr / (1 - beta1^t) * m / u
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local adam = require "needle.optim.adam"

local maximum, zeros_like = core.maximum, core.zeros_like

return Optimizer:extend{
  name = "Adamax",
  defaults = {lr = 2e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, maximize = false},
  state_keys = {step = "number", exp_avg = "tensor", exp_inf = "tensor"},
  check = adam.check,
  update = function(self, group)
    local lr, eps = group.lr, group.eps
    local beta1, beta2 = group.betas[1], group.betas[2]
    self:each_param(group, function(p) return {exp_avg = zeros_like(p), exp_inf = zeros_like(p)} end,
      function(p, g, st, step)
        local m, u = st.exp_avg, st.exp_inf
        m:mul_(beta1):add_(g * (1 - beta1))
        u:copy_(maximum(u:mul_(beta2), g:abs():add_(eps)))
        p:add_((m * (-lr / (1 - beta1 ^ step))):div_(u))
      end)
  end,
}
