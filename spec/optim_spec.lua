-- optim_spec.lua - needle.optim (optimizers, lr schedulers) and nd.nn.utils
-- gradient clipping. Parameters after 10 steps and scheduler learning rates
-- are compared with PyTorch's, from spec/fixtures/torch_optim.lua (written by
-- spec/fixtures/gen/gen_torch_optim.py; PyTorch is not needed here).
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local fx = dofile("spec/fixtures/torch_optim.lua")
local optim = nd.optim
local S = nd.optim.lr_scheduler

local function tensor(t, opts)
  return nd.tensor(t.data, opts):reshape(t.shape)
end

local X, C = tensor(fx.X), tensor(fx.C)

local function model()
  local W = tensor(fx.W0):detach():requires_grad_()
  local b = tensor(fx.b0):detach():requires_grad_()
  return W, b
end

local function loss_fn(W, b)
  local y = X:matmul(W) + b
  return (y * y * C):sum()
end

local function train_step(opt, W, b)
  opt:zero_grad()
  loss_fn(W, b):backward()
  opt:step()
end

-- |got - want| <= rtol * |want| + atol, element by element
local function close(name, got, want, rtol, atol)
  local g = got:contiguous():view({-1}):totable()
  assert.are.equal(#want, #g, name .. ": size")
  for i, w in ipairs(want) do
    if math.abs(g[i] - w) > rtol * math.abs(w) + atol then
      error(("%s: element %d is %.9g, PyTorch %.9g"):format(name, i, g[i], w), 2)
    end
  end
end

local function values(t) return t:contiguous():view({-1}):totable() end

local function same_values(a, b)
  local x, y = values(a), values(b)
  assert.are.equal(#x, #y)
  for i = 1, #x do
    if x[i] ~= y[i] then return false end
  end
  return true
end

local function make_opt(case, W, b)
  local cls = optim[case.optimizer]
  if case.groups then
    local g1, g2 = {params = {W}}, {params = {b}}
    for k, v in pairs(case.groups[1]) do g1[k] = v end
    for k, v in pairs(case.groups[2]) do g2[k] = v end
    return cls({g1, g2}, case.options)
  end
  return cls({W, b}, case.options)
end

describe("optimizers against PyTorch (10 steps, rtol 1e-5)", function()
  for _, case in ipairs(fx.optim) do
    it(case.name, function()
      local W, b = model()
      local opt = make_opt(case, W, b)
      for k, want in ipairs(case.steps) do
        train_step(opt, W, b)
        close(("%s step %d W"):format(case.name, k), W, want.W, 1e-5, 1e-7)
        close(("%s step %d b"):format(case.name, k), b, want.b, 1e-5, 1e-7)
      end
    end)
  end
end)

-- the Lua twin of each scheduler case in the fixture
local schedulers = {
  step = function(o) return S.StepLR(o, 7, {gamma = 0.5}) end,
  multistep = function(o) return S.MultiStepLR(o, {3, 10, 10, 20}, {gamma = 0.3}) end,
  exponential = function(o) return S.ExponentialLR(o, 0.9) end,
  cosine_restart = function(o) return S.CosineAnnealingLR(o, 10, {eta_min = 0.001}) end,
  cosine = function(o) return S.CosineAnnealingLR(o, 30) end,
  linear_warmup = function(o) return S.LinearLR(o, {start_factor = 0.1, total_iters = 8}) end,
  linear_decay = function(o)
    return S.LinearLR(o, {start_factor = 1.0, end_factor = 0.2, total_iters = 20})
  end,
  linear_default = function(o) return S.LinearLR(o) end,
  lambda = function(o) return S.LambdaLR(o, function(e) return 0.95 ^ e end) end,
  onecycle = function(o) return S.OneCycleLR(o, 1.0, {total_steps = 40}) end,
  onecycle_linear_three_phase = function(o)
    return S.OneCycleLR(o, {0.5, 0.2}, {total_steps = 30, pct_start = 0.25, anneal_strategy = "linear",
                                        three_phase = true, div_factor = 10.0, final_div_factor = 100.0})
  end,
  onecycle_adam = function(o) return S.OneCycleLR(o, 0.01, {epochs = 4, steps_per_epoch = 8}) end,
  sequential_warmup_cosine = function(o)
    return S.SequentialLR(o, {S.LinearLR(o, {start_factor = 0.1, total_iters = 5}),
                              S.CosineAnnealingLR(o, 25)}, {5})
  end,
  sequential_three = function(o)
    return S.SequentialLR(o, {S.LinearLR(o, {start_factor = 0.5, total_iters = 4}), S.ExponentialLR(o, 0.9),
                              S.StepLR(o, 5, {gamma = 0.5})}, {4, 12})
  end,
}

local function sched_opt(kind)
  local W, b = model()
  if kind == "SGD" then
    return optim.SGD({{params = {W}, lr = 0.1}, {params = {b}, lr = 0.02}}, {momentum = 0.9}), W, b
  end
  return optim.Adam({{params = {W}, lr = 0.1}, {params = {b}, lr = 0.02}}), W, b
end

local function momenta(opt, kind)
  local out = {}
  for i, g in ipairs(opt.param_groups) do out[i] = kind == "SGD" and g.momentum or g.betas[1] end
  return out
end

local function close_list(name, got, want, rtol)
  assert.are.equal(#want, #got, name .. ": length")
  for i, w in ipairs(want) do
    if math.abs(got[i] - w) > rtol * math.abs(w) + 1e-15 then
      error(("%s[%d] is %.17g, PyTorch %.17g"):format(name, i, got[i], w), 2)
    end
  end
end

describe("lr schedulers against PyTorch (30 steps, rtol 1e-7)", function()
  for _, case in ipairs(fx.schedulers) do
    it(case.name, function()
      local make = assert(schedulers[case.name], "no Lua twin for " .. case.name)
      local opt = sched_opt(case.optimizer)
      local sched = make(opt)
      for k, want in ipairs(case.lrs) do
        if k > 1 then
          opt:step()
          sched:step()
        end
        close_list(("%s lr at step %d"):format(case.name, k - 1), sched:get_last_lr(), want, 1e-7)
        local groups_lr = {}
        for i, g in ipairs(opt.param_groups) do groups_lr[i] = g.lr end
        close_list(("%s group lr at step %d"):format(case.name, k - 1), groups_lr, want, 1e-7)
        close_list(("%s momentum at step %d"):format(case.name, k - 1), momenta(opt, case.optimizer),
                   case.momentum[k], 1e-7)
      end
    end)
  end

  it("state_dict/load_state_dict resume a schedule where it was", function()
    for _, name in ipairs({"step", "cosine_restart", "onecycle", "sequential_warmup_cosine", "multistep",
                           "lambda"}) do
      local opt1 = sched_opt("SGD")
      local s1 = schedulers[name](opt1)
      for _ = 1, 12 do opt1:step(); s1:step() end
      local osd, ssd = opt1:state_dict(), s1:state_dict()
      local opt2 = sched_opt("SGD")
      local s2 = schedulers[name](opt2)
      opt2:load_state_dict(osd)
      s2:load_state_dict(ssd)
      for _ = 1, 10 do
        opt1:step(); s1:step()
        opt2:step(); s2:step()
        assert.are.same(s1:get_last_lr(), s2:get_last_lr(), name)
        assert.are.same(opt1.param_groups[1].momentum, opt2.param_groups[1].momentum, name)
      end
    end
  end)

  it("state_dict is a plain table without the optimizer", function()
    local opt = sched_opt("SGD")
    local s = S.SequentialLR(opt, {S.LinearLR(opt), S.ExponentialLR(opt, 0.5)}, {3})
    local sd = s:state_dict()
    assert.is_nil(sd.optimizer)
    assert.are.equal(2, #sd._schedulers)
    assert.is_nil(sd._schedulers[1].optimizer)
    local lam = S.LambdaLR(opt, function(e) return e end):state_dict()
    assert.is_nil(lam.lr_lambdas)
    assert.are.equal(0, lam.last_epoch)
  end)

  it("jumps with step(epoch) use the closed form", function()
    local opt = sched_opt("SGD")
    local s = S.StepLR(opt, 3, {gamma = 0.5})
    s:step(7)
    close_list("StepLR step(7)", s:get_last_lr(), {0.1 * 0.25, 0.02 * 0.25}, 1e-12)
  end)

  it("OneCycleLR refuses to step past total_steps", function()
    local opt = sched_opt("SGD")
    local s = S.OneCycleLR(opt, 0.5, {total_steps = 3})
    for _ = 1, 3 do s:step() end
    assert_contains(errmsg(function() s:step() end),
                    "needle.optim.lr_scheduler.OneCycleLR: tried to step 5 times; the specified number of total steps is 3")
  end)

  it("rejects bad arguments, naming the scheduler and the value", function()
    local opt = sched_opt("SGD")
    assert_contains(errmsg(S.StepLR, opt, 0), "needle.optim.lr_scheduler.StepLR: step_size must be a positive integer, got 0")
    assert_contains(errmsg(S.LinearLR, opt, {start_factor = 0}), "LinearLR: invalid start_factor 0")
    assert_contains(errmsg(S.LinearLR, opt, {total_itrs = 3}), "LinearLR: unknown option 'total_itrs'")
    assert_contains(errmsg(S.OneCycleLR, opt, 0.1, {total_steps = 10, anneal_strategy = "exp"}),
                    "OneCycleLR: anneal_strategy must be 'cos' or 'linear', got \"exp\"")
    assert_contains(errmsg(S.OneCycleLR, opt, 0.1), "OneCycleLR: give total_steps")
    assert_contains(errmsg(S.OneCycleLR, optim.Adagrad({nd.zeros({2}, {requires_grad = true})}), 0.1,
                           {total_steps = 10}), "cycle_momentum needs an optimizer with momentum or betas")
    assert_contains(errmsg(S.SequentialLR, opt, {S.LinearLR(opt)}, {3}), "expected 0 milestone(s)")
    assert_contains(errmsg(S.CosineAnnealingLR, sched_opt("SGD"), 10, {last_epoch = 4}),
                    "param_groups[1] has no initial_lr")
    assert_contains(errmsg(S.StepLR, {}, 3), "expected an optimizer as the first argument")
    -- all arguments in one table
    local s = S.StepLR(sched_opt("SGD"), {step_size = 2, gamma = 0.5})
    s:step(); s:step()
    close_list("StepLR(opt, {...})", s:get_last_lr(), {0.05, 0.01}, 1e-12)
  end)
end)

describe("optimizer behaviour", function()
  it("zero_grad clears the gradients", function()
    local W, b = model()
    local opt = optim.SGD({W, b}, {lr = 0.1})
    loss_fn(W, b):backward()
    assert.is_not_nil(W.grad)
    opt:zero_grad()
    assert.is_nil(W.grad)
    assert.is_nil(b.grad)
    loss_fn(W, b):backward()
    opt:zero_grad({set_to_none = false})
    assert.are.same({0, 0, 0, 0}, values(b.grad))
  end)

  it("never modifies p.grad in place", function()
    local configs = {
      {"SGD", {lr = 0.1, momentum = 0.9, weight_decay = 0.1, nesterov = true, maximize = true}},
      {"SGD", {lr = 0.1, momentum = 0.9}},
      {"SGD", {lr = 0.1}},
      {"Adam", {lr = 0.1, weight_decay = 0.1, amsgrad = true, maximize = true}},
      {"Adam", {lr = 0.1}},
      {"AdamW", {lr = 0.1}},
      {"RMSprop", {lr = 0.1, momentum = 0.5, centered = true, weight_decay = 0.1}},
      {"RMSprop", {lr = 0.1}},
      {"Adagrad", {lr = 0.1, weight_decay = 0.1}},
      {"Adagrad", {lr = 0.1}},
    }
    for _, c in ipairs(configs) do
      local W, b = model()
      local opt = optim[c[1]]({W, b}, c[2])
      for _ = 1, 3 do
        opt:zero_grad()
        loss_fn(W, b):backward()
        local gW, gb = W.grad, b.grad
        local vW, vb = gW:clone(), gb:clone()
        opt:step()
        assert.is_true(same_values(gW, vW), c[1] .. ": W.grad changed")
        assert.is_true(same_values(gb, vb), c[1] .. ": b.grad changed")
        assert.is_true(same_values(W.grad, vW), c[1] .. ": W.grad replaced")
      end
    end
  end)

  it("skips parameters without a gradient", function()
    local W, b = model()
    local opt = optim.Adam({W, b}, {lr = 0.1})
    opt:zero_grad()
    ;((X:matmul(W)) ^ 2):sum():backward()
    opt:step()
    assert.is_nil(b.grad)
    assert.is_true(same_values(b, tensor(fx.b0)))
    assert.is_false(same_values(W, tensor(fx.W0)))
    assert.is_nil(opt.state[b])
    assert.are.equal(1, opt.state[W].step)
  end)

  it("step(closure) evaluates the closure with grad mode on and returns its loss", function()
    local W, b = model()
    local opt = optim.SGD({W, b}, {lr = 0.01})
    local loss = nd.no_grad(function()
      return opt:step(function()
        opt:zero_grad()
        local l = loss_fn(W, b)
        l:backward()
        return l
      end)
    end)
    close("closure loss", loss, {loss_fn(tensor(fx.W0), tensor(fx.b0)):item()}, 1e-6, 0)
    close("closure step W", W, fx.optim[1].steps[1].W, 1e-5, 1e-7)
  end)

  it("state_dict/load_state_dict: a reloaded optimizer continues identically", function()
    local configs = {
      {"SGD", {lr = 0.01, momentum = 0.9, nesterov = true}},
      {"Adam", {lr = 0.05, amsgrad = true}},
      {"AdamW", {lr = 0.05, weight_decay = 0.1}},
      {"RMSprop", {lr = 0.01, momentum = 0.5, centered = true}},
      {"Adagrad", {lr = 0.1, lr_decay = 0.1, initial_accumulator_value = 0.2}},
    }
    for _, c in ipairs(configs) do
      local W1, b1 = model()
      local opt1 = optim[c[1]]({W1, b1}, c[2])
      for _ = 1, 4 do train_step(opt1, W1, b1) end
      local sd = opt1:state_dict()
      -- a plain table, parameters numbered from 1
      assert.are.same({1, 2}, sd.param_groups[1].params)
      assert.are.equal(c[2].lr, sd.param_groups[1].lr)
      assert.is_table(sd.state[1])
      assert.is_table(sd.state[2])
      -- the second optimizer starts with other hyperparameters; the state dict restores them
      local W2, b2 = model()
      nd.no_grad(function() W2:copy_(W1); b2:copy_(b1) end)
      local opt2 = optim[c[1]]({W2, b2}, {lr = 0.5})
      opt2:load_state_dict(sd)
      assert.are.equal(c[2].lr, opt2.param_groups[1].lr)
      for _ = 1, 5 do
        train_step(opt1, W1, b1)
        train_step(opt2, W2, b2)
        assert.is_true(same_values(W1, W2), c[1] .. ": W diverged after reload")
        assert.is_true(same_values(b1, b2), c[1] .. ": b diverged after reload")
      end
      -- the loaded state is a copy: the two optimizers share no tensors
      for k, v in pairs(opt2.state[W2]) do
        if nd.is_tensor(v) then assert.is_false(v:shares_storage(opt1.state[W1][k]), k) end
      end
    end
  end)

  it("state_dict is a snapshot that later steps do not change", function()
    local W, b = model()
    local opt = optim.Adam({W, b}, {lr = 0.05})
    train_step(opt, W, b)
    local sd = opt:state_dict()
    local before = values(sd.state[1].exp_avg)
    train_step(opt, W, b)
    assert.are.same(before, values(sd.state[1].exp_avg))
    assert.are.equal(1, sd.state[1].step)
  end)

  it("load_state_dict validates everything before changing anything", function()
    local W, b = model()
    local opt = optim.Adam({W, b}, {lr = 0.05})
    train_step(opt, W, b)
    local good = opt:state_dict()
    local function broken(edit)
      local sd = opt:state_dict()
      edit(sd)
      return sd
    end
    local W2, b2 = model()
    local opt2 = optim.Adam({W2, b2}, {lr = 0.01})
    local m
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.state[2].exp_avg = nd.zeros({3, 4}) end))
    assert_contains(m, "needle.optim.Adam: load_state_dict: state[2].exp_avg has shape {3,4}, but parameter 2 has shape {4}")
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.param_groups[2] = {params = {}} end))
    assert_contains(m, "the state dict has 2 parameter group(s), the optimizer 1")
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.param_groups[1].params = {1} end))
    assert_contains(m, "param_groups[1] has 1 parameter(s), the optimizer's group 1 has 2")
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.state[1].momentum_buffer = nd.zeros({3, 4}) end))
    assert_contains(m, "state[1] has an unexpected entry 'momentum_buffer'")
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.param_groups[1].lr = -1 end))
    assert_contains(m, "param_groups[1]: invalid learning rate -1")
    m = errmsg(opt2.load_state_dict, opt2, broken(function(sd) sd.state[7] = sd.state[1] end))
    assert_contains(m, "state has an entry for parameter 7, which no parameter group lists")
    -- nothing changed
    assert.are.same({}, opt2.state)
    assert.are.equal(0.01, opt2.param_groups[1].lr)
    -- a state dict of another optimizer (SGD's momentum buffers) is refused
    local sgd = optim.SGD({W, b}, {lr = 0.1, momentum = 0.9})
    train_step(sgd, W, b)
    assert_contains(errmsg(opt2.load_state_dict, opt2, sgd:state_dict()), "unexpected entry 'momentum_buffer'")
    opt2:load_state_dict(good)
    assert.are.equal(1, opt2.state[W2].step)
  end)

  it("load_state_dict takes PyTorch's 0-based ids, tensor steps and other dtypes", function()
    local W1, b1 = model()
    local opt1 = optim.Adam({W1, b1}, {lr = 0.05})
    for _ = 1, 3 do train_step(opt1, W1, b1) end
    local sd = opt1:state_dict()
    local torch_like = {param_groups = {{lr = 0.05, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0,
                                         amsgrad = false, maximize = false, params = {0, 1}}},
                        state = {}}
    for i, st in pairs(sd.state) do
      torch_like.state[i - 1] = {step = nd.tensor(st.step), exp_avg = st.exp_avg:double(),
                                 exp_avg_sq = st.exp_avg_sq:double()}
    end
    local W2, b2 = model()
    nd.no_grad(function() W2:copy_(W1); b2:copy_(b1) end)
    local opt2 = optim.Adam({W2, b2})
    opt2:load_state_dict(torch_like)
    assert.are.equal(3, opt2.state[W2].step)
    assert.are.equal("float32", opt2.state[b2].exp_avg.dtype)
    train_step(opt1, W1, b1)
    train_step(opt2, W2, b2)
    close("after a PyTorch-style load", W2, values(W1), 1e-6, 1e-7)
  end)

  it("parameter groups take their own hyperparameters", function()
    local W, b = model()
    local opt = optim.SGD({{params = {W}}, {params = b, lr = 0.5}}, {lr = 0.1})
    assert.are.equal(0.1, opt.param_groups[1].lr)
    assert.are.equal(0.5, opt.param_groups[2].lr)
    assert.are.equal(0, opt.param_groups[2].momentum)
    loss_fn(W, b):backward()
    local gW, gb = W.grad, b.grad
    opt:step()
    local want_W = tensor(fx.W0) - gW * 0.1
    local want_b = tensor(fx.b0) - gb * 0.5
    close("group 1", W, values(want_W), 1e-6, 1e-7)
    close("group 2", b, values(want_b), 1e-6, 1e-7)
    -- add_param_group, and groups in state_dict
    local extra = nd.zeros({2}, {requires_grad = true})
    opt:add_param_group({params = {extra}, momentum = 0.9})
    assert.are.equal(0.1, opt.param_groups[3].lr)
    assert.are.same({3}, opt:state_dict().param_groups[3].params)
  end)

  it("accepts a module, and lists its parameters in order", function()
    local m = nd.nn.Linear(3, 2)
    local opt = optim.SGD(m, {lr = 0.1})
    assert.are.equal(2, #opt.param_groups[1].params)
    assert.are.equal(m.weight, opt.param_groups[1].params[1])
  end)

  it("rejects bad hyperparameters, naming the optimizer and the value", function()
    local W = model()
    local cases = {
      {"SGD", {lr = -0.1}, "needle.optim.SGD: invalid learning rate -0.1 (expected lr >= 0)"},
      {"SGD", {lr = 0.1, momentum = -0.5}, "needle.optim.SGD: invalid momentum -0.5"},
      {"SGD", {lr = 0.1, weight_decay = -1}, "needle.optim.SGD: invalid weight_decay -1"},
      {"SGD", {lr = 0.1, nesterov = true}, "needle.optim.SGD: nesterov momentum requires a momentum > 0 and zero dampening"},
      {"SGD", {lr = 0.1, momentum = 0.9, nesterov = true, dampening = 0.1}, "zero dampening (got momentum 0.9, dampening 0.1)"},
      {"SGD", {lr = "big"}, "needle.optim.SGD: lr must be a number, got string"},
      {"SGD", {lr = 0.1, nesterov = 1}, "needle.optim.SGD: nesterov must be a boolean, got number"},
      {"Adam", {lr = -1e-3}, "needle.optim.Adam: invalid learning rate -0.001"},
      {"Adam", {betas = {0.9, 1.0}}, "needle.optim.Adam: invalid beta parameter at index 2: 1.0"},
      {"Adam", {betas = {-0.1, 0.9}}, "needle.optim.Adam: invalid beta parameter at index 1: -0.1"},
      {"Adam", {betas = 0.9}, "needle.optim.Adam: betas must be a table of two numbers, got 0.9"},
      {"Adam", {eps = -1e-8}, "needle.optim.Adam: invalid eps -1e-08"},
      {"AdamW", {weight_decay = -0.01}, "needle.optim.AdamW: invalid weight_decay -0.01"},
      {"RMSprop", {alpha = -0.9}, "needle.optim.RMSprop: invalid alpha -0.9"},
      {"RMSprop", {momentum = -1}, "needle.optim.RMSprop: invalid momentum -1"},
      {"Adagrad", {lr_decay = -0.1}, "needle.optim.Adagrad: invalid lr_decay -0.1"},
      {"Adagrad", {initial_accumulator_value = -1}, "needle.optim.Adagrad: invalid initial_accumulator_value -1"},
      {"Adam", {lr = 0.1, beta = {0.9, 0.99}}, "needle.optim.Adam: unknown option 'beta' (valid: amsgrad, betas, eps, lr, maximize, weight_decay)"},
      -- NaN passes `x < 0`: every number setting must be finite, then in range
      {"SGD", {lr = 0 / 0}, "needle.optim.SGD: lr must be a finite number, got"},
      {"Adam", {lr = math.huge}, "needle.optim.Adam: lr must be a finite number, got inf"},
      {"AdamW", {weight_decay = 0 / 0}, "needle.optim.AdamW: weight_decay must be a finite number"},
      {"Adam", {eps = 0 / 0}, "needle.optim.Adam: eps must be a finite number"},
      {"Adagrad", {lr = 0 / 0}, "needle.optim.Adagrad: lr must be a finite number"},
      {"SGD", {lr = 0.1, momentum = 2}, "needle.optim.SGD: invalid momentum 2 (expected 0 <= momentum <= 1)"},
      {"SGD", {lr = 0.1, momentum = 0 / 0}, "needle.optim.SGD: momentum must be a finite number"},
      {"SGD", {lr = 0.1, dampening = 2}, "needle.optim.SGD: invalid dampening 2 (expected 0 <= dampening <= 1)"},
      {"RMSprop", {momentum = 2}, "needle.optim.RMSprop: invalid momentum 2 (expected 0 <= momentum <= 1)"},
      {"RMSprop", {alpha = 0 / 0}, "needle.optim.RMSprop: alpha must be a finite number"},
    }
    for _, c in ipairs(cases) do
      assert_contains(errmsg(optim[c[1]], {W}, c[2]), c[3])
    end
    assert_contains(errmsg(optim.SGD, {{params = {W}, lr = -2}}, {lr = 0.1}), "needle.optim.SGD: invalid learning rate -2")
    assert_contains(errmsg(optim.SGD, {}, {lr = 0.1}), "needle.optim.SGD: optimizer got an empty parameter list")
    assert_contains(errmsg(optim.Adam, {W}, {lr = 0.1}, 5), "needle.optim.Adam: takes Adam(params[, opts]) only, got an extra argument #3: 5")
    assert_contains(errmsg(optim.SGD, {W, 3}, {lr = 0.1}), "needle.optim.SGD: params[2] is a number, not a tensor")
    assert_contains(errmsg(optim.SGD, {W * 2}, {lr = 0.1}), "needle.optim.SGD: params[1] is not a leaf tensor")
    assert_contains(errmsg(optim.SGD, {W, W}, {lr = 0.1}), "params[2] appears more than once")
    assert_contains(errmsg(optim.SGD, {{params = {W}, lrr = 1}}), "unknown option 'lrr' in a parameter group")
    assert_contains(errmsg(optim.SGD, {{params = {W}, lr = 0 / 0}}, {lr = 0.1}), "lr must be a finite number")
    local sgd = optim.SGD({W}, {lr = 0.1})
    assert_contains(errmsg(sgd.add_param_group, sgd, {params = {model()}, lr = 0 / 0}), "lr must be a finite number")
    -- zero_grad's options are checked too (a misspelt set_to_none would clear to nil)
    assert_contains(errmsg(sgd.zero_grad, sgd, {set_to_non = false}),
                    "needle.optim.SGD.zero_grad: unknown option 'set_to_non' (valid: set_to_none)")
    assert_contains(errmsg(sgd.zero_grad, sgd, 5), "takes zero_grad([{set_to_none = true}]) only")
    -- the error points at the caller's line
    local ok, e = pcall(function() optim.Adam({W}, {lr = -1}) end)
    assert.is_false(ok)
    assert_contains(e, "optim_spec.lua:")
  end)

  it("updates float64 parameters", function()
    local W = nd.tensor({{1, 2}, {3, 4}}, {dtype = "float64", requires_grad = true})
    local opt = optim.Adam({W}, {lr = 0.1})
    local loss = (W * W):sum()
    loss:backward()
    opt:step()
    assert.are.equal("float64", opt.state[W].exp_avg.dtype)
    close("float64 Adam", W, {0.9, 1.9, 2.9, 3.9}, 1e-8, 0)
  end)

  it("prints its groups", function()
    local W = model()
    local s = tostring(optim.SGD({W}, {lr = 0.1, momentum = 0.9}))
    assert_contains(s, "SGD (")
    assert_contains(s, "Parameter Group 1")
    assert_contains(s, "    lr: 0.1")
    assert_contains(s, "    momentum: 0.9")
  end)
end)

describe("nd.nn.utils gradient clipping", function()
  local utils = nd.nn.utils

  local function with_grads()
    local a = nd.zeros({2, 2}, {requires_grad = true})
    local b = nd.zeros({3}, {requires_grad = true})
    a.grad = nd.tensor({{3, -4}, {1, 2}})
    b.grad = nd.tensor({-2, 0, 6})
    return a, b
  end

  it("clip_grad_norm_ returns the total 2-norm and scales every grad", function()
    local a, b = with_grads()
    local old_a = a.grad
    local total = utils.clip_grad_norm_({a, b}, 5)
    -- sqrt(9 + 16 + 1 + 4 + 4 + 0 + 36) = sqrt(70)
    assert.is_number(total)
    assert.is_true(math.abs(total - math.sqrt(70)) < 1e-5)
    local coef = 5 / (math.sqrt(70) + 1e-6)
    close("clipped a", a.grad, {3 * coef, -4 * coef, coef, 2 * coef}, 1e-6, 0)
    close("clipped b", b.grad, {-2 * coef, 0, 6 * coef}, 1e-6, 0)
    -- the old grad tensor is untouched
    assert.are.same({{3, -4}, {1, 2}}, old_a:totable())
    -- within the bound: unchanged
    local c, d = with_grads()
    assert.is_true(math.abs(utils.clip_grad_norm({c, d}, 100) - math.sqrt(70)) < 1e-5)
    assert.are.same({-2, 0, 6}, d.grad:totable())
  end)

  it("clip_grad_norm_'s 2-norm of large, transposed, float64 and bfloat16 grads against float64", function()
    nd.manual_seed(3)
    local cases = {
      {nd.randn({700, 300}) + 2, "float32, contiguous (a dot product)"},
      {(nd.randn({300, 700}) + 2):t(), "float32, transposed"},
      {nd.randn({50, 70}, {dtype = "float64"}), "float64"},
      {nd.randn({50, 70}):to("bfloat16"), "bfloat16"},
    }
    for _, c in ipairs(cases) do
      local p = nd.zeros(c[1].shape, {dtype = c[1].dtype, requires_grad = true})
      p.grad = c[1]
      local g64 = c[1]:double()
      local want = math.sqrt((g64 * g64):sum():item())
      local total = utils.clip_grad_norm_({p}, 1e9)
      assert.is_true(math.abs(total - want) <= 1e-6 * want, ("%s: %.10g, float64 %.10g"):format(c[2], total, want))
    end
  end)

  it("clip_grad_norm_ with other norms", function()
    local a, b = with_grads()
    assert.are.equal(6, utils.clip_grad_norm_({a, b}, 3, math.huge))
    close("inf-clipped b", b.grad, {-2 * 3 / (6 + 1e-6), 0, 3 / (1 + 1e-6 / 6)}, 1e-6, 0)
    local c, d = with_grads()
    assert.is_true(math.abs(utils.clip_grad_norm_({c, d}, 100, 1) - 18) < 1e-5)
    local e, f = with_grads()
    local want3 = (27 + 64 + 1 + 8 + 8 + 216) ^ (1 / 3)
    assert.is_true(math.abs(utils.clip_grad_norm_({e, f}, 100, 3) - want3) < 1e-4)
    local g = nd.zeros({2}, {requires_grad = true})
    g.grad = nd.tensor({0 / 0, 1})
    assert_contains(errmsg(utils.clip_grad_norm_, {g}, 1, 2, {error_if_nonfinite = true}),
                    "needle.nn.utils.clip_grad_norm_: the total norm of order 2 of the gradients is non-finite")
    -- no gradients at all: 0
    assert.are.equal(0, utils.clip_grad_norm_({nd.zeros({2}, {requires_grad = true})}, 1))
    -- a module
    local m = nd.nn.Linear(2, 2)
    m.weight.grad = nd.ones({2, 2})
    assert.is_true(math.abs(utils.clip_grad_norm_(m, 1) - 2) < 1e-6)
  end)

  it("clip_grad_value_ clamps every grad", function()
    local a, b = with_grads()
    local old = b.grad
    utils.clip_grad_value_({a, b}, 2.5)
    assert.are.same({{2.5, -2.5}, {1, 2}}, a.grad:totable())
    assert.are.same({-2, 0, 2.5}, b.grad:totable())
    assert.are.same({-2, 0, 6}, old:totable())
    assert_contains(errmsg(utils.clip_grad_value_, {a}, "x"), "needle.nn.utils.clip_grad_value_: clip_value must be a number")
    assert_contains(errmsg(utils.clip_grad_value_, {a}, -1), "clip_value must be a number >= 0")
    assert_contains(errmsg(utils.clip_grad_value_, {a}, 0 / 0), "clip_value must be a number >= 0")
    assert_contains(errmsg(utils.clip_grad_value_, {a}, 1, 5), "takes clip_grad_value_(parameters, clip_value) only")
  end)

  it("clip_grad_norm_ refuses a negative or NaN max_norm and a NaN norm_type", function()
    local a = with_grads()
    local before = a.grad:clone()
    -- (a negative max_norm would flip every gradient's sign)
    assert_contains(errmsg(utils.clip_grad_norm_, {a}, -1), "needle.nn.utils.clip_grad_norm_: max_norm must be a number >= 0, got -1")
    assert_contains(errmsg(utils.clip_grad_norm_, {a}, 0 / 0), "max_norm must be a number >= 0")
    assert_contains(errmsg(utils.clip_grad_norm_, {a}, 1, 0 / 0), "norm_type must be a number")
    assert.are.same(before:totable(), a.grad:totable())
  end)
end)

-- A non-contiguous parameter (composed update) and its contiguous copy (fused
-- where the kernel applies) stepped by optimizer class Opt with options o
-- keep the same values.
local function composed_agrees(Opt, o)
  local p = nd.randn({30, 20}):t():requires_grad_() -- a non-contiguous leaf
  assert.is_false(p:is_contiguous())
  local qp = p:detach():contiguous():requires_grad_()
  local o1, o2 = Opt({p}, o), Opt({qp}, o)
  for _ = 1, 3 do
    local g = nd.randn({20, 30})
    p.grad, qp.grad = g, g:clone()
    o1:step()
    o2:step()
    assert.is_true(same_values(p:detach(), qp:detach()))
  end
end

-- The CPU runs SGD's update as one fused pass (core.sgd_step_); it must give
-- the composed formulas' values to the bit, for every option, in float32 and
-- float64, on the first step (buffer = g) and after.
describe("optim.SGD's fused update", function()
  local core = require "needle.core"

  -- the composed reference: PyTorch's formulas as separate tensor ops
  local function reference_step(p, g, st, o)
    if o.maximize then g = -g end
    if (o.weight_decay or 0) ~= 0 then g = g + p * o.weight_decay end
    local m, d = o.momentum or 0, o.dampening or 0
    if m ~= 0 then
      if st.buf == nil then st.buf = g:clone()
      else
        st.buf:mul_(m)
        st.buf:add_(d ~= 0 and g * (1 - d) or g)
      end
      if o.nesterov then g = g + st.buf * m else g = st.buf end
    end
    p:add_(g * -o.lr)
  end

  local cases = {
    {lr = 0.1},
    {lr = 0.05, momentum = 0.9},
    {lr = 0.05, momentum = 0.9, dampening = 0.3},
    {lr = 0.02, momentum = 0.8, weight_decay = 0.01},
    {lr = 0.02, momentum = 0.8, nesterov = true, weight_decay = 0.1},
    {lr = 0.3, weight_decay = 0.05, maximize = true},
    {lr = 0.1, momentum = 0.5, dampening = 0.5, weight_decay = 0.2, maximize = true},
  }
  for _, dtype in ipairs({"float32", "float64"}) do
    for ci, o in ipairs(cases) do
      it(("matches the composed formulas exactly (%s, case %d)"):format(dtype, ci), function()
        nd.manual_seed(ci)
        -- 40000 elements: the threaded path of the kernel too
        local p = nd.randn({200, 200}, {dtype = dtype}):requires_grad_()
        local q = p:detach():clone()
        local opt = optim.SGD({p}, o)
        local st = {}
        for _ = 1, 4 do
          local g = nd.randn({200, 200}, {dtype = dtype})
          p.grad = g
          opt:step()
          nd.no_grad(function() reference_step(q, g, st, o) end)
          assert.is_true(same_values(p:detach(), q), "parameter differs")
          if st.buf then
            assert.is_true(same_values(opt.state[p].momentum_buffer, st.buf), "momentum buffer differs")
          end
        end
      end)
    end
  end

  it("runs fused on contiguous CPU float tensors and declines the rest", function()
    local h = {lr = 0.1, momentum = 0.9, dampening = 0, weight_decay = 0, nesterov = false,
               maximize = false, first = true}
    local f64 = {dtype = "float64"}
    local p, g, buf = nd.ones({3, 4}, f64), nd.ones({3, 4}, f64), nd.zeros({3, 4}, f64)
    assert.is_true(core.sgd_step_(p, g, buf, h))
    assert.are.same({0.9, 0.9}, {p[1][1]:item(), p[3][4]:item()})
    assert.are.equal(1, buf[2][2]:item())
    -- declined, nothing changed: non-contiguous, mixed dtypes, integer
    local t = nd.ones({4, 3}, f64):t()
    assert.is_false(core.sgd_step_(t, g, buf, h))
    assert.are.equal(1, t[1][1]:item())
    assert.is_false(core.sgd_step_(p, nd.ones({3, 4}), buf, h))
    assert.is_false(core.sgd_step_(nd.ones({3, 4}, {dtype = "int64"}), nd.ones({3, 4}, {dtype = "int64"}),
                                   nd.zeros({3, 4}, {dtype = "int64"}), h))
    assert.are.equal(0.9, p[1][1]:item())
    -- a buffer without momentum (or none with it) is a caller's error
    h.momentum = 0
    assert_contains(errmsg(core.sgd_step_, p, g, buf, h), "a momentum buffer goes with momentum != 0")
    assert_contains(errmsg(core.sgd_step_, p, g, nil, {lr = "x"}), "option 'lr' must be a number")
  end)

  it("takes the composed path for a non-contiguous parameter, with the same values", function()
    composed_agrees(optim.SGD, {lr = 0.05, momentum = 0.9, weight_decay = 0.01})
  end)
end)

-- The CPU runs Adam's and AdamW's update (without amsgrad) as one fused pass
-- (core.adam_step_); it must give the composed formulas' values to the bit,
-- for every option, in float32 and float64.
describe("optim.Adam's fused update", function()
  local core = require "needle.core"

  -- the composed reference: nd.optim.Adam's own ops (as PyTorch's formulas)
  local function reference_step(p, g, st, o, decoupled)
    local lr, wd, eps = o.lr, o.weight_decay or 0, o.eps or 1e-8
    local b1, b2 = (o.betas or {0.9, 0.999})[1], (o.betas or {0.9, 0.999})[2]
    st.t = (st.t or 0) + 1
    st.m = st.m or nd.zeros_like(p)
    st.v = st.v or nd.zeros_like(p)
    if o.maximize then g = -g end
    if decoupled then
      if wd ~= 0 then p:mul_(1 - lr * wd) end
    elseif wd ~= 0 then
      g = g + p * wd
    end
    st.m:mul_(b1):add_(g * (1 - b1))
    st.v:mul_(b2):add_((g * (1 - b2)):mul_(g))
    local denom = st.v:sqrt():div_(math.sqrt(1 - b2 ^ st.t)):add_(eps)
    p:add_((st.m * -(lr / (1 - b1 ^ st.t))):div_(denom))
  end

  local cases = {
    {lr = 1e-3},
    {lr = 1e-2, weight_decay = 0.1},
    {lr = 1e-2, weight_decay = 0.1, adamw = true},
    {lr = 3e-3, betas = {0.8, 0.99}, eps = 1e-6, maximize = true},
    {lr = 5e-3, weight_decay = 0.01, maximize = true, adamw = true},
  }
  for _, dtype in ipairs({"float32", "float64"}) do
    for ci, c in ipairs(cases) do
      it(("matches the composed formulas exactly (%s, case %d)"):format(dtype, ci), function()
        nd.manual_seed(ci)
        local o = {}
        for k, v in pairs(c) do if k ~= "adamw" then o[k] = v end end
        -- 40000 elements: the threaded path of the kernel too
        local p = nd.randn({200, 200}, {dtype = dtype}):requires_grad_()
        local q = p:detach():clone()
        local opt = (c.adamw and optim.AdamW or optim.Adam)({p}, o)
        local st = {}
        for i = 1, 4 do
          -- gradients of very different sizes: sqrt(v) and eps both matter
          local g = nd.randn({200, 200}, {dtype = dtype}) * (i % 2 == 0 and 1e-4 or 30)
          p.grad = g
          opt:step()
          nd.no_grad(function() reference_step(q, g, st, o, c.adamw) end)
          assert.is_true(same_values(p:detach(), q), "parameter differs at step " .. i)
          assert.is_true(same_values(opt.state[p].exp_avg, st.m), "exp_avg differs")
          assert.is_true(same_values(opt.state[p].exp_avg_sq, st.v), "exp_avg_sq differs")
        end
      end)
    end
  end

  it("runs fused on contiguous CPU float tensors and declines the rest", function()
    local h = {beta1 = 0.9, beta2 = 0.999, one_minus_beta1 = 0.1, one_minus_beta2 = 0.001, eps = 1e-8,
               weight_decay = 0, decay = 1, step_size = -0.1, bc2_sqrt = math.sqrt(0.001),
               decoupled = false, maximize = false}
    local f64 = {dtype = "float64"}
    local p, g = nd.ones({3, 4}, f64), nd.ones({3, 4}, f64)
    local m, v = nd.zeros({3, 4}, f64), nd.zeros({3, 4}, f64)
    assert.is_true(core.adam_step_(p, g, m, v, h))
    assert.is_true(math.abs(m[1][1]:item() - 0.1) < 1e-15 and math.abs(v[3][4]:item() - 0.001) < 1e-15)
    assert.is_true(p[2][2]:item() < 1)
    local before = p:clone()
    -- declined, nothing changed: non-contiguous, mixed dtypes, shared memory, integer
    local t = nd.ones({4, 3}, f64):t()
    assert.is_false(core.adam_step_(t, g, m, v, h))
    assert.are.equal(1, t[1][1]:item())
    assert.is_false(core.adam_step_(p, nd.ones({3, 4}), m, v, h))
    assert.is_false(core.adam_step_(p, g, m, m, h))
    local i64 = {dtype = "int64"}
    assert.is_false(core.adam_step_(nd.ones({3, 4}, i64), nd.ones({3, 4}, i64), nd.zeros({3, 4}, i64),
                                    nd.zeros({3, 4}, i64), h))
    assert.is_true(same_values(p, before))
    assert_contains(errmsg(core.adam_step_, p, g, m, v, {beta1 = "x"}), "adam_step_: option 'beta1' must be a number")
  end)

  it("takes the composed path with amsgrad and for a non-contiguous parameter, with the same values", function()
    composed_agrees(optim.AdamW, {lr = 1e-2, amsgrad = true})
    composed_agrees(optim.AdamW, {lr = 1e-2, weight_decay = 0.1})
  end)
end)
