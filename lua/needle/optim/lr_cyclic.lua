-- needle.optim.lr_scheduler.CyclicLR and CosineAnnealingWarmRestarts
-- (PyTorch's, same formulas): schedules that go up and down again.
--
--   CyclicLR(opt, base_lr, max_lr, {step_size_up = 2000, ...})     -- step() per batch
--   CosineAnnealingWarmRestarts(opt, T_0, {T_mult = 1, eta_min = 0}) -- step() or step(epoch)
local B = require "needle.optim.lr_scheduler_base"

local fmt, is_int, per_group = B.fmt, B.is_int, B.per_group
local check_number, check_positive_int = B.check_number, B.check_positive_int
local LRScheduler = B.LRScheduler
local cos, pi, floor, log = math.cos, math.pi, math.floor, math.log

local M = {}

local function is_callable(f)
  local mt = getmetatable(f)
  return type(f) == "function" or (type(f) == "table" and type(mt) == "table" and mt.__call ~= nil)
end

-- CyclicLR(optimizer, base_lr, max_lr, {step_size_up = 2000, step_size_down = step_size_up,
--   mode = "triangular" | "triangular2" | "exp_range", gamma = 1, scale_fn = nil,
--   scale_mode = "cycle" | "iterations", cycle_momentum = true, base_momentum = 0.8,
--   max_momentum = 0.9}): the lr goes from base_lr up to max_lr in step_size_up
-- steps and back in step_size_down, the height scaled by scale_fn (of the cycle
-- number or of the step); momentum (or Adam's beta1) goes the other way.
local CyclicLR = B.class("CyclicLR", {required = {"base_lr", "max_lr"}, options = {
  step_size_up = 2000, step_size_down = false, mode = "triangular", gamma = 1.0, scale_fn = false,
  scale_mode = "cycle", cycle_momentum = true, base_momentum = 0.8, max_momentum = 0.9}})
M.CyclicLR = CyclicLR

local MODES = {triangular = true, triangular2 = true, exp_range = true}

-- a number >= 0 or a list of them, one per group
local function per_group_numbers(self, name, v)
  local out = per_group(self, name, v)
  for i, x in ipairs(out) do B.check_nonneg(self, #out > 1 and ("%s[%d]"):format(name, i) or name, x) end
  return out
end

function CyclicLR:_init(last_epoch)
  local opt = self.optimizer
  local base_lrs = per_group_numbers(self, "base_lr", self.base_lr)
  self.max_lrs = per_group_numbers(self, "max_lr", self.max_lr)
  self.base_lr, self.max_lr = nil, nil
  check_number(self, "step_size_up", self.step_size_up, 0, true)
  local up = self.step_size_up + 0.0
  local down = up
  if self.step_size_down then
    check_number(self, "step_size_down", self.step_size_down, 0, true)
    down = self.step_size_down + 0.0
  end
  self.total_size = up + down
  self.step_ratio = up / self.total_size
  if not MODES[self.mode] then
    self:_error(("mode must be \"triangular\", \"triangular2\" or \"exp_range\", got %s"):format(fmt(self.mode)))
  end
  check_number(self, "gamma", self.gamma, 0, false)
  if self.scale_fn then
    if not is_callable(self.scale_fn) then
      self:_error(("scale_fn must be a function, got %s"):format(type(self.scale_fn)))
    end
    if self.scale_mode ~= "cycle" and self.scale_mode ~= "iterations" then
      self:_error(("scale_mode must be \"cycle\" or \"iterations\", got %s"):format(fmt(self.scale_mode)))
    end
    self._scale_fn_custom = self.scale_fn
  else
    -- the mode's own scale_fn decides the scale mode, as PyTorch
    self.scale_mode = self.mode == "exp_range" and "iterations" or "cycle"
  end
  self.scale_fn = nil
  if self.cycle_momentum then
    local d = opt.defaults or {}
    if d.momentum == nil and d.betas == nil then
      self:_error(("cycle_momentum needs an optimizer with momentum or betas (%s has neither); " ..
                   "pass cycle_momentum = false"):format(tostring(opt.name)))
    end
    self.use_beta1 = d.betas ~= nil
    self.base_momentums = per_group_numbers(self, "base_momentum", self.base_momentum)
    self.max_momentums = per_group_numbers(self, "max_momentum", self.max_momentum)
    if last_epoch == -1 then
      for i, g in ipairs(opt.param_groups) do
        local m = self.max_momentums[i]
        if self.use_beta1 then g.betas = {m, g.betas[2]} else g.momentum = m end
        g.max_momentum, g.base_momentum = m, self.base_momentums[i]
      end
    end
  end
  self.base_momentum, self.max_momentum = nil, nil
  if last_epoch == -1 then
    for i, g in ipairs(opt.param_groups) do g.lr = base_lrs[i] end
  end
  self:_init_base(last_epoch)
  -- as PyTorch: the initial step used the groups' initial_lr, later ones base_lr
  self.base_lrs = base_lrs
end

function CyclicLR:_scale(x)
  if self._scale_fn_custom then return self._scale_fn_custom(x) end
  if self.mode == "triangular" then return 1.0 end
  if self.mode == "triangular2" then return 1 / (2.0 ^ (x - 1)) end
  return self.gamma ^ x
end

function CyclicLR:get_lr()
  local e = self.last_epoch
  local cycle = floor(1 + e / self.total_size)
  local x = 1.0 + e / self.total_size - cycle
  local scale_factor
  if x <= self.step_ratio then
    scale_factor = x / self.step_ratio
  else
    scale_factor = (x - 1) / (self.step_ratio - 1)
  end
  local scale = self:_scale(self.scale_mode == "cycle" and cycle or e)
  local lrs = {}
  for i, base in ipairs(self.base_lrs) do
    lrs[i] = base + (self.max_lrs[i] - base) * scale_factor * scale
  end
  if self.cycle_momentum then
    for i, g in ipairs(self.optimizer.param_groups) do
      local maxm = self.max_momentums[i]
      local m = maxm - (maxm - self.base_momentums[i]) * scale_factor * scale
      if self.use_beta1 then g.betas = {m, g.betas[2]} else g.momentum = m end
    end
  end
  return lrs
end

-- scale_fn is not part of the state (as LambdaLR's functions)
function CyclicLR:state_dict() return B.state_fields(self, {_scale_fn_custom = true}) end

function CyclicLR:load_state_dict(sd)
  local fn = self._scale_fn_custom
  LRScheduler.load_state_dict(self, sd)
  self._scale_fn_custom = fn
end

-- CosineAnnealingWarmRestarts(optimizer, T_0, {T_mult = 1, eta_min = 0}): cosine
-- annealing from the initial lr to eta_min over T_i epochs, then a restart;
-- T_i starts at T_0 and is multiplied by T_mult at each restart.
local CosineAnnealingWarmRestarts = B.class("CosineAnnealingWarmRestarts", {required = {"T_0"},
  options = {T_mult = 1, eta_min = 0}})
M.CosineAnnealingWarmRestarts = CosineAnnealingWarmRestarts

function CosineAnnealingWarmRestarts:_init(last_epoch)
  check_positive_int(self, "T_0", self.T_0)
  if not is_int(self.T_mult) or self.T_mult < 1 then
    self:_error(("T_mult must be an integer >= 1, got %s"):format(fmt(self.T_mult)))
  end
  check_number(self, "eta_min", self.eta_min, 0, false)
  self.T_i = self.T_0
  self.T_cur = last_epoch
  self:_init_base(last_epoch)
end

function CosineAnnealingWarmRestarts:get_lr()
  local out = {}
  for i, b in ipairs(self.base_lrs) do
    out[i] = self.eta_min + (b - self.eta_min) * (1 + cos(pi * self.T_cur / self.T_i)) / 2
  end
  return out
end

-- sched:step() after each epoch, or sched:step(epoch) with a fractional
-- epoch (epoch + i / iters after each batch); the two may be mixed
function CosineAnnealingWarmRestarts:step(epoch)
  self._step_count = self._step_count + 1
  if epoch == nil and self.last_epoch < 0 then epoch = 0 end
  local T_0, T_mult = self.T_0, self.T_mult
  if epoch == nil then
    epoch = self.last_epoch + 1
    self.T_cur = self.T_cur + 1
    if self.T_cur >= self.T_i then
      self.T_cur = self.T_cur - self.T_i
      self.T_i = self.T_i * T_mult
    end
  else
    if type(epoch) ~= "number" or epoch < 0 or epoch ~= epoch then
      self:_error(("epoch must be a number >= 0, got %s"):format(fmt(epoch)))
    end
    if epoch >= T_0 then
      if T_mult == 1 then
        self.T_cur = epoch % T_0
      else
        -- the restart epoch falls in: PyTorch's int(math.log(x, T_mult)), the
        -- logarithm as log(x) / log(T_mult) (not log2), so ties round alike
        local n = floor(log(epoch / T_0 * (T_mult - 1) + 1) / log(T_mult))
        local pow = math.tointeger(T_mult ^ n) or T_mult ^ n
        self.T_cur = epoch - T_0 * (pow - 1) / (T_mult - 1)
        self.T_i = T_0 * pow
      end
    else
      self.T_i = T_0
      self.T_cur = epoch
    end
  end
  self.last_epoch = floor(epoch)
  local values, last = self:get_lr(), {}
  for i, g in ipairs(self.optimizer.param_groups) do
    g.lr = values[i]
    last[i] = values[i]
  end
  self._last_lr = last
end

return M
