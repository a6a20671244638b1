-- conv_depthwise_spec.lua - depthwise conv2d (groups == in_channels, weight
-- (C*M, 1, kh, kw)) on the kernels that run it: the CPU's
-- (src/backends/cpu/cpu_conv_depthwise.c) and OpenCL's
-- (kernels/conv_depthwise.cl), on every device (spec/helpers/devices.lua):
--   * PyTorch's outputs and gradients (spec/fixtures/gen/gen_torch_conv_depthwise.py):
--     multiplier 1 and >1, 3x3 and 5x5, stride 1, 2 and 3, padding, dilation,
--     rectangular kernels, and grouped and 1x1 convs (the GEMM paths) beside them;
--   * MobileNet-like shapes too large for a fixture (rows wider than the
--     vector blocks, many channels) against the same conv computed as a
--     dense conv (groups = 1) with a block-diagonal weight, which never
--     reaches the depthwise kernels: output, input and weight gradients;
--   * float64 finite-difference gradient checks;
--   * error messages for depthwise weights of the wrong shape.
local nd = require "needle"
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local A = require("spec.helpers.assertions").bind(assert)
local X = require("spec.helpers.fixtures").bind(assert, 1e-5)
local leaf = G.leaf
local C = G.bind(assert, {atol = 1e-5, rtol = 1e-4})
local fixtures = X.load("torch_conv_depthwise")

local OPENCL = D.opencl()
if #OPENCL == 0 then
  describe("depthwise conv2d on OpenCL", function()
    D.pending_without_opencl(pending, "depthwise conv2d on OpenCL")
  end)
end

-- fn's tensors moved to dev and its result brought back (differentiably)
local function on(dev, fn)
  return function(...)
    local args = table.pack(...)
    for i = 1, args.n do if args[i] then args[i] = args[i]:to(dev) end end
    local out = fn(table.unpack(args, 1, args.n))
    assert.are.equal(dev, out.device)
    return out:cpu()
  end
end

-- the block-diagonal dense weight (C*M, C, kh, kw) of a depthwise w (C*M, 1, kh, kw)
local function dense_weight(w, C)
  local O, kh, kw = w.shape[1], w.shape[3], w.shape[4]
  local M = O // C
  local mask = nd.zeros({O, C, 1, 1}, {dtype = w.dtype})
  for o = 1, O do mask[o][(o - 1) // M + 1][1][1] = 1 end
  return w:expand({O, C, kh, kw}) * mask, mask
end

-- max |a - b| / (max |b| + tiny)
local function rel_err(a, b)
  local d = (a:cpu() - b:cpu()):abs():max():item()
  return d / (b:abs():max():item() + 1e-30)
end

for _, dev in ipairs(D.all()) do
  describe("depthwise conv2d on " .. dev .. ":", function()
    before_each(function() nd.manual_seed(2027) end)

    describe("PyTorch fixtures", function()
      it("cover multiplier 2 and 3, 5x5, strides 1-3, dilation, grouped and 1x1 convs", function()
        local seen = {}
        for _, c in ipairs(fixtures) do
          local o = c.opts
          if o.groups and o.groups == c.inputs[1].shape[2] then seen.dw = true end
          if c.inputs[2].shape[1] > (o.groups or 1) and (o.groups or 1) > 1 then seen.mult = true end
          if c.inputs[2].shape[3] == 5 then seen.k5 = true end
          if o.dilation then seen.dil = true end
          if o.stride == 2 or o.stride == 3 then seen.strided = true end
          if c.inputs[2].shape[2] > 1 and (o.groups or 1) > 1 then seen.grouped = true end
          if c.inputs[2].shape[3] == 1 then seen.pointwise = true end
        end
        for _, k in ipairs({"dw", "mult", "k5", "dil", "strided", "grouped", "pointwise"}) do
          assert.is_true(seen[k] == true, k)
        end
      end)
      for _, c in ipairs(fixtures) do
        it(c.name, function()
          X.check_case(c.name, c, on(dev, function(x, w, b) return nd.conv2d(x, w, b, c.opts) end))
        end)
      end
    end)

    describe("against a dense conv with a block-diagonal weight (float32, 1e-4):", function()
      local cases = {
        {"112x112-like row, 3x3 s1 p1", {1, 4, 9, 40}, 1, 3, {padding = 1}},
        {"rows of 70 (the forward's row-wise path), 3x3 s1 p1", {2, 3, 4, 70}, 1, 3, {padding = 1}},
        {"3x3 s2 p1, batch 3", {3, 6, 17, 19}, 1, 3, {stride = 2, padding = 1}},
        {"3x3 s2 p1, rows of 64 after the stride, multiplier 2", {1, 2, 5, 128}, 2, 3, {stride = 2, padding = 1}},
        {"5x5 s1 p2, multiplier 2", {2, 3, 12, 33}, 2, 5, {padding = 2}},
        {"5x5 s2 p2", {2, 5, 15, 21}, 1, 5, {stride = 2, padding = 2}},
        {"3x3 dilation 2 p2, multiplier 3", {1, 4, 11, 26}, 3, 3, {padding = 2, dilation = 2}},
        {"3x3 stride {1,2}, padding {0,1}, no bias", {2, 3, 9, 20}, 1, 3, {stride = {1, 2}, padding = {0, 1}}, true},
        {"3x3 on 1x1 maps (MobileNet's 7x7 stage, smaller): padding only", {2, 8, 1, 1}, 1, 3, {padding = 1}},
      }
      for _, c in ipairs(cases) do
        it(c[1], function()
          local shape, M, k, opts, nobias = c[2], c[3], c[4], c[5], c[6]
          local Cn = shape[2]
          local x = nd.randn(shape)
          local w = nd.randn({Cn * M, 1, k, k})
          local b = not nobias and nd.randn({Cn * M}) or nil
          local dopts = {}
          for key, v in pairs(opts) do dopts[key] = v end
          opts = setmetatable({groups = Cn}, {__index = opts})
          local o2 = {groups = Cn}
          for key, v in pairs(dopts) do o2[key] = v end
          -- depthwise on dev
          local xd, wd = x:to(dev), w:to(dev)
          xd.requires_grad, wd.requires_grad = true, true
          local y = nd.conv2d(xd, wd, b and b:to(dev), o2)
          local gout = nd.randn(y.shape)
          local gx, gw = table.unpack(nd.grad((y * gout:to(dev)):sum(), {xd, wd}))
          -- the reference on the cpu: dense conv, groups = 1
          local xr, wr = x:clone(), w:clone()
          xr.requires_grad, wr.requires_grad = true, true
          local wdense = dense_weight(wr, Cn)
          local yr = nd.conv2d(xr, wdense, b, dopts)
          local gxr, gwr = table.unpack(nd.grad((yr * gout):sum(), {xr, wr}))
          assert.are.same(yr.shape, y.shape)
          assert.is_true(rel_err(y, yr) < 1e-4, "output " .. rel_err(y, yr))
          assert.is_true(rel_err(gx, gxr) < 1e-4, "grad x " .. rel_err(gx, gxr))
          assert.is_true(rel_err(gw, gwr) < 1e-4, "grad w " .. rel_err(gw, gwr))
        end)
      end

      it("fused_conv2d (relu) on a depthwise conv equals relu(conv2d)", function()
        local x, w, b = nd.randn({2, 6, 10, 18}), nd.randn({6, 1, 3, 3}), nd.randn({6})
        local xd, wd, bd = x:to(dev), w:to(dev), b:to(dev)
        local got = nd.fused_conv2d(xd, wd, bd, {padding = 1, groups = 6, activation = "relu"})
        local want = nd.relu(nd.conv2d(x, dense_weight(w, 6), b, {padding = 1}))
        assert.is_true(rel_err(got, want) < 1e-4)
      end)
    end)

    if dev ~= "cpu" then
      it("runs the device's depthwise kernel, not im2col + a GEMM per group", function()
        local x, w = nd.randn({2, 4, 6, 6}):to(dev), nd.randn({8, 1, 3, 3}):to(dev)
        x.requires_grad, w.requires_grad = true, true
        local report = nd.profile(function()
          local y = nd.conv2d(x, w, nil, {padding = 1, groups = 4})
          nd.grad(y:sum(), {x, w})
        end)
        for _, op in ipairs({"matmul", "im2col", "col2im", "conv_transpose2d"}) do
          assert.is_nil(report.by_name[op], op)
        end
        assert.is_not_nil(report.by_name.conv2d)
      end)
    end

    it("compiled (nd.compile: replayed kernels) equals eager, forward and gradients", function()
      local x = nd.randn({2, 4, 9, 10}):to(dev)
      local w, b = nd.randn({8, 1, 3, 3}):to(dev), nd.randn({8}):to(dev)
      w.requires_grad = true
      local function step(xx)
        local y = nd.conv2d(xx, w, b, {stride = 2, padding = 1, groups = 4})
        local gw = nd.grad((y * y):sum(), w)
        return y:detach(), gw
      end
      local y0, g0 = step(x)
      local cstep = nd.compile(step)
      for _ = 1, 3 do
        local y1, g1 = cstep(x)
        assert.is_true(rel_err(y1, y0) < 1e-6)
        assert.is_true(rel_err(g1, g0) < 1e-6)
      end
    end)

    describe("float64 gradient checks:", function()
      if dev ~= "cpu" and not D.fp64(dev) then
        pending(("%s has no fp64 (cl_khr_fp64)"):format(dev))
        return
      end
      local cases = {
        {"3x3 s1 p1, bias", {2, 3, 5, 6}, {3, 1, 3, 3}, true, {padding = 1, groups = 3}},
        {"3x3 s2 p1, multiplier 2", {1, 2, 6, 5}, {4, 1, 3, 3}, true, {stride = 2, padding = 1, groups = 2}},
        {"5x5 s2 p2", {1, 2, 7, 7}, {2, 1, 5, 5}, false, {stride = 2, padding = 2, groups = 2}},
        {"5x5 s1 p2, multiplier 3", {1, 2, 5, 6}, {6, 1, 5, 5}, true, {padding = 2, groups = 2}},
        {"3x3 dilation 2, stride {2,1}", {2, 2, 7, 6}, {2, 1, 3, 3}, false,
          {stride = {2, 1}, padding = {2, 1}, dilation = 2, groups = 2}},
      }
      for _, c in ipairs(cases) do
        it(c[1], function()
          local leaves = {leaf(c[2]), leaf(c[3])}
          if c[4] then leaves[3] = leaf({c[3][1]}) end
          C.check(on(dev, function(x, w, b) return nd.conv2d(x, w, b, c[5]) end), leaves)
        end)
      end
    end)
  end)
end

describe("depthwise conv2d errors", function()
  it("names the shapes when the weight's channels do not match the groups", function()
    local x = nd.zeros({1, 4, 5, 5})
    A.assert_contains(A.errmsg(nd.conv2d, x, nd.zeros({4, 2, 3, 3}), nil, {groups = 4}),
      "needle.conv2d: input has 4 channels but weight expects 8 (weight shape {4,2,3,3}, groups 4)")
    A.assert_contains(A.errmsg(nd.conv2d, x, nd.zeros({6, 1, 3, 3}), nil, {groups = 4}),
      "out_channels 6 (weight shape {6,1,3,3}) is not divisible by groups 4")
    A.assert_contains(A.errmsg(nd.conv2d, x, nd.zeros({4, 1, 3, 3}, {dtype = "float64"}), nil, {groups = 4}),
      "input (float32) and weight (float64) must have the same dtype")
  end)
end)
