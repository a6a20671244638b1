-- needle.functional.conv_nd: conv1d, conv3d, conv_transpose1d, max_pool1d,
-- avg_pool1d and adaptive_max_pool2d of nd.F, as torch.nn.functional's.
--
-- None has a kernel of its own: each is written with the 2-d C ops
-- (conv2d, conv_transpose2d, max_pool2d, avg_pool2d) and views, so
-- gradients, gradients of gradients and OpenCL come from those ops.
--   * the 1-d forms insert a unit height: (N, C, L) -> (N, C, 1, L), a
--     (out, in/groups, k) weight -> (out, in/groups, 1, k); same cost as the
--     2-d op on that shape.
--   * conv3d unfolds the depth: the kd depth slices each output depth reads
--     (a strided view per kernel depth) are stacked as channels, and one
--     conv2d over the N * D_out depth positions does the rest. The
--     multiply-adds are those of a direct 3-d convolution; the price is a
--     copy of the input kd / stride_d times over (the unfolded depth) and
--     a copy of the output back to (N, C, D, H, W).
--   * adaptive_max_pool2d is max_pool2d where the windows are equal
--     (H % oh == 0 and W % ow == 0); otherwise one index_select gathers
--     every window (padded to the largest by repeating its last row and
--     column, which cannot change a maximum or which one is first) and a max
--     over the last dim picks it, so ties go to the first maximum in
--     row-major order, as PyTorch's kernel.
local core = require "needle.core"
local options = require "needle.options"
local A = require "needle.functional.spatial_args"

local M = {}

local fail, shape_str, show = A.fail, A.shape_str, A.show

local SPATIAL = {[1] = "L", [3] = "D, H, W"}

local CONV = {stride = "integer|table", padding = "integer|table|string", dilation = "integer|table",
              groups = "integer"}
local CONV_T = {stride = "integer|table", padding = "integer|table", output_padding = "integer|table",
                dilation = "integer|table", groups = "integer"}

-- The checked arguments of a convolution with n spatial dims:
-- {x = batched input, w, b, unbatched, groups, stride, dilation, kernel,
--  pads = {{lo, hi} per spatial dim}, output_padding (transposed)}
local function conv_args(op, n, x, w, b, opts, transposed)
  if opts == nil and type(b) == "table" and not core.is_tensor(b) then b, opts = nil, b end
  A.tensor(op, x)
  A.tensor(op, w, "weight")
  opts = options.check(op, opts, transposed and CONV_T or CONV)
  local sp = SPATIAL[n]
  if x:dim() ~= n + 2 and x:dim() ~= n + 1 then
    fail(op, "expected input of shape (N, C, %s) or (C, %s), got %s", sp, sp, shape_str(x))
  end
  if w:dim() ~= n + 2 then
    fail(op, "expected weight of shape (%s, k%s) with %d kernel dim%s, got %s",
         transposed and "in_channels, out_channels/groups" or "out_channels, in_channels/groups",
         n == 1 and "" or "d, kh, kw", n, n == 1 and "" or "s", shape_str(w))
  end
  A.float(op, x)
  A.same_kind(op, x, {half = true}, w, "weight", b, "bias")
  local c = {unbatched = x:dim() == n + 1, w = w, b = b}
  local input_shape = shape_str(x)
  if c.unbatched then x = x:unsqueeze(1) end
  c.x = x
  local groups = opts.groups or 1
  if groups < 1 then fail(op, "groups must be a positive integer, got %d", groups) end
  c.groups = groups
  local C, out_channels = x:size(2), nil
  if transposed then
    if C ~= w:size(1) then
      fail(op, "input has %d channels but weight expects %d (weight shape %s is (in_channels, out_channels/groups, k...))",
           C, w:size(1), shape_str(w))
    end
    if C % groups ~= 0 then fail(op, "in_channels (%d) must be divisible by groups (%d)", C, groups) end
    out_channels = w:size(2) * groups
  else
    out_channels = w:size(1)
    if out_channels % groups ~= 0 then
      fail(op, "out_channels (%d, weight shape %s) must be divisible by groups (%d)", out_channels, shape_str(w), groups)
    end
    if C ~= w:size(2) * groups then
      fail(op, "input has %d channels but weight expects %d (weight shape %s, groups %d)", C, w:size(2) * groups,
           shape_str(w), groups)
    end
  end
  if b ~= nil and (b:dim() ~= 1 or b:size(1) ~= out_channels) then
    fail(op, "bias must have shape {%d} (out_channels), got %s", out_channels, shape_str(b))
  end
  c.stride = A.ints(op, "stride", opts.stride or 1, n, 1)
  c.dilation = A.ints(op, "dilation", opts.dilation or 1, n, 1)
  c.kernel = {}
  for i = 1, n do
    c.kernel[i] = w:size(2 + i)
    if c.kernel[i] < 1 then fail(op, "weight %s has an empty kernel", shape_str(w)) end
  end
  local padding = opts.padding or 0
  if padding == "valid" then padding = 0 end
  c.pads = {}
  if padding == "same" then
    for i = 1, n do
      if c.stride[i] ~= 1 then
        fail(op, "padding='same' is not supported for strided convolutions (stride %s)", show(c.stride))
      end
    end
    -- total d (k - 1) per dim; an odd total puts the extra on the end, as PyTorch
    for i = 1, n do
      local total = c.dilation[i] * (c.kernel[i] - 1)
      c.pads[i] = {total // 2, total - total // 2}
    end
  elseif type(padding) == "string" then
    fail(op, "padding must be 'valid', 'same', an integer or a list of %d, got '%s'", n, padding)
  else
    local p = A.ints(op, "padding", padding, n, 0)
    for i = 1, n do c.pads[i] = {p[i], p[i]} end
  end
  if transposed then
    c.output_padding = A.ints(op, "output_padding", opts.output_padding or 0, n, 0)
    for i = 1, n do
      if c.output_padding[i] >= math.max(c.stride[i], c.dilation[i]) then
        fail(op, "output_padding %s must be smaller than stride %s or dilation %s", show(c.output_padding),
             show(c.stride), show(c.dilation))
      end
      local len = (x:size(2 + i) - 1) * c.stride[i] - 2 * c.pads[i][1] + c.dilation[i] * (c.kernel[i] - 1)
                  + c.output_padding[i] + 1
      if len < 1 then
        fail(op, "the output would be empty (size %d in spatial dim %d) for input %s, weight %s and padding %s",
             len, i, input_shape, shape_str(w), show(opts.padding or 0))
      end
    end
  else
    for i = 1, n do
      local padded = x:size(2 + i) + c.pads[i][1] + c.pads[i][2]
      local extent = c.dilation[i] * (c.kernel[i] - 1) + 1
      if padded < extent then
        fail(op, "kernel extent %d (size %d, dilation %d) is larger than the padded input (%d) in spatial dim %d " ..
             "(input shape %s, weight %s, padding %s)", extent, c.kernel[i], c.dilation[i], padded, i, input_shape,
             shape_str(w), show(opts.padding or 0))
      end
    end
  end
  return c
end

-- conv2d pads both sides of a dim alike: pads x explicitly where the two
-- differ (padding='same' with an even extent) and, with `first`, along the
-- first spatial dim (conv3d's depth, which is not conv2d's). Returns x and
-- the paddings left to conv2d.
local function pre_pad(x, pads, first)
  local list, rest, any = {}, {}, false
  for i = #pads, 1, -1 do -- x:pad's list runs from the last dim
    local lo, hi = pads[i][1], pads[i][2]
    if lo ~= hi or (first and i == 1) then
      list[#list + 1], list[#list + 2] = lo, hi
      rest[i] = 0
      any = any or lo ~= 0 or hi ~= 0
    else
      list[#list + 1], list[#list + 2] = 0, 0
      rest[i] = lo
    end
  end
  if any then x = x:pad(list) end
  return x, rest
end

-- conv1d(x (N, C, L) or (C, L), weight (out, C/groups, k), bias,
--        {stride=1, padding=0 | "valid" | "same", dilation=1, groups=1})
function M.conv1d(x, w, b, opts)
  local c = conv_args("conv1d", 1, x, w, b, opts, false)
  local xp, p = pre_pad(c.x, c.pads, false)
  local y = core.conv2d(xp:unsqueeze(3), c.w:unsqueeze(3), c.b, {stride = {1, c.stride[1]}, padding = {0, p[1]},
                        dilation = {1, c.dilation[1]}, groups = c.groups}):squeeze(3)
  if c.unbatched then y = y:squeeze(1) end
  return y
end

-- conv_transpose1d(x (N, C, L) or (C, L), weight (C, out/groups, k), bias,
--                  {stride=1, padding=0, output_padding=0, groups=1, dilation=1})
function M.conv_transpose1d(x, w, b, opts)
  local c = conv_args("conv_transpose1d", 1, x, w, b, opts, true)
  local y = core.conv_transpose2d(c.x:unsqueeze(3), c.w:unsqueeze(3), c.b, {
    stride = {1, c.stride[1]}, padding = {0, c.pads[1][1]}, output_padding = {0, c.output_padding[1]},
    dilation = {1, c.dilation[1]}, groups = c.groups}):squeeze(3)
  if c.unbatched then y = y:squeeze(1) end
  return y
end

-- conv3d(x (N, C, D, H, W) or (C, D, H, W), weight (out, C/groups, kd, kh, kw),
--        bias, {stride=, padding=, dilation=, groups=}): see the top of the file
function M.conv3d(x, w, b, opts)
  local c = conv_args("conv3d", 3, x, w, b, opts, false)
  local xp, p = pre_pad(c.x, c.pads, true)
  local N, C, D, H, W = xp:size(1), xp:size(2), xp:size(3), xp:size(4), xp:size(5)
  local O, Cg, kd, kh, kw = c.w:size(1), c.w:size(2), c.kernel[1], c.kernel[2], c.kernel[3]
  local g, sd, dd = c.groups, c.stride[1], c.dilation[1]
  local Do = (D - dd * (kd - 1) - 1) // sd + 1
  -- (N, C, kd, Do, H, W): slice j holds the input depths d_out * sd + j * dd
  local cols
  if kd == 1 and sd == 1 then
    cols = xp:unsqueeze(3)
  else
    local slices = {}
    for j = 0, kd - 1 do
      local first = j * dd + 1
      slices[j + 1] = xp[{":", ":", {first, first + (Do - 1) * sd, sd}}]
    end
    cols = core.stack(slices, 3)
  end
  -- channels ordered (group, kernel depth, channel in group), as the weight
  -- (O, Cg, kd, kh, kw) becomes (O, kd * Cg, kh, kw) within each group
  cols = cols:reshape({N, g, Cg, kd, Do, H, W}):permute({1, 5, 2, 4, 3, 6, 7}):reshape({N * Do, g * kd * Cg, H, W})
  local w2 = c.w:permute({1, 3, 2, 4, 5}):reshape({O, kd * Cg, kh, kw})
  local y = core.conv2d(cols, w2, c.b, {stride = {c.stride[2], c.stride[3]}, padding = {p[2], p[3]},
                                        dilation = {c.dilation[2], c.dilation[3]}, groups = g})
  y = y:reshape({N, Do, O, y:size(3), y:size(4)}):permute({1, 3, 2, 4, 5}):contiguous()
  if c.unbatched then y = y:squeeze(1) end
  return y
end

-- pooling -------------------------------------------------------------------------

-- PyTorch's pooling_output_shape: floor (or ceil) division, and with
-- ceil_mode no window that starts in the right padding
local function pool_len(L, k, p, s, d, ceil)
  local out = (L + 2 * p - d * (k - 1) - 1 + (ceil and s - 1 or 0)) // s + 1
  if ceil and (out - 1) * s >= L + p then out = out - 1 end
  return out
end

local MAX1 = {stride = "integer|table", padding = "integer|table", dilation = "integer|table",
              ceil_mode = "boolean", return_indices = "boolean"}
local AVG1 = {stride = "integer|table", padding = "integer|table", ceil_mode = "boolean",
              count_include_pad = "boolean"}

-- the checked options of a 1-d pool: opts, k, stride, padding, dilation
local function pool1d_args(op, x, kernel_size, opts, spec)
  A.tensor(op, x)
  opts = options.check(op, opts, spec)
  if x:dim() ~= 2 and x:dim() ~= 3 then
    fail(op, "expected input of shape (N, C, L) or (C, L), got %s", shape_str(x))
  end
  A.float(op, x)
  if kernel_size == nil then fail(op, "kernel_size is required") end
  local k = A.ints(op, "kernel_size", kernel_size, 1, 1)[1]
  local s = opts.stride ~= nil and A.ints(op, "stride", opts.stride, 1, 1)[1] or k
  local p = A.ints(op, "padding", opts.padding or 0, 1, 0)[1]
  local d = A.ints(op, "dilation", opts.dilation or 1, 1, 1)[1]
  if p > k // 2 then fail(op, "padding %d must be at most half of kernel_size %d", p, k) end
  local L = x:size(x:dim())
  local out = pool_len(L, k, p, s, d, opts.ceil_mode == true)
  if out < 1 then
    fail(op, "input %s is too short for kernel_size %d (dilation %d, padding %d): the output would have length %d",
         shape_str(x), k, d, p, out)
  end
  return opts, k, s, p, d
end

-- max_pool1d(x (N, C, L) or (C, L), kernel_size, {stride=kernel_size,
-- padding=0, dilation=1, ceil_mode=false, return_indices=false}) -> out[,
-- indices (int64, 1-based positions along L)]
function M.max_pool1d(x, kernel_size, opts)
  local o, k, s, p, d = pool1d_args("max_pool1d", x, kernel_size, opts, MAX1)
  local y, ix = core.max_pool2d(x:unsqueeze(-2), {1, k}, {stride = {1, s}, padding = {0, p}, dilation = {1, d},
                                ceil_mode = o.ceil_mode == true, return_indices = o.return_indices == true})
  if o.return_indices then return y:squeeze(-2), ix:squeeze(-2) end
  return y:squeeze(-2)
end

-- avg_pool1d(x, kernel_size, {stride=kernel_size, padding=0, ceil_mode=false,
-- count_include_pad=true})
function M.avg_pool1d(x, kernel_size, opts)
  local o, k, s, p = pool1d_args("avg_pool1d", x, kernel_size, opts, AVG1)
  return core.avg_pool2d(x:unsqueeze(-2), {1, k}, {stride = {1, s}, padding = {0, p},
    ceil_mode = o.ceil_mode == true, count_include_pad = o.count_include_pad ~= false}):squeeze(-2)
end

-- window i of n over a dim of size `size`: [floor(i size / n), ceil((i + 1) size / n)), 0-based
local function window(i, size, n)
  return (i * size) // n, ((i + 1) * size + n - 1) // n
end

-- adaptive_max_pool2d(x (N, C, H, W) or (C, H, W), output_size (an int or
-- {oh, ow}), {return_indices=false} (or the boolean)) -> out[, indices
-- (int64, 1-based flat positions within each H x W plane)]
function M.adaptive_max_pool2d(x, output_size, opts)
  local op = "adaptive_max_pool2d"
  if type(opts) == "boolean" then opts = {return_indices = opts} end
  A.tensor(op, x)
  opts = options.check(op, opts, {return_indices = "boolean"})
  if x:dim() ~= 3 and x:dim() ~= 4 then
    fail(op, "expected input of shape (N, C, H, W) or (C, H, W), got %s", shape_str(x))
  end
  A.float(op, x)
  if output_size == nil then fail(op, "output_size is required") end
  local out_size = A.ints(op, "output_size", output_size, 2, 1)
  local unbatched = x:dim() == 3
  if unbatched then x = x:unsqueeze(1) end
  local N, C, H, W = x:size(1), x:size(2), x:size(3), x:size(4)
  if H == 0 or W == 0 then fail(op, "input %s has an empty plane", shape_str(x)) end
  local oh, ow = out_size[1], out_size[2]
  local y, ix
  if H % oh == 0 and W % ow == 0 then
    local k = {H // oh, W // ow}
    y, ix = core.max_pool2d(x, k, {stride = k, return_indices = true})
  else
    local kh, kw = 0, 0
    for i = 0, oh - 1 do local a, b = window(i, H, oh); kh = math.max(kh, b - a) end
    for j = 0, ow - 1 do local a, b = window(j, W, ow); kw = math.max(kw, b - a) end
    local flat = {}
    for i = 0, oh - 1 do
      local r0, r1 = window(i, H, oh)
      for j = 0, ow - 1 do
        local c0, c1 = window(j, W, ow)
        for a = 0, kh - 1 do
          local r = math.min(r0 + a, r1 - 1)
          for b = 0, kw - 1 do flat[#flat + 1] = r * W + math.min(c0 + b, c1 - 1) + 1 end
        end
      end
    end
    local K = kh * kw
    local where = core.tensor(flat, {dtype = "int64", device = x.device})
    local windows = x:reshape({N, C, H * W}):index_select(3, where):reshape({N, C, oh, ow, K})
    local k
    y, k = windows:max(5)
    if opts.return_indices then
      ix = where:reshape({1, 1, oh, ow, K}):expand({N, C, oh, ow, K}):gather(5, k:unsqueeze(5)):squeeze(5)
    end
  end
  if unbatched then
    y = y:squeeze(1)
    if ix ~= nil then ix = ix:squeeze(1) end
  end
  if opts.return_indices then return y, ix end
  return y
end

return M
