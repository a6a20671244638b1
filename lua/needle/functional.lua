-- needle.functional (nd.F): neural-network functions, as torch.nn.functional.
--
-- softmax and log_softmax are fused C kernels; the rest are compositions of
-- differentiable ops, so every function here has gradients (and gradients
-- of gradients). Keyword arguments go in a trailing options table with
-- PyTorch's names. Dims are 1-based; class labels are 1..C.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local capture = require "needle.compile.state"
local spatial_args = require "needle.functional.spatial_args"

local F = {}

local function opt(opts, name, default)
  if opts == nil or opts[name] == nil then return default end
  return opts[name]
end

-- errors raise at the caller of the public function: a public function
-- passes level 2, a helper one call deeper 3 (errors.fail_at counts levels as
-- error() does)
local fail_at = errors.fail_at
local function fail(op, fmt, ...) fail_at(4, op, fmt, ...) end -- fail, helper, public fn, caller

local function check_tensor(op, x, what)
  if not core.is_tensor(x) then fail_at(3, op, "%s must be a tensor, got %s", what or "input", type(x)) end
end

local got = options.got

-- (op, usage, first, ...): the arguments past a public function's last one
-- must be nil, else an error naming the accepted form
local no_extra = spatial_args.no_extra

local is_finite, check_finite = options.is_finite, options.finite

-- training (nil: the default) must be a boolean: a string or a number would
-- count as true
local function check_training(op, training, name)
  if training ~= nil and type(training) ~= "boolean" then
    errors.fail(op, "%s must be a boolean, got %s", name or "training", got(training))
  end
end

-- dim of x: 1..n or -n..-1 (n at least 1: a 0-dim tensor has dim 1 or -1)
local function check_dim(op, x, dim)
  local n = math.max(x:dim(), 1)
  if math.tointeger(dim) == nil or dim < -n or dim > n or dim == 0 then
    errors.fail(op, "dim %s out of range for a tensor with %d dims (expected 1..%d or -%d..-1)", got(dim),
                x:dim(), n, n)
  end
end

-- reduction = "mean" | "sum" | "none"
local function reduce(op, loss, reduction)
  if reduction == "mean" then return loss:mean() end
  if reduction == "sum" then return loss:sum() end
  if reduction == "none" then return loss end
  fail(op, "reduction must be 'mean', 'sum' or 'none', got %s", tostring(reduction))
end

-- activations -------------------------------------------------------------

function F.relu(x, ...)
  if select("#", ...) > 0 then no_extra("relu", "relu(x)", 2, ...) end
  return core.relu(x)
end
function F.sigmoid(x, ...)
  if select("#", ...) > 0 then no_extra("sigmoid", "sigmoid(x)", 2, ...) end
  return core.sigmoid(x)
end
function F.tanh(x, ...)
  if select("#", ...) > 0 then no_extra("tanh", "tanh(x)", 2, ...) end
  return core.tanh(x)
end

-- gelu(x, {approximate = "none" | "tanh"})
function F.gelu(x, opts, ...)
  check_tensor("gelu", x)
  no_extra("gelu", "gelu(x[, {approximate=}])", 3, ...)
  local approximate = opt(options.check("gelu", opts, {approximate = "string"}), "approximate", "none")
  if approximate == "tanh" then
    return core.gelu_tanh(x) -- one kernel (the registry's gelu_tanh), its backward too
  elseif approximate == "none" then
    return core.gelu(x) -- one kernel (the registry's gelu), its backward too
  end
  fail_at(2, "gelu", "approximate must be 'none' or 'tanh', got %s", tostring(approximate))
end

function F.leaky_relu(x, negative_slope, ...)
  check_tensor("leaky_relu", x)
  no_extra("leaky_relu", "leaky_relu(x[, negative_slope])", 3, ...)
  if negative_slope == nil then negative_slope = 0.01 end
  check_finite("leaky_relu", "negative_slope", negative_slope)
  return core.where(x:gt(0), x, x * negative_slope)
end

-- softplus(x, {beta = 1, threshold = 20}): linear above threshold, as PyTorch
function F.softplus(x, opts, ...)
  check_tensor("softplus", x)
  no_extra("softplus", "softplus(x[, {beta=, threshold=}])", 3, ...)
  opts = options.check("softplus", opts, {beta = "number", threshold = "number"})
  local beta, threshold = opt(opts, "beta", 1), opt(opts, "threshold", 20)
  if not is_finite(beta) or beta == 0 then
    errors.fail("softplus", "beta must be a finite number other than 0, got %s", got(beta))
  end
  if threshold ~= threshold then errors.fail("softplus", "threshold must be a number, got nan") end
  local bx = x * beta
  -- log(1 + exp(bx)) without overflow: max(bx, 0) + log(1 + exp(-|bx|))
  local stable = (bx:maximum(0) + ((-bx:abs()):exp() + 1):log()) / beta
  return core.where(bx:gt(threshold), x, stable)
end

function F.elu(x, alpha, ...)
  check_tensor("elu", x)
  no_extra("elu", "elu(x[, alpha])", 3, ...)
  if alpha == nil then alpha = 1.0 end
  check_finite("elu", "alpha", alpha)
  return core.where(x:gt(0), x, (x:clamp(nil, 0):exp() - 1) * alpha)
end

function F.silu(x, ...)
  check_tensor("silu", x)
  no_extra("silu", "silu(x)", 2, ...)
  return x * x:sigmoid()
end

-- mish(x) = x tanh(softplus(x))
function F.mish(x, ...)
  check_tensor("mish", x)
  no_extra("mish", "mish(x)", 2, ...)
  return x * F.softplus(x):tanh()
end

-- hardtanh(x[, min_val = -1, max_val = 1]); relu6(x) = hardtanh(x, 0, 6)
function F.hardtanh(x, min_val, max_val, ...)
  check_tensor("hardtanh", x)
  no_extra("hardtanh", "hardtanh(x[, min_val, max_val])", 4, ...)
  min_val, max_val = min_val or -1, max_val or 1
  if type(min_val) ~= "number" or type(max_val) ~= "number" or not (min_val <= max_val) then
    fail_at(2, "hardtanh", "expected min_val <= max_val, numbers, got %s and %s", tostring(min_val), tostring(max_val))
  end
  return x:clamp(min_val, max_val)
end

function F.relu6(x, ...)
  check_tensor("relu6", x)
  no_extra("relu6", "relu6(x)", 2, ...)
  return x:clamp(0, 6)
end

-- hardsigmoid(x) = relu6(x + 3) / 6; hardswish(x) = x hardsigmoid(x)
function F.hardsigmoid(x, ...)
  check_tensor("hardsigmoid", x)
  no_extra("hardsigmoid", "hardsigmoid(x)", 2, ...)
  return (x + 3):clamp(0, 6) / 6
end

function F.hardswish(x, ...)
  check_tensor("hardswish", x)
  no_extra("hardswish", "hardswish(x)", 2, ...)
  return x * ((x + 3):clamp(0, 6) / 6)
end

-- prelu(x, weight): x where x > 0, weight x elsewhere; weight has 1 value
-- or one per channel (dim 2 of (N, C, ...)), as PyTorch's
function F.prelu(x, weight, ...)
  check_tensor("prelu", x)
  no_extra("prelu", "prelu(x, weight)", 3, ...)
  check_tensor("prelu", weight, "weight")
  local n = weight:numel()
  local w = weight
  if n ~= 1 then
    if x:dim() < 2 or x:size(2) ~= n then
      fail_at(2, "prelu", "weight has %d values for input %s: expected 1 or one per channel (dim 2)", n,
              errors.shape_str(x))
    end
    local shape = {1, n}
    for _ = 3, x:dim() do shape[#shape + 1] = 1 end
    w = weight:reshape(shape)
  else
    w = weight:reshape({})
  end
  return core.where(x:gt(0), x, x * w)
end

-- the p-norm over dim (keepdim), for normalize and cosine_similarity
local function vector_norm(x, p, dim)
  local a = x:abs()
  if p == 2 then return (a * a):sum(dim, true):sqrt() end
  if p == 1 then return a:sum(dim, true) end
  return (a ^ p):sum(dim, true) ^ (1 / p)
end

-- normalize(x, {p = 2, dim = 2, eps = 1e-12}): x / max(||x||_p over dim, eps)
-- (dim 2, PyTorch's dim=1, of (N, D) rows)
function F.normalize(x, opts, ...)
  check_tensor("normalize", x)
  no_extra("normalize", "normalize(x[, {p=, dim=, eps=}])", 3, ...)
  opts = options.check("normalize", opts, {p = "number", dim = "integer", eps = "number"})
  local p, eps = opt(opts, "p", 2), opt(opts, "eps", 1e-12)
  if not (p > 0) then fail_at(2, "normalize", "p must be > 0, got %s", tostring(p)) end
  if not (eps >= 0) then fail_at(2, "normalize", "eps must be >= 0, got %s", tostring(eps)) end
  local dim = opt(opts, "dim", math.min(2, math.max(x:dim(), 1)))
  check_dim("normalize", x, dim)
  return x / vector_norm(x, p, dim):clamp(eps)
end

-- cosine_similarity(x1, x2, {dim = 2, eps = 1e-8}): the cosine of x1 and x2
-- along dim, each normalised by max(||x||, eps) first (PyTorch 2's form)
function F.cosine_similarity(x1, x2, opts, ...)
  check_tensor("cosine_similarity", x1)
  check_tensor("cosine_similarity", x2, "x2")
  no_extra("cosine_similarity", "cosine_similarity(x1, x2[, {dim=, eps=}])", 4, ...)
  opts = options.check("cosine_similarity", opts, {dim = "integer", eps = "number"})
  local dim = opt(opts, "dim", math.min(2, math.max(x1:dim(), 1)))
  local eps = opt(opts, "eps", 1e-8)
  if not (eps >= 0) then fail_at(2, "cosine_similarity", "eps must be >= 0, got %s", tostring(eps)) end
  check_dim("cosine_similarity", x1, dim)
  check_dim("cosine_similarity", x2, dim)
  return ((x1 / vector_norm(x1, 2, dim):clamp(eps)) * (x2 / vector_norm(x2, 2, dim):clamp(eps))):sum(dim)
end

function F.softmax(x, dim, ...)
  if select("#", ...) > 0 then no_extra("softmax", "softmax(x[, dim])", 3, ...) end
  return core.softmax(x, dim)
end
function F.log_softmax(x, dim, ...)
  if select("#", ...) > 0 then no_extra("log_softmax", "log_softmax(x[, dim])", 3, ...) end
  return core.log_softmax(x, dim)
end
function F.logsumexp(x, dim, keepdim, ...)
  if select("#", ...) > 0 then no_extra("logsumexp", "logsumexp(x, dim[, keepdim])", 4, ...) end
  return core.logsumexp(x, dim, keepdim)
end

-- convolution and pooling (C ops; NCHW, 1-based flat indices from max_pool2d)
F.conv2d = core.conv2d                   -- (x, w, b, {stride=, padding=, dilation=, groups=})
F.conv_transpose2d = core.conv_transpose2d
F.max_pool2d = core.max_pool2d           -- (x, kernel_size, {stride=, padding=, dilation=, ceil_mode=, return_indices=})
F.avg_pool2d = core.avg_pool2d           -- (x, kernel_size, {stride=, padding=, ceil_mode=, count_include_pad=})
-- adaptive_avg_pool2d(x, output_size (an int or {oh, ow}, each >= 1, as
-- nn.AdaptiveAvgPool2d's and adaptive_max_pool2d's; nd.adaptive_avg_pool2d
-- itself takes 0 for an empty output))
function F.adaptive_avg_pool2d(x, output_size, ...)
  no_extra("adaptive_avg_pool2d", "adaptive_avg_pool2d(x, output_size)", 3, ...)
  if output_size ~= nil then output_size = spatial_args.ints("adaptive_avg_pool2d", "output_size", output_size, 2, 1) end
  return core.adaptive_avg_pool2d(x, output_size)
end
F.fused_conv2d = core.fused_conv2d       -- (x, w, b, {stride=, ..., activation="none"|"relu"}): nd.nn.fuse
F.fused_linear = core.fused_linear       -- (x, w, b, {activation=}): act(x @ w^T + b)
F.dilate = core.dilate
F.undilate = core.undilate

-- layers ------------------------------------------------------------------

-- linear(x, weight (out, in), bias (out) or nil): x @ weight^T + bias
function F.linear(x, weight, bias, ...)
  check_tensor("linear", x)
  check_tensor("linear", weight, "weight")
  if select("#", ...) > 0 then no_extra("linear", "linear(x, weight[, bias])", 4, ...) end
  if x:size(-1) ~= weight:size(2) then
    fail_at(2, "linear", "input of shape {%s} does not match weight of shape {%s} (%d ~= %d)",
      table.concat(x.shape, ","), table.concat(weight.shape, ","), x:size(-1), weight:size(2))
  end
  -- one C call: the GEMM with the bias added in its epilogue; recorded as
  -- one "linear" node whose backward is one GEMM per gradient
  return core.linear(x, weight, bias)
end

-- dropout(x, p = 0.5, training = true): zeroes with probability p and scales
-- the rest by 1 / (1 - p), so evaluation needs no rescaling
function F.dropout(x, p, training, ...)
  check_tensor("dropout", x)
  no_extra("dropout", "dropout(x[, p, training])", 4, ...)
  if p == nil then p = 0.5 end
  if type(p) == "table" and not core.is_tensor(p) then
    errors.fail("dropout", "p must be in [0, 1], got a table (dropout takes (x, p, training) " ..
                "positionally, not an options table)")
  end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    errors.fail("dropout", "p must be in [0, 1], got %s", got(p))
  end
  check_training("dropout", training)
  if training == nil then training = true end
  if not training or p == 0 then return x end
  if p == 1 then return x * 0 end
  -- the mask is drawn on x's device (no transfer per call): uniforms below
  -- 1 - p, the same draws and comparison as bernoulli(full(1 - p)) without
  -- the probability tensor and its range check (a third of dropout's time)
  local keep = core.rand(x.shape, {dtype = x.dtype, device = x.device}):lt(1 - p)
  return x * keep * (1 / (1 - p))
end

-- losses -------------------------------------------------------------------

-- input and target of one shape (the elementwise losses): an error naming op
-- (broadcasting a {4} input against a {4,1} target would make a {4,4} loss)
local function check_pair(op, input, target, what)
  check_tensor(op, input)
  check_tensor(op, target, what or "target")
  if table.concat(input.shape, ",") ~= table.concat(target.shape, ",") then
    fail_at(3, op, "input %s and %s %s must have the same shape", errors.shape_str(input), what or "target",
            errors.shape_str(target))
  end
end

-- the trailing options table of a loss, with no argument after it
local function loss_opts(op, usage, first, opts, spec, ...)
  no_extra(op, usage, first, ...)
  return options.check(op, opts, spec)
end

function F.mse_loss(input, target, opts, ...)
  check_pair("mse_loss", input, target)
  opts = loss_opts("mse_loss", "mse_loss(input, target[, {reduction=}])", 4, opts, {reduction = "string"}, ...)
  local d = input - target
  return reduce("mse_loss", d * d, opt(opts, "reduction", "mean"))
end

-- stable: max(x, 0) - x y + log(1 + exp(-|x|))
function F.binary_cross_entropy_with_logits(input, target, opts, ...)
  check_pair("binary_cross_entropy_with_logits", input, target)
  opts = loss_opts("binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits(input, target[, {reduction=}])",
                   4, opts, {reduction = "string"}, ...)
  local loss = input:maximum(0) - input * target + ((-input:abs()):exp() + 1):log()
  return reduce("binary_cross_entropy_with_logits", loss, opt(opts, "reduction", "mean"))
end

local function nonnegative(op, name, v)
  if type(v) ~= "number" or not (v >= 0) then fail_at(3, op, "%s must be a number >= 0, got %s", name, tostring(v)) end
end

-- l1_loss(input, target, {reduction=}): |input - target|
function F.l1_loss(input, target, opts, ...)
  check_pair("l1_loss", input, target)
  opts = loss_opts("l1_loss", "l1_loss(input, target[, {reduction=}])", 4, opts, {reduction = "string"}, ...)
  return reduce("l1_loss", (input - target):abs(), opt(opts, "reduction", "mean"))
end

-- smooth_l1_loss(input, target, {beta = 1, reduction=}): 0.5 d^2 / beta below
-- beta, d - 0.5 beta above (d = |input - target|; beta 0 is l1_loss)
function F.smooth_l1_loss(input, target, opts, ...)
  check_pair("smooth_l1_loss", input, target)
  opts = loss_opts("smooth_l1_loss", "smooth_l1_loss(input, target[, {beta=, reduction=}])", 4, opts,
                   {beta = "number", reduction = "string"}, ...)
  local beta = opt(opts, "beta", 1.0)
  nonnegative("smooth_l1_loss", "beta", beta)
  local d = (input - target):abs()
  local loss = beta == 0 and d or core.where(d:lt(beta), d * d * (0.5 / beta), d - 0.5 * beta)
  return reduce("smooth_l1_loss", loss, opt(opts, "reduction", "mean"))
end

-- huber_loss(input, target, {delta = 1, reduction=}): 0.5 d^2 below delta,
-- delta (d - 0.5 delta) above
function F.huber_loss(input, target, opts, ...)
  check_pair("huber_loss", input, target)
  opts = loss_opts("huber_loss", "huber_loss(input, target[, {delta=, reduction=}])", 4, opts,
                   {delta = "number", reduction = "string"}, ...)
  local delta = opt(opts, "delta", 1.0)
  if type(delta) ~= "number" or not (delta > 0) then
    fail_at(2, "huber_loss", "delta must be a number > 0, got %s", tostring(delta))
  end
  local d = (input - target):abs()
  local loss = core.where(d:lt(delta), d * d * 0.5, (d - 0.5 * delta) * delta)
  return reduce("huber_loss", loss, opt(opts, "reduction", "mean"))
end

-- binary_cross_entropy(probabilities, target, {weight=, reduction=}): the
-- logs are clamped at -100, as PyTorch's (a probability of 0 or 1 gives a
-- finite loss)
function F.binary_cross_entropy(input, target, opts, ...)
  local op = "binary_cross_entropy"
  check_pair(op, input, target)
  opts = loss_opts(op, "binary_cross_entropy(input, target[, {weight=, reduction=}])", 4, opts,
                   {weight = "tensor", reduction = "string"}, ...)
  -- the input must be probabilities, as PyTorch's check (two numbers read
  -- back; inside nd.compile the replays skip it, as the label checks)
  if input:numel() > 0 and not capture.compiling() then
    local d = input:detach()
    local lo, hi = d:min():item(), d:max():item()
    if not (lo >= 0 and hi <= 1) then
      errors.fail(op, "all elements of input should be between 0 and 1 (probabilities), got %s",
                  tostring((lo >= 0) and hi or lo))
    end
  end
  local loss = -(target * input:log():clamp(-100) + (1 - target) * (1 - input):log():clamp(-100))
  if opts.weight ~= nil then loss = loss * opts.weight end
  return reduce("binary_cross_entropy", loss, opt(opts, "reduction", "mean"))
end

-- kl_div(input (log-probabilities), target, {reduction = "mean", log_target =
-- false}): target (log target - input), 0 where target is 0; reduction
-- "batchmean" divides the sum by the first dim (the mathematical KL
-- divergence; "mean" averages over every element, as PyTorch's default)
function F.kl_div(input, target, opts, ...)
  check_pair("kl_div", input, target)
  opts = loss_opts("kl_div", "kl_div(input, target[, {reduction=, log_target=}])", 4, opts,
                   {reduction = "string", log_target = "boolean"}, ...)
  local loss
  if opts.log_target then
    loss = target:exp() * (target - input)
  else
    local safe = core.where(target:gt(0), target, core.ones_like(target))
    loss = target * safe:log() - target * input
  end
  local reduction = opt(opts, "reduction", "mean")
  if reduction == "batchmean" then
    return loss:sum() / (input:dim() > 0 and input:size(1) or 1)
  end
  return reduce("kl_div", loss, reduction)
end

-- margin_ranking_loss(x1, x2, y (1 or -1), {margin = 0, reduction=}):
-- max(0, -y (x1 - x2) + margin)
function F.margin_ranking_loss(x1, x2, y, opts, ...)
  check_pair("margin_ranking_loss", x1, x2, "x2")
  check_pair("margin_ranking_loss", x1, y)
  opts = loss_opts("margin_ranking_loss", "margin_ranking_loss(x1, x2, target[, {margin=, reduction=}])", 5, opts,
                   {margin = "number", reduction = "string"}, ...)
  local margin = opt(opts, "margin", 0)
  check_finite("margin_ranking_loss", "margin", margin)
  local loss = (-y * (x1 - x2) + margin):maximum(0)
  return reduce("margin_ranking_loss", loss, opt(opts, "reduction", "mean"))
end

-- the dim a row-wise loss reduces: the last of (N, D), the only one of (D)
local function feature_dim(op, x)
  if x:dim() ~= 1 and x:dim() ~= 2 then
    fail_at(4, op, "expected inputs of shape (N, D) or (D), got %s", errors.shape_str(x))
  end
  return x:dim()
end

-- cosine_embedding_loss(x1, x2, y (1 or -1), {margin = 0, reduction=}):
-- 1 - cos(x1, x2) where y = 1, max(0, cos - margin) where y = -1 (cos as
-- PyTorch's: the squared norms each get 1e-12)
function F.cosine_embedding_loss(x1, x2, y, opts, ...)
  local op = "cosine_embedding_loss"
  check_pair(op, x1, x2, "x2")
  check_tensor(op, y, "target")
  opts = loss_opts(op, "cosine_embedding_loss(x1, x2, target[, {margin=, reduction=}])", 5, opts,
                   {margin = "number", reduction = "string"}, ...)
  check_finite(op, "margin", opts.margin or 0)
  local d = feature_dim(op, x1)
  if y:dim() ~= d - 1 or (d == 2 and y:size(1) ~= x1:size(1)) then
    errors.fail(op, "target must have shape %s (one per row of input %s), got %s",
                d == 2 and ("{%d}"):format(x1:size(1)) or "{}", errors.shape_str(x1), errors.shape_str(y))
  end
  -- targets are 1 or -1 (another value would count for nothing); one number
  -- read back, none inside nd.compile
  if y:numel() > 0 and not capture.compiling() and y:abs():ne(1):sum():item() > 0 then
    for _, v in ipairs(y:reshape({-1}):to("cpu"):totable()) do
      if v ~= 1 and v ~= -1 then errors.fail(op, "target values must be 1 or -1, got %s", tostring(v)) end
    end
  end
  local dot = (x1 * x2):sum(d)
  local denom = (((x1 * x1):sum(d) + 1e-12) * ((x2 * x2):sum(d) + 1e-12)):sqrt()
  local cos = dot / denom
  local zeros = core.zeros_like(cos)
  local loss = core.where(y:eq(1), 1 - cos, zeros) +
               core.where(y:eq(-1), (cos - opt(opts, "margin", 0)):maximum(0), zeros)
  return reduce("cosine_embedding_loss", loss, opt(opts, "reduction", "mean"))
end

-- pairwise_distance(x1, x2, {p = 2, eps = 1e-6, keepdim = false}):
-- ||x1 - x2 + eps||_p over the last dim, as PyTorch's
function F.pairwise_distance(x1, x2, opts, ...)
  check_tensor("pairwise_distance", x1)
  check_tensor("pairwise_distance", x2, "x2")
  no_extra("pairwise_distance", "pairwise_distance(x1, x2[, {p=, eps=, keepdim=}])", 4, ...)
  opts = options.check("pairwise_distance", opts, {p = "number", eps = "number", keepdim = "boolean"})
  local p, eps = opt(opts, "p", 2), opt(opts, "eps", 1e-6)
  if not (p > 0) then fail_at(2, "pairwise_distance", "p must be > 0, got %s", tostring(p)) end
  check_finite("pairwise_distance", "eps", eps)
  local d = (x1 - x2 + eps):abs()
  local last = math.max(d:dim(), 1)
  if p == 2 then return (d * d):sum(last, opts.keepdim == true):sqrt() end
  if p == 1 then return d:sum(last, opts.keepdim == true) end
  return (d ^ p):sum(last, opts.keepdim == true) ^ (1 / p)
end

-- triplet_margin_loss(anchor, positive, negative, {margin = 1, p = 2, eps =
-- 1e-6, swap = false, reduction=}): max(d(a, p) - d(a, n) + margin, 0), d
-- the pairwise distance; swap takes min(d(a, n), d(p, n))
function F.triplet_margin_loss(anchor, positive, negative, opts, ...)
  local op = "triplet_margin_loss"
  check_pair(op, anchor, positive, "positive")
  check_pair(op, anchor, negative, "negative")
  opts = loss_opts(op, "triplet_margin_loss(anchor, positive, negative[, {margin=, p=, eps=, swap=, reduction=}])",
                   5, opts, {margin = "number", p = "number", eps = "number", swap = "boolean", reduction = "string"}, ...)
  local dist_opts = {p = opt(opts, "p", 2), eps = opt(opts, "eps", 1e-6)}
  check_finite(op, "margin", opt(opts, "margin", 1.0))
  if not (dist_opts.p > 0) then errors.fail(op, "p must be > 0, got %s", tostring(dist_opts.p)) end
  check_finite(op, "eps", dist_opts.eps)
  local d_ap = F.pairwise_distance(anchor, positive, dist_opts)
  local d_an = F.pairwise_distance(anchor, negative, dist_opts)
  if opts.swap then d_an = d_an:minimum(F.pairwise_distance(positive, negative, dist_opts)) end
  local loss = (d_ap - d_an + opt(opts, "margin", 1.0)):maximum(0)
  return reduce("triplet_margin_loss", loss, opt(opts, "reduction", "mean"))
end

-- Labels: an int tensor or a Lua table of class indices 1..C, one per row. A
-- table becomes a tensor on the input's device. The range check reads two
-- numbers back (on a device, the host waits for the labels there).
local function check_labels(op, labels, n, C, ignore_index, device)
  -- integers only (a fraction, a boolean or a float tensor is an error), as
  -- every op that takes labels; raised at the caller (core's message has no
  -- position when called through pcall)
  local ok, t = pcall(core._ints, labels, op, "labels", device)
  if not ok then error(t, 3) end
  if t:dim() ~= 1 or t:size(1) ~= n then
    fail(op, "expected %d labels (one per row of the input), got shape {%s}", n, table.concat(t.shape, ","))
  end
  local valid = t
  -- ones_like: a tensor on t's device (a number operand of where is made on the cpu)
  if ignore_index ~= nil then valid = core.where(t:eq(ignore_index), core.ones_like(t), t) end
  -- (inside nd.compile the gather's own bounds check, run by every replay, refuses them)
  if n > 0 and not capture.compiling() then
    local lo, hi = valid:min():item(), valid:max():item()
    if lo < 1 or hi > C then
      local bad = lo < 1 and lo or hi
      fail(op, "label %d is out of range for %d classes (expected 1..%d)", bad, C, C)
    end
  end
  return t, valid
end

-- nll_loss(log_probs (N, C), labels, {ignore_index=, reduction=})
function F.nll_loss(log_probs, labels, opts, ...)
  local op = "nll_loss"
  check_tensor(op, log_probs)
  opts = loss_opts(op, "nll_loss(input, labels[, {ignore_index=, reduction=}])", 4, opts,
                   {ignore_index = "integer", reduction = "string"}, ...)
  if log_probs:dim() ~= 2 then fail_at(2, op, "expected input of shape (N, C), got {%s}", table.concat(log_probs.shape, ",")) end
  local n, C = log_probs:size(1), log_probs:size(2)
  local ignore_index = opt(opts, "ignore_index", nil)
  if ignore_index ~= nil and math.tointeger(ignore_index) == nil then
    fail_at(2, op, "ignore_index must be an integer, got %s", tostring(ignore_index))
  end
  local t, valid = check_labels(op, labels, n, C, ignore_index, log_probs.device)
  -- each row's pick by gather (not a one-hot: one_hot reads the labels on the host, a graph
  -- break inside nd.compile, where the gather's bounds check runs again at every replay)
  local per_row = -log_probs:gather(2, valid:reshape({n, 1})):reshape({n})
  local reduction = opt(opts, "reduction", "mean")
  if ignore_index ~= nil then
    local keep = t:ne(ignore_index):to(log_probs.dtype)
    per_row = per_row * keep
    if reduction == "mean" then return per_row:sum() / keep:sum() end
  end
  return reduce(op, per_row, reduction)
end

-- cross_entropy(logits (N, C), labels 1..C, {ignore_index=, label_smoothing=, reduction=})
-- A fused C op (log-softmax and the pick in one pass, backward in closed
-- form). As PyTorch: with label smoothing the target is
-- (1 - e) one_hot + e / C; the mean skips ignored rows.
-- Labels given as a Lua table become a tensor on the logits' device (in the
-- C op, which checks them in 1-based terms on every device). Errors of the
-- C op are raised again at the user's position (called through pcall, the
-- C op's own message carries no position).
function F.cross_entropy(logits, labels, opts, ...)
  if select("#", ...) > 0 then
    no_extra("cross_entropy", "cross_entropy(logits, labels[, {ignore_index=, label_smoothing=, reduction=}])", 4, ...)
  end
  options.check("cross_entropy", opts, {ignore_index = "integer", label_smoothing = "number", reduction = "string"})
  local ok, r = pcall(core.cross_entropy, logits, labels, opts)
  if not ok then errors.raise(r) end
  return r
end

-- normalisation ---------------------------------------------------------------

-- layer_norm(x, normalized_shape, weight, bias, eps = 1e-5): fused C op
function F.layer_norm(x, normalized_shape, weight, bias, eps, ...)
  check_tensor("layer_norm", x)
  if select("#", ...) > 0 then
    no_extra("layer_norm", "layer_norm(x, normalized_shape[, weight, bias, eps])", 6, ...)
  end
  if type(normalized_shape) == "number" then normalized_shape = {normalized_shape} end
  return core.layer_norm(x, normalized_shape, weight, bias, eps or 1e-5)
end

-- batch_norm(x (N, C, ...), running_mean, running_var, weight, bias,
--            training = false, momentum = 0.1, eps = 1e-5): a fused C op.
-- Training normalises with the batch statistics (biased variance) and
-- updates the running ones in place (unbiased variance, as PyTorch);
-- evaluation uses the running statistics.
local BATCH_NORM = "batch_norm(x, running_mean, running_var[, weight, bias, training, momentum, eps])"

function F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, ...)
  local op = "batch_norm"
  if select("#", ...) > 0 then no_extra(op, BATCH_NORM, 9, ...) end
  -- the positional arguments (a C op would count a string as true, or raise
  -- "bad argument #7" for an options table)
  check_training(op, training, "training (argument 6)")
  if momentum ~= nil and (type(momentum) ~= "number" or not (momentum >= 0 and momentum <= 1)) then
    errors.fail(op, "momentum (argument 7) must be a number in [0, 1], got %s (%s takes positional arguments)",
                got(momentum), BATCH_NORM)
  end
  if eps ~= nil and (type(eps) ~= "number" or not (eps >= 0)) then
    errors.fail(op, "eps (argument 8) must be a number >= 0, got %s", got(eps))
  end
  return core.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
end

-- embedding(indices (any shape, 1-based), weight (num, dim), {padding_idx=})
-- -> indices.shape + {dim}; the padding row gets no gradient
function F.embedding(indices, weight, opts, ...)
  check_tensor("embedding", weight, "weight")
  no_extra("embedding", "embedding(indices, weight[, {padding_idx=}])", 4, ...)
  opts = options.check("embedding", opts, {padding_idx = "integer"})
  local ok, idx = pcall(core._ints, indices, "embedding", "indices", weight.device)
  if not ok then errors.raise(idx) end
  local flat = idx:reshape({-1})
  local out = weight:index_select(1, flat)
  local pad = opt(opts, "padding_idx", nil)
  if pad ~= nil then
    local keep = flat:ne(pad):to(weight.dtype):view({-1, 1})
    out = out * keep + core.no_grad(function() return out * (1 - keep) end)
  end
  local shape = idx.shape
  shape[#shape + 1] = weight:size(2)
  return out:reshape(shape)
end

-- the families kept in files of their own (lua/needle/functional/*.lua), each
-- a table of functions merged into F; a name defined twice is an error
for _, family in ipairs({"needle.functional.spatial", "needle.functional.attention"}) do
  for name, fn in pairs(require(family)) do
    assert(F[name] == nil, ("needle.functional: %s defines %s twice"):format(family, name))
    F[name] = fn
  end
end

return F
