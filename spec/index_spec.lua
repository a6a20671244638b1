-- index_spec.lua - x[i], x[{...}] reads (views) and writes (in place), and
-- the errors for bad indices.
--
--   build/needle-lua spec/run.lua spec/index_spec.lua
--
-- Indices are 1-based, negative from the end; {a, b[, step]} is an inclusive
-- range, {a} keeps the dim with just index a, ":" is the whole dim.

local nd = require "needle"

-- {{1,2,3},{4,5,6}} as int64
local function m23()
  return nd.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "int64"})
end

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains
local err_of, has = A.err_of, A.has

describe("indexing", function()
  describe("reads", function()
    it("x[i] selects along dim 1", function()
      local x = m23()
      assert.are.same({1, 2, 3}, x[1]:totable())
      assert.are.same({4, 5, 6}, x[2]:totable())
      assert.are.same({3}, x[1].shape)
    end)

    it("x[-1] is the last row, x[-2] the one before", function()
      local x = m23()
      assert.are.same({4, 5, 6}, x[-1]:totable())
      assert.are.same({1, 2, 3}, x[-2]:totable())
    end)

    it("x[i] of a 1-d tensor is a 0-dim tensor", function()
      local x = nd.tensor({10, 20, 30}, {dtype = "int64"})
      local e = x[2]
      assert.are.equal(0, e:dim())
      assert.are.same({}, e.shape)
      assert.are.equal(20, e:item())
      assert.are.equal(30, x[-1]:item())
    end)

    it("x[i] is a view sharing storage", function()
      local x = m23()
      local r = x[2]
      assert.is_true(r:shares_storage(x))
      assert.are.equal(3, r:storage_offset())
      r[1] = 40
      assert.are.equal(40, x[{2, 1}]:item())
    end)

    it("x[{i, j}] picks one element as a 0-dim tensor", function()
      local x = m23()
      local e = x[{2, 3}]
      assert.are.equal(0, e:dim())
      assert.are.equal(6, e:item())
      assert.are.equal(2, x[{1, 2}]:item())
      assert.are.equal(6, x[{-1, -1}]:item())
      assert.are.equal(4, x[{-1, 1}]:item())
    end)

    it("x[{i}] with one number selects like x[i]", function()
      local x = m23()
      assert.are.same({4, 5, 6}, x[{2}]:totable())
    end)

    it("\":\" keeps a whole dim", function()
      local x = m23()
      assert.are.same({2, 5}, x[{":", 2}]:totable())
      assert.are.same({{1, 2, 3}, {4, 5, 6}}, x[{":", ":"}]:totable())
      assert.are.same({3, 6}, x[{":", -1}]:totable())
    end)

    it("{a, b} is an inclusive range", function()
      local x = m23()
      assert.are.same({{2, 3}, {5, 6}}, x[{":", {2, 3}}]:totable())
      assert.are.same({5, 6}, x[{2, {2, 3}}]:totable())
      assert.are.same({{1, 2}}, x[{{1, 1}, {1, 2}}]:totable())
    end)

    it("{a} keeps the dim with just index a", function()
      local x = m23()
      local r = x[{{2}}]
      assert.are.same({1, 3}, r.shape)
      assert.are.same({{4, 5, 6}}, r:totable())
      local c = x[{":", {3}}]
      assert.are.same({2, 1}, c.shape)
      assert.are.same({{3}, {6}}, c:totable())
    end)

    it("ranges accept negative bounds", function()
      local x = nd.arange(1, 11) -- 1..10
      assert.are.same({8, 9, 10}, x[{{-3, -1}}]:totable())
      assert.are.same({2, 3, 4, 5, 6, 7, 8, 9}, x[{{2, -2}}]:totable())
      assert.are.same({10}, x[{{-1}}]:totable())
    end)

    it("{a, b, step} takes every step-th element", function()
      local x = nd.arange(1, 11) -- 1..10
      local s = x[{{1, 10, 3}}]
      assert.are.same({1, 4, 7, 10}, s:totable())
      assert.are.same({3}, s:stride())
      assert.are.same({2, 4, 6, 8, 10}, x[{{2, 10, 2}}]:totable())
      assert.are.same({1, 3, 5, 7, 9}, x[{{1, -1, 2}}]:totable())
      assert.are.same({2, 5}, x[{{2, 6, 3}}]:totable()) -- 2, 5 (8 > 6)
    end)

    it("mixes selects, ranges, steps and \":\" on a 3-d tensor", function()
      local x = nd.arange(24):reshape({2, 3, 4}) -- x[i,j,k] = (i-1)*12+(j-1)*4+(k-1)
      local r = x[{2, ":", {1, 4, 2}}]
      assert.are.same({3, 2}, r.shape)
      assert.are.same({{12, 14}, {16, 18}, {20, 22}}, r:totable())
      local s = x[{":", {2}, -1}]
      assert.are.same({2, 1}, s.shape)
      assert.are.same({{7}, {19}}, s:totable())
    end)

    it("fewer indices than dims leave the trailing dims whole", function()
      local x = nd.arange(24):reshape({2, 3, 4})
      assert.are.same({4}, x[{2, 3}].shape)
      assert.are.same({20, 21, 22, 23}, x[{2, 3}]:totable())
      assert.are.same({2, 3, 4}, x[{{1, 2}}].shape)
    end)

    it("range views share storage", function()
      local x = m23()
      local v = x[{":", {2, 3}}]
      assert.is_true(v:shares_storage(x))
      x[{1, 3}] = 30
      assert.are.equal(30, v[{1, 2}]:item())
    end)
  end)

  describe("writes", function()
    it("x[2] = 5 fills a row", function()
      local x = m23()
      x[2] = 5
      assert.are.same({{1, 2, 3}, {5, 5, 5}}, x:totable())
    end)

    it("x[{i, j}] = v writes one element", function()
      local x = m23()
      x[{1, 2}] = 20
      x[{-1, -1}] = 60
      assert.are.same({{1, 20, 3}, {4, 5, 60}}, x:totable())
    end)

    it("x[{{1,2}, 3}] = tensor copies a tensor into a column", function()
      local x = m23()
      x[{{1, 2}, 3}] = nd.tensor({7, 8}, {dtype = "int64"})
      assert.are.same({{1, 2, 7}, {4, 5, 8}}, x:totable())
    end)

    it("x[{\":\", 1}] = {..} copies a Lua table", function()
      local x = nd.zeros({3, 2})
      x[{":", 1}] = {1, 2, 3}
      assert.are.same({{1, 0}, {2, 0}, {3, 0}}, x:totable())
    end)

    it("a tensor of another dtype is converted on assignment", function()
      local x = nd.zeros({2, 3})
      x[1] = nd.tensor({1, 2, 3}, {dtype = "int64"})
      assert.are.same({{1, 2, 3}, {0, 0, 0}}, x:totable())
      assert.are.equal("float32", x.dtype)
    end)

    it("assignment broadcasts a row over a block", function()
      local x = nd.zeros({3, 3})
      x[{{1, 2}, ":"}] = nd.tensor({1, 2, 3})
      assert.are.same({{1, 2, 3}, {1, 2, 3}, {0, 0, 0}}, x:totable())
    end)

    it("assignment broadcasts a column over a block", function()
      local x = nd.zeros({2, 3})
      x[{":", {2, 3}}] = nd.tensor({{-1}, {-2}})
      assert.are.same({{0, -1, -1}, {0, -2, -2}}, x:totable())
    end)

    it("assigning a number to a range fills it", function()
      local x = nd.zeros({2, 3})
      x[{":", {2, 3}}] = 4
      assert.are.same({{0, 4, 4}, {0, 4, 4}}, x:totable())
    end)

    it("assigning to a stepped range writes only those elements", function()
      local x = nd.zeros({6})
      x[{{1, 6, 2}}] = nd.tensor({1, 2, 3})
      assert.are.same({1, 0, 2, 0, 3, 0}, x:totable())
      x[{{2, 6, 2}}] = 9
      assert.are.same({1, 9, 2, 9, 3, 9}, x:totable())
    end)

    it("writes on a view of a view reach the base", function()
      local x = nd.zeros({3, 4})
      local v = x[{{2, 3}, ":"}]
      v[{2, {1, 4, 3}}] = 7
      assert.are.same({{0, 0, 0, 0}, {0, 0, 0, 0}, {7, 0, 0, 7}}, x:totable())
    end)

    it("assigning a mismatched shape errors", function()
      local x = nd.zeros({2, 3})
      local msg = errmsg(function() x[1] = nd.tensor({1, 2}) end)
      assert_contains(msg, "needle.")
      assert.are.same({{0, 0, 0}, {0, 0, 0}}, x:totable())
    end)

    it("assigning past the end errors and changes nothing", function()
      local x = nd.zeros({2, 3})
      local msg = errmsg(function() x[3] = 1 end)
      assert_contains(msg, "index 3")
      assert_contains(msg, "size 2")
      assert.are.same({{0, 0, 0}, {0, 0, 0}}, x:totable())
    end)
  end)

  describe("errors", function()
    it("reading past the end names the index and dim size", function()
      local x = m23()
      local msg = errmsg(function() return x[5] end)
      assert_contains(msg, "needle.")
      assert_contains(msg, "index 5")
      assert_contains(msg, "dim 1")
      assert_contains(msg, "size 2")
    end)

    it("reading past the end of an inner dim names that dim", function()
      local x = m23()
      local msg = errmsg(function() return x[{1, 4}] end)
      assert_contains(msg, "index 4")
      assert_contains(msg, "dim 2")
      assert_contains(msg, "size 3")
    end)

    it("a negative index before the start errors", function()
      local x = m23()
      local msg = errmsg(function() return x[-3] end)
      assert_contains(msg, "index -3")
      assert_contains(msg, "size 2")
    end)

    it("a range past the end errors naming the dim size", function()
      local x = m23()
      local msg = errmsg(function() return x[{":", {2, 4}}] end)
      assert_contains(msg, "needle.")
      assert_contains(msg, "size 3")
    end)

    it("index 0 errors mentioning 1-based", function()
      local x = m23()
      assert_contains(errmsg(function() return x[0] end), "1-based")
      assert_contains(errmsg(function() return x[{1, 0}] end), "1-based")
      assert_contains(errmsg(function() return x[{{0, 2}}] end), "1-based")
      assert_contains(errmsg(function() x[0] = 1 end), "1-based")
    end)

    it("too many indices errors", function()
      local x = m23()
      local msg = errmsg(function() return x[{1, 1, 1}] end)
      assert_contains(msg, "too many indices")
      msg = errmsg(function() x[{1, 1, 1}] = 0 end)
      assert_contains(msg, "too many indices")
    end)

    it("indexing a 0-dim tensor errors", function()
      local x = nd.tensor(3)
      assert_contains(errmsg(function() return x[1] end), "needle.")
    end)

    it("a non-integer index errors", function()
      local x = m23()
      assert_contains(errmsg(function() return x[1.5] end), "integer")
      assert_contains(errmsg(function() return x[{1, 2.5}] end), "integer")
    end)

    it("a bad index type errors", function()
      local x = m23()
      assert_contains(errmsg(function() return x[{true}] end), "needle.")
      assert_contains(errmsg(function() return x[{"a"}] end), "needle.")
    end)
  end)

  it("index errors: extra ':' entries and non-integer index values", function()
    local e = err_of(function() return nd.arange(3)[{":", ":"}] end)
    has(e, "needle.index: too many indices (2)")
    e = err_of(function() return nd.arange(3):index_select(1, {1.7}) end)
    has(e, "needle.index_select: index values must be integers")
  end)
end)

-- Class labels and index values are integers, checked in the caller's
-- 1-based terms on every device: fractions used to be truncated
-- (cross_entropy(x, {1, 2, 1.5}) used 1), math.mininteger overflowed when
-- shifted to 0-based (UBSan, lt_math.c), and OpenCL reported label 0 as -1.
describe("class labels and index values", function()
  local D = require "spec.helpers.devices"
  local F = nd.F
  local RANGE = "is out of range for 3 classes (expected 1..3)"

  for _, dev in ipairs(D.all()) do
    describe("on " .. dev, function()
      local x
      before_each(function() x = nd.zeros({3, 3}, {device = dev}) end)

      it("cross_entropy refuses fractions, booleans and float labels", function()
        assert_contains(errmsg(F.cross_entropy, x, {1, 2, 1.5}),
          "needle.cross_entropy: labels must be integers, got 1.5 (at index {3})")
        assert_contains(errmsg(F.cross_entropy, x, {1, true, 1}), "labels must be integers, got a boolean (at index {2})")
        assert_contains(errmsg(F.cross_entropy, x, nd.tensor({1, 2, 1}, {device = dev})),
          "needle.cross_entropy: labels must be integers, got a float32 tensor")
        assert_contains(errmsg(F.cross_entropy, x, {1, 2, 1}, {ignore_index = 1.5}),
          "needle.cross_entropy: option 'ignore_index' must be an integer, got 1.5")
      end)

      it("cross_entropy names the user's label and 1..C, from a table or a tensor on the device", function()
        assert_contains(errmsg(F.cross_entropy, x, {1, 0, 1}), "needle.cross_entropy: label 0 of row 2 " .. RANGE)
        local y = nd.tensor({1, 0, 1}, {dtype = "int64", device = dev})
        assert_contains(errmsg(F.cross_entropy, x, y), "needle.cross_entropy: label 0 of row 2 " .. RANGE)
        assert_contains(errmsg(F.cross_entropy, x, {1, 4, 1}), "label 4 of row 2 " .. RANGE)
        assert_contains(errmsg(F.cross_entropy, x, {1, math.mininteger, 1}),
          "label -9223372036854775808 of row 2 " .. RANGE)
        assert_contains(errmsg(F.cross_entropy, x, {1, math.maxinteger, 1}),
          "label 9223372036854775807 of row 2 " .. RANGE)
      end)

      it("cross_entropy ignores any integer ignore_index, math.mininteger included", function()
        local logits = nd.tensor({{0, 0, 0}, {1, 2, 3}, {0, 0, 0}}, {device = dev})
        local l3 = math.log(3)
        for _, ig in ipairs({math.mininteger, -100, 2, 2.0, math.maxinteger}) do
          local lab = {1, ig, 3}
          local r = F.cross_entropy(logits, lab, {ignore_index = ig, reduction = "none"}):cpu():totable()
          assert.is_true(math.abs(r[1] - l3) < 1e-6 and r[2] == 0 and math.abs(r[3] - l3) < 1e-6,
            ("ignore_index %s: %s"):format(tostring(ig), table.concat(r, ", ")))
        end
        -- a label equal to a class that is not ignored is still used
        local r = F.cross_entropy(logits, {1, 3, 3}, {ignore_index = math.mininteger, reduction = "none"}):cpu():totable()
        assert.is_true(math.abs(r[2] - (math.log(math.exp(1) + math.exp(2) + math.exp(3)) - 3)) < 1e-5)
      end)

      it("nll_loss refuses fractions and mininteger labels, and ignores mininteger", function()
        assert_contains(errmsg(F.nll_loss, x, {1, 2, 1.5}), "needle.nll_loss: labels must be integers, got 1.5 (at index {3})")
        assert_contains(errmsg(F.nll_loss, x, {1, math.mininteger, 1}),
          "needle.nll_loss: label -9223372036854775808 " .. RANGE)
        assert_contains(errmsg(F.nll_loss, x, {1, 2, 1}, {ignore_index = 1.5}), "needle.nll_loss: option 'ignore_index' must be an integer, got 1.5")
        local lp = nd.tensor({{-1, -2, -3}, {-4, -5, -6}, {-7, -8, -9}}, {device = dev})
        assert.are.equal(5, F.nll_loss(lp, {1, math.mininteger, 3}, {ignore_index = math.mininteger}):item())
      end)
    end)
  end

  it("one_hot, gather and index_select refuse fractions and float tensors alike", function()
    assert_contains(errmsg(nd.one_hot, {1, 2, 1.5}, 3), "needle.one_hot: index values must be integers, got 1.5 (at index {3})")
    assert_contains(errmsg(nd.one_hot, nd.tensor({1, 2}), 3), "needle.one_hot: index values must be integers, got a float32 tensor")
    local v = nd.zeros({3})
    assert_contains(errmsg(function() return v:gather(1, {1.5}) end), "needle.gather: index values must be integers, got 1.5")
    assert_contains(errmsg(function() return v:index_select(1, {{1}, {true}}) end),
      "needle.index_select: index values must be integers, got a boolean (at index {2,1})")
    assert_contains(errmsg(function() return v:index_select(1, {1e300}) end), "needle.index_select: value 1e+300 is out of range for int64")
    assert_contains(errmsg(F.embedding, {1, 2.5}, nd.zeros({3, 2})), "needle.embedding: indices must be integers, got 2.5 (at index {2})")
    -- integral floats are integers
    assert.are.same({{0, 1, 0}}, nd.one_hot({2.0}, 3):totable())
  end)
end)
