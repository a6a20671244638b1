-- needle.nn.module_hooks: forward pre-hooks, forward hooks and full backward
-- hooks of nn.Module (PyTorch's register_forward_pre_hook,
-- register_forward_hook, register_full_backward_hook), as Module's methods
-- use them (docs/nn.md).
--
-- A module's hooks live in its raw field _hooks = {pre = {...}, fwd = {...},
-- bwd = {...}} (lists of {fn = fn} in calling order). While one is
-- registered, the module's metatable is a copy of its class's instance
-- metatable whose __call runs them (the copy keeps every other field:
-- __index, class, __name); removing the last one puts the class's table
-- back. Module's own __call never looks for hooks, so a module without them
-- is called as fast as before hooks existed (a test in __call cost 10% of a
-- call to a trivial module).
--
-- Full backward hooks, as PyTorch's BackwardHook: the tensor arguments that
-- require grad reach forward through identity nodes, and so do the results;
-- all of them also feed one "token" node made on the inputs, so that the
-- token's backward runs once, after every identity node the backward reaches
-- (the results' nodes note grad_output, the inputs' nodes grad_input). There
-- the hooks see (module, grad_input, grad_output) and may replace grad_input,
-- which the token's backward then gives to the inputs.
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local core = require "needle.core"
local options = require "needle.options"
local capture = require "needle.compile.state"

local M = {}

local is_tensor = core.is_tensor
-- (a binary built before core._graph_break: no capture can see the break)
local graph_break = core._graph_break or function() end
local KINDS = {pre = "register_forward_pre_hook", fwd = "register_forward_hook",
               bwd = "register_full_backward_hook"}

-- handles ------------------------------------------------------------------------------

local Handle = {}
Handle.__index = Handle
Handle.__name = "needle.RemovableHandle"

-- handle:remove(): the hook stops running (removing twice does nothing)
function Handle:remove()
  local m, list, rec = self.module, self.list, self.rec
  capture.bump() -- (compiled calls that ran this module check their hooks again)
  for i, r in ipairs(list) do
    if r == rec then table.remove(list, i) break end
  end
  local hooks = rawget(m, "_hooks")
  if hooks == self.hooks and #hooks.pre + #hooks.fwd + #hooks.bwd == 0 then
    rawset(m, "_hooks", nil)
    local mt = getmetatable(m)
    if mt.plain then setmetatable(m, mt.plain) end -- back to the plain __call
  end
end
Handle.__close = Handle.remove

-- m:register_*_hook(fn[, {prepend = false}]) -> handle
function M.register(m, kind, fn, opts)
  local who = ("nn.%s.%s"):format(m.__name, KINDS[kind])
  if type(fn) ~= "function" then
    errors.fail_at(3, who, "expected a function, got %s", options.got(fn))
  end
  local o = options.check(who, opts, {prepend = "boolean"})
  local hooks = rawget(m, "_hooks")
  if not hooks then
    hooks = {pre = {}, fwd = {}, bwd = {}}
    rawset(m, "_hooks", hooks)
    local mt, hooked = getmetatable(m), {}
    for k, v in pairs(mt) do hooked[k] = v end
    hooked.__call, hooked.plain = M.hooked_call, mt
    setmetatable(m, hooked)
  end
  capture.bump() -- (compiled calls that ran this module check their hooks again)
  local list, rec = hooks[kind], {fn = fn}
  if o.prepend then table.insert(list, 1, rec) else list[#list + 1] = rec end
  return setmetatable({module = m, hooks = hooks, list = list, rec = rec}, Handle)
end

-- calling a module with hooks ----------------------------------------------------------------

local function copy(list)
  local out = {}
  for i, r in ipairs(list) do out[i] = r.fn end
  return out
end

local function shape_of(t) return errors.shape_str(t) end

-- replacement grad_input from a backward hook, checked against the one it replaces
local function check_grad_input(who, got, grad_input, args)
  if type(got) ~= "table" or is_tensor(got) then
    error(("needle.%s: a backward hook returned %s; expected nil or a table of %d gradient(s) "
           .. "(grad_input)"):format(who, options.got(got), grad_input.n), 0)
  end
  local n = got.n or #got
  if n ~= grad_input.n then
    error(("needle.%s: a backward hook returned %d gradient(s) for %d input(s)"):format(who, n, grad_input.n), 0)
  end
  for i = 1, n do
    local g, x = got[i], args[i]
    if g ~= nil then
      if not is_tensor(g) then
        error(("needle.%s: a backward hook returned %s as gradient %d; expected a tensor or nil")
              :format(who, options.got(g), i), 0)
      end
      if not (is_tensor(x) and x.requires_grad) then
        error(("needle.%s: a backward hook returned a gradient for input %d, which has none (%s)")
              :format(who, i, is_tensor(x) and "it does not require grad" or "not a tensor"), 0)
      end
      if shape_of(g) ~= shape_of(x) or g.dtype ~= x.dtype or g.device ~= x.device then
        error(("needle.%s: a backward hook returned a %s gradient of shape %s on %s for input %d, a "
               .. "%s tensor of shape %s on %s"):format(who, g.dtype, shape_of(g), g.device, i, x.dtype,
               shape_of(x), x.device), 0)
      end
    end
  end
  got.n = n
  return got
end

-- the identity nodes of a call with full backward hooks (see the top)
local function setup_backward(m, hooks, args)
  local who = ("nn.%s.register_full_backward_hook"):format(m.__name)
  local st = {grad_output = nil, grad_input = {}, positions = {}}
  local ins = {}
  for i = 1, args.n do
    local x = args[i]
    if is_tensor(x) and x.requires_grad then
      ins[#ins + 1] = x
      st.positions[#st.positions + 1] = i
    end
  end
  local originals = {n = args.n}
  for i = 1, args.n do originals[i] = args[i] end
  -- the token: a function of the inputs (of a leaf of its own when none requires grad)
  local token_in = #ins > 0 and ins or {core.zeros({1}, {requires_grad = true})}
  local fns = copy(hooks)
  st.token = core._custom_record("BackwardHookFunctionBackward", token_in, core.zeros({1}), function()
    local grad_input = {n = args.n}
    for k, i in ipairs(st.positions) do grad_input[i] = st.grad_input[k] end
    local grad_output = st.grad_output or {n = st.nout or 0}
    st.grad_input, st.grad_output = {}, nil -- a second backward (retain_graph) fills them again
    for _, fn in ipairs(fns) do
      local r = fn(m, grad_input, grad_output)
      if r ~= nil then grad_input = check_grad_input(who, r, grad_input, originals) end
    end
    if #ins == 0 then return nil end
    local out = {}
    for k, i in ipairs(st.positions) do out[k] = grad_input[i] end
    return table.unpack(out, 1, #ins)
  end)
  local zero = core.zeros({1})
  for k, i in ipairs(st.positions) do
    args[i] = core._custom_record("BackwardHookFunctionBackward", {st.token}, args[i], function(g)
      st.grad_input[k] = g
      return zero
    end)
  end
  return st
end

local function wrap_outputs(st, out)
  st.nout = out.n
  local zero = core.zeros({1})
  for j = 1, out.n do
    local o = out[j]
    if is_tensor(o) and o.requires_grad then
      out[j] = core._custom_record("BackwardHookFunctionBackward", {o, st.token}, o, function(g)
        st.grad_output = st.grad_output or {n = out.n}
        st.grad_output[j] = g
        return g, zero
      end)
    end
  end
  return out
end

-- m(...) for a module with hooks: pre-hooks (may replace the arguments),
-- forward, forward hooks (may replace the result), with the backward hooks'
-- identity nodes around forward when grad mode records
local function call(m, hooks, ...)
  -- (a copy of a module made with its raw fields, after its hooks were removed)
  if not hooks or #hooks.pre + #hooks.fwd + #hooks.bwd == 0 then return m:forward(...) end
  -- Lua that a compiled replay would not run: a capture falls back to eager (or fails)
  graph_break(("nn.%s: a module with hooks (register_forward_hook & co.) runs"):format(m.__name))
  local args = table.pack(...)
  for _, fn in ipairs(copy(hooks.pre)) do
    local r = fn(m, args)
    if r ~= nil then
      if type(r) == "table" and not is_tensor(r) then
        args = table.pack(table.unpack(r, 1, r.n or #r))
      else
        args = table.pack(r) -- a single value stands for a one-argument list, as PyTorch's
      end
    end
  end
  local st
  if #hooks.bwd > 0 and core.is_grad_enabled() then st = setup_backward(m, hooks.bwd, args) end
  local out = table.pack(m:forward(table.unpack(args, 1, args.n)))
  for _, fn in ipairs(copy(hooks.fwd)) do
    local o = out
    if out.n == 1 then o = out[1] end
    local r = fn(m, args, o)
    if r ~= nil then
      if out.n == 1 then out = table.pack(r)
      elseif type(r) == "table" and not is_tensor(r) then out = table.pack(table.unpack(r, 1, r.n or #r))
      else
        errors.fail(("nn.%s.register_forward_hook"):format(m.__name),
                    "forward returned %d values: a forward hook's replacement must be a table of them, got %s",
                    out.n, options.got(r))
      end
    end
  end
  if st then out = wrap_outputs(st, out) end
  return table.unpack(out, 1, out.n)
end

-- the hooked metatable's __call: Module's (capture notes, split children), then call
function M.hooked_call(m, ...)
  if capture.active then capture.note_module(m) end
  local split = capture.split
  if split and split[m] then return capture.call_split(split, m, ...) end
  return call(m, rawget(m, "_hooks"), ...)
end

return M
