-- needle.convert.models: the registry of model definitions, written in Lua
-- to mirror common PyTorch ones, that scripts/convert_torch.lua and
-- convert.model(name, sd) build and load.
--
--   local models = require "needle.convert.models"
--   models.names()                   -- {"lstm_lm", "mlp", "resnet18_cifar", ...}
--   local e = models.get("mlp")      -- {build=, mapping=, description=, input_example=}
--   local model = e.build(sd, opts)  -- sizes inferred from sd (after e.mapping is applied)
--   models.register("my_net", {build = function(sd, opts) ... end, mapping = nil,
--                              options = {depth = "integer"}, description = "...",
--                              input_example = function(model) ... end})
--
-- build(sd, opts) gets the state dict with needle's key names (the entry's
-- mapping already applied) and returns a freshly initialised model of the
-- right sizes; convert.model then loads sd into it. What the weights cannot
-- tell comes from opts: the entry's `options` names those keys and their
-- types (needle.options), and convert.model refuses any other. input_example(model) returns an input
-- the model's forward accepts (random, for smoke tests and benchmarks).
--
-- Also defined here (and exported): ResNetCIFAR with its BasicBlock, and
-- TransformerClassifier.
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local nd = require "needle"
local Module = require "needle.nn.module"
local options = require "needle.options"

local M = {}

local fail = errors.failer("convert", 0)

local shape_str = errors.shape_str

local SD = require "needle.convert.state_dict"
local need, count_indexed = SD.need, SD.count_indexed

local registry, order = {}, {}

function M.register(name, entry)
  if type(name) ~= "string" or name == "" then fail("register: the name must be a non-empty string") end
  if type(entry) ~= "table" or type(entry.build) ~= "function" then
    fail("register('%s'): the entry needs a build(sd, opts) function", name)
  end
  if entry.options ~= nil and type(entry.options) ~= "table" then
    fail("register('%s'): options must be a table {name = type} of the options build reads", name)
  end
  if registry[name] == nil then order[#order + 1] = name end
  registry[name] = entry
  return entry
end

function M.names()
  local list = {}
  for i, n in ipairs(order) do list[i] = n end
  table.sort(list)
  return list
end

function M.get(name)
  local e = registry[name]
  if e == nil then
    fail("unknown model '%s' (known: %s)", tostring(name), table.concat(M.names(), ", "))
  end
  return e
end

-- mlp ---------------------------------------------------------------------------

-- nn.Sequential(Linear, ReLU, Linear, ReLU, ..., Linear): keys 0.*, 2.*, 4.*, ...
M.register("mlp", {
  description = "nn.Sequential(Linear, ReLU, ..., Linear) -> nd.nn.models.MLP (sizes from the weights)",
  build = function(sd, opts)
    local idx = {}
    for k in pairs(sd) do
      local i = tostring(k):match("^(%d+)%.weight$")
      if i then idx[#idx + 1] = tonumber(i) end
    end
    table.sort(idx)
    if #idx == 0 then fail("mlp: no Linear weights ('0.weight', '2.weight', ...) in the state dict") end
    local sizes = {}
    for j, i in ipairs(idx) do
      if i ~= 2 * (j - 1) then
        fail("mlp: expected Linear layers at 0, 2, 4, ... (Linear, ReLU, Linear, ...), found a weight at %d", i)
      end
      local w = need(sd, i .. ".weight", 2, "mlp")
      if j == 1 then sizes[1] = w:size(2)
      elseif w:size(2) ~= sizes[j] then
        fail("mlp: '%d.weight' %s takes %d inputs but the layer before gives %d", i, shape_str(w), w:size(2), sizes[j])
      end
      sizes[j + 1] = w:size(1)
    end
    return nd.nn.MLP(sizes)
  end,
  input_example = function(model) return nd.randn({2, model[1].in_features or model[1].weight:size(2)}) end,
})

-- resnet9 -------------------------------------------------------------------------

M.register("resnet9", {
  description = "needle's ResNet9 (CMU 10-714 hw4) for 3x32x32 images (num_classes from model.9.weight)",
  build = function(sd, opts)
    local w = need(sd, "model.9.weight", 2, "resnet9")
    return nd.nn.ResNet9({num_classes = w:size(1)})
  end,
  input_example = function() return nd.randn({2, 3, 32, 32}) end,
})

-- resnet18_cifar --------------------------------------------------------------------

-- torchvision's BasicBlock: conv3x3(stride) bn relu conv3x3 bn, plus the
-- identity or a 1x1 strided conv + bn, then relu
local BasicBlock = Module:extend("BasicBlock")

function BasicBlock:init(inplanes, planes, stride)
  local nn = nd.nn
  self.inplanes, self.planes, self.stride = inplanes, planes, stride
  self.conv1 = nn.Conv2d(inplanes, planes, 3, {stride = stride, padding = 1, bias = false})
  self.bn1 = nn.BatchNorm2d(planes)
  self.relu = nn.ReLU()
  self.conv2 = nn.Conv2d(planes, planes, 3, {stride = 1, padding = 1, bias = false})
  self.bn2 = nn.BatchNorm2d(planes)
  if stride ~= 1 or inplanes ~= planes then
    self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, {stride = stride, bias = false}),
                                    nn.BatchNorm2d(planes))
  end
end

function BasicBlock:forward(x)
  local out = self.relu(self.bn1(self.conv1(x)))
  out = self.bn2(self.conv2(out))
  local identity = self.downsample and self.downsample(x) or x
  return self.relu(out + identity)
end

-- the fused block: conv1' (BN folded, ReLU in the epilogue), conv2' (BN
-- folded), the downsample folded into one conv; relu(conv2'(conv1'(x)) + ds'(x))
local FusedBasicBlock = Module:extend("FusedBasicBlock")

function FusedBasicBlock:init(conv1, conv2, downsample)
  self.conv1, self.conv2 = conv1, conv2
  if downsample then self.downsample = downsample end
end

function FusedBasicBlock:forward(x)
  local identity = self.downsample and self.downsample(x) or x
  return nd.F.relu(self.conv2(self.conv1(x)) + identity)
end

-- the fuse hook (nd.nn.fuse): F = require "needle.nn.fuse"
function BasicBlock:fuse(F)
  local ds
  if self.downsample then ds = F.conv_bn(self.downsample[1], self.downsample[2], {relu = false}) end
  return FusedBasicBlock(F.conv_bn(self.conv1, self.bn1, {relu = true}),
                         F.conv_bn(self.conv2, self.bn2, {relu = false}), ds)
end

M.BasicBlock, M.FusedBasicBlock = BasicBlock, FusedBasicBlock

-- ResNetCIFAR({width = 64, num_classes = 10, layers = {2, 2, 2, 2}}): torchvision's
-- ResNet with BasicBlocks for 32x32 inputs (3x3 stem, stride 1, no max-pool).
-- {2, 2, 2, 2} is ResNet-18, {3, 4, 6, 3} ResNet-34. Keys conv1.weight, bn1.*,
-- layer<k>.<j>.conv1.weight, layer<k>.0.downsample.0.weight, fc.weight, ...
local ResNetCIFAR = Module:extend("ResNetCIFAR")

function ResNetCIFAR:init(opts)
  local nn = nd.nn
  opts = options.check("nn.models.ResNetCIFAR", opts, {width = "integer", num_classes = "integer", layers = "table"})
  local w = opts.width or 64
  local classes = opts.num_classes or 10
  local layers = opts.layers or {2, 2, 2, 2}
  self.width, self.num_classes, self.layers = w, classes, layers
  self.conv1 = nn.Conv2d(3, w, 3, {stride = 1, padding = 1, bias = false})
  self.bn1 = nn.BatchNorm2d(w)
  self.relu = nn.ReLU()
  local inplanes = w
  for k = 1, 4 do
    local planes = w << (k - 1)
    local blocks = {}
    for j = 1, layers[k] do
      blocks[j] = BasicBlock(inplanes, planes, (j == 1 and k > 1) and 2 or 1)
      inplanes = planes
    end
    self["layer" .. k] = nn.Sequential(table.unpack(blocks))
  end
  self.avgpool = nn.AdaptiveAvgPool2d(1)
  self.fc = nn.Linear(8 * w, classes)
end

function ResNetCIFAR:forward(x)
  if not nd.is_tensor(x) or x:dim() ~= 4 or x:size(2) ~= 3 then
    error(("needle.convert.ResNetCIFAR: expected images of shape (N, 3, H, W), got %s"):format(
      nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  x = self.relu(self.bn1(self.conv1(x)))
  x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
  x = self.avgpool(x)
  return self.fc(x:flatten(2))
end

function ResNetCIFAR:extra_repr()
  return ("width=%d, num_classes=%d, layers={%s}"):format(self.width, self.num_classes, table.concat(self.layers, ","))
end

-- the stem conv+bn+relu folded, every block through its hook, fc a FusedLinear
local FusedResNetCIFAR = Module:extend("FusedResNetCIFAR")

function FusedResNetCIFAR:init(stem, layers, fc)
  self.stem = stem
  for k = 1, 4 do self["layer" .. k] = layers[k] end
  self.fc = fc
end

function FusedResNetCIFAR:forward(x)
  x = self.stem(x)
  x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
  return self.fc(nd.F.adaptive_avg_pool2d(x, {1, 1}):flatten(2))
end

function ResNetCIFAR:fuse(F)
  local layers = {}
  for k = 1, 4 do layers[k] = F.fuse(self["layer" .. k]) end
  return FusedResNetCIFAR(F.conv_bn(self.conv1, self.bn1, {relu = true}), layers, F.linear_bn(self.fc, nil, {relu = false}))
end

M.ResNetCIFAR, M.FusedResNetCIFAR = ResNetCIFAR, FusedResNetCIFAR

M.register("resnet18_cifar", {
  options = {width = "integer", num_classes = "integer"},
  description = "torchvision-style ResNet-18 for 32x32 images (3x3 stem, no max-pool); width from conv1.weight "
             .. "(default 64), num_classes from fc.weight, blocks per stage from the keys ({2,2,2,2})",
  build = function(sd, opts)
    opts = opts or {}
    local width, classes = opts.width or 64, opts.num_classes or 10
    if sd["conv1.weight"] ~= nil then width = need(sd, "conv1.weight", 4, "resnet18_cifar"):size(1) end
    if sd["fc.weight"] ~= nil then
      local fc = need(sd, "fc.weight", 2, "resnet18_cifar")
      classes = fc:size(1)
      if fc:size(2) ~= 8 * width then
        fail("resnet18_cifar: fc.weight %s takes %d features but conv1.weight gives width %d (8 * width = %d)",
             shape_str(fc), fc:size(2), width, 8 * width)
      end
    end
    local layers = {}
    for k = 1, 4 do
      local n = count_indexed(sd, "layer" .. k .. ".%d.conv1.weight")
      layers[k] = n > 0 and n or 2
    end
    return ResNetCIFAR({width = width, num_classes = classes, layers = layers})
  end,
  input_example = function() return nd.randn({2, 3, 32, 32}) end,
})

-- lstm_lm ---------------------------------------------------------------------------

M.register("lstm_lm", {
  mapping = "lstm_lm",
  options = {seq_model = "string"},
  description = "PyTorch word_language_model RNNModel (LSTM) -> nd.nn.models.LanguageModel; "
             .. "vocab, embedding, hidden size and layers from the weights; forward(ids (T, B), 1-based)",
  build = function(sd, opts)
    local emb = need(sd, "embedding.weight", 2, "lstm_lm")
    local whh = need(sd, "rnn.weight_hh_l0", 2, "lstm_lm")
    local layers = count_indexed(sd, "rnn.weight_ih_l%d")
    local hidden = whh:size(2)
    local seq = "lstm"
    if whh:size(1) == 3 * hidden then seq = "gru" elseif whh:size(1) == hidden then seq = "rnn" end
    if opts and opts.seq_model then seq = opts.seq_model end
    return nd.nn.LanguageModel(emb:size(1), {embedding_size = emb:size(2), hidden_size = hidden,
                                                    num_layers = layers, seq_model = seq})
  end,
  input_example = function(model)
    return nd.randint(1, model.vocab, {7, 2}, {dtype = "int64"})
  end,
})

-- transformer_classifier ------------------------------------------------------------

-- TransformerClassifier(vocab, d, nhead, {dim_feedforward=, num_layers=, max_len=,
--   num_classes=, norm_first=false, activation="relu"}): token + learned position
-- embeddings, a PyTorch TransformerEncoder (batch_first, dropout 0), the mean
-- over positions, a Linear classifier. forward(ids (B, T) int64, 1-based).
local TransformerClassifier = Module:extend("TransformerClassifier")

function TransformerClassifier:init(vocab, d, nhead, opts)
  local nn = nd.nn
  opts = options.check("nn.models.TransformerClassifier", opts, {dim_feedforward = "integer", num_layers = "integer",
    max_len = "integer", num_classes = "integer", norm_first = "boolean", activation = "string|function|module"})
  self.vocab, self.d_model, self.nhead = vocab, d, nhead
  self.max_len, self.num_classes = opts.max_len or 512, opts.num_classes or 2
  self.embedding = nn.Embedding(vocab, d)
  self.pos_embedding = nn.Embedding(self.max_len, d)
  local layer = nn.TransformerEncoderLayer(d, nhead, {dim_feedforward = opts.dim_feedforward or 4 * d, dropout = 0,
    batch_first = true, norm_first = opts.norm_first or false, activation = opts.activation or "relu"})
  self.encoder = nn.TransformerEncoder(layer, opts.num_layers or 1)
  self.classifier = nn.Linear(d, self.num_classes)
end

function TransformerClassifier:forward(ids, opts)
  if not nd.is_tensor(ids) or ids:dim() ~= 2 then
    error(("needle.convert.TransformerClassifier: expected token ids of shape (B, T), got %s"):format(
      nd.is_tensor(ids) and shape_str(ids) or type(ids)), 2)
  end
  local T = ids:size(2)
  if T > self.max_len then
    error(("needle.convert.TransformerClassifier: sequence length %d exceeds max_len %d"):format(T, self.max_len), 2)
  end
  local x = self.embedding(ids) + self.pos_embedding(nd.arange(1, T + 1, {dtype = "int64", device = ids.device}))
  x = self.encoder(x, opts)
  return self.classifier(x:mean(2))
end

function TransformerClassifier:extra_repr()
  return ("vocab=%d, d_model=%d, nhead=%d, max_len=%d, num_classes=%d"):format(
    self.vocab, self.d_model, self.nhead, self.max_len, self.num_classes)
end

M.TransformerClassifier = TransformerClassifier

M.register("transformer_classifier", {
  options = {nhead = "integer", norm_first = "boolean", activation = "string|function|module"},
  description = "Embedding + learned positions + PyTorch TransformerEncoder (batch_first) + mean + Linear; "
             .. "sizes from the weights, nhead from opts (default 4: the weights do not hold it)",
  build = function(sd, opts)
    opts = opts or {}
    local name = "transformer_classifier"
    local emb = need(sd, "embedding.weight", 2, name)
    local pos = need(sd, "pos_embedding.weight", 2, name)
    local l1 = need(sd, "encoder.layers.0.linear1.weight", 2, name)
    local cls = need(sd, "classifier.weight", 2, name)
    local d = emb:size(2)
    local nhead = opts.nhead or 4
    if math.type(nhead) ~= "integer" or nhead < 1 or d % nhead ~= 0 then
      fail("%s: nhead must be a positive integer dividing d_model %d, got %s", name, d, tostring(nhead))
    end
    return TransformerClassifier(emb:size(1), d, nhead, {
      dim_feedforward = l1:size(1), num_layers = count_indexed(sd, "encoder.layers.%d.linear1.weight"),
      max_len = pos:size(1), num_classes = cls:size(1), norm_first = opts.norm_first,
      activation = opts.activation})
  end,
  input_example = function(model)
    return nd.randint(1, model.vocab, {2, math.min(10, model.max_len)}, {dtype = "int64"})
  end,
})

require("needle.zoo.register_vision").register(M) -- torchvision's ResNets and MobileNetV2 (needle.zoo.vision)
require("needle.zoo.register_bert").register(M) -- Hugging Face BERT and DistilBERT (needle.zoo.bert)
require("needle.zoo.register_gpt2").register(M) -- Hugging Face GPT-2 (needle.zoo.gpt2)

return M
