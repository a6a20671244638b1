-- nn_sequence_spec.lua - the sequence pieces of issue 20:
-- F.scaled_dot_product_attention, nn.MultiheadAttention's kdim/vdim,
-- add_bias_kv and add_zero_attn, TransformerDecoderLayer, TransformerDecoder,
-- PyTorch's encoder-decoder nn.Transformer{...}, ModuleDict, ParameterList,
-- ParameterDict, F.ctc_loss and nn.CTCLoss: against PyTorch
-- (spec/fixtures/gen/gen_torch_sequence.py wrote the fixtures; float32,
-- relative 1e-5), float64 finite differences, on every device, and their
-- errors. Bidirectional RNN/LSTM/GRU run in spec/rnn_spec.lua.
local nd = require "needle"
local F = nd.F
local nn = nd.nn
local D = require "spec.helpers.devices"
local MF = require "spec.helpers.module_fixtures"
local G = require "spec.helpers.gradcheck"
local C = G.bind(assert)
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, has = A.errmsg, A.has

local FIX = dofile("spec/fixtures/torch_sequence.lua")
local T = MF.tensor
local TOL = {rtol = 1e-5, atol = 1e-5}
local DEV_TOL = {rtol = 1e-4, atol = 1e-5} -- another device's kernels sum in another order

local function find(list, name)
  for _, c in ipairs(list) do if c.name == name then return c end end
  error("no fixture " .. name, 2)
end

-- inputs moved to dev on the way in, the result back (both transfers are
-- differentiable): a fixture's cpu check then runs dev's kernels
local function via(dev, fn)
  if dev == "cpu" then return fn end
  return function(...)
    local args = table.pack(...)
    for i = 1, args.n do
      if nd.is_tensor(args[i]) then args[i] = args[i]:to(dev) end
    end
    local out, extra = fn(table.unpack(args, 1, args.n))
    return out:to("cpu"), extra and extra:to("cpu")
  end
end

-- scaled_dot_product_attention --------------------------------------------------------

-- the needle call of a fixture case
local function sdpa_call(c, dev)
  local opts = {is_causal = c.is_causal or nil, scale = c.scale}
  if c.attn_mask then opts.attn_mask = T(c.attn_mask):to(dev) end
  return via(dev, function(q, k, v) return F.scaled_dot_product_attention(q, k, v, opts) end)
end

local function check_sdpa(c, dev, tol)
  local inputs = {}
  for i, t in ipairs(c.inputs) do
    inputs[i] = T(t)
    inputs[i].requires_grad = true
  end
  local out = sdpa_call(c, dev)(table.unpack(inputs))
  MF.close(c.name .. " output on " .. dev, out, c.output, tol.rtol, tol.atol)
  local grads = nd.grad((out * T(c.w)):sum(), inputs)
  for i = 1, 3 do MF.close(c.name .. " grad " .. i .. " on " .. dev, grads[i], c.grads[i], tol.rtol, tol.atol) end
end

-- shapes of q, k, v and the options: masks of every broadcast, causal with
-- L ~= S, blocks of queries, broadcast batch dims (draws the masks)
local function sdpa_cases()
  return {
    {{2, 3, 5, 8}, {2, 3, 7, 8}, {2, 3, 7, 4}, {}},
    {{2, 3, 130, 16}, {2, 3, 130, 16}, {2, 3, 130, 16}, {is_causal = true}}, -- 2 query blocks
    {{2, 6, 8}, {2, 9, 8}, {2, 9, 8}, {is_causal = true}},                     -- L < S
    {{2, 9, 8}, {2, 6, 8}, {2, 6, 8}, {is_causal = true}},                     -- L > S
    {{4, 9, 8}, {4, 11, 8}, {4, 11, 6}, {attn_mask = nd.randn({9, 11})}},
    {{2, 2, 9, 8}, {2, 2, 11, 8}, {2, 2, 11, 6}, {attn_mask = nd.rand({2, 1, 1, 11}):gt(0.3)}},
    {{2, 2, 9, 8}, {1, 2, 11, 8}, {2, 1, 11, 6}, {attn_mask = nd.randn({2, 1, 9, 11}):transpose(3, 4):transpose(3, 4)}},
    {{9, 8}, {11, 8}, {11, 6}, {scale = 0.3}},
    {{1, 12, 1, 64}, {1, 12, 300, 64}, {1, 12, 300, 64}, {}},                  -- one query, a long cache
  }
end

describe("F.scaled_dot_product_attention", function()
  it("matches PyTorch (masks, is_causal, scale, broadcast batch dims, unbatched): output and gradients", function()
    assert.are.equal(7, #FIX.sdpa)
    for _, c in ipairs(FIX.sdpa) do check_sdpa(c, "cpu", TOL) end
  end)

  it("float64 gradients by finite differences (float mask, causal, scale)", function()
    nd.manual_seed(71)
    local mask = G.leaf({3, 5}):detach()
    C.check(function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {attn_mask = mask, scale = 0.7}) end,
            {G.leaf({2, 3, 4}), G.leaf({2, 5, 4}), G.leaf({2, 5, 2})})
    C.check(function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {is_causal = true}) end,
            {G.leaf({4, 3}), G.leaf({4, 3}), G.leaf({4, 3})})
  end)

  it("is nn.MultiheadAttention's core: a head-split MHA equals it on the projections", function()
    nd.manual_seed(72)
    local m = nn.MultiheadAttention(8, 2, {batch_first = true})
    local x = nd.randn({2, 5, 8})
    local w, b = m.in_proj_weight, m.in_proj_bias
    local qkv = F.linear(x, w, b)
    local function heads(t) return t:reshape({2, 5, 2, 4}):permute({1, 3, 2, 4}) end
    local q, k, v = heads(qkv:narrow(3, 1, 8)), heads(qkv:narrow(3, 9, 8)), heads(qkv:narrow(3, 17, 8))
    local o = F.scaled_dot_product_attention(q, k, v, {is_causal = true})
    local want = m.out_proj(o:permute({1, 3, 2, 4}):reshape({2, 5, 8}))
    assert.is_true(MF.max_abs_diff(m(x, x, x, {is_causal = true}), want) < 1e-6)
  end)

  it("dropout_p drops weights whenever it is > 0 (PyTorch's function has no training flag)", function()
    nd.manual_seed(73)
    local q, k, v = nd.randn({2, 3, 4}), nd.randn({2, 6, 4}), nd.randn({2, 6, 4})
    local plain = F.scaled_dot_product_attention(q, k, v)
    nd.manual_seed(5)
    local a = F.scaled_dot_product_attention(q, k, v, {dropout_p = 0.5})
    nd.manual_seed(5)
    local b = F.scaled_dot_product_attention(q, k, v, {dropout_p = 0.5})
    assert.are.same(a:totable(), b:totable())
    assert.is_true(MF.max_abs_diff(a, plain) > 1e-3)
    assert.are.equal(0, F.scaled_dot_product_attention(q, k, v, {dropout_p = 1}):abs():sum():item())
  end)

  describe("its fused kernel (CPU float32: core._attention)", function()
    local sdpa = F.scaled_dot_product_attention
    -- the composed ops in float64, the reference the kernel must meet
    local function composed64(q, k, v, opts)
      local o = {}
      for key, val in pairs(opts or {}) do o[key] = val end
      if o.attn_mask and o.attn_mask.dtype == "float32" then o.attn_mask = o.attn_mask:double() end
      return sdpa(q:double(), k:double(), v:double(), o)
    end

    it("matches PyTorch on the fixtures, outputs computed under no_grad", function()
      local n = 0
      for _, c in ipairs(FIX.sdpa) do
        local inputs = {}
        for i, t in ipairs(c.inputs) do inputs[i] = T(t) end
        assert.are.equal("float32", inputs[1].dtype)
        local out = nd.no_grad(function() return sdpa_call(c, "cpu")(table.unpack(inputs)) end)
        MF.close(c.name .. " (fused kernel)", out, c.output, TOL.rtol, TOL.atol)
        n = n + 1
      end
      assert.are.equal(7, n)
    end)

    it("equals the composed ops: masks of every broadcast, causal with L ~= S, strided heads, blocks of queries", function()
      nd.manual_seed(74)
      local x = nd.randn({2, 7, 3 * 2 * 8})
      local function heads(t) return t:reshape({2, 7, 2, 8}):transpose(2, 3) end -- strided views
      local cases = sdpa_cases()
      for i, c in ipairs(cases) do
        local q, k, v = nd.randn(c[1]), nd.randn(c[2]), nd.randn(c[3])
        local got = sdpa(q, k, v, c[4])
        assert.are.equal("float32", got.dtype)
        local d = MF.max_abs_diff(got:double(), composed64(q, k, v, c[4]))
        assert.is_true(d < 2e-6, ("case %d: %g"):format(i, d))
      end
      local q, k, v = heads(x:narrow(3, 1, 16)), heads(x:narrow(3, 17, 16)), heads(x:narrow(3, 33, 16))
      local d = MF.max_abs_diff(sdpa(q, k, v, {is_causal = true}):double(), composed64(q, k, v, {is_causal = true}))
      assert.is_true(d < 2e-6, "strided heads: " .. d)
    end)

    it("runs without the (..., L, S) tensors: its output is all it allocates", function()
      local q, k, v = nd.randn({2, 3, 40, 8}), nd.randn({2, 3, 50, 8}), nd.randn({2, 3, 50, 8})
      local report = nd.profile(function() F.scaled_dot_product_attention(q, k, v, {is_causal = true}) end)
      assert.are.equal(2 * 3 * 40 * 8 * 4, report.by_name["F.scaled_dot_product_attention"].total_bytes)
    end)

    it("rows with nothing to attend are NaN, no keys give zeros, as the composed ops", function()
      local q, k, v = nd.randn({1, 2, 3, 4}), nd.randn({1, 2, 5, 4}), nd.randn({1, 2, 5, 4})
      local mask = nd.ones({3, 5}, {dtype = "bool"})
      mask[2] = false -- query 2 attends to nothing
      local got, want = sdpa(q, k, v, {attn_mask = mask}), composed64(q, k, v, {attn_mask = mask})
      for h = 1, 2 do
        for e = 1, 4 do
          assert.is_true(got[{1, h, 2, e}]:item() ~= got[{1, h, 2, e}]:item(), "NaN row")
          assert.is_true(want[{1, h, 2, e}]:item() ~= want[{1, h, 2, e}]:item(), "NaN row (composed)")
        end
      end
      assert.is_true(MF.max_abs_diff(got[{{}, {}, 1}]:double(), want[{{}, {}, 1}]) < 1e-6)
      local none = sdpa(q, nd.randn({1, 2, 0, 4}), nd.randn({1, 2, 0, 6}))
      assert.are.same({1, 2, 3, 6}, none.shape)
      assert.are.equal(0, none:abs():sum():item())
      assert.are.equal(0, composed64(q, nd.randn({1, 2, 0, 4}), nd.randn({1, 2, 0, 6})):abs():sum():item())
    end)

    it("leaves a mask that requires grad to the composed ops, which give it its gradient", function()
      local core = require "needle.core"
      local q, k, v = nd.randn({2, 3, 4}), nd.randn({2, 5, 4}), nd.randn({2, 5, 4})
      local mask = nd.randn({3, 5}, {requires_grad = true})
      local gm = nd.grad(sdpa(q, k, v, {attn_mask = mask}):sum(), {mask})[1]
      local want = nd.grad(composed64(q, k, v, {attn_mask = mask}):sum(), {mask})[1]
      assert.is_true(MF.max_abs_diff(gm:double(), want) < 1e-5)
      -- the kernel itself refuses to give the mask none
      has(errmsg(core._attention, q:view({1, 2, 3, 4}), k:view({1, 2, 5, 4}), v:view({1, 2, 5, 4}),
                 mask:view({1, 1, 3, 5}):expand({1, 2, 3, 5}), 0.5, false),
          "attention: gives the mask no gradient (it requires grad)")
    end)

    it("the kernel checks its own arguments", function()
      local core = require "needle.core"
      local q, k, v = nd.randn({1, 2, 3, 4}), nd.randn({1, 2, 5, 4}), nd.randn({1, 2, 5, 6})
      has(errmsg(core._attention, q, nd.randn({1, 2, 5, 3}), v, nil, 1, false),
          "attention: query {1,2,3,4}, key {1,2,5,3} and value {1,2,5,6} do not fit")
      has(errmsg(core._attention, q, k, v, nd.zeros({1, 2, 3, 4}), 1, false),
          "attention: the mask must have shape {1,2,3,5} (B, H, L, S), got {1,2,3,4}")
      has(errmsg(core._attention, q, k, v:double(), nil, 1, false),
          "attention: query (float32) and value (float64) must have the same dtype")
      has(errmsg(core._attention, q:view({2, 3, 4}), k, v, nil, 1, false),
          "attention: expected a 4-D query (batch, heads, rows, features), got shape {2,3,4}")
      has(errmsg(core._attention, q:half(), k:half(), v:half(), nil, 1, false),
          "attention: expected float32 or float64 tensors, got float16")
      has(errmsg(core._attention, q, k, v, nil, 1, false, 1), "attention: dropout_p must be in [0, 1), got 1")
      has(errmsg(core._attention, q, k, v, nil, 1, false, -0.5), "attention: dropout_p must be in [0, 1), got -0.5")
    end)

    it("returns its (B, H, L, Ev) output over heads-last memory: merging the heads is a view", function()
      nd.manual_seed(75)
      local q, k, v = nd.randn({2, 3, 5, 4}), nd.randn({2, 3, 7, 4}), nd.randn({2, 3, 7, 6})
      local out = sdpa(q, k, v)
      assert.is_false(out:is_contiguous())
      assert.is_true(out:transpose(2, 3):is_contiguous())
      assert.is_true(MF.max_abs_diff(out:double(), composed64(q, k, v)) < 2e-6)
      -- one head: plain contiguous
      assert.is_true(sdpa(q:narrow(2, 1, 1), k:narrow(2, 1, 1), v:narrow(2, 1, 1)):is_contiguous())
    end)

    it("is nn.MultiheadAttention's path without weights in evaluation (need_weights = false): "
       .. "the same output as with them, every mask, kdim/vdim, bias_kv", function()
      nd.manual_seed(76)
      local cases = {
        {nn.MultiheadAttention(16, 4, {batch_first = true}), {}},
        {nn.MultiheadAttention(16, 4), {is_causal = true}},
        {nn.MultiheadAttention(16, 2, {batch_first = true}),
         {attn_mask = nd.ones({6, 6}):triu(2):bool(), key_padding_mask = nd.tensor({{false, false, false, false, true, true},
                                                                               {false, false, false, false, false, false}})}},
        {nn.MultiheadAttention(16, 4, {batch_first = true, kdim = 8, vdim = 12, add_bias_kv = true,
                                       add_zero_attn = true}), {attn_mask = nd.randn({2 * 4, 6, 6})}},
      }
      for i, c in ipairs(cases) do
        local m = c[1]:eval()
        local x = m.batch_first and nd.randn({2, 6, 16}) or nd.randn({6, 2, 16})
        local kv = x
        if m.kdim ~= 16 then kv = nd.randn(m.batch_first and {2, 6, 8} or {6, 2, 8}) end
        local vv = kv
        if m.vdim ~= 16 then vv = nd.randn(m.batch_first and {2, 6, 12} or {6, 2, 12}) end
        local function call(need)
          local o = {need_weights = need}
          for key, val in pairs(c[2]) do o[key] = val end
          return nd.no_grad(function() return m(x, kv, vv, o) end)
        end
        local with = call(true)
        local without
        local report = nd.profile(function() without = call(false) end)
        assert.is_nil(report.by_name.softmax, "case " .. i .. ": the composed softmax ran")
        assert.is_true(MF.max_abs_diff(without:double(), with:double()) < 2e-6, "case " .. i)
      end
    end)
  end)

  it("bad input is an error naming the function, the shapes and what was expected", function()
    local q, k, v = nd.randn({2, 3, 4}), nd.randn({2, 5, 4}), nd.randn({2, 5, 6})
    local sdpa = F.scaled_dot_product_attention
    local line = debug.getinfo(1, "l").currentline + 1
    local m = errmsg(function() local o = sdpa(q, nd.randn({2, 5, 3}), v); return o end) -- (no tail call)
    has(m, ("nn_sequence_spec.lua:%d: needle.scaled_dot_product_attention: query {2,3,4}, key {2,5,3} and value " ..
            "{2,5,6} do not fit (..., L, E), (..., S, E), (..., S, Ev)"):format(line))
    has(errmsg(sdpa, q, k, nd.randn({2, 4, 6})), "key {2,5,4} and value {2,4,6} do not fit")
    has(errmsg(sdpa, q, nd.randn({3, 5, 4}), nd.randn({3, 5, 6})),
        "needle.scaled_dot_product_attention: the batch dims of query {2,3,4}, key {3,5,4} and value {3,5,6} do not broadcast")
    has(errmsg(sdpa, nd.randn({4}), k, v), "query must have at least 2 dims (..., L, E), got {4}")
    has(errmsg(sdpa, q, k, v:to("float64")), "query, key and value must have one dtype, got float32, float32 and float64")
    has(errmsg(sdpa, q, k, v, {attn_mask = nd.ones({3, 4}, {dtype = "bool"})}),
        "attn_mask {3,4} does not broadcast to the scores' shape {2,3,5}")
    has(errmsg(sdpa, q, k, v, {attn_mask = nd.zeros({3, 5}, {dtype = "int64"})}),
        "attn_mask must be bool or float32 (the query's dtype), got int64")
    has(errmsg(sdpa, q, k, v, {attn_mask = nd.zeros({3, 5}), is_causal = true}),
        "attn_mask and is_causal = true exclude each other")
    has(errmsg(sdpa, q, k, v, {dropout_p = 1.5}), "dropout_p must be in [0, 1], got 1.5")
    has(errmsg(sdpa, q, k, v, {causal = true}),
        "needle.scaled_dot_product_attention: unknown option 'causal' (valid: attn_mask, dropout_p, is_causal, scale)")
    has(errmsg(sdpa, q, {1}, v), "key must be a tensor, got a table")
    has(errmsg(sdpa, q, k, v, {scale = 0 / 0}), "needle.scaled_dot_product_attention: scale must be a finite number, got")
    has(errmsg(sdpa, q, k, v, {scale = math.huge}), "scale must be a finite number, got inf")
    has(errmsg(sdpa, q, k, v, nil, 5), "takes scaled_dot_product_attention(query, key, value[, {attn_mask=, " ..
        "dropout_p=, is_causal=, scale=}]) only, got an extra argument #5: 5")
  end)
end)

-- modules --------------------------------------------------------------------------------

-- the needle module and call of each module fixture (masks: bool true = not
-- allowed, as PyTorch's modules)
local MODULES = {
  mha_kdim_vdim = {function() return nn.MultiheadAttention(4, 2, {kdim = 3, vdim = 5}) end,
                   function(m, q, k, v, mask) return m(q, k, v, {key_padding_mask = mask}) end},
  mha_bias_kv_zero_attn = {
    function() return nn.MultiheadAttention(4, 2, {add_bias_kv = true, add_zero_attn = true, batch_first = true}) end,
    function(m, q, k, v, am, mask)
      return m(q, k, v, {attn_mask = am, key_padding_mask = mask, average_attn_weights = false})
    end},
  mha_kdim_bias_kv_self = {function() return nn.MultiheadAttention(6, 3, {kdim = 4, vdim = 4, add_bias_kv = true}) end,
                           function(m, q, kv, am) return m(q, kv, kv, {attn_mask = am}) end},
  decoder_layer_post_norm = {
    function() return nn.TransformerDecoderLayer(4, 2, {dim_feedforward = 6, dropout = 0}) end,
    function(m, tgt, mem, mk)
      return m(tgt, mem, {tgt_is_causal = true, memory_key_padding_mask = mk})
    end},
  decoder_layer_pre_norm = {
    function()
      return nn.TransformerDecoderLayer(4, 2, {dim_feedforward = 6, dropout = 0, activation = "gelu",
                                               batch_first = true, norm_first = true})
    end,
    -- PyTorch's positional order
    function(m, tgt, mem, tm, tk, mm) return m(tgt, mem, tm, mm, tk) end},
  decoder = {
    function()
      return nn.TransformerDecoder(nn.TransformerDecoderLayer(4, 2, {dim_feedforward = 6, dropout = 0}), 2,
                                   {norm = nn.LayerNorm(4)})
    end,
    function(m, tgt, mem)
      return m(tgt, mem, {tgt_mask = nn.Transformer.generate_square_subsequent_mask(4, {device = tgt.device})})
    end},
  transformer = {
    function()
      return nn.Transformer{d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1,
                            dim_feedforward = 6, dropout = 0}
    end,
    function(m, src, tgt, tm, sk)
      return m(src, tgt, {tgt_mask = tm, src_key_padding_mask = sk, memory_key_padding_mask = sk})
    end},
  transformer_pre_norm = {
    function()
      return nn.Transformer{d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1,
                            dim_feedforward = 6, dropout = 0, activation = "gelu", batch_first = true,
                            norm_first = true, layer_norm_eps = 1e-4}
    end,
    function(m, src, tgt) return m(src, tgt, {tgt_is_causal = true}) end},
}

describe("the fused attention's backward (core._attention with a gradient)", function()
  local core = require "needle.core"
  local sdpa = F.scaled_dot_product_attention
  local attend = require("needle.functional.attention").attend
  local causal_mask = require("needle.functional.attention").causal_mask
  -- the composed ops (what F.scaled_dot_product_attention ran before the
  -- kernel had a backward), in the inputs' dtype
  local function composed(q, k, v, mask, causal, scale, p)
    if causal then mask = causal_mask(q:size(-2), k:size(-2), q.dtype, q.device) end
    return (attend(q, k, v, mask, p or 0, scale))
  end
  local function leaves(dt, ...)
    local out = {}
    for i, shape in ipairs({...}) do out[i] = nd.randn(shape, {dtype = dt, requires_grad = true}) end
    return out
  end

  it("float64 gradients by finite differences, through the kernel itself (mask, causal, dropout)", function()
    nd.manual_seed(81)
    local mask = nd.randn({2, 1, 3, 5}, {dtype = "float64"}):expand({2, 2, 3, 5})
    C.check(function(q, k, v) return core._attention(q, k, v, mask, 0.7, false) end,
            {G.leaf({2, 2, 3, 4}), G.leaf({2, 2, 5, 4}), G.leaf({2, 2, 5, 3})})
    C.check(function(q, k, v) return core._attention(q, k, v, nil, 0.5, true) end,
            {G.leaf({1, 2, 4, 3}), G.leaf({1, 2, 6, 3}), G.leaf({1, 2, 6, 2})})
    -- dropout: each evaluation draws the same counters (the seed set first)
    C.check(function(q, k, v) nd.manual_seed(5); return core._attention(q, k, v, mask, 0.6, false, 0.4) end,
            {G.leaf({2, 2, 3, 4}), G.leaf({2, 2, 5, 4}), G.leaf({2, 2, 5, 3})})
    -- gradients of gradients (create_graph composes the backward from differentiable ops)
    C.check2(function(q, k, v) nd.manual_seed(6); return core._attention(q, k, v, nil, 0.8, true, 0.3) end,
             {G.leaf({1, 1, 3, 2}), G.leaf({1, 1, 4, 2}), G.leaf({1, 1, 4, 2})})
    G.assert_covers(assert, "nn_sequence_spec.lua")
  end)

  it("float32 gradients equal the composed ops' in float64: masks of every broadcast, causal with L ~= S, " ..
     "blocks of queries, strided heads", function()
    nd.manual_seed(82)
    local cases = sdpa_cases()
    cases[#cases + 1] = {{1, 2, 300, 8}, {1, 2, 40, 8}, {1, 2, 40, 8}, {}} -- 3 query blocks
    for i, c in ipairs(cases) do
      local q, k, v = nd.randn(c[1]), nd.randn(c[2]), nd.randn(c[3])
      local function grads(dt)
        local ls = {q:to(dt), k:to(dt), v:to(dt)}
        for _, t in ipairs(ls) do t.requires_grad = true end
        local o = c[4]
        if o.attn_mask and o.attn_mask.dtype ~= "bool" then
          o = {attn_mask = o.attn_mask:to(dt), is_causal = o.is_causal, scale = o.scale}
        end
        local out = sdpa(ls[1], ls[2], ls[3], o)
        nd.manual_seed(100 + i)
        local wt = nd.randn(out.shape):to(dt) -- (float32 draws for both)
        return nd.grad((out * wt):sum(), ls)
      end
      local g32, g64 = grads("float32"), grads("float64")
      for j = 1, 3 do
        local d = MF.max_abs_diff(g32[j]:double(), g64[j])
        assert.is_true(d < 2e-5, ("case %d, gradient %d: %g"):format(i, j, d))
      end
    end
    -- strided heads: q, k, v views of one projection
    local x = nd.randn({2, 7, 48}, {requires_grad = true})
    local function heads(t) return t:reshape({2, 7, 2, 8}):transpose(2, 3) end
    local function run(xx)
      return sdpa(heads(xx:narrow(3, 1, 16)), heads(xx:narrow(3, 17, 16)), heads(xx:narrow(3, 33, 16)),
                  {is_causal = true})
    end
    local gx = nd.grad(run(x):sum(), {x})[1]
    local x64 = x:detach():double()
    x64.requires_grad = true
    local gx64 = nd.grad(run(x64):sum(), {x64})[1]
    assert.is_true(MF.max_abs_diff(gx:double(), gx64) < 2e-5)
  end)

  it("dropout keeps the weights F.dropout keeps: under one seed, the kernel and the composed ops agree", function()
    nd.manual_seed(83)
    local q, k, v = table.unpack(leaves("float32", {2, 3, 9, 8}, {2, 3, 11, 8}, {2, 3, 11, 6}))
    local mask = nd.randn({2, 1, 9, 11})
    local w = nd.randn({2, 3, 9, 6})
    local function run(fn)
      nd.manual_seed(9)
      local out = fn()
      local gs = nd.grad((out * w):sum(), {q, k, v})
      return out, gs
    end
    local o1, g1 = run(function() return sdpa(q, k, v, {attn_mask = mask, dropout_p = 0.4}) end)
    local o2, g2 = run(function() return composed(q, k, v, mask, false, 1 / math.sqrt(8), 0.4) end)
    local o0 = sdpa(q, k, v, {attn_mask = mask})
    assert.is_true(MF.max_abs_diff(o1, o0) > 1e-2, "dropout dropped something")
    assert.is_true(MF.max_abs_diff(o1, o2) < 2e-6)
    for j = 1, 3 do assert.is_true(MF.max_abs_diff(g1[j], g2[j]) < 2e-6, "gradient " .. j) end
    -- causal, and a second call draws new counters
    nd.manual_seed(10)
    local a = sdpa(q, k, v, {is_causal = true, dropout_p = 0.5})
    local b = sdpa(q, k, v, {is_causal = true, dropout_p = 0.5})
    nd.manual_seed(10)
    local c = composed(q, k, v, nil, true, 1 / math.sqrt(8), 0.5)
    assert.is_true(MF.max_abs_diff(a, c) < 2e-6)
    assert.is_true(MF.max_abs_diff(a, b) > 1e-2)
    -- v broadcasting the batch further than q and k: one mask shared across v's batch, as the
    -- composed ops draw it, and the stream left where they leave it
    local q3, k3, v3 = nd.randn({1, 4, 3}), nd.randn({1, 5, 3}), nd.randn({3, 5, 2})
    nd.manual_seed(7)
    local f3 = sdpa(q3, k3, v3, {dropout_p = 0.5})
    local next_f = nd.rand({1}):item()
    nd.manual_seed(7)
    local c3 = composed(q3, k3, v3, nil, false, 1 / math.sqrt(3), 0.5)
    assert.is_true(MF.max_abs_diff(f3, c3) < 2e-6)
    assert.are.equal(nd.rand({1}):item(), next_f)
  end)

  it("keeps no (L, S) float tensor: a forward with a gradient allocates its output, a log-sum-exp a row " ..
     "and, with dropout, a byte a weight (the keeps)", function()
    local q, k, v = table.unpack(leaves("float32", {2, 3, 40, 8}, {2, 3, 50, 8}, {2, 3, 50, 8}))
    local function bytes(opts)
      local report = nd.profile(function() F.scaled_dot_product_attention(q, k, v, opts) end)
      return report.by_name["F.scaled_dot_product_attention"].total_bytes
    end
    assert.are.equal(2 * 3 * 40 * 8 * 4 + 2 * 3 * 40 * 4, bytes({is_causal = true}))
    assert.are.equal(2 * 3 * 40 * 8 * 4 + 2 * 3 * 40 * 4 + 2 * 3 * 40 * 50, bytes({is_causal = true, dropout_p = 0.1}))
  end)

  it("gives gradients laid out as the heads they flow to: back through the head split without a copy", function()
    local function heads(t) return t:view({2, 7, 2, 8}):transpose(2, 3) end -- (B, L, H * D) -> (B, H, L, D)
    local xq, xk, xv = table.unpack(leaves("float32", {2, 7, 16}, {2, 9, 16}, {2, 9, 16}))
    local q, k, v = heads(xq), xk:view({2, 9, 2, 8}):transpose(2, 3), xv:view({2, 9, 2, 8}):transpose(2, 3)
    local w = nd.randn({2, 2, 7, 8})
    local gs = nd.grad((F.scaled_dot_product_attention(q, k, v) * w):sum(), {q, k, v})
    for i, t in ipairs({q, k, v}) do
      assert.are.same(t.shape, gs[i].shape)
      assert.is_true(gs[i]:transpose(2, 3):is_contiguous(), "gradient " .. i)
    end
    -- and the projections' own gradients are those values (the views' backward moved nothing)
    local gx = nd.grad((F.scaled_dot_product_attention(heads(xq), k, v) * w):sum(), {xq})[1]
    assert.is_true(MF.max_abs_diff(gx, gs[1]:transpose(2, 3):reshape({2, 7, 16})) == 0)
  end)

  it("no keys, no queries, rows with nothing to attend: as the composed ops", function()
    local q, k, v = table.unpack(leaves("float32", {1, 2, 3, 4}, {1, 2, 0, 4}, {1, 2, 0, 5}))
    local gs = nd.grad(sdpa(q, k, v):sum(), {q, k, v})
    assert.are.same({1, 2, 3, 4}, gs[1].shape)
    assert.are.equal(0, gs[1]:abs():sum():item())
    local q0, k0, v0 = table.unpack(leaves("float32", {1, 2, 0, 4}, {1, 2, 5, 4}, {1, 2, 5, 3}))
    gs = nd.grad(sdpa(q0, k0, v0):sum(), {q0, k0, v0})
    assert.are.equal(0, gs[2]:abs():sum():item() + gs[3]:abs():sum():item())
    -- query 2 attends to nothing: its row is NaN, and so are the gradients it reaches, both ways
    local q2, k2, v2 = table.unpack(leaves("float32", {1, 2, 3, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}))
    local mask = nd.ones({3, 5}, {dtype = "bool"})
    mask[2] = false
    local gf = nd.grad(sdpa(q2, k2, v2, {attn_mask = mask}):sum(), {q2, k2, v2})
    local gc = nd.grad(composed(q2, k2, v2, nd.where(mask, nd.tensor(0.0), nd.tensor(-math.huge)), false,
                                0.5):sum(), {q2, k2, v2})
    for j = 1, 3 do
      assert.are.equal(gc[j]:isnan():sum():item(), gf[j]:isnan():sum():item(), "NaNs of gradient " .. j)
    end
    assert.is_true(MF.max_abs_diff(gf[1][{{}, {}, 1}], gc[1][{{}, {}, 1}]) < 1e-6)
  end)

  it("trains inside nd.compile: a captured step replays the eager gradients, with dropout too (fresh counters each call)", function()
    nd.manual_seed(84)
    local mha = nn.MultiheadAttention(16, 2, {batch_first = true})
    local x = nd.randn({3, 5, 16})
    local function step()
      for _, p in ipairs(mha:parameters()) do p.grad = nil end
      local out = mha(x, x, x, {need_weights = false})
      out:sum():backward()
      local gs = {}
      for i, p in ipairs(mha:parameters()) do gs[i] = p.grad:clone() end
      return gs
    end
    local want = step()
    local cstep = nd.compile(step)
    for _ = 1, 3 do
      local got = cstep()
      for i = 1, #want do assert.is_true(MF.max_abs_diff(got[i], want[i]) < 1e-5, "parameter " .. i) end
    end
    -- training mode with dropout: each replay draws the counters the eager call would (the
    -- kernel's own, the same bits), and its backward reads the replay's keeps
    mha.dropout = 0.3
    mha:train()
    local cd = nd.compile(step)
    for call = 1, 4 do
      nd.manual_seed(12 + call)
      local e = step()
      nd.manual_seed(12 + call)
      local got = cd()
      for i = 1, #e do assert.are.equal(0, MF.max_abs_diff(got[i], e[i]), "call " .. call .. ", parameter " .. i) end
    end
    assert.are.equal(2, cd.stats.replays)
    -- a compiled backward of an eager forward with dropout reads that forward's keeps
    local q, k, v = table.unpack(leaves("float32", {1, 2, 5, 4}, {1, 2, 6, 4}, {1, 2, 6, 3}))
    local loss = (sdpa(q, k, v, {dropout_p = 0.5}) * nd.randn({1, 2, 5, 3})):sum()
    local function bw() return nd.grad(loss, {q, k, v}, {retain_graph = true}) end
    local want, cb = bw(), nd.compile(bw)
    for call = 1, 4 do
      local g = cb()
      for j = 1, 3 do assert.are.equal(0, MF.max_abs_diff(g[j], want[j]), "backward call " .. call) end
    end
    local report = nd.profile(cd)
    assert.are.equal(1, report.by_name["compiled:attention"].calls)
    assert.are.equal(1, report.by_name["compiled:attention_backward"].calls)
  end)
end)

describe("attention and transformer modules against PyTorch (eval, dropout 0)", function()
  it("every fixture: parameter order, state_dict keys, output, weights, gradients of parameters and inputs", function()
    assert.are.equal(8, #FIX.modules)
    for _, c in ipairs(FIX.modules) do
      local mc = MODULES[c.name]
      assert.is_truthy(mc, "no needle module for " .. c.name)
      MF.run(c, mc[1](), mc[2], TOL)
    end
  end)

  it("nd.convert.load_state_dict loads a torch.nn.Transformer's state_dict by name", function()
    local c = find(FIX.modules, "transformer")
    local m = MODULES.transformer[1]()
    nd.convert.load_state_dict(m, MF.state_dict(c))
    m:eval()
    local src, tgt, tm, sk = T(c.inputs[1]), T(c.inputs[2]), T(c.inputs[3]), T(c.inputs[4])
    MF.close("converted transformer", m(src, tgt, {tgt_mask = tm, src_key_padding_mask = sk,
                                                   memory_key_padding_mask = sk}), c.output, TOL.rtol, TOL.atol)
  end)

  it("state_dict keys, parameter order and counts of larger configurations are PyTorch's", function()
    local builders = {
      transformer = function()
        return nn.Transformer{d_model = 32, nhead = 4, num_encoder_layers = 2, num_decoder_layers = 2,
                              dim_feedforward = 64}
      end,
      mha_kdim_vdim_bias_kv = function() return nn.MultiheadAttention(16, 4, {kdim = 8, vdim = 12, add_bias_kv = true}) end,
      lstm_bidirectional_3layers = function() return nn.LSTM(10, 20, {num_layers = 3, bidirectional = true}) end,
    }
    local n = 0
    for name, build in pairs(builders) do
      local k, m = find(FIX.keys, name), build()
      assert.are.same(MF.sorted(k.keys), MF.sorted_keys(m))
      local order = {}
      for i, p in ipairs(m:named_parameters()) do order[i] = p[1] end
      assert.are.same(k.params, order)
      assert.are.equal(k.num_parameters, m:num_parameters())
      n = n + 1
    end
    assert.are.equal(3, n)
  end)
end)

describe("MultiheadAttention with kdim, vdim, add_bias_kv, add_zero_attn", function()
  it("initialises as PyTorch: xavier_uniform projections, zero in_proj_bias, xavier_normal bias_k", function()
    nd.manual_seed(74)
    local m = nn.MultiheadAttention(64, 4, {kdim = 32, vdim = 16, add_bias_kv = true})
    assert.is_nil(m.in_proj_weight)
    assert.is_true(m.k_proj_weight:abs():max():item() <= math.sqrt(6 / (64 + 32)))
    assert.is_true(m.v_proj_weight:abs():max():item() <= math.sqrt(6 / (64 + 16)))
    assert.are.equal(0, m.in_proj_bias:abs():sum():item())
    local std = math.sqrt(2 / (64 + 64)) -- (1, 1, E): fan_in = fan_out = E
    assert.is_true(math.abs(m.bias_k:std():item() - std) < 0.3 * std)
    assert.are.equal("MultiheadAttention(embed_dim=64, num_heads=4, kdim=32, vdim=16, add_bias_kv=true",
                     tostring(m):match("^[^\n]*"))
  end)

  it("float64 gradients of the inputs by finite differences", function()
    nd.manual_seed(75)
    local m = nn.MultiheadAttention(4, 2, {kdim = 3, vdim = 2, add_bias_kv = true, add_zero_attn = true,
                                           dtype = "float64"})
    local kpm = nd.tensor({{false, true, false}, {false, false, false}})
    C.check(function(q, k, v) return (m(q, k, v, {key_padding_mask = kpm})) end,
            {G.leaf({2, 2, 4}), G.leaf({3, 2, 3}), G.leaf({3, 2, 2})})
  end)

  it("errors name the module and the expected key and value sizes", function()
    local m = nn.MultiheadAttention(4, 2, {kdim = 3, vdim = 5})
    has(errmsg(m, nd.randn({2, 1, 4}), nd.randn({6, 1, 4}), nd.randn({6, 1, 5})),
        "needle.nn.MultiheadAttention(4, 2): expected key of shape (L, N, 3) or (L, 3), got {6,1,4}")
    has(errmsg(m, nd.randn({2, 1, 4})), "expected key of shape (L, N, 3) or (L, 3), got {2,1,4}")
    has(errmsg(nn.MultiheadAttention, 4, 2, {kdim = 0}), "needle.nn.MultiheadAttention(4, 2): kdim must be a positive integer, got 0")
  end)
end)

describe("TransformerDecoderLayer, TransformerDecoder, Transformer{...}", function()
  it("tgt_is_causal equals the explicit causal mask; memory_is_causal masks the memory", function()
    nd.manual_seed(76)
    local layer = nn.TransformerDecoderLayer(8, 2, {dim_feedforward = 16, dropout = 0})
    local tgt, mem = nd.randn({5, 2, 8}), nd.randn({5, 2, 8})
    local mask = nn.Transformer.generate_square_subsequent_mask(5)
    assert.is_true(MF.max_abs_diff(layer(tgt, mem, {tgt_is_causal = true}), layer(tgt, mem, {tgt_mask = mask})) < 1e-6)
    assert.is_true(MF.max_abs_diff(layer(tgt, mem, {memory_is_causal = true}), layer(tgt, mem, nil, mask)) < 1e-6)
    -- causal: the first position does not see later targets
    local tgt2 = tgt:clone()
    tgt2[5] = nd.randn({2, 8})
    assert.is_true(MF.max_abs_diff(layer(tgt, mem, {tgt_is_causal = true})[1],
                                   layer(tgt2, mem, {tgt_is_causal = true})[1]) < 1e-6)
  end)

  it("the decoder holds deep copies and passes the masks to every layer", function()
    nd.manual_seed(77)
    local layer = nn.TransformerDecoderLayer(8, 2, {dim_feedforward = 16, dropout = 0, batch_first = true})
    local dec = nn.TransformerDecoder(layer, 2)
    assert.are.equal(2 * layer:num_parameters(), dec:num_parameters())
    assert.are_not.equal(layer.linear1.weight, dec.layers[1].linear1.weight)
    local tgt, mem = nd.randn({2, 4, 8}), nd.randn({2, 6, 8})
    local want = dec.layers[2](dec.layers[1](tgt, mem, {tgt_is_causal = true}), mem, {tgt_is_causal = true})
    assert.is_true(MF.max_abs_diff(dec(tgt, mem, {tgt_is_causal = true}), want) < 1e-6)
  end)

  it("float64 gradients of tgt and memory by finite differences", function()
    nd.manual_seed(78)
    local layer = nn.TransformerDecoderLayer(4, 2, {dim_feedforward = 6, dropout = 0, dtype = "float64",
                                                    norm_first = true})
    C.check(function(tgt, mem) return layer(tgt, mem, {tgt_is_causal = true}) end,
            {G.leaf({3, 2, 4}), G.leaf({4, 2, 4})})
  end)

  it("nn.Transformer: a number first is needle's decoder-only model, an options table PyTorch's", function()
    nd.manual_seed(82)
    local ours = nn.Transformer(8, 16, 1, {num_head = 2})
    assert.is_not_nil(ours.pos_embedding)
    local theirs = nn.Transformer{d_model = 8, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 2,
                                  dim_feedforward = 8}
    assert.are.equal("TransformerEncoder", theirs.encoder.__name)
    assert.are.equal(2, #theirs.decoder.layers)
    assert.are.equal("Transformer", theirs.__name)
    local mask = theirs.generate_square_subsequent_mask(3)
    assert.are.same({3, 3}, mask.shape)
    -- every matrix is xavier_uniform (PyTorch's _reset_parameters), out_proj.weight included
    local w = theirs.encoder.layers[1].self_attn.out_proj.weight
    assert.is_true(w:abs():max():item() <= math.sqrt(6 / 16))
    assert.is_true(w:abs():max():item() > 1 / math.sqrt(8))
    -- custom encoder and decoder
    local enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 8, dropout = 0}), 1)
    local custom = nn.Transformer{d_model = 8, nhead = 2, custom_encoder = enc, num_decoder_layers = 1,
                                  dim_feedforward = 8, dropout = 0}
    assert.are.equal(enc, custom.encoder)
    local out = custom(nd.randn({5, 2, 8}), nd.randn({3, 2, 8}))
    assert.are.same({3, 2, 8}, out.shape)
    local single = custom(nd.randn({5, 8}), nd.randn({3, 8}))
    assert.are.same({3, 8}, single.shape)
  end)

  it("errors name the module and the shapes", function()
    local t = nn.Transformer{d_model = 8, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1,
                             dim_feedforward = 8}
    has(errmsg(t, nd.randn({5, 2, 8}), nd.randn({3, 3, 8})),
        "needle.nn.Transformer(d_model=8, nhead=2): src {5,2,8} and tgt {3,3,8} must have the same batch size (dim 2)")
    has(errmsg(t, nd.randn({5, 2, 6}), nd.randn({3, 2, 8})),
        "needle.nn.Transformer(d_model=8, nhead=2): expected src of shape (S, N, 8) or (S, 8), got {5,2,6}")
    has(errmsg(t, nd.randn({5, 2, 8}), nd.randn({3, 2, 8}), {tgt_causal = true}),
        "needle.nn.Transformer(d_model=8, nhead=2): unknown option 'tgt_causal' (valid: memory_is_causal, " ..
        "memory_key_padding_mask, memory_mask, src_is_causal, src_key_padding_mask, src_mask, tgt_is_causal, " ..
        "tgt_key_padding_mask, tgt_mask)")
    has(errmsg(nn.Transformer, {d_model = 10, nhead = 4}), "needle.nn.Transformer: d_model (10) must be divisible by nhead (4)")
    has(errmsg(nn.Transformer, {d_modle = 8}), "needle.nn.Transformer: unknown option 'd_modle' (valid: activation, ")
    local layer = nn.TransformerDecoderLayer(8, 2)
    has(errmsg(layer, nd.randn({4, 2, 8}), nd.randn({4, 2, 6})),
        "needle.nn.TransformerDecoderLayer(8, 2): expected memory of shape (T, N, 8) or (T, 8), got {4,2,6}")
    has(errmsg(layer, nd.randn({4, 2, 8}), nd.randn({4, 8})),
        "tgt {4,2,8} and memory {4,8} must both be batched or both unbatched")
    has(errmsg(layer, nd.randn({4, 2, 8}), nd.randn({4, 2, 8}), {tgt_causal = true}),
        "needle.nn.TransformerDecoderLayer(8, 2): unknown option 'tgt_causal' (valid: memory_is_causal, ")
    has(errmsg(layer, nd.randn({4, 2, 8}), nd.randn({4, 2, 8}), {}, nd.zeros({4, 4})),
        "options given as a table and then positionally")
    has(errmsg(nn.TransformerDecoder, layer, 0), "needle.nn.TransformerDecoder: num_layers must be a positive integer, got 0")
    has(errmsg(nn.TransformerDecoderLayer, 8, 2, {activation = "tanh"}),
        "needle.nn.TransformerDecoderLayer: activation must be 'relu', 'gelu', a function or a module, got 'tanh'")
  end)
end)

-- containers -----------------------------------------------------------------------------

describe("ModuleDict, ParameterList, ParameterDict", function()
  local function check_keys(name, m)
    local k = find(FIX.keys, name)
    local keys, order = {}, {}
    for key in pairs(m:state_dict()) do keys[#keys + 1] = key end
    table.sort(keys)
    for i, p in ipairs(m:named_parameters()) do order[i] = p[1] end
    assert.are.same(MF.sorted(k.keys), keys)
    assert.are.same(k.params, order) -- insertion order, PyTorch's
    assert.are.equal(k.num_parameters, m:num_parameters())
  end

  it("have PyTorch's state_dict keys and parameter order", function()
    local md = nn.ModuleDict({{"cls", nn.Linear(8, 2)}, {"box", nn.Linear(8, 4)}})
    md:update({{"act", nn.ReLU()}, {"head", nn.Linear(4, 1)}})
    check_keys("module_dict", md)
    local pl = nn.ParameterList({nd.randn({2}), nd.randn({3, 2})})
    pl:append(nd.randn({4}))
    check_keys("parameter_list", pl)
    check_keys("parameter_dict", nn.ParameterDict({{"w", nd.randn({3, 2})}, {"b", nd.randn({3})}}))
    check_keys("nested", nn.Sequential(nn.ModuleDict({a = nn.Linear(2, 2)}), nn.ParameterList({nd.randn({2})})))
  end)

  it("iterate deterministically: pairs in insertion order, string-keyed tables sorted", function()
    local md = nn.ModuleDict({zeta = nn.ReLU(), alpha = nn.Tanh(), mid = nn.Identity()})
    md.beta = nn.Sigmoid()
    local seen = {}
    for k, v in pairs(md) do seen[#seen + 1] = k .. "=" .. v.__name end
    assert.are.same({"alpha=Tanh", "mid=Identity", "zeta=ReLU", "beta=Sigmoid"}, seen)
    assert.are.same({"alpha", "mid", "zeta", "beta"}, md:keys())
    assert.are.equal(4, #md)
    assert.are.equal("Tanh", md.alpha.__name)
    assert.are.equal("Tanh", md["alpha"].__name)
    -- removing and adding again puts the key last; replacing keeps its place
    md.alpha = nil
    md.alpha = nn.ReLU()
    md.mid = nn.Tanh()
    assert.are.same({"mid", "zeta", "beta", "alpha"}, md:keys())
    assert.are.equal("Tanh", md:pop("mid").__name)
    assert.are.same({"zeta", "beta", "alpha"}, md:keys())
    md:clear()
    assert.are.equal(0, #md)
    local copy = nn.ModuleDict(nn.ModuleDict({{"b", nn.ReLU()}, {"a", nn.Tanh()}}))
    assert.are.same({"b", "a"}, copy:keys())
  end)

  it("make their tensors parameters; ParameterList indexes from 1, negatives from the end", function()
    local t = nd.randn({3})
    local pl = nn.ParameterList({t, nd.randn({2})})
    assert.are.equal(t, pl[1]) -- a leaf is marked and kept, as nn.Parameter shares its data
    assert.is_true(pl[1].requires_grad)
    assert.are.equal(2, #pl)
    assert.are.same({2}, pl[-1].shape)
    pl[3] = nd.ones({1})
    local n = 0
    for i, p in ipairs(pl) do n = n + 1; assert.is_true(p.requires_grad, tostring(i)) end
    assert.are.equal(3, n)
    local pd = nn.ParameterDict({w = nd.randn({2, 2})})
    pd.b = nd.zeros({2})
    assert.are.same({"w", "b"}, pd:keys())
    local x = nd.randn({3, 2})
    local y = (F.linear(x, pd.w, pd.b) * pl[2]):sum()
    y:backward()
    assert.are.same({2, 2}, pd.w.grad.shape)
    assert.are.same({2}, pl[2].grad.shape)
    assert.are.equal("ParameterList(0: {3} float32, 1: {2} float32, 2: {1} float32)", tostring(pl))
    -- they move with :to and load by name
    local sd = pd:state_dict()
    local pd2 = nn.ParameterDict({{"w", nd.zeros({2, 2})}, {"b", nd.zeros({2})}})
    pd2:load_state_dict(sd)
    assert.are.same(pd.w:totable(), pd2.w:totable())
  end)

  it("bad keys and values are errors naming the container", function()
    local md = nn.ModuleDict()
    has(errmsg(function() md.keys = nn.ReLU() end),
        "needle.nn.ModuleDict: key 'keys' is not valid (a non-empty string without '.' that is no method or attribute")
    has(errmsg(function() md["a.b"] = nn.ReLU() end), "needle.nn.ModuleDict: key 'a.b' is not valid")
    has(errmsg(function() md[1] = nn.ReLU() end), "needle.nn.ModuleDict: key 1 is not valid")
    has(errmsg(function() md.x = nd.zeros({1}) end), "needle.nn.ModuleDict: values must be modules, got userdata")
    has(errmsg(md.pop, md, "nope"), "needle.nn.ModuleDict.pop: no entry 'nope'")
    has(errmsg(nn.ModuleDict, {{"a", nn.ReLU()}, b = nn.ReLU()}), "not both")
    has(errmsg(nn.ModuleDict, {[3] = nn.ReLU()}), "needle.nn.ModuleDict: keys must be strings, got number")
    has(errmsg(function() nn.ParameterDict({w = 3}) end), "needle.nn.ParameterDict: values must be tensors, got number")
    local pl = nn.ParameterList()
    has(errmsg(function() pl[3] = nd.zeros({1}) end), "needle.nn.ParameterList: index 3 out of range for 0 parameters")
    has(errmsg(pl.append, pl, "x"), "needle.nn.ParameterList: values must be tensors, got string")
    has(errmsg(md), "needle.nn.ModuleDict: a ModuleDict is not callable")
  end)
end)

-- CTC ------------------------------------------------------------------------------------

local function check_ctc(c, dev, tol)
  local x = T(c.x)
  x.requires_grad = true
  local loss = via(dev, function(logits)
    local lp = logits:log_softmax(-1)
    return F.ctc_loss(lp, T(c.targets):to(dev), c.input_lengths, c.target_lengths,
                      {blank = c.blank, reduction = c.reduction, zero_infinity = c.zero_infinity})
  end)(x)
  MF.close(c.name .. " loss on " .. dev, loss, c.output, tol.rtol, tol.atol)
  local g = nd.grad((loss * T(c.w)):sum(), x)
  MF.close(c.name .. " grad on " .. dev, g, c.grad, tol.rtol, tol.atol)
end

describe("F.ctc_loss and nn.CTCLoss", function()
  it("match PyTorch: padded and concatenated targets, repeats, blank, empty targets, zero_infinity, unbatched", function()
    assert.are.equal(7, #FIX.ctc)
    for _, c in ipairs(FIX.ctc) do check_ctc(c, "cpu", TOL) end
  end)

  it("the gradient with respect to log_probs is exact (float64 finite differences, any log_probs)", function()
    nd.manual_seed(79)
    local targets = nd.tensor({{2, 2, 3}, {4, 1, 1}}, {dtype = "int64"})
    -- not normalised: the loss is a function of every log-probability
    C.check(function(lp) return F.ctc_loss(lp, targets, {5, 4}, {3, 1}, {reduction = "none"}) end,
            {G.leaf({5, 2, 4}, -3, 0)})
    C.check(function(lp) return F.ctc_loss(lp, {3, 4}, 4, 2, {blank = 2, reduction = "sum"}) end,
            {G.leaf({4, 5}, -3, 0)})
  end)

  it("an impossible alignment is an infinite loss, 0 with zero_infinity", function()
    local lp = nd.randn({3, 1, 4}):log_softmax(3)
    local targets = nd.tensor({{2, 2, 3}}, {dtype = "int64"}) -- needs 4 steps (a blank between the 2s)
    assert.are.equal(math.huge, F.ctc_loss(lp, targets, {3}, {3}, {reduction = "sum"}):item())
    assert.are.equal(0, F.ctc_loss(lp, targets, {3}, {3}, {reduction = "sum", zero_infinity = true}):item())
  end)

  it("nn.CTCLoss calls F.ctc_loss with its options; blank defaults to 1 (PyTorch's 0)", function()
    nd.manual_seed(80)
    local lp = nd.randn({6, 2, 5}):log_softmax(3)
    local targets, il, tl = nd.tensor({{2, 3}, {4, 5}}, {dtype = "int64"}), {6, 5}, {2, 2}
    assert.are.same(F.ctc_loss(lp, targets, il, tl):totable(), nn.CTCLoss()(lp, targets, il, tl):totable())
    local m = nn.CTCLoss({blank = 5, reduction = "sum", zero_infinity = true})
    local t2 = nd.tensor({{2, 3}, {4, 1}}, {dtype = "int64"})
    assert.are.same(F.ctc_loss(lp, t2, il, tl, {blank = 5, reduction = "sum", zero_infinity = true}):totable(),
                    m(lp, t2, il, tl):totable())
    assert.are.equal("CTCLoss(blank=5, reduction='sum', zero_infinity=true)", tostring(m))
  end)

  it("bad input is an error naming ctc_loss, the shapes and the values", function()
    local lp = nd.randn({6, 2, 5}):log_softmax(3)
    local targets = nd.tensor({{2, 3}, {4, 5}}, {dtype = "int64"})
    local line = debug.getinfo(1, "l").currentline + 1
    local m = errmsg(function() local l = F.ctc_loss(lp, targets, {6, 7}, {2, 2}); return l end) -- (no tail call)
    has(m, ("nn_sequence_spec.lua:%d: needle.ctc_loss: input_lengths[2] = 7 is out of range for 6 time steps " ..
            "(expected 0..6)"):format(line))
    has(errmsg(F.ctc_loss, nd.randn({6, 2, 5, 1}), targets, {6, 6}, {2, 2}),
        "needle.ctc_loss: expected log_probs of shape (T, N, C) or (T, C), got {6,2,5,1}")
    has(errmsg(F.ctc_loss, lp, targets, {6}, {2, 2}), "input_lengths must have 2 values (one per sequence), got shape {1}")
    has(errmsg(F.ctc_loss, lp, targets, {6, 6}, {2, 3}),
        "padded targets must have shape (2, S) with S >= 3 (the longest target), got {2,2}")
    has(errmsg(F.ctc_loss, lp, nd.tensor({2, 3, 4}, {dtype = "int64"}), {6, 6}, {2, 2}),
        "concatenated targets must hold sum(target_lengths) = 4 labels, got {3}")
    has(errmsg(F.ctc_loss, lp, nd.tensor({{2, 3}, {1, 5}}, {dtype = "int64"}), {6, 6}, {2, 2}),
        "needle.ctc_loss: target 1 of sequence 2 is 1: expected a class in 1..5 other than blank (1)")
    has(errmsg(F.ctc_loss, lp, nd.tensor({{2, 6}, {3, 5}}, {dtype = "int64"}), {6, 6}, {2, 2}),
        "target 2 of sequence 1 is 6: expected a class in 1..5 other than blank (1)")
    has(errmsg(F.ctc_loss, lp, targets, {6, 6}, {2, 2}, {blank = 0}), "needle.ctc_loss: blank must be a class index in 1..5, got 0")
    has(errmsg(F.ctc_loss, lp, targets, {6, 6}, {2, 2}, {reduction = "avg"}),
        "needle.ctc_loss: reduction must be 'mean', 'sum' or 'none', got avg")
    has(errmsg(F.ctc_loss, lp, targets:to("float32"), {6, 6}, {2, 2}),
        "needle.ctc_loss: targets must be integers, got a float32 tensor")
    has(errmsg(F.ctc_loss, lp, targets, {6, 6}, {2, -1}), "needle.ctc_loss: target_lengths[2] = -1 is negative")
    has(errmsg(nn.CTCLoss, {blanks = 1}), "needle.nn.CTCLoss: unknown option 'blanks' (valid: blank, reduction, zero_infinity)")
  end)
end)

-- devices ----------------------------------------------------------------------------------

describe("the sequence pieces on OpenCL", function()
  if D.pending_without_opencl(pending, "sequence pieces on OpenCL") then return end
  for _, dev in ipairs(D.opencl()) do
    it("scaled_dot_product_attention: every fixture, output and gradients, on " .. D.describe(dev), function()
      for _, c in ipairs(FIX.sdpa) do check_sdpa(c, dev, DEV_TOL) end
    end)

    it("ctc_loss: every fixture, loss and gradient, on " .. D.describe(dev), function()
      for _, c in ipairs(FIX.ctc) do check_ctc(c, dev, DEV_TOL) end
    end)

    it("attention and transformer modules: every fixture, output and gradients, on " .. D.describe(dev), function()
      for _, c in ipairs(FIX.modules) do
        local mc = MODULES[c.name]
        MF.run(c, mc[1]():to(dev), via(dev, function(...) return mc[2](...) end), DEV_TOL)
      end
    end)

    it("containers move with :to", function()
      local md = nn.ModuleDict({a = nn.Linear(2, 2)})
      local pl = nn.ParameterList({nd.zeros({2})})
      md:to(dev)
      pl:to(dev)
      assert.are.equal(dev, md.a.weight.device)
      assert.are.equal(dev, pl[1].device)
    end)
  end
end)

describe("ModuleDict and ParameterDict keys that are Module's own fields", function()
  it("are refused, however they are given", function()
    local reserved = {"training", "_params", "_buffers", "_children", "_order", "_attrs", "_hooks", "_non_persistent"}
    for _, k in ipairs(reserved) do
      local want = ("needle.nn.ModuleDict: key '%s' "):format(k)
      has(errmsg(nn.ModuleDict, {[k] = nn.Linear(1, 1)}), want)
      has(errmsg(nn.ModuleDict, {{k, nn.Linear(1, 1)}}), want)
      local md = nn.ModuleDict({a = nn.ReLU()})
      -- (md[k] = v on a field the module holds raw, as training, is Lua's plain
      -- assignment of that field: only update and the constructor can see it)
      if rawget(md, k) == nil then has(errmsg(function() md[k] = nn.Linear(1, 1) end), want) end
      has(errmsg(md.update, md, {{k, nn.Linear(1, 1)}}), want)
      assert.are.equal(1, #md)
      assert.is_true(md.training)
      assert.are.same({"a"}, md:keys())
      has(errmsg(nn.ParameterDict, {[k] = nd.ones({1})}), ("needle.nn.ParameterDict: key '%s' "):format(k))
      local pd = nn.ParameterDict()
      if rawget(pd, k) == nil then
        has(errmsg(function() pd[k] = nd.ones({1}) end), ("needle.nn.ParameterDict: key '%s' "):format(k))
      end
      has(errmsg(pd.update, pd, {{k, nd.ones({1})}}), ("needle.nn.ParameterDict: key '%s' "):format(k))
      assert.are.equal(0, #pd)
    end
    -- method names are refused too, and ordinary keys still work
    has(errmsg(nn.ModuleDict, {{"forward", nn.ReLU()}}), "needle.nn.ModuleDict: key 'forward' ")
    has(errmsg(nn.ModuleDict, {{"state_dict", nn.ReLU()}}), "needle.nn.ModuleDict: key 'state_dict' ")
    local md = nn.ModuleDict({train_head = nn.Linear(1, 1), _private = nn.ReLU()})
    assert.are.equal(2, #md)
  end)
end)

describe("clone_module", function()
  local clone = require("needle.nn.transformer").clone_module

  it("gives each clone its own hooks: removing one on the template leaves the clones' running", function()
    local m = nn.Linear(2, 2)
    local calls = {}
    local h = m:register_forward_hook(function(mod) calls[#calls + 1] = mod end)
    local c1, c2 = clone(m), clone(m)
    local x = nd.ones({1, 2})
    c1(x); c2(x); m(x)
    assert.are.same({c1, c2, m}, calls)
    h:remove()
    calls = {}
    c1(x); m(x); c2(x)
    assert.are.same({c1, c2}, calls) -- the template's hook is gone, the clones' still run
    assert.is_nil(rawget(m, "_hooks"))
    -- a clone's own hooks: registered and removed independently of the others
    local h1 = c1:register_forward_pre_hook(function() calls[#calls + 1] = "pre1" end)
    calls = {}
    c1(x); c2(x)
    assert.are.same({"pre1", c1, c2}, calls)
    h1:remove()
    calls = {}
    c1(x); c2(x)
    assert.are.same({c1, c2}, calls)
    assert.are_not.equal(rawget(c1, "_hooks"), rawget(c2, "_hooks"))
    -- a clone of a module without hooks has the class's plain metatable
    local plain = clone(m)
    assert.is_nil(rawget(plain, "_hooks"))
    assert.are.equal(getmetatable(nn.Linear(2, 2)), getmetatable(plain))
    assert.are.equal(getmetatable(m), getmetatable(plain))
    -- and a clone made while a hook is registered, after the hooks are removed too
    local h2 = m:register_forward_hook(function() calls[#calls + 1] = "m" end)
    local c3 = clone(m)
    assert.are_not.equal(getmetatable(m), getmetatable(c3))
    h2:remove()
    calls = {}
    c3(x)
    assert.are.same({"m"}, calls)
  end)

  it("copies plain per-module tables (non-persistent buffers) instead of sharing them", function()
    local m = nn.Linear(2, 2)
    m:register_buffer("mask", nd.ones({2}), {persistent = false})
    local c = clone(m)
    assert.is_nil(c:state_dict().mask)
    c:register_buffer("mask", nd.zeros({2})) -- persistent in the clone
    assert.is_not_nil(c:state_dict().mask)
    assert.is_nil(m:state_dict().mask) -- still non-persistent in the original
    c:register_buffer("extra", nd.ones({1}), {persistent = false})
    m:register_buffer("extra", nd.ones({1}))
    assert.is_not_nil(m:state_dict().extra)
    assert.is_nil(c:state_dict().extra)
    -- (a ModuleDict's __pairs walks its entries, not its raw fields)
    local md = nn.ModuleDict({a = nn.Linear(2, 2)})
    local mc = clone(md)
    assert.is_nil(rawget(mc, "a"))
    assert.are_not.equal(md.a, mc.a)
    assert.is_true(md.a.weight:equal(mc.a.weight))
  end)
end)
