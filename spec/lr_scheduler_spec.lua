-- lr_scheduler_spec.lua - the argument checks of nd.optim.lr_scheduler: NaN,
-- +-inf and negative values refused (range checks written so that NaN fails
-- them), milestones, LambdaLR's return values, the options-table form's
-- misspelt keys, extra arguments and SequentialLR's schedulers. The schedules
-- themselves are compared with PyTorch's in optim_spec.lua and
-- optim_extra_spec.lua.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local S = nd.optim.lr_scheduler
local nan, inf = 0 / 0, math.huge

local function sgd()
  return nd.optim.SGD(nd.nn.Linear(2, 2):parameters(), {lr = 0.1, momentum = 0.9})
end

local function sgd_two_groups()
  local a, b = nd.zeros({2}, {requires_grad = true}), nd.zeros({1}, {requires_grad = true})
  return nd.optim.SGD({{params = {a}, lr = 0.1}, {params = {b}, lr = 0.02}}, {momentum = 0.9})
end

local P = "needle.optim.lr_scheduler."

-- each case: the scheduler, its arguments after the optimizer, the message
local function check_cases(cases)
  for _, c in ipairs(cases) do
    local args = c[2]
    assert_contains(errmsg(function() return c[1](sgd(), table.unpack(args, 1, args.n or #args)) end), c[3])
  end
end

describe("lr scheduler settings", function()
  it("refuse NaN, inf and negative factors and rates (S6, S6b)", function()
    check_cases({
      {S.StepLR, {1, {gamma = nan}}, P .. "StepLR: invalid gamma nan (expected [0, inf))"},
      {S.StepLR, {1, {gamma = inf}}, P .. "StepLR: invalid gamma inf (expected [0, inf))"},
      {S.StepLR, {1, {gamma = -0.5}}, P .. "StepLR: invalid gamma -0.5"},
      {S.StepLR, {inf}, P .. "StepLR: step_size must be a positive integer, got inf"},
      {S.MultiStepLR, {{2}, {gamma = nan}}, P .. "MultiStepLR: invalid gamma nan"},
      {S.ExponentialLR, {nan}, P .. "ExponentialLR: invalid gamma nan"},
      {S.ExponentialLR, {-inf}, P .. "ExponentialLR: invalid gamma -inf"},
      {S.CosineAnnealingLR, {10, {eta_min = -1}}, P .. "CosineAnnealingLR: invalid eta_min -1 (expected [0, inf))"},
      {S.CosineAnnealingLR, {10, {eta_min = nan}}, P .. "CosineAnnealingLR: invalid eta_min nan"},
      {S.CosineAnnealingWarmRestarts, {10, {eta_min = nan}}, P .. "CosineAnnealingWarmRestarts: invalid eta_min nan"},
      {S.CosineAnnealingWarmRestarts, {10, {eta_min = -0.1}}, P .. "CosineAnnealingWarmRestarts: invalid eta_min -0.1"},
      {S.CosineAnnealingWarmRestarts, {10, {T_mult = inf}}, "T_mult must be an integer >= 1, got inf"},
      {S.LinearLR, {{start_factor = nan}}, P .. "LinearLR: invalid start_factor nan (expected (0, 1])"},
      {S.LinearLR, {{end_factor = nan}}, P .. "LinearLR: invalid end_factor nan (expected [0, 1])"},
      {S.LinearLR, {{end_factor = 1.5}}, P .. "LinearLR: invalid end_factor 1.5 (expected [0, 1])"},
      {S.ConstantLR, {{factor = nan}}, P .. "ConstantLR: invalid factor nan (expected (0, 1])"},
      {S.PolynomialLR, {{power = nan}}, P .. "PolynomialLR: invalid power nan (expected [0, inf))"},
      {S.PolynomialLR, {{power = -1}}, P .. "PolynomialLR: invalid power -1"},
      {S.OneCycleLR, {0.1, {total_steps = 10, pct_start = nan}}, P .. "OneCycleLR: invalid pct_start nan (expected [0, 1])"},
      {S.OneCycleLR, {0.1, {total_steps = 10, div_factor = nan}}, P .. "OneCycleLR: invalid div_factor nan (expected (0, inf))"},
      {S.OneCycleLR, {0.1, {total_steps = 10, final_div_factor = nan}}, P .. "OneCycleLR: invalid final_div_factor nan"},
      {S.OneCycleLR, {0.1, {total_steps = 10, div_factor = inf}}, P .. "OneCycleLR: invalid div_factor inf"},
      {S.OneCycleLR, {-1, {total_steps = 10}}, P .. "OneCycleLR: invalid max_lr -1 (expected [0, inf))"},
      {S.OneCycleLR, {nan, {total_steps = 10}}, P .. "OneCycleLR: invalid max_lr nan"},
      {S.OneCycleLR, {0.1, {total_steps = 10, max_momentum = nan}}, P .. "OneCycleLR: invalid max_momentum nan"},
      {S.CyclicLR, {nan, 0.1}, P .. "CyclicLR: invalid base_lr nan (expected [0, inf))"},
      {S.CyclicLR, {0.01, -0.1}, P .. "CyclicLR: invalid max_lr -0.1"},
      {S.CyclicLR, {0.01, 0.1, {gamma = nan}}, P .. "CyclicLR: invalid gamma nan (expected [0, inf))"},
      {S.CyclicLR, {0.01, 0.1, {step_size_up = inf}}, P .. "CyclicLR: invalid step_size_up inf"},
      {S.ReduceLROnPlateau, {{factor = nan}}, P .. "ReduceLROnPlateau: invalid factor nan (expected [0, 1))"},
      {S.ReduceLROnPlateau, {{threshold = nan}}, P .. "ReduceLROnPlateau: invalid threshold nan (expected [0, inf))"},
      {S.ReduceLROnPlateau, {{min_lr = -1}}, P .. "ReduceLROnPlateau: invalid min_lr -1 (expected [0, inf))"},
      {S.ReduceLROnPlateau, {{eps = -1}}, P .. "ReduceLROnPlateau: invalid eps -1 (expected [0, inf))"},
      {S.ReduceLROnPlateau, {{eps = nan}}, P .. "ReduceLROnPlateau: invalid eps nan"},
    })
    -- per-group values name the group
    assert_contains(errmsg(S.ReduceLROnPlateau, sgd_two_groups(), {min_lr = {0, nan}}),
                    P .. "ReduceLROnPlateau: invalid min_lr[2] nan")
    assert_contains(errmsg(S.OneCycleLR, sgd_two_groups(), {0.1, -0.2}, {total_steps = 10}),
                    P .. "OneCycleLR: invalid max_lr[2] -0.2")
  end)

  it("keep the edges of the valid ranges", function()
    S.StepLR(sgd(), 1, {gamma = 0})
    S.StepLR(sgd(), 1, {gamma = 2})
    S.LinearLR(sgd(), {start_factor = 1, end_factor = 0})
    S.ConstantLR(sgd(), {factor = 1})
    S.PolynomialLR(sgd(), {power = 0})
    S.CosineAnnealingLR(sgd(), 10, {eta_min = 0})
    S.OneCycleLR(sgd(), 0.1, {total_steps = 10, pct_start = 0})
    S.OneCycleLR(sgd(), 0.1, {total_steps = 10, pct_start = 1})
    S.ReduceLROnPlateau(sgd(), {factor = 0, threshold = 0, eps = 0, min_lr = 0})
    S.CyclicLR(sgd(), 0, 0.1, {gamma = 0})
  end)

  it("refuse milestones that are not positive and increasing (S6c)", function()
    assert_contains(errmsg(S.MultiStepLR, sgd(), {-1, 2}),
                    P .. "MultiStepLR: milestones[1] must be a positive integer, got -1")
    assert_contains(errmsg(S.MultiStepLR, sgd(), {0}), "MultiStepLR: milestones[1] must be a positive integer, got 0")
    assert_contains(errmsg(S.MultiStepLR, sgd(), {5, 2}), P .. "MultiStepLR: milestones must be increasing, got {5, 2}")
    assert_contains(errmsg(S.MultiStepLR, sgd(), {2, nan}), "MultiStepLR: milestones[2] is not an integer: nan")
    -- a repeated milestone decays twice there, as PyTorch's Counter; none at all is allowed
    local o = sgd()
    local s = S.MultiStepLR(o, {2, 2}, {gamma = 0.5})
    s:step(); s:step()
    assert.are.same({0.1 * 0.25}, s:get_last_lr())
    S.MultiStepLR(sgd(), {})
    local o2 = sgd()
    local function seq(ms) return S.SequentialLR(o2, {S.LinearLR(o2), S.StepLR(o2, 2), S.StepLR(o2, 3)}, ms) end
    assert_contains(errmsg(seq, {5, 2}), P .. "SequentialLR: milestones must be strictly increasing, got {5, 2}")
    assert_contains(errmsg(seq, {3, 3}), "SequentialLR: milestones must be strictly increasing, got {3, 3}")
    assert_contains(errmsg(seq, {-1, 3}), "SequentialLR: milestones[1] must be a positive integer, got -1")
  end)

  it("refuse a LambdaLR lambda that returns no finite number (S6c, R2)", function()
    assert_contains(errmsg(S.LambdaLR, sgd(), function() return nil end),
                    P .. "LambdaLR: lr_lambda must return a number, got nil (at epoch 0)")
    assert_contains(errmsg(S.LambdaLR, sgd(), function() return "0.5" end),
                    P .. "LambdaLR: lr_lambda must return a number, got string")
    local s = S.LambdaLR(sgd(), function(e) return e == 2 and nan or 1 end)
    s:step()
    assert_contains(errmsg(s.step, s), P .. "LambdaLR: lr_lambda must return a finite number, got nan (at epoch 2)")
    assert_contains(errmsg(S.LambdaLR, sgd_two_groups(), {function() return 1 end, function() return inf end}),
                    P .. "LambdaLR: lr_lambda[2] must return a finite number, got inf (at epoch 0)")
    -- a callable table is one function for every group; negative factors stay PyTorch's
    local c = S.LambdaLR(sgd_two_groups(), setmetatable({}, {__call = function(_, e) return -1 - e end}))
    assert.are.same({-0.1, -0.02}, c:get_last_lr())
    assert.is_nil(c:state_dict()._distinct)
  end)
end)

describe("lr scheduler arguments", function()
  it("name a misspelt key of the options-table form (U1)", function()
    assert_contains(errmsg(S.StepLR, sgd(), {step_sze = 2}),
                    P .. "StepLR: unknown option 'step_sze' (valid: gamma, last_epoch, step_size)")
    assert_contains(errmsg(S.ExponentialLR, sgd(), {gamm = 0.9}),
                    P .. "ExponentialLR: unknown option 'gamm' (valid: gamma, last_epoch)")
    assert_contains(errmsg(S.MultiStepLR, sgd(), {milestone = {2}}), "MultiStepLR: unknown option 'milestone'")
    assert_contains(errmsg(S.CosineAnnealingLR, sgd(), {Tmax = 3}), "CosineAnnealingLR: unknown option 'Tmax'")
    assert_contains(errmsg(S.LambdaLR, sgd(), {lambda = function() return 1 end}), "LambdaLR: unknown option 'lambda'")
    assert_contains(errmsg(S.OneCycleLR, sgd(), {maxlr = 0.1, total_steps = 3}), "OneCycleLR: unknown option 'maxlr'")
    assert_contains(errmsg(S.CyclicLR, sgd(), {base_lr = 0.01, max_lrr = 0.1}), "CyclicLR: unknown option 'max_lrr'")
    assert_contains(errmsg(S.CosineAnnealingWarmRestarts, sgd(), {T0 = 3}),
                    "CosineAnnealingWarmRestarts: unknown option 'T0'")
    local o = sgd()
    assert_contains(errmsg(S.SequentialLR, o, {schedulers = {S.StepLR(o, 2)}, milestone = {}}),
                    "SequentialLR: unknown option 'milestone' (valid: last_epoch, milestones, schedulers)")
    assert_contains(errmsg(S.StepLR, sgd(), {gamma = 0.5}), P .. "StepLR: missing required argument step_size")
    -- the table form itself still works; a list is a required argument
    assert.are.same({0.1}, S.StepLR(sgd(), {step_size = 2, gamma = 0.5}):get_last_lr())
    assert.are.same({0.1}, S.CyclicLR(sgd(), {base_lr = 0.1, max_lr = 0.2}):get_last_lr())
    local o2 = sgd()
    S.SequentialLR(o2, {schedulers = {S.StepLR(o2, 2), S.StepLR(o2, 3)}, milestones = {3}})
    assert.are.same({3, 5}, S.MultiStepLR(sgd(), {3, 5}).milestones)
  end)

  it("refuse extra arguments and a required one given twice", function()
    assert_contains(errmsg(S.StepLR, sgd(), 2, {}, 5),
                    P .. "StepLR: takes StepLR(optimizer, step_size[, options]) only, got an extra argument #4: 5")
    assert_contains(errmsg(S.LinearLR, sgd(), {}, "x"),
                    P .. "LinearLR: takes LinearLR(optimizer[, options]) only, got an extra argument #3: \"x\"")
    assert_contains(errmsg(S.CyclicLR, sgd(), 0.01, 0.1, {}, true),
                    "CyclicLR: takes CyclicLR(optimizer, base_lr, max_lr[, options]) only, got an extra argument #5: true")
    assert_contains(errmsg(S.ReduceLROnPlateau, sgd(), nil, 3), "ReduceLROnPlateau: takes ReduceLROnPlateau(optimizer[, options]) only")
    assert_contains(errmsg(S.StepLR, sgd(), 2, {step_size = 3}),
                    P .. "StepLR: step_size is given twice: as argument #2 and in the options table")
    -- trailing nils are no arguments
    S.StepLR(sgd(), 2, nil, nil)
  end)

  it("SequentialLR names what is not a scheduler (U5d)", function()
    local o = sgd()
    local s = S.StepLR(o, 2)
    assert_contains(errmsg(S.SequentialLR, o, {5, s}, {1}),
                    P .. "SequentialLR: schedulers[1] must be a learning-rate scheduler, got number")
    assert_contains(errmsg(S.SequentialLR, o, {s, {}}, {1}),
                    "SequentialLR: schedulers[2] must be a learning-rate scheduler, got table")
    assert_contains(errmsg(S.SequentialLR, o, {S.ReduceLROnPlateau(o), s}, {1}),
                    "SequentialLR: schedulers[1] must be a learning-rate scheduler that steps without a metric")
    assert_contains(errmsg(S.SequentialLR, o, {S.StepLR(sgd(), 2), s}, {1}),
                    "SequentialLR: schedulers[1] does not belong to the optimizer passed in")
  end)
end)
