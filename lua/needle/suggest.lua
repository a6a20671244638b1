-- needle.suggest: "did you mean ...?" for a misspelt name (internal).
--
--   suggest.closest(word, names) -> the name of the list (or key of the set)
--       names closest to word, or nil. The distance is the one the tensor's
--       own errors use (core._closest, src/lua_bindings/lt_suggest.c): edits,
--       a swap of two neighbours counting as one, at most 1 for a word of up
--       to 4 letters, 2 up to 8 and 3 beyond; a difference of case only is
--       closest of all; ties go to the first name in byte order.
--   suggest.methods(class) -> the set of method names of a class and of the
--       classes it extends (the __index chain of their metatables)
--   suggest.module_miss(obj, class, k) -> nil, or an error at the user's line
--       "needle: no method 'forwrd' on module Linear; did you mean 'forward'?"
--
-- module_miss is the last step of a module instance's __index
-- (needle.nn.module): a name the instance does not have reads as nil, as Lua
-- code expects (`if self.bias then`), unless it is close to a method of the
-- class chain: then it is a misspelt call (`m:forwrd(x)` would otherwise fail
-- as "attempt to call a nil value"). Names shorter than 4 letters and names
-- starting with '_' are never taken for misspellings, and a name found not
-- to be close to any method is remembered per class, so that a forward that
-- reads an absent attribute on every call pays one table lookup.
local core = require "needle.core"
local errors = require "needle.errors"

local M = {}

function M.closest(word, names)
  return core._closest(word, names)
end

function M.methods(class)
  local names, seen = {}, {}
  local c = class
  while type(c) == "table" and not seen[c] do
    seen[c] = true
    for k, v in next, c do
      if type(k) == "string" and type(v) == "function" then names[k] = true end
    end
    local mt = getmetatable(c)
    c = type(mt) == "table" and rawget(mt, "__index") or nil
  end
  return names
end

local MIN_LEN = 4
-- class -> {name = true} for names known not to be close to a method
local plain = setmetatable({}, {__mode = "k"})

function M.module_miss(obj, class, k)
  if type(k) ~= "string" or #k < MIN_LEN or k:byte(1) == 95 then return nil end -- 95: '_'
  local known = plain[class]
  if known == nil then
    known = {}
    plain[class] = known
  elseif known[k] then
    return nil
  end
  local best = core._closest(k, M.methods(class))
  if best == nil then
    known[k] = true
    return nil
  end
  errors.raise(("needle: no method '%s' on module %s; did you mean '%s'?")
    :format(k, tostring(rawget(obj, "__name") or class.__name), best))
end

return M
