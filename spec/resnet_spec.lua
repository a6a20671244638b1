-- resnet_spec.lua - nd.nn.ResNet9 (needle's hw4 model): shapes, the
-- parameter count worked out by hand, a training step, BatchNorm's train and
-- eval modes, state_dict round trips, and the outputs, gradients and running
-- statistics of the same network in PyTorch (spec/fixtures/torch_resnet9.lua,
-- written by spec/fixtures/gen/gen_torch_resnet9.py).
local nd = require "needle"
local nn = nd.nn

local function T(f) return nd.tensor(f.data):reshape(f.shape) end

-- every element within rtol * |want| + atol
local function close(what, got, want, rtol, atol)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g = got:contiguous():view({-1}):totable()
  for i, w in ipairs(want.data) do
    if math.abs(g[i] - w) > rtol * math.abs(w) + atol then
      error(("%s: element %d is %.9g, PyTorch %.9g"):format(what, i, g[i], w), 2)
    end
  end
end

local function max_abs_diff(a, b) return (a - b):abs():max():item() end

local function batchnorms(model)
  local out = {}
  for _, m in ipairs(model:modules()) do
    if m.__name == "BatchNorm2d" then out[#out + 1] = m end
  end
  return out
end

describe("nd.nn.ResNet9", function()
  it("maps (N, 3, 32, 32) images to (N, num_classes) logits", function()
    nd.manual_seed(1)
    local m = nn.ResNet9()
    assert.are.same({4, 10}, m(nd.randn({4, 3, 32, 32})).shape)
    -- one image: eval mode (train mode needs more than one value per channel, as PyTorch)
    local ok, err = pcall(m, nd.randn({1, 3, 32, 32}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("more than 1 value per channel", 1, true), err)
    m:eval()
    assert.are.same({1, 10}, m(nd.randn({1, 3, 32, 32})).shape)
    local m7 = nn.ResNet9({num_classes = 7})
    assert.are.same({3, 7}, m7(nd.randn({3, 3, 32, 32})).shape)
    assert.are.equal(require("needle.nn.models").ResNet9, nn.ResNet9)
    assert.truthy(tostring(m):find("ResNet9(num_classes=10", 1, true))
  end)

  it("has the parameter count worked out by hand", function()
    -- ConvBN(a, b, k): conv a*b*k*k + b, BatchNorm weight and bias 2*b
    local function convbn(a, b, k) return a * b * k * k + b + 2 * b end
    local expected = convbn(3, 16, 7)                          -- 2352 + 16 + 32   =   2400
      + convbn(16, 32, 3)                                      -- 4608 + 32 + 64   =   4704
      + 2 * convbn(32, 32, 3)                                  -- 2 * 9312         =  18624
      + convbn(32, 64, 3)                                      -- 18432 + 64 + 128 =  18624
      + convbn(64, 128, 3)                                     -- 73728 + 128 + 256 = 74112
      + 2 * convbn(128, 128, 3)                                -- 2 * 147840       = 295680
      + (128 * 128 + 128) + (128 * 10 + 10)                    -- 16512 + 1290
    assert.are.equal(431946, expected)
    assert.are.equal(431946, nn.ResNet9():num_parameters())
    assert.are.equal(431946 - 1290 + 128 * 100 + 100, nn.ResNet9({num_classes = 100}):num_parameters())
    -- 36 parameter tensors (8 ConvBNs with 4, 2 Linears with 2); 8 BatchNorms with 3 buffers each
    local m = nn.ResNet9()
    assert.are.equal(8 * 4 + 2 * 2, #m:parameters())
    assert.are.equal(8, #batchnorms(m))
    local n = 0
    for _ in pairs(m:state_dict()) do n = n + 1 end
    assert.are.equal(8 * 4 + 2 * 2 + 8 * 3, n)
  end)

  it("refuses wrong inputs and options with clear errors", function()
    local m = nn.ResNet9()
    local ok, err = pcall(m, nd.randn({2, 1, 32, 32}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("needle.nn.ResNet9: expected images of shape (N, 3, H, W)", 1, true), err)
    assert.truthy(tostring(err):find("{2,1,32,32}", 1, true), err)
    ok, err = pcall(m, nd.randn({2, 3, 64, 64}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("at most 32", 1, true), err)
    ok, err = pcall(nn.ResNet9, {classes = 10})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown option 'classes'", 1, true), err)
    ok, err = pcall(nn.ResNet9, {num_classes = 0})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("num_classes must be a positive integer", 1, true), err)
  end)

  it("runs forward and backward on a small batch, and a step lowers the loss", function()
    nd.manual_seed(2)
    local m = nn.ResNet9()
    local x = nd.randn({4, 3, 32, 32})
    local y = nd.tensor({1, 5, 9, 10}, {dtype = "int64"})
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.05, momentum = 0.9})
    local loss = nd.F.cross_entropy(m(x), y)
    opt:zero_grad()
    loss:backward()
    for _, np in ipairs(m:named_parameters()) do
      local name, p = np[1], np[2]
      assert(p.grad, name .. " has no gradient")
      assert.are.same(p.shape, p.grad.shape, name)
      local s = p.grad:abs():sum():item()
      assert(s == s and s < math.huge, name .. ": non-finite gradient")
    end
    assert(m.model[1].conv.weight.grad:abs():sum():item() > 0, "no gradient reaches the stem")
    local before = loss:item()
    for _ = 1, 5 do
      opt:zero_grad()
      loss = nd.F.cross_entropy(m(x), y)
      loss:backward()
      opt:step()
    end
    local after = nd.F.cross_entropy(m(x), y):item()
    assert(after < before, ("loss did not fall: %g then %g"):format(before, after))
  end)

  it("uses batch statistics in train mode and running ones in eval mode", function()
    nd.manual_seed(3)
    local m = nn.ResNet9()
    local x = nd.randn({4, 3, 32, 32})
    for _, bn in ipairs(batchnorms(m)) do assert.is_true(bn.training) end
    local bn1 = m.model[1].bn
    local rm0 = bn1.running_mean:clone()
    -- train: a sample's output depends on the rest of the batch, and the running stats move
    local full = nd.no_grad(function() return m(x) end)
    assert.are.equal(1, bn1.num_batches_tracked:item())
    assert(max_abs_diff(bn1.running_mean, rm0) > 0, "running_mean did not move in train mode")
    local part = nd.no_grad(function() return m(x:narrow(1, 1, 2)) end)
    assert(max_abs_diff(part, full:narrow(1, 1, 2)) > 1e-4, "train mode should use batch statistics")
    -- eval: every BatchNorm switches; outputs are per sample and the stats stay put
    m:eval()
    for _, bn in ipairs(batchnorms(m)) do assert.is_false(bn.training) end
    local rm1, nbt = bn1.running_mean:clone(), bn1.num_batches_tracked:item()
    local e_full = nd.no_grad(function() return m(x) end)
    local e_part = nd.no_grad(function() return m(x:narrow(1, 1, 2)) end)
    assert(max_abs_diff(e_part, e_full:narrow(1, 1, 2)) < 1e-5, "eval mode should not depend on the batch")
    assert.are.equal(0, max_abs_diff(bn1.running_mean, rm1))
    assert.are.equal(nbt, bn1.num_batches_tracked:item())
    m:train()
    for _, bn in ipairs(batchnorms(m)) do assert.is_true(bn.training) end
  end)

  it("round-trips its state_dict, directly and through a safetensors file", function()
    nd.manual_seed(4)
    local a = nn.ResNet9()
    local x = nd.randn({3, 3, 32, 32})
    local opt = nd.optim.SGD(a:parameters(), {lr = 0.1})
    local loss = nd.F.cross_entropy(a(x), nd.tensor({1, 2, 3}, {dtype = "int64"}))
    loss:backward()
    opt:step() -- weights and running stats away from their initial values
    a:eval()
    local want = nd.no_grad(function() return a(x) end)

    local b = nn.ResNet9()
    b:load_state_dict(a:state_dict())
    b:eval()
    assert.are.equal(0, max_abs_diff(nd.no_grad(function() return b(x) end), want))

    local path = os.tmpname()
    nd.save(a, path)
    local c = nn.ResNet9()
    c:load_state_dict((nd.load(path)))
    os.remove(path)
    c:eval()
    assert.are.equal(0, max_abs_diff(nd.no_grad(function() return c(x) end), want))
    assert.are.equal(a.model[1].bn.num_batches_tracked:item(), c.model[1].bn.num_batches_tracked:item())

    local ok, err = pcall(function() nn.ResNet9({num_classes = 5}):load_state_dict(a:state_dict()) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("model.9.weight", 1, true), err)
  end)

  -- The fixture's weights are drawn from an LCG the generator and this spec
  -- share; see spec/fixtures/gen/gen_torch_resnet9.py for why gradients
  -- through the BatchNorms of this batch-of-2 problem are compared in float64.
  describe("against PyTorch", function()
    local fx = dofile("spec/fixtures/torch_resnet9.lua")

    -- the fixture's state_dict, rebuilt from its LCG exactly as the generator
    -- drew it (float32 values; converted for a float64 model)
    local function build(dtype)
      local m = nn.ResNet9({num_classes = fx.num_classes, dtype = dtype})
      local sd = m:state_dict()
      local state, mul, inc = fx.lcg.seed, fx.lcg.mul, fx.lcg.inc
      for _, p in ipairs(fx.params) do
        assert(sd[p.key], "the fixture has a key the model lacks: " .. p.key)
        local n = 1
        for _, d in ipairs(p.shape) do n = n * d end
        local vals, span = {}, p.hi - p.lo
        for i = 1, n do
          state = state * mul + inc -- wraps mod 2^64, as the generator's & MASK
          vals[i] = p.lo + span * ((state >> 11) * 2.0 ^ -53)
        end
        local t = nd.tensor(vals):reshape(p.shape) -- float32, rounded to nearest
        assert.are.same(sd[p.key].shape, t.shape, p.key)
        local s = t:double():sum():item()
        assert(math.abs(s - p.sum) <= 1e-9 * (1 + math.abs(p.sum)),
          ("%s: rebuilt values sum to %.17g, PyTorch's to %.17g"):format(p.key, s, p.sum))
        sd[p.key] = dtype == "float64" and t:double() or t
      end
      m:load_state_dict(sd)
      return m
    end

    local function input(dtype)
      local x = T(fx.x)
      return dtype == "float64" and x:double() or x
    end

    local function named(m)
      local params = {}
      for _, np in ipairs(m:named_parameters()) do params[np[1]] = np[2] end
      return params
    end

    local function train_step(m, x)
      m:train()
      local out = m(x)
      local loss = nd.F.cross_entropy(out, nd.tensor(fx.target, {dtype = "int64"}))
      loss:backward()
      return out, loss
    end

    it("the fixture covers every parameter and running statistic", function()
      local m = nn.ResNet9()
      local keys = {}
      for _, p in ipairs(fx.params) do keys[p.key] = true end
      for k in pairs(m:state_dict()) do
        assert(keys[k] or k:match("num_batches_tracked$"), "the fixture lacks " .. k)
      end
    end)

    it("matches in eval mode (float32)", function()
      local m = build()
      m:eval()
      local out = nd.no_grad(function() return m(input()) end)
      close("eval output", out, fx.f32.out_eval, 1e-4, 1e-4)
    end)

    it("matches in train mode (float32): output, loss, head gradients, running statistics", function()
      local m = build()
      local out, loss = train_step(m, input())
      close("train output", out, fx.f32.out_train, 1e-4, 1e-4)
      assert(math.abs(loss:item() - fx.f32.loss) <= 1e-4 * math.abs(fx.f32.loss),
        ("loss %.9g, PyTorch %.9g"):format(loss:item(), fx.f32.loss))
      local params = named(m)
      for k, g in pairs(fx.f32.grads) do
        assert(params[k] and params[k].grad, k .. ": no gradient")
        close("grad " .. k, params[k].grad, g, 1e-4, 1e-4)
      end
      local sd = m:state_dict()
      for k, v in pairs(fx.f32.stats) do close(k, sd[k], v, 1e-4, 1e-4) end
      assert.are.equal(1, sd["model.0.bn.num_batches_tracked"]:item())
    end)

    it("matches in float64: eval and train outputs and gradients through every layer", function()
      local m = build("float64")
      m:eval()
      local e = nd.no_grad(function() return m(input("float64")) end)
      assert.are.equal("float64", e.dtype)
      close("eval output", e, fx.f64.out_eval, 1e-9, 1e-12)
      local out, loss = train_step(m, input("float64"))
      close("train output", out, fx.f64.out_train, 1e-9, 1e-12)
      assert(math.abs(loss:item() - fx.f64.loss) <= 1e-9 * math.abs(fx.f64.loss),
        ("loss %.17g, PyTorch %.17g"):format(loss:item(), fx.f64.loss))
      local params = named(m)
      for k, g in pairs(fx.f64.grads) do
        assert(params[k] and params[k].grad, k .. ": no gradient")
        -- atol relative to the tensor's scale: a conv bias before a train-mode
        -- BatchNorm has a gradient of exactly 0 up to rounding
        local scale = 0
        for _, v in ipairs(g.data) do scale = math.max(scale, math.abs(v)) end
        close("grad " .. k, params[k].grad, g, 1e-7, 1e-9 * math.max(scale, 1))
      end
    end)
  end)
end)
