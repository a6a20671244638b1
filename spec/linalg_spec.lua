-- linalg_spec.lua - nd.linalg (docs/linalg.md): results and gradients
-- against PyTorch's (spec/fixtures/gen/gen_torch_linalg.py wrote the
-- fixtures, float64), on the CPU and on every OpenCL device; float64
-- finite-difference gradchecks of every gradient (first and second order);
-- empty and singular inputs; and the errors.
--
--   build/needle-lua spec/run.lua spec/linalg_spec.lua
local nd = require "needle"
local L = nd.linalg
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)
local A_ = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A_.errmsg, A_.assert_contains

local fixtures = dofile("spec/fixtures/torch_linalg.lua")

local function tensor(t, opts)
  return nd.tensor(t.data, opts or {dtype = "float64"}):reshape(t.shape)
end

-- every element of got within rtol * |want| + atol
local function close(label, got, want, rtol, atol)
  assert.are.same(want.shape, got.shape, label .. ": shape")
  local g = got:double():cpu():contiguous():view({-1}):totable()
  for i, w in ipairs(want.data) do
    if not (math.abs(g[i] - w) <= rtol * math.abs(w) + atol) then
      error(("%s: element %d is %.12g, PyTorch %.12g"):format(label, i, g[i], w), 2)
    end
  end
end

-- The fixture's output: the results joined flat, with each singular vector,
-- eigenvector and Q column's sign fixed as the generator fixes it (`joined`
-- in gen_torch_linalg.py).
local function flat(...)
  local parts = {}
  for i, t in ipairs({...}) do parts[i] = t:reshape({-1}) end
  return nd.cat(parts, 1)
end
local function firstsign(x) return x:narrow(-2, 1, 1):sign() end
local function diagonal(x)
  return (x * nd.eye(x:size(-1), {dtype = x.dtype, device = x.device})):sum(-1)
end

local function joined(name, ...)
  local r = {...}
  if name == "slogdet" then return flat(r[1], r[2]) end
  if name == "qr" then
    local q, R = r[1], r[2]
    local k = math.min(R:size(-2), R:size(-1))
    local s = diagonal(R:narrow(-2, 1, k):narrow(-1, 1, k)):sign():unsqueeze(-2)
    return flat(q:narrow(-1, 1, k) * s, R:narrow(-2, 1, k) * s:transpose(-2, -1))
  end
  if name == "svd" then
    local k = r[2]:size(-1)
    local u, vh = r[1]:narrow(-1, 1, k), r[3]:narrow(-2, 1, k)
    local g = firstsign(u)
    return flat(u * g, r[2], vh * g:transpose(-2, -1))
  end
  if name == "eigh" then return flat(r[1], r[2] * firstsign(r[2])) end
  return r[1]
end

local function options_of(c)
  return next(c.options) and c.options or nil
end

-- Runs case c on dev in dtype dt: its output, and its gradients when grads.
local function run_case(c, dev, dt, grads)
  local inputs = {}
  for i, t in ipairs(c.inputs) do
    -- the inputs are float32 values (9 digits in the file): read as float32, they are exact
    inputs[i] = tensor(t, {dtype = "float32"}):to({dtype = dt, device = dev})
    inputs[i].requires_grad = grads
  end
  local args = {table.unpack(inputs)}
  args[#args + 1] = options_of(c)
  local results = table.pack(L[c.name](table.unpack(args, 1, #inputs + 1)))
  local out = joined(c.name, table.unpack(results, 1, results.n))
  local g
  if grads then
    g = nd.grad((out * tensor(c.w, {dtype = dt, device = dev})):sum(), inputs)
  end
  return out, g, results
end

local function label(i, c, dev, dt)
  local opts = {}
  for k, v in pairs(c.options) do opts[#opts + 1] = k .. "=" .. tostring(v) end
  table.sort(opts)
  return ("case %d %s{%s} on %s in %s"):format(i, c.name, table.concat(opts, ","), dev, dt)
end

describe("nd.linalg against PyTorch", function()
  it("has the fixture cases", function() assert.is_true(#fixtures >= 25) end)

  for _, dev in ipairs(D.all()) do
    local f64 = D.fp64(dev)
    it("float64 results and gradients on " .. D.describe(dev) .. (f64 and "" or " (no fp64: float32)"), function()
      local dt = f64 and "float64" or "float32"
      local rtol, atol = f64 and 1e-9 or 2e-4, f64 and 1e-9 or 2e-4
      for i, c in ipairs(fixtures) do
        local what = label(i, c, dev, dt)
        local out, grads, results = run_case(c, dev, dt, true)
        for k = 1, results.n do assert.are.equal(dev, results[k].device, what .. " result " .. k) end
        close(what .. " output", out, c.output, rtol, atol)
        for k, g in ipairs(grads) do close(what .. " grad " .. k, g, c.grads[k], rtol * 10, atol * 10) end
        if c.name == "lstsq" then
          close(what .. " residuals", results[2], c.residuals, rtol, atol)
          assert.are.same(c.rank.shape, results[3].shape)
          assert.are.same(c.rank.data, results[3]:reshape({-1}):totable())
          assert.are.equal("int64", results[3].dtype)
          close(what .. " singular values", results[4], c.singular_values, rtol, atol)
        end
      end
    end)
  end

  it("float32 results match within float32's precision", function()
    for i, c in ipairs(fixtures) do
      local out = run_case(c, "cpu", "float32", false)
      assert.are.equal("float32", out.dtype)
      close(label(i, c, "cpu", "float32"), out, c.output, 1e-4, 1e-4)
    end
  end)
end)

-- float64 finite-difference gradchecks ---------------------------------------

local function shift(x) return x + nd.eye(x:size(-1), {dtype = "float64"}) * 3 end
local function spd(x) return x:matmul(x:transpose(-2, -1)) + nd.eye(x:size(-1), {dtype = "float64"}) end
local function sym(x) return x + x:transpose(-2, -1) end
-- singular vectors and eigenvectors with a fixed sign, so that a small
-- change of A does not flip one
local function signed(u) return u * firstsign(u) end

describe("nd.linalg: float64 gradchecks", function()
  it("inv, solve (matrix, vector, broadcast, left = false), det, slogdet", function()
    nd.manual_seed(41)
    C.check(function(a) return L.inv(shift(a)) end, {G.leaf({2, 3, 3})})
    C.check(function(a, b) return L.solve(shift(a), b) end, {G.leaf({2, 3, 3}), G.leaf({3, 2})})
    C.check(function(a, b) return L.solve(shift(a), b) end, {G.leaf({3, 3}), G.leaf({2, 3, 1})})
    C.check(function(a, b) return L.solve(shift(a), b) end, {G.leaf({2, 3, 3}), G.leaf({3})})
    C.check(function(a, b) return L.solve(shift(a), b) end, {G.leaf({2, 3, 3}), G.leaf({2, 3})})
    C.check(function(a, b) return L.solve(shift(a), b, {left = false}) end, {G.leaf({3, 3}), G.leaf({2, 3})})
    C.check(function(a) return L.det(a) end, {G.leaf({2, 3, 3})})
    C.check(function(a) local _, l = L.slogdet(a); return l end, {G.leaf({2, 3, 3})})
  end)

  it("det at singular matrices (the SVD form of the cofactors)", function()
    local rank2 = nd.tensor({{1, 2, 3}, {2, 4, 6}, {1, 0, 1}}, {dtype = "float64", requires_grad = true})
    C.check(function(a) return L.det(a) end, {rank2})
    local rank1 = nd.tensor({{1, 2, 3}, {2, 4, 6}, {3, 6, 9}}, {dtype = "float64", requires_grad = true})
    C.check(function(a) return L.det(a) end, {rank1})
    -- a batch where one matrix is singular and the other is not
    local mixed = nd.stack({rank2:detach(), shift(G.leaf({3, 3})):detach()}, 1)
    mixed.requires_grad = true
    C.check(function(a) return L.det(a) end, {mixed})
  end)

  it("cholesky (lower and upper), qr (tall, square, wide)", function()
    nd.manual_seed(42)
    C.check(function(a) return L.cholesky(spd(a)) end, {G.leaf({2, 3, 3})})
    C.check(function(a) return L.cholesky(spd(a), {upper = true}) end, {G.leaf({3, 3})})
    for _, shape in ipairs({{2, 4, 3}, {3, 3}, {3, 5}}) do
      C.check(function(a) local q = L.qr(a); return q end, {G.leaf(shape)})
      C.check(function(a) local _, r = L.qr(a); return r end, {G.leaf(shape)})
    end
    C.check(function(a) local q, r = L.qr(a, "complete"); return q + r end, {G.leaf({3, 3})})
  end)

  it("svd (reduced and full), svdvals, eigh, eigvalsh", function()
    nd.manual_seed(43)
    for _, shape in ipairs({{2, 4, 3}, {3, 5}}) do
      C.check(function(a) local u, s, vh = L.svd(a, {full_matrices = false}); return flat(signed(u), s) end,
              {G.leaf(shape)})
      C.check(function(a)
        local u, _, vh = L.svd(a, {full_matrices = false})
        return vh * firstsign(u):transpose(-2, -1)
      end, {G.leaf(shape)})
    end
    C.check(function(a) local u = L.svd(a); return signed(u:narrow(-1, 1, 2)) end, {G.leaf({4, 2})})
    C.check(function(a) return L.svdvals(a) end, {G.leaf({2, 3, 5})})
    C.check(function(a) local l, v = L.eigh(sym(a)); return flat(l, signed(v)) end, {G.leaf({2, 3, 3})})
    C.check(function(a) return L.eigvalsh(sym(a), "U") end, {G.leaf({3, 3})})
  end)

  it("lstsq (tall, full rank; matrix, vector and broadcast B)", function()
    nd.manual_seed(44)
    C.check(function(a, b) return (L.lstsq(a, b)) end, {G.leaf({2, 5, 3}), G.leaf({1, 5, 2})})
    C.check(function(a, b) return (L.lstsq(a, b)) end, {G.leaf({5, 3}), G.leaf({5})})
    C.check(function(a, b) return (L.lstsq(a, b)) end, {G.leaf({3, 3}), G.leaf({3, 2})})
  end)

  it("gradients of gradients", function()
    nd.manual_seed(45)
    C.check2(function(a) return L.inv(shift(a)) end, {G.leaf({3, 3})})
    C.check2(function(a, b) return L.solve(shift(a), b) end, {G.leaf({3, 3}), G.leaf({3, 2})})
    C.check2(function(a) return L.det(a) end, {G.leaf({3, 3})})
    C.check2(function(a) return L.cholesky(spd(a)) end, {G.leaf({3, 3})})
    C.check2(function(a) local q, r = L.qr(a); return q:matmul(r) + r:sum() end, {G.leaf({4, 3})})
    C.check2(function(a) local _, s = L.svd(a, {full_matrices = false}); return s end, {G.leaf({3, 2})})
    C.check2(function(a) local _, v = L.eigh(sym(a)); return signed(v) end, {G.leaf({3, 3})})
    C.check2(function(a, b) return (L.lstsq(a, b)) end, {G.leaf({4, 2}), G.leaf({4, 2})})
  end)
end)

-- shapes and values ----------------------------------------------------------

describe("nd.linalg: results", function()
  local f64 = {dtype = "float64"}

  it("several results are several returns, with PyTorch's shapes", function()
    local A = nd.randn({2, 5, 3}, f64)
    local Q, R = L.qr(A)
    assert.are.same({2, 5, 3}, Q.shape)
    assert.are.same({2, 3, 3}, R.shape)
    Q, R = L.qr(A, {mode = "complete"})
    assert.are.same({2, 5, 5}, Q.shape)
    assert.are.same({2, 5, 3}, R.shape)
    local Qr, Rr = L.qr(A, "r")
    assert.are.same({0}, Qr.shape)
    close("qr mode r", Rr, {shape = {2, 3, 3}, data = R:narrow(-2, 1, 3):contiguous():view({-1}):totable()}, 0, 1e-12)
    local U, S, Vh = L.svd(A)
    assert.are.same({{2, 5, 5}, {2, 3}, {2, 3, 3}}, {U.shape, S.shape, Vh.shape})
    U, S, Vh = L.svd(A, {full_matrices = false})
    assert.are.same({{2, 5, 3}, {2, 3}, {2, 3, 3}}, {U.shape, S.shape, Vh.shape})
    local X, res, rank, sv = L.lstsq(A, nd.randn({2, 5}, f64))
    assert.are.same({{2, 3}, {2, 1}, {2}, {2, 3}}, {X.shape, res.shape, rank.shape, sv.shape})
  end)

  it("records a node only when grad is on and A requires it", function()
    local A = nd.randn({3, 3}, {dtype = "float64", requires_grad = true})
    assert.are.equal("linalg.inv", L.inv(A).grad_fn)
    local Q, R = L.qr(A)
    assert.are.equal("linalg.qr", Q.grad_fn)
    assert.are.equal("linalg.qr", R.grad_fn)
    local sign, logabs = L.slogdet(A)
    assert.is_false(sign.requires_grad)
    assert.is_true(logabs.requires_grad)
    assert.is_false(L.det(A:detach()).requires_grad)
    assert.is_false(nd.no_grad(function() return L.svdvals(A) end).requires_grad)
  end)

  it("complete Q and full U are orthogonal and reproduce A", function()
    local A = nd.randn({5, 3}, f64)
    local function near(x, y) assert.is_true((x - y):abs():max():item() < 1e-12) end
    local Q, R = L.qr(A, "complete")
    near(Q:t():matmul(Q), nd.eye(5, f64))
    near(Q:matmul(R), A)
    local U, S, Vh = L.svd(A)
    near(U:t():matmul(U), nd.eye(5, f64))
    near(U:narrow(2, 1, 3):matmul(S:unsqueeze(2) * Vh), A)
    local Lv, V = L.eigh(A:t():matmul(A))
    near(V:matmul(Lv:unsqueeze(2) * V:t()), A:t():matmul(A))
    assert.is_true(Lv[1]:item() <= Lv[2]:item() and Lv[2]:item() <= Lv[3]:item())
  end)

  it("a singular matrix has det 0, and slogdet sign 0 and -inf", function()
    local A = nd.tensor({{1, 2}, {2, 4}}, f64)
    assert.are.equal(0, L.det(A):item())
    local sign, logabs = L.slogdet(A)
    assert.are.equal(0, sign:item())
    assert.are.equal(-math.huge, logabs:item())
    sign, logabs = L.slogdet(nd.tensor({{0, 1}, {1, 0}}, f64) * 3)
    assert.are.equal(-1, sign:item())
    assert.is_true(math.abs(logabs:item() - math.log(9)) < 1e-14)
  end)

  it("empty matrices and empty batches, as PyTorch", function()
    assert.are.same({0, 0}, L.inv(nd.zeros({0, 0})).shape)
    assert.are.equal(1, L.det(nd.zeros({0, 0})):item())
    assert.are.same({0, 3, 3}, L.inv(nd.zeros({0, 3, 3})).shape)
    local U, S, Vh = L.svd(nd.zeros({0, 3}))
    assert.are.same({{0, 0}, {0}, {3, 3}}, {U.shape, S.shape, Vh.shape})
    assert.are.same(nd.eye(3):totable(), Vh:totable())
    local Q, R = L.qr(nd.zeros({2, 0}), "complete")
    assert.are.same(nd.eye(2):totable(), Q:totable())
    assert.are.same({2, 0}, R.shape)
    local w, v = L.eigh(nd.zeros({0, 0}))
    assert.are.same({{0}, {0, 0}}, {w.shape, v.shape})
    local B = nd.tensor({{1, 2}, {3, 4}, {5, 6}})
    local X, res, rank = L.lstsq(nd.zeros({3, 0}), B)
    assert.are.same({0, 2}, X.shape)
    assert.are.same({35, 56}, res:totable()) -- all of B is residual
    assert.are.equal(0, rank:item())
  end)

  it("lstsq: residuals only for tall full-rank A; rank and S keep A's batch", function()
    local A = nd.tensor({{1, 2}, {2, 4}, {1, 1}}, f64) -- rank 2
    local _, res, rank = L.lstsq(A, nd.ones({3, 1}, f64))
    assert.are.same({1}, res.shape)
    assert.are.equal(2, rank:item())
    local Ad = nd.tensor({{1, 2}, {2, 4}, {3, 6}}, f64) -- rank 1
    local X
    X, res, rank = L.lstsq(Ad, nd.ones({3, 1}, f64))
    assert.are.same({0}, res.shape)
    assert.are.equal(1, rank:item())
    -- the minimum-norm solution: X is a multiple of (1, 2)
    assert.is_true(math.abs(X[2][1]:item() - 2 * X[1][1]:item()) < 1e-12)
    _, _, rank = L.lstsq(Ad, nd.ones({3, 1}, f64), {rcond = 0.9})
    assert.are.equal(1, rank:item())
    local _, r2, rk, sv = L.lstsq(nd.randn({1, 4, 2}, f64), nd.randn({3, 4, 2}, f64))
    assert.are.same({{3, 2}, {1}, {1, 2}}, {r2.shape, rk.shape, sv.shape})
  end)

  it("inputs on OpenCL: the results come back on the device", function()
    -- without OpenCL: a visible pending line (busted's pending ends the test)
    if D.pending_without_opencl(pending, "linalg inputs on OpenCL") then return end
    local dev = D.opencl()[1]
    local A = nd.randn({2, 3, 3}):to(dev)
    for _, r in ipairs({L.inv(A), L.det(A), L.cholesky(A:matmul(A:transpose(2, 3)) + nd.eye(3):to(dev)),
                        (L.qr(A)), (L.svd(A)), (L.eigh(A)), (L.lstsq(A, A))}) do
      assert.are.equal(dev, r.device)
    end
    local _, _, rank = L.lstsq(A, A)
    assert.are.equal(dev, rank.device)
  end)

  it("is a graph break inside nd.compile", function()
    local f = nd.compile(function(a) return L.inv(a) end)
    local A = nd.randn({3, 3}) + nd.eye(3) * 3
    local msg = errmsg(function() f(A) f(A) end)
    assert_contains(msg, "linalg.inv: reads tensor values on the host inside a compiled function")
    local g = nd.compile(function(a) return L.inv(a) * 2 end, {fallback = true})
    local want = (L.inv(A) * 2):totable()
    for _ = 1, 3 do assert.are.same(want, g(A):totable()) end
  end)
end)

-- errors ---------------------------------------------------------------------

describe("nd.linalg: errors", function()
  local f64 = {dtype = "float64"}

  it("singular and not positive-definite inputs name the batch element", function()
    local S = nd.stack({nd.eye(3), nd.tensor({{1, 2, 3}, {2, 4, 6}, {0, 0, 1}})}, 1)
    assert_contains(errmsg(L.inv, S), "needle.linalg.inv: (batch element 2): the diagonal element 2 of the LU "
                    .. "factorization is zero: the input matrix is singular and has no inverse")
    assert_contains(errmsg(L.inv, nd.zeros({2, 2})), "needle.linalg.inv: the diagonal element 1 of the LU")
    local S4 = nd.stack({S, S}, 1)
    assert_contains(errmsg(L.inv, S4), "needle.linalg.inv: (batch element {1,2}): ")
    assert_contains(errmsg(L.solve, S, nd.ones({3})), "needle.linalg.solve: (batch element 2): the solver failed "
                    .. "because the input matrix is singular")
    local P = nd.stack({nd.eye(3), -nd.eye(3)}, 1)
    assert_contains(errmsg(L.cholesky, P), "needle.linalg.cholesky: (batch element 2): the factorization could "
                    .. "not be completed because the input is not positive-definite (the leading minor of order "
                    .. "1 is not positive-definite)")
    assert_contains(errmsg(L.cholesky, nd.tensor({{1, 2}, {2, 1}})), "(the leading minor of order 2 is not")
  end)

  it("non-finite inputs to svd, eigh and lstsq are errors, not LAPACK's undefined behaviour", function()
    local bad = nd.stack({nd.eye(2), nd.tensor({{1, 0 / 0}, {0, 1}})}, 1)
    assert_contains(errmsg(L.svd, bad), "needle.linalg.svd: (batch element 2): the input contains non-finite values")
    assert_contains(errmsg(L.svdvals, bad), "needle.linalg.svdvals: (batch element 2): the input contains")
    assert_contains(errmsg(L.lstsq, bad, nd.ones({2, 2, 1})), "needle.linalg.lstsq: (batch element 2): the input")
    -- eigh reads one triangle: a NaN in the other is never seen
    local w = L.eigh(nd.tensor({{1, 0 / 0}, {0, 1}}))
    assert.are.same({1, 1}, w:totable())
    assert_contains(errmsg(L.eigh, nd.tensor({{1, 0}, {math.huge, 1}})),
                    "needle.linalg.eigh: the input contains non-finite values")
    assert_contains(errmsg(L.eigvalsh, nd.tensor({{1, 0 / 0}, {0, 1}}), "U"), "needle.linalg.eigvalsh: the input")
  end)

  it("dtypes: float32 and float64 only", function()
    assert_contains(errmsg(L.inv, nd.eye(2):long()),
                    "needle.linalg.inv: expected A to be a float32 or float64 tensor, got int64")
    assert_contains(errmsg(L.svd, nd.eye(2):half()),
                    "needle.linalg.svd: expected A to be a float32 or float64 tensor, got float16 (LAPACK has no float16")
    assert_contains(errmsg(L.det, nd.eye(2):bool()), "needle.linalg.det: expected A to be a float32 or float64")
    assert_contains(errmsg(L.solve, nd.eye(2), nd.ones({2}, f64)),
                    "needle.linalg.solve: A and B must have the same dtype, got float32 and float64")
    assert_contains(errmsg(L.lstsq, nd.eye(2), nd.ones({2}):int()),
                    "needle.linalg.lstsq: expected B to be a float32 or float64 tensor, got int32")
  end)

  it("shapes", function()
    assert_contains(errmsg(L.inv, nd.ones({3})), "needle.linalg.inv: A must have at least 2 dims, got shape {3}")
    assert_contains(errmsg(L.inv, nd.ones({2, 3})),
                    "needle.linalg.inv: A must be a batch of square matrices, but they are 2 by 3 matrices (shape {2,3})")
    assert_contains(errmsg(L.cholesky, nd.ones({4, 2, 3})), "needle.linalg.cholesky: A must be a batch of square")
    assert_contains(errmsg(L.eigh, nd.ones({2, 3})), "needle.linalg.eigh: A must be a batch of square")
    assert_contains(errmsg(L.solve, nd.eye(3), nd.ones({4, 1})),
                    "needle.linalg.solve: incompatible shapes of A {3,3} and B {4,1} for A X = B (3x3 and 4x1)")
    assert_contains(errmsg(L.solve, nd.eye(3), nd.ones({3}), {left = false}),
                    "needle.linalg.solve: B {3} is a vector: X A = B (left = false) needs B of shape (..., k, 3)")
    assert_contains(errmsg(L.solve, nd.eye(3):expand({2, 3, 3}), nd.ones({3, 3, 1})),
                    "needle.linalg.solve: the batch dims of A {2,3,3} and B {3,3,1} cannot be broadcast ({2} and {3})")
    assert_contains(errmsg(L.solve, nd.eye(3), nd.ones({3, 2}), {left = false}),
                    "needle.linalg.solve: incompatible shapes of A {3,3} and B {3,2} for X A = B (3x3 and 3x2)")
    assert_contains(errmsg(L.lstsq, nd.ones({3, 2}), nd.ones({4, 1})),
                    "needle.linalg.lstsq: A {3,2} and B {4,1} must have the same number of rows (3 and 4)")
    assert_contains(errmsg(L.lstsq, nd.ones({2, 4, 2}), nd.ones({4, 1})),
                    "B has one dim fewer than A, so it is a batch of vectors")
  end)

  it("options and arguments", function()
    assert_contains(errmsg(L.qr, nd.eye(2), "full"), "needle.linalg.qr: mode must be 'reduced', 'complete' or 'r', got 'full'")
    assert_contains(errmsg(L.eigh, nd.eye(2), {UPLO = "X"}), "needle.linalg.eigh: UPLO must be 'L' or 'U', got 'X'")
    assert_contains(errmsg(L.lstsq, nd.eye(2), nd.eye(2), {driver = "gelsy"}),
                    "needle.linalg.lstsq: driver must be 'gelsd' (the one LAPACK driver needle uses), got 'gelsy'")
    assert_contains(errmsg(L.lstsq, nd.eye(2), nd.eye(2), {rcond = -1}), "needle.linalg.lstsq: rcond must be >= 0, got -1")
    assert_contains(errmsg(L.svd, nd.eye(2), {full_matrices = 1}),
                    "needle.linalg.svd: option 'full_matrices' must be a boolean, got 1")
    assert_contains(errmsg(L.inv, {{1, 0}, {0, 1}}), "needle.linalg.inv: A must be a tensor, got a table")
    assert_contains(errmsg(L.solve, nd.eye(2), 3), "needle.linalg.solve: B must be a tensor, got 3")
  end)

  it("are raised at the caller's line", function()
    local msg = errmsg(function() L.inv(nd.zeros({2, 2})) end)
    assert.truthy(msg:find("^[^\n]*linalg_spec%.lua:%d+: needle%.linalg%.inv"), msg)
    msg = errmsg(function() L.qr(nd.eye(2), "full") end)
    assert.truthy(msg:find("^[^\n]*linalg_spec%.lua:%d+: needle%.linalg%.qr"), msg)
  end)

  it("gradients PyTorch does not have are errors at backward", function()
    local A = nd.randn({4, 3}, {dtype = "float64", requires_grad = true})
    local _, R = L.qr(A, "r")
    assert_contains(errmsg(function() R:sum():backward() end),
                    "needle.linalg.qr: the gradient of linalg.qr needs Q, which mode 'r' does not compute")
    local Q = L.qr(A, "complete")
    assert_contains(errmsg(function() Q:sum():backward() end),
                    "linalg.qr with mode 'complete' has no gradient when A has more rows than columns (4x3)")
    local W = nd.randn({2, 3}, {dtype = "float64", requires_grad = true})
    assert_contains(errmsg(function() L.lstsq(W, nd.ones({2, 1}, f64)):sum():backward() end),
                    "needle.linalg.lstsq: the gradient is implemented for A of full rank with at least as many rows as columns; got 2x3 matrices")
    local Rk = nd.tensor({{1, 2}, {2, 4}, {3, 6}}, {dtype = "float64", requires_grad = true})
    assert_contains(errmsg(function() L.lstsq(Rk, nd.ones({3, 1}, f64)):sum():backward() end),
                    "got 3x2 matrices of lower rank")
  end)

  it("mixed devices", function()
    if D.pending_without_opencl(pending, "linalg mixed devices") then return end
    local dev = D.opencl()[1]
    assert_contains(errmsg(L.solve, nd.eye(2), nd.ones({2}):to(dev)),
                    "needle.linalg.solve: expected all tensors on one device, got cpu and " .. dev)
  end)
end)

describe("linalg.lstsq's B", function()
  it("a 1-d B with a batched A is neither a batch of vectors nor of matrices: an error, not a read before its shape", function()
    local A = require("spec.helpers.assertions").bind(assert)
    A.assert_contains(A.errmsg(nd.linalg.lstsq, nd.randn({2, 3, 3}), nd.randn({3})),
      "needle.linalg.lstsq: B {3} must be a batch of vectors (one dim fewer than A {2,3,3}) or of matrices")
  end)
end)
