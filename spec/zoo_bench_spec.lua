-- zoo_bench_spec.lua - scripts/bench/zoo.lua (issue 21, item 5) run as a user
-- runs it, at --quick sizes: it exits 0, writes results.json, results.csv and
-- zoo.svg with a row per (model, task), and its ratios come from both sides'
-- numbers. The ratio arithmetic is checked against a stand-in for PyTorch's
-- Python whose throughputs are known; the real PyTorch run (when Debian's
-- python3-torch and python3-torchvision are there, else pending) checks that
-- the reference side ran and produced its own numbers. No timing thresholds.
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local json = require("needle.checkpoint").json

local run, tmpdir, rmdir = H.runner("bench/zoo"), H.tmpdir, H.rmdir

local fake_python = H.fake_python

local function close(a, b, rel) return math.abs(a - b) <= (rel or 1e-9) * math.abs(b) end

local function rows_by_name(doc)
  local by = {}
  for _, r in ipairs(doc.rows) do by[r.name] = r end
  return by
end

local function has_torch()
  local ok = os.execute("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1")
  return ok == true or ok == 0
end

describe("scripts/bench/zoo.lua", function()
  it("reports the median of the rounds' needle / PyTorch throughput ratios", function()
    -- the stand-in's "PyTorch" takes 1000, then 10, then 100 ms per iteration
    -- of 2 items (counted per model and task): 2, 200 and 20 items/s
    local d = tmpdir()
    local fake = fake_python(d, [[
f="$(dirname "$0")/count_$2_$3"; n=$(cat "$f" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$f"
echo "${OMP_WAIT_POLICY:-unset}" > "$(dirname "$0")/wait_$2"
case $n in 1) echo "ms 1000";; 2) echo "ms 10";; *) echo "ms 100";; esac
echo "items 2"
]])
    local ok, out = run("--quick --models distilbert,gpt2 --rounds 3 --python " .. S.q(fake) .. " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("PyTorch 9.9-fake", 1, true), out)
    assert.is_truthy(out:find("load before:", 1, true), out)
    assert.is_truthy(out:find("load after:", 1, true), out)
    assert.is_truthy(out:find("kernels: needle", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.are.equal("9.9-fake", doc.meta.torch)
    assert.are.equal(3, doc.meta.rounds)
    local names = {}
    for i, r in ipairs(doc.rows) do names[i] = r.name end
    assert.are.same({"distilbert_infer", "distilbert_train", "gpt2_gen_kv", "gpt2_step_kv", "gpt2_full"}, names)
    for _, r in ipairs(doc.rows) do
      assert.are.equal(3, r.rounds, r.name)
      local torch, ratios = {}, {}
      for i, p in ipairs(r.per_round) do
        assert.is_true(p.needle > 0, r.name)
        -- needle's throughput is its own items over its own median time
        assert.is_true(close(p.needle, r.items / (p.needle_ms / 1e3), 1e-6), r.name)
        torch[i] = p.torch
        ratios[i] = p.needle / p.torch
      end
      assert.is_true(close(torch[1], 2) and close(torch[2], 200) and close(torch[3], 20), r.name)
      assert.is_true(close(r.torch, 20), r.name) -- the median of the reference's throughputs
      table.sort(ratios)
      assert.is_true(close(r.ratio, ratios[2]), ("%s: %g vs %g"):format(r.name, r.ratio, ratios[2]))
      assert.is_true(close(r.ratio_min, ratios[1]) and close(r.ratio_max, ratios[3]), r.name)
      if r.target then assert.are.equal(r.ratio >= r.target, r.met) end
    end
    -- PyTorch's BERT and GPT-2 processes run with a passive OpenMP wait
    -- policy (zoo.lua: its libgomp pool otherwise spins against OpenBLAS)
    assert.are.equal("PASSIVE\n", S.read_file(d .. "/wait_distilbert"))
    assert.are.equal("PASSIVE\n", S.read_file(d .. "/wait_gpt2"))
    -- the cache speed-up at the stated context is each side's step_kv over full
    local by = rows_by_name(doc)
    local sp = doc.gpt2_cache_speedup
    assert.are.equal(32, sp.context)
    assert.is_true(close(sp.needle, by.gpt2_step_kv.needle / by.gpt2_full.needle))
    assert.is_true(close(sp.torch, 1))  -- the stand-in answers alike for both
    local lines = {}
    for line in io.lines(d .. "/results.csv") do lines[#lines + 1] = line end
    assert.are.equal(6, #lines)
    assert.is_truthy(lines[1]:match("^name,model,task,unit,items,needle,torch,ratio,ratio_min,ratio_max,rounds,target,met"),
                     lines[1])
    assert.is_truthy(lines[2]:match("^distilbert_infer,distilbert,infer,seq/s,2,[%d%.e%+%-]+,20,[%d%.e%+%-]+,"), lines[2])
    local svg = assert(S.read_file(d .. "/zoo.svg"))
    assert.is_truthy(svg:match("^<svg"))
    assert.is_truthy(svg:find(">gpt2_gen_kv<", 1, true))
    assert.is_truthy(svg:find(("%.2fx"):format(by.gpt2_full.ratio), 1, true))
    assert.is_truthy(svg:find("</svg>", 1, true))
    rmdir(d)
  end)

  it("leaves the CNNs' wait policy to the environment unless --torch-wait says", function()
    local d = tmpdir()
    local fake = fake_python(d, [[
echo "${OMP_WAIT_POLICY:-unset}" > "$(dirname "$0")/wait_$2_$3"
echo "ms 10"; echo "items 2"
]])
    local base = "--quick --models mobilenet_v2 --reps 1 --warmup 0 --python " .. S.q(fake) .. " --out " .. S.q(d)
    local ok, out = run(base)
    assert.is_true(ok, out)
    assert.are.equal((os.getenv("OMP_WAIT_POLICY") or "unset") .. "\n", S.read_file(d .. "/wait_mobilenet_v2_infer"))
    ok, out = run(base .. " --torch-wait passive")
    assert.is_true(ok, out)
    assert.are.equal("PASSIVE\n", S.read_file(d .. "/wait_mobilenet_v2_train"))
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.are.equal("passive", doc.rows[1].torch_wait)
    rmdir(d)
  end)

  it("--bf16 asks both sides for bfloat16 products and says so", function()
    local d = tmpdir()
    local fake = fake_python(d, [[
for a in "$@"; do case $a in bf16=*) echo "$a" > "$(dirname "$0")/torch_bf16";; esac; done
echo "ms 10"; echo "items 2"
]])
    local ok, out = run("--quick --bf16 --models distilbert --reps 1 --warmup 0 --python " .. S.q(fake) ..
                        " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.are.equal("bf16=1\n", S.read_file(d .. "/torch_bf16"))
    assert.is_truthy(out:find("precision: bfloat16 products on both sides", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.is_truthy(doc.meta.precision:find("bfloat16", 1, true))
    for _, r in ipairs(doc.rows) do assert.is_true(r.needle > 0, r.name) end
    rmdir(d)
  end)

  it("--compile times needle's forward and training step through nd.compile, as replays", function()
    local d = tmpdir()
    local fake = fake_python(d, [[
for a in "$@"; do case $a in compile=*) echo "$a" > "$(dirname "$0")/torch_compile";; esac; done
echo "ms 10"; echo "items 2"
]])
    local ok, out = run("--quick --compile --models mobilenet_v2,distilbert --reps 2 --warmup 0 --python " ..
                        S.q(fake) .. " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("needle compiled: nd.compile", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.is_true(doc.meta.needle_compiled)
    assert.are.equal(4, #doc.rows)
    for _, r in ipairs(doc.rows) do assert.is_true(r.needle > 0, r.name) end
    rmdir(d)
    -- the worker itself: with compile=1 every timed call is a replay (3 warm-up calls:
    -- eager, capture, first replay), without it there are none
    local exe, root = S.needle_lua()
    local function capture(cmd)
      local p = assert(io.popen(cmd .. " 2>&1"))
      local text = p:read("a")
      p:close()
      return text
    end
    for _, task in ipairs({"infer", "train"}) do
      local cmd = ("%s %s mobilenet_v2 %s batch=2 size=32 threads=1 reps=2 warmup=0 compile=1"):format(
        S.q(exe), S.q(root .. "/scripts/bench/zoo_worker.lua"), task)
      local text = capture(cmd)
      assert.is_truthy(text:find("replays 3\n"), task .. ": " .. text)
      text = capture((cmd:gsub(" compile=1", "")))
      assert.is_truthy(text:find("ms %d"), task .. ": " .. text)
      assert.is_falsy(text:find("replays"), task .. ": " .. text)
    end
  end)

  it("--device runs needle's side there and asks PyTorch's for --torch-device (cuda by default)", function()
    local D = require "spec.helpers.devices"
    local dev = D.opencl()[1]
    if not dev then return pending("no OpenCL device here") end
    local d = tmpdir()
    local fake = fake_python(d, [[
for a in "$@"; do case $a in device=*) echo "$a" > "$(dirname "$0")/torch_device";; esac; done
echo "ms 10"; echo "items 2"; echo "device cuda:0"
]])
    local ok, out = run("--quick --models distilbert --reps 1 --warmup 0 --device " .. dev .. " --python " ..
                        S.q(fake) .. " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("devices: needle " .. dev .. ", PyTorch cuda", 1, true), out)
    assert.are.equal("device=cuda\n", S.read_file(d .. "/torch_device"))
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.are.equal(dev, doc.meta.device)
    assert.are.equal("cuda", doc.meta.torch_device)
    for _, r in ipairs(doc.rows) do assert.is_true(r.needle > 0 and r.ratio > 0, r.name) end
    -- a side that ran somewhere else is an error, not a GPU figure
    local liar = fake_python(d, [[echo "ms 10"; echo "items 2"; echo "device cpu"]])
    ok, out = run("--quick --models distilbert --reps 1 --warmup 0 --device " .. dev .. " --python " ..
                  S.q(liar) .. " --out " .. S.q(d))
    assert.is_false(ok)
    assert.is_truthy(out:find("PyTorch's distilbert_infer process ran on cpu, not cuda", 1, true), out)
    ok, out = run("--quick --models distilbert --device opencl:99 --no-torch --out " .. S.q(d))
    assert.is_false(ok)
    assert.is_truthy(out:find("--device opencl:99:", 1, true), out)
    rmdir(d)
  end)

  it("marks the PyTorch column missing, not faked, when the Python has no torch", function()
    local d = tmpdir()
    local nopy = d .. "/python3"
    S.write_file(nopy, "#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    os.execute("chmod +x " .. S.q(nopy))
    local ok, out = run("--quick --models gpt2 --python " .. S.q(nopy) .. " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("PyTorch MISSING", 1, true), out)
    assert.is_truthy(out:find("cannot import torch and torchvision", 1, true), out)
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.are.equal("missing", doc.meta.torch)
    for _, r in ipairs(doc.rows) do
      assert.is_true(r.torch_missing, r.name)
      assert.is_nil(r.torch)
      assert.is_nil(r.ratio)
      assert.is_nil(r.met)
      assert.is_true(r.needle > 0, r.name)
    end
    for line in io.lines(d .. "/results.csv") do
      if not line:match("^name,") then assert.is_truthy(line:match("^gpt2_[%w_]+,gpt2,[%w_]+,tokens/s,%d+,[^,]+,missing,,"), line) end
    end
    assert.is_truthy(S.read_file(d .. "/zoo.svg"):find("PyTorch missing", 1, true))
    rmdir(d)
  end)

  it("runs the real models against Debian's PyTorch in the same run", function()
    if not has_torch() then
      pending("/usr/bin/python3 cannot import torch and torchvision (python3-torch, python3-torchvision): no PyTorch side")
      return
    end
    local d = tmpdir()
    local ok, out = run("--quick --models mobilenet_v2,bert_latency,gpt2 --rounds 1 --out " .. S.q(d))
    assert.is_true(ok, out)
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.is_truthy(tostring(doc.meta.torch):match("^%d+%.%d+"), doc.meta.torch)
    assert.is_truthy(doc.meta.torch_kernels, out)
    local by = rows_by_name(doc)
    for _, name in ipairs({"mobilenet_v2_infer", "mobilenet_v2_train", "bert_latency_b1", "gpt2_gen_kv",
                           "gpt2_step_kv", "gpt2_full"}) do
      local r = assert(by[name], name)
      local p = r.per_round[1]
      -- both sides measured, each from its own process's time
      assert.is_true(p.needle > 0 and p.torch > 0, name)
      assert.is_true(close(p.torch, r.items / (p.torch_ms / 1e3), 1e-6), name)
      assert.is_true(close(r.ratio, p.needle / p.torch), name)
      assert.is_nil(r.torch_missing)
    end
    assert.is_true(by.bert_latency_b1.latency)
    assert.are.equal(1.25, by.bert_latency_b1.target)
    assert.is_truthy(out:find("median ms per batch-1 sequence", 1, true), out)
    assert.is_truthy(out:find("KV-cache speed-up per token at 32 tokens", 1, true), out)
    rmdir(d)
  end)

  it("times ResNeXt-50 only when named, as a CNN (the environment's wait policy)", function()
    local d = tmpdir()
    local fake = fake_python(d, [[
echo "${OMP_WAIT_POLICY:-unset}" > "$(dirname "$0")/wait_$2_$3"
echo "ms 10"; echo "items 2"
]])
    local ok, out = run("--quick --models resnext50_32x4d --reps 1 --warmup 0 --python " .. S.q(fake) ..
                        " --out " .. S.q(d))
    assert.is_true(ok, out)
    assert.are.equal((os.getenv("OMP_WAIT_POLICY") or "unset") .. "\n", S.read_file(d .. "/wait_resnext50_32x4d_infer"))
    local doc = json.decode(assert(S.read_file(d .. "/results.json")))
    assert.are.same({"resnext50_32x4d_infer", "resnext50_32x4d_train"}, {doc.rows[1].name, doc.rows[2].name})
    local Z = dofile("scripts/bench/zoo_tasks.lua")
    assert.is_true(Z.optional.resnext50_32x4d and Z.optional.bert_large)
    rmdir(d)
  end)

  it("refuses an unknown model or a bad batch", function()
    local ok, out, code = run("--models resnet51 --no-torch")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("unknown model 'resnet51' (one of resnet50,", 1, true), out)
    ok, out = run("--batch 0 --no-torch")
    assert.is_false(ok)
    assert.is_truthy(out:find("--batch must be an integer >= 1", 1, true), out)
    ok, out = run("--batch x --no-torch")
    assert.is_false(ok)
    assert.is_truthy(out:find("--batch takes N or I,T", 1, true), out)
    ok, out = run("--torch-wait spin --no-torch")
    assert.is_false(ok)
    assert.is_truthy(out:find("--torch-wait takes auto, active or passive", 1, true), out)
  end)
end)
