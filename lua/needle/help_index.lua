-- needle.help_index: the documented names of the docs pages (internal; for
-- needle.help). The pages are the one source of what help prints: a name is
-- documented where a page shows it in a code span, in one of these places
-- (best first; docs/needle-lua.md, "Help", says the same for doc writers):
--
--   1 a heading:             ## `nd.save(tensors, path[, metadata])`
--                            (the summary: the first sentence after it)
--   2 a table's first cell:  | `F.gelu(x, {approximate=})` | erf form by default |
--                            (the summary: the row's last cell)
--   3 a table's other cells, in a row whose first cell is a label:
--                            | basic | `Linear(in, out, {bias})`, ... |
--                            (the summary: the parenthesis after the span,
--                            else the row's first cell); in a row whose first
--                            cell names something, a span of another cell is
--                            a mention (5)
--   4 prose, a call or a name with a parenthesis after it:
--                            `transpose(d1, d2)`, `reshape` (a view when ...)
--   5 prose, a bare name:    `view_as`
--                            (the summary: the parenthesis after the span,
--                            else the sentence around it)
--
-- A span may list names: `nd.zeros, ones, empty (shape, opts)` (later names
-- take the first one's prefix, and the trailing arguments apply to all),
-- `neg abs exp log` (bare names). `x:name` is a method of what the docs call
-- x (RECEIVERS); `nd.`, `F.`, `nn.` ... are namespaces, and a bare name
-- belongs to the namespace of its section: the code span of the nearest
-- heading that names one (`## Transforms (`data.transforms`)`), else the
-- page title's (`# Modules (`nd.nn`)`).
--
--   index.parse(page, text) -> a list of entries {path =, recv =, abs =, ns =,
--       sig =, args =, summary =, page =, line =, rank =}, and the namespace
--       of the page's title (or nil): path the name's dotted components
--       as written without "nd" ({"F", "gelu"}, {"reshape"}), abs whether it
--       was written from nd down (`nd.help`, or a heading's namespace), recv the
--       receiver of a method or field (x of `x:reshape`, nil otherwise), ns
--       the section's namespace components (or nil), sig the signature as
--       documented (a list item expanded: "ones(shape, opts)"), args what
--       follows the name in it ("(shape, opts)", or "")
--   index.RECEIVERS  receiver name in the docs -> the class it stands for
local M = {}

M.RECEIVERS = {
  x = "Tensor", y = "Tensor", t = "Tensor", a = "Tensor", p = "Tensor", loss = "Tensor",
  model = "Module", m = "Module", module = "Module", net = "Module",
  opt = "Optimizer", optimizer = "Optimizer",
  sched = "LRScheduler", scheduler = "LRScheduler",
  loader = "DataLoader", ds = "Dataset", dataset = "Dataset",
}

-- the text of a cell or sentence, as one plain line
local function plain(s)
  s = s:gsub("\\|", "|"):gsub("`", ""):gsub("%*%*", ""):gsub("%[([^%]]*)%]%([^)]*%)", "%1")
  return (s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", ""))
end

-- at most one sentence, at most 160 characters
local function summary_of(s)
  s = plain(s)
  local cut = s:find("%. %u") or s:find("; ")
  if cut and cut > 20 then s = s:sub(1, cut - 1) end
  if #s > 160 then s = s:sub(1, 157):gsub(" [^ ]*$", "") .. "..." end
  return s
end

-- top-level pieces of s split at `sep` (outside (), [], {} and quotes)
local function split_top(s, sep)
  local parts, depth, quote, start = {}, 0, nil, 1
  for i = 1, #s do
    local c = s:sub(i, i)
    if quote then
      if c == quote then quote = nil end
    elseif c == '"' or c == "'" then quote = c
    elseif c:find("[%(%[{]") then depth = depth + 1
    elseif c:find("[%)%]}]") then depth = depth - 1
    elseif depth == 0 and s:sub(i, i + #sep - 1) == sep then
      parts[#parts + 1] = s:sub(start, i - 1)
      start = i + #sep
    end
  end
  parts[#parts + 1] = s:sub(start)
  return parts
end

-- "a.b:c(args)" -> {"a", "b"}, "c", "(args)": the dotted head, the name after
-- ':' (nil without one) and the rest; nil when item is not a name
local function head_of(item)
  local head, rest = item:match("^([%a_][%w_%.]*)(.*)$")
  if head == nil or head:find("%.%.") or head:sub(-1) == "." then return nil end
  local path = {}
  for c in head:gmatch("[^.]+") do path[#path + 1] = c end
  local method, after = rest:match("^:([%a_][%w_]*)(.*)$")
  if method then rest = after end
  return path, method, rest
end

-- The names a code span documents: a list of {path =, recv =, args =, text =}.
local function names_of(span)
  span = span:gsub("\\|", "|")
  local items = split_top(span, ",")
  -- `neg abs exp log`: bare names separated by spaces
  if #items == 1 and span:find("^[%a_][%w_]*%s+[%a_][%w_%s]*$") then
    items = {}
    for w in span:gmatch("[%a_][%w_]*") do items[#items + 1] = w end
  end
  local out, prefix, recv = {}, nil, nil
  for i, item in ipairs(items) do
    item = item:gsub("^%s+", ""):gsub("%s+$", "")
    local path, method, rest = head_of(item)
    -- a name, maybe with arguments ("(x, dim)", " (shape, opts)", "{...}",
    -- "[i]"); anything after them is an example or a message, not a name
    if path == nil or not (rest == "" or rest:find("^ ?%b()$") or rest:find("^%b{}$") or rest:find("^%b[]$")) then
      return out -- keep the names before it
    end
    local abs = (path[1] == "nd" or path[1] == "needle") and #path > 1 -- written from nd down
    if abs then table.remove(path, 1) end
    local r
    if method then
      if #path == 1 and M.RECEIVERS[path[1]] then r = path[1]; path = {method}
      else path[#path + 1] = method end -- a class's function: nd.optim.Optimizer:extend
    elseif #path == 2 and M.RECEIVERS[path[1]] then
      r = path[1]; path = {path[2]} -- a field: x.shape
    end
    if i == 1 then
      prefix, recv = {table.unpack(path, 1, #path - 1)}, r
    elseif #path == 1 and r == nil then -- "nd.zeros, ones": ones takes nd.
      local p = {table.unpack(prefix)}
      p[#p + 1] = path[1]
      path, r = p, recv
    end
    out[#out + 1] = {path = path, recv = r, args = rest, text = item, abs = abs or (i > 1 and out[1].abs)}
  end
  -- "nd.zeros, ones, empty (shape, opts)": the last item's arguments are all's
  local last = out[#out]
  if #out > 1 and last.args:find("^ %(") then
    for _, n in ipairs(out) do
      if n.args == "" or n == last then n.args = last.args:sub(2) end
    end
  end
  return out
end

local function signature(n)
  local name = table.concat(n.path, ".")
  if n.recv then name = n.recv .. (n.text:find("^[%w_]+%.") and "." or ":") .. name end
  return name .. n.args:gsub("^ %(", "(")
end

-- the namespace a heading's code span names: `nd.nn`, `data.transforms`
local function heading_ns(text)
  for span in text:gmatch("`([^`]+)`") do
    if span:find("^[%a_][%w_.]*$") and not span:find("%.md$") then
      local path = {}
      for c in span:gmatch("[^.]+") do path[#path + 1] = c end
      if path[1] == "nd" or path[1] == "needle" then table.remove(path, 1) end
      if #path > 0 and not M.RECEIVERS[path[1]] then return path end
    end
  end
  return nil
end

-- the parenthesis right after position i of s ("reshape` (a view ...)"), or nil
local function paren_after(s, i)
  local open = s:match("^%s*()%(", i)
  if open == nil then return nil end
  local close = s:find("%b()", open)
  if close ~= open then return nil end
  local body = s:match("^%b()", open)
  return body:sub(2, -2)
end

-- the sentence of s around position i
local function sentence_at(s, i)
  local start = 1
  for p in s:gmatch("()%.%s") do
    if p < i then start = p + 2 else break end
  end
  local stop = s:find("%.%s", i) or #s
  return s:sub(start, stop)
end

function M.parse(page, text)
  local entries = {}
  local ns_at = {} -- heading level -> namespace in force
  local ns, heading, title_ns = nil, "", nil
  local pending = {} -- heading entries waiting for the next paragraph
  local para, para_line = {}, nil
  local in_code = false

  local function add(n, rank, summary, line)
    -- one letter alone is a variable of an example (`x`), except in a heading (`nd.F`)
    if #n.path == 0 or (rank > 1 and n.recv == nil and #n.path == 1 and #n.path[1] == 1) then return nil end
    local e = {path = n.path, recv = n.recv, abs = n.abs, ns = ns, sig = signature(n), args = n.args:gsub("^ ", ""),
               summary = summary_of(summary or ""), page = page, line = line, rank = rank}
    entries[#entries + 1] = e
    return e
  end

  local function flush()
    if #para == 0 then return end
    local s = table.concat(para, "\n")
    for _, e in ipairs(pending) do e.summary = summary_of(sentence_at(s, 1)) end
    pending = {}
    local pos = 1
    while true do
      local a, span, b = s:match("()`([^`]+)`()", pos)
      if a == nil then break end
      pos = b
      local line = para_line + select(2, s:sub(1, a):gsub("\n", ""))
      local paren = paren_after(s, b)
      for _, n in ipairs(names_of(span)) do
        add(n, (paren or n.args:find("^%(") or n.recv) and 4 or 5, paren or sentence_at(s, a), line)
      end
    end
    para, para_line = {}, nil
  end

  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("^%s*```") then
      flush()
      in_code = not in_code
    elseif in_code then -- code blocks document nothing
    elseif line:find("^#+%s") then
      flush()
      local hashes, htext = line:match("^(#+)%s+(.-)%s*$")
      local level = #hashes
      for l in pairs(ns_at) do if l >= level then ns_at[l] = nil end end
      local own = heading_ns(htext)
      local inherited
      for l = level - 1, 1, -1 do
        if ns_at[l] then inherited = ns_at[l]; break end
      end
      ns_at[level] = own or inherited
      if level == 1 then title_ns = own end
      ns, heading = ns_at[level], plain(htext)
      -- the heading's own spans: a signature, or the namespace itself
      for span in htext:gmatch("`([^`]+)`") do
        for _, item in ipairs(names_of(span)) do
          local saved = ns
          if own and table.concat(item.path, ".") == table.concat(own, ".") then ns, item.abs = nil, true end
          pending[#pending + 1] = add(item, 1, heading, n)
          ns = saved
        end
      end
    elseif line:find("^%s*|") then
      flush()
      local body = line:gsub("^%s*|", ""):gsub("|%s*$", "")
      local cells = {}
      for c in (body:gsub("\\|", "\1") .. "|"):gmatch("([^|]*)|") do -- a cell's \| is text
        cells[#cells + 1] = c:gsub("\1", "\\|")
      end
      if not line:find("^%s*|[%s:|-]*$") then -- not the |---| row
        local last = cells[#cells] or ""
        -- a row that names something in its first cell describes it in the
        -- others, where a span is a mention; a row whose first cell is a
        -- label (| basic | `Identity`, `Linear(...)` |) lists names after it
        local named = (cells[1] or ""):find("`[^`]+`") ~= nil
        for c, cell in ipairs(cells) do
          for a, span, b in cell:gmatch("()`([^`]+)`()") do
            for _, item in ipairs(names_of(span)) do
              if c == 1 then
                add(item, 2, #cells > 1 and plain(last) ~= "" and last or heading, n)
              elseif named then
                add(item, 5, sentence_at(cell, a), n)
              else
                add(item, 3, paren_after(cell, b) or plain(cells[1]) .. " (" .. heading .. ")", n)
              end
            end
          end
        end
      end
    elseif line:find("^%s*$") then
      flush()
    else
      if #para == 0 then para_line = n end
      para[#para + 1] = line
    end
  end
  flush()
  return entries, title_ns
end

return M
