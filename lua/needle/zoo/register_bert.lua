-- needle.zoo.register_bert: BERT and DistilBERT in needle.convert's model
-- registry, with the mappings from Hugging Face checkpoints' keys. Loaded at
-- the end of needle.convert.models as require("needle.zoo.register_bert").register(M)
-- (a function of the registry: that module is still loading then).
--
--   convert.model("bert", sd, {num_attention_heads = 12})
--   build/needle-lua scripts/convert_torch.lua pytorch_model.bin bert.safetensors --model bert --nhead 12
--
-- Sizes come from the weights' shapes; the number of attention heads does not
-- show in them: num_attention_heads / n_heads (or the script's nhead) give it,
-- else it is hidden_size / 64 (every Google BERT and distilbert-base has heads
-- of 64). hidden_act/activation, layer_norm_eps and pad_token_id (1-based) are
-- options with Hugging Face's defaults.
local errors = require "needle.errors"
local nd = require "needle"
local mappings = require "needle.convert.mappings"
local bert = require "needle.zoo.bert"

local fail = errors.failer("convert", 0)
local shape_str = errors.shape_str

local SD = require "needle.convert.state_dict"
local need, count_indexed = SD.need, SD.count_indexed

local function starts(k, p) return k:sub(1, #p) == p end

-- a mapping from a Hugging Face checkpoint: TF-era LayerNorm.gamma/beta ->
-- weight/bias, `strip` removed from the keys that start with it, keys
-- starting with one of `drop` left out (heads the model does not have), the
-- position_ids/token_type_ids buffers left out; then `after(sd)`
local function hf_mapping(strip, drop, prefix, after)
  return function(sd)
    local out = {}
    for k, v in pairs(sd) do
      k = tostring(k):gsub("LayerNorm%.gamma$", "LayerNorm.weight"):gsub("LayerNorm%.beta$", "LayerNorm.bias")
      if strip and starts(k, strip) then k = k:sub(#strip + 1) end
      local keep = true
      for _, p in ipairs(drop) do if starts(k, p) then keep = false end end
      if keep then
        if out[k] ~= nil then fail("the state dict has '%s' twice (with and without a prefix)", k) end
        out[k] = v
      end
    end
    out = bert.without_buffers(out, prefix)
    return after and after(out) or out
  end
end

local MAPPINGS = {
  {"hf_bert", "Hugging Face BERT (BertModel, or bert.* of any BERT checkpoint) -> nd.nn.models.BertModel: "
     .. "the bert. prefix removed, heads (cls.*, classifier.*, qa_outputs.*) and position_ids buffers left out, LayerNorm.gamma/beta "
     .. "-> weight/bias", hf_mapping("bert.", {"cls.", "classifier.", "qa_outputs."}, "")},
  {"hf_bert_for_sequence_classification", "Hugging Face BertForSequenceClassification -> "
     .. "nd.nn.models.BertForSequenceClassification: buffers left out, LayerNorm.gamma/beta -> weight/bias",
   hf_mapping(nil, {}, "bert.")},
  {"hf_bert_for_masked_lm", "Hugging Face BertForMaskedLM (or BertForPreTraining: its pooler and "
     .. "cls.seq_relationship left out) -> nd.nn.models.BertForMaskedLM: the decoder's tied keys folded into "
     .. "the word embeddings and cls.predictions.bias", hf_mapping(nil, {"cls.seq_relationship.", "bert.pooler."}, "bert.",
     bert.untie_mlm)},
  {"hf_distilbert", "Hugging Face DistilBERT (DistilBertModel, or distilbert.* of any checkpoint) -> "
     .. "nd.nn.models.DistilBertModel: the distilbert. prefix removed, heads left out",
   hf_mapping("distilbert.", {"vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.",
                              "classifier.", "qa_outputs."}, "")},
  {"hf_distilbert_for_sequence_classification", "Hugging Face DistilBertForSequenceClassification -> "
     .. "nd.nn.models.DistilBertForSequenceClassification: buffers left out", hf_mapping(nil, {}, "distilbert.")},
  {"hf_bert_for_token_classification", "Hugging Face BertForTokenClassification -> "
     .. "nd.nn.models.BertForTokenClassification: a pooler (unused by the head) and buffers left out, "
     .. "LayerNorm.gamma/beta -> weight/bias", hf_mapping(nil, {"bert.pooler."}, "bert.")},
  {"hf_bert_for_question_answering", "Hugging Face BertForQuestionAnswering -> "
     .. "nd.nn.models.BertForQuestionAnswering: a pooler (unused by the head) and buffers left out, "
     .. "LayerNorm.gamma/beta -> weight/bias", hf_mapping(nil, {"bert.pooler."}, "bert.")},
  {"hf_distilbert_for_token_classification", "Hugging Face DistilBertForTokenClassification -> "
     .. "nd.nn.models.DistilBertForTokenClassification: buffers left out", hf_mapping(nil, {}, "distilbert.")},
  {"hf_distilbert_for_question_answering", "Hugging Face DistilBertForQuestionAnswering -> "
     .. "nd.nn.models.DistilBertForQuestionAnswering: buffers left out", hf_mapping(nil, {}, "distilbert.")},
}

-- heads: the option, the script's nhead, or width / 64
local function heads_of(name, opts, key, width)
  local h = opts[key] or opts.nhead
  if h == nil then
    if width % 64 ~= 0 then
      fail("%s: the weights do not tell the number of attention heads and the width %d is not a multiple of 64 "
           .. "(heads of 64, the default); give %s", name, width, key)
    end
    h = width // 64
  end
  if h < 1 or width % h ~= 0 then fail("%s: %s must divide the width %d, got %d", name, key, width, h) end
  return h
end

-- BertModel's config from the weights under `p` ("" or "bert.")
local function bert_config(sd, opts, p, name)
  local word = need(sd, p .. "embeddings.word_embeddings.weight", 2, name)
  local H = word:size(2)
  local layers = count_indexed(sd, p .. "encoder.layer.%d.attention.self.query.weight")
  if layers == 0 then fail("%s: no encoder layers ('%sencoder.layer.0.attention.self.query.weight')", name, p) end
  return {
    vocab_size = word:size(1), hidden_size = H, num_hidden_layers = layers,
    num_attention_heads = heads_of(name, opts, "num_attention_heads", H),
    intermediate_size = need(sd, p .. "encoder.layer.0.intermediate.dense.weight", 2, name):size(1),
    max_position_embeddings = need(sd, p .. "embeddings.position_embeddings.weight", 2, name):size(1),
    type_vocab_size = need(sd, p .. "embeddings.token_type_embeddings.weight", 2, name):size(1),
    hidden_act = opts.hidden_act, layer_norm_eps = opts.layer_norm_eps, pad_token_id = opts.pad_token_id,
  }
end

local function distil_config(sd, opts, p, name)
  local word = need(sd, p .. "embeddings.word_embeddings.weight", 2, name)
  local D = word:size(2)
  local layers = count_indexed(sd, p .. "transformer.layer.%d.attention.q_lin.weight")
  if layers == 0 then fail("%s: no transformer layers ('%stransformer.layer.0.attention.q_lin.weight')", name, p) end
  return {
    vocab_size = word:size(1), dim = D, n_layers = layers, n_heads = heads_of(name, opts, "n_heads", D),
    hidden_dim = need(sd, p .. "transformer.layer.0.ffn.lin1.weight", 2, name):size(1),
    max_position_embeddings = need(sd, p .. "embeddings.position_embeddings.weight", 2, name):size(1),
    activation = opts.activation, pad_token_id = opts.pad_token_id,
  }
end

local function num_labels(sd, key, name) return need(sd, key, 2, name):size(1) end

-- random 1-based token ids for a smoke test
local function example(model)
  local c = model.config
  return nd.randint(1, c.vocab_size, {2, math.min(8, c.max_position_embeddings)}, {dtype = "int64"})
end

local BERT_OPTS = {num_attention_heads = "integer", nhead = "integer", hidden_act = "string",
                   layer_norm_eps = "number", pad_token_id = "integer"}
local DISTIL_OPTS = {n_heads = "integer", nhead = "integer", activation = "string", pad_token_id = "integer"}

local M = {}

function M.register(models)
  for _, m in ipairs(MAPPINGS) do mappings.register(m[1], m[2], m[3]) end

  models.register("bert", {
    mapping = "hf_bert", options = BERT_OPTS, input_example = example,
    description = "Hugging Face BertModel -> nd.nn.models.BertModel (sizes from the weights; pooler if present); "
               .. "token ids 1-based",
    build = function(sd, opts)
      local cfg = bert_config(sd, opts or {}, "", "bert")
      cfg.add_pooling_layer = sd["pooler.dense.weight"] ~= nil
      return bert.BertModel(cfg)
    end,
  })
  models.register("distilbert", {
    mapping = "hf_distilbert", options = DISTIL_OPTS, input_example = example,
    description = "Hugging Face DistilBertModel -> nd.nn.models.DistilBertModel (sizes from the weights)",
    build = function(sd, opts) return bert.DistilBertModel(distil_config(sd, opts or {}, "", "distilbert")) end,
  })
  -- the heads: the encoder's config from the weights under its prefix, num_labels
  -- from the head's weight (where it has labels)
  local HEADS = {
    {"bert_for_sequence_classification", "BertForSequenceClassification", bert_config, "bert.", "classifier.weight",
     "Hugging Face BertForSequenceClassification -> nd.nn.models.BertForSequenceClassification "
       .. "(num_labels from classifier.weight)", BERT_OPTS},
    {"bert_for_masked_lm", "BertForMaskedLM", bert_config, "bert.", nil,
     "Hugging Face BertForMaskedLM or BertForPreTraining -> nd.nn.models.BertForMaskedLM "
       .. "(decoder tied to the word embeddings)", BERT_OPTS},
    {"bert_for_token_classification", "BertForTokenClassification", bert_config, "bert.", "classifier.weight",
     "Hugging Face BertForTokenClassification -> nd.nn.models.BertForTokenClassification "
       .. "(num_labels from classifier.weight)", BERT_OPTS},
    {"bert_for_question_answering", "BertForQuestionAnswering", bert_config, "bert.", "qa_outputs.weight",
     "Hugging Face BertForQuestionAnswering -> nd.nn.models.BertForQuestionAnswering (start and end logits)",
     BERT_OPTS},
    {"distilbert_for_sequence_classification", "DistilBertForSequenceClassification", distil_config, "distilbert.",
     "classifier.weight", "Hugging Face DistilBertForSequenceClassification -> "
       .. "nd.nn.models.DistilBertForSequenceClassification (num_labels from classifier.weight)", DISTIL_OPTS},
    {"distilbert_for_token_classification", "DistilBertForTokenClassification", distil_config, "distilbert.",
     "classifier.weight", "Hugging Face DistilBertForTokenClassification -> "
       .. "nd.nn.models.DistilBertForTokenClassification (num_labels from classifier.weight)", DISTIL_OPTS},
    {"distilbert_for_question_answering", "DistilBertForQuestionAnswering", distil_config, "distilbert.",
     "qa_outputs.weight", "Hugging Face DistilBertForQuestionAnswering -> "
       .. "nd.nn.models.DistilBertForQuestionAnswering (start and end logits)", DISTIL_OPTS},
  }
  for _, h in ipairs(HEADS) do
    local name, class, config_of, prefix, labels_key = h[1], h[2], h[3], h[4], h[5]
    models.register(name, {
      mapping = "hf_" .. name, options = h[7], input_example = example, description = h[6],
      build = function(sd, opts)
        local cfg = config_of(sd, opts or {}, prefix, name)
        if labels_key then cfg.num_labels = num_labels(sd, labels_key, name) end
        return bert[class](cfg)
      end,
    })
  end
end

return M
