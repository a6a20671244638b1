-- gradcheck.lua - finite-difference gradient checks in float64.
--
-- gradcheck(build, leaves, opts): `build(...)` receives the leaf tensors and
-- returns the op's output (it may make views of the leaves first, to test
-- non-contiguous and broadcast inputs). The output is reduced against a
-- fixed random weight, so every output element's gradient matters. The
-- analytical gradients (nd.grad) are compared with central differences
-- computed by perturbing each leaf element under no_grad.
--
-- In a spec, bound to its busted `assert` (as spec/helpers/assertions.lua's
-- bind is):
--   local C = require("spec.helpers.gradcheck").bind(assert, {atol = 1e-5, rtol = 1e-4})
--   C.check(build, leaves, opts)   -- gradcheck passes, else fails with its message
--   C.check2(build, leaves, opts)  -- gradgradcheck; opts default to bind's second
--                                  -- argument (nil: gradcheck's own defaults)
local nd = require "needle"

local M = {}

local function weighted_sum(out, w) return (out * w):sum() end

-- returns ok, message
function M.gradcheck(build, leaves, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-6, opts.rtol or 1e-4
  local out = build(table.unpack(leaves))
  local w = nd.randn(out.shape, {dtype = "float64"})
  local analytical = nd.grad(weighted_sum(out, w), leaves, {allow_unused = opts.allow_unused})
  for li, leaf in ipairs(leaves) do
    local flat = nd.no_grad(function() return leaf:view({-1}) end)
    local numel = leaf:numel()
    local num = {}
    for k = 1, numel do
      local x0 = flat[k]:item()
      -- writes into a leaf need no_grad; the evaluation keeps grad mode (a
      -- second-order check's function itself calls nd.grad)
      nd.no_grad(function() flat[k] = x0 + eps end)
      local plus = weighted_sum(build(table.unpack(leaves)), w):item()
      nd.no_grad(function() flat[k] = x0 - eps end)
      local minus = weighted_sum(build(table.unpack(leaves)), w):item()
      nd.no_grad(function() flat[k] = x0 end)
      num[k] = (plus - minus) / (2 * eps)
    end
    local a = analytical[li]
    local at = a and a:contiguous():view({-1}):totable() or {}
    for k = 1, numel do
      local av = a and at[k] or 0
      if math.abs(av - num[k]) > atol + rtol * math.abs(num[k]) then
        return false, ("leaf %d element %d: analytical %.10g, numerical %.10g"):format(li, k, av, num[k])
      end
    end
  end
  return true
end

-- second order: the gradient of <grad(out . w1, leaves), w2> w.r.t. the leaves
function M.gradgradcheck(build, leaves, opts)
  local w1
  local function first_grads(...)
    local ls = {...}
    local out = build(...)
    w1 = w1 or nd.randn(out.shape, {dtype = "float64"})
    local gs = nd.grad((out * w1):sum(), ls, {create_graph = true, allow_unused = true})
    local total
    for i = 1, #ls do
      if gs[i] then
        local s = gs[i]:sum() + (gs[i] * gs[i]):sum()
        total = total and total + s or s
      end
    end
    return total
  end
  return M.gradcheck(first_grads, leaves, opts)
end

-- float64 leaf of the given shape with values away from 0 (for log, div, ...)
function M.leaf(shape, lo, hi)
  lo, hi = lo or -1, hi or 1
  local t = nd.rand(shape, {dtype = "float64"}) * (hi - lo) + lo
  t.requires_grad = true
  return t
end

function M.bind(assert, check2_opts)
  local H = {}

  function H.check(build, leaves, opts)
    local ok, msg = M.gradcheck(build, leaves, opts)
    assert(ok, msg)
  end

  function H.check2(build, leaves, opts)
    local ok, msg = M.gradgradcheck(build, leaves, opts or check2_opts)
    assert(ok, msg)
  end

  return H
end

return M
