-- needle.nn.container: Sequential, ModuleList, Residual.
--
--   local model = nd.nn.Sequential(nd.nn.Linear(784, 128), nd.nn.ReLU(), nd.nn.Linear(128, 10))
--   model[1]                  -- the first Linear (Lua's 1-based indexing)
--   model:state_dict()        -- keys "0.weight", "0.bias", "2.weight", ... as PyTorch
--   #model                    -- 3; ipairs(model) walks the modules
--
-- Children are named "0" .. "n-1", PyTorch's names, so that state_dict keys
-- match PyTorch's; integer indexing is 1-based (negative counts from the end).
local error = require("needle.errors").error -- positions at the user's line
local Module = require "needle.nn.module"

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

function ModuleList:forward()
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

return M
