-- needle.image (nd.image): image files to tensors, and the usual ImageNet
-- preprocessing (docs/image.md).
--
--   local img = nd.image.read("cat.jpg")                 -- uint8 (3, H, W), as torchvision's read_image
--   local x = nd.image.preprocess(img)                   -- float32 (3, 224, 224), normalised
--   local logits = model(x:unsqueeze(1))
--
-- Decoding is C (src/io/image.c): PNG through libpng, JPEG through
-- libjpeg-turbo, binary PPM/PGM by hand; files are untrusted input, sizes are
-- bounded before anything is allocated.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local fail_at = errors.fail_at

local MODES = {rgb = 3, gray = 1, unchanged = 0}

-- image.read(path[, {mode = "rgb" | "gray" | "unchanged", device =}]) -> uint8 (C, H, W)
function M.read(path, opts)
  opts = options.check("image.read", opts, {mode = "string", device = "string"})
  local mode = opts.mode or "rgb"
  if MODES[mode] == nil then
    fail_at(2, "image.read", "mode must be 'rgb', 'gray' or 'unchanged', got '%s'", tostring(mode))
  end
  if type(path) ~= "string" then fail_at(2, "image.read", "expected a file name, got %s", type(path)) end
  local hwc = core._image_read(path, MODES[mode])
  local chw = hwc:permute({3, 1, 2}):contiguous()
  if opts.device then chw = chw:to(opts.device) end
  return chw
end

local function check_image(who, x)
  if not core.is_tensor(x) or x:dim() ~= 3 then
    fail_at(3, who, "expected an image tensor (C, H, W), got %s",
            core.is_tensor(x) and ("shape {" .. table.concat(x.shape, ", ") .. "}") or type(x))
  end
end

-- image.resize(x, size[, {mode = "bilinear"}]): x (C, H, W); size a number
-- (the shorter side becomes size, the aspect ratio kept, as torchvision's
-- Resize) or {h, w}. uint8 in, uint8 out (rounded and clamped); float stays float.
function M.resize(x, size, opts)
  check_image("image.resize", x)
  opts = options.check("image.resize", opts, {mode = "string"})
  local H, W = x:size(2), x:size(3)
  local h, w
  if type(size) == "number" then
    if size < 1 or size % 1 ~= 0 then fail_at(2, "image.resize", "size must be a positive integer, got %s", size) end
    if H <= W then h, w = size, math.floor(size * W / H) else h, w = math.floor(size * H / W), size end
  elseif type(size) == "table" and #size == 2 then
    h, w = size[1], size[2]
  else
    fail_at(2, "image.resize", "size must be a number or {h, w}, got %s", type(size))
  end
  local is_u8 = x.dtype == "uint8"
  local f = is_u8 and x:float() or x
  local y = require("needle.functional").interpolate(f:unsqueeze(1), {size = {h, w}, mode = opts.mode or "bilinear",
                                                                      align_corners = false}):squeeze(1)
  if is_u8 then y = y:round():clamp(0, 255):to({dtype = "uint8"}) end
  return y
end

-- image.center_crop(x, size): the central size x size (or {h, w}) window
function M.center_crop(x, size)
  check_image("image.center_crop", x)
  local h, w = size, size
  if type(size) == "table" then h, w = size[1], size[2] end
  local H, W = x:size(2), x:size(3)
  if type(h) ~= "number" or type(w) ~= "number" or h > H or w > W or h < 1 or w < 1 then
    fail_at(2, "image.center_crop", "cannot crop %sx%s from an image of %dx%d", tostring(h), tostring(w), H, W)
  end
  -- torchvision's offsets: int(round(d / 2)) with Python's round, half to even (0.5 -> 0, 1.5 -> 2)
  local function round_even(v)
    local f = math.floor(v)
    if v - f ~= 0.5 then return math.floor(v + 0.5) end
    return f % 2 == 0 and f or f + 1
  end
  local top, left = round_even((H - h) / 2), round_even((W - w) / 2)
  return x:narrow(2, top + 1, h):narrow(3, left + 1, w)
end

M.IMAGENET_MEAN = {0.485, 0.456, 0.406}
M.IMAGENET_STD = {0.229, 0.224, 0.225}

-- image.preprocess(img[, {resize = 256, crop = 224, mean =, std =}]): the
-- torchvision ImageNet evaluation transform: resize the shorter side, centre
-- crop, scale to [0, 1], normalise per channel. Returns float32 (3, crop, crop).
function M.preprocess(img, opts)
  check_image("image.preprocess", img)
  opts = options.check("image.preprocess", opts, {resize = "integer", crop = "integer", mean = "table", std = "table"})
  local x = M.resize(img, opts.resize or 256)
  x = M.center_crop(x, opts.crop or 224)
  x = x:float() / 255
  local mean, std = opts.mean or M.IMAGENET_MEAN, opts.std or M.IMAGENET_STD
  if #mean ~= x:size(1) or #std ~= x:size(1) then
    fail_at(2, "image.preprocess", "mean and std need %d values (one per channel), got %d and %d", x:size(1), #mean, #std)
  end
  local m = core.tensor(mean, {device = x.device}):reshape({-1, 1, 1})
  local s = core.tensor(std, {device = x.device}):reshape({-1, 1, 1})
  return (x - m) / s
end

return M
