-- needle.compile: nd.compile(fn_or_module[, opts]) -> a compiled callable
-- (docs/compile.md).
--
-- The first calls with a new signature run eagerly (opts.warmup, default 1:
-- optimizers and modules create their state lazily). The next one is
-- captured: it runs eagerly too, while the C core records every backend call
-- that the ops, autograd's backward and the optimizer make (src/ops/graph.c).
-- Later calls with the same guards replay the recorded kernels in one C call:
-- no Lua per op, no op checks, no allocation.
--
-- Guards: the key of the arguments (shapes, dtypes, devices of tensors;
-- values of numbers, strings and booleans; the structure of tables) and grad
-- mode pick a cache entry (at most opts.cache_size, least recently used out);
-- the modules that ran in the capture must keep their train/eval mode and
-- their parameters' memory, and the optimizers their hyperparameters (except
-- the ones they refresh themselves), else the entry is traced again
-- (cf.stats.retraces counts it).
--
-- The arguments' tensors are copied into the graph's own input tensors on
-- every call, and the results' tensors are returned as copies: the graph's
-- buffers are reused by the next call. A result that needs gradients (a
-- compiled forward, trained with an eager backward) gets an autograd node
-- whose backward replays a backward graph captured with the forward.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local state = require "needle.compile.state"

local is_tensor, tensor_sig = core.is_tensor, core._tensor_sig
-- (a capture records per thread: suspended by a yield, it would record whatever ran next)
local no_yield = core._call_no_yield or function(f, ...) return f(...) end
-- (a binary built before core._mute_tensor_hooks: no hooks to mute)
local mute_hooks = core._mute_tensor_hooks or function() return false end
local fail = errors.failer("compile", 3)

local M = {}

local CF = {}
CF.__index = CF

-- arguments ----------------------------------------------------------------------------

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return keys
end

-- Appends v's key to parts and its tensors to flat, in a fixed order (and to
-- objs the objects with a metatable, modules aside, which are keyed by identity).
local function walk(v, parts, flat, depth, objs)
  local tv = type(v)
  if is_tensor(v) then
    -- which earlier argument tensor it is, or shares memory with (aliasing)
    local alias = ""
    if #flat > 0 then
      local key = core._storage_key(v)
      for j, u in ipairs(flat) do
        if rawequal(u, v) then alias = "=" .. j break end
        if core._storage_key(u) == key then alias = "~" .. j break end
      end
    end
    parts[#parts + 1] = "T" .. tensor_sig(v) .. alias
    flat[#flat + 1] = v
  elseif tv == "table" then
    if depth > 16 then fail("arguments nested deeper than 16 tables") end
    local mt = getmetatable(v)
    if mt ~= nil then
      parts[#parts + 1] = "O" .. tostring(v) -- a module or another object: by identity
      if objs and not (type(mt) == "table" and type(rawget(mt, "class")) == "table") then objs[#objs + 1] = v end
      return
    end
    parts[#parts + 1] = "{"
    for _, k in ipairs(sorted_keys(v)) do
      parts[#parts + 1] = type(k):sub(1, 1) .. tostring(k) .. "="
      walk(v[k], parts, flat, depth + 1, objs)
    end
    parts[#parts + 1] = "}"
  elseif tv == "number" then
    parts[#parts + 1] = (math.type(v) == "integer" and "i" or "f") .. ("%.17g"):format(v)
  elseif tv == "string" then
    parts[#parts + 1] = ("%q"):format(v)
  else
    parts[#parts + 1] = tv:sub(1, 1) .. tostring(v)
  end
end

-- (the float32 matmul precision and the OpenCL products' operand dtype are
-- part of it: replays run their products at the precision of the moment,
-- nd.autocast's included, and launches prepared at one are not replayed at
-- the other)
local function signature(args)
  local parts, flat = {(core.is_grad_enabled() and "G" or "N") .. core.get_float32_matmul_precision() ..
                       core._get_opencl_matmul_dtype()}, {}
  for i = 1, args.n do
    parts[#parts + 1] = "|"
    walk(args[i], parts, flat, 0)
  end
  return table.concat(parts), flat
end

-- The objects among the arguments (walk's objs: not modules, whose guards
-- are their own) with their raw fields as the capture found them: a replay
-- reads the tensors and values the capture read, so a field given another
-- value (a tensor swapped in, a new scale) retraces. Shallow: a change inside
-- a table the object holds is not seen.
local function object_guards(args)
  local objs = {}
  for i = 1, args.n do walk(args[i], {}, {}, 0, objs) end
  local out = {}
  for _, o in ipairs(objs) do
    local fields, memory, n = {}, {}, 0
    for k, v in next, o do
      fields[k] = v
      n = n + 1
      if is_tensor(v) then memory[k] = core._storage_key(v) end
    end
    out[#out + 1] = {object = o, fields = fields, memory = memory, n = n}
  end
  return out
end

local function failed_object_guard(list)
  for _, g in ipairs(list) do
    local o, n = g.object, 0
    for k, v in next, o do
      n = n + 1
      if not rawequal(g.fields[k], v) then
        return ("field '%s' of an argument object %s"):format(tostring(k), g.fields[k] == nil and "was added" or "changed")
      end
    end
    if n ~= g.n then return "an argument object lost a field" end
    for k, key in pairs(g.memory) do
      if core._storage_key(rawget(o, k)) ~= key then
        return ("tensor '%s' of an argument object got new memory"):format(tostring(k))
      end
    end
  end
  return nil
end

-- v with every tensor replaced by f(tensor) (tables copied, others as they
-- are), visiting the tensors in walk's order
local function map_tensors(v, f)
  if is_tensor(v) then return f(v) end
  if type(v) == "table" and getmetatable(v) == nil then
    local out = {}
    for _, k in ipairs(sorted_keys(v)) do out[k] = map_tensors(v[k], f) end
    return out
  end
  return v
end

local function detached_copy(t)
  return core.no_grad(function() return t:detach():clone() end)
end

-- guards ---------------------------------------------------------------------------------

-- What the modules that ran must keep: mode and the identity and memory of
-- their own parameters and buffers (each module of the tree checks its own).
local function own_tensors(m)
  local out = {}
  for k, t in pairs(rawget(m, "_params") or {}) do out["p." .. k] = t end
  for k, t in pairs(rawget(m, "_buffers") or {}) do out["b." .. k] = t end
  return out
end

-- the module's plain settings (numbers, strings, booleans: dropout's p,
-- batch norm's momentum and eps), which the kernels hold as constants; and
-- the rest by identity: tensors held as attributes (a mask), functions (an
-- activation), tables (a config; a change inside one is not seen)
local function plain_attrs(m)
  local out = {}
  for k, v in pairs(rawget(m, "_attrs") or {}) do out[k] = v end
  return out
end

-- the module's children, by identity (a replaced child is another graph)
local function children_of(m)
  local out = {}
  for k, c in pairs(rawget(m, "_children") or {}) do out[k] = c end
  return out
end

-- the module's hooks (module_hooks.lua), by identity in calling order: a hook
-- added or removed after the capture runs Lua the graph does not have
local function hooks_of(m)
  local h = rawget(m, "_hooks")
  if not h then return false end
  local out = {}
  for _, kind in ipairs({"pre", "fwd", "bwd"}) do
    for _, r in ipairs(h[kind]) do out[#out + 1] = r.fn end
    out[#out + 1] = kind -- (a separator: the same function moved to another kind differs)
  end
  return out
end

local function same_hooks(m, saved)
  local now = hooks_of(m)
  if not now or not saved then return now == saved end
  if #now ~= #saved then return false end
  for i = 1, #now do if not rawequal(now[i], saved[i]) then return false end end
  return true
end

local function module_guards(modules)
  local list, seen = {}, {}
  for _, top in ipairs(modules) do
    for _, m in ipairs(top:modules()) do
      if not seen[m] then
        seen[m] = true
        local tensors, keys, grads, n = own_tensors(m), {}, {}, 0
        for k, t in pairs(tensors) do
          keys[k], grads[k] = core._storage_key(t), t.requires_grad
          n = n + 1
        end
        list[#list + 1] = {module = m, training = m.training, tensors = tensors, keys = keys,
                           grads = grads, n = n, attrs = plain_attrs(m), children = children_of(m),
                           hooks = hooks_of(m)}
      end
    end
  end
  return list
end

local function failed_module_guard(e)
  for _, g in ipairs(e.module_guards) do
    local m = g.module
    if m.training ~= g.training then
      return ("a module switched to %s mode"):format(m.training and "train" or "eval")
    end
    local n = 0
    for k, t in pairs(own_tensors(m)) do
      n = n + 1
      if not rawequal(g.tensors[k], t) then
        return ("%s '%s' was added or replaced"):format(k:sub(1, 1) == "p" and "parameter" or "buffer",
                                                      k:sub(3))
      end
      if core._storage_key(t) ~= g.keys[k] then
        return ("'%s' got new memory (set_data_)"):format(k:sub(3))
      end
      if t.requires_grad ~= g.grads[k] then
        return ("'%s' changed requires_grad"):format(k:sub(3))
      end
    end
    if n ~= g.n then return "a module lost a parameter or buffer" end
    if not same_hooks(m, g.hooks) then return "a module's hooks were registered or removed" end
    local attrs, na = rawget(m, "_attrs"), 0
    for k, v in pairs(g.attrs) do
      na = na + 1
      if not rawequal(attrs[k], v) then return ("a module's setting '%s' changed"):format(k) end
    end
    for _ in pairs(attrs) do na = na - 1 end
    if na ~= 0 then return "a module gained a setting" end
    local nc = 0
    for k, c in pairs(rawget(m, "_children") or {}) do
      nc = nc + 1
      if not rawequal(g.children[k], c) then return ("child module '%s' was replaced"):format(tostring(k)) end
    end
    for _ in pairs(g.children) do nc = nc - 1 end
    if nc ~= 0 then return "a module gained or lost a child" end
  end
  return nil
end

-- nil when every guard holds, else the reason
local function failed_guard(e)
  -- the module guards, rechecked only when a module or tensor changed since
  -- they last held (state.generation, core._meta_generation)
  local gen, meta = state.generation, core._meta_generation()
  if e.gen ~= gen or e.meta ~= meta then
    local why = failed_module_guard(e)
    if why then return why end
    -- tensors outside modules (an optimizer's parameter list, a closure's): set_data_,
    -- requires_grad_, a first tensor hook
    if e.meta ~= meta then
      why = e.graph:stale() or (e.backward and e.backward.graph:stale())
      if why then return why end
    end
    e.gen, e.meta = gen, meta
  else -- `m.training = x` is a raw field: no generation counts it, so always compared
    for _, g in ipairs(e.module_guards) do
      if g.module.training ~= g.training then
        return ("a module switched to %s mode"):format(g.module.training and "train" or "eval")
      end
    end
  end
  for _, g in ipairs(e.guards) do
    if g.fn() ~= g.value then return "an optimizer hyperparameter or its state changed" end
  end
  if #e.object_guards > 0 then return failed_object_guard(e.object_guards) end
  return nil
end

-- the compiled callable ---------------------------------------------------------------------

local OPTS = {warmup = "integer", cache_size = "integer", fallback = "boolean", verify = "boolean",
              passes = "table|boolean", tune = "number", opaque = "boolean"}
local PASSES = {fold = true, simplify = true, dce = true, cse = true, epilogue = true, join = true,
                reorder = true, fuse = true}
local DEFAULT_PASSES = {"fold", "simplify", "cse", "dce", "epilogue", "join", "reorder", "fuse"}

-- nd.compile(fn_or_module[, {warmup = 1, cache_size = 8, fallback = false, verify = false,
--                           opaque = true,
--                           passes = {"fold", "simplify", "cse", "dce", "epilogue", "join", "reorder",
--                                     "fuse"},
--                           tune = seconds}])
function M.compile(fn, opts, ...)
  options.no_extra("compile", "nd.compile(fn_or_module[, opts])", 2, ...)
  local is_module = type(fn) == "table" and getmetatable(fn) ~= nil and
                    type(getmetatable(fn).class) == "table"
  if type(fn) ~= "function" and not is_module then
    fail("expected a function or an nn.Module, got %s", type(fn))
  end
  opts = options.check("compile", opts, OPTS)
  local warmup = opts.warmup or 1
  local cache_size = opts.cache_size or 8
  if warmup < 0 then fail("warmup must be >= 0, got %d", warmup) end
  -- with fallback, the last eager call before the capture looks for graph breaks (below)
  if opts.fallback == true and warmup == 0 then warmup = 1 end
  if cache_size < 1 then fail("cache_size must be >= 1, got %d", cache_size) end
  if opts.tune ~= nil and not (opts.tune >= 0 and opts.tune < math.huge) then
    fail("tune must be a number of seconds >= 0, got %s", tostring(opts.tune))
  end
  local passes = DEFAULT_PASSES
  if opts.passes == false then passes = {}
  elseif opts.passes == true then passes = DEFAULT_PASSES
  elseif opts.passes ~= nil then
    local n = #opts.passes
    for k in pairs(opts.passes) do
      if math.type(k) ~= "integer" or k < 1 or k > n then
        local hint = ""
        if PASSES[k] then -- {fuse = false}: a set, where a list is expected
          local rest = {}
          for _, name in ipairs(DEFAULT_PASSES) do if name ~= k then rest[#rest + 1] = ("%q"):format(name) end end
          hint = (" (to leave '%s' out, list the passes to run: passes = {%s})"):format(k, table.concat(rest, ", "))
        end
        fail("passes must be a list of pass names (valid: fold, simplify, cse, dce, epilogue, join, reorder, "
             .. "fuse), got the key %s%s", type(k) == "string" and ("'" .. k .. "'") or tostring(k), hint)
      end
    end
    passes = {}
    for i, name in ipairs(opts.passes) do
      if not PASSES[name] then fail("passes[%d]: unknown pass '%s' (valid: fold, simplify, cse, dce, epilogue, join, reorder, fuse)", i, tostring(name)) end
      passes[i] = name
    end
  end
  local self = setmetatable({
    fn = fn, warmup = warmup, cache_size = cache_size, fallback = opts.fallback == true,
    verify = opts.verify == true, opaque = opts.opaque ~= false, passes = passes, tune = opts.tune, is_module = is_module,
    opts = opts, -- the children of a split module are compiled with the same options
    entries = {}, order = {},
    stats = {calls = 0, replays = 0, captures = 0, retraces = 0, eager = 0, evictions = 0},
    breaks = {}, last = nil,
  }, CF)
  return self
end

local split_call -- below: a module split at a graph break

local function touch(self, key)
  local order = self.order
  for i = #order, 1, -1 do
    if order[i] == key then table.remove(order, i) break end
  end
  order[#order + 1] = key
end

local function drop(self, key)
  local e = self.entries[key]
  if e and e.graph then e.graph:free() end
  if e and e.backward then e.backward.graph:free() end
  for _, c in ipairs(e and e.split and e.split.children or {}) do -- a split's compiled children
    if c.compiled then
      for k in pairs(c.compiled.entries) do drop(c.compiled, k) end
    end
  end
  self.entries[key] = nil
end

local function new_entry(self, key)
  local e = {key = key, seen = 0}
  self.entries[key] = e
  touch(self, key)
  while #self.order > self.cache_size do
    local old = table.remove(self.order, 1)
    drop(self, old)
    self.stats.evictions = self.stats.evictions + 1
  end
  return e
end

local function unpack_args(args) return table.unpack(args, 1, args.n) end

local function copy_in(flat, inputs)
  for i, t in ipairs(flat) do
    local c = inputs[i]
    if not rawequal(c, t) then
      if c.requires_grad then c = c:detach() end -- a leaf of the capture (an argument that requires grad)
      c:copy_(t)
    end
  end
end

local function copy_back(flat, inputs, written)
  for _, i in ipairs(written) do flat[i]:copy_(inputs[i]) end
end

local function clone(t) return t:clone() end

-- the results as fresh tensors (cloned under no_grad); the packed top level
-- walked directly
local function copy_out(res)
  local out = {n = res.n}
  for i = 1, res.n do out[i] = map_tensors(res[i], clone) end
  return out
end

-- copy_out, and the results that need gradients get their backward node
local function results(e, flat)
  local bw = e.backward
  -- (grad mode is in the key: an entry with a backward graph was captured with results that
  -- needed gradients, grad mode on, or turned on inside the function itself)
  if not bw then return core.no_grad(copy_out, e.outputs) end
  local res, graph = e.outputs, e.graph
  local function out(t)
    local c = core.no_grad(clone, t)
    local k = bw.index[t]
    if k then -- the leaves result k reaches; an argument's copy stands for this call's argument
      local leaves, grads = {}, {}
      for j, i in ipairs(bw.reach[k]) do
        leaves[j] = bw.arg_of and bw.arg_of[i] and flat[bw.arg_of[i]] or bw.leaves[i]
        grads[j] = bw.grads[i]
      end
      graph:attach_backward(c, bw.graph, bw.grad_in, k, leaves, grads)
    end
    return c
  end
  local r = {n = res.n}
  local function all() for i = 1, res.n do r[i] = map_tensors(res[i], out) end end
  -- (the nodes are made as the function's own grad mode made them: on)
  if core.is_grad_enabled() then all() else core.enable_grad(all) end
  return r
end

-- The backward graph of the results that need gradients (see the top of the
-- file): the gradients of the results with respect to the parameters, from
-- gradients placed in grad_in[k] (zeros but while result k's backward runs);
-- captured right after the forward, while its autograd graph is alive. nil
-- when no result needs one; nil and the reason when, with fallback, the
-- backward met a graph break (a tensor hook, a Function's Lua backward).
local function capture_backward(res, inputs, fallback, opaque)
  local diff, index = {}, {}
  map_tensors(res, function(t)
    if t.requires_grad and not index[t] then
      diff[#diff + 1] = t
      index[t] = #diff
    end
  end)
  if #diff == 0 then return nil end
  local leaves = core._grad_leaves(diff)
  if #leaves == 0 then return nil end
  local grad_in = {}
  for k, o in ipairs(diff) do grad_in[k] = core.no_grad(core.zeros_like, o) end
  local bg = core._graph_begin(fallback, opaque)
  -- (with fallback the graph is kept: after a break the results go back eagerly, to be
  -- differentiated then, and tensor hooks stay muted here: they run in that backward)
  local was_muted = mute_hooks(true)
  local ok, grads = pcall(core.grad, diff, leaves, {grad_outputs = grad_in, allow_unused = true,
                                                   retain_graph = fallback})
  mute_hooks(was_muted)
  local fok, why = pcall(bg.finish, bg)
  if not (ok and fok) then
    bg:free()
    if ok and fallback then return nil, tostring(why) end
    fail("capturing the backward of the results: %s", tostring(ok and why or grads))
  end
  local gs = {}
  for i = 1, #leaves do gs[i] = grads[i] or false end
  -- the leaves each result reaches: another result's leaves get no gradient (nil, as eagerly,
  -- not zeros: an optimizer would still decay or move them)
  local at = {}
  for i, l in ipairs(leaves) do at[core._storage_key(l)] = i end
  local reach = {}
  for k, o in ipairs(diff) do
    reach[k] = {}
    for _, l in ipairs(core._grad_leaves({o})) do reach[k][#reach[k] + 1] = at[core._storage_key(l)] end
  end
  -- leaves that are the copies of arguments: which argument (walk's order) each stands for
  local pos, arg_of = {}, nil
  for i, c in ipairs(inputs) do
    if c.requires_grad then pos[core._storage_key(c)] = pos[core._storage_key(c)] or i end
  end
  for i, l in ipairs(leaves) do
    local p = pos[core._storage_key(l)]
    if p then
      arg_of = arg_of or {}
      arg_of[i] = p
    end
  end
  return {leaves = leaves, graph = bg, grad_in = grad_in, grads = gs, index = index, results = #diff,
          arg_of = arg_of, reach = reach}
end

-- a yield inside a capture (or the probe) is refused by no_yield: say why
local function yield_message(err)
  if type(err) == "string" and err:find("attempt to yield across a C-call boundary", 1, true) then
    return "needle.compile: the compiled function called coroutine.yield while it was being captured; "
           .. "a capture records every op this thread runs until it ends, so it cannot be suspended: "
           .. "yield outside the compiled function (its replays run no Lua and never yield)"
  end
  return err
end

-- A module field assigned during the call (state.writes): a replay runs no
-- Lua, so it would neither assign it again nor read the new value.
local function module_write_break(writes)
  local w = writes[1]
  local m = w.module
  local name = getmetatable(m) and getmetatable(m).__name or "Module"
  return ("%s: needle.compile: nn.%s's field '%s' is assigned another value inside the compiled call (%d "
          .. "assignment(s) in all); a replay runs no Lua and would neither repeat it nor read the "
          .. "new value: keep such state in a tensor updated in place (t:copy_(new)), or pass it "
          .. "in and return it"):format(w.where, name, tostring(w.key), #writes)
end

-- What a later call's argument must not share memory with: the tensors the
-- graphs reach without an argument (by storage; the graph's intermediates
-- included, one held outside could come back as an argument) that they
-- update in place (`written`), and any of them when the argument itself is
-- updated in place (`any`, with `inputs_written` the argument positions).
local function alias_sets(graphs, inputs, written)
  local own = {}
  for _, c in ipairs(inputs) do own[core._storage_key(c)] = true end
  local sets = {written = {}, any = {}, inputs_written = {}, n = 0}
  for _, g in ipairs(graphs) do
    for _, r in ipairs(g:records()) do
      for _, a in ipairs(r.args) do
        if a.key and not own[a.key] then
          if not sets.any[a.key] then sets.n = sets.n + 1 end
          sets.any[a.key] = true
          if a.role:find("w", 1, true) then sets.written[a.key] = true end
        end
      end
    end
  end
  for _, i in ipairs(written) do sets.inputs_written[i] = true end
  return sets
end

-- true when argument i (storage key k) aliases a tensor of the graph in a way a replay
-- (or the capture) cannot follow
local function alias_hazard(sets, k, i)
  return sets.written[k] or (sets.inputs_written[i] and sets.any[k]) or false
end

local function capture_call(self, e, args, flat)
  local objects = object_guards(args) -- (as the call finds them: it may change them itself)
  -- different argument tensors sharing memory: their in-place updates could
  -- not be replayed into each other (each gets its own copy below)
  local shared, first_of = {}, {}
  for i, t in ipairs(flat) do
    if not first_of[t] then
      first_of[t] = i
      local k = core._storage_key(t)
      if shared[k] then shared[k][#shared[k] + 1] = i else shared[k] = {i} end
    end
  end
  -- the graph's own inputs (one per argument position, in walk's order; the
  -- same tensor twice gets one copy): later calls copy their arguments into these
  local inputs, copy_of = {}, {}
  for i, t in ipairs(flat) do
    if not copy_of[t] then
      copy_of[t] = detached_copy(t)
      -- an argument that requires grad (an activation of a bigger model): its copy is a leaf
      -- of the capture, and the backward graph gives its gradient to the argument of each call
      if t.requires_grad then copy_of[t]:requires_grad_(true) end
    end
    inputs[i] = copy_of[t]
  end
  local cargs = map_tensors(args, function(t) return copy_of[t] end)
  cargs.n = args.n
  local grad_args, versions = false, {}
  for i, c in ipairs(inputs) do
    grad_args = grad_args or c.requires_grad
    versions[i] = core._storage_version(c)
  end
  local st, outer, outer_writes = state.new(), state.active, state.writes
  state.active = st
  local ok, g = pcall(core._graph_begin, self.fallback, self.opaque)
  if not ok then state.active = outer; error(g, 0) end
  local res
  state.writes = {fresh = {}}
  ok, res = pcall(function() return table.pack(no_yield(self.fn, unpack_args(cargs))) end)
  local writes = state.writes
  state.active, state.writes = outer, outer_writes
  local fok, why = pcall(g.finish, g)
  if not ok then
    g:free()
    error(yield_message(res), 0)
  end
  if fok and #writes > 0 then fok, why = false, module_write_break(writes) end
  self.stats.captures = self.stats.captures + 1
  if not fok then
    g:free()
    if not self.fallback then error(why, 0) end
    -- a break the probe did not meet: this call ran on the graph's input copies, so the
    -- arguments get their in-place updates back here; results that needed the arguments'
    -- gradients cannot have them (the next calls run eagerly)
    e.broken = tostring(why)
    self.breaks[#self.breaks + 1] = e.broken
    for i, c in ipairs(inputs) do
      if core._storage_version(c) ~= versions[i] and not rawequal(c, flat[i]) then
        core.no_grad(function() flat[i]:copy_(c) end)
      end
    end
    if grad_args then
      fail("a graph break first met at the capture (%s), on a call whose arguments require grad: "
           .. "its results are not connected to them; the next calls run eagerly", e.broken)
    end
    return res
  end
  if grad_args and g:stats().leaves > 0 then
    g:free()
    fail("an argument requires grad and the function runs backward itself: the backward would "
         .. "fill its copy's gradient, not the argument's (pass it detached, or compile the "
         .. "forward alone)")
  end
  if self.verify then
    local problems = require("needle.compile.ir").verify(g:records())
    local cok, cerr = pcall(g.check, g)
    if not cok then problems = problems or {}; problems[#problems + 1] = tostring(cerr) end
    if problems then
      g:free()
      fail("the captured graph is inconsistent:\n  %s", table.concat(problems, "\n  "))
    end
  end
  -- arguments the function updates in place get the update back (as the
  -- eager call would give it), after the capture and after every replay
  local written = {}
  do
    local wkeys = {}
    for _, r in ipairs(g:records()) do
      for _, a in ipairs(r.args) do
        if a.key and a.role:find("w", 1, true) then wkeys[a.key] = true end
      end
    end
    for i, c in ipairs(inputs) do
      if wkeys[core._storage_key(c)] then written[#written + 1] = i end
    end
    for _, same in pairs(shared) do
      if #same > 1 then
        for _, i in ipairs(same) do
          if wkeys[core._storage_key(inputs[i])] then
            g:free()
            fail("arguments %s share memory and the function updates argument %d in place: pass "
                 .. "separate tensors", table.concat(same, ", "), i)
          end
        end
      end
    end
  end
  -- an argument that the function also reaches another way (a closure's tensor, a module's
  -- buffer, a view of one): the capture ran on the argument's copy, so there the two were
  -- separate memory; when either is updated in place the captured call differs from the eager one
  local alias = alias_sets({g}, inputs, written)
  for i, t in ipairs(flat) do
    if alias_hazard(alias, core._storage_key(t), i) then
      g:free()
      fail("argument %d (a tensor %s) shares memory with a tensor the function also reaches "
           .. "without it (a closure's or a module's tensor), and one of them is updated in place: "
           .. "the compiled function works on a copy of each argument, so the two would diverge; "
           .. "pass a copy (x:clone()) or leave the tensor out of the arguments",
           i, core._tensor_sig(t))
    end
  end
  core.no_grad(copy_back, flat, inputs, written)
  -- results that need gradients: their backward graph, unless the function
  -- ran a backward itself (a whole training step returns its loss detached)
  local bw
  if g:stats().leaves == 0 then -- (results need gradients under the caller's grad mode, or the
                                 -- function's own: nd.enable_grad inside, called under no_grad)
    local bok, b, broken = pcall(capture_backward, res, inputs, self.fallback, self.opaque)
    if not bok then g:free(); error(b, 0) end
    if broken then -- this call's results stay the eager ones (their graph reaches the parameters)
      g:free()
      e.broken = broken
      self.breaks[#self.breaks + 1] = broken
      if grad_args then
        fail("a graph break in the backward of the results (%s), on a call whose arguments require "
             .. "grad: its results are not connected to them; the next calls run eagerly", broken)
      end
      return res
    end
    bw = b
  end
  -- the results as the graph's tensors, without the capture's autograd graph
  -- (its saved activations would otherwise look held from outside)
  local detached = {}
  local outputs = map_tensors(res, function(t)
    detached[t] = detached[t] or t:detach()
    return detached[t]
  end)
  outputs.n = res.n
  if bw then
    local index = {}
    for t, k in pairs(bw.index) do index[detached[t]] = k end
    bw.index = index
  end
  res = nil
  -- what the capture left unreachable (autograd nodes and their saved
  -- tensors, Lua temporaries) must be gone for the plan to see which
  -- intermediates only the graph holds
  collectgarbage("collect")
  collectgarbage("collect")
  if core._custom_flush then core._custom_flush() end -- (freed Functions' nodes: their saved tensors)
  local pok, perr = pcall(function()
    e.passes = {}
    for _, c in ipairs(inputs) do g:mark_input(c) end -- arguments are no constants to fold
    for _, name in ipairs(self.passes) do e.passes[#e.passes + 1] = {name, g:pass(name)} end
    if self.verify then
      local problems = require("needle.compile.ir").verify(g:records())
      local cok, cerr = pcall(g.check, g) -- storage numbers, roles, views, whole writes (graph_check.c)
      if not cok then problems = problems or {}; problems[#problems + 1] = tostring(cerr) end
      if problems then
        fail("the graph is inconsistent after the passes:\n  %s", table.concat(problems, "\n  "))
      end
    end
    g:plan()
    if bw then
      -- (not fold nor join: the backward reads the forward's activations, which every forward
      -- replay rewrites, so nothing there stays constant for long)
      for _, name in ipairs(self.passes) do
        if name ~= "fold" and name ~= "join" then bw.graph:pass(name) end
      end
      if self.verify then
        local cok, cerr = pcall(bw.graph.check, bw.graph)
        if not cok then fail("the backward graph is inconsistent after the passes:\n  %s", tostring(cerr)) end
      end
      bw.graph:plan()
    end
  end)
  if not pok then
    g:free()
    if bw then bw.graph:free() end
    error(perr, 0)
  end
  -- State made during the capture that lives on (an optimizer's moments made
  -- by its first step) would be reset to its first value before every replay
  local out_keys = {}
  map_tensors(outputs, function(t) out_keys[core._storage_key(t)] = true end)
  -- (made inside on the host, kept by Lua and put back before each replay;
  -- the optimizers refuse to make their state inside a capture themselves)
  for _, r in ipairs(g:records()) do
    for _, a in ipairs(r.args) do
      if a.outside and not out_keys[a.key] and a.kind == "c" then
        g:free()
        if bw then bw.graph:free() end
        fail("state made during the capture (an optimizer's momentum or moments, a buffer made "
             .. "on the first call) lives on after it, and a replay would start it over: call the "
             .. "function once before it is captured (warmup >= 1)")
      end
    end
  end
  -- the fused kernels' tuned choices: from the file, then timed within opts.tune seconds
  if self.tune then
    local tok, t = pcall(function()
      local r = g:tune(self.tune)
      if bw then
        local b = bw.graph:tune(math.max(0, self.tune - r.seconds))
        for _, k in ipairs({"kernels", "gemms", "cached", "tuned", "untimed", "seconds"}) do r[k] = r[k] + b[k] end
        r.best_speedup = math.max(r.best_speedup, b.best_speedup)
      end
      return r
    end)
    if not tok then
      g:free()
      if bw then bw.graph:free() end
      error(t, 0)
    end
    e.tuning = t
  end
  e.written, e.inputs, e.outputs, e.backward = written, inputs, outputs, bw
  -- (from the planned graphs: the storages that the plan replaced are gone, and their
  -- addresses, which name storages here, may come back as a later argument's)
  e.alias = alias_sets(bw and {g, bw.graph} or {g}, inputs, written)
  e.module_guards = module_guards(st.modules)
  e.guards, e.hooks = st.guards, st.hooks
  e.object_guards = objects
  e.graph = g -- last: an entry with a graph is complete
  return results(e, flat)
end

local function replay(self, e, flat)
  local inputs = e.inputs
  core.no_grad(copy_in, flat, inputs)
  for _, h in ipairs(e.hooks) do h.run() end
  local launches = core.opencl_launches()
  local ok, err = pcall(e.graph.replay, e.graph)
  e.replay_launches = core.opencl_launches() - launches
  if not ok then -- a refused replay (a label out of range) leaves Lua's state as it was
    for i = #e.hooks, 1, -1 do if e.hooks[i].undo then e.hooks[i].undo() end end
    -- at the compiled call's line (the message names the line of the check itself)
    error(err, type(err) == "string" and 3 or 0)
  end
  self.stats.replays = self.stats.replays + 1
  if #e.written > 0 then core.no_grad(copy_back, flat, inputs, e.written) end
  return results(e, flat)
end

-- A module whose capture broke (fallback): its own Lua runs eagerly, and
-- each child that runs once per call goes through a compiled function of its
-- own (compiled with the same options, so a child that breaks splits in
-- turn). The first such call runs eagerly and counts the children's calls: a
-- child called twice per call stays eager, as the backward of its first
-- result would find the activations overwritten by the second.
local function run_split(map, fn, ...)
  local saved = state.split
  state.split = map
  local r = table.pack(pcall(fn, ...))
  state.split = saved
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

split_call = function(self, e, ...)
  local sp = e.split
  if sp then return run_split(sp.map, self.fn, ...) end
  local counts, count_map = {}, {}
  local children = self.fn:named_children()
  if #children == 0 then return self.fn(...) end -- nothing to split: eager
  for _, c in ipairs(children) do
    local m = c[2]
    count_map[m] = function(...)
      counts[m] = (counts[m] or 0) + 1
      return m(...) -- (state.call_split has taken the split map away: its hooks run, as eagerly)
    end
  end
  local out = table.pack(run_split(count_map, self.fn, ...))
  sp = {children = {}, map = {}}
  local copts = {}
  for k, v in pairs(self.opts) do copts[k] = v end
  copts.fallback = true
  for _, c in ipairs(children) do
    local name, m = c[1], c[2]
    local item = {name = name, class = tostring(getmetatable(m).__name or "Module"), calls = counts[m] or 0}
    if item.calls == 1 then
      local cf = M.compile(m, copts)
      item.compiled, item.eager_calls = cf, 0
      -- a call while an earlier result's backward is still to come (the parent called twice
      -- before one backward: a siamese pair) runs eagerly: a replay would overwrite what that
      -- backward reads
      sp.map[m] = function(...)
        if core.is_grad_enabled() then
          for _, ce in pairs(cf.entries) do
            if ce.graph and ce.graph:pending() > 0 then
              item.eager_calls = item.eager_calls + 1
              return m(...)
            end
          end
        end
        return cf(...)
      end
    else
      item.why = item.calls == 0 and "not called" or
                 ("called %d times per call (the backward of a result needs its own activations)"):format(item.calls)
    end
    sp.children[#sp.children + 1] = item
  end
  e.split = sp
  return table.unpack(out, 1, out.n)
end

function CF:__call(...)
  local args = table.pack(...)
  local key, flat = signature(args)
  local stats = self.stats
  stats.calls = stats.calls + 1
  local e = self.entries[key]
  if e and e.graph then
    local why = failed_guard(e)
    if why == nil then
      if self.order[#self.order] ~= key then touch(self, key) end
      self.last = e
      if e.alias.n > 0 then
        -- an argument that is also one of the graph's own tensors (see alias_sets): this call
        -- runs eagerly, as a replay would read or update a copy of it
        for i, t in ipairs(flat) do
          if alias_hazard(e.alias, core._storage_key(t), i) then
            stats.eager = stats.eager + 1
            e.alias_eager = (e.alias_eager or 0) + 1
            return self.fn(...)
          end
        end
      end
      return unpack_args(replay(self, e, flat))
    end
    drop(self, key)
    stats.retraces = stats.retraces + 1
    self.retrace_reasons = self.retrace_reasons or {}
    self.retrace_reasons[#self.retrace_reasons + 1] = why
    e = nil
  end
  if e == nil then e = new_entry(self, key) end
  self.last = e
  if e.broken or e.seen < self.warmup then
    e.seen = e.seen + 1
    stats.eager = stats.eager + 1
    if e.broken then
      if self.is_module and self.fallback then return split_call(self, e, ...) end
      return self.fn(...)
    end
    -- the eager call's peak memory, for explain()'s comparison (garbage of
    -- earlier calls collected first: it would be freed during the call)
    collectgarbage("collect")
    local base, launches = core.live_bytes(), core.opencl_launches()
    core.reset_peak_live_bytes()
    -- With fallback, the last eager call runs under a probe capture that only looks for
    -- graph breaks: a break found here leaves this signature eager before any capture on
    -- the graph's own input copies (whose results would not connect to the caller's
    -- autograd graph), with this call's results the eager ones.
    local probe = self.fallback and e.seen == self.warmup and core._graph_begin(true, self.opaque)
    local was_probing, outer_writes = state.probing, state.writes
    if probe then state.probing, state.writes = true, {fresh = {}} end
    local ok, out
    if probe then
      ok, out = pcall(function(...) return table.pack(no_yield(self.fn, ...)) end, ...)
    else
      ok, out = pcall(function(...) return table.pack(self.fn(...)) end, ...)
    end
    local writes = state.writes
    state.probing, state.writes = was_probing, outer_writes
    if probe then
      local fok, why = pcall(probe.finish, probe)
      probe:free()
      if fok and #writes > 0 then fok, why = false, module_write_break(writes) end
      if ok and not fok then
        e.broken = tostring(why)
        self.breaks[#self.breaks + 1] = e.broken
      end
    end
    if not ok then error(probe and yield_message(out) or out, 0) end
    e.eager_peak = core.peak_live_bytes() - base
    e.eager_launches = core.opencl_launches() - launches
    return unpack_args(out)
  end
  return unpack_args(capture_call(self, e, args, flat))
end

-- introspection -----------------------------------------------------------------------------

local function last_graph(self, who)
  local e = self.last
  if not (e and e.graph) then
    errors.fail_at(3, "compile", "%s: nothing compiled yet (the function has been called %d "
                   .. "time(s); it is captured on call %d)", who, self.stats.calls, self.warmup + 1)
  end
  return e
end

-- cf:ir() -> text of the last used graph: one line per recorded kernel
function CF:ir()
  return require("needle.compile.ir").text(last_graph(self, "ir").graph:records())
end

-- cf:dot() -> the same graph in Graphviz's dot language
function CF:dot()
  return require("needle.compile.ir").dot(last_graph(self, "dot").graph:records())
end

-- cf:explain() -> a report: kernels per call, memory held, guards, breaks
function CF:explain()
  local lines = {}
  local s = self.stats
  lines[#lines + 1] = ("calls %d: %d replayed, %d captured, %d eager, %d retraced, %d evicted")
                      :format(s.calls, s.replays, s.captures, s.eager, s.retraces, s.evictions)
  local e = self.last
  if e and (e.alias_eager or 0) > 0 then
    lines[#lines + 1] = ("aliasing: %d call(s) ran eagerly, an argument sharing memory with a tensor the "
                         .. "graph reaches itself (one of them updated in place)"):format(e.alias_eager)
  end
  if e and e.graph then
    local gs = e.graph:stats()
    local ir = require "needle.compile.ir"
    local removed = 0 -- (reorder moves records, it removes none)
    for _, p in ipairs(e.passes or {}) do if p[1] ~= "reorder" then removed = removed + p[2] end end
    local fills = gs.records - (gs.captured - removed)
    lines[#lines + 1] = ("graph: %d kernel calls per replay: the eager call made %d, the passes "
                         .. "removed %d%s; %d storages"):format(gs.records, gs.captured, removed,
                         fills > 0 and (", %d zero fills stand for its host-side zeros"):format(fills) or "",
                         gs.storages)
    lines[#lines + 1] = ("memory: intermediates %s in %d shared buffer(s) (at least %s; %s "
                         .. "unplanned), %s seen outside the graph; eager call's peak %s"):format(
                         ir.bytes(gs.planned_bytes), gs.buffers, ir.bytes(gs.bound_bytes),
                         ir.bytes(gs.internal_bytes),
                         ir.bytes(gs.fixed_bytes), e.eager_peak and ir.bytes(e.eager_peak) or "not measured")
    if (e.eager_launches or 0) > 0 or (e.replay_launches or 0) > 0 then
      lines[#lines + 1] = ("OpenCL kernel launches: %s per replay, %s in the eager call; %d of %d "
        .. "kernel calls replay as prepared launches"):format(
        tostring(e.replay_launches or "-"), tostring(e.eager_launches or "-"), gs.prepared, gs.records)
    end
    lines[#lines + 1] = ("constants: %d (%s) copied back before each replay"):format(gs.restored,
                         ir.bytes(gs.restored_bytes))
    if gs.folded > 0 then
      lines[#lines + 1] = ("folded: %d kernel(s) computed from constants (parameters, buffers) "
                           .. "run as a prologue, again only when one of those %d constants changes "
                           .. "(%d time(s) so far)"):format(gs.folded, gs.fold_sources, gs.refolds)
    end
    lines[#lines + 1] = ("guards: %d module(s), %d optimizer guard(s), %d replay hook(s); "
                         .. "gradients of %d leaves restored"):format(#e.module_guards, #e.guards,
                         #e.hooks, gs.leaves)
    lines[#lines + 1] = "kernels by entry: " .. ir.histogram(e.graph:records())
    -- opaque nodes: Lua (autograd.Function) run by every replay, in this graph or its backward's
    local opaque = {}
    local function note_opaque(g)
      for _, r in ipairs(g:records()) do
        if r.detail == "opaque_forward" or r.detail == "opaque_backward" then
          opaque[#opaque + 1] = ("'%s' (%s)"):format(r.op, r.detail == "opaque_forward" and "forward" or "backward")
        end
      end
    end
    note_opaque(e.graph)
    if e.backward then note_opaque(e.backward.graph) end
    if #opaque > 0 then
      lines[#lines + 1] = ("opaque nodes: %d autograd.Function call(s) whose Lua runs at every replay "
                           .. "(a barrier to fusion and reordering; results copied into the graph's "
                           .. "buffers): %s"):format(#opaque, table.concat(opaque, ", "))
    end
    if e.backward then
      local nargs = 0
      for _ in pairs(e.backward.arg_of or {}) do nargs = nargs + 1 end
      lines[#lines + 1] = ("backward: %d result(s) differentiable with respect to %d parameter(s)%s; "
                           .. "their backward graph replays %d kernel calls"):format(
                           e.backward.results, #e.backward.leaves - nargs,
                           nargs > 0 and (" and %d argument(s)"):format(nargs) or "",
                           e.backward.graph:stats().records)
    end
    local fused_rows = gs.fused_rows or 0
    if gs.fused_runs + fused_rows > 0 then
      local fuse_removed = 0
      for _, p in ipairs(e.passes or {}) do if p[1] == "fuse" then fuse_removed = fuse_removed + p[2] end end
      -- a fused_rows record is its run plus the row kernel: one record fewer than a run alone
      local runs = gs.fused_runs + fused_rows
      lines[#lines + 1] = ("fused: %d kernel(s) in place of %d elementwise ones%s; %d intermediate(s) "
                           .. "(%s) never stored"):format(runs, runs + fuse_removed - fused_rows,
                           fused_rows > 0 and (" and %d row kernel(s) (softmax, layer norm) that run theirs "
                             .. "as a prologue, row by row"):format(fused_rows) or "",
                           gs.fused_registers, ir.bytes(gs.fused_register_bytes))
      local shown = 0
      for _, r in ipairs(e.graph:records()) do
        if (r.entry == "fused_elementwise" or r.entry == "fused_rows") and shown < 8 then
          shown = shown + 1
          local out = r.args[1] and r.args[1].shape or {}
          local tuned = r.tune_size and ((r.device == "cpu" and ", tile %d" or ", work-group %d"):format(r.tune_size))
                        or ""
          if r.tune_serial then tuned = tuned .. ", one thread" end
          local tensors = 0 -- (a fused_rows record's input slots are empty: no memory)
          for _, a in ipairs(r.args) do if a.shape then tensors = tensors + 1 end end
          lines[#lines + 1] = ("  %s {%s} %s: %d tensor(s)%s"):format(r.detail, table.concat(out, ","),
                              r.device, tensors, tuned)
        end
      end
      if runs > shown then lines[#lines + 1] = ("  ... and %d more"):format(runs - shown) end
    end
    if e.tuning then
      local t = e.tuning
      lines[#lines + 1] = ("tuning: %d fused kernel(s) and %d product(s): %d from the cache, %d timed now in %.2f s%s%s"):format(
        t.kernels, t.gemms, t.cached, t.tuned, t.seconds,
        t.tuned > 0 and (" (best: %.2fx the default)"):format(t.best_speedup) or "",
        -- a budget too short for all of them: say so, a longer tune = seconds times the rest
        (t.untimed > 0 and self.tune > 0)
          and ("; %d left at the default, the %g s budget spent"):format(t.untimed, self.tune) or "")
      -- the products given another work split than their default (at most 8 shown)
      local split, shown = {}, 0
      local function note_split(g)
        for _, r in ipairs(g:records()) do
          local h = r.gemm_hint
          if h then
            shown = shown + 1
            if shown <= 8 then
              local parts = {}
              if h.threads > 0 then parts[#parts + 1] = ("at most %d thread(s)"):format(h.threads) end
              if h.mc > 0 then parts[#parts + 1] = ("%d rows per block"):format(h.mc) end
              if h.order == 1 then parts[#parts + 1] = "B panel stays in cache" end
              if h.order == 2 then parts[#parts + 1] = "A panel stays, B streams" end
              if h.split == 1 then parts[#parts + 1] = "threads take row blocks" end
              if h.split == 2 then parts[#parts + 1] = "threads take column ranges" end
              local dims = {}
              for _, a in ipairs(r.args) do
                if a.shape then dims[#dims + 1] = "(" .. table.concat(a.shape, ",") .. ")" end
              end
              split[#split + 1] = ("  %s %s: %s"):format(r.entry, table.concat(dims, " "), table.concat(parts, ", "))
            end
          end
        end
      end
      note_split(e.graph)
      if e.backward then note_split(e.backward.graph) end
      if shown > 0 then
        lines[#lines + 1] = ("tuned products: %d with another work split than the default"):format(shown)
        for _, l in ipairs(split) do lines[#lines + 1] = l end
        if shown > 8 then lines[#lines + 1] = ("  ... and %d more"):format(shown - 8) end
      end
    end
    local done = {}
    for _, p in ipairs(e.passes or {}) do
      done[#done + 1] = ("%s %s %d"):format(p[1], p[1] == "reorder" and "moved" or "removed", p[2])
    end
    if #done > 0 then lines[#lines + 1] = "passes: " .. table.concat(done, ", ") end
  end
  for _, why in ipairs(self.retrace_reasons or {}) do lines[#lines + 1] = "retraced: " .. why end
  for _, why in ipairs(self.breaks) do lines[#lines + 1] = "graph break (runs eagerly): " .. why end
  local sp = self.last and self.last.split
  if sp then
    lines[#lines + 1] = "split: the module's own code runs eagerly; its children:"
    for _, c in ipairs(sp.children) do
      local what
      if not c.compiled then what = "eager: " .. c.why
      elseif c.compiled.last and c.compiled.last.broken and not c.compiled.last.split then
        what = "eager: its own graph break: " .. c.compiled.last.broken:match("^[^\n]*")
      else
        what = "compiled: " .. c.compiled:explain():match("^[^\n]*")
        if c.compiled.last and c.compiled.last.split then what = what .. " (split in turn)" end
        if c.eager_calls > 0 then
          what = what .. ("; %d call(s) eager, made while an earlier result's backward was to come")
                 :format(c.eager_calls)
        end
      end
      lines[#lines + 1] = ("  %s (%s): %s"):format(c.name, c.class, what)
    end
  end
  return table.concat(lines, "\n")
end

return M
