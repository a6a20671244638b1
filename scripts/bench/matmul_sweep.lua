-- scripts/bench/matmul_sweep.lua: float32 matmul speed over sizes, on the
-- cpu (needle's GEMM, docs/cpu-gemm.md) and on every OpenCL device (the tuned GEMM of
-- kernels/gemm.cl, docs/opencl-gemm.md).
--
--   build/needle-lua scripts/bench/matmul_sweep.lua [--sizes LIST] [--reps N]
--       [--devices cpu,opencl:0] [--layouts nn,nt] [--out DIR] [--quick]
--       [--python PATH] [--torch-device DEV] [--no-torch]
--
-- Sizes: the squares 16, 32, ..., 4096 and the awkward 72x73x74, 1000 and
-- 2500 (a size is n or MxNxK for (M, K) @ (K, N)), each in two layouts: nn
-- is a @ b with both row-major, nt is a @ w:t() with w (N, K) row-major (a
-- Linear layer's product; the transposed view is read in place, OpenCL has
-- a kernel of its own for it). Each point is the median
-- of --reps timed calls (default 5; 3 when one call takes over 2 s) after
-- untimed warm-up calls; every call ends with nd.synchronize(device), so
-- OpenCL times include the kernel, not just its enqueueing. GFLOPS counts
-- 2 M N K. Writes DIR/matmul_sweep.csv, DIR/matmul_sweep.json and a plot
-- (DIR/matmul_sweep.png with gnuplot, else .svg); DIR defaults to
-- runs/matmul_sweep. --quick: sizes 16..512 and 72x73x74, 3 reps.
--
-- Where the Python (default /usr/bin/python3) has torch, PyTorch's
-- torch.matmul runs the same sizes and layouts in the same run
-- (scripts/bench/matmul_sweep_torch.py, the same timing method, at the same
-- thread count) on --torch-device (default cpu; cuda on the GPU machine):
-- its columns and plot lines are "torch DEV LAYOUT", and each needle device
-- gets a needle / PyTorch time ratio per point (> 1: needle slower).
local nd = require "needle"
local plot = require "needle.plot"
local json = require("needle.checkpoint").json
local cli = require "needle.cli"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")

local usage = [[
usage: matmul_sweep.lua [--sizes LIST] [--reps N] [--devices LIST] [--layouts LIST] [--out DIR] [--quick]
  --sizes LIST    comma-separated n or MxNxK (default 16,32,...,4096,72x73x74,1000,2500)
  --reps N        timed calls per point (default 5, 3 with --quick)
  --devices LIST  comma-separated devices (default: cpu and every OpenCL device)
  --layouts LIST  nn (a @ b), nt (a @ w:t()) or nn,nt (default nn,nt)
  --out DIR       where the CSV, JSON and plot go (default runs/matmul_sweep)
  --quick         sizes 16..512 and 72x73x74 (unless --sizes), 3 reps
  --python PATH   the Python whose torch runs the same products (default /usr/bin/python3)
  --torch-device DEV  PyTorch's device (default cpu; cuda on a GPU machine)
  --no-torch      needle only
]]

local function die(fmt, ...)
  io.stderr:write("matmul_sweep: ", fmt:format(...), "\n")
  os.exit(2)
end

local opts = {out = "runs/matmul_sweep"}
local i = 1
while i <= #arg do
  local a = arg[i]
  local function value()
    i = i + 1
    if arg[i] == nil then die("option %s needs a value", a) end
    return arg[i]
  end
  if a == "-h" or a == "--help" then io.write(usage); os.exit(0)
  elseif a == "--sizes" then opts.sizes = value()
  elseif a == "--reps" then
    opts.reps = tonumber(value())
    if math.type(opts.reps) ~= "integer" or opts.reps < 1 then die("--reps expects an integer >= 1, got '%s'", arg[i]) end
  elseif a == "--devices" then opts.devices = value()
  elseif a == "--layouts" then
    opts.layouts = {}
    for l in value():gmatch("[^,]+") do
      if l ~= "nn" and l ~= "nt" then die("--layouts expects nn, nt or nn,nt, got '%s'", arg[i]) end
      opts.layouts[#opts.layouts + 1] = l
    end
  elseif a == "--out" then opts.out = value()
  elseif a == "--quick" then opts.quick = true
  elseif a == "--python" then C.python = value()
  elseif a == "--torch-device" then opts.torch_device = value()
  elseif a == "--no-torch" then opts.no_torch = true
  else io.stderr:write(("matmul_sweep: unknown option '%s'\n\n"):format(a), usage); os.exit(2) end
  i = i + 1
end
local reps = opts.reps or (opts.quick and 3 or 5)
local layouts = opts.layouts or {"nn", "nt"}

-- sizes as {m, n, k, label}
local sizes = {}
local function add_size(item)
  local n = tonumber(item)
  if n and math.type(n) == "integer" and n > 0 then
    sizes[#sizes + 1] = {n, n, n, tostring(n)}
    return
  end
  local m, nn, k = item:match("^(%d+)x(%d+)x(%d+)$")
  if not m or tonumber(m) < 1 or tonumber(nn) < 1 or tonumber(k) < 1 then
    die("--sizes: expected n or MxNxK, got '%s'", item)
  end
  sizes[#sizes + 1] = {tonumber(m), tonumber(nn), tonumber(k), item}
end
if opts.sizes then
  for item in opts.sizes:gmatch("[^,]+") do add_size(item) end
else
  local top = opts.quick and 512 or 4096
  local n = 16
  while n <= top do add_size(tostring(n)); n = n * 2 end
  add_size("72x73x74")
  if not opts.quick then add_size("1000"); add_size("2500") end
end
table.sort(sizes, function(a, b) return a[1] * a[2] * a[3] < b[1] * b[2] * b[3] end)

-- devices: names with their nd.devices() entries
local all = nd.devices()
local by_name = {}
for _, d in ipairs(all) do by_name[d.name] = d end
local devices = {}
if opts.devices then
  for name in opts.devices:gmatch("[^,]+") do
    if name == "opencl" then -- the default OpenCL device
      local probe = nd.zeros({1}, {device = "opencl"})
      name = probe.device
    end
    if not by_name[name] then
      local names = {}
      for _, d in ipairs(all) do names[#names + 1] = d.name end
      die("no device '%s' (nd.devices(): %s)", name, table.concat(names, ", "))
    end
    devices[#devices + 1] = name
  end
else
  for _, d in ipairs(all) do devices[#devices + 1] = d.name end
end

print(("needle-lua matmul sweep: float32, median of %d (threads: %d)"):format(reps, nd.get_num_threads()))
local peaks = {}
for _, name in ipairs(devices) do
  local d = by_name[name]
  if d.type == "opencl" then
    local q = nd.opencl_tune{device = d.index, query = true}
    peaks[name] = q.peak_gflops
    print(("  %s: %s (%s); GEMM %s"):format(name, d.device, d.driver, q.source))
    print(("    small: nn %s, nt %s; large: nn %s, nt %s"):format(q.config.small.nn, q.config.small.nt,
      q.config.large.nn, q.config.large.nt))
    print(("    peak (estimate): %s"):format(q.peak_formula))
  else
    print(("  %s: %s, %d threads"):format(name, d.gemm or "OpenBLAS", d.threads or nd.get_num_threads()))
  end
end

local results = {}
local function measure(dev, s, layout)
  local m, n, k = s[1], s[2], s[3]
  nd.manual_seed(0)
  local a = nd.randn({m, k}):to(dev)
  local b = layout == "nt" and nd.randn({n, k}):to(dev):t() or nd.randn({k, n}):to(dev)
  local function call()
    local c = nd.matmul(a, b)
    nd.synchronize(dev)
    return c
  end
  -- one call first, to size the warm-up and the number of runs (and to
  -- build the OpenCL kernels, which is not what is being timed)
  local t0 = nd.clock()
  call()
  local first = nd.clock() - t0
  local r = first > 2 and math.min(reps, 3) or reps
  local secs = C.median_time(call, r, first > 2 and 0 or 2)
  a, b = nil, nil
  collectgarbage()
  return secs, r
end

for _, dev in ipairs(devices) do
  for _, s in ipairs(sizes) do
    for _, layout in ipairs(layouts) do
      cli.progress(("  %s %s %s ..."):format(dev, s[4], layout))
      local secs, r = measure(dev, s, layout)
      results[#results + 1] = {device = dev, name = by_name[dev].device or by_name[dev].gemm or "OpenBLAS", layout = layout,
        m = s[1], n = s[2], k = s[3], size = s[4], ms = secs * 1e3,
        gflops = 2 * s[1] * s[2] * s[3] / secs * 1e-9, reps = r}
    end
  end
end
cli.progress("")

-- PyTorch's side: the same sizes and layouts in one process
local torch_dev = opts.torch_device or "cpu"
local torch_version
if not opts.no_torch then
  local list = {}
  for _, s in ipairs(sizes) do list[#list + 1] = ("%dx%dx%d"):format(s[1], s[2], s[3]) end
  cli.progress("  PyTorch ...")
  local kv = C.run_kv(("%s %s %d %d %s %s %s"):format(C.python, here .. "/matmul_sweep_torch.py",
    nd.get_num_threads(), reps, torch_dev, table.concat(layouts, ","), table.concat(list, ",")))
  cli.progress("")
  torch_version = kv.text.torch
  if torch_version then
    local tname = "torch " .. torch_dev
    for _, s in ipairs(sizes) do
      for _, layout in ipairs(layouts) do
        local ms = kv[("%s:%dx%dx%d"):format(layout, s[1], s[2], s[3])]
        if ms then
          results[#results + 1] = {device = tname, name = "PyTorch " .. torch_version, layout = layout,
            m = s[1], n = s[2], k = s[3], size = s[4], ms = ms, gflops = 2 * s[1] * s[2] * s[3] / (ms * 1e-3) * 1e-9,
            reps = reps}
        end
      end
    end
    devices[#devices + 1] = tname
    by_name[tname] = {device = "PyTorch " .. torch_version .. " " .. torch_dev}
    print(("  %s: PyTorch %s, torch.matmul, %d threads"):format(tname, torch_version, nd.get_num_threads()))
  else
    print(("  PyTorch: not run (%s cannot import torch)"):format(C.python))
  end
end

-- the table: one row per size, ms and GFLOPS per device and layout
local function find(dev, s, layout)
  for _, r in ipairs(results) do
    if r.device == dev and r.size == s[4] and r.layout == layout then return r end
  end
end
local head = ("%-16s"):format("size (MxNxK)")
for _, dev in ipairs(devices) do
  for _, layout in ipairs(layouts) do head = head .. ("%22s"):format(dev .. " " .. layout) end
end
print("\n" .. head .. "    (ms / GFLOPS)")
for _, s in ipairs(sizes) do
  local line = ("%-16s"):format(s[1] == s[2] and s[2] == s[3] and s[4] or ("%dx%dx%d"):format(s[1], s[2], s[3]))
  for _, dev in ipairs(devices) do
    for _, layout in ipairs(layouts) do
      local r = find(dev, s, layout)
      line = line .. ("%22s"):format(r and ("%.3f / %.1f"):format(r.ms, r.gflops) or "-")
    end
  end
  print(line)
end
-- needle / PyTorch per point, for each needle device
if torch_version then
  local tname = "torch " .. torch_dev
  print(("\n%-16s"):format("needle / torch") .. "    (time ratio: > 1 means needle is slower)")
  for _, s in ipairs(sizes) do
    local line = ("%-16s"):format(s[1] == s[2] and s[2] == s[3] and s[4] or ("%dx%dx%d"):format(s[1], s[2], s[3]))
    for _, dev in ipairs(devices) do
      if dev ~= tname then
        for _, layout in ipairs(layouts) do
          local r, t = find(dev, s, layout), find(tname, s, layout)
          line = line .. ("%22s"):format(r and t and ("%s %s %.2f"):format(dev, layout, r.ms / t.ms) or "-")
        end
      end
    end
    print(line)
  end
  for _, r in ipairs(results) do
    local t = r.device ~= tname and find(tname, {r.m, r.n, r.k, r.size}, r.layout)
    if t then r.vs_torch = r.ms / t.ms end
  end
end

for _, dev in ipairs(devices) do
  if peaks[dev] then
    local best = 0
    for _, r in ipairs(results) do if r.device == dev and r.gflops > best then best = r.gflops end end
    print(("%s: best %.1f GFLOPS = %.0f%% of the estimated peak %.0f GFLOPS"):format(dev, best,
      best / peaks[dev] * 100, peaks[dev]))
  end
end

-- files
cli.mkdir_p(opts.out)
local base = opts.out .. "/matmul_sweep"
local f = assert(io.open(base .. ".csv", "w"))
f:write("device,name,layout,m,n,k,ms,gflops,reps\n")
for _, r in ipairs(results) do
  f:write(('%s,"%s",%s,%d,%d,%d,%.6f,%.4f,%d\n'):format(r.device, r.name:gsub('"', '""'), r.layout, r.m, r.n,
    r.k, r.ms, r.gflops, r.reps))
end
f:close()
local meta = {reps = reps, layouts = layouts, threads = nd.get_num_threads(), date = os.date("!%Y-%m-%dT%H:%M:%SZ"), devices = {},
              torch = torch_version or (opts.no_torch and "not run" or "missing"), torch_device = torch_dev}
for _, dev in ipairs(devices) do
  local d = by_name[dev]
  meta.devices[#meta.devices + 1] = {name = dev, device = d.device or "cpu", driver = d.driver or "",
    peak_gflops_estimate = peaks[dev]}
end
f = assert(io.open(base .. ".json", "w"))
f:write(json.encode({meta = meta, results = results}), "\n")
f:close()
local series = {}
for _, dev in ipairs(devices) do
  for _, layout in ipairs(layouts) do
    local s = {name = dev .. " " .. layout, x = {}, y = {}}
    for _, r in ipairs(results) do
      if r.device == dev and r.layout == layout then
        s.x[#s.x + 1] = math.log(r.m * r.n * r.k, 2) / 3
        s.y[#s.y + 1] = r.gflops
      end
    end
    series[#series + 1] = s
  end
end
local plotted = plot.lines(base, {title = "matmul float32 (median of " .. reps .. ")",
  xlabel = "log2 of (M N K)^(1/3)  (4 = 16, 12 = 4096)", ylabel = "GFLOPS", series = series})
print(("\nwrote %s.csv, %s.json, %s"):format(base, base, plotted))
