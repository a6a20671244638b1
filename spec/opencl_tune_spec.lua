-- spec/opencl_tune_spec.lua - the GEMM autotuner and the matmul sweep, run as a user runs
-- them (scripts/tune_opencl.lua, scripts/bench/matmul_sweep.lua), each in a child process
-- with its own kernel cache directory (NEEDLE_CACHE_DIR), so nothing here touches the
-- user's cache and the saved choice can be seen on disk.
local nd = require "needle"
local D = require "spec.helpers.devices"
local H = require "spec.helpers.scripts"
local S = require "spec.helpers.shell"

describe("OpenCL GEMM tuner and matmul sweep", function()
  if D.pending_without_opencl(pending, "OpenCL GEMM tuner") then return end

  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.rmdir(dir) end)

  local function run(script, args)
    local exe, root = S.needle_lua()
    local out = os.tmpname()
    local ok = os.execute(("NEEDLE_CACHE_DIR=%s %s %s %s > %s 2>&1"):format(S.q(dir), S.q(exe),
      S.q(root .. "/" .. script), args, out))
    local text = S.read_file(out)
    os.remove(out)
    return ok == true or ok == 0, text
  end

  local function gemm_files()
    local p = io.popen("ls " .. S.q(dir .. "/opencl") .. " 2>/dev/null")
    local txt = {}
    for l in p:lines() do
      if l:match("^gemm%-.*%.txt$") then txt[#txt + 1] = l end
    end
    p:close()
    return txt
  end

  it("tunes, checks every candidate, saves the choice atomically and reloads it", function()
    local ok, text = run("scripts/tune_opencl.lua", "--budget 2 --sizes 64,72x73x74 --device 0")
    assert.is_true(ok, text)
    assert.truthy(text:find("GFLOPS", 1, true), text)
    assert.truthy(text:find("peak (estimate)", 1, true), text)
    assert.truthy(text:find("saved to", 1, true), text)
    assert.are.equal("0", text:match("(%d+) rejected"), "a candidate gave a wrong product:\n" .. text)
    local files = gemm_files()
    assert.are.equal(1, #files, "one tuning file per device")
    -- a later process uses it
    ok, text = run("scripts/tune_opencl.lua", "--query --device 0")
    assert.is_true(ok, text)
    assert.truthy(text:find("from: tuned", 1, true), text)
    -- and forgets it on request
    ok, text = run("scripts/tune_opencl.lua", "--forget --device 0")
    assert.is_true(ok, text)
    assert.are.equal(0, #gemm_files())
  end)

  it("matmul stays right under the tuned configuration", function()
    local ok, text = run("scripts/tune_opencl.lua", "--budget 2 --sizes 72x73x74 --device 0 --quiet")
    assert.is_true(ok, text)
    local exe, root = S.needle_lua()
    local prog = os.tmpname()
    S.write_file(prog, [[
      local nd = require "needle"
      local a, b = nd.randn({72, 74}), nd.randn({74, 73})
      local r = a:to("opencl:0"):matmul(b:to("opencl:0")):cpu()
      local w = nd.randn({73, 74})
      local r2 = a:to("opencl:0"):matmul(w:to("opencl:0"):t()):cpu()
      print(((r - a:matmul(b)):abs():max():item()), ((r2 - a:matmul(w:t())):abs():max():item()))
    ]])
    local p = io.popen(("NEEDLE_CACHE_DIR=%s %s %s 2>&1"):format(S.q(dir), S.q(exe), S.q(prog)))
    local out = p:read("a")
    p:close()
    os.remove(prog)
    local e1, e2 = out:match("^(%S+)%s+(%S+)")
    assert.truthy(e1, out)
    assert.is_true(tonumber(e1) < 1e-3 and tonumber(e2) < 1e-3, out)
  end)

  it("bad options are clear errors", function()
    local ok, text = run("scripts/tune_opencl.lua", "--device 99")
    assert.is_false(ok)
    assert.truthy(text:find("99", 1, true), text)
    local okt, err = pcall(nd.opencl.tune, {device = 0, budget_s = -1})
    assert.is_false(okt)
    assert.truthy(tostring(err):find("budget", 1, true), err)
  end)

  it("the sweep writes a table, CSV, JSON and a plot", function()
    local ok, text = run("scripts/bench/matmul_sweep.lua",
      "--quick --sizes 16,64,72x73x74 --reps 2 --out " .. S.q(dir .. "/sweep"))
    assert.is_true(ok, text)
    assert.truthy(text:find("GFLOPS", 1, true), text)
    assert.truthy(text:find("opencl:0", 1, true), text)
    for _, f in ipairs({"matmul_sweep.csv", "matmul_sweep.json", "matmul_sweep.svg"}) do
      assert.is_true(S.exists(dir .. "/sweep/" .. f), f)
    end
    local csv = S.read_file(dir .. "/sweep/matmul_sweep.csv")
    assert.truthy(csv:find("opencl:0,", 1, true) and csv:find(",72,73,74,", 1, true), csv)
  end)
end)
