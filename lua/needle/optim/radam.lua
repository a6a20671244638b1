-- needle.optim.RAdam (PyTorch 2's torch.optim.RAdam, same update): Adam with
-- the variance of the adaptive learning rate rectified.
--   g = grad (negated when maximize); weight decay: p *= 1 - lr * wd when
--   decoupled_weight_decay, else g += wd * p
--   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
--   rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)
--   rho_t > 5: r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
--              p -= lr * m / (1 - beta1^t) * r * sqrt(1 - beta2^t) / (sqrt(v) + eps)
--   otherwise  p -= lr * m / (1 - beta1^t)   (the first steps: SGD with momentum)
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local adam = require "needle.optim.adam"

local sqrt, zeros_like = math.sqrt, core.zeros_like

return Optimizer:extend{
  name = "RAdam",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0,
              decoupled_weight_decay = false, maximize = false},
  state_keys = {step = "number", exp_avg = "tensor", exp_avg_sq = "tensor"},
  check = adam.check,
  update = function(self, group)
    local lr, eps = group.lr, group.eps
    local beta1, beta2 = group.betas[1], group.betas[2]
    self:each_param(group, function(p) return {exp_avg = zeros_like(p), exp_avg_sq = zeros_like(p)} end,
      function(p, g, st, step)
        local m, v = st.exp_avg, st.exp_avg_sq
        m:mul_(beta1):add_(g * (1 - beta1))
        v:mul_(beta2):add_((g * (1 - beta2)):mul_(g))
        local bc1, bc2 = 1 - beta1 ^ step, 1 - beta2 ^ step
        local rho_inf = 2 / (1 - beta2) - 1
        local rho_t = rho_inf - 2 * step * beta2 ^ step / bc2
        local update = m / bc1
        if rho_t > 5 then
          local rect = sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
          update:mul_(lr * rect * sqrt(bc2)):div_(v:sqrt():add_(eps))
        else
          update:mul_(lr)
        end
        p:sub_(update)
      end)
  end,
}
