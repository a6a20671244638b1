-- needle.nn.conv: Conv2d, ConvTranspose2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d.
--
--   nd.nn.Conv2d(3, 16, 3, {stride = 1, padding = 1, dilation = 1, groups = 1, bias = true})
--   nd.nn.ConvTranspose2d(16, 3, 4, {stride = 2, padding = 1, output_padding = 0})
--   nd.nn.MaxPool2d(2), nd.nn.AvgPool2d(3, {stride = 2, padding = 1}), nd.nn.AdaptiveAvgPool2d({1, 1})
--
-- NCHW input (or unbatched CHW); sizes are integers or pairs {h, w}. Weights
-- have PyTorch's layouts - Conv2d (out, in/groups, kh, kw), ConvTranspose2d
-- (in, out/groups, kh, kw) - and PyTorch's default initialisation
-- (kaiming_uniform with a = sqrt(5), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))).
-- Conv2d's padding may also be "valid" or "same" (stride 1).
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"

local M = {}

local util = require "needle.nn.util"
local shape_str = require("needle.errors").shape_str

local SIZE = "integer|table" -- an int or a pair {h, w}
local CONV_OPTS = {stride = SIZE, padding = "integer|table|string", dilation = SIZE, groups = "integer",
                   bias = "boolean", padding_mode = "string"}
local CONV_T_OPTS = {stride = SIZE, padding = SIZE, output_padding = SIZE, dilation = SIZE,
                     groups = "integer", bias = "boolean", padding_mode = "string"}

-- an int or a pair -> {h, w}; min is the smallest allowed value
local function pair(cls, what, v, min, level)
  local p
  if math.type(v) == "integer" then p = {v, v}
  elseif type(v) == "table" and #v == 2 and math.type(v[1]) == "integer" and math.type(v[2]) == "integer" then
    p = {v[1], v[2]}
  end
  if p == nil or p[1] < min or p[2] < min then
    error(("needle.nn.%s: %s must be an integer >= %d or a pair {h, w} of them, got %s"):format(
      cls, what, min, type(v) == "table" and "{" .. table.concat(v, ",") .. "}" or tostring(v)), level or 5)
  end
  return p
end

local function pair_str(p) return ("{%d, %d}"):format(p[1], p[2]) end

local function check_int(cls, what, v, min)
  if math.type(v) ~= "integer" or v < min then
    error(("needle.nn.%s: %s must be an integer >= %d, got %s"):format(cls, what, min, tostring(v)), 5)
  end
end

-- input (N, C, H, W) or (C, H, W) with C channels
local function check_input(self, x, c, level)
  local ok = nd.is_tensor(x) and (x:dim() == 4 or x:dim() == 3)
  if ok then ok = x:size(x:dim() - 2) == c end
  if not ok then
    error(("needle.nn.%s(%d, %d): expected input with %d channels (N, %d, H, W), got %s"):format(
      self.__name, self.in_channels, self.out_channels, c, c,
      nd.is_tensor(x) and shape_str(x) or type(x)), level + 1)
  end
end

-- Conv2d / ConvTranspose2d ------------------------------------------------------

local function conv_init(self, cls, in_channels, out_channels, kernel_size, opts, transposed)
  check_int(cls, "in_channels", in_channels, 1)
  check_int(cls, "out_channels", out_channels, 1)
  opts = util.options(self, opts, transposed and CONV_T_OPTS or CONV_OPTS, true)
  local groups = opts.groups or 1
  check_int(cls, "groups", groups, 1)
  if in_channels % groups ~= 0 or out_channels % groups ~= 0 then
    error(("needle.nn.%s(%d, %d): in_channels and out_channels must be divisible by groups (%d)"):format(
      cls, in_channels, out_channels, groups), 4)
  end
  local pm = opts.padding_mode or "zeros"
  if pm ~= "zeros" then
    error(("needle.nn.%s: only padding_mode 'zeros' is supported, got %s"):format(cls, tostring(pm)), 4)
  end
  self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
  self.kernel_size = pair(cls, "kernel_size", kernel_size, 1)
  self.stride = pair(cls, "stride", opts.stride or 1, 1)
  self.dilation = pair(cls, "dilation", opts.dilation or 1, 1)
  local padding = opts.padding or 0
  if padding == "valid" then padding = 0 end
  if padding == "same" and not transposed then
    if self.stride[1] ~= 1 or self.stride[2] ~= 1 then
      error(("needle.nn.%s(%d, %d): padding='same' is not supported for strided convolutions"):format(
        cls, in_channels, out_channels), 4)
    end
    self.padding = "same"
  else
    self.padding = pair(cls, "padding", padding, 0)
  end
  local dtype = opts.dtype or "float32"
  local kh, kw = self.kernel_size[1], self.kernel_size[2]
  local shape = transposed and {in_channels, out_channels // groups, kh, kw}
                             or {out_channels, in_channels // groups, kh, kw}
  self.weight = Module.Parameter(nd.empty(shape, {dtype = dtype}))
  if opts.bias ~= false then
    self.bias = Module.Parameter(nd.empty({out_channels}, {dtype = dtype}))
  else
    self:register_parameter("bias", nil)
  end
  self:reset_parameters()
  return opts
end

local function conv_reset(self)
  init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
  if self.bias ~= nil then
    local fan_in = init._calculate_fan_in_and_fan_out(self.weight)
    local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
    init.uniform_(self.bias, -bound, bound)
  end
end

local function conv_repr(self, extra)
  local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
    pair_str(self.kernel_size), pair_str(self.stride))
  if self.padding == "same" then s = s .. ", padding='same'"
  elseif self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. ", padding=" .. pair_str(self.padding) end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then s = s .. ", dilation=" .. pair_str(self.dilation) end
  if extra then s = s .. extra end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if self.bias == nil then s = s .. ", bias=false" end
  return s
end

local Conv2d = Module:extend("Conv2d")

-- Conv2d(in_channels, out_channels, kernel_size, {stride=1, padding=0, dilation=1, groups=1, bias=true,
--        padding_mode="zeros", dtype="float32", device="cpu"})
function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  util.place(self, conv_init(self, "Conv2d", in_channels, out_channels, kernel_size, opts, false))
end
Conv2d.reset_parameters = conv_reset

-- x and the padding to pass to conv2d for padding = "same": total padding
-- d (k - 1) per side pair; an odd total puts the extra on the bottom/right
-- (x padded explicitly), as PyTorch. Other paddings pass through. Shared with
-- nn.fuse's FusedConv2d.
function M.resolve_padding(m, x)
  local padding = m.padding
  if padding ~= "same" then return x, padding end
  local th = m.dilation[1] * (m.kernel_size[1] - 1)
  local tw = m.dilation[2] * (m.kernel_size[2] - 1)
  local top, left = th // 2, tw // 2
  if th % 2 == 0 and tw % 2 == 0 then return x, {top, left} end
  return x:pad({left, tw - left, top, th - top}), {0, 0}
end

function Conv2d:forward(x)
  check_input(self, x, self.in_channels, 2)
  local padding
  x, padding = M.resolve_padding(self, x)
  return nd.F.conv2d(x, self.weight, self.bias, {stride = self.stride, padding = padding,
                                                 dilation = self.dilation, groups = self.groups})
end

function Conv2d:extra_repr() return conv_repr(self) end
M.Conv2d = Conv2d

local ConvTranspose2d = Module:extend("ConvTranspose2d")

-- ConvTranspose2d(in_channels, out_channels, kernel_size,
--                 {stride=1, padding=0, output_padding=0, groups=1, bias=true, dilation=1,
--                  padding_mode="zeros", dtype="float32", device="cpu"})
function ConvTranspose2d:init(in_channels, out_channels, kernel_size, opts)
  opts = conv_init(self, "ConvTranspose2d", in_channels, out_channels, kernel_size, opts, true)
  self.output_padding = pair("ConvTranspose2d", "output_padding", opts.output_padding or 0, 0, 4)
  for i = 1, 2 do
    if self.output_padding[i] >= math.max(self.stride[i], self.dilation[i]) then
      error(("needle.nn.ConvTranspose2d(%d, %d): output_padding must be smaller than stride or dilation, got %s"):format(
        in_channels, out_channels, pair_str(self.output_padding)), 3)
    end
  end
  util.place(self, opts)
end
ConvTranspose2d.reset_parameters = conv_reset

function ConvTranspose2d:forward(x)
  check_input(self, x, self.in_channels, 2)
  return nd.F.conv_transpose2d(x, self.weight, self.bias, {
    stride = self.stride, padding = self.padding, output_padding = self.output_padding,
    dilation = self.dilation, groups = self.groups})
end

function ConvTranspose2d:extra_repr()
  local extra
  if self.output_padding[1] ~= 0 or self.output_padding[2] ~= 0 then
    extra = ", output_padding=" .. pair_str(self.output_padding)
  end
  return conv_repr(self, extra)
end
M.ConvTranspose2d = ConvTranspose2d

-- pooling ----------------------------------------------------------------------

local function check_pool_input(self, x)
  if not nd.is_tensor(x) or (x:dim() ~= 3 and x:dim() ~= 4) then
    error(("needle.nn.%s(%s): expected input of shape (N, C, H, W) or (C, H, W), got %s"):format(
      self.__name, pair_str(self.kernel_size), nd.is_tensor(x) and shape_str(x) or type(x)), 3)
  end
end

local MaxPool2d = Module:extend("MaxPool2d")

-- MaxPool2d(kernel_size, {stride=kernel_size, padding=0, dilation=1, return_indices=false, ceil_mode=false})
function MaxPool2d:init(kernel_size, opts)
  opts = util.options(self, opts, {stride = SIZE, padding = SIZE, dilation = SIZE, return_indices = "boolean",
                                   ceil_mode = "boolean"})
  self.kernel_size = pair("MaxPool2d", "kernel_size", kernel_size, 1, 4)
  self.stride = pair("MaxPool2d", "stride", opts.stride or self.kernel_size, 1, 4)
  self.padding = pair("MaxPool2d", "padding", opts.padding or 0, 0, 4)
  self.dilation = pair("MaxPool2d", "dilation", opts.dilation or 1, 1, 4)
  self.return_indices = opts.return_indices or false
  self.ceil_mode = opts.ceil_mode or false
end

function MaxPool2d:forward(x)
  check_pool_input(self, x)
  return nd.F.max_pool2d(x, self.kernel_size, {stride = self.stride, padding = self.padding,
    dilation = self.dilation, ceil_mode = self.ceil_mode, return_indices = self.return_indices})
end

function MaxPool2d:extra_repr()
  return ("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s"):format(
    pair_str(self.kernel_size), pair_str(self.stride), pair_str(self.padding), pair_str(self.dilation),
    tostring(self.ceil_mode))
end
M.MaxPool2d = MaxPool2d

local AvgPool2d = Module:extend("AvgPool2d")

-- AvgPool2d(kernel_size, {stride=kernel_size, padding=0, ceil_mode=false, count_include_pad=true})
function AvgPool2d:init(kernel_size, opts)
  opts = util.options(self, opts, {stride = SIZE, padding = SIZE, ceil_mode = "boolean",
                                   count_include_pad = "boolean"})
  self.kernel_size = pair("AvgPool2d", "kernel_size", kernel_size, 1, 4)
  self.stride = pair("AvgPool2d", "stride", opts.stride or self.kernel_size, 1, 4)
  self.padding = pair("AvgPool2d", "padding", opts.padding or 0, 0, 4)
  self.ceil_mode = opts.ceil_mode or false
  self.count_include_pad = opts.count_include_pad ~= false
end

function AvgPool2d:forward(x)
  check_pool_input(self, x)
  return nd.F.avg_pool2d(x, self.kernel_size, {stride = self.stride, padding = self.padding,
    ceil_mode = self.ceil_mode, count_include_pad = self.count_include_pad})
end

function AvgPool2d:extra_repr()
  return ("kernel_size=%s, stride=%s, padding=%s"):format(
    pair_str(self.kernel_size), pair_str(self.stride), pair_str(self.padding))
end
M.AvgPool2d = AvgPool2d

local AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")

-- AdaptiveAvgPool2d(output_size): an int or {oh, ow}
function AdaptiveAvgPool2d:init(output_size)
  self.output_size = pair("AdaptiveAvgPool2d", "output_size", output_size, 1, 4)
end

function AdaptiveAvgPool2d:forward(x)
  if not nd.is_tensor(x) or (x:dim() ~= 3 and x:dim() ~= 4) then
    error(("needle.nn.AdaptiveAvgPool2d(%s): expected input of shape (N, C, H, W) or (C, H, W), got %s"):format(
      pair_str(self.output_size), nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  return nd.F.adaptive_avg_pool2d(x, self.output_size)
end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. pair_str(self.output_size) end
M.AdaptiveAvgPool2d = AdaptiveAvgPool2d

return M
