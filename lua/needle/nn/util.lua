-- needle.nn.util: small helpers shared by the nn family files (internal).
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"

local M = {}

-- "needle.nn.<Name>: <fmt...>", raised at the user's line
function M.fail(self, fmt, ...)
  errors.fail("nn." .. (type(self) == "string" and self or self.__name), fmt, ...)
end

-- The options of a module's constructor, checked against spec (see
-- needle.options: unknown keys and wrong types are errors naming the module);
-- with factory = true, PyTorch's factory keywords dtype and device too.
-- Returns the options table (an empty one when opts is nil).
function M.options(self, opts, spec, factory)
  if factory then
    local s = {dtype = "string", device = "string"}
    for k, v in pairs(spec) do s[k] = v end
    spec = s
  end
  local o = options.check("nn." .. self.__name, opts, spec)
  -- the settings whose names say their range, the same in every module (written so that
  -- NaN fails them: it passes `x < 0`): an eps, a momentum, a dropout probability, a width
  for _, k in ipairs({"eps", "layer_norm_eps"}) do
    local v = o[k]
    if type(v) == "number" and not (v >= 0 and v < math.huge) then
      M.fail(self, "%s must be a finite number >= 0, got %s", k, tostring(v))
    end
  end
  if type(o.momentum) == "number" and not (o.momentum >= 0 and o.momentum <= 1) then
    M.fail(self, "momentum must be a number in [0, 1], got %s", tostring(o.momentum))
  end
  if type(o.dropout) == "number" and not (o.dropout >= 0 and o.dropout <= 1) then
    M.fail(self, "dropout must be a probability in [0, 1], got %s", tostring(o.dropout))
  end
  if o.dim_feedforward ~= nil and o.dim_feedforward < 1 then
    M.fail(self, "dim_feedforward must be a positive integer, got %s", tostring(o.dim_feedforward))
  end
  if factory then
    local dt = o.dtype
    if dt ~= nil and dt ~= "float32" and dt ~= "float64" and dt ~= "float16" and dt ~= "bfloat16" then
      M.fail(self, "dtype must be a floating-point dtype (float32, float64, float16 or bfloat16), got %q", dt)
    end
    if o.device ~= nil then
      local ok, err = pcall(core.zeros, {0}, {device = o.device})
      if not ok then
        M.fail(self, "cannot use device '%s': %s", o.device, (tostring(err):gsub("^.-needle%.[%w_]+: ", "")))
      end
    end
  end
  return o
end

-- Constructors whose first argument may also come inside the options table,
-- as PyTorch's keyword (Dropout(0.3, {inplace = true}) or Dropout({p = 0.3})):
-- returns that argument and the checked options. spec lists the other
-- options; `name` joins them for the table form.
function M.first_or_options(self, first, opts, name, name_type, spec)
  if type(first) ~= "table" then return first, M.options(self, opts, spec) end
  if opts ~= nil then M.fail(self, "options given twice (a table and then %s)", type(opts)) end
  local full = {[name] = name_type}
  for k, v in pairs(spec) do full[k] = v end
  local o = M.options(self, first, full)
  return o[name], o
end

-- Moves a module just built on the cpu to o.device, when given (the last
-- step of a constructor that took the factory keywords).
function M.place(self, o)
  if o.device ~= nil then self:to(o.device) end
  return self
end

return M
