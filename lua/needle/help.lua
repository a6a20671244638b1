-- needle.help: nd.help(obj_or_name) and the REPL's ?name (docs/needle-lua.md).
--
-- Prints the documented signature and one-line summary of a function,
-- method, field, class or namespace of needle. The docs pages (docs/*.md)
-- are the only source: they are installed with the package
-- (<share/lua/5.4>/needle/docs/) and read, once, the first time help is asked
-- for (needle.help_index says which spans document a name). Nothing is
-- written twice, so what help prints is what the docs say.
--
--   help.help(v)       nd.help: v is a value (nd.F.gelu, a tensor's method,
--                      nd.nn.Linear, a module, an optimizer) or a name
--                      ("nd.F.gelu", "F.gelu", "x:reshape", "Tensor:reshape",
--                      "nn.Linear", "opt:step", "reshape")
--   help.repl(text)    the REPL's "?text": text may also start with a global
--                      of the session ("x:reshape" with x a tensor, "m:forward")
--   help.text(v)       -> what help.help prints
--   help.lookup(v)     -> the best entry documenting v (or nil), and the names
--                      tried ({"nd.F.gelu"})
--   help.public_names() -> {{name =, queries =}, ...}: nd.*, nd.F.*, nd.nn.*,
--                      nd.optim.*, tensor and module methods (the spec counts
--                      those without documentation)
--   help.documented(queries) -> whether one of them is documented
--   help.docs_dir()    -> the directory the pages are read from, or nil
local core = require "needle.core"
local index = require "needle.help_index"
local suggest = require "needle.suggest"

local M = {}

-- This file's directory: the docs are installed beside the Lua files
-- (<dir>/docs/) and, in a source or build tree, are <dir>/../../docs/.
local HERE = debug.getinfo(1, "S").source:match("^@(.*[/\\])help%.lua$")

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

function M.docs_dir()
  if HERE == nil then return nil end -- an embedded copy: no files beside it
  for _, dir in ipairs({HERE .. "docs/", HERE .. "../../docs/"}) do
    if readable(dir .. "needle-lua.md") then return dir end
  end
  return nil
end

local function list_pages(dir)
  local p = io.popen("ls -1 '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  if p == nil then return {} end
  local pages = {}
  for name in p:lines() do
    if name:find("%.md$") then pages[#pages + 1] = name end
  end
  p:close()
  table.sort(pages)
  return pages
end

local loaded -- {entries =, by_name =, titles = {page -> title ns}, dir =}

local function load_index()
  if loaded then return loaded end
  local dir = M.docs_dir()
  loaded = {entries = {}, by_name = {}, titles = {}, dir = dir} -- by_name: last part -> entries
  if dir == nil then return loaded end
  for _, page in ipairs(list_pages(dir)) do
    local f = io.open(dir .. page, "rb")
    if f then
      local es, title = index.parse(page, f:read("a"))
      f:close()
      loaded.titles[page] = title
      for _, e in ipairs(es) do
        loaded.entries[#loaded.entries + 1] = e
        local last = e.path[#e.path]
        local same_name = loaded.by_name[last] or {}
        loaded.by_name[last] = same_name
        same_name[#same_name + 1] = e
      end
    end
  end
  return loaded
end

-- queries ------------------------------------------------------------------
--   {kind = "ns", path = {"F", "gelu"}}               nd.F.gelu
--   {kind = "method", classes = {"Tensor"}, name =}   x:reshape, x.shape
--   {kind = "name", name = "reshape"}                 any entry of that name

-- The page whose bare names are a class's methods: a tensor's methods are
-- the bare names of tensor.md, a module's those of nn.md, and so on.
local METHOD_PAGES = {Tensor = "tensor.md", Module = "nn.md", Optimizer = "optim.md"}
-- how a method of a class is shown when the docs give it no receiver
local SHOWN_AS = {Tensor = "x", Module = "module", Optimizer = "opt", LRScheduler = "sched",
                  DataLoader = "loader", Dataset = "ds"}

local function same(a, b)
  if a == nil or b == nil then return a == b end
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function concat(a, b)
  local out = {table.unpack(a)}
  for _, v in ipairs(b) do out[#out + 1] = v end
  return out
end

-- whether entry e documents the ns path q: as written (an explicit path) or
-- with its section's namespace in front (a bare name, or a path that starts
-- with the namespace's last part: `mnist.load` in `data.mnist`)
local function names_path(e, q)
  if e.recv then return false end
  if e.abs then return same(e.path, q) end
  if e.ns then
    local full = e.path[1] == e.ns[#e.ns] and #e.path > 1 and concat({table.unpack(e.ns, 1, #e.ns - 1)}, e.path)
                 or concat(e.ns, e.path)
    if same(full, q) then return true end
  end
  -- a bare name belongs to its section's namespace only; where there is
  -- none (tensor.md) it is a method (METHOD_PAGES), not nd.<name>
  return #e.path > 1 and same(e.path, q)
end

-- Where a name is at home: a method on its class's page, a name of nd.nn on
-- the page whose title names nd.nn (the longest such namespace), a name of
-- nd itself on tensor.md. An entry elsewhere (an overview, an example in
-- another page's prose) counts 2 ranks less, so that the reference page's
-- own prose beats another page's passing mention, but not its tables.
local AWAY = 2

local function at_home(e, q, titles)
  if q.kind == "method" then
    for _, class in ipairs(q.classes) do
      if METHOD_PAGES[class] == e.page then return true end
    end
    return false
  end
  if q.kind ~= "ns" then return true end
  local title = titles[e.page]
  if title == nil then return #q.path == 1 and e.page == METHOD_PAGES.Tensor end
  return #title < #q.path and same({table.unpack(q.path, 1, #title)}, title) or same(title, q.path)
end

local function score(e, q, titles)
  local away = at_home(e, q, titles) and 0 or AWAY
  if q.kind == "ns" then
    return names_path(e, q.path) and e.rank + away or nil
  end
  local last = e.path[#e.path]
  if q.kind == "name" then return last == q.name and e.rank + away or nil end
  if #e.path ~= 1 or last ~= q.name then return nil end
  for _, class in ipairs(q.classes) do
    if e.recv and index.RECEIVERS[e.recv] == class then return e.rank + away end
    -- a bare name on the class's page, in a section of the page's own namespace
    if not e.recv and METHOD_PAGES[class] == e.page and same(e.ns, titles[e.page]) then return e.rank end
  end
  return nil
end

-- the entries documenting q, best first (ties: in page order), and their scores
local function find(q)
  local idx = load_index()
  local found = {}
  for i, e in ipairs(idx.by_name[q.name or q.path[#q.path]] or {}) do
    local s = score(e, q, idx.titles)
    if s then found[#found + 1] = {e = e, s = s, i = i} end
  end
  table.sort(found, function(a, b) if a.s ~= b.s then return a.s < b.s end return a.i < b.i end)
  local out, scores = {}, {}
  for i, f in ipairs(found) do out[i], scores[i] = f.e, f.s end
  return out, scores
end

-- "nd.F.gelu", "x:reshape"
local function query_name(q, e)
  if q.kind == "ns" then return "nd." .. table.concat(q.path, ".") end
  if q.kind == "name" then return q.name end
  local who = e and e.recv or SHOWN_AS[q.classes[1]] or q.classes[1]
  local sep = e and e.sig:find("^[%w_]+%.") and "." or ":"
  return who .. sep .. q.name
end

-- objects ------------------------------------------------------------------

local function is_class(t)
  return type(t) == "table" and (rawget(t, "__name") ~= nil or rawget(t, "__index") == t)
end

-- value -> the queries that name it, from a walk of the package's tables as
-- they are (nothing is loaded for this): nd, nd.F, the loaded submodules and
-- their classes; a function of a class also as a method of the class chain.
local function reverse_map()
  local nd = package.loaded["needle"]
  local map, class_name = {}, {}
  local function note(v, q)
    local list = map[v]
    if list == nil then list = {}; map[v] = list end
    list[#list + 1] = q
  end
  if type(nd) ~= "table" then return map, class_name end
  local queue, seen = {{t = nd, path = {}}}, {[nd] = true}
  local head = 1
  while queue[head] do
    local item = queue[head]
    head = head + 1
    local keys = {}
    for k in next, item.t do
      if type(k) == "string" and not k:find("^_") then keys[#keys + 1] = k end
    end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v = rawget(item.t, k)
      if type(v) == "function" or type(v) == "table" then
        local path = concat(item.path, {k})
        note(v, {kind = "ns", path = path})
        if is_class(v) and class_name[v] == nil then class_name[v] = k end
        if type(v) == "table" and not seen[v] and #path < 4 and not core.is_tensor(v) then
          seen[v] = true
          queue[#queue + 1] = {t = v, path = path, class = is_class(v) and v or nil}
        end
      end
    end
  end
  -- a function of a class: a method of it and of the classes it extends
  for _, item in ipairs(queue) do
    if item.class then
      local chain, c, guard = {}, item.class, {}
      while type(c) == "table" and not guard[c] do
        guard[c] = true
        chain[#chain + 1] = class_name[c] or rawget(c, "__name")
        local mt = getmetatable(c)
        c = type(mt) == "table" and rawget(mt, "__index") or nil
      end
      for k, v in next, item.t do
        if type(k) == "string" and type(v) == "function" and not k:find("^_") then
          note(v, {kind = "method", classes = chain, name = k})
        end
      end
    end
  end
  local methods = core._methods
  for k, f in next, methods do
    if type(k) == "string" and not k:find("^_") then note(f, {kind = "method", classes = {"Tensor"}, name = k}) end
  end
  return map, class_name
end

-- the class of an instance (a module's, an optimizer's), or nil
local function instance_class(v)
  local mt = getmetatable(v)
  if type(mt) ~= "table" then return nil end
  if type(rawget(mt, "class")) == "table" then return rawget(mt, "class") end
  if rawget(mt, "__index") == mt and mt ~= v then return mt end
  return nil
end

-- the class names of v's class chain, most derived first ({"Linear", "Module"})
local function classes_of(v)
  if core.is_tensor(v) then return {"Tensor"} end
  local c = instance_class(v)
  if c == nil then return nil end
  local _, class_name = reverse_map()
  local out, guard = {}, {}
  while type(c) == "table" and not guard[c] do
    guard[c] = true
    out[#out + 1] = class_name[c] or rawget(c, "__name")
    local mt = getmetatable(c)
    c = type(mt) == "table" and rawget(mt, "__index") or nil
  end
  return out
end

-- name -> queries
local function parse_name(s)
  s = s:gsub("^%s+", ""):gsub("%s+$", ""):gsub("^nd%.", ""):gsub("^needle%.", "")
  local recv, name = s:match("^([%a_][%w_]*):([%a_][%w_]*)$")
  if recv == nil then
    recv, name = s:match("^([%a_][%w_]*)%.([%a_][%w_]*)$")
    if recv and not index.RECEIVERS[recv] then recv = nil end
  end
  if recv then
    local class = index.RECEIVERS[recv] or recv
    return {{kind = "method", classes = {class}, name = name}}
  end
  if not s:find("^[%a_][%w_.]*$") then return {} end
  local path = {}
  for c in s:gmatch("[^.]+") do path[#path + 1] = c end
  local qs = {{kind = "ns", path = path}}
  if #path == 1 then qs[2] = {kind = "name", name = path[1]} end
  return qs
end

-- a value -> queries, and a description for when none is documented
local function value_queries(v)
  if type(v) == "string" then return parse_name(v), ("'%s'"):format(v) end
  if core.is_tensor(v) then
    return {}, "a tensor", true
  end
  local map = reverse_map()
  local qs = map[v]
  if qs == nil then
    local class = instance_class(v)
    if class and map[class] then
      qs = map[class]
    elseif class then
      return {}, ("an instance of %s (not a class of needle)"):format(tostring(rawget(class, "__name") or "a class"))
    end
  end
  return qs or {}, ("this %s (not a part of needle)"):format(type(v))
end

-- lookup and text ------------------------------------------------------------

-- the best entry for the queries (one value may have several names:
-- nd.conv2d is nd.F.conv2d) and the query it answers; a bare word ("name")
-- only when no exact name is documented
local function best(qs)
  for _, bare in ipairs({false, true}) do
    local top, top_q, top_s
    for _, q in ipairs(qs) do
      if (q.kind == "name") == bare then
        local es, scores = find(q)
        if es[1] and (top_s == nil or scores[1] < top_s) then top, top_q, top_s = es[1], q, scores[1] end
      end
    end
    if top then return top, top_q end
  end
  return nil
end

function M.lookup(v)
  local qs = value_queries(v)
  local e, q = best(qs)
  local tried = {}
  for i, qq in ipairs(qs) do tried[i] = query_name(qq) end
  return e, tried, q
end

local function entry_text(e, q)
  local title
  if q.kind == "name" then
    title = e.recv and e.sig or (e.ns and "nd." .. table.concat(e.ns, ".") .. "." or "") .. e.sig
  else
    title = query_name(q, e) .. e.args
  end
  local lines = {title}
  if e.summary ~= "" then lines[#lines + 1] = "  " .. e.summary end
  lines[#lines + 1] = ("  (docs/%s:%d)"):format(e.page, e.line)
  return table.concat(lines, "\n")
end

-- the documented name closest to what was asked, among the names of the
-- same namespace or class, for "did you mean"
local function near(qs)
  local idx = load_index()
  for _, q in ipairs(qs) do
    local word = q.name or q.path[#q.path]
    if #word >= 3 then
      local names = {}
      for _, e in ipairs(idx.entries) do
        local last = e.path[#e.path]
        local like = {kind = q.kind, classes = q.classes, name = last}
        if q.kind == "ns" then like.path = concat({table.unpack(q.path, 1, #q.path - 1)}, {last}) end
        if score(e, like, idx.titles) then names[last] = true end
      end
      local s = suggest.closest(word, names)
      if s then return s end
    end
  end
  return nil
end

local USAGE = [[nd.help(obj_or_name), or ?name in the REPL: the documented signature and summary
of a function, method, module or namespace, e.g. ?nd.F.gelu, ?x:reshape (x a tensor),
?nd.nn.Linear, ?nd.optim.Adam, ?opt:step, ?reshape. The text comes from the docs pages]]

function M.text(v)
  local idx = load_index()
  if v == nil then return USAGE .. (idx.dir and " in " .. idx.dir or "") .. "." end
  if idx.dir == nil then
    return "needle.help: the documentation pages are not installed (looked in " ..
      (HERE and HERE .. "docs/ and " .. HERE .. "../../docs/" or "no directory: an embedded package") .. ")"
  end
  local qs, what, is_tensor = value_queries(v)
  local e, q = best(qs)
  if e then return entry_text(e, q) end
  if is_tensor then
    return ("a tensor (%s, shape {%s}, %s): ?x:<method> for one of its methods (docs/tensor.md)")
      :format(v.dtype, table.concat(v.shape, ","), v.device)
  end
  local names = {}
  for i, qq in ipairs(qs) do names[i] = query_name(qq) end
  local msg = ("no documentation for %s"):format(#names > 0 and table.concat(names, " or ") or what)
  local s = #qs > 0 and near(qs)
  if s then msg = msg .. ("; did you mean '%s'?"):format(s) end
  return msg
end

function M.help(v)
  print(M.text(v))
end

-- "?x:reshape": a session's global first (a tensor, a module), else a name
function M.repl(text)
  text = (text or ""):gsub("^%s+", ""):gsub("%s+$", "")
  if text == "" then return M.help(nil) end
  local first, rest = text:match("^([%a_][%w_]*)(.*)$")
  local v = first and first ~= "nd" and rawget(_G, first) or nil
  if v ~= nil then
    local method = rest:match("^[:.]([%a_][%w_]*)$")
    local classes = method and classes_of(v)
    if classes then
      local e, q = best({{kind = "method", classes = classes, name = method}})
      if e then return print(entry_text(e, q)) end
    elseif rest == "" then
      return M.help(v)
    end
  end
  -- nd.F.gelu and the like: the value when it is there, else the name
  if first == "nd" then
    local ok, value = pcall(function()
      local x = _G.nd
      for part in rest:gmatch("%.([%a_][%w_]*)") do x = x[part] end
      return x
    end)
    if ok and value ~= nil and rest:find("^[%w_.]*$") and best((value_queries(value))) then
      return M.help(value)
    end
  end
  return M.help(text)
end

-- every public name, for the spec of what lacks documentation
function M.public_names()
  local nd = require "needle"
  local out = {}
  local function add(name, q, also) out[#out + 1] = {name = name, queries = {q, also}} end
  local function sorted_keys(t, want)
    local keys = {}
    for k, v in next, t do
      if type(k) == "string" and not k:find("^_") and want(v) then keys[#keys + 1] = k end
    end
    table.sort(keys)
    return keys
  end
  local fn = function(v) return type(v) == "function" end
  -- nd.exp is x:exp: "Math exists both as methods and as functions" (API.md)
  for _, k in ipairs(sorted_keys(nd, fn)) do
    add("nd." .. k, {kind = "ns", path = {k}},
        rawequal(core._methods[k], nd[k]) and {kind = "method", classes = {"Tensor"}, name = k} or nil)
  end
  for _, k in ipairs(sorted_keys(nd.F, fn)) do add("nd.F." .. k, {kind = "ns", path = {"F", k}}) end
  local nn_entries = getmetatable(nd.nn).__lazy
  local nn_names = sorted_keys(nn_entries, function(e) return type(e) == "table" end)
  for _, k in ipairs(nn_names) do add("nd.nn." .. k, {kind = "ns", path = {"nn", k}}) end
  for _, k in ipairs(sorted_keys(nd.optim, is_class)) do add("nd.optim." .. k, {kind = "ns", path = {"optim", k}}) end
  for _, k in ipairs(sorted_keys(core._methods, fn)) do
    add("x:" .. k, {kind = "method", classes = {"Tensor"}, name = k})
  end
  for _, k in ipairs(sorted_keys(nd.nn.Module, fn)) do
    add("module:" .. k, {kind = "method", classes = {"Module"}, name = k})
  end
  return out
end

function M.documented(queries)
  for _, q in ipairs(queries) do
    if find(q)[1] ~= nil then return true end
  end
  return false
end

return M
