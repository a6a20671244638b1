-- needle.options: the check of options tables (PyTorch's keyword arguments)
-- for the Lua half of the package, so that a misspelt key is an error that
-- names the valid ones instead of being ignored (nn.Linear(2, 2, {biass =
-- false}) would keep its bias). The C functions use lt_options
-- (src/lua_bindings/lt_options.c), with the same messages.
--
--   local options = require "needle.options"
--   local o = options.check("nn.Linear", opts, {bias = "boolean", dtype = "string", device = "string"})
--   if o.bias == false then ... end
--
-- check(who, opts, spec[, context]) -> opts, or a new empty table when opts
-- is nil. spec maps every valid key to the types its value may have: a Lua
-- type name ("number", "string", "boolean", "table", "function"),
-- "integer", "tensor", "module", "callable" or "any", several joined by "|"
-- ("integer|table"). Value ranges stay the caller's to check. Raises, at the
-- user's line (needle.errors):
--
--   needle.<who>: expected an options table, got number
--   needle.<who>: unknown option 'biass' (valid: bias, device, dtype)
--   needle.<who>: option 'bias' must be a boolean, got 1
--
-- context, when given, follows the key: "unknown option 'lrr' in a
-- parameter group (valid: ...)". The first unknown key in sorted order is
-- reported, so the message is the same in every run.
local core = require "needle.core"
local errors = require "needle.errors"

local M = {}

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(v) == "table" and type(mt) == "table" and mt.__call ~= nil
end

local function is_module(v)
  local mt = getmetatable(v)
  return type(v) == "table" and type(mt) == "table" and mt.class ~= nil
end

local TESTS = {
  any = function() return true end,
  -- 2.0 is an integer here (n / 2 is a float in Lua 5.4); 2.5 is not
  integer = function(v) return type(v) == "number" and math.tointeger(v) ~= nil end,
  tensor = core.is_tensor,
  module = is_module,
  callable = is_callable,
  table = function(v) return type(v) == "table" and not core.is_tensor(v) end,
}

local function has_type(v, name)
  local test = TESTS[name]
  if test then return test(v) end
  return type(v) == name
end

local ARTICLE = {integer = "an", any = "any value", tensor = "a", module = "a", callable = "a"}

local function describe_types(types)
  local parts = {}
  for name in types:gmatch("[^|]+") do
    local a = ARTICLE[name] or (name:find("^[aeiou]") and "an" or "a")
    parts[#parts + 1] = a == "any value" and a or a .. " " .. name
  end
  if #parts == 1 then return parts[1] end
  return table.concat(parts, ", ", 1, #parts - 1) .. " or " .. parts[#parts]
end

local function fits(v, types)
  for name in types:gmatch("[^|]+") do
    if has_type(v, name) then return true end
  end
  return false
end

-- what a value is, for "got ...": scalars as they are, the rest by type
local function got(v)
  if v == nil then return "nil" end
  if type(v) == "string" then return ("%q"):format(v) end
  if type(v) == "number" or type(v) == "boolean" then return tostring(v) end
  if core.is_tensor(v) then return "a tensor" end
  if is_module(v) then return "a module (" .. tostring(v.__name) .. ")" end
  return "a " .. type(v)
end
M.got = got

-- is_finite(v): a number that is neither NaN nor infinite; finite(who, name, v):
-- else "needle.<who>: <name> must be a finite number, got <v>" at the user's line
-- (NaN passes every `x < 0` check: a NaN setting makes every result NaN)
local function is_finite(v)
  return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge
end
M.is_finite = is_finite
function M.finite(who, name, v)
  if not is_finite(v) then errors.fail(who, "%s must be a finite number, got %s", name, got(v)) end
end

-- no_extra(who, usage, max, ...): ... are the arguments after the `max`
-- documented ones (for a method, counted after self); one that is not nil is
-- an error naming the accepted form, as nd.save's ("needle.data.DataLoader:
-- takes DataLoader(dataset[, opts]) only, got an extra argument #3: 5"). A
-- trailing nil passes: an optional value handed along does no harm.
function M.no_extra(who, usage, max, ...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if v ~= nil then
      errors.fail(who, "takes %s only, got an extra argument #%d: %s", usage, max + i, got(v))
    end
  end
end
-- for positional arguments checked with the same types and words
-- (needle.tensor_ops: "argument 'dim' (position 3) must be an integer or a table")
M.fits = fits
M.describe_types = describe_types

-- "a, b, c": the keys of spec, sorted
function M.valid_list(spec)
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

-- the first key of opts (in sorted order; non-string keys first) that spec
-- does not have, or nil
local function first_unknown(opts, spec)
  local bad
  for k in pairs(opts) do
    if type(k) ~= "string" then
      if bad == nil or type(bad) == "string" then bad = k end
    elseif spec[k] == nil and (bad == nil or (type(bad) == "string" and k < bad)) then
      bad = k
    end
  end
  return bad
end

function M.check(who, opts, spec, context)
  if opts == nil then return {} end
  if type(opts) ~= "table" or core.is_tensor(opts) or is_module(opts) then
    errors.fail(who, "expected an options table, got %s", got(opts))
  end
  local bad = first_unknown(opts, spec)
  if bad ~= nil then
    local key = type(bad) == "string" and ("'%s'"):format(bad) or ("[%s]"):format(tostring(bad))
    local list = M.valid_list(spec)
    errors.fail(who, "unknown option %s%s (%s)", key, context and " " .. context or "",
                list == "" and "it takes no options" or "valid: " .. list)
  end
  local wrong
  for k, v in pairs(opts) do
    if not fits(v, spec[k]) and (wrong == nil or k < wrong) then wrong = k end
  end
  if wrong ~= nil then
    errors.fail(who, "option '%s' must be %s, got %s", wrong, describe_types(spec[wrong]), got(opts[wrong]))
  end
  -- An integral float where only an integer fits (num_layers = 2.0) comes
  -- back as the integer, in a copy (the caller's table is left alone), so
  -- that names and printing built from it read "2", not "2.0".
  local copy
  for k, v in pairs(opts) do
    if math.type(v) == "float" and fits(v, "integer") and not fits(v, (spec[k]:gsub("integer", ""))) then
      if copy == nil then
        copy = {}
        for k2, v2 in pairs(opts) do copy[k2] = v2 end
      end
      copy[k] = math.tointeger(v)
    end
  end
  return copy or opts
end

return M
