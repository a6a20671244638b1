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
-- as nd.data.RandomSampler or nd.data.DistributedSampler, which gives each
-- rank of a data-parallel job its own share; loader:set_epoch(e) reaches it
-- through the epoch. opts.batch_sampler picks whole batches (len() and
-- iter(epoch) -> an iterator of index lists, such as nd.data.BatchSampler).
--
-- opts.num_workers = N > 0 makes the batches in N worker threads
-- (needle.data.workers; docs/data.md, "Worker threads").
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local dataset_mod = require "needle.data.dataset"
local options = require "needle.options"
local errors = require "needle.errors"
local util = require "needle.data.util"

local got, no_extra = util.got, util.no_extra

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

-- the public one (nd.data.default_collate(samples)): samples checked first
DataLoader.default_collate = function(samples, ...)
  local who = "data.default_collate"
  no_extra(who, "default_collate(samples)", 1, ...)
  if type(samples) ~= "table" or is_tensor(samples) or getmetatable(samples) ~= nil then
    errors.fail(who, "samples must be a Lua list of items, got %s", got(samples))
  end
  if samples[1] == nil then
    errors.fail(who, "samples is an empty list: there is nothing to batch")
  end
  return default_collate(samples)
end

---------------------------------------------------------------------------
-- construction
---------------------------------------------------------------------------

-- A plain Lua list of items works as a dataset too (and worker threads
-- rebuild it from the list).
local function wrap_dataset(ds)
  if type(ds) == "table" and not is_tensor(ds) then
    if type(ds.len) == "function" and type(ds.get) == "function" then return ds end
    if getmetatable(ds) == nil then
      local list = ds
      return {len = function() return #list end, get = function(_, i) return list[i] end, _list = true,
              __worker = {module = "needle.data.dataloader", fn = "_wrap_dataset", args = {list}}}
    end
  end
  errorf("dataset must be a Dataset (with len and get) or a Lua list of items, got %s", describe(ds))
end
DataLoader._wrap_dataset = wrap_dataset

local function callable(v)
  local mt = getmetatable(v)
  return type(v) == "function" or (type(v) == "table" and type(mt) == "table" and mt.__call ~= nil)
end

-- collate_fn: a function (or callable), or a recipe {module =, fn =, args =}
-- naming one, which worker threads can rebuild too. -> the function, and
-- what the workers get (the recipe, or the callable to describe)
local function collate_of(c)
  if c == nil or callable(c) then return c, c end
  if type(c.module) ~= "string" or (c.fn ~= nil and type(c.fn) ~= "string") then
    errorf("collate_fn must be a function or a recipe {module = <string>, fn = <string>, args = <list or nil>}, " ..
           "got a table without them")
  end
  local recipe = require "needle.data.recipe"
  local f = recipe.build(recipe.describe({__worker = c}, "collate_fn"))
  if not callable(f) then
    errorf("collate_fn: %s%s is %s, expected a function", c.module, c.fn and ("." .. c.fn) or "", describe(f))
  end
  return f, {__worker = c}
end

local function new(_, dataset, opts, ...)
  no_extra("data.DataLoader", "DataLoader(dataset[, opts])", 2, ...)
  -- batch_size, seed, num_workers, prefetch_factor and timeout: checked below, with their ranges
  opts = options.check("data.DataLoader", opts, {batch_size = "any", shuffle = "boolean", seed = "any",
                                                 drop_last = "boolean", collate_fn = "callable|table",
                                                 sampler = "table", batch_sampler = "table",
                                                 num_workers = "integer", prefetch_factor = "integer",
                                                 persistent_workers = "boolean", timeout = "number"})
  local self = setmetatable({}, DataLoader)
  self.dataset = wrap_dataset(dataset)
  local bs = opts.batch_size == nil and 1 or util.int_of(opts.batch_size)
  if bs == nil or bs < 1 then
    errorf("batch_size must be a positive integer, got %s", got(opts.batch_size))
  end
  self.batch_size = bs
  self.shuffle = opts.shuffle and true or false
  self.drop_last = opts.drop_last and true or false
  self.collate_fn, self._collate_source = collate_of(opts.collate_fn)
  if opts.sampler ~= nil then
    local sm = opts.sampler
    if type(sm.len) ~= "function" or type(sm.indices) ~= "function" then
      errorf("sampler must have len() and indices(epoch) methods (nd.data.RandomSampler, DistributedSampler, ...)")
    end
    if self.shuffle then errorf("sampler and shuffle = true exclude each other (the sampler shuffles)") end
    self.sampler = sm
  end
  if opts.batch_sampler ~= nil then
    local bsm = opts.batch_sampler
    if type(bsm.len) ~= "function" or type(bsm.iter) ~= "function" then
      errorf("batch_sampler must have len() and iter(epoch) methods (nd.data.BatchSampler)")
    end
    if (opts.batch_size ~= nil and opts.batch_size ~= 1) or self.shuffle or opts.sampler ~= nil or self.drop_last then
      errorf("batch_sampler excludes batch_size, shuffle, sampler and drop_last (the batch sampler decides them)")
    end
    self.batch_sampler = bsm
    self.batch_size = nil
  end
  local nw = opts.num_workers or 0
  if nw < 0 or nw > 256 then errorf("num_workers must be in 0..256, got %d", nw) end
  self.num_workers = nw
  if opts.prefetch_factor ~= nil then
    if nw == 0 then errorf("prefetch_factor needs num_workers > 0 (it is the batches each worker makes ahead)") end
    if opts.prefetch_factor < 1 or opts.prefetch_factor > 1 << 20 then
      errorf("prefetch_factor must be 1..%d, got %d", 1 << 20, opts.prefetch_factor)
    end
  end
  self.prefetch_factor = nw > 0 and (opts.prefetch_factor or 2) or nil
  if opts.persistent_workers and nw == 0 then errorf("persistent_workers needs num_workers > 0") end
  self.persistent_workers = opts.persistent_workers == true
  local timeout = opts.timeout or 0
  if not (timeout >= 0) then errorf("timeout must be >= 0 (seconds; 0: wait for ever), got %s", tostring(timeout)) end
  self.timeout = timeout
  if opts.seed ~= nil then
    if util.int_of(opts.seed) == nil then
      errorf("seed must be an integer, got %s", got(opts.seed))
    end
    self.seed = util.int_of(opts.seed)
  elseif self.shuffle or nw > 0 then
    -- drawn once from the global generator, so nd.manual_seed before building
    -- the loader makes its orders (and the workers' per-batch seeds) reproducible too
    self.seed = core.randint(0, 0x7fffffff, {1}):item()
  else
    self.seed = 0
  end
  self.epoch = 0          -- the epoch last started by iter()
  self._next_epoch = 1
  if nw > 0 then
    -- fail now, not at the first iter(), when the dataset cannot go to a worker
    local recipe = require "needle.data.recipe"
    recipe.describe(self.dataset, "the dataset")
    if self._collate_source ~= nil then recipe.describe(self._collate_source, "collate_fn") end
  end
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
  if self.batch_sampler then return self.batch_sampler:len() end
  local n = item_count(self)
  if self.drop_last then return n // self.batch_size end
  return (n + self.batch_size - 1) // self.batch_size
end

function DataLoader:__tostring()
  local workers = self.num_workers > 0 and (", num_workers=%d"):format(self.num_workers) or ""
  if self.batch_sampler then
    return ("DataLoader(%d items, batch_sampler, %d batches%s)"):format(self.dataset:len(), #self, workers)
  end
  return ("DataLoader(%d items, batch_size=%d, shuffle=%s, drop_last=%s, %d batches%s)")
    :format(item_count(self), self.batch_size, tostring(self.shuffle), tostring(self.drop_last), #self, workers)
end

-- The seed of the permutation of epoch e: a fixed mix of (seed, epoch).
local function epoch_seed(seed, epoch)
  return seed * 1000003 + epoch
end

-- an epoch number: an integer >= 0 (0 is the one before the first iter(),
-- which counts from 1); an integral float is that integer
local function check_epoch(what, e) return util.check_epoch("data.DataLoader", what, e) end

-- permutation(epoch) -> int64 tensor of 1..n in the order of that epoch
-- (arange when shuffle is off). The global generator's state is saved and
-- restored around the draw.
function DataLoader:permutation(epoch, ...)
  no_extra("data.DataLoader", "loader:permutation([epoch])", 1, ...)
  if epoch ~= nil then epoch = check_epoch("permutation: epoch", epoch) end
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
function DataLoader:set_epoch(e, ...)
  no_extra("data.DataLoader", "loader:set_epoch(epoch)", 1, ...)
  self._next_epoch = check_epoch("set_epoch: epoch", e)
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

-- fetch(ds, spec, collate[, should_stop]) -> the batch's values, packed
-- ({n = k, ...}). spec gives the items: {indices = an int64 tensor or a Lua
-- list of 1-based item numbers} or {first =, count =} (a run in order).
-- In-process and in a worker thread alike (should_stop: the worker's pool is
-- closing). A TensorDataset without transforms and with the default collate
-- is batched with one index_select (or narrow and copy) per tensor.
local function fetch(ds, spec, collate, should_stop)
  local mt = getmetatable(ds)
  local idx = spec.indices
  if collate == nil and mt and mt.class == TensorDataset and ds:_batchable() then
    local tensors = ds.tensors
    local fields = {n = #tensors}
    if idx ~= nil then
      if not is_tensor(idx) then idx = core.tensor(idx, {dtype = "int64"}) end
      -- the index goes to each tensor's device (a dataset may live on one)
      local on = {}
      for k = 1, #tensors do
        local dev = tensors[k].device
        on[dev] = on[dev] or idx:to(dev)
        fields[k] = tensors[k]:index_select(1, on[dev])
      end
    else
      for k = 1, #tensors do fields[k] = tensors[k]:narrow(1, spec.first, spec.count):clone() end
    end
    return fields
  end
  local samples = {}
  if idx ~= nil then
    local list = is_tensor(idx) and idx:totable() or idx
    for j = 1, #list do
      if should_stop and should_stop() then error("needle.data.DataLoader: the worker was stopped", 0) end
      samples[j] = ds:get(list[j])
    end
  else
    for j = 1, spec.count do
      if should_stop and should_stop() then error("needle.data.DataLoader: the worker was stopped", 0) end
      samples[j] = ds:get(spec.first + j - 1)
    end
  end
  if collate then return table.pack(collate(samples)) end
  return table.pack(unpack_batch(default_collate(samples)))
end
DataLoader._fetch = fetch

-- next_spec() for one epoch: each call gives the next batch's spec (see
-- fetch), nil after the last
local function batches(self, epoch)
  if self.batch_sampler then
    local it = self.batch_sampler:iter(epoch)
    return function()
      local idx = it()
      if idx == nil then return nil end
      return {indices = idx}
    end
  end
  local bs, n, nbatches = self.batch_size, item_count(self), #self
  local perm = (self.shuffle or self.sampler) and self:permutation(epoch) or nil
  local b = 0
  return function()
    if b >= nbatches then return nil end
    b = b + 1
    local start = (b - 1) * bs + 1
    local len = math.min(bs, n - start + 1)
    if perm then return {indices = perm:narrow(1, start, len)} end
    return {first = start, count = len}
  end
end

-- iter() -> an iterator for a generic for over one epoch of batches (and,
-- with workers, a to-be-closed value: leaving the loop stops them).
function DataLoader:iter(...)
  no_extra("data.DataLoader", "loader:iter()", 0, ...)
  -- a sampler's own set_epoch (PyTorch's habit) counts as the loader's
  local sm = self.batch_sampler or self.sampler
  local given = sm and sm._take_epoch and sm:_take_epoch()
  if given then self._next_epoch = given end
  local epoch = self._next_epoch
  self._next_epoch = epoch + 1
  self.epoch = epoch
  local next_spec = batches(self, epoch)
  if self.num_workers > 0 then
    return require("needle.data.workers").iterate(self, epoch, next_spec)
  end
  local ds, collate = self.dataset, self.collate_fn
  return function()
    local spec = next_spec()
    if spec == nil then return nil end
    local v = fetch(ds, spec, collate)
    return table.unpack(v, 1, v.n)
  end
end

return DataLoader
