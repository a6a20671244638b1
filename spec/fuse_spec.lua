-- fuse_spec.lua - inference fusion: the fused ops nd.fused_conv2d and
-- nd.fused_linear against the composed ops (values, errors, the composed
-- fallback's gradients), BatchNorm folding against an independent float64
-- formula, nd.nn.fuse's patterns, hooks and deep copy, and whole models
-- (ResNet9, ResNet-18 for CIFAR) fused vs unfused within 1e-5.
local nd = require "needle"
local nn = nd.nn

local function max_abs_diff(a, b) return (a - b):abs():max():item() end

-- |a - b| <= tol * max(1, max |b|) everywhere
local function assert_close(a, b, tol, what)
  assert.are.same(b.shape, a.shape, (what or "") .. ": shape")
  local d, scale = max_abs_diff(a, b), math.max(1, b:abs():max():item())
  if d > tol * scale then
    error(("%s: max |diff| %.3g exceeds %.3g (max |ref| %.3g)"):format(what or "values", d, tol * scale,
      scale), 2)
  end
end

local function raises(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.truthy(tostring(err):find(pattern, 1, true), tostring(err))
end

-- BatchNorm statistics and affine parameters far from the identity
local function randomize_bn(model)
  nd.no_grad(function()
    for _, m in ipairs(model:modules()) do
      if m.__name == "BatchNorm2d" or m.__name == "BatchNorm1d" then
        local n, dt = m.num_features, m.running_mean and m.running_mean.dtype or "float32"
        if m.running_mean then
          m.running_mean:copy_(nd.randn({n}, {dtype = dt}) * 0.5)
          m.running_var:copy_(nd.rand({n}, {dtype = dt}) * 1.5 + 0.25)
        end
        if m.weight then
          m.weight:copy_(nd.randn({n}, {dtype = dt}) * 0.5 + 1)
          m.bias:copy_(nd.randn({n}, {dtype = dt}) * 0.5)
        end
      end
    end
  end)
end

local function eval_out(model, x) return nd.no_grad(function() return model(x) end) end

describe("nd.fused_conv2d", function()
  local configs = {
    {x = {2, 6, 9, 9}, w = {8, 3, 3, 3}, o = {stride = 2, padding = 1, groups = 2}},
    {x = {3, 4, 5, 5}, w = {6, 4, 1, 1}, o = {}},                        -- pointwise
    {x = {1, 4, 5, 5}, w = {6, 4, 1, 1}, o = {}},                        -- pointwise, one image
    {x = {4, 5, 7, 6}, w = {5, 5, 3, 2}, o = {stride = {2, 1}, padding = {2, 1}, dilation = {2, 1}}},
    {x = {5, 7, 7}, w = {4, 5, 3, 3}, o = {padding = 1}},                -- unbatched
    {x = {70, 3, 8, 8}, w = {16, 3, 3, 3}, o = {padding = 1}},           -- chunks with a remainder
    {x = {2, 3, 70, 70}, w = {4, 3, 3, 3}, o = {padding = 1}},           -- an image per chunk
    {x = {2, 4, 6, 6}, w = {4, 1, 3, 3}, o = {padding = 1, groups = 4}}, -- depthwise
    {x = {3, 5, 1, 1}, w = {4, 5, 3, 3}, o = {padding = 1}},             -- taps reading only padding
    {x = {2, 3, 2, 2}, w = {4, 3, 3, 3}, o = {padding = 2, dilation = 2}},
    {x = {2, 3, 11, 13}, w = {4, 3, 7, 5}, o = {stride = {4, 3}, padding = {3, 2}}},
  }
  for _, dtype in ipairs({"float32", "float64"}) do
    it("equals conv2d (+ relu) for strides, padding, dilation, groups (" .. dtype .. ")", function()
      nd.manual_seed(3)
      for i, c in ipairs(configs) do
        local x = nd.randn(c.x, {dtype = dtype})
        local w, b = nd.randn(c.w, {dtype = dtype}), nd.randn({c.w[1]}, {dtype = dtype})
        local o = {}
        for k, v in pairs(c.o) do o[k] = v end
        local ref = nd.F.conv2d(x, w, b, c.o)
        o.activation = "relu"
        assert_close(nd.fused_conv2d(x, w, b, o), ref:relu(), 1e-6, "config " .. i .. " relu")
        o.activation = "gelu"
        assert_close(nd.fused_conv2d(x, w, b, o), ref:gelu(), 1e-6, "config " .. i .. " gelu")
        o.activation = "none"
        assert_close(nd.fused_conv2d(x, w, b, o), ref, 1e-6, "config " .. i .. " none")
        o.activation = nil
        assert_close(nd.fused_conv2d(x, w, nil, o), nd.F.conv2d(x, w, nil, c.o), 1e-6, "config " .. i .. " no bias")
      end
    end)
  end

  it("reads non-contiguous inputs", function()
    nd.manual_seed(4)
    local x = nd.randn({3, 4, 8, 8}):transpose(3, 4)
    local w, b = nd.randn({5, 4, 3, 3}), nd.randn({5})
    assert_close(nd.fused_conv2d(x, w, b, {padding = 1, activation = "relu"}),
                 nd.F.conv2d(x, w, b, {padding = 1}):relu(), 1e-6, "transposed input")
  end)

  it("names the op, the shapes and the dtypes in its errors", function()
    local x, w = nd.randn({2, 3, 8, 8}), nd.randn({4, 3, 3, 3})
    raises("needle.fused_conv2d: input has 3 channels but weight expects 4", nd.fused_conv2d, x,
           nd.randn({4, 4, 3, 3}))
    raises("needle.fused_conv2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {3,8}",
           nd.fused_conv2d, nd.randn({3, 8}), w)
    raises("needle.fused_conv2d: bias must have shape {4}", nd.fused_conv2d, x, w, nd.randn({3}))
    raises("needle.fused_conv2d: expected a float32 or float64 input, got int64", nd.fused_conv2d,
           nd.zeros({2, 3, 8, 8}, {dtype = "int64"}), w)
    raises("needle.fused_conv2d: input (float32) and weight (float64) must have the same dtype",
           nd.fused_conv2d, x, nd.randn({4, 3, 3, 3}, {dtype = "float64"}))
    raises("needle.fused_conv2d: activation must be 'none', 'relu' or 'gelu', got 'tanh'", nd.fused_conv2d, x, w,
           nil, {activation = "tanh"})
    raises("needle.fused_conv2d: activation must be 'none', 'relu' or 'gelu', got 'gelu '", nd.fused_conv2d, x, w,
           nil, {activation = "gelu "})
    raises("needle.fused_conv2d: unknown option 'stide'", nd.fused_conv2d, x, w, nil, {stide = 2})
  end)
end)

describe("nd.fused_linear", function()
  it("equals F.linear (+ relu) on 1-D, 2-D and 3-D inputs, float32 and float64", function()
    nd.manual_seed(5)
    for _, dtype in ipairs({"float32", "float64"}) do
      local w, b = nd.randn({7, 20}, {dtype = dtype}), nd.randn({7}, {dtype = dtype})
      -- (500 rows: needle's GEMM, its epilogue on each tile; fewer: the small-M kernel)
      for _, shape in ipairs({{20}, {5, 20}, {3, 4, 20}, {500, 20}}) do
        local x = nd.randn(shape, {dtype = dtype})
        local ref = nd.F.linear(x, w, b)
        assert_close(nd.fused_linear(x, w, b, {activation = "relu"}), ref:relu(), 1e-6, dtype .. " relu")
        assert_close(nd.fused_linear(x, w, b, {activation = "gelu"}), ref:gelu(), 1e-6, dtype .. " gelu")
        assert_close(nd.fused_linear(x, w, b), ref, 1e-6, dtype .. " none")
        assert_close(nd.fused_linear(x, w, {activation = "relu"}), nd.F.linear(x, w):relu(), 1e-6, dtype .. " no bias")
      end
    end
  end)

  it("names the op, the shapes and the dtypes in its errors", function()
    local x, w = nd.randn({5, 20}), nd.randn({7, 20})
    raises("needle.fused_linear: input of shape {5,21} does not match weight of shape {7,20}",
           nd.fused_linear, nd.randn({5, 21}), w)
    raises("needle.fused_linear: expected a 2-D weight", nd.fused_linear, x, nd.randn({7, 20, 1}))
    raises("needle.fused_linear: bias must have shape {7}", nd.fused_linear, x, w, nd.randn({6}))
    raises("needle.fused_linear: expected a float32 or float64 input, got int64", nd.fused_linear,
           nd.zeros({5, 20}, {dtype = "int64"}), w)
    raises("needle.fused_linear: input (float32) and bias (float64) must have the same dtype",
           nd.fused_linear, x, w, nd.randn({7}, {dtype = "float64"}))
    raises("needle.fused_linear: unknown option 'act'", nd.fused_linear, x, w, nil, {act = "relu"})
  end)
end)

describe("the fused ops under autograd", function()
  -- gradients of sum(out * g) for x, w, b
  local function grads(fn, x, w, b, g)
    local xs, ws, bs = x:clone(), w:clone(), b:clone()
    xs.requires_grad, ws.requires_grad, bs.requires_grad = true, true, true
    local y = fn(xs, ws, bs)
    ;(y * g):sum():backward()
    return y, xs.grad, ws.grad, bs.grad
  end

  it("fall back to the composed ops when autograd records: conv2d gradients", function()
    nd.manual_seed(6)
    local x, w, b = nd.randn({2, 4, 7, 7}, {dtype = "float64"}), nd.randn({6, 2, 3, 3}, {dtype = "float64"}),
                    nd.randn({6}, {dtype = "float64"})
    local o = {stride = 2, padding = 1, groups = 2}
    local g = nd.randn({2, 6, 4, 4}, {dtype = "float64"})
    local y1, gx1, gw1, gb1 = grads(function(xx, ww, bb)
      local r = {}
      for k, v in pairs(o) do r[k] = v end
      r.activation = "relu"
      return nd.fused_conv2d(xx, ww, bb, r)
    end, x, w, b, g)
    local y2, gx2, gw2, gb2 = grads(function(xx, ww, bb) return nd.F.conv2d(xx, ww, bb, o):relu() end, x, w, b, g)
    assert.are.equal("relu", y1.grad_fn)
    assert_close(y1, y2, 1e-12, "value")
    assert_close(gx1, gx2, 1e-12, "grad x")
    assert_close(gw1, gw2, 1e-12, "grad w")
    assert_close(gb1, gb2, 1e-12, "grad b")
  end)

  it("fall back to the composed ops when autograd records: linear gradients (finite differences)", function()
    nd.manual_seed(7)
    local x, w, b = nd.randn({3, 5}, {dtype = "float64"}), nd.randn({4, 5}, {dtype = "float64"}),
                    nd.randn({4}, {dtype = "float64"})
    local g = nd.randn({3, 4}, {dtype = "float64"})
    local f = function(xx, ww, bb) return nd.fused_linear(xx, ww, bb, {activation = "relu"}) end
    local _, gx, gw = grads(f, x, w, b, g)
    local function loss(xx, ww) return nd.no_grad(function() return (f(xx, ww, b) * g):sum():item() end) end
    local eps = 1e-6
    for _, case in ipairs({{x, gx, "x"}, {w, gw, "w"}}) do
      local t, gt = case[1], case[2]
      local flat, gflat = t:view({-1}), gt:contiguous():view({-1})
      for i = 1, t:numel() do
        local v = flat[i]:item()
        flat[i] = v + eps
        local lp = case[3] == "x" and loss(x, w) or loss(x, w)
        flat[i] = v - eps
        local lm = loss(x, w)
        flat[i] = v
        local num = (lp - lm) / (2 * eps)
        assert.is_true(math.abs(num - gflat[i]:item()) < 1e-6, ("grad %s[%d]: %g vs %g"):format(
          case[3], i, num, gflat[i]:item()))
      end
    end
  end)

  it("run the fused kernel (no graph) under no_grad, even for inputs that require grad", function()
    local x, w = nd.randn({2, 3}), nd.randn({4, 3})
    w.requires_grad = true
    local y = nd.no_grad(function() return nd.fused_linear(x, w, nil, {activation = "relu"}) end)
    assert.is_nil(y.grad_fn)
    assert.is_false(y.requires_grad)
  end)
end)

describe("BatchNorm folding", function()
  it("matches scale = gamma / sqrt(var + eps), W' = W scale, b' = (b - mean) scale + beta in float64", function()
    nd.manual_seed(8)
    local conv = nn.Conv2d(3, 4, 3, {dtype = "float64"})
    local bn = nn.BatchNorm2d(4, {dtype = "float64", eps = 1e-3})
    randomize_bn(bn)
    local F = require "needle.nn.fuse"
    local fused = F.conv_bn(conv, bn)
    local W, B = conv.weight:totable(), conv.bias:totable()
    local g, beta = bn.weight:totable(), bn.bias:totable()
    local mean, var = bn.running_mean:totable(), bn.running_var:totable()
    local FW, FB = fused.weight:totable(), fused.bias:totable()
    for o = 1, 4 do
      local scale = g[o] / math.sqrt(var[o] + 1e-3)
      assert.is_true(math.abs(FB[o] - ((B[o] - mean[o]) * scale + beta[o])) < 1e-14)
      for c = 1, 3 do
        for i = 1, 3 do
          for j = 1, 3 do
            assert.is_true(math.abs(FW[o][c][i][j] - W[o][c][i][j] * scale) < 1e-14)
          end
        end
      end
    end
  end)

  it("folds into a layer without bias, and BatchNorm without affine parameters", function()
    nd.manual_seed(9)
    local F = require "needle.nn.fuse"
    local conv = nn.Conv2d(3, 4, 3, {bias = false, padding = 1})
    local bn = nn.BatchNorm2d(4, {affine = false})
    randomize_bn(bn)
    bn:eval()
    local x = nd.randn({2, 3, 6, 6})
    local fused = F.conv_bn(conv, bn, {relu = true})
    assert.truthy(fused.bias)
    assert_close(eval_out(fused, x), eval_out(nn.Sequential(conv, bn, nn.ReLU()), x), 1e-5, "no bias, no affine")
  end)

  it("rejects BatchNorm without running statistics, and a channel mismatch", function()
    local F = require "needle.nn.fuse"
    raises("needle.nn.fuse: cannot fold BatchNorm2d(4): it has no running statistics", F.conv_bn,
           nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, {track_running_stats = false}))
    raises("needle.nn.fuse: cannot fold BatchNorm2d(5) into Conv2d(3, 4) with 4 output channels",
           F.conv_bn, nn.Conv2d(3, 4, 3), nn.BatchNorm2d(5))
    raises("needle.nn.fuse.conv_bn: expected a Conv2d, got Linear", F.conv_bn, nn.Linear(3, 4))
    raises("needle.nn.fuse.linear_bn: expected a BatchNorm1d (or nil), got BatchNorm2d", F.linear_bn,
           nn.Linear(3, 4), nn.BatchNorm2d(4))
    raises("needle.nn.fuse: cannot fold", nn.fuse,
           nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, {track_running_stats = false})))
  end)
end)

describe("nd.fold_batch_norm", function()
  -- the formula on Lua numbers, element by element (independent of the op)
  local function reference(W, B, mean, rstd, g, beta)
    local FW, FB = {}, {}
    for o = 1, #mean do
      local s = (g and g[o] or 1) * rstd[o]
      FB[o] = ((B and B[o] or 0) - mean[o]) * s + (beta and beta[o] or 0)
      FW[o] = {}
      for c = 1, #W[o] do FW[o][c] = W[o][c] * s end
    end
    return FW, FB
  end

  local D = require "spec.helpers.devices"
  for _, dev in ipairs(D.all()) do
    for _, dt in ipairs({"float64", "float32"}) do
      for _, parts in ipairs({{true, true, true}, {false, false, false}, {true, false, true}}) do
        it(("computes w * s, (b - mean) * s + beta with s = gamma * rstd in float64 (%s, bias/gamma/beta %s) on %s")
             :format(dt, table.concat({tostring(parts[1]), tostring(parts[2]), tostring(parts[3])}, "/"), dev), function()
          nd.manual_seed(21)
          local o = {dtype = dt}
          local w, mean, rstd = nd.randn({5, 6}, o), nd.randn({5}, o), nd.rand({5}, o) + 0.5
          local b = parts[1] and nd.randn({5}, o) or nil
          local g = parts[2] and nd.randn({5}, o) or nil
          local beta = parts[3] and nd.randn({5}, o) or nil
          local function on(t) return t and t:to(dev) or nil end
          local fw, fb = nd.fold_batch_norm(on(w), on(b), on(mean), on(rstd), on(g), on(beta))
          assert.are.equal(dt, fw.dtype)
          assert.are.equal(dt, fb.dtype)
          assert.are.equal(dev, fw.device)
          local RW, RB = reference(w:double():totable(), b and b:double():totable(), mean:double():totable(),
                                   rstd:double():totable(), g and g:double():totable(),
                                   beta and beta:double():totable())
          local tol = dt == "float64" and 1e-14 or 1e-6 -- float32: one rounding of the float64 result
          local FW, FB = fw:cpu():double():totable(), fb:cpu():double():totable()
          for i = 1, 5 do
            assert.is_true(math.abs(FB[i] - RB[i]) <= tol * math.max(1, math.abs(RB[i])), "bias " .. i)
            for c = 1, 6 do
              assert.is_true(math.abs(FW[i][c] - RW[i][c]) <= tol * math.max(1, math.abs(RW[i][c])), "weight")
            end
          end
        end)
      end
    end
  end

  it("takes a weight of any rank (the output channels first), without autograd", function()
    local w = nd.randn({3, 2, 2, 2}):requires_grad_()
    local fw, fb = nd.fold_batch_norm(w, nil, nd.zeros({3}), nd.ones({3}) * 2)
    assert.are.same({3, 2, 2, 2}, fw.shape)
    assert.are.equal(0, max_abs_diff(fw, w:detach() * 2))
    assert.are.equal(0, max_abs_diff(fb, nd.zeros({3})))
    assert.is_false(fw.requires_grad)
  end)

  it("names the op, the tensor and the shapes it expected", function()
    local w = nd.randn({4, 3})
    raises("fold_batch_norm: mean must be a float32 tensor of shape {4} (one value per output channel of "
           .. "the weight {4,3}), got float32 {5}", nd.fold_batch_norm, w, nil, nd.zeros({5}), nd.ones({4}))
    raises("fold_batch_norm: gamma must be a float32 tensor of shape {4}", nd.fold_batch_norm, w, nil,
           nd.zeros({4}), nd.ones({4}), nd.ones({4}, {dtype = "float64"}))
    raises("fold_batch_norm: expected a float32/float64 weight with the output channels first, got int64",
           nd.fold_batch_norm, nd.zeros({4, 3}, {dtype = "int64"}), nil, nd.zeros({4}), nd.ones({4}))
    raises("fold_batch_norm: expected a tensor", nd.fold_batch_norm, w, nil, nil, nd.ones({4}))
  end)
end)

describe("nd.nn.fuse", function()
  local function check_pattern(model, x, fused_class, n_identity, tol)
    randomize_bn(model)
    model:eval()
    local fused = nn.fuse(model)
    assert.are.equal(fused_class, fused[1].__name)
    for i = 2, 1 + n_identity do assert.are.equal("Identity", fused[i].__name) end
    assert_close(eval_out(fused, x), eval_out(model, x), tol or 1e-5, fused_class)
    return fused
  end

  it("fuses Conv2d, BatchNorm2d, ReLU chains (groups, stride, padding, dilation)", function()
    nd.manual_seed(10)
    local x = nd.randn({3, 4, 11, 11})
    local opts = {stride = 2, padding = 2, dilation = 2, groups = 2}
    check_pattern(nn.Sequential(nn.Conv2d(4, 6, 3, opts), nn.BatchNorm2d(6), nn.ReLU()), x, "FusedConv2d", 2)
    check_pattern(nn.Sequential(nn.Conv2d(4, 6, 3, opts), nn.BatchNorm2d(6)), x, "FusedConv2d", 1)
    check_pattern(nn.Sequential(nn.Conv2d(4, 6, 3, opts), nn.ReLU()), x, "FusedConv2d", 1)
    check_pattern(nn.Sequential(nn.Conv2d(4, 6, 3, {padding = "same", bias = false}), nn.BatchNorm2d(6),
                                nn.ReLU()), x, "FusedConv2d", 2)
    check_pattern(nn.Sequential(nn.Conv2d(4, 6, {2, 3}, {padding = "same"}), nn.BatchNorm2d(6)), x,
                  "FusedConv2d", 1)
  end)

  it("fuses Linear, BatchNorm1d, ReLU chains, and Linear, ReLU on 3-D inputs", function()
    nd.manual_seed(11)
    local x = nd.randn({6, 10})
    check_pattern(nn.Sequential(nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU()), x, "FusedLinear", 2)
    check_pattern(nn.Sequential(nn.Linear(10, 8, {bias = false}), nn.BatchNorm1d(8)), x, "FusedLinear", 1)
    check_pattern(nn.Sequential(nn.Linear(10, 8), nn.ReLU()), nd.randn({2, 3, 10}), "FusedLinear", 1)
    local f = nn.fuse(nn.Sequential(nn.Linear(10, 8), nn.BatchNorm1d(8)))
    raises("a BatchNorm1d was folded in", f, nd.randn({2, 3, 10}))
  end)

  it("leaves the original model untouched (weights copied, modes kept)", function()
    nd.manual_seed(12)
    local m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 5))
    randomize_bn(m)
    local before = {}
    for k, v in pairs(m:state_dict()) do before[k] = v:clone() end
    local x = nd.randn({2, 3, 8, 8})
    m:eval()
    local y0 = eval_out(m, x)
    m:train()
    local fused = nn.fuse(m)
    assert.is_true(m.training)
    assert.is_false(fused.training)
    assert.are.equal("Conv2d", m[1].__name)
    local after = m:state_dict()
    for k, v in pairs(before) do assert.are.equal(0, max_abs_diff(after[k]:to({dtype = "float64"}), v:to({dtype = "float64"})), k) end
    for _, p in ipairs(m:parameters()) do assert.is_true(p.requires_grad) end
    -- writing into the fused copy does not reach the original
    nd.no_grad(function() fused[5].weight:fill_(0) end)
    m:eval()
    assert.are.equal(0, max_abs_diff(eval_out(m, x), y0))
  end)

  it("fuses exact GELUs as it fuses ReLUs (Linear(, BatchNorm1d), GELU; Conv2d(, BatchNorm2d), GELU), not tanh ones", function()
    nd.manual_seed(21)
    local m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.BatchNorm1d(16), nn.GELU(),
                            nn.Linear(16, 4), nn.GELU("tanh"))
    local c = nn.Sequential(nn.Conv2d(3, 4, 3, {padding = 1}), nn.BatchNorm2d(4), nn.GELU(),
                            nn.Conv2d(4, 4, 3, {padding = 1}), nn.GELU())
    randomize_bn(m[4])
    randomize_bn(c[2])
    m:eval()
    c:eval()
    local fm, fc = nn.fuse(m), nn.fuse(c)
    local s = tostring(fm)
    assert.truthy(s:find("FusedLinear(in_features=8, out_features=16, bias=true, activation=gelu)", 1, true), s)
    assert.truthy(s:find("FusedLinear(in_features=16, out_features=16, bias=true, activation=gelu, batch_norm folded)", 1, true), s)
    assert.truthy(s:find("GELU(approximate='tanh')", 1, true), s) -- kept
    assert.truthy(tostring(fc):find("activation=gelu", 1, true), tostring(fc))
    local x, xi = nd.randn({5, 8}), nd.randn({2, 3, 6, 6})
    nd.no_grad(function()
      assert.is_true((fm(x) - m(x)):abs():max():item() < 1e-5)
      assert.is_true((fc(xi) - c(xi)):abs():max():item() < 1e-5)
    end)
    local F = require "needle.nn.fuse"
    raises("needle.nn.fuse.linear_bn: relu and gelu are both set: one activation", F.linear_bn, nn.Linear(2, 2), nil,
           {relu = true, gelu = true})
  end)

  it("gives fused modules parameters (state_dict), a repr with the activation, frozen unless asked", function()
    local m = nn.Sequential(nn.Conv2d(3, 4, 3, {stride = 2}), nn.BatchNorm2d(4), nn.ReLU(), nn.Linear(4, 2),
                            nn.ReLU())
    local f = nn.fuse(m)
    local keys = {}
    for k in pairs(f:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({"0.bias", "0.weight", "3.bias", "3.weight"}, keys)
    assert.truthy(tostring(f):find("FusedConv2d(3, 4, kernel_size={3, 3}, stride={2, 2}, activation=relu)", 1, true),
                  tostring(f))
    assert.truthy(tostring(f):find("FusedLinear(in_features=4, out_features=2, bias=true, activation=relu)", 1, true))
    -- a GELU activation, built directly
    local g = nn.FusedLinear(4, 3, {activation = "gelu"})
    local x = nd.randn({5, 4})
    assert.are.equal(0, (g(x) - nd.F.linear(x, g.weight, g.bias):gelu()):abs():max():item())
    assert.has_error(function() nn.FusedLinear(4, 3, {activation = "tanh"}) end,
                     "needle.nn.FusedLinear: activation must be 'none', 'relu' or 'gelu', got 'tanh'")
    for _, p in ipairs(f:parameters()) do assert.is_false(p.requires_grad) end
    local t = nn.fuse(m, {requires_grad = true})
    for _, p in ipairs(t:parameters()) do assert.is_true(p.requires_grad) end
    -- trainable: gradients through the composed fallback equal the unfused model's
    local x = nd.randn({2, 3, 9, 9})
    m:eval()
    local g = nd.randn({2, 4, 4, 2})
    t(x):mul(g):sum():backward()
    m(x):mul(g):sum():backward()
    assert_close(t[4].weight.grad, m[4].weight.grad, 1e-5, "linear weight grad")
    assert.truthy(f:load_state_dict(t:state_dict()) ~= false)
    raises("needle.nn.fuse: unknown option 'inplace'", nn.fuse, m, {inplace = true})
  end)

  it("fuses children of Residual, ModuleList and custom modules, keeping tied weights tied", function()
    nd.manual_seed(13)
    local Custom = nn.Module:extend("CustomBlock")
    function Custom:init()
      self.body = nn.Sequential(nn.Conv2d(4, 4, 3, {padding = 1}), nn.BatchNorm2d(4), nn.ReLU())
      self.list = nn.ModuleList({nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())})
      self.head = nn.Linear(4, 3)
      self.head2 = nn.Linear(4, 3)
      self.head2.weight = self.head.weight -- tied
      self.scale = 0.5
    end
    function Custom:forward(x)
      local h = self.list[1](self.body(x)):mean({3, 4})
      return self.head(h) + self.head2(h) * self.scale
    end
    local m = nn.Sequential(nn.Residual(nn.Sequential(nn.Conv2d(4, 4, 3, {padding = 1}), nn.BatchNorm2d(4))),
                            Custom())
    randomize_bn(m)
    m:eval()
    local x = nd.randn({2, 4, 5, 5})
    local f = nn.fuse(m)
    assert.are.equal("FusedConv2d", f[1].fn[1].__name)
    assert.are.equal("FusedConv2d", f[2].body[1].__name)
    assert.are.equal("FusedConv2d", f[2].list[1][1].__name)
    assert.are.equal(f[2].head.weight, f[2].head2.weight)
    assert.are_not.equal(m[2].head.weight, f[2].head.weight)
    assert_close(eval_out(f, x), eval_out(m, x), 1e-5, "custom")
  end)

  it("calls a module's fuse hook on a private copy", function()
    local Block = nn.Module:extend("HookBlock")
    function Block:init() self.conv = nn.Conv2d(2, 2, 1); self.bn = nn.BatchNorm2d(2) end
    function Block:forward(x) return self.bn(self.conv(x)) end
    local seen
    function Block:fuse(F)
      seen = self
      return F.conv_bn(self.conv, self.bn)
    end
    local b = Block()
    local f = nn.fuse(nn.Sequential(b))
    assert.are.equal("FusedConv2d", f[1].__name)
    assert.are_not.equal(b, seen)
    assert.are.equal("HookBlock", seen.__name)
  end)

  it("fuses ResNet9 (ConvBN hook) within 1e-5 of the eval model, float32 and float64", function()
    for _, dtype in ipairs({"float32", "float64"}) do
      nd.manual_seed(14)
      local m = nn.ResNet9({dtype = dtype})
      randomize_bn(m)
      m:eval()
      local f = nn.fuse(m)
      local n = 0
      for _, mod in ipairs(f:modules()) do
        if mod.__name == "FusedConv2d" then n = n + 1 end
        assert.are_not.equal("BatchNorm2d", mod.__name)
      end
      assert.are.equal(8, n)
      local x = nd.randn({4, 3, 32, 32}, {dtype = dtype})
      assert_close(eval_out(f, x), eval_out(m, x), dtype == "float64" and 1e-12 or 1e-5, "ResNet9 " .. dtype)
    end
  end)

  it("fuses the CIFAR ResNet-18 of needle.convert.models within 1e-5", function()
    local ok, models = pcall(require, "needle.convert.models")
    if not ok or not models.ResNetCIFAR then
      pending("needle.convert.models.ResNetCIFAR is not available")
      return
    end
    nd.manual_seed(15)
    local m = models.ResNetCIFAR({width = 8, num_classes = 10})
    randomize_bn(m)
    m:eval()
    local f = nn.fuse(m)
    for _, mod in ipairs(f:modules()) do assert.are_not.equal("BatchNorm2d", mod.__name) end
    local x = nd.randn({3, 3, 32, 32})
    assert_close(eval_out(f, x), eval_out(m, x), 1e-5, "ResNet-18")
  end)
end)

describe("nd.nn.fuse on OpenCL (the composed ops on the device)", function()
  local D = require "spec.helpers.devices"
  if D.pending_without_opencl(pending, "fused ops on OpenCL") then return end
  for _, dev in ipairs(D.opencl()) do
    it("fuses a model on " .. dev .. " and matches the cpu", function()
      nd.manual_seed(16)
      local m = nn.Sequential(nn.Conv2d(3, 8, 3, {padding = 1}), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.Conv2d(8, 4, 3, {stride = 2, groups = 2}), nn.BatchNorm2d(4), nn.Flatten(),
                              nn.Linear(4 * 9, 6), nn.ReLU())
      randomize_bn(m)
      m:eval()
      local x = nd.randn({2, 3, 8, 8})
      local want = eval_out(nn.fuse(m), x)
      local f = nn.fuse(m:to(dev))
      assert.are.equal(dev, f[1].weight.device)
      local got = eval_out(f, x:to(dev))
      assert.are.equal(dev, got.device)
      assert_close(got:to("cpu"), want, 1e-5, dev)
      local y = nd.fused_linear(nd.randn({3, 5}):to(dev), nd.randn({4, 5}):to(dev), nil, {activation = "relu"})
      assert.are.equal(dev, y.device)
    end)
  end
end)
