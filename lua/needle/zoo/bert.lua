-- needle.zoo.bert: BERT and DistilBERT as Hugging Face's transformers builds
-- them (modeling_bert.py, modeling_distilbert.py), so that a Hugging Face
-- state_dict loads by name (nd.nn.models exposes the nine models):
--
--   local m = nd.nn.models.BertModel{vocab_size = 30522, hidden_size = 768, ...}
--   local last_hidden_state, pooler_output = m(input_ids, {attention_mask =, token_type_ids =, position_ids =})
--   BertForSequenceClassification{..., num_labels = 2, classifier_dropout =}  -> logits (B, num_labels)
--   BertForMaskedLM{...}                                -> logits (B, T, vocab_size)
--   DistilBertModel{vocab_size =, dim =, n_layers =, n_heads =, hidden_dim =, ...}
--       forward(input_ids, {attention_mask =}) -> last_hidden_state (B, T, dim)
--   DistilBertForSequenceClassification{..., num_labels = 2, seq_classif_dropout = 0.2} -> logits
--   BertForTokenClassification{..., num_labels = 2, classifier_dropout =} -> logits (B, T, num_labels)
--   BertForQuestionAnswering{...}                       -> start_logits (B, T), end_logits (B, T)
--   DistilBertForTokenClassification{..., num_labels = 2} -> logits (B, T, num_labels)
--   DistilBertForQuestionAnswering{..., qa_dropout = 0.1} -> start_logits (B, T), end_logits (B, T)
--
-- TOKEN IDS ARE 1-BASED, as every index in needle (nn.Embedding's, class
-- labels): the token on line n of a vocab.txt is id n, i.e. a Hugging Face id
-- i is i + 1 here ([PAD] 0 -> 1, [CLS] 101 -> 102). So are token types (1 =
-- the first segment, 2 = the second: Hugging Face's 0 and 1), position ids
-- (1..max_position_embeddings) and pad_token_id (default 1, Hugging Face's 0).
-- The weights are Hugging Face's unchanged: row n of word_embeddings.weight is
-- id n. An id out of range is an error that says so, never a wrong row.
-- attention_mask is Hugging Face's: 1 (or true) attends, 0 is padding.
--
-- The constructors take the fields of Hugging Face's BertConfig /
-- DistilBertConfig (their defaults: BERT-base and distilbert-base), plus
-- PyTorch's factory keywords dtype and device. Dropout follows train()/eval().
local errors = require "needle.errors"
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local util = require "needle.nn.util"
local options = require "needle.options"
local compile_state = require "needle.compile.state"

local M = {}

local shape_str = errors.shape_str
local fail = errors.fail -- (who, fmt, ...): "needle.<who>: ..." at the user's line

-- Hugging Face's ACT2FN names (hidden_act, activation); "gelu" is the exact erf form
local ACT = {
  gelu = function(x) return nd.F.gelu(x) end,
  gelu_new = function(x) return nd.F.gelu(x, {approximate = "tanh"}) end,
  gelu_pytorch_tanh = function(x) return nd.F.gelu(x, {approximate = "tanh"}) end,
  relu = function(x) return nd.F.relu(x) end,
  silu = function(x) return nd.F.silu(x) end,
  swish = function(x) return nd.F.silu(x) end,
  tanh = function(x) return x:tanh() end,
}
local ACT_NAMES = "gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish, tanh"
-- act(linear(x)) through lin, in one kernel where it can (nn/linear.lua)
local linear_act = require("needle.nn.linear").linear_act

-- torch.finfo(dtype).min: Hugging Face's "minus infinity" for masked scores
-- (finite, so that a row with every key masked is uniform, not NaN)
local FMIN = {float32 = -3.4028234663852886e38, float64 = -1.7976931348623157e308, float16 = -65504.0,
              bfloat16 = -3.3895313892515355e38}

-- configuration ---------------------------------------------------------------

M.BERT_DEFAULTS = {vocab_size = 30522, hidden_size = 768, num_hidden_layers = 12, num_attention_heads = 12,
                   intermediate_size = 3072, hidden_act = "gelu", hidden_dropout_prob = 0.1,
                   attention_probs_dropout_prob = 0.1, max_position_embeddings = 512, type_vocab_size = 2,
                   layer_norm_eps = 1e-12, pad_token_id = 1, initializer_range = 0.02}
M.DISTILBERT_DEFAULTS = {vocab_size = 30522, max_position_embeddings = 512, n_layers = 6, n_heads = 12, dim = 768,
                         hidden_dim = 3072, dropout = 0.1, attention_dropout = 0.1, activation = "gelu",
                         initializer_range = 0.02, pad_token_id = 1}

local BERT_SPEC = {vocab_size = "integer", hidden_size = "integer", num_hidden_layers = "integer",
                   num_attention_heads = "integer", intermediate_size = "integer", hidden_act = "string|callable",
                   hidden_dropout_prob = "number", attention_probs_dropout_prob = "number",
                   max_position_embeddings = "integer", type_vocab_size = "integer", layer_norm_eps = "number",
                   pad_token_id = "integer", initializer_range = "number"}
local DISTIL_SPEC = {vocab_size = "integer", max_position_embeddings = "integer", n_layers = "integer",
                     n_heads = "integer", dim = "integer", hidden_dim = "integer", dropout = "number",
                     attention_dropout = "number", activation = "string|callable", initializer_range = "number",
                     pad_token_id = "integer", sinusoidal_pos_embds = "boolean"}

local function merged(a, b)
  local s = {}
  for k, v in pairs(a) do s[k] = v end
  for k, v in pairs(b or {}) do s[k] = v end
  return s
end

-- the checked options of a model's constructor with the defaults filled in:
-- cfg (the config fields, kept as model.config) and o (the rest)
local function configure(self, opts, spec, defaults, extra)
  local who = "nn.models." .. self.__name
  local o = util.options(setmetatable({}, {__index = {__name = "models." .. self.__name}}), opts,
                         merged(spec, extra), true)
  local cfg = {}
  for k in pairs(spec) do
    if o[k] ~= nil then cfg[k] = o[k] else cfg[k] = defaults[k] end
  end
  for k, v in pairs(cfg) do
    if spec[k] == "integer" and k ~= "pad_token_id" and v < 1 then
      fail(who, "%s must be a positive integer, got %d", k, v)
    elseif k:find("dropout") and not (v >= 0 and v <= 1) then -- (NaN too)
      fail(who, "%s must be a probability in [0, 1], got %s", k, tostring(v))
    elseif k == "initializer_range" and not (v >= 0 and v < math.huge) then
      fail(who, "initializer_range (the standard deviation of the initial weights) must be a finite number >= 0, got %s",
           tostring(v))
    end
  end
  return cfg, o, who
end

local function check_act(who, key, act)
  if type(act) == "string" then
    if ACT[act] == nil then fail(who, "%s '%s' is not supported (known: %s)", key, act, ACT_NAMES) end
    return ACT[act]
  end
  return act
end

local function check_heads(who, width_key, width, heads_key, heads)
  if width % heads ~= 0 then
    fail(who, "%s %d is not a multiple of %s %d", width_key, width, heads_key, heads)
  end
end

local function check_pad(who, cfg)
  local pad = cfg.pad_token_id
  if pad < 1 or pad > cfg.vocab_size then
    fail(who, "pad_token_id must be a token id in 1..%d (1-based: Hugging Face's pad_token_id %d is %d here), got %d",
         cfg.vocab_size, pad, pad + 1, pad)
  end
end

-- Hugging Face's _init_weights: Linear and Embedding weights N(0, std), biases
-- 0 (an Embedding's padding row too), LayerNorm weight 1 and bias 0. A tied
-- weight is initialised once, as its first module (the embedding) wants it.
local function hf_init(model, std)
  local nn = nd.nn
  local done = {}
  nd.no_grad(function()
    for _, m in ipairs(model:modules()) do
      local cls = getmetatable(m).class
      if cls == nn.Linear or cls == nn.Embedding then
        if not done[m.weight] then
          done[m.weight] = true
          init.normal_(m.weight, 0, std)
          if cls == nn.Embedding and m.padding_idx then m.weight[m.padding_idx]:zero_() end
        end
        if cls == nn.Linear and m.bias ~= nil and not done[m.bias] then done[m.bias] = true; m.bias:zero_() end
      elseif cls == nn.LayerNorm then
        m.weight:fill_(1)
        m.bias:zero_()
      end
    end
  end)
end

-- the factory keywords, once the model is built (on the cpu, in float32)
local function place(model, o)
  if o.dtype ~= nil and o.dtype ~= "float32" then model:to({dtype = o.dtype}) end
  util.place(model, o)
end

-- inputs ----------------------------------------------------------------------

-- a model's forward checks its inputs once into a table with this metatable;
-- a head hands that table to its encoder, which then does not check again
local CHECKED = {}

local INT = {int64 = true, int32 = true}

local function tensor_of(who, x, what, device)
  if type(x) == "table" and not nd.is_tensor(x) then
    local ok, t = pcall(nd.tensor, x, {dtype = "int64", device = device})
    if not ok then fail(who, "%s must be a tensor or a table of integers (%s)", what, tostring(t):gsub("^.-needle%.[%w_]+: ", "")) end
    return t
  end
  if not nd.is_tensor(x) then fail(who, "%s must be a tensor (batch, sequence), got %s", what, options.got(x)) end
  if x.device ~= device then
    fail(who, "%s is on %s but the model is on %s (move it with :to(\"%s\"))", what, x.device, device, device)
  end
  return x
end

-- an integer tensor of token, type or position ids, its values in 1..n
local function ids_of(who, x, what, device, n, hint)
  x = tensor_of(who, x, what, device)
  if not INT[x.dtype] then
    fail(who, "%s must hold integer ids (int64 or int32), got %s of shape %s", what, x.dtype, shape_str(x))
  end
  -- (inside nd.compile the lookup's own bounds check refuses them, as nn.Embedding's)
  if x:numel() > 0 and not compile_state.compiling() then
    local lo, hi = x:min():item(), x:max():item()
    if lo < 1 or hi > n then
      fail(who, "%s holds %d, outside 1..%d (%s)", what, lo < 1 and lo or hi, n, hint)
    end
  end
  return x
end

local ID_HINT = "needle's token ids are 1-based: Hugging Face's id i is i + 1 here, [PAD] 0 is 1"
local TYPE_HINT = "token types are 1-based: 1 for the first segment, 2 for the second (Hugging Face's 0 and 1)"
local POS_HINT = "position ids are 1-based, 1..max_position_embeddings"

-- attention_mask (B, T) (or (B, T, T): query by key) of 1 = attend, 0 = padding
-- (any dtype) -> the additive (B, 1, 1, T) (or (B, 1, T, T)) mask of the
-- scores: 0 where attended, finfo(dtype).min elsewhere (Hugging Face's
-- get_extended_attention_mask)
local function additive_mask(who, mask, B, T, dtype, device)
  if mask == nil then return nil end
  mask = tensor_of(who, mask, "attention_mask", device)
  local m
  if mask:dim() == 2 and mask:size(1) == B and mask:size(2) == T then
    m = mask:reshape({B, 1, 1, T})
  elseif mask:dim() == 3 and mask:size(1) == B and mask:size(2) == T and mask:size(3) == T then
    m = mask:reshape({B, 1, T, T})
  else
    fail(who, "attention_mask must have shape (batch, sequence) = {%d,%d} (or {%d,%d,%d}) as input_ids, got %s",
         B, T, B, T, T, shape_str(mask))
  end
  return (1 - m:to({dtype = dtype})) * FMIN[dtype]
end

-- input_ids (B, T) (a tensor or a table of rows) and the forward's options,
-- checked; model: the BertModel or DistilBertModel that runs them
local function prepare(who, model, input_ids, opts, bert)
  opts = options.check(who, opts, bert and {attention_mask = "tensor|table", token_type_ids = "tensor|table",
                                            position_ids = "tensor|table"} or {attention_mask = "tensor|table"})
  local cfg = model.config
  local w = model.embeddings.word_embeddings.weight
  -- the dtype it computes in: float32 for a model kept in half precision
  local device, dtype = w.device, (w.dtype == "float16" or w.dtype == "bfloat16") and "float32" or w.dtype
  if input_ids == nil then fail(who, "expected input_ids (batch, sequence), got nil") end
  local ids = ids_of(who, input_ids, "input_ids", device, cfg.vocab_size, ID_HINT)
  if ids:dim() ~= 2 or ids:size(2) < 1 then
    fail(who, "expected input_ids of shape (batch, sequence), got %s%s", shape_str(ids),
         ids:dim() == 1 and " (one sequence: ids:view({1, -1}))" or "")
  end
  local B, T = ids:size(1), ids:size(2)
  local a = {input_ids = ids, mask = additive_mask(who, opts.attention_mask, B, T, dtype, device)}
  local max_pos = cfg.max_position_embeddings
  if opts.position_ids ~= nil then
    local p = ids_of(who, opts.position_ids, "position_ids", device, max_pos, POS_HINT)
    if p:dim() ~= 2 or (p:size(1) ~= B and p:size(1) ~= 1) or p:size(2) ~= T then
      fail(who, "position_ids must have shape {%d,%d} or {1,%d} (input_ids %s), got %s", B, T, T, shape_str(ids),
           shape_str(p))
    end
    a.position_ids = p
  else
    if T > max_pos then
      fail(who, "input_ids %s: the sequence length %d exceeds max_position_embeddings %d", shape_str(ids), T, max_pos)
    end
    a.position_ids = nd.arange(1, T + 1, {dtype = "int64", device = device}):view({1, T})
  end
  if bert then
    if opts.token_type_ids ~= nil then
      local t = ids_of(who, opts.token_type_ids, "token_type_ids", device, cfg.type_vocab_size, TYPE_HINT)
      if shape_str(t) ~= shape_str(ids) then
        fail(who, "token_type_ids must have the shape of input_ids %s, got %s", shape_str(ids), shape_str(t))
      end
      a.token_type_ids = t
    else
      a.token_type_ids = nd.ones({B, T}, {dtype = "int64", device = device})
    end
  end
  return setmetatable(a, CHECKED)
end

-- heads: (B, T, nH * D) -> (B, nH, T, D) and back
local function split_heads(x, heads)
  local B, T, C = x:size(1), x:size(2), x:size(3)
  return x:view({B, T, heads, C // heads}):transpose(2, 3)
end

local function merge_heads(x)
  local B, H, T, D = x:size(1), x:size(2), x:size(3), x:size(4)
  return x:transpose(2, 3):reshape({B, T, H * D})
end

-- softmax(q k^T / sqrt(D) + mask) v through F.scaled_dot_product_attention
-- (Hugging Face's eager BERT divides the scores, DistilBERT q, by sqrt(D):
-- the same numbers up to rounding); dropout on the weights in training
local function attend(q, k, v, heads, mask, p, training)
  local ctx = nd.F.scaled_dot_product_attention(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                                                {attn_mask = mask, dropout_p = training and p or 0})
  return merge_heads(ctx)
end

-- BERT ------------------------------------------------------------------------

local function bert_class(name) local c = Module:extend(name); M[name] = c; return c end

local BertEmbeddings = bert_class("BertEmbeddings")
function BertEmbeddings:init(cfg)
  local nn = nd.nn
  self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, {padding_idx = cfg.pad_token_id})
  self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
  self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
  self.LayerNorm = nn.LayerNorm(cfg.hidden_size, {eps = cfg.layer_norm_eps})
  self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
end
function BertEmbeddings:forward(input_ids, token_type_ids, position_ids)
  local e = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
  e = e + self.position_embeddings(position_ids)
  return self.dropout(self.LayerNorm(e))
end

local BertSelfAttention = bert_class("BertSelfAttention")
function BertSelfAttention:init(cfg)
  local nn = nd.nn
  self.num_attention_heads = cfg.num_attention_heads
  self.attention_probs_dropout_prob = cfg.attention_probs_dropout_prob
  self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
  self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
  self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
end
function BertSelfAttention:forward(h, mask)
  return attend(self.query(h), self.key(h), self.value(h), self.num_attention_heads, mask,
                self.attention_probs_dropout_prob, self.training)
end

-- dense, dropout, then LayerNorm of the sum with the block's input
-- (BertSelfOutput and BertOutput differ in the dense's input width)
local function residual_output(name)
  local c = bert_class(name)
  function c:init(cfg, in_width)
    local nn = nd.nn
    self.dense = nn.Linear(in_width, cfg.hidden_size)
    self.LayerNorm = nn.LayerNorm(cfg.hidden_size, {eps = cfg.layer_norm_eps})
    self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
  end
  function c:forward(h, input) return self.LayerNorm(self.dropout(self.dense(h)) + input) end
  return c
end
local BertSelfOutput = residual_output("BertSelfOutput")
local BertOutput = residual_output("BertOutput")

local BertAttention = bert_class("BertAttention")
function BertAttention:init(cfg)
  self.self = BertSelfAttention(cfg)
  self.output = BertSelfOutput(cfg, cfg.hidden_size)
end
function BertAttention:forward(h, mask) return self.output(self.self(h, mask), h) end

local BertIntermediate = bert_class("BertIntermediate")
function BertIntermediate:init(cfg)
  self.dense = nd.nn.Linear(cfg.hidden_size, cfg.intermediate_size)
  self.intermediate_act_fn = check_act("nn.models.BertModel", "hidden_act", cfg.hidden_act)
  self.act_name = cfg.hidden_act
end
function BertIntermediate:forward(h) return linear_act(self.dense, self.act_name, self.intermediate_act_fn, h) end

local BertLayer = bert_class("BertLayer")
function BertLayer:init(cfg)
  self.attention = BertAttention(cfg)
  self.intermediate = BertIntermediate(cfg)
  self.output = BertOutput(cfg, cfg.intermediate_size)
end
function BertLayer:forward(h, mask)
  local a = self.attention(h, mask)
  return self.output(self.intermediate(a), a)
end

local BertEncoder = bert_class("BertEncoder")
function BertEncoder:init(cfg)
  local layers = {}
  for i = 1, cfg.num_hidden_layers do layers[i] = BertLayer(cfg) end
  self.layer = nd.nn.ModuleList(layers)
end
function BertEncoder:forward(h, mask)
  for _, layer in ipairs(self.layer) do h = layer(h, mask) end
  return h
end

-- tanh(dense(h[:, 1])): the first ([CLS]) token's state
local BertPooler = bert_class("BertPooler")
function BertPooler:init(cfg)
  self.dense = nd.nn.Linear(cfg.hidden_size, cfg.hidden_size)
  self.activation = nd.nn.Tanh()
end
function BertPooler:forward(h) return self.activation(self.dense(h[{":", 1}])) end

-- the config of a BERT model from its constructor's options (`extra`: the head's own)
local function bert_config(self, opts, extra)
  local cfg, o, who = configure(self, opts, BERT_SPEC, M.BERT_DEFAULTS, extra)
  check_heads(who, "hidden_size", cfg.hidden_size, "num_attention_heads", cfg.num_attention_heads)
  check_pad(who, cfg)
  check_act(who, "hidden_act", cfg.hidden_act)
  if not (cfg.layer_norm_eps > 0) then fail(who, "layer_norm_eps must be positive, got %s", tostring(cfg.layer_norm_eps)) end
  return cfg, o
end

-- BertModel{config..., add_pooling_layer = true, dtype =, device =}
local BertModel = bert_class("BertModel")
local BUILT = {} -- BertModel(BUILT, cfg, pool): a head's encoder, its config already checked
function BertModel:init(opts, cfg, pool)
  local o = {}
  if opts ~= BUILT then
    cfg, o = bert_config(self, opts, {add_pooling_layer = "boolean"})
    pool = o.add_pooling_layer ~= false
  end
  self.config = cfg
  self.add_pooling_layer = pool
  self.embeddings = BertEmbeddings(cfg)
  self.encoder = BertEncoder(cfg)
  if pool then self.pooler = BertPooler(cfg) end
  if opts ~= BUILT then
    hf_init(self, cfg.initializer_range)
    place(self, o)
  end
end

-- forward(input_ids (B, T), {attention_mask =, token_type_ids =, position_ids =})
-- -> last_hidden_state (B, T, hidden_size), pooler_output (B, hidden_size) or nil
function BertModel:forward(input_ids, opts)
  local a = input_ids
  if getmetatable(a) ~= CHECKED then a = prepare("nn.models." .. self.__name, self, input_ids, opts, true) end
  local h = self.encoder(self.embeddings(a.input_ids, a.token_type_ids, a.position_ids), a.mask)
  if not self.add_pooling_layer then return h, nil end
  return h, self.pooler(h)
end

function BertModel:extra_repr()
  local c = self.config
  return ("vocab_size=%d, hidden_size=%d, num_hidden_layers=%d, num_attention_heads=%d"):format(
    c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads)
end

-- keys a Hugging Face state_dict may carry that are no parameters here: the
-- position_ids / token_type_ids buffers (persistent before transformers 4.31)
local function without_buffers(sd, prefix)
  local out = {}
  for k, v in pairs(sd) do out[k] = v end
  out[prefix .. "embeddings.position_ids"] = nil
  out[prefix .. "embeddings.token_type_ids"] = nil
  return out
end
M.without_buffers = without_buffers

-- a head's load_state_dict: Module's, accepting the buffers under `prefix`
local function loads_under(prefix)
  return function(self, sd, opts) return Module.load_state_dict(self, without_buffers(sd, prefix), opts) end
end

-- load_state_dict(sd, {strict = true}): Module's, accepting the buffers above
function BertModel:load_state_dict(sd, opts)
  return Module.load_state_dict(self, without_buffers(sd, ""), opts)
end

-- BertForSequenceClassification{config..., num_labels = 2, classifier_dropout = hidden_dropout_prob}
-- forward(input_ids, opts) -> logits (B, num_labels) from the pooler's output
local BertForSequenceClassification = bert_class("BertForSequenceClassification")
function BertForSequenceClassification:init(opts)
  local cfg, o = bert_config(self, opts, {num_labels = "integer", classifier_dropout = "number"})
  self.num_labels = o.num_labels or 2
  if self.num_labels < 1 then fail("nn.models." .. self.__name, "num_labels must be positive, got %d", self.num_labels) end
  self.config = cfg
  self.bert = BertModel(BUILT, cfg, true)
  self.dropout = nd.nn.Dropout(o.classifier_dropout or cfg.hidden_dropout_prob)
  self.classifier = nd.nn.Linear(cfg.hidden_size, self.num_labels)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function BertForSequenceClassification:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.bert, input_ids, opts, true)
  local _, pooled = self.bert(a)
  return self.classifier(self.dropout(pooled))
end
BertForSequenceClassification.load_state_dict = loads_under("bert.")

-- the head's num_labels (default `dflt`), positive
local function labels_of(self, o, dflt)
  local n = o.num_labels or dflt
  if n < 1 then fail("nn.models." .. self.__name, "num_labels must be positive, got %d", n) end
  return n
end

-- a dropout probability option, in [0, 1]
local function dropout_p(self, key, p)
  if not (p >= 0 and p <= 1) then fail("nn.models." .. self.__name, "%s must be in [0, 1], got %s", key, tostring(p)) end
  return p
end

-- question answering's heads have two labels (start and end), as Hugging Face's require
local function two_labels(self, o)
  if (o.num_labels or 2) ~= 2 then
    fail("nn.models." .. self.__name, "num_labels must be 2 (start and end logits), got %d", o.num_labels)
  end
end

-- the start and end logits (B, T) of question answering's (B, T, 2) logits
local function split_span(logits)
  return logits:select(3, 1):contiguous(), logits:select(3, 2):contiguous()
end

-- BertForTokenClassification{config..., num_labels = 2, classifier_dropout = hidden_dropout_prob}
-- (NER and the like): BertModel without its pooler, dropout, classifier on every token;
-- forward(input_ids, opts) -> logits (B, T, num_labels)
local BertForTokenClassification = bert_class("BertForTokenClassification")
function BertForTokenClassification:init(opts)
  local cfg, o = bert_config(self, opts, {num_labels = "integer", classifier_dropout = "number"})
  self.num_labels = labels_of(self, o, 2)
  self.config = cfg
  self.bert = BertModel(BUILT, cfg, false)
  self.dropout = nd.nn.Dropout(dropout_p(self, "classifier_dropout", o.classifier_dropout or cfg.hidden_dropout_prob))
  self.classifier = nd.nn.Linear(cfg.hidden_size, self.num_labels)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function BertForTokenClassification:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.bert, input_ids, opts, true)
  local h = self.bert(a)
  return self.classifier(self.dropout(h))
end
BertForTokenClassification.load_state_dict = loads_under("bert.")

-- BertForQuestionAnswering{config...} (extractive QA, SQuAD): BertModel without its
-- pooler, qa_outputs (hidden -> 2) on every token; forward(input_ids, opts) ->
-- start_logits (B, T), end_logits (B, T): the scores of each token starting and
-- ending the answer span (num_labels must be 2, as Hugging Face's head requires)
local BertForQuestionAnswering = bert_class("BertForQuestionAnswering")
function BertForQuestionAnswering:init(opts)
  local cfg, o = bert_config(self, opts, {num_labels = "integer"})
  two_labels(self, o)
  self.config = cfg
  self.bert = BertModel(BUILT, cfg, false)
  self.qa_outputs = nd.nn.Linear(cfg.hidden_size, 2)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function BertForQuestionAnswering:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.bert, input_ids, opts, true)
  return split_span(self.qa_outputs((self.bert(a))))
end
BertForQuestionAnswering.load_state_dict = loads_under("bert.")

local BertPredictionHeadTransform = bert_class("BertPredictionHeadTransform")
function BertPredictionHeadTransform:init(cfg)
  self.dense = nd.nn.Linear(cfg.hidden_size, cfg.hidden_size)
  self.transform_act_fn = check_act("nn.models.BertForMaskedLM", "hidden_act", cfg.hidden_act)
  self.LayerNorm = nd.nn.LayerNorm(cfg.hidden_size, {eps = cfg.layer_norm_eps})
end
function BertPredictionHeadTransform:forward(h) return self.LayerNorm(self.transform_act_fn(self.dense(h))) end

-- the decoder's weight is the word embeddings (tied: one tensor) and its bias
-- is `bias` (registered first, as PyTorch lists a module's own parameters
-- before its children's)
local BertLMPredictionHead = bert_class("BertLMPredictionHead")
function BertLMPredictionHead:init(cfg, word_embeddings)
  self.bias = Module.Parameter(nd.zeros({cfg.vocab_size}))
  self.transform = BertPredictionHeadTransform(cfg)
  self.decoder = nd.nn.Linear(cfg.hidden_size, cfg.vocab_size, {bias = false})
  self.decoder.weight = word_embeddings.weight
  self.decoder.bias = self.bias
end
function BertLMPredictionHead:forward(h) return self.decoder(self.transform(h)) end

local BertOnlyMLMHead = bert_class("BertOnlyMLMHead")
function BertOnlyMLMHead:init(cfg, word_embeddings)
  self.predictions = BertLMPredictionHead(cfg, word_embeddings)
end
function BertOnlyMLMHead:forward(h) return self.predictions(h) end

-- BertForMaskedLM{config...}: BertModel without its pooler, then cls.predictions;
-- forward(input_ids, opts) -> logits (B, T, vocab_size)
local BertForMaskedLM = bert_class("BertForMaskedLM")
function BertForMaskedLM:init(opts)
  local cfg, o = bert_config(self, opts)
  self.config = cfg
  self.bert = BertModel(BUILT, cfg, false)
  self.cls = BertOnlyMLMHead(cfg, self.bert.embeddings.word_embeddings)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function BertForMaskedLM:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.bert, input_ids, opts, true)
  return self.cls((self.bert(a)))
end

local DECODER_W, DECODER_B = "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"
local EMB_W, BIAS = "bert.embeddings.word_embeddings.weight", "cls.predictions.bias"

-- two tensors of one shape hold the same values (a's converted to b's dtype)
local function same_values(a, b)
  return a == b or (shape_str(a) == shape_str(b) and nd.no_grad(function()
    return a:to({dtype = b.dtype, device = b.device}):eq(b):all():item()
  end))
end

-- the tied keys: where the state dict has only the decoder's name for a tied
-- tensor, it is taken under the other name; the decoder's names are then
-- dropped. Where it has both, they must hold the same values (needle's
-- BertForMaskedLM has one tensor for both, as Hugging Face's with
-- tie_word_embeddings): an untied head is an error, never silently replaced.
-- `model` (optional) is the model loaded into: a decoder key of the wrong
-- shape is then an error naming that key. `who` names the caller in errors.
function M.untie_mlm(sd, who, model)
  who = who or "convert.model('bert_for_masked_lm')"
  local out = without_buffers(sd, "bert.")
  local mismatched = {}
  local model_t = model and {[EMB_W] = model.bert.embeddings.word_embeddings.weight, [BIAS] = model.cls.predictions.bias}
  for _, pair in ipairs({{DECODER_W, EMB_W}, {DECODER_B, BIAS}}) do
    local dec, tied = pair[1], pair[2]
    local d = out[dec]
    if d ~= nil then
      if not nd.is_tensor(d) then
        mismatched[#mismatched + 1] = ("%s (not a tensor: %s)"):format(dec, type(d))
      elseif model_t then
        local target = model_t[tied]
        if shape_str(d) ~= shape_str(target) then
          mismatched[#mismatched + 1] = ("%s (checkpoint %s, model %s)"):format(dec, shape_str(d), shape_str(target))
        end
      end
    end
  end
  if #mismatched > 0 then fail(who, "shape mismatch: %s", table.concat(mismatched, ", ")) end
  for _, pair in ipairs({{DECODER_W, EMB_W, "word embeddings"}, {DECODER_B, BIAS, "prediction bias"}}) do
    local dec, tied, what = pair[1], pair[2], pair[3]
    local d, t = out[dec], out[tied]
    if d ~= nil and nd.is_tensor(t) and not same_values(d, t) then
      fail(who, "%s %s differs from %s %s: BERT's masked-LM decoder is tied to the %s " ..
           "(tie_word_embeddings), and needle's BertForMaskedLM has one tensor for both",
           dec, shape_str(d), tied, shape_str(t), what)
    end
    if t == nil then out[tied] = d end
    out[dec] = nil
  end
  return out
end

-- state_dict(): PyTorch's, with the tied tensors under both names
-- (cls.predictions.decoder.weight and .bias), as Hugging Face's state_dict()
function BertForMaskedLM:state_dict()
  local sd = Module.state_dict(self)
  sd[DECODER_W], sd[DECODER_B] = sd[EMB_W], sd[BIAS]
  return sd
end

-- load_state_dict(sd, opts): with or without the decoder's tied keys
-- (save_pretrained leaves them out)
function BertForMaskedLM:load_state_dict(sd, opts)
  return Module.load_state_dict(self, M.untie_mlm(sd, "nn.models." .. self.__name .. ".load_state_dict", self), opts)
end

-- DistilBERT ------------------------------------------------------------------

local Embeddings = bert_class("Embeddings")
function Embeddings:init(cfg)
  local nn = nd.nn
  self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, {padding_idx = cfg.pad_token_id})
  self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.dim)
  self.LayerNorm = nn.LayerNorm(cfg.dim, {eps = 1e-12})
  self.dropout = nn.Dropout(cfg.dropout)
end
function Embeddings:forward(input_ids, position_ids)
  return self.dropout(self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids)))
end

local MultiHeadSelfAttention = bert_class("MultiHeadSelfAttention")
function MultiHeadSelfAttention:init(cfg)
  local nn = nd.nn
  self.n_heads, self.attention_dropout = cfg.n_heads, cfg.attention_dropout
  self.q_lin = nn.Linear(cfg.dim, cfg.dim)
  self.k_lin = nn.Linear(cfg.dim, cfg.dim)
  self.v_lin = nn.Linear(cfg.dim, cfg.dim)
  self.out_lin = nn.Linear(cfg.dim, cfg.dim)
end
function MultiHeadSelfAttention:forward(x, mask)
  return self.out_lin(attend(self.q_lin(x), self.k_lin(x), self.v_lin(x), self.n_heads, mask, self.attention_dropout,
                             self.training))
end

local FFN = bert_class("FFN")
function FFN:init(cfg)
  self.dropout = nd.nn.Dropout(cfg.dropout)
  self.lin1 = nd.nn.Linear(cfg.dim, cfg.hidden_dim)
  self.lin2 = nd.nn.Linear(cfg.hidden_dim, cfg.dim)
  self.activation = check_act("nn.models.DistilBertModel", "activation", cfg.activation)
  self.act_name = cfg.activation
end
function FFN:forward(x) return self.dropout(self.lin2(linear_act(self.lin1, self.act_name, self.activation, x))) end

local TransformerBlock = bert_class("TransformerBlock")
function TransformerBlock:init(cfg)
  self.attention = MultiHeadSelfAttention(cfg)
  self.sa_layer_norm = nd.nn.LayerNorm(cfg.dim, {eps = 1e-12})
  self.ffn = FFN(cfg)
  self.output_layer_norm = nd.nn.LayerNorm(cfg.dim, {eps = 1e-12})
end
function TransformerBlock:forward(x, mask)
  local sa = self.sa_layer_norm(self.attention(x, mask) + x)
  return self.output_layer_norm(self.ffn(sa) + sa)
end

local Transformer = bert_class("Transformer")
function Transformer:init(cfg)
  local layers = {}
  for i = 1, cfg.n_layers do layers[i] = TransformerBlock(cfg) end
  self.layer = nd.nn.ModuleList(layers)
end
function Transformer:forward(x, mask)
  for _, layer in ipairs(self.layer) do x = layer(x, mask) end
  return x
end

local function distil_config(self, opts, extra)
  local cfg, o, who = configure(self, opts, DISTIL_SPEC, M.DISTILBERT_DEFAULTS, extra)
  check_heads(who, "dim", cfg.dim, "n_heads", cfg.n_heads)
  check_pad(who, cfg)
  check_act(who, "activation", cfg.activation)
  if cfg.sinusoidal_pos_embds then
    fail(who, "sinusoidal_pos_embds = true is not supported (the position embeddings are learned)")
  end
  cfg.sinusoidal_pos_embds = false
  return cfg, o
end

-- DistilBertModel{config..., dtype =, device =}: embeddings and transformer, no
-- token types, no pooler; forward(input_ids, {attention_mask =}) -> (B, T, dim)
local DistilBertModel = bert_class("DistilBertModel")
function DistilBertModel:init(opts, cfg)
  local o = {}
  if opts ~= BUILT then cfg, o = distil_config(self, opts) end
  self.config = cfg
  self.embeddings = Embeddings(cfg)
  self.transformer = Transformer(cfg)
  if opts ~= BUILT then
    hf_init(self, cfg.initializer_range)
    place(self, o)
  end
end
function DistilBertModel:forward(input_ids, opts)
  local a = input_ids
  if getmetatable(a) ~= CHECKED then a = prepare("nn.models." .. self.__name, self, input_ids, opts, false) end
  return self.transformer(self.embeddings(a.input_ids, a.position_ids), a.mask)
end
DistilBertModel.extra_repr = function(self)
  local c = self.config
  return ("vocab_size=%d, dim=%d, n_layers=%d, n_heads=%d"):format(c.vocab_size, c.dim, c.n_layers, c.n_heads)
end
function DistilBertModel:load_state_dict(sd, opts)
  return Module.load_state_dict(self, without_buffers(sd, ""), opts)
end

-- DistilBertForSequenceClassification{config..., num_labels = 2, seq_classif_dropout = 0.2}:
-- classifier(dropout(relu(pre_classifier(h[:, 1])))) -> logits (B, num_labels)
local DistilBertForSequenceClassification = bert_class("DistilBertForSequenceClassification")
function DistilBertForSequenceClassification:init(opts)
  local cfg, o = distil_config(self, opts, {num_labels = "integer", seq_classif_dropout = "number"})
  self.num_labels = o.num_labels or 2
  if self.num_labels < 1 then fail("nn.models." .. self.__name, "num_labels must be positive, got %d", self.num_labels) end
  local p = o.seq_classif_dropout or 0.2
  if not (p >= 0 and p <= 1) then fail("nn.models." .. self.__name, "seq_classif_dropout must be in [0, 1], got %s", tostring(p)) end
  self.config = cfg
  self.distilbert = DistilBertModel(BUILT, cfg)
  self.pre_classifier = nd.nn.Linear(cfg.dim, cfg.dim)
  self.classifier = nd.nn.Linear(cfg.dim, self.num_labels)
  self.dropout = nd.nn.Dropout(p)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function DistilBertForSequenceClassification:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.distilbert, input_ids, opts, false)
  local h = self.distilbert(a)
  return self.classifier(self.dropout(nd.F.relu(self.pre_classifier(h[{":", 1}]))))
end
DistilBertForSequenceClassification.load_state_dict = loads_under("distilbert.")

-- DistilBertForTokenClassification{config..., num_labels = 2}: dropout (the config's
-- dropout) and classifier on every token -> logits (B, T, num_labels)
local DistilBertForTokenClassification = bert_class("DistilBertForTokenClassification")
function DistilBertForTokenClassification:init(opts)
  local cfg, o = distil_config(self, opts, {num_labels = "integer"})
  self.num_labels = labels_of(self, o, 2)
  self.config = cfg
  self.distilbert = DistilBertModel(BUILT, cfg)
  self.dropout = nd.nn.Dropout(dropout_p(self, "dropout", cfg.dropout))
  self.classifier = nd.nn.Linear(cfg.dim, self.num_labels)
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function DistilBertForTokenClassification:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.distilbert, input_ids, opts, false)
  return self.classifier(self.dropout(self.distilbert(a)))
end
DistilBertForTokenClassification.load_state_dict = loads_under("distilbert.")

-- DistilBertForQuestionAnswering{config..., qa_dropout = 0.1}: dropout, qa_outputs
-- (dim -> 2) on every token -> start_logits (B, T), end_logits (B, T)
local DistilBertForQuestionAnswering = bert_class("DistilBertForQuestionAnswering")
function DistilBertForQuestionAnswering:init(opts)
  local cfg, o = distil_config(self, opts, {num_labels = "integer", qa_dropout = "number"})
  two_labels(self, o)
  self.config = cfg
  self.distilbert = DistilBertModel(BUILT, cfg)
  self.qa_outputs = nd.nn.Linear(cfg.dim, 2)
  self.dropout = nd.nn.Dropout(dropout_p(self, "qa_dropout", o.qa_dropout or 0.1))
  hf_init(self, cfg.initializer_range)
  place(self, o)
end
function DistilBertForQuestionAnswering:forward(input_ids, opts)
  local a = prepare("nn.models." .. self.__name, self.distilbert, input_ids, opts, false)
  return split_span(self.qa_outputs(self.dropout(self.distilbert(a))))
end
DistilBertForQuestionAnswering.load_state_dict = loads_under("distilbert.")

return M
