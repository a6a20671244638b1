-- needle.amp: mixed-precision training (PyTorch's torch.amp): nd.amp.autocast
-- (nd.autocast) and nd.amp.GradScaler, dynamic loss scaling (docs/amp.md).
--
--   local scaler = nd.amp.GradScaler()          -- {init_scale = 2^16, growth_factor = 2,
--                                               --  backoff_factor = 0.5, growth_interval = 2000,
--                                               --  enabled = true}
--   scaler:scale(loss):backward()   -- gradients of loss * scale
--   scaler:unscale_(opt)            -- optional: the true gradients, e.g. to clip them
--   scaler:step(opt)                -- unscales (if not done), skips the step when a
--                                   -- gradient is inf or NaN
--   scaler:update()                 -- the scale backs off after an overflow, grows after
--                                   -- growth_interval clean steps
--
-- A float16 gradient underflows below 6e-8; multiplying the loss by a large
-- scale keeps small gradients representable, and the scale follows the
-- largest value that does not overflow. The algorithm is PyTorch's
-- (torch.amp.GradScaler, with _amp_update_scale_): the scale is a float32
-- value, a step with any non-finite gradient is skipped and multiplies it by
-- backoff_factor, growth_interval steps in a row without one multiply it by
-- growth_factor (unless that overflows float32). Gradients of any float dtype
-- and device are unscaled in place.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local capture = require "needle.compile.state"

local M = {}

function M.autocast(...) return require("needle.autocast").autocast(...) end

local fail = errors.failer("amp.GradScaler")

local FLT_MAX = 3.4028234663852886e38
local huge = math.huge

-- half a unit in the last place of FLT_MAX: values up to FLT_MAX + HALF_ULP
-- (exclusive: the tie goes to the even neighbour, 2^128) round down to it
local HALF_ULP = 2.0 ^ 103

-- x as float32 would hold it (round to nearest even, as C's conversion);
-- inf beyond float32's range
local function to_f32(x)
  if x ~= x then return x end
  local a = math.abs(x)
  if a >= FLT_MAX + HALF_ULP then return x > 0 and huge or -huge end
  if a > FLT_MAX then return x > 0 and FLT_MAX or -FLT_MAX end
  return (string.unpack("<f", string.pack("<f", x)))
end

-- the smallest scale whose reciprocal float32 holds (1 / 2^-128 = 2^128 does not)
local MIN_SCALE = 2.0 ^ -127

local function finite(x) return x == x and x > -huge and x < huge end

local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

local GradScaler = {}
GradScaler.__index = GradScaler
GradScaler.__name = "needle.amp.GradScaler"

local OPTS = {init_scale = "number", growth_factor = "number", backoff_factor = "number",
              growth_interval = "integer", enabled = "boolean"}

-- a value for a message: strings quoted, tables named as such
local function show(v)
  if type(v) == "string" then return ("the string %q"):format(v) end
  if type(v) == "table" then return core.is_tensor(v) and "a tensor" or "a table" end
  return tostring(v)
end

-- the checks of the settings; `where` prefixes the message ("load_state_dict: ")
local function check_growth_factor(v, where)
  if not (type(v) == "number" and finite(v) and v > 1) then
    fail("%sgrowth_factor must be a finite number > 1, got %s", where or "", show(v))
  end
  return v + 0.0 -- a float, as PyTorch keeps it
end
local function check_backoff_factor(v, where)
  if not (type(v) == "number" and v > 0 and v < 1) then
    fail("%sbackoff_factor must be a number in (0, 1), got %s", where or "", show(v))
  end
  return v + 0.0
end
local function check_growth_interval(v, where)
  if type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v >= 2 ^ 53 then
    fail("%sgrowth_interval must be an integer >= 1, got %s", where or "", show(v))
  end
  return math.tointeger(v)
end
-- a scale: a float32 value; min the smallest allowed (a new scale must have
-- a reciprocal float32 holds; a saved one may be anything update() reaches)
local function check_scale(v, what, min)
  local s = type(v) == "number" and to_f32(v)
  if not (s and finite(s) and s >= min and (min > 0 or s >= 0)) then
    fail("%s must be a number in [%.9g, %.9g] (float32's range%s), got %s", what, min, FLT_MAX,
         min > 0 and ", with a reciprocal it holds" or "", show(v))
  end
  return s
end

-- nd.amp.GradScaler([opts])
function M.GradScaler(opts, ...)
  require("needle.options").no_extra("amp.GradScaler", "GradScaler([opts])", 1, ...)
  opts = options.check("amp.GradScaler", opts, OPTS)
  local self = setmetatable({}, GradScaler)
  self._enabled = opts.enabled ~= false
  self._scale = check_scale(opts.init_scale or 65536.0, "init_scale", MIN_SCALE)
  self._growth_factor = check_growth_factor(opts.growth_factor or 2.0)
  self._backoff_factor = check_backoff_factor(opts.backoff_factor or 0.5)
  self._growth_interval = check_growth_interval(opts.growth_interval or 2000)
  self._growth_tracker = 0
  -- per optimizer since the last update(): stage ("unscaled" | "stepped") and
  -- found_inf (true/false; nil when it had no gradient to check). A plain
  -- table: an optimizer that overflowed must count at update() even when
  -- nothing else refers to it any more; update() empties it.
  self._per_optimizer = {}
  return self
end

function GradScaler:__tostring()
  return ("needle.amp.GradScaler(scale=%.9g, growth_factor=%.9g, backoff_factor=%.9g, growth_interval=%d%s)")
    :format(self._scale, self._growth_factor, self._backoff_factor, self._growth_interval,
            self._enabled and "" or ", enabled=false")
end

local function check_self(self, method)
  if getmetatable(self) ~= GradScaler then
    fail("%s: call it as scaler:%s(...) (with a colon)", method, method)
  end
end

local function check_optimizer(opt, method)
  if type(opt) ~= "table" or core.is_tensor(opt) or type(opt.param_groups) ~= "table"
     or type(opt.step) ~= "function" then
    fail("%s expects an optimizer (a table with param_groups and step), got %s", method,
         core.is_tensor(opt) and "a tensor" or type(opt))
  end
end

-- scaler:scale(outputs): outputs * scale, for a tensor or a (nested) list of
-- them, keeping the structure; the outputs themselves when disabled
function GradScaler:scale(outputs)
  check_self(self, "scale")
  if not self._enabled then return outputs end
  -- a compiled function bakes the scale into its kernels: a new scale traces it again
  if capture.active then capture.guard(function() return self._scale end) end
  local s = self._scale
  local seen = {}
  local function apply(v, path)
    if core.is_tensor(v) then
      if not FLOAT[v.dtype] then
        fail("scale: %s is a %s tensor; expected floating-point outputs (a loss)", path, v.dtype)
      end
      local r = v * s
      -- float16 and bfloat16 compute in float32: the result keeps the output's dtype, as PyTorch's
      if r.dtype ~= v.dtype then r = r:to(v.dtype) end
      return r
    elseif type(v) == "table" and getmetatable(v) == nil then
      if seen[v] then fail("scale: %s contains itself", path) end
      seen[v] = true
      local r = {}
      for k, x in pairs(v) do r[k] = apply(x, path .. "[" .. tostring(k) .. "]") end
      seen[v] = nil
      return r
    end
    fail("scale: %s is a %s; expected a tensor or a list of tensors", path, type(v))
  end
  return apply(outputs, "outputs")
end

-- whether g can be multiplied in place: no dim broadcast by a zero stride
-- (autograd gives an expanded gradient to a parameter used only through sum())
local function writable(g)
  local shape, stride = g.shape, g:stride()
  for d = 1, #shape do
    if stride[d] == 0 and shape[d] > 1 then return false end
  end
  return true
end

-- the parameters of opt that have a gradient, each checked; nothing is
-- changed until all are (a failed unscale_ leaves every gradient as it was)
local function grads_of(opt)
  local params = {}
  for gi, group in ipairs(opt.param_groups) do
    if type(group) ~= "table" or type(group.params) ~= "table" then
      fail("unscale_: the optimizer's param_groups[%d] has no list of params", gi)
    end
    for pi, p in ipairs(group.params) do
      if not core.is_tensor(p) then
        fail("unscale_: param_groups[%d].params[%d] is a %s, not a tensor", gi, pi, type(p))
      end
      local g = p.grad
      if g ~= nil then
        if not FLOAT[g.dtype] then
          fail("unscale_: the gradient of param_groups[%d].params[%d] is a %s tensor, expected a floating-point one",
               gi, pi, g.dtype)
        end
        params[#params + 1] = p
      end
    end
  end
  return params
end

-- multiplies every gradient of opt by inv; true when one of them had an inf
-- or NaN, false when none, nil when opt has no gradient at all
local function unscale_grads(opt, inv)
  local params = grads_of(opt)
  if #params == 0 then return nil end
  local found = false
  local pending = {} -- per non-CPU device: a 0-dim tensor, NaN when a gradient was not finite
  local unscaled = {} -- the gradients the fused kernel did already
  core.no_grad(function()
    for _, p in ipairs(params) do
      local g = p.grad
      -- one pass where a kernel does it (the CPU's: multiplies and checks as
      -- it goes), else the check below and a multiply after
      local done, bad = false, false
      if g:numel() > 0 and writable(g) then done, bad = core.amp_unscale_(g, inv) end
      if done then
        unscaled[p] = true
        found = found or bad
      elseif g:numel() > 0 then
        -- max and min propagate NaN and meet every inf: two passes, no temporary
        local mx, mn = g:max(), g:min()
        if g.device == "cpu" then
          local a, b = mx:item(), mn:item()
          if not (a < huge and b > -huge) then found = true end
        else
          -- finite * 0 = 0, inf * 0 = NaN: one read of the device per call
          local chk = mx:mul(0):add(mn:mul(0)):float()
          local d = g.device
          pending[d] = pending[d] and pending[d]:add(chk) or chk
        end
      end
    end
    for _, chk in pairs(pending) do
      if chk:item() ~= 0 then found = true end
    end
    for _, p in ipairs(params) do
      if not unscaled[p] then
        local g = p.grad
        if writable(g) then g:mul_(inv) else p.grad = g * inv end
      end
    end
  end)
  return found
end

local function break_graph(method)
  core._graph_break(("nd.amp.GradScaler:%s reads on the host whether the gradients are finite; call " ..
                     "scaler:step and scaler:update outside the compiled function (scaler:scale(loss) " ..
                     "may be inside)"):format(method))
end

local function state_of(self, opt)
  local st = self._per_optimizer[opt]
  if st == nil then
    st = {}
    self._per_optimizer[opt] = st
  end
  return st
end

-- scaler:unscale_(opt): divides opt's gradients by the scale, in place, and
-- records whether one was inf or NaN. At most once per optimizer between
-- update()s, and before step().
function GradScaler:unscale_(opt)
  check_self(self, "unscale_")
  if not self._enabled then return end
  check_optimizer(opt, "unscale_")
  local st = state_of(self, opt)
  if st.stage == "unscaled" then
    fail("unscale_() has already been called on this optimizer since the last update()")
  elseif st.stage == "stepped" then
    fail("unscale_() is being called after step(); call it before step(), once per update()")
  end
  break_graph("unscale_")
  -- as PyTorch: the reciprocal in float64, then rounded to float32. A scale
  -- that backed off so far that its reciprocal overflows (or reached 0)
  -- would turn every gradient into inf or NaN: such a step is skipped.
  local inv = to_f32(1 / self._scale)
  local found = unscale_grads(opt, inv)
  if found ~= nil and not finite(inv) then found = true end
  st.found_inf = found
  st.stage = "unscaled"
end

-- scaler:step(opt): unscales opt's gradients (unless unscale_ did) and runs
-- opt:step() when they are all finite; returns what opt:step() returned, or
-- nil when the step was skipped.
function GradScaler:step(opt, ...)
  check_self(self, "step")
  check_optimizer(opt, "step")
  if not self._enabled then return opt:step(...) end
  -- whether the step runs depends on values: a replay would repeat the capture's choice
  break_graph("step")
  if select("#", ...) > 0 then
    fail("step: a closure is not supported while the scaler is enabled (its loss would not be scaled); " ..
         "compute the loss, scaler:scale(loss):backward(), then scaler:step(opt)")
  end
  local st = state_of(self, opt)
  if st.stage == "stepped" then
    fail("step() has already been called on this optimizer since the last update()")
  end
  if st.stage == nil then self:unscale_(opt) end
  if st.found_inf == nil then
    fail("step: no inf checks were recorded for this optimizer: none of its parameters has a gradient " ..
         "(run scaler:scale(loss):backward() first)")
  end
  local ret
  if not st.found_inf then ret = opt:step() end
  st.stage = "stepped"
  return ret
end

-- scaler:update([new_scale]): the next scale, from whether this iteration's
-- steps found an inf or NaN; new_scale (a number or a one-element tensor)
-- sets it instead.
function GradScaler:update(new_scale)
  check_self(self, "update")
  if not self._enabled then return end
  break_graph("update")
  if new_scale ~= nil then
    if core.is_tensor(new_scale) then
      if new_scale:numel() ~= 1 or not FLOAT[new_scale.dtype] then
        fail("update: new_scale must be a number or a one-element floating-point tensor, got a %s tensor " ..
             "of shape %s", new_scale.dtype, errors.shape_str(new_scale))
      end
      new_scale = new_scale:item()
    elseif type(new_scale) ~= "number" then
      fail("update: new_scale must be a number or a one-element floating-point tensor, got %s", show(new_scale))
    end
    self._scale = check_scale(new_scale, "update: new_scale", MIN_SCALE)
  else
    local recorded, found = false, false
    for _, st in pairs(self._per_optimizer) do
      if st.found_inf ~= nil then
        recorded = true
        found = found or st.found_inf
      end
    end
    if not recorded then
      fail("update: no inf checks were recorded since the last update(); call scaler:step(opt) first")
    end
    if found then
      self._scale = to_f32(self._scale * self._backoff_factor)
      self._growth_tracker = 0
    else
      local successful = self._growth_tracker + 1
      -- >=, not ==: set_growth_interval may have lowered the interval below the count
      if successful >= self._growth_interval then
        local grown = to_f32(self._scale * self._growth_factor)
        if finite(grown) then self._scale = grown end
        self._growth_tracker = 0
      else
        self._growth_tracker = successful
      end
    end
  end
  self._per_optimizer = {}
end

function GradScaler:get_scale()
  check_self(self, "get_scale")
  return self._enabled and self._scale or 1.0
end
function GradScaler:is_enabled()
  check_self(self, "is_enabled")
  return self._enabled
end
-- get_growth_factor / set_growth_factor(v), and the same for backoff_factor
-- and growth_interval: each setting read, or checked and set
for name, check in pairs({growth_factor = check_growth_factor, backoff_factor = check_backoff_factor,
                          growth_interval = check_growth_interval}) do
  local field, getter, setter = "_" .. name, "get_" .. name, "set_" .. name
  GradScaler[getter] = function(self)
    check_self(self, getter)
    return self[field]
  end
  GradScaler[setter] = function(self, v)
    check_self(self, setter)
    self[field] = check(v, setter .. ": ")
  end
end

local STATE = {scale = "number", growth_factor = "number", backoff_factor = "number",
               growth_interval = "integer", _growth_tracker = "integer"}

-- scaler:state_dict(): PyTorch's keys (scale, growth_factor, backoff_factor,
-- growth_interval, _growth_tracker); {} when disabled
function GradScaler:state_dict()
  check_self(self, "state_dict")
  if not self._enabled then return {} end
  return {scale = self._scale, growth_factor = self._growth_factor, backoff_factor = self._backoff_factor,
          growth_interval = self._growth_interval, _growth_tracker = self._growth_tracker}
end

-- scaler:load_state_dict(sd[, {strict = true}]): every value is checked
-- before any is taken, so a bad dict leaves the scaler as it was; it takes
-- whatever state_dict() gives (a scale that backed off to 0 included).
-- strict = false ignores keys it does not know (nd.checkpoint passes it on).
function GradScaler:load_state_dict(sd, opts)
  check_self(self, "load_state_dict")
  local o = options.check("amp.GradScaler.load_state_dict", opts, {strict = "boolean"})
  if not self._enabled then return end
  if type(sd) ~= "table" or core.is_tensor(sd) then
    fail("load_state_dict: expected a table, got %s", core.is_tensor(sd) and "a tensor" or type(sd))
  end
  if next(sd) == nil then
    fail("load_state_dict: the state dict is empty, possibly because it was saved from a disabled GradScaler")
  end
  if o.strict ~= false then
    options.check("amp.GradScaler.load_state_dict", sd, STATE, "in the state dict")
  end
  local where = "load_state_dict: "
  for _, k in ipairs({"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) do
    if sd[k] == nil then fail("%sthe state dict has no '%s'", where, k) end
  end
  local scale = check_scale(sd.scale, where .. "scale", 0.0)
  local growth = check_growth_factor(sd.growth_factor, where)
  local backoff = check_backoff_factor(sd.backoff_factor, where)
  local interval = check_growth_interval(sd.growth_interval, where)
  local tracker = sd._growth_tracker
  if math.type(tracker) ~= "integer" and not (type(tracker) == "number" and tracker == math.floor(tracker)
                                              and tracker < 2 ^ 53) or tracker < 0 then
    fail("%s_growth_tracker must be an integer >= 0, got %s", where, show(tracker))
  end
  self._scale, self._growth_tracker = scale, math.tointeger(tracker)
  self._growth_factor, self._backoff_factor, self._growth_interval = growth, backoff, interval
end

return M
