-- convert_spec.lua - needle.convert (lua/needle/convert/) and
-- scripts/convert_torch.lua.
--
-- Checked against PyTorch: every reference model and mapping fixture in
-- spec/fixtures/torch_ckpt/ (<name>.pt, torch.save of a state dict, and
-- <name>_io.safetensors with PyTorch's "input" and "output"; written by the
-- generator in spec/fixtures/gen/) is converted through the registry or the
-- mapping, run on the input (token ids + 1: needle's are 1-based) and matched
-- within 1e-4. Those cases need nd.load_torch and the fixtures and are pending
-- without them. The rest (mappings, the one-error mismatch report, dtype
-- conversion, a failed load changing nothing, the registry, the script end to
-- end on safetensors input) needs neither.
local nd = require "needle"
local convert = require "needle.convert"
local mappings = require "needle.convert.mappings"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local DIR = "spec/fixtures/torch_ckpt/"
local have_load_torch = type(nd.load_torch) == "function"
local run = H.runner("convert_torch")

-- the state dict in <name>.pt, or nil and why it cannot be read here
local function ckpt(name)
  if not S.exists(DIR .. name .. ".pt") then
    return nil, DIR .. name .. ".pt is missing (spec/fixtures/gen writes it)"
  end
  if not have_load_torch then return nil, "nd.load_torch is not in this build" end
  return (convert.unwrap(nd.load_torch(DIR .. name .. ".pt")))
end

local function io_of(name) return (nd.load(DIR .. name .. "_io.safetensors")) end

-- every element within 1e-4 (relative to the larger of 1 and |want|'s max)
local function assert_close(got, want, what, tol)
  tol = tol or 1e-4
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local scale = math.max(1, want:to("float64"):abs():max():item())
  local d = (got:to("float64") - want:to("float64")):abs():max():item()
  assert(d <= tol * scale, ("%s: max difference %.3g from PyTorch (tolerance %.3g)"):format(what, d, tol * scale))
end

local function ids(t) return (t:to("int64") + 1) end

local function copy_sd(sd)
  local out = {}
  for k, v in pairs(sd) do out[k] = v end
  return out
end

-- a and b hold the same values
local function same(a, b)
  return a:eq(b):to("int64"):sum():item() == a:numel() and a:numel() == b:numel()
end

local function snapshot(model)
  local out = {}
  for k, v in pairs(model:state_dict()) do out[k] = v:clone() end
  return out
end

local function assert_same_state(model, snap)
  for k, v in pairs(model:state_dict()) do
    assert(snap[k] ~= nil, k)
    assert.are.equal(v.dtype, snap[k].dtype, k)
    assert(same(v, snap[k]), k .. " changed")
  end
end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function has(s, sub) return s:find(sub, 1, true) ~= nil end

describe("needle.convert against PyTorch (spec/fixtures/torch_ckpt)", function()
  -- name, how to run the converted model on the fixture's input
  local models = {
    {"mlp", function(m, x) return m(x) end},
    {"resnet9", function(m, x) return m(x) end},
    {"resnet18_cifar", function(m, x) return m(x) end},
    {"lstm_lm", function(m, x) return (m(ids(x))) end},
    {"transformer_classifier", function(m, x) return m(ids(x)) end},
  }
  for _, case in ipairs(models) do
    local name, fwd = case[1], case[2]
    it(name .. ": built from the registry, output matches PyTorch's", function()
      local sd, why = ckpt(name)
      if not sd then pending(why); return end
      local io = io_of(name)
      local model = convert.model(name, sd)
      assert.is_false(model.training)
      assert_close(nd.no_grad(function() return fwd(model, io.input) end), io.output, name)
    end)
  end

  local mapped = {
    {"lstm_single_bias", "lstm_single_bias",
     function() return nd.nn.LSTM(6, 8) end,
     function(m, x) return (m(x)) end},
    {"attention_separate_qkv", "separate_qkv",
     function() return nd.nn.MultiheadAttention(16, 4, {batch_first = true}) end,
     function(m, x) return (m(x, x, x)) end},
    {"torch_encoder_as_needle_transformer", "torch_encoder_as_needle_transformer",
     function() return nd.nn.Transformer(16, 32, 2, {num_head = 2, batch_first = true, causal = true, sequence_len = 12}) end,
     function(m, x) return (m(x)) end},
  }
  for _, case in ipairs(mapped) do
    local fixture, mapping, build, fwd = case[1], case[2], case[3], case[4]
    it(("mapping %s (%s): output matches PyTorch's"):format(mapping, fixture), function()
      local sd, why = ckpt(fixture)
      if not sd then pending(why); return end
      local io = io_of(fixture)
      local model = build()
      convert.load_state_dict(model, sd, {mapping = mapping})
      model:eval()
      assert_close(nd.no_grad(function() return fwd(model, io.input) end), io.output, fixture)
      -- without the mapping the same checkpoint does not load, and says why
      local e = err_of(convert.load_state_dict, build(), sd)
      assert.truthy(has(e, "needle.convert:"), e)
    end)
  end

  it("a checkpoint saved with protocol 4 and one wrapped in a dict convert as well", function()
    for _, name in ipairs({"proto4", "nested"}) do
      if not (have_load_torch and S.exists(DIR .. name .. ".pt")) then pending(name .. ".pt or nd.load_torch missing"); return end
    end
    local sd = convert.unwrap(nd.load_torch(DIR .. "proto4.pt"))
    local model = convert.model("mlp", sd)
    assert.are.same({20, 32, 16, 5}, {model[1].weight:size(2), model[1].weight:size(1), model[3].weight:size(1),
                                      model[5].weight:size(1)})
    local nested, info = convert.unwrap(nd.load_torch(DIR .. "nested.pt"))
    assert.are.equal("model", info.wrapper)
    assert.truthy(next(nested))
  end)
end)

describe("needle.convert.load_state_dict", function()
  local function mlp_sd()
    nd.manual_seed(3)
    return nd.nn.MLP({4, 6, 3}):state_dict()
  end

  it("loads a matching state dict and returns the model and a report", function()
    local sd = mlp_sd()
    local m = nd.nn.MLP({4, 6, 3})
    local r1, report = convert.load_state_dict(m, sd)
    assert.are.equal(m, r1)
    assert.are.same({}, report.missing)
    assert.are.same({}, report.unexpected)
    assert(same(m[1].weight, sd["0.weight"]))
  end)

  it("reports missing, unexpected, shape and dtype problems together in one error", function()
    local sd = copy_sd(mlp_sd())
    sd["0.bias"] = nil
    sd["extra.weight"] = nd.zeros({2})
    sd["2.weight"] = nd.zeros({5, 6})
    sd["2.bias"] = nd.zeros({3}, {dtype = "int64"})
    local e = err_of(convert.load_state_dict, nd.nn.MLP({4, 6, 3}), sd)
    assert.truthy(e:find("^needle%.convert: cannot load the state dict into Sequential: "), e)
    assert.truthy(has(e, "shape mismatch: 2.weight (checkpoint {5,6}, model {3,6})"), e)
    assert.truthy(has(e, "dtype mismatch: 2.bias (checkpoint int64, model float32)"), e)
    assert.truthy(has(e, "missing keys: 0.bias"), e)
    assert.truthy(has(e, "unexpected keys: extra.weight"), e)
    assert.is_nil(e:find("\n"), "one line")
  end)

  it("strict = false allows missing and unexpected keys but not wrong shapes", function()
    local sd = copy_sd(mlp_sd())
    sd["0.bias"] = nil
    sd["extra"] = nd.zeros({1})
    local m = nd.nn.MLP({4, 6, 3})
    local _, report = convert.load_state_dict(m, sd, {strict = false})
    assert.are.same({"0.bias"}, report.missing)
    assert.are.same({"extra"}, report.unexpected)
    sd["0.weight"] = nd.zeros({1, 1})
    local e = err_of(convert.load_state_dict, m, sd, {strict = false})
    assert.truthy(has(e, "shape mismatch: 0.weight"), e)
  end)

  it("converts float64, float16 and bfloat16 tensors to the model's dtype", function()
    local sd = mlp_sd()
    for _, dt in ipairs({"float64", "float16", "bfloat16"}) do
      local src = {}
      for k, v in pairs(sd) do src[k] = v:to(dt) end
      local m = nd.nn.MLP({4, 6, 3})
      local _, report = convert.load_state_dict(m, src)
      assert.are.equal("float32", m[1].weight.dtype)
      assert.are.equal(dt, report.converted["0.weight"])
      assert(same(m[1].weight, src["0.weight"]:to("float32")), dt)
      assert.is_true(m[1].weight.requires_grad)
    end
    -- a float64 model takes float32 weights
    local m64 = nd.nn.ResNet9({dtype = "float64"})
    local sd9 = nd.nn.ResNet9():state_dict()
    convert.load_state_dict(m64, sd9)
    assert.are.equal("float64", m64.model[1].conv.weight.dtype)
    assert(same(m64.model[1].conv.weight, sd9["model.0.conv.weight"]:to("float64")))
    -- convert_dtype = false makes a difference an error
    local src = {}
    for k, v in pairs(sd) do src[k] = v:to("float64") end
    local e = err_of(convert.load_state_dict, nd.nn.MLP({4, 6, 3}), src, {convert_dtype = false})
    assert.truthy(has(e, "dtype mismatch: 0.bias (checkpoint float64, model float32)"), e)
  end)

  it("a float64 state dict gives the same outputs as the float32 one", function()
    nd.manual_seed(5)
    local ref = convert.models.ResNetCIFAR({width = 4, num_classes = 3})
    local sd64 = {}
    for k, v in pairs(ref:state_dict()) do sd64[k] = v.dtype == "float32" and v:to("float64") or v end
    local m = convert.model("resnet18_cifar", sd64)
    ref:eval()
    local x = nd.randn({2, 3, 16, 16})
    assert_close(m(x), ref(x), "float64 -> float32", 1e-6)
  end)

  it("a failed load leaves the model as it was", function()
    local m = nd.nn.MLP({4, 6, 3})
    local before = snapshot(m)
    local sd = copy_sd(mlp_sd())
    sd["2.bias"] = nd.zeros({7})
    err_of(convert.load_state_dict, m, sd)
    assert_same_state(m, before)
    -- a mapping that fails: nothing is copied either
    local e = err_of(convert.load_state_dict, m, mlp_sd(), {mapping = function() error("boom") end})
    assert.truthy(has(e, "needle.convert: mapping function failed: boom"), e)
    assert_same_state(m, before)
    -- and the caller's state dict is not changed by a mapping
    local lm = copy_sd(mlp_sd())
    lm["encoder.weight"] = nd.zeros({2, 2})
    mappings.lstm_lm(lm)
    assert.truthy(lm["encoder.weight"])
  end)

  it("BatchNorm's num_batches_tracked may be missing (PyTorch < 0.4.1 checkpoints); float into it is an error", function()
    local sd = copy_sd(nd.nn.ResNet9():state_dict())
    local n = 0
    for k in pairs(sd) do if k:match("num_batches_tracked$") then sd[k] = nil; n = n + 1 end end
    assert(n > 0)
    local m = nd.nn.ResNet9()
    local _, report = convert.load_state_dict(m, sd)
    assert.are.equal(n, #report.ignored)
    assert.are.same({}, report.missing)
    sd["model.0.bn.num_batches_tracked"] = nd.tensor(3.5)
    local e = err_of(convert.load_state_dict, m, sd)
    assert.truthy(has(e, "dtype mismatch: model.0.bn.num_batches_tracked (checkpoint float32, model int64)"), e)
  end)

  it("a model's own state dict loads, tied keys included (GPT-2's lm_head, BERT's masked-LM decoder)", function()
    nd.manual_seed(4)
    local G = nd.nn.models.GPT2LMHeadModel{vocab_size = 20, n_positions = 8, n_embd = 8, n_layer = 1, n_head = 2}
    local B = nd.nn.models.BertForMaskedLM{vocab_size = 30, hidden_size = 8, num_hidden_layers = 1,
                                           num_attention_heads = 2, intermediate_size = 16, max_position_embeddings = 16}
    local WTE = "transformer.wte.weight"
    for _, c in ipairs({{G, {["lm_head.weight"] = WTE}},
                        {B, {["cls.predictions.decoder.weight"] = "bert.embeddings.word_embeddings.weight",
                             ["cls.predictions.decoder.bias"] = "cls.predictions.bias"}}}) do
      local m, tied = c[1], c[2]
      for _, strict in ipairs({true, false}) do
        local _, report = convert.load_state_dict(m, m:state_dict(), {strict = strict})
        assert.are.same({}, report.unexpected)
        assert.are.same({}, report.missing)
        assert.are.same(tied, report.tied)
      end
    end
    -- the tied key stands for the tensor where the first name is absent
    local src = nd.nn.models.GPT2LMHeadModel{vocab_size = 20, n_positions = 8, n_embd = 8, n_layer = 1, n_head = 2}
    local sd = copy_sd(src:state_dict())
    sd[WTE] = nil
    convert.load_state_dict(G, sd)
    assert(same(G.transformer.wte.weight, src.transformer.wte.weight))
    -- a tied key of another shape or other values is an error, and nothing is loaded
    local before = G.transformer.wte.weight:clone()
    sd = copy_sd(src:state_dict())
    sd["lm_head.weight"] = sd[WTE] + 1
    for _, strict in ipairs({true, false}) do
      local e = err_of(convert.load_state_dict, G, sd, {strict = strict})
      assert.truthy(has(e, "cannot load the state dict into GPT2LMHeadModel: tied keys differ: lm_head.weight differs "
        .. "from transformer.wte.weight (tied: one tensor in the model)"), e)
    end
    sd["lm_head.weight"] = nd.zeros({21, 8})
    local e = err_of(convert.load_state_dict, G, sd)
    assert.truthy(has(e, "shape mismatch: lm_head.weight (checkpoint {21,8}, model {20,8})"), e)
    assert(same(G.transformer.wte.weight, before))
  end)

  it("rejects what is not a module or a state dict, and unknown mappings", function()
    assert.truthy(has(err_of(convert.load_state_dict, {}, {}), "needle.convert: load_state_dict: expected a needle.nn module"))
    assert.truthy(has(err_of(convert.load_state_dict, nd.nn.Linear(2, 2), nd.zeros({2})), "got a tensor"))
    local e = err_of(convert.load_state_dict, nd.nn.Linear(2, 2), {}, {mapping = "nope"})
    assert.truthy(has(e, "needle.convert: unknown mapping 'nope' (known: " .. table.concat(mappings.names(), ", ")), e)
    assert.truthy(has(e, "lstm_lm, lstm_single_bias"), e)
  end)

  it("lists at most 20 names per kind of problem", function()
    local sd = {}
    for i = 1, 30 do sd["x" .. i] = nd.zeros({1}) end
    local e = err_of(convert.load_state_dict, nd.nn.Linear(2, 2), sd)
    assert.truthy(has(e, "... (10 more)"), e)
  end)
end)

describe("needle.convert.unwrap", function()
  it("finds the state dict in the usual wrappers and drops DataParallel's prefix", function()
    local t = nd.zeros({2})
    local sd, info = convert.unwrap({state_dict = {["module.a.weight"] = t, ["module.b"] = t}, epoch = 3})
    assert.are.same({"a.weight", "b"}, mappings.sorted_keys(sd))
    assert.are.equal("state_dict", info.wrapper)
    assert.are.equal("module.", info.prefix)
    sd, info = convert.unwrap({model = {w = t, step = 7}, lr = 0.1})
    assert.are.same({"w"}, mappings.sorted_keys(sd))
    assert.are.same({"step"}, info.dropped)
    sd, info = convert.unwrap({["module.x"] = t, y = t})
    assert.are.same({"module.x", "y"}, mappings.sorted_keys(sd))
    assert.is_nil(info.prefix)
    local e = err_of(convert.unwrap, {epoch = 3, name = "x"})
    assert.truthy(has(e, "needle.convert: found no tensors in the checkpoint (top-level keys: epoch, name)"), e)
  end)
end)

describe("needle.convert.mappings", function()
  local z = function(...) return nd.zeros({...}) end

  it("lstm_lm renames encoder.* to embedding.* and keeps the rest", function()
    local sd = mappings.lstm_lm({["encoder.weight"] = z(5, 3), ["rnn.weight_ih_l0"] = z(8, 3), ["decoder.bias"] = z(5)})
    assert.are.same({"decoder.bias", "embedding.weight", "rnn.weight_ih_l0"}, mappings.sorted_keys(sd))
  end)

  it("lstm_single_bias splits every layer's bias (and reverse directions) into b_ih and zero b_hh", function()
    local b0, b1 = nd.randn({16}), nd.randn({16})
    local sd = mappings.lstm_single_bias({["rnn.weight_ih_l0"] = z(16, 3), ["rnn.bias_l0"] = b0, ["rnn.bias_l1"] = b1,
                                          ["rnn.bias_l0_reverse"] = b1})
    assert.are.same({"rnn.bias_hh_l0", "rnn.bias_hh_l0_reverse", "rnn.bias_hh_l1", "rnn.bias_ih_l0",
                     "rnn.bias_ih_l0_reverse", "rnn.bias_ih_l1", "rnn.weight_ih_l0"}, mappings.sorted_keys(sd))
    assert(same(sd["rnn.bias_ih_l1"], b1))
    assert.are.equal(0, sd["rnn.bias_hh_l1"]:abs():sum():item())
    -- a two-layer LSTM loads it and computes with b_ih + b_hh = the single bias
    nd.manual_seed(2)
    local ref = nd.nn.LSTM(3, 4, {num_layers = 2})
    local single = {}
    for k, v in pairs(ref:state_dict()) do
      local kind, l = k:match("^bias_(%a+)_l(%d)$")
      if kind == "ih" then single["bias_l" .. l] = v + ref:state_dict()["bias_hh_l" .. l]
      elseif not kind then single[k] = v end
    end
    local m = nd.nn.LSTM(3, 4, {num_layers = 2})
    convert.load_state_dict(m, single, {mapping = "lstm_single_bias"})
    local x = nd.randn({5, 2, 3})
    assert_close(m(x), ref(x), "lstm_single_bias 2 layers", 1e-6)
    local e = err_of(mappings.lstm_single_bias, {bias_l0 = z(4), bias_ih_l0 = z(4)})
    assert.truthy(has(e, "'bias_l0' and 'bias_ih_l0' are both in the state dict"), e)
  end)

  it("separate_qkv stacks q, k, v in that order under any prefix, zero bias where one is absent", function()
    local q, k, v = nd.full({4, 4}, 1), nd.full({4, 4}, 2), nd.full({4, 4}, 3)
    local sd = mappings.separate_qkv({["blk.attn.q_proj.weight"] = q, ["blk.attn.k_proj.weight"] = k,
      ["blk.attn.v_proj.weight"] = v, ["blk.attn.q_proj.bias"] = nd.full({4}, 1), ["blk.attn.v_proj.bias"] = nd.full({4}, 3),
      ["blk.attn.out_proj.weight"] = z(4, 4)})
    assert.are.same({"blk.attn.in_proj_bias", "blk.attn.in_proj_weight", "blk.attn.out_proj.weight"}, mappings.sorted_keys(sd))
    assert.are.same({12, 4}, sd["blk.attn.in_proj_weight"].shape)
    assert.are.same({1, 2, 3}, {sd["blk.attn.in_proj_weight"][1][1]:item(), sd["blk.attn.in_proj_weight"][5][1]:item(),
                                sd["blk.attn.in_proj_weight"][9][1]:item()})
    assert.are.same({1, 0, 3}, {sd["blk.attn.in_proj_bias"][1]:item(), sd["blk.attn.in_proj_bias"][5]:item(),
                                sd["blk.attn.in_proj_bias"][9]:item()})
    local e = err_of(mappings.separate_qkv, {["q_proj.weight"] = q, ["k_proj.weight"] = k})
    assert.truthy(has(e, "key 'v_proj.weight' is not in the state dict"), e)
  end)

  it("torch_encoder_as_needle_transformer moves encoder.layers.N to layers.N", function()
    local sd = mappings.torch_encoder_as_needle_transformer({["pos_embedding.weight"] = z(2, 2),
      ["encoder.layers.0.linear1.weight"] = z(2, 2), ["encoder.layers.1.norm1.bias"] = z(2)})
    assert.are.same({"layers.0.linear1.weight", "layers.1.norm1.bias", "pos_embedding.weight"}, mappings.sorted_keys(sd))
  end)

  it("helpers: rename_prefix, strip_prefix, rename, cat, split, compose", function()
    local a, b = nd.tensor({{1, 2}}), nd.tensor({{3, 4}})
    local m = mappings.compose(mappings.strip_prefix("module."), mappings.rename_prefix("net.", "body."),
                               mappings.cat({"body.a", "body.b"}, "body.ab", 1))
    local sd = m({["module.net.a"] = a, ["module.net.b"] = b, ["module.head"] = a})
    assert.are.same({"body.ab", "head"}, mappings.sorted_keys(sd))
    assert.are.same({{1, 2}, {3, 4}}, sd["body.ab"]:totable())
    local back = mappings.split("body.ab", {"x", "y"}, 1)(sd)
    assert.are.same({{3, 4}}, back.y:totable())
    local cols = mappings.split("body.ab", {"p", "q"}, 2, {1, 1})(sd)
    assert.are.same({{2}, {4}}, cols.q:totable())
    local dropped = mappings.rename(function(k) if k ~= "head" then return k end end)(sd)
    assert.are.same({"body.ab"}, mappings.sorted_keys(dropped))
    local e = err_of(mappings.rename(function() return "same" end), {a = a, b = b})
    assert.truthy(has(e, "needle.convert: mapping renames both 'a' and 'b' to 'same'"), e)
    e = err_of(mappings.split("body.ab", {"x", "y", "z"}, 1), sd)
    assert.truthy(has(e, "not divisible into 3 parts"), e)
    e = err_of(mappings.cat({"x", "y"}, "xy", 2), {x = nd.zeros({2, 2}), y = nd.zeros({3, 2})})
    assert.truthy(has(e, "cat: cannot join x {2,2}, y {3,2} along dim 2"), e)
    assert.are.equal(mappings.lstm_lm, mappings.get("lstm_lm"))
    assert.is_nil(mappings.get(nil))
  end)
end)

describe("needle.convert.models (the registry)", function()
  it("lists the models and rejects unknown names", function()
    -- (sorted; the model files of needle.zoo register theirs too)
    local names = convert.models.names()
    local sorted = {table.unpack(names)}
    table.sort(sorted)
    assert.are.same(sorted, names)
    local listed = " " .. table.concat(names, " ") .. " "
    for _, n in ipairs({"lstm_lm", "mlp", "resnet18_cifar", "resnet9", "transformer_classifier"}) do
      assert.truthy(listed:find(" " .. n .. " ", 1, true), n)
    end
    local e = err_of(convert.model, "vgg", {})
    assert.truthy(has(e, "needle.convert: unknown model 'vgg' (known: " .. table.concat(names, ", ") .. ")"), e)
  end)

  it("infers sizes from the weights", function()
    nd.manual_seed(1)
    local sd = nd.nn.MLP({7, 5, 4, 2}):state_dict()
    local m = convert.model("mlp", sd)
    assert.are.same({2, 7}, {m[5].weight:size(1), m[1].weight:size(2)})
    local r = convert.model("resnet18_cifar", convert.models.ResNetCIFAR({width = 4, num_classes = 7}):state_dict())
    assert.are.same({4, 7, {2, 2, 2, 2}}, {r.width, r.num_classes, r.layers})
    local r34 = convert.models.ResNetCIFAR({width = 2, layers = {3, 4, 6, 3}})
    assert.are.same({3, 4, 6, 3}, convert.model("resnet18_cifar", r34:state_dict()).layers)
    local lm = nd.nn.LanguageModel(11, {embedding_size = 5, hidden_size = 6, num_layers = 3})
    local torch_sd = {}
    for k, v in pairs(lm:state_dict()) do torch_sd[(k:gsub("^embedding%.", "encoder."))] = v end
    local got = convert.model("lstm_lm", torch_sd)
    assert.are.same({11, 3, 6}, {got.vocab, got.rnn.num_layers, got.rnn.hidden_size})
    local ids = nd.randint(1, 11, {4, 2})
    lm:eval()
    assert_close(got(ids), lm(ids), "lstm_lm", 1e-6)
  end)

  it("transformer_classifier takes nhead from the options (default 4)", function()
    nd.manual_seed(4)
    local ref = convert.models.TransformerClassifier(13, 8, 2, {dim_feedforward = 12, num_layers = 2, max_len = 6,
                                                                 num_classes = 3})
    ref:eval()
    local x = nd.randint(1, 13, {2, 5})
    local m = convert.model("transformer_classifier", ref:state_dict(), {nhead = 2})
    assert.are.same({2, 2, 6, 3}, {m.nhead, m.encoder.num_layers, m.max_len, m.num_classes})
    assert_close(m(x), ref(x), "transformer_classifier", 1e-6)
    assert.are.equal(4, convert.model("transformer_classifier", ref:state_dict()).nhead)
    local e = err_of(convert.model, "transformer_classifier", ref:state_dict(), {nhead = 3})
    assert.truthy(has(e, "needle.convert: cannot build 'transformer_classifier' from this state dict: nhead must be a positive integer dividing d_model 8, got 3"), e)
  end)

  it("a build that cannot work out the sizes says what it needs", function()
    local e = err_of(convert.model, "lstm_lm", {["decoder.weight"] = nd.zeros({2, 2})})
    assert.truthy(has(e, "needle.convert: cannot build 'lstm_lm' from this state dict: the state dict has no 'embedding.weight'"), e)
    e = err_of(convert.model, "mlp", {["0.weight"] = nd.zeros({3, 2}), ["2.weight"] = nd.zeros({2, 4})})
    assert.truthy(has(e, "'2.weight' {2,4} takes 4 inputs but the layer before gives 3"), e)
  end)

  it("resnet18_cifar's fuse hook: nd.nn.fuse gives the same outputs", function()
    if not S.exists("lua/needle/nn/fuse.lua") then pending("lua/needle/nn/fuse.lua is not there yet"); return end
    nd.manual_seed(6)
    local m = convert.models.ResNetCIFAR({width = 4, num_classes = 5})
    nd.no_grad(function()
      for _, mod in ipairs(m:modules()) do
        if mod.__name == "BatchNorm2d" then
          mod.running_mean:copy_(nd.rand({mod.num_features}) - 0.5)
          mod.running_var:copy_(nd.rand({mod.num_features}) + 0.5)
          mod.weight:copy_(nd.rand({mod.num_features}) + 0.5)
          mod.bias:copy_(nd.rand({mod.num_features}) - 0.5)
        end
      end
    end)
    m:eval()
    local fused = nd.nn.fuse(m)
    assert.are.equal("FusedResNetCIFAR", fused.__name)
    assert.are.equal("FusedBasicBlock", fused.layer2[1].__name)
    local x = nd.randn({2, 3, 32, 32})
    assert_close(fused(x), m(x), "fused resnet18_cifar", 1e-5)
  end)
end)

describe("scripts/convert_torch.lua", function()
  local tmp
  before_each(function() tmp = H.tmpdir() end)
  after_each(function() H.rmdir(tmp) end)

  it("--help, --list and bad command lines", function()
    local ok, text = run("--help")
    assert(ok, text)
    assert.truthy(has(text, "usage: needle-lua scripts/convert_torch.lua IN OUT --model NAME"), text)
    ok, text = run("--list")
    assert(ok, text)
    for _, n in ipairs({"mlp", "resnet9", "resnet18_cifar", "lstm_lm", "transformer_classifier", "separate_qkv",
                        "lstm_single_bias", "torch_encoder_as_needle_transformer"}) do
      assert.truthy(has(text, "  " .. n), n)
    end
    local code
    ok, text, code = run("a.pt b.safetensors --model vgg")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.are.equal("convert_torch: unknown model 'vgg' (known: " .. table.concat(convert.models.names(), ", ")
      .. "; --list describes them)\n", text)
    ok, text, code = run("a.pt b.safetensors --model mlp --mapping nope")
    assert.are.equal(2, code)
    assert.truthy(has(text, "unknown mapping 'nope'"), text)
    ok, text, code = run("a.pt --model mlp")
    assert.are.equal(2, code)
    assert.truthy(has(text, "expected an input and an output file, got 1 argument"), text)
    ok, text, code = run("a.pt b.st --model mlp --dtype int8")
    assert.are.equal(2, code)
    assert.truthy(has(text, "option --dtype expects 'float32', 'float64', 'float16' or 'bfloat16', got 'int8'"), text)
    -- --nhead where the model has no attention heads: a bad command line, not an internal error
    ok, text, code = run("a.pt b.st --model resnet18 --nhead 2")
    assert.are.equal(2, code)
    assert.truthy(text:find("^convert_torch: option %-%-nhead does not apply to the model 'resnet18' %(it has no "
      .. "attention heads; %-%-nhead applies to: [^\n]*transformer_classifier[^\n]*%)\n$"), text)
    ok, text, code = run("a.pt b.st --model mlp --frobnicate 1")
    assert.are.equal(2, code)
    assert.truthy(has(text, "unknown option '--frobnicate'"), text)
    ok, text, code = run(S.q(tmp .. "/missing.pt") .. " " .. S.q(tmp .. "/o.safetensors") .. " --model mlp")
    assert.are.equal(1, code)
    assert.truthy(text:find("^convert_torch: cannot open '.-missing.pt'"), text)
  end)

  it("converts a safetensors state dict end to end (wrapped keys, float64), and the result loads back", function()
    nd.manual_seed(8)
    local ref = convert.models.ResNetCIFAR({width = 4, num_classes = 6})
    local sd = {}
    for k, v in pairs(ref:state_dict()) do sd["module." .. k] = v.dtype == "float32" and v:to("float64") or v end
    local input, out = tmp .. "/r18.safetensors", tmp .. "/out.safetensors"
    nd.save(sd, input)
    local ok, text = run(S.q(input) .. " " .. S.q(out) .. " --model resnet18_cifar")
    assert(ok, text)
    assert.truthy(has(text, "ResNetCIFAR(width=4, num_classes=6, layers={2,2,2,2})"), text)
    assert.truthy(has(text, "float64 102, int64 20"), text)
    assert.truthy(has(text, "saved: 122 tensors, "), text)
    assert.truthy(has(text, "(float32 102, int64 20)"), text)
    assert.truthy(has(text, "removed the prefix 'module.'"), text)
    local saved, meta = nd.load(out)
    assert.are.equal("resnet18_cifar", meta.model)
    assert.are.equal(input, meta.source)
    assert.are.equal(tostring(nd.version), meta.needle_version)
    assert.are.equal("float32", saved["conv1.weight"].dtype)
    local m = convert.models.ResNetCIFAR({width = 4, num_classes = 6})
    m:load_state_dict(saved)
    m:eval(); ref:eval()
    local x = nd.randn({1, 3, 32, 32})
    assert_close(m(x), ref(x), "round trip", 1e-6)
    -- --dtype float16 saves half-precision floats
    ok, text = run(S.q(input) .. " " .. S.q(out) .. " --model resnet18_cifar --dtype float16")
    assert(ok, text)
    assert.are.equal("float16", nd.load(out)["fc.weight"].dtype)
  end)

  it("a float16 checkpoint converts to float32 (with and without --half-to-float)", function()
    nd.manual_seed(9)
    local ref = nd.nn.MLP({5, 4, 3})
    local half = {}
    for k, v in pairs(ref:state_dict()) do half[k] = v:to("float16") end
    local input, out = tmp .. "/half.safetensors", tmp .. "/out.safetensors"
    nd.save(half, input)
    for _, flag in ipairs({"", " --half-to-float"}) do
      local ok, text = run(S.q(input) .. " " .. S.q(out) .. " --model mlp" .. flag)
      assert(ok, text)
      assert.truthy(has(text, "(float32 4)"), text)
      local saved = nd.load(out)
      assert.are.equal("float32", saved["0.weight"].dtype)
      assert(same(saved["0.weight"], half["0.weight"]:to("float32")))
    end
  end)

  it("a failed conversion is one line, exit status 1, and writes nothing", function()
    local input, out = tmp .. "/mlp.safetensors", tmp .. "/out.safetensors"
    local sd = nd.nn.MLP({4, 3}):state_dict()
    sd["0.weight"] = nd.zeros({3, 5})
    sd["stray"] = nd.zeros({1})
    nd.save(sd, input)
    local ok, text, code = run(S.q(input) .. " " .. S.q(out) .. " --model resnet9")
    assert.is_false(ok)
    assert.are.equal(1, code)
    assert.truthy(text:find("^convert_torch: needle.convert: cannot build 'resnet9' from this state dict: "
      .. "the state dict has no 'model.9.weight'\n$"), text)
    assert.is_false(S.exists(out))
    nd.save({["0.weight"] = nd.zeros({3, 4}), ["0.bias"] = nd.zeros({3}), stray = nd.zeros({1})}, input)
    ok, text, code = run(S.q(input) .. " " .. S.q(out) .. " --model mlp")
    assert.are.equal(1, code)
    assert.truthy(has(text, "unexpected keys: stray"), text)
    local _, lines = text:gsub("\n", "")
    assert.are.equal(1, lines)
    assert.is_false(S.exists(out))
    -- --strict false converts and warns
    ok, text = run(S.q(input) .. " " .. S.q(out) .. " --model mlp --strict false")
    assert(ok, text)
    assert.truthy(has(text, "warning: 1 unexpected keys ignored: stray"), text)
    assert.truthy(S.exists(out))
  end)

  it("converts the PyTorch fixtures (.pt) and the output matches PyTorch's", function()
    if not (have_load_torch and S.exists(DIR .. "resnet18_cifar.pt")) then
      pending("needs nd.load_torch and spec/fixtures/torch_ckpt/resnet18_cifar.pt"); return
    end
    for _, name in ipairs({"mlp", "resnet18_cifar", "lstm_lm", "transformer_classifier"}) do
      local out = tmp .. "/" .. name .. ".safetensors"
      local ok, text = run(S.q(DIR .. name .. ".pt") .. " " .. S.q(out) .. " --model " .. name)
      assert(ok, text)
      assert.truthy(has(text, "saved: "), text)
      local saved = nd.load(out)
      local e = convert.models.get(name)
      local model = e.build(saved, {})
      model:load_state_dict(saved)
      model:eval()
      local io = io_of(name)
      local x = io.input
      if x.dtype == "int64" then x = ids(x) end
      local y = model(x)
      assert_close(y, io.output, name .. " via convert_torch.lua")
    end
  end)
end)
