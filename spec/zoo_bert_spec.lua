-- zoo_bert_spec.lua - BERT and DistilBERT (needle.zoo.bert, nd.nn.models) against
-- a PyTorch reference written with Hugging Face's module structure and names
-- (spec/fixtures/gen/gen_torch_zoo_bert.py: transformers is not packaged), on the
-- CPU and every OpenCL device; the converter entries (needle.zoo.register_bert);
-- the 1-based token ids and their errors.
--
--   build/needle-lua spec/run.lua spec/zoo_bert_spec.lua
--
-- The fixtures hold Hugging Face's 0-based ids, token types and labels (as
-- PyTorch ran them); needle's are 1-based, so each is fed in + 1. That the
-- same weights then give the same numbers is the check that row n of a
-- Hugging Face embedding is needle's id n + 1.
local nd = require "needle"
local convert = require "needle.convert"
local D = require "spec.helpers.devices"
local A = require("spec.helpers.assertions").bind(assert)
local H = require "spec.helpers.scripts"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local models = nd.nn.models
local FIX = nd.load("spec/fixtures/zoo_bert.safetensors")
local DFIX = nd.load("spec/fixtures/zoo_bert_distil.safetensors")

-- the sizes gen_torch_zoo_bert.py used (dropout 0: train mode runs the same numbers)
local BERT = {vocab_size = 100, hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4,
              intermediate_size = 64, max_position_embeddings = 16, hidden_dropout_prob = 0,
              attention_probs_dropout_prob = 0}
local DISTIL = {vocab_size = 100, max_position_embeddings = 16, n_layers = 2, n_heads = 4, dim = 32, hidden_dim = 64,
                dropout = 0, attention_dropout = 0}

local function with(t, extra)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- the fixture's tensors whose keys start with one of the prefixes (weights only),
-- with `strip` taken off the front
local function weights(fix, prefixes, strip)
  local sd = {}
  for k, v in pairs(fix) do
    for _, p in ipairs(prefixes) do
      if k:sub(1, #p) == p then sd[strip and k:sub(#strip + 1) or k] = v end
    end
  end
  return sd
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- every element within 1e-4 |want| + 1e-6 max|want| (float32 against PyTorch's float32)
local function assert_close(got, want, what)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g, w = got:to({dtype = "float64", device = "cpu"}), want:to("float64")
  local scale = w:abs():max():item()
  local excess = ((g - w):abs() - (w:abs() * 1e-4 + 1e-6 * scale)):max():item()
  assert(excess <= 0, ("%s: differs from PyTorch by up to %.3g beyond the tolerance (max |want| %.3g)"):format(
    what, excess, scale))
end

-- the fixture's inputs, 1-based, on device
local function inputs(fix, device)
  local function on(t, plus) return (t + plus):to(device) end
  return on(fix["input.input_ids"], 1), {
    attention_mask = fix["input.attention_mask"]:to(device),
    token_type_ids = fix["input.token_type_ids"] and on(fix["input.token_type_ids"], 1) or nil,
  }
end

describe("BERT against the PyTorch reference", function()
  -- (the cases below run on the cpu and on every OpenCL device; without one, this line says so)
  D.pending_without_opencl(pending, "BERT and DistilBERT on OpenCL")
  for _, dev in ipairs(D.all()) do
    it("BertModel: last_hidden_state and pooler_output, with a mask, token types, positions (" .. D.describe(dev) .. ")",
       function()
      -- through the converter: bert.* keys, the heads' left out, the heads from the option
      local m = convert.model("bert", weights(FIX, {"bert.", "classifier.", "cls."}), {num_attention_heads = 4}):to(dev)
      assert.is_true(m.add_pooling_layer)
      local ids, o = inputs(FIX, dev)
      local h, pooled = m(ids, o)
      assert_close(h, FIX["out.last_hidden_state"], "last_hidden_state")
      assert_close(pooled, FIX["out.pooler_output"], "pooler_output")
      o.position_ids = (FIX["input.position_ids"] + 1):to(dev)
      assert_close((m(ids, o)), FIX["out.last_hidden_state_pos"], "last_hidden_state with position_ids")
      -- no mask, no token types: all attended, all type 1 (Hugging Face's 0)
      assert_close((m(ids)), FIX["out.last_hidden_state_nomask"], "last_hidden_state without a mask")
    end)

    it("BertForSequenceClassification and BertForMaskedLM logits (" .. D.describe(dev) .. ")", function()
      local cls = models.BertForSequenceClassification(with(BERT, {num_labels = 3}))
      cls:load_state_dict(weights(FIX, {"bert.", "classifier."}))
      cls:eval():to(dev)
      local ids, o = inputs(FIX, dev)
      assert_close(cls(ids, o), FIX["out.seq_logits"], "sequence classification logits")
      -- the masked LM through the converter (its mapping leaves out the pooler it has not)
      local mlm = convert.model("bert_for_masked_lm", weights(FIX, {"bert.", "cls."}), {num_attention_heads = 4}):to(dev)
      assert_close(mlm(ids, o), FIX["out.mlm_logits"], "masked LM logits")
      assert.are.equal(mlm.bert.embeddings.word_embeddings.weight, mlm.cls.predictions.decoder.weight)
    end)

    it("token classification and question answering heads, BERT and DistilBERT, through the converter ("
       .. D.describe(dev) .. ")", function()
      -- Hugging Face's key names: classifier.* (the fixture keeps the token head's as token.*)
      -- and qa_outputs.*; a pooler in the BERT checkpoints is left out (the heads have none)
      local function head_sd(fix, base)
        local sd = weights(fix, {base})
        for k, v in pairs(weights(fix, {"token."}, "token.")) do sd[k] = v end
        return sd
      end
      for _, c in ipairs({{FIX, "bert.", "bert", {num_attention_heads = 4}, BERT},
                          {DFIX, "distilbert.", "distilbert", {n_heads = 4}, DISTIL}}) do
        local fix, base, name, opts = c[1], c[2], c[3], c[4]
        local ids, o = inputs(fix, dev)
        local tok = convert.model(name .. "_for_token_classification", head_sd(fix, base), opts):to(dev)
        assert.are.equal(5, tok.num_labels)
        assert_close(tok(ids, o), fix["out.token_logits"], name .. " token classification logits")
        local qa = convert.model(name .. "_for_question_answering", weights(fix, {base, "qa_outputs."}), opts):to(dev)
        local start, stop = qa(ids, o)
        assert_close(start, fix["out.start_logits"], name .. " start logits")
        assert_close(stop, fix["out.end_logits"], name .. " end logits")
        -- the constructors and load_state_dict give the same (strict: every key used)
        local cls = name == "bert" and models.BertForQuestionAnswering or models.DistilBertForQuestionAnswering
        local m = cls(with(c[5], name == "bert" and {} or {qa_dropout = 0}))
        local sd = weights(fix, {base, "qa_outputs."})
        if name == "bert" then sd = weights(fix, {"bert.embeddings.", "bert.encoder.", "qa_outputs."}) end
        m:load_state_dict(sd)
        m:eval():to(dev)
        assert_close((m(ids, o)), fix["out.start_logits"], name .. " start logits (constructor)")
      end
    end)

    it("DistilBERT: hidden states, logits, and one training step's loss and gradients (" .. D.describe(dev) .. ")",
       function()
      local m = models.DistilBertForSequenceClassification(with(DISTIL, {num_labels = 3, seq_classif_dropout = 0}))
      m:load_state_dict(weights(DFIX, {"distilbert.", "pre_classifier.", "classifier."}))
      m:to(dev):eval()
      local ids, o = inputs(DFIX, dev)
      assert_close((m.distilbert(ids, o)), DFIX["out.last_hidden_state"], "last_hidden_state")
      assert_close(m(ids, o), DFIX["out.logits"], "logits")
      m:train()
      local loss = nd.F.cross_entropy(m(ids, o), (DFIX["input.labels"] + 1):to(dev))
      loss:backward()
      assert_close(loss:reshape({1}), DFIX["out.loss"], "loss")
      local params = {}
      for _, p in ipairs(m:named_parameters()) do params[p[1]] = p[2] end
      local n = 0
      for k, want in pairs(DFIX) do
        local name = k:match("^grad%.(.*)$")
        if name then
          n = n + 1
          assert.is_not_nil(params[name], name)
          assert_close(params[name].grad, want, "gradient of " .. name)
        end
      end
      assert.are.equal(8, n)
      -- the padding row ([PAD], id 1) gets no gradient, as PyTorch's padding_idx
      assert.are.equal(0, params["distilbert.embeddings.word_embeddings.weight"].grad[1]:abs():sum():item())
    end)
  end


  it("DistilBertModel through the converter (distilbert.* keys, the heads left out)", function()
    local m = convert.model("distilbert", weights(DFIX, {"distilbert.", "pre_classifier.", "classifier."}),
                            {n_heads = 4})
    local ids, o = inputs(DFIX, "cpu")
    assert_close(m(ids, o), DFIX["out.last_hidden_state"], "last_hidden_state")
    assert.are.same({vocab_size = 100, dim = 32, n_layers = 2, n_heads = 4, hidden_dim = 64,
                     max_position_embeddings = 16},
                    {vocab_size = m.config.vocab_size, dim = m.config.dim, n_layers = m.config.n_layers,
                     n_heads = m.config.n_heads, hidden_dim = m.config.hidden_dim,
                     max_position_embeddings = m.config.max_position_embeddings})
  end)
end)

describe("Hugging Face's structure", function()
  it("state_dict keys are Hugging Face's, tied keys included for the masked LM", function()
    local cls = models.BertForSequenceClassification(with(BERT, {num_labels = 3}))
    assert.are.same(sorted_keys(weights(FIX, {"bert.", "classifier."})), sorted_keys(cls:state_dict()))
    local mlm = models.BertForMaskedLM(BERT)
    local want = weights(FIX, {"bert.", "cls."})
    for _, k in ipairs(sorted_keys(want)) do
      if k:find("^bert%.pooler%.") then want[k] = nil end
    end
    want["cls.predictions.decoder.weight"], want["cls.predictions.decoder.bias"] = true, true
    local sd = mlm:state_dict()
    assert.are.same(sorted_keys(want), sorted_keys(sd))
    assert.are.equal(sd["bert.embeddings.word_embeddings.weight"], sd["cls.predictions.decoder.weight"])
    local distil = models.DistilBertForSequenceClassification(with(DISTIL, {num_labels = 3}))
    assert.are.same(sorted_keys(weights(DFIX, {"distilbert.", "pre_classifier.", "classifier."})),
                    sorted_keys(distil:state_dict()))
    assert.is_nil(models.BertModel(with(BERT, {add_pooling_layer = false})):state_dict()["pooler.dense.weight"])
  end)

  it("the masked LM loads Hugging Face's state_dict() (tied keys present) and save_pretrained's (absent)", function()
    local sd = weights(FIX, {"bert.", "cls."})
    sd["bert.pooler.dense.weight"], sd["bert.pooler.dense.bias"] = nil, nil
    local a = models.BertForMaskedLM(BERT)
    a:load_state_dict(sd)
    local full = {}
    for k, v in pairs(sd) do full[k] = v end
    full["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
    full["cls.predictions.decoder.bias"] = sd["cls.predictions.bias"]
    full["bert.embeddings.position_ids"] = nd.arange(0, 16, {dtype = "int64"}):view({1, 16}) -- transformers < 4.31
    local b = models.BertForMaskedLM(BERT)
    b:load_state_dict(full)
    local ids = FIX["input.input_ids"] + 1
    a:eval(); b:eval()
    assert_close(a(ids), b(ids), "masked LM loaded both ways")
    -- a missing key is still missing
    sd["cls.predictions.transform.dense.weight"] = nil
    assert_contains(errmsg(models.BertForMaskedLM(BERT).load_state_dict, models.BertForMaskedLM(BERT), sd),
                    "missing keys: cls.predictions.transform.dense.weight")
  end)

  it("the masked LM refuses decoder keys of another shape or other values than the tensors they are tied to", function()
    local sd = weights(FIX, {"bert.", "cls."})
    sd["bert.pooler.dense.weight"], sd["bert.pooler.dense.bias"] = nil, nil
    local W, Bias = sd["bert.embeddings.word_embeddings.weight"], sd["cls.predictions.bias"]
    local function variant(dw, db, drop_tied)
      local out = {}
      for k, v in pairs(sd) do out[k] = v end
      out["cls.predictions.decoder.weight"], out["cls.predictions.decoder.bias"] = dw, db
      if drop_tied then out["bert.embeddings.word_embeddings.weight"], out["cls.predictions.bias"] = nil, nil end
      return out
    end
    local m = models.BertForMaskedLM(BERT)
    local before = m:state_dict()["bert.embeddings.word_embeddings.weight"]:clone()
    local function refused(bad)
      local msg = errmsg(m.load_state_dict, m, bad)
      assert.are.same(before:totable(), m.cls.predictions.decoder.weight:totable()) -- all or nothing
      return msg
    end
    local WHO = "needle.nn.models.BertForMaskedLM.load_state_dict: "
    -- another shape: an error naming the key and both shapes (with the tied keys present or absent)
    for _, drop in ipairs({false, true}) do
      assert_contains(refused(variant(nd.zeros({101, 32}), nd.zeros({7}), drop)), WHO .. "shape mismatch: "
        .. "cls.predictions.decoder.weight (checkpoint {101,32}, model {100,32}), "
        .. "cls.predictions.decoder.bias (checkpoint {7}, model {100})")
    end
    -- other values: an untied head is an error, as GPT-2's lm_head.weight
    assert_contains(refused(variant(W + 1, Bias)), WHO .. "cls.predictions.decoder.weight {100,32} differs from "
      .. "bert.embeddings.word_embeddings.weight {100,32}: BERT's masked-LM decoder is tied to the word embeddings")
    assert_contains(refused(variant(W, Bias + 1)), WHO .. "cls.predictions.decoder.bias {100} differs from "
      .. "cls.predictions.bias {100}: BERT's masked-LM decoder is tied to the prediction bias")
    assert_contains(errmsg(convert.model, "bert_for_masked_lm", variant(W + 1, Bias), {nhead = 4}),
                    "cls.predictions.decoder.weight {100,32} differs from bert.embeddings.word_embeddings.weight")
    -- the same values load (in another dtype too), and the decoder's alone stand for the tied keys
    m:load_state_dict(variant(W:to("float64"), Bias))
    m:load_state_dict(variant(W * 2, Bias * 2, true))
    assert.are.same((W * 2):totable(), m.bert.embeddings.word_embeddings.weight:totable())
    assert.are.same((Bias * 2):totable(), m.cls.predictions.bias:totable())
  end)

  it("the decoder is the word embeddings (one tensor: gradients add up, :to keeps the tie)", function()
    local m = models.BertForMaskedLM(with(BERT, {num_hidden_layers = 1}))
    local w = m.bert.embeddings.word_embeddings.weight
    assert.are.equal(w, m.cls.predictions.decoder.weight)
    assert.are.equal(m.cls.predictions.bias, m.cls.predictions.decoder.bias)
    local names = {}
    for _, p in ipairs(m:named_parameters()) do names[#names + 1] = p[1] end
    assert.is_nil(table.concat(names, " "):find("decoder"))
    assert.are.equal(m:num_parameters(), models.BertModel(with(BERT, {num_hidden_layers = 1,
      add_pooling_layer = false})):num_parameters() + 100 + 32 * 32 + 32 + 2 * 32)
    m(FIX["input.input_ids"] + 1):sum():backward()
    assert.is_not_nil(w.grad)
    for _, dev in ipairs(D.opencl()) do
      m:to(dev)
      assert.are.equal(m.bert.embeddings.word_embeddings.weight, m.cls.predictions.decoder.weight)
      assert.are.equal(dev, m.cls.predictions.decoder.weight.device)
    end
  end)

  it("the full-size configurations have Hugging Face's parameter counts", function()
    -- BertModel() is BERT-base (bert-base-uncased): 109,482,240 parameters
    local m = models.BertModel()
    assert.are.equal(109482240, m:num_parameters())
    assert.are.equal(12, #m.encoder.layer)
    m = nil -- luacheck: ignore (frees 440 MB before the next one)
    collectgarbage()
    -- (DistilBertModel(), distilbert-base: 66,362,880, and BertForMaskedLM(): 109,514,298,
    -- are left out for time; the same code builds the small ones above)
  end)

  it("padding changes nothing for the tokens before it", function()
    local m = models.BertModel(BERT):eval()
    local ids = nd.tensor({{5, 9, 12, 40, 0 + 1, 1, 1}}, {dtype = "int64"})
    local mask = nd.tensor({{1, 1, 1, 1, 0, 0, 0}}, {dtype = "int64"})
    local h = m(ids, {attention_mask = mask})
    local h4 = m(ids:narrow(2, 1, 4))
    assert_close(h:narrow(2, 1, 4), h4, "padded vs unpadded")
    -- a bool mask and a float mask mean the same
    assert_close(m(ids, {attention_mask = mask:eq(1)}), h, "bool mask")
    assert_close(m(ids, {attention_mask = mask:to("float32")}), h, "float mask")
    -- a (B, T, T) mask, query by key: every query sees the first four keys, as above
    assert_close(m(ids, {attention_mask = mask:view({1, 1, 7}):expand({1, 7, 7})}), h, "3-D mask")
    local causal = nd.ones({7, 7}, {dtype = "int64"}):tril():view({1, 7, 7})
    assert_close(m(ids, {attention_mask = causal}):narrow(2, 1, 1), m(ids:narrow(2, 1, 1)), "causal mask, first token")
  end)

  it("takes Lua tables (rows of 1-based ids) as tensors", function()
    local m = models.BertModel(BERT):eval()
    local ids, mask, types = {{3, 8, 9, 4}, {3, 7, 4, 1}}, {{1, 1, 1, 1}, {1, 1, 1, 0}}, {{1, 1, 2, 2}, {1, 1, 1, 1}}
    local h1, p1 = m(ids, {attention_mask = mask, token_type_ids = types})
    local i64 = {dtype = "int64"}
    local h2, p2 = m(nd.tensor(ids, i64), {attention_mask = nd.tensor(mask, i64), token_type_ids = nd.tensor(types, i64)})
    assert.are.same(h2:totable(), h1:totable())
    assert.are.same(p2:totable(), p1:totable())
  end)

  it("tokenizer -> model: nd.text's ids, token types and mask go in as they come (all 1-based)", function()
    local vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s", "."}
    local tok = nd.text.WordPiece.new(vocab)
    local m = models.BertForMaskedLM(with(BERT, {vocab_size = #vocab})):eval()
    local enc = tok:encode_batch({{"the cat sat", "a dog"}, "the mats ."}, {padding = true, return_tensors = true})
    local logits = m(enc.input_ids, {attention_mask = enc.attention_mask, token_type_ids = enc.token_type_ids})
    assert.are.same({2, 8, #vocab}, logits.shape)
    -- the padded second text (two [PAD]) as if it were alone
    local one = tok:encode_batch({"the mats ."}, {return_tensors = true})
    assert.are.same({1, 6}, one.input_ids.shape)
    assert_close(logits[{{2, 2}, {1, 6}}], m(one.input_ids, {token_type_ids = one.token_type_ids}), "padded vs alone")
  end)

  it("dropout follows train() and eval()", function()
    local m = models.BertModel(with(BERT, {hidden_dropout_prob = 0.5}))
    local ids = FIX["input.input_ids"] + 1
    m:eval()
    assert_close(m(ids), m(ids), "eval is deterministic")
    m:train()
    local a, b = m(ids), m(ids)
    assert.is_true((a - b):abs():max():item() > 1e-3)
  end)
end)

describe("bad input", function()
  local m = models.BertModel(BERT)
  local ids = FIX["input.input_ids"] + 1

  it("token ids out of range, with the 1-based hint", function()
    assert_contains(errmsg(m, FIX["input.input_ids"]), "needle.nn.models.BertModel: input_ids holds 0, outside 1..100 "
      .. "(needle's token ids are 1-based: Hugging Face's id i is i + 1 here, [PAD] 0 is 1)")
    assert_contains(errmsg(m, ids * 0 + 101), "input_ids holds 101, outside 1..100")
    local cls = models.BertForSequenceClassification(BERT)
    assert_contains(errmsg(cls, ids - 1), "needle.nn.models.BertForSequenceClassification: input_ids holds 0")
    local d = models.DistilBertModel(DISTIL)
    assert_contains(errmsg(d, ids * 0), "needle.nn.models.DistilBertModel: input_ids holds 0, outside 1..100")
    assert_contains(errmsg(m, ids, {token_type_ids = FIX["input.token_type_ids"]}),
                    "token_type_ids holds 0, outside 1..2 (token types are 1-based: 1 for the first segment, "
                    .. "2 for the second (Hugging Face's 0 and 1))")
    assert_contains(errmsg(m, ids, {position_ids = FIX["input.position_ids"]:narrow(1, 1, 1) * 0}),
                    "position_ids holds 0, outside 1..16 (position ids are 1-based")
  end)

  it("shapes, dtypes and options", function()
    assert_contains(errmsg(m, ids[1]), "expected input_ids of shape (batch, sequence), got {8} (one sequence: "
      .. "ids:view({1, -1}))")
    assert_contains(errmsg(m, ids:to("float32")), "input_ids must hold integer ids (int64 or int32), got float32 of "
      .. "shape {2,8}")
    assert_contains(errmsg(m, "hello"), "input_ids must be a tensor (batch, sequence), got \"hello\"")
    assert_contains(errmsg(m, ids, {attention_mask = nd.ones({2, 7})}),
                    "attention_mask must have shape (batch, sequence) = {2,8} (or {2,8,8}) as input_ids, got {2,7}")
    assert_contains(errmsg(m, ids, {token_type_ids = nd.ones({2, 7}, {dtype = "int64"})}),
                    "token_type_ids must have the shape of input_ids {2,8}, got {2,7}")
    assert_contains(errmsg(m, nd.ones({1, 17}, {dtype = "int64"})),
                    "input_ids {1,17}: the sequence length 17 exceeds max_position_embeddings 16")
    assert_contains(errmsg(m, ids, {attn_mask = 1}), "needle.nn.models.BertModel: unknown option 'attn_mask' "
      .. "(valid: attention_mask, position_ids, token_type_ids)")
    assert_contains(errmsg(models.DistilBertModel(DISTIL), ids, {token_type_ids = ids}),
                    "needle.nn.models.DistilBertModel: unknown option 'token_type_ids' (valid: attention_mask)")
    for _, dev in ipairs(D.opencl()) do
      assert_contains(errmsg(m, ids:to(dev)), ("input_ids is on %s but the model is on cpu"):format(dev))
    end
  end)

  it("configurations", function()
    assert_contains(errmsg(models.BertModel, with(BERT, {num_attention_heads = 5})),
                    "needle.nn.models.BertModel: hidden_size 32 is not a multiple of num_attention_heads 5")
    assert_contains(errmsg(models.BertModel, with(BERT, {pad_token_id = 0})),
                    "pad_token_id must be a token id in 1..100 (1-based: Hugging Face's pad_token_id 0 is 1 here), got 0")
    assert_contains(errmsg(models.BertModel, with(BERT, {hidden_act = "gelu_fast"})),
                    "hidden_act 'gelu_fast' is not supported (known: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, ")
    assert_contains(errmsg(models.BertModel, with(BERT, {hidden_size = 0})), "hidden_size must be a positive integer")
    assert_contains(errmsg(models.BertModel, with(BERT, {hidden_dropout_prob = 2})),
                    "hidden_dropout_prob must be a probability in [0, 1], got 2")
    assert_contains(errmsg(models.BertModel, with(BERT, {attention_probs_dropout_prob = 0 / 0})),
                    "attention_probs_dropout_prob must be a probability in [0, 1], got")
    assert_contains(errmsg(models.BertModel, {hiden_size = 8}), "needle.nn.models.BertModel: unknown option 'hiden_size'")
    for _, r in ipairs({0 / 0, math.huge, -1}) do
      assert_contains(errmsg(models.BertModel, with(BERT, {initializer_range = r})), "needle.nn.models.BertModel: "
        .. "initializer_range (the standard deviation of the initial weights) must be a finite number >= 0, got "
        .. tostring(r))
      assert_contains(errmsg(models.DistilBertForSequenceClassification, with(DISTIL, {initializer_range = r})),
                      "needle.nn.models.DistilBertForSequenceClassification: initializer_range (the standard "
                      .. "deviation of the initial weights) must be a finite number >= 0, got " .. tostring(r))
    end
    assert.is_true(models.BertModel(with(BERT, {initializer_range = 0})).pooler.dense.weight:eq(0):all():item())
    assert_contains(errmsg(models.DistilBertModel, with(DISTIL, {n_heads = 5})), "dim 32 is not a multiple of n_heads 5")
    assert_contains(errmsg(models.DistilBertModel, with(DISTIL, {sinusoidal_pos_embds = true})),
                    "sinusoidal_pos_embds = true is not supported")
  end)

  it("the converter says what it cannot tell and what is missing", function()
    local sd = weights(FIX, {"bert."})
    assert_contains(errmsg(convert.model, "bert", sd),
                    "the weights do not tell the number of attention heads and the width 32 is not a multiple of 64")
    sd["bert.embeddings.token_type_embeddings.weight"] = nil
    assert_contains(errmsg(convert.model, "bert", sd, {nhead = 4}),
                    "cannot build 'bert' from this state dict: the state dict has no 'embeddings.token_type_embeddings.weight'")
    assert_contains(errmsg(convert.model, "distilbert", {}, {n_heads = 2}),
                    "the state dict has no 'embeddings.word_embeddings.weight'")
  end)
end)

describe("the converter registry", function()
  it("lists the nine models and their mappings; legacy LayerNorm.gamma/beta keys load", function()
    local names = table.concat(convert.models.names(), " ")
    for _, n in ipairs({"bert", "bert_for_sequence_classification", "bert_for_masked_lm", "distilbert",
                        "distilbert_for_sequence_classification", "bert_for_token_classification",
                        "bert_for_question_answering", "distilbert_for_token_classification",
                        "distilbert_for_question_answering"}) do
      assert.truthy((" " .. names .. " "):find(" " .. n .. " ", 1, true), n)
      assert.are.equal("hf_" .. n, convert.models.get(n).mapping)
      assert.is_not_nil(convert.mappings.descriptions["hf_" .. n])
    end
    local sd = {}
    for k, v in pairs(weights(FIX, {"bert.", "classifier."})) do
      sd[(k:gsub("LayerNorm%.weight$", "LayerNorm.gamma"):gsub("LayerNorm%.bias$", "LayerNorm.beta"))] = v
    end
    local m = convert.model("bert_for_sequence_classification", sd, {nhead = 4})
    local ids, o = inputs(FIX, "cpu")
    assert_close(m(ids, o), FIX["out.seq_logits"], "logits from gamma/beta keys")
    local x = convert.models.get("bert_for_sequence_classification").input_example(m)
    assert.are.same({2, 3}, m(x).shape)
  end)

  it("scripts/convert_torch.lua --model bert writes what loads into BertModel", function()
    local dir = H.tmpdir()
    local src, dst = dir .. "/in.safetensors", dir .. "/out.safetensors"
    nd.save(weights(FIX, {"bert."}), src)
    local ok, text = H.runner("convert_torch")(("%s %s --model bert --nhead 4"):format(src, dst))
    assert(ok, text)
    local m = models.BertModel(BERT)
    m:load_state_dict((nd.load(dst)))
    m:eval()
    local ids, o = inputs(FIX, "cpu")
    assert_close((m(ids, o)), FIX["out.last_hidden_state"], "after convert_torch.lua")
    H.rmdir(dir)
  end)
end)

describe("BERT's feed-forward layer", function()
  local function small(kind)
    nd.manual_seed(9)
    if kind == "distil" then
      return nd.nn.models.DistilBertModel{vocab_size = 50, dim = 16, n_layers = 1, n_heads = 2, hidden_dim = 32,
                                          max_position_embeddings = 16}
    end
    return nd.nn.models.BertModel{vocab_size = 50, hidden_size = 16, num_hidden_layers = 1, num_attention_heads = 2,
                                  intermediate_size = 32, max_position_embeddings = 16}
  end
  local ids = nd.tensor({{2, 3, 4, 5}}, {dtype = "int64"})

  it("applies GELU in the linear kernel's epilogue (one fused op, no separate gelu)", function()
    for _, kind in ipairs({"bert", "distil"}) do
      local m = small(kind)
      m:eval()
      local report = nd.profile(function() return m(ids) end)
      assert.is_not_nil(report.by_name["F.fused_linear"], kind)
      assert.is_nil(report.by_name["gelu"], kind)
      assert.is_nil(report.by_name["F.gelu"], kind)
    end
  end)

  it("takes the plain path when the linear layer has a hook, and both give the same values", function()
    local m = small("bert")
    m:eval()
    local fused = nd.no_grad(function() return m(ids) end)
    local seen = 0
    local dense = m.encoder.layer[1] and m.encoder.layer[1].intermediate.dense or m.encoder.layer["0"].intermediate.dense
    local h = dense:register_forward_hook(function() seen = seen + 1 end)
    local plain = nd.no_grad(function() return m(ids) end)
    h:remove()
    assert.are.equal(1, seen)
    assert.is_true(nd.allclose(fused, plain, {rtol = 1e-5, atol = 1e-6}))
  end)
end)
