-- needle.data.workers: a DataLoader's batches made by worker threads
-- (num_workers > 0; internal, docs/data.md "Worker threads").
--
-- Each worker is a thread with a Lua state of its own (lt_workers.c) that
-- rebuilds the dataset from its recipe (needle.data.recipe) and runs
-- needle.data.worker's run(task) per batch. Batch b goes to worker
-- (b - 1) % N + 1 and carries its indices and its own seed, so what a batch
-- holds does not depend on N or on timing; each worker has at most
-- prefetch_factor tasks in flight, and the loop takes the results back in
-- batch order. Tensors come back without a copy of their data.
local core = require "needle.core"
local recipe = require "needle.data.recipe"
local sampler = require "needle.data.sampler"

local M = {}

-- the seed of batch b of epoch e (a worker seeds its own stream with it)
function M.batch_seed(seed, epoch, b)
  return (sampler.epoch_seed(sampler.epoch_seed(seed, epoch), b)) & 0x7fffffffffffffff
end

-- one description of the dataset and collate_fn per worker
local function payloads(loader)
  local p = {dataset = recipe.describe(loader.dataset, "the dataset")}
  if loader._collate_source ~= nil then p.collate = recipe.describe(loader._collate_source, "collate_fn") end
  local list = {}
  for k = 1, loader.num_workers do list[k] = p end
  return list
end

-- waits for worker k's next result: its values (packed), or nil and why not
-- (the pool is then closed)
local function take(pool, k, timeout)
  local t0 = core.clock()
  while true do
    local slice = 0.1
    if timeout > 0 then slice = math.max(0, math.min(slice, t0 + timeout - core.clock())) end
    local ok, v = pool:get(k, slice) -- short waits: Ctrl-C is seen between them
    if ok == true then return v end
    if ok == false then
      pool:close()
      return nil, ("worker %d failed: %s"):format(k, v)
    end
    if timeout > 0 and core.clock() - t0 >= timeout then
      pool:close()
      return nil, ("worker %d timed out: no batch after %g s (the timeout option)"):format(k, timeout)
    end
  end
end

-- a persistent pool left with tasks of an earlier epoch (a loop left early):
-- their results are dropped
local function drain(loader)
  local pool, pending = loader._pool, loader._pending
  for k = 1, loader.num_workers do
    while pending[k] > 0 do
      pending[k] = pending[k] - 1
      local ok = pool:get(k, 3600)
      if ok == nil then pending[k] = pending[k] + 1 end
    end
  end
end

-- The iterator over one epoch: next_spec() gives the next batch's indices
-- ({indices = ...} or {first =, count =}) or nil at the end. Returns the
-- iterator function, nil, nil and a to-be-closed value (the generic for
-- closes it when the loop ends, is left with break or raises).
function M.iterate(loader, epoch, next_spec)
  local N, P, timeout = loader.num_workers, loader.prefetch_factor, loader.timeout
  local pool = loader._pool
  if pool == nil or pool:closed() then
    pool = core._workers_start(N, P, payloads(loader))
    local pending = {}
    for k = 1, N do pending[k] = 0 end
    if loader.persistent_workers then loader._pool, loader._pending = pool, pending end
    loader._live_pending = pending
  else
    drain(loader)
  end
  local pending = loader._live_pending
  local sent, got = 0, 0
  local function send()
    local spec = next_spec()
    if spec == nil then return false end
    sent = sent + 1
    spec.batch, spec.seed = sent, M.batch_seed(loader.seed, epoch, sent)
    local k = (sent - 1) % N + 1
    pool:put(k, spec)
    pending[k] = pending[k] + 1
    return true
  end
  for _ = 1, N * P do
    if not send() then break end
  end
  local persistent = loader.persistent_workers
  local function step()
    if got >= sent then
      if not persistent then pool:close() end
      return nil
    end
    got = got + 1
    local k = (got - 1) % N + 1
    local v, why = take(pool, k, timeout)
    -- raised here, at the loop's line (level 2: the for calls step); not
    -- through needle.errors, whose position stripping would cut the
    -- message at the worker's own "file:line: needle.<op>:"
    if v == nil then error("needle.data.DataLoader: " .. why, 2) end
    pending[k] = pending[k] - 1
    send() -- the next batch for the same worker: it keeps P in flight
    return table.unpack(v, 1, v.n)
  end
  -- a persistent pool outlives the loop (the next epoch drains what is left)
  local closing = persistent and setmetatable({}, {__close = function() end}) or pool
  return step, nil, nil, closing
end

return M
