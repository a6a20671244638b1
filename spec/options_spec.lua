-- options_spec.lua - every options table (PyTorch's keyword arguments)
-- rejects a misspelt key, naming the valid ones in sorted order, and a value
-- of the wrong type for a known key (issue 15). One table per area lists
-- every public function that takes options; the nn table is checked against
-- nd.nn itself, so a new module cannot skip the check.
--
--   build/needle-lua spec/run.lua spec/options_spec.lua

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

-- fn(opts) must raise "needle.<who>: unknown option '<bad>' (valid: <valid>)"
-- for opts = {[bad] = 1} and accept an empty table
local function rejects(who, valid, fn, bad)
  bad = bad or "bogus"
  local msg = errmsg(fn, {[bad] = 1})
  assert_contains(msg, ("needle.%s: unknown option '%s' (%s)"):format(who, bad,
    valid == "" and "it takes no options" or "valid: " .. valid))
  local ok, e = pcall(fn, {})
  assert(ok, ("%s rejects an empty options table: %s"):format(who, tostring(e)))
end

-- C functions --------------------------------------------------------------------

describe("the C functions' options", function()
  local NEW = "device, dtype, requires_grad"
  local x = nd.zeros({2, 2})
  local img, w = nd.zeros({1, 1, 4, 4}), nd.zeros({1, 1, 3, 3})
  local cases = {
    {"tensor", NEW, function(o) return nd.tensor({1, 2}, o) end},
    {"tensor", NEW, function(o) return nd.tensor(x, o) end},
    {"zeros", NEW, function(o) return nd.zeros({2}, o) end},
    {"zeros", NEW, function(o) return nd.zeros(2, 3, o) end},
    {"ones", NEW, function(o) return nd.ones({2}, o) end},
    {"empty", NEW, function(o) return nd.empty({2}, o) end},
    {"full", NEW, function(o) return nd.full({2}, 7, o) end},
    {"rand", NEW, function(o) return nd.rand({2}, o) end},
    {"randn", NEW, function(o) return nd.randn({2}, o) end},
    {"randint", NEW, function(o) return nd.randint(1, 5, {2}, o) end},
    {"zeros_like", NEW, function(o) return nd.zeros_like(x, o) end},
    {"ones_like", NEW, function(o) return nd.ones_like(x, o) end},
    {"full_like", NEW, function(o) return nd.full_like(x, 3, o) end},
    {"rand_like", NEW, function(o) return nd.rand_like(x, o) end},
    {"randn_like", NEW, function(o) return nd.randn_like(x, o) end},
    {"arange", NEW, function(o) return nd.arange(4, o) end},
    {"arange", NEW, function(o) return nd.arange(1, 4, 2, o) end},
    {"linspace", NEW, function(o) return nd.linspace(0, 1, 3, o) end},
    {"eye", NEW, function(o) return nd.eye(2, o) end},
    {"eye", NEW, function(o) return nd.eye(2, 3, o) end},
    {"to", "device, dtype", function(o) return x:to(o) end},
    {"backward", "create_graph, retain_graph", function(o)
      local p = nd.tensor({1, 2}, {requires_grad = true})
      return (p * p):sum():backward(next(o) and o or nil)
    end},
    {"grad", "allow_unused, create_graph, grad_outputs, retain_graph", function(o)
      local p = nd.tensor({1, 2}, {requires_grad = true})
      return nd.grad((p * p):sum(), p, o)
    end},
    {"conv2d", "dilation, groups, padding, stride", function(o) return nd.conv2d(img, w, nil, o) end},
    {"conv2d", "dilation, groups, padding, stride", function(o) return nd.F.conv2d(img, w, o) end},
    {"conv_transpose2d", "dilation, groups, output_padding, padding, stride",
     function(o) return nd.conv_transpose2d(img, w, nil, o) end},
    {"max_pool2d", "ceil_mode, dilation, padding, return_indices, stride",
     function(o) return nd.max_pool2d(img, 2, o) end},
    {"avg_pool2d", "ceil_mode, count_include_pad, padding, stride", function(o) return nd.avg_pool2d(img, 2, o) end},
    {"fused_conv2d", "activation, dilation, groups, padding, stride",
     function(o) return nd.fused_conv2d(img, w, nil, o) end},
    {"fused_linear", "activation", function(o) return nd.fused_linear(x, x, nil, o) end},
  }

  it("reject an unknown key, naming the valid ones sorted", function()
    for _, c in ipairs(cases) do rejects(c[1], c[2], c[3]) end
  end)

  it("the issue's example: nd.tensor(t, {dtyp = ...}) is an error, not float32", function()
    assert_contains(errmsg(nd.tensor, {1, 2}, {dtyp = "float64"}),
                    "needle.tensor: unknown option 'dtyp' (valid: device, dtype, requires_grad)")
    assert.are.equal("float64", nd.tensor({1, 2}, {dtype = "float64"}).dtype)
  end)

  it("report the first unknown key in sorted order, list entries first", function()
    for _ = 1, 5 do
      assert_contains(errmsg(nd.zeros, {2}, {zz = 1, bb = 2, dtype = "float32", yy = 3}), "unknown option 'bb'")
    end
    assert_contains(errmsg(nd.zeros, {2}, {"float64", zz = 1}), "needle.zeros: unknown option [1] (valid: ")
  end)

  it("reject a value of the wrong type for a known key", function()
    assert_contains(errmsg(nd.zeros, {2}, {requires_grad = "yes"}),
                    "needle.zeros: option 'requires_grad' must be a boolean, got string")
    assert_contains(errmsg(nd.tensor, {1}, {requires_grad = 1}),
                    "needle.tensor: option 'requires_grad' must be a boolean, got number")
    assert_contains(errmsg(nd.zeros, {2}, {dtype = 64}), "needle.zeros: dtype must be a string, got number")
    assert_contains(errmsg(nd.ones, {2}, {device = true}), "needle.ones: device must be a string")
    assert_contains(errmsg(nd.max_pool2d, img, 2, {ceil_mode = 1}),
                    "needle.max_pool2d: option 'ceil_mode' must be a boolean, got number")
    assert_contains(errmsg(nd.avg_pool2d, img, 2, {count_include_pad = "no"}),
                    "needle.avg_pool2d: option 'count_include_pad' must be a boolean, got string")
    local p = nd.tensor({1, 2}, {requires_grad = true})
    assert_contains(errmsg(nd.grad, (p * p):sum(), p, {create_graph = "yes"}),
                    "needle.grad: option 'create_graph' must be a boolean, got string")
  end)

  it("reject options that are not a table", function()
    assert_contains(errmsg(nd.tensor, {1}, "float64"), "needle.tensor: expected an options table as argument 2, got string")
    assert_contains(errmsg(nd.zeros_like, x, "float64"), "needle.zeros_like: expected an options table as argument 2")
    assert_contains(errmsg(nd.linspace, 0, 1, 3, true), "needle.linspace: expected an options table as argument 4")
  end)

  it("nd.opencl.tune checks its keys before it does anything", function()
    local ok = nd.opencl.available()
    if not ok then return end
    rejects("opencl_tune", "budget_s, device, forget, layouts, query, save, sizes, verbose",
            function(o) if next(o) == nil then return end return nd.opencl.tune(o) end)
    assert_contains(errmsg(nd.opencl.tune, {query = "yes"}), "option 'query' must be a boolean, got string")
  end)
end)
