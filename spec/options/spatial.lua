-- spec/options/spatial.lua - the options tables of the spatial layers (issue
-- 20): the 1-d/3-d convolutions and pools, adaptive_max_pool2d, the
-- per-sample norms, interpolate/Upsample, pad, one_hot and their modules.
-- Merged into options_spec.lua; spec/nn_spatial_spec.lua has the rest of
-- their errors.
return function(nd)
  local nn, F = nd.nn, nd.F
  local CONV = "bias, device, dilation, dtype, groups, padding, padding_mode, stride"
  local x1, w1 = nd.randn({1, 2, 6}), nd.randn({2, 2, 3})
  local x2 = nd.randn({1, 2, 4, 4})
  local x3, w3 = nd.randn({1, 2, 3, 3, 3}), nd.randn({2, 2, 2, 2, 2})
  -- interpolate and Upsample need a size or a scale_factor
  local function sized(o)
    if o.size == nil and o.scale_factor == nil then o.size = 3 end
    return o
  end
  return {
    nn = {
      Conv1d = {CONV, function(o) return nn.Conv1d(2, 2, 3, o) end},
      Conv3d = {CONV, function(o) return nn.Conv3d(2, 2, 3, o) end},
      ConvTranspose1d = {"bias, device, dilation, dtype, groups, output_padding, padding, padding_mode, stride",
                         function(o) return nn.ConvTranspose1d(2, 2, 3, o) end},
      MaxPool1d = {"ceil_mode, dilation, padding, return_indices, stride", function(o) return nn.MaxPool1d(2, o) end},
      AvgPool1d = {"ceil_mode, count_include_pad, padding, stride", function(o) return nn.AvgPool1d(2, o) end},
      AdaptiveMaxPool2d = {"return_indices", function(o) return nn.AdaptiveMaxPool2d(2, o) end},
      GroupNorm = {"affine, device, dtype, eps", function(o) return nn.GroupNorm(2, 4, o) end},
      InstanceNorm2d = {"affine, device, dtype, eps, momentum, track_running_stats",
                        function(o) return nn.InstanceNorm2d(3, o) end},
      RMSNorm = {"device, dtype, elementwise_affine, eps", function(o) return nn.RMSNorm(4, o) end},
      Upsample = {"align_corners, mode, recompute_scale_factor, scale_factor, size",
                  function(o) return nn.Upsample(sized(o)) end},
      Dropout2d = {"inplace, p", function(o) return nn.Dropout2d(o) end},
    },
    nn_none = {PixelShuffle = "takes an upscale factor", PixelUnshuffle = "takes a downscale factor"},
    F = {
      conv1d = {"dilation, groups, padding, stride", function(o) return F.conv1d(x1, w1, nil, o) end},
      conv3d = {"dilation, groups, padding, stride", function(o) return F.conv3d(x3, w3, nil, o) end},
      conv_transpose1d = {"dilation, groups, output_padding, padding, stride",
                          function(o) return F.conv_transpose1d(x1, w1, nil, o) end},
      max_pool1d = {"ceil_mode, dilation, padding, return_indices, stride", function(o) return F.max_pool1d(x1, 2, o) end},
      avg_pool1d = {"ceil_mode, count_include_pad, padding, stride", function(o) return F.avg_pool1d(x1, 2, o) end},
      adaptive_max_pool2d = {"return_indices", function(o) return F.adaptive_max_pool2d(x2, 3, o) end},
      group_norm = {"bias, eps, weight", function(o) return F.group_norm(x2, 2, o) end},
      instance_norm = {"bias, eps, momentum, running_mean, running_var, use_input_stats, weight",
                       function(o) return F.instance_norm(x2, o) end},
      rms_norm = {"eps, weight", function(o) return F.rms_norm(x2, 4, o) end},
      interpolate = {"align_corners, antialias, mode, recompute_scale_factor, scale_factor, size",
                     function(o) return F.interpolate(x2, sized(o)) end},
      pad = {"mode, value", function(o) return F.pad(x2, {1, 1}, o) end},
      one_hot = {"num_classes", function(o) return F.one_hot({1, 2}, o) end},
    },
    -- positional arguments only, as F.dropout
    F_none = {pixel_shuffle = 1, pixel_unshuffle = 1, dropout2d = 1},
  }
end
