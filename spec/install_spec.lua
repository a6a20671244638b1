-- install_spec.lua - `cmake --install` produces a tree that a stock lua5.4, the
-- installed needle-lua and a C program built with pkg-config can all use.
--
-- The install goes to a temporary prefix. To check that a default install
-- (prefix /usr/local) works with a plain `lua5.4 -e 'require "needle"'`, the
-- stock interpreter's own package.path/cpath (LUA_PATH unset) are taken and
-- /usr/local/ is replaced by the temporary prefix: if the files land where
-- that rewritten path finds them, they land where a stock lua5.4 looks.
--
-- In a sanitizer build (NEEDLE_SANITIZE=ON) the installed libraries need the
-- ASan runtime first: uninstrumented hosts (lua5.4) get it through LD_PRELOAD
-- (leak checking off there, see below) and test programs are compiled with
-- -fsanitize.

local build = os.getenv("NEEDLE_BUILD_DIR") or "build"

local S = require "spec.helpers.shell"
local sh_quote, read_file, write_file, exists = S.q, S.read_file, S.write_file, S.exists

-- run a shell command; returns ok, combined output
local function run(cmd)
  local p = assert(io.popen("{ " .. cmd .. " ; } 2>&1; echo \"__rc=$?\""))
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  out = out:gsub("__rc=%d+%s*$", "")
  return rc == 0, out, rc
end

local function abs(path)
  if path:sub(1, 1) == "/" then return path end
  local ok, pwd = run("pwd")
  assert(ok, pwd)
  return (pwd:gsub("%s+$", "")) .. "/" .. path
end

describe("cmake --install", function()
  local prefix, work, sanitize, asan_env, san_cflags

  setup(function()
    build = abs(build)
    local cache = read_file(build .. "/CMakeCache.txt")
    assert(cache, "no CMakeCache.txt in " .. build .. " (run scripts/setup.sh)")
    sanitize = cache:match("NEEDLE_SANITIZE:BOOL=ON") ~= nil
    asan_env, san_cflags = "", ""
    if sanitize then
      local ok, lib = run("cc -print-file-name=libasan.so")
      assert(ok, lib)
      -- Leak checking stays on for our own programs; in lua5.4 it is off:
      -- lua_close dlcloses core.so (and with it OpenBLAS and libgomp), so
      -- their one-off allocations are reported from an "<unknown module>"
      -- that no suppression can name.
      local opts = os.getenv("ASAN_OPTIONS")
      opts = (opts and opts ~= "" and opts .. ":" or "") .. "detect_leaks=0"
      asan_env = "LD_PRELOAD=" .. sh_quote((lib:gsub("%s+$", ""))) ..
        " ASAN_OPTIONS=" .. sh_quote(opts) .. " "
      san_cflags = " -fsanitize=address,undefined"
    end

    local ok, dir = run("mktemp -d \"${TMPDIR:-/tmp}/needle-install-spec.XXXXXX\"")
    assert(ok, dir)
    dir = dir:gsub("%s+$", "")
    prefix = dir .. "/prefix"
    work = dir .. "/work"
    assert(run("mkdir -p " .. sh_quote(work)))
    local ok2, out = run("cmake --install " .. sh_quote(build) .. " --prefix " .. sh_quote(prefix))
    assert(ok2, "cmake --install failed:\n" .. out)
  end)

  teardown(function()
    if prefix then
      run("rm -rf " .. sh_quote((prefix:gsub("/prefix$", ""))))
    end
  end)

  it("installs the executable, libraries, header, pkg-config file and Lua package", function()
    for _, rel in ipairs({
      "bin/needle-lua",
      "lib/libneedle.so", "lib/libneedle.so.0", "lib/libneedle.a",
      "include/needle.h", "include/needle_ops.h",
      "lib/pkgconfig/needle.pc",
      "lib/lua/5.4/needle/core.so",
      "share/lua/5.4/needle/init.lua",
    }) do
      assert.is_true(exists(prefix .. "/" .. rel), "missing " .. rel)
    end
    local pc = read_file(prefix .. "/lib/pkgconfig/needle.pc")
    assert.truthy(pc:find("prefix=" .. prefix, 1, true), "needle.pc prefix is not the install prefix")
  end)

  it("installs every lua/needle source", function()
    local ok, out = run("cd lua && find needle -name '*.lua' | sort")
    assert(ok, out)
    for rel in out:gmatch("[^\n]+") do
      assert.is_true(exists(prefix .. "/share/lua/5.4/" .. rel), "missing share/lua/5.4/" .. rel)
    end
  end)

  it("does not link liblua into the Lua C module", function()
    local ok, out = run("readelf -d " .. sh_quote(prefix .. "/lib/lua/5.4/needle/core.so"))
    assert(ok, out)
    assert.falsy(out:find("liblua", 1, true), "core.so has a NEEDED liblua:\n" .. out)
  end)

  it("loads in a stock lua5.4 from the default (/usr/local) layout", function()
    -- the stock search paths, with /usr/local/ moved to the prefix
    local ok, paths = run("cd " .. sh_quote(work) ..
      " && env -u LUA_PATH -u LUA_PATH_5_4 -u LUA_CPATH -u LUA_CPATH_5_4 " ..
      "lua5.4 -e 'io.write(package.path, \"\\n\", package.cpath, \"\\n\")'")
    assert(ok, paths)
    local path, cpath = paths:match("^([^\n]*)\n([^\n]*)")
    assert.truthy(path:find("/usr/local/share/lua/5.4/?.lua", 1, true))
    assert.truthy(cpath:find("/usr/local/lib/lua/5.4/?.so", 1, true))
    local function move(p) return (p:gsub("/usr/local/", (prefix:gsub("%%", "%%%%")) .. "/")) end
    local script = [[
      local nd = require "needle"
      assert(type(nd) == "table", "require 'needle' returned " .. type(nd))
      print(package.searchpath("needle", package.path))
      print(package.searchpath("needle.core", package.cpath))
      print("ok")
    ]]
    write_file(work .. "/stock.lua", script)
    local ok2, out = run("cd " .. sh_quote(work) .. " && " .. asan_env ..
      "LUA_PATH=" .. sh_quote(move(path)) .. " LUA_CPATH=" .. sh_quote(move(cpath)) ..
      " lua5.4 stock.lua")
    assert(ok2, out)
    assert.truthy(out:find(prefix .. "/share/lua/5.4/needle/init.lua", 1, true), out)
    assert.truthy(out:find(prefix .. "/lib/lua/5.4/needle/core.so", 1, true), out)
    assert.truthy(out:find("ok\n", 1, true), out)
  end)

  it("runs the installed needle-lua without the build tree", function()
    write_file(work .. "/hello.lua", [[
      local nd = require "needle"
      assert(type(nd) == "table")
      print("hello from needle-lua")
    ]])
    local ok, out = run("cd " .. sh_quote(work) ..
      " && env -u LUA_PATH -u LUA_PATH_5_4 -u LUA_CPATH -u LUA_CPATH_5_4 " ..
      sh_quote(prefix .. "/bin/needle-lua") .. " hello.lua")
    assert(ok, out)
    assert.truthy(out:find("hello from needle-lua", 1, true), out)
  end)

  local function pkg_config(args)
    local ok, out = run("PKG_CONFIG_PATH=" .. sh_quote(prefix .. "/lib/pkgconfig") ..
      " pkg-config " .. args)
    assert(ok, "pkg-config " .. args .. ": " .. out)
    return (out:gsub("%s+$", ""))
  end

  it("builds a C program against the installed header and shared library (pkg-config)", function()
    write_file(work .. "/version.c", [[
#include <stdio.h>
#include <needle.h>
int main(void) { printf("needle %s\n", nd_version()); return 0; }
]])
    local flags = pkg_config("--cflags --libs needle")
    assert.truthy(flags:find("-lneedle", 1, true), flags)
    local ok, out = run("cd " .. sh_quote(work) .. " && cc -std=c11 -o version version.c " ..
      flags .. san_cflags .. " -Wl,-rpath," .. sh_quote(prefix .. "/lib") .. " && ./version")
    assert(ok, out)
    assert.truthy(out:match("needle %d+%.%d+"), out)
  end)

  it("links the static library with pkg-config --static", function()
    local libs = pkg_config("--static --libs needle")
    libs = libs:gsub("%-lneedle", sh_quote(prefix .. "/lib/libneedle.a"))
    local ok, out = run("cd " .. sh_quote(work) .. " && cc -std=c11 -o version_static version.c " ..
      pkg_config("--cflags needle") .. " " .. libs .. san_cflags .. " && ./version_static" ..
      " && ! ldd ./version_static | grep -q libneedle")
    assert(ok, out)
    assert.truthy(out:match("needle %d+%.%d+"), out)
  end)

  it("lets a C host open the whole package from the installed library (luaopen_needle)", function()
    write_file(work .. "/host.c", [[
#include <stdio.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <needle.h>
int luaopen_needle(lua_State *L);
int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "needle", luaopen_needle, 1);
  lua_pop(L, 1);
  if (luaL_dostring(L, "local nd = require 'needle'; assert(type(nd) == 'table'); print('host ok')")) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    lua_close(L);
    return 1;
  }
  lua_close(L);
  return 0;
}
]])
    local ok, out = run("cd " .. sh_quote(work) ..
      " && env -u LUA_PATH -u LUA_PATH_5_4 -u LUA_CPATH -u LUA_CPATH_5_4 sh -c " ..
      sh_quote("cc -std=c11 -o host host.c " .. pkg_config("--cflags --libs needle lua5.4") ..
        san_cflags .. " -Wl,-rpath," .. prefix .. "/lib && ./host"))
    assert(ok, out)
    assert.truthy(out:find("host ok", 1, true), out)
  end)
end)
