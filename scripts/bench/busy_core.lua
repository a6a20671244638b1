-- scripts/bench/busy_core.lua: needle's threads on a shared machine (issue 18).
-- Runs workloads of scripts/bench/workloads.lua (each in a process of its own,
-- scripts/bench/worker.lua) on the quiet machine and while other processes
-- keep cores busy (shell busy loops), with the thread count fixed at N, fixed at
-- one, and adaptive (the default, docs/threads.md), and prints ms per call and
-- the two ratios that matter: adaptive / fixed N on the quiet machine (the
-- cost of adapting; target <= 1.05) and adaptive with the cores busy / one
-- thread with the cores busy (target <= 1.3).
--
--   build/needle-lua scripts/bench/busy_core.lua [--only A,B] [--threads N] [--busy K]
--                    [--rounds R] [--reps N] [--out DIR]
--
-- Each round runs every (mode, condition) once, in an order that alternates
-- between rounds; a cell is the median over rounds. Writes DIR/busy_core.json.
local nd = require "needle"
local json = require("needle.checkpoint").json

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local W = dofile(here .. "/workloads.lua")

local usage = [[
usage: needle-lua scripts/bench/busy_core.lua [options]
  --only LIST    comma-separated workloads (default: resnet9_train,mlp_train,lstm_train,transformer_infer)
  --threads N    the most threads (default: the CPUs, nd.threads().cpus)
  --busy K       busy loops started for the busy condition (default 1)
  --rounds R     rounds (default 3); cells are medians over rounds
  --reps N       timed calls per process (default 5; the median is taken)
  --out DIR      where busy_core.json goes (default runs/busy_core)
]]

local function die(msg)
  io.stderr:write("busy_core.lua: ", msg, "\n")
  os.exit(2)
end

local opts = {only = "resnet9_train,mlp_train,lstm_train,transformer_infer", threads = nd.threads().cpus,
              busy = 1, rounds = 3, reps = 5, out = "runs/busy_core"}
do
  local numeric = {threads = true, busy = true, rounds = true, reps = true}
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "-h" or a == "--help" then io.write(usage) os.exit(0) end
    local key = a:match("^%-%-(%a+)$")
    if not key or opts[key] == nil then die(("unknown option '%s' (see --help)"):format(a)) end
    local v = arg[i + 1]
    if v == nil then die(a .. " needs a value") end
    if numeric[key] then
      v = math.tointeger(tonumber(v))
      if not v or v < 1 then die(a .. " must be an integer >= 1") end
    end
    opts[key] = v
    i = i + 2
  end
end

local workloads = {}
for name in opts.only:gmatch("[^,%s]+") do
  if not W.by_name[name] or W.by_name[name].kind == "startup" or W.by_name[name].metric == "rss" then
    die(("'%s' is not a timed workload (see scripts/bench/run.lua --list)"):format(name))
  end
  workloads[#workloads + 1] = W.by_name[name]
end

local exe = arg[-1] or "needle-lua"
local N = opts.threads
local modes = {
  {key = "fixed", label = ("%d fixed"):format(N), env = "NEEDLE_ADAPTIVE_THREADS=0", threads = N},
  {key = "one", label = "1 thread", env = "NEEDLE_ADAPTIVE_THREADS=0", threads = 1},
  {key = "adaptive", label = ("adaptive, max %d"):format(N), env = "NEEDLE_ADAPTIVE_THREADS=1", threads = N},
}

local busy_pids = {}
local function start_busy()
  for _ = 1, opts.busy do
    local f = io.popen("(while :; do :; done) >/dev/null 2>&1 & echo $!")
    busy_pids[#busy_pids + 1] = math.tointeger(tonumber(f:read("l")))
    f:close()
  end
  local t0 = nd.clock()
  while nd.clock() - t0 < 0.3 do end -- let the scheduler place them
end
local function stop_busy()
  for _, pid in ipairs(busy_pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
  busy_pids = {}
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function run_one(w, mode)
  local cmd = ("%s OMP_NUM_THREADS=%d %s %s %s %d %d %d"):format(mode.env, mode.threads, q(exe),
    q(here .. "/worker.lua"), w.name, opts.reps, w.warmup or 2, mode.threads)
  return C.run_kv(cmd).ms
end

local results = {} -- results[w][mode][cond] = {ms per round}
local ok, err = pcall(function()
  for r = 1, opts.rounds do
    local conds = r % 2 == 1 and {"quiet", "busy"} or {"busy", "quiet"}
    for _, cond in ipairs(conds) do
      if cond == "busy" then start_busy() end
      for _, w in ipairs(workloads) do
        results[w.name] = results[w.name] or {}
        local order = {}
        for k = 1, #modes do order[k] = modes[r % 2 == 1 and k or #modes + 1 - k] end
        for _, m in ipairs(order) do
          results[w.name][m.key] = results[w.name][m.key] or {quiet = {}, busy = {}}
          local cell = results[w.name][m.key][cond]
          cell[#cell + 1] = run_one(w, m)
        end
      end
      if cond == "busy" then stop_busy() end
      io.stderr:write(("round %d/%d: %s done\n"):format(r, opts.rounds, cond))
    end
  end
end)
stop_busy()
if not ok then die(tostring(err)) end

local median = C.median_of

print(("busy_core: %d CPUs, at most %d threads, %d busy loop(s), %d rounds, %d reps; %s; ms per call (median over rounds)")
  :format(nd.threads().cpus, N, opts.busy, opts.rounds, opts.reps, nd.devices()[1].gemm))
local header = ("%-18s %9s %9s %9s %9s %9s %9s %12s %12s"):format("workload", "fixed q", "fixed b", "one q",
  "one b", "adapt q", "adapt b", "adapt/fixed q", "adapt/one b")
print(header)
print(("-"):rep(#header))
local rows = {}
for _, w in ipairs(workloads) do
  local R = results[w.name]
  local row = {workload = w.name}
  for _, m in ipairs(modes) do
    for _, cond in ipairs({"quiet", "busy"}) do
      row[m.key .. "_" .. cond] = median(R[m.key][cond])
      row[m.key .. "_" .. cond .. "_rounds"] = json.array(R[m.key][cond])
    end
  end
  row.adaptive_cost_quiet = row.adaptive_quiet and row.fixed_quiet and row.adaptive_quiet / row.fixed_quiet
  row.adaptive_vs_one_busy = row.adaptive_busy and row.one_busy and row.adaptive_busy / row.one_busy
  rows[#rows + 1] = row
  print(("%-18s %9s %9s %9s %9s %9s %9s %12s %12s"):format(w.name, C.fmt(row.fixed_quiet, "%.3f"),
    C.fmt(row.fixed_busy, "%.3f"), C.fmt(row.one_quiet, "%.3f"), C.fmt(row.one_busy, "%.3f"),
    C.fmt(row.adaptive_quiet, "%.3f"), C.fmt(row.adaptive_busy, "%.3f"),
    C.fmt(row.adaptive_cost_quiet, "%.3f"), C.fmt(row.adaptive_vs_one_busy, "%.3f")))
end
print("targets: adapt/fixed q <= 1.05 (quiet), adapt/one b <= 1.30 (cores busy)")
os.execute("mkdir -p " .. q(opts.out))
local f = assert(io.open(opts.out .. "/busy_core.json", "w"))
f:write(json.encode({threads = N, busy = opts.busy, rounds = opts.rounds, reps = opts.reps,
                     cpus = nd.threads().cpus, gemm = nd.devices()[1].gemm, rows = json.array(rows)}), "\n")
f:close()
print(("wrote %s/busy_core.json"):format(opts.out))
