-- scripts/bench/zoo.lua: the seeds' real-model tables (issue 21, item 5),
-- needle against PyTorch in the same run: ResNet-50 and MobileNetV2 inference
-- and training images/s at 224x224, DistilBERT and BERT-base (BERT-large
-- with --large) inference and training sequences/s at sequence 128, BERT-base
-- batch 1 sequence 128 latency, GPT-2 124M generation tokens/s with the
-- key/value cache, and one token's cost with and without it at a stated
-- context.
--
--   build/needle-lua scripts/bench/zoo.lua [--models LIST] [--rounds N] [--reps N]
--        [--batch I[,T]] [--text-batch I[,T]] [--threads N] [--large] [--quick]
--        [--device DEV] [--torch-device DEV] [--python PATH]
--        [--torch-wait auto|active|passive] [--no-torch] [--bf16] [--compile] [--out DIR]
--
-- Each (model, task) runs in rounds, as scripts/bench/run.lua's workloads: a
-- round starts needle's process (scripts/bench/zoo_worker.lua) and PyTorch's
-- (scripts/bench/zoo_torch.py: torchvision's models, and for BERT/GPT-2 the
-- Hugging Face-structured reference of spec/fixtures/gen/) back to back,
-- alternating which goes first, at the same thread count; the reported ratio
-- is the median over rounds of that round's needle / PyTorch throughput, so
-- the machine's drift between rounds cancels. Writes OUT/results.csv,
-- OUT/results.json and OUT/zoo.svg. See docs/benchmarks.md, "Real models".
local nd = require "needle"
local json = require("needle.checkpoint").json

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local Z = dofile(here .. "/zoo_tasks.lua")

local usage = [[
usage: needle-lua scripts/bench/zoo.lua [options]

needle's nd.nn.models against PyTorch (Debian's python3-torch/torchvision at
/usr/bin/python3) on the seeds' real-model workloads; throughput ratios.

options:
  --models LIST      comma-separated: resnet50,mobilenet_v2,distilbert,bert,bert_latency,
                     gpt2 (default: all of them), bert_large (only when named or --large) and
                     resnext50_32x4d (only when named)
  --large            add BERT-large (slow on a small machine)
  --rounds N         rounds per row (default 3; --quick: 1)
  --reps N           timed iterations per process (default: each row's own)
  --warmup N         untimed iterations first (default: each row's own)
  --batch I[,T]      CNN batch for inference and training (default 8,4)
  --text-batch I[,T] BERT/DistilBERT batch for inference and training (default 8,4)
  --threads N        threads of both sides (default 2)
  --device DEV       needle's device for models and inputs (default cpu; e.g. opencl:0);
                     off the CPU every timed call ends with nd.synchronize()
  --torch-device DEV PyTorch's device (default: cpu with --device cpu, else cuda)
  --quick            tiny settings (64x64 images, 2-layer BERTs, a small GPT-2), for a spec
  --python PATH      the Python whose torch is the reference (default /usr/bin/python3)
  --torch-wait P     OMP_WAIT_POLICY of PyTorch's process: auto (default: PASSIVE for the
                     BERT and GPT-2 rows, the environment's for the CNNs), active or passive
  --no-torch         needle only (the PyTorch column is marked missing)
  --bf16             both sides in mixed precision: needle's float32 products on bfloat16
                     (nd.set_float32_matmul_precision("medium"): AMX tiles or AVX512_BF16), PyTorch's
                     torch.autocast("cpu", dtype=torch.bfloat16) around each iteration
  --compile          needle's side through nd.compile: the model's forward for inference,
                     the whole step (zero_grad, forward, loss, backward, SGD step) for
                     training, captured in the warm-up calls; PyTorch's side stays eager
                     (the GPT-2 rows, whose generate loop reads tokens on the host, stay eager)
  --out DIR          results.csv, results.json and zoo.svg go here (default runs/zoo)
]]

local function die(msg)
  io.stderr:write("zoo.lua: ", msg, "\n")
  os.exit(2)
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- options ----------------------------------------------------------------------------
local opts = {threads = 2, out = "runs/zoo", batch = {8, 4}, text_batch = {8, 4}}
do
  local i = 1
  local function value(name)
    i = i + 1
    if arg[i] == nil then die(name .. " needs a value") end
    return arg[i]
  end
  local function count(name, min, v)
    v = math.tointeger(tonumber(v or value(name)))
    if not v or v < min then die(("%s must be an integer >= %d"):format(name, min)) end
    return v
  end
  local function pair(name)
    local s = value(name)
    local a, b = s:match("^(%d+),(%d+)$")
    if not a then a = s:match("^(%d+)$"); b = a end
    if not a then die(name .. " takes N or I,T (inference and training batch), e.g. 8,4") end
    return {count(name, 1, a), count(name, 1, b)}
  end
  while i <= #arg do
    local a = arg[i]
    if a == "--models" then opts.models = value(a)
    elseif a == "--rounds" then opts.rounds = count(a, 1)
    elseif a == "--reps" then opts.reps = count(a, 1)
    elseif a == "--warmup" then opts.warmup = count(a, 0)
    elseif a == "--batch" then opts.batch, opts.batch_set = pair(a), true
    elseif a == "--text-batch" then opts.text_batch, opts.text_batch_set = pair(a), true
    elseif a == "--threads" then opts.threads = count(a, 1)
    elseif a == "--device" then opts.device = value(a)
    elseif a == "--torch-device" then opts.torch_device = value(a)
    elseif a == "--large" then opts.large = true
    elseif a == "--quick" then opts.quick = true
    elseif a == "--python" then C.python = q(value(a))
    elseif a == "--no-torch" then opts.no_torch = true
    elseif a == "--bf16" then opts.bf16 = true
    elseif a == "--compile" then opts.compile = true
    elseif a == "--torch-wait" then
      opts.torch_wait = value(a)
      if not ({auto = 1, active = 1, passive = 1})[opts.torch_wait] then
        die("--torch-wait takes auto, active or passive")
      end
    elseif a == "--out" then opts.out = value(a)
    elseif a == "-h" or a == "--help" then io.write(usage); os.exit(0)
    else die(("unknown option '%s' (see --help)"):format(a)) end
    i = i + 1
  end
end
if opts.quick and not opts.batch_set then opts.batch = {2, 2} end
opts.device = opts.device or "cpu"
do -- the device must exist here (its name as nd.devices() gives it), before any round
  local ok, err = pcall(function() return nd.zeros({1}, {device = opts.device}) end)
  if not ok then die(("--device %s: %s"):format(opts.device, tostring(err))) end
end
opts.torch_device = opts.torch_device or (opts.device == "cpu" and "cpu" or "cuda")
for _, d in ipairs({opts.device, opts.torch_device}) do
  if not d:match("^[%w:]+$") then die(("a device is a name like cpu, opencl:0 or cuda:0, got '%s'"):format(d)) end
end
if opts.quick and not opts.text_batch_set then opts.text_batch = {2, 2} end

local want
if opts.models then
  want = {}
  for item in opts.models:gmatch("[^,%s]+") do
    if not Z.groups[item] then
      die(("unknown model '%s' (one of %s)"):format(item, table.concat(Z.group_names, ", ")))
    end
    want[item] = true
  end
else
  want = {}
  for _, g in ipairs(Z.group_names) do want[g] = not Z.optional[g] end
end
if opts.large then want.bert_large = true end
local rows_spec = Z.rows({quick = opts.quick, batch = opts.batch, text_batch = opts.text_batch, want = want})

-- processes ----------------------------------------------------------------------------
local exe = arg[-1] or "needle-lua"
local env = ("OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d "):format(opts.threads, opts.threads)
-- Debian's torch runs its GEMMs in the pthread OpenBLAS (libblas.so.3) from
-- inside its libgomp pool, whose spinning threads then compete with
-- OpenBLAS's for the same cores: a BERT-base batch-1 forward took 532 ms
-- with the default wait policy and 182 ms with OMP_WAIT_POLICY=PASSIVE here.
-- oneDNN's convolutions are a little faster spinning. "auto" gives each row
-- PyTorch's faster setting (zoo_tasks.lua's torch_wait).
local function torch_env(r)
  local w = opts.torch_wait or "auto"
  if w == "auto" then w = r.torch_wait end
  return env .. (w and ("OMP_WAIT_POLICY=%s "):format(w:upper()) or "")
end

local shell_out = C.shell_out

local function run_child(label, cmd) return C.run_child("zoo.lua", label, cmd) end

-- the reference needs torch and torchvision; its version and kernels go into
-- the results (Debian's torch: oneDNN for convolutions, the system BLAS)
local torch_version, torch_kernels
if not opts.no_torch then
  local info = shell_out(C.python .. " -c " .. q([[
import os, re, torch, torchvision
print(torch.__version__)
s = torch.__config__.show()
cap = re.search(r"CPU capability usage: (\w+)", s)
blas = re.search(r"BLAS_INFO=(\w+)", s)
dnn = re.search(r"MKL-DNN (v[\d.]+)", s)
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l and "/" in l})
print("CPU capability %s, BLAS_INFO=%s (loaded: %s), oneDNN %s" % (cap and cap.group(1), blas and blas.group(1),
      " ".join(os.path.realpath(x) for x in libs) or "?", dnn and dnn.group(1)))
]]) .. " 2>/dev/null")
  torch_version = info:match("^(%S+)")
  torch_kernels = info:match("\n([^\n]+)")
end
local have_torch = torch_version ~= nil
-- needle's BLAS: the libopenblas needle-lua loads (its own GEMM kernels are
-- chosen from cpuid; OPENBLAS_CORETYPE, set or not, is the environment's)
local needle_blas = shell_out("ldd " .. q(exe) .. " 2>/dev/null"):match("libopenblas[^%s]*%s*=>%s*(%S+)")

local function uptime() return (shell_out("uptime 2>/dev/null"):gsub("^%s+", ""):gsub("%s+$", "")) end

-- one round of row r: needle's process and PyTorch's, in the given order
local function measure_round(r, torch_first)
  local args = {}
  for _, k in ipairs(r.keys) do args[#args + 1] = ("%s=%s"):format(k, r.cfg[k]) end
  args[#args + 1] = ("threads=%d reps=%d warmup=%d"):format(opts.threads, opts.reps or r.reps,
                                                            opts.warmup or r.warmup)
  if opts.bf16 then args[#args + 1] = "bf16=1" end
  if opts.compile then args[#args + 1] = "compile=1" end
  local tail = ("%s %s %s"):format(r.model, r.task, table.concat(args, " "))
  local mine, theirs = {}, {}
  local function run_mine()
    mine = run_child(r.name .. " (needle)", ("%s%s %s %s device=%s"):format(env, q(exe), q(here .. "/zoo_worker.lua"),
                                                                         tail, opts.device))
  end
  local function run_theirs()
    if have_torch then
      theirs = run_child(r.name .. " (PyTorch)", ("%s%s %s %s device=%s"):format(torch_env(r), C.python,
                                                                             q(here .. "/zoo_torch.py"), tail, opts.torch_device))
    end
  end
  if torch_first then run_theirs(); run_mine() else run_mine(); run_theirs() end
  -- each side says where it ran: a worker that ignored the device must not pass as a GPU figure
  for _, s in ipairs({{mine, opts.device, "needle"}, {theirs, opts.torch_device, "PyTorch"}}) do
    local said = s[1].text and s[1].text.device
    if s[1].ms and said and said ~= s[2] and not (s[2] == "cuda" and said:match("^cuda")) then
      die(("%s's %s process ran on %s, not %s"):format(s[3], r.name, said, s[2]))
    end
  end
  return mine, theirs
end

-- items per second from a worker's "ms" and "items"
local function rate(kv) return (kv.ms and kv.items and kv.ms > 0) and kv.items / (kv.ms / 1e3) or nil end

-- rows ------------------------------------------------------------------------------------
local rounds = opts.rounds or (opts.quick and 1 or 3)
local kernels = os.getenv("OPENBLAS_CORETYPE")
local load_before = uptime()
print(("needle-lua zoo benchmark: threads %d, %d round(s), PyTorch %s%s; devices: needle %s, PyTorch %s")
  :format(opts.threads, rounds, torch_version or (opts.no_torch and "not run (--no-torch)" or "MISSING"),
          opts.quick and ", --quick" or "", opts.device, opts.torch_device))
if opts.bf16 then
  print(("precision: bfloat16 products on both sides (needle's GEMM: %s; PyTorch: torch.autocast on the CPU)")
    :format(nd.devices()[1].bf16 and (nd.devices()[1].amx and "amx_bf16 32x32" or "avx512_bf16 12x32")
            or "no AVX512_BF16 here, so float32"))
end
if opts.compile then
  print("needle compiled: nd.compile of the forward (inference) and of the whole step (training); PyTorch eager")
end
print(("kernels: needle %s, OPENBLAS_CORETYPE=%s; PyTorch %s"):format(needle_blas or "(no libopenblas in ldd)",
  kernels or "unset (OpenBLAS picks by cpuid)", torch_kernels or "-"))
print(("PyTorch's OMP_WAIT_POLICY: %s"):format(opts.torch_wait and opts.torch_wait ~= "auto" and opts.torch_wait
  or "auto (PASSIVE for the BERT and GPT-2 rows; the CNN rows as the environment sets it)"))
print("load before: " .. load_before)
local results = {}
local t_start = nd.clock()
for i, r in ipairs(rows_spec) do
  local t0 = nd.clock()
  local per_round, ratios, mine_rates, their_rates, mine_ms, their_ms = {}, {}, {}, {}, {}, {}
  for k = 1, rounds do
    local mine, theirs = measure_round(r, k % 2 == 0)
    local a, b = rate(mine), rate(theirs)
    per_round[k] = {needle = a, torch = b, needle_ms = mine.ms, torch_ms = theirs.ms,
                    needle_rss_mb = mine.rss_mb, torch_rss_mb = theirs.rss_mb}
    mine_rates[#mine_rates + 1], their_rates[#their_rates + 1] = a, b
    mine_ms[#mine_ms + 1], their_ms[#their_ms + 1] = mine.ms, theirs.ms
    if a and b then ratios[#ratios + 1] = a / b end
  end
  local res = {name = r.name, model = r.model, task = r.task, what = r.what, unit = r.unit,
               items = r.items, config = r.cfg, latency = r.latency or nil,
               needle = C.median_of(mine_rates), torch = C.median_of(their_rates),
               needle_ms = C.median_of(mine_ms), torch_ms = C.median_of(their_ms),
               rounds = #ratios, per_round = json.array(per_round), target = r.target,
               torch_missing = not have_torch or nil,
               torch_wait = (opts.torch_wait and opts.torch_wait ~= "auto") and opts.torch_wait or r.torch_wait}
  if #ratios > 0 then
    res.ratio = C.median_of(ratios)
    res.ratio_min, res.ratio_max = math.min(table.unpack(ratios)), math.max(table.unpack(ratios))
    if r.target then res.met = res.ratio >= r.target end
  end
  results[#results + 1] = res
  io.stderr:write(("[%d/%d] %-22s needle %s, PyTorch %s %s, ratio %s (%.0f s)\n"):format(i, #rows_spec, r.name,
    C.fmt(res.needle, "%.2f"), C.fmt(res.torch, "%.2f"), r.unit, C.fmt(res.ratio, "%.3f"), nd.clock() - t0))
end
local elapsed = nd.clock() - t_start
local load_after = uptime()

-- GPT-2's cache speed-up at the stated context: one token re-running the whole
-- context against one cached step, on each side (issue 21: at least 10x)
local by = {}
for _, r in ipairs(results) do by[r.name] = r end
local speedups
if by.gpt2_step_kv and by.gpt2_full then
  local s = by.gpt2_step_kv
  local function sp(side)
    local f, k = by.gpt2_full[side], s[side]
    return (f and k) and k / f or nil
  end
  speedups = {context = s.config.ctx, needle = sp("needle"), torch = sp("torch"), target = 10}
end

-- the table ------------------------------------------------------------------------------
local header = ("%-22s %-10s %12s %12s %10s %13s %7s %4s"):format("row", "unit", "needle", "PyTorch",
  "ratio", "rounds range", "target", "met")
print(header)
print(("-"):rep(#header))
for _, r in ipairs(results) do
  local torch_cell = r.torch_missing and "MISSING" or C.fmt(r.torch, "%.2f")
  print(("%-22s %-10s %12s %12s %10s %13s %7s %4s"):format(r.name, r.unit, C.fmt(r.needle, "%.2f"), torch_cell,
    r.ratio and ("%.3fx"):format(r.ratio) or "-",
    r.ratio and ("%.2f-%.2f"):format(r.ratio_min, r.ratio_max) or "-",
    r.target and (">=%.2f"):format(r.target) or "-", r.met == nil and "-" or (r.met and "yes" or "NO")))
  if r.latency then
    print(("%-22s %-10s %12s %12s   (median ms per batch-1 sequence)"):format("", "ms",
      C.fmt(r.needle_ms, "%.2f"), r.torch_missing and "MISSING" or C.fmt(r.torch_ms, "%.2f")))
  end
end
if speedups then
  print(("GPT-2 KV-cache speed-up per token at %d tokens of context (target >= 10x): needle %s, PyTorch %s")
    :format(speedups.context, C.fmt(speedups.needle, "%.1fx"), C.fmt(speedups.torch, "%.1fx")))
end
print("ratio = median over rounds of needle / PyTorch throughput (> 1: needle faster); "
  .. "the latency row's ratio is PyTorch ms / needle ms (target: needle <= 0.8x PyTorch's latency)")
if not have_torch then
  print("PyTorch: MISSING (" .. (opts.no_torch and "--no-torch" or C.python .. " cannot import torch and torchvision")
    .. "): no PyTorch column, no ratios")
end
print("load after:  " .. load_after)
print(("%.0f s"):format(elapsed))

-- files -------------------------------------------------------------------------------------
os.execute("mkdir -p " .. q(opts.out))
local function write(name, text)
  local f = assert(io.open(opts.out .. "/" .. name, "w"))
  f:write(text)
  f:close()
end
local meta = {date = os.date("!%Y-%m-%dT%H:%M:%SZ"), threads = opts.threads, rounds = rounds,
              device = opts.device, torch_device = opts.torch_device,
              torch = torch_version or (opts.no_torch and "not run" or "missing"), quick = opts.quick == true,
              openblas_coretype = kernels, needle_blas = needle_blas, torch_kernels = torch_kernels,
              load_before = load_before, load_after = load_after,
              elapsed_s = elapsed, torch_wait = opts.torch_wait or "auto", reps = opts.reps, warmup = opts.warmup,
              precision = opts.bf16 and "bfloat16 products (needle medium, PyTorch autocast)" or "float32",
              needle_compiled = opts.compile == true}
write("results.json", json.encode({meta = meta, rows = json.array(results), gpt2_cache_speedup = speedups}) .. "\n")

local cols = {"name", "model", "task", "unit", "items", "needle", "torch", "ratio", "ratio_min", "ratio_max",
              "rounds", "target", "met", "needle_ms", "torch_ms"}
local csv = {table.concat(cols, ",")}
for _, r in ipairs(results) do
  local cells = {}
  for k, col in ipairs(cols) do
    local v = r[col]
    if col == "torch" and r.torch_missing then v = "missing" end
    if type(v) == "number" and math.type(v) == "float" then v = ("%.6g"):format(v) end
    if type(v) == "boolean" then v = v and "yes" or "no" end
    cells[k] = v == nil and "" or tostring(v)
  end
  csv[#csv + 1] = table.concat(cells, ",")
end
write("results.csv", table.concat(csv, "\n") .. "\n")
write("zoo.svg", dofile(here .. "/zoo_svg.lua")(results, meta))
print(("wrote %s/results.json, results.csv, zoo.svg"):format(opts.out))
