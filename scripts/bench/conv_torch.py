"""PyTorch side of scripts/bench/conv.lua (same measurements, same method:
one warm-up call, then the median of reps runs). Prints "name value" lines.

    conv_torch.py THREADS REPS"""
import sys

import torch
import torch.nn.functional as F

from bench_common import per_iter

threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)


def timed(fn, n):
    return per_iter(fn, n, reps, warmup=1)


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
print("conv_fwd_ms %.4f" % (timed(fwd, 10) * 1e3))
print("conv_fwd_bwd_ms %.4f" % (timed(fwd_bwd, 5) * 1e3))
print("max_pool_fwd_bwd_ms %.4f" % (timed(pool_fwd_bwd(F.max_pool2d), 10) * 1e3))
print("avg_pool_fwd_bwd_ms %.4f" % (timed(pool_fwd_bwd(F.avg_pool2d), 10) * 1e3))
print("mkldnn %d" % int(torch.backends.mkldnn.is_available()))
