-- needle.data.transforms: per-sample image transforms on CHW tensors.
--
--   local T = nd.data.transforms
--   local tf = T.Compose({T.ScaleTo01(), T.RandomCrop(32, {padding = 4}),
--                         T.RandomFlipHorizontal(0.5), T.Normalize({0.49, 0.48, 0.45}, {0.25, 0.24, 0.26})})
--   local y = tf(x)                 -- x: (C, H, W)
--
-- Every transform is a callable object. The random ones draw from the global
-- generator (as torchvision does), so nd.manual_seed makes them reproducible.
local errors = require "needle.errors"
local core = require "needle.core"
local options = require "needle.options"
local util = require "needle.data.util"
local no_extra, got = util.no_extra, util.got

local is_tensor = core.is_tensor

local T = {}

local function errorf(name, fmt, ...) errors.fail_at(3, "data.transforms." .. name, fmt, ...) end

local Transform = {}
Transform.__index = Transform
Transform.__call = function(self, x) return self:apply(x) end
Transform.__tostring = function(self) return self.repr end

local function make(repr, apply, fields)
  local obj = fields or {}
  obj.repr = repr
  obj.apply = apply
  return setmetatable(obj, Transform)
end

-- t with the recipe a DataLoader worker thread rebuilds it from: T[name](...)
-- in the worker's own Lua state (Lambda has none: a function cannot cross)
local function rebuildable(t, name, ...)
  t.__worker = {module = "needle.data.transforms", fn = name, args = table.pack(...)}
  return t
end

local function callable(f)
  return type(f) == "function" or (type(f) == "table" and (getmetatable(f) or {}).__call ~= nil)
end

local function check_image(name, x, min_dims)
  if not is_tensor(x) then errorf(name, "expected a tensor, got %s", type(x)) end
  if x:dim() < min_dims then
    errorf(name, "expected a tensor with at least %d dims (C, H, W), got shape {%s}", min_dims,
      table.concat(x.shape, ","))
  end
end

-- Compose({t1, t2, ...}): applies each in turn.
function T.Compose(list, ...)
  -- Compose(t1, t2) (the transforms not in a list) would be an empty Compose
  -- that drops them all
  if callable(list) or select("#", ...) > 0 then
    errorf("Compose", "expected a list of transforms: Compose({t1, t2}), got %s%s",
           getmetatable(list) == Transform and "the transform " .. tostring(list) or got(list),
           select("#", ...) > 0 and (" and %d more argument(s)"):format(select("#", ...)) or "")
  end
  if type(list) ~= "table" or is_tensor(list) then
    errorf("Compose", "expected a list of transforms: Compose({t1, t2}), got %s", got(list))
  end
  local n = #list
  for k in pairs(list) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      errorf("Compose", "expected a list of transforms (keys 1..%d), got the key %s", n, got(k))
    end
  end
  local parts = {}
  for k = 1, n do
    local t = list[k]
    if not callable(t) then
      errorf("Compose", "item %d is %s, expected a callable transform", k, got(t))
    end
    parts[#parts + 1] = tostring(t)
  end
  return rebuildable(make("Compose(" .. table.concat(parts, ", ") .. ")", function(_, x)
    for _, t in ipairs(list) do x = t(x) end
    return x
  end, {transforms = list}), "Compose", list)
end

-- Lambda(fn): a function as a transform.
function T.Lambda(fn, ...)
  no_extra("data.transforms.Lambda", "Lambda(fn)", 1, ...)
  if not callable(fn) then errorf("Lambda", "expected a function, got %s", type(fn)) end
  return make("Lambda()", function(_, x) return fn(x) end)
end

-- ToFloat(): x:float().
function T.ToFloat(...)
  no_extra("data.transforms.ToFloat", "ToFloat()", 0, ...)
  return rebuildable(make("ToFloat()", function(_, x)
    if not is_tensor(x) then errorf("ToFloat", "expected a tensor, got %s", type(x)) end
    return x:float()
  end), "ToFloat")
end

-- ScaleTo01(): uint8 pixels 0..255 to float32 in [0, 1] (x:float() / 255).
function T.ScaleTo01(...)
  no_extra("data.transforms.ScaleTo01", "ScaleTo01()", 0, ...)
  return rebuildable(make("ScaleTo01()", function(_, x)
    if not is_tensor(x) then errorf("ScaleTo01", "expected a tensor, got %s", type(x)) end
    return x:float() / 255
  end), "ScaleTo01")
end

-- RandomFlipHorizontal(p = 0.5): with probability p, flips the last dim (W).
function T.RandomFlipHorizontal(p, ...)
  no_extra("data.transforms.RandomFlipHorizontal", "RandomFlipHorizontal([p])", 1, ...)
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    errorf("RandomFlipHorizontal", "p must be a number in [0, 1], got %s", tostring(p))
  end
  return rebuildable(make(("RandomFlipHorizontal(p=%g)"):format(p), function(_, x)
    check_image("RandomFlipHorizontal", x, 1)
    if p > 0 and core.rand({1}):item() < p then return x:flip(-1) end
    return x
  end, {p = p}), "RandomFlipHorizontal", p)
end

local function pair(name, what, v)
  if math.type(v) == "integer" then return v, v end
  if type(v) == "table" and #v == 2 and math.type(v[1]) == "integer" and math.type(v[2]) == "integer" then
    return v[1], v[2]
  end
  errorf(name, "%s must be an integer or a pair {h, w} of integers, got %s", what, tostring(v))
end

-- RandomCrop(size, {padding = 0, fill = 0}): pads H and W with `fill`
-- (padding: n on every side, or {left, right, top, bottom}), then cuts a
-- size x size (or {h, w}) window at a uniformly random position.
function T.RandomCrop(size, opts, ...)
  no_extra("data.transforms.RandomCrop", "RandomCrop(size[, opts])", 2, ...)
  opts = options.check("data.transforms.RandomCrop", opts, {padding = "integer|table", fill = "number"})
  local h, w = pair("RandomCrop", "size", size)
  if h < 1 or w < 1 then errorf("RandomCrop", "size must be positive, got {%d, %d}", h, w) end
  local pad = opts.padding or 0
  local pl, pr, pt, pb
  if math.type(pad) == "integer" then
    pl, pr, pt, pb = pad, pad, pad, pad
  elseif type(pad) == "table" and #pad == 4 then
    pl, pr, pt, pb = pad[1], pad[2], pad[3], pad[4]
  else
    errorf("RandomCrop", "padding must be an integer or {left, right, top, bottom}, got %s", tostring(pad))
  end
  for _, v in ipairs({pl, pr, pt, pb}) do
    if math.type(v) ~= "integer" or v < 0 then
      errorf("RandomCrop", "padding values must be non-negative integers, got %s", tostring(v))
    end
  end
  local fill = opts.fill or 0
  local repr = ("RandomCrop(size={%d, %d}, padding={%d, %d, %d, %d})"):format(h, w, pl, pr, pt, pb)
  return rebuildable(make(repr, function(_, x)
    check_image("RandomCrop", x, 2)
    if pl + pr + pt + pb > 0 then x = x:pad({pl, pr, pt, pb}, fill) end
    local H, W = x:size(-2), x:size(-1)
    if h > H or w > W then
      errorf("RandomCrop", "crop {%d, %d} is larger than the padded image {%d, %d}", h, w, H, W)
    end
    local u = core.rand({2}):totable()
    local i = math.floor(u[1] * (H - h + 1)) + 1
    local j = math.floor(u[2] * (W - w + 1)) + 1
    return x:narrow(-2, i, h):narrow(-1, j, w):contiguous()
  end, {size = {h, w}, padding = {pl, pr, pt, pb}}), "RandomCrop", {h, w}, {padding = {pl, pr, pt, pb}, fill = fill})
end

-- Normalize(mean, std): (x - mean[c]) / std[c] per channel (dim -3), with
-- mean and std numbers or lists of one value per channel.
function T.Normalize(mean, std, ...)
  no_extra("data.transforms.Normalize", "Normalize(mean, std)", 2, ...)
  local function as_list(what, v)
    if type(v) == "number" then
      if not (v - v == 0) then errorf("Normalize", "%s must be finite, got %s", what, v ~= v and "nan" or tostring(v)) end
      return {v}
    end
    if type(v) == "table" and #v > 0 then
      for k, e in ipairs(v) do
        if type(e) ~= "number" then errorf("Normalize", "%s[%d] is a %s, expected a number", what, k, type(e)) end
        -- NaN and infinities fail (x - x is NaN for both)
        if not (e - e == 0) then errorf("Normalize", "%s[%d] must be finite, got %s", what, k, e ~= e and "nan" or tostring(e)) end
      end
      return v
    end
    errorf("Normalize", "%s must be a number or a list of numbers, got %s", what, type(v))
  end
  local m, s = as_list("mean", mean), as_list("std", std)
  if #m ~= #s then errorf("Normalize", "mean has %d values but std has %d", #m, #s) end
  for k, v in ipairs(s) do
    if v == 0 then errorf("Normalize", "std[%d] is 0", k) end
  end
  local C = #m
  local mt = core.tensor(m):reshape({C, 1, 1})
  local st = core.tensor(s):reshape({C, 1, 1})
  local function fmt(list)
    local parts = {}
    for k, v in ipairs(list) do parts[k] = ("%g"):format(v) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return rebuildable(make(("Normalize(mean=%s, std=%s)"):format(fmt(m), fmt(s)), function(_, x)
    check_image("Normalize", x, C > 1 and 3 or 0)
    if C > 1 and x:size(-3) ~= C then
      errorf("Normalize", "expected %d channels (dim -3), got shape {%s}", C, table.concat(x.shape, ","))
    end
    local xf = x
    if xf.dtype ~= "float32" and xf.dtype ~= "float64" then xf = xf:float() end
    if C == 1 then return (xf - m[1]) / s[1] end
    return (xf - mt) / st
  end, {mean = m, std = s}), "Normalize", m, s)
end

return T
