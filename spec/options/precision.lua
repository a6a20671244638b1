-- nd.autocast and nd.amp.GradScaler (spec/matmul_precision_spec.lua and
-- spec/amp_spec.lua have the rest of their errors)
return function(nd)
  return {rest = {
    {"autocast", "device_type, dtype, enabled", function(o) return nd.autocast(function() end, o) end},
    {"amp.GradScaler", "backoff_factor, enabled, growth_factor, growth_interval, init_scale",
     function(o) return nd.amp.GradScaler(o) end},
  }}
end
