-- needle.tensor_ops.scan: cumprod and logcumsumexp (internal;
-- docs/tensor.md).
--
-- Both are inclusive scans written as log2(n) steps of narrow, an
-- elementwise combine and cat (Hillis and Steele): step s combines every
-- element with the one s before it. The gradient is then the chain rule
-- through those ops: exact where a zero makes cumprod's usual formula
-- (cumsum of g y / x) divide by zero, and of any order, on every device.
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local M = {}

local function scan(x, d, combine)
  local n = x:size(d)
  local y, s = x, 1
  while s < n do
    y = core.cat({y:narrow(d, 1, s), combine(y:narrow(d, s + 1, n - s), y:narrow(d, 1, n - s))}, d)
    s = s * 2
  end
  return y
end

local function args(who, x, spec, ...)
  A.tensor(who, x)
  local o = A.parse(who, 2, {"dim"}, spec, ...)
  if o.dim == nil then A.fail(who, "dim is required (as PyTorch's)") end
  local d = A.dim(who, o.dim, x:dim())
  if o.dtype ~= nil then x = x:to(o.dtype) end -- cumprod's, as PyTorch's
  return x, d
end

-- cumprod(x, dim, {dtype}): integer and bool tensors give int64, as PyTorch
function M.cumprod(x, ...)
  local d
  x, d = args("cumprod", x, {dim = "integer", dtype = "string"}, ...)
  if not A.is_float(x) then x = x:long() end
  if x:dim() == 0 then return x:clone() end
  return scan(x, d, function(a, b) return a * b end)
end

-- log(exp(a) + exp(b)) as hi + log1p(exp(lo - hi)); where hi is infinite
-- (or NaN) the result is hi itself, and the other branch computes on zeros
-- so that no NaN reaches the gradient
local function logaddexp(a, b)
  local first = a:ge(b) + a:ne(a) -- NaN wins, so that it propagates
  local hi, lo = core.where(first, a, b), core.where(first, b, a)
  local finite = (hi - hi):eq(0)
  local hs, ls = core.where(finite, hi, 0), core.where(finite, lo, 0)
  return core.where(finite, hs + (ls - hs):exp():log1p(), hi)
end

-- logcumsumexp(x, dim): log of the cumulative sum of exp(x), without
-- overflow or underflow (a pairwise log-add-exp scan)
function M.logcumsumexp(x, ...)
  local d
  x, d = args("logcumsumexp", x, {dim = "integer"}, ...)
  A.float_tensor("logcumsumexp", x)
  if x:dim() == 0 then return x:clone() end
  return scan(x, d, logaddexp)
end

return M
