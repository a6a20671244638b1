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

-- Products that a tiled configuration would give too few work-groups on a GPU: with at
-- most 32 rows or columns they take the skinny kernel (kernels/gemm.cl gemm_skinny: an LSTM
-- step's h @ W), with a long K they are split along K (a batched product and a sum: the
-- LSTM decoder's input gradient). POCL is a CPU device, where the launcher picks neither
-- by itself, so a child process forces both with NEEDLE_OPENCL_GEMM_SPLIT=always, and the
-- device times show which kernels ran.
describe("OpenCL matmul split for the GPU (few rows or columns, long K)", function()
  if D.pending_without_opencl(pending, "OpenCL skinny matmul") then return end

  local child = S.run_program

  local BODY = [[
    local nd = require "needle"
    nd.manual_seed(7)
    nd.opencl.timing(true)
    local worst64, worst32, cases = 0, 0, 0
    local function product(M, N, K, ta, tb, batch, dtype)
      local sa, sb = ta and {K, M} or {M, K}, tb and {N, K} or {K, N}
      if batch then table.insert(sa, 1, batch); table.insert(sb, 1, 1) end -- b broadcast
      local a, b = nd.randn(sa, {dtype = dtype}), nd.randn(sb, {dtype = dtype})
      if ta then a = a:transpose(-1, -2) end
      if tb then b = b:transpose(-1, -2) end
      local want = a:to("float64"):matmul(b:to("float64"))
      local got = a:to("opencl:0"):matmul(b:to("opencl:0")):cpu():to("float64")
      local err = ((got - want):abs():max():item()) / math.max(1, want:abs():max():item())
      cases = cases + 1
      return err
    end
    for _, s in ipairs({{20, 1024, 256}, {20, 256, 1024}, {1024, 256, 20}, {1, 7, 3}, {33, 5, 9},
                        {5, 33, 100}, {32, 32, 1}, {3, 1000, 17}, {31, 2, 70},
                        {70, 64, 1000}, {40, 50, 256}}) do -- the last two: split along K
      for _, ta in ipairs({false, true}) do
        for _, tb in ipairs({false, true}) do
          worst64 = math.max(worst64, product(s[1], s[2], s[3], ta, tb, nil, "float64"))
          worst64 = math.max(worst64, product(s[1], s[2], s[3], ta, tb, 3, "float64"))
          worst32 = math.max(worst32, product(s[1], s[2], s[3], ta, tb, nil, "float32"))
        end
      end
    end
    -- accumulating GEMMs (nd.compile's epilogue pass: dW = h1^T d1 + h2^T d2 + h3^T d3)
    -- equal the eager product-then-add bit for bit
    local f = function(h1, d1, h2, d2, h3, d3)
      local acc = h1:t():matmul(d1):t() + h2:t():matmul(d2):t()
      acc = acc + h3:t():matmul(d3):t()
      return acc * 0.5
    end
    local args = {}
    for i = 1, 6 do args[i] = nd.randn(5, i % 2 == 1 and 3 or 4):to("opencl:0") end
    local cf = nd.compile(f)
    local diff = 0
    for i = 1, 4 do
      local xs = {}
      for k, t in ipairs(args) do xs[k] = t * i end
      diff = math.max(diff, (cf(table.unpack(xs)) - f(table.unpack(xs))):abs():max():item())
    end
    local acc = cf.stats and cf:explain():match("matmul_acc (%d+)") or "0"
    local skinny, split = 0, 0
    for _, r in ipairs(nd.opencl.kernel_times()) do
      if r.name:find("gemm_skinny", 1, true) then skinny = skinny + r.calls end
      if r.name:find("^sum ") then split = split + r.calls end -- only split products sum here
    end
    print(("cases %d worst64 %.3g worst32 %.3g compiled_diff %.17g matmul_acc %s skinny %d split %d")
      :format(cases, worst64, worst32, diff, acc, skinny, split))
  ]]

  it("forced on, both agree with float64 products in every layout, with batches and broadcasting", function()
    local out = child("NEEDLE_OPENCL_GEMM_SPLIT=always", BODY)
    local cases, w64, w32, diff, acc, skinny, split = out:match(
      "cases (%d+) worst64 (%S+) worst32 (%S+) compiled_diff (%S+) matmul_acc (%d+) skinny (%d+) split (%d+)")
    assert.truthy(cases, out)
    assert.are.equal(132, tonumber(cases))
    assert.are.equal(24, tonumber(split), out) -- the two long-K shapes, 4 layouts, 3 variants
    assert.is_true(tonumber(w64) < 1e-12, out)
    assert.is_true(tonumber(w32) < 1e-5, out)
    assert.are.equal(0, tonumber(diff), out) -- accumulate = the same product, then one add
    assert.are.equal(1, tonumber(acc), out)
    -- every product above ran on it (6 of them per compiled call: 2 eager + 3 compiled + 1)
    assert.is_true(tonumber(skinny) >= 108, out)
  end)

  it("a tiled GEMM storing into a transposed accumulator gives the plain store's bits", function()
    -- a weight's gradient accumulated over steps: nd.compile's epilogue pass has the GEMM add
    -- into the accumulator through its transposed view (c_sm = 1), which the tiled kernel
    -- stores through local memory (C_LAYOUT); eager runs the product and an add. POCL's
    -- defaults are not tiled: a tuning file here says tiled, as a GPU's would.
    local dir = H.tmpdir()
    local probe = child("NEEDLE_CACHE_DIR=" .. S.q(dir), [[
      local nd = require "needle"
      local r = nd.opencl.tune({device = 0, sizes = {16}, budget_s = 0, save = true})
      print(r.file)
    ]])
    local file = probe:match("(%S+%.txt)")
    assert.truthy(file, probe)
    local text = S.read_file(file)
    text = text:gsub("\n(small) (%a+) [^\n]+", "\n%1 %2 tiled 32x32x16 2x2 v4")
               :gsub("\n(large) (%a+) [^\n]+", "\n%1 %2 tiled 64x64x16 4x4 v4")
    S.write_file(file, text)
    local out = child("NEEDLE_CACHE_DIR=" .. S.q(dir), [[
      local nd = require "needle"
      local cur = nd.opencl.tune({device = 0, query = true})
      local f = function(h1, d1, h2, d2, h3, d3)
        local acc = h1:t():matmul(d1):t() + h2:t():matmul(d2):t()
        acc = acc + h3:t():matmul(d3):t()
        return acc * 0.5
      end
      local worst, diff = 0, 0
      for _, s in ipairs({{20, 70, 90}, {3, 5, 4}, {40, 130, 200}}) do
        nd.manual_seed(s[2])
        local args = {}
        for i = 1, 6 do args[i] = nd.randn(s[1], i % 2 == 1 and s[2] or s[3]):to("opencl:0") end
        local cf = nd.compile(f)
        for i = 1, 3 do
          local xs, x64 = {}, {}
          for k, t in ipairs(args) do xs[k] = t * i; x64[k] = xs[k]:cpu():to("float64") end
          local got = cf(table.unpack(xs))
          diff = math.max(diff, (got - f(table.unpack(xs))):abs():max():item())
          local want = f(table.unpack(x64))
          worst = math.max(worst, (got:cpu():to("float64") - want):abs():max():item())
        end
        assert(cf:explain():find("matmul_acc"), "no accumulating GEMM")
      end
      print(("config %s diff %.17g worst %.3g"):format(cur.config.large.nn, diff, worst))
    ]])
    H.rmdir(dir)
    local cfg, diff, worst = out:match("config (.-) diff (%S+) worst (%S+)")
    assert.truthy(cfg, out)
    assert.are.equal("tiled 64x64x16 4x4 v4", cfg, out)
    assert.are.equal(0, tonumber(diff), out)
    assert.is_true(tonumber(worst) < 1e-3, out)
  end)

  it("the launcher picks neither on a CPU device by itself, and never means never", function()
    for _, env in ipairs({"NEEDLE_OPENCL_GEMM_SPLIT=auto", "NEEDLE_OPENCL_GEMM_SPLIT=never"}) do
      local out = child(env, BODY)
      local w64, skinny, split = out:match("worst64 (%S+) .* skinny (%d+) split (%d+)")
      assert.truthy(w64, out)
      assert.is_true(tonumber(w64) < 1e-12, out)
      local cpu = true
      for _, d in ipairs(nd.devices()) do if d.name == "opencl:0" then cpu = not d.gpu end end
      if cpu or env:find("never") then
        assert.are.equal(0, tonumber(skinny), env .. "\n" .. out)
        assert.are.equal(0, tonumber(split), env .. "\n" .. out)
      end
    end
  end)
end)
