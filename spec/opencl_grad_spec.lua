-- opencl_grad_spec.lua - float64 finite-difference gradient checks of a
-- representative set of ops computed on each OpenCL device.
--
--   NEEDLE_BUILD_DIR=build build/needle-lua spec/run.lua spec/opencl_grad_spec.lua
--   NEEDLE_OPS_SPEC_SELF=1 ...   # the same checks on the cpu (checks the cases themselves)
--
-- It reuses spec/helpers/gradcheck.lua unchanged, with the device in the
-- function: the float64 leaves stay on the cpu (the helper perturbs them
-- there), the function moves them to the device, runs the op there and
-- brings the result back, so both the forward and the backward of the op run
-- on the device (the transfers are differentiable and pass gradients
-- through). Devices without fp64 (cl_khr_fp64) show one pending line each.
local nd = require "needle"
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local leaf = G.leaf
local C = G.bind(assert)
local F = nd.F

-- fn(...) computed on dev, for gradcheck's cpu leaves
local function on(dev, fn)
  return function(...)
    local args = {...}
    for i, a in ipairs(args) do args[i] = a:to(dev) end
    local out = fn(table.unpack(args))
    assert(out.device == dev, "the result is on " .. out.device .. ", expected " .. dev)
    return out:cpu()
  end
end

local function i64(t) return nd.tensor(t, {dtype = "int64"}) end

-- {name, function(dev) -> build, leaves, opts}; build runs the op on dev
local CASES = {
  {"mul, div, pow (broadcast, transposed)", function(dev)
    return on(dev, function(a, b) return (a * b:t()) / (b:t() + 3) + a ^ 2 end), {leaf({3, 4}), leaf({4, 1})}
  end},
  {"exp, tanh, sigmoid, log, sqrt", function(dev)
    return on(dev, function(x) return x:exp() + x:tanh() + x:sigmoid() + x:log() + x:sqrt() end), {leaf({3, 4}, 0.5, 2)}
  end},
  {"gelu, softplus, elu, silu", function(dev)
    return on(dev, function(x) return F.gelu(x) + F.softplus(x) + F.elu(x) + F.silu(x) end), {leaf({2, 5}, -2, 2)}
  end},
  {"where and clamp", function(dev)
    local c = nd.tensor({{true, false, true}, {false, true, false}})
    return on(dev, function(a, b) return nd.where(c:to(dev), a, b):clamp(-0.5, 0.6) end), {leaf({2, 3}), leaf({3})}
  end},
  {"sum, mean, var over dims", function(dev)
    return on(dev, function(x) return x:sum(2) + x:mean(2) * 2 + x:var(2) end), {leaf({3, 5})}
  end},
  {"max over a dim, logsumexp, prod", function(dev)
    return on(dev, function(x) return (x:max(1)) + x:logsumexp(1) + x:prod(1) end), {leaf({4, 3})}
  end},
  {"matmul (batched, transposed operand)", function(dev)
    return on(dev, function(a, b) return a:matmul(b:transpose(2, 3)) end), {leaf({2, 3, 4}), leaf({2, 5, 4})}
  end},
  {"matmul 1-D @ 2-D", function(dev)
    return on(dev, function(a, b) return a:matmul(b) end), {leaf({4}), leaf({4, 3})}
  end},
  {"softmax and log_softmax", function(dev)
    return on(dev, function(x) return F.softmax(x, 2) + F.log_softmax(x, 1) end), {leaf({3, 5}, -2, 2)}
  end},
  {"layer_norm with weight and bias", function(dev)
    return on(dev, function(x, w, b) return F.layer_norm(x, 5, w, b) end), {leaf({3, 5}, -2, 2), leaf({5}), leaf({5})}
  end},
  {"batch_norm training (N, C, H, W)", function(dev)
    return on(dev, function(x, w, b) return F.batch_norm(x, nil, nil, w, b, true) end),
      {leaf({3, 2, 2, 2}, -2, 2), leaf({2}), leaf({2})}
  end},
  {"cross_entropy (label smoothing, ignore_index)", function(dev)
    local y = i64({1, 3, 2, 3})
    return on(dev, function(x)
      return F.cross_entropy(x, y:to(dev), {label_smoothing = 0.1, ignore_index = 2, reduction = "none"})
    end), {leaf({4, 3}, -2, 2)}
  end},
  {"conv2d (stride 2, padding 1, groups 2, bias)", function(dev)
    return on(dev, function(x, w, b) return F.conv2d(x, w, b, {stride = 2, padding = 1, groups = 2}) end),
      {leaf({1, 4, 5, 5}), leaf({4, 2, 3, 3}), leaf({4})}
  end},
  {"conv_transpose2d (stride 2, output_padding 1)", function(dev)
    return on(dev, function(x, w) return F.conv_transpose2d(x, w, nil, {stride = 2, padding = 1, output_padding = 1}) end),
      {leaf({1, 2, 3, 3}), leaf({2, 3, 3, 3})}
  end},
  {"max_pool2d (stride 1, padding 1)", function(dev)
    return on(dev, function(x) return F.max_pool2d(x, 2, {stride = 1, padding = 1}) end), {leaf({1, 2, 4, 4})}
  end},
  {"avg_pool2d and adaptive_avg_pool2d", function(dev)
    return on(dev, function(x) return F.avg_pool2d(x, 3, {stride = 2, padding = 1}) + F.adaptive_avg_pool2d(x, {3, 3}) end),
      {leaf({1, 2, 5, 5})}
  end},
  {"gather, index_select, scatter_add", function(dev)
    local gi, si, ai = i64({{1, 3}, {2, 2}, {3, 1}}), i64({3, 1, 3}), i64({{1, 2, 1}, {3, 3, 2}})
    return on(dev, function(x, s)
      return x:gather(2, gi:to(dev)):sum(2) + x:index_select(1, si:to(dev)):sum(2)
        + x:scatter_add(1, ai:to(dev), s):sum(2)
    end), {leaf({3, 3}), leaf({2, 3})}
  end},
  {"cumsum and sort values", function(dev)
    return on(dev, function(x) return x:cumsum(2) + (x:sort(2, true)) end), {leaf({3, 4})}
  end},
  {"cat, stack, flip, pad", function(dev)
    return on(dev, function(a, b)
      return nd.cat({a, b}, 1):flip({2}):pad({1, 0}) + nd.stack({a, a}, 1):reshape({4, 3}):pad({0, 1})
    end), {leaf({2, 3}), leaf({2, 3})}
  end},
  {"embedding (repeated rows)", function(dev)
    local idx = i64({{1, 3}, {2, 3}})
    return on(dev, function(w) return F.embedding(idx:to(dev), w) end), {leaf({3, 4})}
  end},
}

-- second order (gradients of gradients) on the device
local CASES2 = {
  {"tanh and mul", function(dev) return on(dev, function(x, y) return x:tanh() * y end), {leaf({2, 3}), leaf({2, 3})} end},
  {"matmul", function(dev) return on(dev, function(a, b) return a:matmul(b) end), {leaf({2, 3}), leaf({3, 2})} end},
  {"softmax", function(dev) return on(dev, function(x) return F.softmax(x, 2) end), {leaf({2, 4})} end},
  {"layer_norm", function(dev) return on(dev, function(x) return F.layer_norm(x, 4) end), {leaf({2, 4}, -2, 2)} end},
}

local DEVICES = D.opencl()
-- NEEDLE_OPS_SPEC_SELF=1: the cases on the cpu (checks the cases themselves)
if os.getenv("NEEDLE_OPS_SPEC_SELF") == "1" then DEVICES = {"cpu"} end
if #DEVICES == 0 then
  describe("OpenCL gradient checks", function()
    D.pending_without_opencl(pending, "float64 finite-difference gradient checks on OpenCL")
  end)
end

for _, dev in ipairs(DEVICES) do
  describe("gradcheck on " .. D.describe(dev) .. " (float64):", function()
    if not D.fp64(dev) then
      pending(("gradient checks on %s: the device has no fp64 (cl_khr_fp64)"):format(dev))
      return
    end
    before_each(function() nd.manual_seed(4321) end)
    for _, c in ipairs(CASES) do
      it(c[1], function()
        local build, leaves, opts = c[2](dev)
        C.check(build, leaves, opts)
      end)
    end
    for _, c in ipairs(CASES2) do
      it("second order: " .. c[1], function()
        local build, leaves, opts = c[2](dev)
        C.check2(build, leaves, opts)
      end)
    end
  end)
end
