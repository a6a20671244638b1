-- needle.functional.spatial_args: the argument checks shared by the spatial
-- functions of nd.F (conv1d/3d, the 1-d pools, the per-sample norms,
-- interpolate, pad) and their modules (internal).
--
-- Every check raises "needle.<who>: ..." at the user's line (errors.fail),
-- however deep in the package it runs, so nn.Conv1d's forward and
-- F.conv1d report a bad input the same way.
local core = require "needle.core"
local errors = require "needle.errors"

local M = {}

M.fail = errors.fail -- (who, fmt, ...)
M.shape_str = errors.shape_str

-- "{1,2}" for a list, tostring for the rest (a value in an error message)
function M.show(v)
  if type(v) == "table" and not core.is_tensor(v) then
    local parts = {}
    for i = 1, #v do parts[i] = tostring(v[i]) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if core.is_tensor(v) then return "a tensor of shape " .. errors.shape_str(v) end
  return tostring(v)
end

function M.tensor(who, x, what)
  if not core.is_tensor(x) then errors.fail(who, "%s must be a tensor, got %s", what or "input", type(x)) end
end

-- the arguments a public function received past its last one (`first` is
-- the position of the first of them): each must be nil, else an error naming
-- the accepted form (usage), as nd.save's
function M.no_extra(who, usage, first, ...)
  return require("needle.options").no_extra(who, usage, first - 1, ...)
end

-- the dtypes the C kernels compute in (conv2d, the pools, layer_norm)
function M.float(who, x)
  if x.dtype ~= "float32" and x.dtype ~= "float64" then
    errors.fail(who, "expected a float32 or float64 input, got %s", x.dtype)
  end
end

-- an integer (2.0 counts) or nil
local function int(v)
  if type(v) ~= "number" then return nil end
  return math.tointeger(v)
end
M.int = int

-- v: an integer or a list of n integers, each >= min -> a list of n
-- integers (PyTorch's int-or-tuple arguments)
function M.ints(who, what, v, n, min)
  local out
  if int(v) ~= nil then
    out = {}
    for i = 1, n do out[i] = int(v) end
  elseif type(v) == "table" and not core.is_tensor(v) and #v == n then
    out = {}
    for i = 1, n do
      out[i] = int(v[i])
      if out[i] == nil then out = nil; break end
    end
  end
  if out ~= nil then
    for i = 1, n do
      if out[i] < min then out = nil; break end
    end
  end
  if out == nil then
    errors.fail(who, "%s must be an integer >= %d%s, got %s", what, min,
                n == 1 and " (or a list of one)" or (" or a list of %d of them"):format(n), M.show(v))
  end
  return out
end

local HALF = {float16 = true, bfloat16 = true}

-- weight, bias, ... (tensors or nil) on x's device with x's dtype; with
-- {half = true} first, float16/bfloat16 ones pass too (storage: the
-- elementwise ops that use them compute in float32, as everywhere)
function M.same_kind(who, x, ...)
  local args = table.pack(...) -- pairs of (tensor or nil, its name)
  local half = false
  if type(args[1]) == "table" and not core.is_tensor(args[1]) then
    half = args[1].half == true
    args = table.pack(select(2, ...))
  end
  for i = 1, args.n, 2 do
    local t, what = args[i], args[i + 1]
    if t ~= nil then
      M.tensor(who, t, what)
      if t.dtype ~= x.dtype and not (half and HALF[t.dtype]) then
        errors.fail(who, "input (%s) and %s (%s) must have the same dtype", x.dtype, what, t.dtype)
      end
      if t.device ~= x.device then
        errors.fail(who, "input (on %s) and %s (on %s) must be on the same device", x.device, what, t.device)
      end
    end
  end
end

-- x with a unit dim inserted at d for each d in dims (in order)
function M.unsqueeze(x, dims)
  for _, d in ipairs(dims) do x = x:unsqueeze(d) end
  return x
end

-- x:index_select(dim, idx) for a Lua list of 1-based indices (a map built
-- from sizes, never from the data), the index made on x's device
function M.select(x, dim, idx)
  return x:index_select(dim, core.tensor(idx, {dtype = "int64", device = x.device}))
end

return M
