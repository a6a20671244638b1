-- optim_extra_spec.lua - the optimizers and schedulers of issue 20: NAdam,
-- RAdam, Adamax, Adadelta, LBFGS; ConstantLR, PolynomialLR,
-- CosineAnnealingWarmRestarts, CyclicLR, ReduceLROnPlateau. Trajectories are
-- compared with PyTorch's from spec/fixtures/torch_optim_extra.lua (written by
-- spec/fixtures/gen/gen_torch_optim_extra.py; PyTorch is not needed here).
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local fx = dofile("spec/fixtures/torch_optim_extra.lua")
local base = dofile("spec/fixtures/torch_optim.lua") -- W0, b0, X, C
local optim = nd.optim
local S = nd.optim.lr_scheduler

local function tensor(t, opts)
  return nd.tensor(t.data, opts):reshape(t.shape)
end

local function values(t) return t:contiguous():view({-1}):totable() end

-- |got - want| <= rtol * |want| + atol, element by element
local function close(name, got, want, rtol, atol)
  local g = type(got) == "table" and got or values(got)
  assert.are.equal(#want, #g, name .. ": size")
  for i, w in ipairs(want) do
    if not (math.abs(g[i] - w) <= rtol * math.abs(w) + atol) then
      error(("%s: element %d is %.17g, PyTorch %.17g"):format(name, i, g[i], w), 2)
    end
  end
end

local function same_values(a, b)
  local x, y = values(a), values(b)
  assert.are.equal(#x, #y)
  for i = 1, #x do
    if x[i] ~= y[i] then return false end
  end
  return true
end

-- the problem of torch_optim.lua: W (3x4), b (4), loss sum((X @ W + b)^2 * C)
local function model(opts)
  opts = opts or {}
  local W = tensor(base.W0, opts):detach():requires_grad_()
  local b = tensor(base.b0, opts):detach():requires_grad_()
  return W, b
end

local Xs, Cs = {}, {}
local function loss_fn(W, b)
  local key = W.dtype .. "@" .. W.device
  if not Xs[key] then
    Xs[key] = tensor(base.X, {dtype = W.dtype, device = W.device})
    Cs[key] = tensor(base.C, {dtype = W.dtype, device = W.device})
  end
  local y = Xs[key]:matmul(W) + b
  return (y * y * Cs[key]):sum()
end

local function train_step(opt, W, b)
  opt:zero_grad()
  loss_fn(W, b):backward()
  opt:step()
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

describe("NAdam, RAdam, Adamax, Adadelta against PyTorch (10 steps, rtol 2e-5)", function()
  for _, case in ipairs(fx.optim) do
    it(case.name .. (case.via and (" (PyTorch 1.13 " .. case.via .. ")") or ""), function()
      local W, b = model()
      local opt = make_opt(case, W, b)
      for k, want in ipairs(case.steps) do
        train_step(opt, W, b)
        close(("%s step %d W"):format(case.name, k), W, want.W, 2e-5, 1e-7)
        close(("%s step %d b"):format(case.name, k), b, want.b, 2e-5, 1e-7)
      end
    end)
  end

  it("keep PyTorch's defaults", function()
    local W = model()
    local d = {
      NAdam = {lr = 2e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, momentum_decay = 4e-3,
               decoupled_weight_decay = false, maximize = false},
      RAdam = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, decoupled_weight_decay = false,
               maximize = false},
      Adamax = {lr = 2e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, maximize = false},
      Adadelta = {lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0, maximize = false},
      LBFGS = {lr = 1, max_iter = 20, max_eval = 25, tolerance_grad = 1e-7, tolerance_change = 1e-9,
               history_size = 100, line_search_fn = false},
    }
    for name, want in pairs(d) do
      assert.are.same(want, optim[name]({W}).defaults, name)
    end
    -- LBFGS: max_eval follows max_iter (max_iter * 5 // 4), as PyTorch
    assert.are.equal(12, optim.LBFGS({W}, {max_iter = 10}).defaults.max_eval)
    assert.are.equal(3, optim.LBFGS({W}, {max_iter = 10, max_eval = 3}).defaults.max_eval)
  end)
end)

local CONFIGS = {
  {"NAdam", {lr = 0.05, weight_decay = 0.1, maximize = true}},
  {"NAdam", {lr = 0.05, weight_decay = 0.1, decoupled_weight_decay = true}},
  {"RAdam", {lr = 0.05, weight_decay = 0.1, maximize = true}},
  {"RAdam", {lr = 0.05, weight_decay = 0.1, decoupled_weight_decay = true}},
  {"Adamax", {lr = 0.05, weight_decay = 0.1, maximize = true}},
  {"Adadelta", {lr = 0.5, weight_decay = 0.1, maximize = true}},
}

describe("NAdam, RAdam, Adamax, Adadelta behaviour", function()
  it("never modify p.grad, and skip parameters without a gradient", function()
    for _, c in ipairs(CONFIGS) do
      local W, b = model()
      local opt = optim[c[1]]({W, b}, c[2])
      for _ = 1, 3 do
        opt:zero_grad()
        loss_fn(W, b):backward()
        local gW, vW = W.grad, W.grad:clone()
        opt:step()
        assert.is_true(same_values(gW, vW), c[1] .. ": W.grad changed")
      end
      local W2, b2 = model()
      local opt2 = optim[c[1]]({W2, b2}, c[2])
      ;(nd.tensor(base.X.data):reshape(base.X.shape):matmul(W2) ^ 2):sum():backward()
      opt2:step()
      assert.is_nil(opt2.state[b2], c[1])
      assert.is_true(same_values(b2, tensor(base.b0)), c[1])
      assert.is_false(same_values(W2, tensor(base.W0)), c[1])
    end
  end)

  it("state_dict/load_state_dict: a reloaded optimizer continues identically", function()
    for _, c in ipairs(CONFIGS) do
      local W1, b1 = model()
      local opt1 = optim[c[1]]({W1, b1}, c[2])
      for _ = 1, 4 do train_step(opt1, W1, b1) end
      local sd = opt1:state_dict()
      assert.are.same({1, 2}, sd.param_groups[1].params)
      assert.are.equal(4, sd.state[1].step)
      local W2, b2 = model()
      nd.no_grad(function() W2:copy_(W1); b2:copy_(b1) end)
      local opt2 = optim[c[1]]({W2, b2}, {lr = 0.5})
      opt2:load_state_dict(sd)
      assert.are.same(c[2].lr, opt2.param_groups[1].lr)
      for _ = 1, 4 do
        train_step(opt1, W1, b1)
        train_step(opt2, W2, b2)
        assert.is_true(same_values(W1, W2), c[1] .. ": W diverged after reload")
        assert.is_true(same_values(b1, b2), c[1] .. ": b diverged after reload")
      end
      for k, v in pairs(opt2.state[W2]) do
        if nd.is_tensor(v) then assert.is_false(v:shares_storage(opt1.state[W1][k]), k) end
      end
    end
    -- NAdam's mu_product as PyTorch saves it (a 0-dim tensor) loads as a number
    local W, b = model()
    local opt = optim.NAdam({W, b}, {lr = 0.05})
    train_step(opt, W, b)
    local sd = opt:state_dict()
    sd.state[1].mu_product = nd.tensor(sd.state[1].mu_product, {dtype = "float64"})
    opt:load_state_dict(sd)
    assert.is_number(opt.state[W].mu_product)
  end)

  it("reject bad hyperparameters, naming the optimizer and the value", function()
    local W = model()
    local cases = {
      {"NAdam", {lr = -1}, "needle.optim.NAdam: invalid learning rate -1 (expected lr >= 0)"},
      {"NAdam", {momentum_decay = -0.1}, "needle.optim.NAdam: invalid momentum_decay -0.1 (expected >= 0)"},
      {"NAdam", {betas = {1.0, 0.9}}, "needle.optim.NAdam: invalid beta parameter at index 1: 1.0"},
      {"NAdam", {decoupled_weight_decay = 1}, "needle.optim.NAdam: decoupled_weight_decay must be a boolean, got number"},
      {"RAdam", {betas = {0.9, -0.1}}, "needle.optim.RAdam: invalid beta parameter at index 2: -0.1"},
      {"RAdam", {weight_decay = -1}, "needle.optim.RAdam: invalid weight_decay -1"},
      {"Adamax", {eps = -1}, "needle.optim.Adamax: invalid eps -1"},
      {"Adamax", {betas = 0.9}, "needle.optim.Adamax: betas must be a table of two numbers, got 0.9"},
      {"Adadelta", {rho = 1.5}, "needle.optim.Adadelta: invalid rho 1.5 (expected 0 <= rho <= 1)"},
      {"Adadelta", {maximize = "yes"}, "needle.optim.Adadelta: maximize must be a boolean, got string"},
      {"Adadelta", {rh = 0.9}, "needle.optim.Adadelta: unknown option 'rh' (valid: eps, lr, maximize, rho, weight_decay)"},
    }
    for _, c in ipairs(cases) do
      assert_contains(errmsg(optim[c[1]], {W}, c[2]), c[3])
    end
    assert_contains(errmsg(optim.RAdam, {{params = {W}, betas = {0.9, 2}}}),
                    "needle.optim.RAdam: invalid beta parameter at index 2: 2")
    -- at the caller's line
    local ok, e = pcall(function() optim.NAdam({W}, {lr = -1}) end)
    assert.is_false(ok)
    assert_contains(e, "optim_extra_spec.lua:")
  end)

  it("are refused inside nd.compile, as LBFGS is (their steps live in Lua)", function()
    local m = nd.nn.Linear(2, 2)
    local x = nd.ones({3, 2})
    for _, name in ipairs({"NAdam", "RAdam", "Adamax", "Adadelta"}) do
      local opt = optim[name](m:parameters())
      local cf = nd.compile(function(input)
        opt:zero_grad()
        local loss = m(input):sum()
        loss:backward()
        opt:step()
        return loss
      end)
      cf(x) -- the warm-up call runs eagerly
      assert_contains(errmsg(cf, x), ("needle.optim.%s: cannot step inside nd.compile"):format(name))
    end
    local opt = optim.LBFGS(m:parameters())
    local cf = nd.compile(function(input)
      return opt:step(function()
        opt:zero_grad()
        local loss = m(input):sum()
        loss:backward()
        return loss
      end)
    end)
    cf(x)
    assert_contains(errmsg(cf, x), "needle.optim.LBFGS: cannot step inside nd.compile")
  end)

  it("update float64 parameters in float64", function()
    for _, c in ipairs(CONFIGS) do
      local W, b = model({dtype = "float64"})
      local W32, b32 = model()
      local o64, o32 = optim[c[1]]({W, b}, c[2]), optim[c[1]]({W32, b32}, c[2])
      for _ = 1, 3 do
        train_step(o64, W, b)
        train_step(o32, W32, b32)
      end
      assert.are.equal("float64", W.dtype)
      for _, v in pairs(o64.state[W]) do
        if nd.is_tensor(v) then assert.are.equal("float64", v.dtype) end
      end
      close(c[1] .. " float64 vs float32", W, values(W32), 1e-4, 1e-6)
    end
  end)
end)

-- LBFGS ------------------------------------------------------------------------------

local L = fx.lbfgs_data

local function rosenbrock(x)
  local n = x:numel()
  local a, b = x:narrow(1, 1, n - 1), x:narrow(1, 2, n - 1)
  return ((b - a ^ 2) ^ 2 * 100 + (1 - a) ^ 2):sum()
end

local VECTOR_PROBLEMS = {
  rosenbrock = rosenbrock,
  quartic = function(x) return (x ^ 4):sum() - (x ^ 2):sum() * 3 + x:sum() end,
  l1 = function(x) return (x - 0.3):abs():sum() + (x * x):sum() * 0.01 end,
  linear = function(x) return (x * -2):sum() end,
}

-- the parameters and the loss of an LBFGS fixture problem: "lstsq" (W, b),
-- or a function of one vector starting at x0
local function lbfgs_problem(problem, opts, x0)
  if problem ~= "lstsq" then
    return {nd.tensor(x0, opts):requires_grad_()}, assert(VECTOR_PROBLEMS[problem], problem)
  end
  local Am, Y = tensor(L.A, opts), tensor(L.Y, opts)
  local function lstsq(W, b)
    local r = Am:matmul(W) + b - Y
    return (r * r):sum()
  end
  return {tensor(L.W0, opts):requires_grad_(), tensor(L.b0, opts):requires_grad_()}, lstsq
end

local function closure_for(opt, params, f)
  return function()
    opt:zero_grad()
    local loss = f(table.unpack(params))
    loss:backward()
    return loss
  end
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

describe("LBFGS against PyTorch (float64: rtol 1e-7; float32: 1e-4)", function()
  for _, case in ipairs(fx.lbfgs) do
    it(("%s (%s, %s)"):format(case.name, case.dtype, case.options.line_search_fn or "fixed step"), function()
      local params, f = lbfgs_problem(case.problem, {dtype = case.dtype}, case.x0)
      local opt = optim.LBFGS(params, copy(case.options))
      local closure = closure_for(opt, params, f)
      local f64 = case.dtype == "float64"
      local rtol, atol = f64 and 1e-7 or 1e-4, f64 and 1e-10 or 1e-5
      for k, want in ipairs(case.steps) do
        local loss = opt:step(closure)
        local name = ("%s step %d"):format(case.name, k)
        close(name .. " loss", {loss:item()}, {want.loss}, rtol, atol)
        for i, p in ipairs(params) do close(("%s param %d"):format(name, i), p, want.params[i], rtol, atol) end
        if f64 then -- the counts follow the trajectory exactly
          local st = opt.state[params[1]]
          assert.are.same({want.func_evals, want.n_iter}, {st.func_evals, st.n_iter}, name .. " evals, iters")
        end
      end
    end)
  end
end)

describe("LBFGS behaviour", function()
  it("state_dict/load_state_dict: a reloaded LBFGS continues identically", function()
    for _, o in ipairs({{line_search_fn = "strong_wolfe", max_iter = 3, history_size = 2}, {lr = 0.3, max_iter = 2}}) do
      local p1, f = lbfgs_problem("lstsq", {dtype = "float64"})
      local opt1 = optim.LBFGS(p1, copy(o))
      local c1 = closure_for(opt1, p1, f)
      for _ = 1, 2 do opt1:step(c1) end
      local sd = opt1:state_dict()
      local st = sd.state[1]
      assert.are.equal(8, st.d:numel())
      assert.is_true(#st.old_dirs >= 1)
      -- a snapshot: the history tensors are copies
      assert.is_false(st.old_dirs[1]:shares_storage(opt1.state[p1[1]].old_dirs[1]))
      local p2 = lbfgs_problem("lstsq", {dtype = "float64"})
      nd.no_grad(function()
        for i, p in ipairs(p2) do p:copy_(p1[i]) end
      end)
      local opt2 = optim.LBFGS(p2)
      opt2:load_state_dict(sd)
      local c2 = closure_for(opt2, p2, f)
      for _ = 1, 2 do
        local l1, l2 = opt1:step(c1), opt2:step(c2)
        assert.are.equal(l1:item(), l2:item())
        for i = 1, 2 do assert.is_true(same_values(p1[i], p2[i]), "diverged after reload") end
      end
    end
  end)

  it("load_state_dict checks the flat vectors and the history", function()
    local p, f = lbfgs_problem("lstsq", {dtype = "float64"})
    local opt = optim.LBFGS(p, {max_iter = 3})
    opt:step(closure_for(opt, p, f))
    local function broken(edit)
      local sd = opt:state_dict()
      edit(sd.state[1])
      return sd
    end
    local p2 = lbfgs_problem("lstsq", {dtype = "float64"})
    local opt2 = optim.LBFGS(p2, {max_iter = 3})
    assert_contains(errmsg(opt2.load_state_dict, opt2, broken(function(s) s.d = nd.zeros({7}) end)),
      "needle.optim.LBFGS: load_state_dict: state[1].d has shape {7}, but the parameters have 8 elements in all (expected {8})")
    assert_contains(errmsg(opt2.load_state_dict, opt2, broken(function(s) s.old_dirs = {nd.zeros({8}), 3} end)),
      "state[1].old_dirs[2] must be a tensor, got number")
    assert_contains(errmsg(opt2.load_state_dict, opt2, broken(function(s) s.ro = nd.zeros({2}) end)),
      "state[1].ro must be a list, got userdata")
    assert.are.same({}, opt2.state)
    -- PyTorch's scratch list 'al' is accepted and dropped
    opt2:load_state_dict(broken(function(s) s.al = {0.5} end))
    assert.is_nil(opt2.state[p2[1]].al)
  end)

  it("returns the first loss and stops at once at an optimum", function()
    local x = nd.tensor({1.0, 1.0}, {dtype = "float64", requires_grad = true})
    local opt = optim.LBFGS({x})
    local calls = 0
    local loss = opt:step(function()
      calls = calls + 1
      opt:zero_grad()
      local l = rosenbrock(x)
      l:backward()
      return l
    end)
    assert.are.equal(0, loss:item())
    assert.are.equal(1, calls)
    assert.are.equal(0, opt.state[x].n_iter)
    -- a closure may return a number
    local y = nd.tensor({3.0}, {dtype = "float64", requires_grad = true})
    local o2 = optim.LBFGS({y}, {line_search_fn = "strong_wolfe"})
    o2:step(function()
      o2:zero_grad()
      local l = ((y - 1) ^ 2):sum()
      l:backward()
      return l:item()
    end)
    close("1-D quadratic minimum", y, {1}, 0, 1e-7)
  end)

  it("rejects parameter groups, a missing closure and bad options", function()
    local W, b = model()
    assert_contains(errmsg(optim.LBFGS, {{params = {W}}, {params = {b}}}),
      "needle.optim.LBFGS: LBFGS doesn't support per-parameter options (parameter groups): got 2 groups")
    local opt = optim.LBFGS({W, b})
    assert_contains(errmsg(opt.add_param_group, opt, {params = {nd.zeros({2}, {requires_grad = true})}}),
      "needle.optim.LBFGS: LBFGS doesn't support per-parameter options")
    assert_contains(errmsg(opt.step, opt), "needle.optim.LBFGS: step needs a closure that re-evaluates the model")
    assert_contains(errmsg(opt.step, opt, function() return "x" end),
      "needle.optim.LBFGS: the closure must return the loss (a tensor or a number), got string")
    assert_contains(errmsg(opt.step, opt, function() return W end),
      "needle.optim.LBFGS: the closure must return the loss (one number), got a tensor of shape {3,4}")
    assert_contains(errmsg(optim.LBFGS, {W}, {line_search_fn = "backtracking"}),
      "needle.optim.LBFGS: line_search_fn must be nil or \"strong_wolfe\" (the only line search), got \"backtracking\"")
    assert_contains(errmsg(optim.LBFGS, {W}, {max_iter = 0}), "needle.optim.LBFGS: max_iter must be a positive integer, got 0")
    assert_contains(errmsg(optim.LBFGS, {W}, {history_size = 2.5}), "history_size must be a positive integer, got 2.5")
    assert_contains(errmsg(optim.LBFGS, {W}, {tolerance_grad = "small"}), "tolerance_grad must be a number, got string")
    assert_contains(errmsg(optim.LBFGS, {W, nd.zeros({2}, {dtype = "float64", requires_grad = true})}),
      "needle.optim.LBFGS: all parameters must have one device and dtype (they form one flat vector): " ..
      "params[1] is float32 on cpu, params[2] float64 on cpu")
  end)
end)

-- every new optimizer on each OpenCL device: the same values as on the CPU
describe("the new optimizers on OpenCL", function()
  if D.pending_without_opencl(pending, "optimizers on OpenCL") then return end
  for _, dev in ipairs(D.opencl()) do
    it("NAdam, RAdam, Adamax, Adadelta match the CPU on " .. D.describe(dev), function()
      for _, c in ipairs(CONFIGS) do
        local W, b = model()
        local Wd, bd = model({device = dev})
        local oc, od = optim[c[1]]({W, b}, c[2]), optim[c[1]]({Wd, bd}, c[2])
        for k = 1, 3 do
          train_step(oc, W, b)
          train_step(od, Wd, bd)
          assert.are.equal(dev, Wd.device)
          close(("%s step %d on %s"):format(c[1], k, dev), Wd:to("cpu"), values(W), 1e-5, 1e-6)
          close(("%s step %d b on %s"):format(c[1], k, dev), bd:to("cpu"), values(b), 1e-5, 1e-6)
        end
        local sd = od:state_dict()
        local Wd2, bd2 = model({device = dev})
        local od2 = optim[c[1]]({Wd2, bd2}, c[2])
        od2:load_state_dict(sd)
        assert.are.equal(dev, od2.state[Wd2].exp_avg and od2.state[Wd2].exp_avg.device or
                              od2.state[Wd2].square_avg.device)
      end
    end)

    it("LBFGS (strong_wolfe and fixed step) matches the CPU on " .. D.describe(dev), function()
      local dtype = D.fp64(dev) and "float64" or "float32"
      for _, o in ipairs({{line_search_fn = "strong_wolfe", max_iter = 6, history_size = 3}, {lr = 0.3, max_iter = 4}}) do
        local pc, f = lbfgs_problem("lstsq", {dtype = dtype})
        local pd, fd = lbfgs_problem("lstsq", {dtype = dtype, device = dev})
        local oc, od = optim.LBFGS(pc, copy(o)), optim.LBFGS(pd, copy(o))
        local cc, cd = closure_for(oc, pc, f), closure_for(od, pd, fd)
        for k = 1, 2 do
          local lc, ld = oc:step(cc), od:step(cd)
          close(("LBFGS loss step %d on %s"):format(k, dev), {ld:item()}, {lc:item()}, 1e-4, 1e-6)
          for i = 1, 2 do
            assert.are.equal(dev, pd[i].device)
            close(("LBFGS param %d step %d on %s"):format(i, k, dev), pd[i]:to("cpu"), values(pc[i]), 1e-4, 1e-5)
          end
        end
        assert.are.equal(dev, od.state[pd[1]].d.device)
      end
    end)
  end
end)

-- schedulers ---------------------------------------------------------------------------

local function sgd_two_groups()
  local W, b = model()
  return optim.SGD({{params = {W}, lr = 0.1}, {params = {b}, lr = 0.02}}, {momentum = 0.9})
end

local function adam_two_groups()
  local W, b = model()
  return optim.Adam({{params = {W}, lr = 0.1}, {params = {b}, lr = 0.02}})
end

-- the Lua twin of each scheduler case in the fixture
local schedulers = {
  constant_default = function(o) return S.ConstantLR(o) end,
  constant = function(o) return S.ConstantLR(o, {factor = 0.5, total_iters = 4}) end,
  constant_jumps = function(o) return S.ConstantLR(o, {factor = 0.25, total_iters = 6}) end,
  polynomial_default = function(o) return S.PolynomialLR(o) end,
  polynomial = function(o) return S.PolynomialLR(o, {total_iters = 20, power = 2.0}) end,
  polynomial_sqrt = function(o) return S.PolynomialLR(o, {total_iters = 12, power = 0.5}) end,
  polynomial_jumps = function(o) return S.PolynomialLR(o, {total_iters = 10, power = 3.0}) end,
  warm_restarts = function(o) return S.CosineAnnealingWarmRestarts(o, 7, {eta_min = 0.001}) end,
  warm_restarts_mult = function(o) return S.CosineAnnealingWarmRestarts(o, 3, {T_mult = 2, eta_min = 0.005}) end,
  warm_restarts_fractional = function(o) return S.CosineAnnealingWarmRestarts(o, 2, {T_mult = 2}) end,
  warm_restarts_mult1_fractional = function(o) return S.CosineAnnealingWarmRestarts(o, 3, {eta_min = 0.01}) end,
  warm_restarts_log_ties = function(o)
    return S.CosineAnnealingWarmRestarts(o, 1, {T_mult = 10, eta_min = 0.001})
  end,
  cyclic_triangular = function(o) return S.CyclicLR(o, 0.01, 0.1, {step_size_up = 4}) end,
  cyclic_after_step_lr = function(o)
    S.StepLR(o, 3)
    return S.CyclicLR(o, 0.01, 0.1, {step_size_up = 4})
  end,
  cyclic_triangular2 = function(o)
    return S.CyclicLR(o, {0.01, 0.002}, {0.1, 0.05}, {step_size_up = 3, step_size_down = 5, mode = "triangular2",
                                                      base_momentum = 0.7, max_momentum = 0.95})
  end,
  cyclic_exp_range = function(o)
    return S.CyclicLR(o, 0.01, 0.1, {step_size_up = 5, mode = "exp_range", gamma = 0.9,
                                     base_momentum = {0.8, 0.6}, max_momentum = {0.9, 0.85}})
  end,
  cyclic_no_momentum = function(o)
    return S.CyclicLR(o, 0.02, 0.2, {step_size_up = 2, step_size_down = 7, cycle_momentum = false})
  end,
  cyclic_scale_fn_cycle = function(o)
    return S.CyclicLR(o, 0.01, 0.1, {step_size_up = 3, scale_fn = function(x) return 1 / (1 + 0.5 * x) end})
  end,
  cyclic_scale_fn_iterations = function(o)
    return S.CyclicLR(o, 0.01, 0.1, {step_size_up = 3, scale_fn = function(x) return 0.97 ^ x end,
                                     scale_mode = "iterations"})
  end,
}

local function group_values(opt, key)
  local out = {}
  for i, g in ipairs(opt.param_groups) do out[i] = g[key] end
  return out
end

local function beta1s(opt)
  local out = {}
  for i, g in ipairs(opt.param_groups) do out[i] = g.betas[1] end
  return out
end

describe("the new lr schedulers against PyTorch (rtol 1e-12)", function()
  for _, case in ipairs(fx.schedulers) do
    it(case.name, function()
      local make = assert(schedulers[case.name], "no Lua twin for " .. case.name)
      local opt = sgd_two_groups()
      local sched = make(opt)
      for k, want in ipairs(case.lrs) do
        if k > 1 then
          opt:step()
          if case.epochs then sched:step(case.epochs[k - 1]) else sched:step() end
        end
        local name = ("%s at step %d"):format(case.name, k - 1)
        close(name .. " lr", sched:get_last_lr(), want, 1e-12, 1e-15)
        close(name .. " group lr", group_values(opt, "lr"), want, 1e-12, 1e-15)
        close(name .. " momentum", group_values(opt, "momentum"), case.momentum[k], 1e-12, 1e-15)
      end
    end)
  end

  -- PyTorch 2 cycles Adam's beta1 as SGD's momentum (1.13 cannot): the same
  -- values as the momentum of PyTorch's SGD case
  it("CyclicLR cycles Adam's beta1 as PyTorch's SGD momentum", function()
    for _, name in ipairs({"cyclic_triangular", "cyclic_exp_range"}) do
      local case
      for _, c in ipairs(fx.schedulers) do if c.name == name then case = c end end
      local opt = adam_two_groups()
      local sched = schedulers[name](opt)
      for k, want in ipairs(case.momentum) do
        if k > 1 then opt:step(); sched:step() end
        close(("%s beta1 at step %d"):format(name, k - 1), beta1s(opt), want, 1e-12, 1e-15)
        close(("%s lr at step %d"):format(name, k - 1), sched:get_last_lr(), case.lrs[k], 1e-12, 1e-15)
        assert.are.equal(0.999, opt.param_groups[1].betas[2])
      end
    end
  end)
end)

-- The describes above make one test per fixture case: a fixture that lost
-- cases (or a section renamed) would shrink them silently, so the counts are
-- pinned here (spec/fixtures/torch_optim_extra.lua; update with the generator).
describe("the torch_optim_extra fixture", function()
  local function names(section)
    local out, seen = {}, {}
    for i, c in ipairs(fx[section]) do
      assert.is_nil(seen[c.name], section .. ": duplicate case " .. tostring(c.name))
      seen[c.name], out[i] = true, c.name
    end
    return out, seen
  end

  it("has every section's cases", function()
    assert.are.equal(23, #names("optim"))
    assert.are.equal(15, #names("lbfgs"))
    assert.are.equal(19, #names("schedulers"))
    assert.are.equal(6, #names("plateau"))
    for _, c in ipairs(fx.optim) do assert.are.equal(10, #c.steps, c.name) end
    for _, c in ipairs(fx.lbfgs) do assert.is_true(#c.steps >= 1, c.name) end
  end)

  it("has a case for every scheduler's Lua twin, and a twin for every case", function()
    local _, cases = names("schedulers")
    local twins = 0
    for key in pairs(schedulers) do
      twins = twins + 1
      assert.is_true(cases[key] == true, "no fixture case for the Lua twin " .. key)
    end
    assert.are.equal(#fx.schedulers, twins)
  end)
end)

describe("ReduceLROnPlateau against PyTorch", function()
  for _, case in ipairs(fx.plateau) do
    it(case.name, function()
      local opt = sgd_two_groups()
      local sched = S.ReduceLROnPlateau(opt, copy(case.options))
      close(case.name .. " initial lr", sched:get_last_lr(), case.lrs[1], 0, 0)
      for k, m in ipairs(case.metrics) do
        opt:step()
        -- a one-element tensor works as well as a number
        sched:step(k % 2 == 0 and nd.tensor(m, {dtype = "float64"}) or m)
        close(("%s lr after metric %d"):format(case.name, k), group_values(opt, "lr"), case.lrs[k + 1], 1e-12, 1e-15)
        close(("%s get_last_lr after metric %d"):format(case.name, k), sched:get_last_lr(), case.lrs[k + 1], 1e-12, 1e-15)
      end
      assert.are.equal(case.num_bad_epochs, sched.num_bad_epochs)
      assert.are.equal(case.best, sched.best)
      assert.are.equal(#case.metrics, sched.last_epoch)
    end)
  end
end)

describe("the new lr schedulers' state and errors", function()
  it("state_dict/load_state_dict resume a schedule where it was", function()
    local makers = {
      schedulers.constant, schedulers.polynomial, schedulers.warm_restarts_mult, schedulers.cyclic_triangular2,
      schedulers.cyclic_scale_fn_cycle, function(o) return S.ReduceLROnPlateau(o, {patience = 1, factor = 0.5}) end,
    }
    local metrics = fx.plateau[1].metrics
    for mi, make in ipairs(makers) do
      local opt1 = sgd_two_groups()
      local s1 = make(opt1)
      local function advance(s, k) if s.name == "ReduceLROnPlateau" then s:step(metrics[k]) else s:step() end end
      for k = 1, 9 do opt1:step(); advance(s1, k) end
      local osd, ssd = opt1:state_dict(), s1:state_dict()
      assert.is_nil(ssd.optimizer)
      assert.is_nil(ssd._scale_fn_custom)
      local opt2 = sgd_two_groups()
      local s2 = make(opt2)
      opt2:load_state_dict(osd)
      s2:load_state_dict(ssd)
      for k = 10, 20 do
        opt1:step(); advance(s1, k)
        opt2:step(); advance(s2, k)
        assert.are.same(s1:get_last_lr(), s2:get_last_lr(), "maker " .. mi)
        assert.are.same(group_values(opt1, "momentum"), group_values(opt2, "momentum"), "maker " .. mi)
      end
    end
  end)

  it("reject bad arguments, naming the scheduler and the value", function()
    local o = sgd_two_groups()
    local cases = {
      {S.ConstantLR, {o, {factor = 1.5}}, "needle.optim.lr_scheduler.ConstantLR: invalid factor 1.5 (expected (0, 1])"},
      {S.ConstantLR, {o, {factor = 0}}, "ConstantLR: invalid factor 0 (expected (0, 1])"},
      {S.ConstantLR, {o, {total_iters = -1}}, "ConstantLR: total_iters must be an integer >= 0, got -1"},
      {S.PolynomialLR, {o, {total_iters = 0}}, "PolynomialLR: total_iters must be a positive integer, got 0"},
      {S.PolynomialLR, {o, {power = "2"}}, "PolynomialLR: power must be a number, got string"},
      {S.CosineAnnealingWarmRestarts, {o, 0}, "CosineAnnealingWarmRestarts: T_0 must be a positive integer, got 0"},
      {S.CosineAnnealingWarmRestarts, {o, 3, {T_mult = 1.5}}, "T_mult must be an integer >= 1, got 1.5"},
      {S.CosineAnnealingWarmRestarts, {o}, "CosineAnnealingWarmRestarts: missing required argument T_0"},
      {S.CyclicLR, {o, 0.01, 0.1, {mode = "sine"}},
       "CyclicLR: mode must be \"triangular\", \"triangular2\" or \"exp_range\", got \"sine\""},
      {S.CyclicLR, {o, {0.1}, 0.2}, "CyclicLR: expected 2 values for base_lr (one per parameter group), got 1"},
      {S.CyclicLR, {o, 0.01, 0.1, {step_size_up = 0}}, "CyclicLR: invalid step_size_up 0"},
      {S.CyclicLR, {o, 0.01, 0.1, {scale_fn = 3}}, "CyclicLR: scale_fn must be a function, got number"},
      {S.CyclicLR, {o, 0.01, 0.1, {scale_fn = math.sqrt, scale_mode = "epoch"}},
       "CyclicLR: scale_mode must be \"cycle\" or \"iterations\", got \"epoch\""},
      {S.CyclicLR, {optim.Adagrad({nd.zeros({2}, {requires_grad = true})}), 0.01, 0.1},
       "CyclicLR: cycle_momentum needs an optimizer with momentum or betas (Adagrad has neither)"},
      {S.ReduceLROnPlateau, {o, {mode = "up"}}, "ReduceLROnPlateau: mode must be \"min\" or \"max\", got \"up\""},
      {S.ReduceLROnPlateau, {o, {threshold_mode = "pct"}}, "threshold_mode must be \"rel\" or \"abs\", got \"pct\""},
      {S.ReduceLROnPlateau, {o, {factor = 1.0}}, "ReduceLROnPlateau: invalid factor 1.0 (expected [0, 1))"},
      {S.ReduceLROnPlateau, {o, {patience = -1}}, "patience must be an integer >= 0, got -1"},
      {S.ReduceLROnPlateau, {o, {min_lr = {0.1}}}, "expected 2 values for min_lr (one per parameter group), got 1"},
      {S.ReduceLROnPlateau, {o, {last_epoch = 3}}, "ReduceLROnPlateau: unknown option 'last_epoch'"},
    }
    for _, c in ipairs(cases) do
      assert_contains(errmsg(c[1], table.unpack(c[2])), c[3])
    end
    -- the optimizer is untouched when CyclicLR refuses its arguments
    assert.are.same({0.1, 0.02}, group_values(o, "lr"))
    local plateau = S.ReduceLROnPlateau(o)
    assert_contains(errmsg(plateau.step, plateau), "ReduceLROnPlateau: step needs the metric (a number or a one-element tensor), got nil")
    assert_contains(errmsg(plateau.step, plateau, nd.zeros({2})), "got a tensor of shape {2}")
    assert_contains(errmsg(plateau.load_state_dict, plateau, {mode = "min"}), "ReduceLROnPlateau: load_state_dict: the table has no")
    local warm = S.CosineAnnealingWarmRestarts(sgd_two_groups(), 3)
    assert_contains(errmsg(warm.step, warm, -1), "CosineAnnealingWarmRestarts: epoch must be a number >= 0, got -1")
    local ok, e = pcall(function() S.CyclicLR(o, 0.01, 0.1, {mode = "x"}) end)
    assert.is_false(ok)
    assert_contains(e, "optim_extra_spec.lua:")
  end)

  it("ConstantLR and PolynomialLR jump with step(epoch) through the closed form", function()
    local s = S.PolynomialLR(sgd_two_groups(), {total_iters = 10, power = 2})
    s:step(5)
    close("PolynomialLR step(5)", s:get_last_lr(), {0.1 * 0.25, 0.02 * 0.25}, 1e-14, 0)
    local c = S.ConstantLR(sgd_two_groups(), {factor = 0.5, total_iters = 3})
    c:step(2)
    close("ConstantLR step(2)", c:get_last_lr(), {0.05, 0.01}, 1e-14, 0)
    c:step(3)
    close("ConstantLR step(3)", c:get_last_lr(), {0.1, 0.02}, 1e-14, 0)
  end)
end)
