-- needle.serialize: tensors to and from safetensors files
-- (https://huggingface.co/docs/safetensors), behind nd.save and nd.load, and
-- PyTorch checkpoints (nd.load_torch; nd.load reads them too).
--
--   nd.save({["fc.weight"] = w, ["fc.bias"] = b}, "model.safetensors", {epoch = "3"})
--   local tensors, metadata = nd.load("model.safetensors")
--
-- The C core (src/io/safetensors.c) does the work: the reader treats a file as
-- untrusted input and checks every length, offset, shape and dtype before it
-- allocates anything; the writer streams each tensor (any strides) into a
-- temporary file that replaces `path` only once it is complete and synced, so
-- a failed save leaves the old file intact. This module checks the Lua-side
-- arguments and gives the errors their names.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"

local M = {}

-- "needle.<op>: ..." with no position (0)
local fail_at = require("needle.errors").fail_at

-- Strips the "file:line: " an error picked up inside this package, so that
-- the message starts with "needle.<op>:".
function M.strip_position(msg)
  if type(msg) ~= "string" or msg:find("^needle%.") then return msg end
  return (msg:gsub("^[^\n]-:%d+: ", "", 1))
end

-- The public form of impl: its errors are raised again at the caller's
-- position (level 2), as errors from the C functions are.
function M.public(impl)
  return function(...)
    local r = table.pack(pcall(impl, ...))
    if r[1] then return table.unpack(r, 2, r.n) end
    error(M.strip_position(r[2]), 2)
  end
end

local function check_path(op, path)
  if type(path) ~= "string" then fail_at(0, op, "path must be a string, got %s", type(path)) end
  if path == "" then fail_at(0, op, "path is empty") end
  -- a NUL byte in it is refused by the C functions (lt_check_path)
end

-- save(tensors, path[, metadata[, op]]) (op: internal, save_as): tensors is {name = tensor} (names are
-- any strings; a module is saved through its state_dict()); metadata is
-- {string = string}. Tensors keep their dtype (float16, bfloat16 and bool
-- included) and are written row-major whatever their strides.
local function save(tensors, path, metadata, op)
  op = op or "save"
  if type(tensors) == "table" and getmetatable(tensors) and type(tensors.state_dict) == "function"
      and not core.is_tensor(tensors) then
    tensors = tensors:state_dict()
  end
  if core.is_tensor(tensors) then
    fail_at(0, op, "expected a table of named tensors ({name = tensor}), got a single tensor")
  end
  if type(tensors) ~= "table" then fail_at(0, op, "expected a table of tensors, got %s", type(tensors)) end
  check_path(op, path)
  for k, v in pairs(tensors) do
    if type(k) ~= "string" then
      fail_at(0, op, "tensor names must be strings, got %s key %s", type(k), tostring(k))
    end
    if not core.is_tensor(v) then
      fail_at(0, op, "value for '%s' is a %s, not a tensor%s", k, type(v),
           type(v) == "table" and " (nested state: use nd.checkpoint.save)" or "")
    end
    if k == "__metadata__" then fail_at(0, op, "'__metadata__' cannot be a tensor name") end
  end
  if metadata ~= nil then
    if type(metadata) ~= "table" then fail_at(0, op, "metadata must be a table of strings, got %s", type(metadata)) end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" then fail_at(0, op, "metadata keys must be strings, got %s key %s", type(k), tostring(k)) end
      if type(v) ~= "string" then
        fail_at(0, op, "metadata value for '%s' must be a string, got %s", k, type(v))
      end
    end
  end
  core._safetensors_save(path, tensors, metadata, op)
end

-- What the file is, from its structure (src/io/format.c, nd_detect_format):
-- "safetensors", "zip" (a PyTorch checkpoint), "torch_legacy" (PyTorch's
-- pre-1.6 format, which load_torch explains how to re-save) or "unknown"
-- (left to the safetensors reader, whose error says what is wrong). A file
-- that cannot be opened (missing, a directory, a FIFO) is an error naming it.
local function file_format(path, op)
  op = op or "file_format"
  check_path(op, path)
  return core._file_format(path, op)
end

-- load_torch(path[, opts[, op]]) (op: internal) -> the checkpoint's object (see nd.load_torch).
local function load_torch(path, opts, op)
  op = op or "load_torch"
  check_path(op, path)
  if opts ~= nil and type(opts) ~= "table" then fail_at(0, op, "options must be a table, got %s", type(opts)) end
  return core.load_torch(path, opts, op)
end

-- load(path[, op]) (op: internal, load_as) -> {name = tensor}, {key = value} (the __metadata__ strings;
-- an empty table when the file has none). A PyTorch checkpoint (zip) gives
-- what load_torch gives.
local function load(path, op)
  op = op or "load"
  check_path(op, path)
  local fmt = file_format(path, op)
  if fmt == "zip" or fmt == "torch_legacy" then return load_torch(path, nil, op) end
  return core._safetensors_load(path, op)
end

-- read_header(path) -> {name = {dtype=, shape=, data_offsets = {begin, end}}},
-- metadata, data_start: the validated header alone (no tensor data is read);
-- offsets are 0-based into the byte buffer, which starts at byte data_start of
-- the file.
local function read_header(path, op)
  op = op or "read_header"
  check_path(op, path)
  return core._safetensors_header(path, op)
end

-- The public functions take their documented arguments only: another one is
-- an error naming the function (never a name for its errors: that is the
-- internal save_as / load_as below).
local function fixed(op, usage, max, impl)
  return M.public(function(...)
    for i = max + 1, select("#", ...) do
      local v = select(i, ...)
      if v ~= nil then
        fail_at(0, op, "takes %s only, got an extra argument #%d: %s", usage, i, require("needle.options").got(v))
      end
    end
    return impl(...)
  end)
end

M.save = fixed("save", "save(tensors, path[, metadata])", 3, function(t, p, m) return save(t, p, m) end)
M.load = fixed("load", "load(path)", 1, function(p) return load(p) end)
M.load_torch = fixed("load_torch", "load_torch(path[, opts])", 2, function(p, o) return load_torch(p, o) end)
M.read_header = fixed("read_header", "read_header(path)", 1, function(p) return read_header(p) end)
M.file_format = fixed("file_format", "file_format(path)", 1, function(p) return file_format(p) end)

-- internal (nd.checkpoint): save and load with errors named `op`
-- ("needle.checkpoint.save: ...")
M.save_as = M.public(function(op, t, p, m) return save(t, p, m, op) end)
M.load_as = M.public(function(op, p) return load(p, op) end)

return M
