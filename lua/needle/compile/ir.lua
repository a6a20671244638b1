-- needle.compile.ir: a captured graph's records (core graph:records()) as
-- text, as Graphviz dot, and checked for consistency.
--
-- Each record is one kernel call. Its tensors name a storage (%N) and the
-- version of it they see: a write makes the next version, so
--   %7.1 = binary.add(%5.1, %6.0) float32 {8,512}
-- reads version 1 of storage 5 and version 0 of storage 6 (version 0: as the
-- call found it) and writes version 1 of storage 7. Storages are e (existed
-- before the call: parameters, inputs, optimizer state), i (made inside) or
-- c (made inside and filled on the host: copied back before each replay).
local M = {}

function M.bytes(n)
  if n >= 2 ^ 30 then return ("%.1f GiB"):format(n / 2 ^ 30) end
  if n >= 2 ^ 20 then return ("%.1f MiB"):format(n / 2 ^ 20) end
  if n >= 2 ^ 10 then return ("%.1f KiB"):format(n / 2 ^ 10) end
  return ("%d bytes"):format(n)
end

local function view_str(a)
  local s = ("%s {%s}"):format(a.dtype, table.concat(a.shape, ","))
  -- strides only when they are not the contiguous ones
  local want, contiguous = 1, a.offset == 0
  for d = #a.shape, 1, -1 do
    if a.shape[d] ~= 1 and a.strides[d] ~= want then contiguous = false end
    want = want * a.shape[d]
  end
  if not contiguous then
    s = s .. (" strides {%s} offset %d"):format(table.concat(a.strides, ","), a.offset)
  end
  return s
end

-- Walks the records in order, numbering versions: fn(record, reads, writes)
-- with reads/writes lists of {arg, name} ("%storage.version").
local function walk(records, fn)
  local version = {}
  for _, r in ipairs(records) do
    local reads, writes = {}, {}
    for _, a in ipairs(r.args) do
      if a.storage and a.role:find("r", 1, true) then
        reads[#reads + 1] = {a, ("%%%d.%d"):format(a.storage, version[a.storage] or 0)}
      end
    end
    for _, a in ipairs(r.args) do
      if a.storage and a.role:find("w", 1, true) then
        version[a.storage] = (version[a.storage] or 0) + 1
        writes[#writes + 1] = {a, ("%%%d.%d"):format(a.storage, version[a.storage])}
      end
    end
    fn(r, reads, writes)
  end
end

local function op_name(r)
  local name = r.entry
  if r.detail then name = name .. "." .. r.detail end
  if r.op ~= r.entry and r.op ~= r.detail then name = name .. " [" .. r.op .. "]" end
  return name
end

function M.text(records)
  local lines = {}
  walk(records, function(r, reads, writes)
    local outs, ins = {}, {}
    for i, w in ipairs(writes) do outs[i] = w[2] end
    for i, x in ipairs(reads) do ins[i] = x[2] end
    local shape = writes[1] and view_str(writes[1][1]) or ""
    lines[#lines + 1] = ("%4d  %s = %s(%s) %s %s"):format(#lines + 1,
      #outs > 0 and table.concat(outs, ", ") or "_", op_name(r), table.concat(ins, ", "), shape,
      r.device)
  end)
  -- the storages and what they are
  local kinds, seen = {}, {}
  for _, r in ipairs(records) do
    for _, a in ipairs(r.args) do
      if a.storage and not seen[a.storage] then
        seen[a.storage] = true
        kinds[#kinds + 1] = ("%%%d:%s"):format(a.storage, a.kind)
      end
    end
  end
  lines[#lines + 1] = "storages (e existed before, i made inside, p planned into a shared buffer, c constant, f folded: made by the prologue): " .. table.concat(kinds, " ")
  return table.concat(lines, "\n")
end

function M.dot(records)
  local out = {"digraph needle {", "  rankdir=TB;", "  node [fontname=monospace, fontsize=10];"}
  local values = {}
  local function value(name, a)
    if not values[name] then
      values[name] = true
      local shape = a.kind == "e" and "box" or (a.kind == "c" or a.kind == "f") and "note" or "ellipse"
      out[#out + 1] = ('  "%s" [shape=%s, label="%s\\n%s"];'):format(name, shape, name, view_str(a))
    end
  end
  local k = 0
  walk(records, function(r, reads, writes)
    k = k + 1
    local id = "k" .. k
    out[#out + 1] = ('  %s [shape=box, style=filled, fillcolor="#dde8f5", label="%s"];')
                    :format(id, op_name(r):gsub('"', "'"))
    for _, x in ipairs(reads) do
      value(x[2], x[1])
      out[#out + 1] = ('  "%s" -> %s;'):format(x[2], id)
    end
    for _, w in ipairs(writes) do
      value(w[2], w[1])
      out[#out + 1] = ('  %s -> "%s";'):format(id, w[2])
    end
  end)
  out[#out + 1] = "}"
  return table.concat(out, "\n")
end

-- "binary 12, matmul 3, ..." (most frequent first)
function M.histogram(records)
  local count, names = {}, {}
  for _, r in ipairs(records) do
    if not count[r.entry] then names[#names + 1] = r.entry end
    count[r.entry] = (count[r.entry] or 0) + 1
  end
  table.sort(names, function(a, b)
    if count[a] ~= count[b] then return count[a] > count[b] end
    return a < b
  end)
  local parts = {}
  for i, n in ipairs(names) do parts[i] = ("%s %d"):format(n, count[n]) end
  return table.concat(parts, ", ")
end

-- Checks what every record must satisfy; returns nil or a list of problems:
-- each tensor's view lies inside its storage's known extent, roles are
-- r/w/rw, a write's storage is not one every earlier record only read
-- (external storages may be written: parameters, optimizer state).
function M.verify(records)
  local problems = {}
  for i, r in ipairs(records) do
    if type(r.entry) ~= "string" or type(r.args) ~= "table" then
      problems[#problems + 1] = ("record %d: malformed"):format(i)
    end
    for j, a in ipairs(r.args) do
      if a.role ~= "r" and a.role ~= "w" and a.role ~= "rw" then
        problems[#problems + 1] = ("record %d arg %d: bad role %s"):format(i, j, tostring(a.role))
      end
      if a.storage then
        if #a.shape ~= #a.strides then
          problems[#problems + 1] = ("record %d arg %d: shape and strides differ in rank"):format(i, j)
        end
        if a.offset < 0 then
          problems[#problems + 1] = ("record %d arg %d: negative offset"):format(i, j)
        end
        if not (a.kind == "e" or a.kind == "i" or a.kind == "p" or a.kind == "c" or a.kind == "f") then
          problems[#problems + 1] = ("record %d arg %d: storage of unknown kind"):format(i, j)
        end
      end
    end
  end
  return #problems > 0 and problems or nil
end

return M
