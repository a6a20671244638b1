-- needle.optim.lr_scheduler.ReduceLROnPlateau (PyTorch's, same rules): lower
-- the learning rates when a metric has stopped improving.
--
--   local sched = nd.optim.lr_scheduler.ReduceLROnPlateau(opt, {patience = 5})
--   for epoch = 1, 100 do train(); sched:step(validation_loss) end
--
-- step(metric) (a number or a one-element tensor): when the metric is not
-- better than the best so far (by threshold, relative or absolute) for more
-- than patience steps, every group's lr becomes max(lr * factor, min_lr),
-- unless that changes it by eps or less; cooldown steps follow in which bad
-- steps are not counted.
local B = require "needle.optim.lr_scheduler_base"
local core = require "needle.core"
local errors = require "needle.errors"

local fmt, deepcopy, is_int = B.fmt, B.deepcopy, B.is_int

local M = {}

local ReduceLROnPlateau = B.class("ReduceLROnPlateau", {no_last_epoch = true, options = {
  mode = "min", factor = 0.1, patience = 10, threshold = 1e-4, threshold_mode = "rel", cooldown = 0,
  min_lr = 0, eps = 1e-8}})
M.ReduceLROnPlateau = ReduceLROnPlateau

-- t: the scheduler, or a state dict about to be loaded
local function check_mode(self, t)
  if t.mode ~= "min" and t.mode ~= "max" then
    self:_error(("mode must be \"min\" or \"max\", got %s"):format(fmt(t.mode)))
  end
  if t.threshold_mode ~= "rel" and t.threshold_mode ~= "abs" then
    self:_error(("threshold_mode must be \"rel\" or \"abs\", got %s"):format(fmt(t.threshold_mode)))
  end
end

function ReduceLROnPlateau:_init()
  B.check_number(self, "factor", self.factor, 0, false, 1, true)
  check_mode(self, self)
  for _, k in ipairs({"patience", "cooldown"}) do
    if not is_int(self[k]) or self[k] < 0 then
      self:_error(("%s must be an integer >= 0, got %s"):format(k, fmt(self[k])))
    end
  end
  B.check_nonneg(self, "threshold", self.threshold)
  B.check_nonneg(self, "eps", self.eps)
  self.min_lrs = B.per_group(self, "min_lr", self.min_lr)
  self.min_lr = nil
  for i, v in ipairs(self.min_lrs) do
    B.check_nonneg(self, #self.min_lrs > 1 and ("min_lr[%d]"):format(i) or "min_lr", v)
  end
  self.last_epoch = 0
  self._last_lr = B.current_lrs(self)
  self:_reset()
end

-- the worst value of the metric: every first value is better
function ReduceLROnPlateau:_mode_worse()
  return self.mode == "min" and math.huge or -math.huge
end

function ReduceLROnPlateau:_reset()
  self.best = self:_mode_worse()
  self.cooldown_counter = 0
  self.num_bad_epochs = 0
end

function ReduceLROnPlateau:is_better(a, best)
  local th = self.threshold
  if self.mode == "min" then
    if self.threshold_mode == "rel" then return a < best * (1 - th) end
    return a < best - th
  end
  if self.threshold_mode == "rel" then return a > best * (th + 1) end
  return a > best + th
end

function ReduceLROnPlateau:_reduce_lr()
  for i, g in ipairs(self.optimizer.param_groups) do
    local old = g.lr
    local new = math.max(old * self.factor, self.min_lrs[i])
    if old - new > self.eps then g.lr = new end
  end
end

-- sched:step(metric[, epoch])
function ReduceLROnPlateau:step(metric, epoch)
  local current = metric
  if core.is_tensor(metric) and metric:numel() == 1 then current = metric:item() end
  if type(current) ~= "number" then
    self:_error(("step needs the metric (a number or a one-element tensor), got %s"):format(
      core.is_tensor(metric) and "a tensor of shape " .. errors.shape_str(metric) or type(metric)))
  end
  if epoch == nil then
    epoch = self.last_epoch + 1
  elseif not is_int(epoch) then
    self:_error(("epoch must be an integer, got %s"):format(fmt(epoch)))
  end
  self.last_epoch = epoch
  if self:is_better(current, self.best) then
    self.best = current
    self.num_bad_epochs = 0
  else
    self.num_bad_epochs = self.num_bad_epochs + 1
  end
  if self.cooldown_counter > 0 then
    self.cooldown_counter = self.cooldown_counter - 1
    self.num_bad_epochs = 0 -- bad epochs in the cooldown do not count
  end
  if self.num_bad_epochs > self.patience then
    self:_reduce_lr()
    self.cooldown_counter = self.cooldown
    self.num_bad_epochs = 0
  end
  self._last_lr = B.current_lrs(self)
end

function ReduceLROnPlateau:get_lr()
  self:_error("has no get_lr (its rates follow the metric); use get_last_lr()")
end

-- the fields of state_dict(), besides the optimizer
local FIELDS = {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "eps", "min_lrs",
                "best", "num_bad_epochs", "cooldown_counter", "last_epoch", "_last_lr"}

function ReduceLROnPlateau:load_state_dict(sd)
  if type(sd) ~= "table" then
    self:_error(("load_state_dict: expected a table, got %s"):format(type(sd)))
  end
  for _, k in ipairs(FIELDS) do
    if sd[k] == nil then
      self:_error(("load_state_dict: the table has no %s (not a ReduceLROnPlateau state)"):format(k))
    end
  end
  if #sd.min_lrs ~= #self.optimizer.param_groups then
    self:_error(("load_state_dict: the state has %d min_lrs, the optimizer %d parameter group(s)")
      :format(#sd.min_lrs, #self.optimizer.param_groups))
  end
  check_mode(self, sd)
  for _, k in ipairs(FIELDS) do self[k] = deepcopy(sd[k]) end
end

function ReduceLROnPlateau:__tostring()
  return ("ReduceLROnPlateau(mode=%s, best=%s, num_bad_epochs=%d, lr=%s)"):format(self.mode,
    fmt(self.best), self.num_bad_epochs, fmt(self._last_lr))
end

return M
