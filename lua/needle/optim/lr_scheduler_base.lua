-- needle.optim.lr_scheduler_base: what the learning-rate schedulers share
-- (needle.optim.lr_scheduler and the files it gathers): the LRScheduler base
-- class, the constructor every scheduler has (class), and the argument checks.
--
-- class(name, spec) makes a scheduler class; a scheduler defines _init(last_epoch)
-- (check its settings, then self:_init_base(last_epoch)) and get_lr(), and
-- optionally _closed_form() for step(epoch).
local Optimizer = require "needle.optim.optimizer"
local options = require "needle.options"

local errors = require "needle.errors"
local floor = math.floor

-- a value for a message: numbers as they read back, NaN as "nan" (the C
-- library may print "-nan"), lists as {a, b}
local ofmt = Optimizer._fmt
local function fmt(v)
  if type(v) == "number" and v ~= v then return "nan" end
  if type(v) == "table" and getmetatable(v) == nil then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = fmt(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return ofmt(v)
end

local M = {fmt = fmt}

-- copies plain tables; objects (tables with a metatable: schedulers,
-- callable tables) are kept as they are
function M.deepcopy(v)
  if type(v) ~= "table" or getmetatable(v) ~= nil then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = M.deepcopy(x) end
  return c
end

local deepcopy = M.deepcopy

-- an integer or an integral float; NaN and +-inf are not
function M.is_int(v)
  return math.type(v) == "integer" or (type(v) == "number" and v == floor(v) and v - v == 0)
end
local is_int = M.is_int

-- Scheduler base ----------------------------------------------------------------

local LRScheduler = {}
LRScheduler.__index = LRScheduler
LRScheduler.name = "LRScheduler"
M.LRScheduler = LRScheduler

function LRScheduler:_error(msg)
  errors.fail("optim.lr_scheduler." .. self.name, "%s", msg)
end

-- class(name, {required = {"step_size"}, options = {gamma = 0.1}}): the
-- constructor reads the required arguments positionally (or from the options
-- table) and the options, rejects unknown options, and calls self:_init().
-- no_last_epoch = true: the scheduler takes no last_epoch (ReduceLROnPlateau).
function M.class(name, spec)
  local cls = setmetatable({}, {
    __index = LRScheduler,
    __call = function(c, optimizer, ...) return c.new(c, optimizer, ...) end,
    __tostring = function() return "needle.optim.lr_scheduler." .. name end,
  })
  cls.__index = cls
  cls.__tostring = LRScheduler.__tostring
  cls.name = name
  cls._required = spec.required or {}
  cls._options = spec.options or {}
  cls._no_last_epoch = spec.no_last_epoch
  return cls
end

function LRScheduler.new(cls, optimizer, ...)
  local self = setmetatable({}, cls)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    self:_error(("expected an optimizer as the first argument, got %s"):format(type(optimizer)))
  end
  local args = table.pack(...)
  local nreq = #cls._required
  local nargs = nreq + 1 -- the required arguments and the options table
  -- everything in one options table: Sched(opt, {required..., options...}).
  -- A plain table with a string key is that form (a required argument that
  -- is a table is a list: milestones, per-group values, schedulers), so a
  -- misspelt key is named by options.check below.
  local table_form = false
  if nreq > 0 and type(args[1]) == "table" and getmetatable(args[1]) == nil then
    for k in pairs(args[1]) do
      if type(k) == "string" then table_form = true break end
    end
  end
  if table_form then nargs = 1 end
  for i = nargs + 1, args.n do
    if args[i] ~= nil then
      self:_error(("takes %s only, got an extra argument #%d: %s"):format(cls:_usage(), i + 1,
        options.got(args[i])))
    end
  end
  local opts = args[nreq + 1]
  if table_form then
    opts = args[1]
    args = {}
    for i, k in ipairs(cls._required) do args[i] = opts[k] end
  end
  -- the values are checked by each scheduler's _init
  local known = cls._no_last_epoch and {} or {last_epoch = "any"}
  for k in pairs(cls._options) do known[k] = "any" end
  for _, k in ipairs(cls._required) do known[k] = "any" end
  opts = options.check("optim.lr_scheduler." .. cls.name, opts, known)
  for i, k in ipairs(cls._required) do
    local v = args[i]
    if v ~= nil and not table_form and opts[k] ~= nil then
      self:_error(("%s is given twice: as argument #%d and in the options table"):format(k, i + 1))
    end
    if v == nil then v = opts[k] end
    if v == nil then self:_error(("missing required argument %s"):format(k)) end
    self[k] = deepcopy(v)
  end
  for k, default in pairs(cls._options) do
    local v = opts[k]
    if v == nil then v = default end
    self[k] = deepcopy(v)
  end
  self.optimizer = optimizer
  local last_epoch = opts.last_epoch or -1
  if not is_int(last_epoch) or last_epoch < -1 then
    self:_error(("last_epoch must be an integer >= -1, got %s"):format(fmt(last_epoch)))
  end
  self:_init(last_epoch)
  return self
end

-- "StepLR(optimizer, step_size[, options])": the constructor's arguments, for messages
function LRScheduler:_usage()
  local parts = {"optimizer"}
  for _, k in ipairs(self._required) do parts[#parts + 1] = k end
  return ("%s(%s[, options])"):format(self.name, table.concat(parts, ", "))
end

-- the base initialisation: initial_lr, base_lrs, the initial step
function LRScheduler:_init_base(last_epoch)
  local groups = self.optimizer.param_groups
  if last_epoch == -1 then
    for _, g in ipairs(groups) do
      if g.initial_lr == nil then g.initial_lr = g.lr end
    end
  else
    for i, g in ipairs(groups) do
      if g.initial_lr == nil then
        self:_error(("param_groups[%d] has no initial_lr; resuming with last_epoch = %d needs the " ..
                     "optimizer state saved with its scheduler"):format(i, last_epoch))
      end
    end
  end
  self.base_lrs = {}
  for i, g in ipairs(groups) do self.base_lrs[i] = g.initial_lr end
  self.last_epoch = last_epoch
  self:_initial_step()
end

function LRScheduler:_init(last_epoch) self:_init_base(last_epoch) end

function LRScheduler:_initial_step()
  self._step_count = 0
  self:step()
end

-- sched:step(): advance one step and set every group's lr. sched:step(epoch)
-- (deprecated in PyTorch) jumps to an epoch using the closed form where one exists.
function LRScheduler:step(epoch)
  self._step_count = self._step_count + 1
  local values
  if epoch == nil then
    self.last_epoch = self.last_epoch + 1
    values = self:get_lr()
  else
    if not is_int(epoch) then self:_error(("epoch must be an integer, got %s"):format(fmt(epoch))) end
    self.last_epoch = epoch
    values = self._closed_form and self:_closed_form() or self:get_lr()
  end
  local last = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    g.lr = values[i]
    last[i] = values[i]
  end
  self._last_lr = last
end

-- the learning rates the last step set, one per group (a fresh list)
function LRScheduler:get_last_lr()
  local out = {}
  for i, v in ipairs(self._last_lr) do out[i] = v end
  return out
end

function M.current_lrs(self)
  local out = {}
  for i, g in ipairs(self.optimizer.param_groups) do out[i] = g.lr end
  return out
end

-- fields that are not state: the optimizer, functions
function M.state_fields(self, skip)
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and type(v) ~= "function" and not (skip and skip[k]) then
      sd[k] = deepcopy(v)
    end
  end
  return sd
end

-- sched:state_dict(): a plain table of the scheduler's fields (not the optimizer)
function LRScheduler:state_dict()
  return M.state_fields(self)
end

-- sched:load_state_dict(sd): restores the fields state_dict() returned
function LRScheduler:load_state_dict(sd)
  if type(sd) ~= "table" then
    self:_error(("load_state_dict: expected a table, got %s"):format(type(sd)))
  end
  if type(sd.last_epoch) ~= "number" or type(sd.base_lrs) ~= "table" then
    self:_error("load_state_dict: the table has no last_epoch or base_lrs (not a scheduler state)")
  end
  if #sd.base_lrs ~= #self.optimizer.param_groups then
    self:_error(("load_state_dict: the state has %d base_lrs, the optimizer %d parameter group(s)")
      :format(#sd.base_lrs, #self.optimizer.param_groups))
  end
  for k, v in pairs(sd) do
    if k ~= "optimizer" and type(self[k]) ~= "function" then self[k] = deepcopy(v) end
  end
end

function LRScheduler:__tostring()
  return ("%s(last_epoch=%d, lr=%s)"):format(self.name, self.last_epoch, fmt(self._last_lr))
end

-- check_number(self, name, v[, lo, lo_open, hi, hi_open]): v is a finite
-- number in the range (lo / hi nil: unbounded on that side, but never +-inf).
-- Written so that NaN fails every comparison: NaN and +-inf are refused too.
function M.check_number(self, name, v, lo, lo_open, hi, hi_open)
  if type(v) ~= "number" then
    self:_error(("%s must be a number, got %s"):format(name, type(v)))
  end
  local ok = v - v == 0 -- finite (NaN - NaN and inf - inf are NaN)
      and (lo == nil or (lo_open and v > lo) or (not lo_open and v >= lo))
      and (hi == nil or (hi_open and v < hi) or (not hi_open and v <= hi))
  if not ok then
    self:_error(("invalid %s %s (expected %s%s, %s%s)"):format(name, fmt(v), (lo_open or lo == nil) and "(" or "[",
      lo and fmt(lo) or "-inf", hi and fmt(hi) or "inf", (hi_open or hi == nil) and ")" or "]"))
  end
end

-- a finite number >= 0 (a rate, a factor, a momentum)
function M.check_nonneg(self, name, v) M.check_number(self, name, v, 0, false) end

function M.check_positive_int(self, name, v)
  if not is_int(v) or v <= 0 then
    self:_error(("%s must be a positive integer, got %s"):format(name, fmt(v)))
  end
end

-- per-group values: a number for all groups or a list with one per group
function M.per_group(self, name, v)
  local n = #self.optimizer.param_groups
  if type(v) == "table" then
    if #v ~= n then
      self:_error(("expected %d values for %s (one per parameter group), got %d"):format(n, name, #v))
    end
    return deepcopy(v)
  end
  local out = {}
  for i = 1, n do out[i] = v end
  return out
end

return M
