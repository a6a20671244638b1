-- check_layers.lua - fails when a C file reaches up the layers
-- (docs/ARCHITECTURE.md, "Layers"):
--
--   core (src/*.c: tensor, storage, allocator, dtype, device identity,
--         errors, autograd nodes, the op registry)
--     <- backends (src/backends/cpu, src/backends/opencl: kernels only)
--     <- ops (src/ops: shape rules, dispatch, autograd recording)
--     <- io (src/io: file formats), dist (src/dist: MPI collectives)
--     <- bindings (src/lua_bindings)
--     <- app (src/main.c, src/repl.c: the needle-lua program)
--
-- Also: the ops call backend entries only through ND_BACKEND_CALL (a direct
-- be->fn(...) would escape a graph capture).
--
-- Two checks, both needed: includes (a file may include headers of its own
-- layer or below; a backend's headers are private to that backend, the ops'
-- headers to the ops), and symbols (an object file may reference only
-- functions and data defined in its own layer or below, found with nm on the
-- built objects - so a call through a declaration in the public needle.h is
-- caught too). The one exception: core reaches the backends through their
-- function tables (nd_cpu_backend, nd_opencl_backend), which is how storage
-- gets device memory without knowing the device.
--
--   needle-lua scripts/check_layers.lua <src dir> <object files...>
-- (ctest runs it as "layers"; object files may also come as one
-- ';'-separated argument, as CMake's $<TARGET_OBJECTS:...> gives them.)

local src_dir = assert(arg[1], "usage: check_layers.lua <src dir> <objects...>")
src_dir = src_dir:gsub("/$", "")

local RANK = {core = 0, backend = 1, ops = 2, io = 3, dist = 3, bindings = 4, app = 5}

-- The layer of a path relative to src/ (nil: not ours). backend files also
-- get their backend's name, so one backend cannot use another's internals.
local function layer_of(rel)
  if rel:match("^backends/") then
    local which = rel:match("^backends/([^/]+)/")
    return "backend", which
  end
  if rel == "opencl_tune.h" then return "backend", "interface" end -- the tuner's API for bindings
  if rel:match("^ops/") then return "ops" end
  if rel:match("^io/") then return "io" end
  if rel:match("^dist/") then return "dist" end
  if rel:match("^lua_bindings/") or rel == "embedded_lua.h" then return "bindings" end
  if rel == "main.c" or rel:match("^repl%.") then return "app" end
  if not rel:find("/") then return "core" end
  return nil
end

local failures = {}
local function fail(fmt, ...) failures[#failures + 1] = fmt:format(...) end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function list_sources()
  local files = {}
  local p = assert(io.popen(("find %q -type f \\( -name '*.c' -o -name '*.h' \\) | sort"):format(src_dir)))
  for line in p:lines() do files[#files + 1] = line:sub(#src_dir + 2) end
  p:close()
  return files
end

-- "a/b/../c.h" -> "a/c.h"
local function normalize(path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then table.remove(parts)
    elseif part ~= "." then parts[#parts + 1] = part end
  end
  return table.concat(parts, "/")
end

-- ---------------------------------------------------------------- includes
local nsources, nincludes = 0, 0
for _, rel in ipairs(list_sources()) do
  local layer, backend = layer_of(rel)
  if layer then
    nsources = nsources + 1
    local dir = rel:match("^(.*)/") or ""
    local lineno = 0
    local wrappers = rel:match("^ops/backend_call%.[ch]$") or rel == "ops/graph.c"
    for line in io.lines(src_dir .. "/" .. rel) do
      lineno = lineno + 1
      -- ops call a backend entry only through ND_BACKEND_CALL: a direct call
      -- would be invisible to a graph capture (nd.compile), so a replay would skip it
      if layer == "ops" and not wrappers and (line:match("be%->[%w_]+%s*%(") or
                                              line:match("backend_of%b()%->[%w_]+%s*%(")) then
        fail("%s:%d calls a backend entry directly: use ND_BACKEND_CALL (src/ops/backend_call.h), "
             .. "which a graph capture records", rel, lineno)
      end
      -- "x.h" and <x.h> alike: src/ is an include directory, so <ops/grad_fns.h>
      -- reaches an ops header as surely as "ops/grad_fns.h"
      local quoted = line:match('^%s*#%s*include%s*"([^"]+)"')
      local inc = quoted or line:match('^%s*#%s*include%s*<([^>]+)>')
      if inc then
        -- as the compiler looks: next to the file first (quoted only), then src/
        local target = quoted and normalize((dir ~= "" and dir .. "/" or "") .. inc) or normalize(inc)
        if not exists(src_dir .. "/" .. target) then target = normalize(inc) end
        if exists(src_dir .. "/" .. target) then
          nincludes = nincludes + 1
          local tl, tb = layer_of(target)
          if tl and RANK[tl] > RANK[layer] then
            fail("%s:%d (%s) includes %s (%s): a layer may include only its own headers and those below",
              rel, lineno, layer, target, tl)
          elseif tl == "backend" and tb ~= "interface" and layer == "backend" and tb ~= backend then
            fail("%s:%d includes %s: one backend's headers are private to it", rel, lineno, target)
          elseif tl == "backend" and tb ~= "interface" and layer ~= "backend" then
            fail("%s:%d (%s) includes %s: a backend's headers are private to it (use backend.h's table or a public interface)",
              rel, lineno, layer, target)
          elseif tl == "ops" and layer ~= "ops" then
            fail("%s:%d (%s) includes %s: the ops' headers are private to src/ops (use needle.h)",
              rel, lineno, layer, target)
          end
        end
      end
    end
  end
end

-- ---------------------------------------------------------------- symbols
local objects = {}
for i = 2, #arg do
  for o in arg[i]:gmatch("[^;]+") do objects[#objects + 1] = o end
end

-- src-relative source path of an object ("<...>/src/ops/op_view.c.o"); the
-- generated sources belong to the layer that uses them.
local function object_source(o)
  -- CMake's object path: <build>/CMakeFiles/<target>.dir/src/<rel>.o (the
  -- last "/src/" after ".dir", whatever the checkout's own path holds)
  local rel = o:match("%.dir/src/(.+)%.o$") or o:match("%.dir/src/(.+)%.obj$")
  if rel then return rel end
  if o:match("ocl_sources%.c%.o$") or o:match("ocl_sources%.c%.obj$") then return "backends/opencl/ocl_sources.c" end
  if o:match("needle_embedded_lua%.c%.o$") or o:match("needle_embedded_lua%.c%.obj$") then
    return "lua_bindings/needle_embedded_lua.c"
  end
  return nil
end

local TABLES = {nd_cpu_backend = true, nd_opencl_backend = true}

local defined = {} -- symbol -> {layer, backend, rel}
local undefined = {} -- rel -> list of symbols
local info = {}
for _, o in ipairs(objects) do
  local rel = object_source(o)
  if not rel then fail("%s: cannot tell which source this object was built from", o) else
    local layer, backend = layer_of(rel)
    if not layer then fail("%s: not in a known layer", rel) else
      info[rel] = {layer = layer, backend = backend}
      local p = assert(io.popen(("nm -P %q 2>&1"):format(o)))
      local und = {}
      for line in p:lines() do
        local sym, kind = line:match("^(%S+) (%a)")
        if sym then
          -- U: undefined here; global definitions are the upper-case kinds
          -- (T D B R C V W G S I ...), u (unique) and i (indirect function,
          -- as target_clones makes); w/v are weak undefined references
          if kind == "U" or kind == "w" or kind == "v" then und[#und + 1] = sym
          elseif kind:match("%u") or kind == "u" or kind == "i" then
            defined[sym] = {layer = layer, backend = backend, rel = rel}
          end
        end
      end
      local ok = p:close()
      if not ok then fail("nm failed on %s", o) end
      undefined[rel] = und
    end
  end
end

local nrefs = 0
for rel, und in pairs(undefined) do
  local me = info[rel]
  for _, sym in ipairs(und) do
    local d = defined[sym]
    if d then
      nrefs = nrefs + 1
      if RANK[d.layer] > RANK[me.layer] and not (me.layer == "core" and TABLES[sym]) then
        fail("%s (%s) uses %s, defined in %s (%s): calls go down the layers only",
          rel, me.layer, sym, d.rel, d.layer)
      elseif d.layer == "backend" and me.layer == "backend" and d.backend ~= me.backend then
        fail("%s uses %s of another backend (%s)", rel, sym, d.rel)
      end
    end
  end
end

if #objects == 0 then fail("no object files given: nothing was checked") end
if nsources < 50 or nincludes < 100 then
  fail("only %d sources and %d includes found under %s: wrong directory?", nsources, nincludes, src_dir)
end

if #failures > 0 then
  io.stderr:write(("check_layers: %d violation(s)\n"):format(#failures))
  for _, f in ipairs(failures) do io.stderr:write("  ", f, "\n") end
  os.exit(1)
end
print(("check_layers: ok (%d sources, %d includes, %d objects, %d cross-file references)")
  :format(nsources, nincludes, #objects, nrefs))
