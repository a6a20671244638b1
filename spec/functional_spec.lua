-- functional_spec.lua - nd.F: values against hand-computed references,
-- gradients against finite differences (float64), and bad input.
local nd = require "needle"
local F = nd.F
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)
local check, check2 = C.check, C.check2
local A = require("spec.helpers.assertions").bind(assert)
local err_of, has = A.err_of, A.has

local function near(expected, t, tol)
  local got = t:totable()
  if type(got) ~= "table" then got = {got} end
  for i = 1, #expected do
    assert(math.abs(got[i] - expected[i]) <= (tol or 1e-5), ("element %d: %g vs %g"):format(i, got[i], expected[i]))
  end
end

describe("nd.F", function()
  local x = nd.tensor({1, -2, 0, 30}, {dtype = "float64"})

  it("activations match their definitions", function()
    local e1, e2 = math.exp(1), math.exp(-2)
    near({0.8413447460685429, -0.04550026389635842, 0, 30}, F.gelu(x))
    near({0.8411919906082768, -0.04540230591222972, 0, 30}, F.gelu(x, {approximate = "tanh"}))
    near({1, -0.02, 0, 30}, F.leaky_relu(x))
    near({1, -0.2, 0, 30}, F.leaky_relu(x, 0.1))
    near({math.log(1 + e1), math.log(1 + e2), math.log(2), 30}, F.softplus(x))
    near({1, e2 - 1, 0, 30}, F.elu(x))
    near({1 / (1 + 1 / e1), -2 / (1 + 1 / e2), 0, 30}, F.silu(x))
  end)

  it("softmax and log_softmax are stable and normalised", function()
    local z = nd.tensor({{1, 2, 3}, {1000, 1000, 1000}})
    local s = F.softmax(z, 2)
    local e = {math.exp(1), math.exp(2), math.exp(3)}
    local tot = e[1] + e[2] + e[3]
    near({e[1] / tot, e[2] / tot, e[3] / tot}, s[1])
    near({1 / 3, 1 / 3, 1 / 3}, s[2])
    near({1 - math.log(tot), 2 - math.log(tot), 3 - math.log(tot)}, F.log_softmax(z, 2)[1], 1e-5)
    near({-math.log(3), -math.log(3), -math.log(3)}, F.log_softmax(z, 2)[2], 1e-5)
    near({0.5, 0.5}, nd.tensor({{1}, {1}}):softmax(1):view({2}))
  end)

  -- (a +inf score made exp's 2^n from NaN: undefined behaviour that the sanitizer job stops on)
  it("softmax, log_softmax and cross_entropy of a row holding +inf or NaN are NaN, as PyTorch's", function()
    local z = nd.tensor({{math.huge, 1, 2}, {0 / 0, 1, 2}, {-math.huge, 1, 2}})
    for _, dt in ipairs({"float32", "float64"}) do
      local zz = z:to(dt)
      for _, out in ipairs({F.softmax(zz, 2), F.log_softmax(zz, 2)}) do
        for r = 1, 2 do
          for c = 1, 3 do assert.is_true(out[r][c]:item() ~= out[r][c]:item(), dt .. " row " .. r) end
        end
      end
      near({0, math.exp(1) / (math.exp(1) + math.exp(2)), math.exp(2) / (math.exp(1) + math.exp(2))},
           F.softmax(zz, 2)[3]:float())
      local l = F.cross_entropy(zz:narrow(1, 1, 1), nd.tensor({2}, {dtype = "int64"}))
      assert.is_true(l:item() ~= l:item(), dt)
    end
  end)

  it("cross_entropy: plain, ignore_index, label_smoothing, reductions", function()
    local logits = nd.tensor({{1, 2, 3}, {1, 1, 1}}, {dtype = "float64"})
    local lse = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    local row1, row2 = lse - 3, math.log(3)
    near({(row1 + row2) / 2}, F.cross_entropy(logits, {3, 1}))
    near({row1 + row2}, F.cross_entropy(logits, {3, 1}, {reduction = "sum"}))
    near({row1, row2}, F.cross_entropy(logits, nd.tensor({3, 1}, {dtype = "int64"}), {reduction = "none"}))
    near({row1}, F.cross_entropy(logits, {3, 2}, {ignore_index = 2}))
    local logp = {1 - lse, 2 - lse, 3 - lse}
    local smooth = -(0.9 * logp[3] + 0.1 / 3 * (logp[1] + logp[2] + logp[3]))
    near({smooth}, F.cross_entropy(logits[{{1}}], {3}, {label_smoothing = 0.1}))
  end)

  it("nll_loss, mse_loss, binary_cross_entropy_with_logits, linear", function()
    local lp = nd.tensor({{-1, -2}, {-3, -4}}, {dtype = "float64"})
    near({(1 + 4) / 2}, F.nll_loss(lp, {1, 2}))
    near({2.5}, F.mse_loss(nd.tensor({1, 2}), nd.tensor({0, 0})))
    near({math.log(2), math.log(1 + math.exp(-3)) + 0}, F.binary_cross_entropy_with_logits(
      nd.tensor({0, 3}, {dtype = "float64"}), nd.tensor({1, 1}, {dtype = "float64"}), {reduction = "none"}))
    near({6, 6}, F.linear(nd.ones({1, 3}), nd.full({2, 3}, 2), nil):view({2}))
  end)

  it("dropout keeps the expectation and is the identity in evaluation", function()
    nd.manual_seed(7)
    local y = F.dropout(nd.ones({100000}), 0.25, true)
    local kept = y:gt(0):sum():item()
    assert(math.abs(kept / 100000 - 0.75) < 0.01, "kept fraction " .. kept / 100000)
    near({1 / 0.75}, y:max())
    local z = nd.ones({3})
    assert.is_true(rawequal(z, F.dropout(z, 0.5, false)))
  end)

  describe("gradients (float64 finite differences)", function()
    before_each(function() nd.manual_seed(3) end)
    local fns = {
      {"gelu", function(a) return F.gelu(a) end},
      {"gelu tanh", function(a) return F.gelu(a, {approximate = "tanh"}) end},
      {"leaky_relu", function(a) return F.leaky_relu(a, 0.2) end},
      {"softplus", function(a) return F.softplus(a) end},
      {"elu", function(a) return F.elu(a) end},
      {"silu", function(a) return F.silu(a) end},
      {"softmax dim 1", function(a) return F.softmax(a, 1) end},
      {"softmax dim 2", function(a) return F.softmax(a, 2) end},
      {"log_softmax", function(a) return F.log_softmax(a, -1) end},
      {"softmax of a transposed input", function(a) return F.softmax(a:t(), 2) end},
      {"cross_entropy", function(a) return F.cross_entropy(a, {1, 3, 2}) end},
      {"cross_entropy smoothed, ignoring 2", function(a) return F.cross_entropy(a, {1, 3, 2}, {label_smoothing = 0.2, ignore_index = 2}) end},
      {"binary_cross_entropy_with_logits", function(a) return F.binary_cross_entropy_with_logits(a, nd.full({3, 3}, 0.3, {dtype = "float64"})) end},
      {"mse_loss", function(a) return F.mse_loss(a, nd.zeros({3, 3}, {dtype = "float64"})) end},
    }
    for _, f in ipairs(fns) do
      it(f[1], function()
        check(f[2], {G.leaf({3, 3}, -2, 2)})
      end)
    end
    it("softmax second order", function()
      check2(function(a) return F.softmax(a, 2) end, {G.leaf({2, 3})}, {atol = 1e-5})
    end)
    it("log_softmax second order", function()
      check2(function(a) return F.log_softmax(a, 2) end, {G.leaf({2, 3})}, {atol = 1e-5})
    end)
    it("nll_loss with ignore_index", function()
      check(function(a) return F.nll_loss(a:log_softmax(2), {1, 3, 2}, {ignore_index = 3}) end,
        {G.leaf({3, 3})})
    end)
    it("dropout (the same mask on every evaluation via the seed)", function()
      check(function(a) nd.manual_seed(5); return F.dropout(a, 0.4, true) end,
        {G.leaf({4, 3})})
    end)
    it("split and chunk", function()
      check(function(a)
        local p = a:split({1, 3}, 2)
        local q = a:chunk(2, 1)
        return p[2]:sum(2) * 2 + p[1]:view({3}) + q[1]:sum() + q[2]:sum()
      end, {G.leaf({3, 4})})
    end)
    it("linear", function()
      check(function(a, w, b) return F.linear(a, w, b) end,
        {G.leaf({2, 3}), G.leaf({4, 3}), G.leaf({4})})
    end)
  end)

  describe("normalisation and embedding", function()
    before_each(function() nd.manual_seed(11) end)

    it("layer_norm over two dims matches its composite form", function()
      local x = nd.randn({3, 4, 5}, {dtype = "float64"})
      local w, b = nd.randn({4, 5}, {dtype = "float64"}), nd.randn({4, 5}, {dtype = "float64"})
      local mu = x:mean({2, 3}, true)
      local var = ((x - mu) ^ 2):mean({2, 3}, true)
      local ref = (x - mu) / (var + 1e-5):sqrt() * w + b
      local got = F.layer_norm(x, {4, 5}, w, b)
      local d = (got - ref):abs():max():item()
      assert(d < 1e-10, "max difference " .. d)
    end)

    it("layer_norm gradients (first and second order, with and without affine)", function()
      check(function(a, w, b) return F.layer_norm(a:t(), {2}, w, b) end,
        {G.leaf({2, 3}), G.leaf({2}), G.leaf({2})})
      check(function(a) return F.layer_norm(a, {3, 4}) end, {G.leaf({2, 3, 4})})
      check2(function(a, w) return F.layer_norm(a, {3}, w) end,
        {G.leaf({2, 3}), G.leaf({3})}, {atol = 1e-5})
    end)

    it("fused cross_entropy: second order and reductions", function()
      check2(function(a) return F.cross_entropy(a, {2, 1, 3}) end,
        {G.leaf({3, 3})}, {atol = 1e-5})
      check(function(a) return F.cross_entropy(a, {2, 1, 3}, {reduction = "none", label_smoothing = 0.3}) end,
        {G.leaf({3, 3})})
      check(function(a) return F.cross_entropy(a, {2, 1, 3}, {reduction = "sum", ignore_index = 1}) end,
        {G.leaf({3, 3})})
    end)

    it("batch_norm in training: gradients and running statistics", function()
      check(function(a, w, b) return F.batch_norm(a, nil, nil, w, b, true) end,
        {G.leaf({4, 3, 2}), G.leaf({3}), G.leaf({3})})
      local x = nd.tensor({{1, 2}, {3, 6}})
      local rm, rv = nd.zeros({2}), nd.ones({2})
      F.batch_norm(x, rm, rv, nil, nil, true, 0.5)
      near({1, 2}, rm)                        -- 0.5 * 0 + 0.5 * mean {2, 4}
      near({0.5 + 0.5 * 2, 0.5 + 0.5 * 8}, rv) -- unbiased var {2, 8}
      local y = F.batch_norm(x, rm, rv, nil, nil, false)
      near({(1 - 1) / math.sqrt(1.5 + 1e-5), (2 - 2) / math.sqrt(4.5 + 1e-5)}, y[1])
    end)

    it("fused batch_norm matches its composite form (training and evaluation)", function()
      local x = nd.randn({4, 3, 2, 2}, {dtype = "float64"})
      local w, b = nd.randn({3}, {dtype = "float64"}), nd.randn({3}, {dtype = "float64"})
      local mu = x:mean({1, 3, 4}, true)
      local var = ((x - mu) ^ 2):mean({1, 3, 4}, true)
      local ref = (x - mu) / (var + 1e-5):sqrt() * w:view({1, 3, 1, 1}) + b:view({1, 3, 1, 1})
      local d = (F.batch_norm(x, nil, nil, w, b, true) - ref):abs():max():item()
      assert(d < 1e-10, "training: max difference " .. d)
      local rm, rv = nd.randn({3}, {dtype = "float64"}), nd.rand({3}, {dtype = "float64"}) + 0.5
      local ref_eval = (x - rm:view({1, 3, 1, 1})) / (rv:view({1, 3, 1, 1}) + 1e-5):sqrt()
      d = (F.batch_norm(x, rm, rv, nil, nil, false) - ref_eval):abs():max():item()
      assert(d < 1e-10, "evaluation: max difference " .. d)
    end)

    it("batch_norm gradients: evaluation mode and second order in training", function()
      local rm, rv = nd.zeros({3}, {dtype = "float64"}), nd.ones({3}, {dtype = "float64"}) * 2
      check(function(a, w) return F.batch_norm(a, rm, rv, w, nil, false) end,
        {G.leaf({2, 3, 2}), G.leaf({3})})
      check2(function(a) return F.batch_norm(a, nil, nil, nil, nil, true) end,
        {G.leaf({3, 2, 2})}, {atol = 1e-5})
    end)

    it("batch_norm errors name what was expected", function()
      local e = err_of(function() return F.batch_norm(nd.zeros({2, 3}), nd.zeros({4}), nd.ones({4})) end)
      has(e, "needle.batch_norm: running_mean must be a float32 tensor of shape {3} (one value per channel), got float32 {4}")
      e = err_of(function() return F.batch_norm(nd.zeros({2, 3})) end)
      has(e, "evaluation needs running_mean and running_var")
      e = err_of(function() return F.batch_norm(nd.zeros({1, 3}), nd.zeros({3}), nd.ones({3}), nil, nil, true) end)
      has(e, "expected more than 1 value per channel when training")
    end)

    it("embedding looks rows up and leaves the padding row without gradient", function()
      local w = nd.tensor({{1, 2}, {3, 4}, {5, 6}}, {requires_grad = true})
      local e = F.embedding({{3, 1}, {2, 2}}, w, {padding_idx = 2})
      assert.are.same({2, 2, 2}, e.shape)
      assert.are.same({{{5, 6}, {1, 2}}, {{3, 4}, {3, 4}}}, e:totable())
      e:sum():backward()
      assert.are.same({{1, 1}, {0, 0}, {1, 1}}, w.grad:totable()) -- row 2 is padding
    end)
  end)

  it("bad input names the function and what was expected", function()
    -- not a tail call, so the caller's frame (and position) exists
    local e = err_of(function() local l = F.cross_entropy(nd.zeros({2, 3}), {1, 4}); return l end)
    has(e, "needle.cross_entropy: label 4 of row 2 is out of range for 3 classes (expected 1..3)")
    assert.truthy(e:find("functional_spec.lua", 1, true), "error should point at the caller: " .. e)
    e = err_of(function() return F.cross_entropy(nd.zeros({2, 3}), {0, 1}) end)
    has(e, "label 0 of row 1 is out of range")
    e = err_of(function() return F.cross_entropy(nd.zeros({2, 3}), {1}) end)
    has(e, "expected 2 int64 labels (one per row of logits {2,3}), got int64 {1}")
    e = err_of(function() return F.cross_entropy(nd.zeros({3}), {1}) end)
    has(e, "expected float32/float64 logits of shape (N, C), got float32 {3}")
    e = err_of(function() return F.linear(nd.zeros({2, 3}), nd.zeros({4, 5})) end)
    has(e, "needle.linear: input of shape {2,3} does not match weight of shape {4,5} (3 ~= 5)")
    e = err_of(function() return F.gelu(nd.zeros({1}), {approximate = "fast"}) end)
    has(e, "approximate must be 'none' or 'tanh'")
    e = err_of(function() return nd.softmax(nd.arange(3)) end)
    has(e, "needle.softmax: expected a floating point tensor, got int64")
  end)
  it("arguments are checked at entry: the error names the function called", function()
    local x = nd.randn({4, 3})
    -- activations: a wrong argument names the function, not needle.mul
    has(err_of(function() return F.leaky_relu(x, "a") end),
        "needle.leaky_relu: negative_slope must be a finite number, got \"a\"")
    has(err_of(function() return F.leaky_relu(x, 0 / 0) end), "needle.leaky_relu: negative_slope must be a finite number")
    has(err_of(function() return F.elu(x, "a") end), "needle.elu: alpha must be a finite number, got \"a\"")
    has(err_of(function() return F.softplus(x, {beta = 0}) end),
        "needle.softplus: beta must be a finite number other than 0, got 0")
    -- normalize and cosine_similarity: eps >= 0 (NaN refused), dim in range
    has(err_of(function() return F.normalize(x, {eps = -1}) end), "needle.normalize: eps must be >= 0, got -1")
    has(err_of(function() return F.normalize(x, {eps = 0 / 0}) end), "needle.normalize: eps must be >= 0, got")
    has(err_of(function() return F.normalize(x, {dim = 3}) end),
        "needle.normalize: dim 3 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    has(err_of(function() return F.cosine_similarity(x, x, {eps = -1}) end),
        "needle.cosine_similarity: eps must be >= 0, got -1")
    has(err_of(function() return F.cosine_similarity(x, x, {dim = 5}) end),
        "needle.cosine_similarity: dim 5 out of range for a tensor with 2 dims (expected 1..2 or -2..-1)")
    near({1, 1, 1, 1}, F.cosine_similarity(x, x, {dim = -1}))
    -- dropout: training is a boolean, p a number (no options table)
    has(err_of(function() return F.dropout(x, 0.5, "no") end), "needle.dropout: training must be a boolean, got \"no\"")
    has(err_of(function() return F.dropout(x, 0.5, 0) end), "needle.dropout: training must be a boolean, got 0")
    has(err_of(function() return F.dropout(x, {p = 0.5}) end),
        "needle.dropout: p must be in [0, 1], got a table (dropout takes (x, p, training) positionally")
    has(err_of(function() return F.dropout(x, 0 / 0) end), "needle.dropout: p must be in [0, 1], got")
    assert.are.equal(x, F.dropout(x, 0.5, false))
    -- batch_norm's positional arguments
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, true, {momentum = 0.1}) end),
        "needle.batch_norm: momentum (argument 7) must be a number in [0, 1], got a table (batch_norm(x, running_mean, " ..
        "running_var[, weight, bias, training, momentum, eps]) takes positional arguments)")
    has(err_of(function() return F.batch_norm(x, nd.zeros({3}), nd.ones({3}), nil, nil, true, 0 / 0) end),
        "needle.batch_norm: momentum (argument 7) must be a number in [0, 1], got")
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, true, 1.5) end),
        "momentum (argument 7) must be a number in [0, 1], got 1.5")
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, true, 0.1, -1) end),
        "needle.batch_norm: eps (argument 8) must be a number >= 0, got -1")
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, true, 0.1, 0 / 0) end),
        "needle.batch_norm: eps (argument 8) must be a number >= 0, got")
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, "yes") end),
        "needle.batch_norm: training (argument 6) must be a boolean, got \"yes\"")
    -- extra positional arguments are refused, naming the accepted form
    has(err_of(function() return F.relu(x, true) end), "needle.relu: takes relu(x) only, got an extra argument #2: true")
    has(err_of(function() return F.softmax(x, 1, "float64") end),
        "needle.softmax: takes softmax(x[, dim]) only, got an extra argument #3: \"float64\"")
    has(err_of(function() return F.linear(x, nd.randn({2, 3}), nil, 5) end),
        "needle.linear: takes linear(x, weight[, bias]) only, got an extra argument #4: 5")
    has(err_of(function() return F.cross_entropy(x, {1, 2, 3, 1}, nil, 5) end),
        "needle.cross_entropy: takes cross_entropy(logits, labels[, {ignore_index=, label_smoothing=, reduction=}]) " ..
        "only, got an extra argument #4: 5")
    has(err_of(function() return F.gelu(x, nil, 1) end), "needle.gelu: takes gelu(x[, {approximate=}]) only")
    has(err_of(function() return F.layer_norm(x, 3, nil, nil, 1e-5, 1) end),
        "needle.layer_norm: takes layer_norm(x, normalized_shape[, weight, bias, eps]) only, got an extra argument #6: 1")
    has(err_of(function() return F.batch_norm(x, nil, nil, nil, nil, true, 0.1, 1e-5, 1) end),
        "needle.batch_norm: takes batch_norm(x, running_mean, running_var[, weight, bias, training, momentum, eps]) " ..
        "only, got an extra argument #9: 1")
    -- trailing nils are no arguments
    assert.are.same({4, 3}, F.relu(x, nil).shape)
  end)

  -- F.linear runs nd.linear: the GEMM with the bias added in its epilogue when
  -- autograd does not record, matmul + add when it does; both must agree
  -- with the composed ops, on 2-D and 3-D inputs, with and without bias
  it("linear: the epilogue path (no grad) equals matmul + bias, and records when asked", function()
    nd.manual_seed(3)
    for _, shape in ipairs({{5, 7}, {2, 3, 7}, {1, 7}}) do
      local x, w, b = nd.randn(shape), nd.randn({4, 7}), nd.randn({4})
      local want = x:matmul(w:t()) + b
      local got = nd.no_grad(function() return F.linear(x, w, b) end)
      assert.are.same(want.shape, got.shape)
      assert.is_true((got - want):abs():max():item() < 1e-5)
      local nb = nd.no_grad(function() return F.linear(x, w) end)
      assert.is_true((nb - x:matmul(w:t())):abs():max():item() < 1e-5)
    end
    local x, w = nd.randn({3, 7}, {requires_grad = true}), nd.randn({4, 7}, {requires_grad = true})
    local b = nd.randn({4}, {requires_grad = true})
    F.linear(x, w, b):sum():backward()
    assert.is_true((b.grad - nd.full({4}, 3)):abs():max():item() < 1e-6)
    assert.is_true((x.grad - w:detach():sum(1, true):expand({3, 7})):abs():max():item() < 1e-5)
    local e = err_of(function() return F.linear(nd.zeros({2, 3}, {dtype = "float64"}), nd.zeros({4, 3})) end)
    has(e, "needle.linear: input (float64) and weight (float32) must have the same dtype")
  end)
end)

-- The registry walk in gradcheck_spec.lua counts on these cases: they ran and passed.
describe("gradcheck coverage", function()
  it("every op functional_spec.lua claims in G.ELSEWHERE had a passing gradcheck here", function()
    G.assert_covers(assert, "functional_spec.lua")
  end)
end)
