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
--
-- M.covered: the ops whose autograd node's backward ran inside a passing
-- gradcheck in this process (from the profiler's "<op>_backward" events), so
-- a spec can check that every op of the registry (nd.ops()) has a case.
local nd = require "needle"

local M = {covered = {}}

-- nd.grad(...) under the profiler; the names of the nodes it ran go to `into`.
local function grad_recording(into, ...)
  local args = table.pack(...)
  local report, result = nd.profile(function() return nd.grad(table.unpack(args, 1, args.n)) end)
  for name in pairs(report.by_name) do
    local op = name:match("^(.+)_backward$")
    if op then into[op] = true end
  end
  return result
end

local function weighted_sum(out, w) return (out * w):sum() end

-- returns ok, message
function M.gradcheck(build, leaves, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-6, opts.rtol or 1e-4
  local out = build(table.unpack(leaves))
  local w = nd.randn(out.shape, {dtype = "float64"})
  local ran = {}
  local analytical = grad_recording(ran, weighted_sum(out, w), leaves, {allow_unused = opts.allow_unused})
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
      -- written as not (<=) so that a NaN on either side fails (equal infinities pass)
      if not (av == num[k] or math.abs(av - num[k]) <= atol + rtol * math.abs(num[k])) then
        return false, ("leaf %d element %d: analytical %.10g, numerical %.10g"):format(li, k, av, num[k])
      end
    end
  end
  for op in pairs(ran) do M.covered[op] = true end
  -- ops with no node of their own (nd.ops(): records_node false) name
  -- themselves: {covers = {"narrow"}}
  for _, op in ipairs(opts.covers or {}) do M.covered[op] = true end
  return true
end

-- Where the gradchecks of some registry ops live, outside gradcheck_spec.lua
-- (each of those files ends with M.assert_covers for its own list, so the
-- claim is checked where the cases run; gradcheck_spec.lua accepts it).
M.ELSEWHERE = {
  ["gradcheck_index_spec.lua"] = {"cat", "stack", "flip", "pad", "cumsum", "sort", "topk", "gather",
    "scatter", "scatter_add", "index_select", "index_add", "masked_fill"},
  ["conv_spec.lua"] = {"conv2d", "conv_transpose2d", "im2col", "dilate", "undilate", "max_pool2d",
    "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d"},
  ["functional_spec.lua"] = {"softmax", "log_softmax", "layer_norm", "batch_norm", "cross_entropy",
    "linear"},
  ["compile_backward_spec.lua"] = {"compiled_forward"},
  ["nn_sequence_spec.lua"] = {"attention"},
  ["rnn_spec.lua"] = {"lstm_cell", "lstm_layer", "gru_cell", "gru_layer"},
}

-- In a busted spec: every op the file claims in M.ELSEWHERE had a passing
-- gradcheck in this file's run.
function M.assert_covers(assert, file)
  local missing = {}
  for _, op in ipairs(M.ELSEWHERE[file]) do
    if not M.covered[op] then missing[#missing + 1] = op end
  end
  assert(#missing == 0, file .. " claims gradcheck cases for ops it did not check: "
    .. table.concat(missing, ", "))
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
