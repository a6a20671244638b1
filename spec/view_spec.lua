-- view_spec.lua - views copy nothing: reshape/view, permute, transpose, t,
-- expand/broadcast_to/expand_as, select, narrow, slice, squeeze, unsqueeze,
-- flatten, view_as; contiguous and clone.
--
--   build/needle-lua spec/run.lua spec/view_spec.lua
--
-- Expected shapes, strides and values are worked out by hand (row-major
-- strides of a contiguous {2,3,4} tensor are {12,4,1}, and so on).

local nd = require "needle"

-- 0..n-1 as int64, reshaped: exact values, easy to reason about.
local function iota(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return nd.arange(n):reshape(shape)
end

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains
local err_of, has = A.err_of, A.has

-- x[idx...] as a Lua number, through the public indexing API
local function at(x, idx) return x[idx]:item() end

describe("views", function()
  describe("reshape and view", function()
    it("reshape of a contiguous tensor is a view with row-major strides", function()
      local x = nd.arange(6)
      local y = x:reshape({2, 3})
      assert.are.same({2, 3}, y.shape)
      assert.are.same({3, 1}, y:stride())
      assert.is_true(y:shares_storage(x))
      assert.are.same({{0, 1, 2}, {3, 4, 5}}, y:totable())
    end)

    it("reshape infers one -1", function()
      local x = nd.arange(24)
      assert.are.same({2, 3, 4}, x:reshape({2, -1, 4}).shape)
      assert.are.same({6, 4}, x:reshape({-1, 4}).shape)
      assert.are.same({24}, x:reshape({-1}).shape)
    end)

    it("reshape accepts sizes as varargs", function()
      local x = nd.arange(6)
      assert.are.same({3, 2}, x:reshape(3, 2).shape)
      assert.are.same({3, 2}, x:view(3, 2).shape)
    end)

    it("writes through a reshape are seen by the base and vice versa", function()
      local x = nd.arange(6)
      local y = x:reshape({2, 3})
      y[{2, 1}] = 100
      assert.are.equal(100, at(x, {4}))
      x[{6}] = -7
      assert.are.equal(-7, at(y, {2, 3}))
    end)

    it("view of a contiguous tensor shares storage", function()
      local x = iota({2, 3, 4})
      local v = x:view({6, 4})
      assert.are.same({6, 4}, v.shape)
      assert.are.same({4, 1}, v:stride())
      assert.is_true(v:shares_storage(x))
      v[{6, 4}] = 1000
      assert.are.equal(1000, at(x, {2, 3, 4}))
    end)

    it("view of a transposed tensor errors when strides do not allow it", function()
      local x = iota({2, 3}):t()
      local msg = errmsg(function() return x:view({6}) end)
      assert_contains(msg, "needle.view")
    end)

    it("reshape of a transposed tensor copies (values in logical order)", function()
      local base = iota({2, 3})
      local x = base:t() -- {{0,3},{1,4},{2,5}}
      local y = x:reshape({6})
      assert.are.same({0, 3, 1, 4, 2, 5}, y:totable())
      assert.is_false(y:shares_storage(base))
      y[{1}] = 99
      assert.are.equal(0, at(base, {1, 1}))
    end)

    it("view with a wrong element count errors", function()
      local x = nd.arange(6)
      local msg = errmsg(function() return x:view({4, 2}) end)
      assert_contains(msg, "needle.view")
      msg = errmsg(function() return x:reshape({4, -1}) end)
      assert_contains(msg, "needle.reshape")
    end)

    it("view_as takes the other tensor's shape and shares storage", function()
      local x = nd.arange(6)
      local o = nd.zeros({3, 2})
      local v = x:view_as(o)
      assert.are.same({3, 2}, v.shape)
      assert.are.same({{0, 1}, {2, 3}, {4, 5}}, v:totable())
      assert.is_true(v:shares_storage(x))
      v[{3, 2}] = 50
      assert.are.equal(50, at(x, {6}))
    end)
  end)

  describe("permute, transpose, t", function()
    it("permute reorders shape and strides", function()
      local x = iota({2, 3, 4})
      local p = x:permute({3, 1, 2})
      assert.are.same({4, 2, 3}, p.shape)
      assert.are.same({1, 12, 4}, p:stride())
      assert.is_true(p:shares_storage(x))
      assert.is_false(p:is_contiguous())
    end)

    it("permute maps elements: p[i,j,k] == x[j,k,i]", function()
      local x = iota({2, 3, 4})
      local p = x:permute({3, 1, 2})
      for i = 1, 4 do
        for j = 1, 2 do
          for k = 1, 3 do
            -- x[j,k,i] has flat index (j-1)*12 + (k-1)*4 + (i-1)
            assert.are.equal((j - 1) * 12 + (k - 1) * 4 + (i - 1), at(p, {i, j, k}))
          end
        end
      end
    end)

    it("permute accepts varargs and negative dims", function()
      local x = iota({2, 3, 4})
      assert.are.same({4, 2, 3}, x:permute(3, 1, 2).shape)
      assert.are.same({4, 3, 2}, x:permute({-1, -2, -3}).shape)
    end)

    it("writes through a permute are seen by the base", function()
      local x = iota({2, 3, 4})
      local p = x:permute({3, 1, 2})
      p[{4, 2, 1}] = -1 -- x[2,1,4]
      assert.are.equal(-1, at(x, {2, 1, 4}))
      x[{1, 3, 2}] = -2 -- p[2,1,3]
      assert.are.equal(-2, at(p, {2, 1, 3}))
    end)

    it("transpose swaps two dims (positive and negative)", function()
      local x = iota({2, 3, 4})
      local y = x:transpose(1, 3)
      assert.are.same({4, 3, 2}, y.shape)
      assert.are.same({1, 4, 12}, y:stride())
      local z = x:transpose(-1, -2)
      assert.are.same({2, 4, 3}, z.shape)
      assert.are.same({12, 1, 4}, z:stride())
      assert.is_true(z:shares_storage(x))
      assert.are.equal(1 * 12 + 3 * 1 + 2 * 4, at(z, {2, 4, 3})) -- x[2,3,4]
    end)

    it("t() transposes a matrix as a view", function()
      local x = iota({2, 3})
      local y = x:t()
      assert.are.same({3, 2}, y.shape)
      assert.are.same({1, 3}, y:stride())
      assert.are.same({{0, 3}, {1, 4}, {2, 5}}, y:totable())
      y[{3, 1}] = 42
      assert.are.equal(42, at(x, {1, 3}))
    end)

    it("nd.transpose and nd.permute are functions too", function()
      local x = iota({2, 3})
      assert.are.same({{0, 3}, {1, 4}, {2, 5}}, nd.transpose(x, 1, 2):totable())
      assert.are.same({{0, 3}, {1, 4}, {2, 5}}, nd.permute(x, {2, 1}):totable())
    end)
  end)

  describe("expand", function()
    it("expand gives broadcast dims stride 0", function()
      local x = nd.tensor({{1}, {2}, {3}})
      local e = x:expand({3, 4})
      assert.are.same({3, 4}, e.shape)
      assert.are.same({1, 0}, e:stride())
      assert.is_true(e:shares_storage(x))
      assert.are.same({{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}}, e:totable())
    end)

    it("expand keeps sizes given as -1 and adds leading dims", function()
      local x = nd.tensor({1, 2, 3})
      local e = x:expand({2, -1})
      assert.are.same({2, 3}, e.shape)
      assert.are.same({0, 1}, e:stride())
      assert.are.same({{1, 2, 3}, {1, 2, 3}}, e:totable())
    end)

    it("writes to the base are seen in every expanded position", function()
      local x = nd.tensor({{1}, {2}})
      local e = x:expand({2, 3})
      x[{2, 1}] = 9
      assert.are.same({{1, 1, 1}, {9, 9, 9}}, e:totable())
    end)

    it("broadcast_to (method and function) and expand_as", function()
      local x = nd.tensor({5, 6})
      assert.are.same({{5, 6}, {5, 6}, {5, 6}}, x:broadcast_to({3, 2}):totable())
      assert.are.same({{5, 6}, {5, 6}, {5, 6}}, nd.broadcast_to(x, {3, 2}):totable())
      local o = nd.zeros({4, 2})
      local e = x:expand_as(o)
      assert.are.same({4, 2}, e.shape)
      assert.are.same({0, 1}, e:stride())
      assert.is_true(e:shares_storage(x))
    end)

    it("expanding a non-1 dim errors", function()
      local x = nd.tensor({1, 2, 3})
      local msg = errmsg(function() return x:expand({2, 4}) end)
      assert_contains(msg, "needle.expand")
    end)
  end)

  describe("select, narrow, slice", function()
    it("select picks one index along a dim and drops it", function()
      local x = iota({2, 3}) -- {{0,1,2},{3,4,5}}
      local c = x:select(2, 3)
      assert.are.same({2}, c.shape)
      assert.are.same({3}, c:stride())
      assert.are.same({2, 5}, c:totable())
      assert.are.equal(2, c:storage_offset())
      assert.are.same({3, 4, 5}, x:select(1, 2):totable())
      assert.are.same({2, 5}, x:select(-1, -1):totable())
    end)

    it("writes through select reach the base", function()
      local x = iota({2, 3})
      local c = x:select(2, 2)
      c[{2}] = 77
      assert.are.equal(77, at(x, {2, 2}))
      x[{1, 2}] = 66
      assert.are.same({66, 77}, c:totable())
    end)

    it("narrow(dim, start, length) with a 1-based start is a view", function()
      local x = iota({2, 3})
      local n = x:narrow(2, 2, 2)
      assert.are.same({2, 2}, n.shape)
      assert.are.same({3, 1}, n:stride())
      assert.are.equal(1, n:storage_offset())
      assert.are.same({{1, 2}, {4, 5}}, n:totable())
      assert.is_true(n:shares_storage(x))
      n[{1, 1}] = 10
      assert.are.equal(10, at(x, {1, 2}))
    end)

    it("slice with a step multiplies the stride", function()
      local x = nd.arange(10)
      local s = x:slice(1, 1, -1, 2)
      assert.are.same({5}, s.shape)
      assert.are.same({2}, s:stride())
      assert.are.same({0, 2, 4, 6, 8}, s:totable())
      local t = x:slice(1, 2, 9, 3) -- indices 2, 5, 8 -> values 1, 4, 7
      assert.are.same({1, 4, 7}, t:totable())
      assert.are.equal(1, t:storage_offset())
    end)

    it("writes through a stepped slice touch only the selected elements", function()
      local x = nd.arange(6)
      local s = x:slice(1, 1, 6, 2)
      s:fill_(-1)
      assert.are.same({-1, 1, -1, 3, -1, 5}, x:totable())
    end)

    it("slice on an inner dim", function()
      local x = iota({2, 4})
      local s = x:slice(2, 2, 4, 2) -- columns 2 and 4
      assert.are.same({{1, 3}, {5, 7}}, s:totable())
      assert.are.same({4, 2}, s:stride())
    end)
  end)

  describe("squeeze and unsqueeze", function()
    it("squeeze() removes every size-1 dim", function()
      local x = nd.zeros({1, 3, 1, 2})
      local s = x:squeeze()
      assert.are.same({3, 2}, s.shape)
      assert.is_true(s:shares_storage(x))
    end)

    it("squeeze(d) removes only that dim, and leaves non-1 dims alone", function()
      local x = nd.zeros({1, 3, 1, 2})
      assert.are.same({3, 1, 2}, x:squeeze(1).shape)
      assert.are.same({1, 3, 2}, x:squeeze(3).shape)
      assert.are.same({1, 3, 2}, x:squeeze(-2).shape)
      assert.are.same({1, 3, 1, 2}, x:squeeze(2).shape)
    end)

    it("unsqueeze inserts a size-1 dim at the given 1-based position", function()
      local x = iota({2, 3})
      assert.are.same({1, 2, 3}, x:unsqueeze(1).shape)
      assert.are.same({2, 1, 3}, x:unsqueeze(2).shape)
      assert.are.same({2, 3, 1}, x:unsqueeze(3).shape)
      assert.are.same({2, 3, 1}, x:unsqueeze(-1).shape)
      assert.are.same({2, 1, 3}, x:unsqueeze(-2).shape)
    end)

    it("squeeze/unsqueeze views share storage both ways", function()
      local x = iota({2, 3})
      local u = x:unsqueeze(2)
      assert.are.same({{{0, 1, 2}}, {{3, 4, 5}}}, u:totable())
      u[{2, 1, 3}] = 55
      assert.are.equal(55, at(x, {2, 3}))
      local s = u:squeeze(2)
      x[{1, 1}] = 11
      assert.are.equal(11, at(s, {1, 1}))
      assert.is_true(s:shares_storage(x))
    end)
  end)

  describe("flatten", function()
    it("flatten() gives one dim", function()
      local x = iota({2, 3, 4})
      local f = x:flatten()
      assert.are.same({24}, f.shape)
      assert.is_true(f:shares_storage(x))
    end)

    it("flatten(start) and flatten(start, end) merge an inclusive dim range", function()
      local x = iota({2, 3, 4})
      assert.are.same({2, 12}, x:flatten(2).shape)
      assert.are.same({6, 4}, x:flatten(1, 2).shape)
      assert.are.same({2, 12}, x:flatten(2, 3).shape)
      assert.are.same({2, 12}, x:flatten(-2, -1).shape)
      assert.are.same({2, 3, 4}, x:flatten(2, 2).shape)
    end)

    it("writes through flatten reach the base", function()
      local x = iota({2, 3, 4})
      local f = x:flatten(1, 2)
      f[{5, 3}] = -9 -- row 5 of {6,4} is x[2,2,:]
      assert.are.equal(-9, at(x, {2, 2, 3}))
    end)

    it("flatten of a non-contiguous tensor keeps the logical order", function()
      local x = iota({2, 3}):t()
      assert.are.same({0, 3, 1, 4, 2, 5}, x:flatten():totable())
    end)
  end)

  describe("contiguous and clone", function()
    it("contiguous of a contiguous tensor shares its storage", function()
      local x = iota({2, 3})
      local c = x:contiguous()
      assert.is_true(c:is_contiguous())
      assert.is_true(c:shares_storage(x))
      assert.are.same(x:totable(), c:totable())
    end)

    it("contiguous of a transposed tensor copies into row-major order", function()
      local x = iota({2, 3})
      local y = x:t()
      assert.is_false(y:is_contiguous())
      local c = y:contiguous()
      assert.is_true(c:is_contiguous())
      assert.is_false(c:shares_storage(x))
      assert.are.same({2, 1}, c:stride())
      assert.are.same({{0, 3}, {1, 4}, {2, 5}}, c:totable())
    end)

    it("clone is independent of the original", function()
      local x = iota({2, 3})
      local c = x:clone()
      assert.is_false(c:shares_storage(x))
      assert.are.same(x:totable(), c:totable())
      c[{1, 1}] = 100
      x[{2, 2}] = 200
      assert.are.equal(0, at(x, {1, 1}))
      assert.are.equal(4, at(c, {2, 2}))
    end)

    it("clone of a view copies only the view's elements", function()
      local x = iota({2, 3})
      local c = x:select(2, 2):clone()
      assert.are.same({1, 4}, c:totable())
      assert.are.same({1}, c:stride())
      assert.are.equal(2, c:numel())
    end)
  end)

  -- One rule for every tensor, however it is made (docs/tensor.md, "Sizes"):
  -- sizes >= 0 whose product, counting 0 as 1, is at most 2^48. Empty
  -- tensors with huge other dims used to pass reshape/view and then overflow
  -- int64 in strides, numel and reductions (UBSan: nd_contiguous_strides,
  -- op_reduce.c); the sanitizer build runs these too.
  describe("the size rule", function()
    local H = 1 << 62
    local RULE = "is too large (the product of its sizes, counting 0 as 1, is more than 2^48)"

    it("reshape and view refuse an empty shape whose other sizes are huge", function()
      local e = nd.empty({0})
      assert_contains(errmsg(function() return e:reshape({0, H, H}) end),
        "needle.reshape: shape {0,4611686018427387904,4611686018427387904} " .. RULE)
      assert_contains(errmsg(function() return e:view({0, H, H}) end), "needle.view: shape {0,")
      assert_contains(errmsg(function() return e:reshape({H, 0, -1}) end), "needle.reshape: shape {")
      assert_contains(errmsg(function() return e:reshape(0, 1 << 24, 1 << 25) end), RULE)
    end)

    it("accepts empty shapes up to the bound, and their views, sums and copies", function()
      local x = nd.empty({0}):reshape({0, 1 << 24, 1 << 24})
      assert.are.same({0, 1 << 24, 1 << 24}, x.shape)
      assert.are.same({1 << 48, 1 << 24, 1}, x:stride())
      assert.are.same({1 << 24, 1 << 24, 0}, x:permute({3, 2, 1}):contiguous().shape)
      assert.are.same({0, 1 << 24}, x:sum(2).shape)
      assert.are.same({1 << 24}, x:sum({1, 2}).shape)
      assert.are.same({1, 0, 1 << 24, 1 << 24}, x:unsqueeze(1).shape)
      assert.are.same({0}, x:flatten().shape)
      assert.are.same({1 << 24, 1 << 24, 0}, nd.zeros({1 << 24, 1 << 24, 0}).shape)
      assert_contains(errmsg(nd.zeros, {1 << 24, 1 << 25, 0}),
        "needle.zeros: shape {16777216,33554432,0} " .. RULE)
    end)

    it("cat and stack name themselves when their result is beyond the bound", function()
      local a = nd.zeros({1}):expand({1 << 47})
      assert_contains(errmsg(nd.stack, {a, a, a}), "needle.stack: shape {3,140737488355328} " .. RULE)
      assert_contains(errmsg(nd.cat, {a, a, a}), "needle.cat: shape {")
      assert_contains(errmsg(nd.cat, {a, a, a}), RULE)
      local many = {}
      for i = 1, 4096 do many[i] = a end -- as many as cat takes
      assert_contains(errmsg(nd.cat, many), "needle.cat: shape {")
    end)

    it("expand and broadcasting refuse results beyond the bound, zeros or not", function()
      local one = nd.zeros({1, 1})
      assert_contains(errmsg(function() return one:expand({1 << 40, 1 << 40}) end),
        "needle.expand: shape {1099511627776,1099511627776} " .. RULE)
      local a = nd.zeros({1, 1, 0}):expand({1 << 40, 1, 0})
      local b = nd.zeros({1, 1, 0}):expand({1, 1 << 40, 0})
      assert_contains(errmsg(function() return a + b end),
        "needle.add: shape {1099511627776,1099511627776,0} " .. RULE)
      assert_contains(errmsg(nd.where, a:eq(0), a, b), "needle.where: shape {")
      local p = nd.zeros({1, 1, 1, 1}):expand({1 << 30, 1, 1, 1})
      local q = nd.zeros({1, 1, 1, 1}):expand({1, 1 << 30, 1, 1})
      assert_contains(errmsg(nd.matmul, p, q), "needle.matmul: shape {1073741824,1073741824} " .. RULE)
    end)

    it("ops that compute a result shape apply it under their own name", function()
      local F = nd.F
      assert_contains(errmsg(F.conv_transpose2d, nd.zeros({1, 1, 2, 2}), nd.zeros({1, 1, 1, 1}), nil,
        {stride = 1 << 30, dilation = 1 << 30}), "needle.conv_transpose2d: shape {1,1,1073741825,1073741825} " .. RULE)
      -- an empty weight with huge other dims and a huge group count: no overflow
      assert_contains(errmsg(F.conv2d, nd.zeros({1, 0, 2, 2}), nd.zeros({0, 1 << 48, 1, 1}), nil,
        {groups = 1 << 30}), "needle.conv2d: input has 0 channels but weight expects 281474976710656 x 1073741824")
      assert_contains(errmsg(nd.one_hot, nd.zeros({0}, {dtype = "int64"}), math.maxinteger),
        "needle.one_hot: shape {0,9223372036854775807} " .. RULE)
      assert_contains(errmsg(nd.randint, 1, 10, {0, H, H}), "needle.randint: shape {0,")
      assert_contains(errmsg(nd.eye, 0, H), "needle.eye: shape {0,4611686018427387904} " .. RULE)
    end)

    it("what nd.save writes at the bound, nd.load reads back", function()
      local path = os.tmpname()
      nd.save({a = nd.zeros({1 << 24, 1 << 24, 0}), b = nd.ones({2})}, path)
      local t = nd.load(path)
      os.remove(path)
      assert.are.same({1 << 24, 1 << 24, 0}, t.a.shape)
      assert.are.same({1, 1}, t.b:totable())
    end)
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

  it("empty tensors are contiguous", function()
    assert.is_true(nd.zeros({2, 0, 3}):is_contiguous())
  end)
end)
