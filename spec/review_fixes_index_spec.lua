-- review_fixes_index_spec.lua - regression specs for review findings in
-- the index, join and sort ops:
--   * integer cumsum / scatter_add / index_add wrap on overflow (they were
--     signed overflow: undefined, an abort under the sanitizer build);
--   * index_add on integer tensors rejects alpha = inf, nan, 1e30;
--   * one_hot with math.maxinteger labels fails as one_hot, naming a shape;
--   * pad with math.mininteger / math.maxinteger pads fails cleanly;
--   * cat's list position and gather/scatter's index position are 1-based;
--   * sort, topk and randperm still sort long and many slices (their
--     scratch is now per chunk of the dim loop; the caller's-own-region case
--     is in tests/c/test_review_fixes_index.c).
--
--   build/needle-lua spec/run.lua spec/review_fixes_index_spec.lua

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local maxi, mini = math.maxinteger, math.mininteger
local function i64(t) return nd.tensor(t, {dtype = "int64"}) end
local function i32(t) return nd.tensor(t, {dtype = "int32"}) end

describe("integer accumulation wraps", function()
  it("cumsum of int64 wraps past math.maxinteger", function()
    assert.are.same({maxi, mini}, i64({maxi, 1}):cumsum(1):totable())
    assert.are.same({mini, -1, 4}, i64({mini, maxi, 5}):cumsum(1):totable())
  end)

  it("cumsum of int64 wraps along dim 1 (one running sum per column)", function()
    local r = i64({{maxi, -1}, {1, mini}}):cumsum(1):totable()
    assert.are.same({{maxi, -1}, {mini, maxi}}, r)
  end)

  it("scatter_add of int64 and int32 wraps", function()
    local r = i64({maxi, 0}):scatter_add(1, {1, 1, 2}, i64({1, 1, mini}))
    assert.are.same({mini + 1, mini}, r:totable())
    local r32 = i32({2147483647, -2147483648}):scatter_add(1, {1, 2}, i32({1, -1}))
    assert.are.same({-2147483648, 2147483647}, r32:totable())
  end)

  it("index_add of int64 wraps, with and without alpha", function()
    local x, src = i64({maxi, 1}), i64({1, maxi})
    assert.are.same({mini, mini}, x:index_add(1, {1, 2}, src):totable())
    assert.are.same({mini + 3, -3}, x:index_add(1, {1, 2}, src, 4):totable())
  end)

  it("index_add of int32 wraps", function()
    local r = i32({{2147483647, 0}, {0, -2147483648}}):index_add(1, {1, 2}, i32({{1, 2}, {3, -1}}))
    assert.are.same({{-2147483648, 2}, {3, 2147483647}}, r:totable())
  end)
end)

describe("index_add alpha on integer tensors", function()
  it("rejects alpha = math.huge, naming alpha and the dtype", function()
    local msg = errmsg(function() return i64({1, 2, 3}):index_add(1, {1}, i64({1}), math.huge) end)
    assert_contains(msg, "needle.index_add: alpha inf must be finite for dtype int64")
  end)

  it("rejects alpha = -math.huge and nan", function()
    local msg = errmsg(function() return i64({1, 2}):index_add(1, {1}, i64({1}), -math.huge) end)
    assert_contains(msg, "needle.index_add: alpha -inf must be finite for dtype int64")
    msg = errmsg(function() return i32({1, 2}):index_add(1, {1}, i32({1}), 0 / 0) end)
    assert_contains(msg, "needle.index_add: alpha")
    assert_contains(msg, "must be finite for dtype int32")
  end)

  it("rejects alpha = 1e30 as outside int64", function()
    local msg = errmsg(function() return i64({1, 2, 3}):index_add(1, {1}, i64({1}), 1e30) end)
    assert_contains(msg, "needle.index_add: alpha 1e+30 is out of range for dtype int64 "
      .. "(expected an integer in [-2^63, 2^63))")
  end)

  it("rejects alpha = 2^63 (math.maxinteger as a float) but takes -2^63", function()
    local msg = errmsg(function() return i64({1}):index_add(1, {1}, i64({1}), 2.0 ^ 63) end)
    assert_contains(msg, "is out of range for dtype int64")
    -- -1 + (-2^63) wraps to math.maxinteger
    assert.are.same({maxi}, i64({-1}):index_add(1, {1}, i64({1}), -(2.0 ^ 63)):totable())
  end)

  it("still rejects a fractional alpha, and floats take any alpha", function()
    local msg = errmsg(function() return i64({1}):index_add(1, {1}, i64({1}), 0.5) end)
    assert_contains(msg, "needle.index_add: alpha 0.5 must be an integer for dtype int64")
    assert.are.equal(math.huge, nd.ones(2):index_add(1, {1}, nd.ones(1), math.huge):totable()[1])
  end)
end)

describe("one_hot with huge labels", function()
  it("fails as one_hot, naming the shape, for a math.maxinteger label", function()
    local msg = errmsg(function() return nd.one_hot({1, maxi}) end)
    assert_contains(msg, "needle.one_hot: shape {2,9223372036854775807} is too large")
    msg = errmsg(function() return nd.one_hot(i64({1, maxi})) end)
    assert_contains(msg, "needle.one_hot: shape {2,9223372036854775807} is too large")
  end)

  it("compares labels with num_classes exactly (beyond 2^53)", function()
    -- 2^53 + 1 classes: the label 2^53 + 1 fits, 2^53 + 2 does not
    local msg = errmsg(function() return nd.one_hot(i64({2 ^ 53 + 2 | 0}), (2 ^ 53 | 0) + 1) end)
    assert_contains(msg, "needle.one_hot: class value 9007199254740994 is out of range for "
      .. "num_classes 9007199254740993")
    msg = errmsg(function() return nd.one_hot(i64({(2 ^ 53 | 0) + 1}), (2 ^ 53 | 0) + 1) end)
    assert_contains(msg, "needle.one_hot: shape {1,9007199254740993} is too large")
  end)

  it("still infers num_classes", function()
    assert.are.same({{0, 1, 0}, {0, 0, 1}}, nd.one_hot({2, 3}):totable())
  end)
end)

describe("pad with extreme pads", function()
  it("names the pads when size + pads overflows", function()
    local msg = errmsg(function() return nd.ones(3):pad({maxi, 5}) end)
    assert_contains(msg, "needle.pad: padding (9223372036854775807, 5) of dim 1 of size 3 "
      .. "overflows int64")
  end)

  it("names the pads for math.mininteger", function()
    local msg = errmsg(function() return nd.ones(3):pad({mini, 0}) end)
    assert_contains(msg, "needle.pad: padding (-9223372036854775808, 0) of dim 1 of size 3 "
      .. "gives the negative size -9223372036854775805")
    msg = errmsg(function() return nd.ones(2, 3):pad({0, 0, mini, mini}) end)
    assert_contains(msg, "needle.pad: padding (-9223372036854775808, -9223372036854775808) of "
      .. "dim 1 of size 2 gives a negative size (below -2^63)")
  end)

  it("crops everything and pads back when the sum fits", function()
    assert.are.same({7, 7}, nd.ones(3):pad({mini, maxi}, 7):totable())
    assert.are.same({7, 7}, nd.ones(3):pad({maxi, mini}, 7):totable())
  end)
end)

describe("1-based positions in messages", function()
  it("cat names the list position of a 0-dim tensor 1-based", function()
    local msg = errmsg(function() return nd.cat({nd.ones(2), nd.tensor(1)}) end)
    assert_contains(msg, "needle.cat: zero-dimensional tensor (at position 2) cannot be concatenated")
    msg = errmsg(function() return nd.cat({nd.tensor(1), nd.ones(2)}) end)
    assert_contains(msg, "(at position 1)")
  end)

  it("gather names the bad index's position in the index tensor 1-based", function()
    local msg = errmsg(function()
      return nd.ones(2, 3):gather(2, {{1, 2}, {3, 4}})
    end)
    assert_contains(msg, "needle.gather: index 4 is out of bounds for dim 2 with size 3 "
      .. "(at position {2,2} of the index tensor)")
  end)

  it("scatter and scatter_add name the position 1-based", function()
    local msg = errmsg(function()
      return nd.zeros(2, 3):scatter(2, {{1, 5}, {1, 1}}, nd.ones(2, 2))
    end)
    assert_contains(msg, "needle.scatter: index 5 is out of bounds for dim 2 with size 3 "
      .. "(at position {1,2} of the index tensor)")
    msg = errmsg(function()
      return nd.zeros(2, 3):scatter_add(1, {{1, 1, 1}, {1, 3, 1}}, nd.ones(2, 3))
    end)
    assert_contains(msg, "needle.scatter_add: index 3 is out of bounds for dim 1 with size 2 "
      .. "(at position {2,2} of the index tensor)")
  end)

  it("a 1-D index position is one 1-based coordinate", function()
    local msg = errmsg(function() return nd.ones(3):gather(1, {1, 2, 3, 7}) end)
    assert_contains(msg, "(at position {4} of the index tensor)")
  end)
end)

describe("sort, topk and randperm with per-chunk scratch", function()
  local function ascending_rows(v, i, x)
    local vt, it, xt = v:totable(), i:totable(), x:totable()
    for r = 1, #vt do
      local seen = {}
      for c = 1, #vt[r] do
        if c > 1 and vt[r][c - 1] > vt[r][c] then return false end
        local j = it[r][c]
        if seen[j] or xt[r][j] ~= vt[r][c] then return false end
        seen[j] = true
      end
    end
    return true
  end

  it("sorts many short rows and a few long ones", function()
    local x = nd.rand(300, 40)
    local v, i = x:sort(2)
    assert.is_true(ascending_rows(v, i, x))
    local y = nd.rand(4, 5000, {dtype = "float64"})
    local vy, iy = y:sort(2)
    assert.is_true(ascending_rows(vy, iy, y))
  end)

  it("topk and randperm still work", function()
    local v = nd.tensor({1, 5, 3, 4}):topk(2)
    assert.are.same({5, 4}, v:totable())
    local p, seen = nd.randperm(5000):totable(), {}
    assert.are.equal(5000, #p)
    for _, k in ipairs(p) do
      assert.is_true(k >= 1 and k <= 5000 and not seen[k])
      seen[k] = true
    end
  end)
end)
