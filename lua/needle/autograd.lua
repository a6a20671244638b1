-- needle.autograd (nd.autograd): custom differentiable functions, as
-- PyTorch's torch.autograd.Function.
--
--   local Square = nd.autograd.Function{
--     name = "square",                       -- shown by y.grad_fn (optional)
--     forward = function(ctx, x)             -- runs without recording
--       ctx:save_for_backward(x)
--       return x * x
--     end,
--     backward = function(ctx, grad)         -- one gradient (or nil) per argument
--       local x = ctx.saved_tensors[1]
--       return grad * 2 * x
--     end,
--   }
--   local y = Square(x)                      -- or Square:apply(x)
--
-- forward returns one tensor. backward runs with grad mode on only under
-- create_graph, so a backward written with differentiable ops gives
-- gradients of gradients. Arguments that are not tensors (numbers, tables)
-- get no gradient: return nil for them.
--
-- In nd.compile: forward and backward are Lua, which a replay of the
-- captured kernels would not run again (a counter, a value read from a
-- table, a print would keep their capture-time effect). Three ways:
--   * by default, calling a Function while a compiled function is captured
--     is a graph break: with {fallback = true} that signature runs eagerly
--     and cf:explain() names the Function; without it the capture fails
--     saying so;
--   * compiled with {opaque = true}, the call is one opaque node of the
--     graph: every replay calls forward (a new ctx, the replay's input
--     tensors, the same non-tensor arguments) and copies its result into
--     the graph's buffer; in a captured backward, an opaque node calls
--     backward with that ctx. Their results must keep the shape and dtype
--     they had at the capture (else the replay fails naming the Function).
--     A backward under create_graph still breaks the graph;
--   * a Function declared with traceable = true promises that forward and
--     backward are tensor ops only, whose kernels a replay may repeat: it is
--     captured like any other code (forward and backward inlined into the
--     graphs).
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"

local M = {}

-- (a binary built before core._graph_break: no capture can see the break)
local graph_break = core._graph_break or function() end
local opaque_ok = core._graph_opaque_ok or function() return false end

local Ctx = {}
Ctx.__index = Ctx
function Ctx:save_for_backward(...)
  self.saved_tensors = table.pack(...)
end

local Function = {}
Function.__index = Function

-- Runs fn with the capture paused (its kernels are the opaque node's own).
local function paused(fn, ...)
  local was = core._graph_pause(true)
  local r = table.pack(pcall(fn, ...))
  core._graph_pause(was)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

local function check_out(self, out)
  if not core.is_tensor(out) then
    errors.fail("autograd.Function", "%s: forward must return a tensor, got %s", self.name, options.got(out))
  end
end

-- A call inside a capture that records opaque nodes (nd.compile{opaque = true}):
-- forward runs now, outside the graph, and the graph gets one node that runs
-- it again at each replay; backward likewise, when the capture meets it.
local function opaque_apply(self, args)
  local tin, tpos = {}, {}
  for i = 1, args.n do
    if core.is_tensor(args[i]) then tin[#tin + 1] = args[i]; tpos[#tpos + 1] = i end
  end
  local ctx = setmetatable({saved_tensors = {}}, Ctx)
  local forward, backward, name = self.forward, self.backward, self.name
  local out = paused(core.no_grad, function() return forward(ctx, table.unpack(args, 1, args.n)) end)
  check_out(self, out)
  -- the ctx of the latest run of this node (the capture's until a replay), for its backward's
  -- replays (a compiled call's results are differentiated by a replay of its backward graph)
  local live = {ctx = ctx}
  local function replay_forward(...)
    local a = table.pack(table.unpack(args, 1, args.n))
    for j = 1, #tpos do a[tpos[j]] = (select(j, ...)) end
    local c = setmetatable({saved_tensors = {}}, Ctx)
    live.ctx = c
    local r = core.no_grad(function() return forward(c, table.unpack(a, 1, a.n)) end)
    check_out(self, r)
    return r
  end
  local outs, why = core._graph_opaque(name, "forward", replay_forward, tin, {out})
  if not outs then
    graph_break(why) -- (with fallback the capture pauses and this call goes on eagerly)
  else
    out = outs[1]
  end
  if args.n == 0 then return out end
  local list = {}
  for i = 1, args.n do list[i] = core.is_tensor(args[i]) and args[i] or false end
  local reads = {}
  for j, t in ipairs(tin) do reads[j + 1] = t end -- (its saved inputs must live until it runs)
  return core._custom_record(name, list, out, function(grad)
    if not opaque_ok() then return backward(ctx, grad) end
    if core.is_grad_enabled() then -- create_graph: the gradients need their own autograd graph
      graph_break(("autograd.Function: '%s' runs its Lua backward under create_graph"):format(name))
      return backward(ctx, grad)
    end
    local g = table.pack(paused(backward, ctx, grad))
    local gout, gpos = {}, {}
    for i = 1, args.n do
      if core.is_tensor(g[i]) then gout[#gout + 1] = g[i]; gpos[#gpos + 1] = i end
    end
    if #gout == 0 then return table.unpack(g, 1, args.n) end
    reads[1] = grad
    local function replay_backward(gr)
      local r = table.pack(backward(live.ctx, gr))
      local res = {}
      for j, i in ipairs(gpos) do
        if not core.is_tensor(r[i]) then
          errors.fail("autograd.Function", "%s: backward returned %s for argument %d at a replay of "
                      .. "a compiled call, where the capture had a tensor", name, options.got(r[i]), i)
        end
        res[j] = r[i]
      end
      return table.unpack(res, 1, #gpos)
    end
    local gs, gwhy = core._graph_opaque(name, "backward", replay_backward, reads, gout)
    if not gs then
      graph_break(gwhy)
      return table.unpack(g, 1, args.n)
    end
    for j, i in ipairs(gpos) do g[i] = gs[j] end
    return table.unpack(g, 1, args.n)
  end)
end

function Function:apply(...)
  if not self.traceable and opaque_ok() then return opaque_apply(self, table.pack(...)) end
  if not self.traceable then
    graph_break(("autograd.Function: '%s' runs its Lua forward and backward at every call")
                      :format(self.name))
  end
  local args = table.pack(...)
  local ctx = setmetatable({saved_tensors = {}}, Ctx)
  local out = core.no_grad(function() return self.forward(ctx, table.unpack(args, 1, args.n)) end)
  if not core.is_tensor(out) then
    errors.fail("autograd.Function", "%s: forward must return a tensor, got %s", self.name, options.got(out))
  end
  if args.n == 0 then return out end
  local backward = self.backward
  local list = {}
  for i = 1, args.n do list[i] = core.is_tensor(args[i]) and args[i] or false end
  return core._custom_record(self.name, list, out, function(grad) return backward(ctx, grad) end)
end
Function.__call = function(self, ...) return self:apply(...) end

function M.Function(spec)
  local o = options.check("autograd.Function", spec,
                          {forward = "function", backward = "function", name = "string", traceable = "boolean"})
  if not o.forward or not o.backward then
    errors.fail("autograd.Function", "needs both forward and backward functions")
  end
  return setmetatable({forward = o.forward, backward = o.backward, name = o.name or "custom",
                       traceable = o.traceable == true}, Function)
end

return M
