-- needle.tensor_ops.matrix: bmm, outer, tril, triu, diag, trace (internal;
-- docs/tensor.md). All are views, where, pad, index_select and matmul, so
-- their gradients and OpenCL come from those ops.
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

-- The diagonal `offset` of the last two dims of x (offset > 0 above the
-- main one), as a last dim: one index_select on the flattened matrices.
function M.diagonal_last(x, offset)
  local shape = x.shape
  local n = #shape
  local r, c = shape[n - 1], shape[n]
  local len, first
  if offset >= 0 then
    len, first = math.max(0, math.min(r, c - offset)), offset
  else
    len, first = math.max(0, math.min(r + offset, c)), -offset * c
  end
  local flat = {}
  for i = 1, n - 2 do flat[i] = shape[i] end
  flat[n - 1] = r * c
  -- element i (1-based) of the diagonal is at first + (i - 1) (c + 1) + 1
  local idx = core.arange(0, len, {dtype = "int64", device = x.device}) * (c + 1) + (first + 1)
  return x:reshape(flat):index_select(n - 1, idx)
end

function M.bmm(x, y, ...)
  A.tensor("bmm", x)
  A.tensor("bmm", y, "mat2")
  A.parse("bmm", 3, {}, {}, ...)
  if x:dim() ~= 3 or y:dim() ~= 3 then
    fail("bmm", "expected two 3-dim tensors (b, n, m) and (b, m, p), got %s and %s", A.shape_str(x), A.shape_str(y))
  end
  local sx, sy = x.shape, y.shape
  if sx[1] ~= sy[1] or sx[3] ~= sy[2] then
    fail("bmm", "shapes %s and %s do not match (expected (b, n, m) and (b, m, p): %s)", A.shape_str(x), A.shape_str(y),
         sx[1] ~= sy[1] and ("batch %d ~= %d"):format(sx[1], sy[1]) or ("%d ~= %d"):format(sx[3], sy[2]))
  end
  if x.dtype ~= y.dtype then fail("bmm", "expected one dtype, got %s and %s", x.dtype, y.dtype) end
  A.same_device("bmm", x, y)
  return core.matmul(x, y)
end

function M.outer(x, y, ...)
  A.tensor("outer", x)
  A.tensor("outer", y, "vec2")
  A.parse("outer", 3, {}, {}, ...)
  if x:dim() ~= 1 or y:dim() ~= 1 then
    fail("outer", "expected two 1-dim tensors, got %s and %s", A.shape_str(x), A.shape_str(y))
  end
  A.same_device("outer", x, y)
  return x:reshape({-1, 1}) * y:reshape({1, -1})
end

-- where(keep, x, 0) for the mask of the last two dims: col - row <= k (tril)
-- or >= k (triu)
local function triangle(who, x, ...)
  A.tensor(who, x)
  local o = A.parse(who, 2, {"diagonal"}, {diagonal = "integer"}, ...)
  local k = o.diagonal or 0
  if x:dim() < 2 then fail(who, "expected a tensor with at least 2 dims, got %s", A.shape_str(x)) end
  local r, c = x:size(-2), x:size(-1)
  local rows = core.arange(r, {dtype = "int64", device = x.device}):reshape({r, 1})
  local cols = core.arange(c, {dtype = "int64", device = x.device}):reshape({1, c})
  local diff = cols - rows
  local keep = who == "tril" and diff:le(k) or diff:ge(k)
  return core.where(keep, x, 0)
end

function M.tril(x, ...) return triangle("tril", x, ...) end
function M.triu(x, ...) return triangle("triu", x, ...) end

-- diag(v, k): the matrix with v on diagonal k; diag(m, k): diagonal k of m
function M.diag(x, ...)
  A.tensor("diag", x)
  local o = A.parse("diag", 2, {"diagonal"}, {diagonal = "integer"}, ...)
  local k = o.diagonal or 0
  if x:dim() == 2 then return M.diagonal_last(x, k) end
  if x:dim() ~= 1 then fail("diag", "expected a 1-dim or 2-dim tensor, got %s", A.shape_str(x)) end
  local n = x:size(1)
  local eye = core.eye(n, {dtype = "bool", device = x.device})
  -- where, not a product with the identity: inf * 0 would put NaN off the diagonal
  local m = core.where(eye, x:reshape({1, n}):expand({n, n}), 0)
  local a = math.abs(k)
  if a == 0 then return m end
  -- pairs from the last dim: (left, right, top, bottom)
  return m:pad(k > 0 and {a, 0, 0, a} or {0, a, a, 0})
end

function M.trace(x, ...)
  A.tensor("trace", x)
  A.parse("trace", 2, {}, {}, ...)
  if x:dim() ~= 2 then fail("trace", "expected a 2-dim tensor, got %s", A.shape_str(x)) end
  return M.diagonal_last(x, 0):sum()
end

return M
