-- needle.log (nd.log): a scalar and histogram logger for training runs, in
-- three formats at once (docs/logging.md):
--
--   local log = nd.log.open("runs/exp1")     -- {csv=, jsonl=, tensorboard=, resume=}
--   log:scalar("train/loss", 0.73, step)
--   log:scalars({["val/loss"] = 0.61, ["val/acc"] = 0.8}, step)
--   log:histogram("weights/fc1", model.fc1.weight, step)   -- {bins = 30}
--   log:close()
--
-- writes <dir>/scalars.csv (step,tag,value,wall_time), <dir>/log.jsonl (one
-- JSON object per scalar or histogram) and <dir>/events.out.tfevents.<time>.
-- <host>.<pid>.needle, which TensorBoard (`tensorboard --logdir <dir>`) reads.
-- A resumed run (resume = true) appends to the CSV and JSON lines and starts a
-- new event file beside the old ones, as TensorBoard expects of a restart.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local tfevents = require "needle.log.tfevents"

local M = {}

local fail_at = errors.fail_at

local Logger = {}
Logger.__index = Logger
Logger.__name = "needle.log.Logger"

-- wall-clock seconds with a fraction: os.time() has whole seconds only, so
-- the fraction comes from the monotonic clock since the logger opened
local function wall_clock()
  local base, t0 = os.time(), core.clock()
  return function() return base + (core.clock() - t0) end
end

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "r")
  local h = f and f:read("l") or "localhost"
  if f then f:close() end
  return (h:gsub("[^%w%-_.]", "_"))
end

local function pid()
  local f = io.open("/proc/self/stat", "r")
  local p = f and f:read("n") or 0
  if f then f:close() end
  return math.tointeger(p) or 0
end

local function num(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return ("%.9g"):format(v)
end

-- JSON has no NaN or infinities: they are written as null
local function json_num(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if math.type(v) == "integer" then return tostring(v) end
  return ("%.17g"):format(v)
end
local function json_str(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = {['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r"}
    return named[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end
local function json_list(list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = json_num(v) end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function csv_field(s)
  if s:find('[,"\n]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local function open_file(path, mode, who)
  local f, err = io.open(path, mode)
  if not f then fail_at(3, who, "cannot open %s: %s", path, tostring(err)) end
  return f
end

local function file_is_empty(path)
  local f = io.open(path, "rb")
  if not f then return true end
  local size = f:seek("end")
  f:close()
  return size == 0
end

-- nd.log.open(dir[, {csv = true, jsonl = true, tensorboard = true, resume = false}])
function M.open(dir, opts)
  if type(dir) ~= "string" or dir == "" then
    fail_at(2, "log.open", "expected a directory name, got %s", type(dir) == "string" and '""' or type(dir))
  end
  opts = options.check("log.open", opts, {csv = "boolean", jsonl = "boolean", tensorboard = "boolean",
                                          resume = "boolean"})
  local function on(k) return opts[k] ~= false end
  local ok = os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  if not ok then fail_at(2, "log.open", "cannot create the directory %s", dir) end
  local self = setmetatable({dir = dir, files = {}, closed = false, now = wall_clock()}, Logger)
  local mode = opts.resume and "a" or "w"
  if on("csv") then
    local path = dir .. "/scalars.csv"
    local fresh = not opts.resume or file_is_empty(path)
    self.csv = open_file(path, mode, "log.open")
    if fresh then self.csv:write("step,tag,value,wall_time\n") end
    self.files.csv = path
  end
  if on("jsonl") then
    local path = dir .. "/log.jsonl"
    self.jsonl = open_file(path, mode, "log.open")
    self.files.jsonl = path
  end
  if on("tensorboard") then
    local t = self.now()
    local path = ("%s/events.out.tfevents.%d.%s.%d.needle"):format(dir, math.floor(t), hostname(), pid())
    self.tb = open_file(path, "wb", "log.open")
    self.tb:write(tfevents.record(tfevents.file_version_event(t)))
    self.files.tensorboard = path
  end
  return self
end

local function check_open(self, who)
  if getmetatable(self) ~= Logger then fail_at(3, who, "expected a logger (use log:%s, with a colon)", who:match("[^.]+$")) end
  if self.closed then fail_at(3, who, "the logger of %s is closed", self.dir) end
end

local function check_step(who, step)
  if step == nil then return 0 end
  if math.type(step) ~= "integer" and not (type(step) == "number" and step == math.floor(step) and step == step) then
    fail_at(3, who, "step must be an integer, got %s", tostring(step))
  end
  return math.tointeger(step)
end

local function check_tag(who, tag)
  if type(tag) ~= "string" or tag == "" then fail_at(3, who, "tag must be a non-empty string, got %s", tostring(tag)) end
end

local function to_number(who, tag, value)
  if core.is_tensor(value) then
    if value:numel() ~= 1 then
      fail_at(3, who, "'%s': expected a number or a one-element tensor, got a tensor of shape {%s}", tag,
              table.concat(value.shape, ", "))
    end
    value = value:item()
  end
  if type(value) == "boolean" then value = value and 1 or 0 end
  if type(value) ~= "number" then fail_at(3, who, "'%s': expected a number, got %s", tag, type(value)) end
  return value
end

local function write_scalar(self, tag, value, step, wall)
  if self.csv then
    self.csv:write(("%d,%s,%s,%.3f\n"):format(step, csv_field(tag), num(value), wall))
  end
  if self.jsonl then
    self.jsonl:write(('{"type":"scalar","step":%d,"tag":%s,"value":%s,"wall_time":%.3f}\n'):format(
      step, json_str(tag), json_num(value), wall))
  end
  if self.tb then self.tb:write(tfevents.record(tfevents.scalar_event(wall, step, tag, value))) end
end

-- log:scalar(tag, value, step[, {wall_time = seconds}])
function Logger:scalar(tag, value, step, opts)
  check_open(self, "log.scalar")
  check_tag("log.scalar", tag)
  opts = options.check("log.scalar", opts, {wall_time = "number"})
  write_scalar(self, tag, to_number("log.scalar", tag, value), check_step("log.scalar", step), opts.wall_time or self.now())
end

-- log:scalars({tag = value, ...}, step[, {wall_time =}]): written in sorted tag order
function Logger:scalars(values, step, opts)
  check_open(self, "log.scalars")
  if type(values) ~= "table" then fail_at(2, "log.scalars", "expected a table of tag = value, got %s", type(values)) end
  opts = options.check("log.scalars", opts, {wall_time = "number"})
  step = check_step("log.scalars", step)
  local tags = {}
  for tag in pairs(values) do check_tag("log.scalars", tag); tags[#tags + 1] = tag end
  table.sort(tags)
  local wall = opts.wall_time or self.now()
  for _, tag in ipairs(tags) do write_scalar(self, tag, to_number("log.scalars", tag, values[tag]), step, wall) end
end

-- the values to histogram (a tensor of any dtype and device, or a list of
-- numbers) as a flat float64 tensor
local function values_of(who, tag, v)
  -- counted on the CPU in float64: not every OpenCL device has float64, and a
  -- histogram per parameter per epoch is not worth a device kernel
  if core.is_tensor(v) then return v:detach():reshape({-1}):to({device = "cpu", dtype = "float64"}) end
  if type(v) ~= "table" then fail_at(3, who, "'%s': expected a tensor or a list of numbers, got %s", tag, type(v)) end
  for i, x in ipairs(v) do
    if type(x) ~= "number" then fail_at(3, who, "'%s': element %d is a %s, expected a number", tag, i, type(x)) end
  end
  return core.tensor(#v > 0 and v or {}, {dtype = "float64"})
end

-- equal-width buckets over [min, max] of the finite values; bucket i counts
-- the values in (limit[i-1], limit[i]], the first from -inf, as TensorBoard
-- reads them. Counted with one comparison and one sum per bucket (tensor
-- ops, on the tensor's device), so a 10M-parameter model's histograms cost
-- milliseconds, not a Lua loop over every value. NaN and infinities cannot be
-- bucketed: they are counted as nonfinite.
function M.histogram_of(values, bins)
  local x = values_of("log.histogram_of", "values", values)
  local h = {min = 0, max = 0, num = 0, sum = 0, sum_squares = 0, bucket_limit = {}, bucket = {}, nonfinite = 0}
  local finite = x:abs():lt(math.huge)
  h.num = finite:sum():item()
  h.nonfinite = x:numel() - h.num
  if h.num == 0 then return h end
  local lo, hi = core.where(finite, x, math.huge):min():item(), core.where(finite, x, -math.huge):max():item()
  local xf = core.where(finite, x, 0)
  h.min, h.max, h.sum, h.sum_squares = lo, hi, xf:sum():item(), (xf * xf):sum():item()
  if hi == lo then bins = 1 end
  local xn = core.where(finite, x, 0 / 0) -- NaN compares false: out of every bucket
  local below = 0
  for b = 1, bins do
    local limit = b == bins and hi or lo + (hi - lo) * b / bins
    local upto = b == bins and h.num or xn:le(limit):sum():item()
    h.bucket_limit[b], h.bucket[b] = limit, upto - below
    below = upto
  end
  return h
end

-- log:histogram(tag, tensor_or_list, step[, {bins = 30, wall_time =}])
function Logger:histogram(tag, values, step, opts)
  check_open(self, "log.histogram")
  check_tag("log.histogram", tag)
  opts = options.check("log.histogram", opts, {bins = "integer", wall_time = "number"})
  local bins = opts.bins or 30
  if bins < 1 then fail_at(2, "log.histogram", "bins must be >= 1, got %d", bins) end
  step = check_step("log.histogram", step)
  local h = M.histogram_of(values_of("log.histogram", tag, values), bins)
  local wall = opts.wall_time or self.now()
  if self.jsonl then
    self.jsonl:write(('{"type":"histogram","step":%d,"tag":%s,"min":%s,"max":%s,"num":%d,"sum":%s,' ..
      '"sum_squares":%s,"nonfinite":%d,"bucket_limit":%s,"bucket":%s,"wall_time":%.3f}\n'):format(
      step, json_str(tag), json_num(h.min), json_num(h.max), h.num, json_num(h.sum), json_num(h.sum_squares),
      h.nonfinite, json_list(h.bucket_limit), json_list(h.bucket), wall))
  end
  if self.tb then self.tb:write(tfevents.record(tfevents.histogram_event(wall, step, tag, h))) end
  return h
end

function Logger:flush()
  check_open(self, "log.flush")
  for _, k in ipairs({"csv", "jsonl", "tb"}) do if self[k] then self[k]:flush() end end
end

-- closes the files; closing twice is allowed (a to-be-closed logger and an
-- explicit close)
function Logger:close()
  if self.closed then return end
  for _, k in ipairs({"csv", "jsonl", "tb"}) do if self[k] then self[k]:close(); self[k] = nil end end
  self.closed = true
end
Logger.__close = Logger.close
Logger.__gc = Logger.close

function Logger:__tostring()
  local kinds = {}
  for _, k in ipairs({"csv", "jsonl", "tensorboard"}) do if self.files[k] then kinds[#kinds + 1] = k end end
  return ("needle.log.Logger(%s: %s%s)"):format(self.dir, table.concat(kinds, ", "), self.closed and ", closed" or "")
end

M.Logger = Logger
return M
