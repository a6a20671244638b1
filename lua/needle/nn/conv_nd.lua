-- needle.nn.conv_nd: Conv1d, Conv3d, ConvTranspose1d, MaxPool1d, AvgPool1d,
-- AdaptiveMaxPool2d.
--
--   nd.nn.Conv1d(16, 32, 3, {stride = 1, padding = "same", padding_mode = "reflect"})
--   nd.nn.Conv3d(3, 8, {3, 3, 3}, {padding = 1})
--   nd.nn.ConvTranspose1d(32, 16, 4, {stride = 2, padding = 1})
--   nd.nn.MaxPool1d(2), nd.nn.AvgPool1d(3, {stride = 2}), nd.nn.AdaptiveMaxPool2d({1, 1})
--
-- Weights have PyTorch's layouts - Conv1d (out, in/groups, k), Conv3d (out,
-- in/groups, kd, kh, kw), ConvTranspose1d (in, out/groups, k) - its state_dict
-- keys (weight, bias) and its default initialisation (kaiming_uniform with
-- a = sqrt(5), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))). The forward passes
-- are nd.F's (needle.functional.conv_nd says what they cost). padding_mode
-- "reflect", "replicate" or "circular" pads with F.pad first and convolves
-- without padding, as PyTorch.
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local util = require "needle.nn.util"
local A = require "needle.functional.spatial_args"

local M = {}

local shape_str = A.shape_str

local SIZE = "integer|table"
local CONV_OPTS = {stride = SIZE, padding = "integer|table|string", dilation = SIZE, groups = "integer",
                   bias = "boolean", padding_mode = "string"}
local CONV_T_OPTS = {stride = SIZE, padding = SIZE, output_padding = SIZE, dilation = SIZE, groups = "integer",
                     bias = "boolean", padding_mode = "string"}
local PADDING_MODES = {zeros = true, reflect = true, replicate = true, circular = true}

local function list_str(t) return "{" .. table.concat(t, ", ") .. "}" end

-- the shared base of Conv1d, Conv3d and ConvTranspose1d: _n spatial dims,
-- _transposed, _fn (the nd.F function)
local ConvNd = Module:extend("_ConvNd")

local function check_count(self, what, v)
  if math.type(v) ~= "integer" or v < 1 then
    util.fail(self, "%s must be a positive integer, got %s", what, require("needle.options").got(v))
  end
end

function ConvNd:init(in_channels, out_channels, kernel_size, opts)
  local who, n, transposed = "nn." .. self.__name, self._n, self._transposed
  check_count(self, "in_channels", in_channels)
  check_count(self, "out_channels", out_channels)
  local o = util.options(self, opts, transposed and CONV_T_OPTS or CONV_OPTS, true)
  local groups = o.groups or 1
  check_count(self, "groups", groups)
  if in_channels % groups ~= 0 or out_channels % groups ~= 0 then
    util.fail(self, "in_channels (%d) and out_channels (%d) must be divisible by groups (%d)", in_channels,
              out_channels, groups)
  end
  local pm = o.padding_mode or "zeros"
  if not PADDING_MODES[pm] or (transposed and pm ~= "zeros") then
    util.fail(self, "padding_mode must be %s, got %s", transposed and "'zeros'" or
              "'zeros', 'reflect', 'replicate' or 'circular'", A.show(pm))
  end
  self.in_channels, self.out_channels, self.groups, self.padding_mode = in_channels, out_channels, groups, pm
  self.kernel_size = A.ints(who, "kernel_size", kernel_size, n, 1)
  self.stride = A.ints(who, "stride", o.stride or 1, n, 1)
  self.dilation = A.ints(who, "dilation", o.dilation or 1, n, 1)
  local padding = o.padding or 0
  if type(padding) == "string" and not transposed then
    if padding ~= "same" and padding ~= "valid" then
      util.fail(self, "padding must be 'valid', 'same', an integer or a list of %d, got '%s'", n, padding)
    end
    for i = 1, n do
      if padding == "same" and self.stride[i] ~= 1 then
        util.fail(self, "padding='same' is not supported for strided convolutions (stride %s)", list_str(self.stride))
      end
    end
    self.padding = padding
  else
    self.padding = A.ints(who, "padding", padding, n, 0)
  end
  if transposed then
    self.output_padding = A.ints(who, "output_padding", o.output_padding or 0, n, 0)
    for i = 1, n do
      if self.output_padding[i] >= math.max(self.stride[i], self.dilation[i]) then
        util.fail(self, "output_padding %s must be smaller than stride %s or dilation %s",
                  list_str(self.output_padding), list_str(self.stride), list_str(self.dilation))
      end
    end
  end
  -- F.pad's list (last dim first) for the padding modes, as PyTorch's
  -- _reversed_padding_repeated_twice ('same': the odd one at the end)
  local rev = {}
  for i = n, 1, -1 do
    local lo, hi
    if self.padding == "same" then
      local total = self.dilation[i] * (self.kernel_size[i] - 1)
      lo, hi = total // 2, total - total // 2
    elseif self.padding == "valid" then lo, hi = 0, 0
    else lo, hi = self.padding[i], self.padding[i] end
    rev[#rev + 1], rev[#rev + 2] = lo, hi
  end
  self._reversed_padding_repeated_twice = rev
  local shape = transposed and {in_channels, out_channels // groups} or {out_channels, in_channels // groups}
  for i = 1, n do shape[#shape + 1] = self.kernel_size[i] end
  local dtype = o.dtype or "float32"
  self.weight = Module.Parameter(nd.empty(shape, {dtype = dtype}))
  if o.bias ~= false then
    self.bias = Module.Parameter(nd.empty({out_channels}, {dtype = dtype}))
  else
    self:register_parameter("bias", nil)
  end
  self:reset_parameters()
  util.place(self, o)
end

function ConvNd:reset_parameters()
  init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
  if self.bias ~= nil then
    local fan_in = init._calculate_fan_in_and_fan_out(self.weight)
    local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
    init.uniform_(self.bias, -bound, bound)
  end
end

local SPATIAL = {[1] = "L", [3] = "D, H, W"}

function ConvNd:forward(x)
  local n, c = self._n, self.in_channels
  local ok = nd.is_tensor(x) and (x:dim() == n + 2 or x:dim() == n + 1)
  if ok then ok = x:size(x:dim() - n) == c end
  if not ok then
    util.fail(("%s(%d, %d)"):format(self.__name, c, self.out_channels),
              "expected input with %d channels (N, %d, %s) or (%d, %s), got %s", c, c, SPATIAL[n], c, SPATIAL[n],
              nd.is_tensor(x) and shape_str(x) or type(x))
  end
  local F = nd.F
  if self._transposed then
    return self._fn(x, self.weight, self.bias, {stride = self.stride, padding = self.padding,
      output_padding = self.output_padding, dilation = self.dilation, groups = self.groups})
  end
  local padding = self.padding
  if self.padding_mode ~= "zeros" then
    x = F.pad(x, self._reversed_padding_repeated_twice, self.padding_mode)
    padding = 0
  end
  return self._fn(x, self.weight, self.bias, {stride = self.stride, padding = padding, dilation = self.dilation,
                                              groups = self.groups})
end

function ConvNd:extra_repr()
  local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
    list_str(self.kernel_size), list_str(self.stride))
  local function nonzero(t, v)
    for _, x in ipairs(t) do if x ~= v then return true end end
    return false
  end
  if type(self.padding) == "string" then s = s .. ", padding='" .. self.padding .. "'"
  elseif nonzero(self.padding, 0) then s = s .. ", padding=" .. list_str(self.padding) end
  if nonzero(self.dilation, 1) then s = s .. ", dilation=" .. list_str(self.dilation) end
  if self.output_padding and nonzero(self.output_padding, 0) then
    s = s .. ", output_padding=" .. list_str(self.output_padding)
  end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if self.bias == nil then s = s .. ", bias=false" end
  if self.padding_mode ~= "zeros" then s = s .. ", padding_mode='" .. self.padding_mode .. "'" end
  return s
end

-- Conv1d(in_channels, out_channels, kernel_size, {stride=1, padding=0 | "valid" | "same", dilation=1,
--        groups=1, bias=true, padding_mode="zeros", dtype=, device=})
local Conv1d = ConvNd:extend("Conv1d")
Conv1d._n, Conv1d._transposed = 1, false
function Conv1d._fn(...) return nd.F.conv1d(...) end
M.Conv1d = Conv1d

-- Conv3d(in_channels, out_channels, kernel_size (int or {kd, kh, kw}), {the options of Conv1d})
local Conv3d = ConvNd:extend("Conv3d")
Conv3d._n, Conv3d._transposed = 3, false
function Conv3d._fn(...) return nd.F.conv3d(...) end
M.Conv3d = Conv3d

-- ConvTranspose1d(in_channels, out_channels, kernel_size, {stride=1, padding=0, output_padding=0,
--                 groups=1, bias=true, dilation=1, padding_mode="zeros", dtype=, device=})
local ConvTranspose1d = ConvNd:extend("ConvTranspose1d")
ConvTranspose1d._n, ConvTranspose1d._transposed = 1, true
function ConvTranspose1d._fn(...) return nd.F.conv_transpose1d(...) end
M.ConvTranspose1d = ConvTranspose1d

-- pooling ---------------------------------------------------------------------------

local function check_pool_input(self, x, want, layouts)
  if not nd.is_tensor(x) or (x:dim() ~= want and x:dim() ~= want - 1) then
    util.fail(("%s(%s)"):format(self.__name, self:_sig()), "expected input of shape %s, got %s", layouts,
              nd.is_tensor(x) and shape_str(x) or type(x))
  end
end

-- a 1-element size: an integer or {k}
local function one(self, what, v, min)
  return A.ints("nn." .. self.__name, what, v, 1, min)[1]
end

local MaxPool1d = Module:extend("MaxPool1d")

-- MaxPool1d(kernel_size, {stride=kernel_size, padding=0, dilation=1, return_indices=false, ceil_mode=false})
function MaxPool1d:init(kernel_size, opts)
  local o = util.options(self, opts, {stride = SIZE, padding = SIZE, dilation = SIZE, return_indices = "boolean",
                                      ceil_mode = "boolean"})
  self.kernel_size = one(self, "kernel_size", kernel_size, 1)
  self.stride = one(self, "stride", o.stride or self.kernel_size, 1)
  self.padding = one(self, "padding", o.padding or 0, 0)
  self.dilation = one(self, "dilation", o.dilation or 1, 1)
  self.return_indices = o.return_indices == true
  self.ceil_mode = o.ceil_mode == true
end

function MaxPool1d:_sig() return tostring(self.kernel_size) end

function MaxPool1d:forward(x)
  check_pool_input(self, x, 3, "(N, C, L) or (C, L)")
  return nd.F.max_pool1d(x, self.kernel_size, {stride = self.stride, padding = self.padding,
    dilation = self.dilation, ceil_mode = self.ceil_mode, return_indices = self.return_indices})
end

function MaxPool1d:extra_repr()
  return ("kernel_size=%d, stride=%d, padding=%d, dilation=%d, ceil_mode=%s"):format(self.kernel_size, self.stride,
    self.padding, self.dilation, tostring(self.ceil_mode))
end
M.MaxPool1d = MaxPool1d

local AvgPool1d = Module:extend("AvgPool1d")

-- AvgPool1d(kernel_size, {stride=kernel_size, padding=0, ceil_mode=false, count_include_pad=true})
function AvgPool1d:init(kernel_size, opts)
  local o = util.options(self, opts, {stride = SIZE, padding = SIZE, ceil_mode = "boolean",
                                      count_include_pad = "boolean"})
  self.kernel_size = one(self, "kernel_size", kernel_size, 1)
  self.stride = one(self, "stride", o.stride or self.kernel_size, 1)
  self.padding = one(self, "padding", o.padding or 0, 0)
  self.ceil_mode = o.ceil_mode == true
  self.count_include_pad = o.count_include_pad ~= false
end

AvgPool1d._sig = MaxPool1d._sig

function AvgPool1d:forward(x)
  check_pool_input(self, x, 3, "(N, C, L) or (C, L)")
  return nd.F.avg_pool1d(x, self.kernel_size, {stride = self.stride, padding = self.padding,
    ceil_mode = self.ceil_mode, count_include_pad = self.count_include_pad})
end

function AvgPool1d:extra_repr()
  return ("kernel_size=%d, stride=%d, padding=%d"):format(self.kernel_size, self.stride, self.padding)
end
M.AvgPool1d = AvgPool1d

local AdaptiveMaxPool2d = Module:extend("AdaptiveMaxPool2d")

-- AdaptiveMaxPool2d(output_size (an int or {oh, ow}), {return_indices=false})
function AdaptiveMaxPool2d:init(output_size, opts)
  local o = util.options(self, opts, {return_indices = "boolean"})
  self.output_size = A.ints("nn.AdaptiveMaxPool2d", "output_size", output_size, 2, 1)
  self.return_indices = o.return_indices == true
end

function AdaptiveMaxPool2d:_sig() return list_str(self.output_size) end

function AdaptiveMaxPool2d:forward(x)
  check_pool_input(self, x, 4, "(N, C, H, W) or (C, H, W)")
  return nd.F.adaptive_max_pool2d(x, self.output_size, {return_indices = self.return_indices})
end

function AdaptiveMaxPool2d:extra_repr()
  return ("output_size=%s, return_indices=%s"):format(list_str(self.output_size), tostring(self.return_indices))
end
M.AdaptiveMaxPool2d = AdaptiveMaxPool2d

return M
