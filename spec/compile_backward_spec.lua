-- compile_backward_spec.lua - backward through a compiled forward (op
-- compiled_forward, src/ops/graph_backward.c): nd.compile of a model or a
-- forward function, trained with an eager backward and optimizer, gives the
-- eager gradients and parameters; a finite-difference gradcheck in float64
-- through the compiled function; the refusals (a stale output, create_graph).
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function max_abs(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end

-- a module that reads a value on the host (a graph break): it doubles or triples x
local Odd = nd.nn.Module:extend("Odd")
function Odd:init() end
function Odd:forward(x) return x:sum():item() > 0 and x * 2 or x * 3 end

local function model(device)
  nd.manual_seed(5)
  return nd.nn.Sequential(nd.nn.Linear(6, 16), nd.nn.Tanh(), nd.nn.Linear(16, 16), nd.nn.ReLU(),
                          nd.nn.Linear(16, 3)):to(device)
end

describe("backward through a compiled forward", function()
  for _, dev in ipairs(D.all()) do
    it("trains as eagerly: losses, gradients and parameters after 10 Adam steps, on " .. dev, function()
      local runs = {}
      for _, compiled in ipairs({false, true}) do
        local m = model(dev)
        local f = compiled and nd.compile(m) or m
        local opt = nd.optim.Adam(m:parameters(), {lr = 1e-2})
        local losses = {}
        for i = 1, 10 do
          nd.manual_seed(100 + i)
          local x, y = nd.randn(8, 6):to(dev), nd.randint(1, 3, {8}):to(dev)
          opt:zero_grad()
          local loss = nd.F.cross_entropy(f(x), y)
          loss:backward()
          opt:step()
          losses[i] = loss:item()
        end
        runs[compiled] = {m = m, losses = losses, f = f}
      end
      for i = 1, 10 do assert.are.equal(runs[false].losses[i], runs[true].losses[i]) end
      local pe, pc = runs[false].m:parameters(), runs[true].m:parameters()
      for k = 1, #pe do
        assert.are.equal(0, max_abs(pc[k], pe[k]))
        assert.are.equal(0, max_abs(pc[k].grad, pe[k].grad))
      end
      local cf = runs[true].f
      assert.are.equal(8, cf.stats.replays)
      assert_contains(cf:explain(), "backward: 1 result(s) differentiable with respect to 6 parameter(s)")
    end)
  end

  it("trains the LSTM language model with its state carried between calls, exactly as eagerly", function()
    local V, T, B = 200, 12, 4
    local runs = {}
    for _, compiled in ipairs({false, true}) do
      nd.manual_seed(0)
      local m = nd.nn.LanguageModel(V, {embedding_size = 16, hidden_size = 32, num_layers = 2})
      local f = compiled and nd.compile(m) or m
      local opt = nd.optim.SGD(m:parameters(), {lr = 0.5})
      local h, c
      local losses = {}
      for i = 1, 6 do
        nd.manual_seed(10 + i)
        local ids, y = nd.randint(1, V, {T, B}), nd.randint(1, V, {T * B})
        opt:zero_grad()
        local logits, state = f(ids, h and {h, c} or nil)
        local loss = nd.F.cross_entropy(logits, y)
        loss:backward()
        nd.nn.utils.clip_grad_norm_(m:parameters(), 0.25)
        opt:step()
        h, c = state[1]:detach(), state[2]:detach()
        losses[i] = loss:item()
      end
      runs[compiled] = {m = m, losses = losses, f = f}
    end
    for i = 1, 6 do assert.are.equal(runs[false].losses[i], runs[true].losses[i]) end
    local pe, pc = runs[false].m:parameters(), runs[true].m:parameters()
    for k = 1, #pe do assert.are.equal(0, max_abs(pc[k], pe[k])) end
    assert(runs[true].f.stats.replays >= 3, "no replays")
    -- logits, h and c need gradients: one backward graph for the three
    assert_contains(runs[true].f:explain(), "backward: 3 result(s) differentiable with respect to 11 parameter(s)")
  end)

  it("passes gradients on to arguments that require grad (a compiled block inside an eager model)", function()
    nd.manual_seed(0)
    local pre = nd.nn.Linear(4, 6)
    local block = nd.nn.Sequential(nd.nn.Linear(6, 6), nd.nn.Tanh(), nd.nn.Linear(6, 3))
    local cblock = nd.compile(block)
    for i = 1, 4 do
      local x = nd.randn(5, 4) * i
      local g = {}
      for _, f in ipairs({block, cblock}) do
        for _, p in ipairs(pre:parameters()) do p.grad = nil end
        for _, p in ipairs(block:parameters()) do p.grad = nil end
        local y = f(pre(x):relu());
        (y * y):sum():backward()
        local t = {}
        for _, p in ipairs(pre:parameters()) do t[#t + 1] = p.grad:clone() end
        for _, p in ipairs(block:parameters()) do t[#t + 1] = p.grad:clone() end
        g[#g + 1] = t
      end
      for k = 1, #g[1] do assert.are.equal(0, max_abs(g[1][k], g[2][k]), ("call %d tensor %d"):format(i, k)) end
    end
    assert_contains(cblock:explain(), "with respect to 4 parameter(s) and 1 argument(s)")
    -- a leaf argument gets its .grad; an argument without requires_grad traces another entry
    local x = nd.randn({5, 6}, {requires_grad = true})
    cblock(x):sum():backward()
    local want = x.grad:clone()
    x.grad = nil
    block(x):sum():backward()
    assert.are.equal(0, max_abs(want, x.grad))
    local before = cblock.stats.retraces + cblock.stats.captures
    cblock(nd.randn(5, 6))
    cblock(nd.randn(5, 6))
    assert(cblock.stats.retraces + cblock.stats.captures > before, "requires_grad is part of the key")
  end)

  it("sums the gradients of several results (per parameter: equal within rounding)", function()
    local lin = nd.nn.Linear(4, 4)
    local f = function(x) local h = lin(x); return h:tanh(), h * 2 end
    local cf = nd.compile(f)
    for i = 1, 3 do
      local x = nd.randn(3, 4) * i
      lin.weight.grad, lin.bias.grad = nil, nil
      local a, b = cf(x);
      ((a * b):sum() + a:sum()):backward()
      local gw, gb = lin.weight.grad:clone(), lin.bias.grad:clone()
      lin.weight.grad, lin.bias.grad = nil, nil
      local ea, eb = f(x);
      ((ea * eb):sum() + ea:sum()):backward()
      -- eager adds the two results' gradients at h, before the GEMMs; each result's backward
      -- graph runs its own GEMMs and the engine adds the parameters' gradients: same sum,
      -- other rounding
      assert(max_abs(gw, lin.weight.grad) <= 1e-5 * (1 + lin.weight.grad:abs():max():item()))
      assert(max_abs(gb, lin.bias.grad) <= 1e-5 * (1 + lin.bias.grad:abs():max():item()))
    end
  end)

  it("passes a float64 gradcheck through the compiled function (captured and replayed)", function()
    nd.manual_seed(2)
    local w1 = nd.randn({5, 4}, {dtype = "float64", requires_grad = true})
    local b1 = nd.randn({5}, {dtype = "float64", requires_grad = true})
    local w2 = nd.randn({2, 5}, {dtype = "float64", requires_grad = true})
    local x = nd.randn({3, 4}, {dtype = "float64"})
    local cf = nd.compile(function(inp) return nd.F.linear(nd.F.linear(inp, w1, b1):sigmoid() * 1.5, w2) end,
                          {warmup = 0})
    local function build() return cf(x) end
    local ok, why = G.gradcheck(build, {w1, b1, w2}, {covers = {"compiled_forward"}}) -- call 1: the capture
    assert(ok, why)
    ok, why = G.gradcheck(build, {w1, b1, w2}) -- every call a replay
    assert(ok, why)
    assert(cf.stats.replays > 20, "the gradcheck did not run replays")
  end)

  it("refuses a stale output and create_graph; no_grad calls get no backward", function()
    local lin = nd.nn.Linear(3, 2)
    local cf = nd.compile(lin)
    local x = nd.randn(4, 3)
    cf(x); cf(x)
    local old = cf(x)
    local new = cf(x)
    assert_contains(errmsg(function() old:sum():backward() end),
                    "compiled_forward: the compiled function ran again after it made this output")
    new:sum():backward() -- the latest output is fine
    assert.is_true(lin.weight.grad ~= nil)
    local again = cf(x)
    assert_contains(errmsg(nd.grad, again:sum(), {lin.weight}, {create_graph = true}),
                    "backward with create_graph through the output of a compiled function is not supported")
    local y = nd.no_grad(function() return cf(x) end)
    assert.is_false(y.requires_grad)
  end)

  it("gets gradients that are the output's own gradient, and of parameters returned as they are", function()
    -- (what the review found: the gradient of w in x + w is the incoming gradient itself, and a
    -- returned parameter's gradient too; both came back as zeros or nil)
    nd.manual_seed(0)
    local w = nd.randn({3, 4}, {requires_grad = true})
    local v = nd.randn({3, 4}, {requires_grad = true})
    local fn = function(x) return x + w, v, x * v end
    local cf = nd.compile(fn)
    for i = 1, 4 do
      local x = nd.randn(3, 4)
      local grads = {}
      for _, f in ipairs({fn, cf}) do
        w.grad, v.grad = nil, nil
        local a, b, c = f(x);
        ((a * a):sum() + (b * c):sum()):backward()
        grads[#grads + 1] = {w.grad:clone(), v.grad:clone()}
      end
      assert.are.equal(0, max_abs(grads[1][1], grads[2][1]), "call " .. i)
      assert(max_abs(grads[1][2], grads[2][2]) <= 1e-6, "call " .. i) -- two results: rounding
    end
  end)

  it("refuses a backward once what it reads changed: a later refused call, an update in place", function()
    local m = nd.nn.Sequential(nd.nn.Linear(4, 8), nd.nn.Tanh(), nd.nn.Linear(8, 3))
    local f = nd.compile(function(x, y) return nd.F.cross_entropy(m(x), y) end)
    local y = nd.tensor({1, 2, 3, 2}, {dtype = "int64"})
    for _ = 1, 2 do f(nd.randn(4, 4), y) end
    local l = f(nd.randn(4, 4), y)
    -- refused by its label check after the model's kernels overwrote the activations
    assert_contains(errmsg(f, nd.randn(4, 4), nd.tensor({1, 2, 3, 9}, {dtype = "int64"})), "out of range")
    assert_contains(errmsg(function() l:backward() end), "was modified in place after the call")
    local l2 = f(nd.randn(4, 4), y)
    nd.no_grad(function() m[3].weight:add_(0.1) end) -- read by the backward (the tanh output's gradient)
    assert_contains(errmsg(function() l2:backward() end), "was modified in place after the call")
  end)

  it("handles models with more parameters than one nd.grad list used to take (64)", function()
    local layers = {}
    for i = 1, 40 do layers[i] = nd.nn.Linear(3, 3) end
    local m = nd.nn.Sequential(table.unpack(layers)) -- 80 parameters
    local cf = nd.compile(m)
    local x = nd.randn(2, 3)
    for _ = 1, 3 do
      for _, p in ipairs(m:parameters()) do p.grad = nil end
      cf(x):sum():backward()
    end
    local gc = {}
    for k, p in ipairs(m:parameters()) do gc[k] = p.grad:clone(); p.grad = nil end
    m(x):sum():backward()
    for k, p in ipairs(m:parameters()) do assert.are.equal(0, max_abs(gc[k], p.grad)) end
    assert.are.equal(80, #cf.last.backward.leaves)
  end)

  it("a whole training step returns its loss without a graph (its backward already ran)", function()
    local lin = nd.nn.Linear(3, 1)
    local opt = nd.optim.SGD(lin:parameters(), {lr = 0.1})
    local step = nd.compile(function(x)
      opt:zero_grad()
      local loss = lin(x):sum()
      loss:backward()
      opt:step()
      return loss
    end)
    for i = 1, 3 do
      local loss = step(nd.randn(2, 3))
      assert.are.equal(i == 1, loss.requires_grad) -- call 1 runs eagerly
    end
    assert.is_nil(step.last.backward)
  end)

  it("keeps memory flat over many steps (nodes give their graphs back)", function()
    local m = model("cpu")
    local f = nd.compile(m)
    local opt = nd.optim.SGD(m:parameters(), {lr = 1e-3})
    local x, y = nd.randn(8, 6), nd.randint(1, 3, {8})
    local live
    for i = 1, 3000 do
      opt:zero_grad()
      nd.F.cross_entropy(f(x), y):backward()
      opt:step()
      if i == 300 then collectgarbage(); live = nd.live_bytes() end
    end
    collectgarbage()
    assert(nd.live_bytes() <= live, ("live bytes %d, at step 300 %d"):format(nd.live_bytes(), live))
  end)

  it("splits a module at a graph break (fallback): children compile, training equals eager", function()
    local Twice = nd.nn.Module:extend("Twice")
    function Twice:init() self.lin = nd.nn.Linear(4, 4); self.odd = Odd() end
    function Twice:forward(x) return self.odd(self.lin(self.lin(x):tanh())) end -- breaks; lin runs twice
    local function make()
      nd.manual_seed(4)
      return nd.nn.Sequential(nd.nn.Linear(4, 4), nd.nn.Tanh(), Odd(), Twice(), nd.nn.Linear(4, 2))
    end
    local me, mc = make(), make()
    local cf = nd.compile(mc, {fallback = true})
    local oe = nd.optim.SGD(me:parameters(), {lr = 0.01, momentum = 0.9})
    local oc = nd.optim.SGD(mc:parameters(), {lr = 0.01, momentum = 0.9})
    for i = 1, 10 do
      nd.manual_seed(50 + i)
      local x = nd.randn(3, 4)
      oe:zero_grad()
      oc:zero_grad()
      local le = (me(x) ^ 2):sum()
      le:backward()
      oe:step()
      local lc = (cf(x) ^ 2):sum()
      lc:backward()
      oc:step()
      assert.are.equal(le:item(), lc:item(), "step " .. i)
    end
    local pe, pc = me:parameters(), mc:parameters()
    for k = 1, #pe do assert.are.equal(0, max_abs(pc[k], pe[k])) end
    local text = cf:explain()
    assert_contains(text, "split: the module's own code runs eagerly; its children:")
    assert_contains(text, "0 (Linear): compiled: calls 8: 6 replayed")
    assert_contains(text, "2 (Odd): eager: its own graph break: needle.item")
    assert_contains(text, "3 (Twice): compiled:") -- split in turn: its Linear runs twice, eagerly
    assert_contains(text, "(split in turn)")
    local twice = cf.last.split.children[4].compiled
    assert_contains(twice:explain(), "lin (Linear): eager: called 2 times per call")
    -- the break was found by the eager call before the capture: no capture of the whole model
    assert.are.equal(0, cf.stats.captures)
  end)

  it("a split model called twice before one backward (a siamese pair) trains as eagerly", function()
    local function make()
      nd.manual_seed(6)
      return nd.nn.Sequential(nd.nn.Linear(4, 4), nd.nn.Tanh(), Odd(), nd.nn.Linear(4, 2))
    end
    local me, mc = make(), make()
    local cf = nd.compile(mc, {fallback = true})
    for i = 1, 6 do
      nd.manual_seed(70 + i)
      local x1, x2 = nd.randn(3, 4), nd.randn(3, 4)
      for _, p in ipairs(me:parameters()) do p.grad = nil end
      for _, p in ipairs(mc:parameters()) do p.grad = nil end;
      ((me(x1) - me(x2)) ^ 2):sum():backward();
      ((cf(x1) - cf(x2)) ^ 2):sum():backward()
      for k, p in ipairs(me:parameters()) do assert.are.equal(0, max_abs(mc:parameters()[k].grad, p.grad)) end
    end
    assert_contains(cf:explain(), "call(s) eager, made while an earlier result's backward was to come")
  end)

  it("leaves the gradient of a parameter nil when only a result without gradient reaches it", function()
    local a, b = nd.nn.Linear(3, 3), nd.nn.Linear(3, 3)
    local cf = nd.compile(function(x) return a(x), b(x) end)
    for _ = 1, 3 do
      for _, p in ipairs({a.weight, a.bias, b.weight, b.bias}) do p.grad = nil end
      local ya = cf(nd.randn(2, 3)) -- b's result unused
      ya:sum():backward()
      assert.is_true(a.weight.grad ~= nil)
      assert.is_nil(b.weight.grad) -- eagerly nil, not zeros (momentum or decay would move it)
    end
  end)

  it("refuses an argument that requires grad when the function runs backward itself", function()
    local m = nd.nn.Linear(3, 1)
    local step = nd.compile(function(x) m:zero_grad(); m(x):sum():backward() end)
    local x = nd.ones({4, 3}, {requires_grad = true})
    step(x)
    assert_contains(errmsg(step, x), "an argument requires grad and the function runs backward itself")
  end)

  it("with fallback, the probe finds no break where a capture has none (clip_grad_norm_, Embedding)", function()
    local emb = nd.nn.Embedding(10, 4)
    local opt = nd.optim.SGD(emb:parameters(), {lr = 0.1})
    local step = nd.compile(function(ids)
      opt:zero_grad()
      emb(ids):sum():backward()
      nd.nn.utils.clip_grad_norm_(emb:parameters(), 1.0)
      opt:step()
    end, {fallback = true})
    for _ = 1, 4 do step(nd.tensor({1, 2, 3}, {dtype = "int64"})) end
    assert.are.equal(0, #step.breaks)
    assert.are.equal(2, step.stats.replays)
  end)

  it("claims only the gradchecks it ran", function()
    G.assert_covers(assert, "compile_backward_spec.lua")
  end)
end)
