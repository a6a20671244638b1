-- needle.data.util: file helpers shared by the dataset readers.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"

local util = {}

-- v as an integer when it is a number with an integral value (2, 2.0, 4 / 2),
-- else nil (math.tointeger would also take the string "2")
function util.int_of(v)
  if type(v) ~= "number" then return nil end
  return math.tointeger(v)
end

-- what a value is, for "got ..."; arguments past the documented ones (needle.options)
util.got = require("needle.options").got
util.no_extra = require("needle.options").no_extra

-- check_epoch(who, what, e) -> e as an integer >= 0 (2.0 counts as 2), else an
-- error "needle.<who>: <what> must be an integer >= 0, got ..."
function util.check_epoch(who, what, e)
  local k = util.int_of(e)
  if k == nil or k < 0 then
    require("needle.errors").fail(who, "%s must be an integer >= 0, got %s", what, util.got(e))
  end
  return k
end

-- The type of what path names ("file", "directory", "fifo", ...), or nil
-- when there is nothing there. Nothing is opened: opening a FIFO for
-- reading would wait for a writer.
local function file_type(path)
  if core._file_type then return (core._file_type(path)) end
  -- without the C core: io.open (a FIFO would block it)
  local f = io.open(path, "rb")
  if not f then return nil end
  local ok, _, code = f:read(0)
  f:close()
  return (ok == nil and code == 21) and "directory" or "file" -- EISDIR
end
util.file_type = file_type

-- whether path names something (a file, a directory, ...)
function util.exists(path)
  return file_type(path) ~= nil
end

function util.is_dir(path)
  return file_type(path) == "directory"
end

function util.join(dir, name)
  if dir:sub(-1) == "/" then return dir .. name end
  return dir .. "/" .. name
end

-- read(path, who) -> the file's bytes, gunzipped when it is a gzip file.
-- Errors read "<who>: ..." and name the file.
function util.read(path, who)
  if core.gunzip then
    -- only a regular file is read (a FIFO or a device is refused, not waited on)
    local ok, s = pcall(core.gunzip, path)
    if ok then return s end
    s = tostring(s):gsub("^needle%.gunzip: ", "", 1)
    if not s:find(path, 1, true) then s = ("'%s': %s"):format(path, s) end
    error(("%s: %s"):format(who, s), 0)
  end
  -- without the C reader: plain files directly, gzip through the gzip tool
  local f, err = io.open(path, "rb")
  if not f then error(("%s: cannot open '%s': %s"):format(who, path, err), 0) end
  local s = f:read("a")
  f:close()
  if s and s:sub(1, 2) == "\31\139" then
    local p = io.popen("gzip -dc < '" .. path:gsub("'", "'\\''") .. "' 2>/dev/null")
    s = p:read("a")
    local okc = p:close()
    if not okc then error(("%s: '%s': corrupt or truncated gzip stream"):format(who, path), 0) end
  end
  if not s then error(("%s: cannot read '%s'"):format(who, path), 0) end
  return s
end

-- uint8 tensor of the given shape from bytes s[first .. first + numel - 1].
function util.bytes_tensor(s, first, shape, dtype)
  dtype = dtype or "uint8"
  local numel = 1
  for _, d in ipairs(shape) do numel = numel * d end
  local part = (first == 1 and #s == numel) and s or s:sub(first, first + numel - 1)
  if core.frombytes then return core.frombytes(part, dtype, shape) end
  -- slow fallback (small files only): bytes through a Lua table
  local t = {}
  for k = 1, #part, 4096 do
    local chunk = {part:byte(k, math.min(k + 4095, #part))}
    for j = 1, #chunk do t[k + j - 1] = chunk[j] end
  end
  return core.tensor(t, {dtype = dtype}):reshape(shape)
end

return util
