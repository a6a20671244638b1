-- autograd_function_spec.lua - nd.autograd.Function (custom differentiable
-- functions with a Lua backward; docs/autograd.md) and the gradient-ready
-- and backward-end hooks DistributedDataParallel uses.
--
--   build/needle-lua spec/run.lua spec/autograd_function_spec.lua
local nd = require "needle"
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)

-- f(x, y) = x * sin(y), with its formula written out
local MulSin = nd.autograd.Function{
  name = "mul_sin",
  forward = function(ctx, x, y)
    ctx:save_for_backward(x, y)
    return x * y:sin()
  end,
  backward = function(ctx, g)
    local x, y = ctx.saved_tensors[1], ctx.saved_tensors[2]
    return g * y:sin(), g * x * y:cos()
  end,
}

describe("autograd.Function", function()
  it("its gradients pass a float64 finite-difference check, broadcast inputs included", function()
    nd.manual_seed(11)
    C.check(function(a, b) return MulSin(a, b) end, {G.leaf({3, 4}), G.leaf({3, 4})})
    C.check(function(a, b) return MulSin(a:t(), b:t()) end, {G.leaf({3, 4}), G.leaf({3, 4})})
    C.check(function(a, b) return MulSin(a, b:expand({3, 4})) end, {G.leaf({3, 4}), G.leaf({1, 4})})
  end)

  it("gives gradients of gradients when its backward uses differentiable ops", function()
    nd.manual_seed(12)
    C.check2(function(a, b) return MulSin(a, b) end, {G.leaf({5}), G.leaf({5})})
  end)

  it("records only when grad is on and an input requires it; grad_fn has its name", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local y = MulSin(x, nd.tensor({0.5, 0.25}))
    assert.are.equal("mul_sin", y.grad_fn)
    assert.is_true(y.requires_grad)
    local z = MulSin(nd.tensor({1, 2}), nd.tensor({0.5, 0.25}))
    assert.is_false(z.requires_grad)
    local w = nd.no_grad(function() return MulSin(x, nd.tensor({0.5, 0.25})) end)
    assert.is_false(w.requires_grad)
  end)

  it("arguments that are not tensors get no gradient", function()
    local Scale = nd.autograd.Function{
      forward = function(ctx, x, k) ctx.k = k; return x * k end,
      backward = function(ctx, g) return g * ctx.k, nil end,
    }
    local x = nd.tensor({1, 2, 3}, {requires_grad = true})
    Scale(x, 3):sum():backward()
    assert.are.same({3, 3, 3}, x.grad:totable())
  end)

  it("a wrong backward is an error, not a wrong gradient", function()
    local Bad = nd.autograd.Function{
      name = "bad",
      forward = function(_, x) return x * 2 end,
      backward = function(_, g) return g:sum() end,
    }
    local x = nd.ones({3}, {requires_grad = true})
    local ok, err = pcall(function() Bad(x):sum():backward() end)
    assert.is_false(ok)
    assert.matches("bad returned a gradient of shape {} for an input of shape {3}", err, 1, true)
    local Raises = nd.autograd.Function{
      forward = function(_, x) return x end,
      backward = function() error("no backward today") end,
    }
    ok, err = pcall(function() Raises(x):sum():backward() end)
    assert.is_false(ok)
    assert.matches("no backward today", err, 1, true)
    local Wrong = nd.autograd.Function{
      forward = function(_, x) return x end,
      backward = function() return "grad" end,
    }
    ok, err = pcall(function() Wrong(x):sum():backward() end)
    assert.is_false(ok)
    assert.matches("returned a string as gradient 1; expected a tensor or nil", err, 1, true)
    assert.has_error(function() nd.autograd.Function{forward = function() end} end,
                     "needle.autograd.Function: needs both forward and backward functions")
    assert.has_error(function() nd.autograd.Function{forward = print, backward = print, nmae = "x"} end,
                     "needle.autograd.Function: unknown option 'nmae' (valid: backward, forward, name, traceable)")
    local NotTensor = nd.autograd.Function{forward = function() return 1 end, backward = print}
    assert.has_error(function() NotTensor(x) end,
                     "needle.autograd.Function: custom: forward must return a tensor, got 1")
  end)

  it("a loop of 5000 calls frees what the functions saved", function()
    local x = nd.randn({64, 64}, {requires_grad = true})
    collectgarbage()
    local before = nd.live_bytes()
    for _ = 1, 5000 do
      MulSin(x, x):sum():backward()
      x.grad = nil
    end
    MulSin(nd.ones({1}), nd.ones({1})) -- lets the bindings drop their last dead entries
    collectgarbage()
    collectgarbage()
    assert.is_true(nd.live_bytes() - before < 64 * 64 * 4 * 4,
                   ("%d bytes still live"):format(nd.live_bytes() - before))
  end)
end)

describe("gradient-ready hooks (core._set_grad_hook, what DistributedDataParallel uses)", function()
  local core = require "needle.core"

  it("fire once per backward, after a parameter's last contribution, with the whole gradient", function()
    local w = nd.tensor({1, 2, 3}, {requires_grad = true, dtype = "float64"})
    local seen = {}
    core._set_grad_hook(w, function(t) seen[#seen + 1] = t.grad:clone() end)
    -- w reaches the loss three times: the hook sees the sum of all three
    local loss = (w * 2):sum() + (w * w):sum() + w:sum()
    loss:backward()
    assert.are.equal(1, #seen)
    assert.are.same({5, 7, 9}, seen[1]:totable())
    -- nd.grad leaves grad alone, so it reports nothing
    nd.grad((w * 3):sum(), w)
    assert.are.equal(1, #seen)
    -- a second backward, accumulating: the hook sees the running total
    ;(w * 4):sum():backward()
    assert.are.equal(2, #seen)
    assert.are.same({9, 11, 13}, seen[2]:totable())
    core._set_grad_hook(w, nil)
    ;(w * 4):sum():backward()
    assert.are.equal(2, #seen)
  end)

  it("an error in a hook ends the backward with it", function()
    local w = nd.tensor({1, 2}, {requires_grad = true})
    core._set_grad_hook(w, function() error("hook says no") end)
    local ok, err = pcall(function() (w * 2):sum():backward() end)
    core._set_grad_hook(w, nil)
    assert.is_false(ok)
    assert.matches("a gradient hook failed: .*hook says no", err)
  end)

  it("only leaves take one", function()
    local w = nd.tensor({1, 2}, {requires_grad = true})
    assert.has_error(function() core._set_grad_hook(w * 2, function() end) end)
  end)

  it("backward-end hooks see failure, nesting and create_graph", function()
    local calls = {}
    local key = {}
    core._set_backward_end_hook(key, function(ok, nested, create) calls[#calls + 1] = {ok, nested, create} end)
    local x = nd.tensor({1, 2}, {requires_grad = true})
    ;(x * 2):sum():backward()
    local Inner = nd.autograd.Function{
      forward = function(_, t) return t * 1 end,
      backward = function(_, g) local u = nd.tensor({1}, {requires_grad = true}); (u * 2):sum():backward(); return g end,
    }
    Inner(x):sum():backward({create_graph = true})
    local Fails = nd.autograd.Function{forward = function(_, t) return t * 1 end,
                                       backward = function() error("nope") end}
    pcall(function() Fails(x):sum():backward() end)
    core._set_backward_end_hook(key, nil)
    ;(x * 2):sum():backward()
    assert.are.same({{true, false, false}, {true, true, true}, {false, false, false}}, calls)
  end)
end)

describe("custom nodes' names", function()
  -- a node keeps its own interned copy of the name: a name built at run time may be
  -- collected before the node, and the profiler names backward events by the pointer
  it("stay right when run-time names are collected and their nodes freed in turn", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    for round = 1, 3 do
      for _, which in ipairs({"alpha", "beta"}) do
        local F = nd.autograd.Function{name = "custom_" .. which .. string.rep("x", round % 2),
                                       forward = function(_, t) return t * 2 end,
                                       backward = function(_, g) return g * 2 end}
        local report = nd.profile(function() F(x):sum():backward() end)
        local want = ("custom_%s%s_backward"):format(which, string.rep("x", round % 2))
        assert.is_not_nil(report.by_name[want], want .. " missing from " ..
          table.concat((function() local t = {} for k in pairs(report.by_name) do t[#t + 1] = k end return t end)(), ", "))
        F = nil
        collectgarbage()
        collectgarbage()
      end
    end
  end)
end)
