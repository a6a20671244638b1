-- losses_spec.lua - the losses of nd.F and nd.nn added for issue 20 (l1,
-- smooth_l1, huber, binary_cross_entropy, kl_div, margin_ranking,
-- cosine_embedding, triplet_margin; pairwise_distance): outputs and
-- gradients against PyTorch's (spec/fixtures/gen/gen_torch_losses.py wrote
-- the fixtures; float32, relative 1e-5), float64 finite-difference
-- gradchecks, the modules, and their errors.
local nd = require "needle"
local F = nd.F
local nn = nd.nn
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)

local fixtures = X.load("torch_losses")

describe("losses against PyTorch", function()
  it("every case: output and gradients", function()
    assert.is_true(#fixtures >= 30)
    for i, c in ipairs(fixtures) do
      local consts = {}
      for k, t in ipairs(c.consts) do consts[k] = X.tensor(t) end
      local opts = {}
      for k, v in pairs(c.options) do opts[k] = v end
      -- the weighted binary cross-entropy's weight is its second constant
      if c.name == "binary_cross_entropy" and #consts == 2 then opts.weight = table.remove(consts) end
      local label = ("%d %s %s"):format(i, c.name, require("needle.options").valid_list(opts))
      X.check_case(label, c, function(...)
        local args = table.pack(...)
        for k = 1, #consts do args[args.n + k] = consts[k] end
        local n = args.n + #consts
        args[n + 1] = opts
        return F[c.name](table.unpack(args, 1, n + 1))
      end)
    end
  end)
end)

describe("losses: float64 gradchecks", function()
  local function target(shape) return G.leaf(shape):detach() end

  it("l1, smooth_l1, huber (away from their kinks)", function()
    nd.manual_seed(31)
    local t = target({3, 4})
    C.check(function(x) return F.l1_loss(x, t, {reduction = "sum"}) end, {G.leaf({3, 4})})
    C.check(function(x) return F.smooth_l1_loss(x, t, {beta = 0.5, reduction = "none"}) end, {G.leaf({3, 4})})
    C.check(function(x) return F.huber_loss(x, t, {delta = 0.3, reduction = "none"}) end, {G.leaf({3, 4})})
  end)

  it("binary_cross_entropy, kl_div (input and target)", function()
    nd.manual_seed(32)
    local y = (G.leaf({3, 4}):detach() + 1) / 2
    C.check(function(p) return F.binary_cross_entropy(p, y, {reduction = "none"}) end, {G.leaf({3, 4}, 0.1, 0.9)})
    C.check(function(x, q) return F.kl_div(x, q, {reduction = "none"}) end, {G.leaf({3, 4}), G.leaf({3, 4}, 0.1, 1)})
    C.check(function(x, q) return F.kl_div(x, q, {log_target = true, reduction = "sum"}) end,
            {G.leaf({3, 4}), G.leaf({3, 4})})
  end)

  it("margin_ranking, cosine_embedding, triplet_margin, pairwise_distance", function()
    nd.manual_seed(33)
    local y = nd.tensor({1, -1, 1, -1, 1}, {dtype = "float64"})
    C.check(function(a, b) return F.margin_ranking_loss(a, b, y, {margin = 0.1, reduction = "none"}) end,
            {G.leaf({5}), G.leaf({5})})
    C.check(function(a, b) return F.cosine_embedding_loss(a, b, y, {reduction = "none"}) end,
            {G.leaf({5, 3}), G.leaf({5, 3})})
    C.check(function(a, p, n) return F.triplet_margin_loss(a, p, n, {margin = 2, reduction = "none"}) end,
            {G.leaf({5, 3}), G.leaf({5, 3}), G.leaf({5, 3})})
    C.check(function(a, b) return F.pairwise_distance(a, b, {p = 3}) end, {G.leaf({4, 3}), G.leaf({4, 3})})
  end)
end)

describe("loss modules", function()
  it("call their nd.F function with their options", function()
    nd.manual_seed(34)
    local x, t = nd.randn({4, 3}), nd.randn({4, 3})
    local same = function(a, b) assert.are.same(a:totable(), b:totable()) end
    same(nn.L1Loss()(x, t), F.l1_loss(x, t))
    same(nn.SmoothL1Loss({beta = 0.3, reduction = "sum"})(x, t), F.smooth_l1_loss(x, t, {beta = 0.3, reduction = "sum"}))
    same(nn.HuberLoss({delta = 2})(x, t), F.huber_loss(x, t, {delta = 2}))
    local p, y = x:sigmoid(), t:sigmoid()
    same(nn.BCELoss({weight = y})(p, y), F.binary_cross_entropy(p, y, {weight = y}))
    local lp, q = x:log_softmax(2), t:softmax(2)
    same(nn.KLDivLoss({reduction = "batchmean"})(lp, q), F.kl_div(lp, q, {reduction = "batchmean"}))
    local lab = nd.tensor({1, -1, 1, -1})
    same(nn.MarginRankingLoss({margin = 0.2})(x[{":", 1}], t[{":", 1}], lab),
         F.margin_ranking_loss(x[{":", 1}], t[{":", 1}], lab, {margin = 0.2}))
    same(nn.CosineEmbeddingLoss({margin = 0.1})(x, t, lab), F.cosine_embedding_loss(x, t, lab, {margin = 0.1}))
    same(nn.TripletMarginLoss({swap = true, p = 1})(x, t, -x), F.triplet_margin_loss(x, t, -x, {swap = true, p = 1}))
    assert.are.equal("TripletMarginLoss(p=1, swap=true, reduction='mean')", tostring(nn.TripletMarginLoss({swap = true, p = 1})))
  end)

  it("a probability of 0 or 1 gives a finite binary cross-entropy (logs clamped at -100)", function()
    local loss = F.binary_cross_entropy(nd.tensor({0, 1}), nd.tensor({1, 0}), {reduction = "none"})
    assert.are.same({100, 100}, loss:totable())
  end)

  it("bad input is an error naming the loss", function()
    local x = nd.randn({4, 3})
    assert.has_error(function() F.l1_loss(x, nd.randn({3, 4})) end,
                     "needle.l1_loss: input {4,3} and target {3,4} must have the same shape")
    assert.has_error(function() F.huber_loss(x, x, {delta = 0}) end, "needle.huber_loss: delta must be a number > 0, got 0")
    assert.has_error(function() F.smooth_l1_loss(x, x, {beta = -1}) end,
                     "needle.smooth_l1_loss: beta must be a number >= 0, got -1")
    assert.has_error(function() F.kl_div(x, x, {reduction = "avg"}) end,
                     "needle.kl_div: reduction must be 'mean', 'sum' or 'none', got avg")
    assert.has_error(function() F.cosine_embedding_loss(nd.randn({2, 3, 4}), nd.randn({2, 3, 4}), nd.ones({2})) end,
                     "needle.cosine_embedding_loss: expected inputs of shape (N, D) or (D), got {2,3,4}")
    assert.has_error(function() nn.HuberLoss({delt = 1}) end,
                     "needle.nn.HuberLoss: unknown option 'delt' (valid: delta, reduction)")
    assert.has_error(function() nn.L1Loss()(1, x) end, "needle.nn.L1Loss: expected a tensor input, got number")
  end)

  it("every elementwise loss refuses input and target of different shapes (no silent broadcast)", function()
    local A = require("spec.helpers.assertions").bind(assert)
    local col, row = nd.rand({4}), nd.rand({4, 1})
    for _, name in ipairs({"mse_loss", "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss", "huber_loss",
                           "binary_cross_entropy", "kl_div"}) do
      A.assert_contains(A.errmsg(F[name], col, row), ("needle.%s: input {4} and target {4,1} must have the same shape"):format(name))
    end
    A.assert_contains(A.errmsg(F.margin_ranking_loss, col, col, nd.ones({4, 1})),
                      "needle.margin_ranking_loss: input {4} and target {4,1} must have the same shape")
    A.assert_contains(A.errmsg(F.margin_ranking_loss, col, row, nd.ones({4})),
                      "needle.margin_ranking_loss: input {4} and x2 {4,1} must have the same shape")
    A.assert_contains(A.errmsg(F.triplet_margin_loss, row, row, col),
                      "needle.triplet_margin_loss: input {4,1} and negative {4} must have the same shape")
    A.assert_contains(A.errmsg(F.cosine_embedding_loss, nd.randn({4, 3}), nd.randn({4, 3}), nd.ones({4, 1})),
                      "needle.cosine_embedding_loss: target must have shape {4} (one per row of input {4,3}), got {4,1}")
    -- a missing target names the loss, not the op inside it
    A.assert_contains(A.errmsg(F.mse_loss, col, nil), "needle.mse_loss: target must be a tensor, got nil")
    A.assert_contains(A.errmsg(F.mse_loss, col, col, nil, 5),
                      "needle.mse_loss: takes mse_loss(input, target[, {reduction=}]) only, got an extra argument #4: 5")
  end)

  it("values out of their range are refused", function()
    local A = require("spec.helpers.assertions").bind(assert)
    local x = nd.randn({4, 3})
    A.assert_contains(A.errmsg(F.margin_ranking_loss, x, x, x:sign(), {margin = 0 / 0}),
                      "needle.margin_ranking_loss: margin must be a finite number, got")
    A.assert_contains(A.errmsg(F.triplet_margin_loss, x, x, x, {margin = 0 / 0}),
                      "needle.triplet_margin_loss: margin must be a finite number, got")
    A.assert_contains(A.errmsg(F.triplet_margin_loss, x, x, x, {p = 0}), "needle.triplet_margin_loss: p must be > 0, got 0")
    A.assert_contains(A.errmsg(F.cosine_embedding_loss, x, x, nd.ones({4}), {margin = 0 / 0}),
                      "needle.cosine_embedding_loss: margin must be a finite number, got")
    -- cosine_embedding_loss: targets are 1 or -1 (2 would count for nothing)
    A.assert_contains(A.errmsg(F.cosine_embedding_loss, x, x, nd.tensor({1, -1, 2, 1})),
                      "needle.cosine_embedding_loss: target values must be 1 or -1, got 2")
    assert.is_true(F.cosine_embedding_loss(x, x, nd.tensor({1, -1, -1, 1})):item() >= 0)
    -- binary_cross_entropy: probabilities in [0, 1] (NaN too is refused)
    local t = nd.rand({4})
    A.assert_contains(A.errmsg(F.binary_cross_entropy, nd.full({4}, 2), t),
                      "needle.binary_cross_entropy: all elements of input should be between 0 and 1 (probabilities), got 2")
    A.assert_contains(A.errmsg(F.binary_cross_entropy, nd.tensor({0.5, -0.5, 0.5, 0.5}), t),
                      "all elements of input should be between 0 and 1 (probabilities), got -0.5")
    A.assert_contains(A.errmsg(F.binary_cross_entropy, nd.tensor({0.5, 0 / 0, 0.5, 0.5}), t),
                      "all elements of input should be between 0 and 1")
  end)
end)
