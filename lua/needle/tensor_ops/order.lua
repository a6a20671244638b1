-- needle.tensor_ops.order: searchsorted (internal; docs/tensor.md).
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

-- For each value v (..., m), how many elements of the sorted last dim of
-- seq (..., n) (or of a 1-D seq) come before v: those < v, or <= v with
-- right. A binary search for all values at once, by binary lifting: the
-- count grows by 2^k while element count + 2^k still comes before v, for k
-- from high to low: log2(n) gathers, no division. A NaN value goes after
-- everything, as PyTorch's does (NaN sorts last).
function M.count_before(seq, v, right)
  local n = seq:size(-1)
  local flat = seq:dim() == 1 and v:dim() ~= 1
  local vv = flat and v:reshape({-1}) or v
  local count = core.zeros(vv.shape, {dtype = "int64", device = v.device})
  local step = 1
  while step * 2 <= n do step = step * 2 end
  local nan = A.is_float(vv) and vv:ne(vv) or nil
  while n > 0 and step >= 1 do
    local cand = count + step
    local s = seq:gather(-1, cand:clamp(nil, n))
    local before = right and s:le(vv) or s:lt(vv)
    if nan then before = before + nan end
    count = core.where(before * cand:le(n), cand, count)
    step = step // 2
  end
  return flat and count:reshape(v.shape) or count
end

local SEARCH = {right = "boolean", side = "string", sorter = "tensor|table", out_int32 = "boolean"}

-- searchsorted(sorted_sequence, values, {right, side, sorter, out_int32}):
-- the 1-based position at which each value would be inserted to keep the
-- sequence sorted (PyTorch's index + 1: 1..n+1, as table.insert's pos)
function M.searchsorted(seq, values, ...)
  A.tensor("searchsorted", seq, "sorted_sequence")
  local o = A.parse("searchsorted", 3, {}, SEARCH, ...)
  local scalar = type(values) == "number"
  if scalar then
    values = core.tensor(values, {dtype = seq.dtype, device = seq.device})
  else
    A.tensor("searchsorted", values, "values")
  end
  A.same_device("searchsorted", seq, values)
  if seq:dim() == 0 then fail("searchsorted", "sorted_sequence must have at least 1 dim, got shape {}") end
  if o.side ~= nil and o.side ~= "left" and o.side ~= "right" then
    fail("searchsorted", "side must be 'left' or 'right', got %q", o.side)
  end
  if o.side == "left" and o.right then
    fail("searchsorted", "side = 'left' and right = true contradict each other")
  end
  local right = o.right or o.side == "right"
  if seq:dim() > 1 then
    local ss, sv = seq.shape, values.shape
    local same = #ss == #sv
    for i = 1, #ss - 1 do same = same and ss[i] == sv[i] end
    if not same then
      fail("searchsorted", "sorted_sequence %s and values %s must have the same leading dims (or a 1-dim " ..
           "sorted_sequence)", A.shape_str(seq), A.shape_str(values))
    end
  end
  if o.sorter ~= nil then
    local sorter = o.sorter
    if not core.is_tensor(sorter) then sorter = core.tensor(sorter, {dtype = "int64", device = seq.device}) end
    local same = sorter:dim() == seq:dim()
    for i = 1, seq:dim() do same = same and sorter:size(i) == seq:size(i) end
    if not same or sorter.dtype ~= "int64" then
      fail("searchsorted", "sorter must be an int64 tensor of the sequence's shape %s, got a %s tensor of shape %s",
           A.shape_str(seq), sorter.dtype, A.shape_str(sorter))
    end
    seq = seq:gather(-1, sorter)
  end
  local pos = M.count_before(seq, values, right) + 1
  if o.out_int32 then pos = pos:int() end
  return pos
end

return M
