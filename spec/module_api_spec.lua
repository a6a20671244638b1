-- module_api_spec.lua - nn.Module's hooks (forward pre-hooks, forward hooks,
-- full backward hooks), dtype conversion (to(dtype), double, float, half,
-- bfloat16), requires_grad_, non-persistent buffers and summary
-- (docs/nn.md). PyTorch's values: spec/fixtures/torch_hooks.lua
-- (spec/fixtures/gen/gen_torch_hooks.py).
--
--   build/needle-lua spec/run.lua spec/module_api_spec.lua
local nd = require "needle"
local nn = nd.nn
local A = require("spec.helpers.assertions").bind(assert)
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)
local D = require "spec.helpers.devices"
local errmsg, has = A.errmsg, A.has

local fixtures = {}
for _, c in ipairs(X.load("torch_hooks")) do fixtures[c.name] = c end

-- the fixture case's inputs on dev, as leaves
local function inputs_on(c, dev)
  local out = {}
  for i, t in ipairs(c.inputs) do
    out[i] = X.tensor(t):to({device = dev})
    out[i].requires_grad = true
  end
  return out
end

local function cpu(t) return t:to({device = "cpu"}) end

describe("module hooks against PyTorch", function()
  it("full backward hooks: grad_input and grad_output as PyTorch gives them, grad_input replaced", function()
    local c = fixtures.full_backward_hook
    for _, dev in ipairs(D.all()) do
      local x, w1, b1, w2, b2 = table.unpack(inputs_on(c, dev))
      local model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)):to(dev)
      model[1].weight, model[1].bias, model[3].weight, model[3].bias = w1, b1, w2, b2
      local seen = {}
      model[1]:register_full_backward_hook(function(m, gi, go)
        assert.are.equal(model[1], m)
        seen.first = {gi[1], go[1]}
        return {gi[1] * 0.5}
      end)
      model[3]:register_full_backward_hook(function(_, gi, go)
        assert.are.equal(1, gi.n)
        assert.are.equal(1, go.n)
        seen.last = {gi[1], go[1]}
      end)
      local out = model(x)
      X.close("output on " .. dev, cpu(out), c.output)
      local grads = nd.grad((out * X.tensor(c.w):to({device = dev})):sum(), {x, w1, b1, w2, b2})
      for i, g in ipairs(grads) do X.close(("grad %d on %s"):format(i, dev), cpu(g), c.grads[i]) end
      X.close("first grad_input", cpu(seen.first[1]), c.first_grad_input)
      X.close("first grad_output", cpu(seen.first[2]), c.first_grad_output)
      X.close("last grad_input", cpu(seen.last[1]), c.last_grad_input)
      X.close("last grad_output", cpu(seen.last[2]), c.last_grad_output)
    end
  end)

  it("forward pre-hooks replace the arguments, forward hooks the output (in Sequential children)", function()
    local c = fixtures.forward_hooks
    for _, dev in ipairs(D.all()) do
      local x, w, b = table.unpack(inputs_on(c, dev))
      local model = nn.Sequential(nn.Linear(3, 2), nn.Tanh()):to(dev)
      model[1].weight, model[1].bias = w, b
      model[1]:register_forward_pre_hook(function(_, args) return args[1] + 1 end) -- one value: the argument
      model[2]:register_forward_hook(function(_, _, out) return out * 2 end)
      local out = model(x)
      X.close("output on " .. dev, cpu(out), c.output)
      local grads = nd.grad((out * X.tensor(c.w):to({device = dev})):sum(), {x, w, b})
      for i, g in ipairs(grads) do X.close(("grad %d on %s"):format(i, dev), cpu(g), c.grads[i]) end
    end
  end)
end)

describe("module hooks", function()
  it("see the module, the arguments and the output; run in order; prepend puts one first", function()
    local m = nn.Linear(2, 2)
    local log = {}
    m:register_forward_pre_hook(function(mod, args)
      assert.are.equal(m, mod)
      assert.are.equal(2, args.n)
      log[#log + 1] = "pre1"
    end)
    m:register_forward_pre_hook(function() log[#log + 1] = "pre0" end, {prepend = true})
    m:register_forward_hook(function(_, args, out)
      log[#log + 1] = "fwd"
      assert.is_true(nd.is_tensor(out))
      assert.are.equal("extra", args[2])
    end)
    local x = nd.randn({3, 2})
    m(x, "extra")
    assert.are.same({"pre0", "pre1", "fwd"}, log)
  end)

  it("a pre-hook may return a table of arguments; a forward hook replaces several results with a table", function()
    local Pair = nn.Module:extend("Pair")
    function Pair:forward(a, b) return a + b, a - b end
    local m = Pair()
    m:register_forward_pre_hook(function(_, args) return {args[2], args[1]} end)
    m:register_forward_hook(function(_, _, out)
      assert.are.equal(2, out.n)
      return {out[1] * 10, out[2] * 10}
    end)
    local s, d = m(nd.tensor({1}), nd.tensor({5}))
    assert.are.same({60}, s:totable())
    assert.are.same({40}, d:totable())
    m:register_forward_hook(function() return nd.zeros({1}) end)
    has(errmsg(m, nd.tensor({1}), nd.tensor({5})),
        "needle.nn.Pair.register_forward_hook: forward returned 2 values: a forward hook's replacement must be a table of them")
  end)

  it("handles remove their hook and the module goes back to the class's plain call", function()
    local m = nn.ReLU()
    local plain = getmetatable(m)
    local n = 0
    local h = m:register_forward_hook(function() n = n + 1 end)
    assert.are_not.equal(plain, getmetatable(m))
    assert.are.equal(plain, getmetatable(m).plain)
    assert.is_true(nn.Module.is_module(m))
    m(nd.ones({2}))
    h:remove()
    h:remove()
    m(nd.ones({2}))
    assert.are.equal(1, n)
    assert.are.equal(plain, getmetatable(m))
    assert.is_nil(rawget(m, "_hooks"))
    do
      local h2 <close> = m:register_forward_pre_hook(function() n = n + 1 end)
      m(nd.ones({2}))
    end
    m(nd.ones({2}))
    assert.are.equal(2, n)
  end)

  it("a full backward hook that returns nil changes no gradient (float64 finite differences)", function()
    nd.manual_seed(5)
    local lin = nn.Linear(3, 2, {dtype = "float64"})
    local calls = 0
    lin:register_full_backward_hook(function() calls = calls + 1 end)
    C.check(function(x, w, b)
      lin.weight, lin.bias = w, b
      return lin(x):tanh()
    end, {G.leaf({4, 3}), G.leaf({2, 3}), G.leaf({2})})
    assert.are.equal(1, calls) -- the analytical gradient's backward; finite differences run without grad
  end)

  it("full backward hooks: several inputs, inputs without grad, no grad mode", function()
    local Bil = nn.Module:extend("Bil")
    function Bil:forward(a, k, b) return a * b * k end
    local m = Bil()
    local seen
    m:register_full_backward_hook(function(_, gi, go)
      seen = {n = gi.n, a = gi[1], k = gi[2], b = gi[3], go = go[1]}
      return {gi[1] * 2, nil, gi[3] * 3}
    end)
    local a, b = nd.tensor({1, 2}, {requires_grad = true}), nd.tensor({3, 4}, {requires_grad = true})
    m(a, 5, b):sum():backward()
    assert.are.equal(3, seen.n)
    assert.is_nil(seen.k)
    assert.are.same({15, 20}, seen.a:totable())
    assert.are.same({5, 10}, seen.b:totable())
    assert.are.same({1, 1}, seen.go:totable())
    assert.are.same({30, 40}, a.grad:totable())
    assert.are.same({15, 30}, b.grad:totable())
    -- an input that does not require grad: grad_input has nil there, the hook still runs
    local lin = nn.Linear(2, 1)
    local got
    lin:register_full_backward_hook(function(_, gi, go) got = {gi.n, gi[1], go[1]} end)
    lin(nd.ones({1, 2})):sum():backward()
    assert.are.equal(1, got[1])
    assert.is_nil(got[2])
    assert.are.same({{1}}, got[3]:totable())
    assert.is_not_nil(lin.weight.grad)
    -- under no_grad nothing is recorded and the hook does not run
    got = nil
    nd.no_grad(function() lin(nd.ones({1, 2})) end)
    assert.is_nil(got)
  end)

  it("a bad replacement grad_input is an error naming what was wrong", function()
    local function with(ret)
      local lin = nn.Linear(3, 2)
      lin:register_full_backward_hook(function() return ret end)
      local x = nd.randn({4, 3}, {requires_grad = true})
      return errmsg(function() lin(x):sum():backward() end)
    end
    has(with({nd.zeros({3})}), "needle.nn.Linear.register_full_backward_hook: a backward hook returned a float32 "
        .. "gradient of shape {3} on cpu for input 1, a float32 tensor of shape {4,3} on cpu")
    has(with({nd.zeros({4, 3}), nd.zeros({4, 3})}), "a backward hook returned 2 gradient(s) for 1 input(s)")
    has(with(nd.zeros({4, 3})), "a backward hook returned a tensor; expected nil or a table of 1 gradient(s)")
    has(errmsg(function() nn.Linear(1, 1):register_forward_hook("f") end),
        "needle.nn.Linear.register_forward_hook: expected a function, got \"f\"")
  end)

  it("a compiled module with hooks runs eagerly (fallback) and says why; without hooks it replays", function()
    local m = nn.Linear(3, 2)
    local n = 0
    local h = m:register_forward_hook(function() n = n + 1 end)
    local cm = nd.compile(m, {fallback = true})
    for _ = 1, 3 do cm(nd.ones({1, 3})) end
    assert.are.equal(3, n)
    has(cm:explain(), "graph break (runs eagerly): needle.nn.Linear: a module with hooks (register_forward_hook & co.) runs")
    h:remove()
    local cm2 = nd.compile(m)
    local want = m(nd.ones({1, 3}))
    for _ = 1, 3 do assert.are.same(want:totable(), cm2(nd.ones({1, 3})):totable()) end
    assert.is_true(cm2.stats.replays >= 1)
  end)
end)

describe("Module dtype and device conversion", function()
  it("to(dtype), double, float, half, bfloat16 convert floating parameters and buffers only", function()
    local m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    m[1].weight.grad = nd.ones({4, 3})
    local w = m[1].weight
    assert.are.equal(m, m:double())
    assert.are.equal(w, m[1].weight)           -- the same tensors (an optimizer keeps them)
    assert.are.equal("float64", w.dtype)
    assert.are.equal("float64", w.grad.dtype)
    assert.are.equal("float64", m[2].running_mean.dtype)
    assert.are.equal("int64", m[2].num_batches_tracked.dtype)
    for _, c in ipairs({{"float", "float32"}, {"half", "float16"}, {"bfloat16", "bfloat16"}}) do
      m[c[1]](m)
      assert.are.equal(c[2], m[1].bias.dtype)
      assert.are.equal("int64", m[2].num_batches_tracked.dtype)
    end
    m:to("float64")
    assert.are.equal("float64", m[1].weight.dtype)
    m:to({dtype = "float32"})
    assert.are.equal("float32", m[1].weight.dtype)
    m:to(nd.zeros({1}, {dtype = "float64"}))
    assert.are.equal("float64", m[1].weight.dtype)
    m:to("cpu", "float32")
    assert.are.equal("float32", m[1].weight.dtype)
    local y = m(nd.randn({5, 3}))
    assert.are.equal("float32", y.dtype)
  end)

  it("moves between devices with a dtype at once", function()
    -- needs a device to move to: without OpenCL, pending rather than an empty pass
    if D.pending_without_opencl(pending, "Module:to(device, dtype) on OpenCL") then return end
    for _, dev in ipairs(D.opencl()) do
      local m = nn.Linear(3, 2):to(dev, "float32")
      assert.are.equal(dev, m.weight.device)
      local want = m(nd.ones({1, 3}, {device = dev}))
      m:to(nd.zeros({1}))
      assert.are.equal("cpu", m.weight.device)
      X.close("moved back", m(nd.ones({1, 3})), {shape = {1, 2}, data = cpu(want):view({-1}):totable()})
    end
  end)

  it("bad conversions are errors and change nothing", function()
    local m = nn.Linear(2, 2)
    has(errmsg(m.to, m, "int64"),
        "needle.nn.Linear.to: dtype must be a floating-point dtype (float32, float64, float16 or bfloat16), got int64")
    has(errmsg(m.to, m, nd.zeros({1}, {dtype = "int64"})), "dtype must be a floating-point dtype")
    has(errmsg(m.to, m, "cpu", 3), "needle.nn.Linear.to: to(device, dtype): dtype must be a string, got 3")
    has(errmsg(m.to, m, "float64", "cpu"), "needle.nn.Linear.to: to(dtype) takes nothing after the dtype")
    has(errmsg(m.to, m, 42), "needle.nn.Linear.to: expected a device name")
    has(errmsg(m.to, m, "tpu"), "needle.nn.Linear.to: cannot move to device 'tpu'")
    assert.are.equal("float32", m.weight.dtype)
  end)
end)

describe("requires_grad_ and buffers", function()
  it("requires_grad_(false) freezes every parameter and returns the module", function()
    local m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    assert.are.equal(m[1], m[1]:requires_grad_(false))
    assert.is_false(m[1].weight.requires_grad)
    assert.is_true(m[2].weight.requires_grad)
    m(nd.ones({1, 2})):sum():backward()
    assert.is_nil(m[1].weight.grad)
    assert.is_not_nil(m[2].weight.grad)
    assert.are.equal(4, #m:parameters()) -- frozen parameters are still parameters
    m:requires_grad_()
    assert.is_true(m[1].bias.requires_grad)
    has(errmsg(m.requires_grad_, m, 1), "needle.nn.Sequential.requires_grad_: expected a boolean, got 1")
  end)

  it("a non-persistent buffer is a buffer but not part of the state_dict", function()
    local Masked = nn.Module:extend("Masked")
    function Masked:init()
      self.weight = nn.Parameter(nd.ones({2}))
      self:register_buffer("mask", nd.tensor({1, 0}), {persistent = false})
      self:register_buffer("scale", nd.tensor({3}))
    end
    local m = Masked()
    local names = {}
    for _, b in ipairs(m:named_buffers()) do names[#names + 1] = b[1] end
    assert.are.same({"mask", "scale"}, names)
    local sd = m:state_dict()
    assert.is_nil(sd.mask)
    assert.is_not_nil(sd.scale)
    local m2 = Masked()
    m2.mask = nd.tensor({7, 7}) -- stays a (non-persistent) buffer
    local missing, unexpected = m2:load_state_dict(sd)
    assert.are.same({}, missing)
    assert.are.same({}, unexpected)
    assert.are.same({7, 7}, m2.mask:totable())
    sd.mask = nd.tensor({0, 0})
    has(errmsg(m2.load_state_dict, m2, sd), "unexpected keys: mask")
    -- registered again as persistent, it is saved
    m2:register_buffer("mask", nd.tensor({5, 5}))
    assert.is_not_nil(m2:state_dict().mask)
    has(errmsg(m2.register_buffer, m2, "x", nd.ones({1}), {persistant = false}),
        "needle.nn.Masked.register_buffer: unknown option 'persistant' (valid: persistent)")
    has(errmsg(m2.register_buffer, m2, "x", 3), "needle.nn.Masked.register_buffer: buffer 'x' must be a tensor or nil, got 3")
  end)
end)

describe("Module:summary", function()
  local function model()
    nd.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
  end

  it("lists each layer's output shape and parameters, then the totals", function()
    local m = model()
    m[1]:requires_grad_(false)
    local text = m:summary({2, 1, 8, 8}, {verbose = 0})
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    local function row(prefix)
      for _, l in ipairs(lines) do if l:find(prefix, 1, true) then return l end end
      error("no row " .. prefix .. " in\n" .. text)
    end
    assert.matches("^Sequential%s+{2,10}%s+%-%-$", row("Sequential"))
    assert.matches("^  0 %(Conv2d%)%s+{2,4,6,6}%s+40$", row("0 (Conv2d)"))
    assert.matches("^  1 %(ReLU%)%s+{2,4,6,6}%s+%-%-$", row("1 (ReLU)"))
    assert.matches("^  2 %(Flatten%)%s+{2,144}%s+%-%-$", row("2 (Flatten)"))
    assert.matches("^  3 %(Linear%)%s+{2,10}%s+1,450$", row("3 (Linear)"))
    has(text, "Total params: 1,490")
    has(text, "Trainable params: 1,450")
    has(text, "Non-trainable params: 40")
    -- the same from an example input, and the hooks it used are gone
    assert.are.equal(text, m:summary(nd.zeros({2, 1, 8, 8}), {verbose = 0}))
    assert.is_nil(rawget(m[1], "_hooks"))
  end)

  it("depth limits the rows; without an input it lists the tree; several inputs; several results", function()
    local m = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 1))
    local text = m:summary({3, 2}, {depth = 2, verbose = 0})
    has(text, "  0 (Sequential)")
    has(text, "  1 (Linear)")
    -- depth 2 drops the nested Linear's row (depth 3) but still counts its parameters
    assert.is_nil(text:find("    0 (Linear)", 1, true))
    assert.are.equal(1, select(2, text:gsub("%(Linear%)", "")))
    has(text, "Total params: 9")
    local tree = m:summary({verbose = 0})
    has(tree, "    0 (Linear)")
    has(tree, "Total params: 9")
    local Pair = nn.Module:extend("Pair")
    function Pair:forward(a, b) return a + b, a - b end
    has(Pair():summary({{2, 3}, nd.ones({2, 3})}, {verbose = 0}), "({2,3}, {2,3})")
    local lstm = nn.LSTM(3, 4)
    has(lstm:summary({5, 1, 3}, {verbose = 0}), "({5,1,4}, ({1,1,4}, {1,1,4}))")
  end)

  it("runs on an OpenCL device", function()
    if D.pending_without_opencl(pending, "Module:summary on OpenCL") then return end
    for _, dev in ipairs(D.opencl()) do
      local m = model():to(dev)
      has(m:summary({2, 1, 8, 8}, {device = dev, verbose = 0}), "{2,10}")
    end
  end)

  it("prints unless verbose = 0, and names what was wrong", function()
    local printed = {}
    local real_print = _G.print -- (the package's print: the global table's, not this file's)
    _G.print = function(s) printed[#printed + 1] = s end
    local ok, text = pcall(nn.Linear(2, 2).summary, nn.Linear(2, 2), {1, 2})
    _G.print = real_print
    assert.is_true(ok, text)
    assert.are.same({text}, printed)
    local m = model()
    has(errmsg(m.summary, m, {2, 1, 2.5}), "needle.nn.Module.summary: input 1: a shape is a list of sizes >= 0, but entry 3 is 2.5")
    has(errmsg(m.summary, m, {2, 3}, {verbose = 0}), "needle.nn.Module.summary: the model failed on the example input")
    has(errmsg(m.summary, m, "x"), "needle.nn.Module.summary: expected an example input (a tensor), a shape or a list of them")
    has(errmsg(m.summary, m, {2, 1, 8, 8}, {dept = 1}), "needle.nn.Module.summary: unknown option 'dept' (valid: depth, device, dtype, verbose)")
    assert.is_nil(rawget(m[1], "_hooks")) -- a failed run leaves no hook behind
  end)

  it("runs in eval mode under no_grad, and leaves the modes, running stats and RNG as they were", function()
    nd.manual_seed(3)
    local Probe = nn.Module:extend("Probe")
    function Probe:forward(x)
      self.saw = {training = self.training, grad = nd.is_grad_enabled()}
      return x + nd.rand_like(x) -- draws from the global RNG
    end
    local bn, drop, probe = nn.BatchNorm1d(4), nn.Dropout(0.5), Probe()
    local m = nn.Sequential(nn.Linear(4, 4), bn, drop, probe, nn.Linear(4, 2))
    drop:eval() -- mixed modes come back as they were
    local mean, var = bn.running_mean:clone(), bn.running_var:clone()
    local state = nd.get_rng_state()
    has(m:summary({3, 4}, {verbose = 0}), "{3,2}")
    assert.are.same({training = false, grad = false}, probe.saw)
    assert.are.equal(0, bn.num_batches_tracked:item())
    assert.is_true(mean:equal(bn.running_mean) and var:equal(bn.running_var))
    assert.is_true(m.training and bn.training and probe.training and m[1].training and m[5].training)
    assert.is_false(drop.training)
    local after = nd.rand({5})
    nd.set_rng_state(state)
    assert.is_true(nd.rand({5}):equal(after))
    -- a failed run restores the modes too
    has(errmsg(m.summary, m, {3, 5}, {verbose = 0}), "the model failed on the example input")
    assert.is_true(m.training and bn.training and probe.training)
    assert.is_false(drop.training)
  end)

  it("makes a shape's input on the model's device and in its dtype (options override)", function()
    local function small() return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)) end
    has(small():double():summary({2, 1, 6, 6}, {verbose = 0}), "{2,3}")
    has(errmsg(small().summary, small(), {2, 1, 6, 6}, {dtype = "float64", verbose = 0}),
        "the model failed on the example input")
    for _, dev in ipairs(D.opencl()) do
      has(small():to(dev):summary({2, 1, 6, 6}, {verbose = 0}), "{2,3}")
      has(errmsg(small():to(dev).summary, small():to(dev), {2, 1, 6, 6}, {device = "cpu", verbose = 0}),
          "the model failed on the example input")
    end
    if #D.opencl() == 0 then pending("a model on OpenCL: no OpenCL device (" .. tostring(D.reason) .. ")") end
  end)
end)
