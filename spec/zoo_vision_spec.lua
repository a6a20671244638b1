-- zoo_vision_spec.lua - nd.nn.models' torchvision models (needle.zoo.vision:
-- ResNet-18/34/50, MobileNetV2) and their converter entries
-- (needle.zoo.register_vision): structure and parameter counts against
-- torchvision's, full-size forwards, errors, and the outputs and one training
-- step's gradients of the same weights in torchvision 0.14, on the cpu and
-- every OpenCL device.
--
--   build/needle-lua spec/run.lua spec/zoo_vision_spec.lua
--
-- The fixtures come from spec/fixtures/gen/gen_torch_zoo_vision.py:
-- zoo_vision.lua tells how to rebuild each model's weights from a 64-bit LCG
-- (key, shape, range, and the sum PyTorch got), zoo_vision_expected.safetensors
-- holds PyTorch's outputs and gradients, zoo_vision_tiny.pt a real torch.save'd
-- state_dict (float16) of a narrow Bottleneck ResNet.
local nd = require "needle"
local convert = require "needle.convert"
local vision = require "needle.zoo.vision"
local D = require "spec.helpers.devices"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local models = nd.nn.models
local FX = dofile("spec/fixtures/zoo_vision.lua")
local EXP = nd.load("spec/fixtures/zoo_vision_expected.safetensors")
local TINY_PT = "spec/fixtures/zoo_vision_tiny.pt"
local TOL = 1e-4 -- of the largest magnitude of what is compared (float32)

-- max |got - want| <= tol * max |want| (want is PyTorch's)
local function close(what, got, want, tol)
  tol = tol or TOL
  got = got:detach():cpu():to("float64")
  want = want:to("float64")
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local scale = want:abs():max():item()
  local d = (got - want):abs():max():item()
  assert(scale > 0, what .. ": PyTorch's values are all 0: nothing to compare")
  assert(d <= tol * scale, ("%s: max difference %.3g from PyTorch, %.3g of its largest magnitude %.3g (tolerance %g)")
    :format(what, d, d / scale, scale, tol))
end

-- the LCG of the generator: n values lo + (hi - lo) * u from state
local function draw(state, n, lo, hi)
  local mul, inc = FX.lcg.mul, FX.lcg.inc
  local vals, span = {}, hi - lo
  for i = 1, n do
    state = state * mul + inc -- wraps mod 2^64, as the generator's & MASK
    vals[i] = lo + span * ((state >> 11) * 2.0 ^ -53)
  end
  return vals, state
end

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- the fixture model's state_dict (float32, torchvision's keys and entries,
-- num_batches_tracked included), checked against the sums PyTorch got
local sds = {}
local function state_dict(name)
  if sds[name] then return sds[name] end
  local e, sd, state = FX[name], {}, FX[name].seed
  for _, p in ipairs(e.params) do
    local vals
    vals, state = draw(state, numel(p.shape), p.lo, p.hi)
    local t = nd.tensor(vals):reshape(p.shape) -- float32, rounded to nearest
    local s = t:to("float64"):sum():item()
    assert(math.abs(s - p.sum) <= 1e-9 * (1 + math.abs(p.sum)),
      ("%s %s: rebuilt values sum to %.17g, PyTorch's to %.17g"):format(name, p.key, s, p.sum))
    sd[p.key] = t
    -- torchvision's state_dict also has each BatchNorm's step count (0 here:
    -- the generator loaded its values into a new model)
    local bn = p.key:match("^(.*)%.running_mean$")
    if bn then sd[bn .. ".num_batches_tracked"] = nd.tensor(0, {dtype = "int64"}) end
  end
  sds[name] = sd
  return sd
end

local function input(name, which)
  local i = FX[name][which or "input"]
  return nd.tensor((draw(i.seed, numel(i.shape), i.lo, i.hi))):reshape(i.shape)
end

local function keys_of(sd)
  local out = {}
  for k in pairs(sd) do if not k:match("num_batches_tracked$") then out[#out + 1] = k end end
  table.sort(out)
  return out
end

local function batchnorms(model)
  local n = 0
  for _, m in ipairs(model:modules()) do if m.__name == "BatchNorm2d" then n = n + 1 end end
  return n
end

-- structure ------------------------------------------------------------------------

describe("nd.nn.models: torchvision's ResNet and MobileNetV2", function()
  it("have torchvision's parameter counts and numbers of state_dict entries", function()
    -- torchvision 0.14: sum(p.numel() for p in m.parameters()), len(m.state_dict())
    for _, c in ipairs({{"resnet18", 11689512, 122}, {"resnet34", 21797672, 218}, {"resnet50", 25557032, 320},
                        {"mobilenet_v2", 3504872, 314}, {"resnext50_32x4d", 25028904, 320},
                        {"resnext101_32x8d", 88791336, 626}, {"wide_resnet50_2", 68883240, 320},
                        {"wide_resnet101_2", 126886696, 626}}) do
      local m = models[c[1]]()
      assert.are.equal(c[2], m:num_parameters(), c[1])
      local n = 0
      for _ in pairs(m:state_dict()) do n = n + 1 end
      assert.are.equal(c[3], n, c[1])
    end
    -- num_classes changes the head only: 1000 -> 10 removes (2048 + 1) * 990 from resnet50
    assert.are.equal(25557032 - 2049 * 990, models.resnet50({num_classes = 10}):num_parameters())
    assert.are.equal(3504872 - 1281 * 990, models.mobilenet_v2({num_classes = 10}):num_parameters())
  end)

  it("have torchvision's keys, shapes and parameter order (the fixtures' models)", function()
    local cases = {
      {"r18c", models.resnet18({num_classes = 10, cifar = true})},
      {"r50", models.resnet50({num_classes = 10})},
      {"mb", models.mobilenet_v2({num_classes = 10, width_mult = 0.25})},
      {"rx", models.ResNet("bottleneck", {1, 1, 1, 1}, {num_classes = 10, width = 32, groups = 32,
                                                        width_per_group = 4})},
    }
    for _, c in ipairs(cases) do
      local name, m = c[1], c[2]
      local sd = m:state_dict()
      local want = {}
      for _, p in ipairs(FX[name].params) do
        want[#want + 1] = p.key
        assert(sd[p.key], name .. ": the model lacks " .. p.key)
        assert.are.same(p.shape, sd[p.key].shape, name .. " " .. p.key)
      end
      assert.are.same(want, keys_of(sd), name)
      -- one num_batches_tracked per BatchNorm, as torchvision's
      local nbt = 0
      for k in pairs(sd) do if k:match("num_batches_tracked$") then nbt = nbt + 1 end end
      assert.are.equal(batchnorms(m), nbt, name)
      -- named_parameters in torchvision's order (the fixture lists them so)
      if FX[name].grad_norms then
        local names = {}
        for i, np in ipairs(m:named_parameters()) do names[i] = np[1] end
        local tv = {}
        for i, g in ipairs(FX[name].grad_norms) do tv[i] = g[1] end
        assert.are.same(tv, names, name)
      end
    end
  end)

  it("build the ImageNet and the CIFAR stems", function()
    local m = models.resnet34({num_classes = 10})
    assert.are.same({64, 3, 7, 7}, m.conv1.weight.shape)
    assert.are.same({2, 2}, m.conv1.stride)
    assert.are.equal("MaxPool2d", m.maxpool.__name)
    assert.are.same({3, 4, 6, 3}, {#m.layer1, #m.layer2, #m.layer3, #m.layer4})
    assert.is_nil(m.layer1[1].downsample) -- 64 -> 64, stride 1: the identity
    assert.are.equal("Sequential", m.layer2[1].downsample.__name)
    local c = models.resnet34({num_classes = 10, cifar = true})
    assert.are.same({64, 3, 3, 3}, c.conv1.weight.shape)
    assert.are.same({1, 1}, c.conv1.stride)
    assert.are.equal("Identity", c.maxpool.__name)
    nd.manual_seed(1)
    local x = nd.randn({2, 3, 32, 32})
    m:eval(); c:eval()
    assert.are.same({2, 10}, nd.no_grad(function() return m(x) end).shape)
    assert.are.same({2, 10}, nd.no_grad(function() return c(x) end).shape)
    -- resnet50: the first block of layer1 needs a downsample (64 -> 256 channels)
    local r = models.resnet50({width = 8, num_classes = 3})
    assert.are.same({32, 8, 1, 1}, r.layer1[1].downsample[1].weight.shape)
    assert.are.same({3, 256}, r.fc.weight.shape)
    assert.truthy(tostring(r):find("ResNet(block=Bottleneck, layers={3,4,6,3}, width=8, num_classes=3", 1, true))
    -- MobileNetV2's CIFAR strides: the stem and features.2's depthwise conv
    local v, vc = models.mobilenet_v2({width_mult = 0.25}), models.mobilenet_v2({width_mult = 0.25, cifar = true})
    assert.are.same({2, 2}, v.features[1][1].stride)
    assert.are.same({1, 1}, vc.features[1][1].stride)
    assert.are.same({2, 2}, v.features[3].conv[2][1].stride)
    assert.are.same({1, 1}, vc.features[3].conv[2][1].stride)
    assert.are.equal(v.features[3].conv[2][1].in_channels, v.features[3].conv[2][1].groups) -- depthwise
    assert.is_true(v.features[4].use_res_connect)
    assert.is_false(v.features[3].use_res_connect)
  end)

  it("initialise as torchvision: kaiming_normal_ (fan_out), BatchNorm 1 and 0, MobileNetV2's Linear normal(0, 0.01)",
     function()
    nd.manual_seed(2)
    local m = models.resnet18()
    local w = m.layer4[2].conv2.weight -- fan_out 512 * 9: std sqrt(2 / 4608)
    local std = w:std():item()
    assert(math.abs(std / math.sqrt(2 / 4608) - 1) < 0.01, "conv std " .. std)
    assert.are.equal(512, m.layer4[2].bn2.weight:sum():item())
    assert.are.equal(0, m.layer4[2].bn2.bias:abs():sum():item())
    local v = models.mobilenet_v2()
    local lstd = v.classifier[2].weight:std():item()
    assert(math.abs(lstd / 0.01 - 1) < 0.01, "linear std " .. lstd)
    assert.are.equal(0, v.classifier[2].bias:abs():sum():item())
    -- zero_init_residual: every block's last BatchNorm weight is 0
    local z = models.resnet50({zero_init_residual = true, width = 8})
    for k = 1, 4 do
      for _, b in ipairs(z["layer" .. k]) do
        assert.are.equal(0, b.bn3.weight:abs():sum():item())
        assert.are.equal(b.bn2.weight:numel(), b.bn2.weight:sum():item())
      end
    end
  end)

  it("take dtype and device", function()
    local m = models.mobilenet_v2({width_mult = 0.25, num_classes = 4, dtype = "float64"})
    for _, p in ipairs(m:parameters()) do assert.are.equal("float64", p.dtype) end
    m:eval()
    local x = nd.randn({1, 3, 32, 32}, {dtype = "float64"})
    assert.are.equal("float64", nd.no_grad(function() return m(x) end).dtype)
    for _, dev in ipairs(D.opencl()) do
      local r = models.resnet18({width = 4, num_classes = 2, device = dev})
      for _, p in ipairs(r:parameters()) do assert.are.equal(dev, p.device) end
    end
  end)

  it("refuse bad options and inputs, naming what was expected", function()
    assert_contains(errmsg(models.resnet50, {num_class = 10}), "needle.nn.models.resnet50: unknown option 'num_class' "
      .. "(valid: cifar, device, dtype, groups, num_classes, width, width_per_group, zero_init_residual)")
    assert_contains(errmsg(models.resnet18, {cifar = 1}), "needle.nn.models.resnet18: option 'cifar' must be a boolean")
    assert_contains(errmsg(models.resnet18, {num_classes = 10}, 5), "needle.nn.models.resnet18: takes resnet18([opts]) only")
    assert_contains(errmsg(models.mobilenet_v2, {}, 5), "needle.nn.models.mobilenet_v2: takes mobilenet_v2([opts]) only")
    assert_contains(errmsg(models.resnet34, {num_classes = 0}),
                    "needle.nn.models.resnet34: num_classes must be a positive integer, got 0")
    assert_contains(errmsg(models.mobilenet_v2, {width_mult = 0}),
                    "needle.nn.models.mobilenet_v2: width_mult must be a positive number, got 0")
    assert_contains(errmsg(models.mobilenet_v2, {dropout = 1.5}),
                    "needle.nn.models.mobilenet_v2: dropout must be a probability in [0, 1], got 1.5")
    assert_contains(errmsg(models.mobilenet_v2, {cifar = true, depth = 2}),
                    "needle.nn.models.mobilenet_v2: unknown option 'depth' (valid: cifar, device, dropout, dtype, "
                    .. "num_classes, width_mult)")
    assert_contains(errmsg(models.ResNet, "wide", {2, 2, 2, 2}),
                    "needle.nn.models.ResNet: block must be 'basic', 'bottleneck', BasicBlock or Bottleneck, "
                    .. "got \"wide\"")
    -- torchvision's spelling, ResNet(BasicBlock, ...), works with nd.nn.models' classes
    assert.are.equal("BasicBlock", models.ResNet(models.BasicBlock, {1, 1, 1, 1}, {width = 2}).block)
    assert.are.equal("Bottleneck", models.ResNet(models.Bottleneck, {1, 1, 1, 1}, {width = 2}).block)
    assert_contains(errmsg(models.ResNet, nd.nn.Linear, {2, 2, 2, 2}), "block must be 'basic', 'bottleneck'")
    assert_contains(errmsg(models.ResNet, "basic", {2, 2, 2}),
                    "needle.nn.models.ResNet: layers must be a list of 4 block counts such as {2, 2, 2, 2}")
    assert_contains(errmsg(models.ResNet, "basic", {2, 0, 2, 2}),
                    "needle.nn.models.ResNet: layers[2] must be a positive integer, got 0")
    assert_contains(errmsg(models.InvertedResidual, 8, 8, 3, 6),
                    "needle.nn.models.InvertedResidual: stride must be 1 or 2, got 3")
    local m = models.resnet18({width = 4, num_classes = 2})
    local ok, msg = pcall(m, nd.randn({2, 1, 32, 32}))
    assert.is_false(ok)
    assert_contains(msg, "needle.nn.models.ResNet: expected images of shape (N, 3, H, W), got {2,1,32,32}")
    assert.truthy(msg:find("^spec/zoo_vision_spec.lua:%d+:"), msg) -- at the caller's line
    assert_contains(errmsg(m, nd.randn({3, 32, 32})), "got {3,32,32}")
    local v = models.mobilenet_v2({width_mult = 0.25})
    assert_contains(errmsg(v, nd.randn({1, 4, 32, 32})),
                    "needle.nn.models.MobileNetV2: expected images of shape (N, 3, H, W), got {1,4,32,32}")
    -- a torchvision state_dict of another architecture: every problem named
    msg = errmsg(m.load_state_dict, m, models.resnet18({width = 8, num_classes = 2}):state_dict())
    assert_contains(msg, "conv1.weight (checkpoint {8,3,7,7}, model {4,3,7,7})")
  end)

  -- under no_grad the blocks' ReLUs (inplace = true) and residual adds (torchvision's
  -- out += identity) write into their own intermediates; with autograd they make new
  -- tensors. The values must not depend on which, and the input must stay as it was.
  it("give the same bits under no_grad (in-place ReLU and residual add) as with autograd", function()
    nd.manual_seed(12)
    for _, m in ipairs({models.resnet18({width = 8, num_classes = 3}), models.resnet50({width = 8, num_classes = 3}),
                        models.mobilenet_v2({width_mult = 0.25, num_classes = 3})}) do
      m:eval()
      local x = nd.randn({2, 3, 64, 64})
      local x0 = x:clone()
      local with_grad = m(x)
      assert.is_true(with_grad.requires_grad)
      local without = nd.no_grad(function() return m(x) end)
      assert.is_true(nd.equal(with_grad:detach(), without), m.__name)
      assert.is_true(nd.equal(x, x0), m.__name)
    end
  end)

  it("run full size at 224x224: resnet50 and mobilenet_v2, finite logits of shape {1, 1000}", function()
    nd.manual_seed(3)
    local x = nd.randn({1, 3, 224, 224})
    for _, name in ipairs({"resnet50", "mobilenet_v2"}) do
      local m = models[name]()
      m:eval()
      local y = nd.no_grad(function() return m(x) end)
      assert.are.same({1, 1000}, y.shape, name)
      assert.is_true(y:isfinite():all():item(), name)
      assert(y:abs():max():item() > 0, name .. ": all zero")
    end
  end)
end)

-- against PyTorch ----------------------------------------------------------------------

local function labels(name, dev)
  return nd.tensor(FX[name].target, {dtype = "int64", device = dev})
end

-- a train-mode forward and backward: logits, loss and the model
local function train_step(model, x, target)
  model:train()
  local out = model(x)
  local loss = nd.F.cross_entropy(out, target)
  loss:backward()
  return out, loss
end

local function named(model)
  local params = {}
  for _, np in ipairs(model:named_parameters()) do params[np[1]] = np[2] end
  return params
end

-- the gradients in EXP under "<prefix>.<kind>.<parameter name>", at tol
local function check_grads(prefix, kind, model, tol)
  local params, n, head = named(model), 0, prefix .. "." .. kind .. "."
  for key, want in pairs(EXP) do
    if key:sub(1, #head) == head then
      local k = key:sub(#head + 1)
      assert(params[k] and params[k].grad, k .. ": no gradient")
      close(("%s %s %s"):format(prefix, kind, k), params[k].grad, want, tol)
      n = n + 1
    end
  end
  assert(n >= 3, "the fixture has " .. kind .. " gradients")
end

-- float32: the logits, the loss and the head's gradients (past every ReLU but
-- the last, whose inputs keep a margin from 0 that float32 cannot cross)
local function check_train32(prefix, model, out, loss)
  close(prefix .. " train logits", out, EXP[prefix .. ".train"])
  close(prefix .. " loss", loss:reshape({1}), EXP[prefix .. ".loss"])
  check_grads(prefix, "grad", model)
end

-- float64: gradients through the whole network (a ReLU input within float32's
-- rounding of 0 flips everything before it: see the generator), and the norm
-- of every parameter's gradient (some are 0 up to rounding: a BatchNorm bias
-- whose only path to the loss ends in a train-mode BatchNorm; hence the part
-- relative to the largest norm)
local TOL64 = 1e-8
local function check_train64(prefix, name, model, out, loss)
  close(prefix .. " train logits (float64)", out, EXP[prefix .. ".train64"], TOL64)
  close(prefix .. " loss (float64)", loss:reshape({1}), EXP[prefix .. ".loss64"], TOL64)
  check_grads(prefix, "grad64", model, TOL64)
  local params, largest = named(model), 0
  for _, g in ipairs(FX[name].grad_norms) do largest = math.max(largest, g[2]) end
  for _, g in ipairs(FX[name].grad_norms) do
    local p = params[g[1]]
    assert(p and p.grad, g[1] .. ": no gradient")
    local norm = p.grad:cpu():pow(2):sum():sqrt():item()
    assert(math.abs(norm - g[2]) <= TOL64 * (g[2] + largest * 1e-2),
      ("%s gradient norm of %s: %.17g, PyTorch %.17g"):format(prefix, g[1], norm, g[2]))
  end
end

-- a model built by make(), loaded with the fixture's weights, on dev in dtype
local function loaded(make, name, dev, dtype)
  local m = make()
  m:load_state_dict(state_dict(name))
  return m:to({device = dev, dtype = dtype or "float32"})
end

local function against_pytorch(dev)
  local function on(t) return t:to(dev) end

  local function r18c() return models.resnet18({num_classes = 10, cifar = true}) end

  it("resnet18 (CIFAR stem): eval logits, a train step's logits, loss, head gradients, running statistics", function()
    local m = loaded(r18c, "r18c", dev)
    m:eval()
    close("r18c eval logits", nd.no_grad(function() return m(on(input("r18c"))) end), EXP["r18c.eval"])
    local out, loss = train_step(m, on(input("r18c", "train_input")), labels("r18c", dev))
    check_train32("r18c", m, out, loss)
    local sd = m:state_dict()
    for key, want in pairs(EXP) do
      local k = key:match("^r18c%.stat%.(.*)$")
      if k then close("r18c " .. k, sd[k], want) end
    end
    assert.are.equal(1, sd["bn1.num_batches_tracked"]:item())
  end)

  it("resnet18 (CIFAR stem) in float64: a train step's gradients through every layer", function()
    if not D.fp64(dev) then pending(dev .. " has no float64"); return end
    local m = loaded(r18c, "r18c", dev, "float64")
    local out, loss = train_step(m, on(input("r18c", "train_input"):to("float64")), labels("r18c", dev))
    check_train64("r18c", "r18c", m, out, loss)
  end)

  it("resnet50 at full width (ImageNet stem), through convert.model('resnet50'): eval logits", function()
    local m = convert.model("resnet50", state_dict("r50"))
    assert.are.equal("ResNet", m.__name)
    assert.is_false(m.training) -- convert.model puts it in eval mode
    m:to(dev)
    local y = nd.no_grad(function() return m(on(input("r50"))) end)
    close("r50 eval logits", y, EXP["r50.eval"])
  end)

  it("a ResNeXt (groups 32, width per group 4), through convert.model('resnet'): eval logits", function()
    local m = convert.model("resnet", state_dict("rx"))
    assert.are.same({32, 4, 32}, {m.groups, m.width_per_group, m.width})
    assert.are.equal(32, m.layer1[1].conv2.groups)
    m:to(dev)
    local y = nd.no_grad(function() return m(on(input("rx"))) end)
    close("rx eval logits", y, EXP["rx.eval"])
  end)

  it("mobilenet_v2(width_mult = 0.25): eval logits; the CIFAR variant's too, and a train step", function()
    local m = models.mobilenet_v2({num_classes = 10, width_mult = 0.25})
    m:load_state_dict(state_dict("mb"))
    m:to(dev)
    m:eval()
    local x = on(input("mb"))
    close("mb eval logits", nd.no_grad(function() return m(x) end), EXP["mb.eval"])
    -- the converter finds width_mult 0.25 in the channel counts; cifar from opts
    local c = convert.model("mobilenet_v2", state_dict("mb"), {cifar = true})
    assert.are.equal(0.25, c.width_mult)
    c:to(dev)
    close("mbc eval logits", nd.no_grad(function() return c(x) end), EXP["mbc.eval"])
    c.classifier[1].p = 0 -- as the generator: no dropout mask to reproduce
    local out, loss = train_step(c, on(input("mb", "train_input")), labels("mb", dev))
    check_train32("mbc", c, out, loss)
  end)

  it("mobilenet_v2's CIFAR variant in float64: a train step's gradients through every layer", function()
    if not D.fp64(dev) then pending(dev .. " has no float64"); return end
    local c = loaded(function() return models.mobilenet_v2({num_classes = 10, width_mult = 0.25, cifar = true,
                                                            dropout = 0}) end, "mb", dev, "float64")
    local out, loss = train_step(c, on(input("mb", "train_input"):to("float64")), labels("mb", dev))
    check_train64("mbc", "mb", c, out, loss)
  end)

  it("a torch.save'd torchvision state_dict (float16): nd.load_torch, convert.model('resnet')", function()
    if type(nd.load_torch) ~= "function" then pending("nd.load_torch is not in this build"); return end
    local sd = convert.unwrap(nd.load_torch(TINY_PT))
    assert.are.equal("float16", sd["conv1.weight"].dtype)
    assert.are.equal("int64", sd["bn1.num_batches_tracked"].dtype)
    local m = convert.model("resnet", sd)
    assert.are.equal("Bottleneck", m.block)
    assert.are.same({1, 1, 1, 1}, m.layers)
    assert.are.equal(4, m.width)
    assert.are.equal(3, m.bn1.num_batches_tracked:item()) -- three train-mode batches in PyTorch
    m:to(dev)
    close("tiny eval logits", nd.no_grad(function() return m(on(EXP["tiny.input"])) end), EXP["tiny.eval"])
  end)
end

for _, dev in ipairs(D.all()) do
  describe("against torchvision 0.14 on " .. D.describe(dev), function() against_pytorch(dev) end)
end
if #D.opencl() == 0 then
  describe("against torchvision 0.14 on OpenCL", function()
    D.pending_without_opencl(pending, "torchvision models on OpenCL")
  end)
end

-- the converter ------------------------------------------------------------------------

describe("the converter entries (needle.convert.models)", function()
  local run = H.runner("convert_torch")
  local tmp
  before_each(function() tmp = H.tmpdir() end)
  after_each(function() H.rmdir(tmp) end)

  it("are registered and listed by scripts/convert_torch.lua --list", function()
    local names = {}
    for _, n in ipairs(convert.models.names()) do names[n] = true end
    for _, n in ipairs({"resnet", "resnet18", "resnet34", "resnet50", "mobilenet_v2"}) do
      assert.is_true(names[n], n)
    end
    local ok, text = run("--list")
    assert(ok, text)
    for _, n in ipairs({"resnet", "resnet18", "resnet34", "resnet50", "mobilenet_v2"}) do
      assert.truthy(text:find("\n  " .. n .. "\n", 1, true), n)
    end
  end)

  it("read the architecture from the weights, and say when they are another one", function()
    -- resnet34's blocks, ImageNet stem: resnet34 builds it, resnet18 and resnet50 refuse
    local sd = models.resnet34({width = 4, num_classes = 3}):state_dict()
    local m = convert.model("resnet34", sd)
    assert.are.same({3, 4, 6, 3}, m.layers)
    assert.are.equal(4, m.width)
    assert.is_false(m.cifar)
    assert_contains(errmsg(convert.model, "resnet18", sd), "needle.convert: cannot build 'resnet18' from this state "
      .. "dict: the state dict is a ResNet of basic blocks {3,4,6,3} per stage, resnet18 has basic blocks {2,2,2,2} "
      .. "(the model 'resnet' takes any torchvision ResNet)")
    assert_contains(errmsg(convert.model, "resnet50", sd), "resnet50 has bottleneck blocks {3,4,6,3}")
    -- the CIFAR stem is read from conv1.weight
    local c = convert.model("resnet18", models.resnet18({width = 4, cifar = true, num_classes = 7}):state_dict())
    assert.is_true(c.cifar)
    assert.are.equal(7, c.num_classes)
    sd = models.resnet18({width = 4}):state_dict()
    sd["fc.weight"] = nd.zeros({10, 33})
    assert_contains(errmsg(convert.model, "resnet", sd),
                    "fc.weight {10,33} takes 33 features, but conv1.weight {4,3,7,7} gives 32 (8 * width)")
    sd = models.resnet18({width = 4}):state_dict()
    sd["conv1.weight"] = nil
    assert_contains(errmsg(convert.model, "resnet18", sd), "the state dict has no 'conv1.weight'")
    -- MobileNetV2: width_mult from the channel counts
    for _, wm in ipairs({0.35, 0.5, 0.75, 1.0, 1.4}) do
      local v = convert.model("mobilenet_v2", models.mobilenet_v2({width_mult = wm, num_classes = 5}):state_dict())
      assert.are.equal(wm, v.width_mult)
      assert.are.equal(5, v.num_classes)
    end
    assert_contains(errmsg(convert.model, "mobilenet_v2", sd),
                    "cannot build 'mobilenet_v2' from this state dict: the state dict has no 'classifier.1.weight'")
    assert_contains(errmsg(convert.model, "mobilenet_v2", {}, {cifar = "yes"}),
                    "option 'cifar' must be a boolean")
  end)

  it("scripts/convert_torch.lua converts the torch.save'd file; the saved model gives PyTorch's logits", function()
    if type(nd.load_torch) ~= "function" then pending("nd.load_torch is not in this build"); return end
    local out = tmp .. "/tiny.safetensors"
    local ok, text = run(S.q(TINY_PT) .. " " .. S.q(out) .. " --model resnet")
    assert(ok, text)
    assert.truthy(text:find("model resnet, mapping none", 1, true), text)
    assert.truthy(text:find("converted to the model's dtype", 1, true), text) -- float16 -> float32
    local saved = nd.load(out)
    assert.are.equal("float32", saved["conv1.weight"].dtype)
    local m = models.ResNet("bottleneck", {1, 1, 1, 1}, {width = 4, num_classes = 10})
    m:load_state_dict(saved)
    m:eval()
    close("tiny via convert_torch.lua", nd.no_grad(function() return m(EXP["tiny.input"]) end), EXP["tiny.eval"])
    -- --model resnet50 on it: exit 1, the reason, no output file
    local out50 = tmp .. "/r50.safetensors"
    local code
    ok, text, code = run(S.q(TINY_PT) .. " " .. S.q(out50) .. " --model resnet50")
    assert.is_false(ok)
    assert.are.equal(1, code)
    assert.truthy(text:find("bottleneck blocks {1,1,1,1} per stage, resnet50 has bottleneck blocks {3,4,6,3}", 1, true),
                  text)
    assert.is_false(S.exists(out50))
  end)
end)
