-- needle.data.recipe: how a DataLoader's worker threads rebuild its dataset
-- (and collate_fn) in Lua states of their own (internal; docs/data.md,
-- "Worker threads").
--
-- A Lua value cannot move to another Lua state: a worker gets a description
-- instead, made of plain values and tensors (which are shared, not copied)
-- and rebuilds from it. An object that is not plain data (a Dataset, a
-- transform) describes itself with a recipe, a field
--
--   obj.__worker = {module = "mydata", fn = "MyData", args = {...}}
--
-- (or a method obj:__worker() returning one): the worker builds it as
-- require(module)[fn](table.unpack(args, 1, args.n)) (require(module)(...)
-- without fn); without args the value is require(module)[fn] itself (a
-- function: a collate_fn). args are described the same way, so a recipe may
-- name other rebuildable objects (a Subset's dataset, a Compose's transforms).
--
--   describe(v, where) -> the description (in the loader's state), or an error
--                         naming what cannot cross and where it is
--   build(d) -> the value again (in the worker's state)
--   from_module(module, fn, ...) -> require(module)[fn](...), made rebuildable
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local MARK = "__needle_recipe" -- a described object: {[MARK] = true, module =, fn =, args =}
local MAX_DEPTH = 100

local fail = errors.failer("data.DataLoader")

local HOW = "give it a recipe (obj.__worker = {module =, fn =, args =}) or use num_workers = 0; docs/data.md"

local function key_str(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return "." .. k end
  if type(k) == "string" then return ("[%q]"):format(k) end
  return "[" .. tostring(k) .. "]"
end

local function recipe_of(v)
  local r = rawget(v, "__worker")
  if r == nil and getmetatable(v) ~= nil then
    local ok, got = pcall(function() return v.__worker end)
    if ok then r = got end
  end
  if type(r) == "function" then r = r(v) end
  return r
end

local function describe(v, where, open, depth)
  local t = type(v)
  if t == "nil" or t == "boolean" or t == "number" or t == "string" then return v end
  if core.is_tensor(v) then
    if v.device ~= "cpu" then
      fail("num_workers > 0: %s is a tensor on %s; worker threads work on the CPU (keep the dataset on the " ..
           "CPU and move each batch to the device in the loop)", where, v.device)
    end
    if v.requires_grad then
      fail("num_workers > 0: %s is a tensor that requires grad; worker threads run without autograd " ..
           "(give the dataset x:detach())", where)
    end
    return v
  end
  if t ~= "table" then
    fail("num_workers > 0: %s is a %s, which a worker thread cannot rebuild; %s", where, t, HOW)
  end
  if open[v] then fail("num_workers > 0: %s contains itself (a table with a cycle)", where) end
  if depth >= MAX_DEPTH then fail("num_workers > 0: %s nests tables more than %d levels deep", where, MAX_DEPTH) end
  open[v] = true
  local out
  local r = recipe_of(v)
  if r ~= nil then
    if type(r) ~= "table" or type(r.module) ~= "string" or (r.fn ~= nil and type(r.fn) ~= "string") or
       (r.args ~= nil and (type(r.args) ~= "table" or getmetatable(r.args) ~= nil)) then
      fail("num_workers > 0: %s.__worker must be {module = <string>, fn = <string or nil>, args = <list or nil>}, " ..
           "got %s", where, options.got(r))
    end
    local dargs
    if r.args ~= nil then
      dargs = {n = r.args.n or #r.args}
      for i = 1, dargs.n do
        dargs[i] = describe(r.args[i], ("%s.__worker.args[%d]"):format(where, i), open, depth + 1)
      end
    end
    out = {[MARK] = true, module = r.module, fn = r.fn, args = dargs}
  elseif getmetatable(v) ~= nil then
    local mt = getmetatable(v)
    local name = type(mt) == "table" and rawget(mt, "__name")
    local shown = type(name) == "string" and ("a " .. name) or
                  (type(mt) == "table" and rawget(mt, "__tostring") and tostring(v)) or "a table with a metatable"
    fail("num_workers > 0: %s is %s without a recipe, which a worker thread cannot rebuild; %s", where, shown, HOW)
  else
    out = {}
    for k, x in pairs(v) do
      local kt = type(k)
      if kt ~= "string" and kt ~= "number" and kt ~= "boolean" then
        fail("num_workers > 0: %s has a key of type %s", where, kt)
      end
      out[k] = describe(x, where .. key_str(k), open, depth + 1)
    end
  end
  open[v] = nil
  return out
end

function M.describe(v, where)
  return describe(v, where, {}, 0)
end

-- (in a worker) the value a description stands for
function M.build(d)
  if type(d) ~= "table" or core.is_tensor(d) then return d end
  if d[MARK] then
    local mod = require(d.module)
    local f = mod
    if d.fn ~= nil then
      f = type(mod) == "table" and mod[d.fn] or nil
      if f == nil then
        error(("needle.data.DataLoader: recipe: module '%s' has no field '%s'"):format(d.module, d.fn), 0)
      end
    end
    if d.args == nil then return f end -- the field itself (a function)
    local args = {}
    for i = 1, d.args.n do args[i] = M.build(d.args[i]) end
    return f(table.unpack(args, 1, d.args.n))
  end
  for k, v in pairs(d) do d[k] = M.build(v) end
  return d
end

-- from_module(module, fn, ...) -> require(module)[fn](...) (require(module)(...)
-- when fn is nil), carrying its recipe so that worker threads build the same.
-- A function result is wrapped in a callable table (a collate_fn).
function M.from_module(module, fn, ...)
  if type(module) ~= "string" then
    errors.fail("data.from_module", "module must be a module name (a string), got %s", options.got(module))
  end
  if fn ~= nil and type(fn) ~= "string" then
    errors.fail("data.from_module", "fn must be the name of a field of the module (a string) or nil, got %s",
                options.got(fn))
  end
  local mod = require(module)
  local f = mod
  if fn ~= nil then
    f = type(mod) == "table" and mod[fn] or nil
    if f == nil then errors.fail("data.from_module", "module '%s' has no field '%s'", module, fn) end
  end
  local obj = f(...)
  local recipe = {module = module, fn = fn, args = table.pack(...)}
  if type(obj) == "function" then
    local call = obj
    return setmetatable({__worker = recipe}, {__call = function(_, ...) return call(...) end,
                                              __name = "from_module(" .. module .. ")"})
  end
  if type(obj) ~= "table" then
    errors.fail("data.from_module", "%s%s returned %s: only a table or a function can carry a recipe", module,
                fn and ("." .. fn) or "", options.got(obj))
  end
  rawset(obj, "__worker", recipe)
  return obj
end

return M
