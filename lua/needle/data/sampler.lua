-- needle.data.sampler: DistributedSampler, the share of a dataset that one
-- rank of a data-parallel job reads (as PyTorch's
-- torch.utils.data.distributed.DistributedSampler).
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

local M = {}

local DistributedSampler = {}
DistributedSampler.__index = DistributedSampler
DistributedSampler.__name = "DistributedSampler"

local WHO = "data.DistributedSampler"

local function dataset_len(ds)
  if math.type(ds) == "integer" then return ds end
  if type(ds) == "table" and type(ds.len) == "function" then return ds:len() end
  if type(ds) == "table" and getmetatable(ds) == nil then return #ds end
  errors.fail(WHO, "expected a dataset (with len()), a Lua list or an item count, got %s", options.got(ds))
end

local function new(_, dataset, opts)
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
function DistributedSampler:set_epoch(e)
  if math.type(e) ~= "integer" then errors.fail(WHO, "set_epoch: expected an integer, got %s", options.got(e)) end
  self.epoch = e
  self._epoch_given = true
end

-- (DataLoader) the epoch set_epoch gave since the loader last asked, or nil
function DistributedSampler:_take_epoch()
  if not self._epoch_given then return nil end
  self._epoch_given = false
  return self.epoch
end

-- indices([epoch]) -> int64 tensor of this rank's 1-based item numbers
function DistributedSampler:indices(epoch)
  epoch = epoch or self.epoch
  local n = self.n
  local order
  if self.shuffle and n > 0 then
    local saved = core.get_rng_state()
    core.manual_seed(self.seed * 1000003 + epoch)
    local ok, perm = pcall(core.randperm, n)
    core.set_rng_state(saved)
    if not ok then error(perm, 0) end
    order = perm
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
return M
