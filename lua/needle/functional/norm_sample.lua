-- needle.functional.norm_sample: group_norm, instance_norm and rms_norm of
-- nd.F, the normalisations whose statistics are taken per sample.
--
-- group_norm and instance_norm reshape (N, C, *) so that each group (each
-- channel) is one row and run the fused layer_norm kernel over the rows
-- (its closed-form backward included), then apply the per-channel weight and
-- bias. rms_norm is composed of elementwise ops and a mean. Arguments follow
-- PyTorch's order; the optional ones may instead come as a trailing options
-- table with PyTorch's names: F.group_norm(x, 2, {weight = w, eps = 1e-6}).
local core = require "needle.core"
local options = require "needle.options"
local A = require "needle.functional.spatial_args"

local M = {}

local fail, shape_str = A.fail, A.shape_str

-- PyTorch's torch.finfo(dtype).eps: rms_norm's eps when none is given
local FINFO_EPS = {float32 = 2 ^ -23, float64 = 2 ^ -52, float16 = 2 ^ -10, bfloat16 = 2 ^ -7}
M.FINFO_EPS = FINFO_EPS

-- opts (the checked options table) when args[1] is one and nothing follows
-- it, else nil
local function trailing_options(op, spec, first, ...)
  if type(first) == "table" and not core.is_tensor(first) and select("#", ...) == 0 then
    return options.check(op, first, spec)
  end
  return nil
end

local function check_eps(op, eps)
  if type(eps) ~= "number" or not (eps >= 0) then fail(op, "eps must be a number >= 0, got %s", tostring(eps)) end
end

-- a per-channel tensor t (C) reshaped to broadcast over x (N, C, *)
local function per_channel(t, x)
  local shape = {1, t:numel()}
  for _ = 3, x:dim() do shape[#shape + 1] = 1 end
  return t:reshape(shape)
end

-- y * weight + bias, per channel (either may be nil)
local function affine(y, weight, bias)
  if weight ~= nil then y = y * per_channel(weight, y) end
  if bias ~= nil then y = y + per_channel(bias, y) end
  return y
end

local function check_channel_param(op, x, t, what)
  if t == nil then return end
  A.same_kind(op, x, {half = true}, t, what)
  if t:dim() ~= 1 or t:size(1) ~= x:size(2) then
    fail(op, "%s must have shape {%d} (one per channel of input %s), got %s", what, x:size(2), shape_str(x),
         shape_str(t))
  end
end

-- rows of x normalised to zero mean and unit variance (biased), in the fused kernel
local function normalise_rows(x, rows, eps)
  local n = x:numel() // rows
  return core.layer_norm(x:reshape({rows, n}), {n}, nil, nil, eps):reshape(x.shape)
end

-- group_norm(x (N, C, *), num_groups, weight (C), bias (C), eps = 1e-5)
-- or group_norm(x, num_groups, {weight=, bias=, eps=})
function M.group_norm(x, num_groups, weight, ...)
  local op = "group_norm"
  local bias, eps = ...
  local o = trailing_options(op, {weight = "tensor", bias = "tensor", eps = "number"}, weight, ...)
  if o then weight, bias, eps = o.weight, o.bias, o.eps
  else A.no_extra(op, "group_norm(x, num_groups[, weight, bias, eps]) or group_norm(x, num_groups, {weight=, bias=, eps=})",
                  6, select(3, ...)) end
  A.tensor(op, x)
  if x:dim() < 2 then fail(op, "expected input of shape (N, C, *), got %s", shape_str(x)) end
  A.float(op, x)
  local G = A.int(num_groups)
  if G == nil or G < 1 then fail(op, "num_groups must be a positive integer, got %s", A.show(num_groups)) end
  local C = x:size(2)
  if C % G ~= 0 then
    fail(op, "the %d channels of input %s are not divisible by num_groups (%d)", C, shape_str(x), G)
  end
  check_channel_param(op, x, weight, "weight")
  check_channel_param(op, x, bias, "bias")
  eps = eps or 1e-5
  check_eps(op, eps)
  if x:numel() == 0 then return affine(x, weight, bias) end
  return affine(normalise_rows(x, x:size(1) * G, eps), weight, bias)
end

local INSTANCE = {running_mean = "tensor", running_var = "tensor", weight = "tensor", bias = "tensor",
                  use_input_stats = "boolean", momentum = "number", eps = "number"}

-- instance_norm(x (N, C, *), running_mean, running_var, weight, bias,
--               use_input_stats = true, momentum = 0.1, eps = 1e-5)
-- or instance_norm(x, {running_mean=, ..., eps=}). With use_input_stats each
-- (sample, channel) is normalised by its own statistics and the running ones
-- (when given) are updated in place with their mean over the batch
-- (unbiased variance), as PyTorch; without, the running statistics are used.
function M.instance_norm(x, running_mean, ...)
  local op = "instance_norm"
  local running_var, weight, bias, use_input_stats, momentum, eps = ...
  local o = trailing_options(op, INSTANCE, running_mean, ...)
  if o then
    running_mean, running_var, weight, bias = o.running_mean, o.running_var, o.weight, o.bias
    use_input_stats, momentum, eps = o.use_input_stats, o.momentum, o.eps
  else
    A.no_extra(op, "instance_norm(x[, running_mean, running_var, weight, bias, use_input_stats, momentum, eps]) " ..
               "or instance_norm(x, {running_mean=, ..., eps=})", 9, select(7, ...))
  end
  if use_input_stats ~= nil and type(use_input_stats) ~= "boolean" then
    fail(op, "use_input_stats must be a boolean, got %s", options.got(use_input_stats))
  end
  if momentum ~= nil and (type(momentum) ~= "number" or not (momentum >= 0 and momentum <= 1)) then
    fail(op, "momentum must be a number in [0, 1], got %s", options.got(momentum))
  end
  A.tensor(op, x)
  if x:dim() < 3 then
    fail(op, "expected input of shape (N, C, *) with at least one spatial dim, got %s", shape_str(x))
  end
  A.float(op, x)
  if (running_mean == nil) ~= (running_var == nil) then
    fail(op, "running_mean and running_var must be given together")
  end
  check_channel_param(op, x, running_mean, "running_mean")
  check_channel_param(op, x, running_var, "running_var")
  check_channel_param(op, x, weight, "weight")
  check_channel_param(op, x, bias, "bias")
  if use_input_stats == nil then use_input_stats = true end
  local HALF = {float16 = true, bfloat16 = true}
  if use_input_stats and running_mean ~= nil and (HALF[running_mean.dtype] or HALF[running_var.dtype]) then
    -- an update smaller than half a half-precision step rounds back to the old value
    fail(op, "running statistics in %s cannot be updated with the input's statistics (half precision is " ..
         "storage for inference); use eval() or keep them in %s",
         HALF[running_mean.dtype] and running_mean.dtype or running_var.dtype,
         x.dtype == "float64" and "float64" or "float32")
  end
  momentum, eps = momentum or 0.1, eps or 1e-5
  check_eps(op, eps)
  local N, C = x:size(1), x:size(2)
  local S = x:numel() // math.max(N * C, 1)
  if not use_input_stats then
    if running_mean == nil then
      fail(op, "running_mean and running_var are required when use_input_stats is false")
    end
    return core.batch_norm(x, running_mean, running_var, weight, bias, false, 0, eps)
  end
  if S <= 1 then
    fail(op, "expected more than 1 spatial element when using the input statistics, got input %s", shape_str(x))
  end
  if running_mean ~= nil then
    core.no_grad(function()
      local rows = x:detach():reshape({N, C, S})
      local mean = rows:mean(3):mean(1)
      local var = rows:var({dim = 3, correction = 1}):mean(1)
      running_mean:copy_(running_mean * (1 - momentum) + mean * momentum)
      running_var:copy_(running_var * (1 - momentum) + var * momentum)
    end)
  end
  return affine(normalise_rows(x, N * C, eps), weight, bias)
end

-- rms_norm(x, normalized_shape (int or list: x's last dims), weight, eps)
-- or rms_norm(x, normalized_shape, {weight=, eps=}):
-- x / sqrt(mean(x^2 over those dims) + eps) * weight; eps nil is
-- torch.finfo(x.dtype).eps, as PyTorch
function M.rms_norm(x, normalized_shape, weight, ...)
  local op = "rms_norm"
  local eps = ...
  local o = trailing_options(op, {weight = "tensor", eps = "number"}, weight, ...)
  if o then weight, eps = o.weight, o.eps
  else A.no_extra(op, "rms_norm(x, normalized_shape[, weight, eps]) or rms_norm(x, normalized_shape, {weight=, eps=})",
                  5, select(2, ...)) end
  A.tensor(op, x)
  local ns = normalized_shape
  if A.int(ns) ~= nil then ns = {ns} end
  local ok = type(ns) == "table" and not core.is_tensor(ns) and #ns >= 1 and #ns <= x:dim()
  if ok then
    local ints = {}
    for i = 1, #ns do
      ints[i] = A.int(ns[i])
      if ints[i] ~= x:size(x:dim() - #ns + i) then ok = false end
    end
    ns = ints
  end
  if not ok then
    fail(op, "expected input whose last dims are normalized_shape %s, got %s", A.show(normalized_shape), shape_str(x))
  end
  if weight ~= nil then
    A.same_kind(op, x, {half = true}, weight, "weight")
    if shape_str(weight) ~= A.show(ns) then
      fail(op, "weight must have shape %s (normalized_shape), got %s", A.show(ns), shape_str(weight))
    end
  end
  if eps == nil then eps = FINFO_EPS[x.dtype] end
  if eps == nil then fail(op, "expected a floating-point input, got %s", x.dtype) end
  check_eps(op, eps)
  local dims = {}
  for i = 1, #ns do dims[i] = x:dim() - #ns + i end
  local y = x * ((x * x):mean(dims, true) + eps):rsqrt()
  if weight ~= nil then y = y * weight end
  return y
end

return M
