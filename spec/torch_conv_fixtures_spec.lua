-- torch_conv_fixtures_spec.lua - conv2d, conv_transpose2d and the pools
-- against PyTorch, from the fixtures spec/fixtures/gen/gen_torch_conv.py
-- wrote: outputs, gradients and max_pool2d's indices (ties included) in
-- float32, rtol 1e-5 with an absolute floor of 1e-5 (conv outputs are sums
-- of up to a few dozen products). PyTorch is not needed here.
local nd = require "needle"
local X = require("spec.helpers.fixtures").bind(assert, 1e-5)
local fixtures = X.load("torch_conv")

-- the needle call for a fixture: its op with the stored options
local calls = {
  conv2d = function(c, x, w, b) return nd.conv2d(x, w, b, c.opts) end,
  conv_transpose2d = function(c, x, w, b) return nd.conv_transpose2d(x, w, b, c.opts) end,
  max_pool2d = function(c, x)
    local o = {return_indices = true}
    for k, v in pairs(c.opts) do if k ~= "kernel_size" then o[k] = v end end
    return nd.max_pool2d(x, c.opts.kernel_size, o)
  end,
  avg_pool2d = function(c, x)
    local o = {}
    for k, v in pairs(c.opts) do if k ~= "kernel_size" then o[k] = v end end
    return nd.avg_pool2d(x, c.opts.kernel_size, o)
  end,
  adaptive_avg_pool2d = function(c, x) return nd.adaptive_avg_pool2d(x, c.opts.output_size) end,
}

describe("conv and pooling against PyTorch fixtures", function()
  it("cover every op, with ties, ceil_mode, groups, dilation and output_padding", function()
    local seen = {}
    for _, c in ipairs(fixtures) do seen[c.op] = (seen[c.op] or 0) + 1 end
    for op in pairs(calls) do assert.is_true((seen[op] or 0) >= 3, op) end
  end)

  for _, c in ipairs(fixtures) do
    it(c.name, function()
      local call = assert(calls[c.op], "no needle op for fixture op " .. c.op)
      X.check_case(c.name, c, function(...) return call(c, ...) end, {
        after_output = function(_, indices)
          if c.indices then
            assert.are.same(c.indices.shape, indices.shape)
            assert.are.same("int64", indices.dtype)
            assert.are.same(c.indices.data, indices:contiguous():view({-1}):totable(),
              c.name .. ": indices (1-based, first of tied maxima)")
          end
        end,
      })
    end)
  end
end)
