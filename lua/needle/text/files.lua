-- needle.text.files: reading a tokenizer's files (internal). The files are
-- untrusted input: anything wrong with them is an error naming the file and
-- the line, raised at the user's line, never a crash or a half-built
-- tokenizer.
local errors = require "needle.errors"

local M = {}

-- Files larger than this are refused before they are read: GPT-2's
-- vocab.json is 1 MB, BERT's vocab.txt 230 KB, the largest public ones a
-- few tens of MB.
M.MAX_BYTES = 256 * 1024 * 1024

-- read(who, path, what) -> the file's bytes
function M.read(who, path, what)
  if type(path) ~= "string" then
    errors.fail(who, "%s must be a path (a string), got %s", what, type(path))
  end
  local f, err = io.open(path, "rb")
  if f == nil then errors.fail(who, "cannot open %s '%s': %s", what, path, tostring(err)) end
  -- a directory opens, but reading it fails ("Is a directory")
  local probe, perr = f:read(0)
  local size = f:seek("end")
  if (probe == nil and perr ~= nil) or size == nil then
    f:close()
    errors.fail(who, "cannot read %s '%s': %s", what, path, tostring(perr or "not a regular file"))
  end
  if size > M.MAX_BYTES then
    f:close()
    errors.fail(who, "%s '%s' is %d bytes, more than the %d a tokenizer file may have", what, path, size, M.MAX_BYTES)
  end
  f:seek("set", 0)
  local s, rerr = f:read("a")
  f:close()
  if s == nil then errors.fail(who, "cannot read %s '%s': %s", what, path, tostring(rerr)) end
  return s
end

-- lines(s) -> an iterator of line number, line (without "\n" or "\r\n");
-- a last line without "\n" counts, an empty string after the last "\n" does not
function M.lines(s)
  local pos, n, len = 1, 0, #s
  return function()
    if pos > len then return nil end
    local nl = s:find("\n", pos, true)
    local line
    if nl then
      line = s:sub(pos, nl - 1)
      pos = nl + 1
    else
      line = s:sub(pos)
      pos = len + 1
    end
    if line:byte(-1) == 13 then line = line:sub(1, -2) end
    n = n + 1
    return n, line
  end
end

-- what a value is, for "got ..."; arguments past the documented ones (needle.options)
M.got = require("needle.options").got
M.no_extra = require("needle.options").no_extra

-- check_tokens(who, t) -> true when t is one token (a string), false for a
-- list of them; anything else is an error
function M.check_tokens(who, t)
  if type(t) == "string" then return true end
  if type(t) ~= "table" or getmetatable(t) ~= nil then
    errors.fail(who, "expected a token string or a list of them, got %s", M.got(t))
  end
  for k = 1, #t do
    if type(t[k]) ~= "string" then errors.fail(who, "tokens[%d] is %s, expected a string", k, M.got(t[k])) end
  end
  return false
end

-- check_utf8(who, s, where) raises when s is not valid UTF-8, naming the byte
function M.check_utf8(who, s, where)
  local ok, bad = utf8.len(s)
  if ok == nil then errors.fail(who, "%s is not valid UTF-8 (byte %d)", where, bad) end
end

return M
