"""PyTorch side of scripts/bench/autograd.lua (same measurements)."""
import sys

import torch

from bench_common import per_iter  # reps defaults to 5, no warm-up

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 11

a, b = torch.rand(16), torch.rand(16)
ag = torch.rand(16, requires_grad=True)
n = 100000
plain = per_iter(lambda: a * b, n)
rec = per_iter(lambda: ag * b, n)
print("mul16_us %.4f" % (plain * 1e6))
print("mul16_record_us %.4f" % (rec * 1e6))
print("record_cost_us %.4f" % ((rec - plain) * 1e6))


def step():
    (ag * b).sum().backward()
    ag.grad = None


print("mul_sum_backward_us %.4f" % (per_iter(step, 20000) * 1e6))

x = torch.randn(256, 1024)
def composite():
    m = x.max(1, keepdim=True).values
    e = (x - m).exp()
    return e / e.sum(1, keepdim=True)
print("softmax_fused_ms %.4f" % (per_iter(lambda: torch.softmax(x, 1), 50, reps) * 1e3))
print("softmax_composite_ms %.4f" % (per_iter(composite, 50, reps) * 1e3))

lx = torch.randn(512, 1024, requires_grad=True)
lw, lb = torch.ones(1024, requires_grad=True), torch.zeros(1024, requires_grad=True)
def ln_fused():
    torch.nn.functional.layer_norm(lx, (1024,), lw, lb).sum().backward()
    lx.grad = lw.grad = lb.grad = None
def ln_comp():
    mu = lx.mean(1, keepdim=True)
    d = lx - mu
    ((d * ((d * d).mean(1, keepdim=True) + 1e-5).rsqrt()) * lw + lb).sum().backward()
    lx.grad = lw.grad = lb.grad = None
print("layer_norm_fused_ms %.4f" % (per_iter(ln_fused, 20) * 1e3))
print("layer_norm_composite_ms %.4f" % (per_iter(ln_comp, 20) * 1e3))
cx = torch.randn(512, 1000, requires_grad=True)
cy = torch.randint(0, 1000, (512,))
def ce_fused():
    torch.nn.functional.cross_entropy(cx, cy).backward()
    cx.grad = None
def ce_comp():
    logp = cx.log_softmax(1)
    (-(torch.nn.functional.one_hot(cy, 1000).float() * logp).sum() / 512).backward()
    cx.grad = None
print("cross_entropy_fused_ms %.4f" % (per_iter(ce_fused, 20) * 1e3))
print("cross_entropy_composite_ms %.4f" % (per_iter(ce_comp, 20) * 1e3))
