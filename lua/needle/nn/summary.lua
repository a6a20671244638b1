-- needle.nn.summary: Module:summary([input][, opts]), a table of the layers
-- as torchinfo's summary prints it: each module that ran (in call order,
-- indented by depth) with its class, output shape and the number of its own
-- parameters, then the totals (trainable and non-trainable). The model runs
-- once, in eval mode and under no_grad (its modes and the global RNG state
-- are restored afterwards), on the example input, or on zeros of the given
-- shape (on the device and in the dtype of the model's parameters),
-- with forward hooks noting what each module returned; without an input the
-- table lists the module tree without output shapes.
local errors = require "needle.errors"
local core = require "needle.core"
local options = require "needle.options"
local capture = require "needle.compile.state"

local M = {}

local is_tensor = core.is_tensor
local WHO = "nn.Module.summary"

local function shape_text(v)
  if is_tensor(v) then return errors.shape_str(v) end
  if type(v) == "table" then -- several results (an LSTM's out, {h, c}): each one
    local parts = {}
    for i = 1, v.n or #v do parts[#parts + 1] = shape_text(v[i]) end
    return "(" .. table.concat(parts, ", ") .. ")"
  end
  return "--"
end

local FLOAT = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

-- the device and dtype of the model's first floating-point parameter or
-- buffer (nil, nil for a model without one)
local function model_placement(model)
  for _, p in ipairs(model:parameters()) do
    if FLOAT[p.dtype] then return p.device, p.dtype end
  end
  for _, b in ipairs(model:named_buffers()) do
    if FLOAT[b[2].dtype] then return b[2].device, b[2].dtype end
  end
end

-- the model's arguments: tensors as they are, shapes (lists of integers) as
-- zeros of opts.dtype on opts.device (by default the model's: see
-- model_placement, else float32 on the CPU); one argument or a list of them
local function make_inputs(model, input, o)
  local device, dtype = model_placement(model)
  device, dtype = o.device or device, o.dtype or dtype or "float32"
  local function one(v, i)
    if is_tensor(v) then return v end
    if type(v) == "table" and #v > 0 then
      for k, d in ipairs(v) do
        if math.type(d) ~= "integer" or d < 0 then
          errors.fail(WHO, "input %d: a shape is a list of sizes >= 0, but entry %d is %s", i, k, options.got(d))
        end
      end
      return core.zeros(v, {dtype = dtype, device = device})
    end
    errors.fail(WHO, "input %d: expected a tensor or a shape (a list of sizes), got %s", i, options.got(v))
  end
  if is_tensor(input) or (type(input) == "table" and math.type(input[1]) == "integer") then
    return {one(input, 1), n = 1}
  end
  if type(input) ~= "table" or #input == 0 then
    errors.fail(WHO, "expected an example input (a tensor), a shape or a list of them, got %s", options.got(input))
  end
  local args = {n = #input}
  for i, v in ipairs(input) do args[i] = one(v, i) end
  return args
end

local function own_params(m)
  local n, seen = 0, {}
  for _, e in ipairs(rawget(m, "_order")) do
    local p = e[1] == "param" and rawget(m, "_params")[e[2]]
    if p and not seen[p] then
      seen[p] = true
      n = n + p:numel()
    end
  end
  return n
end

local function with_commas(n)
  local s = tostring(n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

-- rows: {depth, name, class, output text, own parameter count}
local function run_rows(model, args)
  local rows, depth, handles, by_module = {}, 0, {}, {}
  for _, e in ipairs(model:named_modules()) do
    local name, m = e[1], e[2]
    if not by_module[m] then
      by_module[m] = name
      handles[#handles + 1] = m:register_forward_pre_hook(function(mod)
        depth = depth + 1
        rows[#rows + 1] = {depth = depth, name = by_module[mod], class = mod.__name, out = "--",
                           params = own_params(mod)}
      end)
      handles[#handles + 1] = m:register_forward_hook(function(mod, _, out)
        -- the innermost open row of this module
        for i = #rows, 1, -1 do
          local r = rows[i]
          if r.name == by_module[mod] and not r.done then
            r.out, r.done = shape_text(out), true
            break
          end
        end
        depth = depth - 1
      end)
    end
  end
  -- eval mode (no running-stat updates, no dropout), no_grad, and the global
  -- RNG and every module's training flag as they were afterwards, also on error
  local modes = {}
  for _, m in ipairs(model:modules()) do modes[m] = rawget(m, "training") end
  local rng = core.get_rng_state()
  local ok, err = pcall(function()
    model:eval()
    return core.no_grad(function() return model(table.unpack(args, 1, args.n)) end)
  end)
  for _, h in ipairs(handles) do h:remove() end
  for m, mode in pairs(modes) do rawset(m, "training", mode) end
  capture.bump()
  core.set_rng_state(rng)
  if not ok then
    errors.fail(WHO, "the model failed on the example input: %s", (tostring(err):gsub("^[^\n]-:%d+: ", "")))
  end
  return rows
end

local function tree_rows(model)
  local rows = {}
  for _, e in ipairs(model:named_modules()) do
    local name = e[1]
    local depth = name == "" and 1 or select(2, name:gsub("%.", "")) + 2
    rows[#rows + 1] = {depth = depth, name = name, class = e[2].__name, out = "--", params = own_params(e[2])}
  end
  return rows
end

-- summary(model[, input][, {depth = 3, dtype = "float32", device = nil, verbose = 1}]) -> text
function M.summary(model, input, opts)
  if type(input) == "table" and opts == nil and not is_tensor(input) and getmetatable(input) == nil
     and next(input) ~= nil and #input == 0 then
    input, opts = nil, input -- summary(opts)
  end
  local o = options.check(WHO, opts, {depth = "integer", dtype = "string", device = "string", verbose = "integer"})
  local max_depth = o.depth or 3
  if max_depth < 1 then errors.fail(WHO, "depth must be >= 1, got %d", max_depth) end
  local rows
  if input ~= nil then rows = run_rows(model, make_inputs(model, input, o)) else rows = tree_rows(model) end
  local lines, width = {}, 40
  local function label(r)
    local text = r.name == "" and r.class or ("%s (%s)"):format(r.name:match("[^.]+$"), r.class)
    return ("  "):rep(r.depth - 1) .. text
  end
  for _, r in ipairs(rows) do
    if r.depth <= max_depth then width = math.max(width, #label(r) + 2) end
  end
  local rule = ("-"):rep(width + 40)
  local fmt = "%-" .. width .. "s%-26s%14s"
  lines[#lines + 1] = rule
  lines[#lines + 1] = fmt:format("Layer (type)", "Output shape", "Param #")
  lines[#lines + 1] = ("="):rep(width + 40)
  for _, r in ipairs(rows) do
    if r.depth <= max_depth then
      lines[#lines + 1] = fmt:format(label(r), r.out, r.params > 0 and with_commas(r.params) or "--")
    end
  end
  local total, trainable, bytes = 0, 0, 0
  for _, p in ipairs(model:parameters()) do
    total = total + p:numel()
    bytes = bytes + p:numel() * p:element_size()
    if p.requires_grad then trainable = trainable + p:numel() end
  end
  lines[#lines + 1] = ("="):rep(width + 40)
  lines[#lines + 1] = "Total params: " .. with_commas(total)
  lines[#lines + 1] = "Trainable params: " .. with_commas(trainable)
  lines[#lines + 1] = "Non-trainable params: " .. with_commas(total - trainable)
  lines[#lines + 1] = ("Params size (MB): %.2f"):format(bytes / 1e6)
  lines[#lines + 1] = rule
  local text = table.concat(lines, "\n")
  if (o.verbose or 1) > 0 then print(text) end
  return text
end

return M
