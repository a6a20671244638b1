-- needle.checkpoint: training state in one safetensors file.
--
--   local checkpoint = require "needle.checkpoint"
--   checkpoint.save("run/ckpt.safetensors", {model = model, optimizer = opt, scheduler = sched,
--                                            step = step, extra = {best_loss = 0.31}})
--   local state = checkpoint.load("run/ckpt.safetensors", {model = model, optimizer = opt,
--                                                         scheduler = sched})
--   step = state.step
--
-- The file is a plain safetensors file (nd.load reads it too). Tensors sit under
-- prefixed, dot-joined keys ("model.fc1.weight", "optimizer.state.3.exp_avg");
-- everything else (the step, the RNG state, hyperparameters, scheduler
-- counters, extra values) is JSON in the __metadata__ entry
-- "needle.checkpoint.state", as a tree that records every table's keys with
-- their types (integer or string), every number as integer or float, and
-- where each tensor goes, so the state comes back exactly as it was saved.
--
-- Anything with state_dict() / load_state_dict(sd) can be saved and restored:
-- a state_dict is a nested table whose leaves are tensors, numbers, strings or
-- booleans. Loading is all-or-nothing: the whole file is read and checked,
-- every state is rebuilt, and only then are the objects loaded; if one of them
-- refuses its state, the ones already loaded are put back as they were, and
-- the error names the file and the problem.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local serialize = require "needle.serialize"

local M = {}
M.VERSION = 1
local VERSION_KEY, STATE_KEY = "needle.checkpoint.version", "needle.checkpoint.state"

-- A path (of a value in a state, or in JSON) for a message: at most about
-- 80 characters, the start and the end kept (deep nesting makes paths of
-- any length).
local function short(where)
  if #where <= 80 then return where end
  return where:sub(1, 38) .. "..." .. where:sub(-38)
end

-- ------------------------------------------------------------------ JSON
-- needle's one JSON codec, in C (src/io/json.c; the safetensors header is
-- read and written with it too), for plain tables of numbers, strings and
-- booleans. Integers and floats stay distinct: an integer is written with %d
-- and read back as an integer (exact to 64 bits; out of range is an error);
-- a float is written with %.17g (which round-trips every double) and always
-- with a '.' or an exponent, so it is read back as a float. NaN and
-- infinities have no JSON form and are refused. A table is an array when it
-- is a non-empty sequence or marked with json.array(t), an object when all
-- its keys are strings (written sorted bytewise, so output is
-- deterministic). Decoding is strict RFC 8259 without null: duplicate keys,
-- invalid UTF-8 and nesting deeper than 512 levels are errors; arrays come
-- back marked with json.array.
local json = {}
M.json = json

local array_mt = {__name = "json.array"}
function json.array(t) return setmetatable(t or {}, array_mt) end
function json.is_array(t) return getmetatable(t) == array_mt end

-- json.encode(v) -> string; raises "json: ..." naming where the bad value is
-- ("json: number at the root.x is NaN, which JSON cannot hold")
function json.encode(v)
  local s, err = core._json_encode(v, array_mt)
  if not s then error("json: " .. err, 2) end
  return s
end

-- json.decode(s) -> value; raises "json: <problem> at byte N" (N counts from 1)
function json.decode(s)
  if type(s) ~= "string" then error("json: expected a string, got " .. type(s), 2) end
  local v, err = core._json_decode(s, array_mt)
  if err ~= nil then error("json: " .. err, 2) end
  return v
end

-- ------------------------------------------------------- state <-> tree
-- A value of the state becomes:
--   string, boolean, finite number   itself
--   NaN, inf, -inf                    {"$float": "nan" | "inf" | "-inf"}
--   tensor                            {"$tensor": "<file key>"}, the tensor stored under that key
--   table                             {"$table": [[key, value], ...]} with integer keys (JSON
--                                     integers) first, ascending, then string keys, sorted

local function fail(op, path, fmt, ...)
  error(("needle.%s: '%s': " .. fmt):format(op, path, ...), 0)
end

-- Tables nested deeper than this are refused (save) and malformed (load):
-- a state_dict nests a few levels, and each level costs three levels of the
-- JSON the state is stored as, whose reader allows 512 and writer 200.
M.MAX_NESTING = 64

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta == "number" end
  return a < b
end

local function join(where, k)
  return where == "" and tostring(k) or where .. "." .. tostring(k)
end

local function to_tree(v, where, tensors, seen, depth)
  local ty = type(v)
  if ty == "string" and not utf8.len(v) then
    error(("'%s' is a string that is not valid UTF-8 (the state is stored as JSON text; keep bytes in a "
           .. "uint8 tensor)"):format(short(where)), 0)
  end
  if core.is_tensor(v) then
    if tensors[where] then error(("two values map to the tensor key '%s'"):format(short(where)), 0) end
    tensors[where] = v
    return {["$tensor"] = where}
  elseif ty == "string" or ty == "boolean" then
    return v
  elseif ty == "number" then
    if v ~= v then return {["$float"] = "nan"} end
    if v == math.huge then return {["$float"] = "inf"} end
    if v == -math.huge then return {["$float"] = "-inf"} end
    return v
  elseif ty == "table" then
    if seen[v] then error(("'%s' contains itself"):format(short(where)), 0) end
    if getmetatable(v) ~= nil then
      error(("'%s' is a table with a metatable (a module or an object?): a state holds plain tables, "
             .. "tensors, numbers, strings and booleans"):format(short(where)), 0)
    end
    if depth >= M.MAX_NESTING then
      error(("'%s' is nested deeper than %d tables"):format(short(where), M.MAX_NESTING), 0)
    end
    seen[v] = true
    local keys = {}
    for k in next, v do
      if math.type(k) ~= "integer" and type(k) ~= "string" then
        error(("'%s' has a %s key (%s): keys must be integers or strings"):format(short(where), math.type(k) or type(k),
              tostring(k)), 0)
      end
      if type(k) == "string" and not utf8.len(k) then
        error(("'%s' has a key that is not valid UTF-8"):format(short(where)), 0)
      end
      keys[#keys + 1] = k
    end
    table.sort(keys, key_order)
    local entries = json.array()
    for i, k in ipairs(keys) do
      entries[i] = json.array({k, to_tree(v[k], join(where, k), tensors, seen, depth + 1)})
    end
    seen[v] = nil
    return {["$table"] = entries}
  else
    error(("'%s' is a %s: a state holds tensors, numbers, strings, booleans and tables"):format(short(where), ty), 0)
  end
end

local floats = {nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge}

local function from_tree(node, where, tensors, used, depth)
  local ty = type(node)
  if ty == "string" or ty == "boolean" or ty == "number" then return node end
  if ty ~= "table" or json.is_array(node) then error(("malformed state at '%s'"):format(short(where)), 0) end
  local k, v = next(node)
  if k == nil or next(node, k) ~= nil then error(("malformed state at '%s'"):format(short(where)), 0) end
  if k == "$tensor" then
    if type(v) ~= "string" then error(("malformed tensor reference at '%s'"):format(short(where)), 0) end
    local t = tensors[v]
    if not t then error(("tensor '%s' (for '%s') is missing from the file"):format(short(v), short(where)), 0) end
    if used[v] then error(("tensor '%s' is referenced twice"):format(short(v)), 0) end
    used[v] = true
    return t
  elseif k == "$float" then
    local f = floats[v]
    if not f then error(("malformed float at '%s'"):format(short(where)), 0) end
    return f
  elseif k == "$table" then
    if type(v) ~= "table" or not json.is_array(v) then error(("malformed table at '%s'"):format(short(where)), 0) end
    if depth >= M.MAX_NESTING then
      error(("'%s' is nested deeper than %d tables"):format(short(where), M.MAX_NESTING), 0)
    end
    local t = {}
    for _, e in ipairs(v) do
      if type(e) ~= "table" or #e ~= 2 or (math.type(e[1]) ~= "integer" and type(e[1]) ~= "string") then
        error(("malformed table entry at '%s'"):format(short(where)), 0)
      end
      if t[e[1]] ~= nil then error(("duplicate key '%s' at '%s'"):format(short(tostring(e[1])), short(where)), 0) end
      t[e[1]] = from_tree(e[2], join(where, e[1]), tensors, used, depth + 1)
    end
    return t
  end
  error(("malformed state at '%s'"):format(short(where)), 0)
end

-- ------------------------------------------------------------ save / load

local SECTIONS = {"model", "optimizer", "scheduler", "scaler"}
local SAVE_FIELDS = {model = true, optimizer = true, scheduler = true, scaler = true, step = true, extra = true}

local function state_of(name, obj, path)
  if type(obj) == "table" and type(obj.state_dict) == "function" then
    local ok, sd = pcall(obj.state_dict, obj)
    if not ok then fail("checkpoint.save", path, "%s:state_dict() failed: %s", name, tostring(sd)) end
    if type(sd) ~= "table" then
      fail("checkpoint.save", path, "%s:state_dict() returned a %s, not a table", name, type(sd))
    end
    return sd
  end
  if type(obj) == "table" and getmetatable(obj) == nil then return obj end -- a state_dict itself
  fail("checkpoint.save", path, "%s must have a state_dict() method (or be a plain state table), got %s",
       name, type(obj))
end

-- save(path, {model=, optimizer=, scheduler=, scaler=, step=, extra=}): model,
-- optimizer, scheduler and scaler (nd.amp.GradScaler) are objects with
-- state_dict() (or state tables);
-- step a number; extra any state value (tensors, numbers, strings, booleans,
-- nested tables). The RNG state (nd.get_rng_state()) is saved with them. The
-- write is atomic: a failed save leaves an existing file as it was.
local function save(path, what, ...)
  if select("#", ...) > 0 then
    error(("needle.checkpoint.save: takes save(path, {model=, optimizer=, scheduler=, scaler=, step=, extra=}) only, "
           .. "got %d more argument(s)"):format(select("#", ...)), 0)
  end
  if type(path) ~= "string" or path == "" then
    error(("needle.checkpoint.save: path must be a non-empty string, got %s"):format(type(path)), 0)
  end
  if type(what) ~= "table" then
    error(("needle.checkpoint.save: expected a table {model=, optimizer=, scheduler=, scaler=, step=, extra=}, got %s")
      :format(type(what)), 0)
  end
  for k in pairs(what) do
    if not SAVE_FIELDS[k] then
      fail("checkpoint.save", path, "unknown field '%s' (expected model, optimizer, scheduler, scaler, step, extra)",
           tostring(k))
    end
  end
  local state = {rng_state = core.get_rng_state()}
  for _, name in ipairs(SECTIONS) do
    if what[name] ~= nil then state[name] = state_of(name, what[name], path) end
  end
  if what.step ~= nil then
    if type(what.step) ~= "number" then fail("checkpoint.save", path, "step must be a number, got %s", type(what.step)) end
    if not (what.step >= 0 and what.step < math.huge and what.step == math.floor(what.step)) then
      fail("checkpoint.save", path, "step must be a whole number >= 0, got %s", tostring(what.step))
    end
    state.step = what.step
  end
  state.extra = what.extra
  local tensors = {}
  local ok, tree = pcall(function() return json.encode(to_tree(state, "", tensors, {}, 0)) end)
  if not ok then fail("checkpoint.save", path, "%s", (tostring(tree):gsub("^json: ", ""))) end
  serialize.save_as("checkpoint.save", tensors, path, {[VERSION_KEY] = tostring(M.VERSION), [STATE_KEY] = tree})
end

local function deep_clone(v, seen)
  if core.is_tensor(v) then return v:clone() end
  if type(v) ~= "table" then return v end
  seen = seen or {}
  if seen[v] then return seen[v] end
  local t = {}
  seen[v] = t
  for k, x in pairs(v) do t[k] = deep_clone(x, seen) end
  return setmetatable(t, getmetatable(v))
end

local function strip_position(msg)
  msg = tostring(msg)
  return (msg:gsub("^[^\n]-:%d+: ", "", 1))
end

local ROOT_FIELDS = {model = true, optimizer = true, scheduler = true, scaler = true, step = true, extra = true,
                     rng_state = true}

-- The root of a state as checkpoint.save writes it: {model=, optimizer=,
-- scheduler=, step=, extra=, rng_state = {seed=, offset=}}, rng_state always
-- there. Seed and offset are the two 64-bit integers nd.get_rng_state()
-- gives (a seed given to nd.manual_seed as a negative number, or one of
-- 2^63 and more, is a negative Lua integer: both load back as they were).
local function check_root(op, path, state)
  local extra = {}
  for k in pairs(state) do
    if not ROOT_FIELDS[k] then extra[#extra + 1] = short(tostring(k)) end
  end
  if #extra > 0 then
    table.sort(extra)
    fail(op, path, "corrupt checkpoint state: unknown root field%s %s (expected model, optimizer, scheduler, scaler, step, "
         .. "extra, rng_state)", #extra > 1 and "s" or "", table.concat(extra, ", "))
  end
  local rng = state.rng_state
  if rng == nil then fail(op, path, "corrupt checkpoint state: no rng_state (checkpoint.save always writes one)") end
  if type(rng) ~= "table" then fail(op, path, "corrupt checkpoint state: rng_state is a %s, not a table", type(rng)) end
  for k in pairs(rng) do
    if k ~= "seed" and k ~= "offset" then
      fail(op, path, "corrupt checkpoint state: rng_state has a field '%s' (expected seed and offset)", short(tostring(k)))
    end
  end
  for _, k in ipairs({"seed", "offset"}) do
    if math.type(rng[k]) ~= "integer" then
      fail(op, path, "corrupt checkpoint state: rng_state.%s is %s, not an integer", k,
           rng[k] == nil and "missing" or ("a " .. (math.type(rng[k]) or type(rng[k]))))
    end
  end
  if state.step ~= nil and type(state.step) ~= "number" then
    fail(op, path, "corrupt checkpoint state: step is a %s, not a number", type(state.step))
  end
  for _, name in ipairs(SECTIONS) do
    if state[name] ~= nil and type(state[name]) ~= "table" then
      fail(op, path, "corrupt checkpoint state: the %s state is a %s, not a table", name, type(state[name]))
    end
  end
end

-- read(path[, op]) -> the saved state, without loading it anywhere:
-- {model=, optimizer=, scheduler= (state_dicts), step=, extra=, rng_state=}
local function read(path, op)
  op = op or "checkpoint.read"
  if type(path) ~= "string" or path == "" then
    error(("needle.%s: path must be a non-empty string, got %s"):format(op, type(path)), 0)
  end
  local tensors, meta = serialize.load_as(op, path) -- checks the whole file; errors name it
  local version = meta[VERSION_KEY]
  if version == nil or meta[STATE_KEY] == nil then
    fail(op, path, "not a needle checkpoint (no '%s' metadata; nd.load reads plain safetensors files)", VERSION_KEY)
  end
  if math.tointeger(tonumber(version)) ~= M.VERSION then
    fail(op, path, "checkpoint format version %s is not supported (this needle reads version %d)", version, M.VERSION)
  end
  local used = {}
  local ok, state = pcall(function() return from_tree(json.decode(meta[STATE_KEY]), "", tensors, used, 0) end)
  if not ok then fail(op, path, "corrupt checkpoint state: %s", strip_position(state)) end
  if type(state) ~= "table" then fail(op, path, "corrupt checkpoint state: the root is not a table") end
  local unused = {}
  for k in pairs(tensors) do if not used[k] then unused[#unused + 1] = k end end
  if #unused > 0 then
    table.sort(unused)
    fail(op, path, "corrupt checkpoint: tensors not referenced by its state: %s", table.concat(unused, ", "))
  end
  check_root(op, path, state)
  return state
end

-- load(path[, {model=, optimizer=, scheduler=, scaler=, strict=true, restore_rng=true}]) -> state
-- Reads the file, rebuilds every state, then calls each given object's
-- load_state_dict(sd) ({strict=} is passed on) and restores the RNG state.
-- All or nothing: a failure anywhere leaves the objects and the RNG as they
-- were. Returns the state table (step, extra, rng_state and the state_dicts).
local function load(path, targets, ...)
  local op = "checkpoint.load"
  if select("#", ...) > 0 then
    error(("needle.%s: takes load(path[, {model=, optimizer=, scheduler=, scaler=, strict=, restore_rng=}]) only, "
           .. "got %d more argument(s)"):format(op, select("#", ...)), 0)
  end
  targets = targets or {}
  if type(targets) ~= "table" then
    error(("needle.%s: expected a table {model=, optimizer=, scheduler=, scaler=}, got %s"):format(op, type(targets)), 0)
  end
  for k in pairs(targets) do
    if not SAVE_FIELDS[k] and k ~= "strict" and k ~= "restore_rng" or k == "step" or k == "extra" then
      error(("needle.%s: unknown option '%s' (expected model, optimizer, scheduler, scaler, strict, restore_rng)")
        :format(op, tostring(k)), 0)
    end
  end
  -- ("no" is true to Lua: restore_rng = "no" would restore it)
  for _, k in ipairs({"strict", "restore_rng"}) do
    if targets[k] ~= nil and type(targets[k]) ~= "boolean" then
      error(("needle.%s: %s must be a boolean, got %s"):format(op, k, type(targets[k])), 0)
    end
  end
  local state = read(path, op)
  -- every target and its state, checked before anything is touched
  local jobs = {}
  for _, name in ipairs(SECTIONS) do
    local obj = targets[name]
    if obj ~= nil then
      if type(obj) ~= "table" or type(obj.load_state_dict) ~= "function" then
        fail(op, path, "%s must have a load_state_dict() method, got %s", name, type(obj))
      end
      if state[name] == nil then fail(op, path, "the checkpoint has no %s state", name) end
      if type(state[name]) ~= "table" then fail(op, path, "the checkpoint's %s state is not a table", name) end
      jobs[#jobs + 1] = {name = name, obj = obj, sd = state[name]}
    end
  end
  local rng = state.rng_state -- check_root made sure it is {seed=, offset=}
  local restore_rng = targets.restore_rng ~= false
  -- Backups: a module's load_state_dict checks everything before it copies
  -- (atomic); other objects' may stop half way. Objects that are not atomic
  -- go first, and any object that is not atomic, or that is followed by
  -- another, is backed up before anything is loaded.
  local Module = package.loaded["needle.nn.module"]
  for i, job in ipairs(jobs) do
    job.atomic = Module ~= nil and Module.is_module(job.obj)
    job.order = i
  end
  table.sort(jobs, function(a, b)
    if a.atomic ~= b.atomic then return b.atomic end
    return a.order < b.order
  end)
  for i, job in ipairs(jobs) do
    if not job.atomic or i < #jobs then
      local ok, sd = pcall(job.obj.state_dict, job.obj)
      if not ok or type(sd) ~= "table" then
        fail(op, path, "cannot back up the %s before loading (state_dict() failed: %s)", job.name,
             strip_position(ok and "not a table" or sd))
      end
      job.backup = deep_clone(sd)
    end
  end
  local opts = {strict = targets.strict ~= false}
  for i, job in ipairs(jobs) do
    local ok, err = pcall(job.obj.load_state_dict, job.obj, job.sd, opts)
    if not ok then
      -- put back every object touched so far (this one included when it may be half-loaded);
      -- one that refuses its own backup is named, not passed over in silence
      local unrestored = {}
      for j = i, 1, -1 do
        local b = jobs[j]
        if b.backup then
          local restored, why = pcall(b.obj.load_state_dict, b.obj, b.backup, opts)
          if not restored then
            unrestored[#unrestored + 1] = ("; the %s could not be put back as it was (%s)"):format(b.name,
              strip_position(why))
          end
        end
      end
      fail(op, path, "%s: %s%s", job.name, strip_position(err), table.concat(unrestored))
    end
  end
  if restore_rng then core.set_rng_state(rng) end
  return state
end

M.save = serialize.public(save)
M.read = serialize.public(function(path, ...)
  if select("#", ...) > 0 then
    error(("needle.checkpoint.read: takes read(path) only, got %d more argument(s)"):format(select("#", ...)), 0)
  end
  return read(path)
end)
M.load = serialize.public(load)

return M
