-- tensor_ops_spec.lua - the tensor ops of issue 20 (lua/needle/tensor_ops/):
-- every case against PyTorch's (spec/fixtures/gen/gen_torch_tensor_ops.py
-- wrote the fixtures) on every device, float64 gradchecks, the random ops'
-- statistics and reproducibility, and the errors for bad input.
--
--   build/needle-lua spec/run.lua spec/tensor_ops_spec.lua
local nd = require "needle"
local core = require "needle.core"
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert, {atol = 1e-5, rtol = 1e-4})
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local fixtures = dofile("spec/fixtures/torch_tensor_ops.lua")

-- a fixture's tensor ({shape, data[, dtype]}) on dev
local function T(t, dev)
  local dtype = t.dtype or "float32"
  if #t.data == 0 then return nd.zeros(t.shape, {dtype = dtype, device = dev}) end
  return nd.tensor(t.data, {dtype = dtype}):reshape(t.shape):to(dev)
end

-- args and opts of a case: typed tables become tensors on dev
local function values(list, dev)
  local out = {}
  for k, v in pairs(list) do out[k] = type(v) == "table" and v.dtype and T(v, dev) or v end
  return out
end

-- the needle call of a case: nd[fn](lead..., inputs..., args..., opts)
local ADAPT = {
  meshgrid = function(...) return nd.stack({nd.meshgrid(...)}, 1) end,
  allclose = function(...) return nd.tensor(nd.allclose(...)) end,
  equal = function(...) return nd.tensor(nd.equal(...)) end,
}
local function call(c, inputs, dev)
  local args = {}
  for _, v in ipairs(c.lead) do args[#args + 1] = v end
  for _, v in ipairs(inputs) do args[#args + 1] = v end
  for _, v in ipairs(values(c.args, dev)) do args[#args + 1] = v end
  if c.fn ~= "einsum" then args[#args + 1] = values(c.opts, dev) end -- einsum takes no options
  return (ADAPT[c.fn] or nd[c.fn])(table.unpack(args, 1, #args))
end

-- float32 results within rtol 1e-5 (OpenCL's sums and GEMMs add in
-- another order: 1e-4 there) + atol; infinities and NaN exactly
local function close(what, got, want, dev)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g = got:cpu():contiguous():view({-1}):totable()
  local rtol = dev == "cpu" and 1e-5 or 1e-4
  for i, w in ipairs(want.data) do
    local ok
    if w ~= w then ok = g[i] ~= g[i]
    elseif math.abs(w) == math.huge then ok = g[i] == w
    else ok = math.abs(g[i] - w) <= rtol * math.abs(w) + 1e-5 end
    if not ok then error(("%s: element %d is %.9g, PyTorch %.9g"):format(what, i, g[i], w), 2) end
  end
end

local function same(what, got, want)
  assert.are.equal(want.dtype, got.dtype, what .. ": dtype")
  assert.are.same(want.shape, got.shape, what .. ": shape")
  if want.dtype == "float32" then return close(what, got, want, "cpu") end
  assert.are.same(want.data, got:cpu():contiguous():reshape({-1}):totable(), what)
end

-- Without OpenCL the device loops of this file (these fixture cases, "results
-- stay on the input's device", the random fills, the einsum device error) run
-- on the cpu alone: one visible pending line says so instead of a silent pass.
D.pending_without_opencl(pending, "tensor ops on OpenCL (device loops here ran on the cpu alone)")

for _, dev in ipairs(D.all()) do
  describe("tensor ops against PyTorch on " .. D.describe(dev), function()
    it("differentiable ops: outputs and gradients", function()
      assert.is_true(#fixtures.grad >= 60)
      for i, c in ipairs(fixtures.grad) do
        local label = ("%d %s %s"):format(i, c.fn, c.lead[1] or "")
        local inputs = {}
        for k, t in ipairs(c.inputs) do
          inputs[k] = T(t, dev)
          inputs[k].requires_grad = true
        end
        local out = call(c, inputs, dev)
        assert.are.equal(dev, out.device, label)
        close(label .. " output", out, c.output, dev)
        local grads = nd.grad((out * T(c.w, dev)):sum(), inputs)
        for k = 1, #inputs do close(label .. " grad " .. k, grads[k], c.grads[k], dev) end
      end
    end)

    it("indices, counts, masks and values", function()
      assert.is_true(#fixtures.plain >= 40)
      for i, c in ipairs(fixtures.plain) do
        local label = ("%d %s"):format(i, c.fn)
        local inputs = {}
        for k, t in ipairs(c.inputs) do inputs[k] = T(t, dev) end
        local results = table.pack(call(c, inputs, dev))
        assert.are.equal(#c.outputs, results.n, label .. ": number of results")
        for k, want in ipairs(c.outputs) do same(label .. " result " .. k, results[k], want) end
      end
    end)
  end)
end

describe("tensor ops: float64 gradchecks", function()
  local leaf = G.leaf

  it("einsum: products, diagonals, broadcast ellipses, three operands; second order", function()
    nd.manual_seed(71)
    C.check(function(a, b) return nd.einsum("ij,jk->ik", a, b) end, {leaf({2, 3}), leaf({3, 2})})
    C.check(function(a) return nd.einsum("iji->j", a) end, {leaf({3, 2, 3})})
    C.check(function(a, b) return nd.einsum("...ij,...j->...i", a, b) end, {leaf({2, 1, 3, 2}), leaf({4, 2})})
    C.check(function(a, b, c) return nd.einsum("ab,bc,ca", a, b, c) end, {leaf({2, 3}), leaf({3, 2}), leaf({2, 2})})
    C.check(function(a, b) return nd.einsum("i,j->j", a, b) end, {leaf({3}), leaf({2})})
    C.check2(function(a, b) return nd.einsum("bij,bjk->bk", a, b) end, {leaf({2, 2, 3}), leaf({2, 3, 2})})
  end)

  it("bmm, outer, tril, triu, diag, trace", function()
    nd.manual_seed(72)
    C.check(nd.bmm, {leaf({2, 2, 3}), leaf({2, 3, 2})})
    C.check(nd.outer, {leaf({3}), leaf({2})})
    C.check(function(x) return x:tril(1) end, {leaf({2, 3, 3})})
    C.check(function(x) return x:triu(-1) end, {leaf({3, 4})})
    C.check(function(x) return x:diag(-1) end, {leaf({3})})
    C.check(function(x) return x:diag(1) end, {leaf({3, 4})})
    C.check(function(x) return x:t():trace() end, {leaf({3, 2})})
  end)

  it("norm (p = 2, 3, 1, inf, -inf, fro over two dims), amax, amin; second order for p = 2", function()
    nd.manual_seed(73)
    local away = function(shape) return leaf(shape, 0.5, 2) end -- no zeros, no ties (|x| distinct almost surely)
    C.check(function(x) return x:norm() end, {leaf({3, 4})})
    C.check(function(x) return x:norm(3, 2) end, {leaf({3, 4})})
    C.check(function(x) return x:norm(1, {1, 2}, true) end, {away({3, 4})})
    C.check(function(x) return x:norm(math.huge, 1) end, {leaf({3, 4})})
    C.check(function(x) return x:norm(-math.huge, -1) end, {leaf({3, 4})})
    C.check(function(x) return x:norm("fro", {2, 3}) end, {leaf({2, 3, 2})})
    C.check(function(x) return x:amax({1, 3}) end, {leaf({2, 3, 2})})
    C.check(function(x) return x:amin(2, true) end, {leaf({2, 3})})
    C.check2(function(x) return x:norm(2, 1) end, {leaf({3, 2})})
  end)

  it("nan_to_num, masked_select, roll, repeat_interleave, meshgrid", function()
    nd.manual_seed(74)
    local mask = nd.tensor({{true, false, true}})
    C.check(function(x) return x:nan_to_num() end, {leaf({2, 3})})
    C.check(function(x) return x:masked_select(mask) end, {leaf({2, 3})})
    C.check(function(x) return x:roll({1, -1}, {1, 2}) end, {leaf({2, 3})})
    C.check(function(x) return x:repeat_interleave(nd.tensor({0, 2, 1}, {dtype = "int64"}), 2) end, {leaf({2, 3})})
    C.check(function(a, b) return nd.stack({nd.meshgrid(a, b, {indexing = "xy"})}) end, {leaf({2}), leaf({3})})
  end)

  it("cumprod with zeros in the input (one and two), to second order; logcumsumexp", function()
    nd.manual_seed(75)
    local x = leaf({2, 5})
    nd.no_grad(function() x[{1, 3}] = 0; x[{2, 2}] = 0; x[{2, 4}] = 0 end)
    C.check(function(t) return t:cumprod(2) end, {x})
    C.check2(function(t) return t:cumprod(2) end, {x})
    C.check(function(t) return t:cumprod(1) end, {leaf({4, 2})})
    C.check(function(t) return (t * 30):logcumsumexp(2) end, {leaf({3, 6})})
    C.check2(function(t) return t:logcumsumexp(1) end, {leaf({5})})
  end)
end)

describe("tensor ops: behaviour", function()
  it("einsum contracts through matmul: no broadcast product is materialised", function()
    local a, b = nd.randn({200, 300}), nd.randn({300, 400})
    nd.reset_peak_live_bytes()
    local base = nd.live_bytes()
    local r = nd.einsum("ij,jk->ik", a, b)
    -- the (200, 300, 400) product would be 96 MB; the result is 320 KB
    assert.is_true(nd.peak_live_bytes() - base < 4e6, tostring(nd.peak_live_bytes() - base))
    assert.is_true((r - a:matmul(b)):abs():max():item() < 1e-4)
    assert.is_true((nd.einsum("ij,jk", {a, b}) - r):abs():max():item() == 0) -- operands as one list
  end)

  it("amax/amin split the gradient evenly among ties, infinite ones included", function()
    local x = nd.tensor({{math.huge, 1, math.huge}, {2, 2, 2}}, {requires_grad = true})
    local g = nd.grad(x:amax(2):sum(), x):totable()
    local want = {0.5, 0, 0.5, 1 / 3, 1 / 3, 1 / 3}
    for k = 1, 6 do assert.is_true(math.abs(g[(k - 1) // 3 + 1][(k - 1) % 3 + 1] - want[k]) < 1e-7) end
    assert.are.same({math.huge, 2}, x:amax(2):totable())
    assert.are.same({{1}, {2}}, x:amin(-1, true):totable())
    assert.are.equal(0, nd.tensor(3.0):amax():dim())
  end)

  it("norm's gradient at a zero vector is 0, as PyTorch's", function()
    local x = nd.zeros({2, 3}, {requires_grad = true})
    for _, p in ipairs({2, 3, 0.5, "fro"}) do
      local g = nd.grad(x:norm(p, 2):sum(), x)
      assert.are.same({{0, 0, 0}, {0, 0, 0}}, g:totable())
    end
    local n = nd.tensor({{0, 2}, {1, 2}}):norm(-1, 2):totable() -- a zero makes a negative-p norm 0
    assert.is_true(n[1] == 0 and math.abs(n[2] - 2 / 3) < 1e-7)
  end)

  it("logcumsumexp is finite where exp would overflow, and its gradient at -inf is the chain rule's", function()
    local x = nd.tensor({-math.huge, 1000, 1000}, {requires_grad = true})
    local y = x:logcumsumexp(1)
    local v = y:totable()
    assert.are.equal(-math.huge, v[1])
    assert.are.equal(1000, v[2])
    assert.is_true(math.abs(v[3] - (1000 + math.log(2))) < 1e-3)
    local g = nd.grad(y:sum(), x):totable()
    -- y1 = x1; y2 and y3 do not depend on x1 (exp(-inf) = 0)
    assert.are.equal(1, g[1])
    assert.is_true(math.abs(g[2] - 1.5) < 1e-6 and math.abs(g[3] - 0.5) < 1e-6)
  end)

  it("unique without sorted still returns the values sorted; inverse indexes the output", function()
    local x = nd.tensor({5, 3, 5, 1}, {dtype = "int64"})
    local u, inv = x:unique({sorted = false, return_inverse = true})
    assert.are.same({1, 3, 5}, u:totable())
    assert.are.same(x:totable(), u:index_select(1, inv):totable())
    local n = nd.tensor({0 / 0, 1, 0 / 0}):unique()
    assert.are.equal(3, n:numel()) -- NaN never equals NaN, as PyTorch's
  end)

  it("results stay on the input's device", function()
    for _, dev in ipairs(D.all()) do
      local x = nd.tensor({{0, 2}, {3, 0}}, {device = dev})
      assert.are.equal(dev, x:nonzero().device)
      assert.are.equal(dev, x:unique().device)
      assert.are.equal(dev, nd.searchsorted(nd.tensor({1, 2}, {device = dev}), x).device)
      assert.are.equal(dev, nd.multinomial(x[2], 2, true).device)
      assert.are.equal(dev, x:isnan().device)
      assert.are.same({{1, 2}, {2, 1}}, x:nonzero():cpu():totable())
    end
  end)

  it("tolist: nested tables, a number for 0 dims, booleans for bool", function()
    assert.are.same({{1, 2}, {3, 4}}, nd.tensor({{1, 2}, {3, 4}}, {dtype = "int64"}):tolist())
    assert.are.equal(2.5, nd.tensor(2.5):tolist())
    assert.are.same({true, false}, nd.tensor({true, false}):tolist())
    assert.are.equal("integer", math.type(nd.tensor({7}, {dtype = "int64"}):tolist()[1]))
  end)

  it("methods exist where PyTorch's Tensor has them, functions where torch has them", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.same(nd.norm(x, 1):item(), x:norm(1):item())
    assert.are.same(nd.cumprod(x, 2):totable(), x:cumprod(2):totable())
    for _, name in ipairs({"einsum", "meshgrid", "searchsorted"}) do
      assert.is_function(nd[name])
      assert.is_nil(core._methods[name], name)
    end
    for _, name in ipairs({"tolist", "uniform_", "normal_", "bernoulli_"}) do
      assert.is_function(core._methods[name])
      assert.is_nil(nd[name], name)
    end
  end)
end)

describe("tensor ops: random", function()
  local function version(t) return core._storage_version(t) end

  it("uniform_, normal_, bernoulli_ fill in place through views and bump the version", function()
    for _, dev in ipairs(D.all()) do
      local base = nd.zeros({4, 1000}, {device = dev})
      local row = base[2]
      local v0 = version(base)
      assert.are.equal(row, row:uniform_(2, 3))
      assert.is_true(version(base) > v0)
      local r = base[2]
      assert.is_true(r:min():item() >= 2 and r:max():item() < 3)
      assert.is_true(math.abs(r:mean():item() - 2.5) < 0.05)
      assert.are.equal(0, base[1]:abs():sum():item()) -- only the view was written
      local v1 = version(base)
      base[3]:normal_(5, 0.5)
      assert.is_true(version(base) > v1)
      assert.is_true(math.abs(base[3]:mean():item() - 5) < 0.1 and math.abs(base[3]:std():item() - 0.5) < 0.05)
      base[4]:bernoulli_(0.25)
      local b = base[4]
      assert.is_true(b:eq(0):sum():item() + b:eq(1):sum():item() == 1000)
      assert.is_true(math.abs(b:mean():item() - 0.25) < 0.05)
      assert.are.equal(dev, base.device)
    end
  end)

  it("a fill after a tensor was saved for backward makes the backward an error (the version moved)", function()
    local a = nd.tensor({1.0, 2.0}, {requires_grad = true})
    local y = a * 2
    local z = (y * y):sum()
    nd.no_grad(function() y:uniform_() end)
    assert_contains(errmsg(function() z:backward() end), "modified in place")
  end)

  it("bernoulli_ takes a tensor of probabilities and fills any dtype", function()
    local p = nd.tensor({0, 1, 0, 1})
    local x = nd.zeros({3, 4}, {dtype = "int64"}):bernoulli_(p)
    assert.are.same({{0, 1, 0, 1}, {0, 1, 0, 1}, {0, 1, 0, 1}}, x:totable())
    assert.are.same({false, true}, nd.zeros({2}, {dtype = "bool"}):bernoulli_(nd.tensor({0, 1})):totable())
  end)

  it("nd.manual_seed makes the fills and multinomial reproducible", function()
    local function draw()
      local x = nd.zeros({5})
      return {x:uniform_():totable(), x:normal_():totable(), x:bernoulli_():totable(),
              nd.multinomial(nd.tensor({1, 2, 3}), 4, true):totable(),
              nd.multinomial(nd.tensor({{1, 2, 3, 4}}), 3):totable()}
    end
    nd.manual_seed(99)
    local a = draw()
    nd.manual_seed(99)
    assert.are.same(a, draw())
    assert.are_not.same(a, draw())
  end)

  it("multinomial with replacement follows the weights; never a zero-weight category", function()
    nd.manual_seed(5)
    local w = nd.tensor({{1, 0, 3, 6}, {0, 0, 1, 0}})
    local s = nd.multinomial(w, 20000, {replacement = true})
    assert.are.same({2, 20000}, s.shape)
    local counts = nd.bincount(s[1], {minlength = 4}):totable()
    assert.are.equal(0, counts[2])
    for k, p in pairs({[1] = 0.1, [3] = 0.3, [4] = 0.6}) do
      assert.is_true(math.abs(counts[k] / 20000 - p) < 0.015, ("category %d: %d"):format(k, counts[k]))
    end
    assert.are.equal(20000, s[2]:eq(3):sum():item())
  end)

  it("multinomial without replacement draws distinct categories, the heavy ones first more often", function()
    nd.manual_seed(6)
    local p = nd.tensor({0.05, 0, 0.9, 0.05})
    local first3 = 0
    for _ = 1, 200 do
      local s = nd.multinomial(p, 3):totable()
      table.sort(s)
      assert.are.same({1, 3, 4}, s)
    end
    local rows = nd.multinomial(p:reshape({1, 4}):expand({500, 4}), 1)
    first3 = rows:eq(3):sum():item()
    assert.is_true(first3 > 400, tostring(first3))
  end)
end)

describe("tensor ops: errors name the op, the shapes and what was expected", function()
  local x = nd.zeros({2, 3})
  local function has(fn, text) assert_contains(errmsg(fn), text) end

  it("einsum", function()
    local a, b = nd.zeros({2, 3}), nd.zeros({3, 4})
    has(function() nd.einsum("ij,jk->ik", a) end, "needle.einsum: equation \"ij,jk->ik\" has 2 operands but 1 tensor was given")
    has(function() nd.einsum("ij,j1->i", a, b) end, "needle.einsum: invalid subscript \"1\" in equation")
    has(function() nd.einsum("ijk,jk->i", a, b) end, "needle.einsum: operand 1 has 2 dims ({2,3}) but 3 subscripts in \"ijk\"")
    has(function() nd.einsum("ij,ik->jk", a, b) end, "needle.einsum: subscript 'i' has size 2 in operand 1 but 3 in operand 2")
    has(function() nd.einsum("ij,jk->ii", a, b) end, "output subscript 'i' appears more than once")
    has(function() nd.einsum("ij,jk->iz", a, b) end, "output subscript 'z' is not in any operand")
    has(function() nd.einsum("ij,jk->ik", a, b:double()) end, "operands 1 and 2 have dtypes float32 and float64")
    has(function() nd.einsum("...i...->i", a) end, "operand 1 has more than one '...'")
    has(function() nd.einsum("ii->i", a) end, "subscript 'i' is repeated in operand 1 with sizes 2 and 3")
    has(function() nd.einsum("ij->i->j", a) end, "needle.einsum: invalid equation")
    has(function() nd.einsum(a, a) end, "needle.einsum: the equation must be a string, got a tensor")
    has(function() nd.einsum("ij", 3) end, "needle.einsum: operand 1 must be a tensor, got 3")
    for _, dev in ipairs(D.opencl()) do
      has(function() nd.einsum("ij,jk", a, b:to(dev)) end, "expected all tensors on one device, got cpu and " .. dev)
    end
  end)

  it("bmm, outer, tril, diag, trace", function()
    has(function() nd.bmm(x, x) end, "needle.bmm: expected two 3-dim tensors (b, n, m) and (b, m, p), got {2,3} and {2,3}")
    has(function() nd.bmm(nd.zeros({2, 2, 3}), nd.zeros({3, 3, 2})) end, "needle.bmm: shapes {2,2,3} and {3,3,2} do not match")
    has(function() nd.bmm(nd.zeros({1, 2, 3}), nd.zeros({1, 2, 3})) end, "(expected (b, n, m) and (b, m, p): 3 ~= 2)")
    has(function() nd.outer(x, x) end, "needle.outer: expected two 1-dim tensors, got {2,3} and {2,3}")
    has(function() nd.tril(nd.zeros({3})) end, "needle.tril: expected a tensor with at least 2 dims, got {3}")
    has(function() x:triu(1.5) end, "needle.triu: argument 'diagonal' (position 2) must be an integer, got 1.5")
    has(function() nd.diag(nd.zeros({2, 2, 2})) end, "needle.diag: expected a 1-dim or 2-dim tensor, got {2,2,2}")
    has(function() nd.trace(nd.zeros({3})) end, "needle.trace: expected a 2-dim tensor, got {3}")
    has(function() nd.trace("x") end, "needle.trace: input must be a tensor, got \"x\"")
    has(function() x:tril(1, {diagonal = 2}) end, "needle.tril: argument 'diagonal' given twice")
    has(function() x:tril(1, 2) end, "needle.tril: takes at most 1 argument after the tensor (diagonal)")
  end)

  it("reductions: norm, amax, all", function()
    has(function() x:norm("nuc") end, "needle.norm: p = 'nuc' (the nuclear norm) needs singular values")
    has(function() x:norm("nuc") end, "left to nd.linalg")
    has(function() x:norm("max") end, "needle.norm: p must be a number, 'fro' or 'nuc', got \"max\"")
    has(function() nd.zeros({2, 2, 2}):norm("fro", {1, 2, 3}) end, "needle.norm: p = 'fro' takes 1 or 2 dims")
    has(function() nd.tensor({1, 2}, {dtype = "int64"}):norm() end, "needle.norm: expected a floating-point input")
    has(function() x:norm(2, 3) end, "needle.norm: dim 3 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    has(function() x:amax(0) end, "needle.amax: dim 0 is invalid (dims are 1-based; -1 is the last)")
    has(function() x:amax({1, 1}) end, "needle.amax: dim 1 appears more than once")
    has(function() nd.zeros({0, 2}):amin(1) end, "needle.amin: cannot reduce dim 1 of size 0 (shape {0,2})")
    has(function() x:all(1, "yes") end, "needle.all: argument 'keepdim' (position 3) must be a boolean, got \"yes\"")
    has(function() x:any({dim = 1, kepdim = true}) end, "needle.any: unknown option 'kepdim' (valid: dim, keepdim)")
  end)

  it("comparisons", function()
    has(function() nd.isclose(x, x:long()) end, "needle.isclose: expected one dtype, got float32 and int64")
    has(function() nd.isclose(x, nd.zeros({4})) end, "needle.isclose: shapes {2,3} and {4} cannot be broadcast")
    has(function() nd.allclose(x, x, -1) end, "needle.allclose: rtol and atol must be >= 0, got rtol = -1")
    has(function() nd.nan_to_num(x, "0") end, "needle.nan_to_num: argument 'nan' (position 2) must be a number")
    has(function() nd.equal(x, 1) end, "needle.equal: other must be a tensor, got 1")
  end)

  it("data-dependent ops", function()
    local i = nd.tensor({1, 2}, {dtype = "int64"})
    has(function() nd.masked_select(x, x) end, "needle.masked_select: mask must be a bool tensor, got float32")
    has(function() nd.masked_select(x, nd.zeros({4}, {dtype = "bool"})) end,
        "needle.masked_select: shapes {2,3} and {4} cannot be broadcast together (size 3 ~= 4 at dim 2)")
    has(function() nd.unique(x, {dim = 3}) end, "needle.unique: dim 3 out of range")
    has(function() nd.bincount(x) end, "needle.bincount: expected a 1-dim integer tensor of bins, got a float32 tensor of shape {2,3}")
    has(function() nd.bincount(nd.tensor({0, 1}, {dtype = "int64"})) end,
        "needle.bincount: values must be >= 1 (bins are 1-based, as one_hot's classes), got 0")
    has(function() nd.bincount(i, nd.ones({3})) end, "needle.bincount: weights must be 1-dim with one weight per value (2)")
    has(function() nd.bincount(i, {minlength = -1}) end, "needle.bincount: minlength must be >= 0, got -1")
    has(function() x:repeat_interleave(i, 2) end, "needle.repeat_interleave: repeats has 2 counts for 3 slices along dim 2")
    has(function() x:repeat_interleave(-1) end, "needle.repeat_interleave: repeats must be >= 0, got -1")
    has(function() x:repeat_interleave(nd.tensor({1, -1, 1}, {dtype = "int64"}), 2) end, "repeats must be >= 0, got -1")
    has(function() x:repeat_interleave() end, "needle.repeat_interleave: expected repeats, or a 1-dim integer tensor")
    has(function() x:roll(1, {1, 2}) end, "needle.roll: shifts and dims must have the same length, got 1 and 2")
    has(function() x:roll({1, 2}) end, "needle.roll: without dims, shifts must be one number, got 2 of them")
    has(function() x:roll() end, "needle.roll: shifts is required")
    has(function() x:nonzero({as_tuple = 1}) end, "needle.nonzero: option 'as_tuple' must be a boolean, got 1")
  end)

  it("searchsorted", function()
    local s = nd.tensor({1, 2, 3})
    has(function() nd.searchsorted(x, nd.zeros({3, 1})) end,
        "needle.searchsorted: sorted_sequence {2,3} and values {3,1} must have the same leading dims")
    has(function() nd.searchsorted(s, s, {side = "middle"}) end, "needle.searchsorted: side must be 'left' or 'right', got \"middle\"")
    has(function() nd.searchsorted(s, s, {side = "left", right = true}) end, "side = 'left' and right = true contradict each other")
    has(function() nd.searchsorted(s, s, {sorter = {1, 2}}) end,
        "needle.searchsorted: sorter must be an int64 tensor of the sequence's shape {3}, got a int64 tensor of shape {2}")
    has(function() nd.searchsorted(nd.tensor(1), s) end, "needle.searchsorted: sorted_sequence must have at least 1 dim")
  end)

  it("random ops", function()
    local p = nd.tensor({0.5, 0.5})
    has(function() nd.multinomial(p, 3) end, "needle.multinomial: cannot draw 3 samples without replacement from 2 categories")
    has(function() nd.multinomial(nd.tensor({1, 0}), 2) end, "(1 with a positive probability)")
    has(function() nd.multinomial(nd.tensor({-1, 2}), 1) end, "needle.multinomial: probs must be finite and >= 0")
    has(function() nd.multinomial(nd.tensor({0 / 0, 2}), 1) end, "needle.multinomial: probs must be finite and >= 0")
    has(function() nd.multinomial(nd.tensor({{0, 0}}), 1, true) end, "every row of probs must have a positive sum")
    has(function() nd.multinomial(p, 0) end, "needle.multinomial: num_samples must be >= 1, got 0")
    has(function() nd.multinomial(p) end, "needle.multinomial: num_samples is required")
    has(function() nd.multinomial(nd.zeros({1, 1, 2}), 1) end, "needle.multinomial: probs must have 1 or 2 dims, got shape {1,1,2}")
    has(function() nd.multinomial(nd.tensor({1, 2}, {dtype = "int64"}), 1) end, "needle.multinomial: expected a floating-point probs")
    has(function() nd.zeros({2}):uniform_(1, 0) end, "needle.uniform_: expected from <= to, got from = 1 and to = 0")
    has(function() nd.zeros({2}, {dtype = "int64"}):uniform_() end, "needle.uniform_: expected a floating-point input")
    has(function() nd.zeros({2}):normal_(0, -1) end, "needle.normal_: std must be >= 0, got -1")
    has(function() nd.zeros({2}):bernoulli_(1.5) end, "needle.bernoulli_: p must be in [0, 1], got 1.5")
    has(function() nd.zeros({2}):bernoulli_(nd.tensor({0.5, 2})) end, "needle.bernoulli_: p must be in [0, 1], got values in [0.5, 2")
    has(function() nd.zeros({2}):bernoulli_(nd.zeros({3})) end, "needle.bernoulli_: shapes {2} and {3} cannot be broadcast")
    has(function() nd.zeros({2}):bernoulli_(nd.zeros({2, 2})) end,
        "needle.bernoulli_: p of shape {2,2} does not broadcast to the tensor's shape {2}")
    local leaf = nd.zeros({2}, {requires_grad = true})
    has(function() leaf:uniform_() end, "needle.uniform_: in-place fill of a tensor that requires grad")
    has(function() (leaf * 2):bernoulli_() end, "needle.bernoulli_: in-place fill of a tensor that requires grad")
    nd.no_grad(function() leaf:normal_() end) -- as any in-place op: allowed under no_grad
  end)

  it("scans and meshgrid", function()
    has(function() x:cumprod() end, "needle.cumprod: dim is required")
    has(function() x:logcumsumexp(3) end, "needle.logcumsumexp: dim 3 out of range")
    has(function() x:long():logcumsumexp(1) end, "needle.logcumsumexp: expected a floating-point input (float32, float64, float16 or bfloat16), got int64")
    has(function() nd.meshgrid(x) end, "needle.meshgrid: tensor 1 must have 0 or 1 dims, got shape {2,3}")
    has(function() nd.meshgrid(nd.zeros({2}), nd.zeros({2}, {dtype = "int64"})) end,
        "needle.meshgrid: expected one dtype, got float32 (tensor 1) and int64 (tensor 2)")
    has(function() nd.meshgrid(nd.zeros({2}), {indexing = "yx"}) end, "needle.meshgrid: indexing must be 'ij' or 'xy', got \"yx\"")
    has(function() nd.meshgrid() end, "needle.meshgrid: expected at least one tensor")
  end)

  it("are raised at the caller's line", function()
    local ok, e = pcall(function() return nd.zeros({3}):trace() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("^spec/tensor_ops_spec%.lua:%d+: needle%.trace:"), tostring(e))
    ok, e = pcall(function() return nd.einsum("ij->k", nd.zeros({1, 1})) end)
    assert.truthy(tostring(e):find("^spec/tensor_ops_spec%.lua:%d+: needle%.einsum:"), tostring(e))
  end)
end)

describe("norm (p = 2, 'fro') far from 1", function()
  it("neither overflows nor underflows in float32, keeps its gradient, and is inf / 0 where it must be", function()
    local function near(got, want) return math.abs(got - want) <= 1e-6 * math.abs(want) end
    for _, dev in ipairs(D.all()) do
      local big = nd.full({4}, 3e20):to(dev)
      assert.is_true(near(big:norm():item(), 6e20), tostring(big:norm():item()))
      assert.is_true(near(nd.norm(big, 2):item(), 6e20))
      local tiny = nd.full({2, 2}, 1e-30):to(dev)
      assert.is_true(near(tiny:norm("fro"):item(), 2e-30), tostring(tiny:norm("fro"):item()))
      local rows = nd.tensor({{3e20, 4e20}, {3e-25, 4e-25}, {0, 0}}):to(dev):norm(2, 2):to("cpu"):totable()
      assert.is_true(near(rows[1], 5e20) and near(rows[2], 5e-25) and rows[3] == 0, dev)
      local x = nd.tensor({3e20, -4e20}, {requires_grad = true})
      local g = nd.grad(x:norm(), x):totable()
      assert.is_true(near(g[1], 0.6) and near(g[2], -0.8))
      -- infinities give an infinite norm, NaN a NaN one; an empty one is 0
      assert.are.equal(math.huge, nd.tensor({math.huge, 1}):to(dev):norm():item())
      assert.are.equal(math.huge, nd.tensor({-math.huge, math.huge}):to(dev):norm():item())
      local nan = nd.tensor({0 / 0, 1}):to(dev):norm():item()
      assert.is_true(nan ~= nan)
      assert.are.equal(0, nd.zeros({0}):to(dev):norm():item())
      assert.are.same({0, 0}, nd.zeros({2, 0}):to(dev):norm(2, 2):to("cpu"):totable())
    end
  end)
end)
