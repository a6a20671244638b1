-- needle.tensor_ops.shape: roll, meshgrid, tolist (internal;
-- docs/tensor.md).
local core = require "needle.core"
local A = require "needle.tensor_ops.args"

local fail = A.fail
local M = {}

-- roll(x, shifts, dims): elements shifted along each dim, wrapping around;
-- without dims, along the flattened tensor (the shape is kept). Two
-- narrows and a cat per dim.
function M.roll(x, ...)
  A.tensor("roll", x)
  local o = A.parse("roll", 2, {"shifts", "dims"}, {shifts = "integer|table", dims = "integer|table"}, ...)
  if o.shifts == nil then fail("roll", "shifts is required") end
  local shifts = type(o.shifts) == "table" and o.shifts or {o.shifts}
  if o.dims == nil then
    if #shifts ~= 1 then fail("roll", "without dims, shifts must be one number, got %d of them", #shifts) end
    if x:dim() == 0 then return x:clone() end
    return M.roll(x:reshape({-1}), shifts[1], 1):reshape(x.shape)
  end
  local dims = type(o.dims) == "table" and o.dims or {o.dims}
  if #shifts ~= #dims then
    fail("roll", "shifts and dims must have the same length, got %d and %d", #shifts, #dims)
  end
  local y = x
  for i, s in ipairs(shifts) do
    if math.tointeger(s) == nil then fail("roll", "shifts must be integers, got %s", A.got(s)) end
    local d = A.dim("roll", dims[i], x:dim())
    local n = x:dim() == 0 and 1 or x:size(d)
    local k = n > 0 and math.tointeger(s) % n or 0
    if k ~= 0 then y = core.cat({y:narrow(d, n - k + 1, k), y:narrow(d, 1, n - k)}, d) end
  end
  return rawequal(y, x) and x:clone() or y
end

-- meshgrid(a, b, ..., {indexing = "ij"}) or meshgrid({a, b, ...}, opts):
-- one result per input (0 or 1 dims each), every one of shape (#a, #b, ...)
-- ("ij") or (#b, #a, ...) ("xy"); expanded views, as PyTorch's
function M.meshgrid(...)
  local args = table.pack(...)
  local opts
  if args.n > 0 and A.is_options(args[args.n]) then
    opts = args[args.n]
    args.n = args.n - 1
  end
  local o = require("needle.options").check("meshgrid", opts, {indexing = "string"})
  local list = args
  if args.n == 1 and type(args[1]) == "table" and not core.is_tensor(args[1]) then
    list = table.pack(table.unpack(args[1])) -- the caller's list is left alone
  end
  if list.n == 0 then fail("meshgrid", "expected at least one tensor") end
  local indexing = o.indexing or "ij"
  if indexing ~= "ij" and indexing ~= "xy" then
    fail("meshgrid", "indexing must be 'ij' or 'xy', got %q", indexing)
  end
  local shape = {}
  for i = 1, list.n do
    local t = A.tensor("meshgrid", list[i], ("tensor %d"):format(i))
    if t:dim() > 1 then fail("meshgrid", "tensor %d must have 0 or 1 dims, got shape %s", i, A.shape_str(t)) end
    if t.dtype ~= list[1].dtype then
      fail("meshgrid", "expected one dtype, got %s (tensor 1) and %s (tensor %d)", list[1].dtype, t.dtype, i)
    end
    A.same_device("meshgrid", list[1], t)
    shape[i] = t:numel()
  end
  -- "xy": the first two inputs swap their dims (Cartesian indexing)
  local at = {}
  for i = 1, list.n do at[i] = i end
  if indexing == "xy" and list.n >= 2 then
    at[1], at[2] = 2, 1
    shape[1], shape[2] = shape[2], shape[1]
  end
  local out = {}
  for i = 1, list.n do
    local view = {}
    for j = 1, list.n do view[j] = 1 end
    view[at[i]] = shape[at[i]]
    out[i] = list[i]:reshape(view):expand(shape)
  end
  return table.unpack(out, 1, list.n)
end

-- x:tolist(): nested Lua tables (a number for a 0-dim tensor, booleans
-- for bool), as x:totable()
function M.tolist(x, ...)
  A.tensor("tolist", x)
  A.parse("tolist", 2, {}, {}, ...)
  if core._host_read then core._host_read("tolist") end -- (a graph break under the name called)
  return x:totable()
end

return M
