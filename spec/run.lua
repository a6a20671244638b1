-- spec/run.lua - run the busted specs inside needle-lua (or any Lua 5.4):
--
--   build/needle-lua spec/run.lua [busted options] [files or dirs]
--
-- Running busted in-process in our own executable means the sanitizer build's
-- needle-lua runs every spec under ASan/UBSan, with the needle it was built
-- with. Without file arguments busted runs every *_spec.lua under spec/.
--
-- busted.runner reads the global `arg` (arg[1..n], and arg[0] for its --lua
-- switch), names itself after the calling file (debug.getinfo level 2), and
-- chdirs into --directory (default ".") before loading spec files. So: we fill
-- `arg` from `...` if the host did not set it, and pass --directory=<repo
-- root> unless the caller chose one, so that "spec" and the specs' relative
-- paths (build/, data/) resolve from the repository root wherever this is run
-- from. Specs find the build through $NEEDLE_BUILD_DIR (default "build") and
-- the executable through $NEEDLE_LUA (scripts/test.sh exports both).

-- stdout may be a pipe; flush by line so that output survives an abort
-- (ASan, LeakSanitizer at exit) instead of dying in the stdio buffer.
io.stdout:setvbuf("line")

local script = (arg and arg[0]) or debug.getinfo(1, "S").source:match("^@(.*)$") or "spec/run.lua"
if not arg then
  arg = { [0] = script, ... }
end

-- Repository root: the directory above this file's directory.
local function dirname(p)
  local d = p:match("^(.*)/[^/]*$")
  if d == nil then return "." end
  return d == "" and "/" or d
end
local script_dir = dirname(script)
local root
if script_dir == "." then
  root = ".."
elseif script_dir:match("^%.%./?$") or script_dir:match("/%.%./?$") then
  root = script_dir .. "/.."
else
  root = dirname(script_dir)
end

local function add_path(field, entries, at_end)
  local cur = package[field]
  for _, e in ipairs(entries) do
    if not (";" .. cur .. ";"):find(";" .. e:gsub("%p", "%%%0") .. ";") then
      cur = at_end and (cur .. ";" .. e) or (e .. ";" .. cur)
    end
  end
  package[field] = cur
end

-- busted and its dependencies (Debian's lua-busted, lua-cliargs, lua-penlight,
-- lua-term, lua-system, lua-filesystem), wherever the host's defaults left them.
add_path("path", {
  "/usr/local/share/lua/5.4/?.lua", "/usr/local/share/lua/5.4/?/init.lua",
  "/usr/share/lua/5.4/?.lua", "/usr/share/lua/5.4/?/init.lua",
}, true)
add_path("cpath", {
  "/usr/local/lib/lua/5.4/?.so",
  "/usr/lib/x86_64-linux-gnu/lua/5.4/?.so", "/usr/lib/aarch64-linux-gnu/lua/5.4/?.so",
  "/usr/lib/lua/5.4/?.so",
}, true)

-- Spec helpers: require "spec.helpers" and friends from the repository root.
add_path("path", { root .. "/?.lua" }, false)

-- Fallbacks for a plain lua5.4 host: the build tree's Lua sources and C module
-- (needle-lua itself resolves needle on its own, before these are consulted).
local build = os.getenv("NEEDLE_BUILD_DIR") or "build"
if build:sub(1, 1) ~= "/" then build = root .. "/" .. build end
add_path("path", { build .. "/lua/?.lua", build .. "/lua/?/init.lua" }, true)
add_path("cpath", { build .. "/?.so" }, true)

-- Default --directory to the repository root.
local has_dir = false
for i = 1, #arg do
  local a = arg[i]
  if a == "-C" or a == "--directory" or a:match("^%-%-directory=") or a:match("^%-C.") then
    has_dir = true
  end
end
if not has_dir and root ~= "." then
  table.insert(arg, 1, "--directory=" .. root)
end

local ok, runner = pcall(require, "busted.runner")
if not ok then
  io.stderr:write("spec/run.lua: cannot load busted (install lua-busted: bash scripts/setup.sh)\n",
                  tostring(runner), "\n")
  os.exit(1, true)
end

-- standalone = false: busted exits non-zero itself on failures and errors,
-- and returns normally when everything passed.
runner({ standalone = false })
