-- log_spec.lua - nd.log (issue 20): the TensorBoard records against the bytes
-- Google's protobuf library writes (spec/fixtures/gen/gen_tfevents.py wrote
-- spec/fixtures/tfevents_expected.lua), the CSV and JSON lines, histograms,
-- resuming, the errors, and nd.log still being the logarithm when called.
--
--   build/needle-lua spec/run.lua spec/log_spec.lua
local nd = require "needle"
local T = require "needle.log.tfevents"
local A = require("spec.helpers.assertions").bind(assert)
local S = require "spec.helpers.shell"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

local function tmpdir() return S.shell_line("mktemp -d") end

-- the records of a TFRecord file, each checked against its two CRCs
local function read_records(path)
  local data = assert(S.read_file(path))
  local out, pos = {}, 1
  while pos <= #data do
    local len = string.unpack("<I8", data, pos)
    assert.are.equal(T.masked_crc(data:sub(pos, pos + 7)), string.unpack("<I4", data, pos + 8))
    local body = data:sub(pos + 12, pos + 11 + len)
    assert.are.equal(len, #body)
    assert.are.equal(T.masked_crc(body), string.unpack("<I4", data, pos + 12 + len))
    out[#out + 1] = body
    pos = pos + 16 + len
  end
  return out
end

local function lines(path)
  local t = {}
  for l in io.lines(path) do t[#t + 1] = l end
  return t
end

describe("nd.log's TensorBoard records", function()
  it("CRC-32C gives RFC 3720's check value", function()
    assert.are.equal(0xE3069283, T.crc32c("123456789"))
    assert.are.equal(0, T.crc32c(""))
  end)

  it("are byte for byte the records of Google's protobuf library", function()
    local cases = dofile("spec/fixtures/tfevents_expected.lua")
    assert.is_true(#cases >= 8)
    for _, c in ipairs(cases) do
      local e, data = c.event, nil
      if e.kind == "file_version" then data = T.file_version_event(e.wall)
      elseif e.kind == "scalar" then data = T.scalar_event(e.wall, e.step, e.tag, e.value)
      else data = T.histogram_event(e.wall, e.step, e.tag, e.h) end
      assert.are.equal(c.record, hex(T.record(data)), c.name)
    end
  end)
end)

describe("nd.log.open", function()
  it("writes scalars and histograms to CSV, JSON lines and an event file", function()
    local dir = tmpdir()
    local log = nd.log.open(dir)
    log:scalar("train/loss", 0.5, 1)
    log:scalar("train/loss", nd.tensor(0.25), 2)
    log:scalars({["val/loss"] = 0.75, ["val/acc"] = 0.5}, 2)
    local h = log:histogram("w", nd.tensor({1, 2, 2, 3, 0 / 0}), 2, {bins = 2})
    log:close()
    log:close() -- a second close is allowed
    assert.are.same({"step,tag,value,wall_time"}, {lines(log.files.csv)[1]})
    local rows = lines(log.files.csv)
    assert.are.equal(5, #rows)
    assert.is_truthy(rows[2]:match("^1,train/loss,0.5,%d+%.%d+$"))
    assert.is_truthy(rows[3]:match("^2,train/loss,0.25,"))
    assert.is_truthy(rows[4]:match("^2,val/acc,0.5,")) -- sorted tags
    assert.is_truthy(rows[5]:match("^2,val/loss,0.75,"))
    local js = lines(log.files.jsonl)
    assert.are.equal(5, #js)
    local first = nd._json_decode(js[1])
    assert.are.same({type = "scalar", step = 1, tag = "train/loss", value = 0.5}, {type = first.type, step = first.step,
                    tag = first.tag, value = first.value})
    local hist = nd._json_decode(js[5])
    assert.are.equal("histogram", hist.type)
    assert.are.equal(4, hist.num)
    assert.are.equal(1, hist.nonfinite)
    assert.are.same({1, 3}, {hist.min, hist.max})
    assert.are.same({2, 3}, hist.bucket_limit)
    assert.are.same({3, 1}, hist.bucket) -- (-inf, 2] holds 1, 2, 2
    assert.are.same(hist.bucket, h.bucket)
    -- the event file: a version record, then one per value, in order
    assert.is_truthy(log.files.tensorboard:match("/events%.out%.tfevents%.%d+%.[^/]+%.needle$"))
    local recs = read_records(log.files.tensorboard)
    assert.are.equal(6, #recs)
    assert.is_truthy(recs[1]:find("brain.Event:2", 1, true))
    for i, tag in ipairs({"train/loss", "train/loss", "val/acc", "val/loss", "w"}) do
      assert.is_truthy(recs[i + 1]:find(tag, 1, true), tag)
    end
    os.execute("rm -rf " .. S.q(dir))
  end)

  it("the event file holds exactly the records of its values (byte for byte, given wall times)", function()
    local dir = tmpdir()
    do
      local log <close> = nd.log.open(dir, {csv = false, jsonl = false})
      log:scalar("a", 0.5, 1, {wall_time = 1700000000.5})
      log:scalar("flag", true, 2, {wall_time = 1700000001})
      log:histogram("h", {1, 2, 3}, 3, {bins = 2, wall_time = 1700000002})
      dir = log.files.tensorboard
    end -- closed by <close>: the file is complete
    local recs = read_records(dir)
    assert.are.equal(4, #recs)
    assert.are.equal(T.scalar_event(1700000000.5, 1, "a", 0.5), recs[2])
    assert.are.equal(T.scalar_event(1700000001, 2, "flag", 1), recs[3])
    assert.are.equal(T.histogram_event(1700000002, 3, "h", nd.log.histogram_of({1, 2, 3}, 2)), recs[4])
    os.execute("rm -rf " .. S.q(dir:match("^(.*)/[^/]*$")))
  end)

  it("histograms of tensors of any dtype, on every device", function()
    local D = require "spec.helpers.devices"
    local want = nd.log.histogram_of({1, 2, 2, 3}, 2)
    for _, dev in ipairs(D.all()) do
      for _, dtype in ipairs({"float32", "int64", "float16"}) do
        local h = nd.log.histogram_of(nd.tensor({1, 2, 2, 3}, {dtype = dtype, device = dev}):reshape({2, 2}), 2)
        assert.are.same(want.bucket, h.bucket, dev .. " " .. dtype)
        assert.are.same({want.min, want.max, want.sum}, {h.min, h.max, h.sum})
      end
    end
    if #D.opencl() == 0 then pending("histograms on OpenCL: no OpenCL device (" .. tostring(D.reason) .. ")") end
  end)

  it("histogram_of: equal-width buckets, a value on a boundary counts in the bucket below", function()
    local h = nd.log.histogram_of({0, 1, 2, 3, 4}, 4)
    assert.are.same({1, 2, 3, 4}, h.bucket_limit)
    assert.are.same({2, 1, 1, 1}, h.bucket)
    assert.are.same({0, 4, 5, 10, 30}, {h.min, h.max, h.num, h.sum, h.sum_squares})
    local one = nd.log.histogram_of({7, 7, 7}, 10)
    assert.are.same({7}, one.bucket_limit)
    assert.are.same({3}, one.bucket)
    local none = nd.log.histogram_of({}, 5)
    assert.are.same({}, none.bucket)
    assert.are.equal(0, none.num)
  end)

  it("formats can be turned off; resume appends without a second header and starts a new event file", function()
    local dir = tmpdir()
    local a = nd.log.open(dir, {tensorboard = false, jsonl = false})
    assert.is_nil(a.files.tensorboard)
    assert.is_nil(a.files.jsonl)
    a:scalar("x", 1, 1)
    a:close()
    local b = nd.log.open(dir, {resume = true, tensorboard = false})
    b:scalar("x", 2, 2)
    b:close()
    assert.are.same({"step,tag,value,wall_time"}, {lines(dir .. "/scalars.csv")[1]})
    assert.are.equal(3, #lines(dir .. "/scalars.csv"))
    local c = nd.log.open(dir) -- not resumed: a fresh CSV
    c:close()
    assert.are.equal(1, #lines(dir .. "/scalars.csv"))
    os.execute("rm -rf " .. S.q(dir))
  end)

  it("non-finite values: 'nan'/'inf' in the CSV, null in JSON", function()
    local dir = tmpdir()
    local log = nd.log.open(dir, {tensorboard = false})
    log:scalar("a", 0 / 0, 1)
    log:scalar("b", math.huge, 1)
    log:close()
    local rows = lines(dir .. "/scalars.csv")
    assert.is_truthy(rows[2]:match("^1,a,nan,"))
    assert.is_truthy(rows[3]:match("^1,b,inf,"))
    assert_contains(lines(dir .. "/log.jsonl")[1], '"value":null')
    os.execute("rm -rf " .. S.q(dir))
  end)

  it("rejects bad input with needle.log errors", function()
    local dir = tmpdir()
    assert_contains(errmsg(nd.log.open, dir, {tensorbord = true}),
                    "needle.log.open: unknown option 'tensorbord' (valid: csv, jsonl, resume, tensorboard)")
    assert_contains(errmsg(nd.log.open, 3), "needle.log.open: expected a directory name, got number")
    assert_contains(errmsg(nd.log.open, "/proc/no/such/dir"), "needle.log.open: cannot create the directory")
    local log = nd.log.open(dir, {tensorboard = false})
    assert_contains(errmsg(log.scalar, log, "x", 1, 1.5), "needle.log.scalar: step must be an integer, got 1.5")
    assert_contains(errmsg(log.scalar, log, "", 1, 1), "needle.log.scalar: tag must be a non-empty string")
    assert_contains(errmsg(log.scalar, log, "x", "1", 1), "needle.log.scalar: 'x': expected a number, got string")
    assert_contains(errmsg(log.scalar, log, "x", nd.zeros({2}), 1),
                    "needle.log.scalar: 'x': expected a number or a one-element tensor, got a tensor of shape {2}")
    assert_contains(errmsg(log.histogram, log, "h", {1, "a"}, 1), "needle.log.histogram: 'h': element 2 is a string")
    assert_contains(errmsg(log.histogram, log, "h", {1}, 1, {bins = 0}), "needle.log.histogram: bins must be >= 1")
    assert_contains(errmsg(log.histogram, log, "h", {1}, 1, {bin = 3}), "unknown option 'bin' (valid: bins, wall_time)")
    assert_contains(errmsg(log.scalars, log, 5, 1), "needle.log.scalars: expected a table of tag = value, got number")
    assert_contains(errmsg(log.scalar, "x", 1, 1), "needle.log.scalar: expected a logger (use log:scalar, with a colon)")
    log:close()
    assert_contains(errmsg(log.scalar, log, "x", 1, 1), "needle.log.scalar: the logger of " .. dir .. " is closed")
    os.execute("rm -rf " .. S.q(dir))
  end)

  it("nd.log called is still the natural logarithm, with its errors at the caller's line", function()
    local y = nd.log(nd.tensor({1, math.exp(2)}, {dtype = "float64"}))
    assert.are.same({0, 2}, {y[1]:item(), y[2]:item()})
    local msg = errmsg(function() local y = nd.log("x"); return y end) -- not a tail call: this line is the caller
    assert_contains(msg, "needle.log: expected a tensor")
    assert_contains(msg, "log_spec.lua:")
  end)
end)

describe("nd.plot.lines", function()
  local plot = nd.plot
  local function svg_of(spec)
    local dir = tmpdir()
    local saved = plot._has_gnuplot
    plot._has_gnuplot = function() return false end -- the SVG writer, whatever is installed
    local file = plot.lines(dir .. "/p", spec)
    plot._has_gnuplot = saved
    local text = S.read_file(file)
    os.execute("rm -rf " .. S.q(dir))
    return text
  end

  it("ylog = 'auto' is a log axis when positive values span a decade, linear otherwise", function()
    local decades = {series = {{name = "loss", x = {1, 2, 3}, y = {2.3, 0.2, 0.01}}}}
    assert.is_true(plot.wants_log(decades))
    assert.is_false(plot.wants_log({series = {{x = {1, 2}, y = {2.3, 0.5}}}}))
    assert.is_false(plot.wants_log({series = {{x = {1, 2}, y = {2.3, 0}}}}))      -- zero: no log
    assert.is_true(plot.wants_log({series = {{x = {1}, y = {150}}}, hlines = {{y = 11}}})) -- with the line
    local svg = svg_of(decades)
    for _, tick in ipairs({">0.01<", ">0.1<", ">1<", ">10<"}) do assert.truthy(svg:find(tick, 1, true), tick) end
    local linear = svg_of({series = decades.series, ylog = false})
    assert.falsy(linear:find(">0.1<", 1, true))
  end)

  it("ylog = true with nothing positive to draw is an empty linear plot, not a hang", function()
    local svg = svg_of({ylog = true, series = {{x = {1, 2}, y = {0, -1}}}})
    assert.truthy(svg:find("</svg>", 1, true))
    svg = svg_of({ylog = true, series = {}})
    assert.truthy(svg:find("</svg>", 1, true))
  end)

  it("draws a dashed, named line for each hline", function()
    local svg = svg_of({series = {{name = "ppl", x = {1, 2}, y = {100, 50}}}, hlines = {{name = "best achievable", y = 11.4}}})
    assert.truthy(svg:find("best achievable", 1, true))
    assert.truthy(svg:find("stroke-dasharray", 1, true))
  end)

  it("rejects a bad ylog", function()
    assert_contains(errmsg(plot.lines, "/nonexistent/p", {ylog = "yes"}),
                    'needle.plot.lines: ylog must be true, false or "auto", got "yes"')
  end)
end)
