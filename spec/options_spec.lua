-- options_spec.lua - every options table (PyTorch's keyword arguments)
-- rejects a misspelt key, naming the valid ones in sorted order, and a value
-- of the wrong type for a known key (issue 15). One table per area lists
-- every public function that takes options; the nn table is checked against
-- nd.nn itself, so a new module cannot skip the check.
--
--   build/needle-lua spec/run.lua spec/options_spec.lua

local nd = require "needle"

local A = require("spec.helpers.assertions").bind(assert)
local S = require "spec.helpers.shell"
local errmsg, assert_contains = A.errmsg, A.assert_contains

-- fn(opts) must raise "needle.<who>: unknown option '<bad>' (valid: <valid>)"
-- for opts = {[bad] = 1} and accept an empty table
local function rejects(who, valid, fn, bad)
  bad = bad or "bogus"
  local msg = errmsg(fn, {[bad] = 1})
  assert_contains(msg, ("needle.%s: unknown option '%s' (%s)"):format(who, bad,
    valid == "" and "it takes no options" or "valid: " .. valid))
  local ok, e = pcall(fn, {})
  assert(ok, ("%s rejects an empty options table: %s"):format(who, tostring(e)))
end

-- C functions --------------------------------------------------------------------

describe("the C functions' options", function()
  local NEW = "device, dtype, requires_grad"
  local x = nd.zeros({2, 2})
  local img, w = nd.zeros({1, 1, 4, 4}), nd.zeros({1, 1, 3, 3})
  local cases = {
    {"tensor", NEW, function(o) return nd.tensor({1, 2}, o) end},
    {"tensor", NEW, function(o) return nd.tensor(x, o) end},
    {"zeros", NEW, function(o) return nd.zeros({2}, o) end},
    {"zeros", NEW, function(o) return nd.zeros(2, 3, o) end},
    {"ones", NEW, function(o) return nd.ones({2}, o) end},
    {"empty", NEW, function(o) return nd.empty({2}, o) end},
    {"full", NEW, function(o) return nd.full({2}, 7, o) end},
    {"rand", NEW, function(o) return nd.rand({2}, o) end},
    {"randn", NEW, function(o) return nd.randn({2}, o) end},
    {"randint", NEW, function(o) return nd.randint(1, 5, {2}, o) end},
    {"zeros_like", NEW, function(o) return nd.zeros_like(x, o) end},
    {"ones_like", NEW, function(o) return nd.ones_like(x, o) end},
    {"full_like", NEW, function(o) return nd.full_like(x, 3, o) end},
    {"rand_like", NEW, function(o) return nd.rand_like(x, o) end},
    {"randn_like", NEW, function(o) return nd.randn_like(x, o) end},
    {"arange", NEW, function(o) return nd.arange(4, o) end},
    {"arange", NEW, function(o) return nd.arange(1, 4, 2, o) end},
    {"linspace", NEW, function(o) return nd.linspace(0, 1, 3, o) end},
    {"eye", NEW, function(o) return nd.eye(2, o) end},
    {"eye", NEW, function(o) return nd.eye(2, 3, o) end},
    {"to", "device, dtype", function(o) return x:to(o) end},
    {"backward", "create_graph, retain_graph", function(o)
      local p = nd.tensor({1, 2}, {requires_grad = true})
      return (p * p):sum():backward(next(o) and o or nil)
    end},
    {"grad", "allow_unused, create_graph, grad_outputs, retain_graph", function(o)
      local p = nd.tensor({1, 2}, {requires_grad = true})
      return nd.grad((p * p):sum(), p, o)
    end},
    {"conv2d", "dilation, groups, padding, stride", function(o) return nd.conv2d(img, w, nil, o) end},
    {"conv2d", "dilation, groups, padding, stride", function(o) return nd.F.conv2d(img, w, o) end},
    {"conv_transpose2d", "dilation, groups, output_padding, padding, stride",
     function(o) return nd.conv_transpose2d(img, w, nil, o) end},
    {"max_pool2d", "ceil_mode, dilation, padding, return_indices, stride",
     function(o) return nd.max_pool2d(img, 2, o) end},
    {"avg_pool2d", "ceil_mode, count_include_pad, padding, stride", function(o) return nd.avg_pool2d(img, 2, o) end},
    {"fused_conv2d", "activation, dilation, groups, padding, stride",
     function(o) return nd.fused_conv2d(img, w, nil, o) end},
    {"fused_linear", "activation", function(o) return nd.fused_linear(x, x, nil, o) end},
    {"sum", "dim, keepdim", function(o) return x:sum(o) end},
    {"mean", "dim, keepdim", function(o) return x:mean(1, o) end},
    {"max", "dim, keepdim", function(o) return x:max(o) end},
    {"argmax", "dim, keepdim", function(o) return x:argmax(o) end},
    {"logsumexp", "dim, keepdim", function(o) return x:logsumexp(o) end},
    {"var", "correction, dim, keepdim, unbiased", function(o) return x:var(o) end},
    {"std", "correction, dim, keepdim, unbiased", function(o) return x:std(1, true, o) end},
    {"clamp", "max, min", function(o) return x:clamp(o) end},
    {"sort", "descending, dim", function(o) return x:sort(o) end},
    {"cross_entropy", "ignore_index, label_smoothing, reduction",
     function(o) return nd.cross_entropy(x, {1, 2}, o) end},
  }

  it("reject an unknown key, naming the valid ones sorted", function()
    for _, c in ipairs(cases) do rejects(c[1], c[2], c[3]) end
  end)

  it("the issue's example: nd.tensor(t, {dtyp = ...}) is an error, not float32", function()
    assert_contains(errmsg(nd.tensor, {1, 2}, {dtyp = "float64"}),
                    "needle.tensor: unknown option 'dtyp' (valid: device, dtype, requires_grad)")
    assert.are.equal("float64", nd.tensor({1, 2}, {dtype = "float64"}).dtype)
  end)

  it("report the first unknown key in sorted order, list entries first", function()
    for _ = 1, 5 do
      assert_contains(errmsg(nd.zeros, {2}, {zz = 1, bb = 2, dtype = "float32", yy = 3}), "unknown option 'bb'")
    end
    assert_contains(errmsg(nd.zeros, {2}, {"float64", zz = 1}), "needle.zeros: unknown option [1] (valid: ")
  end)

  it("reject a value of the wrong type for a known key", function()
    assert_contains(errmsg(nd.zeros, {2}, {requires_grad = "yes"}),
                    "needle.zeros: option 'requires_grad' must be a boolean, got string")
    assert_contains(errmsg(nd.tensor, {1}, {requires_grad = 1}),
                    "needle.tensor: option 'requires_grad' must be a boolean, got number")
    assert_contains(errmsg(nd.zeros, {2}, {dtype = 64}), "needle.zeros: dtype must be a string, got number")
    assert_contains(errmsg(nd.ones, {2}, {device = true}), "needle.ones: device must be a string")
    assert_contains(errmsg(nd.max_pool2d, img, 2, {ceil_mode = 1}),
                    "needle.max_pool2d: option 'ceil_mode' must be a boolean, got number")
    assert_contains(errmsg(nd.avg_pool2d, img, 2, {count_include_pad = "no"}),
                    "needle.avg_pool2d: option 'count_include_pad' must be a boolean, got string")
    local p = nd.tensor({1, 2}, {requires_grad = true})
    assert_contains(errmsg(nd.grad, (p * p):sum(), p, {create_graph = "yes"}),
                    "needle.grad: option 'create_graph' must be a boolean, got string")
  end)

  it("reject options that are not a table", function()
    assert_contains(errmsg(nd.tensor, {1}, "float64"), "needle.tensor: expected an options table as argument 2, got string")
    assert_contains(errmsg(nd.zeros_like, x, "float64"), "needle.zeros_like: expected an options table as argument 2")
    assert_contains(errmsg(nd.linspace, 0, 1, 3, true), "needle.linspace: expected an options table as argument 4")
  end)

  it("nd.opencl.tune checks its keys before it does anything", function()
    local ok = nd.opencl.available()
    if not ok then return end
    rejects("opencl_tune", "budget_s, device, forget, layouts, query, save, sizes, verbose",
            function(o) if next(o) == nil then return end return nd.opencl.tune(o) end)
    assert_contains(errmsg(nd.opencl.tune, {query = "yes"}), "option 'query' must be a boolean, got string")
  end)
end)

-- Cases kept beside the area that added them: each spec/options/<area>.lua
-- returns function(nd) -> {nn = {...}, nn_none = {...}, F = {...},
-- F_none = {...}, rest = {...}} in the formats of NN, NN_NONE, nd.F's CASES and
-- NONE, and the rest's CASES below. Merged here, so the completeness checks see
-- them; a name listed twice is an error.
local AREAS = {}
do
  local f = assert(io.popen("ls spec/options/*.lua 2>/dev/null"))
  for path in f:lines() do
    AREAS[#AREAS + 1] = assert(loadfile(path))()(nd)
  end
  f:close()
end
local function merge(into, key)
  for _, area in ipairs(AREAS) do
    for k, v in pairs(area[key] or {}) do
      if type(k) == "number" then
        into[#into + 1] = v
      else
        assert(into[k] == nil, ("options_spec: %s.%s is listed twice"):format(key, k))
        into[k] = v
      end
    end
  end
  return into
end

-- nn ---------------------------------------------------------------------------

local nn = nd.nn
local FACT = "device, dtype"

-- every public name of nd.nn: how to call it with an options table, and the
-- valid keys; or why it takes none
local NN = {
  Linear = {"bias, device, dtype", function(o) return nn.Linear(2, 3, o) end},
  Flatten = {"end_dim, start_dim", function(o) return nn.Flatten(o) end},
  ReLU = {"inplace", function(o) return nn.ReLU(o) end},
  Tanh = {"", function(o) return nn.Tanh(o) end},
  Sigmoid = {"", function(o) return nn.Sigmoid(o) end},
  SiLU = {"inplace", function(o) return nn.SiLU(o) end},
  Mish = {"inplace", function(o) return nn.Mish(o) end},
  Hardswish = {"inplace", function(o) return nn.Hardswish(o) end},
  Hardsigmoid = {"inplace", function(o) return nn.Hardsigmoid(o) end},
  ReLU6 = {"inplace", function(o) return nn.ReLU6(o) end},
  ELU = {"alpha, inplace", function(o) return nn.ELU(o) end},
  Softplus = {"beta, threshold", function(o) return nn.Softplus(o) end},
  Hardtanh = {"inplace, max_val, min_val", function(o) return nn.Hardtanh(o) end},
  PReLU = {"device, dtype, init, num_parameters", function(o) return nn.PReLU(o) end},
  LeakyReLU = {"inplace, negative_slope", function(o) return nn.LeakyReLU(o) end},
  GELU = {"approximate", function(o) return nn.GELU(o) end},
  Softmax = {"dim", function(o) return nn.Softmax(o) end},
  LogSoftmax = {"dim", function(o) return nn.LogSoftmax(o) end},
  Dropout = {"inplace, p", function(o) return nn.Dropout(o) end},
  BatchNorm1d = {"affine, device, dtype, eps, momentum, track_running_stats", function(o) return nn.BatchNorm1d(3, o) end},
  BatchNorm2d = {"affine, device, dtype, eps, momentum, track_running_stats", function(o) return nn.BatchNorm2d(3, o) end},
  SyncBatchNorm = {"affine, device, dtype, eps, momentum, track_running_stats", function(o) return nn.SyncBatchNorm(3, o) end},
  LayerNorm = {"bias, device, dtype, elementwise_affine, eps", function(o) return nn.LayerNorm(3, o) end},
  LayerNorm1d = {"bias, device, dtype, elementwise_affine, eps", function(o) return nn.LayerNorm1d(3, o) end},
  Embedding = {"device, dtype, padding_idx", function(o) return nn.Embedding(5, 3, o) end},
  Conv2d = {"bias, device, dilation, dtype, groups, padding, padding_mode, stride",
            function(o) return nn.Conv2d(1, 2, 3, o) end},
  ConvTranspose2d = {"bias, device, dilation, dtype, groups, output_padding, padding, padding_mode, stride",
                     function(o) return nn.ConvTranspose2d(1, 2, 3, o) end},
  MaxPool2d = {"ceil_mode, dilation, padding, return_indices, stride", function(o) return nn.MaxPool2d(2, o) end},
  AvgPool2d = {"ceil_mode, count_include_pad, padding, stride", function(o) return nn.AvgPool2d(2, o) end},
  RNNCell = {"bias, device, dtype, nonlinearity", function(o) return nn.RNNCell(2, 3, o) end},
  LSTMCell = {"bias, device, dtype", function(o) return nn.LSTMCell(2, 3, o) end},
  GRUCell = {"bias, device, dtype", function(o) return nn.GRUCell(2, 3, o) end},
  RNN = {"batch_first, bias, bidirectional, device, dropout, dtype, nonlinearity, num_layers",
         function(o) return nn.RNN(2, 3, o) end},
  LSTM = {"batch_first, bias, bidirectional, device, dropout, dtype, num_layers", function(o) return nn.LSTM(2, 3, o) end},
  GRU = {"batch_first, bias, bidirectional, device, dropout, dtype, num_layers", function(o) return nn.GRU(2, 3, o) end},
  MultiheadAttention = {"add_bias_kv, add_zero_attn, batch_first, bias, device, dropout, dtype, kdim, vdim",
                        function(o) return nn.MultiheadAttention(4, 2, o) end},
  TransformerEncoderLayer = {"activation, batch_first, bias, device, dim_feedforward, dropout, dtype, layer_norm_eps, " ..
                             "norm_first", function(o) return nn.TransformerEncoderLayer(4, 2, o) end},
  TransformerEncoder = {"norm", function(o)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, {dim_feedforward = 8}), 2, o)
  end},
  Transformer = {"activation, batch_first, causal, device, dim_head, dropout, dtype, num_head, sequence_len",
                 function(o) return nn.Transformer(8, 16, 1, o) end},
  CrossEntropyLoss = {"ignore_index, label_smoothing, reduction", function(o) return nn.CrossEntropyLoss(o) end},
  SoftmaxLoss = {"ignore_index, label_smoothing, reduction", function(o) return nn.SoftmaxLoss(o) end},
  NLLLoss = {"ignore_index, reduction", function(o) return nn.NLLLoss(o) end},
  MSELoss = {"reduction", function(o) return nn.MSELoss(o) end},
  BCEWithLogitsLoss = {"pos_weight, reduction", function(o) return nn.BCEWithLogitsLoss(o) end},
  L1Loss = {"reduction", function(o) return nn.L1Loss(o) end},
  SmoothL1Loss = {"beta, reduction", function(o) return nn.SmoothL1Loss(o) end},
  HuberLoss = {"delta, reduction", function(o) return nn.HuberLoss(o) end},
  BCELoss = {"reduction, weight", function(o) return nn.BCELoss(o) end},
  KLDivLoss = {"log_target, reduction", function(o) return nn.KLDivLoss(o) end},
  MarginRankingLoss = {"margin, reduction", function(o) return nn.MarginRankingLoss(o) end},
  CosineEmbeddingLoss = {"margin, reduction", function(o) return nn.CosineEmbeddingLoss(o) end},
  TripletMarginLoss = {"eps, margin, p, reduction, swap", function(o) return nn.TripletMarginLoss(o) end},
  LanguageModel = {"dropout, embedding_size, hidden_size, num_layers, seq_model, tie_weights",
                   function(o) return nn.LanguageModel(10, o) end},
  ResNet9 = {"device, dtype, num_classes", function(o) return nn.ResNet9(o) end},
  MLP = {"activation, dropout", function(o) return nn.MLP({2, 3, 1}, o) end, "nn.models.MLP"},
  fuse = {"requires_grad", function(o) return nn.fuse(nn.Sequential(nn.Linear(2, 2)), o) end},
  FusedConv2d = {"activation, bias, device, dilation, dtype, groups, padding, stride",
                 function(o) return nn.FusedConv2d(1, 2, 3, o) end},
  FusedLinear = {"activation, bias, device, dtype, folded_batch_norm", function(o) return nn.FusedLinear(2, 3, o) end},
}

-- the names of nd.nn without an options table, and why
local NN_NONE = {
  Module = "the base class", Parameter = "a function of a tensor",
  init = "a table: its functions are in INIT below", utils = "a table: see clip_grad_norm_ below",
  models = "a table: its models are in MODELS below",
  parallel = "a table: DistributedDataParallel is in the CASES below",
  Identity = "ignores its arguments, as PyTorch's", Sequential = "takes modules", ModuleList = "takes modules",
  Residual = "takes a module", Unflatten = "takes a dim and sizes", AdaptiveAvgPool2d = "takes an output size",
}

merge(NN, "nn")
merge(NN_NONE, "nn_none")

describe("nn constructors", function()
  it("list every public name of nd.nn (a new module must be added above)", function()
    local seen = 0
    for name in pairs(nn) do
      assert(NN[name] or NN_NONE[name], ("nd.nn.%s is in neither NN nor NN_NONE of options_spec.lua"):format(name))
      seen = seen + 1
    end
    assert.is_true(seen >= 50)
    for name in pairs(NN) do assert.is_not_nil(nn[name], name) end
  end)

  it("reject an unknown option, naming the module and the valid keys sorted", function()
    for name, c in pairs(NN) do rejects(c[3] or ("nn." .. name), c[1], c[2]) end
  end)

  it("the issue's examples are errors, not silently different modules", function()
    assert_contains(errmsg(nn.Linear, 2, 2, {biass = false}),
                    "needle.nn.Linear: unknown option 'biass' (valid: bias, device, dtype)")
    assert_contains(errmsg(nn.Conv2d, 1, 16, 3, {pading = 1}), "needle.nn.Conv2d: unknown option 'pading' (valid: ")
    assert_contains(errmsg(nn.LSTM, 2, 3, {num_layer = 2}), "needle.nn.LSTM: unknown option 'num_layer' (valid: ")
    -- and the spelling PyTorch uses does what it says
    assert.is_nil(nn.Linear(2, 2, {bias = false}).bias)
    assert.are.same({1, 1}, nn.Conv2d(1, 16, 3, {padding = 1}).padding)
    assert.are.equal(2, nn.LSTM(2, 3, {num_layers = 2}).num_layers)
  end)

  it("accept PyTorch's inplace where PyTorch has it, also after a positional argument", function()
    local x = nd.tensor({-1, 2})
    -- (these compute a new tensor whatever inplace says)
    for _, m in ipairs({nn.SiLU({inplace = false}), nn.LeakyReLU(0.5, {inplace = true}),
                        nn.LeakyReLU({negative_slope = 0.5, inplace = true}), nn.Dropout(0, {inplace = true}),
                        nn.ReLU({inplace = false})}) do
      local y = m(x)
      assert.are.same({-1, 2}, x:totable()) -- the input is left as it was
      assert.are.equal(2, #y:totable())
    end
    -- ReLU writes into an input that autograd does not need, as PyTorch's does
    local y = nn.ReLU({inplace = true})(x)
    assert.is_true(rawequal(x, y))
    assert.are.same({0, 2}, x:totable())
    assert.are.equal("ReLU(inplace=true)", tostring(nn.ReLU({inplace = true})))
    assert_contains(errmsg(nn.Dropout, 0.5, {inplce = true}), "needle.nn.Dropout: unknown option 'inplce' (valid: inplace)")
    assert_contains(errmsg(nn.LeakyReLU, 0.1, {slope = 1}), "needle.nn.LeakyReLU: unknown option 'slope' (valid: inplace)")
    assert_contains(errmsg(nn.Dropout, {p = 0.1}, {}), "needle.nn.Dropout: options given twice")
    assert_contains(errmsg(nn.Tanh, {inplace = true}), "needle.nn.Tanh: unknown option 'inplace' (it takes no options)")
  end)

  it("take an integral float where an integer belongs, as the integer, leaving the caller's table", function()
    local o = {num_layers = 4 / 2}
    local m = nn.LSTM(2, 3, o)
    assert.are.equal("integer", math.type(m.num_layers))
    assert.are.equal("float", math.type(o.num_layers))
    assert.is_not_nil(m.weight_ih_l1)
    assert.are.equal("LSTM(2, 3, num_layers=2)", tostring(m))
    local checked = require("needle.options").check("t", {n = 3.0, x = 1.5}, {n = "integer|table", x = "number"})
    assert.are.equal("integer", math.type(checked.n))
    assert.are.equal(1.5, checked.x)
    assert_contains(errmsg(nn.LSTM, 2, 3, {num_layers = "2"}), "option 'num_layers' must be an integer, got \"2\"")
  end)

  it("reject a value of the wrong type for a known option", function()
    assert_contains(errmsg(nn.Linear, 2, 2, {bias = 0}), "needle.nn.Linear: option 'bias' must be a boolean, got 0")
    assert_contains(errmsg(nn.LSTM, 2, 3, {num_layers = 1.5}),
                    "needle.nn.LSTM: option 'num_layers' must be an integer, got 1.5")
    assert_contains(errmsg(nn.Conv2d, 1, 2, 3, {padding = true}),
                    "needle.nn.Conv2d: option 'padding' must be an integer, a table or a string, got true")
    assert_contains(errmsg(nn.BatchNorm2d, 3, {momentum = "0.1"}),
                    "needle.nn.BatchNorm2d: option 'momentum' must be a number or a boolean, got \"0.1\"")
    assert_contains(errmsg(nn.Linear, 2, 2, {dtype = "int64"}),
                    "needle.nn.Linear: dtype must be a floating-point dtype (float32, float64, float16 or bfloat16)")
    assert_contains(errmsg(nn.Linear, 2, 2, {device = "gpu"}), "needle.nn.Linear: cannot use device 'gpu'")
    assert_contains(errmsg(nn.Linear, 2, 2, "float64"), "needle.nn.Linear: expected an options table, got \"float64\"")
  end)

  it("take PyTorch's factory keywords dtype and device", function()
    local m = nn.LSTM(2, 3, {dtype = "float64", device = "cpu"})
    for _, p in ipairs(m:parameters()) do assert.are.equal("float64", p.dtype) end
    assert.are.equal("float64", nn.GRUCell(2, 3, {dtype = "float64"}).weight_hh.dtype)
    for _, dev in ipairs(require("spec.helpers.devices").opencl()) do
      local l = nn.Linear(2, 3, {device = dev})
      assert.are.equal(dev, l.weight.device)
      assert.are.equal(dev, l.bias.device)
    end
  end)

  it("module methods and forward options are checked too", function()
    local m = nn.Linear(2, 2)
    assert_contains(errmsg(m.load_state_dict, m, m:state_dict(), {stict = false}),
                    "needle.nn.Linear.load_state_dict: unknown option 'stict' (valid: strict)")
    assert_contains(errmsg(m.to, m, {dtpye = "float64"}), "needle.nn.Linear.to: unknown option 'dtpye' (valid: device, dtype)")
    local mha, x = nn.MultiheadAttention(4, 2), nd.randn({3, 1, 4})
    assert_contains(errmsg(mha, x, x, x, {need_weight = false}),
                    "needle.nn.MultiheadAttention(4, 2): unknown option 'need_weight' (valid: attn_mask, " ..
                    "average_attn_weights, is_causal, key_padding_mask, need_weights)")
    local layer = nn.TransformerEncoderLayer(4, 2, {dim_feedforward = 8})
    assert_contains(errmsg(layer, x, {causal = true}), "needle.nn.TransformerEncoderLayer(4, 2): unknown option 'causal'")
    assert_contains(errmsg(nn.TransformerEncoder(layer, 1), x, {causal = true}),
                    "needle.nn.TransformerEncoder: unknown option 'causal'")
    assert_contains(errmsg(nn.Transformer.generate_square_subsequent_mask, 3, {dtyp = "float64"}),
                    "needle.nn.Transformer.generate_square_subsequent_mask: unknown option 'dtyp'")
    local p = nd.tensor({1.0}, {requires_grad = true})
    p.grad = nd.tensor({5.0})
    assert_contains(errmsg(nn.utils.clip_grad_norm_, {p}, 1.0, 2, {error_if_nonfinit = true}),
                    "needle.nn.utils.clip_grad_norm_: unknown option 'error_if_nonfinit' (valid: error_if_nonfinite)")
  end)
end)

-- nd.nn.models (the names that are not also in nd.nn) and nn.init
local MODELS = {
  ConvBN = {"device, dtype", function(o) return nn.models.ConvBN(1, 2, 3, 1, o) end, "nn.ConvBN"},
  ResNetCIFAR = {"layers, num_classes, width", function(o)
    o.width, o.layers = 2, {1, 1, 1, 1} -- small: the default is ResNet-18
    return nn.models.ResNetCIFAR(o)
  end},
  TransformerClassifier = {"activation, dim_feedforward, max_len, norm_first, num_classes, num_layers",
                           function(o) return nn.models.TransformerClassifier(10, 4, 2, o) end},
}
local MODELS_NONE = {BasicBlock = "takes sizes", FusedBasicBlock = "built by nn.fuse",
                     FusedResNetCIFAR = "built by nn.fuse"}
-- (an area file's models / models_none tables, in the formats of MODELS and MODELS_NONE)
merge(MODELS, "models")
merge(MODELS_NONE, "models_none")

describe("nn.models and nn.init", function()
  it("models reject unknown options", function()
    for name, c in pairs(MODELS) do rejects(c[3] or ("nn.models." .. name), c[1], c[2]) end
    for name, v in pairs(nn.models) do
      if type(v) == "table" or type(v) == "function" then
        assert(NN[name] or MODELS[name] or MODELS_NONE[name], ("nd.nn.models.%s is not listed in options_spec.lua"):format(name))
      end
    end
  end)

  it("initialisers given an options table accept only their own names", function()
    local INIT = {
      uniform_ = "a, b", normal_ = "mean, std", constant_ = "val", xavier_uniform_ = "gain", xavier_normal_ = "gain",
      kaiming_uniform_ = "a, gain, mode, nonlinearity", kaiming_normal_ = "a, gain, mode, nonlinearity",
      orthogonal_ = "gain",
    }
    for name, valid in pairs(INIT) do
      local w = nd.empty({3, 4})
      local o = name == "constant_" and {val = 1} or {}
      assert_contains(errmsg(nn.init[name], w, {bogus = 1}), ("needle.nn.init.%s: unknown option 'bogus' (valid: %s)")
        :format(name, valid))
      nn.init[name](w, o)
    end
    assert_contains(errmsg(nn.init.kaiming_uniform_, nd.empty({3, 4}), {mode = 1}),
                    "needle.nn.init.kaiming_uniform_: option 'mode' must be a string, got 1")
    -- every initialiser that takes keyword arguments is in the table
    for name, fn in pairs(nn.init) do
      if type(fn) == "function" and name:sub(-1) == "_" and name:sub(1, 1) ~= "_" and not INIT[name] then
        assert(name == "zeros_" or name == "ones_", "nn.init." .. name .. " is not listed in options_spec.lua")
      end
    end
  end)
end)

-- nd.F ---------------------------------------------------------------------------

describe("nd.F", function()
  local x = nd.randn({3, 4})
  local labels = nd.tensor({1, 2, 4}, {dtype = "int64"})
  local F = nd.F
  local CASES = {
    gelu = {"approximate", function(o) return F.gelu(x, o) end},
    softplus = {"beta, threshold", function(o) return F.softplus(x, o) end},
    mse_loss = {"reduction", function(o) return F.mse_loss(x, x, o) end},
    l1_loss = {"reduction", function(o) return F.l1_loss(x, x, o) end},
    smooth_l1_loss = {"beta, reduction", function(o) return F.smooth_l1_loss(x, x, o) end},
    huber_loss = {"delta, reduction", function(o) return F.huber_loss(x, x, o) end},
    binary_cross_entropy = {"reduction, weight", function(o) return F.binary_cross_entropy(x:sigmoid(), x:sigmoid(), o) end},
    kl_div = {"log_target, reduction", function(o) return F.kl_div(x, x, o) end},
    margin_ranking_loss = {"margin, reduction", function(o) return F.margin_ranking_loss(x, x, x:sign(), o) end},
    cosine_embedding_loss = {"margin, reduction", function(o) return F.cosine_embedding_loss(x, x, nd.ones({3}), o) end},
    triplet_margin_loss = {"eps, margin, p, reduction, swap", function(o) return F.triplet_margin_loss(x, x, x, o) end},
    pairwise_distance = {"eps, keepdim, p", function(o) return F.pairwise_distance(x, x, o) end},
    normalize = {"dim, eps, p", function(o) return F.normalize(x, o) end},
    cosine_similarity = {"dim, eps", function(o) return F.cosine_similarity(x, x, o) end},
    binary_cross_entropy_with_logits = {"reduction", function(o) return F.binary_cross_entropy_with_logits(x, x:sigmoid(), o) end},
    nll_loss = {"ignore_index, reduction", function(o) return F.nll_loss(F.log_softmax(x, 2), labels, o) end},
    cross_entropy = {"ignore_index, label_smoothing, reduction", function(o) return F.cross_entropy(x, labels, o) end},
    embedding = {"padding_idx", function(o) return F.embedding({1, 3}, x, o) end},
  }
  -- the C functions of nd.F are covered above; these take no options table
  local NONE = {relu = 1, sigmoid = 1, tanh = 1, leaky_relu = 1, elu = 1, silu = 1, softmax = 1, log_softmax = 1,
                mish = 1, hardswish = 1, hardsigmoid = 1, relu6 = 1, hardtanh = 1, prelu = 1,
                logsumexp = 1, linear = 1, dropout = 1, layer_norm = 1, batch_norm = 1, adaptive_avg_pool2d = 1,
                dilate = 1, undilate = 1, conv2d = 1, conv_transpose2d = 1, max_pool2d = 1, avg_pool2d = 1,
                fused_conv2d = 1, fused_linear = 1}

  merge(CASES, "F")
  merge(NONE, "F_none")

  it("functions with options reject unknown ones", function()
    for name, c in pairs(CASES) do rejects(name, c[1], c[2]) end
    for name in pairs(F) do
      assert(CASES[name] or NONE[name], ("nd.F.%s is not listed in options_spec.lua"):format(name))
    end
    assert_contains(errmsg(F.cross_entropy, x, labels, {reduction = 1}),
                    "needle.cross_entropy: option 'reduction' must be a string, got 1")
  end)
end)

-- optim, data, printing, profiling, convert ----------------------------------------

describe("the rest of the package", function()
  local W = nd.tensor({1.0, 2.0}, {requires_grad = true})
  local function opt() return nd.optim.SGD({W}, {lr = 0.1}) end
  local ds = nd.data.TensorDataset(nd.zeros({4, 2}))
  local CASES = {
    {"optim.SGD", "dampening, lr, maximize, momentum, nesterov, weight_decay", function(o) return nd.optim.SGD({W}, o) end},
    {"optim.Adam", "amsgrad, betas, eps, lr, maximize, weight_decay", function(o) return nd.optim.Adam({W}, o) end},
    {"optim.lr_scheduler.StepLR", "gamma, last_epoch, step_size",
     function(o) o.step_size = o.step_size or 2; return nd.optim.lr_scheduler.StepLR(opt(), o) end},
    {"data.DataLoader", "batch_sampler, batch_size, collate_fn, drop_last, num_workers, persistent_workers, " ..
     "prefetch_factor, sampler, seed, shuffle, timeout", function(o) return nd.data.DataLoader(ds, o) end},
    {"data.DistributedSampler", "drop_last, num_replicas, rank, seed, shuffle",
     function(o) return nd.data.DistributedSampler(10, o) end},
    {"distributed.init", "threads, timeout, world_size", function(o) return nd.distributed.init(o) end},
    {"distributed.all_reduce", "async, channel, check, op", function(o) return nd.distributed.all_reduce(nd.ones({2}), o) end},
    {"distributed.broadcast", "async, check, root", function(o) return nd.distributed.broadcast(nd.ones({2}), o) end},
    {"distributed.all_gather", "async, check", function(o) return nd.distributed.all_gather(nd.ones({2}), o) end},
    {"distributed.reduce_scatter", "async, check, op",
     function(o) return nd.distributed.reduce_scatter(nd.ones({2}), o) end},
    {"autograd.Function", "backward, forward, name, traceable", function(o)
      if next(o) == nil then return end -- needs both functions
      return nd.autograd.Function(o)
    end},
    {"data.TensorDataset", "target_transform, transform",
     function(o) return nd.data.TensorDataset(nd.zeros({2}), o) end},
    {"data.transforms.RandomCrop", "fill, padding", function(o) return nd.data.transforms.RandomCrop(2, o) end},
    {"data.ptb.Corpus", "max_lines", function(o)
      local dir = S.shell_line("mktemp -d")
      for _, f in ipairs({"train", "valid", "test"}) do S.write_file(dir .. "/" .. f .. ".txt", "a b\n") end
      local ok, e = pcall(nd.data.ptb.Corpus, dir, o)
      os.execute("rm -rf " .. S.q(dir))
      if not ok then error(e, 0) end
    end},
    {"data.cifar10.synthetic", "n, seed", function(o)
      if next(o) == nil then return end -- writes files
      return nd.data.cifar10.synthetic("/nonexistent", o)
    end},
    {"set_printoptions", "edgeitems, linewidth, precision, profile, sci_mode, threshold", function(o)
      local saved = nd.get_printoptions()
      nd.set_printoptions(o)
      nd.set_printoptions(saved)
    end},
    {"profile", "device_time, print, sort, trace", function(o) return nd.profile(function() end, o) end},
    {"nn.parallel.DistributedDataParallel", "broadcast_buffers, bucket_mb",
     function(o) return nn.parallel.DistributedDataParallel(nn.Linear(2, 2), o) end},
    {"convert.load_state_dict", "convert_dtype, mapping, strict",
     function(o) local m = nn.Linear(2, 2); return nd.convert.load_state_dict(m, m:state_dict(), o) end},
    {"convert.model('mlp')", "convert_dtype, mapping, strict",
     function(o) return nd.convert.model("mlp", nn.MLP({2, 3, 1}):state_dict(), o) end},
  }

  merge(CASES, "rest")

  it("reject unknown options, naming the valid ones sorted", function()
    for _, c in ipairs(CASES) do rejects(c[1], c[2], c[3]) end
  end)

  it("name the entry's own options for convert.model", function()
    assert_contains(errmsg(nd.convert.model, "lstm_lm", {}, {nheads = 2}),
                    "needle.convert.model('lstm_lm'): unknown option 'nheads' (valid: convert_dtype, mapping, seq_model, strict)")
  end)

  it("keep an optimizer's parameter-group check, with the valid keys", function()
    assert_contains(errmsg(nd.optim.SGD, {{params = {W}, lrr = 1}}),
                    "needle.optim.SGD: unknown option 'lrr' in a parameter group (valid: ")
  end)

  it("reject wrong types for known keys", function()
    assert_contains(errmsg(nd.data.DataLoader, ds, {shuffle = 1}),
                    "needle.data.DataLoader: option 'shuffle' must be a boolean, got 1")
    assert_contains(errmsg(nd.data.DataLoader, ds, {collate_fn = 3}),
                    "needle.data.DataLoader: option 'collate_fn' must be a callable or a table, got 3")
    assert_contains(errmsg(nd.profile, function() end, {print = "yes"}),
                    "needle.profile: option 'print' must be a boolean, got \"yes\"")
  end)
end)
