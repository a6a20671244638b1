-- scripts/bench/fuse.lua: inference with nd.nn.fuse - ResNet9 and ResNet-18
-- (CIFAR, width 64) on 3x32x32 images at batch 8 and 128, the eval model
-- against its fused copy (BatchNorm folded, bias + ReLU in the GEMM
-- epilogue), both under no_grad, at 2 threads (the first argument changes
-- it). Each figure is the median of reps timed calls after warm-up calls;
-- the eval and the fused model take turns, one call each per round.
-- With PyTorch installed (Debian's python3-torch), the same models in eval
-- under torch.no_grad (and torch's own conv-bn fusion,
-- torch.fx.experimental.optimization.fuse) run alongside.
--
--   build/needle-lua scripts/bench/fuse.lua [threads=2] [reps=5] [--no-torch]
--
-- The batch-128 ResNet-18 forward is ~70 GFLOP: reps is kept small there.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")

local threads = tonumber(arg and arg[1]) or 2
local reps = tonumber(arg and arg[2]) or 5
local no_torch = false
for _, a in ipairs(arg or {}) do if a == "--no-torch" then no_torch = true end end
nd.set_num_threads(threads)

-- BatchNorm statistics that are not the identity, as a trained model has
local function randomize_bn(model)
  nd.no_grad(function()
    for _, m in ipairs(model:modules()) do
      if m.__name == "BatchNorm2d" or m.__name == "BatchNorm1d" then
        local n = m.num_features
        m.running_mean:copy_(nd.randn({n}) * 0.1)
        m.running_var:copy_(nd.rand({n}) * 0.5 + 0.75)
        m.weight:copy_(nd.rand({n}) * 0.5 + 0.75)
        m.bias:copy_(nd.randn({n}) * 0.1)
      end
    end
  end)
end

local function resnet18()
  local models = require "needle.convert.models"
  return models.ResNetCIFAR({width = 64, num_classes = 10})
end

local cases = {
  {"resnet9", function() return nd.nn.ResNet9() end},
  {"resnet18", resnet18},
}
local batches = {8, 128}

local torch = {}
if not no_torch then
  torch = C.run_torch(("fuse_torch.py %d %d"):format(threads, reps))
end

-- seconds per call of a and of b: warm-up calls of each, then reps rounds
-- that time one call of each in turn (so a machine whose load changes
-- during the run slows both alike), the median of each
local function interleaved(a, b, reps_, warm)
  for _ = 1, warm do a(); b() end
  local ta, tb = {}, {}
  for i = 1, reps_ do
    local t0 = nd.clock(); a(); ta[i] = nd.clock() - t0
    t0 = nd.clock(); b(); tb[i] = nd.clock() - t0
  end
  table.sort(ta); table.sort(tb)
  return ta[(reps_ + 1) // 2], tb[(reps_ + 1) // 2]
end

nd.manual_seed(0)
local r = {}
local maxdiff = {}
for _, case in ipairs(cases) do
  local name, build = case[1], case[2]
  local model = build()
  randomize_bn(model)
  model:eval()
  local fused = nd.nn.fuse(model)
  for _, n in ipairs(batches) do
    local x = nd.randn({n, 3, 32, 32})
    local big = (name == "resnet18" and n >= 128)
    local reps_here = big and math.max(3, reps // 2) or reps
    local warm = big and 1 or 2
    local function run(m) return function() return nd.no_grad(function() return m(x) end) end end
    local key = ("%s_b%d"):format(name, n)
    local te, tf = interleaved(run(model), run(fused), reps_here, warm)
    r[key .. "_eval_ms"], r[key .. "_fused_ms"] = te * 1e3, tf * 1e3
    local a, b = run(model)(), run(fused)()
    maxdiff[key] = (a - b):abs():max():item()
    collectgarbage()
  end
end

print(("needle-lua fuse benchmark  (threads: %d, reps: %d, PyTorch: %s)"):format(threads, reps,
  torch.resnet9_b8_eval_ms and "yes" or "not run"))
print(("%-22s %10s %10s %8s %11s %10s %11s %9s"):format("model (ms, median)", "eval", "fused", "speedup",
  "max |diff|", "torch", "torch fused", "fused/torch"))
for _, case in ipairs(cases) do
  for _, n in ipairs(batches) do
    local key = ("%s_b%d"):format(case[1], n)
    local e, f = r[key .. "_eval_ms"], r[key .. "_fused_ms"]
    local te, tf = torch[key .. "_eval_ms"], torch[key .. "_fused_ms"]
    print(("%-22s %10s %10s %8s %11.2e %10s %11s %9s"):format(("%s batch %d"):format(case[1], n),
      C.fmt(e, "%.2f"), C.fmt(f, "%.2f"), C.ratio(e, f), maxdiff[key], C.fmt(te, "%.2f"),
      C.fmt(tf, "%.2f"), C.ratio(f, tf)))
  end
end
