-- needle.pretty: how the REPL shows a value (internal; src/repl.c calls it).
--
--   pretty.format(v)   -> string
--   pretty.print(...)  prints each value's format, tab-separated, through the
--                      global print (as lua.c's REPL prints)
--
-- A tensor, a module and anything else with __tostring prints as tostring
-- does (a tensor as PyTorch lays it out, a module as its tree); a string as
-- it is. A table without __tostring prints as Lua: its list part first, then
-- the other keys sorted (numbers, then strings, then the rest), so that a
-- shape reads {3, 4} and a state is the same text in every run:
--
--   {3, 4}
--   {betas = {0.9, 0.999}, lr = 0.001}     (one line when it fits)
--   {
--     alpha = 1,
--     weight = tensor([[...]], ...),       (multi-line values stay aligned)
--   }
--
-- LIMITS: depth, the levels of nested tables shown (deeper ones read
-- {...}); items, the entries shown per table (then "... (N more)"); width,
-- the line length the one-line form must fit. A table inside itself reads
-- <cycle>. Formatting never calls anything but __tostring and never fails: a
-- __tostring that raises shows its error.
local M = {}

local LIMITS = {depth = 3, items = 40, width = 80}

local KEYWORDS = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or
            repeat return then true until while]]):gmatch("%a+") do KEYWORDS[w] = true end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

local ESCAPES = {["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\"}

local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return ESCAPES[c] or ("\\%03d"):format(c:byte()) end) .. '"'
end

local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return ("<%s: __tostring failed: %s>"):format(type(v), tostring(s))
end

-- key order: numbers ascending, then strings, then other types by name
local RANK = {number = 1, string = 2}
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  local ra, rb = RANK[ta] or 3, RANK[tb] or 3
  if ra ~= rb then return ra < rb end
  if ra < 3 then return a < b end
  if ta ~= tb then return ta < tb end
  return safe_tostring(a) < safe_tostring(b)
end

local function key_text(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then return k end
  if type(k) == "string" then return "[" .. quote(k) .. "]" end
  return "[" .. safe_tostring(k) .. "]"
end

-- text with its lines after the first moved right by n columns, so that a
-- multi-line value (a tensor) keeps its alignment after "key = "
local function shift(text, n)
  if n <= 0 then return text end
  return (text:gsub("\n", "\n" .. (" "):rep(n)))
end

-- the list part 1..n, then the sorted other keys
local function entries(t)
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local keys = {}
  for k in next, t do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  return n, keys
end

local function format_table(t, o, indent, level, path)
  if path[t] then return "<cycle>" end
  local n, keys = entries(t)
  local total = n + #keys
  if total == 0 then return "{}" end
  if level > o.depth then return "{...}" end
  path[t] = true
  local inner = indent .. "  "
  local parts = {}
  local shown = math.min(total, o.items)
  for i = 1, shown do
    local k = i <= n and i or keys[i - n]
    local v = rawget(t, k)
    local part = {prefix = i <= n and "" or key_text(k) .. " = "}
    if type(v) == "table" and not has_tostring(v) then
      part.value = format_table(v, o, inner, level + 1, path) -- laid out for its indent
    elseif type(v) == "string" then
      part.value = quote(v)
    else
      part.value = safe_tostring(v)
      part.opaque = true -- its own lines: moved right as a block
    end
    parts[i] = part
  end
  path[t] = nil
  local more = total > shown and ("... (%d more)"):format(total - shown) or nil
  -- one line when it fits and nothing inside spans lines
  local flat = {}
  for i, p in ipairs(parts) do flat[i] = p.prefix .. p.value end
  if more then flat[#flat + 1] = more end
  local line = "{" .. table.concat(flat, ", ") .. "}"
  if not line:find("\n", 1, true) and #indent + #line <= o.width then return line end
  -- one entry a line; list items that fit on one line share lines
  local lines, packed = {"{"}, nil
  for _, p in ipairs(parts) do
    local v = p.opaque and shift(p.value, #inner + #p.prefix) or p.value
    local single = p.prefix == "" and not v:find("\n", 1, true)
    if single and packed and #packed + #v + 2 <= o.width then
      packed = packed .. " " .. v .. ","
    else
      if packed then lines[#lines + 1] = packed end
      packed = nil
      if single then packed = inner .. v .. "," else lines[#lines + 1] = inner .. p.prefix .. v .. "," end
    end
  end
  if packed then lines[#lines + 1] = packed end
  if more then lines[#lines + 1] = inner .. more end
  lines[#lines + 1] = indent .. "}"
  return table.concat(lines, "\n")
end

function M.format(v)
  if type(v) == "string" then return v end
  if type(v) == "table" and not has_tostring(v) then return format_table(v, LIMITS, "", 1, {}) end
  return safe_tostring(v)
end

function M.print(...)
  local out = table.pack(...)
  for i = 1, out.n do out[i] = M.format(out[i]) end
  print(table.unpack(out, 1, out.n))
end

return M
