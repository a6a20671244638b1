-- needle.tensor_ops.select: nonzero, masked_select, unique, bincount,
-- repeat_interleave (internal; docs/tensor.md).
--
-- Their output size depends on the data, so each reads a count back from
-- the device (one sync), and then builds its indices on the device with
-- cumsum and scatter rather than a loop over the elements in Lua.
-- Indices they return are 1-based int64, as argmax's and sort's.
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

local function int64(shape, device) return core.zeros(shape, {dtype = "int64", device = device}) end

-- the 1-based positions of the true elements of a 1-D bool mask, in
-- order, and their count: element i goes to slot rank(i) (its cumsum);
-- the false ones all go to one spare slot, dropped
local function true_positions(mask)
  local n, device = mask:numel(), mask.device
  if n == 0 then return int64({0}, device), 0 end
  local rank = mask:cumsum(1)
  local count = rank[n]:item()
  if count == 0 then return int64({0}, device), 0 end
  local slot = core.where(mask, rank, count + 1)
  return int64({count + 1}, device):scatter(1, slot, A.positions(n, device)):narrow(1, 1, count), count
end

-- nonzero(x, {as_tuple = false}): the 1-based indices of the nonzero
-- elements, one row each (count, ndim); as_tuple: one 1-D tensor per dim,
-- as several results
function M.nonzero(x, ...)
  A.tensor("nonzero", x)
  local o = A.parse("nonzero", 2, {}, {as_tuple = "boolean"}, ...)
  if core._host_read then core._host_read("nonzero") end -- (a graph break under its own name)
  local shape = x:dim() == 0 and {1} or x.shape
  local flat, count = true_positions(x:ne(0):reshape({-1}))
  local cols = {}
  for d = 1, #shape do
    if #shape == 1 then
      cols[d] = flat
    else
      -- dim d's index of every element, then those of the nonzero ones
      local view = {}
      for i = 1, #shape do view[i] = i == d and shape[d] or 1 end
      cols[d] = A.positions(shape[d], x.device):reshape(view):expand(shape):reshape({-1}):index_select(1, flat)
    end
  end
  if o.as_tuple then return table.unpack(cols) end
  if x:dim() == 0 then return int64({count, 0}, x.device) end
  return core.stack(cols, 2)
end

-- masked_select(x, mask): the elements of x where mask (bool, broadcast
-- with x) is true, as a 1-D tensor; differentiable (index_select)
function M.masked_select(x, mask, ...)
  A.tensor("masked_select", x)
  A.tensor("masked_select", mask, "mask")
  A.parse("masked_select", 3, {}, {}, ...)
  if core._host_read then core._host_read("masked_select") end -- (a graph break under its own name)
  if mask.dtype ~= "bool" then fail("masked_select", "mask must be a bool tensor, got %s", mask.dtype) end
  A.same_device("masked_select", x, mask)
  local shape = A.broadcast_shapes("masked_select", x.shape, mask.shape)
  local idx = true_positions(mask:expand(shape):reshape({-1}))
  return x:expand(shape):reshape({-1}):index_select(1, idx)
end

-- v (1-D, n >= 1) sorted, the sorting permutation, and each sorted
-- element's group (1..G; equal neighbours share one, NaN never does)
local function group_sorted(v)
  local n = v:numel()
  local sorted, order = v:sort(1)
  local first = core.ones({1}, {dtype = "bool", device = v.device})
  local new = n == 1 and first or core.cat({first, sorted:narrow(1, 2, n - 1):ne(sorted:narrow(1, 1, n - 1))}, 1)
  return sorted, order, new:cumsum(1)
end

-- the group (1..G, in sorted order) of every element of v
local function ranks(v)
  local _, order, gid = group_sorted(v)
  return int64({v:numel()}, v.device):scatter(1, order, gid)
end

local UNIQUE = {sorted = "boolean", return_inverse = "boolean", return_counts = "boolean", dim = "integer"}

local function results(o, out, inverse, counts)
  if o.return_inverse and o.return_counts then return out, inverse, counts end
  if o.return_inverse then return out, inverse end
  if o.return_counts then return out, counts end
  return out
end

-- unique(x, sorted, return_inverse, return_counts, dim): the distinct
-- values (or slices along dim), sorted (with or without `sorted`: PyTorch
-- leaves the order unspecified without it); inverse: 1-based positions in
-- the output; counts: int64. Not differentiable, as PyTorch's.
function M.unique(x, ...)
  A.tensor("unique", x)
  local o = A.parse("unique", 2, {"sorted", "return_inverse", "return_counts", "dim"}, UNIQUE, ...)
  if core._host_read then core._host_read("unique") end -- (a graph break under its own name)
  x = x:detach()
  local dev = x.device
  if o.dim == nil then
    local n = x:numel()
    if n == 0 then
      return results(o, core.zeros({0}, {dtype = x.dtype, device = dev}), int64(x.shape, dev), int64({0}, dev))
    end
    local sorted, order, gid = group_sorted(x:reshape({-1}))
    local g = gid[n]:item()
    local out = core.zeros({g}, {dtype = x.dtype, device = dev}):scatter(1, gid, sorted)
    local inverse = int64({n}, dev):scatter(1, order, gid):reshape(x.shape)
    local counts = int64({g}, dev):scatter_add(1, gid, core.ones({n}, {dtype = "int64", device = dev}))
    return results(o, out, inverse, counts)
  end
  -- slices along dim: rank the rows of (n, rest) column by column, first
  -- column most significant (keys stay <= n after each re-ranking)
  local d = A.dim("unique", o.dim, x:dim())
  if x:dim() == 0 then fail("unique", "dim %d needs a tensor with at least 1 dim, got shape {}", o.dim) end
  local perm, back = {d}, {}
  for i = 1, x:dim() do if i ~= d then perm[#perm + 1] = i end end
  for i, p in ipairs(perm) do back[p] = i end
  local xm = x:permute(perm)
  local n = xm:size(1)
  if n == 0 then return results(o, x:clone(), int64({0}, dev), int64({0}, dev)) end
  local rows = xm:reshape({n, xm:numel() // n})
  local key = int64({n}, dev)
  for j = 1, rows:size(2) do
    key = ranks(key * (n + 1) + ranks(rows:select(2, j)))
  end
  local _, order, gid = group_sorted(key)
  local g = gid[n]:item()
  local rep = int64({g}, dev):scatter(1, gid, order) -- one row of each group
  local out = xm:index_select(1, rep):permute(back)
  local inverse = int64({n}, dev):scatter(1, order, gid)
  local counts = int64({g}, dev):scatter_add(1, gid, core.ones({n}, {dtype = "int64", device = dev}))
  return results(o, out, inverse, counts)
end

-- bincount(x, weights, minlength): how often each value occurs (or the sum
-- of its weights). Values are 1-based bins, as one_hot's classes: the count
-- of value v is element v, and the length is max(max(x), minlength).
function M.bincount(x, ...)
  A.tensor("bincount", x)
  local o = A.parse("bincount", 2, {"weights", "minlength"}, {weights = "tensor", minlength = "integer"}, ...)
  if not A.is_int(x) or x:dim() ~= 1 then
    fail("bincount", "expected a 1-dim integer tensor of bins, got a %s tensor of shape %s", x.dtype, A.shape_str(x))
  end
  local minlength = o.minlength or 0
  if minlength < 0 then fail("bincount", "minlength must be >= 0, got %d", minlength) end
  local n, bins = x:numel(), minlength
  if n > 0 then
    local lo = x:min():item()
    if lo < 1 then fail("bincount", "values must be >= 1 (bins are 1-based, as one_hot's classes), got %d", lo) end
    bins = math.max(bins, x:max():item())
  end
  local w = o.weights
  local dtype = "int64"
  if w ~= nil then
    if w:dim() ~= 1 or w:numel() ~= n then
      fail("bincount", "weights must be 1-dim with one weight per value (%d), got shape %s", n, A.shape_str(w))
    end
    A.same_device("bincount", x, w)
    -- as PyTorch: float32 weights give float32, any other dtype float64
    dtype = w.dtype == "float32" and "float32" or "float64"
    w = w:to(dtype)
  else
    w = core.ones({n}, {dtype = "int64", device = x.device})
  end
  return core.zeros({bins}, {dtype = dtype, device = x.device}):scatter_add(1, x:long(), w)
end

-- the 1-based positions 1..n repeated by the counts of r (int64, >= 0)
local function repeat_positions(r, total)
  local n, dev = r:numel(), r.device
  local starts = r:cumsum(1) - r + 1
  local marks = int64({total + 1}, dev):scatter_add(1, starts, core.ones({n}, {dtype = "int64", device = dev}))
  return marks:cumsum(1):narrow(1, 1, total)
end

-- repeat_interleave(x, repeats, dim): each slice of x along dim repeated;
-- repeats a number or an integer tensor (one count per slice); without dim
-- x is flattened first. repeat_interleave(r) alone: the 1-based indices
-- 1..#r, each repeated r[i] times (PyTorch's 0-based ones + 1).
function M.repeat_interleave(x, ...)
  A.tensor("repeat_interleave", x)
  local o = A.parse("repeat_interleave", 2, {"repeats", "dim"}, {repeats = "integer|tensor", dim = "integer"}, ...)
  local r = o.repeats
  if r == nil then
    if not A.is_int(x) or x:dim() > 1 then
      fail("repeat_interleave", "expected repeats, or a 1-dim integer tensor of repeats alone, got a %s tensor " ..
           "of shape %s", x.dtype, A.shape_str(x))
    end
    r, x = x, A.positions(x:numel(), x.device)
  end
  local d = 1
  if o.dim == nil then x = x:reshape({-1}) else d = A.dim("repeat_interleave", o.dim, x:dim()) end
  if x:dim() == 0 then x = x:reshape({1}) end
  local n = x:size(d)
  if core.is_tensor(r) then
    -- (counts from a tensor are values read on the host: a graph break under its own name)
    if core._host_read then core._host_read("repeat_interleave") end
    if not A.is_int(r) or r:dim() > 1 then
      fail("repeat_interleave", "repeats must be an integer tensor of at most 1 dim, got a %s tensor of shape %s",
           r.dtype, A.shape_str(r))
    end
    A.same_device("repeat_interleave", x, r)
    if r:numel() == 1 then
      r = r:reshape({}):item()
    elseif r:numel() ~= n then
      fail("repeat_interleave", "repeats has %d counts for %d slices along dim %d (shape %s)", r:numel(), n, d,
           A.shape_str(x))
    end
  end
  if type(r) == "number" then
    if r < 0 then fail("repeat_interleave", "repeats must be >= 0, got %d", r) end
    local idx = A.positions(n, x.device):reshape({n, 1}):expand({n, r}):reshape({-1})
    return x:index_select(d, idx)
  end
  r = r:long()
  if n > 0 and r:min():item() < 0 then
    fail("repeat_interleave", "repeats must be >= 0, got %d", r:min():item())
  end
  local total = n == 0 and 0 or r:sum():item()
  return x:index_select(d, repeat_positions(r, total))
end

return M
