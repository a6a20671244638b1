-- needle.nn.module: the Module base class.
--
-- A module is a table whose fields route through __newindex: assigning a
-- Module registers a child, a tensor that requires grad registers a
-- parameter, and `self:register_buffer(name, t)` a buffer (running stats),
-- each in assignment order, which is the order of parameters() and of the
-- state_dict - PyTorch's, so state_dict keys ("0.weight", "weight_ih_l0",
-- "running_mean") match PyTorch's for the same architecture.
--
--   local Linear = Module:extend("Linear")
--   function Linear:init(i, o) self.weight = ... end       -- constructor
--   function Linear:forward(x) return ... end
--   local m = Linear(3, 4); local y = m(x)
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local core = require "needle.core"
local options = require "needle.options"
local capture = require "needle.compile.state"
local hooks = require "needle.nn.module_hooks" -- (its __call is installed per module)

local Module = {}
Module.__name = "Module"

local RESERVED = {_params = true, _buffers = true, _children = true, _order = true, _attrs = true,
                  _hooks = true, _non_persistent = true, training = true}

-- How many arguments (after self) each forward function declares (math.huge:
-- a vararg one, or a C function); weak, as forwards come and go with classes.
local forward_arity = setmetatable({}, {__mode = "k"})

-- m(...) with more non-nil arguments than its forward declares is an error,
-- as PyTorch's TypeError: an argument silently dropped would be a model that
-- does not do what its caller wrote (m(x, mask) on a module without a mask)
local function check_arity_of(self, what, fwd, level, ...)
  local a = forward_arity[fwd]
  if a == nil then
    local info = type(fwd) == "function" and debug.getinfo(fwd, "u")
    a = (not info or info.isvararg or info.what == "C") and math.huge or info.nparams - 1
    forward_arity[fwd] = a
  end
  local n = select("#", ...)
  for i = a + 1, n do
    if select(i, ...) ~= nil then
      error(("needle.nn.%s: %s takes %d argument(s), got %d (argument %d is %s)"):format(
        self.__name, what, a, n, i, require("needle.options").got((select(i, ...)))), level)
    end
  end
end
local function check_arity(self, fwd, ...) return check_arity_of(self, "forward", fwd, 3, ...) end

-- instance metatable: reads look in parameters, buffers, children, plain
-- attributes, then the class chain
local function make_instance_mt(class)
  return {
    __index = function(self, k)
      local v = rawget(self, "_params")[k]
      if v ~= nil then return v end
      v = rawget(self, "_buffers")[k]
      if v ~= nil then return v end
      v = rawget(self, "_children")[k]
      if v ~= nil then return v end
      v = rawget(self, "_attrs")[k]
      if v ~= nil then return v end
      v = class[k]
      if v ~= nil then return v end
      -- nil, unless k is a misspelt method: then an error with a suggestion
      return require("needle.suggest").module_miss(self, class, k)
    end,
    __newindex = function(self, k, v)
      self:_set(k, v)
    end,
    __call = function(self, ...)
      if capture.active then capture.note_module(self) end
      local split = capture.split
      if split and split[self] then return capture.call_split(split, self, ...) end
      local fwd = self.forward
      if select("#", ...) > (forward_arity[fwd] or 0) then check_arity(self, fwd, ...) end
      return fwd(self, ...)
    end,
    __tostring = function(self) return self:_repr("") end,
    __name = class.__name,
    class = class,
    -- a module with hooks gets a copy of this table whose __call runs them
    -- (module_hooks.lua), so this one stays as fast as without hooks
  }
end

-- Module:extend(name): a subclass; calling the class constructs an instance
-- (new fields, then init(...)).
function Module:extend(name)
  local class = setmetatable({}, {__index = self, __call = function(cls, ...) return cls:new(...) end})
  class.__name = name or "Module"
  class._instance_mt = nil
  class.super = self
  return class
end

function Module:new(...)
  local class = self
  local mt = rawget(class, "_instance_mt")
  if not mt then
    mt = make_instance_mt(class)
    rawset(class, "_instance_mt", mt)
  end
  local obj = setmetatable({_params = {}, _buffers = {}, _children = {}, _order = {}, _attrs = {},
                            training = true}, mt)
  if capture.writes then capture.note_new(obj) end -- (its fields are no state of the caller's)
  -- (nn.Linear(2, 3, {}, 5): an argument the constructor would drop, as forward's)
  check_arity_of(obj, "the constructor", class.init, 3, ...)
  obj:init(...)
  return obj
end

function Module:init() end

function Module:forward(...) -- (any arguments: the message says why)
  error(("needle.nn.%s: forward is not defined"):format(self.__name), 2)
end

local function is_module(v)
  local mt = getmetatable(v)
  return type(v) == "table" and mt ~= nil and mt.class ~= nil
end
Module.is_module = is_module

local function note(self, kind, k)
  local order = rawget(self, "_order")
  for _, e in ipairs(order) do
    if e[2] == k then e[1] = kind; return end
  end
  order[#order + 1] = {kind, k}
end

-- routes an assignment; removes k from every other kind first
function Module:_set(k, v)
  capture.bump()
  if RESERVED[k] then rawset(self, k, v); return end
  local params, buffers, children, attrs =
    rawget(self, "_params"), rawget(self, "_buffers"), rawget(self, "_children"), rawget(self, "_attrs")
  if capture.writes then -- a compiled call assigning another value: its replays would not
    local old = params[k]
    if old == nil then old = buffers[k] end
    if old == nil then old = children[k] end
    if old == nil then old = attrs[k] end
    if not rawequal(old, v) then capture.note_write(self, k) end
  end
  params[k], children[k], attrs[k] = nil, nil, nil
  local was_buffer = buffers[k] ~= nil
  if is_module(v) then
    buffers[k] = nil
    children[k] = v
    note(self, "child", k)
  elseif core.is_tensor(v) and v.requires_grad and not was_buffer then
    params[k] = v
    note(self, "param", k)
  elseif was_buffer and (v == nil or core.is_tensor(v)) then
    buffers[k] = v -- buffers stay buffers (nil keeps the slot, as PyTorch)
  else
    buffers[k] = nil
    attrs[k] = v
  end
end

-- a parameter: the tensor itself, marked as requiring grad
function Module.Parameter(t, ...)
  if not core.is_tensor(t) or select("#", ...) > 0 then
    errors.fail_at(2, "nn.Parameter", "takes Parameter(tensor) only, got %s%s", options.got(t),
                   select("#", ...) > 0 and " and more arguments" or "")
  end
  t.requires_grad = true
  return t
end

-- register_buffer(name, t[, {persistent = true}]): a non-persistent buffer
-- (a cached mask, positions) is one of named_buffers() but not of the
-- state_dict, as PyTorch's
function Module:register_buffer(name, t, opts)
  local o = options.check(("nn.%s.register_buffer"):format(self.__name), opts, {persistent = "boolean"})
  if type(name) ~= "string" then
    errors.fail_at(2, ("nn.%s.register_buffer"):format(self.__name), "name must be a string, got %s", options.got(name))
  end
  if t ~= nil and not core.is_tensor(t) then
    errors.fail_at(2, ("nn.%s.register_buffer"):format(self.__name), "buffer '%s' must be a tensor or nil, got %s",
                   name, options.got(t))
  end
  capture.bump()
  local buffers = rawget(self, "_buffers")
  if capture.writes and not rawequal(buffers[name], t) then capture.note_write(self, name) end
  buffers[name] = t
  rawget(self, "_params")[name], rawget(self, "_children")[name], rawget(self, "_attrs")[name] = nil, nil, nil
  note(self, "buffer", name)
  local np = rawget(self, "_non_persistent")
  if o.persistent == false then
    if not np then np = {}; rawset(self, "_non_persistent", np) end
    np[name] = true
  elseif np then
    np[name] = nil
  end
end

function Module:register_parameter(name, t)
  capture.bump()
  if t ~= nil then t.requires_grad = true end
  rawget(self, "_params")[name] = t
  note(self, "param", name)
end

-- iteration ---------------------------------------------------------------

-- calls fn(kind, name, value) in registration order
local function each(self, fn)
  for _, e in ipairs(rawget(self, "_order")) do
    local kind, k = e[1], e[2]
    local v = (kind == "param" and rawget(self, "_params")[k]) or
              (kind == "buffer" and rawget(self, "_buffers")[k]) or
              (kind == "child" and rawget(self, "_children")[k]) or nil
    if v ~= nil then fn(kind, k, v) end
  end
end

-- named_parameters(prefix): a list of {name, tensor}, PyTorch's order
function Module:named_parameters(prefix, out, seen)
  out, seen = out or {}, seen or {}
  prefix = prefix or ""
  if type(prefix) ~= "string" then
    errors.fail_at(2, ("nn.%s.named_parameters"):format(self.__name), "prefix must be a string, got %s",
                   options.got(prefix))
  end
  each(self, function(kind, k, v)
    if kind == "param" then
      if not seen[v] then
        seen[v] = true
        out[#out + 1] = {prefix .. k, v}
      end
    elseif kind == "child" then
      v:named_parameters(prefix .. k .. ".", out, seen)
    end
  end)
  return out
end

function Module:parameters()
  local list = {}
  for i, p in ipairs(self:named_parameters()) do list[i] = p[2] end
  return list
end

function Module:named_buffers(prefix, out, persistent_only)
  out = out or {}
  prefix = prefix or ""
  local np = persistent_only and rawget(self, "_non_persistent")
  each(self, function(kind, k, v)
    if kind == "buffer" then
      if not (np and np[k]) then out[#out + 1] = {prefix .. k, v} end
    elseif kind == "child" then v:named_buffers(prefix .. k .. ".", out, persistent_only) end
  end)
  return out
end

function Module:named_children()
  local out = {}
  each(self, function(kind, k, v) if kind == "child" then out[#out + 1] = {k, v} end end)
  return out
end

function Module:children()
  local out = {}
  for i, c in ipairs(self:named_children()) do out[i] = c[2] end
  return out
end

-- named_modules(): {name, module} for self ("") and every descendant
function Module:named_modules(prefix, out)
  out = out or {}
  prefix = prefix or ""
  out[#out + 1] = {prefix, self}
  for _, c in ipairs(self:named_children()) do
    c[2]:named_modules(prefix == "" and c[1] or prefix .. "." .. c[1], out)
  end
  return out
end

function Module:modules()
  local out = {}
  for i, m in ipairs(self:named_modules()) do out[i] = m[2] end
  return out
end

-- apply(fn): fn(module) on every descendant, children first (as PyTorch)
function Module:apply(fn)
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    errors.fail_at(2, ("nn.%s.apply"):format(self.__name), "expected a function of a module, got %s", options.got(fn))
  end
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

function Module:train(mode)
  if mode == nil then mode = true end
  -- (a string or a number is true to Lua: train("no") would train)
  if type(mode) ~= "boolean" then
    errors.fail_at(2, ("nn.%s.train"):format(self.__name), "mode must be a boolean, got %s", options.got(mode))
  end
  capture.bump()
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode) end
  return self
end

function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

-- requires_grad_(requires_grad = true): sets requires_grad of every
-- parameter (false freezes them: no gradient, no optimizer step). Returns
-- the module.
function Module:requires_grad_(on)
  if on == nil then on = true end
  if type(on) ~= "boolean" then
    errors.fail_at(2, ("nn.%s.requires_grad_"):format(self.__name), "expected a boolean, got %s", options.got(on))
  end
  for _, p in ipairs(self:parameters()) do p:requires_grad_(on) end
  capture.bump()
  return self
end

-- hooks (module_hooks.lua): each returns a handle whose remove() takes the
-- hook out; {prepend = true} runs it before the ones already registered
function Module:register_forward_pre_hook(fn, opts) return hooks.register(self, "pre", fn, opts) end
function Module:register_forward_hook(fn, opts) return hooks.register(self, "fwd", fn, opts) end
function Module:register_full_backward_hook(fn, opts) return hooks.register(self, "bwd", fn, opts) end

-- to(device), to(dtype), to(device, dtype), to(tensor) (its device and
-- dtype) or to({device=, dtype=}): moves every parameter and buffer (of
-- this module and its descendants) to the device, in place: each tensor takes
-- the moved data with x:set_data_ (PyTorch's `p.data = p.data.to(dev)`), so
-- the tensors an optimizer or any other table holds stay the module's
-- parameters. Gradients move with their parameters. A dtype converts the
-- floating-point parameters and buffers only (integer buffers such as
-- num_batches_tracked keep theirs), as PyTorch. Returns the module.
local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}
local DTYPE = {float32 = true, float64 = true, float16 = true, bfloat16 = true, int64 = true, int32 = true,
               uint8 = true, bool = true}

function Module:to(device, dtype)
  local fail = errors.failer(("nn.%s.to"):format(self.__name), 3)
  if core.is_tensor(device) then -- to(tensor): its device and dtype
    if dtype ~= nil then fail("to(tensor) takes nothing after the tensor, got %s", options.got(dtype)) end
    device, dtype = device.device, device.dtype
  elseif type(device) == "table" then
    if dtype ~= nil then fail("to({device=, dtype=}) takes nothing after the table, got %s", options.got(dtype)) end
    local o = options.check(("nn.%s.to"):format(self.__name), device, {device = "string", dtype = "string"})
    device, dtype = o.device, o.dtype
  elseif DTYPE[device] then -- to(dtype)
    if dtype ~= nil then fail("to(dtype) takes nothing after the dtype, got %s", options.got(dtype)) end
    device, dtype = nil, device
  elseif dtype ~= nil and type(dtype) ~= "string" then
    fail("to(device, dtype): dtype must be a string, got %s", options.got(dtype))
  end
  if device ~= nil and type(device) ~= "string" then
    fail("expected a device name (\"cpu\", \"opencl\" or \"opencl:N\"), a dtype, a tensor or {device=, dtype=}, got %s",
         options.got(device))
  end
  if dtype ~= nil and not FLOAT[dtype] then
    fail("dtype must be a floating-point dtype (float32, float64, float16 or bfloat16), got %s", tostring(dtype))
  end
  if device == nil and dtype == nil then return self end
  -- the device is checked once, before anything moves: a bad name changes nothing
  if device ~= nil then
    local ok, err = pcall(core.zeros, {0}, {device = device})
    if not ok then
      fail("cannot move to device '%s': %s", device, (tostring(err):gsub("^.-needle%.[%w_]+: ", "")))
    end
  end
  local moved, err = {}, nil -- a tensor shared by several modules moves once
  local function move(t)
    if moved[t] or err then return end
    moved[t] = true
    local opts = {device = device}
    if dtype ~= nil and FLOAT[t.dtype] then opts.dtype = dtype end
    local grad = t.grad
    local ok, e = pcall(core.no_grad, function()
      t:set_data_(t:to(opts))
      if grad ~= nil then t.grad = grad:to(opts) end
    end)
    if not ok then err = tostring(e) end
  end
  for _, m in ipairs(self:modules()) do
    each(m, function(kind, _, v)
      if kind == "param" or kind == "buffer" then move(v) end
    end)
  end
  if err then fail(("cannot move to device '%s': %s"):format(tostring(device or "(same)"), err)) end
  return self
end

-- the floating-point parameters and buffers to one dtype (integer buffers
-- keep theirs), as PyTorch's Module.double() & co.; each returns the module
function Module:double() return self:to({dtype = "float64"}) end
function Module:float() return self:to({dtype = "float32"}) end
function Module:half() return self:to({dtype = "float16"}) end
function Module:bfloat16() return self:to({dtype = "bfloat16"}) end

-- state_dict ----------------------------------------------------------------

-- state_dict(): {name = tensor} for every parameter and buffer (detached
-- views: saving never captures a graph)
function Module:state_dict()
  local sd = {}
  for _, p in ipairs(self:named_parameters()) do sd[p[1]] = p[2]:detach() end
  for _, b in ipairs(self:named_buffers(nil, nil, true)) do sd[b[1]] = b[2]:detach() end
  return sd
end

local shape_str = errors.shape_str

-- load_state_dict(sd, {strict = true}): checks everything first (missing,
-- unexpected and shape-mismatched keys are reported together), then copies;
-- a failed load leaves the module untouched. Returns missing, unexpected.
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" or core.is_tensor(sd) then
    errors.fail_at(2, ("nn.%s.load_state_dict"):format(self.__name), "expected a state_dict (a table of "
                   .. "name = tensor), got %s", options.got(sd))
  end
  opts = options.check(("nn.%s.load_state_dict"):format(self.__name), opts, {strict = "boolean"})
  local strict = opts.strict ~= false
  local targets = {}
  for _, p in ipairs(self:named_parameters()) do targets[p[1]] = p[2] end
  -- (non-persistent buffers are not in a state_dict: never missing)
  for _, b in ipairs(self:named_buffers(nil, nil, true)) do targets[b[1]] = b[2] end
  local missing, unexpected, mismatched = {}, {}, {}
  for name, t in pairs(targets) do
    local src = sd[name]
    if src == nil then
      missing[#missing + 1] = name
    elseif not core.is_tensor(src) then
      mismatched[#mismatched + 1] = ("%s (not a tensor: %s)"):format(name, type(src))
    elseif shape_str(src) ~= shape_str(t) then
      mismatched[#mismatched + 1] = ("%s (checkpoint %s, model %s)"):format(name, shape_str(src), shape_str(t))
    end
  end
  for name in pairs(sd) do
    if targets[name] == nil then unexpected[#unexpected + 1] = name end
  end
  table.sort(missing); table.sort(unexpected); table.sort(mismatched)
  local problems = {}
  if #mismatched > 0 then problems[#problems + 1] = "shape mismatch: " .. table.concat(mismatched, ", ") end
  if strict and #missing > 0 then problems[#problems + 1] = "missing keys: " .. table.concat(missing, ", ") end
  if strict and #unexpected > 0 then problems[#problems + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
  if #problems > 0 then
    error(("needle.nn.%s.load_state_dict: %s"):format(self.__name, table.concat(problems, "; ")), 2)
  end
  core.no_grad(function()
    for name, t in pairs(targets) do
      local src = sd[name]
      if src ~= nil then t:copy_(src) end
    end
  end)
  return missing, unexpected
end

-- printing ----------------------------------------------------------------

function Module:extra_repr() return "" end

function Module:_repr(indent)
  local kids = self:named_children()
  local head = self.__name .. "(" .. self:extra_repr()
  if #kids == 0 then return head .. ")" end
  local lines = {head}
  for _, c in ipairs(kids) do
    lines[#lines + 1] = indent .. "  (" .. c[1] .. "): " .. c[2]:_repr(indent .. "  ")
  end
  lines[#lines + 1] = indent .. ")"
  return table.concat(lines, "\n")
end

-- summary([input][, {depth=, dtype=, device=, verbose=}]): the layers, their
-- output shapes and parameter counts, and the totals (nn/summary.lua);
-- printed (verbose = 0: not) and returned
function Module:summary(input, opts)
  return require("needle.nn.summary").summary(self, input, opts)
end

return Module
