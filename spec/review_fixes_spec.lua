-- review_fixes_spec.lua - regressions for defects found by review: each
-- case failed (wrong answer, UB or a misleading message) before its fix.
local nd = require "needle"
local S = require "spec.helpers.shell"
local A = require("spec.helpers.assertions").bind(assert)
local err_of, has = A.err_of, A.has

describe("review regressions", function()
  it("copy_ with an overlapping shifted source reads the original values", function()
    local x = nd.arange(20):reshape({10, 2})
    x[{{2, 10}, 1}] = x[{{1, 9}, 1}]
    assert.are.same({0, 0, 2, 4, 6, 8, 10, 12, 14, 16}, x[{":", 1}]:totable())
  end)

  it("copy_ of a transposed view of itself transposes", function()
    local y = nd.arange(9):reshape({3, 3})
    y:copy_(y:t())
    assert.are.same({{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}, y:totable())
  end)

  it("cat ignores __len/__index tricks (raw reads, elements stay anchored)", function()
    local x = nd.zeros({1})
    local calls = 0
    local list = setmetatable({x, x}, {__len = function() calls = calls + 1; return 200 end})
    assert.are.same({0, 0}, nd.cat(list):totable())
    assert.are.equal(0, calls)
    local lazy = setmetatable({}, {__index = function(_, i) return nd.full({i}, i) end})
    local e = err_of(function() return nd.cat(lazy) end)
    has(e, "needle.cat: expected a non-empty list of tensors")
  end)

  it("huge steps, lengths and chunk counts do not overflow", function()
    local x = nd.arange(5)
    assert.are.same({0}, x:slice(1, 1, 3, math.maxinteger):totable())
    assert.are.same({0}, x[{{1, 3, math.maxinteger}}]:totable())
    local e = err_of(function() return x:narrow(1, 2, math.maxinteger) end)
    has(e, "needle.narrow: start 2 and length")
    local parts = x:chunk(math.maxinteger)
    assert.are.equal(5, #parts)
    e = err_of(function() return x:split({math.maxinteger, math.maxinteger}) end)
    has(e, "needle.split: split sizes add up to more than dim 1")
  end)

  it("narrow names the start the caller passed", function()
    local e = err_of(function() return nd.zeros({5}):narrow(1, -10, 2) end)
    has(e, "needle.narrow: start -10 and length 2 out of range for dim 1 of size 5")
  end)

  it("flatten and expand name 1-based dims", function()
    local e = err_of(function() return nd.zeros({2, 3, 4}):flatten(3, 2) end)
    has(e, "start_dim 3 comes after end_dim 2")
    e = err_of(function() return nd.zeros({3}):expand({-1, 3}) end)
    has(e, "new leading dim 1")
  end)

  it("int64 values stay exact in full, full_like and clamp", function()
    local big = 9007199254740993 -- 2^53 + 1: not representable in a double
    assert.are.equal(big, nd.full({1}, big, {dtype = "int64"}):item())
    assert.are.equal(big, nd.tensor({big}, {dtype = "int64"}):clamp(0, nil):item())
    assert.are.equal(5, nd.tensor({9}, {dtype = "int64"}):clamp(nil, 5.5):item())
  end)

  it("sort takes an options table", function()
    local v, i = nd.tensor({3, 1, 2}):sort({dim = 1, descending = true})
    assert.are.same({3, 2, 1}, v:totable())
    assert.are.same({1, 3, 2}, i:totable())
  end)

  it("index errors: extra ':' entries and non-integer index values", function()
    local e = err_of(function() return nd.arange(3)[{":", ":"}] end)
    has(e, "needle.index: too many indices (2)")
    e = err_of(function() return nd.arange(3):index_select(1, {1.7}) end)
    has(e, "needle.index_select: index values must be integers")
  end)

  it("an empty index table selects nothing (it used to fail inside an integrality check)", function()
    local r = nd.arange(3):index_select(1, {})
    assert.are.same({0}, r.shape)
    assert.are.same({2, 0}, nd.arange(3):index_select(1, {3, 1}):totable())
  end)

  it("a ragged table is caught even when the first row is empty", function()
    local e = err_of(function() return nd.tensor({{}, {1, 2}}) end)
    has(e, "ragged nested table")
  end)

  it("a tensor cannot be its own gradient; the dtype must match", function()
    local x = nd.zeros({2}, {requires_grad = true})
    local e = err_of(function() x.grad = x end)
    has(e, "needle.grad: a tensor cannot be its own gradient")
    e = err_of(function() x.grad = nd.zeros({2}, {dtype = "float64"}) end)
    has(e, "dtype float64, expected float32")
  end)

  it("empty tensors are contiguous", function()
    assert.is_true(nd.zeros({2, 0, 3}):is_contiguous())
  end)

  it("a full reduction is right when OpenMP grants fewer threads than asked", function()
    local exe = S.needle_lua()
    local out = S.shell_line("OMP_NUM_THREADS=8 OMP_THREAD_LIMIT=2 " .. S.q(exe) ..
      " -e 'print(nd.ones({1000000}):sum():item(), nd.ones({1000000}):max():item())'")
    assert.are.equal("1000000.0\t1.0", out)
  end)
end)
