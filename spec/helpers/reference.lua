-- spec/helpers/reference.lua - a small, slow, obviously-correct pure-Lua
-- reference for the tensor specs (elementwise, reduce, matmul, dtype).
--
-- It never calls needle: a reference tensor is a plain table
--   { shape = {d1, ..., dn}, data = {flat row-major values} }
-- (a 0-dim tensor has shape {} and one value). Values are Lua numbers
-- (integers stay integers, so int64 arithmetic wraps like Lua's does) or
-- booleans. The specs build the same data into needle tensors and compare
-- what needle computes with what this module computes.
--
--   local R = require "spec.helpers.reference"

local R = {}

---------------------------------------------------------------------------
-- Scalars

-- Rounds a number to the nearest float32 (string.pack rounds to nearest even).
function R.f32(v)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then return v end
  return (string.unpack("<f", string.pack("<f", v + 0.0)))
end

-- Round half to even (PyTorch / NumPy round).
function R.round_half_even(x)
  if x ~= x or x == math.huge or x == -math.huge then return x end
  local f = math.floor(x)
  local d = x - f
  local r
  if d > 0.5 then r = f + 1
  elseif d < 0.5 then r = f
  else r = (f % 2 == 0) and f or f + 1 end
  if r == 0 and x < 0 then return -0.0 end
  return r + 0.0
end

local function sign(x)
  if x ~= x then return x end
  if x > 0 then return 1 elseif x < 0 then return -1 else return x end
end

-- Unary ops on float values (inputs and outputs as Lua floats).
R.unary = {
  neg = function(x) return -x end,
  abs = function(x) return math.abs(x) end,
  exp = function(x) return math.exp(x) end,
  log = function(x)
    if x < 0 then return 0 / 0 end
    if x == 0 then return -math.huge end
    return math.log(x)
  end,
  sqrt = function(x) if x < 0 then return 0 / 0 end return math.sqrt(x) end,
  rsqrt = function(x)
    if x < 0 then return 0 / 0 end
    return 1 / math.sqrt(x) -- 1/+0 = inf, 1/-0 = -inf
  end,
  tanh = function(x)
    if x > 20 then return 1.0 elseif x < -20 then return -1.0 end
    local e2 = math.exp(2 * x)
    return (e2 - 1) / (e2 + 1)
  end,
  sigmoid = function(x) return 1 / (1 + math.exp(-x)) end,
  relu = function(x)
    if x > 0 or x ~= x then return x end
    return 0.0
  end,
  sign = sign,
  floor = function(x) return math.floor(x) + 0.0 end,
  ceil = function(x) return math.ceil(x) + 0.0 end,
  round = function(x) return R.round_half_even(x) end,
  sin = function(x) return math.sin(x) end,
  cos = function(x) return math.cos(x) end,
  -- erf: its Taylor series below 3 (alternating, terms below 1e-17 of the
  -- sum at the end), 1 - the asymptotic erfc above (erfc(3) = 2.2e-5)
  erf = function(x)
    if x ~= x or x == 0 then return x end
    local a = math.abs(x)
    local r
    if a < 3 then
      local term, sum, n = a, a, 0
      repeat
        n = n + 1
        term = -term * a * a / n
        local t = term / (2 * n + 1)
        sum = sum + t
      until math.abs(t) < 1e-17 * math.abs(sum) or n > 200
      r = sum * 2 / math.sqrt(math.pi)
    else
      local inv = 1 / (2 * a * a)
      r = 1 - math.exp(-a * a) / (a * math.sqrt(math.pi)) * (1 - inv + 3 * inv ^ 2 - 15 * inv ^ 3)
    end
    return x < 0 and -r or r
  end,
  log1p = function(x)
    if x < -1 then return 0 / 0 end
    if x == -1 then return -math.huge end
    return math.log(1 + x)
  end,
  expm1 = function(x) return math.exp(x) - 1 end,
}
-- gelu: 0.5 x (1 + erf(x / sqrt 2)), with the erf above (PyTorch's exact form)
R.unary.gelu = function(x)
  if x ~= x then return x end
  return 0.5 * x * (1 + R.unary.erf(x / math.sqrt(2)))
end
-- gelu_tanh: GELU's tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
R.unary.gelu_tanh = function(x)
  if x ~= x then return x end
  return 0.5 * x * (1 + R.unary.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end
R.unary_names = { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
                  "sign", "floor", "ceil", "round", "sin", "cos", "erf", "log1p", "expm1", "gelu",
                  "gelu_tanh" }

local function fmax(a, b) if a ~= a then return a end if b ~= b then return b end return a > b and a or b end
local function fmin(a, b) if a ~= a then return a end if b ~= b then return b end return a < b and a or b end

-- Binary ops on numbers (float semantics for div and pow).
R.binary = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return (a + 0.0) ^ b end,
  maximum = fmax,
  minimum = fmin,
  eq = function(a, b) return a == b end,
  ne = function(a, b) return a ~= b end,
  lt = function(a, b) return a < b end,
  le = function(a, b) return a <= b end,
  gt = function(a, b) return a > b end,
  ge = function(a, b) return a >= b end,
}
R.binary_names = { "add", "sub", "mul", "div", "pow", "maximum", "minimum",
                   "eq", "ne", "lt", "le", "gt", "ge" }
R.comparison = { eq = true, ne = true, lt = true, le = true, gt = true, ge = true }

-- Integer power with Lua's wrapping integer multiply (e >= 0).
function R.ipow(b, e)
  local r = 1
  for _ = 1, e do r = r * b end
  return r
end

---------------------------------------------------------------------------
-- Shapes and construction

function R.numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

function R.copy_shape(shape)
  local s = {}
  for i = 1, #shape do s[i] = shape[i] end
  return s
end

function R.strides(shape)
  local st, s = {}, 1
  for d = #shape, 1, -1 do st[d] = s; s = s * shape[d] end
  return st
end

function R.new(shape, data)
  assert(#data == R.numel(shape) or (R.numel(shape) == 0 and #data == 0), "reference: data/shape mismatch")
  return { shape = R.copy_shape(shape), data = data }
end

-- shape and a function of the flat 0-based index (or of the 1-based index list).
function R.generate(shape, fn)
  local n = R.numel(shape)
  local data = {}
  for i = 1, n do data[i] = fn(i - 1) end
  return R.new(shape, data)
end

function R.scalar(v) return { shape = {}, data = { v } } end

-- From a nested Lua table (or a plain number/boolean: 0-dim).
function R.from(nested)
  if type(nested) ~= "table" then return R.scalar(nested) end
  local shape = {}
  local t = nested
  while type(t) == "table" do
    shape[#shape + 1] = #t
    if #t == 0 then break end
    t = t[1]
  end
  local data = {}
  local function walk(v, depth)
    if depth > #shape then data[#data + 1] = v; return end
    assert(type(v) == "table" and #v == shape[depth], "reference: ragged table")
    for i = 1, #v do walk(v[i], depth + 1) end
  end
  if R.numel(shape) > 0 then walk(nested, 1) end
  return R.new(shape, data)
end

-- To a nested Lua table (a plain value for 0-dim).
function R.nested(ref)
  local shape, data = ref.shape, ref.data
  if #shape == 0 then return data[1] end
  local pos = 0
  local function build(depth)
    local t = {}
    for i = 1, shape[depth] do
      if depth == #shape then pos = pos + 1; t[i] = data[pos]
      else t[i] = build(depth + 1) end
    end
    return t
  end
  return build(1)
end

-- Flattens a nested table (or a plain value) into a row-major list.
function R.flatten(nested)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for i = 1, #v do walk(v[i]) end
    else out[#out + 1] = v end
  end
  walk(nested)
  return out
end

-- Deterministic pseudo-random values (an LCG): integers in [lo, hi].
function R.lcg(seed)
  local state = seed or 12345
  return function(lo, hi)
    state = (state * 1103515245 + 12345) % 2147483648
    return lo + (state // 65536) % (hi - lo + 1)
  end
end

-- Values on a quarter grid in [lo, hi] (exact in float32, so there are ties
-- for comparisons and no rounding in the inputs).
function R.grid(shape, seed, lo, hi)
  local rnd = R.lcg(seed)
  lo, hi = lo or -3, hi or 3
  return R.generate(shape, function() return rnd(lo * 4, hi * 4) / 4 end)
end

-- Integers in [lo, hi].
function R.ints(shape, seed, lo, hi)
  local rnd = R.lcg(seed)
  return R.generate(shape, function() return rnd(lo, hi) end)
end

---------------------------------------------------------------------------
-- Indexing and views (all return new reference tensors with copied data)

local function unravel(i0, shape)
  -- 0-based flat index -> 1-based index list
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = i0 % shape[d] + 1
    i0 = i0 // shape[d]
  end
  return idx
end
R.unravel = unravel

local function ravel(idx, shape)
  -- 1-based index list -> 1-based flat position
  local pos = 0
  for d = 1, #shape do pos = pos * shape[d] + (idx[d] - 1) end
  return pos + 1
end
R.ravel = ravel

function R.get(ref, idx) return ref.data[ravel(idx, ref.shape)] end

local function norm_dim(d, n)
  if d < 0 then d = d + n + 1 end
  assert(d >= 1 and d <= math.max(n, 1), "reference: dim out of range")
  return d
end
R.norm_dim = norm_dim

-- result dim i is ref dim dims[i]
function R.permute(ref, dims)
  local n = #ref.shape
  local shape = {}
  for i = 1, n do shape[i] = ref.shape[dims[i]] end
  return R.generate(shape, function(i0)
    local idx = unravel(i0, shape)
    local src = {}
    for i = 1, n do src[dims[i]] = idx[i] end
    return R.get(ref, src)
  end)
end

function R.transpose(ref, a, b)
  local n = #ref.shape
  if n < 2 then return R.new(ref.shape, { table.unpack(ref.data) }) end
  a, b = a or 1, b or 2
  local dims = {}
  for i = 1, n do dims[i] = i end
  dims[a], dims[b] = dims[b], dims[a]
  return R.permute(ref, dims)
end

-- inclusive 1-based range first..last (negative from the end) with step
function R.slice(ref, dim, first, last, step)
  step = step or 1
  local size = ref.shape[dim]
  if first < 0 then first = first + size + 1 end
  if last < 0 then last = last + size + 1 end
  local picks = {}
  for i = first, last, step do picks[#picks + 1] = i end
  local shape = R.copy_shape(ref.shape)
  shape[dim] = #picks
  return R.generate(shape, function(i0)
    local idx = unravel(i0, shape)
    idx[dim] = picks[idx[dim]]
    return R.get(ref, idx)
  end)
end

-- Broadcast shape of two shapes (NumPy rules), or nil.
function R.broadcast_shape(a, b)
  local n = math.max(#a, #b)
  local out = {}
  for i = 1, n do
    local da = a[#a - n + i] or 1
    local db = b[#b - n + i] or 1
    if da == db or db == 1 then out[i] = da
    elseif da == 1 then out[i] = db
    else return nil end
  end
  return out
end

-- Value of ref at an index of the (larger) broadcast shape.
local function bget(ref, idx)
  local n, m = #idx, #ref.shape
  local src = {}
  for i = 1, m do
    local s = ref.shape[i]
    local v = idx[n - m + i]
    src[i] = (s == 1) and 1 or v
  end
  return R.get(ref, src)
end

function R.expand(ref, shape)
  return R.generate(shape, function(i0) return bget(ref, unravel(i0, shape)) end)
end

local function as_ref(x)
  if type(x) == "table" and x.shape then return x end
  return R.scalar(x)
end

---------------------------------------------------------------------------
-- Elementwise

function R.map(ref, f)
  local data = {}
  for i = 1, #ref.data do data[i] = f(ref.data[i]) end
  return R.new(ref.shape, data)
end

-- f(a, b) with broadcasting; a, b may be reference tensors or plain numbers.
function R.map2(a, b, f)
  a, b = as_ref(a), as_ref(b)
  local shape = assert(R.broadcast_shape(a.shape, b.shape), "reference: shapes do not broadcast")
  return R.generate(shape, function(i0)
    local idx = unravel(i0, shape)
    return f(bget(a, idx), bget(b, idx))
  end)
end

-- f(a, b, c) with broadcasting (for where).
function R.map3(a, b, c, f)
  a, b, c = as_ref(a), as_ref(b), as_ref(c)
  local shape = assert(R.broadcast_shape(a.shape, b.shape), "reference: shapes do not broadcast")
  shape = assert(R.broadcast_shape(shape, c.shape), "reference: shapes do not broadcast")
  return R.generate(shape, function(i0)
    local idx = unravel(i0, shape)
    return f(bget(a, idx), bget(b, idx), bget(c, idx))
  end)
end

---------------------------------------------------------------------------
-- Reductions

-- fn(values) over the given dims (a number, a list, or nil for all dims);
-- values are passed in row-major order of the reduced dims.
function R.reduce(ref, dims, keepdim, fn)
  local n = #ref.shape
  local red = {}
  if dims == nil then
    for i = 1, n do red[i] = true end
  else
    if type(dims) == "number" then dims = { dims } end
    for _, d in ipairs(dims) do red[norm_dim(d, n)] = true end
  end
  local kept_shape, keep_shape, rshape, rdims, kdims = {}, {}, {}, {}, {}
  for i = 1, n do
    if red[i] then
      keep_shape[i] = 1
      rshape[#rshape + 1] = ref.shape[i]
      rdims[#rdims + 1] = i
    else
      keep_shape[i] = ref.shape[i]
      kept_shape[#kept_shape + 1] = ref.shape[i]
      kdims[#kdims + 1] = i
    end
  end
  local out_shape = keepdim and keep_shape or kept_shape
  local rcount = R.numel(rshape)
  local res = R.generate(kept_shape, function(o0)
    local kidx = unravel(o0, kept_shape)
    local vals = {}
    for r0 = 0, rcount - 1 do
      local ridx = unravel(r0, rshape)
      local idx = {}
      for j, d in ipairs(kdims) do idx[d] = kidx[j] end
      for j, d in ipairs(rdims) do idx[d] = ridx[j] end
      vals[#vals + 1] = R.get(ref, idx)
    end
    return fn(vals)
  end)
  res.shape = out_shape
  return res
end

-- Reduction functions on a list of values.
R.red = {}
function R.red.sum(v) local s = 0 for i = 1, #v do s = s + v[i] end return s end
function R.red.prod(v) local s = 1 for i = 1, #v do s = s * v[i] end return s end
function R.red.mean(v) return R.red.sum(v) / #v end
function R.red.max(v)
  local m = v[1]
  for i = 2, #v do if m == m and (v[i] ~= v[i] or v[i] > m) then m = v[i] end end
  return m
end
function R.red.min(v)
  local m = v[1]
  for i = 2, #v do if m == m and (v[i] ~= v[i] or v[i] < m) then m = v[i] end end
  return m
end
-- 1-based position of the first maximum (first NaN wins)
function R.red.argmax(v)
  local m, k = v[1], 1
  for i = 2, #v do if m == m and (v[i] ~= v[i] or v[i] > m) then m, k = v[i], i end end
  return k
end
function R.red.argmin(v)
  local m, k = v[1], 1
  for i = 2, #v do if m == m and (v[i] ~= v[i] or v[i] < m) then m, k = v[i], i end end
  return k
end
function R.red.var_c(correction)
  return function(v)
    local mean = R.red.mean(v)
    local s = 0
    for i = 1, #v do s = s + (v[i] - mean) ^ 2 end
    local denom = #v - correction
    if denom <= 0 then return 0 / 0 end
    return s / denom
  end
end
function R.red.std_c(correction)
  local var = R.red.var_c(correction)
  return function(v) return math.sqrt(var(v)) end
end
R.red.var = R.red.var_c(1)
R.red.std = R.red.std_c(1)
function R.red.logsumexp(v)
  if #v == 0 then return -math.huge end
  local m = R.red.max(v)
  if m == math.huge or m == -math.huge or m ~= m then return m end
  local s = 0
  for i = 1, #v do s = s + math.exp(v[i] - m) end
  return m + math.log(s)
end

---------------------------------------------------------------------------
-- Matmul (PyTorch's rules: 1-D operands promoted and the dim removed again,
-- batch dims broadcast). Integers accumulate in Lua integers (wrapping).

-- plain 2-D x 2-D product (row-major data)
local function matmul2d(a, b)
  local M, K, N = a.shape[1], a.shape[2], b.shape[2]
  assert(b.shape[1] == K, "reference: inner dims do not match")
  local A, B = a.data, b.data
  local zero = (math.type(A[1]) == "integer" and math.type(B[1]) == "integer") and 0 or 0.0
  local out = {}
  for i = 0, M - 1 do
    for j = 0, N - 1 do
      local s = zero
      for k = 0, K - 1 do s = s + A[i * K + k + 1] * B[k * N + j + 1] end
      out[i * N + j + 1] = s
    end
  end
  return R.new({ M, N }, out)
end

function R.matmul(a, b)
  if #a.shape == 2 and #b.shape == 2 then return matmul2d(a, b) end
  local as, bs = R.copy_shape(a.shape), R.copy_shape(b.shape)
  local a_vec, b_vec = #as == 1, #bs == 1
  if a_vec then as = { 1, as[1] } end
  if b_vec then bs = { bs[1], 1 } end
  local M, K, N = as[#as - 1], as[#as], bs[#bs]
  assert(bs[#bs - 1] == K, "reference: inner dims do not match")
  local abatch, bbatch = {}, {}
  for i = 1, #as - 2 do abatch[i] = as[i] end
  for i = 1, #bs - 2 do bbatch[i] = bs[i] end
  local batch = assert(R.broadcast_shape(abatch, bbatch), "reference: batch dims do not broadcast")
  local A = R.new(as, a.data)
  local B = R.new(bs, b.data)
  local oshape = R.copy_shape(batch)
  oshape[#oshape + 1] = M
  oshape[#oshape + 1] = N
  local nb = #batch
  local zero = (math.type(a.data[1]) == "integer" and math.type(b.data[1]) == "integer") and 0 or 0.0
  local res = R.generate(oshape, function(i0)
    local idx = unravel(i0, oshape)
    local i, j = idx[nb + 1], idx[nb + 2]
    local s = zero
    for k = 1, K do
      local ai, bi = {}, {}
      for d = 1, nb do ai[d] = idx[d]; bi[d] = idx[d] end
      ai[nb + 1], ai[nb + 2] = i, k
      bi[nb + 1], bi[nb + 2] = k, j
      s = s + bget(A, ai) * bget(B, bi)
    end
    return s
  end)
  local final = R.copy_shape(batch)
  if not a_vec then final[#final + 1] = M end
  if not b_vec then final[#final + 1] = N end
  res.shape = final
  return res
end

---------------------------------------------------------------------------
-- Comparison

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end
R.same_shape = same_shape

function R.shape_str(s)
  local parts = {}
  for i = 1, #s do parts[i] = tostring(s[i]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- Is a close to b? NaN matches NaN, infinities must be equal, booleans exact.
function R.close_value(a, b, rtol, atol)
  if type(a) == "boolean" or type(b) == "boolean" then return a == b end
  if type(a) ~= "number" or type(b) ~= "number" then return false end
  if a ~= a or b ~= b then return a ~= a and b ~= b end
  if a == b then return true end
  if a == math.huge or a == -math.huge or b == math.huge or b == -math.huge then return false end
  return math.abs(a - b) <= atol + rtol * math.abs(b)
end

local function is_tensor(x)
  return type(x) == "userdata"
end

-- Compares a needle tensor (or nested table / number) with a reference
-- tensor (or nested table / number). Returns true, or false and a message
-- naming the first mismatch. opts: rtol (1e-5), atol (1e-6), exact (false).
function R.compare(actual, expected, opts)
  opts = opts or {}
  local rtol = opts.rtol or 1e-5
  local atol = opts.atol or 1e-6
  if opts.exact then rtol, atol = 0, 0 end
  local ashape, adata
  if is_tensor(actual) then
    ashape = actual.shape
    adata = R.flatten(actual:totable())
  elseif type(actual) == "table" and actual.shape then
    ashape, adata = actual.shape, actual.data
  else
    local r = R.from(actual)
    ashape, adata = r.shape, r.data
  end
  local eref = (type(expected) == "table" and expected.shape) and expected or R.from(expected)
  if not same_shape(ashape, eref.shape) then
    return false, ("shape %s, expected %s"):format(R.shape_str(ashape), R.shape_str(eref.shape))
  end
  if #adata ~= #eref.data then
    return false, ("%d values, expected %d"):format(#adata, #eref.data)
  end
  for i = 1, #adata do
    if not R.close_value(adata[i], eref.data[i], rtol, atol) then
      local idx = #eref.shape > 0 and R.shape_str(unravel(i - 1, eref.shape)) or "{}"
      return false, ("at %s: got %s, expected %s (rtol %g, atol %g)"):format(
        idx, tostring(adata[i]), tostring(eref.data[i]), rtol, atol)
    end
  end
  return true
end

-- Assertion helpers bound to the caller's assert (pass busted's luassert so
-- that a mismatch is reported as a failure with the message):
--   local close, equal = R.asserts(assert)
--   close(actual, expected, opts, what)  -- rtol/atol comparison
--   equal(actual, expected, what)        -- exact comparison
function R.asserts(A)
  local function close(actual, expected, opts, what)
    local ok, msg = R.compare(actual, expected, opts)
    if not ok then
      msg = (what and (what .. ": ") or "") .. msg
      if type(A) == "table" and A.is_true then A.is_true(false, msg) end
      error(msg, 2)
    end
    return true
  end
  local function equal(actual, expected, what)
    return close(actual, expected, { exact = true }, what)
  end
  return close, equal
end

return R
