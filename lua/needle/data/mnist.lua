-- needle.data.mnist: MNIST-format (IDX) readers, for MNIST and Fashion-MNIST.
--
--   local mnist = nd.data.mnist
--   local x, y = mnist.load("/usr/share/datasets/fashion-mnist", {train = true})
--   -- x: float32 (60000, 1, 28, 28) in [0, 1]; y: int64 labels 1..10
--   local xr = mnist.load(dir, {raw = true})           -- uint8 (60000, 28, 28)
--   local ds = mnist.dataset(dir, {train = false})      -- a TensorDataset of (x, y)
--   local t = mnist.read_idx("t10k-labels-idx1-ubyte.gz")  -- any uint8 IDX file
--
-- Labels are PyTorch's plus one (1-based class indices). Files may be plain or
-- gzip. Fashion-MNIST is Debian's package dataset-fashion-mnist, which puts
-- it in /usr/share/datasets/fashion-mnist (mnist.FASHION_DIR; mnist.fashion()).
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local util = require "needle.data.util"

local M = {}

M.FASHION_DIR = "/usr/share/datasets/fashion-mnist"
M.IMAGES_MAGIC = 2051
M.LABELS_MAGIC = 2049
M.fashion_classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                     "Sneaker", "Bag", "Ankle boot"}

local WHO = "needle.data.mnist"

local function fail(path, fmt, ...) errors.fail_at(0, ("data.mnist: '%s'"):format(path), fmt, ...) end

local TYPE_NAMES = {[0x08] = "unsigned byte", [0x09] = "signed byte", [0x0B] = "short",
                    [0x0C] = "int", [0x0D] = "float", [0x0E] = "double"}

local KIND = {[2051] = "an IDX image file (magic 2051)", [2049] = "an IDX label file (magic 2049)"}

-- parse(s, path, expect_magic) -> dims, header_bytes after checking the header
-- and that the data that follows has exactly the size the dims give.
local function parse(s, path, expect_magic)
  if #s < 4 then
    fail(path, "truncated IDX header: the file has %d bytes, an IDX file starts with a 4-byte magic number", #s)
  end
  local magic = string.unpack(">I4", s)
  local b0, b1, dtype, ndim = s:byte(1, 4)
  if expect_magic and magic ~= expect_magic then
    local hint = KIND[magic] and (" (this is " .. KIND[magic] .. ")") or ""
    fail(path, "bad magic number %d (0x%08X), expected %d (0x%08X) for %s%s", magic, magic,
      expect_magic, expect_magic, KIND[expect_magic] and KIND[expect_magic]:match("^an (.-) %(") or "IDX", hint)
  end
  if b0 ~= 0 or b1 ~= 0 then
    fail(path, "bad magic number 0x%08X: not an IDX file (the first two bytes must be 0)", magic)
  end
  if dtype ~= 0x08 then
    fail(path, "IDX data type 0x%02X (%s) is not supported, only 0x08 (unsigned byte)", dtype,
      TYPE_NAMES[dtype] or "unknown")
  end
  if ndim == 0 then fail(path, "IDX header gives 0 dimensions") end
  local header = 4 + 4 * ndim
  if #s < header then
    fail(path, "truncated IDX header: %d dimensions need a %d-byte header, the file has %d bytes",
      ndim, header, #s)
  end
  local dims, count = {}, 1
  for k = 1, ndim do
    local d = string.unpack(">I4", s, 4 * k + 1)
    dims[k] = d
    count = count * d
  end
  local have = #s - header
  if have < count then
    fail(path, "truncated: the header gives shape {%s} (%d bytes of data) but only %d bytes follow the %d-byte header",
      table.concat(dims, ","), count, have, header)
  elseif have > count then
    fail(path, "the header gives shape {%s} (%d bytes of data) but %d bytes follow the %d-byte header (%d extra)",
      table.concat(dims, ","), count, have, header, have - count)
  end
  return dims, header
end

-- read_idx(path[, expect_magic]) -> uint8 tensor with the file's dims.
function M.read_idx(path, expect_magic)
  local s = util.read(path, WHO)
  local dims, header = parse(s, path, expect_magic)
  return util.bytes_tensor(s, header + 1, dims)
end

-- read_images(path) -> uint8 (N, rows, cols)
function M.read_images(path)
  return M.read_idx(path, M.IMAGES_MAGIC)
end

-- read_labels(path) -> int64 (N) labels, 1-based (the file's value + 1)
function M.read_labels(path)
  return M.read_idx(path, M.LABELS_MAGIC):long() + 1
end

local function candidates(prefix, what, idx)
  return {
    ("%s-%s-%s-ubyte"):format(prefix, what, idx), ("%s-%s-%s-ubyte.gz"):format(prefix, what, idx),
    ("%s-%s.%s-ubyte"):format(prefix, what, idx), ("%s-%s.%s-ubyte.gz"):format(prefix, what, idx),
  }
end

local HOW_TO_GET = "Fashion-MNIST is in Debian's package dataset-fashion-mnist " ..
  "(apt-get install dataset-fashion-mnist puts it in " .. M.FASHION_DIR .. ")"

-- find(dir, train) -> images_path, labels_path
function M.find(dir, train)
  if type(dir) ~= "string" then error(("%s: expected a directory name, got %s"):format(WHO, type(dir)), 3) end
  if not util.is_dir(dir) then
    error(("%s: no MNIST data: directory '%s' does not exist; %s"):format(WHO, dir, HOW_TO_GET), 0)
  end
  local prefix = train and "train" or "t10k"
  local found = {}
  for _, what in ipairs({{"images", "idx3"}, {"labels", "idx1"}}) do
    local names = candidates(prefix, what[1], what[2])
    for _, name in ipairs(names) do
      local p = util.join(dir, name)
      if util.exists(p) then found[what[1]] = p break end
    end
    if not found[what[1]] then
      error(("%s: no %s %s file in '%s' (looked for %s); %s"):format(WHO, train and "training" or "test",
        what[1], dir, table.concat(names, ", "), HOW_TO_GET), 0)
    end
  end
  return found.images, found.labels
end

local function check_opts(opts, allowed)
  for k in pairs(opts) do
    if not allowed[k] then
      error(("%s: unknown option '%s'"):format(WHO, tostring(k)), 4)
    end
  end
end

-- load(dir, {train = true, raw = false}) -> images, labels
--   dir: a directory with the IDX files (default: FASHION_DIR)
--   raw = false: float32 (N, 1, H, W) in [0, 1]; raw = true: uint8 (N, H, W)
--   labels: int64 (N), 1-based
function M.load(dir, opts)
  dir = dir or M.FASHION_DIR
  opts = opts or {}
  check_opts(opts, {train = true, raw = true})
  local train = opts.train ~= false
  local ipath, lpath = M.find(dir, train)
  local images = M.read_images(ipath)
  if images:dim() ~= 3 then
    fail(ipath, "expected 3 dims (N, rows, cols), the header gives %d", images:dim())
  end
  local labels = M.read_labels(lpath)
  if labels:size(1) ~= images:size(1) then
    error(("%s: '%s' has %d images but '%s' has %d labels"):format(WHO, ipath, images:size(1), lpath,
      labels:size(1)), 0)
  end
  if not opts.raw then
    local n, h, w = images:size(1), images:size(2), images:size(3)
    images = (images:float() / 255):reshape({n, 1, h, w})
  end
  return images, labels
end

-- dataset(dir, {train =, raw =, transform =, target_transform =}) -> TensorDataset of (image, label)
function M.dataset(dir, opts)
  dir = dir or M.FASHION_DIR
  opts = opts or {}
  check_opts(opts, {train = true, raw = true, transform = true, target_transform = true})
  local images, labels = M.load(dir, {train = opts.train, raw = opts.raw})
  local TensorDataset = require("needle.data.dataset").TensorDataset
  return TensorDataset(images, labels, {transform = opts.transform, target_transform = opts.target_transform})
end

-- fashion(opts) = load(FASHION_DIR, opts)
function M.fashion(opts)
  return M.load(M.FASHION_DIR, opts)
end

return M
