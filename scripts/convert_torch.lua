-- scripts/convert_torch.lua - a PyTorch checkpoint to a needle safetensors
-- file, through a model definition from the registry (needle.convert.models),
-- with no Python and no code from the file run.
--
--   build/needle-lua scripts/convert_torch.lua model.pt model.safetensors --model resnet18_cifar
--   build/needle-lua scripts/convert_torch.lua --list
--   build/needle-lua scripts/convert_torch.lua --help
--
-- The checkpoint is read with nd.load_torch (a safetensors file is accepted
-- too); the state dict is found inside the usual wrappers ({"state_dict": ...},
-- {"model": ...}, DataParallel's "module." prefix), mapped, loaded into the
-- registry model (every key, shape and dtype checked: the load fails as a
-- whole, naming every problem) and the model's state_dict() is written
-- atomically with metadata saying where it came from. Then a summary.
-- Exit status: 0 done, 1 the conversion failed, 2 a bad command line.
local nd = require "needle"
local cli = require "needle.cli"
local convert = require "needle.convert"

local PROG = "convert_torch"

local usage = [[
usage: needle-lua scripts/convert_torch.lua IN OUT --model NAME [options]
       needle-lua scripts/convert_torch.lua --list

Converts a PyTorch checkpoint IN (torch.save of a state_dict, or of a dict
holding one; a .safetensors file works as well) into the needle model NAME
and saves its state_dict to OUT (safetensors). Nothing in IN is executed.

options:
  --model NAME        the model definition (--list shows them)
  --mapping NAME      a key mapping instead of the model's own (--list shows them;
                      'none' for no mapping)
  --dtype NAME        dtype of the saved floating-point tensors: float32 (default),
                      float64, float16 or bfloat16
  --half-to-float     read float16/bfloat16 tensors as float32
  --strict BOOL       false allows missing and unexpected keys (default: true)
  --nhead N           attention heads, for the models that have them (the weights
                      do not say; transformer_classifier's default is 4)
  --list              the models and mappings, then exit
  -h, --help          this text
]]

local function die(code, fmt, ...)
  local msg = fmt:format(...):gsub("\n", " ")
  cli.die(PROG, code, "%s", msg)
end

-- command line -----------------------------------------------------------------

local VALUED = {model = true, mapping = true, dtype = true, strict = true, nhead = true}
local FLAGS = {list = true, ["half-to-float"] = true}

local opts, positional = {dtype = "float32", strict = "true"}, {}
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "-h" or a == "--help" then io.write(usage); os.exit(0) end
    local name = a:match("^%-%-([%w%-]+)$")
    if name and FLAGS[name] then
      opts[name] = true
      i = i + 1
    elseif name and VALUED[name] then
      if arg[i + 1] == nil then die(2, "option --%s needs a value", name) end
      opts[name] = arg[i + 1]
      i = i + 2
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      io.stderr:write(("%s: unknown option '%s'\n\n"):format(PROG, a), usage)
      os.exit(2)
    else
      positional[#positional + 1] = a
      i = i + 1
    end
  end
end

if opts.list then
  print("models (--model):")
  for _, n in ipairs(convert.models.names()) do
    local e = convert.models.get(n)
    print("  " .. n .. (e.mapping and ("  [mapping " .. e.mapping .. "]") or ""))
    print("      " .. (e.description or ""))
  end
  print("mappings (--mapping):")
  for _, n in ipairs(convert.mappings.names()) do
    print("  " .. n)
    print("      " .. (convert.mappings.descriptions[n] or ""))
  end
  os.exit(0)
end

if #positional ~= 2 then
  io.stderr:write(("%s: expected an input and an output file, got %d argument%s\n\n"):format(
    PROG, #positional, #positional == 1 and "" or "s"), usage)
  os.exit(2)
end
local input, output = positional[1], positional[2]
if not opts.model then die(2, "--model is required (one of: %s)", table.concat(convert.models.names(), ", ")) end
if not pcall(convert.models.get, opts.model) then
  die(2, "unknown model '%s' (known: %s; --list describes them)", opts.model, table.concat(convert.models.names(), ", "))
end
local mapping
if opts.mapping ~= nil then
  if opts.mapping == "none" then mapping = false
  elseif not convert.mappings.descriptions[opts.mapping] then
    die(2, "unknown mapping '%s' (known: none, %s)", opts.mapping, table.concat(convert.mappings.names(), ", "))
  else mapping = opts.mapping end
end
cli.choice(PROG, opts, "dtype", {"float32", "float64", "float16", "bfloat16"})
cli.choice(PROG, opts, "strict", {"true", "false"})
local nhead
if opts.nhead ~= nil then
  nhead = math.tointeger(tonumber(opts.nhead))
  if not nhead or nhead < 1 then die(2, "option --nhead expects a positive integer, got '%s'", opts.nhead) end
  -- (only the models with attention heads take it: the entries that declare the option)
  if not (convert.models.get(opts.model).options or {}).nhead then
    local with = {}
    for _, n in ipairs(convert.models.names()) do
      if (convert.models.get(n).options or {}).nhead then with[#with + 1] = n end
    end
    die(2, "option --nhead does not apply to the model '%s' (it has no attention heads; --nhead applies to: %s)",
        opts.model, table.concat(with, ", "))
  end
end
if input == output then die(2, "the output would overwrite the input '%s'", input) end

-- reading ----------------------------------------------------------------------

-- "safetensors" when the file starts as one (8-byte header length, then '{'),
-- else "torch" (nd.load_torch says what is wrong with anything else)
local function kind_of(path)
  local f, err = io.open(path, "rb")
  if not f then die(1, "cannot open '%s': %s", path, (tostring(err):gsub("^[^:]*: ", ""))) end
  local head = f:read(9) or ""
  f:close()
  if #head == 9 and head:sub(9, 9) == "{" then return "safetensors" end
  return "torch"
end

-- an error without the "file:line: " that error() may have put before "needle.<op>: "
local function strip(msg)
  msg = tostring(msg)
  local at = msg:find("needle%.[%w_.]+: ")
  if at and at > 1 and msg:sub(1, at - 1):match("^[^\n]-:%d+: $") then return msg:sub(at) end
  return msg
end

local obj
local kind = kind_of(input)
if kind == "safetensors" then
  local ok, r = pcall(nd.load, input)
  if not ok then die(1, "%s", strip(r)) end
  obj = r
else
  if type(nd.load_torch) ~= "function" then
    die(1, "cannot read '%s': this needle-lua has no nd.load_torch (PyTorch files); convert from safetensors", input)
  end
  local ok, r = pcall(nd.load_torch, input, {half_to_float = opts["half-to-float"] == true})
  if not ok then die(1, "%s", strip(r)) end
  obj = r
end

local ok, sd, info = pcall(convert.unwrap, obj)
if not ok then die(1, "'%s': %s", input, strip(sd)) end
if opts["half-to-float"] then
  for k, v in pairs(sd) do
    if v.dtype == "float16" or v.dtype == "bfloat16" then sd[k] = v:to("float32") end
  end
end
local source = convert.summary(sd)

-- converting -------------------------------------------------------------------

local model, report
ok, model, report = pcall(convert.model, opts.model, sd,
                          {mapping = mapping, strict = opts.strict ~= "false", nhead = nhead})
if not ok then die(1, "%s", strip(model)) end
if opts.dtype ~= "float32" then
  local ok2, err = pcall(model.to, model, {dtype = opts.dtype})
  if not ok2 then die(1, "%s", strip(err)) end
end

local state = model:state_dict()
local metadata = {
  source = input, model = opts.model, needle_version = tostring(nd.version),
  mapping = mapping == false and "none" or (mapping or convert.models.get(opts.model).mapping or "none"),
  converter = "scripts/convert_torch.lua",
}
local saved_ok, err = pcall(nd.save, state, output, metadata)
if not saved_ok then die(1, "%s", strip(err)) end

-- summary ----------------------------------------------------------------------

local function commas(n)
  local s = tostring(math.tointeger(n) or n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

local function dtypes_str(counts)
  local names = {}
  for k in pairs(counts) do names[#names + 1] = k end
  table.sort(names)
  for i, k in ipairs(names) do names[i] = ("%s %d"):format(k, counts[k]) end
  return table.concat(names, ", ")
end

-- the model in one line: its own description, or its children's (Sequential)
local function repr_line(m)
  local extra = m:extra_repr()
  if extra == "" then
    local parts = {}
    for _, c in ipairs(m:named_children()) do parts[#parts + 1] = ("%s(%s)"):format(c[2].__name, c[2]:extra_repr()) end
    extra = table.concat(parts, ", ")
  end
  local s = ("%s(%s)"):format(m.__name, extra)
  if #s > 200 then s = s:sub(1, 196) .. " ..." end
  return s
end

local saved = convert.summary(state)
local n_converted = 0
for _ in pairs(report.converted) do n_converted = n_converted + 1 end
print(("%s -> %s"):format(input, output))
print(("model %s, mapping %s%s"):format(opts.model, metadata.mapping,
  info.wrapper and (", state dict under '" .. info.wrapper .. "'") or ""))
print(repr_line(model))
print(("read:  %d tensors, %s elements, %s bytes (%s)%s"):format(source.tensors, commas(source.elements),
  commas(source.bytes), dtypes_str(source.dtypes),
  n_converted > 0 and (", %d converted to the model's dtype"):format(n_converted) or ""))
print(("saved: %d tensors, %s parameters, %s bytes (%s)"):format(saved.tensors, commas(model:num_parameters()),
  commas(saved.bytes), dtypes_str(saved.dtypes)))
if info.prefix then print(("removed the prefix '%s' from every key"):format(info.prefix)) end
if #info.dropped > 0 then
  print(("ignored %d entries that are not tensors: %s"):format(#info.dropped, table.concat(info.dropped, ", ")))
end
if #report.missing > 0 then
  print(("warning: %d keys missing (left as initialised): %s"):format(#report.missing, table.concat(report.missing, ", ")))
end
if #report.unexpected > 0 then
  print(("warning: %d unexpected keys ignored: %s"):format(#report.unexpected, table.concat(report.unexpected, ", ")))
end
