-- scripts/bench/common.lua: what the benchmark scripts share - timing (the
-- median of several runs, as scripts/bench/bench_common.py times PyTorch),
-- running the PyTorch side, and the number formats of the tables.
--
--   local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
--   local C = dofile(here .. "/common.lua")
--
--   C.root                           the repository root (found from this file)
--   C.median_time(fn, reps[, warmup]) seconds for one call: warmup (default 3)
--                                    untimed calls, then the median of reps timed ones
--   C.per_iter(fn, n[, reps[, warmup]]) seconds per call: warmup (default 0)
--                                    untimed calls, then the median over reps
--                                    (default 5) runs of n calls each
--   C.median_of(xs)                  the median of the values in xs (holes, such as
--                                    failed runs, skipped; the mean of the middle two
--                                    for an even count), nil when there are none
--   C.run_kv(cmd)                    {key = number} from cmd's "key value" lines
--   C.python                         /usr/bin/python3 when there, else python3
--   C.run_torch(script_args)         run_kv of C.python scripts/bench/<script_args>
--   C.shell_out(cmd)                 cmd's whole output
--   C.run_child(prog, label, cmd)    run_kv(cmd); without an "ms" line, the tail of
--                                    its stderr goes to ours as "<prog>: <label> failed"
--   C.fmt(v[, f]), C.ratio(a, b)     table cells: "-" for a missing value
--   C.peak_rss_mb()                  this process's peak resident set (VmHWM) in MB,
--                                    nil where /proc/self/status is missing
--   C.print_rows(line, rows, mine, theirs[, f])
--                                    one line per {label, key} of rows: the label,
--                                    mine[key], theirs[key] and mine / theirs
local nd = require "needle"

local C = {}

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
C.root = here .. "/../.."

local function median(ts)
  table.sort(ts)
  return ts[(#ts + 1) // 2]
end

function C.median_time(fn, reps, warmup)
  for _ = 1, warmup or 3 do fn() end
  local ts = {}
  for i = 1, reps do
    local t0 = nd.clock()
    fn()
    ts[i] = nd.clock() - t0
  end
  return median(ts)
end

function C.per_iter(fn, n, reps, warmup)
  for _ = 1, warmup or 0 do fn() end -- e.g. the allocator cache, page faults
  local ts = {}
  for r = 1, reps or 5 do
    local t0 = nd.clock()
    for _ = 1, n do fn() end
    ts[r] = (nd.clock() - t0) / n
  end
  return median(ts)
end

function C.median_of(xs)
  local s = {}
  for _, x in pairs(xs) do s[#s + 1] = x end
  if #s == 0 then return nil end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

function C.run_kv(cmd)
  local f = io.popen(cmd .. " 2>/dev/null")
  local out = {text = {}} -- numbers by key; other values in out.text (e.g. device)
  for line in f:lines() do
    local k, v = line:match("^(%S+)%s+(%S+)$")
    if k and tonumber(v) then out[k] = tonumber(v) elseif k then out.text[k] = v end
  end
  f:close()
  return out
end

-- Debian's python3-torch lives under /usr/bin/python3 (a python3 earlier on
-- PATH, e.g. pyenv's, may not have it)
C.python = io.open("/usr/bin/python3") and "/usr/bin/python3" or "python3"

-- The PyTorch side of a benchmark: its keys are the same as needle's; an
-- empty table when PyTorch is not installed.
function C.run_torch(script_args)
  return C.run_kv(("%s %s/scripts/bench/%s"):format(C.python, C.root, script_args))
end

-- the whole output of a shell command
function C.shell_out(cmd)
  local f = io.popen(cmd)
  local s = f:read("a")
  f:close()
  return s
end

-- run_kv of cmd; on failure (no "ms" line) the tail of its stderr goes to
-- ours, as "<prog>: <label> failed: ..."
function C.run_child(prog, label, cmd)
  local err = os.tmpname()
  local q = "'" .. err:gsub("'", "'\\''") .. "'"
  local kv = C.run_kv(("(%s 2>%s)"):format(cmd, q))
  if not kv.ms then
    local f = io.open(err)
    local text = f and f:read("a") or ""
    if f then f:close() end
    io.stderr:write(("%s: %s failed: %s\n"):format(prog, label, text:sub(-600)))
  end
  os.remove(err)
  return kv
end

function C.peak_rss_mb()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local kb = f:read("a"):match("VmHWM:%s*(%d+)")
  f:close()
  return kb and tonumber(kb) / 1024
end

function C.fmt(v, f) return v and (f or "%.3f"):format(v) or "-" end
function C.ratio(a, b) return (a and b) and ("%.2fx"):format(a / b) or "-" end

function C.print_rows(line, rows, mine, theirs, f)
  for _, row in ipairs(rows) do
    local a, b = mine[row[2]], theirs[row[2]]
    print(line:format(row[1], C.fmt(a, f), C.fmt(b, f), C.ratio(a, b)))
  end
end

return C
