-- join_spec.lua - joining and splitting (cat, stack, split, chunk), flip,
-- pad, the index ops (gather, scatter, scatter_add, index_select,
-- index_add, masked_fill), cumsum, sort, argsort and topk.
--
--   build/needle-lua spec/run.lua spec/join_spec.lua
--
-- Indices going in and coming out are 1-based; expected values by hand.

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function i64(t) return nd.tensor(t, {dtype = "int64"}) end

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
end)
