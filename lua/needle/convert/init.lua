-- needle.convert: PyTorch state dicts into needle models.
--
--   local convert = require "needle.convert"      -- also nd.convert
--   local sd = convert.unwrap(nd.load_torch("model.pt"))
--   local model = convert.model("resnet18_cifar", sd)       -- build from the registry and load
--   convert.load_state_dict(my_model, sd, {mapping = "lstm_lm"})  -- or into a model you built
--
-- load_state_dict(model, sd, {mapping=, strict=true, convert_dtype=true}):
--   applies the mapping (a name from convert.mappings or a function(sd) -> sd),
--   then checks every key before anything is copied: missing, unexpected,
--   shape-mismatched and dtype-incompatible keys are reported together in one
--   error ("needle.convert: cannot load ... into <Model>: ..."), and a failed
--   load leaves the model unchanged. Floating-point tensors are converted to
--   each target's dtype (float64/float16/bfloat16 -> float32, ...) and integer
--   ones to the target's integer dtype; float into integer or the other way is
--   an error (convert_dtype = false makes any dtype difference one). A missing
--   "*.num_batches_tracked" is not an error (checkpoints from PyTorch < 0.4.1
--   lack it; PyTorch fills it with 0 as well). With strict = false, missing and
--   unexpected keys are allowed (shapes and dtypes are still checked). Returns
--   the model and a report {missing=, unexpected=, converted = {key = "float64"},
--   tied = {key = name}}. A key naming a tied tensor under its second name
--   (GPT-2's lm_head.weight, BertForMaskedLM's cls.predictions.decoder.*, as
--   PyTorch's state_dict lists them) is no unexpected key: it must have the
--   tensor's shape and the values of the state dict's entry under the first
--   name (it is that entry where the first name is absent); report.tied lists it.
-- unwrap(obj): the state dict inside what torch.save wrote: {"state_dict": sd},
--   {"model": sd} (also "model_state_dict", "net", "module"), one level or more,
--   with DataParallel's "module." prefix removed; entries that are not tensors
--   are dropped. Returns sd, {wrapper = "model" | nil, prefix = "module." | nil,
--   dropped = {names}}.
-- model(name, sd, opts): build the registry model `name` (convert.models) for the
--   state dict (sizes inferred from it, opts for what cannot be), load it and
--   put it in eval mode. opts.mapping overrides the registry's mapping; opts.strict.
-- summary(sd): {tensors=, elements=, bytes=, dtypes = {float32 = n, ...}}
local errors = require "needle.errors"
local core = require "needle.core"
local options = require "needle.options"

local M = {}

-- the options of load_state_dict (model() takes them too, with the entry's own)
local LOAD_OPTS = {strict = "boolean", convert_dtype = "boolean", mapping = "string|function|boolean"}

local fail = errors.failer("convert", 0)

require("needle.lazy")(M, {mappings = "needle.convert.mappings", models = "needle.convert.models"})

local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}
local INT = {int64 = true, int32 = true, int16 = true, int8 = true, uint8 = true}
local SIZE = {float32 = 4, float64 = 8, float16 = 2, bfloat16 = 2, int64 = 8, int32 = 4, int16 = 2,
              int8 = 1, uint8 = 1, bool = 1}

local function kind(dtype)
  if FLOAT[dtype] then return "float" end
  if INT[dtype] then return "int" end
  return dtype
end

local shape_str = errors.shape_str

-- an error message without the "file:line: " a plain error() adds and
-- without our own prefix (it is added again)
local function clean(msg)
  msg = tostring(msg)
  if not msg:find("^needle%.") then msg = msg:gsub("^[^\n]-:%d+: ", "", 1) end
  return (msg:gsub("^needle%.convert: ", ""))
end

-- at most `max` names, then how many more
local LIST_MAX = 20
local function list_str(list)
  if #list <= LIST_MAX then return table.concat(list, ", ") end
  return table.concat(list, ", ", 1, LIST_MAX) .. (", ... (%d more)"):format(#list - LIST_MAX)
end

local function model_name(model)
  return (type(model) == "table" and model.__name) or "model"
end

-- named targets: parameters first, then buffers (tied weights once)
local function targets_of(model)
  local targets, order = {}, {}
  for _, p in ipairs(model:named_parameters()) do
    if targets[p[1]] == nil then targets[p[1]] = p[2]; order[#order + 1] = p[1] end
  end
  for _, b in ipairs(model:named_buffers()) do
    if targets[b[1]] == nil then targets[b[1]] = b[2]; order[#order + 1] = b[1] end
  end
  return targets, order
end

-- tied keys: the keys of sd that name a target under a second name (GPT-2's
-- lm_head.weight is transformer.wte.weight, BertForMaskedLM's
-- cls.predictions.decoder.* are the word embeddings and cls.predictions.bias;
-- PyTorch's state_dict lists such a tensor under every name). {alias = name}
local function tied_keys(model, sd, targets)
  local by_tensor, modules, tied = nil, nil, {}
  for key in pairs(sd) do
    if type(key) == "string" and targets[key] == nil then
      if modules == nil then
        by_tensor, modules = {}, {}
        for name, t in pairs(targets) do by_tensor[t] = name end
        for _, m in ipairs(model:named_modules()) do modules[m[1]] = m[2] end
      end
      local path, leaf = key:match("^(.*)%.([^.]+)$")
      if path == nil then path, leaf = "", key end
      local m = modules[path]
      if type(m) == "table" then
        local params, buffers = rawget(m, "_params"), rawget(m, "_buffers")
        local t = (type(params) == "table" and params[leaf]) or (type(buffers) == "table" and buffers[leaf]) or nil
        if t ~= nil and by_tensor[t] ~= nil then tied[key] = by_tensor[t] end
      end
    end
  end
  return tied
end

-- two tensors of one shape hold the same values (a's converted to b's dtype)
local function same_values(a, b)
  return a == b or (shape_str(a) == shape_str(b) and core.no_grad(function()
    return a:detach():to({dtype = b.dtype, device = b.device}):eq(b):all():item()
  end))
end

function M.load_state_dict(model, sd, opts)
  opts = options.check("convert.load_state_dict", opts, LOAD_OPTS)
  if type(model) ~= "table" or type(model.named_parameters) ~= "function" then
    fail("load_state_dict: expected a needle.nn module, got %s", type(model))
  end
  if type(sd) ~= "table" or core.is_tensor(sd) then
    fail("load_state_dict: expected a state dict (a table of named tensors), got %s",
         core.is_tensor(sd) and "a tensor" or type(sd))
  end
  local strict = opts.strict ~= false
  local convert_dtype = opts.convert_dtype ~= false
  local mapping = M.mappings.get(opts.mapping)
  if mapping then
    local ok, r = pcall(mapping, sd)
    if not ok then
      fail("mapping %s failed: %s", type(opts.mapping) == "string" and ("'" .. opts.mapping .. "'") or "function", clean(r))
    end
    if type(r) ~= "table" then fail("mapping returned a %s, not a state dict", type(r)) end
    sd = r
  end

  local targets, order = targets_of(model)
  local missing, unexpected, mismatched, badtype, ignored = {}, {}, {}, {}, {}
  -- a tied key is checked against the tensor it shares: the same shape, and
  -- the same values as the state dict's entry for that tensor (or it is that
  -- entry, where the state dict has the tensor under the second name only)
  local tied, differ = tied_keys(model, sd, targets), {}
  if next(tied) ~= nil then
    local copy = {}
    for k, v in pairs(sd) do copy[k] = v end
    for alias, name in pairs(tied) do
      local src, t, other = sd[alias], targets[name], sd[name]
      if not core.is_tensor(src) then
        mismatched[#mismatched + 1] = ("%s (not a tensor: %s)"):format(alias, type(src))
      elseif shape_str(src) ~= shape_str(t) then
        mismatched[#mismatched + 1] = ("%s (checkpoint %s, model %s)"):format(alias, shape_str(src), shape_str(t))
      elseif other == nil then
        copy[name] = src
      elseif core.is_tensor(other) and shape_str(other) == shape_str(t) and not same_values(src, other) then
        differ[#differ + 1] = ("%s differs from %s (tied: one tensor in the model)"):format(alias, name)
      end
      copy[alias] = nil
    end
    sd = copy
  end
  local sources, converted = {}, {}
  for _, name in ipairs(order) do
    local t, src = targets[name], sd[name]
    if src == nil then
      if name:match("num_batches_tracked$") then ignored[#ignored + 1] = name
      else missing[#missing + 1] = name end
    elseif not core.is_tensor(src) then
      mismatched[#mismatched + 1] = ("%s (not a tensor: %s)"):format(name, type(src))
    elseif shape_str(src) ~= shape_str(t) then
      mismatched[#mismatched + 1] = ("%s (checkpoint %s, model %s)"):format(name, shape_str(src), shape_str(t))
    elseif src.dtype ~= t.dtype and (not convert_dtype or kind(src.dtype) ~= kind(t.dtype)) then
      badtype[#badtype + 1] = ("%s (checkpoint %s, model %s)"):format(name, src.dtype, t.dtype)
    else
      sources[name] = src
      if src.dtype ~= t.dtype then converted[name] = src.dtype end
    end
  end
  for name in pairs(sd) do
    if targets[name] == nil then unexpected[#unexpected + 1] = tostring(name) end
  end
  table.sort(missing); table.sort(unexpected); table.sort(mismatched); table.sort(badtype)

  local problems = {}
  if #mismatched > 0 then problems[#problems + 1] = "shape mismatch: " .. list_str(mismatched) end
  if #badtype > 0 then problems[#problems + 1] = "dtype mismatch: " .. list_str(badtype) end
  table.sort(differ)
  if #differ > 0 then problems[#problems + 1] = "tied keys differ: " .. list_str(differ) end
  if strict and #missing > 0 then problems[#problems + 1] = "missing keys: " .. list_str(missing) end
  if strict and #unexpected > 0 then
    local hint = ""
    local n_module = 0
    for _, k in ipairs(unexpected) do if k:sub(1, 7) == "module." then n_module = n_module + 1 end end
    if n_module > 0 then hint = " (keys start with 'module.': convert.unwrap removes DataParallel's prefix)" end
    problems[#problems + 1] = "unexpected keys: " .. list_str(unexpected) .. hint
  end
  if #problems > 0 then
    fail("cannot load the state dict into %s: %s", model_name(model), table.concat(problems, "; "))
  end

  -- convert everything first (on the target's device), then copy: an error in
  -- a conversion leaves the model as it was
  local ready = {}
  for _, name in ipairs(order) do
    local src, t = sources[name], targets[name]
    if src ~= nil then
      if src.dtype ~= t.dtype or src.device ~= t.device then
        local ok, r = pcall(function() return src:detach():to({dtype = t.dtype, device = t.device}) end)
        if not ok then fail("cannot convert '%s' (%s) to %s: %s", name, src.dtype, t.dtype, tostring(r)) end
        src = r
      end
      ready[name] = src
    end
  end
  core.no_grad(function()
    for _, name in ipairs(order) do
      if ready[name] ~= nil then targets[name]:copy_(ready[name]) end
    end
  end)
  table.sort(ignored)
  return model, {missing = missing, unexpected = unexpected, converted = converted, ignored = ignored, tied = tied}
end

-- unwrap ----------------------------------------------------------------------

local WRAPPERS = {"state_dict", "model_state_dict", "model", "net", "module"}

local function tensor_count(t)
  local n = 0
  for _, v in pairs(t) do if core.is_tensor(v) then n = n + 1 end end
  return n
end

function M.unwrap(obj)
  if core.is_tensor(obj) or type(obj) ~= "table" then
    fail("expected a state dict (a table of named tensors), got %s", core.is_tensor(obj) and "a tensor" or type(obj))
  end
  local info = {dropped = {}}
  -- descend into the usual wrappers while the table holds no tensors itself
  for _ = 1, 4 do
    if tensor_count(obj) > 0 then break end
    local inner
    for _, w in ipairs(WRAPPERS) do
      if type(obj[w]) == "table" and not core.is_tensor(obj[w]) then inner = w; break end
    end
    if not inner then break end
    info.wrapper = info.wrapper and (info.wrapper .. "." .. inner) or inner
    obj = obj[inner]
  end
  local sd, all_module = {}, true
  for k, v in pairs(obj) do
    if core.is_tensor(v) and type(k) == "string" then
      sd[k] = v
      if k:sub(1, 7) ~= "module." then all_module = false end
    else
      info.dropped[#info.dropped + 1] = tostring(k)
    end
  end
  table.sort(info.dropped)
  if next(sd) == nil then
    fail("found no tensors in the checkpoint (top-level keys: %s)", #info.dropped > 0 and list_str(info.dropped) or "none")
  end
  if all_module then
    local out = {}
    for k, v in pairs(sd) do out[k:sub(8)] = v end
    sd, info.prefix = out, "module."
  end
  return sd, info
end

-- summary ---------------------------------------------------------------------

function M.summary(sd)
  local s = {tensors = 0, elements = 0, bytes = 0, dtypes = {}}
  local seen = {}
  for _, v in pairs(sd) do
    if core.is_tensor(v) and not seen[v] then
      seen[v] = true
      s.tensors = s.tensors + 1
      s.elements = s.elements + v:numel()
      s.bytes = s.bytes + v:numel() * (SIZE[v.dtype] or 0)
      s.dtypes[v.dtype] = (s.dtypes[v.dtype] or 0) + 1
    end
  end
  return s
end

-- the registry ----------------------------------------------------------------

function M.model(name, sd, opts)
  local entry = M.models.get(name)
  -- load_state_dict's options and those the entry declares (entry.options)
  local spec = {}
  for k, v in pairs(LOAD_OPTS) do spec[k] = v end
  for k, v in pairs(entry.options or {}) do spec[k] = v end
  opts = options.check(("convert.model('%s')"):format(name), opts, spec)
  local mapping = opts.mapping
  if mapping == nil then mapping = entry.mapping end
  local fn = M.mappings.get(mapping)
  local mapped = sd
  if fn then
    local ok, r = pcall(fn, sd)
    if not ok then
      fail("mapping %s failed: %s", type(mapping) == "string" and ("'" .. mapping .. "'") or "function",
           clean(r))
    end
    mapped = r
  end
  local ok, model = pcall(entry.build, mapped, opts)
  if not ok then
    local msg = clean(model)
    if msg:sub(1, #name + 2) == name .. ": " then msg = msg:sub(#name + 3) end
    fail("cannot build '%s' from this state dict: %s", name, msg)
  end
  local _, report = M.load_state_dict(model, mapped, {strict = opts.strict, convert_dtype = opts.convert_dtype})
  model:eval()
  return model, report
end

return M
