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

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")

local reps = tonumber(arg and arg[1]) or 7
local threads = nd.get_num_threads()

-- one warm-up call (allocator cache, page faults), then the median of reps runs
local function per_iter(fn, n) return C.per_iter(fn, n, reps, 1) end

-- the PyTorch side: the same measurements, printed as "key value" lines
local torch = C.run_torch(("conv_torch.py %d %d"):format(threads, reps))

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

print(("needle-lua conv benchmark  (threads: %d, PyTorch: %s%s)"):format(threads,
  torch.conv_fwd_ms and "yes" or "not installed", torch.mkldnn == 1 and ", oneDNN" or ""))
print(("%-46s %9s %9s %9s"):format("measure (ms, median of " .. reps .. ")", "needle", "PyTorch", "ratio"))
C.print_rows("%-46s %9s %9s %9s", {
  {"conv2d 3x3 (8,32,56,56) forward", "conv_fwd_ms"},
  {"conv2d 3x3 (8,32,56,56) forward + backward", "conv_fwd_bwd_ms"},
  {"max_pool2d 2x2 forward + backward", "max_pool_fwd_bwd_ms"},
  {"avg_pool2d 2x2 forward + backward", "avg_pool_fwd_bwd_ms"},
}, r, torch, "%.2f")
