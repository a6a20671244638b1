"""PyTorch side of scripts/bench/foundation.lua: the same measurements, same
sizes, same method (warm-up, then the median of several runs). Prints
"name value" lines. Run by foundation.lua when `import torch` works."""
import sys

import torch

from bench_common import median_time

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
torch.set_num_threads(torch.get_num_threads())

a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
print("matmul_1024_ms %.4f" % (median_time(lambda: a @ b, reps) * 1e3))

x, y = torch.rand(16), torch.rand(16)
n = 200000
def small_adds():
    for _ in range(n):
        x + y
print("add16_us %.4f" % (median_time(small_adds, 5) / n * 1e6))

X, Y = torch.ones(1 << 24), torch.ones(1 << 24)
s = median_time(lambda: X + Y, reps)
print("add_2p24_ms %.4f" % (s * 1e3))
print("add_2p24_gbs %.3f" % (3 * 4 * (1 << 24) / s / 1e9))
