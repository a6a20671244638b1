-- fast_kernels_spec.lua - the CPU kernels added for speed (issue 7), each
-- against a reference that does not run it:
--   * conv2d's chunked kernels (cpu_conv_gemm.c): the forward against a
--     direct sum in Lua (float64), the first-order gradients against the
--     composed, differentiable formulas (nd.grad with create_graph = true
--     runs those instead of the kernel), plus finite differences. The
--     configurations reach every path: dead taps (3x3 on 1x1 and 2x2 maps,
--     and a conv whose taps all read padding), several images per chunk
--     with a partial last chunk, the small-map offset table and the wide-row
--     copy, groups, dilation, strides, 1x1 convolutions, strided inputs.
--   * the packed float32 conv2d (cpu_conv_packed.c): against float64, and
--     against the BLAS path (NEEDLE_CONV_BLAS=1) in a child process.
--   * relu's fused backward (cpu_elementwise.c): against the composed
--     formula.
--   * batch_norm's fused backward (cpu_norm.c): against the composed
--     formulas, training and evaluation, with and without affine weights.
--   * layer_norm's rows (cpu_norm.c): float64 against the composed
--     formulas, float32 against float64, every affine combination.
--   * the small-M float32 linear kernel (cpu_linear_small.c): against
--     x:matmul(w:t()) + b (BLAS) over M, K, O with every remainder; and
--     linear's own autograd node (op_fused.c) by finite differences.
local nd = require "needle"
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert, {atol = 1e-5, rtol = 1e-4, allow_unused = true})
local leaf = G.leaf

local f64 = {dtype = "float64"}

-- y[n][o][i][j] = b[o] + sum over the group's channels and the taps
local function direct_conv(x, w, b, opt)
  local X, Wt = x:totable(), w:totable()
  local B = b and b:totable()
  local s = opt.stride or {1, 1}
  local p = opt.padding or {0, 0}
  local d = opt.dilation or {1, 1}
  if type(s) == "number" then s = {s, s} end
  if type(p) == "number" then p = {p, p} end
  if type(d) == "number" then d = {d, d} end
  local groups = opt.groups or 1
  local N, Cin, H, W = table.unpack(x.shape)
  local O, Cg, kh, kw = table.unpack(w.shape)
  local OH = (H + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
  local OW = (W + 2 * p[2] - d[2] * (kw - 1) - 1) // s[2] + 1
  local Og, Y = O // groups, {}
  assert(Cin == Cg * groups)
  for n = 1, N do
    Y[n] = {}
    for o = 1, O do
      local gi = (o - 1) // Og
      Y[n][o] = {}
      for i = 1, OH do
        Y[n][o][i] = {}
        for j = 1, OW do
          local acc = B and B[o] or 0
          for c = 1, Cg do
            for a = 1, kh do
              local h = (i - 1) * s[1] - p[1] + (a - 1) * d[1] + 1
              if h >= 1 and h <= H then
                for e = 1, kw do
                  local v = (j - 1) * s[2] - p[2] + (e - 1) * d[2] + 1
                  if v >= 1 and v <= W then
                    acc = acc + X[n][gi * Cg + c][h][v] * Wt[o][c][a][e]
                  end
                end
              end
            end
          end
          Y[n][o][i][j] = acc
        end
      end
    end
  end
  return Y, {N, O, OH, OW}
end

local function max_diff(a, b) return (a - b):abs():max():item() end

local conv_cases = {
  {"3x3 on 1x1 maps: 8 of 9 taps dead", {5, 6, 1, 1}, {4, 6, 3, 3}, {padding = 1}},
  {"2x2 maps, stride 2: 4 of 9 taps live", {3, 4, 2, 2}, {5, 4, 3, 3}, {stride = 2, padding = 1}},
  {"every tap reads padding: the output is the bias", {2, 2, 1, 1}, {3, 2, 2, 2},
    {dilation = 3, padding = 2}},
  {"64 images per chunk, a partial last chunk (offset table)", {70, 2, 4, 4}, {3, 2, 3, 3},
    {padding = 1}},
  {"wide rows (row copies), stride {1,2}, dilation {2,1}", {2, 3, 9, 40}, {4, 3, 3, 3},
    {stride = {1, 2}, dilation = {2, 1}, padding = {2, 1}}},
  {"groups 2 over two chunks", {50, 4, 5, 5}, {6, 2, 3, 3}, {groups = 2, padding = 1}},
  {"1x1, one image per chunk (x read as is)", {2, 3, 40, 40}, {4, 3, 1, 1}, {}},
  {"1x1, several images per chunk", {20, 3, 5, 5}, {4, 3, 1, 1}, {}},
  {"7x7 stride 4 (ResNet9's stem)", {3, 3, 32, 32}, {4, 3, 7, 7}, {stride = 4, padding = 3}},
  {"depthwise, stride 2", {9, 4, 7, 7}, {4, 1, 3, 3}, {groups = 4, stride = 2, padding = 1}},
}

describe("conv2d's chunked CPU kernels", function()
  before_each(function() nd.manual_seed(77) end)

  for _, c in ipairs(conv_cases) do
    local name, xs, ws, opt = c[1], c[2], c[3], c[4]

    it("forward equals a direct sum (float64 and float32): " .. name, function()
      local x, w, b = nd.randn(xs, f64), nd.randn(ws, f64), nd.randn({ws[1]}, f64)
      local want, shape = direct_conv(x, w, b, opt)
      local ref = nd.tensor(want, f64)
      local y = nd.conv2d(x, w, b, opt)
      assert.are.same(shape, y.shape)
      assert.is_true(max_diff(y, ref) < 1e-10)
      local y32 = nd.conv2d(x:float(), w:float(), b:float(), opt)
      assert.is_true(max_diff(y32:double(), ref) < 1e-4 * math.max(1, ref:abs():max():item()))
      -- no bias
      local want0 = nd.tensor((direct_conv(x, w, nil, opt)), f64)
      assert.is_true(max_diff(nd.conv2d(x, w, nil, opt), want0) < 1e-10)
    end)

    it("gradients equal the composed formulas: " .. name, function()
      local x = nd.randn(xs, {dtype = "float64", requires_grad = true})
      local w = nd.randn(ws, {dtype = "float64", requires_grad = true})
      local b = nd.randn({ws[1]}, {dtype = "float64", requires_grad = true})
      local y = nd.conv2d(x, w, b, opt)
      local gy = nd.randn(y.shape, f64)
      local loss = (y * gy):sum()
      local fast = nd.grad(loss, {x, w, b}, {retain_graph = true})
      local composed = nd.grad(loss, {x, w, b}, {create_graph = true})
      for i = 1, 3 do
        assert.are.same(composed[i].shape, fast[i].shape)
        assert.is_true(max_diff(fast[i], composed[i]:detach()) < 1e-10,
          "gradient " .. i .. " differs by " .. max_diff(fast[i], composed[i]:detach()))
      end
      -- only some inputs wanting gradients
      local gw = nd.grad((nd.conv2d(x:detach(), w, nil, opt) * gy):sum(), {w})[1]
      assert.is_true(max_diff(gw, composed[2]:detach()) < 1e-10)
      local gx = nd.grad((nd.conv2d(x, w:detach(), nil, opt) * gy):sum(), {x})[1]
      assert.is_true(max_diff(gx, composed[1]:detach()) < 1e-10)
    end)
  end

  it("float32 gradients agree with float64 ones", function()
    local x = nd.randn({70, 2, 4, 4}, f64)
    local w = nd.randn({3, 2, 3, 3}, f64)
    local function grads(dt)
      local xv = x:to(dt):requires_grad_()
      local wv = w:to(dt):requires_grad_()
      local y = nd.conv2d(xv, wv, nil, {padding = 1})
      local gy = nd.ones(y.shape, {dtype = dt})
      return nd.grad((y * gy):sum(), {xv, wv})
    end
    local g64, g32 = grads("float64"), grads("float32")
    assert.is_true(max_diff(g32[1]:double(), g64[1]) < 1e-4)
    assert.is_true(max_diff(g32[2]:double(), g64[2]) < 1e-3)
  end)

  it("finite differences: dead taps, several images per chunk", function()
    C.check(function(x, w, b) return nd.conv2d(x, w, b, {padding = 1}) end,
      {leaf({3, 3, 1, 1}), leaf({2, 3, 3, 3}), leaf({2})})
    C.check(function(x, w, b) return nd.conv2d(x, w, b, {stride = 2, padding = 1}) end,
      {leaf({2, 2, 2, 2}), leaf({3, 2, 3, 3}), leaf({3})})
    C.check(function(x, w) return nd.conv2d(x, w, nil, {dilation = 3, padding = 2}) end,
      {leaf({1, 2, 1, 1}), leaf({2, 2, 2, 2})})
  end)

  it("fused_conv2d of an empty batch or no output channels is empty, as conv2d", function()
    local y = nd.fused_conv2d(nd.zeros({0, 2, 4, 4}), nd.zeros({3, 2, 3, 3}), nil, {padding = 1})
    assert.are.same({0, 3, 4, 4}, y.shape)
    assert.are.same({1, 0, 2, 2}, nd.fused_conv2d(nd.zeros({1, 2, 4, 4}), nd.zeros({0, 2, 3, 3})).shape)
    assert.are.same({3, 4, 4}, nd.fused_conv2d(nd.randn({2, 4, 4}), nd.randn({3, 2, 3, 3}), nil,
      {padding = 1}).shape)
  end)

  it("reads strided (transposed) inputs", function()
    local x, w = nd.randn({4, 3, 6, 5}, f64), nd.randn({2, 3, 3, 3}, f64)
    local xt = x:transpose(3, 4)
    local want = nd.tensor((direct_conv(xt:contiguous(), w, nil, {padding = 1})), f64)
    assert.is_true(max_diff(nd.conv2d(xt, w, nil, {padding = 1}), want) < 1e-10)
  end)
end)

-- The packed float32 path (cpu_conv_packed.c) runs wherever the CPU has
-- AVX2 + FMA (nd.devices()[1].packed_conv); float64 and groups > 1 always
-- take the BLAS path, which the tests above check against a direct sum. So
-- here float32 results are checked against float64 ones. The cases reach
-- the packed path's parts: panels inside one image and across images
-- (L = 64, 16, 9, 4, 1), planes read in place (strided or not) or copied
-- per thread (padded, and split by stride phase), wide rows, dilation,
-- depth blocks (K > 256), output channels that fill no tile, one image
-- (one thread), partial panels.
local packed_cases = {
  {"4x4 maps, odd batch, O = 7", {9, 5, 4, 4}, {7, 5, 3, 3}, {padding = 1}},
  {"the 7x7 stride-4 stem, 4 panels per image", {5, 3, 32, 32}, {16, 3, 7, 7},
    {stride = 4, padding = 3}},
  {"3x3 outputs: panels straddle images", {7, 4, 5, 5}, {6, 4, 3, 3}, {stride = 2, padding = 1}},
  {"1x1 maps: 16 images per panel, one live tap", {20, 8, 1, 1}, {5, 8, 3, 3}, {padding = 1}},
  {"no padding: planes read in place", {3, 4, 9, 11}, {5, 4, 3, 3}, {}},
  {"wide rows, stride {1,2}, dilation {2,1}", {2, 3, 20, 41}, {6, 3, 3, 3},
    {stride = {1, 2}, dilation = {2, 1}, padding = {2, 1}}},
  {"depth 360 (two depth blocks), O = 9", {4, 40, 6, 6}, {9, 40, 3, 3}, {padding = 1}},
  {"one image", {1, 6, 9, 9}, {4, 6, 3, 3}, {padding = 1}},
  {"padding 2 around a 3x3 kernel", {2, 3, 5, 5}, {4, 3, 3, 3}, {padding = 2}},
  {"2x2 outputs, stride 2 (ResNet9's 32->64)", {11, 16, 4, 4}, {32, 16, 3, 3},
    {stride = 2, padding = 1}},
  {"stride 2 read in place (no live tap reads padding)", {6, 8, 2, 2}, {5, 8, 3, 3},
    {stride = 2, padding = 1}},
  {"stride {3,2} phase planes, dilation 2", {3, 5, 17, 19}, {4, 5, 3, 3},
    {stride = {3, 2}, dilation = 2, padding = {1, 3}}},
  {"a strided 1x1 reads x in place (no phase planes)", {2, 16, 14, 14}, {24, 16, 1, 1}, {stride = 2}},
  -- shapes where the path choice (cpu_conv_packed.c, packed_wins) sends
  -- some products to the BLAS path and keeps others here
  {"1x1 over 8192 pixels: forward and grad x by BLAS, grad w packed", {2, 8, 64, 64},
    {64, 8, 1, 1}, {}},
  {"3x3 over 8192 pixels, 64 filters: grad x by BLAS, the rest packed", {2, 4, 64, 64},
    {64, 4, 3, 3}, {padding = 1}},
  {"64 pixels, a 64x576 weight: grad w by BLAS, the rest packed", {1, 64, 8, 8}, {64, 64, 3, 3},
    {padding = 1}},
  -- groups (more than one channel a group: depthwise has its own kernel) run
  -- group by group on the packed path
  {"groups = 2, 3x3", {3, 6, 9, 9}, {8, 3, 3, 3}, {padding = 1, groups = 2}},
  {"groups = 4, stride 2, 2 channels a group", {2, 8, 10, 10}, {12, 2, 3, 3},
    {stride = 2, padding = 1, groups = 4}},
  {"groups = 3, 1x1", {2, 9, 7, 7}, {6, 3, 1, 1}, {groups = 3}},
  {"groups = 2, phase planes and dead taps", {2, 4, 17, 19}, {4, 2, 3, 3},
    {stride = {3, 2}, dilation = 2, padding = {1, 3}, groups = 2}},
}

-- |a - b| relative to b's largest magnitude
local function rel_diff(a, b)
  return max_diff(a:double(), b) / math.max(1e-12, b:abs():max():item())
end

describe("conv2d's packed float32 kernels", function()
  before_each(function() nd.manual_seed(31) end)

  for _, c in ipairs(packed_cases) do
    local name, xs, ws, opt = c[1], c[2], c[3], c[4]
    it("forward, bias, ReLU and all three gradients match float64: " .. name, function()
      local x, w, b = nd.randn(xs, f64), nd.randn(ws, f64), nd.randn({ws[1]}, f64)
      local gy
      local function run(dt)
        local xv, wv, bv = x:to(dt):requires_grad_(), w:to(dt):requires_grad_(), b:to(dt):requires_grad_()
        local y = nd.conv2d(xv, wv, bv, opt)
        gy = gy or nd.randn(y.shape, f64)
        local g = nd.grad((y * gy:to(dt)):sum(), {xv, wv, bv})
        local o = {}
        for k, v in pairs(opt) do o[k] = v end
        o.activation = "relu"
        local fused = nd.fused_conv2d(xv:detach(), wv:detach(), bv:detach(), o)
        return y:detach(), g, fused
      end
      local y64, g64, f64r = run("float64")
      local y32, g32, f32r = run("float32")
      assert.is_true(rel_diff(y32, y64) < 1e-5, "forward " .. rel_diff(y32, y64))
      assert.is_true(rel_diff(f32r, f64r) < 1e-5, "fused relu " .. rel_diff(f32r, f64r))
      for i, what in ipairs({"x", "w", "b"}) do
        assert.is_true(rel_diff(g32[i], g64[i]) < 1e-5, "grad " .. what .. " " .. rel_diff(g32[i], g64[i]))
      end
      -- one gradient at a time (the backward computes only what is asked)
      local xv, wv = x:float():requires_grad_(), w:float():requires_grad_()
      local only_w = nd.grad((nd.conv2d(x:float(), wv, nil, opt) * gy:float()):sum(), {wv})[1]
      local only_x = nd.grad((nd.conv2d(xv, w:float(), nil, opt) * gy:float()):sum(), {xv})[1]
      assert.is_true(rel_diff(only_w, g64[2]) < 1e-5)
      assert.is_true(rel_diff(only_x, g64[1]) < 1e-5)
    end)
  end

  it("NaN in the input stays NaN, through the fused ReLU too (as nd.relu)", function()
    local x = nd.randn({3, 2, 4, 4})
    x[{2, 1, 3, 3}] = 0 / 0
    local w = nd.randn({5, 2, 3, 3})
    local y = nd.conv2d(x, w, nil, {padding = 1})
    assert.is_true(y[{2, 1, 3, 3}]:item() ~= y[{2, 1, 3, 3}]:item())
    assert.is_true(y[{1, 1, 3, 3}]:item() == y[{1, 1, 3, 3}]:item(), "other images are untouched")
    local r = nd.fused_conv2d(x, w, nil, {padding = 1, activation = "relu"})
    assert.is_true(r[{2, 1, 3, 3}]:item() ~= r[{2, 1, 3, 3}]:item())
    assert.are.equal(0, max_diff(r[1], y[1]:relu()), "elsewhere the fused ReLU is nd.relu")
  end)

  it("NEEDLE_CONV_BLAS=1 switches the path off and gives the same results", function()
    local S = require "spec.helpers.shell"
    local exe = S.needle_lua()
    local code = [[
      local nd = require "needle"
      nd.manual_seed(5)
      local x, w, b = nd.randn({6, 4, 5, 5}), nd.randn({7, 4, 3, 3}), nd.randn({7})
      x.requires_grad = true; w.requires_grad = true
      local y = nd.conv2d(x, w, b, {stride = 2, padding = 1})
      local g = nd.grad((y * y):sum(), {x, w})
      print(nd.devices()[1].packed_conv, y:sum():item(), g[1]:abs():sum():item(), g[2]:abs():sum():item())
    ]]
    local function run(env)
      local out = os.tmpname()
      local ok = os.execute(("env %s %s -e %s > %s 2>&1"):format(env, S.q(exe), S.q(code), out))
      local text = S.read_file(out) or ""
      os.remove(out)
      assert.is_true(ok == true or ok == 0, text)
      local flag, a, b2, c2 = text:match("^(%a+)%s+(%S+)%s+(%S+)%s+(%S+)")
      return flag, {tonumber(a), tonumber(b2), tonumber(c2)}
    end
    local flag_blas, blas = run("NEEDLE_CONV_BLAS=1")
    local flag_default, default = run("NEEDLE_CONV_BLAS=0")
    assert.are.equal("false", flag_blas)
    local env = os.getenv("NEEDLE_CONV_BLAS")
    if env == nil or env == "" or env == "0" then -- this process runs the default path too
      assert.are.equal(tostring(nd.devices()[1].packed_conv), flag_default)
    end
    for i = 1, 3 do
      assert.is_true(math.abs(blas[i] - default[i]) <= 1e-4 * math.max(1, math.abs(blas[i])),
        ("value %d: %s vs %s"):format(i, blas[i], default[i]))
    end
  end)
end)

describe("the packed convolution's AVX-512 tiles", function()
  -- 24-, 12- and 6-row tiles (4, 2 and 1 panels of 6 filters) where the GEMM runs AVX-512;
  -- NEEDLE_GEMM=avx2 keeps the AVX2 tile. Each element is the same chain of FMAs either way.
  it("give the AVX2 tile's bits, forward and input gradient, for 24 + 6, 12 + 6 and 48 filters", function()
    if not tostring(nd.devices()[1].gemm):match("^avx512") then
      pending("this CPU's GEMM is " .. tostring(nd.devices()[1].gemm) .. ": no AVX-512 tiles to compare")
      return
    end
    local S = require "spec.helpers.shell"
    local code = [[
      local nd = require "needle"
      nd.manual_seed(12)
      local out = {}
      for _, c in ipairs({{{2, 8, 9, 9}, {30, 8, 3, 3}}, {{3, 5, 7, 7}, {18, 5, 3, 3}}, {{1, 16, 6, 6}, {48, 16, 3, 3}}}) do
        local x, w = nd.randn(c[1]), nd.randn(c[2])
        x.requires_grad = true
        local y = nd.conv2d(x, w, nil, {padding = 1})
        local gx = nd.grad((y * y):sum(), {x})[1]
        for _, t in ipairs({y, gx}) do
          for _, v in ipairs(t:reshape({-1}):tolist()) do out[#out + 1] = ("%a"):format(v) end
        end
      end
      print(#out, table.concat(out, " "))
    ]]
    -- (a failed run prints no count first: the check below fails with its message)
    local wide = S.run_program("NEEDLE_CONV_PACKED=1", code)
    local avx2 = S.run_program("NEEDLE_CONV_PACKED=1 NEEDLE_GEMM=avx2", code)
    local n = tonumber(wide:match("^(%d+)"))
    assert.is_true(n ~= nil and n > 5000, wide:sub(1, 200))
    assert.are.equal(avx2, wide)
  end)
end)

describe("the conv path choice", function()
  it("NEEDLE_CONV_PACKED=1, NEEDLE_CONV_BLAS=1 and the default agree where the default mixes paths", function()
    local S = require "spec.helpers.shell"
    local code = [[
      local nd = require "needle"
      nd.manual_seed(6)
      local out = {}
      for _, c in ipairs({{{2, 8, 64, 64}, {64, 8, 1, 1}, 0}, {{1, 64, 8, 8}, {64, 64, 3, 3}, 1}}) do
        local x, w = nd.randn(c[1]), nd.randn(c[2]) * 0.1
        x.requires_grad = true; w.requires_grad = true
        local y = nd.conv2d(x, w, nil, {padding = c[3]})
        local g = nd.grad((y * y):sum(), {x, w})
        for _, v in ipairs({y:abs():sum(), g[1]:abs():sum(), g[2]:abs():sum()}) do
          out[#out + 1] = ("%.9g"):format(v:item())
        end
      end
      print(table.concat(out, " "))
    ]]
    local function run(env)
      local f = os.tmpname()
      local ok = os.execute(("env %s %s -e %s > %s 2>&1"):format(env, S.q(S.needle_lua()), S.q(code), f))
      local text = S.read_file(f) or ""
      os.remove(f)
      assert.is_true(ok == true or ok == 0, text)
      local v = {}
      for num in text:gmatch("%S+") do v[#v + 1] = assert(tonumber(num), text) end
      assert.are.equal(6, #v, text)
      return v
    end
    local default, packed, blas = run("NEEDLE_CONV_PACKED=0"), run("NEEDLE_CONV_PACKED=1"), run("NEEDLE_CONV_BLAS=1")
    for i = 1, 6 do
      for _, other in ipairs({packed, blas}) do
        assert.is_true(math.abs(other[i] - default[i]) <= 1e-4 * math.abs(default[i]),
          ("value %d: %s vs %s"):format(i, other[i], default[i]))
      end
    end
  end)
end)

describe("relu's fused backward", function()
  it("equals the composed g * (y > 0), for contiguous and broadcast gradients", function()
    for _, dt in ipairs({"float32", "float64"}) do
      local x = nd.randn({70, 33}, {dtype = dt, requires_grad = true})
      local y = nd.relu(x)
      local gy = nd.randn({70, 33}, {dtype = dt})
      local fast = nd.grad((y * gy):sum(), {x}, {retain_graph = true})[1]
      local composed = nd.grad((y * gy):sum(), {x}, {create_graph = true})[1]:detach()
      assert.are.equal(0, max_diff(fast, composed))
      assert.are.equal(0, max_diff(fast, gy * x:detach():gt(0):to(dt)))
      -- sum's backward hands relu an expanded (stride 0) gradient
      local g1 = nd.grad(nd.relu(x):sum(), {x})[1]
      assert.are.equal(0, max_diff(g1, x:detach():gt(0):to(dt)))
    end
  end)

  it("zeroes where y <= 0 even when the gradient there is NaN or infinite (as PyTorch)", function()
    local x = nd.tensor({-1, 0, 2, 3}, {requires_grad = true})
    local y = nd.relu(x)
    local g = nd.grad(y, {x}, {grad_outputs = {nd.tensor({0 / 0, 1 / 0, 0 / 0, 5})}})[1]:totable()
    assert.are.equal(0, g[1])
    assert.are.equal(0, g[2])
    assert.is_true(g[3] ~= g[3])
    assert.are.equal(5, g[4])
  end)
end)

describe("unary ops' fused backward (one elementwise program)", function()
  -- every differentiable float unary op but relu (its own kernel, above);
  -- floor's gradient is zeros, which the program cannot hold: the composed
  -- formula runs, and it is here to show that fallback still agrees
  local ops = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "erf",
               "log1p", "expm1", "gelu", "gelu_tanh", "floor"}
  local function apply(name, x)
    if name == "gelu" then return nd.F.gelu(x) end
    if name == "gelu_tanh" then return nd.F.gelu(x, {approximate = "tanh"}) end
    return x[name](x)
  end

  it("equals the composed formula bit for bit: float32 and float64, strided inputs, broadcast gradients", function()
    for _, dt in ipairs({"float32", "float64"}) do
      for _, name in ipairs(ops) do
        -- positive values (log, sqrt, rsqrt), read through a transpose
        local leaf = (nd.rand({19, 37}, {dtype = dt}) * 3 + 0.1):detach()
        leaf.requires_grad = true
        local x = leaf:t()
        local gy = nd.randn({37, 19}, {dtype = dt})
        local fast = nd.grad((apply(name, x) * gy):sum(), {leaf})[1]
        local composed = nd.grad((apply(name, x) * gy):sum(), {leaf}, {create_graph = true})[1]:detach()
        assert.are.equal(0, max_diff(fast, composed), name .. " " .. dt)
        -- sum's backward hands the op an expanded (stride 0) gradient
        local fast1 = nd.grad(apply(name, x):sum(), {leaf})[1]
        local composed1 = nd.grad(apply(name, x):sum(), {leaf}, {create_graph = true})[1]:detach()
        assert.are.equal(0, max_diff(fast1, composed1), name .. " " .. dt .. " (broadcast gradient)")
      end
    end
  end)

  it("runs as one pass: the gradient is the only tensor it makes", function()
    local x = nd.randn({64, 64}, {requires_grad = true})
    local function bytes(opts)
      local report = nd.profile(function() nd.grad(nd.F.gelu(x):sum(), {x}, opts) end)
      return report.by_name.gelu_backward.bytes
    end
    assert.are.equal(64 * 64 * 4, bytes())
    -- under create_graph the formula runs op by op, a tensor per op
    assert.is_true(bytes({create_graph = true}) >= 10 * 64 * 64 * 4)
  end)

  it("inside nd.compile the composed formula is captured (the compiler fuses it itself)", function()
    local x = nd.randn({6, 5}, {requires_grad = true})
    local step = nd.compile(function(t) return nd.grad(nd.F.gelu(t):sum(), {t})[1] end)
    local eager = nd.grad(nd.F.gelu(x):sum(), {x})[1]
    for _ = 1, 3 do assert.are.equal(0, max_diff(step(x), eager)) end
  end)
end)

describe("batch_norm's fused backward", function()
  before_each(function() nd.manual_seed(99) end)
  -- channel rows (sp >= 16) and slabs (cpu_batch_norm_slab.c: sp < 16),
  -- the last one big enough for threads
  local shapes = {{8, 3}, {4, 3, 5, 5}, {2, 4, 1, 1}, {3, 2, 2, 3, 2}, {300, 40, 2, 2}}
  for _, shape in ipairs(shapes) do
    for _, training in ipairs({true, false}) do
      for _, affine in ipairs({true, false}) do
        local label = ("shape {%s}, %s, %s"):format(table.concat(shape, ","),
          training and "training" or "evaluation", affine and "affine" or "no weights")
        it("equals the composed formulas: " .. label, function()
          local Cn = shape[2]
          local x = nd.randn(shape, {dtype = "float64", requires_grad = true})
          local w = affine and nd.randn({Cn}, {dtype = "float64", requires_grad = true}) or nil
          local b = affine and nd.randn({Cn}, {dtype = "float64", requires_grad = true}) or nil
          local rm, rv = nd.randn({Cn}, f64), nd.rand({Cn}, f64) + 0.5
          local y = nd.F.batch_norm(x, rm, rv, w, b, training)
          local gy = nd.randn(y.shape, f64)
          local loss = (y * gy):sum()
          local inputs = affine and {x, w, b} or {x}
          local fast = nd.grad(loss, inputs, {retain_graph = true})
          local composed = nd.grad(loss, inputs, {create_graph = true})
          for i = 1, #inputs do
            assert.is_true(max_diff(fast[i], composed[i]:detach()) < 1e-10,
              label .. ": gradient " .. i .. " differs by " .. max_diff(fast[i], composed[i]:detach()))
          end
        end)
      end
    end
  end

  for _, shape in ipairs({{300, 40}, {6, 5, 3, 3}, {300, 40, 2, 2}, {4, 3, 5, 5}}) do
    it(("forward (training) equals the composed formula, shape {%s}"):format(table.concat(shape, ",")),
      function()
        local x = nd.randn(shape, f64) * 3 + 1
        local Cn = shape[2]
        local w, b = nd.randn({Cn}, f64), nd.randn({Cn}, f64)
        local rm, rv = nd.zeros({Cn}, f64), nd.ones({Cn}, f64)
        local y = nd.F.batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5)
        -- channels last, flattened: mean and biased variance per column
        local perm = {1}
        for d = 3, #shape do perm[#perm + 1] = d end
        perm[#perm + 1] = 2
        local cols = x:permute(perm):reshape({-1, Cn})
        local mu = cols:mean(1)
        local var = ((cols - mu) * (cols - mu)):mean(1)
        local bshape = {1, Cn}
        for _ = 3, #shape do bshape[#bshape + 1] = 1 end
        local want = (x - mu:reshape(bshape)) / (var + 1e-5):sqrt():reshape(bshape) *
          w:reshape(bshape) + b:reshape(bshape)
        assert.is_true(max_diff(y, want) < 1e-10, "forward differs by " .. max_diff(y, want))
        local y32 = nd.F.batch_norm(x:float(), nil, nil, w:float(), b:float(), true)
        assert.is_true(max_diff(y32:double(), want) < 1e-4)
        -- the running statistics (unbiased variance), momentum 0.1
        local m = cols:size(1)
        assert.is_true(max_diff(rm, mu * 0.1) < 1e-10)
        assert.is_true(max_diff(rv, var * (m / (m - 1)) * 0.1 + 0.9) < 1e-10)
      end)
  end

  it("float32 agrees with float64", function()
    local x = nd.randn({16, 4, 3, 3}, f64)
    local w = nd.rand({4}, f64) + 0.5
    local function gx(dt)
      local xv = x:to(dt):requires_grad_()
      local y = nd.F.batch_norm(xv, nil, nil, w:to(dt), nil, true)
      local gy = nd.arange(1, y:numel() + 1, 1, {dtype = dt}):reshape(y.shape):sin()
      return nd.grad((y * gy):sum(), {xv})[1]
    end
    assert.is_true(max_diff(gx("float32"):double(), gx("float64")) < 1e-4)
  end)
end)

-- layer_norm's rows (cpu_norm.c): sums vectorised in double lanes, the
-- float32 rows built for AVX-512 / AVX2 / baseline. Widths with every
-- vector remainder, a shifted mean (a float accumulator would lose it),
-- enough rows for threads, and each affine combination.
describe("layer_norm's vectorised rows", function()
  before_each(function() nd.manual_seed(7) end)
  for _, shape in ipairs({{5, 37}, {40, 777}, {1100, 64}, {3, 1}}) do
    for _, affine in ipairs({"w,b", "w", "b", "none"}) do
      local label = ("shape {%s}, %s"):format(table.concat(shape, ","), affine)
      it("float64 equals the composed formula, float32 agrees: " .. label, function()
        local cols = shape[2]
        local x = nd.randn(shape, f64) * 2 + 50
        local w = affine:find("w") and nd.randn({cols}, f64) or nil
        local b = affine:find("b") and nd.randn({cols}, f64) or nil
        local gy = nd.randn(shape, f64)
        local mu = x:mean(2, true)
        local xh = (x - mu) / ((((x - mu) * (x - mu)):mean(2, true) + 1e-5):sqrt())
        local want = xh
        if w then want = want * w end
        if b then want = want + b end
        local function run(dt)
          local xv = x:to(dt):requires_grad_()
          local wv = w and w:to(dt):requires_grad_() or nil
          local bv = b and b:to(dt):requires_grad_() or nil
          local y = nd.F.layer_norm(xv, {cols}, wv, bv, 1e-5)
          local inputs = {xv}
          if wv then inputs[#inputs + 1] = wv end
          if bv then inputs[#inputs + 1] = bv end
          return y, nd.grad((y * gy:to(dt)):sum(), inputs)
        end
        local y64, g64 = run("float64")
        assert.is_true(max_diff(y64, want) < 1e-10, label .. ": forward differs by " .. max_diff(y64, want))
        -- the gradients against the composed formulas (create_graph runs them)
        local xv = x:clone():requires_grad_()
        local wv = w and w:clone():requires_grad_() or nil
        local bv = b and b:clone():requires_grad_() or nil
        local inputs = {xv}
        if wv then inputs[#inputs + 1] = wv end
        if bv then inputs[#inputs + 1] = bv end
        local composed = nd.grad((nd.F.layer_norm(xv, {cols}, wv, bv, 1e-5) * gy):sum(), inputs,
                                 {create_graph = true})
        for i = 1, #inputs do
          assert.is_true(max_diff(g64[i], composed[i]:detach()) < 1e-9,
            label .. ": gradient " .. i .. " differs by " .. max_diff(g64[i], composed[i]:detach()))
        end
        local y32, g32 = run("float32")
        assert.is_true(max_diff(y32:double(), y64) < 2e-4, label .. ": float32 forward differs by " ..
          max_diff(y32:double(), y64))
        for i = 1, #g64 do
          local tol = 2e-4 * (1 + g64[i]:abs():max():item())
          assert.is_true(max_diff(g32[i]:double(), g64[i]) < tol,
            label .. ": float32 gradient " .. i .. " differs by " .. max_diff(g32[i]:double(), g64[i]))
        end
      end)
    end
  end
end)

-- Without the small kernel (NEEDLE_NO_SMALL_GEMM=1; on AVX2 CPUs above its 24
-- rows) the float32 fused linear runs needle's GEMM, which adds the bias
-- and applies relu to each tile as its last K block is stored (cpu_gemm.c):
-- the same float operations as the product followed by a pass over it, so the
-- bits must equal matmul + bias (+ relu), and both must agree with float64.
describe("the fused linear's GEMM epilogue (bias, relu)", function()
  it("equals matmul + bias (+ relu) bit for bit over tile, K-block and N-block edges", function()
    local S = require "spec.helpers.shell"
    local out = S.run_program("NEEDLE_NO_SMALL_GEMM=1", [[
      local nd = require "needle"
      nd.manual_seed(6)
      local function max_diff(a, b) return (a:double() - b:double()):abs():max():item() end
      local bad, n = {}, 0
      for _, M in ipairs({385, 500}) do
        for _, K in ipairs({7, 385, 800}) do
          for _, O in ipairs({1, 33, 70, 2100}) do
            local x, w, b = nd.randn({M, K}), nd.randn({O, K}), nd.randn({O})
            local plain = x:matmul(w:t()) + b
            local lin = nd.F.linear(x, w, b)
            local what = ("M %d K %d O %d"):format(M, K, O)
            local want = x:double():matmul(w:double():t()) + b:double()
            if max_diff(lin, plain) ~= 0 or
               max_diff(nd.F.fused_linear(x, w, b, {activation = "relu"}), plain:relu()) ~= 0 or
               max_diff(nd.F.fused_linear(x, w, nil, {activation = "relu"}), x:matmul(w:t()):relu()) ~= 0 or
               max_diff(lin:double(), want) >= 1e-5 * math.sqrt(K) * 4 then
              bad[#bad + 1] = what
            end
            n = n + 1
          end
        end
      end
      print(("checked %d, differ: %s"):format(n, table.concat(bad, "; ")))
    ]])
    assert.truthy(out:match("checked 24, differ: %s*$"), out)
  end)
end)

describe("the small-M float32 linear kernel", function()
  before_each(function() nd.manual_seed(5) end)

  local function ref(x, w, b, relu)
    local y = x:double():matmul(w:double():t())
    if b then y = y + b:double() end
    if relu then y = y:relu() end
    return y
  end

  for _, M in ipairs({1, 2, 3, 7, 8, 16, 17, 20, 24, 41, 130}) do
    it(("equals the BLAS product for M = %d over K and O remainders"):format(M), function()
      for _, K in ipairs({1, 7, 8, 13, 16, 17, 31, 512}) do
        for _, O in ipairs({1, 3, 4, 5, 130}) do
          local x, w, b = nd.randn({M, K}), nd.randn({O, K}), nd.randn({O})
          local tol = 1e-5 * math.sqrt(K) * 4
          local y = nd.F.linear(x, w, b)
          assert.are.same({M, O}, y.shape)
          local d = max_diff(y:double(), ref(x, w, b, false))
          assert.is_true(d < tol, ("M %d K %d O %d: off by %g"):format(M, K, O, d))
          assert.is_true(max_diff(nd.F.linear(x, w):double(), ref(x, w, nil, false)) < tol)
          local r = nd.F.fused_linear(x, w, b, {activation = "relu"})
          assert.is_true(max_diff(r:double(), ref(x, w, b, true)) < tol)
          assert.is_true(r:min():item() >= 0)
        end
      end
    end)
  end

  it("linear's autograd node: finite differences, first and second order, 1-D to 3-D inputs",
    function()
      local lin = function(x, w, b) return nd.F.linear(x, w, b) end
      C.check(lin, {leaf({4}), leaf({3, 4}), leaf({3})})
      C.check(lin, {leaf({2, 4}), leaf({3, 4})})
      C.check(lin, {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})})
      C.check(function(x, w, b) return nd.F.linear(x:transpose(2, 3), w, b) end,
        {leaf({2, 4, 3}), leaf({5, 4}), leaf({5})})
      C.check2(function(x, w, b) return nd.F.linear(x, w, b):tanh() end,
        {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})})
      C.check(function(x, w, b) return nd.F.fused_linear(x, w, b, {activation = "relu"}) end,
        {leaf({3, 4}), leaf({5, 4}), leaf({5})})
      local x = nd.randn({2, 4}, {requires_grad = true})
      assert.are.equal("linear", nd.F.linear(x, nd.randn({3, 4})).grad_fn)
    end)

  it("its AVX2 kernel (NEEDLE_GEMM=avx2 on an AVX-512 CPU) agrees with the float64 product too", function()
    local S = require "spec.helpers.shell"
    local out = S.run_program("NEEDLE_GEMM=avx2", [[
      local nd = require "needle"
      nd.manual_seed(3)
      local worst = 0
      for _, M in ipairs({1, 5, 20}) do
        for _, K in ipairs({7, 16, 300}) do
          local x, w, b = nd.randn({M, K}), nd.randn({9, K}), nd.randn({9})
          local y = nd.F.fused_linear(x, w, b, {activation = "relu"}):double()
          local r = (x:double():matmul(w:double():t()) + b:double()):relu()
          worst = math.max(worst, ((y - r):abs():max()):item() / math.sqrt(K))
        end
      end
      print(("worst %.3g"):format(worst))
    ]])
    local worst = tonumber(out:match("worst (%S+)"))
    assert.is_truthy(worst, out)
    assert.is_true(worst < 4e-5, out)
  end)

  -- on AMD Zen 4 it takes every M, x in slabs of about 256 KB (cpu_linear_small.c); the
  -- parts below have over 384 rows, so elsewhere both sides run the GEMM
  it("takes many rows in slabs of x: each row's bits as computed alone, for any thread count", function()
    for _, K in ipairs({7, 385, 800, 3000}) do
      for _, O in ipairs({1, 6, 33, 70}) do
        local M = 2000
        local x, w, b = nd.randn({M, K}), nd.randn({O, K}), nd.randn({O})
        local what = ("K %d O %d"):format(K, O)
        local y = nd.F.fused_linear(x, w, b, {activation = "relu"})
        local d = max_diff(y:double(), ref(x, w, b, true))
        assert.is_true(d < 1e-5 * math.sqrt(K) * 4, what .. ": off by " .. d)
        -- rows across a slab edge, computed alone, and the whole on one thread
        for _, r in ipairs({{1, 400}, {777, 1200}, {1601, 2000}}) do
          local part = nd.F.fused_linear(x[{{r[1], r[2]}}], w, b, {activation = "relu"})
          assert.are.equal(0, max_diff(part, y[{{r[1], r[2]}}]), what)
        end
        local threads = nd.get_num_threads()
        nd.set_num_threads(1)
        local one = nd.F.fused_linear(x, w, b, {activation = "relu"})
        nd.set_num_threads(threads)
        assert.are.equal(0, max_diff(one, y), what .. ": one thread")
      end
    end
  end)

  it("gives the same result as the large-M (BLAS) path row by row", function()
    local x, w, b = nd.randn({40, 300}), nd.randn({70, 300}), nd.randn({70})
    local big = nd.F.linear(x, w, b)        -- 40 rows: BLAS
    local small = nd.F.linear(x[{{1, 8}}], w, b) -- 8 rows: the kernel
    assert.is_true(max_diff(small, big[{{1, 8}}]) < 1e-4)
  end)
end)

-- GCC dispatches a target_clones("arch=<cpu>") clone only on that exact CPU
-- model: "arch=haswell" kept the AVX2 softmax and cross-entropy on their SSE2
-- clones on every AMD and newer Intel CPU. Clones must name an ISA level
-- (arch=x86-64-v3) or features (avx2), which are dispatched by cpuid bits.
describe("multiversioned kernels", function()
  it("name ISA levels or features, never a CPU model", function()
    local S = require "spec.helpers.shell"
    local _, root = S.needle_lua()
    local p = assert(io.popen("grep -rn 'target_clones' " .. S.q(root .. "/src") .. " 2>/dev/null"))
    local n = 0
    for line in p:lines() do
      n = n + 1
      for arch in line:gmatch('"arch=([%w%-]+)"') do
        assert.truthy(arch:match("^x86%-64%-v%d$"), "a clone for one CPU model: " .. line)
      end
    end
    p:close()
    assert.is_true(n >= 1, "no target_clones found (ND_ISA_CLONES in cpu_math.h)")
    -- the kernels take their clones through ND_ISA_CLONES (cpu_math.h)
    local users = {}
    p = assert(io.popen("grep -rln 'ND_ISA_CLONES' " .. S.q(root .. "/src/backends/cpu") .. " 2>/dev/null"))
    for path in p:lines() do users[path:match("[^/]+$")] = true end
    p:close()
    for _, file in ipairs({"cpu_softmax.c", "cpu_norm.c", "cpu_vmath.c"}) do
      assert.is_true(users[file] == true, "the clones of " .. file .. " were not found")
    end
  end)
end)
