-- compile_spec.lua - nd.compile (lua/needle/compile, src/ops/graph.c): a
-- compiled training step or forward gives what the eager one gives (losses,
-- every gradient, parameters after 10 optimizer steps) on the cpu and on
-- every OpenCL device; guards trace again when they must; reads of values
-- on the host are refused (or fall back); constants, random streams,
-- gradients and optimizer state follow the eager semantics on every replay;
-- the memory plan shares buffers; memory stays flat over many replays.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local ir = require "needle.compile.ir"
local errmsg, assert_contains = A.errmsg, A.assert_contains
local nn = nd.nn

local DEVICES = D.all()

-- the largest |a - b| / max(|b|, tiny) over two tensors (same shape)
local function rel_diff(a, b)
  a, b = a:to("cpu"):double(), b:to("cpu"):double()
  return ((a - b):abs() / (b:abs() + 1e-30)):max():item()
end

local function max_abs(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end

-- Runs `steps` calls of the step made by make(device) eagerly and compiled,
-- from the same seed and inputs; returns both runs' outputs, parameters,
-- gradients and the compiled callable.
local function twin(make, device, steps, copts)
  local runs = {}
  -- a fixed thread count for both runs: adaptive threads (docs/threads.md) would
  -- take fewer under another process's load, and sums over threads change order
  local was = nd.threads()
  nd.set_num_threads(was.max, {adaptive = false})
  for _, compiled in ipairs({false, true}) do
    nd.manual_seed(11)
    local step, params, inputs, driver = make(device)
    local f = compiled and nd.compile(step, copts) or step
    local call = driver and driver(f) or f
    local outs = {}
    for i = 1, steps do
      nd.manual_seed(100 + i) -- the same draws (dropout) in both runs
      outs[i] = call(table.unpack(inputs(i)))
    end
    local grads = {}
    for i, p in ipairs(params) do grads[i] = p.grad end
    runs[#runs + 1] = {outs = outs, params = params, grads = grads, f = f}
  end
  nd.set_num_threads(was.max, {adaptive = was.adaptive})
  return runs[1], runs[2]
end

local function assert_same_run(e, c, tol, what)
  for i, o in ipairs(e.outs) do
    if nd.is_tensor(o) then
      local d = rel_diff(c.outs[i], o)
      assert(d <= tol, ("%s: output of call %d differs by %g (relative)"):format(what, i, d))
    end
  end
  assert.are.equal(#e.params, #c.params)
  for i, p in ipairs(e.params) do
    local d = max_abs(c.params[i], p) / math.max(p:to("cpu"):double():abs():max():item(), 1e-30)
    assert(d <= tol, ("%s: parameter %d differs by %g after the steps"):format(what, i, d))
    if e.grads[i] ~= nil then
      assert(c.grads[i] ~= nil, what .. ": compiled run lost gradient " .. i)
      local dg = max_abs(c.grads[i], e.grads[i]) /
                 math.max(e.grads[i]:to("cpu"):double():abs():max():item(), 1e-30)
      assert(dg <= tol, ("%s: gradient %d differs by %g"):format(what, i, dg))
    end
  end
end

-- models and steps ------------------------------------------------------------------------

local function train_step(model, opt, loss_fn)
  return function(x, y)
    opt:zero_grad()
    local loss = loss_fn(model(x), y)
    loss:backward()
    opt:step()
    return loss
  end
end

-- A Linear(3, 2) trained `steps` steps on (ones * i, zeros) with mse, eagerly and then
-- through nd.compile, from one seed. make_opt(m) -> opt[, scheduler stepped after each
-- step]; each(i, m, opt), if given, runs before step i. Returns the two runs, each
-- {m = module, opt = optimizer, f = the step (compiled in the second)}.
local function linear_twins(steps, make_opt, each)
  local runs = {}
  for _, compiled in ipairs({false, true}) do
    nd.manual_seed(2)
    local m = nn.Linear(3, 2)
    local opt, sched = make_opt(m)
    local f = train_step(m, opt, function(o, y) return nd.F.mse_loss(o, y) end)
    if compiled then f = nd.compile(f) end
    for i = 1, steps do
      if each then each(i, m, opt) end
      f(nd.ones(4, 3) * i, nd.zeros(4, 2))
      if sched then sched:step() end
    end
    runs[#runs + 1] = {m = m, opt = opt, f = f}
  end
  return runs[1], runs[2]
end

local function batches(device, shape, classes, n_rows)
  return function(i)
    nd.manual_seed(1000 + i)
    local x = nd.randn(shape):to(device)
    local y = nd.randint(1, classes, {n_rows}):to(device)
    return {x, y}
  end
end

local MODELS = {
  {name = "MLP, SGD momentum", steps = 10, make = function(device)
    local m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)):to(device)
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {8, 12}, 4, 8)
  end},
  {name = "MLP, Adam", steps = 10, make = function(device)
    local m = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4)):to(device)
    local opt = nd.optim.Adam(m:parameters(), {lr = 1e-2})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {8, 12}, 4, 8)
  end},
  {name = "MLP, AdamW amsgrad", steps = 10, make = function(device)
    local m = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 4)):to(device)
    local opt = nd.optim.AdamW(m:parameters(), {lr = 1e-2, amsgrad = true})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {8, 12}, 4, 8)
  end},
  {name = "conv + batch norm + pooling (ResNet9's layers), SGD", steps = 10, make = function(device)
    local m = nn.Sequential(nn.models.ConvBN(3, 8, 3, 1), nn.MaxPool2d(2), nn.models.ConvBN(8, 8, 3, 1),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)):to(device)
    m:train()
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.05, momentum = 0.9, weight_decay = 1e-4})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {4, 3, 8, 8}, 5, 4)
  end},
  {name = "ResNet9 (batch norm in training mode), SGD momentum", steps = 10, make = function(device)
    local m = nn.ResNet9({num_classes = 4}):to(device)
    m:train()
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.01, momentum = 0.9})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {2, 3, 32, 32}, 4, 2)
  end},
  {name = "LSTM language model, clipped gradients, state carried over", steps = 10, make = function(device)
    local V, T, B = 30, 5, 3
    local m = nn.LanguageModel(V, {embedding_size = 8, hidden_size = 12, num_layers = 2}):to(device)
    m:train()
    local opt = nd.optim.SGD(m:parameters(), {lr = 1.0})
    local step = function(ids, y, h, c)
      opt:zero_grad()
      local logits, state = m(ids, {h, c})
      local loss = nd.F.cross_entropy(logits, y)
      loss:backward()
      nn.utils.clip_grad_norm_(m:parameters(), 0.25)
      opt:step()
      return loss, state[1]:detach(), state[2]:detach()
    end
    -- the recurrent state goes out of one call and into the next
    local driver = function(f)
      local h, c = nd.zeros(2, B, 12):to(device), nd.zeros(2, B, 12):to(device)
      return function(ids, y)
        local loss
        loss, h, c = f(ids, y, h, c)
        return loss
      end
    end
    local inputs = function(i)
      nd.manual_seed(1000 + i)
      return {nd.randint(1, V, {T, B}):to(device), nd.randint(1, V, {T * B}):to(device)}
    end
    return step, m:parameters(), inputs, driver
  end},
  {name = "Transformer encoder with dropout, Adam", steps = 8, make = function(device)
    local layer = nn.TransformerEncoderLayer(16, 2, {dim_feedforward = 32, dropout = 0.1, batch_first = true})
    local m = nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Flatten(2, 3), nn.Linear(4 * 16, 3)):to(device)
    m:train()
    local opt = nd.optim.Adam(m:parameters(), {lr = 1e-3})
    return train_step(m, opt, nn.CrossEntropyLoss()), m:parameters(), batches(device, {2, 4, 16}, 3, 2)
  end},
  {name = "needle's decoder-only Transformer, SGD", steps = 8, make = function(device)
    local tr = nn.Transformer(16, 32, 2, {num_head = 2, batch_first = true, sequence_len = 8}):to(device)
    local head = nn.Linear(4 * 16, 3):to(device)
    tr:train()
    local params = tr:parameters()
    for _, p in ipairs(head:parameters()) do params[#params + 1] = p end
    local opt = nd.optim.SGD(params, {lr = 0.05})
    local step = function(x, y)
      opt:zero_grad()
      local out = tr(x)
      local loss = nd.F.cross_entropy(head(out:reshape({2, 4 * 16})), y)
      loss:backward()
      opt:step()
      return loss
    end
    return step, params, batches(device, {2, 4, 16}, 3, 2)
  end},
}

for _, device in ipairs(DEVICES) do
  describe("nd.compile on " .. device .. ": compiled training steps equal eager ones", function()
    for _, model in ipairs(MODELS) do
      it(model.name .. " (10 steps: outputs, gradients, parameters)", function()
        local e, c = twin(model.make, device, model.steps, {verify = true})
        assert_same_run(e, c, 1e-5, model.name)
        assert.are.equal(model.steps - 2, c.f.stats.replays, "every call after warm-up and capture replays")
        assert.are.equal(0, c.f.stats.retraces)
      end)
    end

    it("a compiled forward (eval) equals the eager one, and its output is a copy", function()
      nd.manual_seed(3)
      local m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)):to(device)
      m:eval()
      local cf = nd.compile(m)
      local outs = {}
      for i = 1, 4 do
        local x = nd.randn(5, 6):to(device)
        outs[i] = {cf(x), nd.no_grad(function() return m(x) end)}
      end
      for i = 1, 4 do assert.are.equal(0, max_abs(outs[i][1], outs[i][2])) end
      -- the output of call 3 was not overwritten by call 4
      assert(max_abs(outs[3][1], outs[4][1]) > 0)
      assert.are.equal(2, cf.stats.replays)
    end)
  end)
end

describe("nd.compile guards", function()
  local function counter_step()
    nd.manual_seed(5)
    local m = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5), nn.Linear(3, 2))
    local cf = nd.compile(function(x) return m(x) end)
    return cf, m
  end

  it("a new shape, dtype or device is a new cache entry; the old one still replays", function()
    local cf = nd.compile(function(x) return x * 2 + 1 end)
    local a, b = nd.ones(3), nd.ones(4)
    for _ = 1, 3 do cf(a) end
    assert.are.equal(1, cf.stats.captures)
    for _ = 1, 3 do cf(b) end
    assert.are.equal(2, cf.stats.captures)
    cf(a)
    assert.are.equal(2, cf.stats.captures)
    assert.are.equal(3, cf.stats.replays)
    for _ = 1, 3 do cf(nd.ones(3, {dtype = "float64"})) end
    assert.are.equal(3, cf.stats.captures)
    assert.are.equal("float64", cf(nd.ones(3, {dtype = "float64"})).dtype)
    if D.available then
      local dev = D.opencl()[1]
      for _ = 1, 3 do cf(nd.ones(3):to(dev)) end
      assert.are.equal(4, cf.stats.captures)
      assert.are.equal(dev, cf(nd.ones(3):to(dev)).device)
    end
    assert.are.equal(0, cf.stats.retraces)
  end)

  it("numbers among the arguments are part of the key", function()
    local cf = nd.compile(function(x, s) return x * s end)
    for _ = 1, 3 do assert.are.equal(6, cf(nd.ones(1), 6):item()) end
    for _ = 1, 3 do assert.are.equal(7, cf(nd.ones(1), 7):item()) end
    assert.are.equal(2, cf.stats.captures)
  end)

  it("train/eval retraces (dropout on, then off)", function()
    local cf, m = counter_step()
    local x = nd.ones(2, 4)
    for _ = 1, 3 do cf(x) end
    m:eval()
    local y = cf(x)
    assert.are.equal(1, cf.stats.retraces)
    assert.are.equal(0, max_abs(y, nd.no_grad(function() return m(x) end)))
    assert_contains(cf:explain(), "eval mode")
  end)

  it("replacing a parameter, or its memory, retraces", function()
    local cf, m = counter_step()
    m:eval()
    local x = nd.ones(2, 4)
    for _ = 1, 3 do cf(x) end
    m[1].weight = nd.nn.Parameter(nd.zeros(3, 4))
    local y = cf(x)
    assert.are.equal(1, cf.stats.retraces)
    assert.are.equal(0, max_abs(y, nd.no_grad(function() return m(x) end)))
    for _ = 1, 2 do cf(x) end
    m[3].weight:set_data_(nd.ones(2, 3))
    y = cf(x)
    assert.are.equal(2, cf.stats.retraces)
    assert.are.equal(0, max_abs(y, nd.no_grad(function() return m(x) end)))
  end)

  it("grad mode is part of the key", function()
    local w = nd.ones(3):requires_grad_()
    local cf = nd.compile(function(x) return (x * w):sum() end)
    for _ = 1, 3 do cf(nd.ones(3)) end
    nd.no_grad(function() for _ = 1, 3 do cf(nd.ones(3)) end end)
    assert.are.equal(2, cf.stats.captures)
  end)

  it("SGD's lr and momentum can change without a retrace, with eager's results; weight decay retraces", function()
    local e, c = linear_twins(8, function(m)
      return nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.5})
    end, function(i, _, opt)
      if i == 5 then opt.param_groups[1].lr = 0.01 end
      if i == 6 then opt.param_groups[1].momentum = 0.8 end
    end)
    assert.are.equal(0, max_abs(c.m.weight, e.m.weight))
    assert.are.equal(0, c.f.stats.retraces)
    -- a hyperparameter the kernels hold as a constant retraces
    local m = nn.Linear(3, 2)
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.5})
    local g = nd.compile(train_step(m, opt, function(o, y) return nd.F.mse_loss(o, y) end))
    for _ = 1, 3 do g(nd.ones(4, 3), nd.zeros(4, 2)) end
    opt.param_groups[1].weight_decay = 1e-3
    g(nd.ones(4, 3), nd.zeros(4, 2))
    assert.are.equal(1, g.stats.retraces)
    for _ = 1, 2 do g(nd.ones(4, 3), nd.zeros(4, 2)) end
    opt.param_groups[1].momentum = 0 -- no momentum at all: another graph
    g(nd.ones(4, 3), nd.zeros(4, 2))
    assert.are.equal(2, g.stats.retraces)
  end)

  it("Adam's lr follows a scheduler without retracing, with eager's results", function()
    local e, c = linear_twins(9, function(m)
      local opt = nd.optim.Adam(m:parameters(), {lr = 0.1})
      return opt, nd.optim.lr_scheduler.StepLR(opt, {step_size = 2, gamma = 0.5})
    end)
    local me, oe, mc, oc, f = e.m, e.opt, c.m, c.opt, c.f
    assert.are.equal(0, max_abs(mc.weight, me.weight))
    assert.are.equal(0, f.stats.retraces)
    -- the step count in the state advanced as eagerly
    assert.are.equal(oe.state[me.weight].step, oc.state[mc.weight].step)
    -- and the private scalars stay out of the state dict
    local sd = oc:state_dict()
    for _, st in pairs(sd.state) do
      for k in pairs(st) do assert.are_not.equal("_", k:sub(1, 1)) end
    end
  end)

  it("the cache keeps cache_size entries, least recently used out", function()
    local cf = nd.compile(function(x) return x + 1 end, {cache_size = 2, warmup = 0})
    cf(nd.ones(1)); cf(nd.ones(2)); cf(nd.ones(3))
    assert.are.equal(1, cf.stats.evictions)
    cf(nd.ones(3)); cf(nd.ones(2))
    assert.are.equal(3, cf.stats.captures)
    cf(nd.ones(1))
    assert.are.equal(4, cf.stats.captures)
  end)
end)

describe("nd.compile: what a replay must redo", function()
  it("constants made on the host and then updated in place are put back each call", function()
    local step = function(x)
      local acc = nd.tensor({0.5, 0.5, 0.5}) -- made on the host: no kernel to replay
      acc:add_(x)              -- (zeros would be folded away: compile_passes_spec, simplify)
      acc:add_(x)
      local r = nd.tensor({1, 2, 3}, {dtype = "int64"})
      r:mul_(2)
      return acc + r
    end
    local cf = nd.compile(step, {verify = true})
    for i = 1, 5 do
      local x = nd.ones(3) * i
      assert.are.equal(0, max_abs(cf(x), step(x)))
    end
    assert.are.equal(3, cf.stats.replays)
    assert_contains(cf:explain(), "constants: 2")
  end)

  it("a gradient filled in part (select's backward) keeps its zeros in a shared buffer", function()
    local w = nd.randn(4, 3):requires_grad_()
    local step = function(x)
      w.grad = nil
      local loss = (w[2] * x):sum() + (w[4] * x):sum()
      loss:backward()
      return w.grad:clone()
    end
    local cf = nd.compile(step)
    for i = 1, 5 do
      local x = nd.randn(3)
      assert.are.equal(0, max_abs(cf(x), step(x)))
    end
  end)

  it("dropout draws fresh numbers on every replay, exactly as eager calls would", function()
    local f = function(x) return nd.F.dropout(x, 0.5, true) end
    local cf = nd.compile(f)
    nd.manual_seed(9)
    local eager = {}
    for i = 1, 5 do eager[i] = f(nd.ones(64)) end
    nd.manual_seed(9)
    for i = 1, 5 do assert.are.equal(0, max_abs(cf(nd.ones(64)), eager[i])) end
    assert(max_abs(eager[4], eager[5]) > 0)
  end)

  it("labels and indices change from call to call (shifted on the device, checked every replay)", function()
    local emb = nn.Embedding(10, 2)
    local step = function(ids, y)
      local logits = emb(ids):sum(2)
      return nd.F.cross_entropy(logits, y)
    end
    local cf = nd.compile(step)
    for i = 1, 5 do
      local ids = nd.randint(1, 10, {3, 3})
      local y = nd.randint(1, 2, {3})
      assert.are.equal(0, max_abs(cf(ids, y), step(ids, y)), "call " .. i)
    end
    local msg = errmsg(cf, nd.tensor({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, {dtype = "int64"}), nd.tensor({1, 3, 1}, {dtype = "int64"}))
    assert_contains(msg, "cross_entropy")
    assert_contains(msg, "label 3 of row 2 is out of range for 2 classes")
    msg = errmsg(cf, nd.tensor({{1, 2, 3}, {4, 11, 6}, {7, 8, 9}}, {dtype = "int64"}), nd.tensor({1, 2, 1}, {dtype = "int64"}))
    assert_contains(msg, "out of bounds")
  end)

  it("nll_loss compiles (its pick is a gather, whose bounds check every replay runs)", function()
    nd.manual_seed(4)
    local f = function(x, y) return nd.F.nll_loss(nd.F.log_softmax(x, 2), y, {ignore_index = 4}) end
    local cf = nd.compile(f)
    for _ = 1, 4 do
      local x = nd.randn(5, 4)
      local y = nd.randint(1, 4, {5})
      assert.are.equal(0, max_abs(cf(x, y), f(x, y)))
    end
    assert.are.equal(2, cf.stats.replays)
    assert_contains(errmsg(cf, nd.randn(5, 4), nd.tensor({1, 5, 2, 3, 1}, {dtype = "int64"})),
                    "index 5 is out of bounds for dim 2 with size 4")
  end)

  it("a refused replay names the line of the compiled call and the line that made the check", function()
    local cf = nd.compile(function(x, y)
      local h = x * 2
      local loss = nd.F.cross_entropy(h, y) -- (this line: the check's; a tail call would name the caller's)
      return loss
    end)
    local check_line = debug.getinfo(1, "l").currentline - 3
    local x = nd.randn(3, 4)
    local ok_labels = nd.tensor({1, 2, 3}, {dtype = "int64"})
    cf(x, ok_labels); cf(x, ok_labels)
    local call_line
    local ok, msg = pcall(function()
      call_line = debug.getinfo(1, "l").currentline + 1
      local r = cf(x, nd.tensor({1, 2, 7}, {dtype = "int64"}))
      return r
    end)
    assert.is_false(ok)
    assert_contains(msg, "compile_spec.lua:" .. call_line .. ": needle.cross_entropy: label 7 of row 3 is out "
                         .. "of range for 4 classes (expected 1..4)")
    assert_contains(msg, "(the check of cross_entropy recorded at spec/compile_spec.lua:" .. check_line .. ")")
    assert.are.equal(0, cf.stats.replays) -- (a refused replay is none)
    local ci = nd.compile(function(t, i) local r = t:index_select(1, i); return r end)
    local idx_line = debug.getinfo(1, "l").currentline - 1
    ci(x, nd.tensor({1, 2}, {dtype = "int64"})); ci(x, nd.tensor({1, 2}, {dtype = "int64"}))
    msg = errmsg(ci, x, nd.tensor({1, 9}, {dtype = "int64"}))
    assert_contains(msg, "index 9 is out of bounds for dim 1 with size 3 (at position {2} of the index tensor) "
                         .. "(the check of index_select recorded at spec/compile_spec.lua:" .. idx_line .. ")")
  end)

  it("an argument updated in place gets the update back, as eagerly", function()
    local f = function(x, y) x:mul_(2); x:narrow(1, 1, 1):add_(y:sum()); return x * 1 end
    local cf = nd.compile(f)
    for i = 1, 4 do
      local a, b = nd.ones(3) * i, nd.ones(3) * i
      local y = nd.ones(2)
      local got, want = cf(a, y), f(b, y)
      assert.are.equal(0, max_abs(got, want))
      assert.are.equal(0, max_abs(a, b), "the argument itself, call " .. i)
    end
    assert.are.equal(2, cf.stats.replays)
  end)

  it("arguments sharing memory that the function updates are refused", function()
    local cf = nd.compile(function(a, b) a:add_(1) return a + b end, {warmup = 0})
    local x = nd.ones(3)
    assert_contains(errmsg(cf, x, x:view({3})), "arguments 1, 2 share memory")
    local cr = nd.compile(function(a, b) return a + b end, {warmup = 0})
    assert.are.equal(6, cr(x, x):sum():item()) -- read only: fine
  end)

  it("an argument that is also a tensor the function reaches itself: eager where a copy would diverge", function()
    -- a buffer the function updates through its closure, passed as the argument of a later call
    local buf = nd.ones(3)
    local f = function(x) buf:mul_(2); return x + 1 end
    local cf = nd.compile(f)
    local other = nd.ones(3)
    cf(other) -- eager
    cf(other) -- captured
    assert.are.equal(0, max_abs(buf, nd.full({3}, 4)))
    local got = cf(buf) -- eagerly: buf doubled to 8 first, then read through the argument
    assert.are.equal(0, max_abs(got, nd.full({3}, 9)))
    assert.are.equal(0, max_abs(buf, nd.full({3}, 8)))
    local view = buf:view({3}) -- another tensor of the same memory
    assert.are.equal(0, max_abs(cf(view), nd.full({3}, 17)))
    assert.are.equal(2, cf.stats.eager - 1)
    assert_contains(cf:explain(), "aliasing: 2 call(s) ran eagerly")
    assert.are.equal(0, max_abs(cf(other), nd.full({3}, 2))) -- unrelated arguments replay again
    assert.are.equal(1, cf.stats.replays)
    -- an argument updated in place that a parameter's memory also is (a training step given
    -- the weight): eager, with eager's result
    nd.manual_seed(1)
    local lin = nn.Linear(3, 3)
    local g = function(x) x:mul_(0.5); return lin(x):sum() end
    local cg = nd.compile(g)
    cg(nd.ones(3, 3)); cg(nd.ones(3, 3)) -- (the weight's shape: the same cache entry)
    local w = lin.weight:detach()
    local w_copy = w:clone()
    -- lin(W/2) = (W/2) (W/2)^T + b, after the step has halved W itself
    local eager = nd.no_grad(function() return (w_copy * 0.5):matmul((w_copy * 0.5):t()):sum() +
                                            lin.bias:detach():sum() * 3 end)
    local r = cg(w)
    assert.are.equal(2, cg.stats.eager) -- the warm-up and this one
    assert(math.abs(r:item() - eager:item()) < 1e-5, r:item() .. " vs " .. eager:item())
    assert.are.equal(0, max_abs(lin.weight:detach(), w_copy * 0.5))
    -- the capture itself meets it: refused, naming the argument
    local buf2 = nd.ones(3)
    local ch = nd.compile(function(x) buf2:mul_(2); return x + 1 end, {warmup = 0})
    assert_contains(errmsg(ch, buf2), "argument 1 (a tensor")
    assert_contains(errmsg(ch, buf2), "shares memory with a tensor the function also reaches without it")
    -- read only on both sides: replays as usual
    local w2 = nd.ones(3)
    local cr = nd.compile(function(x) return x + w2 end, {warmup = 0})
    assert.are.equal(0, max_abs(cr(w2), nd.full({3}, 2)))
    assert.are.equal(0, max_abs(cr(w2), nd.full({3}, 2)))
    assert.are.equal(1, cr.stats.replays)
  end)

  it("a replay refused by a host check leaves the parameters as they were", function()
    nd.manual_seed(1)
    local m = nn.Linear(3, 2)
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.5})
    local cf = nd.compile(train_step(m, opt, nn.CrossEntropyLoss()))
    for _ = 1, 3 do cf(nd.randn(4, 3), nd.tensor({1, 2, 1, 2}, {dtype = "int64"})) end
    local before = m.weight:clone()
    errmsg(cf, nd.randn(4, 3), nd.tensor({1, 2, 3, 2}, {dtype = "int64"}))
    assert.are.equal(0, max_abs(m.weight, before))
  end)

  it("a replay refused by an index out of bounds after the step leaves parameters and Adam's state as they were", function()
    -- the bounds check comes after opt:step() in the function, and its index is computed from the
    -- argument (1-based to 0-based): the check and that computation run first in a replay
    nd.manual_seed(1)
    local model = nn.Linear(4, 3)
    local E = nd.randn(5, 2)
    local opt = nd.optim.Adam(model:parameters(), {lr = 0.1})
    local cf = nd.compile(function(x, y, idx)
      opt:zero_grad()
      local loss = nd.F.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      return loss, E:index_select(1, idx), E:gather(2, idx:view(2, 1))
    end)
    local x, y = nd.randn(2, 4), nd.tensor({1, 2}, {dtype = "int64"})
    local good = nd.tensor({1, 2}, {dtype = "int64"})
    for _ = 1, 3 do cf(x, y, good) end -- eager, captured, replayed
    local st = opt.state[model.weight]
    local w0, b0, m0, v0, n0 = model.weight:clone(), model.bias:clone(), st.exp_avg:clone(), st.exp_avg_sq:clone(), st.step
    for _, bad in ipairs({{1, 9}, {0, 1}, {3, -2}}) do
      local msg = errmsg(cf, x, y, nd.tensor(bad, {dtype = "int64"}))
      assert_contains(msg, "index_select")
      assert_contains(msg, "out of bounds")
      assert.are.equal(0, max_abs(model.weight, w0))
      assert.are.equal(0, max_abs(model.bias, b0))
      assert.are.equal(0, max_abs(st.exp_avg, m0))
      assert.are.equal(0, max_abs(st.exp_avg_sq, v0))
      assert.are.equal(n0, st.step)
    end
    cf(x, y, good) -- and the next good call steps on from there, as eagerly
    assert.are.equal(n0 + 1, st.step)
    assert(max_abs(model.weight, w0) > 0)
  end)

  it("a mean over labels with a different count of ignored rows is refused, not wrong", function()
    local f = function(x, y) return nd.F.cross_entropy(x, y, {ignore_index = 2}) end
    local cf = nd.compile(f)
    local x = nd.randn(4, 3)
    for _ = 1, 3 do assert.are.equal(0, max_abs(cf(x, nd.tensor({1, 2, 3, 1}, {dtype = "int64"})), f(x, nd.tensor({1, 2, 3, 1}, {dtype = "int64"})))) end
    assert.are.equal(0, max_abs(cf(x, nd.tensor({2, 1, 3, 3}, {dtype = "int64"})), f(x, nd.tensor({2, 1, 3, 3}, {dtype = "int64"}))))
    assert_contains(errmsg(cf, x, nd.tensor({2, 2, 3, 1}, {dtype = "int64"})), "rows not equal to ignore_index")
  end)
end)

describe("nd.compile: what the review found", function()
  it("tensors in a table argument keep their places (keys in a fixed order)", function()
    local f = function(b) return b.input * 2 - b.target end
    local cf = nd.compile(f)
    for i = 1, 5 do
      local b = {input = nd.ones(3) * i, target = nd.ones(3) * (10 * i), extra = {x = nd.ones(3), [1] = nd.zeros(3)}}
      assert.are.equal(0, max_abs(cf(b), f(b)))
    end
  end)

  it("the same tensor passed twice stays one tensor", function()
    local f = function(a, b) a:add_(1) return a + b end
    local cf = nd.compile(f)
    for i = 1, 4 do
      local x, y = nd.ones(2) * i, nd.ones(2) * i
      assert.are.equal(0, max_abs(cf(x, x), f(y, y)))
      assert.are.equal(0, max_abs(x, y))
    end
  end)

  it("optimizer state made during the capture is refused (warmup = 0)", function()
    local m = nn.Linear(2, 2)
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
    local cf = nd.compile(train_step(m, opt, function(o, y) return nd.F.mse_loss(o, y) end), {warmup = 0})
    assert_contains(errmsg(cf, nd.ones(3, 2), nd.zeros(3, 2)), "would be made inside nd.compile")
  end)

  it("Lua state made on the first call and updated in place: refused at capture, fine after warm-up", function()
    local acc
    local f = function(x)
      if acc == nil then acc = nd.zeros(3) end
      acc:add_(x)
      return acc * 1
    end
    assert_contains(errmsg(nd.compile(f, {warmup = 0}), nd.ones(3)), "state made during the capture")
    acc = nil
    local cf = nd.compile(f)
    for i = 1, 4 do assert.are.equal(3 * i * (i + 1) / 2, cf(nd.ones(3) * i):sum():item()) end
  end)

  it("gradients cleared outside: each call must clear them, else the replay refuses", function()
    local w = nd.ones(3):requires_grad_()
    local f = function(x) (w * x):sum():backward() end
    local cf = nd.compile(f)
    for i = 1, 4 do
      w.grad = nil
      cf(nd.ones(3) * i)
      assert.are.equal(3 * i, w.grad:sum():item())
    end
    assert_contains(errmsg(cf, nd.ones(3)), "has a gradient from before this call")
  end)

  it("two Adam steps in one compiled call are refused", function()
    local m = nn.Linear(2, 2)
    local opt = nd.optim.Adam(m:parameters())
    local cf = nd.compile(function(x)
      for _ = 1, 2 do
        opt:zero_grad()
        m(x):sum():backward()
        opt:step()
      end
    end)
    cf(nd.ones(1, 2))
    assert_contains(errmsg(cf, nd.ones(1, 2)), "two steps of one parameter in one compiled call")
  end)

  it("Adagrad and RMSprop are refused inside (their step lives in Lua)", function()
    local m = nn.Linear(2, 2)
    for _, name in ipairs({"Adagrad", "RMSprop"}) do
      local opt = nd.optim[name](m:parameters())
      local cf = nd.compile(train_step(m, opt, function(o, y) return nd.F.mse_loss(o, y) end))
      cf(nd.ones(3, 2), nd.zeros(3, 2))
      assert_contains(errmsg(cf, nd.ones(3, 2), nd.zeros(3, 2)), "cannot step inside nd.compile")
    end
  end)

  it("load_state_dict retraces and the steps go on as eagerly", function()
    local saved
    local e, c = linear_twins(8, function(m) return nd.optim.Adam(m:parameters(), {lr = 0.05}) end,
      function(i, _, opt)
        if i == 4 then saved = opt:state_dict() end
        if i == 6 then opt:load_state_dict(saved) end
      end)
    assert.are.equal(0, max_abs(c.m.weight, e.m.weight))
    assert(c.f.stats.retraces >= 1)
  end)

  it("requires_grad and a module's settings are guards", function()
    nd.manual_seed(8)
    local m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    m:train()
    local cf = nd.compile(function(x) return m(x) end)
    for _ = 1, 3 do cf(nd.ones(2, 4)) end
    m[2].p = 0
    assert.are.equal(0, max_abs(cf(nd.ones(2, 4)), nd.no_grad(function() return m(nd.ones(2, 4)) end)))
    assert.are.equal(1, cf.stats.retraces)
    for _ = 1, 2 do cf(nd.ones(2, 4)) end -- warm-up and capture again
    m[1].weight.requires_grad = false
    cf(nd.ones(2, 4))
    assert.are.equal(2, cf.stats.retraces)
  end)

  it("a replaced child module, a tensor attribute, a raw training flag and register_buffer retrace", function()
    nd.manual_seed(3)
    local m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    m:eval()
    local cf = nd.compile(function(x) return m(x) end)
    local x = nd.ones(2, 4)
    local function check(n)
      assert.are.equal(0, max_abs(cf(x), nd.no_grad(function() return m(x) end)))
      assert.are.equal(n, cf.stats.retraces)
      for _ = 1, 2 do cf(x) end -- warm-up and capture again
    end
    for _ = 1, 3 do cf(x) end
    m[3] = nn.Linear(4, 2)
    check(1)
    m[2].training = true -- a raw field: no generation counts it
    nd.manual_seed(5)
    local got = cf(x)
    nd.manual_seed(5)
    local want = nd.no_grad(function() return m(x) end)
    assert.are.equal(0, max_abs(got, want))
    assert.are.equal(2, cf.stats.retraces)
    for _ = 1, 2 do cf(x) end
    m[2].training = false
    check(3)
    m[1]:register_buffer("extra", nd.ones(1))
    check(4)
    local holder = nn.Module:extend("Holder")
    function holder:init() self.scale = nd.ones(2) end
    function holder:forward(y) return y * self.scale end
    local h = holder()
    local ch = nd.compile(function(y) return h(y) end)
    for _ = 1, 3 do ch(nd.ones(2)) end
    h.scale = nd.ones(2) * 3
    assert.are.equal(6, ch(nd.ones(2)):sum():item())
    assert.are.equal(1, ch.stats.retraces)
  end)

  it("an argument object's fields are guards: a tensor swapped in or a new value retraces", function()
    local Batch = {}
    Batch.__index = Batch
    function Batch:get() return self.x * self.scale end
    local b = setmetatable({x = nd.ones(2), scale = 2}, Batch)
    local cf = nd.compile(function(o) return o:get() + 1 end)
    for _ = 1, 3 do assert.are.equal(0, max_abs(cf(b), nd.full({2}, 3))) end
    assert.are.equal(1, cf.stats.replays)
    b.x:fill_(4) -- in place: the graph reads the object's tensor itself, no retrace needed
    assert.are.equal(0, max_abs(cf(b), nd.full({2}, 9)))
    assert.are.equal(2, cf.stats.replays)
    b.x = nd.full({2}, 5) -- another tensor
    assert.are.equal(0, max_abs(cf(b), nd.full({2}, 11)))
    assert.are.equal(1, cf.stats.retraces)
    assert_contains(cf.retrace_reasons[1], "field 'x' of an argument object changed")
    cf(b)
    b.scale = 3
    assert.are.equal(0, max_abs(cf(b), nd.full({2}, 16)))
    assert_contains(cf.retrace_reasons[2], "field 'scale' of an argument object changed")
    cf(b)
    b.extra = true
    cf(b)
    assert_contains(cf.retrace_reasons[3], "field 'extra' of an argument object was added")
    cf(b); cf(b)
    b.extra = nil
    cf(b)
    assert_contains(cf.retrace_reasons[4], "an argument object lost a field")
    cf(b); cf(b)
    b.x:set_data_(nd.full({2}, 6)) -- new memory under the same tensor
    assert.are.equal(0, max_abs(cf(b), nd.full({2}, 19)))
    assert.are.equal(5, cf.stats.retraces)
    -- an optimizer passed as an argument keeps replaying: its fields stay
    nd.manual_seed(1)
    local m = nn.Linear(3, 1)
    local opt = nd.optim.Adam(m:parameters(), {lr = 0.01})
    local cs = nd.compile(function(o, x) o:zero_grad(); local l = m(x):sum(); l:backward(); o:step(); return l end)
    for _ = 1, 6 do cs(opt, nd.ones(2, 3)) end
    assert.are.equal(4, cs.stats.replays)
    assert.are.equal(0, cs.stats.retraces)
  end)

  it("tensors outside modules are guards too: set_data_, requires_grad_ and a first tensor hook retrace", function()
    -- a training step over a plain parameter list, against the same steps eagerly
    local function run(compile, change)
      local w = nd.tensor({1.0, 2.0, 3.0}, {requires_grad = true})
      local b = nd.tensor({1.0}, {requires_grad = true})
      local opt = nd.optim.SGD({w, b}, {lr = 0.1})
      local function step(x)
        opt:zero_grad()
        local loss = (w * x + b):sum()
        loss:backward()
        opt:step()
        return loss
      end
      local f = compile and nd.compile(step, {fallback = true}) or step
      local x = nd.ones({3})
      for _ = 1, 3 do f(x) end
      change(w)
      local losses = {}
      for i = 1, 3 do losses[i] = f(x):item() end
      return losses, w:detach():clone(), b:detach():clone(), compile and f
    end
    local changes = {
      set_data = function(w) w:set_data_(nd.tensor({100.0, 200.0, 300.0})) end, -- (weights restored)
      freeze = function(w) w:requires_grad_(false) end,
      hook = function(w) w:register_hook(function(g) return g * 0 end) end, -- (frozen by its hook)
    }
    for name, change in pairs(changes) do
      local el, ew, eb = run(false, change)
      local cl, cw, cb, f = run(true, change)
      assert.are.same(el, cl, name)
      assert.are.equal(0, max_abs(ew, cw), name)
      assert.are.equal(0, max_abs(eb, cb), name)
      assert.are.equal(1, f.stats.retraces, name)
      assert_contains(f.retrace_reasons[1], ({set_data = "got new memory (set_data_)",
                      freeze = "changed requires_grad", hook = "got a tensor hook"})[name])
    end
    -- a closure's tensor given new memory
    local s = nd.tensor({1.0, 2.0, 3.0})
    local cg = nd.compile(function(x) return x * s end)
    for _ = 1, 3 do cg(nd.ones(3)) end
    s:set_data_(nd.tensor({10.0, 20.0, 30.0}))
    assert.are.equal(0, max_abs(cg(nd.ones(3)), nd.tensor({10.0, 20.0, 30.0})))
    -- a closure's tensor unfrozen: a compiled forward's backward reaches it
    local w = nd.tensor({1.0, 2.0, 3.0})
    local c = nd.tensor({2.0, 2.0, 2.0}, {requires_grad = true})
    local cf = nd.compile(function(x) return (x * w + c):sum() end)
    local x = nd.tensor({1.0, 2.0, 3.0})
    for _ = 1, 3 do cf(x):backward() end
    w:requires_grad_(true)
    cf(x):backward()
    assert.are.equal(0, max_abs(w.grad, x))
  end)

  it("a function that turns grad mode on itself, called under no_grad, keeps its results' gradients", function()
    nd.manual_seed(0)
    local lin = nn.Linear(3, 1)
    local f = function(x) return nd.enable_grad(function() return lin(x) end) end
    local cf = nd.compile(f)
    for i = 1, 4 do
      local x = nd.randn(2, 3)
      local y = nd.no_grad(function() return cf(x) end)
      assert.is_true(y.requires_grad, "call " .. i)
      lin:zero_grad()
      y:sum():backward()
      local got = lin.weight.grad:clone()
      lin:zero_grad()
      nd.no_grad(function() return f(x) end):sum():backward()
      assert.are.equal(0, max_abs(got, lin.weight.grad), "call " .. i)
    end
    assert.are.equal(2, cf.stats.replays)
  end)

  it("a module's function and table settings are guards by identity; a new setting retraces", function()
    local Act = nn.Module:extend("Act")
    function Act:init() self.f = function(x) return x:relu() end; self.lin = nn.Linear(2, 2) end
    function Act:forward(x) return self.f(self.lin(x)) * (self.cfg and self.cfg.scale or 1) end
    nd.manual_seed(1)
    local m = Act()
    local cf = nd.compile(m)
    local x = -nd.ones(1, 2)
    for _ = 1, 3 do cf(x) end
    m.f = function(t) return t:sigmoid() end -- another activation
    assert.are.equal(0, max_abs(cf(x), m(x)))
    assert.are.equal(1, cf.stats.retraces)
    assert_contains(cf.retrace_reasons[1], "a module's setting 'f' changed")
    cf(x) -- captured with the sigmoid
    assert.are.equal(0, max_abs(cf(x), m(x))) -- and replayed with it
    assert.are.equal(2, cf.stats.replays)
    m.cfg = {scale = 3} -- a setting that was not there
    assert.are.equal(0, max_abs(cf(x), m(x)))
    assert.are.equal(2, cf.stats.retraces)
    assert_contains(cf.retrace_reasons[2], "a module gained a setting")
    for _ = 1, 2 do cf(x) end
    m.cfg = {scale = 5} -- another table
    assert.are.equal(0, max_abs(cf(x), m(x)))
    assert.are.equal(3, cf.stats.retraces)
  end)

  it("a hook registered or removed after the capture retraces; the hook then runs as eagerly", function()
    nd.manual_seed(1)
    local m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    local cf = nd.compile(m, {fallback = true})
    local x = nd.ones(2, 3)
    cf(x); cf(x); cf(x)
    assert.are.equal(1, cf.stats.replays)
    local seen = 0
    local h = m[1]:register_forward_hook(function(_, _, out) seen = seen + 1; return out * 0 end)
    local want = nd.no_grad(function() return m[3].bias:detach():view({1, 2}):expand({2, 2}):clone() end)
    for i = 1, 3 do
      assert.are.equal(0, max_abs(cf(x), want))
      assert.are.equal(i, seen)
    end
    assert.are.equal(1, cf.stats.retraces)
    assert_contains(cf.retrace_reasons[1], "a module's hooks were registered or removed")
    h:remove()
    local plain = m(x)
    assert.are.equal(0, max_abs(cf(x), plain)) -- (the signature stays split: its children compiled)
    assert.are.equal(3, seen)
    -- without fallback: the retrace meets the hook at the capture, an error as at a first capture
    local m2 = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    local c2 = nd.compile(m2)
    c2(x); c2(x)
    m2[2]:register_forward_pre_hook(function() end)
    c2(x) -- (eager: the warm-up of the retrace)
    assert_contains(errmsg(c2, x), "a module with hooks")
  end)

  it("SGD with nesterov, dampening, weight decay and maximize under a changing lr and momentum equals eager", function()
    for _, hp in ipairs({{nesterov = true, momentum = 0.9}, {momentum = 0.9, dampening = 0.3, weight_decay = 0.01},
                         {momentum = 0.5, maximize = true, weight_decay = 0.1}}) do
      local e, c = linear_twins(8, function(m)
        local o = {lr = 0.1}
        for k, v in pairs(hp) do o[k] = v end
        return nd.optim.SGD(m:parameters(), o)
      end, function(i, _, opt)
        opt.param_groups[1].lr = 0.1 / i
        if hp.nesterov then opt.param_groups[1].momentum = 0.8 + 0.01 * i end
      end)
      assert.are.equal(0, max_abs(c.m.weight, e.m.weight))
      assert.are.equal(0, max_abs(c.m.bias, e.m.bias))
      assert.are.equal(0, c.f.stats.retraces)
      assert.are.equal(6, c.f.stats.replays)
    end
  end)

  it("Adam under a one-cycle schedule (lr and betas move every step) replays without retracing", function()
    local e, c = linear_twins(10, function(m)
      local opt = nd.optim.Adam(m:parameters(), {lr = 0.01})
      return opt, nd.optim.lr_scheduler.OneCycleLR(opt, 0.05, {total_steps = 20})
    end)
    assert.are.equal(0, max_abs(c.m.weight, e.m.weight))
    assert.are.equal(0, c.f.stats.retraces)
  end)

  it("a reset momentum buffer or a swapped parameter retraces, with eager's results", function()
    local e, c = linear_twins(8, function(m)
      return nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
    end, function(i, m, opt)
      if i == 5 then opt.state[m.weight].momentum_buffer = nd.zeros_like(m.weight) end
    end)
    assert.are.equal(0, max_abs(c.m.weight, e.m.weight))
    assert.are.equal(1, c.f.stats.retraces)
  end)

  it("a NaN gradient norm leaves the gradients as eager does", function()
    local function run(compiled)
      local w = nd.tensor({1, 2, 3}):requires_grad_()
      local v = nd.tensor({1, 1}):requires_grad_()
      local f = function(x)
        w.grad, v.grad = nil, nil
        ((w * x):sum() + (v * 2):sum()):backward()
        nd.nn.utils.clip_grad_norm_({w, v}, 0.5)
        return w.grad:clone(), v.grad:clone()
      end
      local cf = compiled and nd.compile(f) or f
      local gw, gv
      for _ = 1, 3 do gw, gv = cf(nd.tensor({1, 0 / 0, 1})) end
      return gv
    end
    assert.are.same(run(false):totable(), run(true):totable())
  end)

  it("a kernel that failed under pcall inside makes the capture fail", function()
    local cf = nd.compile(function(x)
      pcall(function() return x:gather(1, nd.tensor({5}, {dtype = "int64"})) end)
      return x + 1
    end, {warmup = 0})
    assert_contains(errmsg(cf, nd.ones(3)), "gather")
  end)

  it("a backward through a graph that a replay overwrote is refused", function()
    local w = nd.ones(3):requires_grad_()
    local cf = nd.compile(function(x) w.grad = nil; local l = (w * w * x):sum(); l:backward(); return l end)
    for _ = 1, 3 do cf(nd.ones(3)) end
    local keep = (w * w):sum() -- saves w for its backward
    cf(nd.ones(3)) -- a replay writes w's gradient buffers, not w: still fine
    keep:backward()
    local m = nn.Linear(2, 1)
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.1})
    local step = nd.compile(train_step(m, opt, function(o, y) return nd.F.mse_loss(o, y) end))
    for _ = 1, 3 do step(nd.ones(1, 2), nd.zeros(1, 1)) end
    local pending = m(nd.ones(1, 2):requires_grad_()):sum() -- saves m.weight for the input's grad
    step(nd.ones(1, 2), nd.zeros(1, 1))    -- the replay updates m.weight in place
    assert_contains(errmsg(function() pending:backward() end), "modified in place afterwards")
  end)

  it("a refused replay does not advance Adam's step count", function()
    local m = nn.Linear(3, 2)
    local opt = nd.optim.Adam(m:parameters())
    local cf = nd.compile(train_step(m, opt, nn.CrossEntropyLoss()))
    for _ = 1, 3 do cf(nd.randn(4, 3), nd.tensor({1, 2, 1, 2}, {dtype = "int64"})) end
    local step = opt.state[m.weight].step
    errmsg(cf, nd.randn(4, 3), nd.tensor({1, 2, 3, 2}, {dtype = "int64"}))
    assert.are.equal(step, opt.state[m.weight].step)
  end)
end)

describe("nd.compile: graph breaks and refusals", function()
  it("reading a value on the host inside is an error naming the op and the line", function()
    local cf = nd.compile(function(x)
      local s = (x * 2):sum()
      if s:item() > 0 then return x end -- a value-dependent branch
      return -x
    end, {warmup = 0})
    local msg = errmsg(cf, nd.ones(2))
    assert_contains(msg, "needle.item: reads tensor values on the host inside a compiled function")
    assert_contains(msg, "compile_spec.lua:")
    assert.are.equal(0, cf.stats.replays)
  end)

  it("with fallback = true the function runs eagerly and explain() says why", function()
    local f = function(x)
      local s = (x * 2):sum()
      if s:item() > 0 then return x + 1 end
      return x - 1
    end
    local cf = nd.compile(f, {fallback = true})
    assert.are.equal(2, cf(nd.ones(1)):item())
    assert.are.equal(2, cf(nd.ones(1)):item())
    assert.are.equal(0, cf(-nd.ones(1)):item() + 2)
    assert.are.equal(0, cf.stats.replays)
    assert_contains(cf:explain(), "graph break (runs eagerly): needle.item")
  end)

  it("a module assigning its own fields in forward is refused (fallback: eager), naming the field and line", function()
    local Counter = nn.Module:extend("Counter")
    function Counter:init() self.calls = 0; self.lin = nn.Linear(3, 3) end
    function Counter:forward(x)
      self.calls = self.calls + 1 -- a replay would not count, nor scale by the new count
      return self.lin(x) * self.calls
    end
    nd.manual_seed(2)
    local m = Counter()
    local cf = nd.compile(m)
    local x = nd.ones(2, 3)
    cf(x) -- warm-up, eager
    local msg = errmsg(cf, x)
    assert_contains(msg, "compile_spec.lua:")
    assert_contains(msg, "nn.Counter's field 'calls' is assigned another value inside the compiled call")
    assert.are.equal(0, cf.stats.replays)
    -- with fallback: the module's own Lua runs eagerly each call, its Linear compiled
    local m2 = Counter()
    m2.lin:load_state_dict(m.lin:state_dict())
    local cf2 = nd.compile(m2, {fallback = true})
    local base = m2.lin(x):detach()
    for i = 1, 4 do
      assert.are.equal(0, max_abs(cf2(x), base * i))
      assert.are.equal(i, m2.calls)
    end
    assert_contains(cf2:explain(), "graph break (runs eagerly): ")
    assert_contains(cf2:explain(), "field 'calls'")
    -- a hidden state kept as a field: the replay would start from the captured one every time
    local Carry = nn.Module:extend("Carry")
    function Carry:init() self.h = nd.zeros(3) end
    function Carry:forward(x) self.h = self.h + x; return self.h * 1 end
    local cc = nd.compile(Carry(), {warmup = 0})
    assert_contains(errmsg(cc, nd.ones(3)), "nn.Carry's field 'h' is assigned another value")
    -- the same value again, and modules made inside the call, are no state: compiled
    local Same = nn.Module:extend("Same")
    function Same:init() self.scale = 2 end
    function Same:forward(x)
      self.scale = 2
      local tmp = nn.Identity() -- (its constructor's fields are its own)
      return tmp(x) * self.scale
    end
    local cs = nd.compile(Same())
    for _ = 1, 3 do assert.are.equal(0, max_abs(cs(nd.ones(2)), nd.full({2}, 2))) end
    assert.are.equal(1, cs.stats.replays)
    -- a buffer registered inside, on a module made before it
    local Reg = nn.Module:extend("Reg")
    function Reg:forward(x) self:register_buffer("last", x * 1); return x + 1 end
    assert_contains(errmsg(nd.compile(Reg(), {warmup = 0}), nd.ones(2)), "nn.Reg's field 'last'")
  end)

  it("a coroutine.yield inside a capture is refused, and leaves no capture running", function()
    local core = require "needle.core"
    local cf = nd.compile(function(x) local y = x * 2; coroutine.yield("paused"); return y + 1 end)
    local warm = coroutine.wrap(function() return cf(nd.ones(2)) end)
    assert.are.equal("paused", warm()) -- the eager warm-up call may yield
    local co = coroutine.create(function() return cf(nd.ones(2)) end)
    local ok, msg = coroutine.resume(co)
    assert.is_false(ok)
    assert_contains(msg, "the compiled function called coroutine.yield while it was being captured")
    assert.is_false(core._graph_capturing())
    -- ops after it run eagerly, recorded nowhere; a later capture works
    assert.are.equal(0, max_abs(nd.ones(2) + 1, nd.full({2}, 2)))
    local c2 = nd.compile(function(x) return x * 3 end, {warmup = 0})
    c2(nd.ones(2))
    assert.are.equal(0, max_abs(c2(nd.ones(2)), nd.full({2}, 3)))
    assert.are.equal(1, c2.stats.replays)
  end)

  it("seeding or moving the random stream inside is a graph break (fallback: eager, as its masks)", function()
    local f = function(x) nd.manual_seed(42); return nd.F.dropout(x, 0.5, true) end
    local cf = nd.compile(f, {warmup = 0})
    local msg = errmsg(cf, nd.ones(8))
    assert_contains(msg, "needle.manual_seed: reseeds the random stream (a graph break)")
    assert_contains(msg, "compile_spec.lua:")
    local g = function(x, y)
      local s = nd.get_rng_state()
      local a = nd.F.dropout(x, 0.5, true)
      nd.set_rng_state(s)
      return a, nd.F.dropout(y, 0.5, true)
    end
    assert_contains(errmsg(nd.compile(g, {warmup = 0}), nd.ones(8), nd.ones(8)), "needle.get_rng_state")
    local cg = nd.compile(g, {fallback = true})
    for _ = 1, 4 do
      local a, b = cg(nd.ones(64), nd.ones(64))
      assert.are.equal(0, max_abs(a, b)) -- the same mask twice, as eagerly
    end
    local cs = nd.compile(f, {fallback = true})
    local first = cs(nd.ones(64))
    for _ = 1, 3 do assert.are.equal(0, max_abs(cs(nd.ones(64)), first)) end
  end)

  it("value-reading ops name themselves in their graph break", function()
    local cases = {
      nonzero = function(x) return x:gt(0):nonzero() end,
      masked_select = function(x) return x:masked_select(x:gt(0)) end,
      unique = function(x) return nd.unique(x) end,
      allclose = function(x) return nd.allclose(x, x) end,
      equal = function(x) return x:equal(x) end,
      multinomial = function(x) return nd.multinomial(x:abs() + 0.1, 2) end,
      one_hot = function(x) return nd.F.one_hot(x:gt(0):long() + 1, 2) end,
      repeat_interleave = function(x) return x:repeat_interleave(nd.tensor({1, 2, 1}, {dtype = "int64"})) end,
    }
    for name, f in pairs(cases) do
      local cf = nd.compile(f, {warmup = 0})
      assert_contains(errmsg(cf, nd.tensor({1.0, -2.0, 3.0})), "needle." .. name .. ": reads tensor values on the host")
    end
  end)

  it("tolist/totable and printing are graph breaks too", function()
    local cf = nd.compile(function(x) return x:totable() end, {warmup = 0})
    assert_contains(errmsg(cf, nd.ones(2)), "totable: reads tensor values on the host")
    -- named as the user called them, not as the library reads the values
    local cl = nd.compile(function(x) return x:tolist() end, {warmup = 0})
    assert_contains(errmsg(cl, nd.ones(2)), "needle.tolist: reads tensor values on the host")
    local cp = nd.compile(function(x) local s = tostring(x); return x, s end, {warmup = 0})
    local msg = errmsg(cp, nd.ones(2))
    assert_contains(msg, "needle.tostring (print): reads tensor values on the host")
    assert_contains(msg, "compile_spec.lua:")
  end)

  it("backward adding to gradients from before the call is refused", function()
    local w = nd.ones(3):requires_grad_()
    local cf = nd.compile(function(x) (w * x):sum():backward() end)
    cf(nd.ones(3))
    assert_contains(errmsg(cf, nd.ones(3)), "adds to a gradient that existed before the compiled call")
  end)

  it("set_data_ inside, nesting and bad options are refused", function()
    local t = nd.ones(2)
    local cf = nd.compile(function(x) t:set_data_(x) return x end, {warmup = 0})
    assert_contains(errmsg(cf, nd.ones(2)), "set_data_: cannot run inside a compiled function")
    local inner = nd.compile(function(x) return x + 1 end, {warmup = 0})
    inner(nd.ones(1))
    inner(nd.ones(1))
    local outer = nd.compile(function(x) return inner(x) end, {warmup = 0})
    assert_contains(errmsg(outer, nd.ones(1)), "cannot be nested")
    assert_contains(errmsg(nd.compile, function() end, {warmpu = 1}), "unknown option 'warmpu'")
    assert_contains(errmsg(nd.compile, 42), "expected a function or an nn.Module")
    assert_contains(errmsg(nd.compile, function() end, {}, 5),
                    "needle.compile: takes nd.compile(fn_or_module[, opts]) only, got an extra argument #3: 5")
    assert_contains(errmsg(nd.compile, function() end, {cache_size = 0}), "cache_size must be >= 1")
  end)

  it("ir(), dot() and explain() describe the graph; ir() before a capture says when it comes", function()
    local m = nn.Linear(3, 2)
    local cf = nd.compile(function(x) return m(x):tanh() end)
    assert_contains(errmsg(function() return cf:ir() end), "nothing compiled yet")
    for _ = 1, 3 do cf(nd.ones(4, 3)) end
    local text = cf:ir()
    assert_contains(text, "linear_fused")
    assert_contains(text, "unary.tanh")
    assert_contains(text, "float32 {4,2}")
    assert(cf:dot():match("^digraph needle {"))
    assert.is_nil(ir.verify(cf.last.graph:records()))
    local ex = cf:explain()
    assert_contains(ex, "calls 3: 1 replayed, 1 captured, 1 eager")
    assert_contains(ex, "kernels by entry: ")
  end)

  it("the profiler shows each compiled kernel as its own row", function()
    local m = nn.Linear(3, 2)
    local cf = nd.compile(function(x) return m(x):tanh() end)
    for _ = 1, 2 do cf(nd.ones(4, 3)) end
    local report = nd.profile(function() for _ = 1, 3 do cf(nd.ones(4, 3)) end end)
    assert.are.equal(3, report.by_name["compiled:linear_fused"].calls)
    assert.are.equal(3, report.by_name["compiled:unary.tanh"].calls)
  end)

  it("verify finds a broken record", function()
    local bad = {{entry = "copy", args = {{role = "x", storage = 1, kind = "i", shape = {2}, strides = {1, 1},
                                           offset = -1}}}}
    local problems = ir.verify(bad)
    assert.are.equal(3, #problems)
  end)
end)

describe("nd.compile on OpenCL: launches", function()
  if D.pending_without_opencl(pending, "OpenCL launch counts") then return end
  it("nd.opencl.launches counts kernels; explain() compares a replay's with the eager call's", function()
    local dev = D.opencl()[1]
    local x = nd.ones(16):to(dev)
    local before = nd.opencl.launches()
    local _ = (x + 1) * 2
    assert.are.equal(2, nd.opencl.launches() - before)
    local f = function(t) local _ = t * 7; return (t + 1) * 2 end
    local cf = nd.compile(f, {passes = {"cse", "dce"}})
    for _ = 1, 3 do cf(x) end
    -- the eager call: 3 kernels; a replay: 2 (dce removed t * 7; copying the argument in and
    -- the output out happen around the replay, not in it)
    assert_contains(cf:explain(), "OpenCL kernel launches: 2 per replay, 3 in the eager call")
    -- and 1 with the default passes: fuse makes the add and the multiply one generated kernel
    local fused = nd.compile(f)
    for _ = 1, 3 do fused(x) end
    assert_contains(fused:explain(), "OpenCL kernel launches: 1 per replay, 3 in the eager call")
  end)

  it("replays enqueue prepared launches; random draws, index checks and host checks still run each time", function()
    local dev = D.opencl()[1]
    nd.manual_seed(1)
    local w = nd.randn(10, 4):to(dev)
    local f = function(x, ids)
      local e = w:index_select(1, ids) -- checks its indices on the host's word: never prepared
      local d = nd.F.dropout(x, 0.5, true) -- a random stream: its counter moves on every call
      return (e:sum(2) + d) * 3, d
    end
    local cf = nd.compile(f)
    local x = nd.ones(64):to(dev)
    local ids = nd.randint(1, 10, {64}):to(dev)
    local masks = {}
    for i = 1, 6 do
      local out, d = cf(x, ids)
      -- the same arithmetic eagerly, from the mask this call drew
      local ref = (w:index_select(1, ids):sum(2) + d) * 3
      assert.are.equal(0, max_abs(out, ref))
      masks[i] = d:to("cpu")
    end
    local gs = cf.last.graph:stats()
    -- the sum, the comparison that makes dropout's mask from its uniforms and the fused
    -- add/multiply are prepared; index_select (its host check) and the draw are not
    assert(gs.prepared >= 3 and gs.prepared <= gs.records - 2, ("%d of %d prepared"):format(gs.prepared, gs.records))
    assert_contains(cf:explain(), ("%d of %d kernel calls replay as prepared launches"):format(gs.prepared, gs.records))
    for i = 4, 6 do assert(max_abs(masks[i], masks[i - 1]) > 0, "replay " .. i .. " drew the mask of the one before") end
    local bad = nd.tensor({1, 2, 11}, {dtype = "int64"}):to(dev)
    local ok, err = pcall(cf, nd.ones(3):to(dev), bad) -- another shape: a new entry, eager first
    assert.is_false(ok)
    ids[1] = 11 -- out of range, in the captured shape: a replay must still check it
    ok, err = pcall(cf, x, ids)
    assert.is_false(ok)
    assert_contains(tostring(err), "index 11 is out of bounds")
  end)
end)

describe("nd.compile memory", function()
  for _, device in ipairs(DEVICES) do
    it("writes an elementwise kernel's result over its input where the input dies there, on " .. device, function()
      nd.manual_seed(4)
      local w, b = nd.randn(6, 40):to(device), nd.randn(40):to(device)
      local f = function(x) return ((x:matmul(w) + b):tanh() * 3):sum(2) end
      local cf = nd.compile(f, {passes = {"dce"}}) -- unfused: each kernel its own record
      for i = 1, 4 do
        local x = nd.randn(8, 6):to(device) * i
        assert.are.equal(0, max_abs(cf(x), f(x)))
      end
      local places = {}
      for _, r in ipairs(cf.last.graph:records()) do
        if r.entry ~= "reduce" then places[#places + 1] = r.args[1].key .. "+" .. r.args[1].offset end
      end
      -- the product, the bias add, the tanh and the multiply: one place in the arena
      assert.are.equal(4, #places)
      for i = 2, 4 do assert.are.equal(places[1], places[i]) end
    end)

    it("puts the logits' gradient over the logits, which die at cross_entropy's backward, on " .. device, function()
      local function run(compiled)
        nd.manual_seed(9)
        local m = nn.Sequential(nn.Linear(8, 50), nn.Tanh(), nn.Linear(50, 40)):to(device)
        local opt = nd.optim.SGD(m:parameters(), {lr = 0.5})
        local step = function(x, y)
          opt:zero_grad()
          local loss = nd.F.cross_entropy(m(x), y)
          loss:backward()
          opt:step()
          return loss
        end
        local f = compiled and nd.compile(step) or step
        local losses = {}
        for i = 1, 5 do
          nd.manual_seed(70 + i)
          losses[i] = f(nd.randn(16, 8):to(device), nd.randint(1, 40, {16}):to(device)):item()
        end
        return f, m:parameters(), losses
      end
      local cf, pc, lc = run(true)
      local _, pe, le = run(false)
      for i = 1, 5 do assert.are.equal(le[i], lc[i]) end
      for i, p in ipairs(pe) do assert.are.equal(0, max_abs(pc[i], p)) end -- bit for bit
      local ce
      for _, r in ipairs(cf.last.graph:records()) do if r.entry == "cross_entropy_backward" then ce = r end end
      assert.is_not_nil(ce)
      -- one place in the arena: the gradient over the logits
      assert.are.equal(ce.args[2].key, ce.args[1].key)
      assert.are.equal(ce.args[2].offset, ce.args[1].offset)
    end)
  end

  it("the plan shares buffers between intermediates that do not live at once", function()
    local f = function(x)
      local y = x
      for _ = 1, 12 do y = (y * 1.5):relu() end
      return y:sum()
    end
    local cf = nd.compile(f)
    for _ = 1, 3 do cf(nd.ones(1000)) end
    local gs = cf.last.graph:stats()
    assert(gs.buffers <= 3, "buffers: " .. gs.buffers)
    assert(gs.planned_bytes <= 3 * 4000, "planned bytes: " .. gs.planned_bytes)
    assert(gs.internal_bytes >= 24 * 4000)
  end)

  for _, device in ipairs(DEVICES) do
    local steps = device == "cpu" and 10000 or 2000 -- POCL launches cost ~20 us each
    it(("stays flat over %d replays of a training step on %s"):format(steps, device), function()
      nd.manual_seed(4)
      local m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)):to(device)
      local opt = nd.optim.Adam(m:parameters(), {lr = 1e-3})
      local cf = nd.compile(train_step(m, opt, nn.CrossEntropyLoss()))
      local x, y = nd.randn(8, 16):to(device), nd.randint(1, 4, {8}):to(device)
      for _ = 1, 200 do cf(x, y) end
      collectgarbage()
      collectgarbage()
      local before = nd.live_bytes()
      for _ = 1, steps do cf(x, y) end
      collectgarbage()
      collectgarbage()
      local grown = nd.live_bytes() - before
      assert(grown <= 4096, "live bytes grew by " .. grown)
      assert.are.equal(steps + 198, cf.stats.replays)
    end)
  end
end)
