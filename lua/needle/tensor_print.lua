-- needle.tensor_print - PyTorch-style text form of a tensor (the `__tostring`
-- of needle tensors) and the print options that control it.
--
--   local tp = require "needle.tensor_print"
--   print(tp.format(t))                 -- same as print(t)
--   tp.format(t, {precision = 2})       -- options for this call only
--   tp.set_printoptions{precision = 2, threshold = 1000, edgeitems = 3,
--                       linewidth = 80, sci_mode = nil, profile = nil}
--   tp.get_printoptions()               -- a copy of the current options
--
-- The layout follows torch/_tensor_str.py (PyTorch's repr) step by step:
--
--   tensor([[ 0.1000, -2.0000,  3.5000],
--           [ 4.0000,  5.0000,  6.0000]], dtype=float32, shape={2,3})
--
-- * one formatter per tensor: every element gets the same width; floats are
--   printed as `1.` when all finite values are integral, else with
--   `precision` decimals, or in scientific notation (`1.0000e+05`) when
--   max/min of the nonzero finite magnitudes exceeds 1000, the largest
--   exceeds 1e8, or (non-integral tensors) the smallest is below 1e-4;
--   `sci_mode = true/false` forces the choice. nan/inf read `nan`, `inf`,
--   `-inf`; integer dtypes print as integers, bool as `true`/`false`.
-- * tensors of more than `threshold` elements are summarized: along every
--   dim longer than 2*edgeitems only the first and last `edgeitems` entries
--   are shown, with ` ...` in a row and a `...,` line between row blocks.
--   Only those edges are ever read (each dim is narrowed before `totable`),
--   so printing a huge tensor costs next to nothing.
-- * rows are wrapped at `linewidth`; nested brackets line up under the
--   opening one; blocks of 3-D+ tensors are separated by dim-2 blank lines.
-- * needle always ends with `, dtype=<name>, shape={d1,d2}` (+ `, device=..`
--   off the CPU, + `, requires_grad=true`), always right after the closing
--   bracket on the last line (PyTorch would move a suffix that overflows
--   `linewidth` to a line of its own; needle keeps one greppable form).
--
-- The tensor API used: t.shape, t.dtype, t.device, t.requires_grad,
-- t:narrow(dim, start, length), t:totable(), t:double().

local error = require("needle.errors").error -- positions at the user's line
local options = require "needle.options"

local M = {}

local floor, huge, tointeger = math.floor, math.huge, math.tointeger
local sformat, srep, concat = string.format, string.rep, table.concat

local DEFAULTS = {
  precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = nil,
}

-- torch.set_printoptions(profile=...)
local PROFILES = {
  default = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 },
  short = { precision = 2, threshold = 1000, edgeitems = 2, linewidth = 80 },
  full = { precision = 4, threshold = huge, edgeitems = 3, linewidth = 80 },
}

local OPTS = {
  precision = DEFAULTS.precision, threshold = DEFAULTS.threshold,
  edgeitems = DEFAULTS.edgeitems, linewidth = DEFAULTS.linewidth, sci_mode = nil,
}

-- the options (their values are checked by check below)
local KNOWN = {
  precision = "any", threshold = "any", edgeitems = "any", linewidth = "any",
  sci_mode = "any", profile = "any",
}

local FLOATING = { float32 = true, float64 = true, float16 = true, bfloat16 = true }
local HALF = { float16 = true, bfloat16 = true }
local NONFLOAT = {
  int64 = true, int32 = true, int16 = true, int8 = true, uint8 = true, bool = true,
}

-- (core._host_read: a binary built before it has no capture to tell)
local host_read = require("needle.core")._host_read

local function is_int(v)
  return math.type(v) == "integer" or (type(v) == "number" and v == floor(v))
end

-- Checks one option; returns the value to store.
local function check(fn, key, v)
  if key == "precision" then
    if type(v) ~= "number" or not is_int(v) or v < 0 or v > 99 then
      error(sformat("needle.%s: precision must be an integer in 0..99, got %s", fn, tostring(v)), 3)
    end
    return tointeger(v)
  elseif key == "threshold" then
    if type(v) ~= "number" or v ~= v or v < 0 then
      error(sformat("needle.%s: threshold must be a number >= 0, got %s", fn, tostring(v)), 3)
    end
    return v
  elseif key == "edgeitems" then
    if type(v) ~= "number" or not is_int(v) or v < 0 then
      error(sformat("needle.%s: edgeitems must be an integer >= 0, got %s", fn, tostring(v)), 3)
    end
    return tointeger(v)
  elseif key == "linewidth" then
    if type(v) ~= "number" or not is_int(v) or v < 1 then
      error(sformat("needle.%s: linewidth must be an integer >= 1, got %s", fn, tostring(v)), 3)
    end
    return tointeger(v)
  elseif key == "sci_mode" then
    if v ~= nil and type(v) ~= "boolean" then
      error(sformat("needle.%s: sci_mode must be true, false or nil, got %s", fn, tostring(v)), 3)
    end
    return v
  end
end

--- Sets the print options, as torch.set_printoptions: the options given are
-- changed, the others kept, except `sci_mode`, which (as in PyTorch) is set to
-- the value given, so leaving it out goes back to the automatic choice.
-- `profile` ("default", "short", "full") first sets the profile's values.
function M.set_printoptions(o)
  o = options.check("set_printoptions", o, KNOWN)
  local new = {}
  for k, v in pairs(OPTS) do new[k] = v end
  if o.profile ~= nil then
    local p = PROFILES[o.profile]
    if not p then
      error("needle.set_printoptions: unknown profile '" .. tostring(o.profile) ..
        "' (expected default, short or full)", 2)
    end
    for k, v in pairs(p) do new[k] = v end
  end
  for _, k in ipairs({ "precision", "threshold", "edgeitems", "linewidth" }) do
    if o[k] ~= nil then new[k] = check("set_printoptions", k, o[k]) end
  end
  new.sci_mode = check("set_printoptions", "sci_mode", o.sci_mode)
  for k in pairs(DEFAULTS) do OPTS[k] = new[k] end
  OPTS.sci_mode = new.sci_mode
end

--- A copy of the current print options.
function M.get_printoptions()
  return {
    precision = OPTS.precision, threshold = OPTS.threshold, edgeitems = OPTS.edgeitems,
    linewidth = OPTS.linewidth, sci_mode = OPTS.sci_mode,
  }
end

-- The options for one call: the current ones, overridden by `o` if a table.
local function effective(o)
  local p = M.get_printoptions()
  if type(o) == "table" then
    for _, k in ipairs({ "precision", "threshold", "edgeitems", "linewidth", "sci_mode" }) do
      if o[k] ~= nil then p[k] = check("tensor_print.format", k, o[k]) end
    end
  end
  return p
end

---------------------------------------------------------------------------
-- Reading the (summarized) data

-- Concatenates two nested tables of equal shape but along `level` (1 = the
-- outermost) into a new nested table.
local function cat(a, b, level)
  local r = {}
  if level == 1 then
    local n = #a
    for i = 1, n do r[i] = a[i] end
    for i = 1, #b do r[n + i] = b[i] end
  else
    for i = 1, #a do r[i] = cat(a[i], b[i], level - 1) end
  end
  return r
end

-- Returns the nested table of the values to print and, per dim, whether that
-- dim is summarized (then the table holds its first e and last e entries).
-- A summarized dim is narrowed to its two edges before going on, so only the
-- 2^k corner blocks (k = summarized dims) are ever converted with totable.
local function fetch(t, shape, summarize, e, half)
  local D = #shape
  local sumd = {}
  for d = 1, D do sumd[d] = summarize and shape[d] > 2 * e end
  local function rec(x, d)
    if d > D then
      if half then x = x:double() end
      return x:totable()
    end
    if not sumd[d] then return rec(x, d + 1) end
    local n = shape[d]
    local head = rec(x:narrow(d, 1, e), d + 1)
    local tail = rec(x:narrow(d, n - e + 1, e), d + 1)
    return cat(head, tail, d)
  end
  return rec(t, 1), sumd
end

-- All leaves of a nested table D levels deep, in order.
local function flatten(node, D, out)
  if D == 0 then
    out[#out + 1] = node
  elseif D == 1 then
    local n = #out
    for i = 1, #node do out[n + i] = node[i] end
  else
    for i = 1, #node do flatten(node[i], D - 1, out) end
  end
  return out
end

---------------------------------------------------------------------------
-- The formatter (torch/_tensor_str.py: _Formatter)

local function nonfinite_str(v)
  if v ~= v then return "nan" end
  if v == huge then return "inf" end
  if v == -huge then return "-inf" end
  return nil
end

local function plain_str(v)
  if type(v) == "boolean" then return v and "true" or "false" end
  if type(v) == "number" then
    local i = tointeger(v)
    if i then return tostring(i) end
    return nonfinite_str(v) or tostring(v)
  end
  return tostring(v)
end

local function make_formatter(values, floating, p)
  local f = { floating = floating, int_mode = true, sci_mode = false, max_width = 1 }
  local prec = p.precision
  local efmt, ffmt = "%." .. prec .. "e", "%." .. prec .. "f"
  f.efmt, f.ffmt = efmt, ffmt

  if not floating then
    local w = 1
    for i = 1, #values do
      local n = #plain_str(values[i])
      if n > w then w = n end
    end
    f.max_width = w
    return f
  end

  -- nonzero finite values
  local nz, mn, mx = {}, huge, 0.0
  for i = 1, #values do
    local v = values[i] * 1.0
    if v == v and v ~= huge and v ~= -huge and v ~= 0 then
      nz[#nz + 1] = v
      local a = v < 0 and -v or v
      if a < mn then mn = a end
      if a > mx then mx = a end
    end
  end
  if #nz == 0 then
    return f -- as PyTorch: no valid number, and sci_mode is not even applied
  end

  for i = 1, #nz do
    local v = nz[i]
    if v ~= math.ceil(v) then f.int_mode = false; break end
  end

  local w = 1
  if f.int_mode then
    if mx / mn > 1000.0 or mx > 1.0e8 then
      f.sci_mode = true
      for i = 1, #nz do
        local n = #sformat(efmt, nz[i]); if n > w then w = n end
      end
    else
      for i = 1, #nz do
        local n = #sformat("%.0f", nz[i]) + 1; if n > w then w = n end
      end
    end
  else
    if mx / mn > 1000.0 or mx > 1.0e8 or mn < 1.0e-4 then
      f.sci_mode = true
      for i = 1, #nz do
        local n = #sformat(efmt, nz[i]); if n > w then w = n end
      end
    else
      for i = 1, #nz do
        local n = #sformat(ffmt, nz[i]); if n > w then w = n end
      end
    end
  end
  f.max_width = w

  if p.sci_mode ~= nil then f.sci_mode = p.sci_mode end
  return f
end

local function format_value(f, v)
  local s
  if f.floating then
    v = v * 1.0
    s = nonfinite_str(v)
    if not s then
      if f.sci_mode then
        s = sformat(f.efmt, v)
      elseif f.int_mode then
        s = sformat("%.0f", v) .. "."
      else
        s = sformat(f.ffmt, v)
      end
    end
  else
    s = plain_str(v)
  end
  local pad = f.max_width - #s
  if pad > 0 then s = srep(" ", pad) .. s end
  return s
end

---------------------------------------------------------------------------
-- Layout (torch/_tensor_str.py: _vector_str, _tensor_str_with_formatter)

local function vector_str(node, summarized, indent, f, p)
  local e = p.edgeitems
  local element_length = f.max_width + 2
  local per_line = floor((p.linewidth - indent) / element_length)
  if per_line < 1 then per_line = 1 end

  local data = {}
  if summarized then
    for i = 1, e do data[#data + 1] = format_value(f, node[i]) end
    data[#data + 1] = " ..."
    for i = e + 1, #node do data[#data + 1] = format_value(f, node[i]) end
  else
    for i = 1, #node do data[i] = format_value(f, node[i]) end
  end

  local lines = {}
  for i = 1, #data, per_line do
    lines[#lines + 1] = concat(data, ", ", i, math.min(i + per_line - 1, #data))
  end
  return "[" .. concat(lines, ",\n" .. srep(" ", indent + 1)) .. "]"
end

local function tensor_str(node, d, D, sumd, indent, f, p)
  if D - d == 0 then
    return vector_str(node, sumd[d], indent, f, p)
  end
  local slices = {}
  if sumd[d] then
    local e = p.edgeitems
    for i = 1, e do slices[#slices + 1] = tensor_str(node[i], d + 1, D, sumd, indent + 1, f, p) end
    slices[#slices + 1] = "..."
    for i = e + 1, #node do
      slices[#slices + 1] = tensor_str(node[i], d + 1, D, sumd, indent + 1, f, p)
    end
  else
    for i = 1, #node do
      slices[i] = tensor_str(node[i], d + 1, D, sumd, indent + 1, f, p)
    end
  end
  return "[" .. concat(slices, "," .. srep("\n", D - d) .. srep(" ", indent + 1)) .. "]"
end

local shape_str = require("needle.errors").shape_str

---------------------------------------------------------------------------

--- The text form of tensor `t`, as PyTorch's repr with needle's suffixes.
-- `opts` (optional) overrides the print options for this call.
function M.format(t, opts)
  -- inside a compiled function's capture: a graph break named as the user called it
  if host_read then host_read("tostring (print)") end
  local p = effective(opts)
  local shape = t.shape
  local D = #shape
  local dtype = t.dtype
  local numel = 1
  for i = 1, D do numel = numel * shape[i] end

  local prefix = "tensor("
  local indent = #prefix
  local body
  if numel == 0 then
    body = "[]"
  else
    local summarize = numel > p.threshold
    if summarize and p.edgeitems == 0 and D > 0 then
      body = "[...]"
    else
      local node, sumd = fetch(t, shape, summarize, p.edgeitems, HALF[dtype])
      local values = flatten(node, D, {})
      local floating = FLOATING[dtype] or false
      if not floating and not NONFLOAT[dtype] then
        -- a dtype this file does not know: decide from the values themselves
        floating = math.type(values[1]) == "float"
      end
      local f = make_formatter(values, floating, p)
      if D == 0 then
        body = format_value(f, node)
      else
        body = tensor_str(node, 1, D, sumd, indent, f, p)
      end
    end
  end

  local suffixes = { "dtype=" .. tostring(dtype), "shape=" .. shape_str(shape) }
  local device = t.device
  if device ~= nil and device ~= "cpu" then suffixes[#suffixes + 1] = "device=" .. tostring(device) end
  if t.requires_grad then suffixes[#suffixes + 1] = "requires_grad=true" end
  return prefix .. body .. ", " .. concat(suffixes, ", ") .. ")"
end

M.DEFAULTS = DEFAULTS

return M
