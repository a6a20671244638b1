-- the hooks and Module API of issue 20 (spec/hooks_spec.lua and
-- spec/module_api_spec.lua have the rest of their errors)
return function(nd)
  local nn = nd.nn
  local function linear() return nn.Linear(2, 2) end
  return {rest = {
    {"nn.Linear.register_forward_pre_hook", "prepend",
     function(o) return linear():register_forward_pre_hook(function() end, o) end},
    {"nn.Linear.register_forward_hook", "prepend",
     function(o) return linear():register_forward_hook(function() end, o) end},
    {"nn.Linear.register_full_backward_hook", "prepend",
     function(o) return linear():register_full_backward_hook(function() end, o) end},
    {"nn.Linear.register_buffer", "persistent",
     function(o) return linear():register_buffer("b", nd.zeros({1}), o) end},
    {"nn.Module.summary", "depth, device, dtype, verbose", function(o)
      o.verbose = o.verbose or 0
      return linear():summary({1, 2}, o)
    end},
  }}
end
