-- needle.nn.linear: Identity, Linear, Flatten, Unflatten.
--
--   local fc = nd.nn.Linear(784, 128)            -- {bias = true}
--   fc.weight  -- (128, 784), PyTorch's layout; fc.bias (128)
--
-- Linear's default initialisation is PyTorch's: weight kaiming_uniform with
-- a = sqrt(5) (U(-1/sqrt(in), 1/sqrt(in))), bias U(-1/sqrt(in), 1/sqrt(in)).
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"

local M = {}

local util = require "needle.nn.util"
local shape_str = require("needle.errors").shape_str

local function check_int(name, what, v, min)
  if math.type(v) ~= "integer" or v < (min or 1) then
    error(("needle.nn.%s: %s must be an integer >= %d, got %s"):format(name, what, min or 1, tostring(v)), 4)
  end
end

local function check_tensor(self, x, sig)
  if not nd.is_tensor(x) then
    error(("needle.nn.%s%s: expected a tensor input, got %s"):format(self.__name, sig, type(x)), 4)
  end
end

-- Identity ---------------------------------------------------------------------

-- Identity(...): its arguments are ignored, as PyTorch's ("any argument
-- (unused)"), so that it can stand in for any module
local Identity = Module:extend("Identity")
function Identity:init() end
function Identity:forward(x) return x end
M.Identity = Identity

-- Linear -------------------------------------------------------------------------

local Linear = Module:extend("Linear")

-- Linear(in_features, out_features, {bias = true, dtype = "float32", device = "cpu"})
function Linear:init(in_features, out_features, opts)
  check_int("Linear", "in_features", in_features, 0)
  check_int("Linear", "out_features", out_features, 0)
  local o = util.options(self, opts, {bias = "boolean"}, true)
  self.in_features, self.out_features = in_features, out_features
  local dtype = o.dtype or "float32"
  self.weight = Module.Parameter(nd.empty({out_features, in_features}, {dtype = dtype}))
  if o.bias ~= false then
    self.bias = Module.Parameter(nd.empty({out_features}, {dtype = dtype}))
  else
    self:register_parameter("bias", nil)
  end
  self:reset_parameters()
  util.place(self, o)
end

function Linear:reset_parameters()
  init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
  if self.bias ~= nil then
    local bound = self.in_features > 0 and 1 / math.sqrt(self.in_features) or 0
    init.uniform_(self.bias, -bound, bound)
  end
end

function Linear:forward(x)
  local sig = ("(%d, %d)"):format(self.in_features, self.out_features)
  check_tensor(self, x, sig)
  if x:dim() == 0 or x:size(-1) ~= self.in_features then
    error(("needle.nn.Linear%s: expected input with last dim %d, got %s"):format(
      sig, self.in_features, shape_str(x)), 2)
  end
  return nd.F.linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return ("in_features=%d, out_features=%d, bias=%s"):format(self.in_features, self.out_features,
                                                             tostring(self.bias ~= nil))
end
M.Linear = Linear

-- the activations the fused linear kernel applies in its GEMM's epilogue
-- (nd.F.fused_linear: one pass over a feed-forward block's largest
-- activation instead of two, the same values as act(lin(x)))
local FUSED = {gelu = "gelu", relu = "relu"}

-- M.linear_act(lin, act_name, act, x) -> act(lin(x)), in one kernel when
-- act_name names an activation the kernel fuses and lin is a plain Linear
-- whose call nothing watches (no module hooks: a hook on lin must see its
-- output); else act(lin(x)) as written. For the feed-forward blocks of the
-- Transformer layers and the model zoo.
function M.linear_act(lin, act_name, act, x)
  local fused = FUSED[act_name]
  local mt = getmetatable(lin)
  if fused and mt and mt.class == Linear and rawget(lin, "_hooks") == nil then
    return nd.F.fused_linear(x, lin.weight, lin.bias, {activation = fused})
  end
  return act(lin(x))
end

-- Flatten ------------------------------------------------------------------------

local Flatten = Module:extend("Flatten")

-- Flatten(start_dim = 2, end_dim = -1) or Flatten({start_dim=, end_dim=}):
-- 1-based dims, so the default keeps the batch dim (PyTorch's start_dim=1)
function Flatten:init(start_dim, end_dim)
  if type(start_dim) == "table" then
    local o = util.options(self, start_dim, {start_dim = "integer", end_dim = "integer"})
    start_dim, end_dim = o.start_dim, o.end_dim
  end
  for _, d in ipairs({{"start_dim", start_dim}, {"end_dim", end_dim}}) do
    if d[2] ~= nil and (math.type(d[2]) ~= "integer" or d[2] == 0) then
      util.fail(self, "%s must be a nonzero integer (1-based, negative from the end), got %s", d[1], tostring(d[2]))
    end
  end
  self.start_dim, self.end_dim = start_dim or 2, end_dim or -1
end

function Flatten:forward(x)
  check_tensor(self, x, "")
  if x:dim() == 0 then return x:reshape({1}) end
  return x:flatten(self.start_dim, self.end_dim)
end

function Flatten:extra_repr()
  return ("start_dim=%d, end_dim=%d"):format(self.start_dim, self.end_dim)
end
M.Flatten = Flatten

-- Unflatten ----------------------------------------------------------------------

local Unflatten = Module:extend("Unflatten")

-- Unflatten(dim, unflattened_size): dim (1-based, negative from the end)
-- becomes the sizes (one may be -1)
function Unflatten:init(dim, unflattened_size)
  if math.type(dim) ~= "integer" or dim == 0 then
    error(("needle.nn.Unflatten: dim must be a nonzero integer (1-based), got %s"):format(tostring(dim)), 3)
  end
  if type(unflattened_size) ~= "table" or #unflattened_size == 0 then
    error("needle.nn.Unflatten: unflattened_size must be a non-empty list of sizes", 3)
  end
  self.dim, self.unflattened_size = dim, unflattened_size
end

function Unflatten:forward(x)
  local n = x:dim()
  local d = self.dim < 0 and n + 1 + self.dim or self.dim
  local sig = ("(%d, {%s})"):format(self.dim, table.concat(self.unflattened_size, ", "))
  if d < 1 or d > n then
    error(("needle.nn.Unflatten%s: dim %d out of range for input of shape %s"):format(sig, self.dim, shape_str(x)), 2)
  end
  local prod, infer = 1, false
  for _, s in ipairs(self.unflattened_size) do
    if s == -1 then infer = true else prod = prod * s end
  end
  if (infer and (prod == 0 or x:size(d) % prod ~= 0)) or (not infer and prod ~= x:size(d)) then
    error(("needle.nn.Unflatten%s: dim %d of input %s has size %d, which does not split into {%s}"):format(
      sig, self.dim, shape_str(x), x:size(d), table.concat(self.unflattened_size, ",")), 2)
  end
  local shape = {}
  for i = 1, d - 1 do shape[#shape + 1] = x:size(i) end
  for _, s in ipairs(self.unflattened_size) do shape[#shape + 1] = s end
  for i = d + 1, n do shape[#shape + 1] = x:size(i) end
  return x:reshape(shape)
end

function Unflatten:extra_repr()
  return ("dim=%d, unflattened_size={%s}"):format(self.dim, table.concat(self.unflattened_size, ", "))
end
M.Unflatten = Unflatten

return M
