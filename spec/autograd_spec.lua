-- autograd_spec.lua - the engine's behaviour (numerical correctness of each
-- formula is gradcheck_spec's job): accumulation, graph freeing,
-- retain_graph/create_graph, grad modes, the version counter, and the error
-- messages for misuse.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local err_of, has = A.err_of, A.has

describe("autograd", function()
  it("leaves, non-leaves and grad_fn", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local y = x * 2
    assert.is_true(x.is_leaf)
    assert.is_false(y.is_leaf)
    assert.are.equal("mul", y.grad_fn)
    assert.is_nil(x.grad_fn)
    assert.is_true(y.requires_grad)
    assert.is_false((nd.ones({2}) * 2).requires_grad)
  end)

  it("gradients accumulate across backward calls until cleared", function()
    local x = nd.tensor({1, 2, 3}, {requires_grad = true});
    (x * x):sum():backward();
    (x * 3):sum():backward()
    assert.are.same({5, 7, 9}, x.grad:totable()) -- 2x + 3
    x.grad = nil;
    (x * 3):sum():backward()
    assert.are.same({3, 3, 3}, x.grad:totable())
  end)

  it("a value used twice gets both contributions", function()
    local x = nd.tensor({2}, {requires_grad = true})
    local y = x * x + x * 3 -- 2x + 3 = 7
    y:sum():backward()
    assert.are.same({7}, x.grad:totable())
  end)

  it("backward with an explicit gradient for a non-scalar output", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local y = x * 3
    y:backward(nd.tensor({1, 10}))
    assert.are.same({3, 30}, x.grad:totable())
    local e = err_of(function() (x * 3):backward() end)
    has(e, "needle.backward: a gradient can be created implicitly only for a one-element tensor, but this one has shape {2}")
    e = err_of(function() (x * 3):backward(nd.ones({3})) end)
    has(e, "gradient of shape {3} does not match the tensor's shape {2}")
  end)

  it("a second backward through a freed graph is an error; retain_graph keeps it", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local y = (x:exp()):sum()
    y:backward()
    local e = err_of(function() y:backward() end)
    has(e, "trying to backward through exp a second time")
    has(e, "retain_graph=true")
    local z = (x:exp()):sum()
    z:backward({retain_graph = true})
    z:backward()
    assert.is_near(2 * math.exp(1) + math.exp(1), x.grad:totable()[1], 1e-4)
  end)

  it("modifying a saved tensor in place is caught at backward time", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local h = x * 1      -- non-leaf
    local y = h:exp()    -- saves its output
    local out = (y * 2):sum()
    nd.no_grad(function() y:add_(1) end)
    local e = err_of(function() out:backward() end)
    has(e, "saved for its gradient was modified in place afterwards")
    has(e, "exp")
  end)

  it("in-place ops on tensors that require grad are refused outside no_grad", function()
    local w = nd.ones({2}, {requires_grad = true})
    local e = err_of(function() w:add_(1) end)
    has(e, "needle.add_: in-place operation on a tensor that requires grad (a leaf)")
    e = err_of(function() w[1] = 5 end)
    has(e, "in-place operation on a tensor that requires grad")
    nd.no_grad(function() w:sub_(0.5) end) -- how optimizers update parameters
    assert.are.same({0.5, 0.5}, w:totable())
  end)

  it("no_grad and enable_grad nest, return values, and restore the mode on errors", function()
    local x = nd.ones({2}, {requires_grad = true})
    local a, b = nd.no_grad(function(k) return x * k, 7 end, 3)
    assert.is_false(a.requires_grad)
    assert.are.equal(7, b)
    nd.no_grad(function()
      assert.is_false(nd.is_grad_enabled())
      local y = nd.enable_grad(function() return x * 2 end)
      assert.is_true(y.requires_grad)
    end)
    assert.is_true(nd.is_grad_enabled())
    local ok = pcall(nd.no_grad, function() error("boom") end)
    assert.is_false(ok)
    assert.is_true(nd.is_grad_enabled())
  end)

  it("detach shares memory but has no history", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local d = (x * 2):detach()
    assert.is_false(d.requires_grad)
    assert.is_true(d.is_leaf)
    assert.are.same({2, 4}, d:totable())
  end)

  it("nd.grad returns gradients without touching .grad", function()
    local x = nd.tensor({1, 2}, {requires_grad = true})
    local y = nd.tensor({3, 4}, {requires_grad = true})
    local gs = nd.grad((x * y):sum(), {x, y})
    assert.are.same({3, 4}, gs[1]:totable())
    assert.are.same({1, 2}, gs[2]:totable())
    assert.is_nil(x.grad)
    local z = nd.tensor({1}, {requires_grad = true})
    local e = err_of(function() return nd.grad((x * 2):sum(), z) end)
    has(e, "needle.grad: input 1 is not used in the graph of the outputs")
    local g = nd.grad((x * 2):sum(), {x, z}, {allow_unused = true})
    assert.are.same({2, 2}, g[1]:totable())
    assert.is_nil(g[2])
  end)

  it("create_graph gives gradients of gradients", function()
    local x = nd.tensor({1, 2, 3}, {dtype = "float64", requires_grad = true})
    local g = nd.grad((x ^ 3):sum(), x, {create_graph = true}) -- 3x^2
    assert.are.same({3, 12, 27}, g:totable())
    local gg = nd.grad(g:sum(), x) -- 6x
    assert.are.same({6, 12, 18}, gg:totable())
  end)

  it("integer tensors cannot require grad; gradient of a tensor that needs none", function()
    local e = err_of(function() nd.arange(3).requires_grad = true end)
    has(e, "needle.requires_grad: only floating point tensors can require gradients, got int64")
    e = err_of(function() nd.ones({1}):sum():backward() end)
    has(e, "needle.backward: the tensor does not require grad")
    e = err_of(function() return nd.zeros({2}, {dtype = "int64", requires_grad = true}) end)
    has(e, "only floating point tensors can require gradients")
  end)

  it("a non-leaf cannot stop requiring grad", function()
    local x = nd.ones({2}, {requires_grad = true})
    local y = x * 2
    local e = err_of(function() y.requires_grad = false end)
    has(e, "only leaf tensors can stop requiring grad")
  end)

  it("a chain of 100000 ops is built and freed without deep recursion", function()
    local x = nd.ones({1}, {requires_grad = true})
    local y = x
    for _ = 1, 100000 do y = y * 1 end
    y:sum():backward()
    assert.are.same({1}, x.grad:totable())
    y = nil
    collectgarbage()
  end)

  it("graphs of a training loop are freed: 10000 steps keep memory flat", function()
    nd.manual_seed(0)
    local W = nd.randn({8, 4}) * 0.1; W.requires_grad = true
    local X, Y = nd.randn({32, 8}), nd.randn({32, 4})
    local function rss()
      local f = assert(io.open("/proc/self/statm"))
      local pages = tonumber(f:read("a"):match("^%d+%s+(%d+)"))
      f:close()
      return pages * 4096
    end
    local live, rss1000
    for step = 1, 10000 do
      local loss = ((X:matmul(W) - Y) ^ 2):mean()
      W.grad = nil
      loss:backward()
      nd.no_grad(function() W:sub_(W.grad * 0.05) end)
      if step == 1000 then collectgarbage(); live = nd.live_bytes(); rss1000 = rss() end
    end
    collectgarbage()
    assert.is_true(nd.live_bytes() <= live + 1024, ("live bytes %d, at step 1000 %d"):format(nd.live_bytes(), live))
    if not nd._SANITIZE then -- ASan's quarantine makes RSS meaningless there
      local grown = rss() - rss1000
      assert(grown < 8 * 1024 * 1024, ("RSS grew by %.1f MiB over 9000 steps"):format(grown / 2^20))
    end
  end)

  it("a tensor cannot be its own gradient; the dtype must match", function()
    local x = nd.zeros({2}, {requires_grad = true})
    local e = err_of(function() x.grad = x end)
    has(e, "needle.grad: a tensor cannot be its own gradient")
    e = err_of(function() x.grad = nd.zeros({2}, {dtype = "float64"}) end)
    has(e, "dtype float64, expected float32")
  end)

  it("select and slice backwards add into one gradient of their input, as the composed backward does", function()
    -- a loop over the steps of a sequence, as the RNNs do: each step's gradient goes into its
    -- slice of one zeros tensor (not a zeros tensor per step, summed afterwards)
    local function run(create_graph)
      nd.manual_seed(3)
      local x = nd.randn({7, 3, 8}, {requires_grad = true})
      local xw = x * 2 -- an intermediate: its pending gradient collects the slices
      local loss = nd.zeros({})
      for t = 1, 7 do
        local part = xw[t]:narrow(2, 2, 5) + xw[t]:narrow(2, 1, 4):sum(2, true) -- overlapping slices
        loss = loss + (part * t):tanh():sum()
      end
      loss = loss + (xw:narrow(1, 2, 3) * 0.5):sum() -- and a whole-tensor slice on top
      loss:backward({create_graph = create_graph})
      local g = x.grad
      x.grad = nil -- with create_graph, x.grad's graph holds x: a cycle refcounts never free
      return g
    end
    local fast, composed = run(false), run(true) -- create_graph keeps the differentiable formulas
    assert.are.equal(0, (fast - composed:detach()):abs():max():item())
    -- a gradient the engine may not write in place is copied first: here y's pending gradient
    -- is sum's backward, an expanded view of one number, when y[1]'s slice arrives
    local x1 = nd.zeros({3, 2}, {requires_grad = true})
    local x2 = nd.zeros({3, 2}, {requires_grad = true})
    local y, c = x1 * 1, x2 * 1
    local loss = (y[1] * 3):sum() + (y + c):sum()
    loss:backward()
    assert.are.same({{4, 4}, {1, 1}, {1, 1}}, x1.grad:totable())
    assert.are.same({{1, 1}, {1, 1}, {1, 1}}, x2.grad:totable())
  end)
end)
describe("grad-mode guards", function()
  it("nd.no_grad(f) with an f that is nil by mistake is an error, not a guard left open", function()
    for _, name in ipairs({"no_grad", "enable_grad", "inference_mode"}) do
      local before = nd.is_grad_enabled()
      local ok = pcall(nd[name], nil)
      assert.is_false(ok, name .. "(nil) did not raise")
      assert.are.equal(before, nd.is_grad_enabled(), name)
    end
    local g <close> = nd.no_grad() -- no argument: the guard
    assert.is_false(nd.is_grad_enabled())
  end)
end)
