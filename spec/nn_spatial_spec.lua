-- nn_spatial_spec.lua - the spatial layers of issue 20: nd.F's conv1d, conv3d,
-- conv_transpose1d, max_pool1d, avg_pool1d, adaptive_max_pool2d, group_norm,
-- instance_norm, rms_norm, interpolate, pixel_shuffle, pixel_unshuffle, pad,
-- one_hot, dropout2d and their modules. Outputs, indices and gradients
-- against PyTorch's (spec/fixtures/gen/gen_torch_spatial.py wrote the
-- fixtures; float32, relative 1e-5), modules loaded from PyTorch
-- state_dicts, float64 finite-difference gradchecks, every case again on
-- each OpenCL device, and the errors for bad input.
--
--   build/needle-lua spec/run.lua spec/nn_spatial_spec.lua
local nd = require "needle"
local F = nd.F
local nn = nd.nn
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local MF = require "spec.helpers.module_fixtures"
local G = require "spec.helpers.gradcheck"
local D = require "spec.helpers.devices"
local A = require("spec.helpers.assertions").bind(assert)
local C = G.bind(assert)

local errmsg, assert_contains = A.errmsg, A.assert_contains

local fixtures = X.load("torch_spatial")

-- the needle call of each fixture case (c.args: PyTorch's positional
-- arguments after the tensors; c.options: its keyword arguments, same names)
local CALLS = {
  conv1d = function(c, x, w, b) return F.conv1d(x, w, b, c.options) end,
  conv3d = function(c, x, w, b) return F.conv3d(x, w, b, c.options) end,
  conv_transpose1d = function(c, x, w, b) return F.conv_transpose1d(x, w, b, c.options) end,
  max_pool1d = function(c, x) return F.max_pool1d(x, c.args[1], c.options) end,
  avg_pool1d = function(c, x) return F.avg_pool1d(x, c.args[1], c.options) end,
  adaptive_max_pool2d = function(c, x) return F.adaptive_max_pool2d(x, c.args[1], c.options) end,
  group_norm = function(c, x, w, b) return F.group_norm(x, c.args[1], w, b, c.options.eps) end,
  -- the options-table form
  instance_norm = function(c, x, w, b) return F.instance_norm(x, {weight = w, bias = b, eps = c.options.eps}) end,
  rms_norm = function(c, x, w) return F.rms_norm(x, c.args[1], w, c.options.eps) end,
  interpolate = function(c, x) return F.interpolate(x, c.options) end,
  pixel_shuffle = function(c, x) return F.pixel_shuffle(x, c.args[1]) end,
  pixel_unshuffle = function(c, x) return F.pixel_unshuffle(x, c.args[1]) end,
  pad = function(c, x) return F.pad(x, c.args[1], c.options) end,
}

-- |got - want| <= rtol |want| + atol for every element of a fixture tensor
local function close(what, got, want, rtol, atol)
  MF.close(what, got:to("cpu"), want, rtol, atol)
end

describe("spatial functions against PyTorch", function()
  it("every case: output, indices and gradients", function()
    assert.is_true(#fixtures.functional >= 60)
    local seen = {}
    for _, c in ipairs(fixtures.functional) do
      local call = assert(CALLS[c.fn], "no needle call for " .. c.fn)
      seen[c.fn] = true
      X.check_case(c.name, c, function(...) return call(c, ...) end, {
        after_output = function(_, indices)
          if c.indices then X.close(c.name .. " indices", indices, c.indices) end
        end,
      })
    end
    for fn in pairs(CALLS) do assert.is_true(seen[fn], fn .. " has no fixture case") end
  end)

  it("one_hot: 1-based labels, num_classes given or inferred", function()
    for _, c in ipairs(fixtures.one_hot) do
      local labels = MF.tensor(c.labels)
      local got = c.num_classes == -1 and F.one_hot(labels) or F.one_hot(labels, c.num_classes)
      assert.are.equal("int64", got.dtype)
      close("one_hot", got, c.output)
      close("one_hot (options table)", F.one_hot(labels, {num_classes = c.num_classes}), c.output)
    end
    assert.are.same({{0, 1}, {1, 0}}, F.one_hot({2, 1}):totable()) -- a Lua table of labels
  end)
end)

-- the needle module of each module fixture
local MODULES = {
  conv1d_groups = function() return nn.Conv1d(4, 6, 3, {stride = 2, padding = 1, groups = 2}) end,
  conv1d_same_reflect = function()
    return nn.Conv1d(3, 4, 4, {padding = "same", dilation = 2, padding_mode = "reflect"})
  end,
  conv1d_circular = function() return nn.Conv1d(3, 2, 3, {padding = 2, padding_mode = "circular", bias = false}) end,
  conv1d_replicate = function() return nn.Conv1d(2, 3, 3, {stride = 2, padding = 1, padding_mode = "replicate"}) end,
  conv3d_groups = function() return nn.Conv3d(4, 6, {3, 2, 3}, {stride = {2, 1, 2}, padding = 1, groups = 2}) end,
  conv3d_same_replicate = function() return nn.Conv3d(2, 3, 2, {padding = "same", padding_mode = "replicate"}) end,
  conv_transpose1d = function()
    return nn.ConvTranspose1d(4, 6, 3, {stride = 2, padding = 1, output_padding = 1, groups = 2})
  end,
  max_pool1d = function() return nn.MaxPool1d(3, {stride = 2, padding = 1}) end,
  avg_pool1d = function() return nn.AvgPool1d(2) end,
  adaptive_max_pool2d = function() return nn.AdaptiveMaxPool2d({3, 2}) end,
  group_norm = function() return nn.GroupNorm(3, 6) end,
  instance_norm2d_tracked_train = function()
    return nn.InstanceNorm2d(3, {affine = true, track_running_stats = true, momentum = 0.2})
  end,
  instance_norm2d_unbatched = function() return nn.InstanceNorm2d(3) end,
  rms_norm = function() return nn.RMSNorm({3, 4}, {eps = 1e-5}) end,
  upsample_bilinear = function() return nn.Upsample({scale_factor = 2, mode = "bilinear"}) end,
  upsample_nearest_size = function() return nn.Upsample({size = {5, 3}}) end,
  pixel_shuffle = function() return nn.PixelShuffle(2) end,
  pixel_unshuffle = function() return nn.PixelUnshuffle(2) end,
}
MODULES.instance_norm2d_tracked_eval = MODULES.instance_norm2d_tracked_train

describe("spatial modules against PyTorch", function()
  it("load PyTorch's state_dict by name; outputs, gradients and running statistics match", function()
    assert.are.equal(19, #fixtures.modules)
    for _, c in ipairs(fixtures.modules) do
      local build = assert(MODULES[c.name], "no needle module for " .. c.name)
      MF.run(c, build(), function(m, x) return m(x) end)
    end
  end)

  it("nd.convert loads the same state_dicts; state_dict round-trips", function()
    for _, c in ipairs(fixtures.modules) do
      local m = MODULES[c.name]()
      nd.convert.load_state_dict(m, MF.state_dict(c))
      local again = MODULES[c.name]()
      again:load_state_dict(m:state_dict())
      for k, v in pairs(m:state_dict()) do
        assert.are.same(v:totable(), again:state_dict()[k]:totable(), c.name .. " " .. k)
      end
      for _, kv in ipairs(c.state) do close(c.name .. " " .. kv[1], again:state_dict()[kv[1]]:to("float32"), kv[2]) end
    end
  end)

  it("initialise weights as PyTorch: kaiming_uniform(a = sqrt(5)), bias U(+-1/sqrt(fan_in))", function()
    nd.manual_seed(61)
    local layers = {
      conv1d = {nn.Conv1d(64, 128, 5), 64 * 5},
      conv3d = {nn.Conv3d(16, 32, 3), 16 * 27},
      conv_transpose1d = {nn.ConvTranspose1d(64, 32, 4), 32 * 4},
    }
    -- needle's n draws against PyTorch's (fixtures.init: statistics of the same
    -- layers' tensors under torch's RNG; where the fixture has none, U(-bound,
    -- bound)'s own: mean 0, std bound / sqrt(3)). Statistical tolerances: the
    -- sample std of n uniform draws has a relative standard error of about
    -- sqrt(0.2 / n), the mean a standard error of std / sqrt(n), and two
    -- independent samples differ by sqrt(2) of those: allow 4. The gap between
    -- the largest draw and the bound is about exponential with mean 2 * bound / n:
    -- allow 10 means.
    local function check(what, t, bound, want)
      want = want or {mean = 0, std = bound / math.sqrt(3)}
      t = t:to("float64")
      local n = t:numel()
      local lo, hi, mean, std = t:min():item(), t:max():item(), t:mean():item(), t:std():item()
      assert.is_true(lo >= -bound and hi <= bound, what .. ": outside +-" .. bound)
      assert.is_true(bound - hi < 20 * bound / n, what .. ": max " .. hi .. " far below the bound " .. bound)
      assert.is_true(lo + bound < 20 * bound / n, what .. ": min " .. lo .. " far above -" .. bound)
      assert.is_true(math.abs(std - want.std) <= 4 * math.sqrt(0.4 / n) * want.std,
                     ("%s: std %.6g, PyTorch's %.6g"):format(what, std, want.std))
      assert.is_true(math.abs(mean - want.mean) <= 4 * math.sqrt(2 / n) * want.std,
                     ("%s: mean %.6g, PyTorch's %.6g"):format(what, mean, want.mean))
    end
    for name, l in pairs(layers) do
      local m, fan_in = l[1], l[2]
      local bound = 1 / math.sqrt(fan_in)
      -- PyTorch's own draws reach the same bound
      local want = fixtures.init[name .. "_weight"]
      assert.is_true(math.abs(want.max - bound) < 0.02 * bound, name .. " PyTorch's bound")
      check(name .. " weight", m.weight, bound, want)
      check(name .. " bias", m.bias, bound, fixtures.init[name .. "_bias"])
    end
    assert.is_not_nil(fixtures.init.conv1d_bias) -- (the bias case with PyTorch's numbers)
  end)
end)

describe("spatial functions: float64 gradchecks", function()
  local leaf = G.leaf

  it("conv1d, conv3d, conv_transpose1d (strides, groups, dilation, 'same')", function()
    nd.manual_seed(62)
    C.check(function(x, w, b) return F.conv1d(x, w, b, {stride = 2, padding = 1, dilation = 2, groups = 2}) end,
            {leaf({2, 4, 7}), leaf({4, 2, 3}), leaf({4})})
    C.check(function(x, w) return F.conv1d(x, w, {padding = "same"}) end, {leaf({1, 2, 6}), leaf({3, 2, 4})})
    C.check(function(x, w, b) return F.conv3d(x, w, b, {stride = {2, 1, 1}, padding = {1, 0, 1}, dilation = {1, 2, 1},
                                                         groups = 2}) end,
            {leaf({1, 4, 4, 3, 3}), leaf({2, 2, 2, 2, 2}), leaf({2})})
    C.check(function(x, w) return F.conv3d(x, w, nil, {padding = "same"}) end, {leaf({2, 3, 3, 2}), leaf({1, 2, 2, 1, 2})})
    C.check(function(x, w, b) return F.conv_transpose1d(x, w, b, {stride = 2, padding = 1, output_padding = 1,
                                                                   groups = 2}) end,
            {leaf({1, 4, 4}), leaf({4, 3, 3}), leaf({6})})
    C.check2(function(x, w) return F.conv1d(x, w, nil, {padding = 1}) end, {leaf({1, 2, 5}), leaf({2, 2, 3})})
  end)

  it("max_pool1d, avg_pool1d, adaptive_max_pool2d (equal and unequal windows)", function()
    nd.manual_seed(63)
    C.check(function(x) return F.max_pool1d(x, 3, {stride = 2, padding = 1, dilation = 1}) end, {leaf({2, 2, 9})})
    C.check(function(x) return F.avg_pool1d(x, 3, {stride = 2, padding = 1, count_include_pad = false,
                                                   ceil_mode = true}) end, {leaf({2, 2, 8})})
    C.check(function(x) return F.adaptive_max_pool2d(x, {3, 2}) end, {leaf({1, 2, 7, 5})})
    C.check(function(x) return F.adaptive_max_pool2d(x, 2) end, {leaf({2, 4, 6})})
  end)

  it("group_norm, instance_norm, rms_norm (with their weights)", function()
    nd.manual_seed(64)
    C.check(function(x, w, b) return F.group_norm(x, 2, w, b) end, {leaf({2, 4, 3}), leaf({4}), leaf({4})})
    C.check(function(x, w, b) return F.instance_norm(x, nil, nil, w, b) end, {leaf({2, 3, 2, 3}), leaf({3}), leaf({3})})
    C.check(function(x, w) return F.rms_norm(x, {2, 3}, w) end, {leaf({2, 2, 3}), leaf({2, 3})})
    C.check2(function(x, w) return F.rms_norm(x, 3, {weight = w, eps = 1e-3}) end, {leaf({2, 3}), leaf({3})})
    C.check2(function(x) return F.group_norm(x, 1) end, {leaf({2, 2, 3})})
  end)

  it("interpolate (every mode), pixel_shuffle, pixel_unshuffle, pad (every mode)", function()
    nd.manual_seed(65)
    local x4 = leaf({1, 2, 3, 4})
    C.check(function(x) return F.interpolate(x, {size = {5, 7}}) end, {x4})
    C.check(function(x) return F.interpolate(x, {scale_factor = 0.6, mode = "nearest-exact"}) end, {leaf({1, 1, 5, 6})})
    C.check(function(x) return F.interpolate(x, {size = {5, 3}, mode = "bilinear"}) end, {x4})
    C.check(function(x) return F.interpolate(x, {scale_factor = 1.5, mode = "bilinear", align_corners = true}) end, {x4})
    C.check(function(x) return F.interpolate(x, {size = 7, mode = "linear"}) end, {leaf({2, 2, 4})})
    C.check(function(x) return F.interpolate(x, {size = {3, 2, 5}, mode = "trilinear"}) end, {leaf({1, 1, 2, 3, 3})})
    C.check(function(x) return F.pixel_shuffle(x, 2) end, {leaf({2, 8, 2, 3})})
    C.check(function(x) return F.pixel_unshuffle(x, 2) end, {leaf({2, 2, 4, 2})})
    for _, mode in ipairs({"constant", "reflect", "replicate", "circular"}) do
      C.check(function(x) return F.pad(x, {2, 1, 1, 2}, {mode = mode}) end, {leaf({1, 2, 3, 4})})
    end
  end)
end)

describe("spatial functions on OpenCL", function()
  if D.pending_without_opencl(pending, "spatial functions on OpenCL") then return end

  it("every fixture case: output, indices and gradients on each device", function()
    for _, dev in ipairs(D.opencl()) do
      for _, c in ipairs(fixtures.functional) do
        local inputs = {}
        for i, t in ipairs(c.inputs) do
          inputs[i] = X.tensor(t):to(dev)
          inputs[i].requires_grad = true
        end
        local out, indices = CALLS[c.fn](c, table.unpack(inputs))
        local what = ("%s on %s"):format(c.name, dev)
        assert.are.equal(dev, out.device, what)
        close(what .. " output", out, c.output, 1e-4, 1e-5)
        if c.indices then close(what .. " indices", indices, c.indices, 0, 0) end
        local grads = nd.grad((out * X.tensor(c.w):to(dev)):sum(), inputs)
        for i = 1, #inputs do close(what .. " grad " .. i, grads[i], c.grads[i], 1e-4, 1e-5) end
      end
      for _, c in ipairs(fixtures.one_hot) do
        close("one_hot on " .. dev, F.one_hot(MF.tensor(c.labels):to(dev), c.num_classes), c.output, 0, 0)
      end
    end
  end)

  it("modules built on a device (running statistics updated there) and a float64 gradient there", function()
    nd.manual_seed(66)
    for _, dev in ipairs(D.opencl()) do
      local m = nn.InstanceNorm2d(3, {affine = true, track_running_stats = true, device = dev})
      local x = nd.randn({2, 3, 4, 4})
      local y = m(x:to(dev))
      local ref = nn.InstanceNorm2d(3, {affine = true, track_running_stats = true})
      assert.is_true((y:to("cpu") - ref(x)):abs():max():item() < 1e-5)
      assert.are.equal(dev, m.running_mean.device)
      assert.is_true((m.running_mean:to("cpu") - ref.running_mean):abs():max():item() < 1e-6)
      local conv = nn.Conv3d(2, 3, 2, {padding = "same", padding_mode = "circular"})
      local xc = nd.randn({1, 2, 3, 4, 3})
      local want = conv(xc)
      conv:to(dev)
      assert.is_true((conv(xc:to(dev)):to("cpu") - want):abs():max():item() < 1e-5)
      assert_contains(errmsg(F.conv1d, nd.randn({1, 2, 5}), nd.randn({2, 2, 3}, {device = dev})),
                      ("needle.conv1d: input (on cpu) and weight (on %s) must be on the same device"):format(dev))
      assert_contains(errmsg(F.group_norm, nd.randn({1, 2, 5}, {device = dev}), 1, nd.ones({2})),
                      ("needle.group_norm: input (on %s) and weight (on cpu) must be on the same device"):format(dev))
      local drop = nn.Dropout2d(0.5)(nd.ones({2, 8, 3, 3}, {device = dev}))
      assert.are.equal(dev, drop.device)
    end
  end)

  it("float64 gradchecks with the forward and the backward on each device", function()
    nd.manual_seed(70)
    local leaf = G.leaf
    -- fn computed on dev for gradcheck's cpu leaves (the transfers pass gradients)
    local function on(dev, fn)
      return function(...)
        local args = {...}
        for i, a in ipairs(args) do args[i] = a:to(dev) end
        local out = fn(table.unpack(args))
        assert.are.equal(dev, out.device)
        return out:to("cpu")
      end
    end
    -- the devices first: pending() ends the test, so it comes after every
    -- float64 device has run, naming those without float64
    local fp64_devs, no_fp64 = {}, {}
    for _, dev in ipairs(D.opencl()) do
      table.insert(D.fp64(dev) and fp64_devs or no_fp64, dev)
    end
    for _, dev in ipairs(fp64_devs) do
      C.check(on(dev, function(x, w) return F.conv1d(x, w, {padding = "same", dilation = 2}) end),
              {leaf({1, 2, 6}), leaf({3, 2, 2})})
      C.check(on(dev, function(x, w, b) return F.conv3d(x, w, b, {stride = {2, 1, 1}, padding = 1}) end),
              {leaf({1, 2, 3, 3, 2}), leaf({2, 2, 2, 2, 2}), leaf({2})})
      C.check(on(dev, function(x, w) return F.conv_transpose1d(x, w, nil, {stride = 2}) end),
              {leaf({1, 2, 3}), leaf({2, 2, 3})})
      C.check(on(dev, function(x) return F.max_pool1d(x, 2) + F.avg_pool1d(x, 2) end), {leaf({1, 2, 6})})
      C.check(on(dev, function(x) return F.adaptive_max_pool2d(x, {2, 3}) end), {leaf({1, 2, 5, 4})})
      C.check(on(dev, function(x, w, b) return F.group_norm(x, 2, w, b) + F.instance_norm(x) end),
              {leaf({2, 4, 3}), leaf({4}), leaf({4})})
      C.check(on(dev, function(x, w) return F.rms_norm(x, 3, w) end), {leaf({2, 3}), leaf({3})})
      C.check(on(dev, function(x) return F.interpolate(x, {size = {4, 5}, mode = "bilinear"}) end),
              {leaf({1, 2, 3, 2})})
      C.check(on(dev, function(x) return F.interpolate(x, {scale_factor = 1.5}) end), {leaf({1, 2, 3, 2})})
      C.check(on(dev, function(x) return F.pixel_shuffle(F.pad(x, {1, 1, 2, 0}, "reflect"), 2) end),
              {leaf({1, 4, 3, 2})})
    end
    if #no_fp64 > 0 then pending(table.concat(no_fp64, ", ") .. ": no float64 (cl_khr_fp64)") end
  end)
end)

describe("dropout2d", function()
  it("zeroes whole channels with probability p and scales the rest by 1 / (1 - p)", function()
    nd.manual_seed(67)
    local x = nd.ones({16, 32, 3, 3})
    local y = F.dropout2d(x, 0.25)
    local per_channel = y:sum({3, 4}) / 9 -- a channel is all 0 or all 1 / 0.75
    local kept = per_channel:gt(0):to("float32")
    assert.is_true(((per_channel - kept / 0.75):abs()):max():item() < 1e-6)
    local frac = kept:mean():item()
    assert.is_true(frac > 0.70 and frac < 0.80, "kept fraction " .. frac)
    -- (N, C, L): one draw per (sample, channel), as PyTorch's dropout2d on 3-D input
    local z = F.dropout2d(nd.ones({8, 16, 5}), 0.5):sum(3)
    assert.is_true((z * (z - 10)):abs():max():item() < 1e-5)
    assert.are.equal(x, F.dropout2d(x, 0.5, false))
    assert.are.same(x:totable(), F.dropout2d(x, 0):totable())
    assert.are.equal(0, F.dropout2d(x, 1):abs():sum():item())
    local m = nn.Dropout2d(0.3)
    m:eval()
    assert.are.equal(x, m(x))
    assert.are.equal("Dropout2d(p=0.3)", tostring(m))
  end)
end)

describe("spatial functions and modules: details", function()
  it("interpolate's nearest follows PyTorch's float32 index rule; modes agree where they must", function()
    -- 23 * float32(14 / 46) is just under 7: PyTorch (and needle) read pixel 7 (1-based), not 8
    local x = nd.arange(14):to("float32"):reshape({1, 1, 14})
    assert.are.equal(6, F.interpolate(x, {size = 46}):totable()[1][1][24])
    -- scale 2 nearest repeats each pixel; bilinear with align_corners keeps the corners
    local y = nd.randn({1, 2, 3, 4})
    local up = F.interpolate(y, {scale_factor = 2})
    assert.are.same(y:totable(), up[{":", ":", {1, 6, 2}, {1, 8, 2}}]:totable())
    local b = F.interpolate(y, {size = {7, 9}, mode = "bilinear", align_corners = true})
    assert.are.same(y[{":", ":", 1, 1}]:totable(), b[{":", ":", 1, 1}]:totable())
    assert.are.same(y[{":", ":", 3, 4}]:totable(), b[{":", ":", 7, 9}]:totable())
    -- size as the second argument, as PyTorch's positional size
    assert.are.same(F.interpolate(y, {5, 6}):totable(), F.interpolate(y, {size = {5, 6}}):totable())
  end)

  it("pad: negative sizes crop in every mode; the two calling forms agree", function()
    local x = nd.randn({1, 2, 5})
    for _, mode in ipairs({"constant", "reflect", "replicate", "circular"}) do
      assert.are.same(x[{":", ":", {2, 4}}]:totable(), F.pad(x, {-1, -1}, {mode = mode}):totable(), mode)
    end
    assert.are.same(F.pad(x, {2, 1}, "reflect"):totable(), F.pad(x, {2, 1}, {mode = "reflect"}):totable())
    assert.are.same(F.pad(x, {1, 1}, "constant", 3):totable(), F.pad(x, {1, 1}, {value = 3}):totable())
  end)

  it("conv3d equals a sum of conv2d over the kernel's depth (an independent composition)", function()
    nd.manual_seed(68)
    local x, w, b = nd.randn({2, 3, 5, 4, 4}), nd.randn({4, 3, 2, 3, 3}), nd.randn({4})
    local y = F.conv3d(x, w, b, {padding = {0, 1, 1}})
    for d = 1, 4 do
      local want = F.conv2d(x[{":", ":", d}], w[{":", ":", 1}], b, {padding = 1}) +
                   F.conv2d(x[{":", ":", d + 1}], w[{":", ":", 2}], nil, {padding = 1})
      assert.is_true((y[{":", ":", d}] - want):abs():max():item() < 1e-4)
    end
  end)

  it("InstanceNorm2d: running statistics only when tracked, momentum = false leaves them", function()
    nd.manual_seed(69)
    local x = nd.randn({4, 3, 5, 5}) * 2 + 1
    local m = nn.InstanceNorm2d(3, {track_running_stats = true, momentum = false})
    m(x)
    assert.are.same({0, 0, 0}, m.running_mean:totable())
    assert.are.equal("InstanceNorm2d(3, eps=1e-05, momentum=None, affine=false, track_running_stats=true)", tostring(m))
    local plain = nn.InstanceNorm2d(3)
    assert.are.same({}, MF.sorted_keys(plain))
    -- a channel count other than num_features is accepted without parameters (PyTorch warns)
    assert.are.same({2, 5, 3, 3}, plain(nd.randn({2, 5, 3, 3})).shape)
    -- eval with tracked statistics uses them: the output is (x - mean) / sqrt(var + eps)
    local t = nn.InstanceNorm2d(3, {track_running_stats = true})
    t:eval()
    assert.is_true((t(x) - x / math.sqrt(1 + 1e-5)):abs():max():item() < 1e-5)
  end)

  it("RMSNorm's default eps is the input dtype's machine epsilon; keys and repr as PyTorch", function()
    local m = nn.RMSNorm(4, {dtype = "float64"})
    local x = nd.tensor({{1e-9, 0, 0, 0}}, {dtype = "float64"})
    -- x / sqrt(x^2 / 4 + 2^-52): the eps dominates
    local want = 1e-9 / math.sqrt(1e-18 / 4 + 2 ^ -52)
    assert.is_true(math.abs(m(x):totable()[1][1] - want) < 1e-12 * want)
    assert.are.same({"weight"}, MF.sorted_keys(m))
    assert.are.same({}, MF.sorted_keys(nn.RMSNorm(4, {elementwise_affine = false})))
    assert.are.equal("RMSNorm({4}, eps=None, elementwise_affine=true)", tostring(m))
  end)

  it("module reprs and attributes follow PyTorch's names", function()
    assert.are.equal("Conv1d(4, 6, kernel_size={3}, stride={1}, padding='same', padding_mode='reflect')",
                     tostring(nn.Conv1d(4, 6, 3, {padding = "same", padding_mode = "reflect"})))
    assert.are.equal("Conv3d(2, 4, kernel_size={3, 1, 2}, stride={2, 1, 1}, padding={1, 0, 0}, groups=2, bias=false)",
                     tostring(nn.Conv3d(2, 4, {3, 1, 2}, {stride = {2, 1, 1}, padding = {1, 0, 0}, groups = 2,
                                                          bias = false})))
    assert.are.equal("ConvTranspose1d(4, 2, kernel_size={3}, stride={2}, output_padding={1})",
                     tostring(nn.ConvTranspose1d(4, 2, 3, {stride = 2, output_padding = 1})))
    assert.are.equal("GroupNorm(2, 4, eps=1e-05, affine=true)", tostring(nn.GroupNorm(2, 4)))
    assert.are.equal("Upsample(size={4, 5}, mode='bilinear', align_corners=true)",
                     tostring(nn.Upsample({size = {4, 5}, mode = "bilinear", align_corners = true})))
    assert.are.same({2, 2, 3}, nn.Conv1d(4, 2, 3, {groups = 2}).weight.shape)
    assert.are.same({4, 1, 3}, nn.ConvTranspose1d(4, 2, 3, {groups = 2}).weight.shape)
    local mp = nn.MaxPool1d(2, {return_indices = true})
    local out, idx = mp(nd.tensor({{{1, 3, 2, 0}}}))
    assert.are.same({{{3, 2}}}, out:totable())
    assert.are.same({{{2, 3}}}, idx:totable())
  end)
end)

describe("spatial functions: errors name the function, the shapes and what was expected", function()
  local x3, w3 = nd.randn({2, 3, 9}), nd.randn({6, 3, 3})

  it("conv1d, conv3d, conv_transpose1d", function()
    assert_contains(errmsg(F.conv1d, nd.randn({2, 3, 5, 5}), w3),
                    "needle.conv1d: expected input of shape (N, C, L) or (C, L), got {2,3,5,5}")
    assert_contains(errmsg(F.conv1d, x3, nd.randn({6, 4, 3})),
                    "needle.conv1d: input has 3 channels but weight expects 4 (weight shape {6,4,3}, groups 1)")
    assert_contains(errmsg(F.conv1d, x3, nd.randn({6, 3, 3}, {dtype = "float64"})),
                    "needle.conv1d: input (float32) and weight (float64) must have the same dtype")
    assert_contains(errmsg(F.conv1d, x3, w3, nd.randn({5})), "needle.conv1d: bias must have shape {6} (out_channels), got {5}")
    local ints = nd.ones({2, 3, 9}, {dtype = "int64"})
    assert_contains(errmsg(F.conv1d, ints, w3), "needle.conv1d: expected a float32 or float64 input, got int64")
    assert_contains(errmsg(F.max_pool1d, ints, 2), "needle.max_pool1d: expected a float32 or float64 input, got int64")
    assert_contains(errmsg(F.group_norm, ints, 3), "needle.group_norm: expected a float32 or float64 input, got int64")
    assert_contains(errmsg(F.interpolate, ints, {size = 4, mode = "linear"}),
                    "needle.interpolate: expected a float32 or float64 input, got int64")
    assert_contains(errmsg(F.conv1d, x3, w3, {stride = 2, padding = "same"}),
                    "needle.conv1d: padding='same' is not supported for strided convolutions (stride {2})")
    assert_contains(errmsg(F.conv1d, x3, w3, {padding = "full"}),
                    "needle.conv1d: padding must be 'valid', 'same', an integer or a list of 1, got 'full'")
    assert_contains(errmsg(F.conv1d, nd.randn({1, 3, 2}), w3, {dilation = 2}),
                    "needle.conv1d: kernel extent 5 (size 3, dilation 2) is larger than the padded input (2)")
    assert_contains(errmsg(F.conv1d, x3, w3, {stride = 0}),
                    "needle.conv1d: stride must be an integer >= 1 (or a list of one), got 0")
    assert_contains(errmsg(F.conv1d, x3, w3, {groups = 2}),
                    "needle.conv1d: input has 3 channels but weight expects 6 (weight shape {6,3,3}, groups 2)")
    assert_contains(errmsg(F.conv1d, x3, w3, {stide = 2}),
                    "needle.conv1d: unknown option 'stide' (valid: dilation, groups, padding, stride)")
    assert_contains(errmsg(F.conv3d, nd.randn({1, 2, 3, 3, 3}), nd.randn({2, 2, 3, 3})),
                    "needle.conv3d: expected weight of shape (out_channels, in_channels/groups, kd, kh, kw) " ..
                    "with 3 kernel dims, got {2,2,3,3}")
    assert_contains(errmsg(F.conv3d, nd.randn({1, 2, 3, 3, 3}), nd.randn({2, 2, 3, 3, 3}), nil, {padding = {1, 1}}),
                    "needle.conv3d: padding must be an integer >= 0 or a list of 3 of them, got {1,1}")
    assert_contains(errmsg(F.conv_transpose1d, x3, nd.randn({3, 2, 3}), nil, {stride = 2, output_padding = 2}),
                    "needle.conv_transpose1d: output_padding {2} must be smaller than stride {2} or dilation {1}")
    assert_contains(errmsg(F.conv_transpose1d, x3, nd.randn({4, 2, 3})),
                    "needle.conv_transpose1d: input has 3 channels but weight expects 4")
  end)

  it("the pools", function()
    assert_contains(errmsg(F.max_pool1d, x3, 3, {padding = 2}),
                    "needle.max_pool1d: padding 2 must be at most half of kernel_size 3")
    assert_contains(errmsg(F.max_pool1d, nd.randn({1, 1, 2}), 3),
                    "needle.max_pool1d: input {1,1,2} is too short for kernel_size 3 (dilation 1, padding 0)")
    assert_contains(errmsg(F.max_pool1d, x3), "needle.max_pool1d: kernel_size is required")
    assert_contains(errmsg(F.avg_pool1d, nd.randn({9}), 3),
                    "needle.avg_pool1d: expected input of shape (N, C, L) or (C, L), got {9}")
    assert_contains(errmsg(F.avg_pool1d, x3, 3, {dilation = 2}),
                    "needle.avg_pool1d: unknown option 'dilation' (valid: ceil_mode, count_include_pad, padding, stride)")
    assert_contains(errmsg(F.adaptive_max_pool2d, nd.randn({3, 9}), 2),
                    "needle.adaptive_max_pool2d: expected input of shape (N, C, H, W) or (C, H, W), got {3,9}")
    assert_contains(errmsg(F.adaptive_max_pool2d, nd.randn({1, 2, 3, 3}), {0, 2}),
                    "needle.adaptive_max_pool2d: output_size must be an integer >= 1 or a list of 2 of them, got {0,2}")
  end)

  it("the norms", function()
    local x = nd.randn({2, 6, 3})
    assert_contains(errmsg(F.group_norm, x, 4),
                    "needle.group_norm: the 6 channels of input {2,6,3} are not divisible by num_groups (4)")
    assert_contains(errmsg(F.group_norm, x, 3, nd.ones({3})),
                    "needle.group_norm: weight must have shape {6} (one per channel of input {2,6,3}), got {3}")
    assert_contains(errmsg(F.group_norm, x, 3, {eps = -1}), "needle.group_norm: eps must be a number >= 0, got -1")
    assert_contains(errmsg(F.group_norm, x, 3, {epsilon = 1}),
                    "needle.group_norm: unknown option 'epsilon' (valid: bias, eps, weight)")
    assert_contains(errmsg(F.instance_norm, nd.randn({2, 3, 1})),
                    "needle.instance_norm: expected more than 1 spatial element when using the input statistics, " ..
                    "got input {2,3,1}")
    assert_contains(errmsg(F.instance_norm, nd.randn({2, 3})),
                    "needle.instance_norm: expected input of shape (N, C, *) with at least one spatial dim, got {2,3}")
    assert_contains(errmsg(F.instance_norm, x, nd.zeros({6})),
                    "needle.instance_norm: running_mean and running_var must be given together")
    assert_contains(errmsg(F.instance_norm, x, {use_input_stats = false}),
                    "needle.instance_norm: running_mean and running_var are required when use_input_stats is false")
    assert_contains(errmsg(F.rms_norm, nd.randn({2, 3}), 4),
                    "needle.rms_norm: expected input whose last dims are normalized_shape 4, got {2,3}")
    assert_contains(errmsg(F.rms_norm, nd.randn({2, 3}), {3}, nd.ones({2})),
                    "needle.rms_norm: weight must have shape {3} (normalized_shape), got {2}")
  end)

  it("interpolate, pixel_shuffle, pad, one_hot, dropout2d", function()
    local x = nd.randn({1, 2, 3, 4})
    assert_contains(errmsg(F.interpolate, x, {size = 4, scale_factor = 2}),
                    "needle.interpolate: only one of size and scale_factor may be given")
    assert_contains(errmsg(F.interpolate, x, {mode = "bilinear"}),
                    "needle.interpolate: either size or scale_factor must be given")
    assert_contains(errmsg(F.interpolate, x, {size = 4, mode = "bicubic"}),
                    "needle.interpolate: mode must be 'nearest', 'nearest-exact', 'linear', 'bilinear' or " ..
                    "'trilinear', got 'bicubic'")
    assert_contains(errmsg(F.interpolate, nd.randn({1, 2, 3}), {size = 4, mode = "bilinear"}),
                    "needle.interpolate: mode 'bilinear' expects 4-D input (N, C, H, W), got {1,2,3}")
    assert_contains(errmsg(F.interpolate, x, {size = 4, align_corners = true}),
                    "needle.interpolate: align_corners can only be set with the interpolating modes")
    assert_contains(errmsg(F.interpolate, x, {size = {4}}),
                    "needle.interpolate: size must be an integer >= 1 or a list of 2 of them, got {4}")
    assert_contains(errmsg(F.interpolate, x, {scale_factor = 0.1}),
                    "needle.interpolate: input and output sizes must be greater than 0, got input {1,2,3,4} and " ..
                    "output size {0,0}")
    assert_contains(errmsg(F.interpolate, x, {size = 4, antialias = true}), "needle.interpolate: antialias = true is not supported")
    assert_contains(errmsg(F.pixel_shuffle, nd.randn({1, 6, 2, 2}), 2),
                    "needle.pixel_shuffle: the channel dim (6) of input {1,6,2,2} must be divisible by upscale_factor^2 (4)")
    assert_contains(errmsg(F.pixel_unshuffle, nd.randn({1, 2, 3, 4}), 2),
                    "needle.pixel_unshuffle: the height and width (3, 4) of input {1,2,3,4} must be divisible by " ..
                    "downscale_factor (2)")
    assert_contains(errmsg(F.pixel_shuffle, x, 0), "needle.pixel_shuffle: upscale_factor must be a positive integer, got 0")
    local p = nd.randn({1, 1, 3})
    assert_contains(errmsg(F.pad, p, {3, 0}, "reflect"),
                    "needle.pad: reflect padding (3, 0) of dim 3 must be smaller than its size 3 (input {1,1,3})")
    assert_contains(errmsg(F.pad, p, {4, 0}, "circular"),
                    "needle.pad: circular padding (4, 0) of dim 3 must be at most its size 3 (input {1,1,3})")
    assert_contains(errmsg(F.pad, p, {1}), "needle.pad: pad must be a non-empty list of integers of even length, got {1}")
    assert_contains(errmsg(F.pad, p, {1, 1}, "edge"),
                    "needle.pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got edge")
    assert_contains(errmsg(F.pad, p, {1, 1}, {mode = "reflect", value = 2}), "needle.pad: mode 'reflect' takes no value (got 2)")
    assert_contains(errmsg(F.pad, p, {1, 1, 1, 1, 1, 1}, "replicate"),
                    "needle.pad: mode 'replicate' pads the last 1, 2 or 3 dims of an input with 1 or 2 more dims")
    assert_contains(errmsg(F.pad, p, {1, 1, 1, 1, 1, 1, 1, 1}),
                    "needle.pad: pad {1,1,1,1,1,1,1,1} has 4 pairs, more than the 3 dims of input {1,1,3}")
    assert_contains(errmsg(F.one_hot, {1, 5}, 3),
                    "needle.one_hot: class value 5 is out of range for num_classes 3 (expected 1..3)")
    assert_contains(errmsg(F.one_hot, {1, 2}, 2.5), "needle.one_hot: num_classes must be an integer, got 2.5")
    assert_contains(errmsg(F.dropout2d, x, 1.5), "needle.dropout2d: p must be in [0, 1], got 1.5")
    assert_contains(errmsg(F.dropout2d, x, 0 / 0), "needle.dropout2d: p must be in [0, 1], got")
    assert_contains(errmsg(F.dropout2d, x, {p = 0.5}),
                    "needle.dropout2d: p must be in [0, 1], got a table (dropout2d takes (x, p, training) positionally")
    -- a string or a number is not a boolean (it would count as true)
    assert_contains(errmsg(F.dropout2d, x, 0.5, "no"), "needle.dropout2d: training must be a boolean, got \"no\"")
    assert_contains(errmsg(F.dropout2d, x, 0.5, false, 1),
                    "needle.dropout2d: takes dropout2d(x[, p, training]) only, got an extra argument #4: 1")
    local c = nd.randn({2, 4, 3})
    assert_contains(errmsg(F.instance_norm, c, nd.zeros({4}), nd.ones({4}), nil, nil, true, 2),
                    "needle.instance_norm: momentum must be a number in [0, 1], got 2")
    assert_contains(errmsg(F.instance_norm, c, nd.zeros({4}), nd.ones({4}), nil, nil, true, 0 / 0),
                    "needle.instance_norm: momentum must be a number in [0, 1], got")
    assert_contains(errmsg(F.instance_norm, c, nil, nil, nil, nil, "no"),
                    "needle.instance_norm: use_input_stats must be a boolean, got \"no\"")
    assert_contains(errmsg(F.instance_norm, c, nil, nil, nil, nil, true, 0.1, 1e-5, 3),
                    "needle.instance_norm: takes instance_norm(x[, running_mean, running_var, weight, bias, " ..
                    "use_input_stats, momentum, eps]) or instance_norm(x, {running_mean=, ..., eps=}) only, got an extra argument #9: 3")
    assert_contains(errmsg(F.group_norm, c, 2, nil, nil, 1e-5, 3), "needle.group_norm: takes group_norm(x, num_groups[, " ..
                    "weight, bias, eps]) or group_norm(x, num_groups, {weight=, bias=, eps=}) only, got an extra argument #6: 3")
    assert_contains(errmsg(F.rms_norm, c, 3, nil, 1e-5, 3),
                    "needle.rms_norm: takes rms_norm(x, normalized_shape[, weight, eps]) or rms_norm(x, " ..
                    "normalized_shape, {weight=, eps=}) only, got an extra argument #5: 3")
    -- adaptive_avg_pool2d refuses an empty output size, as adaptive_max_pool2d and nn.AdaptiveAvgPool2d
    local img = nd.randn({1, 2, 5, 5})
    assert_contains(errmsg(F.adaptive_avg_pool2d, img, 0),
                    "needle.adaptive_avg_pool2d: output_size must be an integer >= 1 or a list of 2 of them, got 0")
    assert_contains(errmsg(F.adaptive_avg_pool2d, img, {2, 0}),
                    "needle.adaptive_avg_pool2d: output_size must be an integer >= 1 or a list of 2 of them, got {2,0}")
    assert_contains(errmsg(F.adaptive_avg_pool2d, img, 2, 2),
                    "needle.adaptive_avg_pool2d: takes adaptive_avg_pool2d(x, output_size) only, got an extra argument #3: 2")
    assert.are.same({1, 2, 2, 3}, F.adaptive_avg_pool2d(img, {2, 3}).shape)
    assert_contains(errmsg(F.dropout2d, nd.randn({2, 3}), 0.5),
                    "needle.dropout2d: expected input of shape (N, C, H, W) or (N, C, L), got {2,3}")
  end)

  it("modules: at construction and for a wrong input", function()
    assert_contains(errmsg(nn.Conv1d(4, 6, 3), nd.randn({2, 3, 9})),
                    "needle.nn.Conv1d(4, 6): expected input with 4 channels (N, 4, L) or (4, L), got {2,3,9}")
    assert_contains(errmsg(nn.Conv3d(2, 2, 3), nd.randn({1, 3, 3, 3, 3})),
                    "needle.nn.Conv3d(2, 2): expected input with 2 channels (N, 2, D, H, W) or (2, D, H, W), got {1,3,3,3,3}")
    assert_contains(errmsg(nn.Conv1d, 4, 6, 3, {padding_mode = "mirror"}),
                    "needle.nn.Conv1d: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got mirror")
    assert_contains(errmsg(nn.ConvTranspose1d, 4, 6, 3, {padding_mode = "reflect"}),
                    "needle.nn.ConvTranspose1d: padding_mode must be 'zeros', got reflect")
    assert_contains(errmsg(nn.Conv1d, 4, 6, 3, {groups = 4}),
                    "needle.nn.Conv1d: in_channels (4) and out_channels (6) must be divisible by groups (4)")
    assert_contains(errmsg(nn.Conv3d, 4, 6, {3, 3}),
                    "needle.nn.Conv3d: kernel_size must be an integer >= 1 or a list of 3 of them, got {3,3}")
    assert_contains(errmsg(nn.Conv1d, 4, 6, 3, {stride = 2, padding = "same"}),
                    "needle.nn.Conv1d: padding='same' is not supported for strided convolutions (stride {2})")
    assert_contains(errmsg(nn.GroupNorm, 4, 6), "needle.nn.GroupNorm: num_channels (6) must be divisible by num_groups (4)")
    assert_contains(errmsg(nn.GroupNorm(3, 6), nd.randn({2, 4, 3})),
                    "needle.nn.GroupNorm(3, 6): expected input with 6 channels (N, 6, *), got {2,4,3}")
    assert_contains(errmsg(nn.InstanceNorm2d(3, {affine = true}), nd.randn({2, 4, 3, 3})),
                    "needle.nn.InstanceNorm2d(3): expected input with 3 channels (N, 3, H, W) or (3, H, W), got {2,4,3,3}")
    assert_contains(errmsg(nn.RMSNorm({3, 4}), nd.randn({2, 4, 3})),
                    "needle.nn.RMSNorm({3, 4}): expected input with last dims {3,4}, got {2,4,3}")
    assert_contains(errmsg(nn.Upsample, {mode = "bilinear"}), "needle.nn.Upsample: either size or scale_factor must be given")
    assert_contains(errmsg(nn.Upsample, {scale_factor = 2, align_corners = false}),
                    "needle.nn.Upsample: align_corners can only be set with the interpolating modes")
    assert_contains(errmsg(nn.PixelShuffle, 0), "needle.nn.PixelShuffle: upscale_factor must be a positive integer, got 0")
    assert_contains(errmsg(nn.MaxPool1d(3), nd.randn({2, 3, 4, 4})),
                    "needle.nn.MaxPool1d(3): expected input of shape (N, C, L) or (C, L), got {2,3,4,4}")
    assert_contains(errmsg(nn.AdaptiveMaxPool2d(2), nd.randn({5})),
                    "needle.nn.AdaptiveMaxPool2d({2, 2}): expected input of shape (N, C, H, W) or (C, H, W), got {5}")
  end)

  it("are raised at the user's line, also from a module deep in a model", function()
    local model = nn.Sequential(nn.Conv1d(3, 4, 3, {padding = 1}), nn.GroupNorm(2, 4), nn.Upsample({scale_factor = 2}))
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, e = pcall(function() return model(nd.randn({1, 3, 5, 5})) end)
    assert.is_false(ok)
    assert_contains(e, ("nn_spatial_spec.lua:%d: needle.nn.Conv1d(3, 4)"):format(line))
    line = debug.getinfo(1, "l").currentline + 1
    ok, e = pcall(function() return F.pad(nd.randn({1, 1, 3}), {5, 5}, "reflect") end)
    assert_contains(e, ("nn_spatial_spec.lua:%d: needle.pad: "):format(line))
    line = debug.getinfo(1, "l").currentline + 1
    ok, e = pcall(function() return F.conv3d(nd.randn({1, 2, 3, 3, 3}), nd.randn({2, 3, 1, 1, 1})) end)
    assert_contains(e, ("nn_spatial_spec.lua:%d: needle.conv3d: "):format(line))
  end)
end)

describe("interpolate's nearest index maps for float64", function()
  it("are PyTorch's float32 ones, as for a float32 input (whose results the fixtures check)", function()
    local function ramp(n, dtype) return nd.arange(0, n, {dtype = dtype}):reshape({1, 1, n}) end
    -- 6 -> 74: PyTorch picks source 3 (value 2) at output 38 (1-based), where a double scale gives 4
    assert.are.equal(2, F.interpolate(ramp(6, "float64"), {size = 74}):totable()[1][1][38])
    local cases = {{6, 74}, {12, 74}, {14, 46}, {7, 3}, {5, 13}}
    for _, mode in ipairs({"nearest", "nearest-exact"}) do
      for _, c in ipairs(cases) do
        local got = F.interpolate(ramp(c[1], "float64"), {size = c[2], mode = mode})
        local want = F.interpolate(ramp(c[1], "float32"), {size = c[2], mode = mode})
        assert.are.equal("float64", got.dtype)
        assert.are.same(want:totable(), got:totable(), ("%s %d -> %d"):format(mode, c[1], c[2]))
      end
      for _, s in ipairs({1.7, 2.3, 0.6}) do
        local got = F.interpolate(ramp(11, "float64"), {scale_factor = s, mode = mode})
        local want = F.interpolate(ramp(11, "float32"), {scale_factor = s, mode = mode})
        assert.are.same(want:totable(), got:totable(), ("%s 11 x %g"):format(mode, s))
      end
      local x = nd.arange(0, 6 * 14, {dtype = "float64"}):reshape({1, 1, 6, 14})
      assert.are.same(F.interpolate(x:float(), {size = {74, 46}, mode = mode}):totable(),
                      F.interpolate(x, {size = {74, 46}, mode = mode}):totable(), mode .. " 2-d")
    end
  end)
end)
