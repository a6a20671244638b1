-- needle.nn: modules, one file per family, loaded on first use.
--
--   local nn = nd.nn
--   local model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
local error = require("needle.errors").error -- positions at the user's line
local Module = require "needle.nn.module"

local nn = {Module = Module, Parameter = Module.Parameter}

-- class name -> the file (family) that defines it
local families = {
  ["needle.nn.linear"] = {"Identity", "Linear", "Flatten", "Unflatten"},
  ["needle.nn.activation"] = {"ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax",
                              "LogSoftmax"},
  ["needle.nn.container"] = {"Sequential", "ModuleList", "Residual"},
  ["needle.nn.dropout"] = {"Dropout"},
  ["needle.nn.norm"] = {"BatchNorm1d", "BatchNorm2d", "LayerNorm", "LayerNorm1d"},
  ["needle.nn.embedding"] = {"Embedding"},
  ["needle.nn.conv"] = {"Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"},
  ["needle.nn.rnn"] = {"RNNCell", "RNN", "LSTMCell", "LSTM", "GRUCell", "GRU"},
  ["needle.nn.transformer"] = {"MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
                               "Transformer"},
  ["needle.nn.loss"] = {"CrossEntropyLoss", "SoftmaxLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss"},
  ["needle.nn.models"] = {"LanguageModel", "ResNet9", "MLP"},
  ["needle.nn.fuse"] = {"fuse", "FusedConv2d", "FusedLinear"},
}
-- submodules that are whole files: nd.nn.init, nd.nn.utils, nd.nn.models
local whole = {init = "needle.nn.initializers", utils = "needle.nn.utils", models = "needle.nn.models"}
local lazy = {}
for k, file in pairs(whole) do lazy[k] = file end
for file, names in pairs(families) do
  for _, name in ipairs(names) do lazy[name] = file end
end

local function load(t, k)
  local file = lazy[k]
  if not file then return nil end
  local m = require(file)
  local v = m
  if whole[k] == nil then v = m[k] end
  if v == nil then error(("needle.nn: %s does not define %s"):format(file, k), 2) end
  rawset(t, k, v)
  return v
end

return setmetatable(nn, {
  __index = load,
  -- pairs(nd.nn) walks every name, loading what is not loaded yet
  __pairs = function(t)
    for k in pairs(lazy) do if rawget(t, k) == nil then load(t, k) end end
    return next, t, nil
  end,
})
