-- needle.errors: errors that point at the user's code (internal).
--
-- An error raised deep inside the package (a Linear called by a Sequential,
-- an option checked by a helper of a helper) would otherwise carry the
-- position of a library line, which the user can do nothing with
-- ("nn/container.lua:143: needle.nn.Linear ..."). Two tools give it the
-- position of the innermost line of the user's own code instead:
--
--   errors.raise(msg)       raises msg at the first stack frame outside the
--                           package's Lua sources (C frames are skipped too)
--   errors.call(fn, ...)    calls fn(...); a "needle.<op>: ..." error raised
--                           inside (by Lua or by a C function) at a library
--                           line, or with no position, is re-raised with the
--                           position of the innermost user frame. The nn
--                           modules' calls and constructors go through it.
--
-- Errors that are not needle's own ("attempt to index a nil value", errors
-- raised by the user's callbacks) pass through unchanged.
local M = {}

-- "@/path/to/lua/needle/": the package's files share this file's directory
local ROOT = debug.getinfo(1, "S").source:match("^(@.*[/\\])errors%.lua$")

-- true when source (debug.getinfo's) is one of the package's Lua files
function M.is_library(source)
  if ROOT ~= nil and source:sub(1, #ROOT) == ROOT then return true end
  return source:find("^=%[needle embedded%] needle") ~= nil
end
local is_library = M.is_library

function M.raise(msg)
  -- debug.getinfo and error count levels alike here: 1 is raise itself
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if info == nil then error(msg, 0) end
    if info.what ~= "C" and not is_library(info.source) then error(msg, level) end
    level = level + 1
  end
end

-- "needle.<who>: <fmt...>" raised at the user's line
function M.fail(who, fmt, ...)
  M.raise(("needle.%s: " .. fmt):format(who, ...))
end

-- The message handler of errors.call: runs on the stack of the error, so the
-- frame the message blames and the user's frames above it are all there.
local function relocate(e)
  if type(e) ~= "string" then return e end
  local pos = e:match("^([^\n]-:%d+: )needle%.")
  if pos == nil then
    if e:find("^needle%.") == nil then return e end -- not needle's
    pos = ""
  end
  local chunk = pos:match("^(.*):%d+: $")
  local user, library = nil, {}
  local level = 2
  while true do
    local info = debug.getinfo(level, "Sl")
    if info == nil then break end
    if info.what ~= "C" then
      if is_library(info.source) then library[info.short_src] = true
      elseif user == nil then user = info end
    end
    level = level + 1
  end
  if user == nil or (pos ~= "" and not library[chunk]) then return e end
  return ("%s:%d: %s"):format(user.short_src, user.currentline, e:sub(#pos + 1))
end

-- The threads (coroutines) inside an errors.call: only the outermost call of
-- a thread needs the protected call, since relocate runs on the whole stack
-- of the error; calls nested in it (the modules of a Sequential) are plain.
local protected = setmetatable({}, {__mode = "k"})

local function finish(co, ok, ...)
  protected[co] = nil
  if ok then return ... end
  error((...), 0)
end

function M.call(fn, ...)
  local co = coroutine.running()
  if protected[co] then return fn(...) end
  protected[co] = true
  return finish(co, xpcall(fn, relocate, ...))
end

return M
