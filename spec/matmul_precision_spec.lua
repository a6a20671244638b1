-- matmul_precision_spec.lua - float32 products on bfloat16 (issue 22, item 4
-- on the CPU): nd.set_float32_matmul_precision("medium") and nd.autocast.
--
--   build/needle-lua spec/run.lua spec/matmul_precision_spec.lua
--
-- Under "medium", on a CPU with AVX512_BF16, needle's GEMM rounds its
-- operands to bfloat16 and sums in float32: every product must then equal
-- the float64 product of the bfloat16-rounded operands (x:bfloat16(), an
-- independent conversion) to float32 summation error, and differ from the
-- float32 product by bfloat16's rounding. Without AVX512_BF16 those checks
-- are pending with the reason, and "medium" must change nothing.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local BF16 = nd.devices()[1].bf16

-- runs fn under precision p, restoring "highest"
local function at(p, fn)
  nd.set_float32_matmul_precision(p)
  local ok, r = pcall(fn)
  nd.set_float32_matmul_precision("highest")
  assert(ok, r)
  return r
end

-- c (float32) against the float64 product of the rounded operands: within
-- float32 summation error, (K + 2) 2^-24 sum_k |a_ik b_kj| per element
local function assert_bf16_product(c, a, b, what)
  local a16, b16 = a:bfloat16():double(), b:bfloat16():double()
  local ref = a16:matmul(b16)
  local bound = a16:abs():matmul(b16:abs()) * ((a:size(-1) + 2) * 2 ^ -24) + 1e-30
  local excess = ((c:double() - ref):abs() - bound):max():item()
  assert(excess <= 0, ("%s: off the bfloat16 product by %g more than float32 rounding"):format(what, excess))
end

describe("nd.set_float32_matmul_precision", function()
  after_each(function() nd.set_float32_matmul_precision("highest") end)

  it("takes PyTorch's three names and says which are valid", function()
    assert.are.equal("highest", nd.get_float32_matmul_precision())
    for _, p in ipairs({"high", "medium", "highest"}) do
      nd.set_float32_matmul_precision(p)
      assert.are.equal(p, nd.get_float32_matmul_precision())
    end
    assert_contains(errmsg(function() nd.set_float32_matmul_precision("low") end),
                    'set_float32_matmul_precision: expected "highest", "high" or "medium", got "low"')
    assert_contains(errmsg(function() nd.set_float32_matmul_precision(2) end), "got number")
  end)

  it("reports the CPU's bfloat16 support and the kernel in use", function()
    assert.is_boolean(BF16)
    local kernel = at("medium", function() return nd.devices()[1].gemm end)
    assert.is_boolean(nd.devices()[1].amx)
    if BF16 then
      assert.are.equal(nd.devices()[1].amx and "amx_bf16 32x32" or "avx512_bf16 12x32", kernel)
    else
      assert.is_false(nd.devices()[1].amx)
      assert.are.equal(nd.devices()[1].gemm, kernel)
    end
    assert.is_nil(nd.devices()[1].gemm:find("bf16")) -- "highest" again
  end)

  -- Both bfloat16 kernels where the CPU has them: AMX tiles (the default where Linux
  -- grants them) and vdpbf16ps (NEEDLE_AMX=0), each against float64 products of the
  -- rounded operands, over tile, pair-group (16 pairs) and K-block (1024) edges, in every
  -- layout; the prepacked weight's few-rows kernel gives each kernel's bits.
  local KERNELS = [[
    local nd = require "needle"
    nd.manual_seed(9)
    nd.set_float32_matmul_precision("medium")
    local excess, rows_diff, cases = -1, 0, 0
    for _, s in ipairs({{64, 64, 31}, {95, 70, 32}, {64, 97, 33}, {130, 64, 1024}, {64, 66, 1025}, {200, 130, 2081}}) do
      local M, N, K = s[1], s[2], s[3]
      for _, layout in ipairs({"nn", "tn", "nt"}) do
        local a = layout:sub(1, 1) == "t" and nd.randn({K, M}):t() or nd.randn({M, K})
        local b = layout:sub(2, 2) == "t" and nd.randn({N, K}):t() or nd.randn({K, N})
        local c = a:matmul(b):double()
        local ah, bh = a:bfloat16():double(), b:bfloat16():double()
        local bound = ah:abs():matmul(bh:abs()) * ((K + 2) * 2 ^ -24) + 1e-30
        excess = math.max(excess, ((c - ah:matmul(bh)):abs() - bound):max():item())
        cases = cases + 1
      end
      local w, x = nd.randn({N, K}), nd.randn({M, K})
      nd.autocast(function()
        local big = nd.F.linear(x, w)
        for m = 1, 4 do
          local small = nd.F.linear(x:narrow(1, 1, m):contiguous(), w)
          rows_diff = math.max(rows_diff, (big:narrow(1, 1, m) - small):abs():max():item())
        end
      end)
    end
    print(("kernel %s cases %d excess %.3g rows_diff %.3g"):format(nd.devices()[1].gemm, cases, excess, rows_diff))
  ]]
  for _, env in ipairs({"NEEDLE_AMX=", "NEEDLE_AMX=0"}) do
    it("multiplies bfloat16-rounded operands on each kernel the CPU has (" .. env .. ")", function()
      local out = require("spec.helpers.shell").run_program(env, KERNELS)
      local k, cases, excess, rows = out:match("kernel (.-) cases (%d+) excess (%S+) rows_diff (%S+)")
      assert.truthy(k, out)
      if not BF16 then
        assert.is_nil(k:find("bf16"), out)
        return
      end
      if env == "NEEDLE_AMX=0" then
        assert.are.equal("avx512_bf16 12x32", k)
      else
        assert.are.equal(nd.devices()[1].amx and "amx_bf16 32x32" or "avx512_bf16 12x32", k)
      end
      assert.are.equal(18, tonumber(cases))
      assert.is_true(tonumber(excess) <= 0, out)
      assert.are.equal(0, tonumber(rows), out) -- a row's bits whatever rows come with it
    end)
  end

  if not BF16 then
    pending("bfloat16 products: this CPU has no AVX512_BF16 (\"medium\" runs float32, checked below)")
    it("changes nothing without AVX512_BF16", function()
      nd.manual_seed(1)
      local a, b = nd.randn({33, 70}), nd.randn({70, 41})
      assert.are.same(a:matmul(b):totable(), at("medium", function() return a:matmul(b) end):totable())
    end)
    return
  end

  it("multiplies the bfloat16-rounded operands, summing in float32, for every shape and layout", function()
    nd.manual_seed(2)
    local shapes = {{64, 64, 1}, {64, 65, 2}, {65, 64, 3}, {70, 96, 29}, {129, 64, 384}, {64, 77, 385},
                    {100, 130, 771}, {300, 64, 29}, {64, 70, 1100}, {65, 66, 2049}}
    local differ = 0
    for _, s in ipairs(shapes) do
      local M, N, K = s[1], s[2], s[3]
      for _, layout in ipairs({"nn", "tn", "nt", "tt"}) do
        local a = layout:sub(1, 1) == "t" and nd.randn({K, M}):t() or nd.randn({M, K})
        local b = layout:sub(2, 2) == "t" and nd.randn({N, K}):t() or nd.randn({K, N})
        local c = at("medium", function() return a:matmul(b) end)
        local what = ("%dx%dx%d %s"):format(M, N, K, layout)
        assert_bf16_product(c, a, b, what)
        if (c - a:matmul(b)):abs():max():item() > 0 then differ = differ + 1 end
      end
    end
    assert.are.equal(#shapes * 4, differ, "medium's products differ from float32's")
  end)

  it("leaves products under 64 x 64 in float32, where packing would cost more than it saves", function()
    nd.manual_seed(6)
    for _, s in ipairs({{1, 768, 768}, {63, 200, 50}, {200, 63, 50}, {5, 5, 5}}) do
      local a, b = nd.randn({s[1], s[3]}), nd.randn({s[3], s[2]})
      assert.are.same(a:matmul(b):totable(), at("medium", function() return a:matmul(b) end):totable())
    end
  end)

  it("covers batched matmul, linear (bias and activation fused), conv2d and attention", function()
    nd.manual_seed(3)
    local a, b = nd.randn({3, 70, 50}), nd.randn({3, 50, 66})
    local c = at("medium", function() return a:matmul(b) end)
    for i = 1, 3 do assert_bf16_product(c[i], a[i], b[i], "batch " .. i) end
    -- linear: x w^T + b; relu (fused) after
    local x, w, bias = nd.randn({70, 96}), nd.randn({72, 96}), nd.randn({72})
    local y = at("medium", function() return nd.F.fused_linear(x, w, bias, {activation = "relu"}) end)
    local pre = y:clone()
    local ref_pre = x:bfloat16():double():matmul(w:bfloat16():double():t()) + bias:double()
    local bound = x:bfloat16():double():abs():matmul(w:bfloat16():double():abs():t()) * (98 * 2 ^ -24) + 1e-6
    local want = ref_pre:clamp(0, nil)
    assert.is_true(((pre:double() - want):abs() - bound):max():item() <= 0, "fused linear")
    for _, rows in ipairs({64, 65, 300}) do -- (the small-batch kernel gives way to the GEMM)
      local xr = nd.randn({rows, 96})
      local yr = at("medium", function() return nd.F.linear(xr, w) end)
      assert_bf16_product(yr, xr, w:t(), ("linear, %d rows"):format(rows))
    end
    for _, rows in ipairs({1, 4, 63}) do -- (fewer rows stream the float32 weight, as at "highest")
      local xr = nd.randn({rows, 96})
      assert.are.same(nd.F.linear(xr, w, bias):totable(),
                      at("medium", function() return nd.F.linear(xr, w, bias) end):totable())
    end
    -- conv2d through im2col + GEMM: the same as a product over patches (products of 32M
    -- multiply-adds or more: smaller ones stay float32, below)
    local img, k = nd.randn({2, 64, 40, 40}) * 0.2, nd.randn({64, 64, 3, 3}) * 0.05
    local conv = at("medium", function() return nd.F.conv2d(img, k) end)
    local ref = nd.F.conv2d(img:bfloat16():double(), k:bfloat16():double())
    local absref = nd.F.conv2d(img:bfloat16():double():abs(), k:bfloat16():double():abs())
    assert.is_true(((conv:double() - ref):abs() - absref * (578 * 2 ^ -24) - 1e-30):max():item() <= 0, "conv2d")
    assert.is_true((conv - nd.F.conv2d(img, k)):abs():max():item() > 0, "conv2d took bfloat16 products")
    -- small maps in a batch: the GEMM's columns are a chunk's images' pixels (32 x 49)
    local maps, k2 = nd.randn({32, 64, 7, 7}), nd.randn({64, 64, 3, 3}) * 0.05
    local c2 = at("medium", function() return nd.F.conv2d(maps, k2, nil, {padding = 1}) end)
    local r2 = nd.F.conv2d(maps:bfloat16():double(), k2:bfloat16():double(), nil, {padding = 1})
    local a2 = nd.F.conv2d(maps:bfloat16():double():abs(), k2:bfloat16():double():abs(), nil, {padding = 1})
    assert.is_true(((c2:double() - r2):abs() - a2 * (578 * 2 ^ -24) - 1e-30):max():item() <= 0, "conv2d, 7x7 maps")
    assert.is_true((c2 - nd.F.conv2d(maps, k2, nil, {padding = 1})):abs():max():item() > 0, "7x7 maps on bfloat16")
    -- small convolutions (products under 32M multiply-adds: ResNet9's) stay float32, where
    -- packing to bfloat16 costs more than it saves (cpu_conv_plan.h), forward and backward, on
    -- the packed path and on the im2col + GEMM one (a 1x1 over a large map, larger maps' grad_x)
    local smalls = {{{8, 64, 4, 4}, {64, 64, 3, 3}, 1}, {{8, 64, 32, 32}, {64, 64, 1, 1}, 0},
                    {{8, 16, 32, 32}, {64, 16, 3, 3}, 1}}
    for i, c in ipairs(smalls) do
      local xs, ks = nd.randn(c[1], {requires_grad = true}), nd.randn(c[2], {requires_grad = true})
      local function run()
        local y = nd.F.conv2d(xs, ks, nil, {padding = c[3]})
        local g = nd.grad((y * y):sum(), {xs, ks})
        return {y, g[1], g[2]}
      end
      local want, got = run(), at("medium", run)
      for j = 1, 3 do assert.are.same(want[j]:totable(), got[j]:totable(), ("small conv %d, result %d"):format(i, j)) end
    end
    -- attention's two products (the fused kernel, no gradient)
    local q, kk, v = nd.randn({1, 2, 80, 64}), nd.randn({1, 2, 80, 64}), nd.randn({1, 2, 80, 64})
    local o16 = at("medium", function() return nd.F.scaled_dot_product_attention(q, kk, v) end)
    local o32 = nd.F.scaled_dot_product_attention(q, kk, v)
    local gap = (o16 - o32):abs():max():item()
    assert.is_true(gap > 0 and gap < 0.05, "attention within bfloat16's rounding of float32's: " .. gap)
  end)

  it("keeps NaN and infinity", function()
    local a = nd.ones({70, 4})
    a[{2, 3}] = 0 / 0
    a[{5, 1}] = math.huge
    local c = at("medium", function() return a:matmul(nd.ones({4, 70})) end)
    assert.is_true(c[{2, 7}]:item() ~= c[{2, 7}]:item())
    assert.are.equal(math.huge, c[{5, 30}]:item())
    assert.are.equal(4, c[{1, 1}]:item())
  end)
end)

describe("nd.autocast", function()
  after_each(function() nd.set_float32_matmul_precision("highest") end)

  it("runs the scope's products at medium precision, restores the setting, and passes results through", function()
    local seen
    local a, b = nd.autocast(function()
      seen = nd.get_float32_matmul_precision()
      return 1, 2
    end)
    assert.are.same({"medium", 1, 2}, {seen, a, b})
    assert.are.equal("highest", nd.get_float32_matmul_precision())
    -- restored after an error, which passes through unchanged
    local err = errmsg(function() nd.autocast(function() error("boom", 0) end) end)
    assert.are.equal("boom", err)
    assert.are.equal("highest", nd.get_float32_matmul_precision())
    -- nested, and enabled = false
    -- nested; enabled = false gives float32 products, inside an outer scope too (as PyTorch's)
    nd.autocast(function()
      nd.autocast(function() end)
      assert.are.equal("medium", nd.get_float32_matmul_precision())
      nd.autocast(function() assert.are.equal("highest", nd.get_float32_matmul_precision()) end, {enabled = false})
      assert.are.equal("medium", nd.get_float32_matmul_precision())
    end)
    nd.autocast(function() seen = nd.get_float32_matmul_precision() end, {enabled = false})
    assert.are.equal("highest", seen)
    -- an error keeps its own position (the caller's line, not autocast's)
    local e2 = errmsg(function() nd.autocast(function() error("here") end) end)
    assert.is_truthy(e2:find("matmul_precision_spec.lua", 1, true), e2)
  end)

  it("names what it cannot do", function()
    assert_contains(errmsg(function() nd.autocast(function() end, {dtype = "float16"}) end),
                    'dtype float16 with device_type "cpu"')
    assert_contains(errmsg(function() nd.autocast(function() end, {device_type = "cuda"}) end),
                    'device_type must be "cpu" or "opencl", got "cuda"')
    assert_contains(errmsg(function() nd.autocast(function() end, {device_type = "opencl", dtype = "int8"}) end),
                    'dtype must be "float16" or "bfloat16", got "int8"')
    assert_contains(errmsg(function() nd.autocast(function() end, {dtyp = "bfloat16"}) end), "dtyp")
    assert_contains(errmsg(function() nd.autocast(42) end), "expected a function to run, got number")
  end)

  it("runs each product's gradient at the precision of its forward, wherever backward() is called", function()
    if not BF16 then pending("this CPU has no AVX512_BF16"); return end
    nd.manual_seed(4)
    local lin = nd.nn.Linear(64, 80)
    local x = nd.randn({70, 64})
    local y = nd.autocast(function() return lin(x) end)
    assert_bf16_product(y - lin.bias, x, lin.weight:detach():t(), "forward")
    local dy = nd.randn({70, 80})
    y:backward(dy) -- outside the scope
    assert_bf16_product(lin.weight.grad, dy:t(), x, "weight gradient")
    -- a layer outside the scope stays float32 in both directions
    lin:zero_grad()
    local y32 = lin(x)
    y32:backward(dy)
    assert.are.same(dy:t():matmul(x):totable(), lin.weight.grad:totable())
  end)

  it("packs a linear layer's weight once per scope; every batch size runs on it, rows alike", function()
    if not BF16 then pending("this CPU has no AVX512_BF16"); return end
    nd.manual_seed(8)
    for _, dims in ipairs({{768, 3000}, {1025, 70}, {5, 33}}) do
      local K, O = dims[1], dims[2]
      local w, b = nd.randn({O, K}), nd.randn({O})
      local x = nd.randn({40, K})
      nd.autocast(function()
        local big = nd.F.linear(x, w, b)
        assert_bf16_product(big - b, x, w:t(), ("linear %dx%d, 40 rows"):format(K, O))
        for m = 1, 5 do -- (1-4 rows: a kernel of their own, the same sums)
          local small = nd.F.linear(x:narrow(1, 1, m):contiguous(), w, b)
          assert.are.same(big:narrow(1, 1, m):totable(), small:totable(), ("%d rows"):format(m))
        end
        local g = nd.F.fused_linear(x:narrow(1, 1, 2):contiguous(), w, b, {activation = "gelu"})
        assert.are.same(nd.F.fused_linear(x, w, b, {activation = "gelu"}):narrow(1, 1, 2):totable(), g:totable())
      end)
    end
  end)

  it("keeps each weight's own packing: layers of one shape (and dtype) in one scope do not share it", function()
    if not BF16 then pending("this CPU has no AVX512_BF16"); return end
    nd.manual_seed(12)
    local x = nd.randn({100, 64})
    local ws = {nd.randn({96, 64}), nd.randn({96, 64}), nd.randn({96, 64}):bfloat16(), nd.randn({96, 64}):bfloat16()}
    nd.no_grad(function()
      nd.autocast(function()
        for round = 1, 2 do -- the second round from the cache
          for i, w in ipairs(ws) do
            local y = nd.F.linear(x, w)
            assert_bf16_product(y, x, w:float():t(), ("weight %d, round %d"):format(i, round))
          end
        end
      end)
    end)
    -- a model of repeated layers: within bfloat16's error of float32, layer by layer
    local m = nd.nn.Sequential(nd.nn.Linear(64, 64), nd.nn.ReLU(), nd.nn.Linear(64, 64), nd.nn.ReLU(),
                               nd.nn.Linear(64, 64))
    local want = nd.no_grad(function() return m(x) end)
    local got = nd.no_grad(function() return nd.autocast(function() return m(x) end) end)
    local err = (got - want):abs():max():item()
    assert(err < 0.05 * want:abs():max():item(), ("off by %g"):format(err))
  end)

  it("packs a weight again once it is written, inside the scope", function()
    if not BF16 then pending("this CPU has no AVX512_BF16"); return end
    nd.manual_seed(9)
    local lin = nd.nn.Linear(96, 80)
    local x = nd.randn({3, 96})
    local opt = nd.optim.SGD(lin:parameters(), {lr = 0.5})
    local inside = {}
    nd.autocast(function()
      for step = 1, 3 do
        opt:zero_grad()
        local y = lin(x)
        inside[step] = y:detach():clone()
        y:pow(2):sum():backward()
        opt:step() -- (writes the weight: the cached packing is stale)
      end
      lin.weight:detach():mul_(0.5)
      inside[4] = lin(x):detach():clone()
    end)
    -- the same steps, a scope each: the same bits
    nd.manual_seed(9)
    local lin2 = nd.nn.Linear(96, 80)
    local opt2 = nd.optim.SGD(lin2:parameters(), {lr = 0.5})
    for step = 1, 3 do
      nd.autocast(function()
        opt2:zero_grad()
        local y = lin2(x)
        assert.are.same(inside[step]:totable(), y:totable(), "step " .. step)
        y:pow(2):sum():backward()
      end)
      opt2:step()
    end
    lin2.weight:detach():mul_(0.5)
    assert.are.same(inside[4]:totable(), nd.autocast(function() return lin2(x) end):totable())
  end)

  it("keeps nd.compile's joined layers bit for bit (no joins at medium: the kernel follows the width)", function()
    nd.manual_seed(7)
    local l1, l2, l3 = nd.nn.Linear(96, 40), nd.nn.Linear(96, 40), nd.nn.Linear(96, 40)
    for _, l in ipairs({l1, l2, l3}) do l:eval() end
    local x = nd.randn({70, 96})
    local function f(v) return nd.no_grad(function() return l1(v) + l2(v) * l3(v) end) end
    local cf = nd.compile(f)
    for _, p in ipairs({"medium", "highest", "medium"}) do
      local want = at(p, function() return f(x) end)
      for _ = 1, 3 do assert.are.same(want:totable(), at(p, function() return cf(x) end):totable(), p) end
    end
  end)

  it("is a guard of nd.compile, and a graph break inside a compiled function", function()
    nd.manual_seed(5)
    local lin = nd.nn.Linear(96, 80)
    local x = nd.randn({70, 96})
    local cf = nd.compile(function(v) return lin(v) end)
    local eager32 = lin(x)
    local eager16 = nd.autocast(function() return lin(x) end)
    for _ = 1, 3 do
      assert.are.same(eager32:totable(), cf(x):totable())
      assert.are.same(eager16:totable(), nd.autocast(function() return cf(x) end):totable())
    end
    assert.are.equal(2, cf.stats.captures) -- one entry per precision, replayed at it
    local inner = nd.compile(function(v) return nd.autocast(function() return lin(v) end) end)
    inner(x) -- (the warm-up call runs eagerly)
    assert_contains(errmsg(function() inner(x) end), "nd.autocast inside a compiled function")
    local function sets_precision(v)
      nd.set_float32_matmul_precision("medium")
      local y = lin(v)
      nd.set_float32_matmul_precision("highest")
      return y
    end
    local set = nd.compile(sets_precision)
    set(x)
    assert_contains(errmsg(function() set(x) end), "set_float32_matmul_precision inside a compiled function")
    -- with fallback the function runs eagerly, at the precision it sets
    local fb = nd.compile(sets_precision, {fallback = true})
    for _ = 1, 3 do assert.are.same(eager16:totable(), fb(x):totable()) end
  end)
end)

-- nd.autocast{device_type = "opencl"}: float32 products on OpenCL devices
-- round their operands to float16 (the default) or bfloat16 and sum in
-- float32. Checked against the float64 product of operands rounded by the
-- CPU's own conversions (x:half(), x:bfloat16()), within float32 summation
-- error, and against the plain product, which must differ by half's rounding.
describe("nd.autocast on OpenCL", function()
  local D = require "spec.helpers.devices"
  local devs = D.available and D.opencl() or {}

  local function assert_half_product(c, a, b, dt, what)
    local ah, bh = a:to(dt):double(), b:to(dt):double()
    local ref = ah:matmul(bh)
    local bound = ah:abs():matmul(bh:abs()) * ((a:size(-1) + 2) * 2 ^ -24) + 1e-30
    local excess = ((c:to("cpu"):double() - ref):abs() - bound):max():item()
    assert(excess <= 0, ("%s: off the %s product by %g more than float32 rounding"):format(what, dt, excess))
    local plain = (c:to("cpu"):double() - a:double():matmul(b:double())):abs():max():item()
    assert(plain > 1e-4, ("%s: the %s product equals the float32 one (%g): nothing was rounded"):format(what, dt, plain))
  end

  if #devs == 0 then
    it("needs an OpenCL device", function() pending("no OpenCL device: " .. tostring(D.reason)) end)
  end

  for _, dev in ipairs(devs) do
    it("rounds matmul's operands to float16 or bfloat16 and sums in float32 (" .. dev .. ")", function()
      nd.manual_seed(21)
      local a, b = nd.randn({37, 53}), nd.randn({53, 29})
      local A, B = a:to(dev), b:to(dev)
      for _, dt in ipairs({"float16", "bfloat16"}) do
        local c = nd.autocast(function()
          assert.are.equal(dt, require("needle.core")._get_opencl_matmul_dtype())
          return A:matmul(B)
        end, {device_type = "opencl", dtype = dt})
        assert.are.equal("float32", c.dtype)
        assert_half_product(c, a, b, dt, "matmul")
        -- batched, and with a transposed operand
        local a3, b3 = nd.randn({3, 20, 40}), nd.randn({3, 30, 40})
        local c3 = nd.autocast(function() return a3:to(dev):matmul(b3:to(dev):transpose(2, 3)) end,
                               {device_type = "opencl", dtype = dt})
        assert_half_product(c3, a3, b3:transpose(2, 3), dt, "batched matmul")
      end
      -- the default dtype is float16 (PyTorch's for its GPU autocast); after the scope, float32
      local c = nd.autocast(function() return A:matmul(B) end, {device_type = "opencl"})
      assert_half_product(c, a, b, "float16", "default dtype")
      assert.are.equal("float32", require("needle.core")._get_opencl_matmul_dtype())
      local after = A:matmul(B):to("cpu"):double()
      assert.is_true((after - a:double():matmul(b:double())):abs():max():item() < 1e-4)
      -- enabled = false inside a scope: float32 products
      local off = nd.autocast(function()
        return nd.autocast(function() return A:matmul(B) end, {device_type = "opencl", enabled = false})
      end, {device_type = "opencl"})
      assert.is_true((off:to("cpu"):double() - a:double():matmul(b:double())):abs():max():item() < 1e-4)
      -- the CPU's products are untouched by an OpenCL scope (and the OpenCL ones by a CPU scope)
      local cpu = nd.autocast(function() return a:matmul(b) end, {device_type = "opencl"})
      assert.are.equal(0, (cpu - a:matmul(b)):abs():max():item())
      local ocl = nd.autocast(function() return A:matmul(B) end)
      assert.is_true((ocl:to("cpu"):double() - a:double():matmul(b:double())):abs():max():item() < 1e-4)
      -- a compiled function replays at the setting of each call (it is part of the guard)
      local cf = nd.compile(function(x, y) return x:matmul(y) * 2 end)
      for _ = 1, 2 do
        local o = cf(A, B)
        assert.is_true((o:to("cpu"):double() - a:double():matmul(b:double()) * 2):abs():max():item() < 1e-4)
        local h = nd.autocast(function() return cf(A, B) end, {device_type = "opencl"})
        assert_half_product(h * 0.5, a, b, "float16", "compiled matmul")
      end
      -- an error inside restores the setting
      assert.is_false(pcall(nd.autocast, function() error("inside") end, {device_type = "opencl"}))
      assert.are.equal("float32", require("needle.core")._get_opencl_matmul_dtype())
    end)

    it("runs linear, conv2d and the gradients' products on the rounded operands too (" .. dev .. ")", function()
      nd.manual_seed(22)
      -- linear: x @ w^T + b, and its gradients (dx = g @ w, dw = g^T @ x) at the forward's dtype,
      -- with backward() called outside the scope
      local x, w, bias = nd.randn({24, 40}), nd.randn({30, 40}), nd.randn({30})
      local X, W = x:to(dev):requires_grad_(), w:to(dev):requires_grad_()
      local y = nd.autocast(function() return nd.F.linear(X, W, bias:to(dev)) end, {device_type = "opencl"})
      assert_half_product(y - bias:to(dev), x, w:t(), "float16", "linear")
      local g = nd.randn({24, 30})
      y:backward(g:to(dev))
      assert_half_product(X.grad, g, w, "float16", "linear's input gradient")
      assert_half_product(W.grad, g:t(), x, "float16", "linear's weight gradient")
      -- outside the scope the same backward is float32
      local X2, W2 = x:to(dev):requires_grad_(), w:to(dev):requires_grad_()
      nd.F.linear(X2, W2):backward(g:to(dev))
      assert.is_true((X2.grad:to("cpu"):double() - g:double():matmul(w:double())):abs():max():item() < 1e-4)
      -- conv2d through im2col's GEMM: against the float64 convolution of rounded operands
      local xi, wk = nd.randn({2, 3, 9, 9}), nd.randn({5, 3, 3, 3})
      local out = nd.autocast(function() return nd.F.conv2d(xi:to(dev), wk:to(dev), nil, {padding = 1}) end,
                              {device_type = "opencl", dtype = "bfloat16"}):to("cpu"):double()
      local ref = nd.F.conv2d(xi:bfloat16():double(), wk:bfloat16():double(), nil, {padding = 1})
      local plain = nd.F.conv2d(xi:double(), wk:double(), nil, {padding = 1})
      assert.is_true((out - ref):abs():max():item() < 1e-4, "conv2d off the bfloat16 convolution")
      assert.is_true((out - plain):abs():max():item() > 1e-3, "conv2d was not rounded")
    end)
  end
end)
