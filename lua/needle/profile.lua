-- needle.profile: nd.profile(fn, opts) and `needle-lua --profile` (docs/profiler.md).
--
-- While profiling, every C binding (nd.*, the tensor methods and metamethods),
-- every nd.F function and every nd.nn module class's forward is replaced by a
-- wrapper that brackets the call with a profiler event (core.profiler_wrap);
-- autograd adds an "<op>_backward" event around each node's backward. The C
-- side sums calls, total time, self time (total minus nested events) and
-- bytes of tensor storage allocated per name; the originals are put back when
-- the outermost profile ends, also when fn raises.
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"

local M = {}

-- bindings that are not ops (the profiler's own, clocks, memory counters)
local SKIP = {
  clock = true, live_bytes = true, cached_bytes = true, empty_cache = true,
  allocated_bytes = true, is_tensor = true,
  opencl_timing = true, opencl_kernel_times = true, opencl_launches = true,
}
-- metamethods that are ops, under the name of the method that does the same
local META = {
  __add = "add", __sub = "sub", __mul = "mul", __div = "div", __unm = "neg",
  __pow = "pow", __mod = "remainder", __idiv = "floor_divide", __eq = "eq",
  __lt = "lt", __le = "le", __concat = "concat", __call = "call",
}

local state = {active = 0, saved = nil, keep = false}

local function is_c(f) return debug.getinfo(f, "S").what == "C" end

local function wrap_table(saved, cache, tbl, name_of, c_only)
  if type(tbl) ~= "table" then return end
  local todo = {}
  for k, v in pairs(tbl) do
    if type(k) == "string" and type(v) == "function" and (not c_only or is_c(v)) then
      local name = name_of(k)
      if name then todo[#todo + 1] = {k, v, name} end
    end
  end
  for _, e in ipairs(todo) do
    local k, v, name = e[1], e[2], e[3]
    local key = tostring(v) .. "\0" .. name
    local w = cache[key]
    if not w then
      w = core.profiler_wrap(v, name)
      cache[key] = w
    end
    saved[#saved + 1] = {tbl, k, v}
    rawset(tbl, k, w)
  end
end

local function install()
  local nd = require "needle"
  local saved, cache = {}, {}
  local plain = function(k) return (k:sub(1, 1) ~= "_" and not k:find("^profiler_") and not SKIP[k]) and k or nil end
  wrap_table(saved, cache, core, plain, true)
  wrap_table(saved, cache, nd, plain, true)
  wrap_table(saved, cache, core._methods, plain, true)
  wrap_table(saved, cache, core._metatable, function(k) return META[k] end, true)
  wrap_table(saved, cache, nd.F, function(k) return "F." .. k end, false)
  -- module forwards: "nn.Linear", ... (the nn classes load here, so that
  -- classes a script reaches later are wrapped too)
  local ok, nn = pcall(function() return nd.nn end)
  if ok and type(nn) == "table" then
    local names = {}
    local mt = getmetatable(nn)
    if mt and type(mt.__index) == "function" then
      for i = 1, 20 do
        local uname, lazy = debug.getupvalue(mt.__index, i)
        if uname == nil then break end
        if uname == "lazy" and type(lazy) == "table" then
          for k in pairs(lazy) do names[#names + 1] = k end
        end
      end
    end
    for _, k in ipairs(names) do pcall(function() return nn[k] end) end
    for k, class in pairs(nn) do
      if type(class) == "table" and type(rawget(class, "forward")) == "function" then
        local cname = "nn." .. tostring(rawget(class, "__name") or k)
        wrap_table(saved, cache, class, function(m) return m == "forward" and cname or nil end, false)
      end
    end
  end
  return saved
end

local function uninstall(saved)
  for i = #saved, 1, -1 do
    local e = saved[i]
    rawset(e[1], e[2], e[3])
  end
end

-- Starts profiling (nested starts share the wrappers and count from their
-- own start). opts.trace: keep the events for a Chrome trace.
function M.start(opts)
  opts = opts or {}
  if state.active == 0 then
    state.saved = install()
    core.profiler_reset()
  end
  local h = {prev_keep = state.keep, trace = opts.trace, device_time = opts.device_time}
  -- device time: every OpenCL command takes an event (nd.opencl.timing); a nested
  -- profile that asks for it too shares the rows of the outer one
  if opts.device_time then
    state.device_time = (state.device_time or 0) + 1
    if state.device_time == 1 then core.opencl_timing(true) end
  end
  state.keep = state.keep or opts.trace ~= nil
  state.active = state.active + 1
  core.profiler_enable(true, state.keep)
  h.depth = core.profiler_depth()
  h.before, h.ev0 = core.profiler_stats()
  h.bytes0 = core.allocated_bytes()
  h.t0 = core.profiler_now()
  return h
end

local function fmt_bytes(b)
  if b < 1024 then return ("%d B"):format(b) end
  local units = {"KiB", "MiB", "GiB", "TiB"}
  local u = 0
  repeat b = b / 1024; u = u + 1 until b < 1024 or u == #units
  return ("%.1f %s"):format(b, units[u])
end

local Report = {}
Report.__index = Report

local SORT_KEYS = {self = "self_ms", total = "total_ms", calls = "calls", bytes = "bytes", name = "name"}

-- The rows sorted by `by` ("self", "total", "calls", "bytes", "name"); the
-- "(other)" row (time between ops) stays last.
function Report:sorted(by)
  by = by or "self"
  local key = SORT_KEYS[by]
  if not key then error(("needle.profile: sort must be one of self, total, calls, bytes, name, got %s"):format(tostring(by)), 2) end
  local rows = {}
  for i, r in ipairs(self.rows) do rows[i] = r end
  table.sort(rows, function(a, b)
    if key == "name" then return a.name < b.name end
    if a[key] ~= b[key] then return a[key] > b[key] end
    return a.name < b.name
  end)
  return rows
end

function Report:format(by)
  local lines = {}
  local w = 24
  for _, r in ipairs(self.rows) do w = math.max(w, #r.name) end
  -- the name column padded by hand: string.format takes widths up to 99 only, and a
  -- compiled fused kernel's row ("compiled:fused_elementwise.mul+add+...") is longer
  local function pad(name) return name .. (" "):rep(w - #name) end
  local head = "%s %9s %11s %11s %7s %11s"
  local row = "%s %9s %11.3f %11.3f %6.1f%% %11s"
  lines[1] = ("needle profile: %.3f ms wall, %d op calls%s"):format(self.total_ms, self.calls,
    self.dropped > 0 and (", %d trace events dropped"):format(self.dropped) or "")
  lines[2] = head:format(pad("op"), "calls", "total ms", "self ms", "self %", "alloc")
  for _, r in ipairs(self:sorted(by)) do
    lines[#lines + 1] = row:format(pad(r.name), r.calls, r.total_ms, r.self_ms, r.self_pct, fmt_bytes(r.bytes))
  end
  local o = self.other
  lines[#lines + 1] = row:format(pad(o.name), "-", o.total_ms, o.self_ms, o.self_pct, fmt_bytes(o.bytes))
  lines[#lines + 1] = row:format(pad("total"), self.calls, self.total_ms, self.total_ms, 100, fmt_bytes(self.bytes))
  if self.device then
    local dw, sum, n = 24, 0, 0
    for _, r in ipairs(self.device) do dw = math.max(dw, #r.name); sum = sum + r.ms; n = n + r.calls end
    local function dpad(name) return name .. (" "):rep(dw - #name) end
    lines[#lines + 1] = ""
    lines[#lines + 1] = ("OpenCL device time: %.3f ms in %d commands"):format(sum, n)
    lines[#lines + 1] = ("%s %9s %11s %11s %7s"):format(dpad("command"), "calls", "device ms", "us/call", "share")
    for _, r in ipairs(self.device) do
      lines[#lines + 1] = ("%s %9d %11.3f %11.2f %6.1f%%"):format(dpad(r.name), r.calls, r.ms,
        1000 * r.ms / r.calls, sum > 0 and 100 * r.ms / sum or 0)
    end
  end
  return table.concat(lines, "\n")
end
Report.__tostring = function(r) return r:format(r.sort) end

function Report:print(by, out)
  out = out or io.stdout
  if not (io.type(out) == "file" or (type(out) == "table" and type(out.write) == "function")) then
    error(("needle.profile: print(by, out): out must be a file (io.stdout, io.open(...)), got %s"):format(type(out)), 2)
  end
  out:write(self:format(by or self.sort), "\n")
end

-- Ends what M.start(h) began and returns the report.
function M.stop(h, opts)
  opts = opts or {}
  local t1 = core.profiler_now()
  local bytes1 = core.allocated_bytes()
  core.profiler_pop(h.depth) -- events an error left open
  local after, ev1, dropped = core.profiler_stats()
  local ntraced
  local ok, err = true, nil
  if h.trace then
    ok, err = pcall(core.profiler_write_trace, h.trace, h.ev0 + 1, ev1, h.t0)
    ntraced = ok and err or nil
  end
  state.active = state.active - 1
  state.keep = h.prev_keep
  if state.active == 0 then
    core.profiler_enable(false, false)
    core.profiler_reset()
    uninstall(state.saved)
    state.saved = nil
  else
    core.profiler_enable(true, state.keep)
  end
  local device
  if h.device_time then
    local tok, rows = pcall(core.opencl_kernel_times)
    state.device_time = state.device_time - 1
    if state.device_time == 0 then pcall(core.opencl_timing, false) end
    if tok then device = rows elseif ok then ok, err = false, rows end
  end
  if not ok then error(err, 0) end

  local wall_ns = t1 - h.t0
  local r = setmetatable({rows = {}, total_ms = wall_ns / 1e6, bytes = bytes1 - h.bytes0,
                          calls = 0, trace = h.trace, events = ntraced, dropped = dropped,
                          sort = opts.sort or "self", device = device}, Report)
  local self_sum, bytes_sum = 0, 0
  for name, s in pairs(after) do
    local b = h.before[name] or {calls = 0, total_ns = 0, self_ns = 0, total_bytes = 0, self_bytes = 0}
    local calls = s.calls - b.calls
    if calls > 0 then
      local self_ns = s.self_ns - b.self_ns
      local row = {name = name, calls = calls, total_ms = (s.total_ns - b.total_ns) / 1e6,
                   self_ms = self_ns / 1e6, self_pct = wall_ns > 0 and 100 * self_ns / wall_ns or 0,
                   bytes = s.self_bytes - b.self_bytes, total_bytes = s.total_bytes - b.total_bytes}
      r.rows[#r.rows + 1] = row
      r.calls = r.calls + calls
      self_sum = self_sum + self_ns
      bytes_sum = bytes_sum + row.bytes
    end
  end
  local other_ns = math.max(0, wall_ns - self_sum)
  r.other = {name = "(other)", calls = 0, total_ms = other_ns / 1e6, self_ms = other_ns / 1e6,
             self_pct = wall_ns > 0 and 100 * other_ns / wall_ns or 0,
             bytes = math.max(0, r.bytes - bytes_sum), total_bytes = math.max(0, r.bytes - bytes_sum)}
  r.rows = r:sorted(r.sort)
  r.by_name = {}
  for _, row in ipairs(r.rows) do r.by_name[row.name] = row end
  return r
end

local function check_opts(opts)
  -- trace and sort: checked below, with what they may be
  opts = require("needle.options").check("profile", opts, {trace = "any", print = "boolean", sort = "any", device_time = "boolean"})
  if opts.trace ~= nil and type(opts.trace) ~= "string" then
    error(("needle.profile: trace must be a file name, got %s"):format(type(opts.trace)), 3)
  end
  if opts.sort ~= nil and not SORT_KEYS[opts.sort] then
    error(("needle.profile: sort must be one of self, total, calls, bytes, name, got %s"):format(tostring(opts.sort)), 3)
  end
  return opts
end

-- nd.profile(fn[, {trace = path, print = bool, sort = "self", device_time = bool}]) -> report, fn's results
function M.profile(fn, opts)
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error(("needle.profile: fn must be a function, got %s"):format(type(fn)), 2)
  end
  opts = check_opts(opts)
  local h = M.start(opts)
  local res = table.pack(pcall(fn))
  local report = M.stop(h, opts)
  if not res[1] then error(res[2], 0) end
  if opts.print then report:print() end
  return report, table.unpack(res, 2, res.n)
end

-- `needle-lua --profile[=trace.json] script`: main.c calls these around the script.
local cli
function M._cli_start(trace)
  cli = M.start({trace = trace ~= "" and trace or nil})
end
function M._cli_stop()
  if not cli then return end
  local h = cli
  cli = nil
  local r = M.stop(h)
  io.stdout:flush()
  r:print("self", io.stderr)
  if r.trace then io.stderr:write(("needle profile: trace written to %s\n"):format(r.trace)) end
end

return M
