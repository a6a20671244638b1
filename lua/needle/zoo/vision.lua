-- needle.zoo.vision: torchvision's image classifiers, ResNet-18/34/50 and
-- MobileNetV2, with torchvision's module trees, so that their state_dict keys
-- are torchvision's (conv1.weight, layer1.0.downsample.0.weight, fc.bias,
-- features.3.conv.1.0.weight, classifier.1.weight, ...) and a torchvision
-- state_dict loads by name. Reached as nd.nn.models.<name> (docs/models.md).
--
--   local models = nd.nn.models
--   local m = models.resnet50({num_classes = 1000})     -- ImageNet: 7x7 stride-2 stem + max-pool
--   local c = models.resnet18({num_classes = 10, cifar = true}) -- 3x3 stride-1 stem, no max-pool
--   local v = models.mobilenet_v2({width_mult = 0.5})
--   m:load_state_dict(convert.unwrap(nd.load_torch("resnet50.pth")))
--   m:eval(); local logits = m(images)                  -- images (N, 3, H, W) -> (N, num_classes)
--
--   resnet18/34/50({num_classes = 1000, cifar = false, width = 64,
--                   zero_init_residual = false, dtype =, device =})
--   resnext50_32x4d, resnext101_32x8d, wide_resnet50_2, wide_resnet101_2 (the same options)
--   ResNet(block, layers, {..., groups = 1, width_per_group = 64}) (ResNeXt, wide ResNets)
--   mobilenet_v2({num_classes = 1000, width_mult = 1.0, dropout = 0.2, cifar = false,
--                 dtype =, device =})
--   ResNet(block, layers, opts)  block "basic" | "bottleneck" (or nd.nn.models.BasicBlock, Bottleneck),
--                                layers {n1, n2, n3, n4} blocks per stage; opts as resnet18's
--   MobileNetV2(opts), BasicBlock(inplanes, planes, {stride=, downsample=}),
--   Bottleneck(inplanes, planes, {stride=, downsample=}), InvertedResidual(inp, oup, stride, expand_ratio)
--
-- width (needle's, not torchvision's) is the channel count of the stem and of
-- layer1 (torchvision: 64): smaller widths give the same architecture, narrower,
-- for tests and small data. cifar = true is the usual change for 32x32 images:
-- ResNet's conv1 becomes a 3x3 stride-1 convolution and maxpool an Identity;
-- MobileNetV2's first convolution and its 24-channel stage run at stride 1
-- instead of 2 (total stride 8 instead of 32; the blocks are built so, and a
-- block whose channels in and out agree gets its residual connection, as
-- torchvision decides). The keys do not change, only conv1.weight's shape
-- for ResNet ({width, 3, 3, 3}).
--
-- Weights start as torchvision initialises them: convolutions kaiming_normal_
-- (mode fan_out, relu), BatchNorm weight 1 and bias 0, MobileNetV2's Linear
-- normal(0, 0.01) with bias 0, ResNet's fc PyTorch's Linear default.
local errors = require "needle.errors"
local nd = require "needle"
local Module = require "needle.nn.module"
local options = require "needle.options"
local util = require "needle.nn.util"

local M = {}

local shape_str = errors.shape_str

-- needle.<who>: ... at the user's line
local function fail(who, fmt, ...) errors.fail(who, fmt, ...) end

local function check_images(who, x)
  if not nd.is_tensor(x) or x:dim() ~= 4 or x:size(2) ~= 3 then
    fail(who, "expected images of shape (N, 3, H, W), got %s", nd.is_tensor(x) and shape_str(x) or type(x))
  end
end

-- torchvision's initialisation; linear_std: MobileNetV2's normal(0, std) for
-- Linear weights (ResNet keeps PyTorch's Linear default)
local function init_weights(model, linear_std)
  local init = nd.nn.init
  for _, m in ipairs(model:modules()) do
    if m.__name == "Conv2d" then
      init.kaiming_normal_(m.weight, {mode = "fan_out", nonlinearity = "relu"})
      if m.bias then init.zeros_(m.bias) end
    elseif m.__name == "BatchNorm2d" then
      init.ones_(m.weight)
      init.zeros_(m.bias)
    elseif m.__name == "Linear" and linear_std then
      init.normal_(m.weight, {mean = 0, std = linear_std})
      init.zeros_(m.bias)
    end
  end
end

-- the factory keywords, applied once the model is built on the cpu in float32
local function place(model, o)
  if o.dtype ~= nil and o.dtype ~= "float32" then model:to({dtype = o.dtype}) end
  return util.place(model, o)
end

-- options.check plus the dtype/device checks of nn modules, as `who`
local function check_opts(who, opts, spec)
  return util.options({__name = who:gsub("^nn%.", "")}, opts, spec, true)
end

local function positive_int(who, what, v)
  if math.type(v) ~= "integer" or v < 1 then
    fail(who, "%s must be a positive integer, got %s", what, options.got(v))
  end
end

-- ResNet ----------------------------------------------------------------------------

local function conv(a, b, k, stride, extra)
  local o = {stride = stride, padding = (k - 1) // 2, bias = false}
  for key, v in pairs(extra or {}) do o[key] = v end
  return nd.nn.Conv2d(a, b, k, o)
end

local BLOCK_OPTS = {stride = "integer", downsample = "module", groups = "integer", base_width = "integer"}

-- out + identity, as torchvision's `out += identity`: written into out (the
-- block's own last BatchNorm output, which nothing else holds) where
-- autograd does not need it, else a new tensor (needle refuses in-place
-- writes to tensors that require grad; the values are the same)
local function add_residual(out, identity)
  if out.dtype ~= identity.dtype or (nd.is_grad_enabled() and (out.requires_grad or identity.requires_grad)) then
    return out + identity
  end
  return out:add_(identity)
end

-- torchvision's BasicBlock: conv3x3(stride) bn1 relu conv3x3 bn2, plus the
-- input or downsample(input), then relu. expansion 1.
local BasicBlock = Module:extend("BasicBlock")
BasicBlock.expansion = 1

function BasicBlock:init(inplanes, planes, opts)
  opts = options.check("nn.models.BasicBlock", opts, BLOCK_OPTS)
  if (opts.groups or 1) ~= 1 or (opts.base_width or 64) ~= 64 then
    fail("nn.models.BasicBlock", "BasicBlock supports only groups = 1 and base_width = 64 (as torchvision's), got %s and %s",
         tostring(opts.groups or 1), tostring(opts.base_width or 64))
  end
  local nn = nd.nn
  local stride = opts.stride or 1
  self.conv1 = conv(inplanes, planes, 3, stride)
  self.bn1 = nn.BatchNorm2d(planes)
  self.relu = nn.ReLU({inplace = true})
  self.conv2 = conv(planes, planes, 3, 1)
  self.bn2 = nn.BatchNorm2d(planes)
  if opts.downsample then self.downsample = opts.downsample end
  self.stride = stride
end

function BasicBlock:forward(x)
  local out = self.relu(self.bn1(self.conv1(x)))
  out = self.bn2(self.conv2(out))
  local identity = self.downsample and self.downsample(x) or x
  return self.relu(add_residual(out, identity))
end

-- torchvision's Bottleneck (ResNet V1.5: the stride on the 3x3): conv1x1 bn1
-- relu conv3x3(stride, groups) bn2 relu conv1x1(planes * 4) bn3, plus the
-- input or downsample(input), then relu. expansion 4. The inner width is
-- floor(planes * base_width / 64) * groups (ResNeXt: groups 32, base_width 4
-- or 8; wide ResNets: base_width 128).
local Bottleneck = Module:extend("Bottleneck")
Bottleneck.expansion = 4

function Bottleneck:init(inplanes, planes, opts)
  opts = options.check("nn.models.Bottleneck", opts, BLOCK_OPTS)
  local nn = nd.nn
  local stride, groups = opts.stride or 1, opts.groups or 1
  local inner = (planes * (opts.base_width or 64)) // 64 * groups
  self.conv1 = conv(inplanes, inner, 1, 1)
  self.bn1 = nn.BatchNorm2d(inner)
  self.conv2 = conv(inner, inner, 3, stride, {groups = groups})
  self.bn2 = nn.BatchNorm2d(inner)
  self.conv3 = conv(inner, planes * 4, 1, 1)
  self.bn3 = nn.BatchNorm2d(planes * 4)
  self.relu = nn.ReLU({inplace = true})
  if opts.downsample then self.downsample = opts.downsample end
  self.stride = stride
end

function Bottleneck:forward(x)
  local out = self.relu(self.bn1(self.conv1(x)))
  out = self.relu(self.bn2(self.conv2(out)))
  out = self.bn3(self.conv3(out))
  local identity = self.downsample and self.downsample(x) or x
  return self.relu(add_residual(out, identity))
end

M.BasicBlock, M.Bottleneck = BasicBlock, Bottleneck

local BLOCKS = {basic = BasicBlock, bottleneck = Bottleneck}
local BLOCK_CLASSES = {BasicBlock = BasicBlock, Bottleneck = Bottleneck}

local RESNET_OPTS = {num_classes = "integer", cifar = "boolean", width = "integer", zero_init_residual = "boolean",
                     groups = "integer", width_per_group = "integer"}

-- the checked options of a ResNet, raised as `who`
local function resnet_opts(who, opts)
  opts = check_opts(who, opts, RESNET_OPTS)
  positive_int(who, "num_classes", opts.num_classes or 1000)
  positive_int(who, "width", opts.width or 64)
  positive_int(who, "groups", opts.groups or 1)
  positive_int(who, "width_per_group", opts.width_per_group or 64)
  return opts
end

-- torchvision's ResNet: conv1 bn1 relu maxpool layer1..4 avgpool fc
local ResNet = Module:extend("ResNet")

function ResNet:init(block, layers, opts)
  local who = "nn.models.ResNet"
  opts = resnet_opts(who, opts)
  -- by name: nd.nn.models.BasicBlock is the converter's CIFAR block, the same module
  local cls = BLOCKS[block] or (type(block) == "table" and BLOCK_CLASSES[rawget(block, "__name")])
  if cls ~= BasicBlock and cls ~= Bottleneck then
    fail(who, "block must be 'basic', 'bottleneck', BasicBlock or Bottleneck, got %s", options.got(block))
  end
  if type(layers) ~= "table" or #layers ~= 4 then
    fail(who, "layers must be a list of 4 block counts such as {2, 2, 2, 2}, got %s", options.got(layers))
  end
  for i = 1, 4 do positive_int(who, ("layers[%d]"):format(i), layers[i]) end
  local nn = nd.nn
  local width, classes = opts.width or 64, opts.num_classes or 1000
  local groups, per_group = opts.groups or 1, opts.width_per_group or 64
  if cls == BasicBlock and (groups ~= 1 or per_group ~= 64) then
    fail(who, "BasicBlock supports only groups = 1 and width_per_group = 64 (as torchvision's), got %d and %d",
         groups, per_group)
  end
  self.block, self.layers = cls.__name, {layers[1], layers[2], layers[3], layers[4]}
  self.groups, self.width_per_group = groups, per_group
  self.width, self.num_classes, self.cifar = width, classes, opts.cifar == true
  if self.cifar then
    self.conv1 = conv(3, width, 3, 1)
  else
    self.conv1 = conv(3, width, 7, 2)
  end
  self.bn1 = nn.BatchNorm2d(width)
  self.relu = nn.ReLU({inplace = true})
  self.maxpool = self.cifar and nn.Identity() or nn.MaxPool2d(3, {stride = 2, padding = 1})
  local inplanes = width
  for k = 1, 4 do
    local planes = width << (k - 1)
    local stride = k == 1 and 1 or 2
    local blocks = {}
    for j = 1, layers[k] do
      local ds
      if j == 1 and (stride ~= 1 or inplanes ~= planes * cls.expansion) then
        ds = nn.Sequential(conv(inplanes, planes * cls.expansion, 1, stride), nn.BatchNorm2d(planes * cls.expansion))
      end
      local bo = {stride = j == 1 and stride or 1, downsample = ds}
      if cls == Bottleneck then bo.groups, bo.base_width = groups, per_group end
      blocks[j] = cls(inplanes, planes, bo)
      inplanes = planes * cls.expansion
    end
    self["layer" .. k] = nn.Sequential(table.unpack(blocks))
  end
  self.avgpool = nn.AdaptiveAvgPool2d({1, 1})
  self.fc = nn.Linear(inplanes, classes)
  init_weights(self)
  if opts.zero_init_residual then
    -- each residual branch starts as zero: the block starts as the identity
    for k = 1, 4 do
      for _, b in ipairs(self["layer" .. k]) do nd.nn.init.zeros_((b.bn3 or b.bn2).weight) end
    end
  end
  place(self, opts)
end

function ResNet:forward(x)
  check_images("nn.models.ResNet", x)
  x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
  x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
  return self.fc(self.avgpool(x):flatten(2))
end

function ResNet:extra_repr()
  local grouped = (self.groups ~= 1 or self.width_per_group ~= 64)
    and (", groups=%d, width_per_group=%d"):format(self.groups, self.width_per_group) or ""
  return ("block=%s, layers={%s}, width=%d, num_classes=%d%s%s"):format(self.block, table.concat(self.layers, ","),
    self.width, self.num_classes, grouped, self.cifar and ", cifar=true" or "")
end

M.ResNet = ResNet

-- resnet18/34/50(opts), resnext50_32x4d / resnext101_32x8d, wide_resnet50_2 /
-- wide_resnet101_2: torchvision's constructors (11,689,512, 21,797,672,
-- 25,557,032, 25,028,904, 88,791,336, 68,883,240 and 126,886,696 parameters
-- with 1000 classes); the named ones fix groups and width_per_group
local function resnet_ctor(name, block, layers, groups, per_group)
  return function(opts, ...)
    local who = "nn.models." .. name
    require("needle.options").no_extra(who, name .. "([opts])", 1, ...)
    opts = resnet_opts(who, opts)
    if groups then
      if opts.groups ~= nil or opts.width_per_group ~= nil then
        fail(who, "%s has groups = %d and width_per_group = %d; for others use nn.models.ResNet", name, groups,
             per_group)
      end
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      o.groups, o.width_per_group = groups, per_group
      opts = o
    end
    return ResNet(block, layers, opts)
  end
end

M.resnet18 = resnet_ctor("resnet18", "basic", {2, 2, 2, 2})
M.resnet34 = resnet_ctor("resnet34", "basic", {3, 4, 6, 3})
M.resnet50 = resnet_ctor("resnet50", "bottleneck", {3, 4, 6, 3})
M.resnext50_32x4d = resnet_ctor("resnext50_32x4d", "bottleneck", {3, 4, 6, 3}, 32, 4)
M.resnext101_32x8d = resnet_ctor("resnext101_32x8d", "bottleneck", {3, 4, 23, 3}, 32, 8)
M.wide_resnet50_2 = resnet_ctor("wide_resnet50_2", "bottleneck", {3, 4, 6, 3}, 1, 128)
M.wide_resnet101_2 = resnet_ctor("wide_resnet101_2", "bottleneck", {3, 4, 23, 3}, 1, 128)

-- MobileNetV2 -----------------------------------------------------------------------

-- torchvision's _make_divisible: v rounded to a multiple of divisor, at least
-- divisor, and not below 90% of v
function M._make_divisible(v, divisor)
  local new_v = math.max(divisor, (math.floor(v + divisor / 2) // divisor) * divisor)
  if new_v < 0.9 * v then new_v = new_v + divisor end
  return math.tointeger(new_v)
end

-- expand ratio t, output channels c, blocks n, stride s of the first block
M.INVERTED_RESIDUAL_SETTING = {
  {1, 16, 1, 1}, {6, 24, 2, 2}, {6, 32, 3, 2}, {6, 64, 4, 2}, {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1},
}

-- the channel plan of mobilenet_v2(width_mult): stem, the output channels of
-- features.1 .. features.17 and last_channel (features.18's)
function M._mobilenet_channels(width_mult)
  local stem = M._make_divisible(32 * width_mult, 8)
  local outs = {}
  for _, s in ipairs(M.INVERTED_RESIDUAL_SETTING) do
    local c = M._make_divisible(s[2] * width_mult, 8)
    for _ = 1, s[3] do outs[#outs + 1] = c end
  end
  return stem, outs, M._make_divisible(1280 * math.max(1.0, width_mult), 8)
end

-- torchvision's Conv2dNormActivation with ReLU6: a Sequential of Conv2d (no
-- bias, "same" padding), BatchNorm2d, ReLU6 (keys 0.weight, 1.running_mean, ...)
local function conv_bn_relu6(a, b, k, stride, groups)
  local nn = nd.nn
  return nn.Sequential(conv(a, b, k, stride, {groups = groups}), nn.BatchNorm2d(b), nn.ReLU6({inplace = true}))
end

-- torchvision's InvertedResidual: [1x1 expand conv-bn-relu6 when expand_ratio
-- ~= 1], 3x3 depthwise conv-bn-relu6 (groups = channels), 1x1 projection conv,
-- bn; plus the input when stride is 1 and inp == oup. Children: conv.
local InvertedResidual = Module:extend("InvertedResidual")

function InvertedResidual:init(inp, oup, stride, expand_ratio)
  local who = "nn.models.InvertedResidual"
  positive_int(who, "inp", inp)
  positive_int(who, "oup", oup)
  if stride ~= 1 and stride ~= 2 then fail(who, "stride must be 1 or 2, got %s", options.got(stride)) end
  positive_int(who, "expand_ratio", expand_ratio)
  local nn = nd.nn
  local hidden = inp * expand_ratio
  self.stride, self.use_res_connect = stride, stride == 1 and inp == oup
  self.inp, self.oup, self.expand_ratio = inp, oup, expand_ratio
  local layers = {}
  if expand_ratio ~= 1 then layers[#layers + 1] = conv_bn_relu6(inp, hidden, 1, 1, 1) end
  layers[#layers + 1] = conv_bn_relu6(hidden, hidden, 3, stride, hidden)
  layers[#layers + 1] = conv(hidden, oup, 1, 1)
  layers[#layers + 1] = nn.BatchNorm2d(oup)
  self.conv = nn.Sequential(table.unpack(layers))
end

function InvertedResidual:forward(x)
  if self.use_res_connect then return x + self.conv(x) end
  return self.conv(x)
end

function InvertedResidual:extra_repr()
  return ("%d, %d, stride=%d, expand_ratio=%d"):format(self.inp, self.oup, self.stride, self.expand_ratio)
end

M.InvertedResidual = InvertedResidual

local MOBILENET_OPTS = {num_classes = "integer", width_mult = "number", dropout = "number", cifar = "boolean"}

local function mobilenet_opts(who, opts)
  opts = check_opts(who, opts, MOBILENET_OPTS)
  positive_int(who, "num_classes", opts.num_classes or 1000)
  local wm = opts.width_mult or 1.0
  if not (wm > 0 and wm < math.huge) then fail(who, "width_mult must be a positive number, got %s", options.got(wm)) end
  local p = opts.dropout or 0.2
  if not (p >= 0 and p <= 1) then fail(who, "dropout must be a probability in [0, 1], got %s", options.got(p)) end
  return opts
end

-- torchvision's MobileNetV2: features (19 modules: the stem conv-bn-relu6, 17
-- inverted residual blocks, a 1x1 conv-bn-relu6 to last_channel), the mean
-- over H and W, classifier (Dropout, Linear)
local MobileNetV2 = Module:extend("MobileNetV2")

function MobileNetV2:init(opts)
  opts = mobilenet_opts("nn.models.MobileNetV2", opts)
  local nn = nd.nn
  local wm, classes = opts.width_mult or 1.0, opts.num_classes or 1000
  self.width_mult, self.num_classes, self.cifar = wm, classes, opts.cifar == true
  local stem, outs, last = M._mobilenet_channels(wm)
  self.last_channel = last
  local features = {conv_bn_relu6(3, stem, 3, self.cifar and 1 or 2, 1)}
  local inp, i = stem, 0
  for stage, s in ipairs(M.INVERTED_RESIDUAL_SETTING) do
    for j = 1, s[3] do
      i = i + 1
      local stride = j == 1 and s[4] or 1
      if self.cifar and stage == 2 then stride = 1 end
      features[#features + 1] = InvertedResidual(inp, outs[i], stride, s[1])
      inp = outs[i]
    end
  end
  features[#features + 1] = conv_bn_relu6(inp, last, 1, 1, 1)
  self.features = nn.Sequential(table.unpack(features))
  self.classifier = nn.Sequential(nn.Dropout(opts.dropout or 0.2), nn.Linear(last, classes))
  init_weights(self, 0.01)
  place(self, opts)
end

function MobileNetV2:forward(x)
  check_images("nn.models.MobileNetV2", x)
  x = nd.F.adaptive_avg_pool2d(self.features(x), {1, 1})
  return self.classifier(x:flatten(2))
end

function MobileNetV2:extra_repr()
  return ("width_mult=%g, num_classes=%d%s"):format(self.width_mult, self.num_classes,
                                                    self.cifar and ", cifar=true" or "")
end

M.MobileNetV2 = MobileNetV2

-- mobilenet_v2(opts): torchvision's constructor (3,504,872 parameters with
-- 1000 classes and width_mult 1)
function M.mobilenet_v2(opts, ...)
  require("needle.options").no_extra("nn.models.mobilenet_v2", "mobilenet_v2([opts])", 1, ...)
  return MobileNetV2(mobilenet_opts("nn.models.mobilenet_v2", opts))
end

return M
