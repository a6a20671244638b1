-- compile_function_spec.lua - nd.autograd.Function inside nd.compile{opaque = true}: the
-- call is one opaque node whose Lua forward (and, in a captured backward, Lua backward)
-- runs at every replay. Compiled functions, compiled forwards trained eagerly and
-- compiled whole training steps equal the eager runs bit for bit on every device;
-- explain() names the node; a replay whose forward changes its result's shape fails
-- naming the Function; opaque is the default, and with opaque = false a Function is a
-- graph break.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function max_abs(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end

local calls = {f = 0, b = 0}

-- x * tanh(x) with a hand-written backward (saves its input and an intermediate)
local XTanh = nd.autograd.Function{
  name = "xtanh",
  forward = function(ctx, x, scale)
    calls.f = calls.f + 1
    local t = x:tanh()
    ctx:save_for_backward(x, t)
    ctx.scale = scale
    return x * t * scale
  end,
  backward = function(ctx, g)
    calls.b = calls.b + 1
    local x, t = ctx.saved_tensors[1], ctx.saved_tensors[2]
    return g * (t + x * (1 - t * t)) * ctx.scale, nil
  end,
}

local function model(dev)
  nd.manual_seed(3)
  return nd.nn.Linear(5, 7):to(dev), nd.nn.Linear(7, 3):to(dev)
end

describe("autograd.Function as an opaque node of nd.compile", function()
  for _, dev in ipairs(D.all()) do
    it("a compiled function replays the Lua forward every call, equal to eager, on " .. dev, function()
      local w = nd.randn(4, 6):to(dev)
      local function f(x) return (XTanh(x * w, 0.5) + 1):sum(1) end
      local cf = nd.compile(f, {opaque = true})
      for i = 1, 5 do
        nd.manual_seed(20 + i)
        local x = nd.randn(4, 6):to(dev)
        local want = f(x)
        calls.f = 0
        local got = cf(x)
        assert.are.equal(1, calls.f) -- the Lua forward ran at this call (capture or replay)
        assert.are.equal(0, max_abs(got, want))
      end
      assert.are.equal(3, cf.stats.replays)
      assert.are.equal(0, #cf.breaks)
      assert_contains(cf:explain(), "opaque nodes: 1 autograd.Function call(s) whose Lua runs at every replay")
      assert_contains(cf:explain(), "'xtanh' (forward)")
      assert_contains(cf:ir(), "host_check.opaque_forward [xtanh]")
    end)

    it("a compiled forward trained eagerly runs the Lua backward at every backward, on " .. dev, function()
      local runs = {}
      for _, compiled in ipairs({false, true}) do
        local l1, l2 = model(dev)
        local function fwd(x) return l2(XTanh(l1(x), 2)) end
        local f = compiled and nd.compile(fwd, {opaque = true}) or fwd
        local params = {}
        for _, p in ipairs(l1:parameters()) do params[#params + 1] = p end
        for _, p in ipairs(l2:parameters()) do params[#params + 1] = p end
        local opt = nd.optim.SGD(params, {lr = 0.1, momentum = 0.9})
        local losses, counts = {}, {}
        for i = 1, 6 do
          nd.manual_seed(40 + i)
          local x, y = nd.randn(8, 5):to(dev), nd.randint(1, 3, {8}):to(dev)
          calls.f, calls.b = 0, 0
          opt:zero_grad()
          local loss = nd.F.cross_entropy(f(x), y)
          loss:backward()
          opt:step()
          losses[i] = loss:item()
          counts[i] = {calls.f, calls.b}
        end
        runs[compiled] = {losses = losses, params = params, f = f, counts = counts}
      end
      for i = 1, 6 do
        assert.are.equal(runs[false].losses[i], runs[true].losses[i])
        -- (the capture, call 2, also runs backward once to capture the backward graph)
        assert.are.same({1, i == 2 and 2 or 1}, runs[true].counts[i])
      end
      for k, p in ipairs(runs[true].params) do
        assert.are.equal(0, max_abs(p, runs[false].params[k]))
        assert.are.equal(0, max_abs(p.grad, runs[false].params[k].grad))
      end
      local cf = runs[true].f
      assert.are.equal(4, cf.stats.replays)
      assert_contains(cf:explain(), "'xtanh' (forward), 'xtanh' (backward)")
    end)

    it("a compiled whole training step equals eager bit for bit, Lua forward and backward each step, on "
       .. dev, function()
      local runs = {}
      for _, compiled in ipairs({false, true}) do
        local l1, l2 = model(dev)
        local params = {}
        for _, p in ipairs(l1:parameters()) do params[#params + 1] = p end
        for _, p in ipairs(l2:parameters()) do params[#params + 1] = p end
        local opt = nd.optim.Adam(params, {lr = 1e-2})
        local function step(x, y)
          opt:zero_grad()
          local loss = nd.F.cross_entropy(l2(XTanh(l1(x), 1.5)), y)
          loss:backward()
          opt:step()
          return loss:detach()
        end
        local f = compiled and nd.compile(step, {opaque = true, verify = true}) or step
        local losses, counts = {}, {}
        for i = 1, 7 do
          nd.manual_seed(60 + i)
          local x, y = nd.randn(8, 5):to(dev), nd.randint(1, 3, {8}):to(dev)
          calls.f, calls.b = 0, 0
          losses[i] = f(x, y):item()
          counts[i] = {calls.f, calls.b}
        end
        runs[compiled] = {losses = losses, params = params, f = f, counts = counts}
      end
      for i = 1, 7 do
        assert.are.equal(runs[false].losses[i], runs[true].losses[i])
        assert.are.same({1, 1}, runs[true].counts[i]) -- the Lua really ran at every replay
      end
      for k, p in ipairs(runs[true].params) do
        assert.are.equal(0, max_abs(p, runs[false].params[k]))
        assert.are.equal(0, max_abs(p.grad, runs[false].params[k].grad))
      end
      local cf = runs[true].f
      assert.are.equal(5, cf.stats.replays)
      assert.are.equal(0, #cf.breaks)
      assert_contains(cf:explain(), "opaque nodes: 2 autograd.Function call(s)")
      assert_contains(cf:explain(), "'xtanh' (forward), 'xtanh' (backward)")
    end)

    it("a replay whose forward returns another shape or dtype fails naming the Function, on " .. dev, function()
      local mode = "same"
      local Odd = nd.autograd.Function{
        name = "shifty",
        forward = function(_, x)
          if mode == "shape" then return x:sum(1) end
          if mode == "dtype" then return x:double() end
          return x * 2
        end,
        backward = function(_, g) return g * 2 end,
      }
      local cf = nd.compile(function(x) return Odd(x + 1) * 3 end, {opaque = true})
      local x = nd.ones({2, 3}):to(dev)
      cf(x); cf(x); cf(x)
      assert.are.equal(1, cf.stats.replays)
      mode = "shape"
      assert_contains(errmsg(cf, x), "autograd.Function 'shifty': its forward returned float32 {3}")
      assert_contains(errmsg(cf, x), "where the capture had float32 {2,3}")
      mode = "dtype"
      assert_contains(errmsg(cf, x), "autograd.Function 'shifty': its forward returned float64 {2,3}")
      mode = "same"
      assert.are.same({{12, 12, 12}, {12, 12, 12}}, cf(x):to("cpu"):totable())
    end)
  end

  it("a forward that returns its input, a view or a constant gets a buffer of its own", function()
    local k = nd.tensor({1, 2, 3})
    local Id = nd.autograd.Function{name = "id", forward = function(_, x) return x end,
                                    backward = function(_, g) return g end}
    local View = nd.autograd.Function{name = "view", forward = function(_, x) return x:narrow(1, 2, 2) end,
                                      backward = function(_, g) return nd.cat({nd.zeros({1}), g}) end}
    local Const = nd.autograd.Function{name = "const", forward = function() return k end,
                                       backward = function() return nil end}
    local function f(x) return Id(x * 2) + View(x):sum() + Const(x) end
    local cf = nd.compile(f, {opaque = true})
    for i = 1, 4 do
      local x = nd.full({3}, i)
      assert.are.equal(0, max_abs(cf(x), f(x)))
    end
    assert.are.equal(2, cf.stats.replays)
    local direct = nd.compile(function(x) return Id(x) end, {opaque = true}) -- its result is the output
    for i = 1, 4 do assert.are.same({i, i}, direct(nd.full({2}, i)):totable()) end
    assert.are.equal(2, direct.stats.replays)
  end)

  it("a module calling a Function compiles with it as an opaque node", function()
    local M = nd.nn.Module:extend("WithXTanh")
    function M:init() self.lin = nd.nn.Linear(4, 4) end
    function M:forward(x) return XTanh(self.lin(x), 1) end
    nd.manual_seed(1)
    local m = M()
    local cm = nd.compile(m, {opaque = true})
    for i = 1, 4 do
      nd.manual_seed(i)
      local x = nd.randn(3, 4)
      local want = m(x)
      assert.are.equal(0, max_abs(cm(x), want))
    end
    assert.are.equal(2, cm.stats.replays)
  end)

  it("a forward that reads values with item() runs again at each replay", function()
    local Clip = nd.autograd.Function{
      name = "clip_to_max",
      forward = function(_, x) local m = x:max():item(); return x / m end,
      backward = function(_, g) return g end,
    }
    local cf = nd.compile(function(x) return Clip(x + 1) end, {opaque = true})
    for i = 1, 4 do
      local x = nd.tensor({1, 2, i})
      assert.are.equal(0, max_abs(cf(x), (x + 1) / (x + 1):max()))
    end
    assert.are.equal(2, cf.stats.replays)
  end)

  it("a backward under create_graph breaks the graph (fallback: eager)", function()
    local w = nd.tensor({1, 2, 3}, {requires_grad = true})
    local function step(x)
      w.grad = nil
      local y = XTanh(x * w, 1):sum()
      local g = nd.grad({y}, {w}, {create_graph = true})[1]
      return g:sum():detach()
    end
    local cf = nd.compile(step, {opaque = true, fallback = true})
    for i = 1, 3 do
      local x = nd.full({3}, i * 0.1)
      assert.are.equal(0, max_abs(cf(x), step(x)))
    end
    assert.are.equal(0, cf.stats.replays)
    assert_contains(cf:explain(), "'xtanh' runs its Lua backward under create_graph")
  end)

  it("opaque is the default; with opaque = false a Function is a graph break; traceable ones are inlined", function()
    local default = nd.compile(function(x) return XTanh(x, 1):sum() end)
    for i = 1, 3 do default(nd.full({2}, i)) end
    assert.is_true(default.stats.replays >= 1)
    assert_contains(default:explain(), "opaque nodes: 1 autograd.Function call(s)")
    local cf = nd.compile(function(x) return XTanh(x, 1):sum() end, {opaque = false})
    cf(nd.ones({2}))
    assert_contains(errmsg(cf, nd.ones({2})), "'xtanh' runs its Lua forward and backward at every call (a graph break)")
    local Sq = nd.autograd.Function{name = "sq", traceable = true, forward = function(_, x) calls.f = calls.f + 1; return x * x end,
                                    backward = function(_, g) return g end}
    local tf = nd.compile(function(x) return Sq(x) end, {opaque = true})
    calls.f = 0
    for i = 1, 4 do assert.are.same({i * i}, tf(nd.tensor({i})):totable()) end
    assert.are.equal(2, calls.f) -- the warm-up and the capture: replays run no Lua
  end)
end)
