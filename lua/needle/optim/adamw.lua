-- needle.optim.AdamW: Adam with decoupled weight decay (PyTorch's
-- torch.optim.AdamW): p = p * (1 - lr * weight_decay), then Adam's update
-- without weight decay in the gradient. weight_decay defaults to 1e-2.
local Optimizer = require "needle.optim.optimizer"
local adam = require "needle.optim.adam"

return Optimizer:extend{
  name = "AdamW",
  defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2, amsgrad = false,
              maximize = false},
  state_keys = adam.state_keys,
  check = adam.check,
  dynamic = {lr = true, betas = true},
  capturable = true,
  update = function(self, group) return adam.update(self, group, true) end,
}
