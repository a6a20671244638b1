-- needle.compile.state: what Lua code tells a capture in progress (small and
-- loaded by nn.Module and the optimizers, so they need not load the compiler).
--
--   state.active            the capture in progress, or nil
--   state.note_module(m)    m ran inside it: its train/eval mode and the
--                           identity of its parameters become guards
--   state.guard(fn)         fn() must return the same value (==) on every
--                           later call, else the function is traced again
--                           (an optimizer's hyperparameters)
--   state.on_replay(fn[, undo])
--                           fn() runs before every replay: it refreshes what
--                           the recorded kernels read but Lua computes (an
--                           optimizer's step count and bias corrections);
--                           undo() takes it back when the replay is refused
--   state.split             while a compiled module that was split at a graph
--                           break runs its own Lua: {[child] = fn}, the
--                           children nn.Module's __call sends to their
--                           compiled functions (fn), else nil
--   state.probing           true while nd.compile's probe (fallback) looks for
--                           graph breaks in the call before the capture
--   state.compiling()       active or probing: library code that would read
--                           values on the host takes its capture path (the
--                           probe must find the breaks a capture would, no more)
--   state.writes            while a capture or the probe runs: {fresh = {},
--                           [i] = {module, key, where}}, the module fields
--                           assigned another value (nn.Module's __newindex)
--                           in modules made before the call (fresh: made in it)
--   state.note_write(m, k)  records one; a replay runs no Lua, so it would not
--                           repeat the assignment (a counter, a hidden state
--                           kept as a field): nd.compile refuses such a capture
local M = {active = nil, split = nil, probing = false, writes = nil}

function M.compiling() return M.active ~= nil or M.probing end

-- Bumped by every change to a module's parameters, buffers, children,
-- settings or train/eval mode (nn.Module): a compiled call rechecks its
-- module guards only when it moved.
M.generation = 0
function M.bump() M.generation = M.generation + 1 end

function M.note_module(m)
  local a = M.active
  if a and not a.module_seen[m] then
    a.module_seen[m] = true
    a.modules[#a.modules + 1] = m
  end
end

-- the first frame outside the nn.Module machinery: the user's assignment
local function where()
  for level = 3, 12 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if not info.short_src:find("needle/nn/module", 1, true) and not info.short_src:find("compile/state", 1, true) then
      return ("%s:%d"):format(info.short_src, info.currentline)
    end
  end
  return "?"
end

function M.note_write(m, k)
  local w = M.writes
  if w and not w.fresh[m] then w[#w + 1] = {module = m, key = k, where = where()} end
end

function M.note_new(m)
  local w = M.writes
  if w then w.fresh[m] = true end
end

function M.guard(fn)
  local a = M.active
  if a then a.guards[#a.guards + 1] = {fn = fn, value = fn()} end
end

function M.on_replay(fn, undo)
  local a = M.active
  if a then a.hooks[#a.hooks + 1] = {run = fn, undo = undo} end
end

-- child's compiled function, run without the parent's split table (the child
-- may be split itself)
function M.call_split(split, child, ...)
  M.split = nil
  local r = table.pack(pcall(split[child], ...))
  M.split = split
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

function M.new()
  return {modules = {}, module_seen = {}, guards = {}, hooks = {}}
end

return M
