-- matmul_spec.lua - nd.matmul / x:matmul / nd.mm with PyTorch's rules (1-D
-- operands, batched and broadcast batch dims), on BLAS-friendly and
-- non-BLAS layouts, float32, float64 and int64, checked against the naive
-- pure-Lua matmul in spec/helpers/reference.lua.
--
--   build/needle-lua spec/run.lua spec/matmul_spec.lua

local nd = require "needle"
local R = require "spec.helpers.reference"

local close, equal = R.asserts(assert)

local T = require("spec.helpers.tensors").T -- a needle tensor of a reference's values

local function grid(shape, seed) return R.grid(shape, seed, -2, 2) end
local tol = { rtol = 1e-5, atol = 1e-5 }

-- Checks x:matmul(y), nd.matmul(x, y) against the reference product.
local function check(a, b, ra, rb, opts, what)
  local want = R.matmul(ra, rb)
  local y1 = a:matmul(b)
  local y2 = nd.matmul(a, b)
  close(y1, want, opts or tol, (what or "") .. " x:matmul(y)")
  close(y2, want, opts or tol, (what or "") .. " nd.matmul(x, y)")
  return y1
end

---------------------------------------------------------------------------
describe("matmul shapes", function()
  it("1-D x 1-D is the dot product, a 0-dim tensor", function()
    local ra, rb = grid({ 5 }, 1), grid({ 5 }, 2)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({}, y.shape)
    local dot = 0
    for i = 1, 5 do dot = dot + ra.data[i] * rb.data[i] end
    close(y:item(), dot)
    -- hand-computed
    close(nd.matmul(nd.tensor({ 1, 2, 3 }), nd.tensor({ 4, 5, 6 })), 32)
  end)

  it("1-D x 2-D gives a 1-D result", function()
    local ra, rb = grid({ 3 }, 3), grid({ 3, 4 }, 4)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 4 }, y.shape)
  end)

  it("2-D x 1-D gives a 1-D result", function()
    local ra, rb = grid({ 4, 3 }, 5), grid({ 3 }, 6)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 4 }, y.shape)
    equal(nd.matmul(nd.tensor({ { 1, 2 }, { 3, 4 } }), nd.tensor({ 1, 1 })), { 3, 7 })
  end)

  it("2-D x 2-D", function()
    local ra, rb = grid({ 2, 3 }, 7), grid({ 3, 4 }, 8)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 2, 4 }, y.shape)
    equal(nd.matmul(nd.tensor({ { 1, 2 }, { 3, 4 } }), nd.tensor({ { 5, 6 }, { 7, 8 } })),
          { { 19, 22 }, { 43, 50 } })
  end)

  it("nd.mm is matmul for matrices", function()
    local ra, rb = grid({ 3, 2 }, 9), grid({ 2, 5 }, 10)
    close(nd.mm(T(ra), T(rb)), R.matmul(ra, rb), tol)
  end)

  it("batched 3-D x 3-D", function()
    local ra, rb = grid({ 2, 3, 4 }, 11), grid({ 2, 4, 5 }, 12)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 2, 3, 5 }, y.shape)
  end)

  it("broadcast batch {2,1,3,4} x {5,4,2} -> {2,5,3,2}", function()
    local ra, rb = grid({ 2, 1, 3, 4 }, 13), grid({ 5, 4, 2 }, 14)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 2, 5, 3, 2 }, y.shape)
  end)

  it("3-D x 2-D broadcasts the matrix over the batch", function()
    local ra, rb = grid({ 3, 2, 4 }, 15), grid({ 4, 3 }, 16)
    local y = check(T(ra), T(rb), ra, rb)
    assert.are.same({ 3, 2, 3 }, y.shape)
  end)

  it("1-D x 3-D and 3-D x 1-D drop the added dim", function()
    local rv, rm = grid({ 4 }, 17), grid({ 2, 4, 5 }, 18)
    local y = check(T(rv), T(rm), rv, rm)
    assert.are.same({ 2, 5 }, y.shape)
    local rm2, rv2 = grid({ 2, 3, 4 }, 19), grid({ 4 }, 20)
    y = check(T(rm2), T(rv2), rm2, rv2)
    assert.are.same({ 2, 3 }, y.shape)
  end)

  it("K = 0 gives zeros", function()
    local y = nd.matmul(nd.ones({ 2, 0 }), nd.ones({ 0, 3 }))
    assert.are.same({ 2, 3 }, y.shape)
    equal(y, { { 0, 0, 0 }, { 0, 0, 0 } })
    local yb = nd.matmul(nd.ones({ 2, 3, 0 }), nd.ones({ 2, 0, 4 }))
    assert.are.same({ 2, 3, 4 }, yb.shape)
    equal(yb, R.generate({ 2, 3, 4 }, function() return 0 end))
    local yd = nd.matmul(nd.ones({ 0 }), nd.ones({ 0 }))
    assert.are.same({}, yd.shape)
    close(yd, 0)
  end)

  it("K = 0 overwrites: the result is zeros even for garbage-filled outputs (repeated)", function()
    for _ = 1, 5 do
      local _ = nd.full({ 4, 4 }, 7) -- recycle memory
      equal(nd.matmul(nd.empty({ 4, 0 }), nd.empty({ 0, 4 })), R.generate({ 4, 4 }, function() return 0 end))
    end
  end)

  it("M = 0 or N = 0 give empty results of the right shape", function()
    assert.are.same({ 0, 4 }, nd.matmul(nd.ones({ 0, 3 }), nd.ones({ 3, 4 })).shape)
    assert.are.same({ 2, 0 }, nd.matmul(nd.ones({ 2, 3 }), nd.ones({ 3, 0 })).shape)
    assert.are.same({ 0, 2, 2 }, nd.matmul(nd.ones({ 0, 2, 3 }), nd.ones({ 3, 2 })).shape)
  end)
end)

---------------------------------------------------------------------------
describe("matmul operand layouts", function()
  it("transposed operands x:t() equal the contiguous computation", function()
    local rat, rbt = grid({ 4, 3 }, 21), grid({ 5, 4 }, 22) -- a = rat^T {3,4}, b = rbt^T {4,5}
    local a, b = T(rat):t(), T(rbt):t()
    assert.is_false(a:is_contiguous())
    assert.is_false(b:is_contiguous())
    local ra, rb = R.transpose(rat), R.transpose(rbt)
    local want = R.matmul(ra, rb)
    local ac, bc = a:contiguous(), b:contiguous()
    local contiguous_result = nd.matmul(ac, bc)
    close(contiguous_result, want, tol, "contiguous")
    close(nd.matmul(a, b), want, tol, "both transposed")
    close(nd.matmul(a, bc), want, tol, "left transposed")
    close(nd.matmul(ac, b), want, tol, "right transposed")
    equal(nd.matmul(a, b), R.from(contiguous_result:totable()), "t() vs contiguous")
  end)

  it("transposed 1-row and 1-column matrices", function()
    local rr, rc = grid({ 1, 4 }, 23), grid({ 4, 1 }, 24)
    local row, col = T(rr), T(rc)
    -- {4,1}:t() is {1,4}; {1,4}:t() is {4,1}
    check(col:t(), row:t(), R.transpose(rc), R.transpose(rr), tol, "col:t() x row:t()")
    check(row:t(), col:t(), R.transpose(rr), R.transpose(rc), tol, "row:t() x col:t()")
  end)

  it("1-row and 1-column views with non-unit strides", function()
    local rbase = grid({ 4, 5 }, 60)
    local base = T(rbase)
    local row = base:t()[{ { 2, 2 }, ":" }]   -- {1,4}, strides {1,5}
    local col = base[{ ":", { 3, 3 } }]        -- {4,1}, strides {5,1}
    local rrow = R.slice(R.transpose(rbase), 1, 2, 2)
    local rcol = R.slice(rbase, 2, 3, 3)
    assert.are.same({ 1, 4 }, row.shape)
    assert.are.same({ 4, 1 }, col.shape)
    check(row, col, rrow, rcol, tol, "row x col")
    check(col, row, rcol, rrow, tol, "col x row")
    local rm = grid({ 4, 3 }, 61)
    check(row, T(rm), rrow, rm, tol, "row x matrix")
    local rm2 = grid({ 3, 4 }, 62)
    check(T(rm2), col, rm2, rcol, tol, "matrix x col")
    -- 1-D views with stride 5 (a column of a matrix)
    local v = base[{ ":", 2 }]
    local rv = R.new({ 4 }, { rbase.data[2], rbase.data[7], rbase.data[12], rbase.data[17] })
    check(v, T(rm), rv, rm, tol, "strided vector x matrix")
    check(T(rm2), v, rm2, rv, tol, "matrix x strided vector")
    check(v, v, rv, rv, tol, "strided dot")
  end)

  it("row-step sliced operands (x[{{1,-1,2}, ':'}], BLAS leading dimension)", function()
    local rba, rbb = grid({ 6, 4 }, 25), grid({ 8, 5 }, 27)
    local a = T(rba)[{ { 1, -1, 2 }, ":" }] -- rows 1,3,5 -> {3,4}
    local b = T(rbb)[{ { 2, -1, 2 }, ":" }] -- rows 2,4,6,8 -> {4,5}
    local ra, rb = R.slice(rba, 1, 1, -1, 2), R.slice(rbb, 1, 2, -1, 2)
    assert.are.same({ 3, 4 }, a.shape)
    assert.are.same({ 4, 5 }, b.shape)
    assert.is_false(a:is_contiguous())
    assert.is_false(b:is_contiguous())
    check(a, b, ra, rb, tol, "row step")
    check(a, T(rb), ra, rb, tol, "left row step")
    check(T(ra), b, ra, rb, tol, "right row step")
  end)

  it("column-step sliced operands (non-BLAS layouts, x:slice(2, 1, -1, 2))", function()
    local rba, rbb = grid({ 3, 8 }, 28), grid({ 4, 10 }, 29)
    local a = T(rba):slice(2, 1, -1, 2) -- {3,4}, column stride 2
    local b = T(rbb):slice(2, 2, -1, 2) -- {4,5}, column stride 2
    local ra, rb = R.slice(rba, 2, 1, -1, 2), R.slice(rbb, 2, 2, -1, 2)
    assert.are.same({ 3, 4 }, a.shape)
    assert.are.same({ 4, 5 }, b.shape)
    check(a, b, ra, rb, tol, "column step")
    check(a, T(rb), ra, rb, tol, "left column step")
    check(T(ra), b, ra, rb, tol, "right column step")
  end)

  it("operands stepped in both dims", function()
    local rba, rbb = grid({ 6, 8 }, 30), grid({ 8, 6 }, 31)
    local a = T(rba)[{ { 1, -1, 2 }, { 1, -1, 2 } }] -- {3,4}
    local b = T(rbb)[{ { 1, -1, 2 }, { 2, -1, 2 } }] -- {4,3}
    local ra = R.slice(R.slice(rba, 1, 1, -1, 2), 2, 1, -1, 2)
    local rb = R.slice(R.slice(rbb, 1, 1, -1, 2), 2, 2, -1, 2)
    check(a, b, ra, rb, tol, "both dims stepped")
  end)

  it("transposed and stepped (x:t() of a column-step slice)", function()
    local rbase = grid({ 4, 6 }, 32)
    local a = T(rbase):slice(2, 1, -1, 2):t() -- {3,4}, strides {2,6}
    local ra = R.transpose(R.slice(rbase, 2, 1, -1, 2))
    local rb = grid({ 4, 2 }, 33)
    check(a, T(rb), ra, rb, tol, "t() of step slice")
  end)

  it("expanded batch operands (stride-0 batch dims)", function()
    local rm, rb = grid({ 3, 4 }, 34), grid({ 2, 4, 5 }, 35)
    local a = T(rm):expand({ 2, 3, 4 })
    local ra = R.expand(rm, { 2, 3, 4 })
    check(a, T(rb), ra, rb, tol, "expanded left batch")
    local rbm = grid({ 1, 4, 5 }, 36)
    local b = T(rbm):expand({ 2, 4, 5 })
    check(T(ra), b, ra, R.expand(rbm, { 2, 4, 5 }), tol, "expanded right batch")
    check(a, b, ra, R.expand(rbm, { 2, 4, 5 }), tol, "both expanded")
  end)

  it("expanded inside the matrix (stride-0 rows or columns)", function()
    local rcol = grid({ 3, 1 }, 37)
    local a = T(rcol):expand({ 3, 4 })
    local rrow = grid({ 1, 5 }, 38)
    local b = T(rrow):expand({ 4, 5 })
    check(a, b, R.expand(rcol, { 3, 4 }), R.expand(rrow, { 4, 5 }), tol, "expanded matrices")
  end)

  it("permuted batched operands", function()
    local rba = grid({ 3, 2, 4 }, 39) -- permute(2,1,3) -> {2,3,4}
    local rbb = grid({ 5, 4, 2 }, 40) -- permute(3,2,1) -> {2,4,5}
    local a = T(rba):permute(2, 1, 3)
    local b = T(rbb):permute(3, 2, 1)
    check(a, b, R.permute(rba, { 2, 1, 3 }), R.permute(rbb, { 3, 2, 1 }), tol, "permuted batch")
  end)

  it("a view with a storage offset (narrowed rows and columns)", function()
    local rbase = grid({ 5, 6 }, 41)
    local a = T(rbase):narrow(1, 2, 3):narrow(2, 3, 4) -- rows 2..4, cols 3..6
    local ra = R.slice(R.slice(rbase, 1, 2, 4), 2, 3, 6)
    local rb = grid({ 4, 2 }, 42)
    check(a, T(rb), ra, rb, tol, "offset view")
    check(T(grid({ 2, 3 }, 43)), a, grid({ 2, 3 }, 43), ra, tol, "offset view right")
  end)
end)

---------------------------------------------------------------------------
-- Products with one column or one row (cpu_gemm.c's dot and axpy forms):
-- float32 against float64's BLAS product of the same values, with A's rows
-- or columns of unit stride or neither (the tile kernel), a strided vector,
-- sizes with every block remainder, and big enough for threads.
describe("matrix-vector products", function()
  local function against_f64(a, b, what)
    local got = a:matmul(b)
    local want = a:double():matmul(b:double())
    local K = a.shape[#a.shape]
    local scale = (a:double():abs():matmul(b:double():abs())):max():item()
    local d = (got:double() - want):abs():max():item()
    assert.is_true(d <= 1e-6 * scale * math.sqrt(K) + 1e-6, ("%s: differs by %g (scale %g)"):format(what, d, scale))
    return got
  end
  before_each(function() nd.manual_seed(5) end)
  for _, mk in ipairs({{2049, 1031}, {37, 5}, {3, 5000}, {1, 1}}) do
    local M, K = mk[1], mk[2]
    it(("A (%d x %d) @ a column, every layout of A"):format(M, K), function()
      local a, at = nd.randn({M, K}), nd.randn({K, M}):t()
      local wide = nd.randn({M, 2 * K})
      local stepped = wide:slice(2, 1, -1, 2) -- neither stride 1
      local v = nd.randn({K, 1})
      local vs = nd.randn({K, 3})[{":", {2, 2}}] -- a column of stride 3
      for _, c in ipairs({{a, "rows"}, {at, "columns"}, {stepped, "stepped"}}) do
        against_f64(c[1], v, c[2])
        against_f64(c[1], vs, c[2] .. ", strided vector")
        against_f64(c[1], v:reshape({K}), c[2] .. ", 1-D vector")
      end
    end)
    it(("a row @ B (%d x %d), every layout of B"):format(K, M), function()
      local b, bt = nd.randn({K, M}), nd.randn({M, K}):t()
      local u = nd.randn({1, K})
      local us = nd.randn({3, K})[{{2, 2}, ":"}]:t():contiguous():t() -- a row of stride != 1
      for _, c in ipairs({{b, "rows"}, {bt, "columns"}}) do
        against_f64(u, c[1], c[2])
        against_f64(us, c[1], c[2] .. ", strided row")
        against_f64(u:reshape({K}), c[1], c[2] .. ", 1-D vector")
      end
    end)
  end
  it("a dot of 10,000 floats keeps float32's accuracy", function()
    local v = nd.randn({10000}) + 3
    local got = v:matmul(v):item()
    local want = v:double():matmul(v:double()):item()
    assert.is_true(math.abs(got - want) <= 2e-7 * want, ("dot %.9g, float64 %.9g"):format(got, want))
  end)
  it("a dot of two strided vectors, and of a strided and a contiguous one", function()
    local m = nd.randn({5001, 3})
    local a, b, c = m[{":", 1}], m[{":", 3}], nd.randn({5001})
    for _, pair in ipairs({{a, b}, {a, c}, {c, b}}) do
      local got = pair[1]:matmul(pair[2]):item()
      local want = pair[1]:double():matmul(pair[2]:double()):item()
      local scale = (pair[1]:double():abs() * pair[2]:double():abs()):sum():item()
      assert.is_true(math.abs(got - want) <= 1e-6 * scale, ("dot %.9g, float64 %.9g"):format(got, want))
    end
  end)
  it("linear to one output: bias and activation in the epilogue", function()
    local x, w, b = nd.randn({3000, 700}), nd.randn({1, 700}), nd.randn({1})
    for _, act in ipairs({"relu", "gelu"}) do
      local got = nd.F.fused_linear(x, w, b, {activation = act})
      local want = nd.F[act](x:double():matmul(w:double():t()) + b:double())
      local d = (got:double() - want):abs():max():item()
      assert.is_true(d < 1e-3, act .. ": differs by " .. d)
    end
  end)
end)

describe("matmul dtypes", function()
  it("float64 x float64 gives float64 at double precision", function()
    local ra = R.generate({ 3, 4 }, function(i) return (i + 1) / 3 end)
    local rb = R.generate({ 4, 2 }, function(i) return (i - 3) / 7 end)
    local y = nd.matmul(T(ra, "float64"), T(rb, "float64"))
    assert.are.equal("float64", y.dtype)
    close(y, R.matmul(ra, rb), { rtol = 1e-13, atol = 1e-13 })
  end)

  it("float32 x float64 gives float64", function()
    local y = nd.matmul(nd.ones({ 2, 2 }), nd.ones({ 2, 2 }, { dtype = "float64" }))
    assert.are.equal("float64", y.dtype)
  end)

  it("int64 x int64 gives exact int64", function()
    local ra, rb = R.ints({ 3, 4 }, 44, -1000, 1000), R.ints({ 4, 5 }, 45, -1000, 1000)
    local y = nd.matmul(T(ra, "int64"), T(rb, "int64"))
    assert.are.equal("int64", y.dtype)
    equal(y, R.matmul(ra, rb))
    assert.are.equal("integer", math.type(y:totable()[1][1]))
  end)

  it("int64 batched, transposed and 1-D operands", function()
    local ra, rb = R.ints({ 2, 3, 4 }, 46, -50, 50), R.ints({ 4 }, 47, -50, 50)
    equal(nd.matmul(T(ra, "int64"), T(rb, "int64")), R.matmul(ra, rb))
    local rt = R.ints({ 4, 3 }, 48, -50, 50)
    local rc = R.ints({ 4, 2 }, 49, -50, 50)
    equal(nd.matmul(T(rt, "int64"):t(), T(rc, "int64")), R.matmul(R.transpose(rt), rc))
  end)

  it("int64 matmul is exact for values above 2^53", function()
    local big = (1 << 53) + 1
    local y = nd.matmul(nd.tensor({ { big } }, { dtype = "int64" }), nd.tensor({ { 1 } }, { dtype = "int64" }))
    assert.are.equal(("%d"):format(big), ("%d"):format(y:totable()[1][1]))
    local z = nd.matmul(nd.tensor({ 3, 5 }, { dtype = "int64" }), nd.tensor({ big, big }, { dtype = "int64" }))
    assert.are.equal(("%d"):format(8 * big), ("%d"):format(z:item()))
  end)

  it("int64 matmul wraps around like Lua integers", function()
    local a = nd.tensor({ { 1 << 62, 1 << 62 } }, { dtype = "int64" })
    local b = nd.tensor({ { 2 }, { 2 } }, { dtype = "int64" })
    assert.are.equal(("%d"):format((1 << 62) * 2 + (1 << 62) * 2), ("%d"):format(nd.matmul(a, b):item()))
  end)

  it("int64 x float32 gives float32", function()
    local y = nd.matmul(nd.tensor({ { 1, 2 } }, { dtype = "int64" }), nd.tensor({ { 0.5 }, { 0.25 } }))
    assert.are.equal("float32", y.dtype)
    close(y, { { 1 } })
  end)
end)

---------------------------------------------------------------------------
describe("matmul size", function()
  it("64x64 against the naive reference at rtol 1e-4", function()
    local rnd = R.lcg(50)
    local ra = R.generate({ 64, 64 }, function() return rnd(-1000, 1000) / 997 end)
    local rb = R.generate({ 64, 64 }, function() return rnd(-1000, 1000) / 991 end)
    local ra32 = R.map(ra, R.f32)
    local rb32 = R.map(rb, R.f32)
    local want = R.matmul(ra32, rb32)
    close(nd.matmul(T(ra), T(rb)), want, { rtol = 1e-4, atol = 1e-4 })
    -- transposed operand of the same values
    local at = T(R.transpose(ra32)):t()
    close(nd.matmul(at, T(rb)), want, { rtol = 1e-4, atol = 1e-4 }, "transposed")
  end)

  it("batched 8 x (33x17) @ (17x29), odd sizes", function()
    local ra, rb = grid({ 8, 33, 17 }, 51), grid({ 8, 17, 29 }, 52)
    close(nd.matmul(T(ra), T(rb)), R.matmul(ra, rb), { rtol = 1e-5, atol = 1e-4 })
  end)
end)

---------------------------------------------------------------------------
describe("matmul errors", function()
  it("mismatched inner dims give the exact message", function()
    local ok, err = pcall(nd.matmul, nd.ones({ 2, 3 }), nd.ones({ 4, 5 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul: shapes {2,3} and {4,5} do not match (3 ~= 4)", 1, true), err)
    -- and the message is exactly that after the position prefix
    assert.truthy(err:match("needle%.matmul: shapes {2,3} and {4,5} do not match %(3 ~= 4%)$"), err)
  end)

  it("the method form gives the same message", function()
    local a = nd.ones({ 2, 3 })
    assert.has_error(function() return a:matmul(nd.ones({ 4, 5 })) end)
    local ok, err = pcall(function() return a:matmul(nd.ones({ 4, 5 })) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul: shapes {2,3} and {4,5} do not match (3 ~= 4)", 1, true), err)
  end)

  it("1-D operands of different lengths", function()
    local ok, err = pcall(nd.matmul, nd.ones({ 3 }), nd.ones({ 4 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul: shapes {3} and {4} do not match (3 ~= 4)", 1, true), err)
  end)

  it("batch dims that cannot broadcast name both operand shapes", function()
    local ok, err = pcall(nd.matmul, nd.ones({ 2, 2, 3 }), nd.ones({ 3, 3, 2 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul:", 1, true), err)
    assert.truthy(err:find("{2,2,3}", 1, true), err)
    assert.truthy(err:find("{3,3,2}", 1, true), err)
  end)

  it("0-dim operands are an error", function()
    local ok, err = pcall(nd.matmul, nd.tensor(2), nd.ones({ 2 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul:", 1, true), err)
  end)

  it("a non-tensor operand is an error naming the argument", function()
    local ok, err = pcall(nd.matmul, nd.ones({ 2, 2 }), "x")
    assert.is_false(ok)
    assert.truthy(err:find("needle.matmul:", 1, true), err)
    assert.truthy(err:find("string", 1, true), err)
  end)
end)

---------------------------------------------------------------------------
-- needle's own float32 GEMM on the CPU (cpu_gemm.c, chosen from cpuid: AVX-512F 12x32
-- or AVX2+FMA 6x16 microkernels; NEEDLE_GEMM=avx2 / openblas pick the others). Against
-- float64 products: shapes around the microkernel tile, the K block (384) and the row
-- block, every layout, strided and broadcast operands; results bit for bit the same on 1
-- and 2 threads; the same checks in a child process on each kernel the CPU has.
describe("matmul on the CPU: needle's GEMM", function()
  local S = require "spec.helpers.shell"
  local kernel = nd.devices()[1].gemm

  it("reports its kernel in nd.devices()", function()
    assert.truthy(kernel == "openblas" or kernel:find("^avx512f ") or kernel:find("^avx2%+fma "), kernel)
  end)

  -- worst error of a float32 product against float64, scaled by sqrt(K) (rounding grows so)
  local CHECK = [[
    local nd = require "needle"
    nd.manual_seed(11)
    local worst, cases = 0, 0
    local function check(a, b)
      local got = a:matmul(b):to("float64")
      local want = a:to("float64"):matmul(b:to("float64"))
      local K = a.shape[#a.shape]
      worst = math.max(worst, (got - want):abs():max():item() / math.sqrt(K))
      cases = cases + 1
      return got
    end
    local shapes = {{1, 1, 1}, {5, 7, 3}, {12, 32, 383}, {13, 33, 385}, {24, 64, 768}, {25, 17, 769},
                    {20, 1024, 256}, {20, 256, 1024}, {193, 70, 400}, {6, 16, 16}, {7, 15, 5}, {1, 300, 2},
                    {400, 3, 50}}
    for _, s in ipairs(shapes) do
      local M, N, K = s[1], s[2], s[3]
      for _, ta in ipairs({false, true}) do
        for _, tb in ipairs({false, true}) do
          local a = ta and nd.randn({K, M}):t() or nd.randn({M, K})
          local b = tb and nd.randn({N, K}):t() or nd.randn({K, N})
          check(a, b)
        end
      end
      -- every other row and column of bigger tensors (no unit stride anywhere)
      local a = nd.randn({2 * M, 2 * K})[{{1, -1, 2}, {1, -1, 2}}]
      local b = nd.randn({2 * K, 2 * N})[{{1, -1, 2}, {1, -1, 2}}]
      check(a, b)
    end
    -- batched, with a batch dim broadcast (stride 0)
    check(nd.randn({3, 2, 30, 40}), nd.randn({1, 2, 40, 50}):expand({3, 2, 40, 50}))
    -- attention's products: heads split from (N, L, H*D) by permuted views, K
    -- transposed: threads take whole products (2 MFLOP each; a batch of 3
    -- of 20 MFLOP too), and larger ones (46 MFLOP) one at a time, split
    local q = nd.randn({4, 128, 4 * 64}):reshape({4, 128, 4, 64}):permute({1, 3, 2, 4})
    local k = nd.randn({4, 128, 4 * 64}):reshape({4, 128, 4, 64}):permute({1, 3, 2, 4})
    check(q, k:transpose(3, 4))
    check(nd.randn({3, 200, 256}), nd.randn({3, 256, 200}))
    check(nd.randn({2, 300, 256}), nd.randn({2, 256, 300}))
    check(nd.randn({5, 1, 7}), nd.randn({7, 3})) -- a batch of row vectors against one matrix
    -- the same bits on one thread and on two, for one product and for batches
    local function both(fn)
      nd.set_num_threads(1, {adaptive = false})
      local one = fn()
      nd.set_num_threads(2)
      local two = fn()
      return (one - two):abs():max():item()
    end
    local a, b = nd.randn({300, 500}), nd.randn({500, 200})
    local diff = both(function() return a:matmul(b) end)
    diff = math.max(diff, both(function() return q:matmul(k:transpose(3, 4)) end))
    local a3, b3 = nd.randn({3, 200, 256}), nd.randn({3, 256, 200})
    diff = math.max(diff, both(function() return a3:matmul(b3) end))
    print(("kernel %s cases %d worst %.3g threads_diff %.17g"):format(nd.devices()[1].gemm, cases, worst, diff))
  ]]

  local function child(env) return S.run_program(env, CHECK) end

  -- Packed B is cut into column blocks sized to the L2 cache (NEEDLE_L2_BYTES overrides
  -- what Linux reports; 64 KiB gives one 32-column panel a block), and an A panel stays
  -- in L1 while the block's B panels stream past it. The block width must not change a
  -- bit (each element's sum runs over the same K blocks), tiles at every block's edge
  -- must land where they belong, and the fused linear's epilogue (bias, activation)
  -- must run once on each tile.
  local BLOCKS = [[
    local nd = require "needle"
    nd.manual_seed(5)
    local worst, out = 0, {}
    local function check(name, got, want, K)
      worst = math.max(worst, (got:to("float64") - want):abs():max():item() / math.sqrt(K))
      out[name] = got
    end
    -- M above the in-place-B limit (256 rows), N across several blocks, K across K blocks
    for i, s in ipairs({{300, 70, 400}, {261, 161, 33}, {520, 97, 800}, {289, 1100, 50}}) do
      local M, N, K = s[1], s[2], s[3]
      for _, tb in ipairs({false, true}) do
        local a = nd.randn({M, K})
        local b = tb and nd.randn({N, K}):t() or nd.randn({K, N})
        check(("mm%d%s"):format(i, tb), a:matmul(b), a:to("float64"):matmul(b:to("float64")), K)
      end
      -- A a view whose rows are K + 5 apart, at an offset: when B streams, the AVX-512
      -- kernel reads A's rows in place (packed otherwise), and must find each row
      local av, b = nd.randn({M, K + 5})[{":", {3, K + 2}}], nd.randn({K, N})
      check(("view%d"):format(i), av:matmul(b), av:to("float64"):matmul(b:to("float64")), K)
      -- the fused linear (x @ w^T + b, relu) on the GEMM's tile epilogue
      local x, w, bias = nd.randn({M, K}), nd.randn({N, K}), nd.randn({N})
      local x64, w64 = x:to("float64"), w:to("float64")
      check("linear" .. i, nd.F.fused_linear(x, w, bias, {activation = "relu"}),
            (x64:matmul(w64:t()) + bias:to("float64")):relu(), K)
    end
    nd.save(out, OUT)
    print(("l2 %d worst %.3g"):format(nd.devices()[1].l2_cache, worst))
  ]]

  it("cuts packed B into L2-sized column blocks without changing a bit", function()
    local function run(env)
      local path = os.tmpname()
      local text = S.run_program(env, ("local OUT = %q\n"):format(path) .. BLOCKS)
      local l2, worst = text:match("l2 (%d+) worst (%S+)")
      assert.truthy(l2, text)
      assert.is_true(tonumber(worst) < 1e-5, text) -- a misplaced tile is off by O(1)
      local t = nd.load(path)
      os.remove(path)
      return tonumber(l2), t
    end
    local l2s, small = run("NEEDLE_L2_BYTES=65536")
    local l2b, big = run("NEEDLE_L2_BYTES=")
    assert.are.equal(65536, l2s)
    assert.is_true(l2b >= 65536)
    local n = 0
    for name, t in pairs(small) do
      assert.are.equal(0, (t - big[name]):abs():max():item(), name)
      n = n + 1
    end
    assert.are.equal(16, n)
  end)

  it("reads NEEDLE_L2_BYTES as bytes, K or M, clamped, and ignores what is not a size", function()
    local code = [[print("l2=" .. require("needle").devices()[1].l2_cache)]]
    local function l2(env) return tonumber(S.run_program(env, code):match("l2=(%d+)")) end
    local detected = l2("NEEDLE_L2_BYTES=")
    assert.is_true(detected >= 65536 and detected <= 64 * 2 ^ 20, tostring(detected))
    assert.are.equal(2 * 2 ^ 20, l2("NEEDLE_L2_BYTES=2M"))
    assert.are.equal(1280 * 1024, l2("NEEDLE_L2_BYTES=1280K"))
    assert.are.equal(300000, l2("NEEDLE_L2_BYTES=300000"))
    assert.are.equal(65536, l2("NEEDLE_L2_BYTES=1K")) -- at least 64 KiB
    assert.are.equal(64 * 2 ^ 20, l2("NEEDLE_L2_BYTES=1000M")) -- at most 64 MiB
    assert.are.equal(detected, l2("NEEDLE_L2_BYTES=lots"))
  end)

  -- Products with at most 16 columns (8 with AVX2) run narrow kernels (24 x 16, 24 x 8,
  -- 12 x 8) instead of computing 32 (16) columns for the few wanted. Each element is
  -- the same chain of FMAs over the same K blocks, so a narrow product must equal the
  -- same columns of a wide one (B with 40 more columns) bit for bit: row counts below
  -- and above the in-place-B limit (256), K over three K blocks, every layout of B,
  -- and the fused linear's epilogue.
  local NARROW = [[
    local nd = require "needle"
    nd.manual_seed(21)
    local worst, cases, mismatches = 0, 0, {}
    local function same(narrow, wide, what)
      cases = cases + 1
      if not nd.equal(narrow, wide) then mismatches[#mismatches + 1] = what end
    end
    for _, M in ipairs({203, 700}) do
      local K = 777
      local a = nd.randn({M, K})
      local a64 = a:to("float64")
      for _, N in ipairs({2, 3, 5, 8, 9, 10, 15, 16, 17, 23}) do
        local wide = nd.randn({K, N + 40})
        local layouts = {rows = wide, cols = wide:t():contiguous():t(),
                         stepped = nd.randn({K, 2 * (N + 40)})[{":", {1, -1, 2}}]}
        for name, bw in pairs(layouts) do
          local b = bw[{":", {1, N}}]
          local got = a:matmul(b)
          local what = ("%dx%dx%d %s"):format(M, N, K, name)
          same(got, a:matmul(bw)[{":", {1, N}}], what)
          worst = math.max(worst, (got:to("float64") - a64:matmul(b:to("float64"))):abs():max():item() / math.sqrt(K))
        end
        if M > 256 then -- (up to 256 rows a linear may take the few-rows kernel, whose order is its own)
          local w, bias = nd.randn({N + 40, K}), nd.randn({N + 40})
          local narrow = nd.F.fused_linear(a, w[{{1, N}, ":"}], bias[{{1, N}}], {activation = "relu"})
          same(narrow, nd.F.fused_linear(a, w, bias, {activation = "relu"})[{":", {1, N}}], ("linear %dx%d"):format(M, N))
        end
      end
    end
    print(("kernel %s cases %d worst %.3g mismatches %d %s"):format(nd.devices()[1].gemm, cases, worst,
          #mismatches, table.concat(mismatches, ", ")))
  ]]

  for _, env in ipairs({"NEEDLE_GEMM=", "NEEDLE_GEMM=avx2"}) do
    it("runs products with few columns on narrow kernels, with the wide kernel's bits (" .. env .. ")", function()
      local out = S.run_program(env, NARROW)
      local k, cases, worst, bad = out:match("kernel (.-) cases (%d+) worst (%S+) mismatches (%d+)")
      assert.truthy(k, out)
      assert.are.equal(70, tonumber(cases), out)
      assert.are.equal(0, tonumber(bad), out)
      assert.is_true(tonumber(worst) < 1e-5, out)
    end)
  end

  for _, env in ipairs({"NEEDLE_GEMM=", "NEEDLE_GEMM=avx2", "NEEDLE_GEMM=openblas"}) do
    it("agrees with float64 products in every layout and stride, on any thread count (" .. env .. ")", function()
      local out = child(env)
      local k, cases, worst, diff = out:match("kernel (.-) cases (%d+) worst (%S+) threads_diff (%S+)")
      assert.truthy(k, out)
      assert.are.equal(70, tonumber(cases), out)
      assert.is_true(tonumber(worst) < 1e-5, out) -- a wrong tile or panel is off by O(1)
      if k ~= "openblas" then
        assert.are.equal(0, tonumber(diff), out) -- (OpenBLAS's own split does change the bits)
      end
      if env == "NEEDLE_GEMM=openblas" then
        assert.are.equal("openblas", k)
      elseif env == "NEEDLE_GEMM=avx2" then -- AVX2 where the CPU has it, else BLAS
        assert.truthy(k:find("^avx2%+fma") or k == "openblas", k)
      else
        assert.are.equal(kernel, k)
      end
    end)
  end
end)
