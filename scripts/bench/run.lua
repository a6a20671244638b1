-- scripts/bench/run.lua: needle-lua against PyTorch on this machine, in one
-- invocation (issue 7). Every workload of scripts/bench/workloads.lua runs in
-- a process of its own (scripts/bench/worker.lua), and, where /usr/bin/python3
-- has torch (Debian's python3-torch), the same workload in PyTorch
-- (scripts/bench/torch_ref.py) at the same thread count; the matmuls also
-- against cblas_sgemm called directly (scripts/bench/sgemm.c). Prints a table
-- and writes OUT/bench.json, OUT/bench.csv and OUT/ratios.svg.
--
-- Each workload runs in several rounds; a round launches the needle, PyTorch
-- (and cblas) processes back to back, in alternating order, and its ratio
-- compares processes that ran seconds apart. The reported ratio is the
-- median of the rounds' ratios: on a shared machine whose speed drifts by
-- tens of percent over minutes, that is much steadier than the ratio of two
-- medians taken at different moments.
--
--   build/needle-lua scripts/bench/run.lua [--only NAME[,NAME]] [--rounds N] [--reps N]
--                    [--warmup N] [--threads N | --scaling 1,2,4,...] [--no-torch] [--out DIR]
--                    [--device DEV] [--torch-device DEV]
--
-- See docs/benchmarks.md for the workloads, the targets and how to read the
-- output.
local nd = require "needle"
local json = require("needle.checkpoint").json

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local W = dofile(here .. "/workloads.lua")

local usage = [[
usage: needle-lua scripts/bench/run.lua [options]

Runs the issue-7 workloads with needle-lua and, where /usr/bin/python3 has
torch, with PyTorch (scripts/bench/torch_ref.py), each in a process of its own,
and reports times, needle/PyTorch ratios against the targets, and peak RSS.

options:
  --only LIST     comma-separated workload names or issue numbers (e.g.
                  small_ops,mlp_train or 1,2); default: all
  --rounds N      rounds per workload (default 3, lstm_rss 1): each round runs needle and
                  the reference back to back, alternating which goes first;
                  the reported ratio is the median of the rounds' ratios
  --reps N        timed runs per workload process (the median is reported);
                  default: each workload's own (workloads.lua)
  --warmup N      untimed calls before timing; default: each workload's own
  --threads N     threads for needle, PyTorch and OpenBLAS (default: 2)
  --no-torch      needle only
  --python PATH   the Python whose torch is the reference (default:
                  /usr/bin/python3, Debian's python3-torch)
  --device DEV    needle's device for the models and inputs (default cpu; e.g.
                  opencl:0); start-up, peak-RSS and cblas rows are CPU-only
                  and are left out on another device
  --torch-device DEV
                  PyTorch's device (default cpu; e.g. cuda); each timed call
                  of either side ends by synchronizing its device
  --scaling LIST  thread counts (e.g. 1,2,4,8,16): every selected workload at each
                  count, needle and PyTorch (and cblas for the matmuls); prints time
                  and speed-up over the first count, writes scaling.json and
                  scaling.svg instead of the ratio table
  --out DIR       where bench.json, bench.csv and ratios.svg go (default: runs/bench)
  --list          print the workloads and exit

workloads:
]]

local function die(msg)
  io.stderr:write("run.lua: ", msg, "\n")
  os.exit(2)
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- options ----------------------------------------------------------------------------
local opts = {threads = 2, out = "runs/bench"}
do
  local i = 1
  local function value(name)
    i = i + 1
    if arg[i] == nil then die(name .. " needs a value") end
    return arg[i]
  end
  local function count(name, min)
    local v = math.tointeger(tonumber(value(name)))
    if not v or v < min then die(("%s must be an integer >= %d"):format(name, min)) end
    return v
  end
  while i <= #arg do
    local a = arg[i]
    if a == "--only" then opts.only = value(a)
    elseif a == "--rounds" then opts.rounds = count(a, 1)
    elseif a == "--reps" then opts.reps = count(a, 1)
    elseif a == "--warmup" then opts.warmup = count(a, 0)
    elseif a == "--threads" then opts.threads = count(a, 1)
    elseif a == "--scaling" then
      opts.scaling = {}
      for item in value(a):gmatch("[^,%s]+") do
        local n = math.tointeger(tonumber(item))
        if not n or n < 1 then die("--scaling takes thread counts >= 1, e.g. 1,2,4,8,16") end
        opts.scaling[#opts.scaling + 1] = n
      end
      if #opts.scaling == 0 then die("--scaling takes thread counts >= 1, e.g. 1,2,4,8,16") end
    elseif a == "--out" then opts.out = value(a)
    elseif a == "--no-torch" then opts.no_torch = true
    elseif a == "--python" then C.python = q(value(a))
    elseif a == "--device" then opts.device = value(a)
    elseif a == "--torch-device" then opts.torch_device = value(a)
    elseif a == "--list" or a == "-h" or a == "--help" then
      if a ~= "--list" then io.write(usage) end
      for _, w in ipairs(W.list) do print(("  %-18s %d  %s"):format(w.name, w.issue, w.what)) end
      os.exit(0)
    else die(("unknown option '%s' (see --help)"):format(a)) end
    i = i + 1
  end
end

local selected = {}
if opts.only then
  local want = {}
  for item in opts.only:gmatch("[^,%s]+") do
    local n = math.tointeger(tonumber(item))
    local hit = false
    for _, w in ipairs(W.list) do
      if w.name == item or w.issue == n then want[w.name], hit = true, true end
    end
    if not hit then die(("unknown workload '%s' (see --list)"):format(item)) end
  end
  for _, w in ipairs(W.list) do if want[w.name] then selected[#selected + 1] = w end end
else
  selected = W.list
end
if opts.device and opts.device ~= "cpu" then
  local on_dev = {}
  for _, w in ipairs(selected) do if not w.host_only then on_dev[#on_dev + 1] = w end end
  selected = on_dev
end
local dev_arg = opts.device and (" " .. q(opts.device)) or ""
local torch_dev_arg = opts.torch_device and (" " .. q(opts.torch_device)) or ""

-- processes ----------------------------------------------------------------------------
local exe = arg[-1] or "needle-lua"
local threads, env
-- the thread count for every child, also the libraries' own pools
local function set_threads(n)
  threads = n
  env = ("OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d "):format(n, n)
end
set_threads(opts.threads)

local function shell_ok(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

local shell_out = C.shell_out

local function run_child(label, cmd) return C.run_child("run.lua", label, cmd) end

local have_torch = false
if not opts.no_torch then
  have_torch = shell_ok(C.python .. " -c 'import torch' >/dev/null 2>&1")
end

-- cblas_sgemm called directly, against the libopenblas needle-lua loads
local sgemm_bin
local function build_sgemm()
  if sgemm_bin ~= nil then return sgemm_bin end
  sgemm_bin = false
  local lib = shell_out("ldd " .. q(exe) .. " 2>/dev/null"):match("libopenblas[^\n]-=>%s*(%S+)")
  local libdir = lib and lib:match("^(.*)/[^/]*$")
  local bin = os.tmpname()
  local inc = "-I/usr/include/x86_64-linux-gnu/openblas-pthread"
  if libdir and libdir:find("openblas%-openmp") then inc = "-I/usr/include/x86_64-linux-gnu/openblas-openmp" end
  if shell_ok(("cc -O2 %s %s -o %s -lopenblas 2>/dev/null"):format(inc, q(here .. "/sgemm.c"), q(bin))) then
    sgemm_bin = (libdir and ("LD_LIBRARY_PATH=" .. q(libdir) .. " ") or "") .. q(bin)
    C.sgemm_file = bin
  else
    os.remove(bin)
    io.stderr:write("run.lua: could not build scripts/bench/sgemm.c (cc, libopenblas-dev): no cblas rows\n")
  end
  return sgemm_bin
end

local function reps_of(w) return opts.reps or w.reps or 1 end
local function warmup_of(w) return opts.warmup or w.warmup or 0 end

-- start-up (workload 8): the median of reps launches after warmup ones, and
-- the peak RSS of one more launch that prints it
local rss_lua = [[local f = io.open("/proc/self/status") print("rss_mb " .. tonumber(f:read("a"):match("VmHWM:%s*(%d+)")) / 1024)]]
local rss_py = [[import sys; sys.path.insert(0, sys.argv[1]); from bench_common import peak_rss_mb; print("rss_mb %.3f" % peak_rss_mb())]]
local function startup(cmd, rss_cmd, reps, warmup)
  for _ = 1, warmup do os.execute(cmd .. " >/dev/null 2>&1") end
  local ts = {}
  for i = 1, reps do
    local t0 = nd.clock()
    local ok = shell_ok(cmd .. " >/dev/null 2>&1")
    ts[i] = nd.clock() - t0
    if not ok then return {} end
  end
  table.sort(ts)
  local kv = C.run_kv(rss_cmd)
  kv.ms = ts[(reps + 1) // 2] * 1e3
  return kv
end

-- One round of workload w: needle's process and the references' (PyTorch, and
-- cblas for the matmuls), back to back; ref_first flips the order, so that a
-- machine speeding up or slowing down during a round favours neither side.
local function measure_round(w, ref_first)
  local reps, warmup = reps_of(w), warmup_of(w)
  local mine, theirs, cblas = {}, {}, nil
  local function run_mine()
    if w.kind == "startup" then
      mine = startup(q(exe) .. [[ -e 'require "needle"']],
        q(exe) .. " -e " .. q('require "needle" ' .. rss_lua), reps, warmup)
    else
      mine = run_child(w.name .. " (needle)", ("%s%s %s %s %d %d %d%s"):format(env, q(exe),
        q(here .. "/worker.lua"), w.name, reps, warmup, threads, dev_arg))
    end
  end
  local function run_refs()
    if have_torch then
      if w.kind == "startup" then
        theirs = startup(C.python .. " -c 'import torch'",
          C.python .. " -c " .. q("import torch; " .. rss_py) .. " " .. q(here), reps, warmup)
      else
        theirs = run_child(w.name .. " (PyTorch)", ("%s%s %s %s %d %d %d%s"):format(env, C.python,
          q(here .. "/torch_ref.py"), w.name, reps, warmup, threads, torch_dev_arg))
      end
    end
    if w.cblas and dev_arg == "" and build_sgemm() then
      local m, k, n = table.unpack(w.cblas)
      cblas = run_child(w.name .. " (cblas)", ("%s%s %d %d %d %d %d %d"):format(env, sgemm_bin,
        m, k, n, reps, warmup, threads))
    end
  end
  if ref_first then run_refs(); run_mine() else run_mine(); run_refs() end
  return mine, theirs, cblas
end

-- rows ------------------------------------------------------------------------------------
local median = C.median_of

-- the row of one comparison over all rounds: mine[i], theirs[i] are round i's
-- results; times and RSS are the medians over rounds, the ratio the median of
-- the rounds' own ratios (ratio_min/ratio_max: their spread)
local function row(w, name, ref, mine, theirs, target)
  local function col(rs, key)
    local xs = {}
    for _, kv in ipairs(rs) do if kv[key] then xs[#xs + 1] = kv[key] end end
    return median(xs)
  end
  local r = {name = name, workload = w.name, issue = w.issue, what = w.what, metric = w.metric,
             ref = ref, target = target, needle_ms = col(mine, "ms"), ref_ms = col(theirs, "ms"),
             needle_rss_mb = col(mine, "rss_mb"), ref_rss_mb = col(theirs, "rss_mb"),
             reps = w.steps and w.steps or reps_of(w), warmup = w.steps and 0 or warmup_of(w)}
  local key = w.metric == "rss" and "rss_mb" or "ms"
  local ratios = {}
  r.per_round = json.array({}) -- {needle = , ref = } of the metric; a key is absent where a process failed
  for i = 1, #mine do
    local a, b = mine[i][key], theirs[i] and theirs[i][key]
    r.per_round[i] = {needle = a, ref = b}
    if a and b and b > 0 then ratios[#ratios + 1] = a / b end
  end
  r.rounds = #ratios
  if #ratios > 0 then
    r.ratio = median(ratios)
    r.ratio_min, r.ratio_max = math.min(table.unpack(ratios)), math.max(table.unpack(ratios))
    r.met = r.ratio <= target
  end
  return r
end

if opts.scaling then
  local S = dofile(here .. "/scaling.lua")
  S.run({selected = selected, counts = opts.scaling, rounds = opts.rounds or 1, out = opts.out,
         set_threads = set_threads, measure_round = measure_round, have_torch = have_torch,
         python = C.python})
  if C.sgemm_file then os.remove(C.sgemm_file) end
  os.exit(0)
end

local rows = {}
local t_start = nd.clock()
for i, w in ipairs(selected) do
  local t0 = nd.clock()
  local mine, theirs, cblas = {}, {}, {}
  local rounds = opts.rounds or w.rounds or 3
  for k = 1, rounds do
    mine[k], theirs[k], cblas[k] = measure_round(w, k % 2 == 0)
  end
  local r = row(w, w.name, "PyTorch", mine, theirs, w.target)
  rows[#rows + 1] = r
  io.stderr:write(("[%d/%d] %-18s needle %s ms, PyTorch %s ms, ratio %s over %d rounds (%.0f s)\n")
    :format(i, #selected, w.name, C.fmt(r.needle_ms, "%.3f"), C.fmt(r.ref_ms, "%.3f"),
            C.fmt(r.ratio, "%.3f"), rounds, nd.clock() - t0))
  if next(cblas) then
    -- issue 7: within 5% of cblas_sgemm called directly
    rows[#rows + 1] = row(w, w.name .. "_vs_cblas", "cblas_sgemm", mine, cblas, 1.05)
  end
end
if C.sgemm_file then os.remove(C.sgemm_file) end
local elapsed = nd.clock() - t_start

-- the table ------------------------------------------------------------------------------
local function cpu_model()
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local m = f:read("a"):match("model name%s*:%s*([^\n]+)")
  f:close()
  return m
end
local torch_version = have_torch and shell_out(C.python .. " -c 'import torch; print(torch.__version__)' 2>/dev/null"):match("%S+")
local meta = {
  date = os.date("!%Y-%m-%dT%H:%M:%SZ"),
  machine = (shell_out("uname -srm 2>/dev/null"):gsub("%s+$", "")),
  cpu = cpu_model(), cores = tonumber((shell_out("nproc 2>/dev/null"))),
  threads = threads, torch = torch_version or (opts.no_torch and "not run" or "not installed"),
  device = opts.device or "cpu", torch_device = opts.torch_device or "cpu",
  needle = nd.version or nd._VERSION, rounds = opts.rounds, reps = opts.reps, warmup = opts.warmup,
  elapsed_s = elapsed,
}

local header = ("%-24s %2s %11s %11s %-6s %7s %13s %7s %4s %9s %9s"):format("workload", "#",
  "needle ms", "ref ms", "ref", "ratio", "rounds range", "target", "met", "needle MB", "ref MB")
print(("needle-lua benchmark  %s  %s, %s cores, threads %d, PyTorch %s, %s rounds, devices %s / %s"):format(meta.date,
  meta.cpu or meta.machine, tostring(meta.cores), threads, meta.torch, opts.rounds or "3 (lstm_rss 1)",
  meta.device, meta.torch_device))
print(header)
print(("-"):rep(#header))
local met_n, with_ratio = 0, 0
for _, r in ipairs(rows) do
  local ms_fmt = (r.needle_ms and r.needle_ms < 10) and "%.3f" or "%.2f"
  print(("%-24s %2d %11s %11s %-6s %7s %13s %7s %4s %9s %9s"):format(r.name, r.issue,
    C.fmt(r.needle_ms, ms_fmt), C.fmt(r.ref_ms, ms_fmt), r.ref == "PyTorch" and "torch" or "cblas",
    r.ratio and ("%.3f"):format(r.ratio) or "-",
    r.ratio and ("%.3f-%.3f"):format(r.ratio_min, r.ratio_max) or "-", ("<=%.2f"):format(r.target),
    r.met == nil and "-" or (r.met and "yes" or "NO"),
    C.fmt(r.needle_rss_mb, "%.1f"), C.fmt(r.ref_rss_mb, "%.1f")))
  if r.ratio then
    with_ratio = with_ratio + 1
    if r.met then met_n = met_n + 1 end
  end
end
print(("ratio = median over rounds of needle / ref time (lstm_rss: peak RSS); %d of %d targets met; %.0f s")
  :format(met_n, with_ratio, elapsed))

-- compiled rows against their eager needle rows (issue 17)
do
  local by = {}
  for _, r in ipairs(rows) do by[r.name] = r end
  local any = false
  for _, r in ipairs(rows) do
    local w = W.by_name[r.name]
    local e = w and w.compiled_of and by[w.compiled_of]
    if e and e.needle_ms and r.needle_ms then
      if not any then
        print(("\n%-24s %11s %11s %8s %7s %4s"):format("compiled", "eager ms", "compiled ms", "speed-up",
                                                      "target", "met"))
        any = true
      end
      r.speedup = e.needle_ms / r.needle_ms
      r.speedup_met = r.speedup >= w.speedup_target
      print(("%-24s %11.3f %11.3f %7.2fx %6.1fx %4s"):format(r.name, e.needle_ms, r.needle_ms, r.speedup,
                                                            w.speedup_target, r.speedup_met and "yes" or "NO"))
    end
  end
end

-- files -------------------------------------------------------------------------------------
os.execute("mkdir -p " .. q(opts.out))
local function write(name, text)
  local path = opts.out .. "/" .. name
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

write("bench.json", json.encode({meta = meta, rows = json.array(rows)}) .. "\n")

local cols = {"name", "workload", "issue", "metric", "ref", "needle_ms", "ref_ms", "ratio", "ratio_min",
              "ratio_max", "rounds", "target", "met", "needle_rss_mb", "ref_rss_mb", "reps", "warmup",
              "speedup", "speedup_met"}
local csv = {table.concat(cols, ",")}
for _, r in ipairs(rows) do
  local cells = {}
  for i, c in ipairs(cols) do
    local v = r[c]
    if type(v) == "number" and math.type(v) == "float" then v = ("%.6g"):format(v) end
    if type(v) == "boolean" then v = v and "yes" or "no" end
    cells[i] = v == nil and "" or tostring(v)
  end
  csv[#csv + 1] = table.concat(cells, ",")
end
write("bench.csv", table.concat(csv, "\n") .. "\n")

-- ratios.svg: one horizontal bar per row (log scale, 1 = parity), its target as
-- a tick; green where met, red where missed, grey where there is no ratio
local function svg(rs)
  local function esc(s) return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end
  local L, R, T, BH, GAP = 200, 80, 50, 18, 8
  local Wd = 900
  local H = T + #rs * (BH + GAP) + 50
  local lo, hi = math.log(0.01, 10), math.log(100, 10)
  for _, r in ipairs(rs) do
    for _, v in ipairs({r.ratio or 1, r.target}) do
      lo, hi = math.min(lo, math.floor(math.log(v, 10))), math.max(hi, math.ceil(math.log(v, 10)))
    end
  end
  local function px(v) return L + (math.log(v, 10) - lo) / (hi - lo) * (Wd - L - R) end
  local out = {('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'):format(Wd, H),
    ('<rect width="%d" height="%d" fill="white"/>'):format(Wd, H),
    ('<text x="%d" y="22" text-anchor="middle" font-size="15">needle / reference (lower is better; | = target)  %s, %d threads</text>')
      :format(Wd / 2, esc(meta.date), threads)}
  for e = lo, hi do
    local x = px(10 ^ e)
    out[#out + 1] = ('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>'):format(x, T - 6, x, H - 40,
      e == 0 and "#444" or "#ddd")
    out[#out + 1] = ('<text x="%.1f" y="%d" text-anchor="middle">%g</text>'):format(x, H - 24, 10 ^ e)
  end
  for i, r in ipairs(rs) do
    local y = T + (i - 1) * (BH + GAP)
    local color = r.met == nil and "#999" or (r.met and "#2ca02c" or "#d62728")
    out[#out + 1] = ('<text x="%d" y="%.1f" text-anchor="end">%s</text>'):format(L - 8, y + BH * 0.75, esc(r.name))
    local x0 = px(10 ^ lo)
    if r.ratio then
      out[#out + 1] = ('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>'):format(x0, y,
        math.max(1, px(r.ratio) - x0), BH, color)
      out[#out + 1] = ('<text x="%.1f" y="%.1f">%.3g</text>'):format(px(r.ratio) + 4, y + BH * 0.75, r.ratio)
    end
    local tx = px(r.target)
    out[#out + 1] = ('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black" stroke-width="2"/>'):format(tx, y - 2, tx, y + BH + 2)
  end
  out[#out + 1] = ('<text x="%d" y="%d" text-anchor="middle">ratio (log scale; green: target met, red: missed, grey: no reference)</text>')
    :format(Wd / 2, H - 6)
  out[#out + 1] = "</svg>\n"
  return table.concat(out, "\n")
end
write("ratios.svg", svg(rows))
print(("wrote %s/bench.json, bench.csv, ratios.svg"):format(opts.out))
