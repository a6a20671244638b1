-- needle.data.dataset: the Dataset base class and TensorDataset.
--
-- A dataset has `:len()` (also `#ds`) and `:get(i)` for 1-based i (also
-- `ds[i]`). Subclass with Dataset:extend(name) and define init/len/get:
--
--   local Squares = nd.data.Dataset:extend("Squares")
--   function Squares:init(n) self.n = n end
--   function Squares:len() return self.n end
--   function Squares:get(i) return nd.tensor(i * i) end
--   local ds = Squares(10); print(#ds, ds[3])
--
-- A dataset that DataLoader worker threads (num_workers > 0) can rebuild in
-- their own Lua states has a recipe, `ds.__worker = {module =, fn =, args =}`:
-- the worker builds require(module)[fn](table.unpack(args)) (docs/data.md).
--
-- TensorDataset(t1, t2, ..., [opts]) indexes every tensor along dim 1: item i
-- is t1[i] alone for one tensor, else the list {t1[i], t2[i], ...}.
-- opts.transform is applied to the first field of each item, opts.target_transform
-- to the second (as torchvision's transform / target_transform).
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local options = require "needle.options"

local is_tensor = core.is_tensor

local Dataset = {}
Dataset.__name = "Dataset"

local function make_instance_mt(class)
  return {
    -- ds[i]: a number key is an item number (2.0, 4 / 2 are item 2); one
    -- that is no integer, or out of 1..#ds, is an error naming the size
    __index = function(self, k)
      if type(k) == "number" then
        local i = self:_check_index(k, self:len())
        return self:get(i)
      end
      return class[k]
    end,
    __len = function(self) return self:len() end,
    -- ds1 + ds2: their ConcatDataset (as PyTorch's Dataset.__add__)
    __add = function(a, b) return require("needle.data.subset").ConcatDataset({a, b}) end,
    __tostring = function(self)
      local ok, n = pcall(self.len, self)
      return ("%s(%s items)"):format(class.__name, ok and tostring(n) or "?")
    end,
    __name = class.__name,
    class = class,
  }
end

-- Dataset:extend(name): a subclass; calling the class constructs an instance
-- (an empty table with the instance metatable, then init(...)).
function Dataset:extend(name)
  local class = setmetatable({}, {__index = self, __call = function(cls, ...) return cls:new(...) end})
  class.__name = name or "Dataset"
  class.super = self
  return class
end

function Dataset:new(...)
  local mt = rawget(self, "_instance_mt")
  if not mt then
    mt = make_instance_mt(self)
    rawset(self, "_instance_mt", mt)
  end
  local obj = setmetatable({}, mt)
  obj:init(...)
  return obj
end

setmetatable(Dataset, {__call = function(cls, ...) return cls:new(...) end})

function Dataset:init() end

function Dataset:len()
  error(("needle.data.%s: len is not defined (a Dataset subclass defines len and get)"):format(self.__name), 2)
end

function Dataset:get()
  error(("needle.data.%s: get is not defined (a Dataset subclass defines len and get)"):format(self.__name), 2)
end

-- Whether v is an instance of Dataset (or of a subclass).
function Dataset.is_dataset(v)
  local mt = type(v) == "table" and getmetatable(v)
  local class = mt and mt.class
  while class do
    if class == Dataset then return true end
    class = rawget(class, "super")
  end
  return false
end

-- Checks i against 1..n and returns it as an integer (an integral float,
-- 2.0 or 4 / 2, is that integer); the message names the dataset and its size.
function Dataset:_check_index(i, n)
  local k = require("needle.data.util").int_of(i)
  if k == nil then
    error(("needle.data.%s: index must be an integer in 1..%d (the dataset has %d items), got %s"):format(
      self.__name, n, n, type(i) == "number" and tostring(i) or require("needle.data.util").got(i)), 3)
  end
  if k < 1 or k > n then
    if n == 0 then
      error(("needle.data.%s: index %d out of range: the dataset is empty"):format(self.__name, k), 3)
    end
    error(("needle.data.%s: index %d out of range (expected 1..%d) for a dataset of %d items")
      :format(self.__name, k, n, n), 3)
  end
  return k
end

---------------------------------------------------------------------------
-- TensorDataset
---------------------------------------------------------------------------

local TensorDataset = Dataset:extend("TensorDataset")

function TensorDataset:init(...)
  local args = table.pack(...)
  local opts = {}
  if args.n > 0 and type(args[args.n]) == "table" and not is_tensor(args[args.n]) then
    opts = args[args.n]
    args.n = args.n - 1
  end
  if args.n == 0 then
    error("needle.data.TensorDataset: expected at least one tensor", 3)
  end
  local tensors, n = {}, nil
  for k = 1, args.n do
    local t = args[k]
    if not is_tensor(t) then
      error(("needle.data.TensorDataset: argument %d is a %s, expected a tensor"):format(k, type(t)), 3)
    end
    if t:dim() == 0 then
      error(("needle.data.TensorDataset: tensor %d is 0-dim; items are taken along dim 1"):format(k), 3)
    end
    local len = t:size(1)
    if n == nil then
      n = len
    elseif len ~= n then
      error(("needle.data.TensorDataset: size mismatch along dim 1: tensor 1 has %d rows, tensor %d has %d")
        :format(n, k, len), 3)
    end
    tensors[k] = t
  end
  opts = options.check("data.TensorDataset", opts, {transform = "callable", target_transform = "callable"})
  self.tensors = tensors
  self.n = n
  self.transform = opts.transform
  self.target_transform = opts.target_transform
  -- how a DataLoader worker thread rebuilds it (the tensors are shared, not
  -- copied); a subclass gives its own
  if getmetatable(self).class == TensorDataset then
    self.__worker = {module = "needle.data.dataset", fn = "TensorDataset", args = table.pack(...)}
  end
end

function TensorDataset:len() return self.n end

function TensorDataset:get(i)
  i = self:_check_index(i, self.n)
  local ts = self.tensors
  if #ts == 1 then
    local x = ts[1][i]
    if self.transform then x = self.transform(x) end
    return x
  end
  local item = {}
  for k = 1, #ts do item[k] = ts[k][i] end
  if self.transform then item[1] = self.transform(item[1]) end
  if self.target_transform then item[2] = self.target_transform(item[2]) end
  return item
end

-- Whether the DataLoader may batch this dataset by index_select on the whole
-- tensors (no per-item transform to run).
function TensorDataset:_batchable()
  return self.transform == nil and self.target_transform == nil
end

return {Dataset = Dataset, TensorDataset = TensorDataset}
