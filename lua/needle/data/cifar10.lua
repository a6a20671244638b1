-- needle.data.cifar10: the CIFAR-10 binary version.
--
--   local cifar = nd.data.cifar10
--   local x, y = cifar.load("data/cifar-10-batches-bin", {train = true})
--   -- x: float32 (50000, 3, 32, 32) in [0, 1]; y: int64 labels 1..10
--   local ds = cifar.dataset(dir, {train = false, transform = tf})
--   cifar.synthetic(tmpdir, {n = 20})   -- tiny files in the same format, for tests
--
-- A batch file (data_batch_1.bin .. data_batch_5.bin, test_batch.bin) is a
-- sequence of 3073-byte records: one label byte (0..9) and 3072 pixel bytes,
-- the red, green and blue 32x32 planes in row-major order, i.e. CHW. Labels
-- come back 1-based (the file's value + 1). Files may also be gzip.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local options = require "needle.options"
local util = require "needle.data.util"

local M = {}

M.RECORD = 3073
M.classes = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
M.train_files = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                 "data_batch_5.bin"}
M.test_files = {"test_batch.bin"}

local WHO = "needle.data.cifar10"

local HOW_TO_GET = "the data is the binary version of CIFAR-10 (cifar-10-binary.tar.gz from the " ..
  "CIFAR-10 site, unpacked to a directory cifar-10-batches-bin); Debian has no package of it; " ..
  "cifar10.synthetic(dir) writes small files of the same format for tests"

-- read_batch(path) -> images uint8 (N, 3, 32, 32), labels int64 (N) 1-based
function M.read_batch(path)
  local s = util.read(path, WHO)
  local size = #s
  if size == 0 then error(("%s: '%s': empty file, expected 3073-byte records"):format(WHO, path), 0) end
  if size % M.RECORD ~= 0 then
    error(("%s: '%s': truncated or corrupt: %d bytes is not a whole number of 3073-byte records " ..
      "(%d records and %d bytes left over)"):format(WHO, path, size, size // M.RECORD, size % M.RECORD), 0)
  end
  local n = size // M.RECORD
  local rec = util.bytes_tensor(s, 1, {n, M.RECORD})
  local labels = rec:select(2, 1):long()
  local maxv, imax = labels:max(1)
  if maxv:item() > 9 then
    error(("%s: '%s': record %d has label byte %d (expected 0..9)"):format(WHO, path, imax:item(),
      maxv:item()), 0)
  end
  local images = rec:narrow(2, 2, 3072):reshape({n, 3, 32, 32})
  return images, labels + 1
end

-- files(dir, train) -> list of paths; the batches may be in dir or in
-- dir/cifar-10-batches-bin, plain or .gz
function M.files(dir, train)
  if type(dir) ~= "string" then error(("%s: expected a directory name, got %s"):format(WHO, type(dir)), 3) end
  if not util.is_dir(dir) then
    error(("%s: no CIFAR-10 data: directory '%s' does not exist; %s"):format(WHO, dir, HOW_TO_GET), 0)
  end
  local names = train and M.train_files or M.test_files
  local base = dir
  local sub = util.join(dir, "cifar-10-batches-bin")
  local function find(d, name)
    for _, n in ipairs({name, name .. ".gz"}) do
      local p = util.join(d, n)
      if util.exists(p) then return p end
    end
  end
  if not find(dir, names[1]) and util.is_dir(sub) then base = sub end
  local out = {}
  for _, name in ipairs(names) do
    local p = find(base, name)
    if not p then
      error(("%s: '%s' is missing (looked for %s and %s.gz in '%s'%s); %s"):format(WHO,
        util.join(base, name), name, name, base, base == dir and (" and '" .. sub .. "'") or "", HOW_TO_GET), 0)
    end
    out[#out + 1] = p
  end
  return out
end

-- load(dir, {train = true, raw = false}) -> images, labels
--   raw = false: float32 (N, 3, 32, 32) in [0, 1]; raw = true: uint8
function M.load(dir, opts)
  opts = options.check("data.cifar10.load", opts, {train = "boolean", raw = "boolean"})
  local xs, ys = {}, {}
  for _, p in ipairs(M.files(dir, opts.train ~= false)) do
    local x, y = M.read_batch(p)
    xs[#xs + 1], ys[#ys + 1] = x, y
  end
  local images = #xs == 1 and xs[1] or core.cat(xs, 1)
  local labels = #ys == 1 and ys[1] or core.cat(ys, 1)
  if not opts.raw then images = images:float() / 255 end
  return images, labels
end

-- dataset(dir, {train =, raw =, transform =, target_transform =}) -> TensorDataset of (image, label)
function M.dataset(dir, opts)
  opts = options.check("data.cifar10.dataset", opts, {train = "boolean", raw = "boolean", transform = "callable",
                                                      target_transform = "callable"})
  local images, labels = M.load(dir, {train = opts.train, raw = opts.raw})
  local TensorDataset = require("needle.data.dataset").TensorDataset
  return TensorDataset(images, labels, {transform = opts.transform, target_transform = opts.target_transform})
end

-- synthetic(dir, {n = 10, seed = 1}) writes data_batch_1..5.bin and
-- test_batch.bin with n records each into an existing directory dir. The
-- pixels come from a small generator of our own (the global random stream is
-- not touched): each class has its own mean colour, plus noise, so a model can
-- learn them. Returns the list of paths written.
function M.synthetic(dir, opts)
  opts = options.check("data.cifar10.synthetic", opts, {n = "integer", seed = "integer"})
  local n = opts.n or 10
  if math.type(n) ~= "integer" or n < 1 then error(("%s: synthetic: n must be a positive integer"):format(WHO), 2) end
  local state = (opts.seed or 1) * 6364136223846793005 + 1442695040888963407
  local function rnd() -- 64-bit LCG, top bits
    state = state * 6364136223846793005 + 1442695040888963407
    return (state >> 33) & 0x7fffffff
  end
  local paths = {}
  local names = {}
  for _, f in ipairs(M.train_files) do names[#names + 1] = f end
  names[#names + 1] = M.test_files[1]
  for _, name in ipairs(names) do
    local p = util.join(dir, name)
    local f, err = io.open(p, "wb")
    if not f then error(("%s: synthetic: cannot write '%s': %s"):format(WHO, p, err), 2) end
    for _ = 1, n do
      local label = rnd() % 10
      local rec = {string.char(label)}
      for c = 0, 2 do
        local mean = (label * 37 + c * 91) % 200 + 28
        local bytes = {}
        for i = 1, 1024 do
          local v = mean + (rnd() % 49) - 24
          bytes[i] = v < 0 and 0 or (v > 255 and 255 or v)
        end
        for k = 1, 1024, 256 do rec[#rec + 1] = string.char(table.unpack(bytes, k, k + 255)) end
      end
      f:write(table.concat(rec))
    end
    f:close()
    paths[#paths + 1] = p
  end
  return paths
end

return M
