-- nd.optim: the optimizers and lr schedulers of issue 20 (spec/optim_extra_spec.lua
-- has the rest of their errors)
return function(nd)
  local optim, S = nd.optim, nd.optim.lr_scheduler
  local W = nd.tensor({1.0, 2.0}, {requires_grad = true})
  local function sgd() return optim.SGD({W}, {lr = 0.1, momentum = 0.9}) end
  return {rest = {
    {"optim.NAdam", "betas, decoupled_weight_decay, eps, lr, maximize, momentum_decay, weight_decay",
     function(o) return optim.NAdam({W}, o) end},
    {"optim.RAdam", "betas, decoupled_weight_decay, eps, lr, maximize, weight_decay",
     function(o) return optim.RAdam({W}, o) end},
    {"optim.Adamax", "betas, eps, lr, maximize, weight_decay", function(o) return optim.Adamax({W}, o) end},
    {"optim.Adadelta", "eps, lr, maximize, rho, weight_decay", function(o) return optim.Adadelta({W}, o) end},
    {"optim.LBFGS", "history_size, line_search_fn, lr, max_eval, max_iter, tolerance_change, tolerance_grad",
     function(o) return optim.LBFGS({W}, o) end},
    {"optim.lr_scheduler.ConstantLR", "factor, last_epoch, total_iters",
     function(o) return S.ConstantLR(sgd(), o) end},
    {"optim.lr_scheduler.PolynomialLR", "last_epoch, power, total_iters",
     function(o) return S.PolynomialLR(sgd(), o) end},
    {"optim.lr_scheduler.CosineAnnealingWarmRestarts", "T_0, T_mult, eta_min, last_epoch",
     function(o) return S.CosineAnnealingWarmRestarts(sgd(), 3, o) end},
    {"optim.lr_scheduler.CyclicLR", "base_lr, base_momentum, cycle_momentum, gamma, last_epoch, max_lr, " ..
     "max_momentum, mode, scale_fn, scale_mode, step_size_down, step_size_up",
     function(o) return S.CyclicLR(sgd(), 0.01, 0.1, o) end},
    {"optim.lr_scheduler.ReduceLROnPlateau", "cooldown, eps, factor, min_lr, mode, patience, threshold, " ..
     "threshold_mode", function(o) return S.ReduceLROnPlateau(sgd(), o) end},
  }}
end
