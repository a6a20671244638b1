-- bench_harness_spec.lua - scripts/bench/run.lua (issue 7's benchmark
-- harness) run as a user runs it, on its cheapest workloads and without
-- PyTorch: it exits 0 and writes bench.json, bench.csv and ratios.svg with a
-- row per workload. No timing thresholds: only that the numbers are there.
-- Also that torch_ref.py defines the same workloads as workloads.lua.
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local json = require("needle.checkpoint").json

local _, root = S.needle_lua()
local run, tmpdir, rmdir = H.runner("bench/run"), H.tmpdir, H.rmdir

local fake_python = H.fake_python

describe("scripts/bench/run.lua", function()
  it("runs the cheap workloads without PyTorch and writes JSON, CSV and SVG", function()
    local d = tmpdir()
    local ok, out = run("--only small_ops,small_ops_grad,startup --reps 1 --warmup 0 --no-torch --out " .. S.q(d))
    assert.is_true(ok, out)
    for _, name in ipairs({"small_ops", "small_ops_grad", "startup"}) do
      assert.is_truthy(out:find(name, 1, true), out)
    end
    assert.is_truthy(out:find("PyTorch not run", 1, true), out)

    local doc = json.decode(assert(S.read_file(d .. "/bench.json")))
    assert.are.equal(2, doc.meta.threads)
    assert.are.equal(3, #doc.rows)
    local by = {}
    for _, r in ipairs(doc.rows) do by[r.name] = r end
    for _, name in ipairs({"small_ops", "small_ops_grad", "startup"}) do
      local r = assert(by[name], name)
      assert.is_true(r.needle_ms > 0, name)
      assert.is_true(r.needle_rss_mb > 0, name)
      assert.is_nil(r.ref_ms)   -- no PyTorch: no reference, no ratio
      assert.is_nil(r.ratio)
      assert.is_number(r.target)
    end
    assert.are.equal(2, by.small_ops.issue)
    assert.are.equal(8, by.startup.issue)

    local lines = {}
    for line in io.lines(d .. "/bench.csv") do lines[#lines + 1] = line end
    assert.are.equal(4, #lines)
    assert.is_truthy(lines[1]:match("^name,workload,issue,metric,ref,needle_ms,ref_ms,ratio,ratio_min,ratio_max,rounds,target,met"),
                     lines[1])
    assert.is_truthy(lines[2]:match("^small_ops,small_ops,2,ms,PyTorch,[%d%.e%-]+,,"), lines[2])

    local svg = assert(S.read_file(d .. "/ratios.svg"))
    assert.is_truthy(svg:match("^<svg"))
    assert.is_truthy(svg:find(">small_ops_grad<", 1, true))
    assert.is_truthy(svg:find("</svg>", 1, true))
    rmdir(d)
  end)

  it("reports the median of the rounds' own ratios, each round a needle and a reference process", function()
    -- a stand-in for python3 whose "torch" answers 0.001, 100, then 2 ms
    -- in successive runs: the ratio of the medians would differ from the
    -- median of the per-round ratios that run.lua must report
    local d = tmpdir()
    local fake = fake_python(d, [[
n=$(cat "$(dirname "$0")/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$(dirname "$0")/count"
case $n in 1) echo "ms 0.001";; 2) echo "ms 100";; *) echo "ms 2";; esac
echo "rss_mb 5"
]])
    local ok, out = run("--only small_ops --rounds 3 --reps 1 --warmup 0 --python " .. S.q(fake) ..
                        " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("3 rounds", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/bench.json")))
    assert.are.equal(3, doc.meta.rounds)
    assert.are.equal("9.9-fake", doc.meta.torch)
    local r = doc.rows[1]
    assert.are.equal(3, r.rounds)
    assert.are.equal(3, #r.per_round)
    local refs, ratios = {}, {}
    for i, p in ipairs(r.per_round) do
      assert.is_true(p.needle > 0)
      refs[i] = p.ref
      ratios[i] = p.needle / p.ref
    end
    assert.are.same({0.001, 100, 2}, refs)
    table.sort(ratios)
    assert.is_true(math.abs(r.ratio - ratios[2]) <= 1e-6 * ratios[2], ("%g vs %g"):format(r.ratio, ratios[2]))
    assert.is_true(math.abs(r.ratio_min - ratios[1]) <= 1e-6 * ratios[1])
    assert.is_true(math.abs(r.ratio_max - ratios[3]) <= 1e-6 * ratios[3])
    assert.are.equal(2, r.ref_ms) -- the median of the reference's times
    assert.are.equal(r.ratio <= 0.3, r.met)
    rmdir(d)
  end)

  it("--scaling runs each workload at each thread count and reports speed-ups over the first", function()
    -- a stand-in for python3 whose "torch" takes 8 / OMP_NUM_THREADS ms:
    -- exactly 2x faster at 2 threads
    local d = tmpdir()
    local fake = fake_python(d, [[echo "ms $((8 / OMP_NUM_THREADS))"
]])
    local ok, out = run("--only small_ops,startup --scaling 1,2 --reps 1 --warmup 0 --python " .. S.q(fake) ..
                        " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("thread scaling", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/scaling.json")))
    assert.are.same({1, 2}, doc.counts)
    assert.are.equal(1, #doc.rows) -- start-up is not a thread workload
    local r = doc.rows[1]
    assert.are.equal("small_ops", r.workload)
    assert.are.equal(2, #r.points)
    assert.are.same({1, 2}, {r.points[1].threads, r.points[2].threads})
    assert.are.same({8, 4}, {r.points[1].torch_ms, r.points[2].torch_ms})
    assert.are.same({1, 2}, {r.points[1].torch_speedup, r.points[2].torch_speedup})
    for _, p in ipairs(r.points) do
      assert.is_true(p.needle_ms > 0)
      assert.is_true(math.abs(p.needle_speedup - r.points[1].needle_ms / p.needle_ms) < 1e-9)
      assert.is_true(math.abs(p.ratio - p.needle_ms / p.torch_ms) < 1e-9)
    end
    local svg = assert(S.read_file(d .. "/scaling.svg"))
    assert.is_truthy(svg:match("^<svg"))
    assert.is_truthy(svg:find(">small_ops<", 1, true))
    assert.is_falsy(io.open(d .. "/bench.json")) -- the ratio table is not made
    ok, out = run("--scaling 1,0 --no-torch")
    assert.is_false(ok)
    assert.is_truthy(out:find("--scaling takes thread counts >= 1", 1, true), out)
    rmdir(d)
  end)

  it("selects workloads by issue number", function()
    local d = tmpdir()
    local ok, out = run("--only 2 --reps 1 --warmup 0 --no-torch --out " .. S.q(d))
    assert.is_true(ok, out)
    local doc = json.decode(assert(S.read_file(d .. "/bench.json")))
    assert.are.equal(2, #doc.rows)
    assert.are.equal("small_ops", doc.rows[1].name)
    assert.are.equal("small_ops_grad", doc.rows[2].name)
    rmdir(d)
  end)

  it("refuses an unknown workload or option", function()
    local ok, out, code = run("--rounds 0 --no-torch")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("--rounds must be an integer >= 1", 1, true), out)
    ok, out, code = run("--only no_such_workload --no-torch")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("unknown workload 'no_such_workload'", 1, true), out)
    ok, out, code = run("--bogus")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("unknown option '--bogus'", 1, true), out)
  end)

  it("lists the workloads, the same ones torch_ref.py defines", function()
    local ok, out = run("--list")
    assert.is_true(ok, out)
    local listed = {}
    for name in ("\n" .. out):gmatch("\n  (%S+)%s+%d") do listed[name] = true end
    local py = assert(S.read_file(root .. "/scripts/bench/torch_ref.py"))
    local block = assert(py:match("WORKLOADS = {(.-)\n}"))
    local n = 0
    for name in block:gmatch('\n    "([%w_]+)":') do
      n = n + 1
      assert.is_true(listed[name] == true, "torch_ref.py's " .. name .. " is not in workloads.lua")
      listed[name] = nil
    end
    assert.is_true(n >= 10)
    -- what is left is what only run.lua measures (start-up launches processes)
    assert.are.same({startup = true}, listed)
  end)
end)

-- scripts/bench/busy_core.lua: the threads benchmark with other processes
-- keeping cores busy (issue 18); only that it runs and fills every cell.
describe("scripts/bench/busy_core.lua", function()
  local busy = H.runner("bench/busy_core")

  it("times each mode on the quiet machine and with a core busy, and writes JSON", function()
    local d = tmpdir()
    local ok, out = busy("--only small_ops --rounds 1 --reps 1 --threads 2 --out " .. S.q(d))
    assert.is_true(ok, out)
    local doc = json.decode(assert(S.read_file(d .. "/busy_core.json")))
    assert.are.equal(2, doc.threads)
    assert.are.equal(1, #doc.rows)
    local r = doc.rows[1]
    for _, mode in ipairs({"fixed", "one", "adaptive"}) do
      for _, cond in ipairs({"quiet", "busy"}) do
        assert.is_true(r[mode .. "_" .. cond] > 0, mode .. " " .. cond)
        assert.are.equal(1, #r[mode .. "_" .. cond .. "_rounds"])
      end
    end
    assert.is_true(math.abs(r.adaptive_cost_quiet - r.adaptive_quiet / r.fixed_quiet) < 1e-9)
    assert.is_true(math.abs(r.adaptive_vs_one_busy - r.adaptive_busy / r.one_busy) < 1e-9)
    rmdir(d)
  end)

  it("refuses a workload that is not timed, and unknown options", function()
    local ok, out = busy("--only startup")
    assert.is_false(ok)
    assert.is_truthy(out:find("'startup' is not a timed workload", 1, true), out)
    ok, out = busy("--rounds 0")
    assert.is_false(ok)
    assert.is_truthy(out:find("--rounds must be an integer >= 1", 1, true), out)
    ok, out = busy("--bogus 1")
    assert.is_false(ok)
    assert.is_truthy(out:find("unknown option '--bogus'", 1, true), out)
  end)
end)

describe("scripts/bench/conv_paths.lua", function()
  local run_paths = H.runner("bench/conv_paths")

  it("times each convolution product of a model on both paths and as chosen (no PyTorch)", function()
    local ok, out = run_paths("--model resnet9 --batch 2 --reps 1 --no-torch")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("conv_paths: resnet9 at 32x32, batch 2", 1, true), out)
    -- ResNet9's six distinct convolutions, each with three numbers per column
    local rows = 0
    for line in out:gmatch("[^\n]+") do
      if line:match("^%d+,%d+,%d+,%d+,%d+,%d+%s+%d+") then
        rows = rows + 1
        local n = 0
        for _ in line:gmatch("%s%-?%d+%.%d%d") do n = n + 1 end
        assert.are.equal(9, n, line) -- packed, GEMM and chosen: fwd, grad x, grad w
      end
    end
    assert.are.equal(6, rows, out)
    for _, col in ipairs({"packed", "GEMM", "chosen"}) do
      assert.is_truthy(out:find("total " .. col .. "%s+fwd%s+[%d.]+%s+grad x"), col .. "\n" .. out)
    end
    assert.is_nil(out:find("PyTorch", 1, true), out)
  end)

  it("refuses an unknown model or option, naming it", function()
    local ok, out = run_paths("--model vgg")
    assert.is_false(ok)
    assert.is_truthy(out:find("--model takes resnet50, mobilenet_v2 or resnet9", 1, true), out)
    ok, out = run_paths("--modle resnet9")
    assert.is_false(ok)
    assert.is_truthy(out:find("unknown option '--modle'", 1, true), out)
  end)
end)

-- scripts/bench/matmul_sweep.lua's PyTorch side (issue 22, item 5): the same sizes and
-- layouts through scripts/bench/matmul_sweep_torch.py, here a stand-in whose times are
-- known, so the needle / PyTorch ratios can be checked against needle's own numbers.
describe("scripts/bench/matmul_sweep.lua against PyTorch", function()
  local sweep = H.runner("bench/matmul_sweep")

  it("runs PyTorch's products in the same run, in the table, the JSON and the ratios", function()
    local d = tmpdir()
    local fake = fake_python(d, [[
echo "torch 9.9-fake"; echo "device $4"
echo "$5 $6" > "$(dirname "$0")/torch_args"
echo "nn:8x8x8 0.5"; echo "nt:8x8x8 0.25"; echo "nn:16x4x32 2"; echo "nt:16x4x32 4"
]])
    local ok, out = sweep("--sizes 8,16x4x32 --layouts nn,nt --devices cpu --reps 1 --python " .. S.q(fake) ..
                          " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.are.equal("nn,nt 8x8x8,16x4x32\n", S.read_file(d .. "/torch_args"))
    assert.is_truthy(out:find("torch cpu: PyTorch 9.9-fake", 1, true), out)
    assert.is_truthy(out:find("needle / torch", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/matmul_sweep.json")))
    assert.are.equal("9.9-fake", doc.meta.torch)
    local mine, theirs = {}, {}
    for _, r in ipairs(doc.results) do
      local key = r.layout .. ":" .. r.size
      if r.device == "torch cpu" then theirs[key] = r else mine[key] = r end
    end
    assert.are.equal(0.5, theirs["nn:8"].ms)
    assert.are.equal(4, theirs["nt:16x4x32"].ms)
    for _, key in ipairs({"nn:8", "nt:8", "nn:16x4x32", "nt:16x4x32"}) do
      assert.is_true(mine[key].ms > 0, key)
      assert.is_true(math.abs(mine[key].vs_torch - mine[key].ms / theirs[key].ms) < 1e-9, key)
    end
    assert.is_truthy(S.read_file(d .. "/matmul_sweep.csv"):find('torch cpu,"PyTorch 9.9-fake",nt,16,4,32,', 1, true))
    rmdir(d)
  end)

  it("says PyTorch was not run without torch, and runs needle only with --no-torch", function()
    local d = tmpdir()
    local nopy = fake_python(d, "exit 1\n")
    local ok, out = sweep("--sizes 8 --devices cpu --reps 1 --python " .. S.q(nopy) .. " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("PyTorch: not run", 1, true), out)
    assert.are.equal("missing", json.decode(assert(S.read_file(d .. "/matmul_sweep.json"))).meta.torch)
    ok, out = sweep("--sizes 8 --devices cpu --reps 1 --no-torch --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_falsy(out:find("torch", 1, true), out)
    assert.are.equal("not run", json.decode(assert(S.read_file(d .. "/matmul_sweep.json"))).meta.torch)
    rmdir(d)
  end)
end)
