-- needle.zoo.register_vision: the converter entries of torchvision's image
-- classifiers (needle.zoo.vision), registered in needle.convert.models, so
-- that convert.model("resnet50", sd) and
--
--   build/needle-lua scripts/convert_torch.lua resnet50.pth resnet50.safetensors --model resnet50
--
-- build the model from a torchvision state_dict (keys as they are: no
-- mapping) and load it. What the weights say is read from them: block type
-- and blocks per stage (the layer<k>.<j>.* keys), width (conv1.weight), the
-- CIFAR stem (a 3x3 conv1), num_classes (fc.weight, classifier.1.weight),
-- MobileNetV2's width_mult (its channel counts). What they cannot say comes
-- from opts: MobileNetV2's CIFAR strides (cifar = true).
--
--   resnet        any torchvision ResNet (BasicBlock or Bottleneck, any depth, ResNeXt and
--                 wide ResNets: groups and width_per_group from layer1.0.conv2.weight)
--   resnet18/34/50, resnext50_32x4d, resnext101_32x8d, wide_resnet50_2, wide_resnet101_2
--                 the same, checking that the blocks are the named model's
--   mobilenet_v2  torchvision's MobileNetV2 at any width_mult
--
-- register(models) registers the entries in models (needle.convert.models
-- calls it on itself, its last line before `return`: requiring
-- needle.convert.models from here would load it a second time).
local errors = require "needle.errors"
local nd = require "needle"
local vision = require "needle.zoo.vision"

local fail = errors.failer("convert", 0)
local shape_str = errors.shape_str

local need = require("needle.convert.state_dict").need

-- ResNet -------------------------------------------------------------------------

-- what a torchvision ResNet state dict says about its architecture:
-- {block = "basic" | "bottleneck", layers = {n1..n4}, width =, num_classes =, cifar =}
local function resnet_plan(sd, name)
  local conv1 = need(sd, "conv1.weight", 4, name)
  local width, k = conv1:size(1), conv1:size(3)
  if k ~= 3 and k ~= 7 then
    fail("%s: conv1.weight %s is neither the 7x7 ImageNet stem nor the 3x3 CIFAR one", name, shape_str(conv1))
  end
  local block
  if sd["layer1.0.conv3.weight"] ~= nil then block = "bottleneck"
  elseif sd["layer1.0.conv2.weight"] ~= nil then block = "basic"
  else fail("%s: no layer1.0.conv2.weight: not a torchvision ResNet", name) end
  local layers = {}
  for s = 1, 4 do
    local n = 0
    while sd[("layer%d.%d.conv1.weight"):format(s, n)] ~= nil do n = n + 1 end
    if n == 0 then fail("%s: no layer%d.0.conv1.weight: a ResNet has 4 stages", name, s) end
    layers[s] = n
  end
  local fc = need(sd, "fc.weight", 2, name)
  local features = 8 * width * (block == "bottleneck" and 4 or 1)
  if fc:size(2) ~= features then
    fail("%s: fc.weight %s takes %d features, but conv1.weight %s gives %d (8 * width%s)", name, shape_str(fc),
         fc:size(2), shape_str(conv1), features, block == "bottleneck" and " * 4" or "")
  end
  -- ResNeXt and wide ResNets: the inner width of layer1's first block and its groups
  local groups, per_group = 1, 64
  if block == "bottleneck" then
    local c2 = need(sd, "layer1.0.conv2.weight", 4, name)
    local inner = c2:size(1)
    if inner % c2:size(2) ~= 0 then
      fail("%s: layer1.0.conv2.weight %s is no grouped 3x3 convolution", name, shape_str(c2))
    end
    groups = inner // c2:size(2)
    per_group = (inner // groups) * 64 // width
    if (width * per_group) // 64 * groups ~= inner then
      fail("%s: layer1.0.conv2.weight %s fits no width_per_group for width %d and %d groups", name, shape_str(c2),
           width, groups)
    end
  end
  return {block = block, layers = layers, width = width, num_classes = fc:size(1), cifar = k == 3,
          groups = groups, width_per_group = per_group}
end

local function resnet_build(name, sd, opts, want)
  local p = resnet_plan(sd, name)
  if want and (p.block ~= want.block or table.concat(p.layers, ",") ~= table.concat(want.layers, ",")) then
    fail("%s: the state dict is a ResNet of %s blocks {%s} per stage, %s has %s blocks {%s} "
         .. "(the model 'resnet' takes any torchvision ResNet)", name, p.block, table.concat(p.layers, ","), name,
         want.block, table.concat(want.layers, ","))
  end
  if want and (p.groups ~= (want.groups or 1) or p.width_per_group ~= (want.width_per_group or 64)) then
    fail("%s: the state dict's blocks have groups = %d and width_per_group = %d, %s's %d and %d "
         .. "(the model 'resnet' takes any torchvision ResNet)", name, p.groups, p.width_per_group, name,
         want.groups or 1, want.width_per_group or 64)
  end
  return vision.ResNet(p.block, p.layers, {num_classes = p.num_classes, width = p.width, cifar = p.cifar,
                                           groups = p.groups, width_per_group = p.width_per_group})
end

local function image_example(model)
  return nd.randn({1, 3, model.cifar and 32 or 224, model.cifar and 32 or 224})
end

-- MobileNetV2 ----------------------------------------------------------------------

-- features.i's output channels: its last convolution's weight (the projection
-- conv.1 or conv.2 of a block, features.0.0 / features.18.0)
local function out_channels(sd, i)
  for _, key in ipairs({"features.%d.conv.2.weight", "features.%d.conv.1.weight", "features.%d.0.weight"}) do
    local t = sd[key:format(i)]
    if nd.is_tensor(t) and t:dim() == 4 then return t:size(1) end
  end
  return nil
end

-- the first width_mult whose channel plan equals the weights' (equal plans
-- are the same network, so any that fits is right)
local CANDIDATES = {1.0, 0.5, 0.75, 0.35, 0.25, 1.4, 1.3, 2.0}
for k = 5, 400 do CANDIDATES[#CANDIDATES + 1] = k / 100 end

local function mobilenet_width(sd, name)
  local got = {}
  for i = 0, 18 do
    got[i] = out_channels(sd, i)
    if got[i] == nil then fail("%s: no convolution weight for features.%d: not a torchvision MobileNetV2", name, i) end
  end
  if sd["features.19.0.weight"] ~= nil then fail("%s: features.19 exists: not a torchvision MobileNetV2", name) end
  for _, wm in ipairs(CANDIDATES) do
    local stem, outs, last = vision._mobilenet_channels(wm)
    local same = stem == got[0] and last == got[18]
    for i = 1, 17 do same = same and outs[i] == got[i] end
    if same then return wm end
  end
  local list = {}
  for i = 0, 18 do list[#list + 1] = got[i] end
  fail("%s: no width_mult gives these channel counts (features.0 .. 18: %s)", name, table.concat(list, ","))
end

local M = {}

function M.register(models)
  models.register("resnet", {
    description = "torchvision ResNet, any depth (BasicBlock or Bottleneck, ResNeXt, wide) -> nd.nn.models.ResNet; "
               .. "block type, blocks per stage, width, groups, width_per_group, stem (7x7 ImageNet or 3x3 CIFAR) "
               .. "and num_classes from the weights",
    build = function(sd) return resnet_build("resnet", sd) end,
    input_example = image_example,
  })

  for _, m in ipairs({{"resnet18", "basic", {2, 2, 2, 2}}, {"resnet34", "basic", {3, 4, 6, 3}},
                      {"resnet50", "bottleneck", {3, 4, 6, 3}},
                      {"resnext50_32x4d", "bottleneck", {3, 4, 6, 3}, 32, 4},
                      {"resnext101_32x8d", "bottleneck", {3, 4, 23, 3}, 32, 8},
                      {"wide_resnet50_2", "bottleneck", {3, 4, 6, 3}, 1, 128},
                      {"wide_resnet101_2", "bottleneck", {3, 4, 23, 3}, 1, 128}}) do
    local name, want = m[1], {block = m[2], layers = m[3], groups = m[4], width_per_group = m[5]}
    models.register(name, {
      description = ("torchvision %s -> nd.nn.models.%s; stem (7x7 ImageNet or 3x3 CIFAR), width and "
                     .. "num_classes from the weights"):format(name, name),
      build = function(sd) return resnet_build(name, sd, nil, want) end,
      input_example = image_example,
    })
  end

  models.register("mobilenet_v2", {
    options = {cifar = "boolean", width_mult = "number"},
    description = "torchvision MobileNetV2 -> nd.nn.models.MobileNetV2; num_classes and width_mult from the weights "
               .. "(or opts.width_mult); cifar = true (in Lua) for needle's stride-8 CIFAR variant",
    build = function(sd, opts)
      opts = opts or {}
      local cls = need(sd, "classifier.1.weight", 2, "mobilenet_v2")
      local wm = opts.width_mult or mobilenet_width(sd, "mobilenet_v2")
      return vision.MobileNetV2({num_classes = cls:size(1), width_mult = wm, cifar = opts.cifar})
    end,
    input_example = image_example,
  })
end

return M
