-- needle.optim.Adagrad (PyTorch's torch.optim.Adagrad, same update):
--   g = grad (negated when maximize) + weight_decay * p
--   clr = lr / (1 + (step - 1) * lr_decay)
--   sum = sum + g * g;  p = p - clr * g / (sqrt(sum) + eps)
-- The state (step 0, sum = initial_accumulator_value) is made at
-- construction, as PyTorch does.
local core = require "needle.core"
local Optimizer = require "needle.optim.optimizer"

local fmt = Optimizer._fmt
local full_like = core.full_like

return Optimizer:extend{
  name = "Adagrad",
  defaults = {lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10,
              maximize = false},
  state_keys = {step = "number", sum = "tensor"},
  check = function(g, fail)
    if g.lr_decay < 0 then fail(("invalid lr_decay %s (expected >= 0)"):format(fmt(g.lr_decay))) end
    if g.initial_accumulator_value < 0 then
      fail(("invalid initial_accumulator_value %s (expected >= 0)"):format(
        fmt(g.initial_accumulator_value)))
    end
  end,
  init_state = function(p, group)
    return {step = 0, sum = full_like(p, group.initial_accumulator_value)}
  end,
  update = function(self, group)
    local state = self.state
    local lr, lr_decay, eps, wd, maximize = group.lr, group.lr_decay, group.eps, group.weight_decay,
                                            group.maximize
    for _, p in ipairs(group.params) do
      local g = p.grad
      if g ~= nil then
        local st = state[p]
        if st == nil or st.sum == nil then
          st = {step = 0, sum = full_like(p, group.initial_accumulator_value)}
          state[p] = st
        end
        local step = st.step + 1
        st.step = step
        if maximize then g = -g end
        if wd ~= 0 then g = g + p * wd end
        local clr = lr / (1 + (step - 1) * lr_decay)
        local sum = st.sum
        sum:add_(g * g)
        local std = sum:sqrt():add_(eps)
        p:add_((g * -clr):div_(std))
      end
    end
  end,
}
