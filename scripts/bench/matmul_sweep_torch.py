"""PyTorch side of scripts/bench/matmul_sweep.lua: torch.matmul of float32
operands on the same sizes and layouts (nn: a @ b, nt: a @ w.t() with w
(N, K) row-major, the transposed view read in place), timed as the Lua side
times needle's (scripts/bench/common.lua's median_time: warm-up calls, then
the median of reps timed calls; every call synchronizes a CUDA device).
Prints "layout:MxNxK ms" lines, and "torch VERSION" and "device DEV".

    matmul_sweep_torch.py THREADS REPS DEVICE LAYOUTS SIZES
    (LAYOUTS: nn,nt; SIZES: MxNxK,MxNxK,...)"""
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import median_time  # noqa: E402

threads, reps, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
layouts = sys.argv[4].split(",")
sizes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[5].split(",")]
torch.set_num_threads(threads)
if device.startswith("cuda"):
    # float32 as on needle's side: no TF32 in the products
    torch.backends.cuda.matmul.allow_tf32 = False
print("torch", torch.__version__.split("+")[0])
print("device", device)


def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()


torch.manual_seed(0)
with torch.no_grad():
    for m, n, k in sizes:
        for layout in layouts:
            a = torch.randn(m, k, device=device)
            b = torch.randn(n, k, device=device).t() if layout == "nt" else torch.randn(k, n, device=device)

            def call():
                c = torch.matmul(a, b)
                sync()
                return c

            call()
            print("%s:%dx%dx%d %.6f" % (layout, m, n, k, median_time(call, reps, 2) * 1e3))
            sys.stdout.flush()
