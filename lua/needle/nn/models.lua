-- needle.nn.models (nd.nn.models): ready-made models.
--
--   LanguageModel(vocab, {embedding_size=, hidden_size=, num_layers=,
--                         seq_model="lstm"|"rnn"|"gru", dropout=, tie_weights=})
--     needle's word-level language model: Embedding -> LSTM -> Linear.
--     forward(ids (T, B), state) -> logits (T*B, vocab), state
--   MLP(sizes, {activation=nn.ReLU, dropout=}) -> a Sequential of Linear layers
--   ResNet9({num_classes=10, dtype=}): needle's (CMU 10-714 hw4) small residual
--     network for 3x32x32 images; forward(x (N, 3, 32, 32)) -> logits (N, num_classes)
--   ConvBN(a, b, k, s, {dtype=}): Conv2d(a, b, k, {stride=s, padding=(k-1)//2}) -> BatchNorm2d(b) -> ReLU
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local util = require "needle.nn.util"
local options = require "needle.options"

local M = {}

local LanguageModel = Module:extend("LanguageModel")

function LanguageModel:init(vocab, opts)
  local nn = nd.nn
  opts = util.options(self, opts, {embedding_size = "integer", hidden_size = "integer", num_layers = "integer",
                                   seq_model = "string", dropout = "number", tie_weights = "boolean"})
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
    self.embedding.weight:copy_(init._random_scaled(nd.rand, self.embedding.weight.shape, nil, 2 * r, -r))
    self.decoder.weight:copy_(init._random_scaled(nd.rand, self.decoder.weight.shape, nil, 2 * r, -r))
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
  opts = options.check("nn.models.MLP", opts, {activation = "callable", dropout = "number"})
  if type(sizes) ~= "table" or #sizes < 2 then
    util.fail("models.MLP", "sizes must be a list of at least 2 layer sizes such as {784, 256, 10}, got %s",
              options.got(sizes))
  end
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

-- ConvBN(a, b, k, s, {dtype=}): needle's convolution block, Conv2d (with bias, "same"
-- padding (k-1)//2 for odd k) -> BatchNorm2d -> ReLU. Children conv, bn, relu.
local ConvBN = Module:extend("ConvBN")

function ConvBN:init(a, b, k, s, opts)
  local nn = nd.nn
  s = s or 1
  opts = util.options(self, opts, {}, true)
  local dtype = opts.dtype or "float32"
  self.conv = nn.Conv2d(a, b, k, {stride = s, padding = (k - 1) // 2, bias = true, dtype = dtype})
  self.bn = nn.BatchNorm2d(b, {dtype = dtype})
  self.relu = nn.ReLU()
  util.place(self, opts)
end

function ConvBN:forward(x) return self.relu(self.bn(self.conv(x))) end

-- nd.nn.fuse's hook: one FusedConv2d with the BatchNorm folded in and the ReLU
-- in the GEMM's epilogue (F = require "needle.nn.fuse")
function ConvBN:fuse(F) return F.conv_bn(self.conv, self.bn, {relu = true}) end

M.ConvBN = ConvBN

-- ResNet9({num_classes = 10, dtype = "float32"}): needle's ResNet9 (hw4) for
-- 32x32 RGB images (dtype "float64" for checks against a double reference).
-- The stride-4 7x7 stem and three stride-2 blocks take 32x32 down to 1x1, so
-- the classifier sees 128 features:
--
--   ConvBN(3,16,7,4) ConvBN(16,32,3,2) Residual(ConvBN(32,32,3,1) ConvBN(32,32,3,1))
--   ConvBN(32,64,3,2) ConvBN(64,128,3,2) Residual(ConvBN(128,128,3,1) ConvBN(128,128,3,1))
--   Flatten Linear(128,128) ReLU Linear(128,num_classes)
--
-- 431,946 parameters with num_classes = 10. state_dict keys are
-- model.<i>.conv.weight, model.2.fn.0.bn.running_mean, model.9.bias, ...
-- (the same module tree in PyTorch gives the same keys; see
-- spec/fixtures/gen/gen_torch_resnet9.py).
local ResNet9 = Module:extend("ResNet9")

function ResNet9:init(opts)
  local nn = nd.nn
  opts = util.options(self, opts, {num_classes = "integer"}, true)
  local classes = opts.num_classes or 10
  if math.type(classes) ~= "integer" or classes < 1 then
    error(("needle.nn.ResNet9: num_classes must be a positive integer, got %s"):format(options.got(classes)), 3)
  end
  local dtype = opts.dtype or "float32"
  if dtype ~= "float32" and dtype ~= "float64" then
    error(("needle.nn.ResNet9: dtype must be 'float32' or 'float64', got %s"):format(tostring(dtype)), 3)
  end
  self.num_classes, self.dtype = classes, dtype
  local o = {dtype = dtype}
  local function cbn(a, b, k, s) return ConvBN(a, b, k, s, o) end
  self.model = nn.Sequential(
    cbn(3, 16, 7, 4),
    cbn(16, 32, 3, 2),
    nn.Residual(nn.Sequential(cbn(32, 32, 3, 1), cbn(32, 32, 3, 1))),
    cbn(32, 64, 3, 2),
    cbn(64, 128, 3, 2),
    nn.Residual(nn.Sequential(cbn(128, 128, 3, 1), cbn(128, 128, 3, 1))),
    nn.Flatten(),
    nn.Linear(128, 128, o),
    nn.ReLU(),
    nn.Linear(128, classes, o))
  util.place(self, opts)
end

function ResNet9:extra_repr()
  return ("num_classes=%d%s"):format(self.num_classes, self.dtype ~= "float32" and ", dtype=" .. self.dtype or "")
end

-- the spatial size after the stem (k 7, stride 4, pad 3) and three stride-2
-- blocks: 1 for every size up to 32, which Linear(128, ...) needs
local function final_size(h)
  h = (h + 6 - 7) // 4 + 1
  for _ = 1, 3 do h = (h + 2 - 3) // 2 + 1 end
  return h
end

function ResNet9:forward(x)
  if not nd.is_tensor(x) or x:dim() ~= 4 or x:size(2) ~= 3
     or final_size(x:size(3)) ~= 1 or final_size(x:size(4)) ~= 1 then
    local got = nd.is_tensor(x) and ("{" .. table.concat(x.shape, ",") .. "}") or type(x)
    error(("needle.nn.ResNet9: expected images of shape (N, 3, H, W) with H and W at most 32 (CIFAR: 32x32), got %s"):format(got), 2)
  end
  return self.model(x)
end

M.ResNet9 = ResNet9

-- nd.nn.models is this table; it also has the model classes that the
-- converter's registry defines (needle.convert.models): ResNetCIFAR,
-- BasicBlock, FusedResNetCIFAR, FusedBasicBlock and TransformerClassifier,
-- loaded on first use.
local CONVERT = {"needle.convert.models"}
-- torchvision's ResNet-18/34/50 and MobileNetV2 (needle.zoo.vision, docs/models.md)
local VISION = {"needle.zoo.vision"}
-- Hugging Face BERT and DistilBERT (needle.zoo.bert, docs/models-text.md)
local BERT = {"needle.zoo.bert"}
return require("needle.lazy")(M, {ResNetCIFAR = CONVERT, BasicBlock = CONVERT, FusedResNetCIFAR = CONVERT,
                                  FusedBasicBlock = CONVERT, TransformerClassifier = CONVERT,
                                  resnet18 = VISION, resnet34 = VISION, resnet50 = VISION, mobilenet_v2 = VISION,
                                  resnext50_32x4d = VISION, resnext101_32x8d = VISION, wide_resnet50_2 = VISION,
                                  wide_resnet101_2 = VISION,
                                  ResNet = VISION, Bottleneck = VISION, MobileNetV2 = VISION,
                                  InvertedResidual = VISION,
                                  BertModel = BERT, BertForSequenceClassification = BERT, BertForMaskedLM = BERT,
                                  DistilBertModel = BERT, DistilBertForSequenceClassification = BERT,
                                  BertForTokenClassification = BERT, BertForQuestionAnswering = BERT,
                                  DistilBertForTokenClassification = BERT, DistilBertForQuestionAnswering = BERT,
                                  -- Hugging Face GPT-2 (needle.zoo.gpt2, docs/models-gpt2.md)
                                  GPT2Model = {"needle.zoo.gpt2"}, GPT2LMHeadModel = {"needle.zoo.gpt2"}},
                                 {who = "nn.models"})
