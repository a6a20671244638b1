-- nd.profile and `needle-lua --profile` (docs/profiler.md): exact call
-- counts, self <= total, shares that add up, backward events, bytes
-- allocated, the Chrome trace, and the bindings put back afterwards.
-- No timing thresholds: only relations between the numbers.
local nd = require "needle"
local core = require "needle.core"
local S = require "spec.helpers.shell"

local function sum_pct(r)
  local s = r.other.self_pct
  for _, row in ipairs(r.rows) do s = s + row.self_pct end
  return s
end

describe("nd.profile", function()
  it("counts calls per op exactly and returns fn's results", function()
    local a = nd.randn({8, 8})
    local r, x, y = nd.profile(function()
      local m = a:matmul(a)
      m = nd.matmul(m, a)
      m = m:matmul(a)
      local s = m + a
      s = s + a
      return 7, "z"
    end)
    assert.are.equal(7, x)
    assert.are.equal("z", y)
    assert.are.equal(3, r.by_name.matmul.calls)
    assert.are.equal(2, r.by_name.add.calls)
    assert.are.equal(5, r.calls)
  end)

  it("has self <= total and shares that sum to 100%", function()
    local x = nd.randn({16, 10})
    local labels = nd.tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6}, {dtype = "int64"})
    local r = nd.profile(function()
      for _ = 1, 3 do nd.F.cross_entropy(x, labels) end
    end)
    assert.are.equal(3, r.by_name["F.cross_entropy"].calls)
    for _, row in ipairs(r.rows) do
      assert.is_true(row.self_ms <= row.total_ms + 1e-9, row.name)
      assert.is_true(row.self_ms >= 0, row.name)
    end
    -- F.cross_entropy calls core ops: it is not all self time
    local ce = r.by_name["F.cross_entropy"]
    assert.is_true(ce.self_ms < ce.total_ms)
    assert.is_true(math.abs(sum_pct(r) - 100) < 1e-6)
  end)

  it("records the backward of each op after y:backward()", function()
    local w = nd.randn({4, 4}, {requires_grad = true})
    local r = nd.profile(function()
      local y = (w:matmul(w) + w):relu():sum()
      y:backward()
    end)
    assert.are.equal(1, r.by_name.backward.calls)
    assert.are.equal(1, r.by_name.matmul_backward.calls)
    assert.are.equal(1, r.by_name.relu_backward.calls)
    assert.are.equal(1, r.by_name.sum_backward.calls)
    assert.is_not_nil(w.grad)
  end)

  it("print checks where it writes", function()
    local r = nd.profile(function() return nd.zeros({10}) + 1 end)
    local ok, err = pcall(r.print, r, "self", 5)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("needle.profile: print(by, out): out must be a file", 1, true), err)
    local got = {}
    r:print("self", {write = function(_, ...) for _, s in ipairs({...}) do got[#got + 1] = s end end})
    assert.truthy(table.concat(got):find("add", 1, true))
  end)

  it("attributes allocated bytes to the op that allocates", function()
    local r = nd.profile(function() return nd.zeros({1000}) end)
    assert.is_true(r.by_name.zeros.bytes >= 4000)
    assert.is_true(r.bytes >= 4000)
  end)

  it("gives module forwards their own event", function()
    local m = nd.nn.Linear(3, 2)
    local r = nd.profile(function() return m(nd.randn({5, 3})) end)
    assert.are.equal(1, r.by_name["nn.Linear"].calls)
    assert.are.equal(1, r.by_name["F.linear"].calls)
  end)

  it("writes the trace as every file is written: a FIFO or a directory is refused, not waited on", function()
    local dir = S.shell_line("mktemp -d")
    local fifo = dir .. "/fifo"
    os.execute("mkfifo " .. S.q(fifo))
    local exe = S.needle_lua()
    -- in a child under timeout: opening a FIFO to write blocks until a reader comes
    local code = ("local ok, e = pcall(nd.profile, function() return nd.ones({2}) + 1 end, {trace = %q}); "
                  .. "io.write(tostring(e))"):format(fifo)
    local msg = S.shell_line("timeout 20 " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1; echo \" exit=$?\"")
    assert.is_truthy(msg:find("needle.profile: cannot replace '" .. fifo .. "': it is a FIFO, not a regular file", 1, true), msg)
    local ok
    ok, msg = pcall(nd.profile, function() end, {trace = dir})
    assert.is_truthy(msg:find("needle.profile: cannot replace '" .. dir .. "'", 1, true), msg)
    -- and under a file-size limit the trace is an error, not SIGXFSZ
    code = ("local ok, e = pcall(nd.profile, function() for _ = 1, 200 do local y = nd.ones({2}) + 1 end end, "
                  .. "{trace = %q}); io.write(tostring(e))"):format(dir .. "/t.json")
    local out = S.shell_line("ulimit -f 1; " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1; echo \" exit=$?\"")
    assert.is_truthy(out:find("needle.profile: cannot write '" .. dir .. "/t.json': File too large", 1, true), out)
    assert.is_truthy(out:find(" exit=0", 1, true), out)
    os.execute("rm -rf " .. S.q(dir))
  end)

  it("writes a Chrome trace of complete events", function()
    local path = os.tmpname()
    local a = nd.randn({4, 4})
    local r = nd.profile(function() return (a:matmul(a) + a):sum() end, {trace = path})
    local text = S.read_file(path)
    os.remove(path)
    assert.is_truthy(text:match('^%s*{.*"traceEvents"%s*:%s*%[.*%]%s*}%s*$'))
    local n = 0
    for ev in text:gmatch('{"name":[^\n]-"ph":"X"[^\n]*}') do
      n = n + 1
      assert.is_truthy(ev:match('"ts":[%d.]+'))
      assert.is_truthy(ev:match('"dur":[%d.]+'))
      assert.is_truthy(ev:match('"pid":%d+'))
      assert.is_truthy(ev:match('"tid":%d+'))
    end
    assert.are.equal(3, n)
    assert.are.equal(3, r.events)
    assert.is_truthy(text:find('"name":"matmul"', 1, true))
    -- balanced braces and brackets outside strings: a cheap JSON shape check
    local depth = 0
    for c in text:gsub('"[^"]*"', ""):gmatch("[%[%]{}]") do
      depth = depth + ((c == "[" or c == "{") and 1 or -1)
      assert.is_true(depth >= 0)
    end
    assert.are.equal(0, depth)
  end)

  it("prints a table sorted by the given key", function()
    local a = nd.randn({4, 4})
    local r = nd.profile(function() a:matmul(a); a:add(a); a:add(a) end, {sort = "calls"})
    local text = r:format("calls")
    assert.is_truthy(text:find("calls", 1, true))
    assert.is_truthy(text:find("self %", 1, true))
    local first = text:match("\n[^\n]*\n(%S+)")
    assert.are.equal("add", first)
    assert.are.equal("add", r.rows[1].name)
    assert.is_truthy(tostring(r):find("total", 1, true))
    assert.has_error(function() r:format("speed") end)
  end)

  it("prints rows whose names are longer than string.format's widths (a compiled fused kernel's)", function()
    -- a chain of 14 elementwise ops: its fused kernel's row is "compiled:fused_elementwise.mul+add+..."
    local f = function(x)
      local y = x
      for _ = 1, 7 do y = (y * 1.5 + 0.25):tanh() end
      return y
    end
    local cf = nd.compile(f)
    local x = nd.randn(16)
    for _ = 1, 3 do cf(x) end
    local r = nd.profile(function() cf(x) end)
    local long
    for _, row in ipairs(r.rows) do if #row.name > 99 then long = row.name end end
    assert.is_truthy(long, "no row name over 99 characters")
    local text = r:format("total")
    assert.is_truthy(text:find(long, 1, true))
    for line in text:gmatch("[^\n]+") do
      if line:find("total ms", 1, true) then assert.is_truthy(#line > #long) end -- the header padded as wide
    end
  end)

  it("puts the originals back, also after an error in fn", function()
    local mm, methods_mm, add_mt, relu = nd.matmul, core._methods.matmul, core._metatable.__add, nd.F.relu
    nd.profile(function() return nd.matmul(nd.ones({2, 2}), nd.ones({2, 2})) end)
    assert.are.equal(mm, nd.matmul)
    assert.are.equal(mm, core.matmul)
    local ok, err = pcall(nd.profile, function() nd.ones({2}):add(nd.ones({3})) end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("needle.add", 1, true))
    assert.are.equal(mm, nd.matmul)
    assert.are.equal(methods_mm, core._methods.matmul)
    assert.are.equal(add_mt, core._metatable.__add)
    assert.are.equal(relu, nd.F.relu)
    assert.is_false(core.profiler_enabled())
    assert.are.equal(0, core.profiler_depth())
  end)

  it("keeps counting right after an error caught inside fn", function()
    local a = nd.ones({2, 2})
    local r = nd.profile(function()
      assert(not pcall(function() return a:add(nd.ones({3})) end))
      a:matmul(a)
    end)
    assert.are.equal(1, r.by_name.add.calls)
    assert.are.equal(1, r.by_name.matmul.calls)
  end)

  it("nests: the inner report covers the inner fn only", function()
    local a = nd.ones({2, 2})
    local inner
    local outer = nd.profile(function()
      a:matmul(a)
      inner = nd.profile(function() a:add(a) end)
      a:matmul(a)
    end)
    assert.are.equal(1, inner.by_name.add.calls)
    assert.is_nil(inner.by_name.matmul)
    assert.are.equal(2, outer.by_name.matmul.calls)
    assert.are.equal(1, outer.by_name.add.calls)
    assert.are.equal(nd.matmul, core.matmul)
    assert.is_false(core.profiler_enabled())
  end)

  it("checks its arguments", function()
    assert.has_error(function() nd.profile(42) end, "needle.profile: fn must be a function, got number")
    assert.has_error(function() nd.profile(function() end, {sort = "x"}) end)
    assert.has_error(function() nd.profile(function() end, {trace = 3}) end)
    assert.has_error(function() nd.profile(function() end, {device_time = 1}) end)
  end)

  it("adds the OpenCL device time per kernel with device_time, and turns timing off after", function()
    local D = require "spec.helpers.devices"
    if D.pending_without_opencl(pending, "OpenCL device time") then return end
    local a = nd.randn({64, 48}):to("opencl:0")
    local b = nd.randn({48, 32}):to("opencl:0")
    local f = nd.compile(function(x, y) return (x:matmul(y) + 1):relu() end)
    local r = nd.profile(function()
      for _ = 1, 3 do local _ = a:matmul(b) end
      for _ = 1, 4 do local _ = f(a, b) end
      nd.synchronize()
    end, {device_time = true})
    local by = {}
    for _, row in ipairs(r.device) do
      assert.is_true(row.calls > 0 and row.ms >= 0, row.name)
      by[row.name] = row
    end
    -- 3 eager products, then the compiled function's: eager, capture, 2 replays
    local mm = 0
    for name, row in pairs(by) do if name:find("^matmul gemm_") then mm = mm + row.calls end end
    assert.are.equal(7, mm)
    local fused = 0
    for name, row in pairs(by) do if name:find("nd_fused", 1, true) then fused = fused + row.calls end end
    assert.is_true(fused >= 2, "the replays' fused add+relu is timed (prepared launches too)")
    for i = 2, #r.device do assert.is_true(r.device[i - 1].ms >= r.device[i].ms) end
    local text = r:format()
    assert.truthy(text:find("OpenCL device time:", 1, true), text)
    assert.truthy(text:find("us/call", 1, true), text)
    -- off again: nothing more is timed
    local _ = a:matmul(b)
    nd.synchronize()
    assert.are.equal(0, #nd.opencl.kernel_times())
    assert.has_error(function() nd.opencl.timing("yes") end)
  end)
end)

describe("needle-lua --profile", function()
  local exe = S.needle_lua()
  local function run(args)
    local out, err = os.tmpname(), os.tmpname()
    local cmd = ("%s %s >%s 2>%s"):format(S.q(exe), args, S.q(out), S.q(err))
    local ok = os.execute(cmd)
    local r = {ok = ok, out = S.read_file(out), err = S.read_file(err)}
    os.remove(out); os.remove(err)
    return r
  end

  it("prints the table at exit and writes the trace", function()
    local script, trace = os.tmpname(), os.tmpname()
    S.write_file(script, [[
      local nd = require "needle"
      local a = nd.ones({3, 3})
      for _ = 1, 4 do a = a:matmul(a) end
      print("args", ...)
    ]])
    local r = run("--profile=" .. S.q(trace) .. " " .. S.q(script) .. " x y")
    os.remove(script)
    local text = S.read_file(trace)
    os.remove(trace)
    assert.is_true(r.ok)
    assert.are.equal("args\tx\ty\n", r.out)
    assert.is_truthy(r.err:find("needle profile:", 1, true))
    assert.is_truthy(r.err:match("\nmatmul%s+4%s"))
    assert.is_truthy(text:find('"traceEvents"', 1, true))
  end)

  it("prints the table when the script fails, and fails", function()
    local r = run("--profile -e " .. S.q('local nd = require "needle"; nd.ones({2}):sum(); error("boom")'))
    assert.is_not_true(r.ok)
    assert.is_truthy(r.err:find("boom", 1, true))
    assert.is_truthy(r.err:match("\nsum%s+1%s"))
  end)
end)
