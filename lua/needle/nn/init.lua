-- needle.nn: modules, one file per family, loaded on first use.
--
--   local nn = nd.nn
--   local model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
local Module = require "needle.nn.module"

local nn = {Module = Module, Parameter = Module.Parameter}

-- class name -> the file (family) that defines it
local families = {
  ["needle.nn.linear"] = {"Identity", "Linear", "Flatten", "Unflatten"},
  ["needle.nn.activation"] = {"ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax",
                              "LogSoftmax", "ELU", "Softplus", "Mish", "Hardswish", "Hardsigmoid", "ReLU6",
                              "Hardtanh", "PReLU"},
  ["needle.nn.container"] = {"Sequential", "ModuleList", "Residual", "ModuleDict", "ParameterList", "ParameterDict"},
  ["needle.nn.dropout"] = {"Dropout", "Dropout2d"},
  ["needle.nn.conv_nd"] = {"Conv1d", "Conv3d", "ConvTranspose1d", "MaxPool1d", "AvgPool1d", "AdaptiveMaxPool2d"},
  ["needle.nn.norm_sample"] = {"GroupNorm", "InstanceNorm2d", "RMSNorm"},
  ["needle.nn.upsample"] = {"Upsample", "PixelShuffle", "PixelUnshuffle"},
  ["needle.nn.norm"] = {"BatchNorm1d", "BatchNorm2d", "LayerNorm", "LayerNorm1d"},
  ["needle.nn.embedding"] = {"Embedding"},
  ["needle.nn.conv"] = {"Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"},
  ["needle.nn.rnn"] = {"RNNCell", "RNN", "LSTMCell", "LSTM", "GRUCell", "GRU"},
  ["needle.nn.transformer"] = {"MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
                               "Transformer"},
  ["needle.nn.transformer_decoder"] = {"TransformerDecoderLayer", "TransformerDecoder"},
  ["needle.nn.loss"] = {"CrossEntropyLoss", "SoftmaxLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss",
                        "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "KLDivLoss", "MarginRankingLoss",
                        "CosineEmbeddingLoss", "TripletMarginLoss", "CTCLoss"},
  ["needle.nn.models"] = {"LanguageModel", "ResNet9", "MLP"},
  ["needle.nn.fuse"] = {"fuse", "FusedConv2d", "FusedLinear"},
  ["needle.nn.sync_batchnorm"] = {"SyncBatchNorm"},
}
-- submodules that are whole files: nd.nn.init, nd.nn.utils, nd.nn.models
local whole = {init = "needle.nn.initializers", utils = "needle.nn.utils", models = "needle.nn.models",
               parallel = "needle.nn.parallel"}
local entries = {}
for k, file in pairs(whole) do entries[k] = file end
for file, names in pairs(families) do
  local entry = {file}
  for _, name in ipairs(names) do entries[name] = entry end
end

-- pairs(nd.nn) walks every name, loading what is not loaded yet
return require("needle.lazy")(nn, entries, {who = "nn", walk = true})
