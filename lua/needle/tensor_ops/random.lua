-- needle.tensor_ops.random: multinomial and the in-place fills uniform_,
-- normal_, bernoulli_ (internal; docs/tensor.md). Every draw comes from
-- needle's stream (nd.rand, nd.randn), so nd.manual_seed makes it
-- reproducible; a fill is a copy_ of the draw, which writes through views
-- and bumps the tensor's version (autograd sees the write), as every
-- in-place op.
local core = require "needle.core"
local A = require "needle.tensor_ops.args"
local order = require "needle.tensor_ops.order"

local fail = A.fail
local M = {}

-- the fills are in-place ops: refused on a tensor that requires grad while
-- grad mode is on (copy_ would refuse it too, naming itself)
local function writable(who, x)
  if x.requires_grad and core.is_grad_enabled() then
    fail(who, "in-place fill of a tensor that requires grad (its gradient graph would be wrong); fill it " ..
         "under nd.no_grad")
  end
end

local function draw(x, normal)
  local opts = {dtype = A.is_float(x) and x.dtype or "float32", device = x.device}
  return normal and core.randn(x.shape, opts) or core.rand(x.shape, opts)
end

-- x:uniform_(from = 0, to = 1): uniform in [from, to)
function M.uniform_(x, ...)
  A.float_tensor("uniform_", x)
  local o = A.parse("uniform_", 2, {"from", "to"}, {from = "number", to = "number"}, ...)
  writable("uniform_", x)
  local from, to = o.from or 0, o.to or 1
  if not (from <= to) then fail("uniform_", "expected from <= to, got from = %s and to = %s", from, to) end
  return x:copy_(draw(x) * (to - from) + from)
end

-- x:normal_(mean = 0, std = 1)
function M.normal_(x, ...)
  A.float_tensor("normal_", x)
  local o = A.parse("normal_", 2, {"mean", "std"}, {mean = "number", std = "number"}, ...)
  writable("normal_", x)
  local mean, std = o.mean or 0, o.std or 1
  if not (std >= 0) then fail("normal_", "std must be >= 0, got %s", std) end
  return x:copy_(draw(x, true) * std + mean)
end

-- x:bernoulli_(p = 0.5): 1 with probability p (a number or a tensor that
-- broadcasts to x), else 0; any dtype
function M.bernoulli_(x, ...)
  A.tensor("bernoulli_", x)
  local o = A.parse("bernoulli_", 2, {"p"}, {p = "number|tensor"}, ...)
  writable("bernoulli_", x)
  local p = o.p == nil and 0.5 or o.p
  if core.is_tensor(p) then
    A.float_tensor("bernoulli_", p, "p")
    A.same_device("bernoulli_", x, p)
    local shape = A.broadcast_shapes("bernoulli_", x.shape, p.shape)
    if #shape ~= x:dim() or A.shape_str(shape) ~= A.shape_str(x) then
      fail("bernoulli_", "p of shape %s does not broadcast to the tensor's shape %s", A.shape_str(p), A.shape_str(x))
    end
    if p:numel() > 0 then
      local lo, hi = p:min():item(), p:max():item()
      if not (lo >= 0 and hi <= 1) then
        fail("bernoulli_", "p must be in [0, 1], got values in [%s, %s]", lo, hi)
      end
    end
    p = p:detach()
  elseif not (p >= 0 and p <= 1) then
    fail("bernoulli_", "p must be in [0, 1], got %s", p)
  end
  return x:copy_(core.rand(x.shape, {device = x.device}):lt(p))
end

-- multinomial(probs, num_samples, replacement = false): 1-based indices of
-- categories drawn with the (unnormalised) weights of each row of probs
-- (1 or 2 dims). With replacement: inverse CDF, a binary search of uniform
-- draws in the cumulative weights; without: the num_samples largest
-- p / E (E exponential), the method PyTorch uses.
function M.multinomial(probs, ...)
  A.float_tensor("multinomial", probs, "probs")
  local o = A.parse("multinomial", 2, {"num_samples", "replacement"},
                    {num_samples = "integer", replacement = "boolean"}, ...)
  local k = o.num_samples
  if core._host_read then core._host_read("multinomial") end -- (a graph break under its own name)
  if k == nil then fail("multinomial", "num_samples is required") end
  if probs:dim() < 1 or probs:dim() > 2 then
    fail("multinomial", "probs must have 1 or 2 dims, got shape %s", A.shape_str(probs))
  end
  local n = probs:size(-1)
  if k < 1 then fail("multinomial", "num_samples must be >= 1, got %d", k) end
  if n == 0 then fail("multinomial", "probs has no categories (shape %s)", A.shape_str(probs)) end
  local p = probs:detach():to(probs.dtype == "float64" and "float64" or "float32")
  local rows = p:dim() == 1 and p:reshape({1, n}) or p
  if rows:size(1) == 0 then return core.zeros({0, k}, {dtype = "int64", device = p.device}) end
  -- rows - rows is NaN at every NaN and infinity
  if (rows - rows):ne(0):sum():item() > 0 or rows:min():item() < 0 then
    fail("multinomial", "probs must be finite and >= 0")
  end
  local positive = rows:gt(0):sum(2)
  if positive:min():item() == 0 then fail("multinomial", "every row of probs must have a positive sum") end
  local r = rows:size(1)
  local idx
  if o.replacement then
    local cdf = rows:cumsum(2)
    cdf = cdf / cdf:narrow(2, n, 1) -- the last is exactly 1, above every draw
    local u = core.rand({r, k}, {dtype = cdf.dtype, device = p.device})
    idx = (order.count_before(cdf, u, true) + 1):clamp(nil, n)
  else
    if k > n or positive:min():item() < k then
      fail("multinomial", "cannot draw %d samples without replacement from %d categories (%d with a positive " ..
           "probability)", k, n, positive:min():item())
    end
    local e = -(1 - core.rand(rows.shape, {dtype = rows.dtype, device = p.device})):log()
    -- categories of probability 0 stay below every other key
    local keys = core.where(rows:gt(0), rows / e, -1)
    local _, top = keys:topk(k, 2)
    idx = top
  end
  return probs:dim() == 1 and idx:reshape({k}) or idx
end

return M
