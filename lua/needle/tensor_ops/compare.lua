-- needle.tensor_ops.compare: isnan, isinf, isfinite, nan_to_num, isclose,
-- allclose, equal (internal; docs/tensor.md).
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

local function constant(x, value)
  return core.full(x.shape, value, {dtype = "bool", device = x.device})
end

local function no_args(who, ...) A.parse(who, 2, {}, {}, ...) end

-- NaN is the only value not equal to itself; x - x is NaN exactly for
-- NaN and the infinities. Integer and bool tensors hold neither.
local function isnan(x) return A.is_float(x) and x:ne(x) or constant(x, false) end
local function isfinite(x) return A.is_float(x) and (x - x):eq(0) or constant(x, true) end

function M.isnan(x, ...)
  A.tensor("isnan", x)
  no_args("isnan", ...)
  return isnan(x)
end

function M.isinf(x, ...)
  A.tensor("isinf", x)
  no_args("isinf", ...)
  return A.is_float(x) and x:abs():eq(math.huge) or constant(x, false)
end

function M.isfinite(x, ...)
  A.tensor("isfinite", x)
  no_args("isfinite", ...)
  return isfinite(x)
end

-- the largest finite value of each floating dtype
local LARGEST = {float32 = 3.4028234663852886e38, float64 = 1.7976931348623157e308, float16 = 65504.0,
                 bfloat16 = 3.3895313892515355e38}

-- nan_to_num(x, nan = 0, posinf = largest, neginf = -largest): where, so
-- the gradient reaches the elements kept (as PyTorch's)
function M.nan_to_num(x, ...)
  A.tensor("nan_to_num", x)
  local o = A.parse("nan_to_num", 2, {"nan", "posinf", "neginf"},
                    {nan = "number", posinf = "number", neginf = "number"}, ...)
  if not A.is_float(x) then return x:clone() end
  local big = LARGEST[x.dtype]
  local r = core.where(x:ne(x), o.nan or 0, x)
  r = core.where(x:eq(math.huge), o.posinf or big, r)
  return core.where(x:eq(-math.huge), o.neginf or -big, r)
end

local CLOSE = {rtol = "number", atol = "number", equal_nan = "boolean"}

-- PyTorch's isclose, step for step: equal, or both NaN (equal_nan), or a
-- finite |a - b| <= atol + |rtol b| (bool operands compare as float32)
local function isclose(who, a, b, ...)
  A.tensor(who, a)
  A.tensor(who, b, "other")
  local o = A.parse(who, 3, {"rtol", "atol", "equal_nan"}, CLOSE, ...)
  local rtol, atol = o.rtol or 1e-5, o.atol or 1e-8
  if not (rtol >= 0) or not (atol >= 0) then
    fail(who, "rtol and atol must be >= 0, got rtol = %s and atol = %s", tostring(rtol), tostring(atol))
  end
  if a.dtype ~= b.dtype then fail(who, "expected one dtype, got %s and %s", a.dtype, b.dtype) end
  A.same_device(who, a, b)
  A.broadcast_shapes(who, a.shape, b.shape)
  local close = a:eq(b)
  if o.equal_nan and A.is_float(a) then close = close + isnan(a) * isnan(b) end
  if rtol == 0 and atol == 0 then return close end
  if a.dtype == "bool" then a, b = a:float(), b:float() end
  local actual = (a - b):abs()
  return close + isfinite(actual) * actual:le((b * rtol):abs() + atol)
end

function M.isclose(a, b, ...) return isclose("isclose", a, b, ...) end

function M.allclose(a, b, ...)
  local close = isclose("allclose", a, b, ...)
  if core._host_read then core._host_read("allclose") end -- (a graph break under its own name)
  return close:numel() == close:sum():item()
end

-- equal(a, b): the same shape and the same values (after promotion)
function M.equal(a, b, ...)
  A.tensor("equal", a)
  A.tensor("equal", b, "other")
  no_args("equal", ...)
  if core._host_read then core._host_read("equal") end -- (a graph break under its own name)
  A.same_device("equal", a, b)
  local sa, sb = a.shape, b.shape
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return a:eq(b):sum():item() == a:numel()
end

return M
