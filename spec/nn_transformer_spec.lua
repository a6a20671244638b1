-- nn_transformer_spec.lua - MultiheadAttention, TransformerEncoderLayer,
-- TransformerEncoder and needle's Transformer: PyTorch fixtures (state_dict
-- loaded by name; outputs, attention weights and gradients at rtol 1e-5,
-- atol 1e-5), keys, masks, deep copies, causality and errors.
local nd = require "needle"
local nn = nd.nn
local MF = require "spec.helpers.module_fixtures"

local TOL = {rtol = 1e-5, atol = 1e-5}

local A = require("spec.helpers.assertions").bind(assert)
local sorted_keys, sorted, max_abs_diff = MF.sorted_keys, MF.sorted, MF.max_abs_diff
local errmsg = A.errmsg

describe("attention modules against PyTorch fixtures", function()
  it("MultiheadAttention, cross attention with a key_padding_mask (sequence first)", function()
    local c = MF.case("mha_key_padding_mask")
    MF.run(c, nn.MultiheadAttention(8, 2), function(m, q, k, v, mask)
      return m(q, k, v, {key_padding_mask = mask})
    end, TOL)
  end)

  it("MultiheadAttention, batch-first self-attention with is_causal", function()
    local c = MF.case("mha_causal")
    local m = nn.MultiheadAttention(8, 2, {batch_first = true})
    MF.run(c, m, function(mod, x) return mod(x, x, x, {is_causal = true}) end, TOL)
    -- the explicit bool mask (PyTorch's) gives the same
    local x = MF.tensor(c.inputs[1])
    local causal = nd.arange(1, 5):view({1, 4}):gt(nd.arange(1, 5):view({4, 1}))
    local a, wa = m(x, x, x, {is_causal = true})
    local b, wb = m(x, x, x, {attn_mask = causal})
    assert.are.same(a:totable(), b:totable())
    assert.are.same(wa:totable(), wb:totable())
  end)

  it("TransformerEncoderLayer, post-norm, sequence first, src_key_padding_mask", function()
    local c = MF.case("encoder_layer_post_norm")
    MF.run(c, nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 12, dropout = 0}), function(m, x, mask)
      return m(x, {src_key_padding_mask = mask})
    end, TOL)
  end)

  it("TransformerEncoderLayer, pre-norm, batch first, gelu, float causal mask", function()
    local c = MF.case("encoder_layer_pre_norm")
    local m = nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 12, dropout = 0, activation = "gelu",
                                                batch_first = true, norm_first = true})
    local mask = nn.Transformer.generate_square_subsequent_mask(4)
    MF.run(c, m, function(mod, x) return mod(x, {src_mask = mask}) end, TOL)
    -- is_causal builds the same mask; PyTorch's positional form works too
    local x = MF.tensor(c.inputs[1])
    MF.close("is_causal output", m(x, {is_causal = true}), c.output, TOL.rtol, TOL.atol)
    MF.close("positional src_mask output", m(x, mask), c.output, TOL.rtol, TOL.atol)
  end)
end)

describe("attention state_dict keys and parameter counts equal PyTorch's", function()
  local builders = {
    mha = function() return nn.MultiheadAttention(64, 8) end,
    mha_nobias = function() return nn.MultiheadAttention(64, 8, {bias = false}) end,
    encoder_layer = function() return nn.TransformerEncoderLayer(64, 8, {dim_feedforward = 256}) end,
    encoder = function()
      return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, {dim_feedforward = 64}), 2,
                                   {norm = nn.LayerNorm(32)})
    end,
  }
  for _, k in ipairs(MF.fixtures.keys) do
    if builders[k.name] then
      it(k.name .. " (" .. k.config .. ")", function()
        local m = builders[k.name]()
        assert.are.same(sorted(k.keys), sorted_keys(m))
        assert.are.equal(k.num_parameters, m:num_parameters())
      end)
    end
  end

  it("MultiheadAttention's default init: xavier_uniform in_proj, zero biases", function()
    nd.manual_seed(11)
    local m = nn.MultiheadAttention(256, 8)
    local bound = math.sqrt(6 / (256 + 768))
    assert.is_true(m.in_proj_weight:abs():max():item() <= bound)
    local std = m.in_proj_weight:std():item()
    local pt = MF.fixtures.init.mha_in_proj_weight
    assert.is_true(math.abs(std - pt.std) < 0.01 * pt.std, ("std %g, PyTorch %g"):format(std, pt.std))
    assert.are.equal(0, m.in_proj_bias:abs():sum():item())
    assert.are.equal(0, m.out_proj.bias:abs():sum():item())
    -- out_proj keeps Linear's init
    assert.is_true(m.out_proj.weight:abs():max():item() <= 1 / 16)
    assert.is_true(m.out_proj.weight:std():item() > 0.8 / 16 / math.sqrt(3))
  end)
end)

describe("MultiheadAttention", function()
  nd.manual_seed(12)
  local m = nn.MultiheadAttention(8, 2, {batch_first = true})
  local x = nd.randn({3, 5, 8})

  it("returns averaged weights whose rows sum to 1; per-head weights; none", function()
    local out, w = m(x, x, x)
    assert.are.same({3, 5, 8}, out.shape)
    assert.are.same({3, 5, 5}, w.shape)
    assert.is_true(max_abs_diff(w:sum(3), nd.ones({3, 5})) < 1e-5)
    local out2, heads = m(x, x, x, {average_attn_weights = false})
    assert.are.same({3, 2, 5, 5}, heads.shape)
    assert.is_true(max_abs_diff(heads:mean(2), w) < 1e-6)
    assert.are.same(out:totable(), out2:totable())
    local out3, none = m(x, x, x, {need_weights = false})
    assert.is_nil(none)
    -- without the weights the fused kernel runs (its sums in another order)
    assert.is_true(max_abs_diff(out, out3) < 1e-6)
  end)

  it("masked keys get zero weight; a (N*H, L, S) mask works; unbatched input", function()
    local kpm = nd.tensor({{false, false, true, true, true}, {false, false, false, false, false},
                           {true, false, false, false, false}})
    local _, w = m(x, x, x, {key_padding_mask = kpm})
    assert.are.equal(0, w[1][{":", {3, 5}}]:abs():sum():item())
    assert.are.equal(0, w[3][{":", 1}]:abs():sum():item())
    local _, wc = m(x, x, x, {is_causal = true})
    for i = 1, 4 do assert.are.equal(0, wc[{":", i, {i + 1, 5}}]:abs():sum():item()) end
    local causal = nn.Transformer.generate_square_subsequent_mask(5)
    local per_head = causal:view({1, 5, 5}):expand({6, 5, 5}):contiguous()
    local a = m(x, x, x, {attn_mask = per_head})
    local b = m(x, x, x, {is_causal = true})
    assert.is_true(max_abs_diff(a, b) < 1e-6)
    -- the packed projections (q = k = v, or k = v) equal the separate ones
    local q, kv = nd.randn({3, 2, 8}), nd.randn({3, 5, 8})
    assert.is_true(max_abs_diff(m(q, kv, kv), m(q, kv:clone(), kv:clone())) < 1e-6)
    assert.is_true(max_abs_diff(m(x, x, x), m(x, x:clone(), x:clone())) < 1e-6)
    assert.is_true(max_abs_diff(m(x), m(x, x, x)) == 0)
    local single, ws = m(x[2], x[2], x[2])
    assert.are.same({5, 8}, single.shape)
    assert.are.same({5, 5}, ws.shape)
    assert.is_true(max_abs_diff(single, m(x, x, x)[2]) < 1e-5)
  end)

  it("dropout on the attention weights only in training", function()
    nd.manual_seed(13)
    local d = nn.MultiheadAttention(8, 2, {dropout = 0.5, batch_first = true})
    local a = d(x, x, x)
    local b = d(x, x, x)
    assert.is_true(max_abs_diff(a, b) > 0)
    d:eval()
    assert.are.same(d(x, x, x):totable(), d(x, x, x):totable())
  end)

  it("errors name the module, its config and the shapes", function()
    assert.truthy(errmsg(m, nd.zeros({3, 5, 6}))
      :find("needle.nn.MultiheadAttention(8, 2): expected query of shape (N, L, 8) or (L, 8), got {3,5,6}", 1, true))
    assert.truthy(errmsg(m, x, x, x, {key_padding_mask = nd.zeros({3, 4}, {dtype = "bool"})})
      :find("needle.nn.MultiheadAttention(8, 2): key_padding_mask must have shape {3,5} (batch, source length), got {3,4}", 1, true))
    assert.truthy(errmsg(m, x, x, x, {attn_mask = nd.zeros({4, 4}, {dtype = "bool"})})
      :find("needle.nn.MultiheadAttention(8, 2): attn_mask must have shape {5,5} or {6,5,5}, got {4,4}", 1, true))
    assert.truthy(errmsg(nn.MultiheadAttention, 10, 3)
      :find("needle.nn.MultiheadAttention(10, 3): embed_dim must be divisible by num_heads", 1, true))
    assert.truthy(errmsg(nn.TransformerEncoderLayer(8, 2), nd.zeros({4, 2, 6}))
      :find("needle.nn.TransformerEncoderLayer(8, 2): expected input of shape (S, N, 8) or (S, 8), got {4,2,6}", 1, true))
  end)
end)

describe("the feed-forward block's first linear layer and its activation in one kernel", function()
  -- nn/linear.lua's linear_act: a named relu or gelu goes into the fused linear's epilogue
  for _, act in ipairs({"relu", "gelu"}) do
    it(act .. ": one fused_linear call, the values and gradients of the activation after the layer bit for bit", function()
      for _, Layer in ipairs({"TransformerEncoderLayer", "TransformerDecoderLayer"}) do
        nd.manual_seed(41)
        local fused = nn[Layer](16, 2, {dim_feedforward = 24, dropout = 0, activation = act})
        local plain = nn[Layer](16, 2, {dim_feedforward = 24, dropout = 0,
                                        activation = function(v) return nd.F[act](v) end})
        plain:load_state_dict(fused:state_dict())
        local x = nd.randn({5, 3, 16}, {requires_grad = true})
        local function run(m)
          local y = Layer == "TransformerEncoderLayer" and m(x) or m(x, x)
          return y, nd.grad((y * y):sum(), {x, m.linear1.weight, m.linear1.bias, m.linear2.weight})
        end
        local rep, y1, g1 = nd.profile(function() return run(fused) end)
        local y2, g2 = run(plain)
        assert.is_truthy(rep.by_name["F.fused_linear"], Layer .. ": no fused_linear call")
        assert.is_nil(rep.by_name["F." .. act], Layer .. ": the activation ran on its own")
        assert.are.equal(0, max_abs_diff(y1, y2), Layer)
        for i = 1, #g1 do assert.are.equal(0, max_abs_diff(g1[i], g2[i]), Layer .. " gradient " .. i) end
      end
    end)
  end

  it("runs linear1 as a module when it has a hook, which sees its output before the activation", function()
    nd.manual_seed(42)
    local layer = nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 12, dropout = 0})
    local seen
    local h = layer.linear1:register_forward_hook(function(_, _, out) seen = out end)
    local x = nd.randn({4, 2, 8})
    layer(x)
    h:remove()
    assert.is_truthy(seen, "the hook on linear1 did not run")
    assert.is_true(seen:min():item() < 0, "the hook saw the activation's output, not linear1's")
  end)
end)

describe("TransformerEncoder", function()
  it("holds independent deep copies of the layer and applies them in order", function()
    nd.manual_seed(14)
    local layer = nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 16, dropout = 0, batch_first = true})
    local enc = nn.TransformerEncoder(layer, 3, {norm = nn.LayerNorm(8)})
    assert.are.equal(3, #enc.layers)
    assert.are.equal(3 * layer:num_parameters() + 16, enc:num_parameters())
    -- same values, different tensors
    for i = 1, 3 do
      local l = enc.layers[i]
      assert.are_not.equal(layer.linear1.weight, l.linear1.weight)
      assert.are.same(layer.linear1.weight:totable(), l.linear1.weight:totable())
      assert.is_true(l.linear1.weight.requires_grad and l.linear1.weight.is_leaf)
      assert.are.equal(l.dropout.__name, "Dropout")
    end
    nd.no_grad(function() enc.layers[1].linear1.weight:fill_(0) end)
    assert.is_true(enc.layers[2].linear1.weight:abs():sum():item() > 0)
    assert.is_true(layer.linear1.weight:abs():sum():item() > 0)
    local x = nd.randn({2, 4, 8})
    local want = x
    for i = 1, 3 do want = enc.layers[i](want, {is_causal = true}) end
    want = enc.norm(want)
    assert.is_true(max_abs_diff(enc(x, {is_causal = true}), want) < 1e-6)
    -- backward reaches every copy
    enc(x):sum():backward()
    for _, p in ipairs(enc:named_parameters()) do assert.truthy(p[2].grad, p[1]) end
    assert.is_nil(layer.linear1.weight.grad)
  end)

  it("clone_module keeps tied weights tied and train/eval state", function()
    local clone = require("needle.nn.transformer").clone_module
    local a = nn.Linear(4, 4)
    local m = nn.Sequential(a, nn.ReLU(), nn.Linear(4, 4))
    m[3].weight = a.weight
    m:eval()
    local c = clone(m)
    assert.are.equal(c[1].weight, c[3].weight)
    assert.are_not.equal(m[1].weight, c[1].weight)
    assert.is_false(c.training)
    assert.is_false(c[2].training)
    assert.are.equal(#m:parameters(), #c:parameters())
    assert.are.equal(3, #c)
    assert.are.same(m:state_dict()["0.bias"]:totable(), c:state_dict()["0.bias"]:totable())
  end)
end)

describe("Transformer (needle's decoder-only model)", function()
  it("maps (T, B, D) to (T, B, D) with learned positions, causally", function()
    nd.manual_seed(15)
    local m = nn.Transformer(16, 32, 2, {num_head = 4})
    local x = nd.randn({6, 2, 16})
    local y, h = m(x)
    assert.are.same({6, 2, 16}, y.shape)
    assert.are.same({6, 2, 16}, h.shape)
    assert.are.same({16 * 2048}, {m.pos_embedding.weight:numel()})
    -- changing the last position leaves the earlier outputs alone
    local x2 = x:clone()
    x2[6] = nd.randn({2, 16})
    local y2 = m(x2)
    assert.is_true(max_abs_diff(y[{{1, 5}}], y2[{{1, 5}}]) < 1e-6)
    assert.is_true(max_abs_diff(y[6], y2[6]) > 1e-3)
    -- non-causal: earlier outputs change too
    local nc = nn.Transformer(16, 32, 1, {num_head = 4, causal = false})
    assert.is_true(max_abs_diff(nc(x)[1], nc(x2)[1]) > 1e-4)
    -- gradients reach the positional embedding
    y:sum():backward()
    assert.truthy(m.pos_embedding.weight.grad)
    local keys = sorted_keys(m)
    assert.are.equal("layers.0.linear1.bias", keys[1])
    assert.are.equal("pos_embedding.weight", keys[#keys])
  end)

  it("batch_first, head defaults and errors", function()
    local m = nn.Transformer(16, 32, 1, {batch_first = true, sequence_len = 8})
    assert.are.same({2, 5, 16}, m(nd.randn({2, 5, 16})).shape)
    assert.are.equal(2, m.num_head)
    assert.are.equal(8, nn.Transformer(64, 32, 1).num_head)
    assert.are.equal(4, nn.Transformer(64, 32, 1, {dim_head = 16}).num_head)
    assert.truthy(errmsg(m, nd.randn({2, 9, 16}))
      :find("needle.nn.Transformer(16, 32, 1): sequence length 9 exceeds sequence_len 8", 1, true))
    assert.truthy(errmsg(m, nd.randn({2, 5, 8}))
      :find("needle.nn.Transformer(16, 32, 1): expected input of shape (B, T, 16), got {2,5,8}", 1, true))
    assert.truthy(errmsg(nn.Transformer, 16, 32, 1, {num_head = 3, dim_head = 5})
      :find("num_head (3) * dim_head (5) must equal embedding_size 16", 1, true))
  end)

  it("prints its layers", function()
    local s = tostring(nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 16}))
    assert.truthy(s:find("TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16\n  (self_attn): MultiheadAttention(embed_dim=8, num_heads=2, dropout=0.1\n    (out_proj): Linear(in_features=8, out_features=8, bias=true)\n  )\n  (linear1): Linear", 1, true))
  end)
end)
