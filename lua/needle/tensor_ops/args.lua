-- needle.tensor_ops.args: the argument checks the tensor ops share (internal).
--
-- PyTorch's arguments may be given by position or by name, so every op here
-- takes both: nd.norm(x, 2, 1, true) and nd.norm(x, {p = 2, dim = 1,
-- keepdim = true}) (a trailing table without list entries is the options
-- table). Every error is "needle.<op>: ..." at the user's line
-- (needle.errors.fail picks the innermost frame outside the package).
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local fail = errors.fail
M.fail = fail
M.shape_str = errors.shape_str
M.got = options.got

local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}
local INT = {int64 = true, int32 = true, uint8 = true}

function M.is_float(x) return FLOAT[x.dtype] == true end
function M.is_int(x) return INT[x.dtype] == true end

-- x, or an error naming `what` (default "input")
function M.tensor(who, x, what)
  if not core.is_tensor(x) then fail(who, "%s must be a tensor, got %s", what or "input", options.got(x)) end
  return x
end

function M.float_tensor(who, x, what)
  M.tensor(who, x, what)
  if not FLOAT[x.dtype] then
    fail(who, "expected a floating-point %s (float32, float64, float16 or bfloat16), got %s", what or "input", x.dtype)
  end
  return x
end

-- a and b on one device, else the same words as the C ops use
function M.same_device(who, a, b)
  if a.device ~= b.device then
    fail(who, "expected all tensors on one device, got %s and %s (move one with :to(device))", a.device, b.device)
  end
end

local function is_options(v)
  return type(v) == "table" and not core.is_tensor(v) and v[1] == nil
end
M.is_options = is_options

-- parse(who, names, spec, ...) -> a table of the arguments by name.
-- `...` are the arguments after the tensor(s) the op takes first: up to
-- #names positional ones (names[i] for the i-th), then an optional options
-- table. spec maps every name to its types (needle.options' words);
-- `first` is the position of names[1] in the user's call, for messages.
function M.parse(who, first, names, spec, ...)
  local n = select("#", ...)
  local args = table.pack(...)
  local opts
  if n > 0 and is_options(args[n]) then
    opts = args[n]
    n = n - 1
  end
  while n > 0 and args[n] == nil do n = n - 1 end
  if n > #names then
    fail(who, "takes at most %d argument%s after the tensor (%s) and an options table, got %d",
         #names, #names == 1 and "" or "s", table.concat(names, ", "), n)
  end
  local o = {}
  for k, v in pairs(options.check(who, opts, spec)) do o[k] = v end
  for i = 1, n do
    local name, v = names[i], args[i]
    if v ~= nil then
      if o[name] ~= nil then
        fail(who, "argument '%s' given twice (at position %d and in the options table)", name, first + i - 1)
      end
      if not options.fits(v, spec[name]) then
        fail(who, "argument '%s' (position %d) must be %s, got %s", name, first + i - 1,
             options.describe_types(spec[name]), options.got(v))
      end
      -- 2.0 where only an integer fits is the integer, as options.check does
      if math.type(v) == "float" and not options.fits(v, (spec[name]:gsub("integer", ""))) then
        v = math.tointeger(v)
      end
      o[name] = v
    end
  end
  return o
end

-- d as a positive 1-based dim of a tensor with ndim dims (a 0-dim tensor
-- takes 1 and -1, as PyTorch's takes 0 and -1); the C ops' words
function M.dim(who, d, ndim)
  local i = math.tointeger(d)
  if i == nil then fail(who, "dim must be an integer, got %s", options.got(d)) end
  if i == 0 then fail(who, "dim 0 is invalid (dims are 1-based; -1 is the last)") end
  local n = math.max(ndim, 1)
  if i > n or i < -n then
    fail(who, "dim %d out of range for a tensor with %d dims (expected 1..%d or -%d..-1)", i, ndim, n, n)
  end
  return i < 0 and i + n + 1 or i
end

-- dims (an integer, a list of them, or nil for all) as a sorted list of
-- positive dims without repeats
function M.dims(who, dims, ndim)
  local out = {}
  if dims == nil then
    for d = 1, ndim do out[d] = d end
    return out
  end
  if type(dims) ~= "table" then dims = {dims} end
  local seen = {}
  for _, d in ipairs(dims) do
    local p = M.dim(who, d, ndim)
    if seen[p] then fail(who, "dim %d appears more than once", d) end
    seen[p] = true
    out[#out + 1] = p
  end
  table.sort(out)
  return out
end

-- x's shape without the dims in the sorted list `dims` (keepdim = false)
function M.reduced_shape(shape, dims)
  local drop, out = {}, {}
  for _, d in ipairs(dims) do drop[d] = true end
  for i, s in ipairs(shape) do
    if not drop[i] then out[#out + 1] = s end
  end
  return out
end

-- the broadcast of two shapes, or an error naming both
function M.broadcast_shapes(who, a, b)
  local n = math.max(#a, #b)
  local out = {}
  for i = 1, n do
    local sa, sb = a[#a - n + i] or 1, b[#b - n + i] or 1
    if sa ~= sb and sa ~= 1 and sb ~= 1 then
      fail(who, "shapes %s and %s cannot be broadcast together (size %d ~= %d at dim %d)",
           errors.shape_str(a), errors.shape_str(b), sa, sb, i)
    end
    out[i] = sa == 1 and sb or sa
  end
  return out
end

-- a 1-based int64 index tensor 1..n on x's device
function M.positions(n, device)
  return core.arange(1, n + 1, {dtype = "int64", device = device})
end

return M
