-- needle.nn.initializers (nd.nn.init): in-place initialisers, as torch.nn.init.
--
--   local init = nd.nn.init
--   init.kaiming_uniform_(w, {a = math.sqrt(5)})     -- or init.kaiming_uniform_(w, math.sqrt(5))
--   init.xavier_uniform_(w); init.zeros_(b)
--
-- Each function fills its tensor in place under nd.no_grad (so it works on
-- parameters) and returns it. Fans follow PyTorch: for a weight of shape
-- (out, in, k...) fan_in = in * prod(k), fan_out = out * prod(k). The names
-- without the trailing underscore are aliases. Keyword arguments may be given
-- positionally (PyTorch's order) or in an options table with PyTorch's names.
local errors = require "needle.errors"
local core = require "needle.core"
local opts_check = require("needle.options").check
local got = require("needle.options").got

local init = {}

local function fail(fn, fmt, ...) errors.fail_at(3, "nn.init." .. fn, fmt, ...) end

local function check(fn, t)
  if not core.is_tensor(t) then fail(fn, "expected a tensor, got %s", type(t)) end
  if t.dtype ~= "float32" and t.dtype ~= "float64" then
    fail(fn, "expected a floating point tensor, got %s", t.dtype)
  end
end

-- the type of each keyword argument (needle.options)
local TYPES = {a = "number", b = "number", mean = "number", std = "number", val = "number", gain = "number",
               mode = "string", nonlinearity = "string"}

-- the accepted forms of fn, for an error about an extra argument
local function usage(fn, names)
  local list = table.concat(names, ", ")
  if #names == 0 then return ("%s(tensor)"):format(fn) end
  return ("%s(tensor[, %s]) or %s(tensor, {%s=})"):format(fn, list, fn, table.concat(names, "=, "))
end

-- the arguments past the last accepted one (`first` its position) must be nil;
-- names: the keyword names (or the usage itself, a string)
local function no_extra(fn, names, first, ...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if v ~= nil then
      fail(fn, "takes %s only, got an extra argument #%d: %s", type(names) == "string" and names or usage(fn, names),
           first + i - 1, got(v))
    end
  end
end

-- args: (t, opts_table) or (t, positional...) in the order of `names`; an
-- options table may have only those names. A positional argument must have
-- its keyword's type (xavier_uniform_(t, "relu") names gain, not an
-- arithmetic error).
local function options(fn, names, ...)
  local first = ...
  local out = {}
  if type(first) == "table" and not core.is_tensor(first) then
    no_extra(fn, names, 3, select(2, ...))
    local spec = {}
    for _, n in ipairs(names) do spec[n] = TYPES[n] end
    opts_check("nn.init." .. fn, first, spec)
    for _, n in ipairs(names) do out[n] = first[n] end
  else
    local args = table.pack(...)
    for i, n in ipairs(names) do
      local v = args[i]
      if v ~= nil and type(v) ~= TYPES[n] then
        local hint = ""
        if n == "gain" and type(v) == "string" then
          hint = (" (a nonlinearity's gain is nn.init.calculate_gain(%q))"):format(v)
        elseif n == "a" and type(v) == "string" and names[3] == "nonlinearity" then
          hint = (" (the nonlinearity goes fourth, or as {nonlinearity = %q})"):format(v)
        end
        fail(fn, "%s (argument %d) must be a %s, got %s%s", n, i + 1, TYPES[n], got(v), hint)
      end
      out[n] = v
    end
    no_extra(fn, names, #names + 2, select(#names + 1, ...))
  end
  return out
end

-- a number that is neither NaN nor infinite (the fill would be NaN)
local function finite(fn, name, v) require("needle.options").finite("nn.init." .. fn, name, v) end

-- gain: a finite number >= 0 (a negative gain flips the bounds of a uniform
-- and makes the std of a normal negative)
local function check_gain(fn, gain)
  if gain ~= nil and not (gain >= 0 and gain ~= math.huge) then
    fail(fn, "gain must be a finite number >= 0, got %s", tostring(gain))
  end
end

local function fill_from(t, src)
  core.no_grad(function() t:copy_(src) end)
  return t
end

-- gen(shape) * scale + shift (rand/randn), computed in place: one
-- temporary, not three. The caching allocator keeps freed blocks for
-- reuse, so the temporaries of a large model's initialisation would stay
-- in the process's resident memory. Same values as the out-of-place form.
function init._random_scaled(gen, shape, dtype, scale, shift)
  local r = gen(shape, {dtype = dtype})
  core.no_grad(function()
    r:mul_(scale)
    if shift ~= 0 then r:add_(shift) end
  end)
  return r
end
local random_scaled = init._random_scaled

local shape_str = errors.shape_str

-- calculate_gain(nonlinearity, param): PyTorch's recommended gains
function init.calculate_gain(nonlinearity, param, ...)
  no_extra("calculate_gain", "calculate_gain(nonlinearity[, param])", 3, ...)
  if type(nonlinearity) ~= "string" then
    fail("calculate_gain", "nonlinearity must be a string, got %s", nonlinearity == nil and "nil" or got(nonlinearity))
  end
  if param ~= nil and nonlinearity ~= "leaky_relu" then
    fail("calculate_gain", "param (the negative slope) is for leaky_relu only, got %s for '%s' " ..
         "(calculate_gain(nonlinearity[, param]))", got(param), nonlinearity)
  end
  local linear = {linear = true, conv1d = true, conv2d = true, conv3d = true, conv_transpose1d = true,
                  conv_transpose2d = true, conv_transpose3d = true, sigmoid = true, identity = true}
  if linear[nonlinearity] then return 1 end
  if nonlinearity == "tanh" then return 5 / 3 end
  if nonlinearity == "relu" then return math.sqrt(2) end
  if nonlinearity == "leaky_relu" then
    local slope = param
    if slope == nil then slope = 0.01 end
    if type(slope) ~= "number" then
      fail("calculate_gain", "negative_slope must be a number, got %s", type(slope))
    end
    finite("calculate_gain", "negative_slope", slope)
    return math.sqrt(2 / (1 + slope * slope))
  end
  if nonlinearity == "selu" then return 3 / 4 end
  fail("calculate_gain", "unsupported nonlinearity '%s' (expected linear, conv*, sigmoid, tanh, relu, leaky_relu or selu)",
       tostring(nonlinearity))
end

-- fans of a weight: (fan_in, fan_out); at least 2 dims
function init._calculate_fan_in_and_fan_out(t, fn)
  if t:dim() < 2 then
    fail(fn or "_calculate_fan_in_and_fan_out",
         "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape %s)", shape_str(t))
  end
  local receptive = 1
  for d = 3, t:dim() do receptive = receptive * t:size(d) end
  return t:size(2) * receptive, t:size(1) * receptive
end
local fans = init._calculate_fan_in_and_fan_out

-- uniform_(t, a = 0, b = 1)
function init.uniform_(t, ...)
  check("uniform_", t)
  local o = options("uniform_", {"a", "b"}, ...)
  local a, b = o.a or 0, o.b or 1
  finite("uniform_", "a", a)
  finite("uniform_", "b", b)
  if not (a <= b) then fail("uniform_", "expected a <= b, got a = %s and b = %s", tostring(a), tostring(b)) end
  return fill_from(t, random_scaled(core.rand, t.shape, t.dtype, b - a, a))
end

-- normal_(t, mean = 0, std = 1)
function init.normal_(t, ...)
  check("normal_", t)
  local o = options("normal_", {"mean", "std"}, ...)
  local mean, std = o.mean or 0, o.std or 1
  finite("normal_", "mean", mean)
  if not (std >= 0 and std ~= math.huge) then
    fail("normal_", "std must be a finite number >= 0, got %s", tostring(std))
  end
  return fill_from(t, random_scaled(core.randn, t.shape, t.dtype, std, mean))
end

-- constant_(t, val)
function init.constant_(t, ...)
  check("constant_", t)
  local o = options("constant_", {"val"}, ...)
  if type(o.val) ~= "number" then fail("constant_", "val must be a number, got %s", type(o.val)) end
  finite("constant_", "val", o.val)
  core.no_grad(function() t:fill_(o.val) end)
  return t
end

function init.zeros_(t, ...)
  check("zeros_", t)
  no_extra("zeros_", {}, 2, ...)
  core.no_grad(function() t:fill_(0) end)
  return t
end

function init.ones_(t, ...)
  check("ones_", t)
  no_extra("ones_", {}, 2, ...)
  core.no_grad(function() t:fill_(1) end)
  return t
end

-- xavier_uniform_(t, gain = 1): U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))
function init.xavier_uniform_(t, ...)
  check("xavier_uniform_", t)
  local o = options("xavier_uniform_", {"gain"}, ...)
  check_gain("xavier_uniform_", o.gain)
  local fan_in, fan_out = fans(t, "xavier_uniform_")
  local a = (o.gain or 1) * math.sqrt(6 / (fan_in + fan_out))
  return fill_from(t, random_scaled(core.rand, t.shape, t.dtype, 2 * a, -a))
end

-- xavier_normal_(t, gain = 1): N(0, std), std = gain * sqrt(2 / (fan_in + fan_out))
function init.xavier_normal_(t, ...)
  check("xavier_normal_", t)
  local o = options("xavier_normal_", {"gain"}, ...)
  check_gain("xavier_normal_", o.gain)
  local fan_in, fan_out = fans(t, "xavier_normal_")
  local std = (o.gain or 1) * math.sqrt(2 / (fan_in + fan_out))
  return fill_from(t, random_scaled(core.randn, t.shape, t.dtype, std, 0))
end

local function kaiming_std(fn, t, o)
  local mode = o.mode or "fan_in"
  if mode ~= "fan_in" and mode ~= "fan_out" then
    fail(fn, "mode must be 'fan_in' or 'fan_out', got %s", tostring(mode))
  end
  if o.a ~= nil then finite(fn, "a", o.a) end
  check_gain(fn, o.gain)
  local fan_in, fan_out = fans(t, fn)
  local fan = mode == "fan_in" and fan_in or fan_out
  local gain = o.gain
  if gain == nil then
    local nonlinearity = o.nonlinearity or "leaky_relu"
    -- a is leaky_relu's negative slope (ignored for another nonlinearity, as PyTorch's)
    gain = init.calculate_gain(nonlinearity, nonlinearity == "leaky_relu" and (o.a or 0) or nil)
  end
  if fan == 0 then return 0 end
  return gain / math.sqrt(fan)
end

-- kaiming_uniform_(t, a = 0, mode = "fan_in", nonlinearity = "leaky_relu"),
-- or an options table {a=, mode=, nonlinearity=, gain=} (gain overrides the
-- one computed from nonlinearity and a): U(-b, b), b = gain * sqrt(3 / fan)
function init.kaiming_uniform_(t, ...)
  check("kaiming_uniform_", t)
  local o = options("kaiming_uniform_", {"a", "mode", "nonlinearity", "gain"}, ...)
  local bound = math.sqrt(3) * kaiming_std("kaiming_uniform_", t, o)
  return fill_from(t, random_scaled(core.rand, t.shape, t.dtype, 2 * bound, -bound))
end

-- kaiming_normal_(t, a = 0, mode = "fan_in", nonlinearity = "leaky_relu"): N(0, gain / sqrt(fan))
function init.kaiming_normal_(t, ...)
  check("kaiming_normal_", t)
  local o = options("kaiming_normal_", {"a", "mode", "nonlinearity", "gain"}, ...)
  local std = kaiming_std("kaiming_normal_", t, o)
  return fill_from(t, random_scaled(core.randn, t.shape, t.dtype, std, 0))
end

-- orthogonal_(t, gain = 1): the Q of a QR decomposition of a normal matrix
-- (rows = size(1), cols = the rest), signs fixed so that diag(R) > 0, as
-- PyTorch. Modified Gram-Schmidt in float64 over the shorter side.
function init.orthogonal_(t, ...)
  check("orthogonal_", t)
  local o = options("orthogonal_", {"gain"}, ...)
  if o.gain ~= nil then finite("orthogonal_", "gain", o.gain) end
  if t:dim() < 2 then
    fail("orthogonal_", "only tensors with 2 or more dimensions are supported (shape %s)", shape_str(t))
  end
  local rows = t:size(1)
  local cols = t:numel() // math.max(rows, 1)
  if t:numel() == 0 then return t end
  -- columns of a (n, k) matrix with n >= k, orthonormalised
  local n, k = math.max(rows, cols), math.min(rows, cols)
  local a = core.randn({n, k}, {dtype = "float64"})
  local q = core.zeros({n, k}, {dtype = "float64"})
  core.no_grad(function()
    for j = 1, k do
      local v = a:select(2, j):clone()
      if j > 1 then
        local qs = q:narrow(2, 1, j - 1)              -- (n, j-1)
        -- two passes of projection for stability
        for _ = 1, 2 do v = v - qs:matmul(qs:t():matmul(v)) end
      end
      local norm = math.sqrt((v * v):sum():item())
      q:select(2, j):copy_(v / norm)
    end
  end)
  if rows < cols then q = q:t() end
  return fill_from(t, (q * (o.gain or 1)):reshape(t.shape):to(t.dtype))
end

-- aliases without the trailing underscore
local aliases = {}
for name, fn in pairs(init) do
  if name:sub(-1) == "_" and name:sub(1, 1) ~= "_" then aliases[name:sub(1, -2)] = fn end
end
for name, fn in pairs(aliases) do init[name] = fn end

return init
