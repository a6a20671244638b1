-- dtype_spec.lua - type promotion of binary ops (tensor-tensor and
-- tensor-number), conversions between every dtype (float16 and bfloat16
-- rounding included), truncation of float -> int, and dtype errors.
--
--   build/needle-lua spec/run.lua spec/dtype_spec.lua

local nd = require "needle"
local R = require "spec.helpers.reference"

local close, equal = R.asserts(assert)

-- Sample values of each dtype (all exactly representable in every one of
-- them that they are used with).
local samples = {
  float32 = { 1.5, -2, 0.25 },
  float64 = { 1.5, -2, 0.25 },
  float16 = { 1.5, -2, 0.25 },
  bfloat16 = { 1.5, -2, 0.25 },
  int64 = { 3, -2, 7 },
  int32 = { 3, -2, 7 },
  uint8 = { 3, 2, 7 },
  bool = { true, false, true },
}

local function make(dt)
  return nd.tensor(samples[dt], { dtype = dt })
end

local function num(v)
  if type(v) == "boolean" then return v and 1 or 0 end
  return v
end

---------------------------------------------------------------------------
describe("promotion of tensor-tensor ops", function()
  local table_ = {
    { "float32", "float64", "float64" },
    { "int64", "float32", "float32" },
    { "int32", "int64", "int64" },
    { "uint8", "int32", "int32" },
    { "bool", "int64", "int64" },
    { "bool", "uint8", "uint8" },
    { "uint8", "int64", "int64" },
    { "int32", "float64", "float64" },
    { "bool", "float32", "float32" },
    { "float16", "float64", "float64" },
    { "bfloat16", "float64", "float64" },
    { "float16", "float32", "float32" },
    { "int64", "float64", "float64" },
    { "int32", "int32", "int32" },
    { "float64", "float64", "float64" },
  }
  for _, row in ipairs(table_) do
    local a, b, want = row[1], row[2], row[3]
    it(a .. " + " .. b .. " -> " .. want .. " (both orders, values)", function()
      local x, y = make(a), make(b)
      local r1, r2 = x + y, y + x
      assert.are.equal(want, r1.dtype)
      assert.are.equal(want, r2.dtype)
      local expect = {}
      for i = 1, 3 do expect[i] = num(samples[a][i]) + num(samples[b][i]) end
      equal(r1, expect)
      equal(r2, expect)
    end)
  end

  it("the promoted dtype is used by mul, maximum and pow too", function()
    local x, y = make("int32"), make("float64")
    assert.are.equal("float64", (x * y).dtype)
    assert.are.equal("float64", nd.maximum(x, y).dtype)
    assert.are.equal("float64", nd.pow(y, x).dtype)
    assert.are.equal("int64", (make("int64") * make("uint8")).dtype)
  end)

  it("comparisons of mixed dtypes compare promoted values and give bool", function()
    local x = nd.tensor({ 1, 2, 3 }, { dtype = "int64" })
    local y = nd.tensor({ 1.5, 2, 2.5 }, { dtype = "float64" })
    local r = x:lt(y)
    assert.are.equal("bool", r.dtype)
    equal(r, { true, false, false })
    equal(x:eq(y), { false, true, false })
  end)

  it("int64 + float32 rounds large integers to float32", function()
    local y = nd.tensor({ (1 << 24) + 1 }, { dtype = "int64" }) + nd.tensor({ 0 })
    assert.are.equal("float32", y.dtype)
    assert.are.equal(16777216.0, y:item())
  end)
end)

---------------------------------------------------------------------------
describe("promotion of tensor-number ops", function()
  it("int64 tensor + 2.5 -> float32", function()
    local y = nd.tensor({ 1, 2 }, { dtype = "int64" }) + 2.5
    assert.are.equal("float32", y.dtype)
    equal(y, { 3.5, 4.5 })
    local z = 2.5 + nd.tensor({ 1, 2 }, { dtype = "int64" })
    assert.are.equal("float32", z.dtype)
    equal(z, { 3.5, 4.5 })
  end)

  it("int64 tensor + 2 -> int64", function()
    local y = nd.tensor({ 1, 2 }, { dtype = "int64" }) + 2
    assert.are.equal("int64", y.dtype)
    equal(y, { 3, 4 })
    assert.are.equal("integer", math.type(y:totable()[1]))
    local z = 2 * nd.tensor({ 1, 2 }, { dtype = "int64" })
    assert.are.equal("int64", z.dtype)
  end)

  it("int64 tensor + 2.0 (a Lua float, like a Python float) -> float32, as PyTorch", function()
    local y = nd.tensor({ 1, 2 }, { dtype = "int64" }) + 2.0
    assert.are.equal("float32", y.dtype)
    equal(y, { 3, 4 })
  end)

  it("an integer that does not fit the dtype: comparisons widen, arithmetic errors", function()
    local u = nd.tensor({ 10, 200 }, { dtype = "uint8" })
    assert.are.same({ true, true }, u:lt(256):totable())
    assert.are.same({ false, false }, u:eq(-246):totable())
    local ok, err = pcall(function() return u + 256 end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add: the number 256 cannot be converted to uint8 without overflow", 1, true), err)
  end)

  it("float32 tensor + 2 stays float32, + 2.5 too", function()
    assert.are.equal("float32", (nd.tensor({ 1, 2 }) + 2).dtype)
    assert.are.equal("float32", (nd.tensor({ 1, 2 }) + 2.5).dtype)
    assert.are.equal("float32", (nd.tensor({ 1, 2 }) * 1e300 / 1e300).dtype)
  end)

  it("float64 tensor + a number stays float64 at double precision", function()
    local y = nd.tensor({ 1 }, { dtype = "float64" }) + 0.1
    assert.are.equal("float64", y.dtype)
    assert.are.equal(1.1, y:item())
  end)

  it("int32 and uint8 tensors + integer keep their dtype; + fraction gives float32", function()
    assert.are.equal("int32", (nd.tensor({ 1 }, { dtype = "int32" }) + 2).dtype)
    assert.are.equal("uint8", (nd.tensor({ 1 }, { dtype = "uint8" }) + 2).dtype)
    assert.are.equal("float32", (nd.tensor({ 1 }, { dtype = "int32" }) + 0.5).dtype)
    assert.are.equal("float32", (nd.tensor({ 1 }, { dtype = "uint8" }) * 0.5).dtype)
  end)

  it("bool tensor + integer -> int64, bool tensor * 0.5 -> float32", function()
    local y = nd.tensor({ true, false }) + 3
    assert.are.equal("int64", y.dtype)
    equal(y, { 4, 3 })
    local z = nd.tensor({ true, false }) * 0.5
    assert.are.equal("float32", z.dtype)
    equal(z, { 0.5, 0 })
  end)

  it("comparisons with numbers give bool for every dtype", function()
    for dt in pairs(samples) do
      local r = make(dt):gt(1)
      assert.are.equal("bool", r.dtype, dt)
      local want = {}
      for i = 1, 3 do want[i] = num(samples[dt][i]) > 1 end
      equal(r, want, dt)
    end
  end)
end)

---------------------------------------------------------------------------
-- Independent float16 / bfloat16 rounding: round to `bits` significant bits
-- (nearest, ties to even), with the format's smallest normal exponent and
-- overflow threshold.
local function round_bits(v, bits, min_exp, max_finite)
  if v ~= v or v == 0 or v == math.huge or v == -math.huge then return v end
  local a = math.abs(v)
  local e = math.floor(math.log(a, 2))
  while 2.0 ^ e > a do e = e - 1 end
  while 2.0 ^ (e + 1) <= a do e = e + 1 end
  if e < min_exp then e = min_exp end -- subnormals share the smallest exponent
  local ulp = 2.0 ^ (e - (bits - 1))
  local q = a / ulp
  local fq = math.floor(q)
  local d = q - fq
  if d > 0.5 or (d == 0.5 and fq % 2 == 1) then fq = fq + 1 end
  local r = fq * ulp
  -- values that round beyond the largest finite value overflow
  if r > max_finite then r = math.huge end
  return v < 0 and -r or r
end
local function to_half(v) return round_bits(R.f32(v), 11, -14, 65504) end
local function to_bf16(v) return round_bits(R.f32(v), 8, -126, R.f32(3.3895313892515355e38)) end

describe("conversions", function()
  it("x:to(name), x:to({dtype = name}) and the short methods give the named dtype", function()
    local x = nd.tensor({ 1.5, -2, 0 })
    local methods = { float = "float32", double = "float64", long = "int64", int = "int32",
                      byte = "uint8", bool = "bool", half = "float16", bfloat16 = "bfloat16" }
    for m, dt in pairs(methods) do
      assert.are.equal(dt, x[m](x).dtype, m)
      assert.are.equal(dt, x:to(dt).dtype, dt)
      assert.are.equal(dt, x:to({ dtype = dt }).dtype, dt)
    end
  end)

  it("dtype aliases: to('double'), to('long'), to('half'), to('float'), to('int'), to('byte')", function()
    local x = nd.tensor({ 1 }, { dtype = "float64" })
    assert.are.equal("float64", nd.tensor({ 1 }):to("double").dtype)
    assert.are.equal("int64", x:to("long").dtype)
    assert.are.equal("float16", x:to("half").dtype)
    assert.are.equal("float32", x:to("float").dtype)
    assert.are.equal("int32", x:to("int").dtype)
    assert.are.equal("uint8", x:to("byte").dtype)
  end)

  it("x:to('float64') preserves values and makes a separate copy", function()
    local x = nd.tensor({ 0.1, 1 / 3, -7.25 })
    local y = x:to("float64")
    equal(y, { R.f32(0.1), R.f32(1 / 3), -7.25 })
    y:fill_(0)
    equal(x, { R.f32(0.1), R.f32(1 / 3), -7.25 })
  end)

  it("to(same dtype) returns the same tensor object", function()
    local x = nd.tensor({ 1, 2 })
    assert.is_true(rawequal(x, x:to("float32")), "to('float32')")
    assert.is_true(rawequal(x, x:to({ dtype = "float32" })), "to({dtype='float32'})")
    assert.is_true(rawequal(x, x:float()), "float()")
    local l = nd.tensor({ 1, 2 }, { dtype = "int64" })
    assert.is_true(rawequal(l, l:long()), "long()")
    assert.is_true(rawequal(l, l:to("int64")), "to('int64')")
  end)

  it("to('cpu') returns the same tensor object", function()
    local x = nd.tensor({ 1, 2 })
    assert.is_true(rawequal(x, x:to("cpu")))
  end)

  it("float -> int truncates toward zero", function()
    local x = nd.tensor({ 2.7, -2.7, 0.5, -0.5, 1.999, -1.999, 100.25 }, { dtype = "float64" })
    local want = { 2, -2, 0, 0, 1, -1, 100 }
    equal(x:long(), want)
    equal(x:int(), want)
    assert.are.equal("integer", math.type(x:long():totable()[1]))
    equal(nd.tensor({ 2.7, 0.2, 254.9 }):byte(), { 2, 0, 254 })
  end)

  it("float -> int of a non-contiguous tensor", function()
    local x = nd.tensor({ { 1.5, -2.5 }, { 3.75, -4.25 }, { 5.5, 6.5 } }):t()
    equal(x:long(), { { 1, 3, 5 }, { -2, -4, 6 } })
  end)

  it("int64 -> float64 is exact up to 2^53, int64 -> float32 rounds", function()
    local big = 1 << 53
    local x = nd.tensor({ big, -big, 12345 }, { dtype = "int64" })
    local d = x:double():totable()
    assert.are.equal(big + 0.0, d[1])
    assert.are.equal(-big + 0.0, d[2])
    assert.are.equal(12345.0, d[3])
    assert.are.equal(R.f32((1 << 24) + 1), nd.tensor({ (1 << 24) + 1 }, { dtype = "int64" }):float():item())
  end)

  it("to bool: nonzero (and NaN) is true, zero and -0 are false", function()
    local b = nd.tensor({ 0, 0.5, -1, 0 / 0, -0.0 }):bool()
    equal(b, { false, true, true, true, false })
    equal(nd.tensor({ 0, 3, 255 }, { dtype = "uint8" }):bool(), { false, true, true })
  end)

  it("from bool: true is 1, false is 0", function()
    local b = nd.tensor({ true, false })
    equal(b:float(), { 1, 0 })
    equal(b:long(), { 1, 0 })
    equal(b:double(), { 1, 0 })
  end)

  it("uint8 <-> int32 <-> int64 keep values in range", function()
    local x = nd.tensor({ 0, 1, 127, 200, 255 }, { dtype = "uint8" })
    equal(x:int(), { 0, 1, 127, 200, 255 })
    equal(x:long():byte(), { 0, 1, 127, 200, 255 })
    local y = nd.tensor({ -5, 2147483647, -2147483648 }, { dtype = "int64" })
    equal(y:int(), { -5, 2147483647, -2147483648 })
  end)

  describe("float16", function()
    it("0.1 comes back as 0.0999755859375 (half() then float())", function()
      local h = nd.tensor({ 0.1 }):half()
      assert.are.equal("float16", h.dtype)
      assert.are.equal(0.0999755859375, h:float():item())
      assert.are.equal(0.0999755859375, h:totable()[1])
      assert.are.equal(0.0999755859375, to_half(0.1)) -- the reference agrees
    end)

    it("65504 is the largest finite value; 1e5 and 65520 overflow to inf", function()
      local h = nd.tensor({ 65504, 1e5, -1e5, 65519, 65520 }):half()
      equal(h:float(), { 65504, math.huge, -math.huge, 65504, math.huge })
    end)

    it("round trip matches the independent rounding on many values", function()
      local vals = {}
      local rnd = R.lcg(3)
      for i = 1, 200 do
        local m = rnd(-100000, 100000) / 1000
        local e = rnd(-20, 12)
        vals[i] = m * 2.0 ^ e
      end
      vals[#vals + 1] = 2.0 ^ -24           -- smallest subnormal
      vals[#vals + 1] = 2.0 ^ -25           -- halfway to 0: ties to even -> 0
      vals[#vals + 1] = 3 * 2.0 ^ -25       -- 1.5 subnormal ulps -> 2 ulps
      vals[#vals + 1] = 2.0 ^ -14           -- smallest normal
      vals[#vals + 1] = 1 + 2.0 ^ -11       -- tie between 1 and 1+2^-10: even -> 1
      vals[#vals + 1] = 1 + 3 * 2.0 ^ -11   -- tie: even -> 1 + 2^-9
      vals[#vals + 1] = 2047.5              -- 2047.5 exact? (11 bits: 2047 | 2048) tie -> 2048
      vals[#vals + 1] = 0 / 0
      vals[#vals + 1] = -math.huge
      local want = {}
      for i = 1, #vals do want[i] = to_half(vals[i]) end
      local h = nd.tensor(vals):half()
      equal(h:float(), want)
      equal(h:double(), want)
    end)

    it("half of float64 input", function()
      local h = nd.tensor({ 0.1, 1 / 3 }, { dtype = "float64" }):half()
      equal(h:double(), { to_half(0.1), to_half(1 / 3) })
    end)

    it("float16 -> int truncates toward zero", function()
      equal(nd.tensor({ 2.75, -2.75 }):half():long(), { 2, -2 })
    end)
  end)

  describe("bfloat16", function()
    it("round trip keeps 8 significant bits (0.1 -> 0.10009765625, 1/3 -> 0.333984375)", function()
      local b = nd.tensor({ 0.1, 1 / 3, 1, -3.140625 }):bfloat16()
      assert.are.equal("bfloat16", b.dtype)
      equal(b:float(), { 0.10009765625, 0.333984375, 1, -3.140625 })
      assert.are.equal(0.10009765625, to_bf16(0.1))
    end)

    it("has float32's range (1e38 is finite)", function()
      local b = nd.tensor({ 1e38, -1e38 }):bfloat16():double():totable()
      assert.are.equal(to_bf16(1e38), b[1])
      assert.is_true(b[1] < math.huge)
      assert.are.equal(-to_bf16(1e38), b[2])
    end)

    it("round trip matches the independent rounding on many values", function()
      local vals = {}
      local rnd = R.lcg(4)
      for i = 1, 200 do vals[i] = rnd(-100000, 100000) / 1000 * 2.0 ^ rnd(-60, 60) end
      vals[#vals + 1] = 1 + 2.0 ^ -8 -- tie: even -> 1
      vals[#vals + 1] = 1 + 3 * 2.0 ^ -8 -- tie: even -> 1 + 2^-6
      local want = {}
      for i = 1, #vals do want[i] = to_bf16(vals[i]) end
      equal(nd.tensor(vals):bfloat16():float(), want)
    end)

    it("NaN stays NaN", function()
      close(nd.tensor({ 0 / 0 }):bfloat16():float(), { 0 / 0 })
    end)
  end)

  it("arithmetic on float16 and bfloat16 tensors gives correct values", function()
    local h = nd.tensor({ 1.5, 2.25 }):half()
    local b = nd.tensor({ 1.5, 2.25 }):bfloat16()
    equal((h + 1):double(), { 2.5, 3.25 })
    equal((b * 2):double(), { 3, 4.5 })
    equal(h:sum():double(), 3.75)
  end)

  it("nd.tensor with each dtype round-trips through totable", function()
    for dt, vals in pairs(samples) do
      local x = nd.tensor(vals, { dtype = dt })
      assert.are.equal(dt, x.dtype)
      local t = x:totable()
      for i = 1, #vals do
        if dt == "bool" then assert.are.equal(vals[i], t[i], dt)
        else assert.are.equal(num(vals[i]), t[i], dt) end
      end
    end
  end)

  it("nd.dtypes lists the eight dtypes", function()
    local set = {}
    for _, d in ipairs(nd.dtypes) do set[d] = true end
    for dt in pairs(samples) do assert.is_true(set[dt], dt) end
    assert.are.equal(8, #nd.dtypes)
  end)
end)

---------------------------------------------------------------------------
describe("dtype errors", function()
  it("x:to() with an unknown dtype name names it", function()
    local ok, err = pcall(function() return nd.tensor({ 1 }):to("floaty") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.to:", 1, true), err)
    assert.truthy(err:find("'floaty'", 1, true), err)
  end)

  it("constructors with an unknown dtype name name it", function()
    local ok, err = pcall(nd.tensor, { 1 }, { dtype = "float128" })
    assert.is_false(ok)
    assert.truthy(err:find("needle.tensor:", 1, true), err)
    assert.truthy(err:find("float128", 1, true), err)
    ok, err = pcall(nd.zeros, { 2 }, { dtype = "qint8" })
    assert.is_false(ok)
    assert.truthy(err:find("needle.zeros:", 1, true), err)
    assert.truthy(err:find("qint8", 1, true), err)
  end)

  it("x:to({dtype = 'nope'}) names it", function()
    local ok, err = pcall(function() return nd.tensor({ 1 }):to({ dtype = "nope" }) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.to:", 1, true), err)
    assert.truthy(err:find("nope", 1, true), err)
  end)

  it("a non-string dtype is an error", function()
    local ok, err = pcall(function() return nd.tensor({ 1 }):to(5) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.to:", 1, true), err)
    ok, err = pcall(nd.tensor, { 1 }, { dtype = 5 })
    assert.is_false(ok)
    assert.truthy(err:find("needle.tensor:", 1, true), err)
  end)

  it("an unavailable device is an error naming it", function()
    local ok, err = pcall(function() return nd.tensor({ 1 }):to("opencl:99") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.to:", 1, true), err)
    assert.truthy(err:find("opencl", 1, true), err)
  end)
end)

-- The one rule into an integer dtype (docs/tensor.md): truncate toward zero,
-- saturate at the target's range, NaN -> 0, from floats and wider integers
-- alike, on every device. int32 and uint8 used to wrap (1e10 -> 1410065408,
-- inf -> -1, 300.0 -> 44 as uint8, int64 2^40 -> 0 as int32).
describe("conversions into integer dtypes saturate", function()
  local D = require "spec.helpers.devices"
  local I32_MAX, I32_MIN = 2147483647, -2147483648
  local F = { 1e10, -1e10, math.huge, -math.huge, 0 / 0, 300.0, -1.0, 255.9, -0.9, 2.5, -2.5,
    2147483647.5, 2147483648.0, -2147483649.0 }
  for _, dev in ipairs(D.all()) do
    it("float32 and float64 -> int32, uint8, int64 on " .. dev, function()
      for _, from in ipairs({ "float64", "float32" }) do
        local x = nd.tensor(F, { dtype = from, device = dev })
        local i32 = { I32_MAX, I32_MIN, I32_MAX, I32_MIN, 0, 300, -1, 255, 0, 2, -2, I32_MAX, I32_MAX, I32_MIN }
        if from == "float32" then i32[12] = I32_MAX end -- 2147483647.5 is 2^31 as float32
        equal(x:int():cpu(), i32, from .. " -> int32")
        equal(x:byte():cpu(), { 255, 0, 255, 0, 0, 255, 0, 255, 0, 2, 0, 255, 255, 0 }, from .. " -> uint8")
        local i64 = x:long():cpu():totable()
        assert.are.same({ 10000000000, -10000000000, math.maxinteger, math.mininteger, 0, 300, -1, 255, 0, 2, -2 },
          { table.unpack(i64, 1, 11) }, from .. " -> int64")
      end
    end)

    it("float64 2^63 and beyond -> int64 saturates exactly, -2^63 fits, on " .. dev, function()
      local x = nd.tensor({ 2 ^ 63, -2 ^ 63, 1e300, 2 ^ 63 - 1024 }, { dtype = "float64", device = dev })
      assert.are.same({ math.maxinteger, math.mininteger, math.maxinteger, (1 << 63) - 1024 }, x:long():cpu():totable())
    end)

    it("int64 -> int32 and uint8, int32 -> uint8 saturate instead of wrapping, on " .. dev, function()
      local x = nd.tensor({ 1 << 40, -(1 << 40), 300, -5, 7, math.maxinteger, math.mininteger },
        { dtype = "int64", device = dev })
      equal(x:int():cpu(), { I32_MAX, I32_MIN, 300, -5, 7, I32_MAX, I32_MIN })
      equal(x:byte():cpu(), { 255, 0, 255, 0, 7, 255, 0 })
      equal(nd.tensor({ 300, -5, 7 }, { dtype = "int32", device = dev }):byte():cpu(), { 255, 0, 7 })
    end)

    it("copy_ between dtypes follows the same rule on " .. dev, function()
      local y = nd.zeros({ 3 }, { dtype = "uint8", device = dev })
      y:copy_(nd.tensor({ 1e10, -7.5, 0 / 0 }, { device = dev }))
      equal(y:cpu(), { 255, 0, 0 })
    end)
  end
end)

-- A Lua number given for an integer tensor is stored exactly or refused,
-- naming the op, the value, the dtype and its range; it used to be clamped,
-- wrapped or truncated (nd.tensor({2^40}, {dtype = "int32"}) gave 0).
describe("Lua numbers for integer tensors", function()
  local A = require("spec.helpers.assertions").bind(assert)
  local errmsg, assert_contains = A.errmsg, A.assert_contains
  local I32 = "int32 (-2147483648..2147483647)"

  it("nd.tensor refuses values out of range, NaN and fractions, naming the position", function()
    assert_contains(errmsg(nd.tensor, { 1, 1 << 40 }, { dtype = "int32" }),
      "needle.tensor: value 1099511627776 is out of range for " .. I32 .. " (at index {2})")
    assert_contains(errmsg(nd.tensor, { { 1, 2 }, { 3, 1e10 } }, { dtype = "int32" }),
      "needle.tensor: value 10000000000 is out of range for " .. I32 .. " (at index {2,2})")
    assert_contains(errmsg(nd.tensor, 256, { dtype = "uint8" }), "needle.tensor: value 256 is out of range for uint8 (0..255)")
    assert_contains(errmsg(nd.tensor, { -1 }, { dtype = "uint8" }), "value -1 is out of range for uint8 (0..255)")
    assert_contains(errmsg(nd.tensor, { 2 ^ 63 }, { dtype = "int64" }),
      "value 9223372036854775808 is out of range for int64 (-9223372036854775808..9223372036854775807)")
    assert_contains(errmsg(nd.tensor, { math.huge }, { dtype = "int64" }), "value inf is out of range for int64")
    assert_contains(errmsg(nd.tensor, { 0 / 0 }, { dtype = "int32" }), "needle.tensor: value nan is not an integer (int32")
    assert_contains(errmsg(nd.tensor, { 1, 2.5 }, { dtype = "int64" }), "value 2.5 is not an integer (int64 holds the integers")
    assert_contains(errmsg(function() return nd.zeros({ 2 }, { dtype = "int32" }) + { 1, 1e10 } end),
      "needle.add: value 10000000000 is out of range for " .. I32)
  end)

  it("nd.tensor keeps every integer that fits, exactly", function()
    assert.are.same({ math.maxinteger, math.mininteger, -(2 ^ 63) // 1 },
      nd.tensor({ math.maxinteger, math.mininteger, -2 ^ 63 }, { dtype = "int64" }):totable())
    assert.are.same({ 2147483647, -2147483648, 3 }, nd.tensor({ 2147483647, -2147483648.0, 3.0 }, { dtype = "int32" }):totable())
    assert.are.same({ 0, 255 }, nd.tensor({ 0, 255 }, { dtype = "uint8" }):totable())
  end)

  it("fill_, full, full_like, x[i] = v, masked_fill, scatter and pad refuse them too", function()
    local x = nd.zeros({ 3 }, { dtype = "int32" })
    assert_contains(errmsg(function() return x:fill_(1 << 40) end), "needle.fill_: value 1099511627776 is out of range for " .. I32)
    assert_contains(errmsg(nd.full, { 2 }, 1e10, { dtype = "int32" }), "needle.full: value 10000000000 is out of range for " .. I32)
    assert_contains(errmsg(nd.full, { 2 }, 2.5, { dtype = "int64" }), "needle.full: value 2.5 is not an integer")
    assert_contains(errmsg(nd.full_like, nd.zeros({ 2 }, { dtype = "uint8" }), -1), "needle.full_like: value -1 is out of range for uint8 (0..255)")
    local b = nd.zeros({ 2 }, { dtype = "uint8" })
    assert_contains(errmsg(function() b[1] = 300 end), "needle.index: value 300 is out of range for uint8 (0..255)")
    assert_contains(errmsg(function() b[{ { 1, 2 } }] = -1 end), "needle.index: value -1 is out of range for uint8")
    assert_contains(errmsg(function() return x:masked_fill(nd.tensor({ true, false, true }), 2 ^ 31) end),
      "needle.masked_fill: value 2147483648 is out of range for " .. I32)
    assert_contains(errmsg(function() return b:scatter(1, { 1 }, 256) end), "needle.scatter: value 256 is out of range for uint8")
    assert_contains(errmsg(function() return x:pad({ 1, 1 }, 2 ^ 31) end), "needle.pad: value 2147483648 is out of range for " .. I32)
    assert.are.same({ 0, 0, 0 }, x:totable())
    assert.are.same({ 0, 0 }, b:totable())
    -- what fits is stored exactly
    assert.are.same({ math.maxinteger, math.maxinteger }, nd.full_like(nd.zeros({ 2 }, { dtype = "int64" }), math.maxinteger):totable())
    b[2] = 255
    assert.are.same({ 0, 255 }, b:totable())
    assert.are.same({ -2147483648, -2147483648, -2147483648 }, x:fill_(-2147483648):totable())
  end)

  it("arange refuses an integer dtype its values do not fit (it saturated to 255, 255, ...)", function()
    assert_contains(errmsg(nd.arange, 250, 260, { dtype = "uint8" }), "needle.arange: value 259 is out of range for uint8 (0..255)")
    assert_contains(errmsg(nd.arange, -1, 3, { dtype = "uint8" }), "needle.arange: value -1 is out of range for uint8")
    assert.are.same({ 250, 251, 252, 253, 254, 255 }, nd.arange(250, 256, { dtype = "uint8" }):totable())
  end)

  it("linspace refuses an integer dtype its ends do not fit (it saturated to 2147483647)", function()
    assert_contains(errmsg(nd.linspace, 0, 1e10, 3, { dtype = "int32" }),
                    "needle.linspace: value 10000000000 is out of range for int32 (-2147483648..2147483647)")
    assert_contains(errmsg(nd.linspace, -1, 3, 5, { dtype = "uint8" }), "needle.linspace: value -1 is out of range for uint8")
    assert_contains(errmsg(nd.linspace, 0 / 0, 3, 5, { dtype = "int64" }), "needle.linspace: value nan")
    -- values in range truncate toward zero, as PyTorch's integer linspace
    assert.are.same({ 0, 0, 1 }, nd.linspace(0, 1, 3, { dtype = "int64" }):totable())
    assert.are.same({ 255, 127, 0 }, nd.linspace(255, 0, 3, { dtype = "uint8" }):totable())
    assert.are.same({ 7 }, nd.linspace(7.9, 1e10, 1, { dtype = "int32" }):totable())
  end)

  it("int64 values stay exact in full, full_like and clamp", function()
    local big = 9007199254740993 -- 2^53 + 1: not representable in a double
    assert.are.equal(big, nd.full({1}, big, {dtype = "int64"}):item())
    assert.are.equal(big, nd.tensor({big}, {dtype = "int64"}):clamp(0, nil):item())
    assert.are.equal(5, nd.tensor({9}, {dtype = "int64"}):clamp(nil, 5.5):item())
  end)
end)

-- every conversion on each OpenCL device gives the cpu's bytes (rounding,
-- truncation, saturation, nan -> 0, signed zeros included; a NaN may carry
-- another payload); without OpenCL one pending line
describe("conversions on OpenCL devices", function()
  local D = require "spec.helpers.devices"
  if D.pending_without_opencl(pending, "dtype conversions on OpenCL devices") then return end
  local DT = { "float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool" }
  local src = nd.tensor({ -300.7, -2.5, -1, -0.5, 0, -0.0, 0.4999, 0.5, 1.5, 2.5, 127.9, 255.5, 256, 70000, 1e20,
    -1e20, 0 / 0, math.huge, -math.huge, 1 / 3, 1e-40 }, { dtype = "float64" })
  -- the same bytes, or the same values where both are NaN
  local function same(want, got)
    if want:tobytes() == got:tobytes() then return true end
    local wb, gb = want:tobytes(), got:tobytes()
    local es = #wb // want:numel()
    local w, g = want:view({ -1 }):totable(), got:view({ -1 }):totable()
    for i = 1, #w do
      local nan = w[i] ~= w[i] and g[i] ~= g[i]
      if not nan and wb:sub((i - 1) * es + 1, i * es) ~= gb:sub((i - 1) * es + 1, i * es) then return false end
    end
    return true
  end
  for _, dev in ipairs(D.opencl()) do
    it("every dtype to every dtype on " .. dev, function()
      for _, from in ipairs(DT) do
        local x = src:to(from)
        local xd = x:to(dev)
        for _, to in ipairs(DT) do
          local want = x:to(to)
          local got = xd:to(to)
          assert.are.equal(dev, got.device, from .. " -> " .. to)
          assert.are.equal(to, got.dtype)
          assert.is_true(same(want, got:cpu()), ("%s -> %s on %s: %s, the cpu gives %s"):format(
            from, to, dev, tostring(got:cpu()), tostring(want)))
          -- the same through a transposed, expanded (strided) view
          local w2 = x:view({ 1, -1 }):expand({ 2, x:numel() }):t():to(to)
          local g2 = xd:view({ 1, -1 }):expand({ 2, xd:numel() }):t():to(to)
          assert.is_true(same(w2:contiguous(), g2:cpu():contiguous()), from .. " -> " .. to .. " (strided)")
        end
      end
    end)
  end
end)

describe("element_size", function()
  it("is the bytes per element of every dtype", function()
    local want = {float32 = 4, float64 = 8, int64 = 8, int32 = 4, uint8 = 1, bool = 1, float16 = 2, bfloat16 = 2}
    for dt, bytes in pairs(want) do
      assert.are.equal(bytes, nd.zeros({2}, {dtype = dt}):element_size(), dt)
    end
  end)
end)
