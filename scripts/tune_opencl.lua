-- scripts/tune_opencl.lua: tune the OpenCL GEMM (matmul) for a device and
-- print what was measured. The choice is saved in the OpenCL cache directory
-- and used by every later process on that device (docs/opencl-gemm.md).
--
--   build/needle-lua scripts/tune_opencl.lua [--device N|all] [--budget S]
--       [--sizes 256,1024,72x73x74,128x3072x768] [--layouts nn,nt] [--quiet] [--no-save]
--   build/needle-lua scripts/tune_opencl.lua --query [--device N|all]
--   build/needle-lua scripts/tune_opencl.lua --forget [--device N|all]
--
-- A size is n (n x n x n) or MxNxK for (M, K) @ (K, N); each is timed in
-- the layouts asked for: nn (b row-major, a @ b) and nt (b = w:t(), the
-- Linear layer's x @ w:t()), which have their own kernels. The budget (seconds,
-- default 5) bounds the time spent trying candidates; kernel builds count,
-- and on a CPU driver (POCL) each takes a second or two, so a thorough run
-- wants --budget 120 or so. The configurations in use are always measured.
local nd = require "needle"

local usage = [[
usage: tune_opencl.lua [--device N|all] [--budget SECONDS] [--sizes LIST] [--layouts nn,nt]
                      [--quiet] [--no-save]
       tune_opencl.lua --query [--device N|all]
       tune_opencl.lua --forget [--device N|all]
  --device N|all  OpenCL device index (default: the default OpenCL device)
  --budget S      seconds for trying candidates (default 5; builds count)
  --sizes LIST    comma-separated n or MxNxK (default 256,1024,72x73x74,128x3072x768)
  --layouts LIST  nn (a @ b), nt (a @ w:t()) or both (default nn,nt)
  --quiet         no progress lines
  --no-save       keep the choice for this process only
  --query         print the configuration in use, tune nothing
  --forget        delete the saved choice (back to the defaults)
]]

local function die(fmt, ...)
  io.stderr:write("tune_opencl: ", fmt:format(...), "\n")
  os.exit(2)
end

local opts = {budget = 5, verbose = true, save = true}
local i = 1
while i <= #arg do
  local a = arg[i]
  local function value()
    i = i + 1
    if arg[i] == nil then die("option %s needs a value", a) end
    return arg[i]
  end
  if a == "-h" or a == "--help" then io.write(usage); os.exit(0)
  elseif a == "--device" then opts.device = value()
  elseif a == "--budget" then
    opts.budget = tonumber(value())
    if not opts.budget or opts.budget < 0 then die("--budget expects seconds >= 0, got '%s'", arg[i]) end
  elseif a == "--sizes" then opts.sizes = value()
  elseif a == "--layouts" then
    opts.layouts = {}
    for l in value():gmatch("[^,]+") do
      if l ~= "nn" and l ~= "nt" then die("--layouts expects nn, nt or nn,nt, got '%s'", arg[i]) end
      opts.layouts[#opts.layouts + 1] = l
    end
  elseif a == "--quiet" then opts.verbose = false
  elseif a == "--no-save" then opts.save = false
  elseif a == "--query" then opts.query = true
  elseif a == "--forget" then opts.forget = true
  else io.stderr:write(("tune_opencl: unknown option '%s'\n\n"):format(a), usage); os.exit(2) end
  i = i + 1
end

local ok, why = nd.opencl_available()
if not ok then die("no OpenCL device: %s", why) end

local sizes
if opts.sizes then
  sizes = {}
  for item in opts.sizes:gmatch("[^,]+") do
    local n = tonumber(item)
    if n then
      if math.type(n) ~= "integer" then die("--sizes: '%s' is not an integer", item) end
      sizes[#sizes + 1] = n
    elseif item:match("^%d+x%d+x%d+$") then
      sizes[#sizes + 1] = item
    else
      die("--sizes: expected n or MxNxK, got '%s'", item)
    end
  end
end

local devices = {}
if opts.device == "all" then
  for _, d in ipairs(nd.devices()) do
    if d.type == "opencl" then devices[#devices + 1] = d.index end
  end
elseif opts.device then
  local n = tonumber(opts.device) or tonumber(opts.device:match("^opencl:(%d+)$") or "")
  if not n then die("--device expects an index, opencl:N or all, got '%s'", opts.device) end
  devices[1] = n
else
  devices[1] = false -- the default OpenCL device
end

local function fmt(v, f) return v and v > 0 and (f or "%.1f"):format(v) or "-" end
local function size_str(s) return ("%dx%dx%d"):format(s.m, s.n, s.k) end

local function print_configs(config, tuned)
  for _, c in ipairs{"small", "large"} do
    for _, l in ipairs{"nn", "nt"} do
      print(("  %s %s: %s%s"):format(c, l, config[c][l], tuned and not tuned[c][l] and " (not tuned)" or ""))
    end
  end
end

for _, dev in ipairs(devices) do
  local base = {device = dev or nil}
  if opts.query or opts.forget then
    local q = nd.opencl_tune{device = base.device, query = opts.query, forget = opts.forget}
    print(("%s  %s"):format(q.device, q.name))
    print_configs(q.config)
    print(("  from: %s"):format(q.source))
    print(("  peak (estimate): %s"):format(q.peak_formula))
  else
    local r = nd.opencl_tune{device = base.device, sizes = sizes, layouts = opts.layouts,
                             budget_s = opts.budget, verbose = opts.verbose, save = opts.save}
    print(("\n%s  %s"):format(r.device, r.name))
    print(("peak (estimate): %s"):format(r.peak_formula))
    -- every candidate that ran, on the problems of its layout
    local head = ("%-30s"):format("candidate (GFLOPS)")
    local cols = {}
    for k, s in ipairs(r.sizes) do
      if s.layout == r.sizes[1].layout then
        cols[#cols + 1] = size_str(s)
        head = head .. ("%16s"):format(size_str(s))
      end
    end
    print("\n" .. head .. "  status")
    local skipped = 0
    for _, c in ipairs(r.candidates) do
      if c.status:match("^skipped") then
        skipped = skipped + 1
      else
        local line = ("%-30s"):format(c.layout .. " " .. c.config)
        local col = 0
        for k, s in ipairs(r.sizes) do
          if s.layout == c.layout then
            col = col + 1
            line = line .. ("%16s"):format(fmt(c.gflops[k]))
          end
        end
        print(line .. "  " .. c.status)
      end
    end
    print(("(%d of %d candidates tried, %d rejected, %d not valid for the device%s; %.1f s)"):format(
      r.tried, r.total, r.rejected, skipped, r.budget_exhausted and ", budget used up: --budget for more" or "",
      r.elapsed_s))
    -- the choice
    print(("\n%-16s %-6s %-6s %-26s %10s %9s %8s %8s"):format("size (MxNxK)", "layout", "class", "config", "ms",
      "GFLOPS", "% peak", "naive"))
    for _, s in ipairs(r.sizes) do
      print(("%-16s %-6s %-6s %-26s %10s %9s %8s %8s"):format(size_str(s), s.layout, s.class,
        s.config or "(default kept)", fmt(s.ms, "%.3f"), fmt(s.gflops),
        fmt(s.gflops and s.gflops / r.peak_gflops * 100), fmt(s.naive_gflops, "%.2f")))
    end
    print("(naive: the naive kernel on the tuner's sampled reference, for scale only)")
    print("\nchosen:")
    print_configs(r.config, r.tuned)
    print(r.file and ("saved to " .. r.file) or "not saved")
  end
end
