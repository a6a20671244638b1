-- needle.optim.lr_scheduler: learning-rate schedules (PyTorch's
-- torch.optim.lr_scheduler, the same recursive ("chainable") formulas, so the
-- learning rates match PyTorch's step for step).
--
--   local sched = nd.optim.lr_scheduler.StepLR(opt, 30, {gamma = 0.1})
--   for epoch = 1, 90 do train(); opt:step(); sched:step() end
--
-- Required arguments are positional, PyTorch's keyword arguments go in a
-- trailing options table (they may also all be given in the table:
-- StepLR(opt, {step_size = 30, gamma = 0.1}); a misspelt key there is named, and
-- an argument past the options table is refused). Constructing a scheduler sets
-- group.initial_lr (when last_epoch is -1) and performs the initial step
-- (last_epoch becomes 0). Every scheduler has step(), get_last_lr(),
-- state_dict() and load_state_dict(sd).
--
-- The base class and the checks are in needle.optim.lr_scheduler_base;
-- ReduceLROnPlateau is in lr_plateau.lua, CyclicLR and
-- CosineAnnealingWarmRestarts in lr_cyclic.lua (gathered here).
local B = require "needle.optim.lr_scheduler_base"

local fmt, deepcopy, is_int = B.fmt, B.deepcopy, B.is_int
local current_lrs, state_fields, per_group = B.current_lrs, B.state_fields, B.per_group
local check_number, check_positive_int, check_nonneg = B.check_number, B.check_positive_int, B.check_nonneg
local LRScheduler = B.LRScheduler
local cos, pi = math.cos, math.pi

local M = {LRScheduler = LRScheduler}

-- a scheduler class, registered as nd.optim.lr_scheduler.<name>
local function class(name, spec)
  local cls = B.class(name, spec)
  M[name] = cls
  return cls
end

-- StepLR(optimizer, step_size, {gamma = 0.1}) ----------------------------------
local StepLR = class("StepLR", {required = {"step_size"}, options = {gamma = 0.1}})

function StepLR:_init(last_epoch)
  check_positive_int(self, "step_size", self.step_size)
  check_nonneg(self, "gamma", self.gamma)
  self:_init_base(last_epoch)
end

function StepLR:get_lr()
  local e = self.last_epoch
  if e == 0 or e % self.step_size ~= 0 then return current_lrs(self) end
  local out = current_lrs(self)
  for i, lr in ipairs(out) do out[i] = lr * self.gamma end
  return out
end

function StepLR:_closed_form()
  local out = {}
  for i, b in ipairs(self.base_lrs) do out[i] = b * self.gamma ^ (self.last_epoch // self.step_size) end
  return out
end

-- MultiStepLR(optimizer, milestones, {gamma = 0.1}) ----------------------------
local MultiStepLR = class("MultiStepLR", {required = {"milestones"}, options = {gamma = 0.1}})

function MultiStepLR:_init(last_epoch)
  if type(self.milestones) ~= "table" then
    self:_error(("milestones must be a list of integers, got %s"):format(type(self.milestones)))
  end
  -- positive epochs, in increasing order; a repeated one decays gamma^count
  -- there (PyTorch's Counter)
  for i, m in ipairs(self.milestones) do
    if not is_int(m) then self:_error(("milestones[%d] is not an integer: %s"):format(i, fmt(m))) end
    if m < 1 then self:_error(("milestones[%d] must be a positive integer, got %s"):format(i, fmt(m))) end
    if i > 1 and m < self.milestones[i - 1] then
      self:_error(("milestones must be increasing, got %s"):format(fmt(self.milestones)))
    end
  end
  check_nonneg(self, "gamma", self.gamma)
  self:_init_base(last_epoch)
end

function MultiStepLR:get_lr()
  local count = 0
  for _, m in ipairs(self.milestones) do
    if m == self.last_epoch then count = count + 1 end
  end
  local out = current_lrs(self)
  if count == 0 then return out end
  for i, lr in ipairs(out) do out[i] = lr * self.gamma ^ count end
  return out
end

-- number of milestones <= e (bisect_right on the sorted list)
local function bisect_right(list, e)
  local n = 0
  for _, m in ipairs(list) do
    if m <= e then n = n + 1 end
  end
  return n
end

function MultiStepLR:_closed_form()
  local out = {}
  local k = bisect_right(self.milestones, self.last_epoch)
  for i, b in ipairs(self.base_lrs) do out[i] = b * self.gamma ^ k end
  return out
end

-- ExponentialLR(optimizer, gamma) -------------------------------------------------
local ExponentialLR = class("ExponentialLR", {required = {"gamma"}})

function ExponentialLR:_init(last_epoch)
  check_nonneg(self, "gamma", self.gamma)
  self:_init_base(last_epoch)
end

function ExponentialLR:get_lr()
  local out = current_lrs(self)
  if self.last_epoch == 0 then return out end
  for i, lr in ipairs(out) do out[i] = lr * self.gamma end
  return out
end

function ExponentialLR:_closed_form()
  local out = {}
  for i, b in ipairs(self.base_lrs) do out[i] = b * self.gamma ^ self.last_epoch end
  return out
end

-- CosineAnnealingLR(optimizer, T_max, {eta_min = 0}) ------------------------------
local CosineAnnealingLR = class("CosineAnnealingLR", {required = {"T_max"}, options = {eta_min = 0}})

function CosineAnnealingLR:_init(last_epoch)
  check_positive_int(self, "T_max", self.T_max)
  check_nonneg(self, "eta_min", self.eta_min)
  self:_init_base(last_epoch)
end

function CosineAnnealingLR:get_lr()
  local e, T, eta_min = self.last_epoch, self.T_max, self.eta_min
  local out = current_lrs(self)
  if e == 0 then return out end
  if self._step_count == 1 and e > 0 then
    for i, b in ipairs(self.base_lrs) do
      out[i] = eta_min + (b - eta_min) * (1 + cos(e * pi / T)) / 2
    end
  elseif (e - 1 - T) % (2 * T) == 0 then
    for i, b in ipairs(self.base_lrs) do
      out[i] = out[i] + (b - eta_min) * (1 - cos(pi / T)) / 2
    end
  else
    for i, lr in ipairs(out) do
      out[i] = (1 + cos(pi * e / T)) / (1 + cos(pi * (e - 1) / T)) * (lr - eta_min) + eta_min
    end
  end
  return out
end

function CosineAnnealingLR:_closed_form()
  local out = {}
  for i, b in ipairs(self.base_lrs) do
    out[i] = self.eta_min + (b - self.eta_min) * (1 + cos(pi * self.last_epoch / self.T_max)) / 2
  end
  return out
end

-- LinearLR(optimizer, {start_factor = 1/3, end_factor = 1, total_iters = 5}) -------
local LinearLR = class("LinearLR", {options = {start_factor = 1 / 3, end_factor = 1.0, total_iters = 5}})

function LinearLR:_init(last_epoch)
  check_number(self, "start_factor", self.start_factor, 0, true, 1, false)
  check_number(self, "end_factor", self.end_factor, 0, false, 1, false)
  check_positive_int(self, "total_iters", self.total_iters)
  self:_init_base(last_epoch)
end

function LinearLR:get_lr()
  local e, s, f, n = self.last_epoch, self.start_factor, self.end_factor, self.total_iters
  local out = current_lrs(self)
  if e == 0 then
    for i, lr in ipairs(out) do out[i] = lr * s end
    return out
  end
  if e > n then return out end
  for i, lr in ipairs(out) do
    out[i] = lr * (1 + (f - s) / (n * s + (e - 1) * (f - s)))
  end
  return out
end

function LinearLR:_closed_form()
  local out = {}
  local s, f, n = self.start_factor, self.end_factor, self.total_iters
  for i, b in ipairs(self.base_lrs) do
    out[i] = b * (s + (f - s) * math.min(n, self.last_epoch) / n)
  end
  return out
end

-- LambdaLR(optimizer, lr_lambda): lr = initial_lr * lr_lambda(last_epoch);
-- lr_lambda is a function or a list of functions, one per group. The
-- functions are not part of state_dict.
local LambdaLR = class("LambdaLR", {required = {"lr_lambda"}})

function LambdaLR:_init(last_epoch)
  local f = self.lr_lambda
  self.lr_lambda = nil
  local n = #self.optimizer.param_groups
  local fns = {}
  if type(f) == "table" and getmetatable(f) == nil then
    if #f ~= n then self:_error(("expected %d lr_lambdas, got %d"):format(n, #f)) end
    for i = 1, n do fns[i] = f[i] end
    self._distinct = true -- messages name lr_lambda[i]
  else
    for i = 1, n do fns[i] = f end
  end
  for i, fn in ipairs(fns) do
    if type(fn) ~= "function" and not (getmetatable(fn) and getmetatable(fn).__call) then
      self:_error(("lr_lambda %d is a %s, not a function"):format(i, type(fn)))
    end
  end
  self.lr_lambdas = fns
  self:_init_base(last_epoch)
end

function LambdaLR:get_lr()
  local out = {}
  local n = #self.lr_lambdas
  for i, b in ipairs(self.base_lrs) do
    local v = self.lr_lambdas[i](self.last_epoch)
    if type(v) ~= "number" or v - v ~= 0 then
      local name = (n > 1 and self._distinct) and ("lr_lambda[%d]"):format(i) or "lr_lambda"
      self:_error(("%s must return a %snumber, got %s (at epoch %s)"):format(name,
        type(v) == "number" and "finite " or "", type(v) == "number" and fmt(v) or type(v), fmt(self.last_epoch)))
    end
    out[i] = b * v
  end
  return out
end

function LambdaLR:state_dict() return state_fields(self, {lr_lambdas = true, _distinct = true}) end

function LambdaLR:load_state_dict(sd)
  local fns = self.lr_lambdas
  LRScheduler.load_state_dict(self, sd)
  self.lr_lambdas = fns
end

-- OneCycleLR(optimizer, max_lr, {total_steps = | epochs =, steps_per_epoch =,
--   pct_start = 0.3, anneal_strategy = "cos", cycle_momentum = true,
--   base_momentum = 0.85, max_momentum = 0.95, div_factor = 25,
--   final_div_factor = 1e4, three_phase = false}) -----------------------------------
local OneCycleLR = class("OneCycleLR", {required = {"max_lr"}, options = {
  total_steps = false, epochs = false, steps_per_epoch = false, pct_start = 0.3,
  anneal_strategy = "cos", cycle_momentum = true, base_momentum = 0.85, max_momentum = 0.95,
  div_factor = 25.0, final_div_factor = 1e4, three_phase = false}})

function OneCycleLR:_init(last_epoch)
  local opt = self.optimizer
  if self.total_steps then
    check_positive_int(self, "total_steps", self.total_steps)
  elseif self.epochs or self.steps_per_epoch then
    check_positive_int(self, "epochs", self.epochs or 0)
    check_positive_int(self, "steps_per_epoch", self.steps_per_epoch or 0)
    self.total_steps = self.epochs * self.steps_per_epoch
  else
    self:_error("give total_steps, or epochs and steps_per_epoch")
  end
  self.epochs, self.steps_per_epoch = nil, nil
  check_number(self, "pct_start", self.pct_start, 0, false, 1, false)
  if self.anneal_strategy ~= "cos" and self.anneal_strategy ~= "linear" then
    self:_error(("anneal_strategy must be 'cos' or 'linear', got %s"):format(fmt(self.anneal_strategy)))
  end
  check_number(self, "div_factor", self.div_factor, 0, true)
  check_number(self, "final_div_factor", self.final_div_factor, 0, true)
  local n, pct = self.total_steps, self.pct_start
  if self.three_phase then
    self._schedule_phases = {
      {end_step = pct * n - 1, start_lr = "initial_lr", end_lr = "max_lr",
       start_momentum = "max_momentum", end_momentum = "base_momentum"},
      {end_step = 2 * pct * n - 2, start_lr = "max_lr", end_lr = "initial_lr",
       start_momentum = "base_momentum", end_momentum = "max_momentum"},
      {end_step = n - 1, start_lr = "initial_lr", end_lr = "min_lr",
       start_momentum = "max_momentum", end_momentum = "max_momentum"},
    }
  else
    self._schedule_phases = {
      {end_step = pct * n - 1, start_lr = "initial_lr", end_lr = "max_lr",
       start_momentum = "max_momentum", end_momentum = "base_momentum"},
      {end_step = n - 1, start_lr = "max_lr", end_lr = "min_lr",
       start_momentum = "base_momentum", end_momentum = "max_momentum"},
    }
  end
  local max_lrs = per_group(self, "max_lr", self.max_lr)
  for i, v in ipairs(max_lrs) do check_nonneg(self, #max_lrs > 1 and ("max_lr[%d]"):format(i) or "max_lr", v) end
  if last_epoch == -1 then
    for i, g in ipairs(opt.param_groups) do
      g.initial_lr = max_lrs[i] / self.div_factor
      g.max_lr = max_lrs[i]
      g.min_lr = g.initial_lr / self.final_div_factor
    end
  end
  if self.cycle_momentum then
    local d = opt.defaults or {}
    if d.momentum == nil and d.betas == nil then
      self:_error(("cycle_momentum needs an optimizer with momentum or betas (%s has neither); " ..
                   "pass cycle_momentum = false"):format(tostring(opt.name)))
    end
    self.use_beta1 = d.betas ~= nil
    local maxm = per_group(self, "max_momentum", self.max_momentum)
    local basem = per_group(self, "base_momentum", self.base_momentum)
    for _, p in ipairs({{"max_momentum", maxm}, {"base_momentum", basem}}) do
      for i, v in ipairs(p[2]) do check_nonneg(self, #p[2] > 1 and ("%s[%d]"):format(p[1], i) or p[1], v) end
    end
    if last_epoch == -1 then
      for i, g in ipairs(opt.param_groups) do
        if self.use_beta1 then g.betas = {maxm[i], g.betas[2]} else g.momentum = maxm[i] end
        g.max_momentum = maxm[i]
        g.base_momentum = basem[i]
      end
    end
  end
  self:_init_base(last_epoch)
end

local function anneal(strategy, start, stop, pct)
  if strategy == "cos" then
    return stop + (start - stop) / 2.0 * (cos(pi * pct) + 1)
  end
  return (stop - start) * pct + start
end

function OneCycleLR:get_lr()
  local step_num = self.last_epoch
  if step_num > self.total_steps then
    self:_error(("tried to step %d times; the specified number of total steps is %d"):format(
      step_num + 1, self.total_steps))
  end
  local phases, strategy = self._schedule_phases, self.anneal_strategy
  local lrs = {}
  for gi, g in ipairs(self.optimizer.param_groups) do
    local start_step, lr, mom = 0, nil, nil
    for i, phase in ipairs(phases) do
      local end_step = phase.end_step
      if step_num <= end_step or i == #phases then
        local pct = (step_num - start_step) / (end_step - start_step)
        lr = anneal(strategy, g[phase.start_lr], g[phase.end_lr], pct)
        if self.cycle_momentum then
          mom = anneal(strategy, g[phase.start_momentum], g[phase.end_momentum], pct)
        end
        break
      end
      start_step = end_step
    end
    lrs[gi] = lr
    if self.cycle_momentum then
      if self.use_beta1 then g.betas = {mom, g.betas[2]} else g.momentum = mom end
    end
  end
  return lrs
end

-- SequentialLR(optimizer, schedulers, milestones): schedulers[i] runs until
-- milestones[i] (an epoch), then schedulers[i + 1] starts from its epoch 0.
local SequentialLR = class("SequentialLR", {required = {"schedulers", "milestones"}})

function SequentialLR:_init(last_epoch)
  local scheds, ms = self.schedulers, self.milestones
  self.schedulers, self.milestones = nil, nil
  if type(scheds) ~= "table" or #scheds == 0 then
    self:_error("schedulers must be a non-empty list of schedulers")
  end
  if type(ms) ~= "table" or #ms ~= #scheds - 1 then
    self:_error(("expected %d milestone(s) (one fewer than the %d schedulers), got %s"):format(
      #scheds - 1, #scheds, type(ms) == "table" and tostring(#ms) or type(ms)))
  end
  for i, s in ipairs(scheds) do
    local mt = type(s) == "table" and getmetatable(s)
    if not (mt and type(s.step) == "function" and type(s.get_last_lr) == "function" and s.optimizer ~= nil) then
      self:_error(("schedulers[%d] must be a learning-rate scheduler, got %s"):format(i, type(s)))
    end
    if s.name == "ReduceLROnPlateau" then
      self:_error(("schedulers[%d] must be a learning-rate scheduler that steps without a metric, " ..
                   "got a ReduceLROnPlateau"):format(i))
    end
    if s.optimizer ~= self.optimizer then
      self:_error(("schedulers[%d] does not belong to the optimizer passed in"):format(i))
    end
  end
  -- epochs at which the next scheduler starts: positive and increasing
  for i, m in ipairs(ms) do
    if not is_int(m) then self:_error(("milestones[%d] is not an integer: %s"):format(i, fmt(m))) end
    if m < 1 then self:_error(("milestones[%d] must be a positive integer, got %s"):format(i, fmt(m))) end
    if i > 1 and m <= ms[i - 1] then
      self:_error(("milestones must be strictly increasing, got %s"):format(fmt(ms)))
    end
  end
  self._schedulers = scheds  -- the objects themselves: they are not deep-copied
  self._milestones = ms
  self.last_epoch = last_epoch + 1
  for _, g in ipairs(self.optimizer.param_groups) do g.lr = g.initial_lr end
  for _, s in ipairs(scheds) do s.last_epoch = s.last_epoch - 1 end
  scheds[1]:_initial_step()
  self._last_lr = scheds[1]:get_last_lr()
end

function SequentialLR:step()
  self.last_epoch = self.last_epoch + 1
  local idx = bisect_right(self._milestones, self.last_epoch) + 1
  local s = self._schedulers[idx]
  if idx > 1 and self._milestones[idx - 1] == self.last_epoch then
    s:step(0)
  else
    s:step()
  end
  self._last_lr = s:get_last_lr()
end

function SequentialLR:state_dict()
  local sd = state_fields(self, {_schedulers = true})
  sd._schedulers = {}
  for i, s in ipairs(self._schedulers) do sd._schedulers[i] = s:state_dict() end
  return sd
end

function SequentialLR:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd._schedulers) ~= "table" then
    self:_error("load_state_dict: the table has no _schedulers list (not a SequentialLR state)")
  end
  if #sd._schedulers ~= #self._schedulers then
    self:_error(("load_state_dict: the state has %d schedulers, this SequentialLR %d"):format(
      #sd._schedulers, #self._schedulers))
  end
  for k, v in pairs(sd) do
    if k ~= "_schedulers" and k ~= "optimizer" then self[k] = deepcopy(v) end
  end
  for i, s in ipairs(self._schedulers) do s:load_state_dict(sd._schedulers[i]) end
end

-- ConstantLR(optimizer, {factor = 1/3, total_iters = 5}): lr * factor until
-- epoch total_iters, then lr ------------------------------------------------------
local ConstantLR = class("ConstantLR", {options = {factor = 1 / 3, total_iters = 5}})

function ConstantLR:_init(last_epoch)
  -- factor 0 is refused: PyTorch's lr * (1 / factor) at total_iters would be NaN
  check_number(self, "factor", self.factor, 0, true, 1, false)
  if not is_int(self.total_iters) or self.total_iters < 0 then
    self:_error(("total_iters must be an integer >= 0, got %s"):format(fmt(self.total_iters)))
  end
  self:_init_base(last_epoch)
end

function ConstantLR:get_lr()
  local e, out = self.last_epoch, current_lrs(self)
  if e == 0 then
    for i, lr in ipairs(out) do out[i] = lr * self.factor end
  elseif e == self.total_iters then
    for i, lr in ipairs(out) do out[i] = lr * (1.0 / self.factor) end
  end
  return out
end

function ConstantLR:_closed_form()
  local out = {}
  local f = self.factor + (self.last_epoch >= self.total_iters and 1 or 0) * (1 - self.factor)
  for i, b in ipairs(self.base_lrs) do out[i] = b * f end
  return out
end

-- PolynomialLR(optimizer, {total_iters = 5, power = 1}): lr decays as
-- (1 - epoch / total_iters)^power to 0 at total_iters -------------------------------
local PolynomialLR = class("PolynomialLR", {options = {total_iters = 5, power = 1.0}})

function PolynomialLR:_init(last_epoch)
  check_positive_int(self, "total_iters", self.total_iters)
  check_nonneg(self, "power", self.power)
  self:_init_base(last_epoch)
end

function PolynomialLR:get_lr()
  local e, n, out = self.last_epoch, self.total_iters, current_lrs(self)
  if e == 0 or e > n then return out end
  local decay = ((1.0 - e / n) / (1.0 - (e - 1) / n)) ^ self.power
  for i, lr in ipairs(out) do out[i] = lr * decay end
  return out
end

function PolynomialLR:_closed_form()
  local out = {}
  local n = self.total_iters
  for i, b in ipairs(self.base_lrs) do
    out[i] = b * (1.0 - math.min(n, self.last_epoch) / n) ^ self.power
  end
  return out
end

for _, file in ipairs({"needle.optim.lr_plateau", "needle.optim.lr_cyclic"}) do
  for name, cls in pairs(require(file)) do
    assert(M[name] == nil, name)
    M[name] = cls
  end
end

return M
