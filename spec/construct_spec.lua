-- construct_spec.lua - nd.tensor from nested tables, the constructors,
-- metadata accessors, totable/item, and the random functions.
--
--   build/needle-lua spec/run.lua spec/construct_spec.lua
--
-- Expected values are written out by hand or computed in plain Lua.

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains
local err_of, has = A.err_of, A.has

local maxi = math.maxinteger
local function i64(t) return nd.tensor(t, {dtype = "int64"}) end

-- nearest float32 to v (for values that are not exact in float32)
local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

describe("nd.tensor", function()
  it("infers the shape of nested tables", function()
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({2, 3}, x.shape)
    assert.are.equal("float32", x.dtype)
    assert.are.same({{1, 2, 3}, {4, 5, 6}}, x:totable())
  end)

  it("infers a 3-d shape", function()
    local x = nd.tensor({{{1, 2}}, {{3, 4}}, {{5, 6}}})
    assert.are.same({3, 1, 2}, x.shape)
  end)

  it("honours the dtype option", function()
    local x = nd.tensor({1, 2, 3}, {dtype = "int64"})
    assert.are.equal("int64", x.dtype)
    local t = x:totable()
    assert.are.same({1, 2, 3}, t)
    assert.are.equal("integer", math.type(t[1]))
    assert.are.equal("float64", nd.tensor({0.5}, {dtype = "float64"}).dtype)
  end)

  it("keeps large int64 values exactly", function()
    local big = (1 << 62) + 1
    local x = nd.tensor({big, -big}, {dtype = "int64"})
    assert.are.same({big, -big}, x:totable())
  end)

  it("makes booleans into a bool tensor", function()
    local x = nd.tensor({true, false, true})
    assert.are.equal("bool", x.dtype)
    assert.are.same({true, false, true}, x:totable())
  end)

  it("makes a scalar into a 0-dim tensor", function()
    local x = nd.tensor(5)
    assert.are.equal(0, x:dim())
    assert.are.same({}, x.shape)
    assert.are.equal(1, x:numel())
    assert.are.equal(5, x:item())
    local b = nd.tensor(true)
    assert.are.equal("bool", b.dtype)
    assert.are.equal(true, b:item())
  end)

  it("makes an empty table into a tensor of shape {0}", function()
    local x = nd.tensor({})
    assert.are.same({0}, x.shape)
    assert.are.equal(0, x:numel())
  end)

  it("copies a tensor argument", function()
    local a = nd.tensor({1, 2})
    local b = nd.tensor(a)
    assert.is_false(b:shares_storage(a))
    b[1] = 9
    assert.are.same({1, 2}, a:totable())
  end)

  it("sets requires_grad from the options", function()
    assert.is_true(nd.tensor({1.5}, {requires_grad = true}).requires_grad)
    assert.is_false(nd.tensor({1.5}).requires_grad)
  end)

  it("errors on a ragged table, naming the position", function()
    local msg = errmsg(function() return nd.tensor({{1, 2}, {3}}) end)
    assert_contains(msg, "needle.tensor")
    assert_contains(msg, "ragged")
    assert_contains(msg, "{2}")
  end)

  it("errors on a number where a table belongs, naming the position", function()
    local msg = errmsg(function() return nd.tensor({{1, 2}, 3}) end)
    assert_contains(msg, "needle.tensor")
    assert_contains(msg, "{2}")
    assert_contains(msg, "number")
  end)

  it("errors on a non-number element, naming the position and the type", function()
    local msg = errmsg(function() return nd.tensor({1, "a", 3}) end)
    assert_contains(msg, "needle.tensor")
    assert_contains(msg, "{2}")
    assert_contains(msg, "string")
    msg = errmsg(function() return nd.tensor({{1, 2}, {3, {}}}) end)
    assert_contains(msg, "{2,2}")
    assert_contains(msg, "table")
    msg = errmsg(function() return nd.tensor({{1, 2}, {print, 4}}) end)
    assert_contains(msg, "{2,1}")
    assert_contains(msg, "function")
  end)

  it("accepts 8 levels of nesting and rejects 9", function()
    local t8 = 1
    for _ = 1, 8 do t8 = {t8} end
    assert.are.same({1, 1, 1, 1, 1, 1, 1, 1}, nd.tensor(t8).shape)
    local msg = errmsg(function() return nd.tensor({t8}) end)
    assert_contains(msg, "needle.tensor")
    assert_contains(msg, "8")
  end)

  it("errors on a string argument", function()
    assert_contains(errmsg(function() return nd.tensor("abc") end), "string")
  end)

  it("a ragged table is caught even when the first row is empty", function()
    local e = err_of(function() return nd.tensor({{}, {1, 2}}) end)
    has(e, "ragged nested table")
  end)
end)

describe("fill constructors", function()
  it("zeros/ones/full/empty take a table shape", function()
    local z = nd.zeros({2, 3})
    assert.are.same({2, 3}, z.shape)
    assert.are.equal("float32", z.dtype)
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, z:totable())
    assert.are.same({{1, 1}, {1, 1}}, nd.ones({2, 2}):totable())
    assert.are.same({{7, 7, 7}, {7, 7, 7}}, nd.full({2, 3}, 7):totable())
    assert.are.same({4, 1}, nd.empty({4, 1}).shape)
  end)

  it("zeros/ones/empty take sizes as varargs", function()
    assert.are.same({2, 3}, nd.zeros(2, 3).shape)
    assert.are.same({{1, 1, 1}}, nd.ones(1, 3):totable())
    assert.are.same({5}, nd.empty(5).shape)
    assert.are.same({2, 3, 4}, nd.zeros(2, 3, 4).shape)
  end)

  it("an empty shape gives a 0-dim tensor", function()
    local z = nd.zeros({})
    assert.are.equal(0, z:dim())
    assert.are.equal(0, z:item())
  end)

  it("a zero size gives an empty tensor", function()
    local z = nd.zeros({3, 0})
    assert.are.same({3, 0}, z.shape)
    assert.are.equal(0, z:numel())
  end)

  it("honours the dtype option (table shape and varargs)", function()
    local z = nd.zeros({2}, {dtype = "int64"})
    assert.are.equal("int64", z.dtype)
    assert.are.equal("integer", math.type(z:totable()[1]))
    assert.are.equal("float64", nd.ones(2, 3, {dtype = "float64"}).dtype)
    assert.are.equal("int32", nd.full({2}, 3, {dtype = "int32"}).dtype)
    assert.are.same({3, 3}, nd.full({2}, 3, {dtype = "int32"}):totable())
    assert.are.equal("float64", nd.empty({2}, {dtype = "float64"}).dtype)
  end)

  it("full with a boolean value makes a bool tensor", function()
    local b = nd.full({2}, true)
    assert.are.equal("bool", b.dtype)
    assert.are.same({true, true}, b:totable())
  end)

  it("honours requires_grad", function()
    assert.is_true(nd.zeros({2}, {requires_grad = true}).requires_grad)
    assert.is_true(nd.ones(2, 2, {requires_grad = true}).requires_grad)
    assert.is_true(nd.full({2}, 1, {requires_grad = true}).requires_grad)
    assert.is_false(nd.zeros({2}).requires_grad)
  end)

  it("rejects requires_grad for an integer dtype", function()
    local msg = errmsg(function() return nd.zeros({2}, {dtype = "int64", requires_grad = true}) end)
    assert_contains(msg, "needle.zeros")
    assert_contains(msg, "floating point")
    msg = errmsg(function() return nd.tensor({1}, {dtype = "int64", requires_grad = true}) end)
    assert_contains(msg, "floating point")
  end)

  it("rejects an unknown dtype", function()
    assert_contains(errmsg(function() return nd.zeros({2}, {dtype = "float7"}) end), "float7")
  end)

  it("zeros_like/ones_like/full_like keep shape and dtype", function()
    local x = nd.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "int64"})
    local z = nd.zeros_like(x)
    assert.are.same({2, 3}, z.shape)
    assert.are.equal("int64", z.dtype)
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, z:totable())
    assert.are.same({{1, 1, 1}, {1, 1, 1}}, nd.ones_like(x):totable())
    assert.are.same({{4, 4, 4}, {4, 4, 4}}, nd.full_like(x, 4):totable())
    assert.are.equal("float64", nd.zeros_like(x, {dtype = "float64"}).dtype)
  end)

  it("rand_like/randn_like keep the shape", function()
    local x = nd.zeros({3, 4})
    local r = nd.rand_like(x)
    assert.are.same({3, 4}, r.shape)
    assert.are.equal("float32", r.dtype)
    assert.are.same({3, 4}, nd.randn_like(x).shape)
  end)
end)

describe("ranges", function()
  it("arange with integer arguments gives int64", function()
    local a = nd.arange(5)
    assert.are.equal("int64", a.dtype)
    assert.are.same({0, 1, 2, 3, 4}, a:totable())
    assert.are.same({2, 3, 4}, nd.arange(2, 5):totable())
  end)

  it("arange with a step, positive and negative", function()
    assert.are.same({0, 3, 6, 9}, nd.arange(0, 10, 3):totable())
    assert.are.same({5, 4, 3, 2, 1}, nd.arange(5, 0, -1):totable())
    assert.are.same({10, 7, 4}, nd.arange(10, 2, -3):totable())
  end)

  it("arange with float arguments gives float32", function()
    local a = nd.arange(0.0, 1.0, 0.25)
    assert.are.equal("float32", a.dtype)
    assert.are.same({0, 0.25, 0.5, 0.75}, a:totable())
    local b = nd.arange(1.5)
    assert.are.equal("float32", b.dtype)
    assert.are.same({0, 1}, b:totable())
    assert.are.equal("float32", nd.arange(0, 2, 0.5).dtype)
  end)

  it("arange takes a dtype option", function()
    local a = nd.arange(3, {dtype = "float64"})
    assert.are.equal("float64", a.dtype)
    assert.are.same({0, 1, 2}, a:totable())
  end)

  it("arange of an empty range is empty", function()
    assert.are.equal(0, nd.arange(0):numel())
    assert.are.equal(0, nd.arange(5, 5):numel())
  end)

  it("linspace includes both endpoints exactly", function()
    assert.are.same({0, 0.25, 0.5, 0.75, 1}, nd.linspace(0, 1, 5):totable())
    assert.are.same({-1, 0, 1}, nd.linspace(-1, 1, 3):totable())
    local t = nd.linspace(0.1, 0.7, 7):totable()
    assert.are.equal(7, #t)
    assert.are.equal(f32(0.1), t[1])
    assert.are.equal(f32(0.7), t[7])
    for i = 1, 7 do assert.is_true(math.abs(t[i] - 0.1 * i) < 1e-6) end
  end)

  it("linspace runs downwards and handles one step", function()
    assert.are.same({2, 1, 0}, nd.linspace(2, 0, 3):totable())
    assert.are.same({3}, nd.linspace(3, 7, 1):totable())
    assert.are.equal("float64", nd.linspace(0, 1, 3, {dtype = "float64"}).dtype)
  end)

  it("eye(n) is the identity", function()
    assert.are.same({{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, nd.eye(3):totable())
    assert.are.equal("float32", nd.eye(2).dtype)
  end)

  it("eye(n, m) is rectangular", function()
    assert.are.same({{1, 0, 0}, {0, 1, 0}}, nd.eye(2, 3):totable())
    assert.are.same({{1, 0}, {0, 1}, {0, 0}}, nd.eye(3, 2):totable())
    assert.are.equal("int64", nd.eye(2, {dtype = "int64"}).dtype)
  end)
end)

describe("one_hot", function()
  it("takes 1-based labels and infers the number of classes", function()
    local o = nd.one_hot({1, 3, 2})
    assert.are.same({3, 3}, o.shape)
    assert.are.same({{1, 0, 0}, {0, 0, 1}, {0, 1, 0}}, o:totable())
  end)

  it("takes a given number of classes", function()
    local o = nd.one_hot(nd.tensor({2, 1}, {dtype = "int64"}), 4)
    assert.are.same({{0, 1, 0, 0}, {1, 0, 0, 0}}, o:totable())
  end)

  it("keeps the label shape as leading dims", function()
    local o = nd.one_hot({{1, 2}, {2, 1}}, 2)
    assert.are.same({2, 2, 2}, o.shape)
    assert.are.same({{{1, 0}, {0, 1}}, {{0, 1}, {1, 0}}}, o:totable())
  end)

  it("rejects label 0 mentioning 1-based", function()
    assert_contains(errmsg(function() return nd.one_hot({1, 0}) end), "1-based")
  end)

  it("rejects a label above num_classes, naming the label and 1-based range", function()
    local msg = errmsg(function() return nd.one_hot({1, 5}, 3) end)
    assert_contains(msg, "needle.one_hot")
    assert_contains(msg, "5")
    assert_contains(msg, "1..3")
  end)

  describe("huge labels", function()
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
end)

describe("metadata and conversion", function()
  it("totable round-trips nested tables", function()
    local t = {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}, {{9, 10}, {11, 12}}}
    assert.are.same(t, nd.tensor(t):totable())
    assert.are.same(t, nd.tensor(nd.tensor(t):totable()):totable())
    local b = {{true, false}, {false, true}}
    assert.are.same(b, nd.tensor(b):totable())
  end)

  it("totable of a 0-dim tensor is a number", function()
    assert.are.equal(3, nd.tensor(3):totable())
  end)

  it("item returns a Lua number for one element", function()
    assert.are.equal(2.5, nd.tensor({{2.5}}):item())
    local i = nd.tensor({7}, {dtype = "int64"}):item()
    assert.are.equal(7, i)
    assert.are.equal("integer", math.type(i))
  end)

  it("item errors when numel ~= 1", function()
    local msg = errmsg(function() return nd.ones(2, 3):item() end)
    assert_contains(msg, "needle.item")
    assert_contains(msg, "6")
    msg = errmsg(function() return nd.zeros({0}):item() end)
    assert_contains(msg, "needle.item")
  end)

  it("x.shape returns a fresh table", function()
    local x = nd.zeros({2, 3})
    local s = x.shape
    s[1] = 99
    s[3] = 4
    assert.are.same({2, 3}, x.shape)
    assert.are_not.equal(x.shape, x.shape)
  end)

  it("size, dim, numel, # and dtype/device", function()
    local x = nd.zeros({2, 3, 4})
    assert.are.equal(3, x:size(2))
    assert.are.equal(4, x:size(-1))
    assert.are.equal(2, x:size(-3))
    assert.are.same({2, 3, 4}, x:size())
    assert.are.equal(3, x:dim())
    assert.are.equal(24, x:numel())
    assert.are.equal(2, #x)
    assert.are.equal("float32", x.dtype)
    assert.are.equal("cpu", x.device)
  end)

  it("# of a 0-dim tensor errors", function()
    assert_contains(errmsg(function() return #nd.tensor(1) end), "needle.")
  end)

  it("size(d) errors for a dim out of range", function()
    local x = nd.zeros({2, 3})
    assert_contains(errmsg(function() return x:size(3) end), "needle.size")
    assert_contains(errmsg(function() return x:size(0) end), "1-based")
  end)
end)

describe("random", function()
  local function draw_all()
    return {
      nd.rand({50}):totable(),
      nd.randn({50}):totable(),
      nd.randint(1, 100, {50}):totable(),
      nd.randperm(50):totable(),
      nd.bernoulli(nd.full({50}, 0.5)):totable(),
    }
  end

  it("manual_seed makes rand/randn/randint/randperm/bernoulli reproducible", function()
    nd.manual_seed(1234)
    local a = draw_all()
    nd.manual_seed(1234)
    local b = draw_all()
    assert.are.same(a, b)
  end)

  it("different seeds give different streams", function()
    nd.manual_seed(1)
    local a = draw_all()
    nd.manual_seed(2)
    local b = draw_all()
    for i = 1, 4 do -- bernoulli on 50 draws could coincide only with prob 2^-50
      assert.is_false(same_list(a[i], b[i]), "stream " .. i .. " did not change with the seed")
    end
    assert.is_false(same_list(a[5], b[5]))
  end)

  it("consecutive draws differ", function()
    nd.manual_seed(5)
    assert.is_false(same_list(nd.rand({20}):totable(), nd.rand({20}):totable()))
  end)

  it("rand is in [0, 1) with mean about 0.5", function()
    nd.manual_seed(11)
    local t = nd.rand({100000}):totable()
    local lo, hi, sum = math.huge, -math.huge, 0
    for i = 1, #t do
      local v = t[i]
      if v < lo then lo = v end
      if v > hi then hi = v end
      sum = sum + v
    end
    assert.is_true(lo >= 0)
    assert.is_true(hi < 1)
    assert.is_true(math.abs(sum / #t - 0.5) < 0.01)
  end)

  it("rand takes varargs sizes and a float64 dtype", function()
    assert.are.same({2, 3}, nd.rand(2, 3).shape)
    assert.are.equal("float64", nd.rand({2}, {dtype = "float64"}).dtype)
  end)

  it("randn has mean about 0 and std about 1", function()
    nd.manual_seed(12)
    local t = nd.randn({100000}):totable()
    local n, sum, sq = #t, 0, 0
    for i = 1, n do sum = sum + t[i] end
    local mean = sum / n
    for i = 1, n do sq = sq + (t[i] - mean) ^ 2 end
    local std = math.sqrt(sq / (n - 1))
    assert.is_true(math.abs(mean) < 0.02, "mean " .. mean)
    assert.is_true(math.abs(std - 1) < 0.02, "std " .. std)
  end)

  it("randint is inclusive of both bounds and hits every value", function()
    nd.manual_seed(13)
    local x = nd.randint(1, 6, {10000})
    assert.are.equal("int64", x.dtype)
    local seen = {}
    for _, v in ipairs(x:totable()) do
      assert.is_true(v >= 1 and v <= 6, "out of range: " .. v)
      seen[v] = true
    end
    for v = 1, 6 do assert.is_true(seen[v], "value " .. v .. " never drawn") end
  end)

  it("randint works with negative bounds and a single value", function()
    nd.manual_seed(14)
    local seen = {}
    for _, v in ipairs(nd.randint(-2, 2, {2000}):totable()) do
      assert.is_true(v >= -2 and v <= 2)
      seen[v] = true
    end
    for v = -2, 2 do assert.is_true(seen[v]) end
    assert.are.same({3, 3, 3}, nd.randint(3, 3, {3}):totable())
    assert.are.same({2, 2}, nd.randint(0, 9, {2, 2}).shape)
  end)

  it("randint with high < low errors", function()
    assert_contains(errmsg(function() return nd.randint(5, 4, {2}) end), "needle.randint")
  end)

  it("randperm(n) is a permutation of 1..n", function()
    nd.manual_seed(15)
    local p = nd.randperm(100)
    assert.are.equal("int64", p.dtype)
    local t = p:totable()
    assert.are.equal(100, #t)
    table.sort(t)
    for i = 1, 100 do assert.are.equal(i, t[i]) end
    assert.are.same({1}, nd.randperm(1):totable())
    assert.are.equal(0, nd.randperm(0):numel())
  end)

  it("bernoulli with p = 0 and p = 1 is exact", function()
    nd.manual_seed(16)
    for _, v in ipairs(nd.bernoulli(nd.zeros({1000})):totable()) do assert.are.equal(0, v) end
    for _, v in ipairs(nd.bernoulli(nd.ones({1000})):totable()) do assert.are.equal(1, v) end
    local mixed = nd.bernoulli(nd.tensor({0, 1, 0, 1})):totable()
    assert.are.same({0, 1, 0, 1}, mixed)
  end)

  it("bernoulli(0.5) gives about half ones", function()
    nd.manual_seed(17)
    local ones = 0
    for _, v in ipairs(nd.bernoulli(nd.full({10000}, 0.5)):totable()) do
      assert.is_true(v == 0 or v == 1)
      if v == 1 then ones = ones + 1 end
    end
    assert.is_true(ones > 4700 and ones < 5300, "ones: " .. ones)
  end)

  it("bernoulli rejects p outside [0, 1]", function()
    local msg = errmsg(function() return nd.bernoulli(nd.full({3}, 1.5)) end)
    assert_contains(msg, "needle.bernoulli")
    assert_contains(msg, "1.5")
    msg = errmsg(function() return nd.bernoulli(nd.tensor({0.5, -0.1})) end)
    assert_contains(msg, "needle.bernoulli")
  end)

  it("results do not depend on the number of threads", function()
    local saved = nd.get_num_threads()
    local ok, err = pcall(function()
      nd.set_num_threads(1)
      nd.manual_seed(99)
      local a1, n1 = nd.rand({200000}):totable(), nd.randn({200000}):totable()
      nd.set_num_threads(2)
      nd.manual_seed(99)
      local a2, n2 = nd.rand({200000}):totable(), nd.randn({200000}):totable()
      assert.is_true(same_list(a1, a2), "rand differs between 1 and 2 threads")
      assert.is_true(same_list(n1, n2), "randn differs between 1 and 2 threads")
    end)
    nd.set_num_threads(saved)
    assert(ok, err)
  end)

  it("get_rng_state/set_rng_state replays a sequence", function()
    nd.manual_seed(21)
    nd.rand({7}) -- move along the stream
    local state = nd.get_rng_state()
    local a = nd.rand({10}):totable()
    local b = nd.randn({10}):totable()
    local c = nd.randint(1, 1000, {10}):totable()
    nd.set_rng_state(state)
    assert.are.same(a, nd.rand({10}):totable())
    assert.are.same(b, nd.randn({10}):totable())
    assert.are.same(c, nd.randint(1, 1000, {10}):totable())
  end)

  it("set_rng_state rejects a bad state", function()
    assert_contains(errmsg(function() nd.set_rng_state({seed = "x"}) end), "needle.set_rng_state")
  end)

  it("rand rejects an integer dtype", function()
    assert_contains(errmsg(function() return nd.rand({2}, {dtype = "int64"}) end), "needle.rand")
  end)
end)

-- Issue 15: a shape table is a list of sizes and nothing else; every op that
-- reads a shape (constructors, view, reshape, expand, frombytes, ...) goes
-- through the same reader, so each case is tried on several.
describe("shape tables", function()
  local readers = {
    zeros = function(s) return nd.zeros(s) end,
    full = function(s) return nd.full(s, 1) end,
    randn = function(s) return nd.randn(s) end,
    reshape = function(s) return nd.zeros({8}):reshape(s) end,
    view = function(s) return nd.zeros({8}):view(s) end,
  }

  it("with holes is an error, not a shorter shape", function()
    for name, f in pairs(readers) do
      local msg = errmsg(f, {[1] = 2, [3] = 4})
      assert_contains(msg, "needle." .. name .. ": a shape is a list of sizes such as {2, 3}, " ..
                      "but this one has no size at index 2 (and one at 3)")
    end
    -- a hole after the first size too, and one that leaves #t ambiguous
    assert_contains(errmsg(nd.zeros, {2, nil, 4}), "no size at index 2")
    assert_contains(errmsg(nd.zeros, {[2] = 3}), "no size at index 1 (and one at 2)")
  end)

  it("with a key that is not a position is an error", function()
    for name, f in pairs(readers) do
      assert_contains(errmsg(f, {2, 4, x = 3}),
                      "needle." .. name .. ": a shape is a list of sizes such as {2, 3}, but this one has the key 'x'")
    end
    assert_contains(errmsg(nd.zeros, {[0] = 1, 2}), "has the key 0")
    assert_contains(errmsg(nd.zeros, {[1.5] = 1}), "has the key 1.5")
    assert_contains(errmsg(nd.zeros, {2, [-1] = 3}), "has the key -1")
  end)

  it("with a size that is not an integer names the size", function()
    assert_contains(errmsg(nd.zeros, {2, 2.5}), "needle.zeros: size 2 of the shape must be an integer, got 2.5")
    assert_contains(errmsg(nd.zeros, {"2"}), "needle.zeros: size 1 of the shape must be an integer, got string")
    assert_contains(errmsg(nd.zeros, {2, {3}}), "size 2 of the shape must be an integer, got table")
    assert_contains(errmsg(nd.zeros({8}).reshape, nd.zeros({8}), {2, true}),
                    "needle.reshape: size 2 of the shape must be an integer, got boolean")
  end)

  it("that are plain lists still work, empty included", function()
    assert.are.same({2, 4}, nd.zeros({2, 4}).shape)
    assert.are.same({}, nd.zeros({}).shape)
    assert.are.same({2, 4}, nd.zeros({8}):reshape({2, -1}).shape)
    assert.are.same({2, 2}, nd.zeros(2, 2).shape)
  end)
end)
