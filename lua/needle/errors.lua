-- needle.errors: errors that point at the user's code (internal).
--
-- An error raised deep inside the package (a Linear called by a Sequential,
-- an option checked by a helper of a helper) would otherwise carry the
-- position of a library line, which the user can do nothing with
-- ("nn/container.lua:143: needle.nn.Linear ..."). The position is chosen
-- where the error is raised, never by catching and re-raising it, so the
-- traceback keeps every frame (the user's forward and its helpers included):
--
--   errors.error(msg, level)  the package's `error` (each file that raises
--                             does `local error = require("needle.errors").error`):
--                             a "needle.<op>: ..." message whose level lands
--                             on a line of the package gets the position of
--                             the innermost user frame above it instead; any
--                             other message or level behaves as error's
--   errors.raise(msg)         raises msg at the innermost user frame
--   errors.fail(who, fmt, ...) raises "needle.<who>: <fmt...>" there
--   errors.fail_at(level, who, fmt, ...)
--                             "needle.<who>: <fmt...>" through errors.error
--                             with `level` counted as error() counts it where
--                             fail_at is called (0: no position)
--   errors.failer(who[, level])
--                             a file's local helper made once: a function(fmt,
--                             ...) that does fail_at(level, who, fmt, ...) as
--                             if written in it (level 1 is the helper itself);
--                             without level, fail(who, fmt, ...)
--   errors.shape_str(t)       "{2,3}", the way needle's messages spell the
--                             shape of a tensor (or a shape table)
--   errors.at_user_line(msg)  for a message handler (needle-lua's, or an
--                             xpcall's): msg with the position of the user's
--                             line when it names a line of the package
--                             (below)
--
-- The C functions do the same for their own errors (lt_error in
-- src/lua_bindings/lt_tensor.c); this module tells them where the package's
-- files are when they are not the embedded copies.
local core = require "needle.core"

local M = {}

-- "@/path/to/lua/needle/": the package's files share this file's directory
local ROOT = debug.getinfo(1, "S").source:match("^(@.*[/\\])errors%.lua$")
if ROOT ~= nil then core._set_library_root(ROOT) end

-- true when source (debug.getinfo's) is one of the package's Lua files
local function is_library(source)
  if ROOT ~= nil and source:sub(1, #ROOT) == ROOT then return true end
  return source:find("^=%[needle embedded%] needle") ~= nil
end

-- The level of the innermost frame at or above `from` that is neither the
-- package's nor C, or nil. Levels count as the calling function counts them
-- (1 is itself), so the result can go straight to error().
local function user_level(from)
  local level = from + 1 -- this function's own frame is one more
  while true do
    local info = debug.getinfo(level, "S")
    if info == nil then return nil end
    if info.what ~= "C" and not is_library(info.source) then return level - 1 end
    level = level + 1
  end
end

-- "file:line: needle.x: ..." -> "needle.x: ..." (a C error already carries a
-- position; raising it again must not add a second one)
local function strip_position(msg)
  return (msg:gsub("^[^\n]-:%d+: (needle%.)", "%1", 1))
end

function M.raise(msg)
  if type(msg) == "string" then msg = strip_position(msg) end
  -- levels here: 1 is raise itself, 2 its caller
  local level = user_level(2)
  if level == nil then error(msg, 0) end
  error(msg, level)
end

-- "needle.<who>: <fmt...>" raised at the user's line
function M.fail(who, fmt, ...)
  M.raise(("needle.%s: " .. fmt):format(who, ...))
end

-- "needle.<who>: <fmt...>" through M.error at `level`, counted from fail_at's
-- caller as error() counts it there (1: that caller's line; 0: no position)
function M.fail_at(level, who, fmt, ...)
  local msg = ("needle.%s: " .. fmt):format(who, ...)
  if level <= 0 then error(msg, 0) end
  M.error(msg, level + 1) -- not a tail call: one frame (this one) deeper
end

-- A file's local error helper, made once: failer(who, level)(fmt, ...) is
-- fail_at(level, who, fmt, ...) called from a helper of the file's own, so
-- `local function fail(fmt, ...) error(("needle.x: " .. fmt):format(...), 3) end`
-- becomes `local fail = errors.failer("x", 3)` with the same positions.
-- Without level the helper is fail(who, fmt, ...) (the user's line).
function M.failer(who, level)
  if level == nil then
    return function(fmt, ...) M.fail(who, fmt, ...) end
  end
  return function(fmt, ...) M.fail_at(level, who, fmt, ...) end
end

-- "{2,3}": a tensor's shape (or a shape table) the way needle's errors spell it
function M.shape_str(t)
  local shape = type(t) == "table" and t or t.shape
  local s = {}
  for i = 1, #shape do s[i] = tostring(math.tointeger(shape[i]) or shape[i]) end
  return "{" .. table.concat(s, ",") .. "}"
end

-- A message that names a line of the package, though it was not raised by
-- the package's own `error`: a user's forward that raises with error(msg, 2)
-- names the container that called it ("nn/container.lua:144: ..."), and a
-- runtime error inside a library function names that function's line. A
-- message handler runs before the stack unwinds, so the frame of that line is
-- still there: the message gets the position of the innermost user frame
-- above it (the line that called the model), keeps its text, and the
-- traceback the handler adds afterwards still shows every frame. Any other
-- message comes back as it is.
function M.at_user_line(msg)
  if type(msg) ~= "string" then return msg end
  local src, line, text = msg:match("^([^\n]-):(%d+): (.*)$")
  if src == nil then return msg end
  line = tonumber(line)
  local found = false
  for level = 2, math.huge do
    local info = debug.getinfo(level, "Sl")
    if info == nil then return msg end
    if found then
      if info.what ~= "C" and info.currentline > 0 and not is_library(info.source) then
        return ("%s:%d: %s"):format(info.short_src, info.currentline, text)
      end
    elseif info.short_src == src and info.currentline == line then
      if not is_library(info.source) then return msg end -- the user's own line
      found = true
    end
  end
end

function M.error(msg, level)
  level = level or 1
  if level <= 0 or type(msg) ~= "string" then error(msg, 0) end -- no position to choose
  -- A tail call (`return error(...)`) replaced the caller's frame with this
  -- one, so the caller's levels are ours; otherwise ours are one deeper.
  local here = debug.getinfo(1, "t").istailcall and level or level + 1
  local info = debug.getinfo(here, "S")
  if info ~= nil and info.what ~= "C" and is_library(info.source) then
    local stripped = strip_position(msg)
    if stripped:find("^needle%.") then
      local user = user_level(here)
      if user ~= nil then error(stripped, user) end
    end
  end
  error(msg, here)
end

return M
