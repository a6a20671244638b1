-- scripts/bench/autograd.lua: autograd overhead and fused kernels, side by
-- side with PyTorch when it is installed (Debian's python3-torch).
--
--   build/needle-lua scripts/bench/autograd.lua
--
-- Targets (issue 3): recording a node costs at most 2 us on small tensors
-- (PyTorch: about 4); mul + sum + backward on small tensors well under
-- 50 us; fused softmax at least 2x faster than its composite form.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local root = here .. "/../.."

local function per_iter(fn, n, reps)
  local ts = {}
  for r = 1, reps or 5 do
    local t0 = nd.clock()
    for _ = 1, n do fn() end
    ts[r] = (nd.clock() - t0) / n
  end
  table.sort(ts)
  return ts[(#ts + 1) // 2]
end

local function run_kv(cmd)
  local f = io.popen(cmd .. " 2>/dev/null")
  local out = {}
  for line in f:lines() do
    local k, v = line:match("^(%S+)%s+(%S+)$")
    if k then out[k] = tonumber(v) end
  end
  f:close()
  return out
end

local python = io.open("/usr/bin/python3") and "/usr/bin/python3" or "python3"
local torch = run_kv(("%s %s/scripts/bench/autograd_torch.py"):format(python, root))

local r = {}
local a, b = nd.rand({16}), nd.rand({16})
local ag = nd.rand({16}, {requires_grad = true})
local n = 100000
local plain = per_iter(function() return a * b end, n)
local rec = per_iter(function() return ag * b end, n)
r.mul16_us, r.mul16_record_us, r.record_cost_us = plain * 1e6, rec * 1e6, (rec - plain) * 1e6
r.mul_sum_backward_us = per_iter(function()
  (ag * b):sum():backward()
  ag.grad = nil
end, 20000) * 1e6
local x = nd.randn({256, 1024})
local function composite()
  local m = x:max(2, true)
  local e = (x - m):exp()
  return e / e:sum(2, true)
end
r.softmax_fused_ms = per_iter(function() return x:softmax(2) end, 50) * 1e3
r.softmax_composite_ms = per_iter(composite, 50) * 1e3

local function fmt(v) return v and ("%.3f"):format(v) or "-" end
local function ratio(p, q) return (p and q) and ("%.2fx"):format(p / q) or "-" end
print(("needle-lua autograd benchmark  (threads: %d, PyTorch: %s)"):format(nd.get_num_threads(),
  torch.mul16_us and "yes" or "not installed"))
print(("%-40s %10s %10s %10s"):format("measure", "needle", "PyTorch", "ratio"))
for _, row in ipairs({
  {"mul, 16 elements, no grad (us)", "mul16_us"},
  {"mul, 16 elements, recording (us)", "mul16_record_us"},
  {"cost of recording a node (us)", "record_cost_us"},
  {"mul + sum + backward, 16 elements (us)", "mul_sum_backward_us"},
  {"softmax 256x1024 fused (ms)", "softmax_fused_ms"},
  {"softmax 256x1024 composite (ms)", "softmax_composite_ms"},
}) do
  print(("%-40s %10s %10s %10s"):format(row[1], fmt(r[row[2]]), fmt(torch[row[2]]), ratio(r[row[2]], torch[row[2]])))
end
print(("fused softmax speed-up over the composite: %.1fx"):format(r.softmax_composite_ms / r.softmax_fused_ms))
