-- nd.autocast (spec/matmul_precision_spec.lua has the rest of its errors)
return function(nd)
  return {rest = {
    {"autocast", "device_type, dtype, enabled", function(o) return nd.autocast(function() end, o) end},
  }}
end
