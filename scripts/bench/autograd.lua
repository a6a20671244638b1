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
local C = dofile(here .. "/common.lua")
local per_iter = C.per_iter -- median of 5 runs of n calls, no warm-up

local torch = C.run_torch("autograd_torch.py")

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

-- layer norm and cross entropy, forward + backward, fused vs composite
local ln_x = nd.randn({512, 1024}, {requires_grad = true})
local ln_w, ln_b = nd.ones({1024}, {requires_grad = true}), nd.zeros({1024}, {requires_grad = true})
local function clear() ln_x.grad, ln_w.grad, ln_b.grad = nil, nil, nil end
r.layer_norm_fused_ms = per_iter(function()
  nd.F.layer_norm(ln_x, {1024}, ln_w, ln_b):sum():backward(); clear()
end, 20) * 1e3
r.layer_norm_composite_ms = per_iter(function()
  local mu = ln_x:mean(2, true)
  local d = ln_x - mu
  local y = d * ((d * d):mean(2, true) + 1e-5):rsqrt() * ln_w + ln_b
  y:sum():backward(); clear()
end, 20) * 1e3
local ce_x = nd.randn({512, 1000}, {requires_grad = true})
local ce_y = nd.randint(1, 1000, {512})
r.cross_entropy_fused_ms = per_iter(function()
  nd.F.cross_entropy(ce_x, ce_y):backward(); ce_x.grad = nil
end, 20) * 1e3
r.cross_entropy_composite_ms = per_iter(function()
  local logp = ce_x:log_softmax(2)
  local loss = -(nd.one_hot(ce_y, 1000):float() * logp):sum() / 512
  loss:backward(); ce_x.grad = nil
end, 20) * 1e3

print(("needle-lua autograd benchmark  (threads: %d, PyTorch: %s)"):format(nd.get_num_threads(),
  torch.mul16_us and "yes" or "not installed"))
print(("%-40s %10s %10s %10s"):format("measure", "needle", "PyTorch", "ratio"))
C.print_rows("%-40s %10s %10s %10s", {
  {"mul, 16 elements, no grad (us)", "mul16_us"},
  {"mul, 16 elements, recording (us)", "mul16_record_us"},
  {"cost of recording a node (us)", "record_cost_us"},
  {"mul + sum + backward, 16 elements (us)", "mul_sum_backward_us"},
  {"softmax 256x1024 fused (ms)", "softmax_fused_ms"},
  {"softmax 256x1024 composite (ms)", "softmax_composite_ms"},
  {"layer_norm 512x1024 fwd+bwd fused (ms)", "layer_norm_fused_ms"},
  {"layer_norm 512x1024 fwd+bwd composite (ms)", "layer_norm_composite_ms"},
  {"cross_entropy 512x1000 fwd+bwd fused (ms)", "cross_entropy_fused_ms"},
  {"cross_entropy 512x1000 fwd+bwd composite (ms)", "cross_entropy_composite_ms"},
}, r, torch)
print(("fused over composite: softmax %.1fx, layer_norm %.1fx, cross_entropy %.1fx"):format(
  r.softmax_composite_ms / r.softmax_fused_ms, r.layer_norm_composite_ms / r.layer_norm_fused_ms,
  r.cross_entropy_composite_ms / r.cross_entropy_fused_ms))
