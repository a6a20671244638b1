-- scripts/bench/worker.lua: runs one workload of scripts/bench/workloads.lua
-- in a process of its own (so that its peak RSS is its own) and prints
-- "key value" lines for scripts/bench/run.lua:
--
--   needle-lua scripts/bench/worker.lua NAME REPS WARMUP THREADS [DEVICE]
--
--   ms N        the median over REPS timed runs (after WARMUP untimed calls)
--               of one call; for a workload with `steps` (peak RSS), the
--               median step of `steps` steps, all timed
--   rss_mb N    peak resident set (VmHWM) of this process at the end, MB
--   threads N   the thread count needle ran with
--
-- DEVICE (default "cpu", e.g. "opencl:0") holds the model and inputs; each
-- timed call ends with nd.synchronize(DEVICE), so a time is the device's work
-- done, not only its launch.
--
-- torch_ref.py is the PyTorch side, with the same arguments and output.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local W = dofile(here .. "/workloads.lua")

local name, reps, warmup, threads = arg[1], tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local dev = arg[5] or "cpu"
local w = W.by_name[name or ""]
if not (w and w.setup and reps and warmup and threads) then
  io.stderr:write("usage: needle-lua scripts/bench/worker.lua NAME REPS WARMUP THREADS [DEVICE]\n")
  os.exit(2)
end

nd.set_num_threads(threads)
nd.manual_seed(0)
local fn = w.setup(nd, dev)
if dev ~= "cpu" then
  local call = fn
  fn = function() call(); nd.synchronize(dev) end
end

local ms
if w.steps then
  local ts = {}
  for i = 1, w.steps do
    local t0 = nd.clock()
    fn()
    ts[i] = nd.clock() - t0
  end
  table.sort(ts)
  ms = ts[(#ts + 1) // 2] * 1e3
else
  local inner = w.inner or 1
  ms = C.per_iter(fn, inner, reps, warmup * inner) * 1e3
end
print(("ms %.6f"):format(ms))
local rss = C.peak_rss_mb()
if rss then print(("rss_mb %.3f"):format(rss)) end
print(("threads %d"):format(nd.get_num_threads()))
