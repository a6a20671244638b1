-- scripts/bench/foundation.lua: the foundation's speed targets, measured
-- side by side with plain C (cblas_sgemm called directly, a bare add loop)
-- and with PyTorch when it is installed, reported as ratios.
--
--   build/needle-lua scripts/bench/foundation.lua [--reps N]
--
-- Targets (issue 2): 1024^2 float32 matmul within 5% of cblas_sgemm; a + b on
-- 16 elements <= 1 us/op; 2^24-element add near memory bandwidth (the C
-- loop); `needle-lua -e ''` starts in under 20 ms.
local nd = require "needle"

local reps = 15
for i = 1, #arg do
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
  if arg[i] == "-h" or arg[i] == "--help" then
    print("usage: needle-lua scripts/bench/foundation.lua [--reps N]")
    os.exit(0)
  end
end

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local root = C.root
local exe = arg[-1] or "needle-lua"
local median_time, fmt, ratio = C.median_time, C.fmt, C.ratio

-- plain C yardsticks
local bin = os.tmpname()
local ok = os.execute(("cc -O3 -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-pthread %s/scripts/bench/baseline.c -o %s -lopenblas"):format(root, bin))
local c = ok and C.run_kv(bin .. " " .. reps) or {}
os.remove(bin)

-- PyTorch, if present
local torch = C.run_torch(("foundation_torch.py %d"):format(reps))
local have_torch = torch.matmul_1024_ms ~= nil

-- needle
local r = {}
do
  local a, b = nd.rand({1024, 1024}), nd.rand({1024, 1024})
  r.matmul_1024_ms = median_time(function() return a:matmul(b) end, reps) * 1e3
  local at = nd.rand({1024, 1024}):t()
  r.matmul_1024_t_ms = median_time(function() return at:matmul(b) end, reps) * 1e3
end
do
  local x, y = nd.rand({16}), nd.rand({16})
  local n = 200000
  r.add16_us = median_time(function() for _ = 1, n do local _ = x + y end end, 5) / n * 1e6
end
do
  local X, Y = nd.ones({1 << 24}), nd.ones({1 << 24})
  local s = median_time(function() return X + Y end, reps)
  r.add_2p24_ms = s * 1e3
  r.add_2p24_gbs = 3 * 4 * (1 << 24) / s / 1e9
end
do
  local n = 50
  local function loop(cmd)
    local t0 = nd.clock()
    os.execute(("for i in $(seq %d); do %s >/dev/null; done"):format(n, cmd))
    return (nd.clock() - t0) / n * 1e3
  end
  r.startup_ms = loop(exe .. " -e ''")
  r.lua_startup_ms = loop("lua5.4 -e ''")
end

print(("needle-lua foundation benchmark  (threads: %d, reps: %d, PyTorch: %s)")
  :format(nd.get_num_threads(), reps, have_torch and "yes" or "not installed"))
print(("%-34s %12s %12s %12s %10s %10s"):format("measure", "needle", "plain C", "PyTorch", "vs C", "vs torch"))
local rows = {
  {"matmul 1024^2 f32 (ms)", r.matmul_1024_ms, c.sgemm_1024_ms, torch.matmul_1024_ms},
  {"matmul 1024^2, A transposed (ms)", r.matmul_1024_t_ms, c.sgemm_1024_ms, nil},
  {"a + b, 16 elements (us/op)", r.add16_us, nil, torch.add16_us},
  {"add 2^24 f32 (ms)", r.add_2p24_ms, c.add_2p24_ms, torch.add_2p24_ms},
  {"add 2^24 f32 (GB/s)", r.add_2p24_gbs, c.add_2p24_gbs, torch.add_2p24_gbs},
  {"startup needle-lua -e '' (ms)", r.startup_ms, r.lua_startup_ms, nil},
}
for _, row in ipairs(rows) do
  print(("%-34s %12s %12s %12s %10s %10s"):format(row[1], fmt(row[2]), fmt(row[3]), fmt(row[4]),
    ratio(row[2], row[3]), ratio(row[2], row[4])))
end
print("(ratios are needle / other: below 1.00x needle is faster, except GB/s where higher is better;")
print(" the startup 'plain C' column is a stock lua5.4 -e '')")
