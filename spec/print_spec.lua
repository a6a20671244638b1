-- print_spec.lua - needle.tensor_print: PyTorch-style tensor printing.
--
-- Self-contained: the tensors here are a plain-Lua fake that offers exactly
-- the API tensor_print may rely on (t.shape, t.dtype, t.device,
-- t.requires_grad, t:dim(), t:numel(), t:narrow(), t:totable(), t:double()),
-- as strided views over a flat storage (a table, or a function of the flat
-- index for huge tensors), and counts what was converted. The expected strings
-- are PyTorch's repr for the same data (worked out from torch/_tensor_str.py)
-- with needle's `, dtype=..., shape={...})` ending.
--
--   busted --lua=lua5.4 spec/print_spec.lua

package.path = "lua/?.lua;lua/?/init.lua;" .. package.path

local tp = require("needle.tensor_print")

---------------------------------------------------------------------------
-- The fake tensor

local stats -- reset before each test
local function reset_stats()
  stats = { totable_calls = 0, totable_elems = 0, totable_shapes = {}, double_calls = 0 }
end
reset_stats()

local State = setmetatable({}, { __mode = "k" })
local Fake = {}
local mt = {}

local function prod(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

local function contiguous_strides(shape)
  local st, s = {}, 1
  for d = #shape, 1, -1 do st[d] = s; s = s * shape[d] end
  return st
end

local function f32(v)
  if v ~= v or v == math.huge or v == -math.huge then return v end
  return (string.unpack("<f", string.pack("<f", v)))
end

local function cast(v, dtype)
  if dtype == "bool" then return v and true or false end
  if dtype == "float32" or dtype == "float16" or dtype == "bfloat16" then return f32(v * 1.0) end
  if dtype == "float64" then return v * 1.0 end
  return math.tointeger(v) or error("fake: not an integer: " .. tostring(v))
end

local function new(st)
  local t = setmetatable({}, mt)
  State[t] = st
  return t
end

-- from_table(nested, dtype) / from_table(nil, dtype, shape) for empty tensors
local function from_table(data, dtype, shape, extra)
  dtype = dtype or "float32"
  local flat = {}
  if shape == nil then
    shape = {}
    if type(data) == "table" then
      local x = data
      while type(x) == "table" do shape[#shape + 1] = #x; x = x[1] end
    end
    local function walk(x, d)
      if d > #shape then flat[#flat + 1] = cast(x, dtype); return end
      assert(#x == shape[d], "fake: ragged table")
      for i = 1, #x do walk(x[i], d + 1) end
    end
    walk(data, 1)
  end
  extra = extra or {}
  return new({
    storage = flat, dtype = dtype, shape = shape, strides = contiguous_strides(shape),
    offset = 0, device = extra.device or "cpu", requires_grad = extra.requires_grad or false,
  })
end

-- a tensor whose element at flat index i (0-based) is gen(i); never materialized
local function from_gen(shape, dtype, gen)
  return new({
    storage = function(i) return cast(gen(i), dtype) end, dtype = dtype, shape = shape,
    strides = contiguous_strides(shape), offset = 0, device = "cpu", requires_grad = false,
  })
end

local function get(st, off)
  if type(st.storage) == "function" then return st.storage(off) end
  return st.storage[off + 1]
end

function Fake.dim(t) return #State[t].shape end
function Fake.numel(t) return prod(State[t].shape) end

function Fake.narrow(t, dim, start, length)
  local st = State[t]
  assert(dim >= 1 and dim <= #st.shape, "fake narrow: bad dim")
  assert(start >= 1 and length >= 0 and start + length - 1 <= st.shape[dim], "fake narrow: out of range")
  local shape = {}
  for i = 1, #st.shape do shape[i] = st.shape[i] end
  shape[dim] = length
  return new({
    storage = st.storage, dtype = st.dtype, shape = shape, strides = st.strides,
    offset = st.offset + (start - 1) * st.strides[dim], device = st.device,
    requires_grad = st.requires_grad,
  })
end

function Fake.totable(t)
  local st = State[t]
  stats.totable_calls = stats.totable_calls + 1
  stats.totable_elems = stats.totable_elems + prod(st.shape)
  stats.totable_shapes[#stats.totable_shapes + 1] = table.concat(st.shape, "x")
  local D = #st.shape
  local function rec(d, off)
    if d > D then return get(st, off) end
    local r = {}
    for i = 1, st.shape[d] do r[i] = rec(d + 1, off + (i - 1) * st.strides[d]) end
    return r
  end
  return rec(1, st.offset)
end

function Fake.double(t)
  local st = State[t]
  stats.double_calls = stats.double_calls + 1
  assert(prod(st.shape) <= 10000, "fake double: refusing to copy a huge tensor")
  local flat = {}
  local D = #st.shape
  local function rec(d, off)
    if d > D then flat[#flat + 1] = get(st, off) * 1.0; return end
    for i = 1, st.shape[d] do rec(d + 1, off + (i - 1) * st.strides[d]) end
  end
  rec(1, st.offset)
  local shape = {}
  for i = 1, D do shape[i] = st.shape[i] end
  return new({
    storage = flat, dtype = "float64", shape = shape, strides = contiguous_strides(shape),
    offset = 0, device = st.device, requires_grad = false,
  })
end

mt.__index = function(t, k)
  local st = State[t]
  if k == "shape" then
    local s = {}
    for i = 1, #st.shape do s[i] = st.shape[i] end
    return s
  elseif k == "dtype" or k == "device" or k == "requires_grad" then
    return st[k]
  end
  return Fake[k]
end
mt.__tostring = tp.format

local function T(data, dtype, extra) return from_table(data, dtype, nil, extra) end

local nan, inf = 0 / 0, math.huge

local function arange(n, dtype)
  local r = {}
  for i = 1, n do r[i] = i - 1 end
  return T(r, dtype)
end

local function reshape(flat, shape, dtype)
  -- nested table of `shape` from a flat list
  local pos = 0
  local function rec(d)
    if d > #shape then pos = pos + 1; return flat[pos] end
    local r = {}
    for i = 1, shape[d] do r[i] = rec(d + 1) end
    return r
  end
  return T(rec(1), dtype)
end

---------------------------------------------------------------------------

describe("needle.tensor_print", function()
  before_each(function()
    reset_stats()
    tp.set_printoptions({ profile = "default" })
  end)
  after_each(function()
    tp.set_printoptions({ profile = "default" })
  end)

  describe("float formatting", function()
    it("prints integral floats as `1.`", function()
      assert.are.equal("tensor([[1., 2.],\n        [3., 4.]], dtype=float32, shape={2,2})",
        tostring(T({ { 1, 2 }, { 3, 4 } })))
      assert.are.equal("tensor([0., 0., 0.], dtype=float32, shape={3})", tp.format(T({ 0, 0, 0 })))
      assert.are.equal("tensor([-0., 1.], dtype=float32, shape={2})", tp.format(T({ -0.0, 1 })))
    end)

    it("uses fixed point with a common width for mixed values", function()
      assert.are.equal(
        "tensor([[ 0.1000, -2.0000,  3.5000],\n" ..
        "        [ 4.0000,  5.0000,  6.0000]], dtype=float32, shape={2,3})",
        tp.format(T({ { 0.1, -2, 3.5 }, { 4, 5, 6 } })))
      assert.are.equal("tensor([ 12.2500,  -0.5000, 100.0000], dtype=float64, shape={3})",
        tp.format(T({ 12.25, -0.5, 100 }, "float64")))
    end)

    it("aligns negative integral floats", function()
      assert.are.equal("tensor([ -1.,   2., -30.], dtype=float32, shape={3})",
        tp.format(T({ -1, 2, -30 })))
    end)

    it("switches to scientific notation by PyTorch's rule", function()
      -- max/min > 1000
      assert.are.equal("tensor([1.0000e+05, 1.5000e+00, 2.0000e+00], dtype=float64, shape={3})",
        tp.format(T({ 1e5, 1.5, 2 }, "float64")))
      -- smallest nonzero magnitude < 1e-4
      assert.are.equal("tensor([1.0000e-05, 5.0000e-01], dtype=float64, shape={2})",
        tp.format(T({ 1e-5, 0.5 }, "float64")))
      -- integral values too, by ratio or size (> 1e8)
      assert.are.equal("tensor([1.0000e+00, 1.0000e+04], dtype=float32, shape={2})",
        tp.format(T({ 1, 10000 })))
      assert.are.equal("tensor([1.0000e+09], dtype=float32, shape={1})", tp.format(T({ 1e9 })))
      -- width includes the sign
      assert.are.equal("tensor([-1.0000e+05,  1.5000e+00], dtype=float64, shape={2})",
        tp.format(T({ -1e5, 1.5 }, "float64")))
      -- zeros do not count for min, and print in the same notation
      assert.are.equal("tensor([0.0000e+00, 1.0000e-05, 1.0000e+00], dtype=float64, shape={3})",
        tp.format(T({ 0, 1e-5, 1 }, "float64")))
    end)

    it("stays fixed at the boundaries", function()
      -- ratio exactly 1000, min exactly 1e-4 (float64): not scientific
      assert.are.equal("tensor([   1.5000, 1500.0000], dtype=float64, shape={2})",
        tp.format(T({ 1.5, 1500 }, "float64")))
      assert.are.equal("tensor([0.0001, 0.0500], dtype=float64, shape={2})",
        tp.format(T({ 1e-4, 0.05 }, "float64")))
      -- integral 1e8 exactly is not > 1e8
      assert.are.equal("tensor([100000000.], dtype=float64, shape={1})",
        tp.format(T({ 1e8 }, "float64")))
    end)

    it("prints nan and inf", function()
      assert.are.equal("tensor([1., nan, inf, -inf], dtype=float32, shape={4})",
        tp.format(T({ 1, nan, inf, -inf })))
      assert.are.equal("tensor([1.5000,    nan,   -inf], dtype=float32, shape={3})",
        tp.format(T({ 1.5, nan, -inf })))
      assert.are.equal("tensor([nan, nan], dtype=float32, shape={2})", tp.format(T({ nan, -nan })))
      assert.are.equal("tensor([1.0000e-05,        inf], dtype=float64, shape={2})",
        tp.format(T({ 1e-5, inf }, "float64")))
    end)

    it("formats float16 through double(), only on what is printed", function()
      assert.are.equal("tensor([1.5000, 2.0000], dtype=float16, shape={2})",
        tp.format(T({ 1.5, 2 }, "float16")))
      assert.are.equal(1, stats.double_calls)
      reset_stats()
      local big = from_gen({ 50, 50 }, "bfloat16", function(i) return i % 4 end)
      assert.are.equal(
        "tensor([[0., 1., 2.,  ..., 3., 0., 1.],\n" ..
        "        [2., 3., 0.,  ..., 1., 2., 3.],\n" ..
        "        [0., 1., 2.,  ..., 3., 0., 1.],\n" ..
        "        ...,\n" ..
        "        [2., 3., 0.,  ..., 1., 2., 3.],\n" ..
        "        [0., 1., 2.,  ..., 3., 0., 1.],\n" ..
        "        [2., 3., 0.,  ..., 1., 2., 3.]], dtype=bfloat16, shape={50,50})",
        tp.format(big))
      assert.are.equal(4, stats.double_calls)
      assert.are.equal(36, stats.totable_elems)
    end)
  end)

  describe("other dtypes", function()
    it("prints int64 as integers", function()
      assert.are.equal("tensor([[  1, -20],\n        [300,   4]], dtype=int64, shape={2,2})",
        tp.format(T({ { 1, -20 }, { 300, 4 } }, "int64")))
      assert.are.equal("tensor([0, 1, 2], dtype=int32, shape={3})", tp.format(arange(3, "int32")))
      assert.are.equal("tensor([  0, 255], dtype=uint8, shape={2})", tp.format(T({ 0, 255 }, "uint8")))
    end)

    it("prints bool as true/false", function()
      assert.are.equal("tensor([ true, false,  true], dtype=bool, shape={3})",
        tp.format(T({ true, false, true }, "bool")))
      assert.are.equal("tensor([true, true], dtype=bool, shape={2})",
        tp.format(T({ true, true }, "bool")))
    end)
  end)

  describe("0-dim and empty", function()
    it("prints 0-dim tensors without brackets", function()
      assert.are.equal("tensor(3.5000, dtype=float32, shape={})", tp.format(T(3.5)))
      assert.are.equal("tensor(2., dtype=float32, shape={})", tp.format(T(2)))
      assert.are.equal("tensor(-7, dtype=int64, shape={})", tp.format(T(-7, "int64")))
      assert.are.equal("tensor(false, dtype=bool, shape={})", tp.format(T(false, "bool")))
      assert.are.equal("tensor(1.0000e-06, dtype=float64, shape={})", tp.format(T(1e-6, "float64")))
    end)

    it("prints empty tensors as [] with their shape", function()
      assert.are.equal("tensor([], dtype=float32, shape={0})",
        tp.format(from_table(nil, "float32", { 0 })))
      assert.are.equal("tensor([], dtype=float32, shape={2,0})",
        tp.format(from_table(nil, "float32", { 2, 0 })))
      assert.are.equal("tensor([], dtype=int64, shape={0,3,4})",
        tp.format(from_table(nil, "int64", { 0, 3, 4 })))
      assert.are.equal(0, stats.totable_calls)
    end)
  end)

  describe("layout", function()
    it("lays out 3-D tensors with blank lines between blocks", function()
      local flat = {}
      for i = 1, 12 do flat[i] = i - 1 end
      assert.are.equal(
        "tensor([[[ 0.,  1.,  2.],\n" ..
        "         [ 3.,  4.,  5.]],\n" ..
        "\n" ..
        "        [[ 6.,  7.,  8.],\n" ..
        "         [ 9., 10., 11.]]], dtype=float32, shape={2,2,3})",
        tp.format(reshape(flat, { 2, 2, 3 })))
    end)

    it("uses dim-2 blank lines for 4-D tensors", function()
      assert.are.equal(
        "tensor([[[[1, 2]]],\n" ..
        "\n" ..
        "\n" ..
        "        [[[3, 4]]]], dtype=int64, shape={2,1,1,2})",
        tp.format(reshape({ 1, 2, 3, 4 }, { 2, 1, 1, 2 }, "int64")))
    end)

    it("wraps long rows at linewidth", function()
      assert.are.equal(
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n" ..
        "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n" ..
        "        28., 29.], dtype=float32, shape={30})",
        tp.format(arange(30)))
      -- rows of a 2-D tensor wrap under their own bracket
      local rows = {}
      for r = 1, 2 do
        rows[r] = {}
        for c = 1, 10 do rows[r][c] = (r - 1) * 10 + c - 0.5 end
      end
      assert.are.equal(
        "tensor([[ 0.5000,  1.5000,  2.5000,  3.5000,  4.5000,  5.5000,  6.5000,  7.5000,\n" ..
        "          8.5000,  9.5000],\n" ..
        "        [10.5000, 11.5000, 12.5000, 13.5000, 14.5000, 15.5000, 16.5000, 17.5000,\n" ..
        "         18.5000, 19.5000]], dtype=float32, shape={2,10})",
        tp.format(T(rows)))
    end)
  end)

  describe("summarization", function()
    it("summarizes a 1x2000 tensor from its edges only", function()
      local t = from_gen({ 1, 2000 }, "int64", function(i) return i end)
      assert.are.equal(
        "tensor([[   0,    1,    2,  ..., 1997, 1998, 1999]], dtype=int64, shape={1,2000})",
        tp.format(t))
      assert.are.equal(2, stats.totable_calls)
      assert.are.equal(6, stats.totable_elems)
      assert.are.same({ "1x3", "1x3" }, stats.totable_shapes)

      reset_stats()
      local f = from_gen({ 1, 2000 }, "float32", function(i) return 1 + i * 0.25 end)
      assert.are.equal(
        "tensor([[  1.0000,   1.2500,   1.5000,  ..., 500.2500, 500.5000, 500.7500]]," ..
        " dtype=float32, shape={1,2000})",
        tp.format(f))
      assert.are.equal(6, stats.totable_elems)
    end)

    it("summarizes and wraps a long 1-D tensor", function()
      -- the formatter sees only the edges: 1999/1 > 1000 -> scientific
      assert.are.equal(
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n" ..
        "        1.9990e+03], dtype=float32, shape={2000})",
        tp.format(from_gen({ 2000 }, "float32", function(i) return i end)))
    end)

    it("summarizes a 100x100 tensor with a `...,` line between row blocks", function()
      local t = from_gen({ 100, 100 }, "int64", function(i) return i end)
      assert.are.equal(
        "tensor([[   0,    1,    2,  ...,   97,   98,   99],\n" ..
        "        [ 100,  101,  102,  ...,  197,  198,  199],\n" ..
        "        [ 200,  201,  202,  ...,  297,  298,  299],\n" ..
        "        ...,\n" ..
        "        [9700, 9701, 9702,  ..., 9797, 9798, 9799],\n" ..
        "        [9800, 9801, 9802,  ..., 9897, 9898, 9899],\n" ..
        "        [9900, 9901, 9902,  ..., 9997, 9998, 9999]], dtype=int64, shape={100,100})",
        tp.format(t))
      assert.are.equal(4, stats.totable_calls)
      assert.are.equal(36, stats.totable_elems)
      assert.are.same({ "3x3", "3x3", "3x3", "3x3" }, stats.totable_shapes)
    end)

    it("keeps short dims whole", function()
      local t = from_gen({ 2, 600 }, "int64", function(i) return i end)
      assert.are.equal(
        "tensor([[   0,    1,    2,  ...,  597,  598,  599],\n" ..
        "        [ 600,  601,  602,  ..., 1197, 1198, 1199]], dtype=int64, shape={2,600})",
        tp.format(t))
      assert.are.equal(12, stats.totable_elems)
    end)

    it("does not summarize at exactly threshold elements", function()
      local t = from_gen({ 1000 }, "int64", function(i) return i % 10 end)
      local s = tp.format(t)
      assert.is_nil(s:find("...", 1, true))
      assert.are.equal(1000, stats.totable_elems)
    end)

    it("summarizes 3-D tensors with threshold/edgeitems options", function()
      local flat = {}
      for i = 1, 27 do flat[i] = i - 1 end
      tp.set_printoptions({ threshold = 10, edgeitems = 1 })
      assert.are.equal(
        "tensor([[[ 0,  ...,  2],\n" ..
        "         ...,\n" ..
        "         [ 6,  ...,  8]],\n" ..
        "\n" ..
        "        ...,\n" ..
        "\n" ..
        "        [[18,  ..., 20],\n" ..
        "         ...,\n" ..
        "         [24,  ..., 26]]], dtype=int64, shape={3,3,3})",
        tp.format(reshape(flat, { 3, 3, 3 }, "int64")))
      assert.are.equal(8, stats.totable_elems)
    end)

    it("prints only `...` with edgeitems = 0", function()
      assert.are.equal("tensor([...], dtype=int64, shape={2,3})",
        tp.format(T({ { 1, 2, 3 }, { 4, 5, 6 } }, "int64"), { threshold = 2, edgeitems = 0 }))
      assert.are.equal(0, stats.totable_calls)
    end)

    it("prints a 10^8-element tensor fast", function()
      local t = from_gen({ 10000, 10000 }, "float32", function(i) return (i % 7) * 0.5 end)
      local t0 = os.clock()
      local s = tp.format(t)
      assert.is_true(os.clock() - t0 < 0.5)
      assert.are.equal(36, stats.totable_elems)
      assert.is_truthy(s:find("shape={10000,10000})", 1, true))
      assert.are.equal(
        "tensor([[0.0000, 0.5000, 1.0000,  ..., 0.5000, 1.0000, 1.5000],",
        s:match("^[^\n]*"))
    end)
  end)

  describe("metadata", function()
    it("adds device and requires_grad when set", function()
      assert.are.equal(
        "tensor([1., 2.], dtype=float32, shape={2}, device=opencl, requires_grad=true)",
        tp.format(T({ 1, 2 }, "float32", { device = "opencl", requires_grad = true })))
      assert.are.equal("tensor([1., 2.], dtype=float32, shape={2}, requires_grad=true)",
        tp.format(T({ 1, 2 }, "float32", { requires_grad = true })))
    end)

    it("keeps the metadata on the last line even when it is long", function()
      assert.are.equal(
        "tensor([0.5000, 1.5000, 2.5000, 3.5000, 4.5000, 5.5000, 6.5000, 7.5000, 8.5000]," ..
        " dtype=float32, shape={9})",
        tp.format(T({ 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5 })))
    end)
  end)

  describe("print options", function()
    it("has PyTorch's defaults", function()
      assert.are.same({ precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 },
        tp.get_printoptions())
      assert.is_nil(tp.get_printoptions().sci_mode)
    end)

    it("set_printoptions changes precision and keeps the rest", function()
      tp.set_printoptions({ precision = 2 })
      assert.are.same({ precision = 2, threshold = 1000, edgeitems = 3, linewidth = 80 },
        tp.get_printoptions())
      assert.are.equal("tensor([0.12, 1.50], dtype=float64, shape={2})",
        tp.format(T({ 0.12345, 1.5 }, "float64")))
      assert.are.equal("tensor([1.23e-05, 1.00e+00], dtype=float64, shape={2})",
        tp.format(T({ 1.2345e-5, 1 }, "float64")))
      tp.set_printoptions({ precision = 0 })
      assert.are.equal("tensor([0, 2], dtype=float64, shape={2})",
        tp.format(T({ 0.25, 1.5 }, "float64")))
    end)

    it("get_printoptions returns a copy", function()
      local o = tp.get_printoptions()
      o.precision = 9
      assert.are.equal(4, tp.get_printoptions().precision)
    end)

    it("sci_mode forces or forbids scientific notation", function()
      tp.set_printoptions({ sci_mode = true })
      assert.are.equal("tensor([1.0000e+00, 2.0000e+00], dtype=float32, shape={2})",
        tp.format(T({ 1, 2 })))
      tp.set_printoptions({ sci_mode = false })
      -- the width still comes from the scientific strings, as in PyTorch
      assert.are.equal("tensor([100000.0000,     1.5000], dtype=float64, shape={2})",
        tp.format(T({ 1e5, 1.5 }, "float64")))
      -- as torch.set_printoptions: leaving sci_mode out resets it to automatic
      tp.set_printoptions({ precision = 4 })
      assert.is_nil(tp.get_printoptions().sci_mode)
      assert.are.equal("tensor([1.0000e+05, 1.5000e+00], dtype=float64, shape={2})",
        tp.format(T({ 1e5, 1.5 }, "float64")))
    end)

    it("linewidth controls wrapping", function()
      tp.set_printoptions({ linewidth = 20 })
      assert.are.equal(
        "tensor([0, 1, 2, 3,\n" ..
        "        4, 5, 6, 7,\n" ..
        "        8, 9], dtype=int64, shape={10})",
        tp.format(arange(10, "int64")))
    end)

    it("format takes per-call options", function()
      local t = T({ 0.12345, 1.5 }, "float64")
      assert.are.equal("tensor([0.1, 1.5], dtype=float64, shape={2})", tp.format(t, { precision = 1 }))
      assert.are.equal(4, tp.get_printoptions().precision)
      assert.are.equal("tensor([0.1235, 1.5000], dtype=float64, shape={2})", tp.format(t))
    end)

    it("profiles", function()
      tp.set_printoptions({ profile = "short" })
      assert.are.same({ precision = 2, threshold = 1000, edgeitems = 2, linewidth = 80 },
        tp.get_printoptions())
      tp.set_printoptions({ profile = "full" })
      assert.are.equal(math.huge, tp.get_printoptions().threshold)
      local s = tp.format(from_gen({ 1200 }, "int64", function(i) return i % 3 end))
      assert.is_nil(s:find("...", 1, true))
    end)

    it("rejects bad options", function()
      assert.has_error(function() tp.set_printoptions({ precison = 2 }) end,
        "needle.set_printoptions: unknown option 'precison' " ..
        "(valid: edgeitems, linewidth, precision, profile, sci_mode, threshold)")
      assert.has_error(function() tp.set_printoptions({ precision = -1 }) end)
      assert.has_error(function() tp.set_printoptions({ edgeitems = 1.5 }) end)
      assert.has_error(function() tp.set_printoptions({ sci_mode = "yes" }) end)
      assert.has_error(function() tp.set_printoptions({ profile = "long" }) end)
      -- a failed call changes nothing
      assert.are.same({ precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 },
        tp.get_printoptions())
    end)
  end)
end)
