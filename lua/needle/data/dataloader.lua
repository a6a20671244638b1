-- needle.data.dataloader: batches from a dataset, in order or shuffled.
--
--   local loader = nd.data.DataLoader(ds, {batch_size = 64, shuffle = true, seed = 1})
--   for x, y in loader:iter() do ... end          -- items that are pairs
--   for batch in loader:iter() do ... end         -- items that are single tensors
--   print(#loader)                                 -- number of batches
--
-- Shuffling has its own generator: a seed (opts.seed, or one drawn from the
-- global generator once, when the loader is built) and the epoch number give
-- the order, so epoch e of a loader built with seed s is the same in every
-- run, different epochs give different orders, and iterating never moves the
-- global random stream (nd.rand after a loop equals nd.rand without it).
--
-- opts.sampler picks the items instead (not with shuffle): an object with
-- len() and indices(epoch) -> an int64 tensor of 1-based item numbers, such
-- as nd.data.DistributedSampler, which gives each rank of a data-parallel
-- job its own share; loader:set_epoch(e) reaches it through the epoch.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local dataset_mod = require "needle.data.dataset"
local options = require "needle.options"
local errors = require "needle.errors"

local is_tensor = core.is_tensor
local TensorDataset = dataset_mod.TensorDataset

local DataLoader = {}
DataLoader.__index = DataLoader
DataLoader.__name = "DataLoader"

-- raised at the user's line, however deep inside the loader (a collate of a
-- nested item runs several calls down)
local errorf = errors.failer("data.DataLoader")

---------------------------------------------------------------------------
-- collate
---------------------------------------------------------------------------

local function describe(v)
  if is_tensor(v) then return ("a tensor of shape {%s}"):format(table.concat(v.shape, ",")) end
  return "a " .. type(v)
end

-- Items may nest tables this deep (a deeper item is almost surely a mistake,
-- and Lua's stack would give out a few thousand levels further).
local MAX_DEPTH = 100

-- "item.x[2].y": where a field sits inside an item (keys: the path from the
-- item down); at most the first and last few keys of a long path
local function path_str(keys, depth)
  local parts = {"item"}
  local function add(k)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") then parts[#parts + 1] = "." .. k
    elseif type(k) == "string" then parts[#parts + 1] = ("[%q]"):format(k)
    else parts[#parts + 1] = "[" .. tostring(k) .. "]" end
  end
  for i = 1, math.min(depth, 6) do add(keys[i]) end
  if depth > 8 then parts[#parts + 1] = ("...(%d more)..."):format(depth - 8) end
  for i = math.max(7, depth - 1), depth do add(keys[i]) end
  return table.concat(parts)
end

-- default_collate(samples) -> batch: tensors are stacked along a new dim 1
-- (nd.stack), numbers become a 1-D tensor (int64 when all are integers, else
-- float32), booleans a bool tensor, strings stay a list, and tables (lists or
-- records of fields) are collated field by field into a table of the same shape.
-- A table that contains itself, or tables nested deeper than MAX_DEPTH, are
-- errors naming the path (the field-by-field walk would never end).
-- keys, depth and open (the tables of item 1 being walked) are the walk's.
local function default_collate(samples, keys, depth, open)
  keys, depth, open = keys or {}, depth or 0, open or {}
  local first = samples[1]
  if is_tensor(first) then
    for k = 2, #samples do
      if not is_tensor(samples[k]) then
        errorf("collate: item 1 is a tensor but item %d is %s", k, describe(samples[k]))
      end
    end
    local ok, res = pcall(core.stack, samples, 1)
    if not ok then errorf("collate: cannot stack the items' tensors: %s", tostring(res)) end
    return res
  end
  local t = type(first)
  if t == "number" then
    local all_int = true
    for k = 1, #samples do
      local v = samples[k]
      if type(v) ~= "number" then errorf("collate: item 1 is a number but item %d is %s", k, describe(v)) end
      if math.type(v) ~= "integer" then all_int = false end
    end
    return core.tensor(samples, {dtype = all_int and "int64" or "float32"})
  elseif t == "boolean" then
    return core.tensor(samples, {dtype = "bool"})
  elseif t == "string" then
    local out = {}
    for k = 1, #samples do out[k] = samples[k] end
    return out
  elseif t == "table" then
    if open[first] then
      errorf("collate: item 1 contains itself (at %s): a table with a cycle cannot be batched",
             path_str(keys, depth))
    end
    if depth >= MAX_DEPTH then
      errorf("collate: items nest tables more than %d levels deep (at %s)", MAX_DEPTH, path_str(keys, depth))
    end
    open[first] = true
    local out = {}
    for key in pairs(first) do
      local column = {}
      for k = 1, #samples do
        local item = samples[k]
        if type(item) ~= "table" or is_tensor(item) then
          errorf("collate: item 1 is a table but item %d is %s", k, describe(item))
        end
        local v = item[key]
        if v == nil then errorf("collate: item %d has no field %s (item 1 has)", k, tostring(key)) end
        column[k] = v
      end
      keys[depth + 1] = key
      out[key] = default_collate(column, keys, depth + 1, open)
    end
    keys[depth + 1] = nil
    open[first] = nil
    return out
  end
  errorf("collate: cannot batch items of type %s (give a collate_fn)", t)
end

DataLoader.default_collate = default_collate

---------------------------------------------------------------------------
-- construction
---------------------------------------------------------------------------

-- A plain Lua list of items works as a dataset too.
local function wrap_dataset(ds)
  if type(ds) == "table" and not is_tensor(ds) then
    if type(ds.len) == "function" and type(ds.get) == "function" then return ds end
    if getmetatable(ds) == nil then
      local list = ds
      return {len = function() return #list end, get = function(_, i) return list[i] end, _list = true}
    end
  end
  errorf("dataset must be a Dataset (with len and get) or a Lua list of items, got %s", describe(ds))
end

local function new(_, dataset, opts)
  -- batch_size and seed: checked below, with their ranges
  opts = options.check("data.DataLoader", opts, {batch_size = "any", shuffle = "boolean", seed = "any",
                                                 drop_last = "boolean", collate_fn = "callable",
                                                 sampler = "table"})
  local self = setmetatable({}, DataLoader)
  self.dataset = wrap_dataset(dataset)
  local bs = opts.batch_size == nil and 1 or opts.batch_size
  if math.type(bs) ~= "integer" or bs < 1 then
    errorf("batch_size must be a positive integer, got %s", tostring(bs))
  end
  self.batch_size = bs
  self.shuffle = opts.shuffle and true or false
  self.drop_last = opts.drop_last and true or false
  self.collate_fn = opts.collate_fn
  if opts.sampler ~= nil then
    local sm = opts.sampler
    if type(sm.len) ~= "function" or type(sm.indices) ~= "function" then
      errorf("sampler must have len() and indices(epoch) methods (nd.data.DistributedSampler)")
    end
    if self.shuffle then errorf("sampler and shuffle = true exclude each other (the sampler shuffles)") end
    self.sampler = sm
  end
  if opts.seed ~= nil then
    if math.type(opts.seed) ~= "integer" then
      errorf("seed must be an integer, got %s", tostring(opts.seed))
    end
    self.seed = opts.seed
  elseif self.shuffle then
    -- drawn once from the global generator, so nd.manual_seed before building
    -- the loader makes its orders reproducible too
    self.seed = core.randint(0, 0x7fffffff, {1}):item()
  else
    self.seed = 0
  end
  self.epoch = 0          -- the epoch last started by iter()
  self._next_epoch = 1
  return self
end

setmetatable(DataLoader, {__call = new})

---------------------------------------------------------------------------
-- order and size
---------------------------------------------------------------------------

-- items one epoch visits
local function item_count(self)
  if self.sampler then return self.sampler:len() end
  return self.dataset:len()
end

function DataLoader:__len()
  local n = item_count(self)
  if self.drop_last then return n // self.batch_size end
  return (n + self.batch_size - 1) // self.batch_size
end

function DataLoader:__tostring()
  return ("DataLoader(%d items, batch_size=%d, shuffle=%s, drop_last=%s, %d batches)")
    :format(item_count(self), self.batch_size, tostring(self.shuffle), tostring(self.drop_last), #self)
end

-- The seed of the permutation of epoch e: a fixed mix of (seed, epoch).
local function epoch_seed(seed, epoch)
  return seed * 1000003 + epoch
end

-- permutation(epoch) -> int64 tensor of 1..n in the order of that epoch
-- (arange when shuffle is off). The global generator's state is saved and
-- restored around the draw.
function DataLoader:permutation(epoch)
  epoch = epoch or self.epoch
  if self.sampler then return self.sampler:indices(epoch) end
  local n = self.dataset:len()
  if not self.shuffle then return core.arange(1, n + 1) end
  if n == 0 then return core.zeros({0}, {dtype = "int64"}) end
  local saved = core.get_rng_state()
  core.manual_seed(epoch_seed(self.seed, epoch))
  local ok, perm = pcall(core.randperm, n)
  core.set_rng_state(saved)
  if not ok then error(perm, 0) end
  return perm
end

-- set_epoch(e): the next iter() runs epoch e (and e + 1 after it, ...).
function DataLoader:set_epoch(e)
  if math.type(e) ~= "integer" then errorf("set_epoch: epoch must be an integer, got %s", tostring(e)) end
  self._next_epoch = e
end

---------------------------------------------------------------------------
-- iteration
---------------------------------------------------------------------------

-- Values the iterator returns for one batch: the default collate's list of
-- fields is unpacked (for x, y in ...), anything else is returned as it is.
local function unpack_batch(batch)
  if type(batch) == "table" and not is_tensor(batch) and batch[1] ~= nil then
    return table.unpack(batch, 1, #batch)
  end
  return batch
end

-- iter() -> an iterator for a generic for over one epoch of batches.
function DataLoader:iter()
  -- a sampler's own set_epoch (PyTorch's habit) counts as the loader's
  local given = self.sampler and self.sampler._take_epoch and self.sampler:_take_epoch()
  if given then self._next_epoch = given end
  local epoch = self._next_epoch
  self._next_epoch = epoch + 1
  self.epoch = epoch
  local ds, bs = self.dataset, self.batch_size
  local n = item_count(self)
  local nbatches = #self
  local collate = self.collate_fn
  local perm = (self.shuffle or self.sampler) and self:permutation(epoch) or nil
  local b = 0

  -- fast path: a TensorDataset without transforms is batched with one
  -- index_select (or a narrow, in order) per tensor
  local mt = getmetatable(ds)
  if collate == nil and mt and mt.class == TensorDataset and ds:_batchable() then
    local tensors = ds.tensors
    return function()
      if b >= nbatches then return nil end
      b = b + 1
      local start = (b - 1) * bs + 1
      local len = math.min(bs, n - start + 1)
      local fields = {}
      if perm then
        -- the index goes to each tensor's device (a dataset may live on one)
        local idx, on = perm:narrow(1, start, len), {}
        for k = 1, #tensors do
          local dev = tensors[k].device
          on[dev] = on[dev] or idx:to(dev)
          fields[k] = tensors[k]:index_select(1, on[dev])
        end
      else
        for k = 1, #tensors do fields[k] = tensors[k]:narrow(1, start, len):clone() end
      end
      return table.unpack(fields, 1, #tensors)
    end
  end

  local order = perm and perm:totable() or nil
  return function()
    if b >= nbatches then return nil end
    b = b + 1
    local start = (b - 1) * bs + 1
    local stop = math.min(start + bs - 1, n)
    local samples = {}
    for j = start, stop do
      samples[#samples + 1] = ds:get(order and order[j] or j)
    end
    if collate then return collate(samples) end
    return unpack_batch(default_collate(samples))
  end
end

return DataLoader
