-- join_spec.lua - joining and splitting (cat, stack, split, chunk), flip,
-- pad, the index ops (gather, scatter, scatter_add, index_select,
-- index_add, masked_fill), cumsum, sort, argsort and topk; integer
-- accumulation that wraps, extreme pads and alphas, and 1-based positions
-- in their messages.
--
--   build/needle-lua spec/run.lua spec/join_spec.lua
--
-- Indices going in and coming out are 1-based; expected values by hand.

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains
local err_of, has = A.err_of, A.has

local maxi, mini = math.maxinteger, math.mininteger
local function i64(t) return nd.tensor(t, {dtype = "int64"}) end
local function i32(t) return nd.tensor(t, {dtype = "int32"}) end

describe("cat", function()
  it("joins along dim 1 by default", function()
    local a, b = nd.tensor({{1, 2}, {3, 4}}), nd.tensor({{5, 6}})
    local c = nd.cat({a, b})
    assert.are.same({3, 2}, c.shape)
    assert.are.same({{1, 2}, {3, 4}, {5, 6}}, c:totable())
  end)

  it("joins along a given dim", function()
    local a, b = nd.tensor({{1, 2}, {3, 4}}), nd.tensor({{5}, {6}})
    assert.are.same({{1, 2, 5}, {3, 4, 6}}, nd.cat({a, b}, 2):totable())
  end)

  it("accepts a negative dim", function()
    local a, b = nd.tensor({{1, 2}, {3, 4}}), nd.tensor({{5}, {6}})
    assert.are.same({{1, 2, 5}, {3, 4, 6}}, nd.cat({a, b}, -1):totable())
  end)

  it("joins three tensors and copies (no sharing)", function()
    local a, b, c = nd.tensor({1}), nd.tensor({2, 3}), nd.tensor({4})
    local r = nd.cat({a, b, c})
    assert.are.same({1, 2, 3, 4}, r:totable())
    assert.is_false(r:shares_storage(a))
    a[1] = 100
    assert.are.same({1, 2, 3, 4}, r:totable())
  end)

  it("joins non-contiguous inputs by value", function()
    local a = nd.tensor({{1, 2}, {3, 4}}):t() -- {{1,3},{2,4}}
    local b = nd.tensor({{5, 6}})
    assert.are.same({{1, 3}, {2, 4}, {5, 6}}, nd.cat({a, b}, 1):totable())
  end)

  it("errors on mismatched shapes, naming the shapes", function()
    local msg = errmsg(function() return nd.cat({nd.ones(2, 2), nd.ones(3, 3)}, 1) end)
    assert_contains(msg, "needle.cat")
    assert_contains(msg, "{2,2}")
    assert_contains(msg, "{3,3}")
  end)

  it("names the 1-based dim and tensor positions on a mismatch", function()
    local msg = errmsg(function() return nd.cat({nd.ones(2, 2), nd.ones(3, 3)}, 1) end)
    assert_contains(msg, "dim 1")
    assert_contains(msg, "tensor 2")
  end)

  it("promotes mixed dtypes", function()
    local r = nd.cat({i64({1, 2}), nd.tensor({0.5})})
    assert.are.equal("float32", r.dtype)
    assert.are.same({1, 2, 0.5}, r:totable())
    local d = nd.cat({nd.tensor({1}), nd.tensor({0.25}, {dtype = "float64"})})
    assert.are.equal("float64", d.dtype)
  end)

  it("int64 with int64 stays int64", function()
    assert.are.equal("int64", nd.cat({i64({1}), i64({2})}).dtype)
  end)

  it("errors on an empty list or a non-tensor element", function()
    assert_contains(errmsg(function() return nd.cat({}) end), "needle.cat")
    local msg = errmsg(function() return nd.cat({nd.ones(2), 5}) end)
    assert_contains(msg, "needle.cat")
    assert_contains(msg, "2")
  end)

  describe("list positions and raw reads", function()
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

    it("cat names the list position of a 0-dim tensor 1-based", function()
      local msg = errmsg(function() return nd.cat({nd.ones(2), nd.tensor(1)}) end)
      assert_contains(msg, "needle.cat: zero-dimensional tensor (at position 2) cannot be concatenated")
      msg = errmsg(function() return nd.cat({nd.tensor(1), nd.ones(2)}) end)
      assert_contains(msg, "(at position 1)")
    end)
  end)
end)

describe("cat and stack of more than 64 tensors (a buffer of their own)", function()
  it("join them with and without a dim", function()
    local ts = {}
    for i = 1, 65 do ts[i] = nd.full({2}, i) end
    local c = nd.cat(ts) -- the buffer used to be read as the missing dim
    assert.are.same({130}, c.shape)
    assert.are.same({65, 65}, {c[129]:item(), c[130]:item()})
    local s = nd.stack(ts)
    assert.are.same({65, 2}, s.shape)
    assert.are.same({3, 3}, s[3]:totable())
    assert.are.same({2, 65}, nd.stack(ts, 2).shape)
    assert.are.same({130}, nd.cat(ts, 1).shape)
  end)
end)

describe("stack", function()
  it("adds a new first dim", function()
    local a, b = nd.tensor({1, 2}), nd.tensor({3, 4})
    local s = nd.stack({a, b})
    assert.are.same({2, 2}, s.shape)
    assert.are.same({{1, 2}, {3, 4}}, s:totable())
  end)

  it("adds the new dim where asked (positive and negative)", function()
    local a, b, c = nd.tensor({1, 2}), nd.tensor({3, 4}), nd.tensor({5, 6})
    assert.are.same({{1, 3, 5}, {2, 4, 6}}, nd.stack({a, b, c}, 2):totable())
    assert.are.same({{1, 3, 5}, {2, 4, 6}}, nd.stack({a, b, c}, -1):totable())
  end)

  it("errors on different shapes", function()
    local msg = errmsg(function() return nd.stack({nd.ones(2, 2), nd.ones(3, 3)}) end)
    assert_contains(msg, "needle.stack")
    assert_contains(msg, "{2,2}")
    assert_contains(msg, "{3,3}")
  end)
end)

describe("split and chunk", function()
  it("split(size) gives pieces of that size, the last smaller", function()
    local x = nd.arange(5)
    local parts = x:split(2)
    assert.are.equal(3, #parts)
    assert.are.same({0, 1}, parts[1]:totable())
    assert.are.same({2, 3}, parts[2]:totable())
    assert.are.same({4}, parts[3]:totable())
  end)

  it("split returns a plain Lua list of views", function()
    local x = nd.arange(6)
    local parts = x:split(3)
    assert.are.equal("table", type(parts))
    assert.are.equal(2, #parts)
    for _, p in ipairs(parts) do assert.is_true(p:shares_storage(x)) end
    parts[2][1] = 30
    assert.are.same({0, 1, 2, 30, 4, 5}, x:totable())
    x[1] = -1
    assert.are.equal(-1, parts[1][1]:item())
  end)

  it("split({sizes}) gives pieces of those sizes", function()
    local x = nd.arange(6)
    local parts = x:split({1, 3, 2})
    assert.are.equal(3, #parts)
    assert.are.same({0}, parts[1]:totable())
    assert.are.same({1, 2, 3}, parts[2]:totable())
    assert.are.same({4, 5}, parts[3]:totable())
  end)

  it("split along another dim", function()
    local x = nd.arange(6):reshape({2, 3})
    local parts = x:split({2, 1}, 2)
    assert.are.same({{0, 1}, {3, 4}}, parts[1]:totable())
    assert.are.same({{2}, {5}}, parts[2]:totable())
    local q = nd.split(x, 1, -1)
    assert.are.equal(3, #q)
    assert.are.same({{1}, {4}}, q[2]:totable())
  end)

  it("split sizes must sum to the dim size", function()
    local msg = errmsg(function() return nd.arange(6):split({2, 2}) end)
    assert_contains(msg, "needle.split")
    assert_contains(msg, "4")
    assert_contains(msg, "6")
  end)

  it("chunk(n) splits into n equal pieces", function()
    local parts = nd.arange(6):chunk(3)
    assert.are.equal(3, #parts)
    assert.are.same({0, 1}, parts[1]:totable())
    assert.are.same({2, 3}, parts[2]:totable())
    assert.are.same({4, 5}, parts[3]:totable())
  end)

  it("chunk(n) makes the last piece smaller when uneven", function()
    local parts = nd.arange(5):chunk(2)
    assert.are.equal(2, #parts)
    assert.are.same({0, 1, 2}, parts[1]:totable())
    assert.are.same({3, 4}, parts[2]:totable())
  end)

  it("chunk along dim 2 gives views", function()
    local x = nd.arange(8):reshape({2, 4})
    local parts = x:chunk(2, 2)
    assert.are.same({{0, 1}, {4, 5}}, parts[1]:totable())
    assert.are.same({{2, 3}, {6, 7}}, parts[2]:totable())
    assert.is_true(parts[2]:shares_storage(x))
  end)
end)

describe("flip", function()
  it("flips one dim", function()
    assert.are.same({3, 2, 1}, nd.tensor({1, 2, 3}):flip(1):totable())
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{4, 5, 6}, {1, 2, 3}}, x:flip(1):totable())
    assert.are.same({{3, 2, 1}, {6, 5, 4}}, x:flip(2):totable())
    assert.are.same({{3, 2, 1}, {6, 5, 4}}, x:flip(-1):totable())
  end)

  it("flips several dims", function()
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{6, 5, 4}, {3, 2, 1}}, x:flip({1, 2}):totable())
    assert.are.same({{6, 5, 4}, {3, 2, 1}}, nd.flip(x, {1, 2}):totable())
  end)

  it("does not change the input", function()
    local x = nd.tensor({1, 2, 3})
    local _ = x:flip(1)
    assert.are.same({1, 2, 3}, x:totable())
  end)
end)

describe("pad", function()
  it("pads the last dim with zeros by default", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.same({{0, 1, 2, 0}, {0, 3, 4, 0}}, x:pad({1, 1}):totable())
  end)

  it("takes pairs from the last dim first, with a constant value", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    -- last dim: left 1, right 0; first dim: top 0, bottom 1
    assert.are.same({{9, 1, 2}, {9, 3, 4}, {9, 9, 9}}, x:pad({1, 0, 0, 1}, 9):totable())
    assert.are.same({{9, 1, 2}, {9, 3, 4}, {9, 9, 9}}, nd.pad(x, {1, 0, 0, 1}, 9):totable())
  end)

  it("negative pads crop", function()
    assert.are.same({2, 3}, nd.tensor({1, 2, 3, 4, 5}):pad({-1, -2}):totable())
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{5, 6, 0}}, x:pad({-1, 1, -1, 0}):totable())
  end)

  it("errors on an odd number of pad sizes", function()
    assert_contains(errmsg(function() return nd.ones(2, 2):pad({1}) end), "needle.pad")
  end)

  describe("extreme pads", function()
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
end)

describe("gather", function()
  it("gathers along dim 2 with 1-based indices", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    local g = x:gather(2, i64({{1, 1}, {2, 1}}))
    assert.are.same({{1, 1}, {4, 3}}, g:totable())
  end)

  it("gathers along dim 1 and accepts a Lua table of indices", function()
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{4, 2, 6}}, x:gather(1, {{2, 1, 2}}):totable())
    assert.are.same({{4, 2, 6}}, nd.gather(x, 1, {{2, 1, 2}}):totable())
  end)

  it("errors on an out-of-range index, naming the index", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    local msg = errmsg(function() return x:gather(2, i64({{1, 3}, {2, 1}})) end)
    assert_contains(msg, "needle.gather")
    assert_contains(msg, "index 3")
    assert_contains(msg, "dim 2")
  end)

  it("errors on index 0 mentioning 1-based", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert_contains(errmsg(function() return x:gather(2, {{0, 1}, {1, 1}}) end), "1-based")
  end)

  it("errors on a float index tensor", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert_contains(errmsg(function() return x:gather(2, nd.tensor({{1.0, 1.0}, {1.0, 1.0}})) end),
      "needle.gather")
  end)

  describe("index positions in messages (1-based)", function()
    it("gather names the bad index's position in the index tensor 1-based", function()
      local msg = errmsg(function()
        return nd.ones(2, 3):gather(2, {{1, 2}, {3, 4}})
      end)
      assert_contains(msg, "needle.gather: index 4 is out of bounds for dim 2 with size 3 "
        .. "(at position {2,2} of the index tensor)")
    end)

    it("a 1-D index position is one 1-based coordinate", function()
      local msg = errmsg(function() return nd.ones(3):gather(1, {1, 2, 3, 7}) end)
      assert_contains(msg, "(at position {4} of the index tensor)")
    end)
  end)
end)

describe("scatter and scatter_add", function()
  it("scatter writes src at the indexed positions (1-based)", function()
    local z = nd.zeros({2, 3})
    local r = z:scatter(2, i64({{1}, {3}}), nd.tensor({{5}, {7}}))
    assert.are.same({{5, 0, 0}, {0, 0, 7}}, r:totable())
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, z:totable())
  end)

  it("scatter along dim 1 with a scalar source", function()
    local z = nd.zeros({3, 2})
    local r = z:scatter(1, i64({{3, 1}}), 1.5)
    assert.are.same({{0, 1.5}, {0, 0}, {1.5, 0}}, r:totable())
  end)

  it("scatter_add accumulates duplicate indices", function()
    local r = nd.zeros({5}):scatter_add(1, i64({1, 2, 1, 1, 5}), nd.ones({5}))
    assert.are.same({3, 1, 0, 0, 1}, r:totable())
  end)

  it("scatter_add with values along dim 2", function()
    local r = nd.zeros({2, 2}):scatter_add(2, i64({{1, 1, 2}, {2, 2, 2}}),
      nd.tensor({{1, 2, 3}, {4, 5, 6}}))
    assert.are.same({{3, 3}, {0, 15}}, r:totable())
  end)

  it("errors on an out-of-range index, naming the index", function()
    local msg = errmsg(function() return nd.zeros({3}):scatter_add(1, i64({1, 4}), nd.ones({2})) end)
    assert_contains(msg, "needle.scatter_add")
    assert_contains(msg, "index 4")
    msg = errmsg(function() return nd.zeros({3}):scatter(1, i64({1, 4}), nd.ones({2})) end)
    assert_contains(msg, "needle.scatter")
    assert_contains(msg, "index 4")
  end)

  describe("integer overflow and index positions", function()
    it("scatter_add of int64 and int32 wraps", function()
      local r = i64({maxi, 0}):scatter_add(1, {1, 1, 2}, i64({1, 1, mini}))
      assert.are.same({mini + 1, mini}, r:totable())
      local r32 = i32({2147483647, -2147483648}):scatter_add(1, {1, 2}, i32({1, -1}))
      assert.are.same({-2147483648, 2147483647}, r32:totable())
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
  end)
end)

describe("index_select and index_add", function()
  local x3 = function() return nd.tensor({{1, 2}, {3, 4}, {5, 6}}) end

  it("index_select picks rows by 1-based index, repeats allowed", function()
    assert.are.same({{5, 6}, {1, 2}}, x3():index_select(1, i64({3, 1})):totable())
    assert.are.same({{1, 2}, {1, 2}}, x3():index_select(1, {1, 1}):totable())
  end)

  it("index_select along dim 2 (and negative dim)", function()
    assert.are.same({{2}, {4}, {6}}, x3():index_select(2, {2}):totable())
    assert.are.same({{2, 1}, {4, 3}, {6, 5}}, nd.index_select(x3(), -1, {2, 1}):totable())
  end)

  it("index_select errors on an out-of-range index, naming it", function()
    local msg = errmsg(function() return x3():index_select(1, {4}) end)
    assert_contains(msg, "needle.index_select")
    assert_contains(msg, "index 4")
    assert_contains(msg, "size 3")
  end)

  it("index_add adds rows of src at the indices, accumulating duplicates", function()
    local r = nd.zeros({3, 2}):index_add(1, i64({1, 3, 1}), nd.tensor({{1, 1}, {2, 2}, {3, 3}}))
    assert.are.same({{4, 4}, {0, 0}, {2, 2}}, r:totable())
  end)

  it("index_add takes alpha", function()
    local r = nd.ones({3}):index_add(1, {2, 2}, nd.tensor({1, 2}), 10)
    assert.are.same({1, 31, 1}, r:totable())
  end)

  it("index_add errors on an out-of-range index, naming it", function()
    local msg = errmsg(function() return nd.zeros({2, 2}):index_add(1, {1, 5}, nd.ones(2, 2)) end)
    assert_contains(msg, "needle.index_add")
    assert_contains(msg, "index 5")
  end)

  it("an empty index table selects nothing (it used to fail inside an integrality check)", function()
    local r = nd.arange(3):index_select(1, {})
    assert.are.same({0}, r.shape)
    assert.are.same({2, 0}, nd.arange(3):index_select(1, {3, 1}):totable())
  end)

  describe("integer overflow wraps", function()
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

  describe("alpha on integer tensors", function()
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
end)

describe("masked_fill", function()
  it("fills where the mask is true", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    local r = x:masked_fill(nd.tensor({{true, false}, {false, true}}), -1)
    assert.are.same({{-1, 2}, {3, -1}}, r:totable())
    assert.are.same({{1, 2}, {3, 4}}, x:totable())
  end)

  it("broadcasts the mask", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.same({{0, 2}, {0, 4}}, x:masked_fill(nd.tensor({true, false}), 0):totable())
    assert.are.same({{0, 0}, {3, 4}}, nd.masked_fill(x, nd.tensor({{true}, {false}}), 0):totable())
  end)

  it("takes a mask from a comparison", function()
    local x = nd.tensor({1, 5, 2, 7})
    assert.are.same({1, 0, 2, 0}, x:masked_fill(x:gt(3), 0):totable())
  end)
end)

describe("cumsum", function()
  it("runs along a 1-d tensor", function()
    assert.are.same({1, 3, 6, 10}, nd.tensor({1, 2, 3, 4}):cumsum(1):totable())
  end)

  it("runs along either dim of a matrix", function()
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{1, 3, 6}, {4, 9, 15}}, x:cumsum(2):totable())
    assert.are.same({{1, 2, 3}, {5, 7, 9}}, x:cumsum(1):totable())
    assert.are.same({{1, 3, 6}, {4, 9, 15}}, nd.cumsum(x, -1):totable())
  end)

  it("keeps int64 as int64", function()
    local c = i64({5, -2, 4}):cumsum(1)
    assert.are.equal("int64", c.dtype)
    assert.are.same({5, 3, 7}, c:totable())
  end)

  describe("integer overflow wraps", function()
    it("cumsum of int64 wraps past math.maxinteger", function()
      assert.are.same({maxi, mini}, i64({maxi, 1}):cumsum(1):totable())
      assert.are.same({mini, -1, 4}, i64({mini, maxi, 5}):cumsum(1):totable())
    end)

    it("cumsum of int64 wraps along dim 1 (one running sum per column)", function()
      local r = i64({{maxi, -1}, {1, mini}}):cumsum(1):totable()
      assert.are.same({{maxi, -1}, {mini, maxi}}, r)
    end)
  end)
end)

describe("sort, argsort, topk", function()
  it("sorts ascending with 1-based indices", function()
    local v, i = nd.tensor({3, 1, 2}):sort()
    assert.are.same({1, 2, 3}, v:totable())
    assert.are.same({2, 3, 1}, i:totable())
    assert.are.equal("int64", i.dtype)
  end)

  it("sorts descending", function()
    local v, i = nd.tensor({3, 1, 2}):sort(1, true)
    assert.are.same({3, 2, 1}, v:totable())
    assert.are.same({1, 3, 2}, i:totable())
  end)

  it("is stable: equal keys keep their order", function()
    local _, i = nd.tensor({2, 1, 2, 1, 2}):sort()
    assert.are.same({2, 4, 1, 3, 5}, i:totable())
    local _, j = nd.tensor({2, 1, 2, 1, 2}):sort(1, true)
    assert.are.same({1, 3, 5, 2, 4}, j:totable())
  end)

  it("is stable on a longer input (pure-Lua reference)", function()
    local keys = {}
    for k = 1, 200 do keys[k] = (k * 37) % 7 end
    local ref = {}
    for k = 1, 200 do ref[k] = k end
    table.sort(ref, function(a, b)
      if keys[a] ~= keys[b] then return keys[a] < keys[b] end
      return a < b
    end)
    local _, i = i64(keys):sort()
    assert.are.same(ref, i:totable())
  end)

  it("sorts along a chosen dim of a matrix", function()
    local x = nd.tensor({{3, 1}, {2, 4}})
    local v, i = x:sort(1)
    assert.are.same({{2, 1}, {3, 4}}, v:totable())
    assert.are.same({{2, 1}, {1, 2}}, i:totable())
    local v2, i2 = x:sort(2)
    assert.are.same({{1, 3}, {2, 4}}, v2:totable())
    assert.are.same({{2, 1}, {1, 2}}, i2:totable())
  end)

  it("argsort returns the sort indices", function()
    assert.are.same({2, 3, 1}, nd.tensor({3, 1, 2}):argsort():totable())
    assert.are.same({1, 3, 2}, nd.tensor({3, 1, 2}):argsort(1, true):totable())
    assert.are.same({2, 3, 1}, nd.argsort(nd.tensor({3, 1, 2})):totable())
  end)

  it("topk returns the k largest with 1-based indices", function()
    local v, i = nd.tensor({1, 5, 3, 4}):topk(2)
    assert.are.same({5, 4}, v:totable())
    assert.are.same({2, 4}, i:totable())
  end)

  it("topk with largest = false returns the k smallest", function()
    local v, i = nd.tensor({1, 5, 3, 4}):topk(2, 1, false)
    assert.are.same({1, 3}, v:totable())
    assert.are.same({1, 3}, i:totable())
  end)

  it("topk along the rows of a matrix", function()
    local v, i = nd.tensor({{1, 9, 5}, {7, 2, 8}}):topk(1, 2)
    assert.are.same({{9}, {8}}, v:totable())
    assert.are.same({{2}, {3}}, i:totable())
  end)

  it("max(dim) and argmax/argmin return 1-based int64 indices", function()
    local x = nd.tensor({{1, 9, 5}, {7, 2, 8}})
    local v, i = x:max(2)
    assert.are.same({9, 8}, v:totable())
    assert.are.same({2, 3}, i:totable())
    assert.are.equal("int64", i.dtype)
    assert.are.same({2, 1, 2}, x:argmax(1):totable())
    assert.are.same({1, 2}, x:argmin(2):totable())
    assert.are.equal(2, nd.tensor({4, 9, 1}):argmax():item())
  end)

  it("topk with k larger than the dim errors", function()
    assert_contains(errmsg(function() return nd.tensor({1, 2}):topk(3) end), "needle.topk")
  end)

  it("sort takes an options table", function()
    local v, i = nd.tensor({3, 1, 2}):sort({dim = 1, descending = true})
    assert.are.same({3, 2, 1}, v:totable())
    assert.are.same({1, 3, 2}, i:totable())
  end)

  -- (sorts from the caller's own OpenMP region: tests/c/test_sort_threads.c)
  describe("with per-chunk scratch (sort, topk and randperm)", function()
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
end)
