-- needle.optim: optimizers and learning-rate schedulers (PyTorch's torch.optim).
--
--   local opt = nd.optim.Adam(model:parameters(), {lr = 1e-3, weight_decay = 1e-4})
--   local sched = nd.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
--   opt:zero_grad(); loss:backward(); opt:step(); sched:step()
--
-- See docs/optim.md.
return {
  Optimizer = require "needle.optim.optimizer",
  SGD = require "needle.optim.sgd",
  Adam = require("needle.optim.adam").Adam,
  AdamW = require "needle.optim.adamw",
  RMSprop = require "needle.optim.rmsprop",
  Adagrad = require "needle.optim.adagrad",
  Adadelta = require "needle.optim.adadelta",
  Adamax = require "needle.optim.adamax",
  NAdam = require "needle.optim.nadam",
  RAdam = require "needle.optim.radam",
  LBFGS = require "needle.optim.lbfgs",
  lr_scheduler = require "needle.optim.lr_scheduler",
}
