-- spec/options/zoo_vision.lua - the options tables of torchvision's ResNet and
-- MobileNetV2 in needle (issue 21, needle.zoo.vision): the nd.nn.models
-- constructors and classes, and convert.model('resnet*') /
-- convert.model('mobilenet_v2'). Merged into options_spec.lua;
-- spec/zoo_vision_spec.lua has the rest of their errors.
return function(nd)
  local models = nd.nn.models
  local RESNET = "cifar, device, dtype, groups, num_classes, width, width_per_group, zero_init_residual"
  local MOBILENET = "cifar, device, dropout, dtype, num_classes, width_mult"
  -- small models: the defaults build the full ImageNet networks
  local function narrow(o)
    if o.width == nil then o.width = 2 end
    return o
  end
  local function thin(o)
    if o.width_mult == nil then o.width_mult = 0.1 end
    return o
  end
  local resnet_sd = models.resnet18({width = 2, num_classes = 3}):state_dict()
  local mobilenet_sd = models.mobilenet_v2({width_mult = 0.1, num_classes = 3}):state_dict()
  return {
    models = {
      resnet18 = {RESNET, function(o) return models.resnet18(narrow(o)) end},
      resnet34 = {RESNET, function(o) return models.resnet34(narrow(o)) end},
      resnet50 = {RESNET, function(o) return models.resnet50(narrow(o)) end},
      ResNet = {RESNET, function(o) return models.ResNet("basic", {1, 1, 1, 1}, narrow(o)) end},
      mobilenet_v2 = {MOBILENET, function(o) return models.mobilenet_v2(thin(o)) end},
      MobileNetV2 = {MOBILENET, function(o) return models.MobileNetV2(thin(o)) end},
      Bottleneck = {"base_width, downsample, groups, stride", function(o) return models.Bottleneck(8, 2, o) end},
      resnext50_32x4d = {RESNET, function(o)
        if o.width == nil then o.width = 16 end -- (16 * 4 / 64 * 32 = 32 channels per 3x3 in layer1)
        return models.resnext50_32x4d(o)
      end},
      wide_resnet50_2 = {RESNET, function(o) return models.wide_resnet50_2(narrow(o)) end},
    },
    models_none = {InvertedResidual = "takes sizes (inp, oup, stride, expand_ratio), as torchvision's"},
    rest = {
      {"nn.models.BasicBlock", "base_width, downsample, groups, stride",
       function(o) return require("needle.zoo.vision").BasicBlock(2, 2, o) end},
      {"convert.model('resnet')", "convert_dtype, mapping, strict",
       function(o) return nd.convert.model("resnet", resnet_sd, o) end},
      {"convert.model('resnet18')", "convert_dtype, mapping, strict",
       function(o) return nd.convert.model("resnet18", resnet_sd, o) end},
      {"convert.model('mobilenet_v2')", "cifar, convert_dtype, mapping, strict, width_mult",
       function(o) return nd.convert.model("mobilenet_v2", mobilenet_sd, o) end},
    },
  }
end
