-- needle.optim.NAdam (PyTorch 2's torch.optim.NAdam, same update): Adam with
-- Nesterov momentum and a momentum schedule.
--   g = grad (negated when maximize); weight decay: p *= 1 - lr * wd when
--   decoupled_weight_decay, else g += wd * p
--   mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)), mu_{t+1} likewise
--   mu_product *= mu_t
--   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
--   denom = sqrt(v / (1 - beta2^t)) + eps
--   p -= lr * (1 - mu_t) / (1 - mu_product) * g / denom
--      + lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom
-- mu_product lives in the state as a number (PyTorch: a 0-dim tensor).
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"
local adam = require "needle.optim.adam"

local fmt = Optimizer._fmt
local zeros_like = core.zeros_like

return Optimizer:extend{
  name = "NAdam",
  defaults = {lr = 2e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, momentum_decay = 4e-3,
              decoupled_weight_decay = false, maximize = false},
  state_keys = {step = "number", mu_product = "number", exp_avg = "tensor", exp_avg_sq = "tensor"},
  check = function(g, fail)
    adam.check(g, fail)
    if g.momentum_decay < 0 then
      fail(("invalid momentum_decay %s (expected >= 0)"):format(fmt(g.momentum_decay)))
    end
  end,
  update = function(self, group)
    local lr, eps = group.lr, group.eps
    local beta1, beta2, psi = group.betas[1], group.betas[2], group.momentum_decay
    self:each_param(group, function(p) return {mu_product = 1, exp_avg = zeros_like(p), exp_avg_sq = zeros_like(p)} end,
      function(p, g, st, step)
        local mu = beta1 * (1 - 0.5 * 0.96 ^ (step * psi))
        local mu_next = beta1 * (1 - 0.5 * 0.96 ^ ((step + 1) * psi))
        local mu_product = st.mu_product * mu
        st.mu_product = mu_product
        local m, v = st.exp_avg, st.exp_avg_sq
        m:mul_(beta1):add_(g * (1 - beta1))
        v:mul_(beta2):add_((g * (1 - beta2)):mul_(g))
        local denom = (v / (1 - beta2 ^ step)):sqrt():add_(eps)
        p:add_((g * (-lr * (1 - mu) / (1 - mu_product))):div_(denom))
        p:add_((m * (-lr * mu_next / (1 - mu_product * mu_next))):div_(denom))
      end)
  end,
}
