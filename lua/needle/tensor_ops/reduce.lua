-- needle.tensor_ops.reduce: amax, amin, all, any, norm (internal;
-- docs/tensor.md).
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

local REDUCE = {dim = "integer|table", keepdim = "boolean"}

-- the result of a keepdim reduction over `dims`, without them unless keepdim
local function finish(r, x, dims, keepdim)
  if keepdim or x:dim() == 0 then return r end
  return r:reshape(A.reduced_shape(x.shape, dims))
end

local function wants_grad(x) return x.requires_grad and core.is_grad_enabled() end

-- amax/amin: the values of max/min over dims; the gradient goes to every
-- element equal to the result, split evenly among them (as PyTorch's)
local function extreme(who, largest, x, ...)
  A.tensor(who, x)
  local o = A.parse(who, 2, {"dim", "keepdim"}, REDUCE, ...)
  local dims = A.dims(who, o.dim, x:dim())
  if #dims == 0 then dims = A.dims(who, nil, x:dim()) end -- dim = {} is every dim, as PyTorch's ()
  for _, d in ipairs(dims) do
    if d <= x:dim() and x:size(d) == 0 then
      fail(who, "cannot reduce dim %d of size 0 (shape %s)", d, A.shape_str(x))
    end
  end
  if x:dim() == 0 then return x:clone() end
  local v = largest and x:max(dims, true) or x:min(dims, true)
  if not wants_grad(x) then return finish(v, x, dims, o.keepdim) end
  v = v:detach()
  local mask = x:eq(v)
  local count = mask:sum(dims, true)
  -- v + sum(mask (x - x)) / count: the value is v (exactly; an infinite x
  -- adds an infinity of v's own sign), the gradient mask / count
  local xd = x:detach()
  local zero = x - core.where((xd - xd):eq(0), xd, 0)
  local r = v + core.where(mask, zero, 0):sum(dims, true) / count
  if r.dtype ~= x.dtype then r = r:to(x.dtype) end
  return finish(r, x, dims, o.keepdim)
end

function M.amax(x, ...) return extreme("amax", true, x, ...) end
function M.amin(x, ...) return extreme("amin", false, x, ...) end

-- all/any: bool (uint8 for uint8 input, as PyTorch 1.13)
local function logical(who, x, ...)
  A.tensor(who, x)
  local o = A.parse(who, 2, {"dim", "keepdim"}, REDUCE, ...)
  local dims = A.dims(who, o.dim, x:dim())
  local nonzero = x:ne(0)
  local r
  if x:dim() == 0 then
    r = nonzero
  else
    if #dims == 0 then dims = A.dims(who, nil, x:dim()) end
    local hits = nonzero:sum(dims, true)
    if who == "all" then
      local n = 1
      for _, d in ipairs(dims) do n = n * x:size(d) end
      r = hits:eq(n)
    else
      r = hits:gt(0)
    end
    r = finish(r, x, dims, o.keepdim)
  end
  return x.dtype == "uint8" and r:byte() or r
end

function M.all(x, ...) return logical("all", x, ...) end
function M.any(x, ...) return logical("any", x, ...) end

-- f(s) for s >= 0 with f's gradient where s > 0 and 0 where s == 0 (the
-- gradient of a norm at 0, as PyTorch masks it; sqrt(0)' is infinite)
local function at_zero_safe(s, f)
  local zero = s:eq(0)
  return core.where(zero, 0, f(core.where(zero, 1, s)))
end

-- ||x||_2 over dims (keepdim) as m sqrt(sum((x / m)^2)) with m = max |x|
-- (detached: a constant to autograd, so the gradient, of every order, is
-- the norm's): x * x would overflow float32 above ~1.8e19 and underflow
-- below ~1e-23. Where m is 0 (all zeros) the norm is 0 with gradient 0, as
-- before; where it is infinite, the norm is too (x / m would be NaN).
local function two_norm(x, dims)
  local root = function(s) return s:sqrt() end
  if x:numel() == 0 then return at_zero_safe((x * x):sum(dims, true), root) end -- (no max to take)
  local m = M.amax(x:detach():abs(), dims, true)
  local safe = core.where(m:eq(0), 1, m)
  local q = x / safe
  local r = at_zero_safe((q * q):sum(dims, true), root) * safe
  return core.where(m:eq(math.huge), m, r)
end

-- ||x||_p over dims (keepdim), x floating point
local function vector_norm(x, p, dims)
  local a = x:abs()
  if p == math.huge then return M.amax(a, dims, true) end
  if p == -math.huge then return M.amin(a, dims, true) end
  if p == 0 then return a:ne(0):sum(dims, true):to(x.dtype) end
  if p == 1 then return a:sum(dims, true) end
  if p == 2 then return two_norm(x, dims) end
  if p < 0 then return (a ^ p):sum(dims, true) ^ (1 / p) end -- a zero makes the sum infinite: the norm is 0
  local terms = at_zero_safe(a, function(t) return t ^ p end)
  return at_zero_safe(terms:sum(dims, true), function(s) return s ^ (1 / p) end)
end

-- norm(x, p = "fro", dim = nil, keepdim = false, {dtype =}): torch.norm
function M.norm(x, ...)
  A.tensor("norm", x)
  local o = A.parse("norm", 2, {"p", "dim", "keepdim", "dtype"},
                    {p = "number|string", dim = "integer|table", keepdim = "boolean", dtype = "string"}, ...)
  local p = o.p == nil and "fro" or o.p
  if p == "nuc" then
    fail("norm", "p = 'nuc' (the nuclear norm) needs singular values, which nd.norm does not compute: it is " ..
         "left to nd.linalg (the sum of nd.linalg.svdvals(x) over its last dim)")
  end
  if type(p) == "string" and p ~= "fro" then fail("norm", "p must be a number, 'fro' or 'nuc', got %q", p) end
  if o.dtype ~= nil then
    if p == "fro" then fail("norm", "option 'dtype' is not supported with p = 'fro' (as PyTorch)") end
    x = x:to(o.dtype)
  end
  A.float_tensor("norm", x)
  local dims = A.dims("norm", o.dim, x:dim())
  if p == "fro" and o.dim ~= nil and #dims > 2 then
    fail("norm", "p = 'fro' takes 1 or 2 dims (a vector or a matrix), got %d", #dims)
  end
  if #dims == 0 then dims = A.dims("norm", nil, x:dim()) end
  local scalar = x:dim() == 0
  if scalar then x, dims = x:reshape({1}), {1} end
  local r = vector_norm(x, p == "fro" and 2 or p, dims)
  if scalar then return r:reshape({}) end
  if o.keepdim then return r end
  return r:reshape(A.reduced_shape(x.shape, dims))
end

return M
