-- needle.data.subset: datasets made of other datasets (torch.utils.data's
-- Subset, ConcatDataset and random_split).
--
--   local sub = data.Subset(ds, {3, 1, 4})          -- sub[1] is ds[3]
--   local all = data.ConcatDataset({ds1, ds2})     -- or ds1 + ds2
--   local train, val = data.random_split(ds, {0.8, 0.2}, {generator_seed = 0})
--
-- Indices are 1-based. Each carries a recipe (__worker) naming the datasets
-- it is made of, so a DataLoader's worker threads rebuild it when those can
-- be rebuilt (docs/data.md, "Worker threads").
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"
local Dataset = require("needle.data.dataset").Dataset
local sampler = require "needle.data.sampler"
local no_extra = require("needle.data.util").no_extra

local M = {}

local function is_dataset(ds)
  return type(ds) == "table" and not core.is_tensor(ds) and type(ds.len) == "function" and
         type(ds.get) == "function"
end

-- ds as a dataset: a dataset as it is, a plain Lua list of items wrapped (as DataLoader does)
local function as_dataset(who, ds, what)
  if is_dataset(ds) then return ds end
  if type(ds) == "table" and getmetatable(ds) == nil then
    return require("needle.data.dataloader")._wrap_dataset(ds)
  end
  errors.fail(who, "%s is %s, expected a dataset (with len and get) or a Lua list of items", what, options.got(ds))
end

-- The indices as a Lua list of integers in 1..n (a list, or a 1-D integer tensor).
local function index_list(who, indices, n)
  local list
  if core.is_tensor(indices) then
    if indices:dim() ~= 1 or (indices.dtype ~= "int64" and indices.dtype ~= "int32") then
      errors.fail(who, "indices must be a 1-D integer tensor or a Lua list, got a %s tensor of shape %s",
                  indices.dtype, errors.shape_str(indices))
    end
    list = indices:totable()
  elseif type(indices) == "table" and getmetatable(indices) == nil then
    list = indices
  else
    errors.fail(who, "indices must be a Lua list or a 1-D integer tensor, got %s", options.got(indices))
  end
  for k = 1, #list do
    local i = list[k]
    if math.type(i) ~= "integer" then
      errors.fail(who, "indices[%d] is %s, expected an integer", k, options.got(i))
    end
    if i < 1 or i > n then
      errors.fail(who, "indices[%d] = %d is out of range for a dataset of %d items (expected 1..%d)", k, i, n, n)
    end
  end
  return list
end

---------------------------------------------------------------------------
-- Subset
---------------------------------------------------------------------------

-- Subset(dataset, indices): item k is dataset[indices[k]].
local Subset = Dataset:extend("Subset")

function Subset:init(dataset, indices, ...)
  no_extra("data.Subset", "Subset(dataset, indices)", 2, ...)
  dataset = as_dataset("data.Subset", dataset, "the dataset")
  local n = dataset:len()
  self.dataset = dataset
  self.indices = index_list("data.Subset", indices, n)
  if getmetatable(self).class == Subset then
    self.__worker = {module = "needle.data.subset", fn = "Subset", args = {dataset, self.indices}}
  end
end

function Subset:len() return #self.indices end

function Subset:get(k)
  k = self:_check_index(k, #self.indices)
  return self.dataset:get(self.indices[k])
end

---------------------------------------------------------------------------
-- ConcatDataset
---------------------------------------------------------------------------

-- ConcatDataset(datasets): the items of datasets[1], then of datasets[2], ...
-- cumulative_sizes[k] is the number of items in datasets 1..k (PyTorch's).
local ConcatDataset = Dataset:extend("ConcatDataset")

function ConcatDataset:init(datasets, ...)
  no_extra("data.ConcatDataset", "ConcatDataset({ds1, ds2, ...})", 1, ...)
  if type(datasets) ~= "table" or getmetatable(datasets) ~= nil or core.is_tensor(datasets) then
    errors.fail("data.ConcatDataset", "expected a Lua list of datasets, got %s", options.got(datasets))
  end
  if #datasets == 0 then errors.fail("data.ConcatDataset", "datasets must not be empty") end
  local sizes, total, list = {}, 0, {}
  for k, ds in ipairs(datasets) do
    list[k] = as_dataset("data.ConcatDataset", ds, ("datasets[%d]"):format(k))
    total = total + list[k]:len()
    sizes[k] = total
  end
  self.datasets = list
  self.cumulative_sizes = sizes
  if getmetatable(self).class == ConcatDataset then
    self.__worker = {module = "needle.data.subset", fn = "ConcatDataset", args = {self.datasets}}
  end
end

function ConcatDataset:len() return self.cumulative_sizes[#self.cumulative_sizes] end

-- which dataset item i falls in (the first whose cumulative size reaches it), and where
function ConcatDataset:locate(i)
  i = self:_check_index(i, self:len())
  local sizes = self.cumulative_sizes
  local lo, hi = 1, #sizes
  while lo < hi do
    local mid = (lo + hi) // 2
    if sizes[mid] >= i then hi = mid else lo = mid + 1 end
  end
  return lo, i - (sizes[lo - 1] or 0)
end

function ConcatDataset:get(i)
  local d, j = self:locate(i)
  return self.datasets[d]:get(j)
end

---------------------------------------------------------------------------
-- random_split
---------------------------------------------------------------------------

-- PyTorch's rule: lengths that are fractions summing to 1 become
-- floor(n * fraction) each, and the items left over go one by one to the
-- splits in order (round robin); counts must sum to n.
local function split_lengths(who, lengths, n)
  if type(lengths) ~= "table" or getmetatable(lengths) ~= nil or #lengths == 0 then
    errors.fail(who, "lengths must be a non-empty Lua list of counts or fractions, got %s", options.got(lengths))
  end
  local sum = 0
  for k, v in ipairs(lengths) do
    if type(v) ~= "number" or v ~= v then errors.fail(who, "lengths[%d] is %s, expected a number", k, options.got(v)) end
    sum = sum + v
  end
  -- math.isclose(sum, 1) (relative tolerance 1e-9) and sum <= 1
  if math.abs(sum - 1) <= 1e-9 and sum <= 1 then
    local out, total = {}, 0
    for k, f in ipairs(lengths) do
      if not (f >= 0 and f <= 1) then errors.fail(who, "fraction lengths[%d] = %s is not between 0 and 1", k, tostring(f)) end
      out[k] = math.floor(n * f)
      total = total + out[k]
    end
    for i = 0, n - total - 1 do
      local k = i % #out + 1
      out[k] = out[k] + 1
    end
    return out
  end
  local out, total = {}, 0
  for k, v in ipairs(lengths) do
    local c = math.tointeger(v)
    if c == nil or c < 0 then
      errors.fail(who, "lengths[%d] = %s: counts must be non-negative integers (or give fractions summing to 1)",
                  k, tostring(v))
    end
    out[k] = c
    total = total + c
  end
  if total ~= n then
    errors.fail(who, "the lengths sum to %d but the dataset has %d items", total, n)
  end
  return out
end
M.split_lengths = split_lengths

-- random_split(dataset, lengths, {generator_seed =}) -> Subset, Subset, ...
-- (one per length; {random_split(...)} for a list). The items are dealt by
-- nd.randperm(n): from the global random stream, or with generator_seed, from
-- a generator seeded with it (the global stream is then left alone).
function M.random_split(dataset, lengths, opts, ...)
  local who = "data.random_split"
  no_extra(who, "random_split(dataset, lengths[, opts])", 3, ...)
  local o = options.check(who, opts, {generator_seed = "integer"})
  dataset = as_dataset(who, dataset, "the dataset")
  local n = dataset:len()
  local sizes = split_lengths(who, lengths, n)
  local perm
  if n == 0 then perm = {}
  elseif o.generator_seed ~= nil then perm = sampler.seeded(o.generator_seed, core.randperm, n):totable()
  else perm = core.randperm(n):totable() end
  local out, offset = {}, 0
  for k, len in ipairs(sizes) do
    out[k] = Subset(dataset, table.move(perm, offset + 1, offset + len, 1, {}))
    offset = offset + len
  end
  return table.unpack(out, 1, #sizes)
end

M.Subset = Subset
M.ConcatDataset = ConcatDataset
return M
