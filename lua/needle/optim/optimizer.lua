-- needle.optim.optimizer: the Optimizer base class (PyTorch's torch.optim.Optimizer).
--
-- A concrete optimizer is made with Optimizer:extend{...}:
--
--   local SGD = Optimizer:extend{
--     name = "SGD",
--     defaults = {lr = 1e-3, momentum = 0, ...},   -- every option and its default
--     state_keys = {momentum_buffer = "tensor"},    -- what a parameter's state may hold
--                                                   -- (kinds: see STATE_KINDS below)
--     check = function(group, fail) ... end,        -- validates a group's hyperparameters
--     init_state = function(p, group) ... end,      -- optional: state made at construction
--     update = function(self, group) ... end,       -- one step for one group (grad mode off)
--     untyped = {line_search_fn = true},            -- optional: defaults whose type check
--   }                                               --   is left to `check` (nil-able ones)
--
-- and called as SGD(params, opts). `params` is a list of tensors, a list of
-- groups ({params = {...}, lr = ...}; a group's missing options take the
-- optimizer's), a module (its :parameters()) or a single tensor.
--
-- Per-parameter state lives in opt.state[p] (a table; tensors there are updated
-- in place). Parameters are updated in place under no_grad; p.grad is only read.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local capture = require "needle.compile.state"
local errors = require "needle.errors"
local options = require "needle.options"

local is_tensor = core.is_tensor

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.name = "Optimizer"

-- group keys that are not hyperparameters but are kept in groups and state
-- dicts (written by the lr schedulers, or a user's label)
local EXTRA_GROUP_KEYS = {initial_lr = true, max_lr = true, min_lr = true, max_momentum = true,
                          base_momentum = true, name = true}

-- a needle.nn module (see needle.nn.module)
local function is_module(v)
  local mt = type(v) == "table" and getmetatable(v)
  return mt and mt.class ~= nil or false
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end

local shape_str = errors.shape_str

local function fmt(v)
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = fmt(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  elseif type(v) == "string" then
    return ("%q"):format(v)
  elseif math.type(v) == "float" then
    -- the shortest form that reads back as the same number
    for digits = 15, 17 do
      local s = ("%." .. digits .. "g"):format(v)
      if tonumber(s) == v then
        return s:find("[.eni]") and s or s .. ".0" -- 1.0 reads as a float, as Lua prints it
      end
    end
  end
  return tostring(v)
end
Optimizer._fmt = fmt

-- copy of a hyperparameter value (tables such as betas are copied)
local function copy_value(v)
  if type(v) == "table" and not is_tensor(v) then
    local c = {}
    for k, x in pairs(v) do c[k] = copy_value(x) end
    return c
  end
  return v
end

-- every key of t, each of any type (options.check spec: the values are
-- checked by the optimizer's own check)
local function any_of(...)
  local spec = {}
  for _, t in ipairs({...}) do
    for k in pairs(t) do spec[k] = "any" end
  end
  return spec
end

-- "needle.optim.SGD: ..." errors, at the user's code: the first stack frame
-- outside the package, whatever the depth of the internal calls (needle.errors)
function Optimizer:_error(msg)
  errors.fail("optim." .. self.name, "%s", msg)
end

-- a list of tensors from what the user passed as a group's params
local function param_list(self, params)
  if is_tensor(params) then return {params} end
  if type(params) ~= "table" then
    self:_error(("params must be a list of tensors, a list of parameter groups, a module or a " ..
                 "tensor, got %s"):format(type(params)))
  end
  if is_module(params) then params = params:parameters() end
  local list = {}
  for i, p in ipairs(params) do
    if not is_tensor(p) then
      self:_error(("params[%d] is a %s, not a tensor"):format(i, type(p)))
    end
    if not p.is_leaf then
      self:_error(("params[%d] is not a leaf tensor (it has a grad_fn); optimize leaves, e.g. " ..
                   "x:detach():requires_grad_()"):format(i))
    end
    if p.dtype ~= "float32" and p.dtype ~= "float64" then
      self:_error(("params[%d] has dtype %s; only float32 and float64 parameters can be " ..
                   "optimized"):format(i, p.dtype))
    end
    list[i] = p
  end
  return list
end

-- validates the hyperparameters of a group: the class's check gets a fail
-- function that raises "needle.optim.<Name>: <msg>"
function Optimizer:_check_group(group, fail)
  fail = fail or function(msg) self:_error(msg) end
  local untyped = self._untyped or {}
  for k, v in pairs(self._class_defaults) do
    local got = group[k]
    if not untyped[k] then
      if type(v) == "number" and type(got) ~= "number" then
        fail(("%s must be a number, got %s"):format(k, type(got)))
      elseif type(v) == "number" and not (got > -math.huge and got < math.huge) then
        -- (NaN passes every `x < 0` check below: one NaN setting makes every weight NaN)
        fail(("%s must be a finite number, got %s"):format(k, fmt(got)))
      elseif type(v) == "boolean" and type(got) ~= "boolean" then
        fail(("%s must be a boolean, got %s"):format(k, type(got)))
      end
    end
  end
  if group.lr < 0 then fail(("invalid learning rate %s (expected lr >= 0)"):format(fmt(group.lr))) end
  if group.weight_decay ~= nil and group.weight_decay < 0 then
    fail(("invalid weight_decay %s (expected >= 0)"):format(fmt(group.weight_decay)))
  end
  if group.eps ~= nil and group.eps < 0 then
    fail(("invalid eps %s (expected >= 0)"):format(fmt(group.eps)))
  end
  if self._check then self._check(group, fail) end
end

-- the class: Optimizer:extend{name=, defaults=, state_keys=, check=, update=, init_state=,
-- dynamic=, capturable=} (dynamic: the group keys a compiled step refreshes itself, above;
-- capturable: the update can run inside nd.compile)
function Optimizer:extend(spec)
  local class = setmetatable({}, {
    __index = self,
    __call = function(cls, params, opts, ...)
      options.no_extra("optim." .. spec.name, spec.name .. "(params[, opts])", 2, ...)
      return cls.new(cls, params, opts)
    end,
    __tostring = function() return "needle.optim." .. spec.name end,
  })
  class.__index = class
  class.__tostring = self.__tostring
  class.name = spec.name
  class.defaults = spec.defaults
  class._class_defaults = spec.defaults -- instances shadow `defaults` with their own
  class.state_keys = spec.state_keys or {}
  class._check = spec.check
  class._update = spec.update
  class._init_state = spec.init_state
  class._untyped = spec.untyped
  class.dynamic = spec.dynamic
  class.capturable = spec.capturable
  return class
end

function Optimizer.new(class, params, opts)
  if rawequal(class, Optimizer) then
    error("needle.optim.Optimizer: the base class cannot be instantiated; use SGD, Adam, ...", 3)
  end
  local self = setmetatable({param_groups = {}, state = {}}, class)
  opts = options.check("optim." .. class.name, opts, any_of(class.defaults))
  local defaults = {}
  for k, v in pairs(class.defaults) do defaults[k] = copy_value(v) end
  for k, v in pairs(opts) do defaults[k] = copy_value(v) end
  self.defaults = defaults
  self:_check_group(defaults)

  -- a list of groups, or one group's worth of parameters
  local groups
  if type(params) == "table" and not is_module(params) and type(params[1]) == "table"
     and not is_module(params[1]) then
    groups = params
  else
    groups = {{params = params}}
  end
  for _, g in ipairs(groups) do self:_add_param_group(g) end
  return self
end

function Optimizer:_add_param_group(g)
  if type(g) ~= "table" or is_tensor(g) then
    self:_error(("a parameter group must be a table {params = ..., <options>}, got %s"):format(
      is_tensor(g) and "a tensor mixed with groups" or type(g)))
  end
  if g.params == nil then
    self:_error("a parameter group has no 'params' entry")
  end
  local group = {params = param_list(self, g.params)}
  if #group.params == 0 then
    self:_error("optimizer got an empty parameter list")
  end
  options.check("optim." .. self.name, g, any_of(self.defaults, EXTRA_GROUP_KEYS, {params = true}),
                "in a parameter group")
  for k, v in pairs(g) do
    if k ~= "params" then group[k] = copy_value(v) end
  end
  for k, v in pairs(self.defaults) do
    if group[k] == nil then group[k] = copy_value(v) end
  end
  self:_check_group(group)
  -- a parameter may appear once in all groups
  local seen = {}
  for _, old in ipairs(self.param_groups) do
    for _, p in ipairs(old.params) do seen[p] = true end
  end
  for i, p in ipairs(group.params) do
    if seen[p] then
      self:_error(("params[%d] appears more than once in the parameter groups"):format(i))
    end
    seen[p] = true
  end
  self.param_groups[#self.param_groups + 1] = group
  if self._init_state then
    for _, p in ipairs(group.params) do
      if self.state[p] == nil then self.state[p] = self._init_state(p, group) end
    end
  end
end

-- opt:add_param_group({params = {...}, lr = ...})
-- The loop NAdam, RAdam, Adamax and Adadelta share: for each parameter of
-- group that has a gradient, its state (fresh(p) on the first step, or after
-- a load_state_dict that had none), the step count advanced, and the
-- gradient negated with maximize and with L2 weight_decay added (with
-- group.decoupled_weight_decay, p decays by lr * weight_decay instead, as
-- AdamW); then fn(p, g, st, step).
function Optimizer:each_param(group, fresh, fn)
  local state = self.state
  local lr, wd = group.lr, group.weight_decay
  for _, p in ipairs(group.params) do
    local g = p.grad
    if g ~= nil then
      local st = state[p]
      if st == nil or st.step == nil then
        st = fresh(p)
        st.step = 0
        state[p] = st
      end
      local step = st.step + 1
      st.step = step
      if group.maximize then g = -g end
      if wd ~= 0 then
        if group.decoupled_weight_decay then p:mul_(1 - lr * wd) else g = g + p * wd end
      end
      fn(p, g, st, step)
    end
  end
end

function Optimizer:add_param_group(g)
  self:_add_param_group(g)
end

-- opt:zero_grad(): every parameter's grad becomes nil (PyTorch's set_to_none).
-- opt:zero_grad({set_to_none = false}) gives each a fresh tensor of zeros instead
-- (a grad tensor someone holds is never written).
function Optimizer:zero_grad(opts, ...)
  if select("#", ...) > 0 or (opts ~= nil and type(opts) ~= "table") then
    errors.fail_at(2, "optim." .. self.name .. ".zero_grad", "takes zero_grad([{set_to_none = true}]) only, got %s",
                   options.got(opts))
  end
  if opts ~= nil then opts = options.check("optim." .. self.name .. ".zero_grad", opts, {set_to_none = "boolean"}) end
  local to_none = not (opts and opts.set_to_none == false)
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do
      if to_none then
        p.grad = nil
      elseif p.grad ~= nil then
        p.grad = core.zeros_like(p)
      end
    end
  end
end

local function step_groups(self)
  local update = self._update
  for _, group in ipairs(self.param_groups) do update(self, group) end
end

-- opt:step([closure]): one update of every parameter that has a grad.
-- closure (optional) re-evaluates the model with grad mode on and returns the
-- loss, which step returns.
-- Under nd.compile, the hyperparameters that the recorded kernels hold as
-- constants become a guard: changing one (a scheduler's new lr) traces the
-- function again. An optimizer class lists in `dynamic` the ones its update
-- reads from tensors that a replay hook refreshes instead (Adam's lr).
local function hyper_key(self)
  local dynamic, parts = self.dynamic or {}, {}
  for gi, group in ipairs(self.param_groups) do
    local keys = {}
    for k in pairs(group) do
      if k ~= "params" and not dynamic[k] then keys[#keys + 1] = k end
    end
    table.sort(keys)
    parts[#parts + 1] = ("[%d]#%d"):format(gi, #group.params)
    for _, k in ipairs(keys) do
      local v = group[k]
      if type(v) == "table" then
        local items = {}
        for i, x in ipairs(v) do items[i] = type(x) == "number" and ("%.17g"):format(x) or tostring(x) end
        v = table.concat(items, ",")
      elseif type(v) == "number" then
        v = ("%.17g"):format(v)
      end
      parts[#parts + 1] = ("%s=%s"):format(k, tostring(v))
    end
  end
  return table.concat(parts, " ")
end

-- Under nd.compile an optimizer must find its per-parameter state made: a
-- replay would make it anew (zeros) on every call. (Optimizer._fresh_state)
function Optimizer:_refuse_fresh_state()
  if capture.active then
    errors.fail("optim." .. self.name, "its state (momentum, moments) would be made inside "
                .. "nd.compile, and every replay would start it over: call the step once before "
                .. "it is captured (nd.compile's warmup >= 1, the default)")
  end
end

-- The identity of the optimizer's state, which the recorded kernels update:
-- the state table, each group and its parameters, each parameter's state
-- table and the memory of its tensors (load_state_dict, a reset momentum
-- buffer or a swapped parameter are other graphs).
local function state_key(self)
  local id = function(v) return ("%p"):format(v) end -- never __tostring (a tensor would print)
  local parts = {id(self.state)}
  for _, group in ipairs(self.param_groups) do
    parts[#parts + 1] = id(group)
    for _, p in ipairs(group.params) do
      local st = self.state[p]
      parts[#parts + 1] = id(p)
      if st then
        parts[#parts + 1] = id(st)
        for _, k in ipairs({"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) do
          if st[k] then parts[#parts + 1] = tostring(core._storage_key(st[k])) end
        end
      end
    end
  end
  return table.concat(parts, " ")
end

function Optimizer:step(closure)
  local loss
  if closure ~= nil then loss = core.enable_grad(closure) end
  if capture.active then
    if not self.capturable then
      errors.fail("optim." .. self.name, "cannot step inside nd.compile yet (its per-step values "
                  .. "live in Lua); SGD, Adam and AdamW can")
    end
    capture.guard(function() return hyper_key(self) end)
    capture.guard(function() return state_key(self) end)
  end
  core.no_grad(step_groups, self)
  return loss
end

-- state ----------------------------------------------------------------------

-- a state value for state_dict: tensors cloned, also inside lists (LBFGS's history)
local function snapshot(v)
  if is_tensor(v) then return v:clone() end
  if type(v) == "table" then
    local c = {}
    for k, x in pairs(v) do c[k] = snapshot(x) end
    return c
  end
  return v
end

-- opt:state_dict(): a plain table
--   {state = {[i] = {step = n, exp_avg = <tensor>, ...}},
--    param_groups = {{lr = ..., betas = {...}, params = {1, 2}}, ...}}
-- with parameters numbered 1.. over all groups in order. The tensors are
-- copies: the snapshot does not change with later steps.
function Optimizer:state_dict()
  local index, n, groups = {}, 0, {}
  for gi, group in ipairs(self.param_groups) do
    local packed = {}
    for k, v in pairs(group) do
      if k ~= "params" then packed[k] = copy_value(v) end
    end
    local ids = {}
    for j, p in ipairs(group.params) do
      if not index[p] then n = n + 1; index[p] = n end
      ids[j] = index[p]
    end
    packed.params = ids
    groups[gi] = packed
  end
  local state = {}
  core.no_grad(function()
    for p, st in pairs(self.state) do
      local i = index[p]
      if i then
        local s = {}
        for k, v in pairs(st) do -- "_" keys are private (a compiled step's scalars)
          if k:sub(1, 1) ~= "_" then s[k] = snapshot(v) end
        end
        state[i] = s
      end
    end
  end)
  return {state = state, param_groups = groups}
end

local function to_index(k)
  if math.type(k) == "integer" then return k end
  if type(k) == "number" and k == math.floor(k) then return math.tointeger(k) end
  if type(k) == "string" then return math.tointeger(tonumber(k)) end
  return nil
end

-- What a state entry may be (the values of state_keys), for load_state_dict:
-- check(v, ctx) says what is wrong with a saved value (nil: nothing), load(v,
-- ctx) makes the optimizer's own copy of it (nil drops it). ctx: the parameter
-- p, its position pos, and n, the elements of all parameters together (the
-- length of LBFGS's flat vectors).
local function as_number(v)
  if is_tensor(v) then v = v:item() end
  return math.tointeger(v) or v
end

local function check_number(v)
  if is_tensor(v) then
    if v:numel() ~= 1 then return "must be a number, got a tensor of shape " .. shape_str(v) end
  elseif type(v) ~= "number" then
    return "must be a number, got " .. type(v)
  end
end

local function check_flat(v, ctx)
  if not is_tensor(v) then return "must be a tensor, got " .. type(v) end
  if v:dim() ~= 1 or v:numel() ~= ctx.n then
    return ("has shape %s, but the parameters have %d elements in all (expected {%d})"):format(
      shape_str(v), ctx.n, ctx.n)
  end
end

local function load_flat(v, ctx)
  local c = core.zeros({ctx.n}, {dtype = ctx.p.dtype, device = ctx.p.device})
  c:copy_(v)
  return c
end

local function list_of(kind)
  return {
    check = function(v, ctx)
      if type(v) ~= "table" or is_tensor(v) then return "must be a list, got " .. type(v) end
      for i, x in ipairs(v) do
        local err = kind.check(x, ctx)
        if err then return ("[%d] %s"):format(i, err) end
      end
    end,
    load = function(v, ctx)
      local out = {}
      for i, x in ipairs(v) do out[i] = kind.load(x, ctx) end
      return out
    end,
  }
end

local STATE_KINDS = {
  tensor = {
    check = function(v, ctx)
      if not is_tensor(v) then return "must be a tensor, got " .. type(v) end
      if shape_str(v) ~= shape_str(ctx.p) then
        return ("has shape %s, but parameter %d has shape %s"):format(shape_str(v), ctx.pos,
                                                                       shape_str(ctx.p))
      end
    end,
    load = function(v, ctx)
      local c = core.zeros_like(ctx.p)
      c:copy_(v)
      return c
    end,
  },
  number = {check = check_number, load = as_number},
  flat = {check = check_flat, load = load_flat},         -- one value per element of all parameters
  ignored = {check = function() end, load = function() end}, -- accepted, not kept (scratch space)
}
STATE_KINDS.number_list = list_of(STATE_KINDS.number)
STATE_KINDS.flat_list = list_of(STATE_KINDS.flat)

-- opt:load_state_dict(sd): restores the state and the groups' hyperparameters
-- from a state_dict(). Saved parameter ids map by position to the groups'
-- parameters (so PyTorch's 0-based ids work too). Everything is checked
-- before anything changes: group and parameter counts, state keys, tensor
-- shapes, hyperparameter values; the error names the mismatch.
function Optimizer:load_state_dict(sd)
  local function fail(msg) errors.fail("optim." .. self.name, "load_state_dict: %s", msg) end
  if type(sd) ~= "table" then fail(("expected a table, got %s"):format(type(sd))) end
  local saved_groups, saved_state = sd.param_groups, sd.state
  if type(saved_groups) ~= "table" then fail("the state dict has no param_groups table") end
  if saved_state ~= nil and type(saved_state) ~= "table" then
    fail(("state must be a table, got %s"):format(type(saved_state)))
  end
  saved_state = saved_state or {}
  local groups = self.param_groups
  if #saved_groups ~= #groups then
    fail(("the state dict has %d parameter group(s), the optimizer %d"):format(#saved_groups, #groups))
  end
  -- saved id -> parameter, by position
  local id_map, id_pos, pos = {}, {}, 0
  local new_groups = {}
  for gi, sg in ipairs(saved_groups) do
    if type(sg) ~= "table" or type(sg.params) ~= "table" then
      fail(("param_groups[%d] has no params list"):format(gi))
    end
    local cur = groups[gi].params
    if #sg.params ~= #cur then
      fail(("param_groups[%d] has %d parameter(s), the optimizer's group %d has %d"):format(
        gi, #sg.params, gi, #cur))
    end
    for j, id in ipairs(sg.params) do
      pos = pos + 1
      local key = to_index(id)
      if key == nil then fail(("param_groups[%d].params[%d] is not an integer id"):format(gi, j)) end
      id_map[key], id_pos[key] = cur[j], pos
    end
    local ng = {params = cur}
    for k, v in pairs(sg) do
      if k ~= "params" then ng[k] = copy_value(v) end
    end
    for k, v in pairs(self.defaults) do
      if ng[k] == nil then ng[k] = copy_value(v) end
    end
    self:_check_group(ng, function(msg) fail(("param_groups[%d]: %s"):format(gi, msg)) end)
    new_groups[gi] = ng
  end
  -- state entries: validate everything first
  local keys = self.state_keys
  local entries = {}
  local n_all = 0
  for _, g in ipairs(groups) do
    for _, p in ipairs(g.params) do n_all = n_all + p:numel() end
  end
  for k, st in pairs(saved_state) do
    local id = to_index(k)
    local p = id and id_map[id]
    if p == nil then
      fail(("state has an entry for parameter %s, which no parameter group lists"):format(tostring(k)))
    end
    if type(st) ~= "table" then
      fail(("state[%s] must be a table, got %s"):format(tostring(k), type(st)))
    end
    local ctx = {p = p, pos = id_pos[id], n = n_all}
    for name, v in pairs(st) do
      local kind = STATE_KINDS[keys[name]]
      if kind == nil then
        local known = sorted_keys(keys)
        fail(("state[%s] has an unexpected entry '%s' (a %s state holds %s)"):format(tostring(k),
          tostring(name), self.name, #known > 0 and table.concat(known, ", ") or "nothing"))
      end
      local err = kind.check(v, ctx)
      if err then -- a list's "[i] ..." follows the name directly
        fail(("state[%s].%s%s%s"):format(tostring(k), name, err:sub(1, 1) == "[" and "" or " ", err))
      end
    end
    entries[#entries + 1] = {p, st, ctx}
  end
  -- commit
  local new_state = {}
  core.no_grad(function()
    for _, e in ipairs(entries) do
      local p, st, ctx = e[1], e[2], e[3]
      local s = {}
      for name, v in pairs(st) do s[name] = STATE_KINDS[keys[name]].load(v, ctx) end
      new_state[p] = s
    end
  end)
  -- parameters without saved state get the state made at construction (Adagrad)
  if self._init_state then
    for _, g in ipairs(new_groups) do
      for _, p in ipairs(g.params) do
        if new_state[p] == nil then new_state[p] = self._init_state(p, g) end
      end
    end
  end
  self.state = new_state
  for gi, ng in ipairs(new_groups) do groups[gi] = ng end
end

function Optimizer:__tostring()
  local lines = {self.name .. " ("}
  for i, group in ipairs(self.param_groups) do
    lines[#lines + 1] = ("Parameter Group %d"):format(i)
    for _, k in ipairs(sorted_keys(group)) do
      if k ~= "params" then lines[#lines + 1] = ("    %s: %s"):format(k, fmt(group[k])) end
    end
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

return Optimizer
