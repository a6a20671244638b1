-- scripts/bench/conv_depthwise.lua - MobileNetV2's depthwise 3x3 convolutions
-- (224x224 input sizes), needle against Debian's PyTorch 1.13 in the same run,
-- at batch 1 and 32, forward (no grad) and forward + backward (gradients of x
-- and w), float32, same thread count on both sides:
--
--   build/needle-lua scripts/bench/conv_depthwise.lua [ROUNDS] [--layers 1,3]
--
-- Paired rounds: each round runs PyTorch's side (a child /usr/bin/python3
-- process, the script below) and then needle's, over every shape; a cell's
-- ratio is the median over rounds of that round's PyTorch ms / needle ms
-- (> 1: needle is faster), so a slow spell on this shared machine hits both
-- sides of a pair. Times are the median of 5 timed runs per round after one
-- warm-up. needle's depthwise convs run src/backends/cpu/cpu_conv_depthwise.c
-- (NEEDLE_CONV_BLAS=1: the im2col + GEMM path, for comparison); the kernel
-- PyTorch ran is printed from its profiler.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")

local rounds = tonumber(arg and arg[1]) or 3
local only
for i = 1, #(arg or {}) do
  if arg[i] == "--layers" and arg[i + 1] then
    only = {}
    for k in arg[i + 1]:gmatch("%d+") do only[tonumber(k)] = true end
  end
end
local threads = nd.get_num_threads()

-- {name, C, H (= W), stride}: MobileNetV2's depthwise layers, each 3x3, padding 1, no bias
local LAYERS = {
  {"112x112x32", 32, 112, 1},
  {"56x56x144 s2", 144, 56, 2},
  {"28x28x192", 192, 28, 1},
  {"14x14x384", 384, 14, 1},
  {"7x7x960", 960, 7, 1},
}
local BATCHES = {1, 32}
local REPS = 5

local function key(li, n, mode) return ("l%d_b%d_%s"):format(li, n, mode) end

-- calls per timed run: about 50 ms of work (guessed from the multiply-adds)
local function calls(n, c, h, s)
  local madds = n * c * (h // s) * (h // s) * 9
  return math.max(1, math.min(200, math.floor(2e8 / madds)))
end

local PY = [[
import sys, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from bench_common import per_iter
torch.set_num_threads(int(sys.argv[2]))
layers = [tuple(int(v) for v in s.split(":")) for s in sys.argv[3].split(",")]
torch.manual_seed(0)
for li, n, c, h, s, k in layers:
    x = torch.randn(n, c, h, h)
    w = torch.randn(c, 1, 3, 3) * 0.3
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, None, stride=s, padding=1, groups=c)
    def fwd_bwd():
        F.conv2d(xg, wg, None, stride=s, padding=1, groups=c).sum().backward()
        xg.grad = wg.grad = None
    print("l%d_b%d_fwd %.6f" % (li, n, per_iter(fwd, k, %REPS%, warmup=1) * 1e3))
    print("l%d_b%d_fwdbwd %.6f" % (li, n, per_iter(fwd_bwd, max(1, k // 3), %REPS%, warmup=1) * 1e3))
with torch.autograd.profiler.profile() as prof:
    F.conv2d(torch.randn(1, 32, 16, 16), torch.randn(32, 1, 3, 3), padding=1, groups=32)
names = sorted({e.name for e in prof.function_events if "conv" in e.name})
print("kernel %s" % "|".join(names))
]]

local function torch_round(spec)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write((PY:gsub("%%REPS%%", tostring(REPS))))
  f:close()
  local out, kernel = {}, nil
  local p = io.popen(("%s %s %s/scripts/bench %d %s 2>/dev/null"):format(C.python, path, C.root,
    threads, spec))
  for line in p:lines() do
    local k, v = line:match("^(%S+)%s+(%S+)$")
    if k == "kernel" then kernel = v elseif k then out[k] = tonumber(v) end
  end
  p:close()
  os.remove(path)
  return out, kernel
end

local function needle_round(todo)
  local out = {}
  nd.manual_seed(0)
  for _, t in ipairs(todo) do
    local li, n, c, h, s, k = table.unpack(t)
    local x = nd.randn({n, c, h, h})
    local w = nd.randn({c, 1, 3, 3}) * 0.3
    local xg, wg = x:clone(), w:clone()
    xg.requires_grad, wg.requires_grad = true, true
    local o = {stride = s, padding = 1, groups = c}
    out[key(li, n, "fwd")] = C.per_iter(function() return nd.no_grad(nd.conv2d, x, w, nil, o) end,
      k, REPS, 1) * 1e3
    out[key(li, n, "fwdbwd")] = C.per_iter(function()
      nd.conv2d(xg, wg, nil, o):sum():backward()
      xg.grad, wg.grad = nil, nil
    end, math.max(1, k // 3), REPS, 1) * 1e3
  end
  return out
end

local todo, spec = {}, {}
for li, L in ipairs(LAYERS) do
  if not only or only[li] then
    for _, n in ipairs(BATCHES) do
      local k = calls(n, L[2], L[3], L[4])
      todo[#todo + 1] = {li, n, L[2], L[3], L[4], k}
      spec[#spec + 1] = table.concat({li, n, L[2], L[3], L[4], k}, ":")
    end
  end
end
spec = table.concat(spec, ",")

local mine, theirs, ratios, kernel = {}, {}, {}, nil
for r = 1, rounds do
  local t, kn = torch_round(spec)
  kernel = kernel or kn
  local m = needle_round(todo)
  for k, v in pairs(m) do
    mine[k] = mine[k] or {}
    mine[k][r] = v
    if t[k] then
      theirs[k] = theirs[k] or {}
      theirs[k][r] = t[k]
      ratios[k] = ratios[k] or {}
      ratios[k][r] = t[k] / v
    end
  end
end

local gemm = nd.devices()[1].gemm or "?"
local f = io.open("/proc/loadavg")
local load = f and f:read("l") or "?"
if f then f:close() end
print(("MobileNetV2 depthwise 3x3 convs, float32, %d threads, %d paired rounds (load at end: %s)")
  :format(threads, rounds, load))
print(("needle: %s (cpu_conv_depthwise.c; AVX2 copies when nd.devices()[1].gemm is not openblas: %s)")
  :format(os.getenv("NEEDLE_CONV_BLAS") and os.getenv("NEEDLE_CONV_BLAS") ~= "0"
    and "NEEDLE_CONV_BLAS set: im2col + GEMM" or "depthwise kernel", gemm))
print(("PyTorch: %s"):format(kernel and ("ran " .. kernel) or "not installed"))
print(("%-26s %-8s %10s %10s %8s"):format("layer (C x H x W in)", "batch", "needle ms", "torch ms",
  "torch/needle"))
for _, t in ipairs(todo) do
  for _, mode in ipairs({"fwd", "fwdbwd"}) do
    local k = key(t[1], t[2], mode)
    print(("%-26s %-8s %10s %10s %8s"):format(LAYERS[t[1]][1] .. (mode == "fwd" and " fwd" or " fwd+bwd"),
      t[2], C.fmt(C.median_of(mine[k]), "%.3f"), C.fmt(C.median_of(theirs[k] or {}), "%.3f"),
      C.fmt(C.median_of(ratios[k] or {}), "%.2f")))
  end
end
