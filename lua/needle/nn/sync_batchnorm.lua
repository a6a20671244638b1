-- needle.nn.sync_batchnorm: SyncBatchNorm(num_features[, opts]), batch
-- normalisation whose training statistics cover the whole global batch of a
-- data-parallel job (nd.distributed), as PyTorch's nn.SyncBatchNorm.
--
-- Options, buffers and state_dict keys are BatchNorm's; inputs are (N, C,
-- ...) of any rank. In training mode with more than one process, each
-- rank's per-channel mean, variance and count are gathered (one small
-- all_gather per layer and forward) and merged in float64, and backward
-- all-reduces the two per-channel sums its formula needs (one all_reduce),
-- so every rank normalises with the statistics one process with the whole
-- batch would use, the gradients are that process's, and the running
-- statistics agree across ranks. Every rank must run the layer in each
-- forward and backward (a rank whose loss does not reach it would leave the
-- others waiting). In eval mode, or in a world of one process, it is
-- BatchNorm.
--
-- SyncBatchNorm.convert_sync_batchnorm(model) swaps every BatchNorm1d/2d of
-- a model (its parameters and buffers kept) and returns the model (a
-- BatchNorm itself gives its SyncBatchNorm).
local nd = require "needle"
local norm = require "needle.nn.norm"
local shape_str = require("needle.errors").shape_str
local error = require("needle.errors").error

local M = {}

local SyncBatchNorm = norm._BatchNorm:extend("SyncBatchNorm")

function SyncBatchNorm:_check_input(x)
  local c = self.num_features
  if not nd.is_tensor(x) or x:dim() < 2 or x:size(2) ~= c then
    error(("needle.nn.SyncBatchNorm(%d): expected input with %d channels (N, %d, ...), got %s"):format(
      c, c, c, nd.is_tensor(x) and shape_str(x) or type(x)), 3)
  end
end

local function distributed_world()
  local dist = nd.distributed
  return dist.is_initialized() and dist.world_size() > 1 and dist or nil
end

-- The layer as one differentiable function (as PyTorch's SyncBatchNorm):
-- forward gathers every rank's per-channel (mean, variance, count) in one
-- small all_gather and merges them in float64 (Chan's parallel formula: no
-- cancellation), then normalises with the fused elementwise ops; backward
-- all-reduces the two per-channel sums its formula needs, in one call.
-- Every rank's channel count agrees (one model), so neither checks it.
local SyncBatchNormFn = require("needle.autograd").Function{
  name = "sync_batch_norm",
  forward = function(ctx, x, weight, bias, layer)
    local dist = nd.distributed
    local C = layer.num_features
    local dims, shape = {1}, {1, C}
    for d = 3, x:dim() do
      dims[#dims + 1] = d
      shape[#shape + 1] = 1
    end
    -- a rank with no samples adds nothing (count 0, and zeros, not NaN)
    local empty = x:numel() == 0
    local m = empty and nd.zeros({C}, {dtype = x.dtype}) or x:mean(dims)
    local v = empty and nd.zeros({C}, {dtype = x.dtype}) or x:var(dims, false, {correction = 0})
    local stats = nd.cat({m:double(), v:double(), nd.full({1}, x:numel() // C, {dtype = "float64"})}, 1)
    local all = dist.all_gather(stats, {check = false}) -- {W, 2C + 1}
    local counts = all:narrow(2, 2 * C + 1, 1)
    local n = counts:sum():item()
    if n <= 1 then
      error(("needle.nn.SyncBatchNorm(%d): expected more than 1 value per channel when training, "
             .. "got %d over all ranks"):format(C, n), 0)
    end
    local means, vars = all:narrow(2, 1, C), all:narrow(2, C + 1, C)
    local mean = (means * counts):sum(1) / n
    local d = means - mean
    local var = ((vars + d * d) * counts):sum(1) / n
    local mean_x, var_x = mean:to(x.dtype), var:to(x.dtype)
    -- the fused kernel normalises with given statistics in its eval form
    local y = nd.F.batch_norm(x, mean_x, var_x, weight, bias, false, 0, layer.eps)
    local invstd_x = (1 / (var + layer.eps):sqrt()):to(x.dtype)
    ctx.x, ctx.mean, ctx.invstd, ctx.weight, ctx.n = x, mean_x, invstd_x, weight, n
    ctx.dims, ctx.shape, ctx.C, ctx.affine = dims, shape, C, bias ~= nil
    if layer.track_running_stats then
      layer.num_batches_tracked:add_(1)
      local f = layer.momentum or 1.0 / layer.num_batches_tracked:item()
      local rm, rv = layer.running_mean, layer.running_var
      rm:mul_(1 - f):add_(mean:to(rm.dtype) * f)
      rv:mul_(1 - f):add_(var:to(rv.dtype) * (f * n / (n - 1)))
    end
    return y
  end,
  backward = function(ctx, g)
    -- dx = invstd * (w g - mean(w g) - xhat mean(w g xhat)), the means over
    -- the whole batch, written per channel as dx = a g + b x + c
    local shape, dims, C, n = ctx.shape, ctx.dims, ctx.C, ctx.n
    local x, mean, invstd = ctx.x, ctx.mean, ctx.invstd
    local sum_g = g:sum(dims)
    local sum_gx = ((g * x):sum(dims) - mean * sum_g) * invstd -- sum of g * xhat
    local both = nd.cat({sum_g, sum_gx}, 1)
    -- the whole batch's sums: this rank's loss moved every rank's statistics
    nd.distributed.all_reduce(both, {op = "sum", check = false})
    local w = ctx.weight
    local a = w and invstd * w or invstd
    local mean_dy = both:narrow(1, 1, C) / n
    local mean_dyx = both:narrow(1, C + 1, C) / n
    local b = -(a * invstd * mean_dyx)
    local c = -(a * mean_dy) - b * mean
    local dx = g * a:view(shape) + x * b:view(shape) + c:view(shape)
    if ctx.affine then return dx, sum_gx, sum_g end
    return dx
  end,
}

function SyncBatchNorm:forward(x)
  local dist = self.training and distributed_world()
  if not dist then return norm._BatchNorm.forward(self, x) end
  self:_check_input(x)
  local rm, rv = self.running_mean, self.running_var
  for _, t in ipairs({rm or false, rv or false}) do
    if t and (t.dtype == "float16" or t.dtype == "bfloat16") then
      -- as batch_norm: an update smaller than half a half-precision step rounds back to the old value
      error(("needle.nn.SyncBatchNorm: running statistics in %s cannot be updated in training mode (half " ..
             "precision is storage for inference); use eval() or keep them in float32"):format(t.dtype), 2)
    end
  end
  return SyncBatchNormFn(x, self.affine and self.weight or nil, self.affine and self.bias or nil, self)
end
M.SyncBatchNorm = SyncBatchNorm

local function is_batchnorm(m) return m.__name == "BatchNorm1d" or m.__name == "BatchNorm2d" end

-- a SyncBatchNorm holding bn's own parameters and buffers
local function to_sync(bn)
  local s = SyncBatchNorm(bn.num_features, {eps = bn.eps, momentum = bn.momentum, affine = bn.affine,
                          track_running_stats = bn.track_running_stats,
                          dtype = (bn.weight or bn.running_mean or nd.zeros(1)).dtype})
  for _, k in ipairs({"weight", "bias"}) do
    if bn[k] ~= nil then s:register_parameter(k, bn[k]) end
  end
  for _, k in ipairs({"running_mean", "running_var", "num_batches_tracked"}) do
    if bn[k] ~= nil then s:register_buffer(k, bn[k]) end
  end
  s:train(bn.training)
  return s
end

local function convert(module)
  for _, entry in ipairs(module:named_children()) do
    local name, child = entry[1], entry[2]
    if is_batchnorm(child) then module[name] = to_sync(child) else convert(child) end
  end
  return module
end

function SyncBatchNorm.convert_sync_batchnorm(model)
  if is_batchnorm(model) then return to_sync(model) end
  return convert(model)
end

return M
