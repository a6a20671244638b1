-- needle.data.worker: what a DataLoader worker thread runs, in the Lua state
-- of its own that src/lua_bindings/lt_workers.c made for it (internal;
-- docs/data.md, "Worker threads"). The C side calls
--
--   start(id, num_workers, payload, should_stop)   once: rebuilds the dataset
--   run(task) -> {n = k, ...}                       per batch: its values, packed
--
-- The thread runs with autograd off, on the CPU, with its own random stream
-- (seeded per batch from task.seed, so a batch's random transforms do not
-- depend on which worker made it or when) and one kernel thread.
local nd = require "needle"
local core = require "needle.core"
local recipe = require "needle.data.recipe"
local DataLoader = require "needle.data.dataloader"

local M = {}

local state -- {dataset =, collate =, should_stop =}
local info  -- nd.data.get_worker_info()'s answer

-- What a worker must not do: these would act on the whole process (or, for
-- grad mode, on nothing: workers return data, never graphs).
local function lock_down()
  local function refuse(name, why)
    return function() error(("needle.%s: not available in a DataLoader worker thread (%s)"):format(name, why), 2) end
  end
  local set = core.set_grad_enabled
  local function set_grad_enabled(on, ...)
    if on then error("needle.set_grad_enabled: not available in a DataLoader worker thread " ..
                     "(workers run without autograd)", 2) end
    return set(on, ...)
  end
  for _, t in ipairs({nd, core}) do
    t.enable_grad = refuse("enable_grad", "workers run without autograd")
    t.set_grad_enabled = set_grad_enabled
  end
  nd.profile = refuse("profile", "profile the loop in the main thread")
  core.profiler_enable = refuse("profile", "profile the loop in the main thread")
end

function M.start(id, num_workers, payload, should_stop)
  lock_down()
  local ds = recipe.build(payload.dataset)
  state = {dataset = DataLoader._wrap_dataset(ds), collate = payload.collate and recipe.build(payload.collate),
           should_stop = should_stop}
  info = {id = id, num_workers = num_workers, dataset = ds, seed = nil}
end

function M.run(task)
  core.manual_seed(task.seed) -- this thread's own stream
  info.seed = task.seed
  return DataLoader._fetch(state.dataset, task, state.collate, state.should_stop)
end

-- {id, num_workers, seed, dataset} in a worker thread (seed: the current
-- batch's), nil elsewhere (as torch.utils.data.get_worker_info)
function M.info() return info end

return M
