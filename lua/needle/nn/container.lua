-- needle.nn.container: Sequential, ModuleList, Residual, ModuleDict,
-- ParameterList, ParameterDict.
--
--   local model = nd.nn.Sequential(nd.nn.Linear(784, 128), nd.nn.ReLU(), nd.nn.Linear(128, 10))
--   model[1]                  -- the first Linear (Lua's 1-based indexing)
--   model:state_dict()        -- keys "0.weight", "0.bias", "2.weight", ... as PyTorch
--   #model                    -- 3; ipairs(model) walks the modules
--   local heads = nd.nn.ModuleDict({{"cls", nd.nn.Linear(8, 2)}, {"box", nd.nn.Linear(8, 4)}})
--   heads.cls, heads["box"]   -- by key; pairs(heads) walks them in insertion order
--
-- Children are named "0" .. "n-1" (the dicts: by their keys), PyTorch's
-- names, so that state_dict keys match PyTorch's; integer indexing is
-- 1-based (negative counts from the end).
local error = require("needle.errors").error -- positions at the user's line
local Module = require "needle.nn.module"
local core = require "needle.core"
local shape_str = require("needle.errors").shape_str

local M = {}

local function count(self)
  local n = 0
  local children = rawget(self, "_children")
  while children[tostring(n)] ~= nil do n = n + 1 end
  return n
end

-- the position p (1-based, negative from the end) as a 0-based child name, or
-- nil when out of range
local function child_name(self, p, n)
  n = n or count(self)
  if p < 0 then p = n + 1 + p end
  if p < 1 or p > n then return nil end
  return tostring(p - 1)
end

-- Instances of list-like containers get integer indexing and #: their
-- class's instance metatable (built by Module.new) is extended once.
local function make_indexable(obj)
  local mt = getmetatable(obj)
  if rawget(mt, "_indexable") then return end
  local index, newindex = mt.__index, mt.__newindex
  mt.__index = function(self, k)
    if math.type(k) == "integer" then
      local name = child_name(self, k)
      return name and rawget(self, "_children")[name] or nil
    end
    return index(self, k)
  end
  mt.__newindex = function(self, k, v)
    if math.type(k) == "integer" then
      local n = count(self)
      local name = child_name(self, k, n)
      if name == nil and k == n + 1 then name = tostring(n) end
      if name == nil then
        error(("needle.nn.%s: index %d out of range for %d modules"):format(self.__name, k, n), 2)
      end
      if not Module.is_module(v) then
        error(("needle.nn.%s: item %d must be a module, got %s"):format(self.__name, k, type(v)), 2)
      end
      self:_set(name, v)
      return
    end
    newindex(self, k, v)
  end
  mt.__len = count
  rawset(mt, "_indexable", true)
end

-- the modules given as varargs or as one Lua list
local function module_list(name, ...)
  local args = table.pack(...)
  if args.n == 1 and type(args[1]) == "table" and not Module.is_module(args[1]) then
    local list = args[1]
    args = {n = #list}
    for i = 1, #list do args[i] = list[i] end
  end
  for i = 1, args.n do
    if not Module.is_module(args[i]) then
      error(("needle.nn.%s: argument %d must be a module, got %s"):format(name, i, type(args[i])), 4)
    end
  end
  return args
end

local function list_methods(C)
  function C:new(...)
    local obj = Module.new(self, ...)
    make_indexable(obj)
    return obj
  end

  function C:append(m)
    if not Module.is_module(m) then
      error(("needle.nn.%s.append: expected a module, got %s"):format(self.__name, type(m)), 2)
    end
    self:_set(tostring(count(self)), m)
    return self
  end

  function C:extend(list)
    -- called on the class (C:extend("Name")) it makes a subclass, as Module's
    if rawget(self, "_children") == nil then return Module.extend(self, list) end
    for _, m in ipairs(list) do self:append(m) end
    return self
  end

  -- insert(index, module): before the 1-based index (negative from the end)
  function C:insert(index, m)
    if not Module.is_module(m) then
      error(("needle.nn.%s.insert: expected a module, got %s"):format(self.__name, type(m)), 2)
    end
    local n = count(self)
    if index < 0 then index = n + 2 + index end
    if index < 1 or index > n + 1 then
      error(("needle.nn.%s.insert: index %d out of range for %d modules"):format(self.__name, index, n), 2)
    end
    local children = rawget(self, "_children")
    local items = {}
    for i = 1, n do items[i] = children[tostring(i - 1)] end
    table.insert(items, index, m)
    for i = index, n + 1 do self:_set(tostring(i - 1), items[i]) end
    return self
  end

  -- the modules as a Lua list
  function C:totable()
    local out, children = {}, rawget(self, "_children")
    for i = 1, count(self) do out[i] = children[tostring(i - 1)] end
    return out
  end
end

-- Sequential -----------------------------------------------------------------

local Sequential = Module:extend("Sequential")
list_methods(Sequential)

-- Sequential(m1, m2, ...) or Sequential({m1, m2, ...})
function Sequential:init(...)
  local mods = module_list("Sequential", ...)
  for i = 1, mods.n do self:_set(tostring(i - 1), mods[i]) end
end

function Sequential:forward(x, ...)
  local children = rawget(self, "_children")
  local n = count(self)
  if n == 0 then return x, ... end
  for i = 1, n do
    if i == 1 then x = children["0"](x, ...) else x = children[tostring(i - 1)](x) end
  end
  return x
end
M.Sequential = Sequential

-- ModuleList ------------------------------------------------------------------

local ModuleList = Module:extend("ModuleList")
list_methods(ModuleList)

-- ModuleList({m1, m2, ...}) or ModuleList(m1, m2, ...) or ModuleList()
function ModuleList:init(...)
  if select("#", ...) == 0 then return end
  local mods = module_list("ModuleList", ...)
  for i = 1, mods.n do self:_set(tostring(i - 1), mods[i]) end
end

function ModuleList:forward(...) -- (any arguments: the message says why)
  error("needle.nn.ModuleList: a ModuleList is not callable; iterate over it in the parent's forward", 2)
end
M.ModuleList = ModuleList

-- Residual --------------------------------------------------------------------

-- Residual(fn): fn(x) + x (needle's)
local Residual = Module:extend("Residual")
function Residual:init(fn)
  if not Module.is_module(fn) then
    error(("needle.nn.Residual: fn must be a module, got %s"):format(type(fn)), 3)
  end
  self.fn = fn
end
function Residual:forward(x) return self.fn(x) + x end
M.Residual = Residual

-- ModuleDict, ParameterList, ParameterDict -------------------------------------

-- the entries of a keyed container in insertion order: {key, value} pairs
-- (the module's registration order, _order, is the insertion order)
local function keyed_items(self, kind)
  local out, store = {}, rawget(self, kind == "child" and "_children" or "_params")
  for _, e in ipairs(rawget(self, "_order")) do
    local v = store[e[2]]
    if e[1] == kind and v ~= nil then out[#out + 1] = {e[2], v} end
  end
  return out
end

-- removes key from the registration order, so that inserting it again puts
-- it last, as Python's dicts
local function forget(self, key)
  local order = rawget(self, "_order")
  for i, e in ipairs(order) do
    if e[2] == key then table.remove(order, i); return end
  end
end

-- The entries a dict container is built or updated from, as {key, value}
-- pairs: a list of {key, value} pairs (kept in its order), a dict container
-- of the same kind (its order) or a table with string keys (sorted: a Lua
-- table has no insertion order, and the state_dict's order must not change
-- from run to run).
local function entries_of(who, arg, level)
  if arg == nil then return {} end
  if Module.is_module(arg) and arg.items then return arg:items() end
  if type(arg) ~= "table" or Module.is_module(arg) or core.is_tensor(arg) then
    error(("needle.nn.%s: expected a table of entries, got %s"):format(who, type(arg)), level)
  end
  if #arg > 0 then
    local out = {}
    for i, kv in ipairs(arg) do
      if type(kv) ~= "table" or #kv ~= 2 or Module.is_module(kv) then
        error(("needle.nn.%s: entry %d must be a {key, value} pair"):format(who, i), level)
      end
      out[i] = {kv[1], kv[2]}
    end
    local n = 0
    for _ in pairs(arg) do n = n + 1 end
    if n ~= #arg then
      error(("needle.nn.%s: give entries as a list of {key, value} pairs or as string keys, not both"):format(who), level)
    end
    return out
  end
  local keys = {}
  for k in pairs(arg) do keys[#keys + 1] = k end
  for _, k in ipairs(keys) do
    if type(k) ~= "string" then error(("needle.nn.%s: keys must be strings, got %s"):format(who, type(k)), level) end
  end
  table.sort(keys)
  local out = {}
  for i, k in ipairs(keys) do out[i] = {k, arg[k]} end
  return out
end

-- the raw fields every module has or may get (nn/module.lua's RESERVED):
-- an entry of that name would overwrite the module's own state
local MODULE_FIELDS = {training = true, _params = true, _buffers = true, _children = true, _order = true,
                       _attrs = true, _hooks = true, _non_persistent = true}

-- Keyed containers: t[key] reads an entry (the module's own lookup), t[key]
-- = v adds or replaces one (nil removes it), pairs(t) walks the entries in
-- insertion order, #t counts them. A key must be a string without "." that
-- is no method or attribute of the container, nor one of Module's own raw
-- fields (training, _params, ...) (PyTorch refuses those too: KeyError).
-- kind: "child" (ModuleDict) or "param" (ParameterDict); value(self, v,
-- level) checks and converts a value.
local function make_keyed(obj, kind, value)
  local mt = getmetatable(obj)
  if rawget(mt, "_keyed") then return end
  mt.__newindex = function(self, k, v)
    if type(k) ~= "string" or k == "" or k:find(".", 1, true) or mt.class[k] ~= nil or MODULE_FIELDS[k]
       or rawget(self, k) ~= nil then
      error(("needle.nn.%s: key %s is not valid (a non-empty string without '.' that is no method or attribute " ..
             "of the %s)"):format(self.__name, type(k) == "string" and ("'" .. k .. "'") or tostring(k), self.__name), 2)
    end
    if v == nil then
      self:_set(k, nil)
      forget(self, k)
      return
    end
    v = value(self, v, 3)
    if kind == "param" then self:register_parameter(k, v) else self:_set(k, v) end
  end
  mt.__len = function(self) return #keyed_items(self, kind) end
  mt.__pairs = function(self)
    local items, i = keyed_items(self, kind), 0
    return function()
      i = i + 1
      if items[i] then return items[i][1], items[i][2] end
    end, self, nil
  end
  rawset(mt, "_keyed", true)
end

-- the methods of a keyed container
local function keyed_methods(C, kind)
  function C:items() return keyed_items(self, kind) end
  function C:keys()
    local out = {}
    for i, kv in ipairs(keyed_items(self, kind)) do out[i] = kv[1] end
    return out
  end
  function C:values()
    local out = {}
    for i, kv in ipairs(keyed_items(self, kind)) do out[i] = kv[2] end
    return out
  end
  -- update(entries): adds or replaces (see entries_of for the forms)
  -- (entries go through the keyed __newindex even where a raw field of that
  -- name exists, such as training, which a plain assignment would overwrite)
  function C:update(entries)
    local set = getmetatable(self).__newindex
    for _, kv in ipairs(entries_of(self.__name .. ".update", entries, 3)) do set(self, kv[1], kv[2]) end
    return self
  end
  function C:_fill(entries)
    local set = getmetatable(self).__newindex
    for _, kv in ipairs(entries_of(self.__name, entries, 4)) do set(self, kv[1], kv[2]) end
  end
  -- pop(key): removes the entry and returns its value
  function C:pop(key)
    local v = (kind == "child" and rawget(self, "_children") or rawget(self, "_params"))[key]
    if v == nil then error(("needle.nn.%s.pop: no entry '%s'"):format(self.__name, tostring(key)), 2) end
    self[key] = nil
    return v
  end
  function C:clear()
    for _, k in ipairs(self:keys()) do self[k] = nil end
    return self
  end
  function C:forward(...) -- (any arguments: the message says why)
    error(("needle.nn.%s: a %s is not callable; use its entries in the parent's forward"):format(
      self.__name, self.__name), 2)
  end
end

-- "0: {2} float32, 1: {3,2} float32": the parameters of a ParameterList or
-- ParameterDict, for printing
local function params_repr(items)
  local parts = {}
  for i, kv in ipairs(items) do
    parts[i] = ("%s: %s %s"):format(kv[1], shape_str(kv[2]), kv[2].dtype)
  end
  return table.concat(parts, ", ")
end

local function module_value(self, v, level)
  if not Module.is_module(v) then
    error(("needle.nn.%s: values must be modules, got %s"):format(self.__name, type(v)), level + 1)
  end
  return v
end

-- a tensor as a parameter: a leaf is marked (and shared, as nn.Parameter's
-- data); a tensor with a history is detached first
local function param_value(self, v, level)
  if not core.is_tensor(v) then
    error(("needle.nn.%s: values must be tensors, got %s"):format(self.__name, type(v)), level + 1)
  end
  return Module.Parameter(v.is_leaf and v or v:detach())
end

local ModuleDict = Module:extend("ModuleDict")
keyed_methods(ModuleDict, "child")

-- ModuleDict(entries): modules by string key (state_dict keys "<key>.weight", ...)
function ModuleDict:init(entries)
  make_keyed(self, "child", module_value)
  self:_fill(entries)
end
M.ModuleDict = ModuleDict

local ParameterDict = Module:extend("ParameterDict")
keyed_methods(ParameterDict, "param")

-- ParameterDict(entries): tensors (made parameters) by string key
function ParameterDict:init(entries)
  make_keyed(self, "param", param_value)
  self:_fill(entries)
end
function ParameterDict:extra_repr() return params_repr(self:items()) end
M.ParameterDict = ParameterDict

-- ParameterList ------------------------------------------------------------------

local ParameterList = Module:extend("ParameterList")

local function param_count(self)
  local n, params = 0, rawget(self, "_params")
  while params[tostring(n)] ~= nil do n = n + 1 end
  return n
end

-- ParameterList({t1, t2, ...}): tensors (made parameters) named "0", "1", ...
-- as PyTorch; p[i] is 1-based (negative from the end), p[#p + 1] = t appends
function ParameterList:init(values)
  local mt = getmetatable(self)
  if not rawget(mt, "_indexable") then
    local index, newindex = mt.__index, mt.__newindex
    mt.__index = function(obj, k)
      if math.type(k) ~= "integer" then return index(obj, k) end
      local n = param_count(obj)
      if k < 0 then k = n + 1 + k end
      return (k >= 1 and k <= n) and rawget(obj, "_params")[tostring(k - 1)] or nil
    end
    mt.__newindex = function(obj, k, v)
      if math.type(k) ~= "integer" then return newindex(obj, k, v) end
      local n = param_count(obj)
      local i = k < 0 and n + 1 + k or k
      if i < 1 or i > n + 1 then
        error(("needle.nn.ParameterList: index %d out of range for %d parameters"):format(k, n), 2)
      end
      obj:register_parameter(tostring(i - 1), param_value(obj, v, 2))
    end
    mt.__len = param_count
    rawset(mt, "_indexable", true)
  end
  if values ~= nil then
    if type(values) ~= "table" or Module.is_module(values) or core.is_tensor(values) then
      error(("needle.nn.ParameterList: expected a list of tensors, got %s"):format(type(values)), 3)
    end
    for _, v in ipairs(values) do self:append(v) end
  end
end

function ParameterList:append(t)
  self[param_count(self) + 1] = t
  return self
end

function ParameterList:extend(list)
  -- called on the class (ParameterList:extend("Name")) it makes a subclass, as Module's
  if rawget(self, "_params") == nil then return Module.extend(self, list) end
  for _, t in ipairs(list) do self:append(t) end
  return self
end

function ParameterList:forward(...) -- (any arguments: the message says why)
  error("needle.nn.ParameterList: a ParameterList is not callable; use its parameters in the parent's forward", 2)
end
function ParameterList:extra_repr()
  local items = {}
  for i = 1, #self do items[i] = {tostring(i - 1), self[i]} end
  return params_repr(items)
end
M.ParameterList = ParameterList

return M
