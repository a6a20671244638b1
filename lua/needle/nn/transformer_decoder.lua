-- needle.nn.transformer_decoder: PyTorch's TransformerDecoderLayer,
-- TransformerDecoder and encoder-decoder Transformer (reached as
-- nn.Transformer{...}: see Transformer:new in needle.nn.transformer).
--
--   local model = nd.nn.Transformer{d_model = 64, nhead = 4, num_encoder_layers = 2,
--                                   num_decoder_layers = 2, dim_feedforward = 128, dropout = 0}
--   local tgt_mask = nd.nn.Transformer.generate_square_subsequent_mask(T)
--   local out = model(src, tgt, {tgt_mask = tgt_mask})        -- (T, N, E)
--
-- Children, parameters and state_dict keys are PyTorch's (a decoder layer's
-- self_attn, multihead_attn, linear1, linear2, norm1..3; a decoder's
-- layers.<i>.* and norm.*; a Transformer's encoder.* and decoder.*), so a
-- torch.nn.Transformer's state_dict loads by name. Masks follow
-- nn.MultiheadAttention (bool: true where attention is NOT allowed; float:
-- added); *_is_causal = true without a mask builds the causal mask.
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local Linear = require("needle.nn.linear").Linear
local linear_act = require("needle.nn.linear").linear_act
local Dropout = require("needle.nn.dropout").Dropout
local LayerNorm = require("needle.nn.norm").LayerNorm
local ModuleList = require("needle.nn.container").ModuleList
local T = require "needle.nn.transformer"

local M = {}

local util = require "needle.nn.util"
local options = require "needle.options"
local shape_str = require("needle.errors").shape_str

-- TransformerDecoderLayer --------------------------------------------------------

local TDL = Module:extend("TransformerDecoderLayer")

-- TransformerDecoderLayer(d_model, nhead, {dim_feedforward=2048, dropout=0.1,
--   activation="relu" | "gelu" | function | module, layer_norm_eps=1e-5,
--   batch_first=false, norm_first=false, bias=true, dtype=, device=})
local LAYER = {dim_feedforward = "integer", dropout = "number", activation = T.ACTIVATION,
               layer_norm_eps = "number", batch_first = "boolean", norm_first = "boolean", bias = "boolean"}

function TDL:init(d_model, nhead, opts)
  opts = util.options(self, opts, LAYER, true)
  local dim_ff = opts.dim_feedforward or 2048
  local dropout = opts.dropout or 0.1
  local eps = opts.layer_norm_eps or 1e-5
  local bias = opts.bias ~= false
  local dtype = opts.dtype or "float32"
  self.d_model, self.nhead, self.dim_feedforward = d_model, nhead, dim_ff
  self.batch_first = opts.batch_first or false
  local mha = {dropout = dropout, bias = bias, batch_first = self.batch_first, dtype = dtype}
  self.self_attn = T.MultiheadAttention(d_model, nhead, mha)
  self.multihead_attn = T.MultiheadAttention(d_model, nhead, mha)
  self.linear1 = Linear(d_model, dim_ff, {bias = bias, dtype = dtype})
  self.dropout = Dropout(dropout)
  self.linear2 = Linear(dim_ff, d_model, {bias = bias, dtype = dtype})
  self.norm_first = opts.norm_first or false
  self.norm1 = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})
  self.norm2 = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})
  self.norm3 = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})
  self.dropout1 = Dropout(dropout)
  self.dropout2 = Dropout(dropout)
  self.dropout3 = Dropout(dropout)
  T.set_activation(self, opts.activation)
  util.place(self, opts)
end

-- the forward options of a decoder layer and a decoder, in PyTorch's
-- positional order after (tgt, memory)
local DECODER_ARGS = {"tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask",
                      "tgt_is_causal", "memory_is_causal"}
local DECODER_CALL = {tgt_mask = "tensor", memory_mask = "tensor", tgt_key_padding_mask = "tensor",
                      memory_key_padding_mask = "tensor", tgt_is_causal = "boolean", memory_is_causal = "boolean"}

-- forward(tgt, memory, {...}) or forward(tgt, memory, tgt_mask, memory_mask, ...):
-- the options as one table
local function call_options(who, first, ...)
  if type(first) == "table" and not nd.is_tensor(first) then
    if select("#", ...) > 0 then util.fail(who, "options given as a table and then positionally") end
    return options.check("nn." .. who, first, DECODER_CALL)
  end
  local args, o = table.pack(first, ...), {}
  for i, name in ipairs(DECODER_ARGS) do o[name] = args[i] end
  return options.check("nn." .. who, o, DECODER_CALL)
end

function TDL:_sig() return ("TransformerDecoderLayer(%d, %d)"):format(self.d_model, self.nhead) end

-- the input check of a decoder layer: tgt and memory (L, N, E) / (N, L, E)
-- or unbatched (L, E), both batched or both not
local function check_inputs(who, d_model, batch_first, tgt, memory)
  for _, a in ipairs({{"tgt", tgt}, {"memory", memory}}) do
    local x = a[2]
    if not nd.is_tensor(x) or (x:dim() ~= 2 and x:dim() ~= 3) or x:size(-1) ~= d_model then
      local want = batch_first and "(N, T, %d)" or "(T, N, %d)"
      util.fail(who, "expected %s of shape " .. want .. " or (T, %d), got %s", a[1], d_model, d_model,
                nd.is_tensor(x) and shape_str(x) or type(x))
    end
  end
  if tgt:dim() ~= memory:dim() then
    util.fail(who, "tgt %s and memory %s must both be batched or both unbatched", shape_str(tgt), shape_str(memory))
  end
end

function TDL:forward(tgt, memory, ...)
  local o = call_options(self:_sig(), ...)
  check_inputs(self:_sig(), self.d_model, self.batch_first, tgt, memory)
  local x = tgt
  local function sa(y)
    return self.dropout1((self.self_attn(y, y, y, {attn_mask = o.tgt_mask, key_padding_mask = o.tgt_key_padding_mask,
                                                   is_causal = o.tgt_is_causal, need_weights = false})))
  end
  local function mha(y)
    return self.dropout2((self.multihead_attn(y, memory, memory, {attn_mask = o.memory_mask,
      key_padding_mask = o.memory_key_padding_mask, is_causal = o.memory_is_causal, need_weights = false})))
  end
  local function ff(y) -- (linear1 and a named activation in one kernel: nn/linear.lua)
    return self.dropout3(self.linear2(self.dropout(linear_act(self.linear1, self.activation_name, self.activation, y))))
  end
  if self.norm_first then
    x = x + sa(self.norm1(x))
    x = x + mha(self.norm2(x))
    x = x + ff(self.norm3(x))
  else
    x = self.norm1(x + sa(x))
    x = self.norm2(x + mha(x))
    x = self.norm3(x + ff(x))
  end
  return x
end

-- the encoder layer's: the same hyperparameters
TDL.extra_repr = T.TransformerEncoderLayer.extra_repr
M.TransformerDecoderLayer = TDL

-- TransformerDecoder ---------------------------------------------------------------

local TD = Module:extend("TransformerDecoder")

-- TransformerDecoder(decoder_layer, num_layers, {norm=}): num_layers deep
-- copies of decoder_layer (keys layers.0.*, layers.1.*, ...) and an optional
-- final norm module (keys norm.*)
function TD:init(decoder_layer, num_layers, opts)
  if not Module.is_module(decoder_layer) then
    util.fail(self, "decoder_layer must be a module, got %s", type(decoder_layer))
  end
  if math.type(num_layers) ~= "integer" or num_layers < 1 then
    util.fail(self, "num_layers must be a positive integer, got %s", tostring(num_layers))
  end
  local norm = util.options(self, opts, {norm = "module"}).norm
  local layers = {}
  for i = 1, num_layers do layers[i] = T.clone_module(decoder_layer) end
  self.layers = ModuleList(layers)
  self.num_layers = num_layers
  if norm ~= nil then self.norm = norm end
end

-- forward(tgt, memory, {tgt_mask=, memory_mask=, tgt_key_padding_mask=,
-- memory_key_padding_mask=, tgt_is_causal=, memory_is_causal=}) or those
-- positionally, as PyTorch's
function TD:forward(tgt, memory, ...)
  local o = call_options("TransformerDecoder", ...)
  local x = tgt
  for _, layer in ipairs(self.layers) do x = layer(x, memory, o) end
  if self.norm ~= nil then x = self.norm(x) end
  return x
end
M.TransformerDecoder = TD

-- Transformer (PyTorch's encoder-decoder) -------------------------------------------

local S2S = Module:extend("Transformer")
S2S.generate_square_subsequent_mask = T.generate_square_subsequent_mask

local S2S_OPTS = {d_model = "integer", nhead = "integer", num_encoder_layers = "integer",
                  num_decoder_layers = "integer", dim_feedforward = "integer", dropout = "number",
                  activation = T.ACTIVATION, custom_encoder = "module", custom_decoder = "module",
                  layer_norm_eps = "number", batch_first = "boolean", norm_first = "boolean", bias = "boolean"}

-- nn.Transformer{d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
--   dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=, custom_decoder=,
--   layer_norm_eps=1e-5, batch_first=false, norm_first=false, bias=true, dtype=, device=}:
-- an encoder (TransformerEncoder with a final LayerNorm) and a decoder
-- (TransformerDecoder, likewise), every parameter of more than one dim
-- xavier_uniform_, as PyTorch's _reset_parameters
function S2S:init(opts)
  opts = util.options(self, opts, S2S_OPTS, true)
  local d_model, nhead = opts.d_model or 512, opts.nhead or 8
  for _, k in ipairs({"d_model", "nhead", "num_encoder_layers", "num_decoder_layers", "dim_feedforward"}) do
    if opts[k] ~= nil and opts[k] < 1 then util.fail(self, "%s must be a positive integer, got %d", k, opts[k]) end
  end
  if d_model % nhead ~= 0 then
    util.fail(self, "d_model (%d) must be divisible by nhead (%d)", d_model, nhead)
  end
  self.d_model, self.nhead = d_model, nhead
  self.batch_first = opts.batch_first or false
  local dtype = opts.dtype or "float32"
  local eps, bias = opts.layer_norm_eps or 1e-5, opts.bias ~= false
  local layer = {dim_feedforward = opts.dim_feedforward or 2048, dropout = opts.dropout or 0.1,
                 activation = opts.activation, layer_norm_eps = eps, batch_first = self.batch_first,
                 norm_first = opts.norm_first or false, bias = bias, dtype = dtype}
  if opts.custom_encoder ~= nil then
    self.encoder = opts.custom_encoder
  else
    self.encoder = T.TransformerEncoder(T.TransformerEncoderLayer(d_model, nhead, layer),
      opts.num_encoder_layers or 6, {norm = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})})
  end
  if opts.custom_decoder ~= nil then
    self.decoder = opts.custom_decoder
  else
    self.decoder = TD(TDL(d_model, nhead, layer), opts.num_decoder_layers or 6,
      {norm = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})})
  end
  for _, p in ipairs(self:parameters()) do
    if p:dim() > 1 then init.xavier_uniform_(p) end
  end
  util.place(self, opts)
end

function S2S:_sig() return ("Transformer(d_model=%d, nhead=%d)"):format(self.d_model, self.nhead) end

local S2S_CALL = {src_mask = "tensor", tgt_mask = "tensor", memory_mask = "tensor", src_key_padding_mask = "tensor",
                  tgt_key_padding_mask = "tensor", memory_key_padding_mask = "tensor", src_is_causal = "boolean",
                  tgt_is_causal = "boolean", memory_is_causal = "boolean"}

-- forward(src, tgt, {src_mask=, tgt_mask=, memory_mask=, src_key_padding_mask=,
--   tgt_key_padding_mask=, memory_key_padding_mask=, src_is_causal=, tgt_is_causal=,
--   memory_is_causal=}) -> (T, N, E) (or (N, T, E) with batch_first; (T, E) unbatched)
function S2S:forward(src, tgt, opts)
  local o = options.check("nn." .. self:_sig(), opts, S2S_CALL)
  for _, a in ipairs({{"src", src}, {"tgt", tgt}}) do
    local x = a[2]
    if not nd.is_tensor(x) or (x:dim() ~= 2 and x:dim() ~= 3) or x:size(-1) ~= self.d_model then
      local want = self.batch_first and "(N, S, %d)" or "(S, N, %d)"
      error(("needle.nn.%s: expected %s of shape " .. want .. " or (S, %d), got %s"):format(self:_sig(), a[1],
        self.d_model, self.d_model, nd.is_tensor(x) and shape_str(x) or type(x)), 2)
    end
  end
  if src:dim() ~= tgt:dim() then
    error(("needle.nn.%s: src %s and tgt %s must both be batched or both unbatched"):format(self:_sig(),
      shape_str(src), shape_str(tgt)), 2)
  end
  local bdim = self.batch_first and 1 or 2
  if src:dim() == 3 and src:size(bdim) ~= tgt:size(bdim) then
    error(("needle.nn.%s: src %s and tgt %s must have the same batch size (dim %d)"):format(self:_sig(),
      shape_str(src), shape_str(tgt), bdim), 2)
  end
  local memory = self.encoder(src, {src_mask = o.src_mask, src_key_padding_mask = o.src_key_padding_mask,
                                    is_causal = o.src_is_causal})
  return self.decoder(tgt, memory, {tgt_mask = o.tgt_mask, memory_mask = o.memory_mask,
    tgt_key_padding_mask = o.tgt_key_padding_mask, memory_key_padding_mask = o.memory_key_padding_mask,
    tgt_is_causal = o.tgt_is_causal, memory_is_causal = o.memory_is_causal})
end

function S2S:extra_repr()
  return ("d_model=%d, nhead=%d%s"):format(self.d_model, self.nhead, self.batch_first and ", batch_first=true" or "")
end
M.Seq2SeqTransformer = S2S

return M
