-- spec/helpers/shell.lua - files, shell quoting and the needle-lua executable,
-- for the specs that drive programs (cli, repl, install).
--
--   local S = require "spec.helpers.shell"
--   S.q(s)                  -- s quoted for the shell ('...')
--   S.shell_line(cmd)       -- first line of cmd's stdout
--   S.read_file(path)       -- contents, or nil when it cannot be opened
--   S.write_file(path, s)
--   S.exists(path)          -- true when path can be opened for reading
--   local exe, root = S.needle_lua()
--   S.run_program(env, source) -- needle-lua runs source (a Lua chunk) with env
--                              -- ("NAME=value ..." prefixed to the command);
--                              -- returns its stdout and stderr together

local S = {}

function S.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function S.shell_line(cmd)
  local f = assert(io.popen(cmd))
  local line = f:read("l")
  f:close()
  return line
end

function S.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function S.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function S.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- This file is spec/helpers/shell.lua: the repository root is two levels up.
local helpers_dir = debug.getinfo(1, "S").source:gsub("^@", ""):match("^(.*)/[^/]*$") or "."

-- The needle-lua executable, $NEEDLE_LUA (a relative one from the working
-- directory) else build/needle-lua under the repository root, and the
-- repository root (absolute).
function S.needle_lua()
  local root = S.shell_line("cd " .. S.q(helpers_dir .. "/../..") .. " && pwd")
  local exe = os.getenv("NEEDLE_LUA") or "build/needle-lua"
  if exe:sub(1, 1) ~= "/" then
    exe = (os.getenv("NEEDLE_LUA") and S.shell_line("pwd") or root) .. "/" .. exe
  end
  return exe, root
end

function S.run_program(env, source)
  local prog = os.tmpname()
  S.write_file(prog, source)
  local p = assert(io.popen(("%s %s %s 2>&1"):format(env, S.q(S.needle_lua()), S.q(prog))))
  local out = p:read("a")
  p:close()
  os.remove(prog)
  return out
end

return S
