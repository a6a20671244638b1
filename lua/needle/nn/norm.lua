-- needle.nn.norm: BatchNorm1d, BatchNorm2d, LayerNorm, LayerNorm1d.
--
--   nd.nn.BatchNorm2d(16, {eps = 1e-5, momentum = 0.1, affine = true, track_running_stats = true})
--   nd.nn.LayerNorm(256, {eps = 1e-5, elementwise_affine = true, bias = true})
--   nd.nn.LayerNorm({4, 5})       -- the last two dims
--
-- BatchNorm keeps PyTorch's buffers running_mean, running_var and
-- num_batches_tracked (int64, 0-dim); in training mode it normalises with the
-- batch statistics and updates the running ones in place, in eval mode it
-- uses the running ones. momentum = false is PyTorch's momentum=None (a
-- cumulative average).
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"

local M = {}

local util = require "needle.nn.util"
local shape_str = require("needle.errors").shape_str

-- BatchNorm ----------------------------------------------------------------------

-- The per-channel state of BatchNorm and InstanceNorm (PyTorch's _NormBase):
-- weight and bias (ones, zeros) when self.affine, the running statistics and
-- num_batches_tracked when self.track_running_stats, else registered as
-- absent; then moved to o.device.
function M.per_channel_state(self, num_features, o)
  local dtype = o.dtype or "float32"
  if self.affine then
    self.weight = Module.Parameter(nd.ones({num_features}, {dtype = dtype}))
    self.bias = Module.Parameter(nd.zeros({num_features}, {dtype = dtype}))
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
  if self.track_running_stats then
    self:register_buffer("running_mean", nd.zeros({num_features}, {dtype = dtype}))
    self:register_buffer("running_var", nd.ones({num_features}, {dtype = dtype}))
    self:register_buffer("num_batches_tracked", nd.tensor(0, {dtype = "int64"}))
  else
    self:register_buffer("running_mean", nil)
    self:register_buffer("running_var", nil)
    self:register_buffer("num_batches_tracked", nil)
  end
  util.place(self, o)
end

local BatchNorm = Module:extend("_BatchNorm")

function BatchNorm:init(num_features, opts)
  if math.type(num_features) ~= "integer" or num_features < 1 then
    error(("needle.nn.%s: num_features must be a positive integer, got %s"):format(
      self.__name, require("needle.options").got(num_features)), 3)
  end
  local o = util.options(self, opts, {eps = "number", momentum = "number|boolean", affine = "boolean",
                                      track_running_stats = "boolean"}, true)
  if o.momentum == true then util.fail(self, "momentum must be a number or false (PyTorch's None), got true") end
  self.num_features = num_features
  self.eps = o.eps or 1e-5
  local momentum = o.momentum
  if momentum == nil then momentum = 0.1 end
  self.momentum = momentum          -- false: cumulative average
  self.affine = o.affine ~= false
  self.track_running_stats = o.track_running_stats ~= false
  M.per_channel_state(self, num_features, o)
end

function BatchNorm:reset_running_stats()
  if self.track_running_stats then
    nd.no_grad(function()
      self.running_mean:fill_(0)
      self.running_var:fill_(1)
      self.num_batches_tracked:fill_(0)
    end)
  end
end

function BatchNorm:reset_parameters()
  self:reset_running_stats()
  if self.affine then
    nd.no_grad(function()
      self.weight:fill_(1)
      self.bias:fill_(0)
    end)
  end
end

function BatchNorm:forward(x)
  self:_check_input(x)
  if self.training and x:numel() // self.num_features <= 1 then
    error(("needle.nn.%s(%d): expected more than 1 value per channel when training, got input of shape %s"):format(
      self.__name, self.num_features, shape_str(x)), 2)
  end
  local factor = self.momentum or 0.0
  if self.training and self.track_running_stats then
    nd.no_grad(function() self.num_batches_tracked:add_(1) end)
    if self.momentum == false then factor = 1.0 / self.num_batches_tracked:item() end
  end
  local use_batch_stats = self.training or not self.track_running_stats
  local rm, rv
  if not self.training or self.track_running_stats then
    rm, rv = self.running_mean, self.running_var
  end
  return nd.F.batch_norm(x, rm, rv, self.weight, self.bias, use_batch_stats, factor, self.eps)
end

function BatchNorm:extra_repr()
  return ("%d, eps=%g, momentum=%s, affine=%s, track_running_stats=%s"):format(
    self.num_features, self.eps, self.momentum == false and "None" or tostring(self.momentum),
    tostring(self.affine), tostring(self.track_running_stats))
end

local BatchNorm1d = BatchNorm:extend("BatchNorm1d")
function BatchNorm1d:_check_input(x)
  local c = self.num_features
  if not nd.is_tensor(x) or (x:dim() ~= 2 and x:dim() ~= 3) or x:size(2) ~= c then
    error(("needle.nn.BatchNorm1d(%d): expected input with %d features (N, %d) or (N, %d, L), got %s"):format(
      c, c, c, c, nd.is_tensor(x) and shape_str(x) or type(x)), 3)
  end
end
M.BatchNorm1d = BatchNorm1d

local BatchNorm2d = BatchNorm:extend("BatchNorm2d")
function BatchNorm2d:_check_input(x)
  local c = self.num_features
  if not nd.is_tensor(x) or x:dim() ~= 4 or x:size(2) ~= c then
    error(("needle.nn.BatchNorm2d(%d): expected input with %d channels (N, %d, H, W), got %s"):format(
      c, c, c, nd.is_tensor(x) and shape_str(x) or type(x)), 3)
  end
end
M.BatchNorm2d = BatchNorm2d
M._BatchNorm = BatchNorm -- the base SyncBatchNorm extends (nn/sync_batchnorm.lua)

-- LayerNorm ----------------------------------------------------------------------

local LayerNorm = Module:extend("LayerNorm")

-- LayerNorm(normalized_shape (int or list), {eps = 1e-5, elementwise_affine = true, bias = true})
function LayerNorm:init(normalized_shape, opts)
  local given = normalized_shape
  if math.type(normalized_shape) == "integer" then normalized_shape = {normalized_shape} end
  local ok = type(normalized_shape) == "table" and #normalized_shape > 0
  if ok then
    for _, s in ipairs(normalized_shape) do
      if math.type(s) ~= "integer" or s < 1 then ok = false end
    end
  end
  if not ok then
    error(("needle.nn.%s: normalized_shape must be a positive integer or a list of them, got %s"):format(
      self.__name, require("needle.options").got(given)), 4)
  end
  local shape = {}
  for i, s in ipairs(normalized_shape) do shape[i] = s end
  self.normalized_shape = shape
  if type(opts) == "number" then opts = {eps = opts} end
  local o = util.options(self, opts, {eps = "number", elementwise_affine = "boolean", bias = "boolean"}, true)
  self.eps = o.eps or 1e-5
  self.elementwise_affine = o.elementwise_affine ~= false
  local dtype = o.dtype or "float32"
  if self.elementwise_affine then
    self.weight = Module.Parameter(nd.ones(shape, {dtype = dtype}))
    if o.bias ~= false then
      self.bias = Module.Parameter(nd.zeros(shape, {dtype = dtype}))
    else
      self:register_parameter("bias", nil)
    end
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
  util.place(self, o)
end

function LayerNorm:reset_parameters()
  nd.no_grad(function()
    if self.weight ~= nil then self.weight:fill_(1) end
    if self.bias ~= nil then self.bias:fill_(0) end
  end)
end

function LayerNorm:_sig()
  if self.__name == "LayerNorm1d" then return ("(%d)"):format(self.normalized_shape[1]) end
  if #self.normalized_shape == 1 then return ("(%d)"):format(self.normalized_shape[1]) end
  return ("({%s})"):format(table.concat(self.normalized_shape, ", "))
end

function LayerNorm:forward(x)
  local ns = self.normalized_shape
  local ok = nd.is_tensor(x) and x:dim() >= #ns
  if ok then
    for i = 1, #ns do
      if x:size(x:dim() - #ns + i) ~= ns[i] then ok = false end
    end
  end
  if not ok then
    error(("needle.nn.%s%s: expected input with last dims {%s}, got %s"):format(
      self.__name, self:_sig(), table.concat(ns, ","), nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  return nd.F.layer_norm(x, ns, self.weight, self.bias, self.eps)
end

function LayerNorm:extra_repr()
  local head
  if self.__name == "LayerNorm1d" then head = tostring(self.normalized_shape[1])
  else head = "{" .. table.concat(self.normalized_shape, ", ") .. "}" end
  return ("%s, eps=%g, elementwise_affine=%s"):format(head, self.eps, tostring(self.elementwise_affine))
end
M.LayerNorm = LayerNorm

-- LayerNorm1d(dim, {eps = 1e-5}) (or LayerNorm1d(dim, eps)): needle's, a
-- LayerNorm over the last dim with weight and bias
local LayerNorm1d = LayerNorm:extend("LayerNorm1d")
function LayerNorm1d:init(dim, opts)
  if math.type(dim) ~= "integer" then
    error(("needle.nn.LayerNorm1d: dim must be a positive integer, got %s"):format(tostring(dim)), 3)
  end
  LayerNorm.init(self, dim, opts)
end
M.LayerNorm1d = LayerNorm1d

return M
