-- scripts/tune_model.lua: tunes a model's compiled kernels ahead of time, so that later
-- runs start with the tuned choices (nd.compile's tune option, docs/compile.md). It
-- compiles one of the benchmark workloads (scripts/bench/workloads.lua) with
-- {tune = SECONDS}, runs it until it is captured, tuned and replayed, and prints
-- what the tuner chose. The choices are kept in the cache directory
-- ($NEEDLE_CACHE_DIR, else ~/.cache/needle: compile/tune.txt) for every later process
-- with the same kernels, thread count and device.
--
--   build/needle-lua scripts/tune_model.lua --workload lstm_train [--seconds 10] [--threads N]
--   build/needle-lua scripts/tune_model.lua --list
--
-- The training scripts tune their own step the same way: --tune SECONDS.
local nd = require "needle"
local cli = require "needle.cli"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local W = dofile(here .. "/bench/workloads.lua")

local usage = [[
usage: needle-lua scripts/tune_model.lua --workload NAME [--seconds S] [--threads N]
       needle-lua scripts/tune_model.lua --list
  --workload NAME  a workload of scripts/bench/workloads.lua (--list shows them)
  --seconds S      time for tuning (default 10)
  --threads N      CPU threads (default: all); choices are kept per thread count
  --list           the workloads that can be tuned
  -h, --help       this text
]]

local opts = cli.parse(arg, {seconds = 10}, usage, {prog = "tune_model", numbers = {seconds = true, threads = true},
                                                    optional = {"workload", "threads"}, flags = {list = true}})
local names = {}
for _, w in ipairs(W.list) do
  if w.setup and not w.compiled_of then names[#names + 1] = w.name end
end
if opts.list then
  print(table.concat(names, "\n"))
  os.exit(0)
end
if not opts.workload then cli.die("tune_model", 2, "--workload NAME is required (--list shows them)") end
local w = W.by_name[opts.workload]
if not (w and w.setup and not w.compiled_of) then
  cli.die("tune_model", 2, "unknown workload '%s' (expected one of: %s)", opts.workload, table.concat(names, ", "))
end
if not (opts.seconds >= 0) then cli.die("tune_model", 2, "--seconds expects a number >= 0, got %s", opts.seconds) end
if opts.threads then
  cli.positive_integers("tune_model", opts, {"threads"})
  nd.set_num_threads(opts.threads)
end

nd.manual_seed(0)
local cf = nd.compile(w.setup(nd), {tune = opts.seconds})
for _ = 1, 3 do cf() end -- eager, captured and tuned, replayed
local text = cf:explain()
print(("%s, %d thread(s)"):format(w.name, nd.get_num_threads()))
print(text:match("tuning: [^\n]*") or "tuning: nothing to tune (no fused kernels or products)")
for line in text:gmatch("[^\n]+") do
  if line:match("^fused:") or line:match("^tuned products:") or line:match("^  ") then print(line) end
end
