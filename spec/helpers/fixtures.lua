-- spec/helpers/fixtures.lua - the PyTorch fixtures (spec/fixtures/*.lua,
-- written by spec/fixtures/gen/gen_torch_*.py) and needle compared with them.
--
--   local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
--   local fixtures = X.load("torch_ops")  -- spec/fixtures/torch_ops.lua's cases
--   X.tensor(t)                  -- float32 tensor of a fixture's {shape = ..., data = ...}
--   X.close(what, got, want)     -- same shape, every element within
--                                -- 1e-5 * |want| + atol (atol: bind's second argument)
--   X.check_case(name, c, fn, opts)
--     -- fn(...) on c.inputs as float32 leaves that require grad; its first
--     -- result against c.output, then the gradients of sum(output * c.w)
--     -- against c.grads. opts.allow_unused: nd.grad's option, and an input
--     -- the output does not use must have a zero gradient in c.grads.
--     -- opts.after_output(...): called with all of fn's results once the
--     -- output has matched (extra results such as max_pool2d's indices).
--
-- bind takes the spec's busted `assert` (a required module sees the global
-- environment, not the one busted gives spec files), as
-- spec/helpers/assertions.lua does.
local nd = require "needle"

local M = {}

function M.load(name)
  return dofile("spec/fixtures/" .. name .. ".lua")
end

function M.tensor(t)
  return nd.tensor(t.data):reshape(t.shape)
end

function M.bind(assert, atol)
  local H = {load = M.load, tensor = M.tensor}

  function H.close(name, got, want)
    assert.are.same(want.shape, got.shape, name .. ": shape")
    local g = got:contiguous():view({-1}):totable()
    for i, w in ipairs(want.data) do
      -- not (<=): a NaN in needle's result (or in the fixture) fails
      if not (g[i] == w or math.abs(g[i] - w) <= 1e-5 * math.abs(w) + atol) then
        error(("%s: element %d is %.9g, PyTorch %.9g"):format(name, i, g[i], w), 2)
      end
    end
  end

  function H.check_case(name, c, fn, opts)
    opts = opts or {}
    local inputs = {}
    for i, t in ipairs(c.inputs) do
      inputs[i] = M.tensor(t)
      inputs[i].requires_grad = true
    end
    local results = table.pack(fn(table.unpack(inputs)))
    local out = results[1]
    H.close(name .. " output", out, c.output)
    if opts.after_output then opts.after_output(table.unpack(results, 1, results.n)) end
    local loss = (out * M.tensor(c.w)):sum()
    if opts.allow_unused then
      local grads = nd.grad(loss, inputs, {allow_unused = true})
      for i = 1, #inputs do
        local g = grads[i] or nd.zeros(c.inputs[i].shape)
        H.close(name .. " grad " .. i, g, c.grads[i])
      end
    else
      local grads = nd.grad(loss, inputs)
      for i = 1, #inputs do H.close(name .. " grad " .. i, grads[i], c.grads[i]) end
    end
  end

  return H
end

return M
