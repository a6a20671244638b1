-- needle.lazy: tables whose entries load on first use (internal).
--
--   lazy(t, entries[, opts]) -> t
--
-- gives t a metatable under which t[k], for a key k of entries, requires the
-- module entries[k] names the first time and keeps the result in t (rawset):
-- a string names a whole module, {name} the field k of that module. Any other
-- key is nil. opts.walk = true adds __pairs: pairs(t) loads every entry
-- first. A module that lacks its field is an error "needle.<opts.who>: <module>
-- does not define <k>" (who: "lazy" unless given).
--
-- The metatable's __lazy is entries itself: what t will hold, known without
-- loading anything (the REPL's tab completion lists it, nd.help walks it).
-- Indexing t with one of its keys is what loads that entry.
local error = require("needle.errors").error -- positions at the user's line

return function(t, entries, opts)
  opts = opts or {}
  local function load(tbl, k)
    local e = entries[k]
    if e == nil then return nil end
    local v
    if type(e) == "string" then
      v = require(e)
    else
      v = require(e[1])[k]
      if v == nil then error(("needle.%s: %s does not define %s"):format(opts.who or "lazy", e[1], k), 2) end
    end
    rawset(tbl, k, v)
    return v
  end
  local mt = {__index = load, __lazy = entries}
  if opts.walk then
    mt.__pairs = function(tbl)
      for k in pairs(entries) do if rawget(tbl, k) == nil then load(tbl, k) end end
      return next, tbl, nil
    end
  end
  return setmetatable(t, mt)
end
