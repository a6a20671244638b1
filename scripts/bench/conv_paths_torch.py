"""PyTorch's column of scripts/bench/conv_paths.lua: for each "C,H,O,k,stride,pad"
line of SHAPES, "fwd gx gw" ms (the median of REPS runs after one warm-up;
grad x and grad w as a forward + backward with only that input requiring
grad, less the forward alone), float32 on the CPU with THREADS threads.

    /usr/bin/python3 scripts/bench/conv_paths_torch.py SHAPES BATCH REPS THREADS
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import median_time  # noqa: E402  (the Lua side's timing)


def median_ms(fn, reps):
    return median_time(fn, reps, warmup=1) * 1e3


def main():
    shapes, batch, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    for line in open(shapes):
        c, h, o, k, s, p = map(int, line.strip().split(","))
        x, w = torch.randn(batch, c, h, h), torch.randn(o, c, k, k) * 0.05
        dy = torch.randn_like(F.conv2d(x, w, None, s, p))

        def fwd():
            with torch.no_grad():
                F.conv2d(x, w, None, s, p)
        t_fwd = median_ms(fwd, reps)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        t_gx = median_ms(lambda: F.conv2d(xg, w, None, s, p).backward(dy), reps) - t_fwd
        t_gw = median_ms(lambda: F.conv2d(x, wg, None, s, p).backward(dy), reps) - t_fwd
        print("%.4f %.4f %.4f" % (t_fwd, t_gx, t_gw))


if __name__ == "__main__":
    main()
