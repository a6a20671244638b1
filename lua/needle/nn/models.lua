-- needle.nn.models: ready-made models.
--
--   LanguageModel(vocab, {embedding_size=, hidden_size=, num_layers=,
--                         seq_model="lstm"|"rnn"|"gru", dropout=, tie_weights=})
--     needle's word-level language model: Embedding -> LSTM -> Linear.
--     forward(ids (T, B), state) -> logits (T*B, vocab), state
--   MLP(sizes, {activation=nn.ReLU, dropout=}) -> a Sequential of Linear layers
local nd = require "needle"
local Module = require "needle.nn.module"

local M = {}

local LanguageModel = Module:extend("LanguageModel")

function LanguageModel:init(vocab, opts)
  local nn = nd.nn
  opts = opts or {}
  local emb = opts.embedding_size or 64
  local hid = opts.hidden_size or 128
  local seq = opts.seq_model or "lstm"
  local kinds = {lstm = "LSTM", rnn = "RNN", gru = "GRU"}
  if not kinds[seq] then
    error(("needle.nn.LanguageModel: seq_model must be 'lstm', 'rnn' or 'gru', got '%s'"):format(tostring(seq)), 3)
  end
  self.vocab, self.seq_model, self.dropout_p = vocab, seq, opts.dropout or 0
  self.embedding = nn.Embedding(vocab, emb)
  self.rnn = nn[kinds[seq]](emb, hid, {num_layers = opts.num_layers or 1, dropout = self.dropout_p})
  self.drop = nn.Dropout(self.dropout_p)
  self.decoder = nn.Linear(hid, vocab)
  if opts.tie_weights then
    if emb ~= hid then
      error("needle.nn.LanguageModel: tie_weights needs embedding_size == hidden_size", 3)
    end
    self.decoder.weight = self.embedding.weight
  end
  -- PyTorch's word_language_model initialisation
  nd.no_grad(function()
    local r = 0.1
    self.embedding.weight:copy_(nd.rand(self.embedding.weight.shape) * (2 * r) - r)
    self.decoder.weight:copy_(nd.rand(self.decoder.weight.shape) * (2 * r) - r)
    self.decoder.bias:zero_()
  end)
end

function LanguageModel:extra_repr()
  return ("vocab=%d, seq_model=%s"):format(self.vocab, self.seq_model)
end

-- ids: (T, B) int64 word indices 1..vocab
function LanguageModel:forward(ids, state)
  if ids:dim() ~= 2 then
    error(("needle.nn.LanguageModel: expected word ids of shape (T, B), got {%s}"):format(
      table.concat(ids.shape, ",")), 2)
  end
  local T, B = ids:size(1), ids:size(2)
  local x = self.drop(self.embedding(ids))
  local out, new_state = self.rnn(x, state)
  local logits = self.decoder(self.drop(out):reshape({T * B, -1}))
  return logits, new_state
end

-- the recurrent state without its history (truncated backpropagation)
function LanguageModel.detach_state(state)
  if state == nil then return nil end
  if nd.is_tensor(state) then return state:detach() end
  return {state[1]:detach(), state[2]:detach()}
end

M.LanguageModel = LanguageModel

-- MLP({784, 256, 10}, {activation=, dropout=}): Linear layers with the
-- activation (and dropout) between them
function M.MLP(sizes, opts)
  local nn = nd.nn
  opts = opts or {}
  local layers = {}
  for i = 1, #sizes - 1 do
    layers[#layers + 1] = nn.Linear(sizes[i], sizes[i + 1])
    if i < #sizes - 1 then
      layers[#layers + 1] = (opts.activation or nn.ReLU)()
      if opts.dropout and opts.dropout > 0 then layers[#layers + 1] = nn.Dropout(opts.dropout) end
    end
  end
  return nn.Sequential(table.unpack(layers))
end

return M
