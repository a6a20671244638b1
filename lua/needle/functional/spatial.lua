-- needle.functional.spatial: the spatial functions of nd.F (issue 20), merged
-- into nd.F by needle.functional.
--
--   conv1d, conv3d, conv_transpose1d, max_pool1d, avg_pool1d,
--   adaptive_max_pool2d                   needle.functional.conv_nd
--   group_norm, instance_norm, rms_norm   needle.functional.norm_sample
--   interpolate, pixel_shuffle,
--   pixel_unshuffle                       needle.functional.resample
--   pad, one_hot, dropout2d               here
--
-- Every one is written with differentiable ops (no kernel of its own), so
-- each has gradients and runs on every device those ops run on.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local A = require "needle.functional.spatial_args"

local S = {}

local fail, shape_str, show = A.fail, A.shape_str, A.show

for _, family in ipairs({"needle.functional.conv_nd", "needle.functional.norm_sample",
                         "needle.functional.resample"}) do
  for name, fn in pairs(require(family)) do
    if type(fn) == "function" then S[name] = fn end
  end
end

-- pad -------------------------------------------------------------------------------

-- the 1-based source index of each output position of a dim of size n
-- padded by lo and hi (negative: cropped) in mode
local function pad_map(mode, n, lo, hi)
  local idx = {}
  for o = 0, n + lo + hi - 1 do
    local i = o - lo
    if mode == "replicate" then i = math.min(math.max(i, 0), n - 1)
    elseif mode == "circular" then i = i % n
    elseif i < 0 then i = -i -- reflect about the first element
    elseif i >= n then i = 2 * (n - 1) - i end
    idx[o + 1] = i + 1
  end
  return idx
end

local PAD_MODES = {constant = true, reflect = true, replicate = true, circular = true}

-- pad(x, pad, {mode = "constant", value = 0}) or pad(x, pad, mode, value):
-- pad = {left, right[, top, bottom[, front, back]]...}, from the last dim
-- backwards as PyTorch's; negative sizes crop. Modes other than "constant"
-- pad the last 1, 2 or 3 dims of an input with 1 or 2 more dims (batch,
-- channel), as PyTorch.
function S.pad(x, pad, mode, value)
  local op = "pad"
  if type(mode) == "table" then
    if value ~= nil then fail(op, "options given twice (a table and then %s)", type(value)) end
    local o = options.check(op, mode, {mode = "string", value = "number"})
    mode, value = o.mode, o.value
  end
  A.tensor(op, x)
  mode = mode or "constant"
  if not PAD_MODES[mode] then
    fail(op, "mode must be 'constant', 'reflect', 'replicate' or 'circular', got %s", show(mode))
  end
  if value ~= nil and type(value) ~= "number" then fail(op, "value must be a number, got %s", type(value)) end
  local ok = type(pad) == "table" and not core.is_tensor(pad) and #pad % 2 == 0 and #pad > 0
  for i = 1, ok and #pad or 0 do
    if A.int(pad[i]) == nil then ok = false end
  end
  if not ok then fail(op, "pad must be a non-empty list of integers of even length, got %s", show(pad)) end
  local pairs_n = #pad // 2
  if pairs_n > x:dim() then
    fail(op, "pad %s has %d pairs, more than the %d dims of input %s", show(pad), pairs_n, x:dim(), shape_str(x))
  end
  if mode == "constant" then
    local ints = {}
    for i = 1, #pad do ints[i] = A.int(pad[i]) end
    local r = x:pad(ints, value or 0)
    return r
  end
  if value ~= nil and value ~= 0 then
    fail(op, "mode '%s' takes no value (got %s)", mode, tostring(value))
  end
  if pairs_n > 3 or (x:dim() ~= pairs_n + 1 and x:dim() ~= pairs_n + 2) then
    fail(op, "mode '%s' pads the last 1, 2 or 3 dims of an input with 1 or 2 more dims (batch, channels): " ..
         "%d pad pairs do not fit input %s", mode, pairs_n, shape_str(x))
  end
  local y = x
  for k = 1, pairs_n do
    local dim, lo, hi = x:dim() - k + 1, A.int(pad[2 * k - 1]), A.int(pad[2 * k])
    local n = x:size(dim)
    if mode == "reflect" and (lo >= n or hi >= n) then
      fail(op, "reflect padding (%d, %d) of dim %d must be smaller than its size %d (input %s)", lo, hi, dim, n,
           shape_str(x))
    end
    if mode == "circular" and (lo > n or hi > n) then
      fail(op, "circular padding (%d, %d) of dim %d must be at most its size %d (input %s)", lo, hi, dim, n,
           shape_str(x))
    end
    if n + lo + hi < 1 or n == 0 then
      fail(op, "padding (%d, %d) of dim %d leaves no element of input %s", lo, hi, dim, shape_str(x))
    end
    if lo ~= 0 or hi ~= 0 then y = A.select(y, dim, pad_map(mode, n, lo, hi)) end
  end
  if y == x then y = x * 1 end
  return y
end

-- one_hot -------------------------------------------------------------------------------

-- one_hot(labels (int tensor or table of class indices 1..C), num_classes = -1)
-- or one_hot(labels, {num_classes=}) -> int64 of labels.shape + {C}; -1
-- takes C from the largest label. nd.one_hot (a C op) does the work.
function S.one_hot(labels, num_classes)
  if type(num_classes) == "table" then
    num_classes = options.check("one_hot", num_classes, {num_classes = "integer"}).num_classes
  end
  if num_classes == nil then num_classes = -1 end
  if core._host_read then core._host_read("one_hot") end -- (a graph break under its own name)
  if A.int(num_classes) == nil then
    fail("one_hot", "num_classes must be an integer, got %s", show(num_classes))
  end
  local ok, r = pcall(core.one_hot, labels, A.int(num_classes))
  if not ok then errors.raise(r) end
  return r
end

-- dropout2d -------------------------------------------------------------------------------

-- dropout2d(x (N, C, H, W) or (N, C, L), p = 0.5, training = true): zeroes
-- whole channels with probability p and scales the rest by 1 / (1 - p). A
-- 3-D input is (N, C, L), as PyTorch's dropout2d (which warns about it).
function S.dropout2d(x, p, training, ...)
  local op = "dropout2d"
  A.tensor(op, x)
  if p == nil then p = 0.5 end
  if training == nil then training = true end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    fail(op, "p must be in [0, 1], got %s%s", options.got(p), type(p) == "table" and not core.is_tensor(p)
         and " (dropout2d takes (x, p, training) positionally, not an options table)" or "")
  end
  if type(training) ~= "boolean" then fail(op, "training must be a boolean, got %s", options.got(training)) end
  A.no_extra(op, "dropout2d(x[, p, training])", 4, ...)
  if x:dim() ~= 3 and x:dim() ~= 4 then
    fail(op, "expected input of shape (N, C, H, W) or (N, C, L), got %s", shape_str(x))
  end
  if not training or p == 0 then return x end
  if p == 1 then return x * 0 end
  local shape = {x:size(1), x:size(2)}
  for _ = 3, x:dim() do shape[#shape + 1] = 1 end
  -- one draw per channel, made on x's device
  local keep = core.bernoulli(core.full(shape, 1 - p, {dtype = x.dtype, device = x.device}))
  return x * keep * (1 / (1 - p))
end

return S
