-- needle.nn.activation: ReLU, LeakyReLU, GELU, SiLU, Tanh, Sigmoid, Softmax,
-- LogSoftmax, ELU, Softplus, Mish, Hardswish, Hardsigmoid, ReLU6, Hardtanh -
-- modules around the nd.F functions (no parameters) - and PReLU (a learnt
-- slope).
--
--   nd.nn.GELU({approximate = "tanh"}); nd.nn.Softmax(-1); nd.nn.LeakyReLU(0.2)
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local util = require "needle.nn.util"

local M = {}

-- PyTorch's `inplace` (ReLU, ReLU6, Hardtanh, LeakyReLU, SiLU, Dropout, ...)
-- is accepted so that ported code builds the same model. ReLU, ReLU6 and
-- Hardtanh honour it where autograd does not need their input (grad mode
-- off, or an input that does not require grad): the result is written into
-- the input and the input returned, one pass over memory instead of a new
-- tensor (a ResNet-50 forward under no_grad makes 49 ReLUs of up to 25 MB).
-- Where autograd needs the input (training), and for the other modules, the
-- result is a new tensor (the same values; the input is left as it was):
-- needle refuses in-place writes to tensors that require grad.
local INPLACE = {inplace = "boolean"}

local function writes_in_place(self, x)
  return self.inplace and nd.is_tensor(x) and not (x.requires_grad and nd.is_grad_enabled())
end

-- ReLU(), SiLU() ({inplace=} only), Tanh(), Sigmoid() (no options: an
-- options table, if given, must be empty); in_place_fn: the in-place form
-- that inplace = true runs where it may
local function simple(name, fn, spec, in_place_fn)
  local C = Module:extend(name)
  -- (inplace stored as a boolean: a missing field is looked up through the
  -- module's metatables, which cost a ReLU call 0.5 us)
  function C:init(opts) self.inplace = util.options(self, opts, spec).inplace == true end
  if in_place_fn then
    function C:forward(x)
      -- (the attribute read raw: through the module's __index it cost a call
      -- 0.2-0.5 us, more than the ReLU of a small tensor)
      if rawget(self, "_attrs").inplace and writes_in_place(self, x) then return in_place_fn(x) end
      return fn(x)
    end
  else
    function C:forward(x) return fn(x) end
  end
  function C:extra_repr() return self.inplace and "inplace=true" or "" end
  M[name] = C
  return C
end

simple("ReLU", function(x) return nd.F.relu(x) end, INPLACE, function(x) return x:relu_() end)
simple("Tanh", function(x) return nd.F.tanh(x) end, {})
simple("Sigmoid", function(x) return nd.F.sigmoid(x) end, {})
simple("SiLU", function(x) return nd.F.silu(x) end, INPLACE)
simple("Mish", function(x) return nd.F.mish(x) end, INPLACE)
simple("Hardswish", function(x) return nd.F.hardswish(x) end, INPLACE)
simple("Hardsigmoid", function(x) return nd.F.hardsigmoid(x) end, INPLACE)
simple("ReLU6", function(x) return nd.F.relu6(x) end, INPLACE, function(x) return x:clamp_(0, 6) end)

-- a setting that must be a finite number (NaN or inf would make every output NaN)
local function finite(self, name, v)
  if v ~= nil then require("needle.options").finite("nn." .. self.__name, name, v) end
end

-- ELU({alpha = 1, inplace=}) or ELU(alpha)
local ELU = Module:extend("ELU")
function ELU:init(alpha, opts)
  alpha, opts = util.first_or_options(self, alpha, opts, "alpha", "number", INPLACE)
  finite(self, "alpha", alpha)
  self.inplace = opts.inplace
  self.alpha = alpha or 1.0
end
function ELU:forward(x) return nd.F.elu(x, self.alpha) end
function ELU:extra_repr() return ("alpha=%s"):format(self.alpha) end
M.ELU = ELU

-- Softplus({beta = 1, threshold = 20})
local Softplus = Module:extend("Softplus")
function Softplus:init(opts)
  local o = util.options(self, opts, {beta = "number", threshold = "number"})
  finite(self, "beta", o.beta)
  finite(self, "threshold", o.threshold)
  if o.beta == 0 then util.fail(self, "beta must not be 0 (softplus divides by it)") end
  self.beta, self.threshold = o.beta or 1, o.threshold or 20
end
function Softplus:forward(x) return nd.F.softplus(x, {beta = self.beta, threshold = self.threshold}) end
function Softplus:extra_repr() return ("beta=%s, threshold=%s"):format(self.beta, self.threshold) end
M.Softplus = Softplus

-- Hardtanh({min_val = -1, max_val = 1, inplace=})
local Hardtanh = Module:extend("Hardtanh")
function Hardtanh:init(opts)
  local o = util.options(self, opts, {min_val = "number", max_val = "number", inplace = "boolean"})
  self.min_val, self.max_val, self.inplace = o.min_val or -1, o.max_val or 1, o.inplace == true
  if not (self.min_val <= self.max_val) then
    util.fail(self, "min_val must be <= max_val, got %s and %s", self.min_val, self.max_val)
  end
end
function Hardtanh:forward(x)
  if writes_in_place(self, x) then return x:clamp_(self.min_val, self.max_val) end
  return nd.F.hardtanh(x, self.min_val, self.max_val)
end
function Hardtanh:extra_repr() return ("min_val=%s, max_val=%s"):format(self.min_val, self.max_val) end
M.Hardtanh = Hardtanh

-- PReLU({num_parameters = 1, init = 0.25, dtype=, device=}): weight (a
-- parameter of num_parameters slopes: 1, or the input's channels)
local PReLU = Module:extend("PReLU")
function PReLU:init(opts)
  local o = util.options(self, opts, {num_parameters = "integer", init = "number"}, true)
  finite(self, "init", o.init)
  local n = o.num_parameters or 1
  if n < 1 then util.fail(self, "num_parameters must be >= 1, got %d", n) end
  self.num_parameters = n
  self.weight = Module.Parameter(nd.full({n}, o.init or 0.25, {dtype = o.dtype or "float32"}))
  util.place(self, o)
end
function PReLU:forward(x) return nd.F.prelu(x, self.weight) end
function PReLU:extra_repr() return ("num_parameters=%d"):format(self.num_parameters) end
M.PReLU = PReLU

-- LeakyReLU(negative_slope = 0.01[, {inplace=}]) or LeakyReLU({negative_slope=, inplace=})
local LeakyReLU = Module:extend("LeakyReLU")
function LeakyReLU:init(negative_slope, opts)
  negative_slope, opts = util.first_or_options(self, negative_slope, opts, "negative_slope", "number", INPLACE)
  self.inplace = opts.inplace
  if negative_slope ~= nil and not (type(negative_slope) == "number" and negative_slope > -math.huge
                                   and negative_slope < math.huge) then
    util.fail(self, "negative_slope must be a finite number, got %s", tostring(negative_slope))
  end
  self.negative_slope = negative_slope or 0.01
end
function LeakyReLU:forward(x) return nd.F.leaky_relu(x, self.negative_slope) end
function LeakyReLU:extra_repr()
  return ("negative_slope=%s%s"):format(self.negative_slope, self.inplace and ", inplace=true" or "")
end
M.LeakyReLU = LeakyReLU

-- GELU({approximate = "none" | "tanh"}) or GELU("tanh")
local GELU = Module:extend("GELU")
function GELU:init(opts)
  local approximate = opts
  if type(opts) == "table" then approximate = util.options(self, opts, {approximate = "string"}).approximate end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    error(("needle.nn.GELU: approximate must be 'none' or 'tanh', got %s"):format(tostring(approximate)), 3)
  end
  self.approximate = approximate
end
function GELU:forward(x) return nd.F.gelu(x, {approximate = self.approximate}) end
function GELU:extra_repr() return ("approximate='%s'"):format(self.approximate) end
M.GELU = GELU

-- Softmax(dim = -1), LogSoftmax(dim = -1): 1-based dims, or {dim=}
local function softmax_class(name, fn)
  local C = Module:extend(name)
  function C:init(dim)
    if type(dim) == "table" then dim = util.options(self, dim, {dim = "integer"}).dim end
    if dim ~= nil and (math.type(dim) ~= "integer" or dim == 0) then
      error(("needle.nn.%s: dim must be a nonzero integer (1-based, negative from the end), got %s"):format(
        name, tostring(dim)), 3)
    end
    self.dim = dim or -1
  end
  function C:forward(x) return fn(x, self.dim) end
  function C:extra_repr() return ("dim=%d"):format(self.dim) end
  M[name] = C
end
softmax_class("Softmax", function(x, d) return nd.F.softmax(x, d) end)
softmax_class("LogSoftmax", function(x, d) return nd.F.log_softmax(x, d) end)

return M
