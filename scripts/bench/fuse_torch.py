"""PyTorch side of scripts/bench/fuse.lua: ResNet9 (needle's module tree)
and the CIFAR ResNet-18 (width 64) in eval mode under torch.no_grad, as
they are and after torch.fx.experimental.optimization.fuse (PyTorch's own
inference fusion: BatchNorm folded into the preceding conv), on 3x32x32
images at batch 8 and 128. Same method as the Lua side: warm-up calls, then
reps rounds timing one call of each model in turn, the median of each.
Prints "name value" lines.

    fuse_torch.py THREADS REPS"""
import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.fx.experimental.optimization import fuse

threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)


# the models the converter's fixtures are made from (same module trees as
# needle's ResNet9 and needle.convert's resnet18_cifar)
GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "spec", "fixtures", "gen")
sys.dont_write_bytecode = True
sys.path.insert(0, GEN)
from gen_torch_checkpoints import ResNet18Cifar  # noqa: E402
from gen_torch_resnet9 import ResNet9  # noqa: E402


def resnet18():
    return ResNet18Cifar(w=64)


def randomize_bn(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n) * 0.1)
                m.running_var.copy_(torch.rand(n) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n) * 0.1)


def interleaved(a, b, reps, warm):
    """fuse.lua's method: warm-up calls, then reps rounds timing one call of
    a and one of b in turn; the median of each"""
    for _ in range(warm):
        a()
        b()
    ta, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        a()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b()
        tb.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


torch.manual_seed(0)
for name, build in (("resnet9", ResNet9), ("resnet18", resnet18)):
    model = build()
    randomize_bn(model)
    model.eval()
    fused = fuse(model)
    for n in (8, 128):
        x = torch.randn(n, 3, 32, 32)
        big = name == "resnet18" and n >= 128
        reps_here = max(3, reps // 2) if big else reps
        warm = 1 if big else 2

        def run(m):
            def call():
                with torch.no_grad():
                    m(x)
            return call
        key = "%s_b%d" % (name, n)
        te, tf = interleaved(run(model), run(fused), reps_here, warm)
        print("%s_eval_ms %.4f" % (key, te * 1e3))
        print("%s_fused_ms %.4f" % (key, tf * 1e3))
        sys.stdout.flush()
