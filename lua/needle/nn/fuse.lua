-- needle.nn.fuse: operator fusion for inference.
--
--   local fused = nd.nn.fuse(model)          -- a new model; `model` is left untouched
--   nd.no_grad(function() return fused(x) end)
--
-- fuse(model, {requires_grad = false}) deep-copies the model, folds every
-- BatchNorm that follows a Conv2d or a Linear into that layer's weight and
-- bias (with the running statistics: eval mode), and replaces these chains
-- of a Sequential's children by one fused module:
--
--   Conv2d, BatchNorm2d, ReLU -> FusedConv2d(relu)   Linear, BatchNorm1d, ReLU -> FusedLinear(relu)
--   Conv2d, BatchNorm2d       -> FusedConv2d         Linear, BatchNorm1d       -> FusedLinear
--   Conv2d, ReLU              -> FusedConv2d(relu)   Linear, ReLU              -> FusedLinear(relu)
--   and the same with GELU (approximate = "none") in place of ReLU -> (gelu)
--
-- The modules a chain replaces become Identity, so children keep their
-- positions (as torch.ao.quantization.fuse_modules does). FusedConv2d and
-- FusedLinear run nd.fused_conv2d / nd.fused_linear: one GEMM whose epilogue
-- adds the bias and applies the ReLU. Other modules are copied and their
-- children fused recursively (Residual, ModuleList, custom modules).
--
-- Fuse hooks: a module class with a method `:fuse(F)` is replaced by what
-- it returns (F is this table); the hook sees a private copy of the module,
-- so it may reuse the copy's children. ResNet9's ConvBN block:
--   function ConvBN:fuse(F) return F.conv_bn(self.conv, self.bn, {relu = true}) end
--
-- The result is in eval mode and, being for inference, its parameters do not
-- require grad (pass {requires_grad = true} to keep them trainable: the
-- fused ops then run as the composed differentiable ops whenever autograd
-- records, so gradients stay correct).
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local nd = require "needle"
local Module = require "needle.nn.module"
local options = require "needle.options"
local util = require "needle.nn.util"

local F = {}

local fail = errors.failer("nn.fuse", 3)

local function class_of(m) return getmetatable(m).class end

local function is_a(m, cls)
  local c = class_of(m)
  while c ~= nil do
    if c == cls then return true end
    c = rawget(c, "super")
  end
  return false
end

local function pair_str(p) return ("{%d, %d}"):format(p[1], p[2]) end

local shape_str = errors.shape_str

local ACTS = {none = true, relu = true, gelu = true}

local function check_activation(cls, a)
  if not ACTS[a] then
    error(("needle.nn.%s: activation must be 'none', 'relu' or 'gelu', got %s"):format(
      cls, type(a) == "string" and ("'" .. a .. "'") or tostring(a)), 4)
  end
end

-- FusedConv2d ---------------------------------------------------------------------

local FusedConv2d = Module:extend("FusedConv2d")

-- FusedConv2d(in_channels, out_channels, kernel_size, {stride=1, padding=0,
-- dilation=1, groups=1, bias=true, activation="none"|"relu"|"gelu", dtype=}):
-- act(conv2d(x, weight, bias)). Built by F.conv_bn; the weights start at 0.
function FusedConv2d:init(in_channels, out_channels, kernel_size, opts)
  opts = util.options(self, opts, {stride = "integer|table", padding = "integer|table|string",
                                   dilation = "integer|table", groups = "integer", bias = "boolean",
                                   activation = "string"}, true)
  local function pr(v) return type(v) == "table" and {v[1], v[2]} or {v, v} end
  self.in_channels, self.out_channels = in_channels, out_channels
  self.kernel_size = pr(kernel_size)
  self.stride, self.dilation = pr(opts.stride or 1), pr(opts.dilation or 1)
  self.padding = opts.padding == "same" and "same" or pr(opts.padding or 0)
  self.groups = opts.groups or 1
  self.activation = opts.activation or "none"
  check_activation("FusedConv2d", self.activation)
  local dtype = opts.dtype or "float32"
  self.weight = Module.Parameter(nd.zeros({out_channels, in_channels // self.groups,
                                          self.kernel_size[1], self.kernel_size[2]}, {dtype = dtype}))
  if opts.bias == false then
    self:register_parameter("bias", nil)
  else
    self.bias = Module.Parameter(nd.zeros({out_channels}, {dtype = dtype}))
  end
  util.place(self, opts)
end

function FusedConv2d:forward(x)
  if not nd.is_tensor(x) or (x:dim() ~= 4 and x:dim() ~= 3) or x:size(x:dim() - 2) ~= self.in_channels then
    error(("needle.nn.FusedConv2d(%d, %d): expected input with %d channels (N, %d, H, W), got %s"):format(
      self.in_channels, self.out_channels, self.in_channels, self.in_channels,
      nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  local padding
  x, padding = require("needle.nn.conv").resolve_padding(self, x)
  return nd.fused_conv2d(x, self.weight, self.bias, {stride = self.stride, padding = padding,
    dilation = self.dilation, groups = self.groups, activation = self.activation})
end

function FusedConv2d:extra_repr()
  local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
    pair_str(self.kernel_size), pair_str(self.stride))
  if self.padding == "same" then s = s .. ", padding='same'"
  elseif self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. ", padding=" .. pair_str(self.padding) end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then s = s .. ", dilation=" .. pair_str(self.dilation) end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if self.bias == nil then s = s .. ", bias=false" end
  return s .. ", activation=" .. self.activation
end
F.FusedConv2d = FusedConv2d

-- FusedLinear ---------------------------------------------------------------------

local FusedLinear = Module:extend("FusedLinear")

-- FusedLinear(in_features, out_features, {bias=true, activation="none"|"relu"|"gelu",
-- dtype=}): act(x @ weight^T + bias), any leading dims. Built by F.linear_bn.
function FusedLinear:init(in_features, out_features, opts)
  opts = util.options(self, opts, {bias = "boolean", activation = "string", folded_batch_norm = "boolean"}, true)
  self.in_features, self.out_features = in_features, out_features
  self.activation = opts.activation or "none"
  check_activation("FusedLinear", self.activation)
  -- a BatchNorm1d folded in normalised dim 2 of 2-D inputs only: a 3-D input
  -- (N, C, L) would have had its channels elsewhere
  self.folded_batch_norm = opts.folded_batch_norm or false
  local dtype = opts.dtype or "float32"
  self.weight = Module.Parameter(nd.zeros({out_features, in_features}, {dtype = dtype}))
  if opts.bias == false then
    self:register_parameter("bias", nil)
  else
    self.bias = Module.Parameter(nd.zeros({out_features}, {dtype = dtype}))
  end
  util.place(self, opts)
end

function FusedLinear:forward(x)
  local sig = ("(%d, %d)"):format(self.in_features, self.out_features)
  if not nd.is_tensor(x) or x:dim() == 0 or x:size(-1) ~= self.in_features then
    error(("needle.nn.FusedLinear%s: expected input with last dim %d, got %s"):format(
      sig, self.in_features, nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  if self.folded_batch_norm and x:dim() ~= 2 then
    error(("needle.nn.FusedLinear%s: a BatchNorm1d was folded in, which normalised (N, C) inputs: "
      .. "expected a 2-D input, got %s"):format(sig, shape_str(x)), 2)
  end
  return nd.fused_linear(x, self.weight, self.bias, {activation = self.activation})
end

function FusedLinear:extra_repr()
  return ("in_features=%d, out_features=%d, bias=%s, activation=%s%s"):format(self.in_features,
    self.out_features, tostring(self.bias ~= nil), self.activation,
    self.folded_batch_norm and ", batch_norm folded" or "")
end
F.FusedLinear = FusedLinear

-- BatchNorm folding -------------------------------------------------------------------

local function f64(t) return t:detach():to({device = "cpu", dtype = "float64"}) end

-- BatchNorm in eval mode is y = (x - running_mean) * rstd * gamma + beta per
-- channel, rstd = (running_var + eps)^-1/2: checks that bn can be folded into
-- a layer with `channels` outputs
local function check_bn(bn, channels, what)
  local name = ("%s(%d)"):format(bn.__name, bn.num_features)
  if bn.num_features ~= channels then
    fail("cannot fold %s into %s with %d output channels", name, what, channels)
  end
  if not bn.track_running_stats or bn.running_mean == nil or bn.running_var == nil then
    fail("cannot fold %s: it has no running statistics (track_running_stats=false), so it " ..
         "normalises with each batch's own statistics even in eval mode", name)
  end
end

-- (weight, bias) of a layer followed by bn (or nil), as float64 cpu tensors:
-- nd.fold_batch_norm (the formula nd.compile's fold pass uses too), W' = W *
-- scale per output channel, b' = (b - mean) * scale + beta, scale = gamma * rstd
local function fold(layer, bn, what)
  local w = f64(layer.weight)
  local b = layer.bias ~= nil and f64(layer.bias) or nil
  if bn == nil then return w, b end
  check_bn(bn, w:size(1), what)
  local rstd = (f64(bn.running_var) + bn.eps):rsqrt()
  return nd.fold_batch_norm(w, b, f64(bn.running_mean), rstd, bn.weight ~= nil and f64(bn.weight) or nil,
                            bn.bias ~= nil and f64(bn.bias) or nil)
end

-- copies a float64 cpu tensor into p (p's dtype and device), in place
local function put(p, v)
  nd.no_grad(function() p:copy_(v:to({device = p.device, dtype = p.dtype})) end)
end

-- eval mode; parameters require grad only with opts.requires_grad
local function finish(m, opts)
  m:eval()
  local keep = (opts and opts.requires_grad) and true or false
  for _, p in ipairs(m:parameters()) do p.requires_grad = keep end
  return m
end

local function check_layer(fn, layer, cls, what)
  if not Module.is_module(layer) or not is_a(layer, cls) then
    error(("needle.nn.fuse.%s: expected a %s, got %s"):format(fn, what,
      Module.is_module(layer) and layer.__name or type(layer)), 3)
  end
end

-- the fused module on layer's device with the folded weight and bias
local function fill(fused, layer, w, b, opts)
  local dev = layer.weight.device
  if dev ~= "cpu" then fused:to(dev) end
  put(fused.weight, w)
  if b ~= nil then put(fused.bias, b) end
  return finish(fused, opts)
end

-- F.conv_bn(conv, bn_or_nil, {relu = false, gelu = false, requires_grad = false})
-- -> a FusedConv2d equal to act(bn(conv(x))) with bn's running statistics
-- (act: relu, gelu or none). conv and bn are read, never modified.
local FOLD_OPTS = {relu = "boolean", gelu = "boolean", requires_grad = "boolean"}

local function fold_activation(op, opts)
  if opts and opts.relu and opts.gelu then
    error(("needle.nn.fuse.%s: relu and gelu are both set: one activation"):format(op), 3)
  end
  return (opts and opts.relu) and "relu" or (opts and opts.gelu) and "gelu" or "none"
end

function F.conv_bn(conv, bn, opts)
  local nn = nd.nn
  opts = options.check("nn.fuse.conv_bn", opts, FOLD_OPTS)
  local act = fold_activation("conv_bn", opts)
  check_layer("conv_bn", conv, nn.Conv2d, "Conv2d")
  if bn ~= nil then check_layer("conv_bn", bn, nn.BatchNorm2d, "BatchNorm2d (or nil)") end
  local w, b = fold(conv, bn, ("Conv2d(%d, %d)"):format(conv.in_channels, conv.out_channels))
  local fused = FusedConv2d(conv.in_channels, conv.out_channels, conv.kernel_size, {
    stride = conv.stride, padding = conv.padding, dilation = conv.dilation, groups = conv.groups,
    bias = b ~= nil, activation = act, dtype = conv.weight.dtype})
  return fill(fused, conv, w, b, opts)
end

-- F.linear_bn(linear, bn_or_nil, {relu = false, gelu = false, requires_grad = false})
-- -> a FusedLinear equal to act(bn(linear(x))) (BatchNorm1d on (N, C) inputs).
function F.linear_bn(linear, bn, opts)
  local nn = nd.nn
  opts = options.check("nn.fuse.linear_bn", opts, FOLD_OPTS)
  local act = fold_activation("linear_bn", opts)
  check_layer("linear_bn", linear, nn.Linear, "Linear")
  if bn ~= nil then check_layer("linear_bn", bn, nn.BatchNorm1d, "BatchNorm1d (or nil)") end
  local w, b = fold(linear, bn, ("Linear(%d, %d)"):format(linear.in_features, linear.out_features))
  local fused = FusedLinear(linear.in_features, linear.out_features, {
    bias = b ~= nil, activation = act, folded_batch_norm = bn ~= nil, dtype = linear.weight.dtype})
  return fill(fused, linear, w, b, opts)
end

-- deep copy ---------------------------------------------------------------------------

-- A copy of v: modules and tensors copied once each (memo), so weights tied
-- between modules and modules used twice stay shared in the copy; plain
-- tables copied; anything with another metatable (classes, nd.null) kept.
local function deep_copy(v, memo)
  if memo[v] ~= nil then return memo[v] end
  if nd.is_tensor(v) then
    local c = nd.no_grad(function() return v:detach():clone() end)
    c.requires_grad = v.requires_grad
    memo[v] = c
    return c
  end
  if type(v) ~= "table" then return v end
  if Module.is_module(v) then
    local c = setmetatable({_params = {}, _buffers = {}, _children = {}, _order = {}, _attrs = {},
                            training = rawget(v, "training")}, getmetatable(v))
    memo[v] = c
    for _, e in ipairs(rawget(v, "_order")) do rawget(c, "_order")[#rawget(c, "_order") + 1] = {e[1], e[2]} end
    for _, part in ipairs({"_params", "_buffers", "_children", "_attrs"}) do
      local src, dst = rawget(v, part), rawget(c, part)
      for k, x in pairs(src) do dst[k] = deep_copy(x, memo) end
    end
    for k, x in next, v do -- any other raw field (a subclass's own bookkeeping)
      if rawget(c, k) == nil then rawset(c, k, deep_copy(x, memo)) end
    end
    return c
  end
  if getmetatable(v) ~= nil then return v end
  local c = {}
  memo[v] = c
  for k, x in pairs(v) do c[deep_copy(k, memo)] = deep_copy(x, memo) end
  return c
end

-- fusing ------------------------------------------------------------------------------

-- the chain starting at children[i] of a Sequential: the fused module and
-- how many children it replaces, or nil
local function match(children, i)
  local nn = nd.nn
  local a, b, c = children[i], children[i + 1], children[i + 2]
  local function cls(m, k) return m ~= nil and class_of(m) == k end
  -- the activation module m stands for, as fold options (nil: none it can fuse;
  -- a tanh GELU is another function)
  local function act(m)
    if cls(m, nn.ReLU) then return {relu = true} end
    if cls(m, nn.GELU) and m.approximate == "none" then return {gelu = true} end
  end
  local layer, fold = nil, nil
  if cls(a, nn.Conv2d) then layer, fold = nn.BatchNorm2d, F.conv_bn
  elseif cls(a, nn.Linear) then layer, fold = nn.BatchNorm1d, F.linear_bn
  else return nil end
  if cls(b, layer) then
    local o = act(c)
    if o then return fold(a, b, o), 3 end
    return fold(a, b), 2
  end
  local o = act(b)
  if o then return fold(a, nil, o), 2 end
  return nil
end

local fuse_tree

-- fuses m (a private copy: changed in place) and returns its replacement
function fuse_tree(m, memo)
  if memo[m] ~= nil then return memo[m] end
  local nn = nd.nn
  local r = m
  if type(m.fuse) == "function" then
    r = m:fuse(F)
    if not Module.is_module(r) then
      error(("needle.nn.fuse: %s:fuse(F) must return a module, got %s"):format(m.__name, type(r)), 3)
    end
  elseif is_a(m, nn.Sequential) then
    local list = m:totable()
    local i = 1
    while i <= #list do
      local fused, n = match(list, i)
      if fused then
        m[i] = fused
        for k = i + 1, i + n - 1 do m[k] = nn.Identity() end
        i = i + n
      else
        m[i] = fuse_tree(list[i], memo)
        i = i + 1
      end
    end
  else
    local children = rawget(m, "_children")
    for _, c in ipairs(m:named_children()) do children[c[1]] = fuse_tree(c[2], memo) end
  end
  memo[m] = r
  return r
end

-- F.fuse(model, {requires_grad = false}) -> the fused copy (see the top)
function F.fuse(model, opts)
  if not Module.is_module(model) then fail("expected a module, got %s", type(model)) end
  opts = options.check("nn.fuse", opts, {requires_grad = "boolean"})
  local copy = deep_copy(model, {})
  return finish(fuse_tree(copy, {}), opts)
end

return F
