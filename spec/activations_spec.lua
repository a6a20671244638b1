-- activations_spec.lua - the activations, prelu, normalize and
-- cosine_similarity added for issue 20: nd.F against PyTorch's
-- (spec/fixtures/gen/gen_torch_activations.py wrote the fixtures; float32,
-- relative 1e-5), float64 gradchecks, and the modules.
local nd = require "needle"
local F = nd.F
local nn = nd.nn
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)

local fixtures = X.load("torch_activations")

-- the needle call of each case (PyTorch's 0-based dims become 1-based)
local calls = {
  mish = F.mish, hardswish = F.hardswish, hardsigmoid = F.hardsigmoid, relu6 = F.relu6,
  ["hardtanh_m2_1.5"] = function(x) return F.hardtanh(x, -2, 1.5) end,
  prelu_one = F.prelu, prelu_channels = F.prelu,
  normalize_p2_dim1 = function(x) return F.normalize(x, {p = 2, dim = 2}) end,
  normalize_p1_dim0 = function(x) return F.normalize(x, {p = 1, dim = 1}) end,
  cosine_similarity_dim1 = function(a, b) return F.cosine_similarity(a, b, {dim = 2}) end,
  cosine_similarity_dim0 = function(a, b) return F.cosine_similarity(a, b, {dim = 1}) end,
}

describe("activations against PyTorch", function()
  it("every case: output and gradients", function()
    assert.are.equal(11, #fixtures)
    for _, c in ipairs(fixtures) do
      assert.is_truthy(calls[c.name], "no needle call for " .. c.name)
      X.check_case(c.name, c, calls[c.name])
    end
  end)
end)

describe("activations: float64 gradchecks", function()
  it("every function, inputs away from the kinks", function()
    nd.manual_seed(41)
    local function away(shape)
      -- values in (-5, 7) that keep 0.05 from -3, 0, 3 and 6
      local t = G.leaf(shape, -5, 7):detach()
      for _, k in ipairs({-3, 0, 3, 6}) do
        t = nd.where((t - k):abs():lt(0.05), t + 0.1, t)
      end
      t.requires_grad = true
      return t
    end
    for _, f in ipairs({F.mish, F.hardswish, F.hardsigmoid, F.relu6}) do C.check(f, {away({3, 4})}) end
    C.check(function(x) return F.hardtanh(x, -2, 1.5) end, {away({3, 4})})
    C.check(function(x, w) return F.prelu(x, w) end, {away({2, 3, 4}), G.leaf({3})})
    C.check(function(x) return F.normalize(x, {p = 3}) end, {G.leaf({3, 4}, 0.5, 2)})
    C.check(function(a, b) return F.cosine_similarity(a, b) end, {G.leaf({3, 4}), G.leaf({3, 4})})
    C.check2(F.mish, {away({5})})
  end)
end)

describe("activation modules", function()
  it("call their functions; PReLU learns its slopes", function()
    nd.manual_seed(42)
    local x = nd.randn({2, 3, 4}) * 4
    local same = function(a, b) assert.are.same(a:totable(), b:totable()) end
    same(nn.Mish()(x), F.mish(x))
    same(nn.Hardswish()(x), F.hardswish(x))
    same(nn.Hardsigmoid()(x), F.hardsigmoid(x))
    same(nn.ReLU6()(x), F.relu6(x))
    same(nn.Hardtanh({min_val = -2, max_val = 3})(x), F.hardtanh(x, -2, 3))
    same(nn.ELU(0.5)(x), F.elu(x, 0.5))
    same(nn.Softplus({beta = 2})(x), F.softplus(x, {beta = 2}))
    local p = nn.PReLU({num_parameters = 3, init = 0.1})
    assert.are.same({"weight"}, (function() local k = {} for n in pairs(p:state_dict()) do k[#k + 1] = n end return k end)())
    p(x):sum():backward()
    assert.are.same({3}, p.weight.grad.shape)
    assert.is_true(p.weight.grad:abs():sum():item() > 0)
  end)

  -- inplace = true: ReLU, ReLU6 and Hardtanh write into their input where autograd does
  -- not need it, as PyTorch's do; where it does (grad mode on, an input that requires
  -- grad), a new tensor with the same values, the input untouched
  it("ReLU, ReLU6 and Hardtanh with inplace = true write into the input where autograd allows", function()
    nd.manual_seed(7)
    local mods = {
      {nn.ReLU({inplace = true}), F.relu},
      {nn.ReLU6({inplace = true}), F.relu6},
      {nn.Hardtanh({min_val = -2, max_val = 3, inplace = true}), function(x) return F.hardtanh(x, -2, 3) end},
    }
    for _, c in ipairs(mods) do
      local m, f = c[1], c[2]
      local x = nd.randn({2, 3, 4}) * 4
      local want = f(x)
      local out = m(x) -- x does not require grad: in place, grad mode or not
      assert.is_true(rawequal(out, x), tostring(m))
      assert.is_true(nd.equal(x, want), tostring(m))
      local w = (nd.randn({2, 3, 4}) * 4):requires_grad_()
      local before = w:detach():clone()
      local y = m(w) -- autograd needs w: a new tensor
      assert.is_false(rawequal(y, w))
      assert.is_true(nd.equal(w:detach(), before))
      assert.is_true(nd.equal(y:detach(), f(before)))
      y:sum():backward()
      local w2 = before:clone():requires_grad_()
      f(w2):sum():backward()
      assert.is_true(nd.equal(w.grad, w2.grad)) -- the out-of-place function's gradient
      local z = nd.no_grad(function() return m(w) end) -- no grad mode: in place even so
      assert.is_true(rawequal(z, w))
      assert.is_true(nd.equal(w:detach(), f(before)))
    end
    -- without inplace the input is left as it was
    local x = nd.randn({5}) - 1
    local x0 = x:clone()
    nn.ReLU()(x)
    assert.is_true(nd.equal(x, x0))
  end)

  it("bad input is an error naming the function or module", function()
    assert.has_error(function() F.prelu(nd.randn({2, 3}), nd.ones({4})) end,
      "needle.prelu: weight has 4 values for input {2,3}: expected 1 or one per channel (dim 2)")
    assert.has_error(function() F.hardtanh(nd.ones({2}), 1, -1) end,
      "needle.hardtanh: expected min_val <= max_val, numbers, got 1 and -1")
    assert.has_error(function() nn.Hardtanh({min_val = 2, max_val = 1}) end,
      "needle.nn.Hardtanh: min_val must be <= max_val, got 2 and 1")
    assert.has_error(function() nn.PReLU({num_parameter = 3}) end)
    assert.has_error(function() F.normalize(nd.ones({2}), {p = 0}) end, "needle.normalize: p must be > 0, got 0")
  end)
end)
