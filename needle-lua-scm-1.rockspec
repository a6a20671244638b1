-- LuaRocks build of needle-lua from a checkout:
--   luarocks --lua-version=5.4 make needle-lua-scm-1.rockspec            (system tree)
--   luarocks --lua-version=5.4 make --tree /tmp/rocktree needle-lua-scm-1.rockspec
-- --lua-version=5.4 is needed: Debian's luarocks defaults to Lua 5.1, and plain
-- `luarocks make` then fails on the dependency below.
-- The CMake build installs needle/core.so into $(LIBDIR), the Lua sources into
-- $(LUADIR) and needle-lua into $(PREFIX)/bin; LuaRocks deploys them into the
-- tree. The C embedding API (libneedle, needle.h, needle.pc) is left to
-- `cmake --install` (see docs/building.md): LuaRocks has no place for it.
rockspec_format = "3.0"
package = "needle-lua"
version = "scm-1"

source = {
   -- `luarocks --lua-version=5.4 make` builds the checkout it is run in; this URL is a
   -- placeholder until the project has a public home.
   url = "git+https://example.invalid/needle-lua.git",
}

description = {
   summary = "A deep learning runtime with a C11 core and a Lua 5.4 face",
   detailed = [[
needle-lua: tensors with autograd, nn modules and optimizers, a CPU backend on
OpenMP and OpenBLAS, and the needle-lua executable (script runner and REPL).
]],
   labels = { "deep-learning", "tensor", "autograd" },
}

dependencies = {
   "lua >= 5.4, < 5.5",
}

-- System libraries (OpenBLAS, zlib, OpenMP, readline, liblua5.4 headers) are
-- found by CMake; on Debian: bash scripts/setup.sh installs them.

build = {
   type = "cmake",
   variables = {
      CMAKE_INSTALL_PREFIX = "$(PREFIX)",
      CMAKE_BUILD_TYPE = "Release",
      NEEDLE_INSTALL_LUA_CMOD_DIR = "$(LIBDIR)",
      NEEDLE_INSTALL_LUA_DIR = "$(LUADIR)",
      NEEDLE_INSTALL_C_API = "OFF",
      NEEDLE_BUILD_TESTS = "OFF",
   },
}
