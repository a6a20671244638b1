-- conv_spec.lua - conv2d, conv_transpose2d, max/avg/adaptive pooling and
-- needle's dilate/undilate: float64 finite-difference gradient checks
-- (stride, padding, dilation, groups, non-contiguous and unbatched inputs),
-- second-order checks, values and error messages. Outputs against PyTorch:
-- spec/torch_conv_fixtures_spec.lua.
local nd = require "needle"
local G = require "spec.helpers.gradcheck"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains
local leaf = G.leaf
-- check2's allow_unused: a bias's gradient does not depend on any leaf
local C = G.bind(assert, {atol = 1e-5, rtol = 1e-4, allow_unused = true})
local check, check2 = C.check, C.check2

describe("conv2d", function()
  before_each(function() nd.manual_seed(4321) end)

  local cases = {
    {"padding 1 with bias", {2, 3, 5, 5}, {4, 3, 3, 3}, true, {padding = 1}},
    {"stride {2,1}, padding {1,0}, rectangular kernel", {2, 3, 5, 4}, {2, 3, 3, 2}, true,
      {stride = {2, 1}, padding = {1, 0}}},
    {"groups 2 and dilation 2", {1, 4, 6, 6}, {4, 2, 2, 2}, true, {padding = 1, dilation = 2, groups = 2}},
    {"depthwise (groups = channels), stride 2, no bias", {1, 3, 5, 5}, {6, 1, 3, 3}, false,
      {stride = 2, padding = 1, groups = 3}},
    {"1x1 (no im2col)", {2, 3, 3, 3}, {4, 3, 1, 1}, true, {}},
    {"dilation {2,1}, stride 3: trailing rows unused", {1, 2, 7, 6}, {2, 2, 2, 3}, true,
      {stride = 3, dilation = {2, 1}}},
  }
  for _, c in ipairs(cases) do
    it("gradcheck: " .. c[1], function()
      local leaves = {leaf(c[2]), leaf(c[3])}
      if c[4] then leaves[3] = leaf({c[3][1]}) end
      check(function(x, w, b) return nd.conv2d(x, w, b, c[5]) end, leaves)
    end)
  end

  it("gradcheck: non-contiguous input and weight (transposed views)", function()
    check(function(x, w) return nd.conv2d(x:transpose(3, 4), w:transpose(3, 4), nil, {padding = {0, 1}}) end,
      {leaf({2, 2, 5, 4}), leaf({3, 2, 2, 3})})
  end)

  it("gradcheck: unbatched (C, H, W) input", function()
    check(function(x, w, b)
      local y = nd.conv2d(x, w, b, {padding = 1})
      assert.are.same({3, 4, 4}, y.shape)
      return y
    end, {leaf({2, 4, 4}), leaf({3, 2, 3, 3}), leaf({3})})
  end)

  it("second order (create_graph) with groups, stride and padding", function()
    check2(function(x, w, b) return nd.conv2d(x, w, b, {stride = 2, padding = 1, groups = 2}) end,
      {leaf({1, 2, 4, 4}), leaf({4, 1, 3, 3}), leaf({4})})
  end)

  it("second order of a non-linear function of a dilated conv", function()
    check2(function(x, w) return nd.conv2d(x, w, nil, {dilation = 2}):tanh() end,
      {leaf({1, 2, 5, 5}), leaf({2, 2, 2, 2})})
  end)

  it("matches a direct sum in float64", function()
    local x, w, b = nd.randn({1, 2, 4, 5}, {dtype = "float64"}), nd.randn({3, 2, 2, 3}, {dtype = "float64"}),
      nd.randn({3}, {dtype = "float64"})
    local y = nd.conv2d(x, w, b, {stride = {1, 2}, padding = 1, dilation = {2, 1}})
    local X, Wt, B, Y = x:totable(), w:totable(), b:totable(), y:totable()
    assert.are.same({1, 3, 4, 3}, y.shape)
    for o = 1, 3 do
      for i = 1, 4 do
        for j = 1, 3 do
          local s = B[o]
          for c = 1, 2 do
            for ki = 1, 2 do
              for kj = 1, 3 do
                local h, v = (i - 1) - 1 + (ki - 1) * 2 + 1, (j - 1) * 2 - 1 + (kj - 1) + 1
                if h >= 1 and h <= 4 and v >= 1 and v <= 5 then s = s + X[1][c][h][v] * Wt[o][c][ki][kj] end
              end
            end
          end
          assert.is_true(math.abs(Y[1][o][i][j] - s) < 1e-12)
        end
      end
    end
  end)

  it("records conv2d as grad_fn and accepts the options in the bias's place", function()
    local x, w = nd.randn({1, 2, 4, 4}), nd.randn({3, 2, 3, 3}, {requires_grad = true})
    local y = nd.conv2d(x, w, {padding = 1})
    assert.are.equal("conv2d", y.grad_fn)
    assert.are.same({1, 3, 4, 4}, y.shape)
    assert.are.same({1, 3, 2, 2}, nd.conv2d(x, w).shape)
  end)

  it("works with an empty batch", function()
    local y = nd.conv2d(nd.zeros({0, 2, 4, 4}), nd.zeros({3, 2, 3, 3}))
    assert.are.same({0, 3, 2, 2}, y.shape)
  end)

  describe("errors", function()
    local x = nd.zeros({1, 3, 5, 5})
    it("names the channel mismatch", function()
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({8, 4, 3, 3})),
        "needle.conv2d: input has 3 channels but weight expects 4 (weight shape {8,4,3,3}, groups 1)")
      assert_contains(errmsg(nd.conv2d, nd.zeros({1, 4, 5, 5}), nd.zeros({8, 4, 3, 3}), nil, {groups = 2}),
        "input has 4 channels but weight expects 8 (weight shape {8,4,3,3}, groups 2)")
    end)
    it("groups that do not divide the channels", function()
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({4, 1, 3, 3}), nil, {groups = 2}),
        "needle.conv2d: groups 2 does not divide the input's 3 channels (input shape {1,3,5,5})")
      assert_contains(errmsg(nd.conv2d, nd.zeros({1, 4, 5, 5}), nd.zeros({3, 2, 3, 3}), nil, {groups = 2}),
        "out_channels 3 (weight shape {3,2,3,3}) is not divisible by groups 2")
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({3, 3, 3, 3}), nil, {groups = 0}),
        "groups must be >= 1, got 0")
    end)
    it("a kernel larger than the padded input", function()
      assert_contains(errmsg(nd.conv2d, nd.zeros({1, 1, 2, 2}), nd.zeros({1, 1, 3, 3})),
        "needle.conv2d: kernel size 3x3 is larger than the padded input 2x2 (input shape {1,1,2,2}, padding {0,0})")
      assert_contains(errmsg(nd.conv2d, nd.zeros({1, 1, 4, 4}), nd.zeros({1, 1, 3, 3}), nil, {dilation = 2}),
        "kernel size 3x3 (5x5 dilated) is larger than the padded input 4x4")
      -- padding makes it fit
      assert.are.same({1, 1, 2, 2}, nd.conv2d(nd.zeros({1, 1, 4, 4}), nd.zeros({1, 1, 3, 3}), nil,
        {dilation = 2, padding = 1}).shape)
    end)
    it("stride, dilation and padding out of range", function()
      local w = nd.zeros({2, 3, 3, 3})
      assert_contains(errmsg(nd.conv2d, x, w, nil, {stride = 0}), "needle.conv2d: stride must be >= 1, got {0,0}")
      assert_contains(errmsg(nd.conv2d, x, w, nil, {dilation = {1, 0}}), "dilation must be >= 1, got {1,0}")
      assert_contains(errmsg(nd.conv2d, x, w, nil, {padding = -1}), "padding must be >= 0, got {-1,-1}")
      assert_contains(errmsg(nd.conv2d, x, w, nil, {stride = {1, 2, 3}}),
        "stride must be an integer or a pair {h, w}, got a table of 3 entries")
      assert_contains(errmsg(nd.conv2d, x, w, nil, {stride = 1.5}), "stride must be an integer")
      assert_contains(errmsg(nd.conv2d, x, w, nil, {strides = 2}),
        "needle.conv2d: unknown option 'strides' (valid: dilation, groups, padding, stride)")
    end)
    it("shapes and dtypes", function()
      assert_contains(errmsg(nd.conv2d, nd.zeros({3, 5}), nd.zeros({2, 3, 3, 3})),
        "needle.conv2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {3,5}")
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({2, 3, 3})),
        "expected a 4-D weight (out_channels, in_channels/groups, kH, kW), got shape {2,3,3}")
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({2, 3, 3, 3}), nd.zeros({3})),
        "bias must have shape {2} (out_channels), got {3}")
      assert_contains(errmsg(nd.conv2d, x, nd.zeros({2, 3, 3, 3}, {dtype = "float64"})),
        "input (float32) and weight (float64) must have the same dtype")
      assert_contains(errmsg(nd.conv2d, nd.zeros({1, 3, 5, 5}, {dtype = "int64"}), nd.zeros({2, 3, 3, 3})),
        "expected a float32 or float64 input, got int64")
    end)
  end)
end)

describe("conv_transpose2d", function()
  before_each(function() nd.manual_seed(8765) end)

  local cases = {
    {"stride 2, padding 1, output_padding 1, groups 2, bias", {1, 4, 3, 3}, {4, 2, 3, 3}, true,
      {stride = 2, padding = 1, output_padding = 1, groups = 2}},
    {"dilation 2 with output_padding 1 >= stride", {1, 2, 3, 3}, {2, 2, 2, 2}, false,
      {dilation = 2, output_padding = 1}},
    {"rectangular stride and padding", {2, 2, 2, 3}, {2, 3, 2, 3}, true, {stride = {1, 2}, padding = {0, 1}}},
  }
  for _, c in ipairs(cases) do
    it("gradcheck: " .. c[1], function()
      local leaves = {leaf(c[2]), leaf(c[3])}
      if c[4] then leaves[3] = leaf({c[3][2] * (c[5].groups or 1)}) end
      check(function(x, w, b) return nd.conv_transpose2d(x, w, b, c[5]) end, leaves)
    end)
  end

  it("gradcheck: non-contiguous and unbatched input", function()
    check(function(x, w) return nd.conv_transpose2d(x:transpose(2, 3), w, nil, {stride = 2}) end,
      {leaf({2, 3, 2}), leaf({2, 1, 2, 2})})
  end)

  it("output size follows PyTorch's formula", function()
    local y = nd.conv_transpose2d(nd.zeros({1, 2, 4, 5}), nd.zeros({2, 3, 3, 2}), nil,
      {stride = {2, 3}, padding = {1, 0}, output_padding = {1, 2}, dilation = {1, 2}})
    -- (4-1)*2 - 2 + 1*(3-1) + 1 + 1 = 8; (5-1)*3 - 0 + 2*(2-1) + 2 + 1 = 17
    assert.are.same({1, 3, 8, 17}, y.shape)
  end)

  it("is the adjoint of conv2d: <conv2d(x, w), y> == <x, conv_transpose2d(y, w)>", function()
    local x = nd.randn({2, 4, 8, 6}, {dtype = "float64"}) -- row 8 unused by conv2d: output_padding 1
    local w = nd.randn({6, 2, 3, 2}, {dtype = "float64"})
    local opts = {stride = {2, 1}, padding = {1, 1}, dilation = {1, 2}, groups = 2}
    local y = nd.conv2d(x, w, nil, opts)
    local r = nd.randn(y.shape, {dtype = "float64"})
    local topts = {stride = opts.stride, padding = opts.padding, dilation = opts.dilation, groups = 2,
      output_padding = {1, 0}}
    local xt = nd.conv_transpose2d(r, w, nil, topts)
    assert.are.same(x.shape, xt.shape)
    assert.is_true(math.abs((y * r):sum():item() - (x * xt):sum():item()) < 1e-9)
  end)

  it("second order", function()
    check2(function(x, w, b) return nd.conv_transpose2d(x, w, b, {stride = 2, padding = 1, output_padding = 1}) end,
      {leaf({1, 2, 2, 2}), leaf({2, 1, 3, 3}), leaf({1})})
  end)

  it("errors", function()
    local x = nd.zeros({1, 4, 3, 3})
    assert_contains(errmsg(nd.conv_transpose2d, x, nd.zeros({3, 2, 3, 3})),
      "needle.conv_transpose2d: input has 4 channels but weight expects 3 (weight shape {3,2,3,3}, groups 1)")
    assert_contains(errmsg(nd.conv_transpose2d, x, nd.zeros({4, 2, 3, 3}), nil, {stride = 2, output_padding = 2}),
      "needle.conv_transpose2d: output_padding {2,2} must be smaller than either stride {2,2} or dilation {1,1}")
    assert_contains(errmsg(nd.conv_transpose2d, x, nd.zeros({4, 2, 3, 3}), nil, {groups = 3}),
      "groups 3 does not divide the input's 4 channels")
    assert_contains(errmsg(nd.conv_transpose2d, x, nd.zeros({4, 2, 3, 3}), nd.zeros({2}), {groups = 2}),
      "bias must have shape {4} (out_channels), got {2}")
    assert_contains(errmsg(nd.conv_transpose2d, x, nd.zeros({4, 2, 3, 3}), nil, {padding = 3}),
      "needle.conv_transpose2d: output size along H would be -1")
  end)
end)

describe("max_pool2d", function()
  before_each(function() nd.manual_seed(1357) end)

  local cases = {
    {"kernel 2", {2, 2, 4, 4}, 2, {}},
    {"kernel 3, stride 2, padding 1, ceil_mode", {1, 2, 6, 6}, 3, {stride = 2, padding = 1, ceil_mode = true}},
    {"dilation 2, rectangular", {1, 1, 7, 6}, {2, 3}, {stride = 1, padding = 1, dilation = {2, 1}}},
  }
  for _, c in ipairs(cases) do
    it("gradcheck: " .. c[1], function()
      check(function(x) return nd.max_pool2d(x, c[3], c[4]) end, {leaf(c[2])})
    end)
  end

  it("gradcheck: non-contiguous and unbatched input", function()
    check(function(x) return nd.max_pool2d(x:transpose(2, 3), 2, {stride = 1}) end, {leaf({2, 5, 4})})
  end)

  it("ties send the whole gradient to the first maximum (row-major)", function()
    local x = nd.tensor({{{{1, 3, 3, 0}, {3, 2, 3, 3}}}}, {requires_grad = true})
    local y, ix = nd.max_pool2d(x, 2, {return_indices = true})
    assert.are.same({{{{3, 3}}}}, y:totable())
    assert.are.same({{{{2, 3}}}}, ix:totable()) -- 1-based flat within the plane
    local g = nd.grad(y:sum(), x)
    assert.are.same({{{{0, 1, 1, 0}, {0, 0, 0, 0}}}}, g:totable())
  end)

  it("indices are 1-based flat positions (h-1)*W + w within each plane", function()
    local x = nd.arange(2 * 3 * 4):double():reshape({2, 3, 4})
    local y, ix = nd.max_pool2d(x, {3, 2}, {stride = {1, 2}, return_indices = true})
    assert.are.same({{{9, 11}}, {{21, 23}}}, y:totable())
    assert.are.same({{{10, 12}}, {{10, 12}}}, ix:totable())
  end)

  it("NaN propagates", function()
    local y = nd.max_pool2d(nd.tensor({{{1, 0 / 0}, {3, 2}}}), 2)
    assert.is_true(y:item() ~= y:item())
  end)

  it("equals a window-by-window reference: rows wider than the kernel's 256-output chunks, ties, NaN, -inf, dilation", function()
    -- values from a small set, so windows hold ties; a few NaN and -inf
    local vals = {-2, -1, 0, 1, 2, 1 / 0 * -1}
    for _, c in ipairs({
      {{1, 2, 5, 600}, 3, {stride = 1, padding = 1}},
      {{2, 1, 7, 530}, {3, 2}, {stride = {2, 1}, padding = {1, 0}, dilation = {1, 2}}},
      {{1, 1, 4, 300}, 2, {stride = 2}},
    }) do
      local shape, k, opts = c[1], c[2], c[3]
      local n = shape[1] * shape[2] * shape[3] * shape[4]
      local t = {}
      for i = 1, n do t[i] = i % 97 == 0 and 0 / 0 or vals[(i * 7919) % #vals + 1] end
      local x = nd.tensor(t):view(shape)
      local o = {return_indices = true}
      for key, v in pairs(opts) do o[key] = v end
      local y, ix = nd.max_pool2d(x, k, o)
      local kh, kw = type(k) == "table" and k[1] or k, type(k) == "table" and k[2] or k
      local function pair(v, d) if v == nil then return d, d end; if type(v) == "table" then return v[1], v[2] end; return v, v end
      local sh, sw = pair(opts.stride, 1)
      local ph, pw = pair(opts.padding, 0)
      local dh, dw = pair(opts.dilation, 1)
      local X, Y, I = x:totable(), y:totable(), ix:totable()
      local H, W = shape[3], shape[4]
      for a = 1, shape[1] do for b = 1, shape[2] do
        for oh = 0, y:size(3) - 1 do for ow = 0, y:size(4) - 1 do
          local best, bi = -math.huge, nil
          for i = 0, kh - 1 do for j = 0, kw - 1 do
            local h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
            if h >= 0 and h < H and w >= 0 and w < W then
              local v = X[a][b][h + 1][w + 1]
              bi = bi or h * W + w
              if v > best or v ~= v then best, bi = v, h * W + w end
            end
          end end
          local got, gi = Y[a][b][oh + 1][ow + 1], I[a][b][oh + 1][ow + 1]
          assert.is_true(got == best or (got ~= got and best ~= best),
            ("value at %d,%d,%d,%d: %s vs %s"):format(a, b, oh, ow, got, best))
          assert.are.equal(bi + 1, gi, ("index at %d,%d,%d,%d"):format(a, b, oh, ow))
        end end
      end end
    end
  end)

  it("second order through max_pool2d_backward and its gather", function()
    check2(function(x) return nd.max_pool2d(x, 2, {stride = 1}) ^ 2 end, {leaf({1, 1, 3, 4})})
  end)

  it("errors", function()
    local x = nd.zeros({1, 1, 4, 4})
    assert_contains(errmsg(nd.max_pool2d, x, 3, {padding = 2}),
      "needle.max_pool2d: padding {2,2} must be at most half of kernel_size {3,3}")
    assert_contains(errmsg(nd.max_pool2d, x, 5),
      "needle.max_pool2d: output size 0x0 is too small")
    assert_contains(errmsg(nd.max_pool2d, x, 0), "kernel_size must be >= 1, got {0,0}")
    assert_contains(errmsg(nd.max_pool2d, x), "kernel_size is required")
    assert_contains(errmsg(nd.max_pool2d, x, 2, {stride = 0}), "stride must be >= 1")
    assert_contains(errmsg(nd.max_pool2d, x, 2, {return_index = true}), "unknown option 'return_index'")
    assert_contains(errmsg(nd.max_pool2d, nd.zeros({4, 4}), 2),
      "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {4,4}")
  end)
end)

describe("avg_pool2d and adaptive_avg_pool2d", function()
  before_each(function() nd.manual_seed(2468) end)

  local cases = {
    {"count_include_pad false, ceil_mode", 3, {stride = 2, padding = 1, ceil_mode = true, count_include_pad = false}},
    {"count_include_pad true, ceil_mode", 3, {stride = 2, padding = 1, ceil_mode = true}},
    {"rectangular", {2, 3}, {stride = {2, 1}, padding = {1, 1}}},
  }
  for _, c in ipairs(cases) do
    it("gradcheck: " .. c[1], function()
      check(function(x) return nd.avg_pool2d(x, c[2], c[3]) end, {leaf({1, 2, 5, 5})})
    end)
  end

  it("divisors with and without padding", function()
    local x = nd.ones({1, 1, 3, 3})
    assert.are.same({{{{4 / 9, 4 / 9}, {4 / 9, 4 / 9}}}},
      nd.avg_pool2d(x:double(), 3, {stride = 2, padding = 1}):totable())
    assert.are.same({{{{1, 1}, {1, 1}}}},
      nd.avg_pool2d(x, 3, {stride = 2, padding = 1, count_include_pad = false}):totable())
  end)

  it("gradcheck: adaptive, sizes that do not divide the input; non-contiguous; unbatched", function()
    check(function(x) return nd.adaptive_avg_pool2d(x, {3, 4}) end, {leaf({1, 2, 7, 5})})
    check(function(x) return nd.adaptive_avg_pool2d(x:transpose(3, 4), 3) end, {leaf({2, 1, 5, 4})})
    check(function(x) return nd.adaptive_avg_pool2d(x, {4, 5}) end, {leaf({1, 2, 3})})
  end)

  it("adaptive windows floor(i*H/oh) .. ceil((i+1)*H/oh)", function()
    local x = nd.arange(5):double():reshape({1, 1, 5})
    -- windows {0,1}, {1,2,3}, {3,4}
    assert.are.same({{{0.5, 2, 3.5}}}, nd.adaptive_avg_pool2d(x, {1, 3}):totable())
  end)

  it("second order", function()
    check2(function(x) return nd.avg_pool2d(x, 2, {stride = 1, padding = 1}) ^ 2 end, {leaf({1, 1, 3, 3})})
    check2(function(x) return nd.adaptive_avg_pool2d(x, {2, 2}) ^ 2 end, {leaf({1, 1, 3, 3})})
  end)

  it("errors", function()
    local x = nd.zeros({1, 1, 4, 4})
    assert_contains(errmsg(nd.avg_pool2d, x, 2, {padding = 2}),
      "needle.avg_pool2d: padding {2,2} must be at most half of kernel_size {2,2}")
    assert_contains(errmsg(nd.avg_pool2d, x, 2, {dilation = 2}), "unknown option 'dilation'")
    assert_contains(errmsg(nd.adaptive_avg_pool2d, x, {-1, 2}),
      "needle.adaptive_avg_pool2d: output_size must be >= 0, got {-1,2}")
    assert_contains(errmsg(nd.adaptive_avg_pool2d, nd.zeros({1, 1, 0, 4}), 2),
      "expected non-empty (H, W) planes, got input shape {1,1,0,4}")
  end)
end)

describe("dilate and undilate (needle's semantics)", function()
  it("dilate follows each element with `dilation` zeros", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.same({{1, 0, 0, 2, 0, 0}, {3, 0, 0, 4, 0, 0}}, nd.dilate(x, 2, 2):totable())
    assert.are.same({{1, 0, 2, 0}, {0, 0, 0, 0}, {3, 0, 4, 0}, {0, 0, 0, 0}}, nd.dilate(x, {1, 2}, 1):totable())
    assert.are.same(x:totable(), nd.dilate(x, {}, 3):totable())
    assert.are.same({{1, 0, 2, 0}, {3, 0, 4, 0}}, x:dilate(-1, 1):totable())
    assert.are.equal("int64", nd.dilate(nd.tensor({1, 2}, {dtype = "int64"}), 1, 1).dtype)
  end)

  it("undilate keeps every (dilation+1)-th element and inverts dilate", function()
    local x = nd.arange(10):reshape({2, 5})
    assert.are.same({{0, 2, 4}, {5, 7, 9}}, nd.undilate(x, 2, 1):totable())
    local y = nd.randn({2, 3, 4})
    assert.are.same(y:totable(), nd.undilate(nd.dilate(y, {1, 3}, 2), {1, 3}, 2):totable())
    -- a new tensor, not a view
    local u = nd.undilate(x, 2, 0)
    u[1][1] = 100
    assert.are.equal(0, x[1][1]:item())
  end)

  it("gradcheck", function()
    check(function(x) return nd.dilate(x, {1, 3}, 2) end, {leaf({2, 3, 2})})
    check(function(x) return nd.undilate(x:transpose(1, 2), {1, 2}, 1) end, {leaf({5, 3})})
    check2(function(x) return nd.dilate(x, 2, 1):exp() end, {leaf({2, 2})})
  end)

  it("errors", function()
    local x = nd.zeros({2, 3})
    assert_contains(errmsg(nd.dilate, x, 1, -1), "needle.dilate: dilation must be >= 0, got -1")
    assert_contains(errmsg(nd.undilate, x, {2, -1}, 1), "needle.undilate: dim 2 is given twice")
    assert_contains(errmsg(nd.dilate, x, 3, 1), "needle.dilate:")
  end)
end)

-- Images with more than 1024 output pixels take the per-image GEMM path
-- (smaller ones one GEMM over the batch): check that path too, and that
-- both agree where a batch is split across them.
describe("conv on large images (per-image GEMM path)", function()
  it("conv2d gradients on a 36x36 image (34x34 = 1156 output pixels)", function()
    check(function(x, w, b) return nd.conv2d(x, w, b) end,
      {G.leaf({2, 1, 36, 36}), G.leaf({2, 1, 3, 3}), G.leaf({2})})
  end)
  it("conv_transpose2d gradients on a 33x33 input (1089 pixels)", function()
    check(function(x, w, b) return nd.conv_transpose2d(x, w, b) end,
      {G.leaf({1, 1, 33, 33}), G.leaf({1, 2, 2, 2}), G.leaf({2})})
  end)
  it("the two paths agree: a large image equals its tiles' convolutions", function()
    nd.manual_seed(3)
    local x = nd.randn({2, 3, 40, 40}, {dtype = "float64"})
    local w = nd.randn({4, 3, 3, 3}, {dtype = "float64"})
    local big = nd.conv2d(x, w, nil, {padding = 1})            -- 1600 pixels: per image
    local top = nd.conv2d(x[{":", ":", {1, 21}}], w, nil, {padding = 1}) -- 21x40 = 840: batched
    local d = (big[{":", ":", {1, 20}}] - top[{":", ":", {1, 20}}]):abs():max():item()
    assert(d < 1e-12, "paths differ by " .. d)
  end)
end)

-- The registry walk in gradcheck_spec.lua counts on these cases: they ran and passed.
describe("gradcheck coverage", function()
  it("every op conv_spec.lua claims in G.ELSEWHERE had a passing gradcheck here", function()
    G.assert_covers(assert, "conv_spec.lua")
  end)
end)
