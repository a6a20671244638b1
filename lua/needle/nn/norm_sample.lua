-- needle.nn.norm_sample: GroupNorm, InstanceNorm2d, RMSNorm - the
-- normalisation layers whose statistics are taken per sample.
--
--   nd.nn.GroupNorm(4, 32, {eps = 1e-5, affine = true})
--   nd.nn.InstanceNorm2d(16, {affine = true, track_running_stats = true})
--   nd.nn.RMSNorm(512, {eps = 1e-6})     -- eps nil: torch.finfo(x.dtype).eps
--
-- Parameters and buffers have PyTorch's names (weight, bias, running_mean,
-- running_var, num_batches_tracked), so a PyTorch state_dict loads by name.
-- The forward passes are nd.F's (needle.functional.norm_sample).
local nd = require "needle"
local Module = require "needle.nn.module"
local util = require "needle.nn.util"
local A = require "needle.functional.spatial_args"

local M = {}

local shape_str = A.shape_str

local function check_count(self, what, v)
  if math.type(v) ~= "integer" or v < 1 then
    util.fail(self, "%s must be a positive integer, got %s", what, tostring(v))
  end
end

local function got(x) return nd.is_tensor(x) and shape_str(x) or type(x) end

-- GroupNorm ---------------------------------------------------------------------------

local GroupNorm = Module:extend("GroupNorm")

-- GroupNorm(num_groups, num_channels, {eps=1e-5, affine=true, dtype=, device=})
function GroupNorm:init(num_groups, num_channels, opts)
  check_count(self, "num_groups", num_groups)
  check_count(self, "num_channels", num_channels)
  if num_channels % num_groups ~= 0 then
    util.fail(self, "num_channels (%d) must be divisible by num_groups (%d)", num_channels, num_groups)
  end
  local o = util.options(self, opts, {eps = "number", affine = "boolean"}, true)
  self.num_groups, self.num_channels = num_groups, num_channels
  self.eps = o.eps or 1e-5
  self.affine = o.affine ~= false
  local dtype = o.dtype or "float32"
  if self.affine then
    self.weight = Module.Parameter(nd.ones({num_channels}, {dtype = dtype}))
    self.bias = Module.Parameter(nd.zeros({num_channels}, {dtype = dtype}))
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
  util.place(self, o)
end

function GroupNorm:reset_parameters()
  if self.affine then
    nd.no_grad(function()
      self.weight:fill_(1)
      self.bias:fill_(0)
    end)
  end
end

function GroupNorm:forward(x)
  local c = self.num_channels
  if not nd.is_tensor(x) or x:dim() < 2 or x:size(2) ~= c then
    util.fail(("GroupNorm(%d, %d)"):format(self.num_groups, c), "expected input with %d channels (N, %d, *), got %s",
              c, c, got(x))
  end
  return nd.F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
end

function GroupNorm:extra_repr()
  return ("%d, %d, eps=%g, affine=%s"):format(self.num_groups, self.num_channels, self.eps, tostring(self.affine))
end
M.GroupNorm = GroupNorm

-- InstanceNorm2d ------------------------------------------------------------------------

local InstanceNorm2d = Module:extend("InstanceNorm2d")

-- InstanceNorm2d(num_features, {eps=1e-5, momentum=0.1, affine=false, track_running_stats=false,
--                dtype=, device=}); momentum = false is PyTorch's None (no update of the
--                running statistics, as PyTorch's instance norm)
function InstanceNorm2d:init(num_features, opts)
  check_count(self, "num_features", num_features)
  local o = util.options(self, opts, {eps = "number", momentum = "number|boolean", affine = "boolean",
                                      track_running_stats = "boolean"}, true)
  if o.momentum == true then util.fail(self, "momentum must be a number or false (PyTorch's None), got true") end
  self.num_features = num_features
  self.eps = o.eps or 1e-5
  if o.momentum == nil then self.momentum = 0.1 else self.momentum = o.momentum end
  self.affine = o.affine == true
  self.track_running_stats = o.track_running_stats == true
  require("needle.nn.norm").per_channel_state(self, num_features, o)
end

function InstanceNorm2d:reset_parameters()
  nd.no_grad(function()
    if self.track_running_stats then
      self.running_mean:fill_(0)
      self.running_var:fill_(1)
      self.num_batches_tracked:fill_(0)
    end
    if self.affine then
      self.weight:fill_(1)
      self.bias:fill_(0)
    end
  end)
end

-- (N, C, H, W) or unbatched (C, H, W). A channel count other than
-- num_features is an error where the parameters or the running statistics
-- need it (PyTorch warns and goes on otherwise, as this does).
function InstanceNorm2d:forward(x)
  local c = self.num_features
  local ok = nd.is_tensor(x) and (x:dim() == 3 or x:dim() == 4)
  if ok and (self.affine or self.track_running_stats) then ok = x:size(x:dim() - 2) == c end
  if not ok then
    util.fail(("InstanceNorm2d(%d)"):format(c), "expected input with %d channels (N, %d, H, W) or (%d, H, W), got %s",
              c, c, c, got(x))
  end
  local unbatched = x:dim() == 3
  if unbatched then x = x:unsqueeze(1) end
  local use_input_stats = self.training or not self.track_running_stats
  local y = nd.F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_input_stats,
                               self.momentum or 0.0, self.eps)
  if unbatched then y = y:squeeze(1) end
  return y
end

function InstanceNorm2d:extra_repr()
  return ("%d, eps=%g, momentum=%s, affine=%s, track_running_stats=%s"):format(self.num_features, self.eps,
    self.momentum == false and "None" or tostring(self.momentum), tostring(self.affine),
    tostring(self.track_running_stats))
end
M.InstanceNorm2d = InstanceNorm2d

-- RMSNorm ---------------------------------------------------------------------------------

local RMSNorm = Module:extend("RMSNorm")

-- RMSNorm(normalized_shape (int or list), {eps=nil, elementwise_affine=true, dtype=, device=})
function RMSNorm:init(normalized_shape, opts)
  local shape = normalized_shape
  if math.type(shape) == "integer" then shape = {shape} end
  local ok = type(shape) == "table" and not nd.is_tensor(shape) and #shape > 0
  for i = 1, ok and #shape or 0 do
    if math.type(shape[i]) ~= "integer" or shape[i] < 1 then ok = false end
  end
  if not ok then
    util.fail(self, "normalized_shape must be a positive integer or a list of them, got %s", A.show(normalized_shape))
  end
  local o = util.options(self, opts, {eps = "number", elementwise_affine = "boolean"}, true)
  self.normalized_shape = {table.unpack(shape)}
  self.eps = o.eps -- nil: the input dtype's machine epsilon, at each call
  self.elementwise_affine = o.elementwise_affine ~= false
  if self.elementwise_affine then
    self.weight = Module.Parameter(nd.ones(self.normalized_shape, {dtype = o.dtype or "float32"}))
  else
    self:register_parameter("weight", nil)
  end
  util.place(self, o)
end

function RMSNorm:reset_parameters()
  if self.weight ~= nil then nd.no_grad(function() self.weight:fill_(1) end) end
end

function RMSNorm:forward(x)
  local ns = self.normalized_shape
  local ok = nd.is_tensor(x) and x:dim() >= #ns
  for i = 1, ok and #ns or 0 do
    if x:size(x:dim() - #ns + i) ~= ns[i] then ok = false end
  end
  if not ok then
    util.fail(("RMSNorm({%s})"):format(table.concat(ns, ", ")), "expected input with last dims {%s}, got %s",
              table.concat(ns, ","), got(x))
  end
  return nd.F.rms_norm(x, ns, self.weight, self.eps)
end

function RMSNorm:extra_repr()
  return ("{%s}, eps=%s, elementwise_affine=%s"):format(table.concat(self.normalized_shape, ", "),
    self.eps == nil and "None" or ("%g"):format(self.eps), tostring(self.elementwise_affine))
end
M.RMSNorm = RMSNorm

return M
