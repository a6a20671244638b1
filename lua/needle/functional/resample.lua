-- needle.functional.resample: interpolate, pixel_shuffle and
-- pixel_unshuffle of nd.F, as torch.nn.functional's.
--
-- interpolate works one spatial dim at a time with index_select (whose
-- backward is index_add, so gradients and OpenCL come for free): nearest
-- picks one source index per output position, the linear modes blend two
-- with weights made from the sizes. The index maps and weights are computed
-- on the host from the sizes only, with PyTorch's formulas - for a float32
-- input in float32 arithmetic, as PyTorch's CPU kernels do, so that the
-- legacy 'nearest' rule floor(dst * scale) picks the same pixel where the
-- product lands next to an integer. The nearest modes' maps are float32 for
-- every dtype (PyTorch's are: compute_scales_value<float>, floorf); the
-- linear modes' weights are double for a float64 input. Bilinear = linear along H, then along W
-- (the same weights as the 2-d formula).
local core = require "needle.core"
local options = require "needle.options"
local A = require "needle.functional.spatial_args"

local M = {}

local fail, shape_str, show = A.fail, A.shape_str, A.show

-- mode -> the number of spatial dims it needs (0: any of 1..3)
local MODES = {nearest = 0, ["nearest-exact"] = 0, linear = 1, bilinear = 2, trilinear = 3}
local LAYOUT = {"(N, C, L)", "(N, C, H, W)", "(N, C, D, H, W)"}

local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end
local function exact(v) return v end

-- PyTorch's compute_scales_value: 1 / scale_factor when one was given (and
-- not recomputed), else in / out; R rounds to the kernel's precision
local function scales_value(R, scale, n_in, n_out)
  if scale ~= nil and scale > 0 then return R(1.0 / scale) end
  return R(n_in / n_out)
end

-- the 1-based source index of each output position (nearest_idx /
-- nearest_exact_idx of PyTorch's UpSample.h)
local function nearest_map(R, n_in, n_out, scale, exact_mode)
  local idx = {}
  local s = scales_value(R, scale, n_in, n_out)
  for o = 0, n_out - 1 do
    local src
    if not exact_mode and n_out == n_in then src = o
    elseif not exact_mode and n_out == 2 * n_in then src = o >> 1
    elseif exact_mode then src = math.floor(R((o + 0.5) * s))
    else src = math.floor(R(o * s)) end
    idx[o + 1] = math.min(src, n_in - 1) + 1
  end
  return idx
end

-- two 1-based source indices and their weights per output position
-- (compute_source_index_and_lambda of PyTorch's UpSample.h)
local function linear_map(R, n_in, n_out, scale, align_corners)
  local ratio
  if align_corners then ratio = n_out > 1 and R((n_in - 1) / (n_out - 1)) or 0
  else ratio = scales_value(R, scale, n_in, n_out) end
  local i0, i1, w0, w1 = {}, {}, {}, {}
  for o = 0, n_out - 1 do
    local src = align_corners and R(ratio * o) or math.max(R(ratio * (o + 0.5) - 0.5), 0)
    local a = math.min(math.floor(src), n_in - 1)
    local lambda = math.min(math.max(R(src - a), 0), 1)
    i0[o + 1], i1[o + 1] = a + 1, a + (a < n_in - 1 and 1 or 0) + 1
    w0[o + 1], w1[o + 1] = R(1 - lambda), lambda
  end
  return i0, i1, w0, w1
end

-- weights (a Lua list) shaped to broadcast along dim of x
local function along(x, dim, values)
  local shape = {}
  for d = 1, x:dim() do shape[d] = d == dim and #values or 1 end
  return core.tensor(values, {dtype = x.dtype, device = x.device}):reshape(shape)
end

local OPTS = {size = "integer|table", scale_factor = "number|table", mode = "string", align_corners = "boolean",
              recompute_scale_factor = "boolean", antialias = "boolean"}

-- interpolate(x (N, C, L | H, W | D, H, W), {size=, scale_factor=, mode =
-- "nearest", align_corners = false, recompute_scale_factor = false,
-- antialias = false}) or interpolate(x, size[, opts])
function M.interpolate(x, size, opts)
  local op = "interpolate"
  if opts == nil and type(size) == "table" and not core.is_tensor(size) and size[1] == nil then
    size, opts = nil, size
  end
  A.tensor(op, x)
  opts = options.check(op, opts, OPTS)
  if size ~= nil and opts.size ~= nil then fail(op, "size given twice (an argument and an option)") end
  size = size or opts.size
  local mode = opts.mode or "nearest"
  local need = MODES[mode]
  if need == nil then
    fail(op, "mode must be 'nearest', 'nearest-exact', 'linear', 'bilinear' or 'trilinear', got '%s'", mode)
  end
  local n = x:dim() - 2
  if n < 1 or n > 3 or (need ~= 0 and n ~= need) then
    if need ~= 0 then fail(op, "mode '%s' expects %d-D input %s, got %s", mode, need + 2, LAYOUT[need], shape_str(x)) end
    fail(op, "expected 3-D, 4-D or 5-D input (N, C, spatial...), got %s", shape_str(x))
  end
  if need == 0 and opts.align_corners ~= nil then
    fail(op, "align_corners can only be set with the interpolating modes: linear, bilinear, trilinear (mode '%s')", mode)
  end
  if need ~= 0 then A.float(op, x) end
  if opts.antialias then fail(op, "antialias = true is not supported") end
  local scale = opts.scale_factor
  if (size == nil) == (scale == nil) then
    fail(op, size == nil and "either size or scale_factor must be given" or "only one of size and scale_factor may be given")
  end
  local out, scales = {}, {}
  if size ~= nil then
    out = A.ints(op, "size", size, n, 1)
  else
    local s = scale
    if type(s) == "number" then s = {} for i = 1, n do s[i] = scale end end
    local ok = type(s) == "table" and #s == n
    for i = 1, ok and n or 0 do
      if type(s[i]) ~= "number" or not (s[i] > 0) or s[i] == math.huge then ok = false end
    end
    if not ok then fail(op, "scale_factor must be a number > 0 or a list of %d of them, got %s", n, show(scale)) end
    for i = 1, n do
      out[i] = math.floor(x:size(i + 2) * s[i])
      if not opts.recompute_scale_factor then scales[i] = s[i] end
    end
  end
  for i = 1, n do
    if x:size(i + 2) < 1 or out[i] < 1 then
      fail(op, "input and output sizes must be greater than 0, got input %s and output size %s", shape_str(x), show(out))
    end
  end
  local R = x.dtype == "float64" and exact or f32 -- (the linear modes' precision)
  local y = x
  for i = 1, n do
    local dim, n_in, n_out = i + 2, x:size(i + 2), out[i]
    if need == 0 then
      if n_out ~= n_in or mode == "nearest-exact" then
        -- (in float whatever the dtype: PyTorch's nearest kernels use
        -- compute_scales_value<float> and floorf for float64 too)
        y = A.select(y, dim, nearest_map(f32, n_in, n_out, scales[i], mode == "nearest-exact"))
      end
    elseif n_out ~= n_in then
      local i0, i1, w0, w1 = linear_map(R, n_in, n_out, scales[i], opts.align_corners == true)
      y = A.select(y, dim, i0) * along(y, dim, w0) + A.select(y, dim, i1) * along(y, dim, w1)
    end
  end
  if y == x then y = x * 1 end -- a new tensor, as PyTorch's
  return y
end

-- the checked factor of pixel_shuffle / pixel_unshuffle
local function factor(op, what, x, r)
  A.tensor(op, x)
  if A.int(r) == nil or A.int(r) < 1 then fail(op, "%s must be a positive integer, got %s", what, show(r)) end
  if x:dim() < 3 then fail(op, "expected input of shape (*, C, H, W), got %s", shape_str(x)) end
  return A.int(r)
end

-- x's leading dims (all but the last three), their product and the last three
local function split(x)
  local lead, B = {}, 1
  for d = 1, x:dim() - 3 do lead[d] = x:size(d); B = B * x:size(d) end
  return lead, B, x:size(-3), x:size(-2), x:size(-1)
end

local function with_lead(lead, ...)
  local shape = {}
  for i, s in ipairs(lead) do shape[i] = s end
  for _, s in ipairs({...}) do shape[#shape + 1] = s end
  return shape
end

-- pixel_shuffle(x (*, C r^2, H, W), r) -> (*, C, H r, W r)
function M.pixel_shuffle(x, upscale_factor)
  local op = "pixel_shuffle"
  local r = factor(op, "upscale_factor", x, upscale_factor)
  local lead, B, C, H, W = split(x)
  if C % (r * r) ~= 0 then
    fail(op, "the channel dim (%d) of input %s must be divisible by upscale_factor^2 (%d)", C, shape_str(x), r * r)
  end
  local c = C // (r * r)
  return x:reshape({B, c, r, r, H, W}):permute({1, 2, 5, 3, 6, 4}):reshape(with_lead(lead, c, H * r, W * r))
end

-- pixel_unshuffle(x (*, C, H r, W r), r) -> (*, C r^2, H, W)
function M.pixel_unshuffle(x, downscale_factor)
  local op = "pixel_unshuffle"
  local r = factor(op, "downscale_factor", x, downscale_factor)
  local lead, B, C, H, W = split(x)
  if H % r ~= 0 or W % r ~= 0 then
    fail(op, "the height and width (%d, %d) of input %s must be divisible by downscale_factor (%d)", H, W,
         shape_str(x), r)
  end
  local h, w = H // r, W // r
  return x:reshape({B, C, h, r, w, r}):permute({1, 2, 4, 6, 3, 5}):reshape(with_lead(lead, C * r * r, h, w))
end

return M
