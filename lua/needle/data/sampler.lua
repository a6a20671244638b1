-- needle.data.sampler: the samplers of torch.utils.data. Each one is an
-- object with len() (also #sampler) and indices([epoch]) -> an int64 tensor
-- of 1-based item numbers, the order of that epoch (default: the one
-- set_epoch gave, else 0), which is what DataLoader's `sampler` option takes:
--
--   SequentialSampler(ds)                           1, 2, ..., n
--   RandomSampler(ds, {replacement=, num_samples=, seed=})
--   WeightedRandomSampler(weights, num_samples, {replacement = true, seed=})
--   DistributedSampler(ds, {num_replicas=, rank=, shuffle=, seed=, drop_last=})
--   BatchSampler(sampler, batch_size, drop_last)    lists of indices, for
--                                                   DataLoader's batch_sampler
--
-- The random ones are reproducible: epoch e draws with the global generator
-- seeded from (seed, e), its state saved before and restored after, so the
-- orders depend only on the seed and the epoch, and the global random stream
-- is left alone. A seed not given is drawn from the global generator once,
-- when the sampler is built (so nd.manual_seed before makes it reproducible).
--
-- DistributedSampler is the share of a dataset that one rank of a
-- data-parallel job reads (PyTorch's torch.utils.data.distributed.DistributedSampler):
--
--   local sampler = nd.data.DistributedSampler(ds, {shuffle = true, seed = 0})
--   local loader = nd.data.DataLoader(ds, {batch_size = 32, sampler = sampler})
--   loader:set_epoch(e)   -- or let iter() count the epochs
--
-- Each epoch, the items are shuffled with a generator seeded from (seed,
-- epoch), the same on every rank, and dealt out: rank r takes items r+1,
-- r+1+W, r+1+2W, ... of that order (W ranks), so the ranks' shares are
-- disjoint and cover the dataset. When W does not divide the dataset, the
-- order is padded with its own first items (every rank gets ceil(n/W)) or,
-- with drop_last, cut (floor(n/W)). num_replicas and rank default to
-- nd.distributed's world (a world of one without init).
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"
local util = require "needle.data.util"

local no_extra = util.no_extra

-- an epoch number: an integer >= 0 (an integral float is that integer)
local check_epoch = util.check_epoch

local M = {}

local DistributedSampler = {}
DistributedSampler.__index = DistributedSampler
DistributedSampler.__name = "DistributedSampler"

local WHO = "data.DistributedSampler"

local function dataset_len(ds, who)
  if math.type(ds) == "integer" then return ds end
  if type(ds) == "table" and type(ds.len) == "function" then return ds:len() end
  if type(ds) == "table" and getmetatable(ds) == nil then return #ds end
  errors.fail(who or WHO, "expected a dataset (with len()), a Lua list or an item count, got %s", options.got(ds))
end

-- seeded(seed, fn, ...) -> fn(...) drawn right after nd.manual_seed(seed),
-- the global generator's state saved before and restored after
local function seeded(seed, fn, ...)
  local saved = core.get_rng_state()
  core.manual_seed(seed)
  local ok, res = pcall(fn, ...)
  core.set_rng_state(saved)
  if not ok then error(res, 0) end
  return res
end
M.seeded = seeded

-- the seed of epoch e's draw (the DataLoader's shuffle mixes them the same way)
local function epoch_seed(seed, epoch) return seed * 1000003 + epoch end
M.epoch_seed = epoch_seed

-- a seed drawn from the global generator, once (when a sampler is built)
local function draw_seed() return core.randint(0, 0x7fffffff, {1}):item() end
M.draw_seed = draw_seed

local function new(_, dataset, opts, ...)
  no_extra(WHO, "DistributedSampler(dataset[, opts])", 2, ...)
  local o = options.check(WHO, opts, {num_replicas = "integer", rank = "integer", shuffle = "boolean",
                                      seed = "integer", drop_last = "boolean"})
  local n = dataset_len(dataset)
  if n < 0 then errors.fail(WHO, "the dataset length must be >= 0, got %d", n) end
  local world, rank = o.num_replicas, o.rank
  if world == nil or rank == nil then
    local info = core.dist_info()
    if info.launched and not info.initialized then
      errors.fail(WHO, "this process runs under mpirun but nd.distributed.init() was not called: "
                  .. "call it first, or give num_replicas and rank")
    end
    world = world or (info.initialized and info.world_size or 1)
    rank = rank or (info.initialized and info.rank or 0)
  end
  if world < 1 then errors.fail(WHO, "num_replicas must be >= 1, got %d", world) end
  if rank < 0 or rank >= world then
    errors.fail(WHO, "rank %d out of range for %d replicas (ranks are 0..%d)", rank, world, world - 1)
  end
  local self = setmetatable({n = n, num_replicas = world, rank = rank, shuffle = o.shuffle ~= false,
                             seed = o.seed or 0, drop_last = o.drop_last == true, epoch = 0}, DistributedSampler)
  if self.drop_last then
    self.num_samples = n // world
  else
    self.num_samples = (n + world - 1) // world
  end
  self.total_size = self.num_samples * world
  return self
end
setmetatable(DistributedSampler, {__call = new})

function DistributedSampler:len() return self.num_samples end
function DistributedSampler:__len() return self.num_samples end

-- set_epoch(e): the epoch of indices() without an argument, and of the
-- next epoch a DataLoader iterates (as PyTorch's sampler.set_epoch; the
-- loader's own set_epoch does the same)
function DistributedSampler:set_epoch(e, ...)
  no_extra(WHO, "sampler:set_epoch(epoch)", 1, ...)
  self.epoch = check_epoch(WHO, "set_epoch: epoch", e)
  self._epoch_given = true
end

-- (DataLoader) the epoch set_epoch gave since the loader last asked, or nil
function DistributedSampler:_take_epoch()
  if not self._epoch_given then return nil end
  self._epoch_given = false
  return self.epoch
end

-- indices([epoch]) -> int64 tensor of this rank's 1-based item numbers
function DistributedSampler:indices(epoch, ...)
  no_extra(WHO, "sampler:indices([epoch])", 1, ...)
  epoch = epoch == nil and self.epoch or check_epoch(WHO, "indices: epoch", epoch)
  local n = self.n
  local order
  if self.shuffle and n > 0 then
    order = seeded(epoch_seed(self.seed, epoch), core.randperm, n)
  else
    order = core.arange(1, n + 1)
  end
  if self.total_size > n and n > 0 then
    -- pad with the order's own first items (repeated when the gap exceeds n)
    local parts, need = {order}, self.total_size - n
    while need > 0 do
      local k = math.min(need, n)
      parts[#parts + 1] = order:narrow(1, 1, k)
      need = need - k
    end
    order = core.cat(parts, 1)
  elseif self.total_size < n then
    order = order:narrow(1, 1, self.total_size)
  end
  if self.num_samples == 0 then return core.zeros({0}, {dtype = "int64"}) end
  return order:slice(1, self.rank + 1, self.total_size, self.num_replicas):contiguous()
end

function DistributedSampler:__tostring()
  return ("DistributedSampler(%d items, rank %d of %d, %d per rank, shuffle=%s, drop_last=%s)"):format(
    self.n, self.rank, self.num_replicas, self.num_samples, tostring(self.shuffle), tostring(self.drop_last))
end

M.DistributedSampler = DistributedSampler

---------------------------------------------------------------------------
-- the samplers of torch.utils.data
---------------------------------------------------------------------------

local function got(v) return v == nil and "nil" or options.got(v) end

-- A sampler class: set_epoch, __len and __tostring shared; new(...) checks
-- and fills the instance.
local function class(name, new)
  local C = {__name = name}
  C.__index = C
  C.__len = function(self) return self:len() end
  function C:set_epoch(e, ...)
    no_extra("data." .. name, "sampler:set_epoch(epoch)", 1, ...)
    self.epoch = check_epoch("data." .. name, "set_epoch: epoch", e)
    self._epoch_given = true
  end
  -- (DataLoader) the epoch set_epoch gave since the loader last asked, or nil
  function C:_take_epoch()
    if not self._epoch_given then return nil end
    self._epoch_given = false
    return self.epoch
  end
  return setmetatable(C, {__call = function(_, ...) return setmetatable(new(...), C) end})
end


-- SequentialSampler(data_source): 1, 2, ..., #data_source, every epoch. The
-- length is the data source's at each call (a dataset may grow).
local SequentialSampler = class("SequentialSampler", function(data_source, ...)
  no_extra("data.SequentialSampler", "SequentialSampler(data_source)", 1, ...)
  dataset_len(data_source, "data.SequentialSampler")
  return {data_source = data_source, epoch = 0}
end)

function SequentialSampler:len() return dataset_len(self.data_source, "data.SequentialSampler") end

function SequentialSampler:indices(epoch, ...)
  no_extra("data.SequentialSampler", "sampler:indices([epoch])", 1, ...)
  if epoch ~= nil then check_epoch("data.SequentialSampler", "indices: epoch", epoch) end
  return core.arange(1, self:len() + 1)
end

function SequentialSampler:__tostring() return ("SequentialSampler(%d items)"):format(self:len()) end

-- RandomSampler(data_source, {replacement = false, num_samples = #data_source, seed =}):
-- a permutation per epoch; with replacement, num_samples draws of 1..n; without
-- and num_samples > n, whole permutations and then the start of one more
-- (torch.utils.data.RandomSampler).
local RS = "data.RandomSampler"
local RandomSampler = class("RandomSampler", function(data_source, opts, ...)
  no_extra(RS, "RandomSampler(data_source[, opts])", 2, ...)
  local o = options.check(RS, opts, {replacement = "boolean", num_samples = "integer", seed = "integer"})
  dataset_len(data_source, RS)
  if o.num_samples ~= nil and o.num_samples < 1 then
    errors.fail(RS, "num_samples must be a positive integer, got %d", o.num_samples)
  end
  local self = {data_source = data_source, replacement = o.replacement == true, _num_samples = o.num_samples,
                seed = o.seed or draw_seed(), epoch = 0}
  if o.num_samples == nil and dataset_len(data_source, RS) < 1 then
    errors.fail(RS, "num_samples must be a positive integer, got 0 (the data source is empty)")
  end
  return self
end)

-- num_samples as given, else the data source's length now
function RandomSampler:len() return self._num_samples or dataset_len(self.data_source, RS) end
RandomSampler.num_samples = RandomSampler.len

local function random_indices(n, k, replacement)
  if replacement then return core.randint(1, n, {k}) end -- high is inclusive
  local parts = {}
  for _ = 1, k // n do parts[#parts + 1] = core.randperm(n) end
  if k % n > 0 then parts[#parts + 1] = core.randperm(n):narrow(1, 1, k % n) end
  return #parts == 1 and parts[1] or core.cat(parts, 1)
end

function RandomSampler:indices(epoch, ...)
  no_extra(RS, "sampler:indices([epoch])", 1, ...)
  if epoch ~= nil then epoch = check_epoch(RS, "indices: epoch", epoch) end
  local n, k = dataset_len(self.data_source, RS), self:len()
  if n < 1 then errors.fail(RS, "the data source is empty: nothing to sample %d items from", k) end
  return seeded(epoch_seed(self.seed, epoch or self.epoch), random_indices, n, k, self.replacement)
end

function RandomSampler:__tostring()
  return ("RandomSampler(%d samples, replacement=%s)"):format(self:len(), tostring(self.replacement))
end

-- WeightedRandomSampler(weights, num_samples, {replacement = true, seed =}):
-- num_samples indices 1..#weights, index i with probability weights[i] / sum
-- (torch.multinomial's rule: without replacement each index at most once).
local WS = "data.WeightedRandomSampler"
local WeightedRandomSampler = class("WeightedRandomSampler", function(weights, num_samples, opts, ...)
  no_extra(WS, "WeightedRandomSampler(weights, num_samples[, opts])", 3, ...)
  local o = options.check(WS, opts, {replacement = "boolean", seed = "integer"})
  local w
  if core.is_tensor(weights) then
    w = weights:detach():to({device = "cpu", dtype = "float64"})
  elseif type(weights) == "table" and getmetatable(weights) == nil then
    for i, v in ipairs(weights) do
      if type(v) ~= "number" then errors.fail(WS, "weights[%d] is %s, expected a number", i, options.got(v)) end
    end
    w = core.tensor(weights, {dtype = "float64"})
  else
    errors.fail(WS, "weights must be a tensor or a list of numbers, got %s", options.got(weights))
  end
  if w:dim() ~= 1 then
    errors.fail(WS, "weights must be 1-D (one weight per item), got shape %s", errors.shape_str(w))
  end
  if math.type(num_samples) ~= "integer" or num_samples < 1 then
    errors.fail(WS, "num_samples must be a positive integer, got %s", got(num_samples))
  end
  local n = w:size(1)
  if n == 0 then errors.fail(WS, "weights is empty: there is nothing to sample") end
  local nonfinite = (w - w):ne(0) -- NaN at every NaN and infinity
  if nonfinite:sum():item() > 0 then
    local at = nonfinite:long():argmax():item()
    errors.fail(WS, "weights must be finite, got %s at index %d", tostring(w[at]:item()), at)
  end
  local lo, at = w:min(1)
  if lo:item() < 0 then
    errors.fail(WS, "weights must be >= 0, got %g at index %d", lo:item(), at:item())
  end
  local positive = w:gt(0):sum():item()
  if positive == 0 then errors.fail(WS, "weights sum to 0: no item can be drawn") end
  local replacement = o.replacement ~= false
  if not replacement and num_samples > positive then
    errors.fail(WS, "cannot draw %d samples without replacement: only %d of the %d weights are positive",
                num_samples, positive, n)
  end
  return {weights = w, num_samples = num_samples, replacement = replacement, seed = o.seed or draw_seed(), epoch = 0}
end)

function WeightedRandomSampler:len() return self.num_samples end

function WeightedRandomSampler:indices(epoch, ...)
  no_extra(WS, "sampler:indices([epoch])", 1, ...)
  if epoch ~= nil then epoch = check_epoch(WS, "indices: epoch", epoch) end
  local w, k, r = self.weights, self.num_samples, self.replacement
  return seeded(epoch_seed(self.seed, epoch or self.epoch), function() return w:multinomial(k, r) end)
end

function WeightedRandomSampler:__tostring()
  return ("WeightedRandomSampler(%d samples of %d items, replacement=%s)"):format(self.num_samples,
    self.weights:size(1), tostring(self.replacement))
end

-- BatchSampler(sampler, batch_size, drop_last): the sampler's indices in
-- lists of batch_size (the last one shorter, or dropped with drop_last), as
-- torch.utils.data.BatchSampler. sampler is a sampler (len, indices), a Lua
-- list of indices or a 1-D integer tensor of them. For DataLoader's
-- batch_sampler option, and on its own:
--   for batch in bs:iter() do ... end     -- batch: a Lua list of indices
local BS = "data.BatchSampler"
local BatchSampler = class("BatchSampler", function(sampler, batch_size, drop_last, ...)
  no_extra(BS, "BatchSampler(sampler, batch_size, drop_last)", 3, ...)
  local ok = type(sampler) == "table" and (getmetatable(sampler) == nil or
    (type(sampler.len) == "function" and type(sampler.indices) == "function"))
  if core.is_tensor(sampler) then
    ok = sampler:dim() == 1 and (sampler.dtype == "int64" or sampler.dtype == "int32")
    if ok and sampler:numel() > 0 and sampler:min():item() < 1 then
      errors.fail(BS, "sampler's indices must be positive (1-based item numbers), got %d",
                  sampler:min():item())
    end
  end
  if not ok then
    errors.fail(BS, "sampler must be a sampler (with len() and indices(epoch)), a Lua list of indices or a " ..
                "1-D integer tensor, got %s", core.is_tensor(sampler) and
                ("a %s tensor of shape %s"):format(sampler.dtype, errors.shape_str(sampler)) or options.got(sampler))
  end
  if math.type(batch_size) ~= "integer" or batch_size < 1 then
    errors.fail(BS, "batch_size must be a positive integer, got %s", got(batch_size))
  end
  if type(drop_last) ~= "boolean" then
    errors.fail(BS, "drop_last must be a boolean, got %s", got(drop_last))
  end
  if type(sampler) == "table" and getmetatable(sampler) == nil and type(sampler.indices) ~= "function" then
    -- a plain list of item numbers: positive integers (1-based), checked now
    -- rather than when a batch of them reaches a dataset
    local n = #sampler
    for k, v in pairs(sampler) do
      if math.type(k) ~= "integer" or k < 1 or k > n then
        errors.fail(BS, "sampler must be a list of indices (keys 1..%d), got the key %s", n, got(k))
      end
    end
    local list
    for k = 1, n do
      local v = sampler[k]
      local i = util.int_of(v)
      if i == nil or i < 1 then
        errors.fail(BS, "sampler[%d] is %s, expected a positive integer (a 1-based item number)", k, got(v))
      end
      if math.type(v) == "float" then
        list = list or table.move(sampler, 1, n, 1, {})
        list[k] = i
      end
    end
    sampler = list or sampler
  end
  return {sampler = sampler, batch_size = batch_size, drop_last = drop_last, epoch = 0}
end)

-- the sampler's order of that epoch, as a Lua list
local function order_of(self, epoch)
  local sm = self.sampler
  if core.is_tensor(sm) then return sm:totable() end
  if getmetatable(sm) == nil and type(sm.indices) ~= "function" then return sm end
  return sm:indices(epoch):totable()
end

local function count_of(self)
  local sm = self.sampler
  if core.is_tensor(sm) then return sm:size(1) end
  if getmetatable(sm) == nil and type(sm.len) ~= "function" then return #sm end
  return sm:len()
end

function BatchSampler:len()
  local n, bs = count_of(self), self.batch_size
  if self.drop_last then return n // bs end
  return (n + bs - 1) // bs
end

-- set_epoch(e) reaches the sampler too (a DistributedSampler's own epoch)
local base_set_epoch = BatchSampler.set_epoch
function BatchSampler:set_epoch(e)
  base_set_epoch(self, e)
  if type(self.sampler.set_epoch) == "function" then self.sampler:set_epoch(e) end
end

function BatchSampler:_take_epoch()
  local own = self._epoch_given and self.epoch or nil
  self._epoch_given = false
  local sm = self.sampler
  local inner = type(sm) == "table" and type(sm._take_epoch) == "function" and sm:_take_epoch() or nil
  return own or inner
end

-- batches([epoch]) -> a Lua list of the epoch's batches (lists of indices)
function BatchSampler:batches(epoch, ...)
  no_extra(BS, "sampler:batches([epoch])", 1, ...)
  local out = {}
  for b in self:iter(epoch) do out[#out + 1] = b end
  return out
end

-- iter([epoch]) -> an iterator over the epoch's batches
function BatchSampler:iter(epoch, ...)
  no_extra(BS, "sampler:iter([epoch])", 1, ...)
  if epoch ~= nil then epoch = check_epoch(BS, "iter: epoch", epoch) end
  local order = order_of(self, epoch or self.epoch)
  local n, bs, drop = #order, self.batch_size, self.drop_last
  local pos = 0
  return function()
    if pos >= n or (drop and pos + bs > n) then return nil end
    local batch = table.move(order, pos + 1, math.min(pos + bs, n), 1, {})
    pos = pos + bs
    return batch
  end
end

function BatchSampler:__tostring()
  return ("BatchSampler(%d batches of %d, drop_last=%s)"):format(self:len(), self.batch_size, tostring(self.drop_last))
end

M.SequentialSampler = SequentialSampler
M.RandomSampler = RandomSampler
M.WeightedRandomSampler = WeightedRandomSampler
M.BatchSampler = BatchSampler
M.dataset_len = dataset_len
return M
