-- scripts/bench/conv.lua: a 3x3 convolution (padding 1, 32 -> 32 channels)
-- on an (8, 32, 56, 56) float32 input, forward alone and forward + backward
-- (gradients for x, w and b), and 2x2 max/avg pooling, side by side with
-- PyTorch when it is installed (Debian's python3-torch), at the same
-- thread count.
--
--   build/needle-lua scripts/bench/conv.lua [reps]
--
-- needle's conv2d is im2col + one GEMM (OpenBLAS) per image; PyTorch on
-- CPU uses oneDNN (MKL-DNN) when it was built with it, as Debian's is.
--
-- The GEMMs dominate, so the BLAS's threading matters: with Debian's
-- pthreads OpenBLAS (libopenblas0-pthread) its threads and libgomp's (the
-- OpenMP kernels: im2col, col2im, the bias add, reductions) spin against
-- each other at every hand-over, and this runs 2.5-3x slower than with the
-- OpenMP build of the same OpenBLAS (libopenblas0-openmp), which shares
-- libgomp's pool. To compare without relinking:
--   LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp build/needle-lua scripts/bench/conv.lua
local nd = require "needle"

local reps = tonumber(arg and arg[1]) or 7
local threads = nd.get_num_threads()

local function per_iter(fn, n)
  fn() -- warm up (allocator cache, page faults)
  local ts = {}
  for r = 1, reps do
    local t0 = nd.clock()
    for _ = 1, n do fn() end
    ts[r] = (nd.clock() - t0) / n
  end
  table.sort(ts)
  return ts[(#ts + 1) // 2]
end

-- the PyTorch side: the same measurements, printed as "key value" lines
local py = ([[
import statistics, sys, time
import torch
import torch.nn.functional as F
torch.set_num_threads(%d)
reps = %d
def per_iter(fn, n):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)
torch.manual_seed(0)
x = torch.randn(8, 32, 56, 56)
w = (torch.randn(32, 32, 3, 3) * 0.1)
b = torch.randn(32)
xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
def fwd():
    with torch.no_grad():
        F.conv2d(x, w, b, padding=1)
def fwd_bwd():
    F.conv2d(xg, wg, bg, padding=1).sum().backward()
    xg.grad = wg.grad = bg.grad = None
def pool_fwd_bwd(fn):
    def step():
        fn(xg, 2).sum().backward()
        xg.grad = None
    return step
print("conv_fwd_ms %%.4f" %% (per_iter(fwd, 10) * 1e3))
print("conv_fwd_bwd_ms %%.4f" %% (per_iter(fwd_bwd, 5) * 1e3))
print("max_pool_fwd_bwd_ms %%.4f" %% (per_iter(pool_fwd_bwd(F.max_pool2d), 10) * 1e3))
print("avg_pool_fwd_bwd_ms %%.4f" %% (per_iter(pool_fwd_bwd(F.avg_pool2d), 10) * 1e3))
print("mkldnn %%d" %% int(torch.backends.mkldnn.is_available()))
]]):format(threads, reps)

local function run_torch()
  local python = io.open("/usr/bin/python3") and "/usr/bin/python3" or "python3"
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(py)
  f:close()
  local p = io.popen(("%s %s 2>/dev/null"):format(python, path))
  local out = {}
  for line in p:lines() do
    local k, v = line:match("^(%S+)%s+(%S+)$")
    if k then out[k] = tonumber(v) end
  end
  p:close()
  os.remove(path)
  return out
end

local torch = run_torch()

nd.manual_seed(0)
local x = nd.randn({8, 32, 56, 56})
local w = nd.randn({32, 32, 3, 3}) * 0.1
local b = nd.randn({32})
local xg, wg, bg = x:clone(), w:clone(), b:clone()
xg.requires_grad, wg.requires_grad, bg.requires_grad = true, true, true
local opts = {padding = 1}

local r = {}
r.conv_fwd_ms = per_iter(function() return nd.no_grad(nd.conv2d, x, w, b, opts) end, 10) * 1e3
r.conv_fwd_bwd_ms = per_iter(function()
  nd.conv2d(xg, wg, bg, opts):sum():backward()
  xg.grad, wg.grad, bg.grad = nil, nil, nil
end, 5) * 1e3
local function pool_step(fn)
  return function()
    fn(xg, 2):sum():backward()
    xg.grad = nil
  end
end
r.max_pool_fwd_bwd_ms = per_iter(pool_step(nd.max_pool2d), 10) * 1e3
r.avg_pool_fwd_bwd_ms = per_iter(pool_step(nd.avg_pool2d), 10) * 1e3

local function fmt(v) return v and ("%.2f"):format(v) or "-" end
local function ratio(p, q) return (p and q) and ("%.2fx"):format(p / q) or "-" end
print(("needle-lua conv benchmark  (threads: %d, PyTorch: %s%s)"):format(threads,
  torch.conv_fwd_ms and "yes" or "not installed", torch.mkldnn == 1 and ", oneDNN" or ""))
print(("%-46s %9s %9s %9s"):format("measure (ms, median of " .. reps .. ")", "needle", "PyTorch", "ratio"))
for _, row in ipairs({
  {"conv2d 3x3 (8,32,56,56) forward", "conv_fwd_ms"},
  {"conv2d 3x3 (8,32,56,56) forward + backward", "conv_fwd_bwd_ms"},
  {"max_pool2d 2x2 forward + backward", "max_pool_fwd_bwd_ms"},
  {"avg_pool2d 2x2 forward + backward", "avg_pool_fwd_bwd_ms"},
}) do
  print(("%-46s %9s %9s %9s"):format(row[1], fmt(r[row[2]]), fmt(torch[row[2]]), ratio(r[row[2]], torch[row[2]])))
end
