-- zoo_gpt2_spec.lua - Hugging Face's GPT-2 in needle (issue 21): the keys and
-- layouts of HF checkpoints, logits, attention masks, the key/value cache and
-- generation against a PyTorch reference with HF's module structure
-- (spec/fixtures/gen/gen_torch_zoo_gpt2.py: zoo_gpt2.safetensors holds the
-- weights as an HF checkpoint, zoo_gpt2_expected.safetensors the inputs and
-- the reference's outputs), on the cpu and every OpenCL device.
--
--   build/needle-lua spec/run.lua spec/zoo_gpt2_spec.lua
--
-- The fixture's token ids are HF's (0-based); needle's are 1-based, so the
-- spec adds 1 to every id (and position id) it feeds in and subtracts 1 from
-- what generate returns before comparing.
local nd = require "needle"
local D = require "spec.helpers.devices"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, has = A.errmsg, A.has

local models = nd.nn.models
local W = nd.load("spec/fixtures/zoo_gpt2.safetensors")
local EX, META = nd.load("spec/fixtures/zoo_gpt2_expected.safetensors")
local CFG = {vocab_size = tonumber(META.vocab_size), n_positions = tonumber(META.n_positions),
             n_embd = tonumber(META.n_embd), n_layer = tonumber(META.n_layer), n_head = tonumber(META.n_head)}
for k, v in pairs(CFG) do CFG[k] = math.tointeger(v) end

local HERE = "zoo_gpt2_spec.lua:" -- errors carry the position of the spec's own line
-- (the calls in error checks are not tail calls: a tail call leaves no frame to point at)

-- every element within 1e-4 relative (and 1e-5 absolute, for the values near 0)
local function close(what, got, want)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g = got:to("cpu"):to("float64")
  local w = want:to("float64")
  local excess = ((g - w):abs() - w:abs() * 1e-4 - 1e-5):max():item()
  assert(excess <= 0, ("%s: off by %.3g beyond 1e-4 relative (largest |value| %.3g)"):format(
    what, excess, w:abs():max():item()))
end

local function copy(sd)
  local out = {}
  for k, v in pairs(sd) do out[k] = v end
  return out
end

-- the fixture model, loaded from the HF checkpoint, in evaluation mode, on dev
local function fixture_model(dev)
  local m = models.GPT2LMHeadModel(CFG)
  m:load_state_dict(W)
  m:eval()
  if dev and dev ~= "cpu" then m:to(dev) end
  return m
end

local function ids_on(t, dev) return (t + 1):to(dev or "cpu") end

-- logits, presents without recording a graph
local function logits_of(m, ids, opts)
  return nd.no_grad(function() return m(ids, opts) end)
end

describe("nd.nn.models.GPT2LMHeadModel: Hugging Face's keys and layouts", function()
  it("has GPT2LMHeadModel's state_dict keys, Conv1D's (in, out) weights and lm_head tied to wte", function()
    local m = models.GPT2LMHeadModel(CFG)
    local sd = m:state_dict()
    local want = {}
    for k, v in pairs(W) do
      if not k:match("%.attn%.bias$") and not k:match("%.attn%.masked_bias$") then want[k] = v.shape end
    end
    want["lm_head.weight"] = {CFG.vocab_size, CFG.n_embd}
    local got = {}
    for k, v in pairs(sd) do got[k] = v.shape end
    assert.are.same(want, got)
    assert.are.same({32, 96}, sd["transformer.h.0.attn.c_attn.weight"].shape) -- (in, out), as HF's Conv1D
    assert.are.same({128, 32}, sd["transformer.h.1.mlp.c_proj.weight"].shape)
    assert.are.equal(m.transformer.wte.weight, m.lm_head.weight)
    -- the tied weight counts once: HF's num_parameters()
    assert.are.equal(29696, m:num_parameters())
  end)

  it("the 124M configuration (the defaults) has 124,439,808 parameters, HF's count with the tied head", function()
    local m = models.GPT2LMHeadModel()
    assert.are.equal(124439808, m:num_parameters())
    local sd = m:state_dict()
    local n = 0
    for _ in pairs(sd) do n = n + 1 end
    assert.are.equal(149, n) -- wte, wpe, 12 x 12 block tensors, ln_f, lm_head
    assert.are.same({768, 2304}, sd["transformer.h.11.attn.c_attn.weight"].shape)
    assert.are.same({1024, 768}, sd["transformer.wpe.weight"].shape)
    m, sd = nil, nil
    collectgarbage()
  end)

  it("loads an HF checkpoint in each of its layouts, ignoring attn.bias / attn.masked_bias", function()
    local want = logits_of(fixture_model(), ids_on(EX.input_ids))
    close("logits", want, EX.logits)
    -- with lm_head.weight (HF's state_dict()), and the bare GPT2Model keys of the original gpt2 files
    local with_head = copy(W)
    with_head["lm_head.weight"] = W["transformer.wte.weight"]
    local bare = {}
    for k, v in pairs(W) do bare[k:gsub("^transformer%.", "")] = v end
    assert.is_not_nil(bare["h.0.attn.bias"])
    for name, sd in pairs({with_head = with_head, bare = bare}) do
      local m = models.GPT2LMHeadModel(CFG)
      m:load_state_dict(sd)
      m:eval()
      close(name, logits_of(m, ids_on(EX.input_ids)), EX.logits)
    end
    -- GPT2Model takes both as well; its hidden states through the tied head are the logits
    local base = models.GPT2Model(CFG)
    base:load_state_dict(with_head)
    base:eval()
    local h = nd.no_grad(function() return (base(ids_on(EX.input_ids))) end)
    close("GPT2Model", h:matmul(W["transformer.wte.weight"]:t()), EX.logits)
  end)

  it("refuses an lm_head.weight that differs from the embedding it is tied to", function()
    local sd = copy(W)
    sd["lm_head.weight"] = W["transformer.wte.weight"] + 1
    local m = models.GPT2LMHeadModel(CFG)
    local msg = errmsg(function() local r = m:load_state_dict(sd); return r end)
    has(msg, HERE)
    has(msg, "needle.nn.models.GPT2LMHeadModel.load_state_dict: lm_head.weight {100,32} differs from " ..
             "transformer.wte.weight {100,32}")
  end)

  it("state_dict round-trips through a safetensors file, without the attn.bias buffers (as current HF)", function()
    local m = fixture_model()
    local path = os.tmpname()
    nd.save(m:state_dict(), path)
    local back = nd.load(path)
    os.remove(path)
    assert.is_nil(back["transformer.h.0.attn.bias"])
    assert.is_not_nil(back["lm_head.weight"])
    local m2 = models.GPT2LMHeadModel(CFG)
    m2:load_state_dict(back)
    m2:eval()
    close("round trip", logits_of(m2, ids_on(EX.input_ids)), EX.logits)
  end)

  it("is in needle.convert's registry: the config from the shapes, n_head from the option", function()
    assert.is_truthy(table.concat(nd.convert.models.names(), ","):find("gpt2", 1, true))
    local m = nd.convert.model("gpt2", W, {n_head = 4})
    assert.are.same({vocab_size = 100, n_positions = 32, n_embd = 32, n_layer = 2, n_head = 4, n_inner = 128},
                    {vocab_size = m.config.vocab_size, n_positions = m.config.n_positions, n_embd = m.config.n_embd,
                     n_layer = m.config.n_layer, n_head = m.config.n_head, n_inner = m.config.n_inner})
    assert.is_false(m.training)
    close("convert.model", logits_of(m, ids_on(EX.input_ids)), EX.logits)
    local bare = {}
    for k, v in pairs(W) do bare[k:gsub("^transformer%.", "")] = v end
    bare["lm_head.weight"] = W["transformer.wte.weight"]
    close("convert.model (bare keys)", logits_of(nd.convert.model("gpt2", bare, {n_head = 4}), ids_on(EX.input_ids)),
          EX.logits)
    -- n_embd 32 is no multiple of GPT-2's 64-dim heads: the option is needed
    has(errmsg(nd.convert.model, "gpt2", W),
        "needle.convert: cannot build 'gpt2' from this state dict: n_embd 32 is not a multiple of 64: give n_head")
  end)
end)

describe("nd.nn.models.GPT2LMHeadModel: errors at the user's line", function()
  local m = fixture_model()
  local WHO = "needle.nn.models.GPT2LMHeadModel: "
  local function err(...)
    local msg = errmsg(...)
    has(msg, HERE)
    return msg
  end

  it("token ids outside 1..vocab_size, saying that they are 1-based", function()
    has(err(function() local r = m(nd.tensor({{5, 0, 7}}, {dtype = "int64"})); return r end),
        WHO .. "token id 0 is out of range (expected 1..100; needle's token ids are 1-based: Hugging Face's id + 1)")
    has(err(function() local r = m(nd.tensor({{5, 101}}, {dtype = "int64"})); return r end),
        WHO .. "token id 101 is out of range")
    has(err(function() local r = m(nd.tensor({{1.0, 2.0}})); return r end),
        WHO .. "input_ids must be integers (int64, int32 or uint8), got float32 of shape {1,2}")
    has(err(function() local r = m(nd.ones({2, 2, 2}, {dtype = "int64"})); return r end),
        WHO .. "input_ids must be (B, T) or (T), got shape {2,2,2}")
    has(err(function() local r = m(nd.ones({1, 2}, {dtype = "int64"}), {position_ids = {{0, 1}}}); return r end),
        WHO .. "position id 0 is out of range (expected 1..32; position ids are 1-based")
  end)

  it("sequences longer than n_positions, masks and caches that do not fit", function()
    has(err(function() local r = m(nd.ones({1, 33}, {dtype = "int64"})); return r end),
        WHO .. "33 positions (0 cached + 33 new) exceed n_positions 32")
    has(err(function() local r = m(nd.ones({2, 4}, {dtype = "int64"}), {attention_mask = nd.ones({2, 3})}); return r
            end),
        WHO .. "attention_mask must be (B, past + T) = {2,4} (1: attend, 0: padding), got shape {2,3}")
    has(err(function() local r = m(nd.ones({2, 4}, {dtype = "int64"}), {past_key_values = {}}); return r end),
        WHO .. "past_key_values must be a cache from model:new_cache or a forward with use_cache = true")
    local cache = m:new_cache(1, 8)
    has(err(function() local r = m(nd.ones({2, 1}, {dtype = "int64"}), {past_key_values = cache}); return r end),
        WHO .. "past_key_values (GPT2Cache(batch_size=1, length=0, capacity=8, n_layer=2)) does not fit")
    has(err(function() local r = m:new_cache(1, 40); return r end),
        "needle.nn.models.GPT2Model.new_cache: max_length must be an integer in 1..32 (n_positions), got 40")
  end)

  it("configs and generation options", function()
    has(err(function() local r = models.GPT2LMHeadModel({n_embd = 30, n_head = 4}); return r end),
        WHO .. "n_embd (30) must be a multiple of n_head (4)")
    has(err(function() local r = models.GPT2LMHeadModel({n_layer = 1, activation_function = "gelu_newer"}); return r
            end),
        WHO .. "activation_function must be one of gelu, gelu_fast, gelu_new, gelu_pytorch_tanh, relu, silu, swish, " ..
               "tanh, got \"gelu_newer\"")
    local G = "needle.nn.models.GPT2LMHeadModel.generate: "
    local p = nd.ones({1, 30}, {dtype = "int64"})
    has(err(function() local r = m:generate(p, {max_new_tokens = 3}); return r end),
        G .. "the prompt's 30 positions + max_new_tokens 3 exceed n_positions 32")
    has(err(function() local r = m:generate(p, {max_new_tokens = 1, do_sample = true, temperature = 0}); return r end),
        G .. "temperature must be > 0, got 0")
    has(err(function() local r = m:generate(p, {max_new_tokens = 1, top_p = 0}); return r end),
        G .. "top_p must be in (0, 1]")
    has(err(function() local r = m:generate(p, {max_new_tokens = 1, eos_token_id = 0}); return r end),
        G .. "eos_token_id 0 is out of range (expected 1..100; needle's token ids are 1-based")
    local q = nd.ones({1, 3}, {dtype = "int64"})
    has(err(function() local r = m:generate(q, {max_new_tokens = 1, num_beams = 0}); return r end),
        G .. "num_beams must be >= 1, got 0")
    has(err(function() local r = m:generate(q, {max_new_tokens = 1, num_beams = 2, num_return_sequences = 3}); return r end),
        G .. "num_return_sequences must be in 1..num_beams (2), got 3")
    has(err(function() local r = m:generate(q, {max_new_tokens = 1, num_beams = 2, do_sample = true, top_k = 3}); return r
            end),
        G .. "beam sampling draws 2 * num_beams (4) distinct continuations a step, and only 3 have a nonzero " ..
             "probability (top_k below 2 * num_beams")
    has(err(function() local r = m:generate(q, {max_new_tokens = 1, length_penalty = 0.5}); return r end),
        G .. "length_penalty applies to beam search only (num_beams > 1)")
    has(err(function() local r = m:generate(q, {max_new_tokens = 1, num_beam = 2}); return r end),
        G .. "unknown option 'num_beam'")
    has(err(function() local r = m:generate(q, {max_new_tokens = 1}, 5); return r end),
        G .. "takes model:generate(input_ids[, opts]) only, got an extra argument #3: 5")
  end)

  it("length_penalty must be a finite number (NaN and the infinities reorder the beams)", function()
    local G = "needle.nn.models.GPT2LMHeadModel.generate: length_penalty must be a finite number"
    local q = nd.ones({1, 3}, {dtype = "int64"})
    for _, lp in ipairs({0 / 0, math.huge, -math.huge}) do
      has(err(function() local r = m:generate(q, {max_new_tokens = 2, num_beams = 2, length_penalty = lp}); return r end),
          G)
    end
    -- finite values, negative ones included, are HF's
    assert.are.same({5}, m:generate(q[1], {max_new_tokens = 2, num_beams = 2, length_penalty = -2}).shape)
  end)
end)

describe("nd.nn.models.GPT2LMHeadModel: the key/value cache", function()
  local m = fixture_model()
  local ids = ids_on(EX.input_ids)

  it("an incremental run, one token at a time after a 5-token prompt, gives PyTorch's logits", function()
    local _, cache = logits_of(m, ids:narrow(2, 1, 5), {use_cache = true})
    local steps = {}
    for t = 6, 8 do
      local l
      l, cache = nd.no_grad(function() return m(ids:narrow(2, t, 1), {past_key_values = cache}) end)
      steps[#steps + 1] = l
    end
    close("cached logits", nd.cat(steps, 2), EX.cached_logits)
    assert.are.equal(8, cache:get_seq_length())
    -- several new positions after a cached prefix: the causal mask is offset by the past
    local _, c2 = logits_of(m, ids:narrow(2, 1, 3), {use_cache = true})
    local l = logits_of(m, ids:narrow(2, 4, 5), {past_key_values = c2})
    close("5 after 3 cached", l, EX.logits:narrow(2, 4, 5))
  end)

  it("writes into buffers allocated once (model:new_cache), through views, with no concatenation", function()
    local cache = m:new_cache(2, 8)
    local k1, v1 = cache.keys[1], cache.values[2]
    assert.are.same({2, 4, 8, 8}, k1.shape) -- (B, n_head, capacity, head_dim)
    local _, c = logits_of(m, ids:narrow(2, 1, 2), {past_key_values = cache})
    assert.are.equal(cache, c)
    for t = 3, 8 do logits_of(m, ids:narrow(2, t, 1), {past_key_values = cache}) end
    assert.are.equal(k1, cache.keys[1])
    assert.are.equal(v1, cache.values[2])
    assert.are.equal(8, cache.capacity)
    local k, v = cache:layer(2)
    assert.are.same({2, 4, 8, 8}, k.shape)
    assert.are.same({2, 4, 8, 8}, v.shape)
    -- a cache made by use_cache grows by doubling when it must
    local _, grown = logits_of(m, ids:narrow(2, 1, 3), {use_cache = true})
    assert.are.equal(3, grown.capacity)
    local last = logits_of(m, ids:narrow(2, 4, 1), {past_key_values = grown})
    assert.are.equal(6, grown.capacity)
    close("after growing", last, EX.logits:narrow(2, 4, 1))
  end)

  it("left padding: attention_mask and 1-based position_ids give PyTorch's logits", function()
    close("masked logits", logits_of(m, ids, {attention_mask = EX.attention_mask, position_ids = EX.position_ids + 1}),
          EX.logits_masked)
  end)

  it("with gradients on, the cached forward still backpropagates into the new keys and values", function()
    local mt = fixture_model()
    local _, cache = logits_of(mt, ids:narrow(2, 1, 5), {use_cache = true})
    local l = mt(ids:narrow(2, 6, 3), {past_key_values = cache})
    close("cached logits with grad", l, EX.logits:narrow(2, 6, 3))
    l:sum():backward()
    local g = mt.transformer.h[1].attn.c_attn.weight.grad
    assert.are.same({32, 96}, g.shape)
    -- the key columns (33..64) get a gradient only through the attention over the new keys
    assert.is_true(g:narrow(2, 33, 32):abs():sum():item() > 0)
  end)
end)

describe("nd.nn.models.GPT2LMHeadModel:generate", function()
  local m = fixture_model()
  local T = EX.gen_prompt:size(2)

  it("greedy: PyTorch's tokens (a full re-run per token there), with the cache and without", function()
    for _, use_cache in ipairs({true, false}) do
      local out = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 10, use_cache = use_cache})
      assert.are.same(EX.gen_ids:totable(), (out - 1):totable())
      local padded = m:generate(ids_on(EX.gen_masked_prompt), {max_new_tokens = 10, use_cache = use_cache,
                                                                 attention_mask = EX.gen_masked_mask})
      assert.are.same(EX.gen_masked_ids:totable(), (padded - 1):totable())
    end
    -- (the reference's two largest logits were at least this far apart at every step)
    assert.is_true(EX.min_margin:item() > 1e-3)
  end)

  it("takes the attention_mask forward takes: float32, bool or a Lua list, as the int64 one", function()
    local mask = EX.gen_masked_mask
    local prompt = ids_on(EX.gen_masked_prompt)
    local beams = m:generate(prompt, {max_new_tokens = 4, num_beams = 2, attention_mask = mask:to("int64")})
    for _, alt in ipairs({mask:to("float32"), mask:to("float64"), mask:ne(0), mask:to("float32"):totable()}) do
      for _, use_cache in ipairs({true, false}) do
        local out = m:generate(prompt, {max_new_tokens = 10, use_cache = use_cache, attention_mask = alt})
        assert.are.same(EX.gen_masked_ids:totable(), (out - 1):totable())
      end
      assert.are.same(beams:totable(),
                      m:generate(prompt, {max_new_tokens = 4, num_beams = 2, attention_mask = alt}):totable())
    end
    -- a mask of other values than 0 and 1 is refused, naming generate and attention_mask
    local half = mask:to("float32") * 0.5
    local msg = errmsg(function() local r = m:generate(prompt, {max_new_tokens = 1, attention_mask = half}); return r end)
    has(msg, "needle.nn.models.GPT2LMHeadModel.generate: attention_mask must hold 0 (padding) and 1 (attend) only, " ..
             "got other values in a float32 mask")
  end)

  it("beam search: PyTorch's sequences (Hugging Face's BeamSearchScorer), with the cache and without", function()
    local eos = EX.beam_eos[1]:item() + 1
    for _, use_cache in ipairs({true, false}) do
      local o = {max_new_tokens = 8, use_cache = use_cache}
      local function gen(extra)
        local oo = {}
        for k, v in pairs(o) do oo[k] = v end
        for k, v in pairs(extra) do oo[k] = v end
        return (m:generate(ids_on(EX.gen_prompt), oo) - 1):totable()
      end
      assert.are.same(EX.beam3_ids:totable(), gen({num_beams = 3}))
      -- an eos the search meets: hypotheses end there, scored by length; two per prompt
      assert.are.same(EX.beam4_eos_ids:totable(),
                      gen({num_beams = 4, eos_token_id = eos, length_penalty = 0.7, num_return_sequences = 2}))
      assert.are.same(EX.beam4_eos_early_ids:totable(),
                      gen({num_beams = 4, eos_token_id = eos, length_penalty = 0.7, early_stopping = true}))
      -- a left-padded batch: HF's position ids, the mask following the beams
      local masked = m:generate(ids_on(EX.gen_masked_prompt), {max_new_tokens = 6, num_beams = 3, use_cache = use_cache,
                                                                 attention_mask = EX.gen_masked_mask, eos_token_id = eos,
                                                                 num_return_sequences = 2})
      assert.are.same(EX.beam_masked_ids:totable(), (masked - 1):totable())
      -- the step's best candidate an eos: HF's stopping test counts it (the best running
      -- beam alone would stop this search after two tokens)
      local lp2 = m:generate(ids_on(EX.beam_lp2_prompt), {max_new_tokens = 9, num_beams = 2, length_penalty = 2.0,
                                                         eos_token_id = 92, use_cache = use_cache})
      assert.are.same(EX.beam_lp2_ids:totable(), (lp2 - 1):totable())
    end
    -- one beam is greedy search
    assert.are.same((m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 6})):totable(),
                    (m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 6, num_beams = 1})):totable())
  end)

  it("with the cache, every token after the prompt runs the model on one position", function()
    local seen = {}
    local h = m.transformer.h[1]:register_forward_pre_hook(function(_, args) seen[#seen + 1] = args[1]:size(2) end)
    m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 5})
    h:remove()
    assert.are.same({T, 1, 1, 1, 1}, seen)
  end)

  it("stops at eos_token_id and pads finished rows with it", function()
    local gen = (EX.gen_ids + 1):totable()
    local eos = gen[1][T + 3]
    local one = m:generate(ids_on(EX.gen_prompt):narrow(1, 1, 1), {max_new_tokens = 10, eos_token_id = eos})
    assert.are.same({table.unpack(gen[1], 1, T + 3)}, one:totable()[1]) -- stopped at the first eos
    local both = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 10, eos_token_id = eos}):totable()
    local want = {{}, {}}
    for b = 1, 2 do
      local done = false
      for i = 1, #gen[b] do
        want[b][i] = done and eos or gen[b][i]
        if i > T and gen[b][i] == eos then done = true end
      end
    end
    if #both[1] < #want[1] then -- both rows ended early
      for b = 1, 2 do want[b] = {table.unpack(want[b], 1, #both[1])} end
    end
    assert.are.same(want, both)
  end)

  it("accepts a Lua list as one sequence and returns one", function()
    local prompt = (EX.gen_prompt[1] + 1):totable()
    local out = m:generate(prompt, {max_new_tokens = 3})
    assert.are.same({T + 3}, out.shape)
    assert.are.same({table.unpack((EX.gen_ids[1] + 1):totable(), 1, T + 3)}, out:totable())
  end)

  it("the warpers keep the tokens HF's temperature, top-k and top-p warpers keep", function()
    local warp = require("needle.zoo.gpt2_generate").warp
    local s = EX.warp_scores
    local function kept(o) return warp(s, o):ne(-math.huge) end
    assert.are.same(EX.keep_top_k5:totable(), kept({top_k = 5}):totable())
    assert.are.same(EX.keep_top_p09:totable(), kept({top_p = 0.9}):totable())
    assert.are.same(EX.keep_top_p05:totable(), kept({top_p = 0.5}):totable())
    local combo = {temperature = 0.7, top_k = 20, top_p = 0.8}
    assert.are.same(EX.keep_t07_k20_p08:totable(), kept(combo):totable())
    close("warped probabilities", warp(s, combo):softmax(2), EX.probs_t07_k20_p08)
    -- with beams HF keeps at least 2 tokens a row (min_tokens_to_keep): the 2 likeliest
    local top2 = s:topk(2, 2)
    local floor = top2:min(2, true)
    for _, o in ipairs({{top_p = 0.01}, {top_k = 1}, {top_k = 1, top_p = 0.01}}) do
      local k2 = warp(s, o, 2):ne(-math.huge)
      assert.are.same(s:ge(floor):totable(), k2:totable())
      assert.are.same(kept(o):sum(2):totable(), nd.ones({s:size(1)}, {dtype = "int64"}):totable())
    end
  end)

  it("a tiny temperature (scores / temperature overflows) samples greedily, its limit", function()
    local warp = require("needle.zoo.gpt2_generate").warp
    local s = nd.tensor({{1, 3, 3, -2}, {0.5, 0.25, 0, 0}, {-1, -2, -3, -4}})
    for _, t in ipairs({1e-45, 1e-300}) do
      local w = warp(s, {temperature = t})
      assert.are.same({{-math.huge, 0, 0, -math.huge}, {0, -math.huge, -math.huge, -math.huge},
                       {0, -math.huge, -math.huge, -math.huge}}, w:totable())
      assert.is_true(w:softmax(2):isfinite():all():item())
    end
    local greedy = (EX.gen_ids + 1):totable()
    for _, t in ipairs({1e-30, 1e-45, 1e-300}) do
      local out = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 10, do_sample = true, temperature = t, seed = 1})
      assert.are.same(greedy, out:totable(), tostring(t))
    end
  end)

  it("sampling is reproducible with seed (or nd.manual_seed), and top_k = 1 is greedy", function()
    local o = {max_new_tokens = 8, do_sample = true, top_k = 10, seed = 7}
    local a = m:generate(ids_on(EX.gen_prompt), o)
    local b = m:generate(ids_on(EX.gen_prompt), o)
    assert.are.same(a:totable(), b:totable())
    nd.manual_seed(7)
    local c = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 8, do_sample = true, top_k = 10})
    assert.are.same(a:totable(), c:totable())
    local greedy = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 8, do_sample = true, top_k = 1, seed = 3})
    assert.are.same({table.unpack((EX.gen_ids + 1):totable()[1], 1, T + 8)}, greedy:totable()[1])
  end)

  it("draws the next token with PyTorch's probabilities (top_k = 5, 4000 draws)", function()
    -- the prompt is the first row of input_ids; its last position's logits are the reference's
    local n, k = 4000, 5
    local prompt = ids_on(EX.input_ids):narrow(1, 1, 1):expand({n, 8}):contiguous()
    local out = m:generate(prompt, {max_new_tokens = 1, do_sample = true, top_k = k, seed = 11})
    local last = EX.logits[1][8]
    local top, idx = last:topk(k)
    local p = (top - top:max()):exp()
    p = (p / p:sum()):totable()
    local count = {}
    for _, row in ipairs(out:narrow(2, 9, 1):totable()) do count[row[1]] = (count[row[1]] or 0) + 1 end
    local seen = 0
    for j, id in ipairs(idx:totable()) do -- (topk's indices are 1-based: needle's ids already)
      local got = (count[id] or 0) / n
      seen = seen + (count[id] or 0)
      local sd = math.sqrt(p[j] * (1 - p[j]) / n)
      assert(math.abs(got - p[j]) <= 5 * sd + 1e-3,
             ("token %d: drawn %.4f of the time, probability %.4f"):format(id, got, p[j]))
    end
    assert.are.equal(n, seen) -- nothing outside the top 5
  end)

  it("beam sampling draws 2 * num_beams continuations without replacement and keeps the best (4000 prompts)", function()
    -- one new token with 2 beams: the result is the likeliest of the 4 tokens
    -- drawn without replacement from the reference logits' top 6 at
    -- temperature 1.5; its distribution is summed here over every draw order
    local n, k, t = 4000, 6, 1.5
    local prompt = ids_on(EX.input_ids):narrow(1, 1, 1):expand({n, 8}):contiguous()
    local out = m:generate(prompt, {max_new_tokens = 1, do_sample = true, num_beams = 2, top_k = k, temperature = t,
                                    seed = 5})
    local top, idx = EX.logits[1][8]:topk(k)
    local w = ((top - top:max()) / t):exp()
    local p = (w / w:sum()):totable()
    local best = {}
    for j = 1, k do best[j] = 0 end
    local used = {}
    local function draw(depth, mass, prob, likeliest)
      if depth == 4 then
        best[likeliest] = best[likeliest] + prob
        return
      end
      for j = 1, k do
        if not used[j] then
          used[j] = true
          draw(depth + 1, mass - p[j], prob * p[j] / mass, math.min(likeliest, j))
          used[j] = false
        end
      end
    end
    draw(0, 1, 1, k + 1)
    local count = {}
    for _, row in ipairs(out:narrow(2, 9, 1):totable()) do count[row[1]] = (count[row[1]] or 0) + 1 end
    local seen = 0
    for j, id in ipairs(idx:totable()) do
      local got = (count[id] or 0) / n
      seen = seen + (count[id] or 0)
      local sd = math.sqrt(best[j] * (1 - best[j]) / n)
      assert(math.abs(got - best[j]) <= 5 * sd + 1e-3,
             ("token %d: the best %.4f of the time, expected %.4f"):format(id, got, best[j]))
    end
    assert.are.equal(n, seen)
    assert.is_true(best[1] < 0.97 and best[2] > 0.02, "the distribution is not a certainty")
  end)

  it("beam sampling is reproducible with seed, and drawing every candidate is beam search", function()
    local o = {max_new_tokens = 6, num_beams = 3, do_sample = true, top_p = 0.9, seed = 4, num_return_sequences = 2,
               eos_token_id = EX.beam_eos[1]:item() + 1}
    local a = m:generate(ids_on(EX.gen_prompt), o)
    assert.are.same(a:totable(), m:generate(ids_on(EX.gen_prompt), o):totable())
    assert.are.same({EX.gen_prompt:size(1) * 2, T + 6}, a.shape)
    -- one step, top_k = 2 * num_beams: all 6 continuations are drawn, then sorted
    local one = {max_new_tokens = 1, num_beams = 3}
    local sampled = m:generate(ids_on(EX.gen_prompt), {max_new_tokens = 1, num_beams = 3, do_sample = true, top_k = 6,
                                                       seed = 9})
    assert.are.same(m:generate(ids_on(EX.gen_prompt), one):totable(), sampled:totable())
  end)

  it("KV-cached generation equals the uncached one token for token at 256 tokens of context, and is faster",
     function()
    -- a small model with room for 256 + 17 positions; the time per token is printed, not asserted
    nd.manual_seed(2026)
    local big = models.GPT2LMHeadModel({vocab_size = 512, n_positions = 280, n_embd = 128, n_layer = 4, n_head = 4})
    big:eval()
    local prompt = nd.randint(1, 512, {1, 256}, {dtype = "int64"})
    local cached = big:generate(prompt, {max_new_tokens = 8})
    local full = big:generate(prompt, {max_new_tokens = 8, use_cache = false})
    assert.are.same(full:totable(), cached:totable())
    assert.are.same({1, 264}, cached.shape)
    -- per token: the time of 1 + k new tokens less that of 1 (the prompt's pass), each the
    -- best of 3 runs (the machine is shared: the minimum is the least disturbed)
    local function best_of_3(n, use_cache)
      local best = math.huge
      for _ = 1, 3 do
        local t0 = nd.clock()
        big:generate(prompt, {max_new_tokens = n, use_cache = use_cache})
        best = math.min(best, nd.clock() - t0)
      end
      return best
    end
    local function per_token(use_cache, k)
      return (best_of_3(1 + k, use_cache) - best_of_3(1, use_cache)) / k
    end
    local with, without = per_token(true, 16), per_token(false, 4)
    print(("\nGPT-2 (n_embd 128, 4 layers) at 256 tokens of context: %.2f ms per token with the KV cache, " ..
           "%.2f ms re-running the sequence: %.1fx"):format(with * 1e3, without * 1e3, without / with))
  end)
end)

describe("nd.nn.models.GPT2LMHeadModel on OpenCL", function()
  if D.pending_without_opencl(pending, "GPT-2 on OpenCL") then return end
  for _, dev in ipairs(D.opencl()) do
    it("logits, masks, the cache, greedy generation and beam search equal PyTorch's on " .. D.describe(dev), function()
      local m = fixture_model(dev)
      assert.are.equal(dev, m.transformer.h[1].attn.c_attn.weight.device)
      assert.is_true(m.transformer.h[1].attn.c_attn.weight:t():is_contiguous()) -- the layout :to restores
      local ids = ids_on(EX.input_ids, dev)
      close("logits on " .. dev, logits_of(m, ids), EX.logits)
      close("masked logits on " .. dev, logits_of(m, ids, {attention_mask = EX.attention_mask:to(dev),
                                                         position_ids = (EX.position_ids + 1):to(dev)}),
            EX.logits_masked)
      local _, cache = logits_of(m, ids:narrow(2, 1, 5), {use_cache = true})
      local steps = {}
      for t = 6, 8 do steps[#steps + 1] = logits_of(m, ids:narrow(2, t, 1), {past_key_values = cache}) end
      close("cached logits on " .. dev, nd.cat(steps, 2), EX.cached_logits)
      for _, use_cache in ipairs({true, false}) do
        local out = m:generate(ids_on(EX.gen_prompt, dev), {max_new_tokens = 10, use_cache = use_cache})
        assert.are.equal(dev, out.device)
        assert.are.same(EX.gen_ids:totable(), (out:to("cpu") - 1):totable())
      end
      local padded = m:generate(ids_on(EX.gen_masked_prompt, dev), {max_new_tokens = 10,
                                                                      attention_mask = EX.gen_masked_mask})
      assert.are.same(EX.gen_masked_ids:totable(), (padded:to("cpu") - 1):totable())
      local beams = m:generate(ids_on(EX.gen_prompt, dev), {max_new_tokens = 8, num_beams = 4, num_return_sequences = 2,
                                                           eos_token_id = EX.beam_eos[1]:item() + 1, length_penalty = 0.7})
      assert.are.same(EX.beam4_eos_ids:totable(), (beams:to("cpu") - 1):totable())
      -- a seed draws the same tokens as on the cpu
      local o = {max_new_tokens = 6, do_sample = true, top_p = 0.9, temperature = 0.8, seed = 5}
      assert.are.same(fixture_model():generate(ids_on(EX.gen_prompt), o):totable(),
                      m:generate(ids_on(EX.gen_prompt, dev), o):to("cpu"):totable())
    end)
  end
end)
