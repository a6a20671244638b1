-- distributed_spec.lua - nd.distributed, DistributedDataParallel,
-- SyncBatchNorm and DistributedSampler (docs/distributed.md).
--
--   build/needle-lua spec/run.lua spec/distributed_spec.lua
--
-- The world of one process is checked in this process; jobs of several
-- run the workers in spec/dist/ under mpirun (Open MPI, installed by
-- scripts/setup.sh), each bounded by `timeout`, and compare what they print
-- or write with what one process computes.
local nd = require "needle"
local S = require "spec.helpers.shell"

local dist = nd.distributed

-- In the ASan build, Open MPI's own allocations that live until exit are
-- not leaks of needle's: spec/dist/lsan.supp names its libraries, which
-- needs stacks that reach them (the slow unwinder) and plugins that stay
-- loaded until the leak check.
local function sanitizer_env(root)
  if not nd._SANITIZE then return "" end
  return ("ASAN_OPTIONS=%s LSAN_OPTIONS=%s OMPI_MCA_mca_base_component_disable_dlclose=1 "
          .. "PMIX_MCA_mca_base_component_disable_dlclose=1 ")
    :format(S.q((os.getenv("ASAN_OPTIONS") or "") .. ":fast_unwind_on_malloc=0"),
            S.q("suppressions=" .. root .. "/spec/dist/lsan.supp:print_suppressions=0"))
end

-- a program's path from the repository root: a worker's name alone is spec/dist/'s
local function program(path) return path:find("/", 1, true) and path or "spec/dist/" .. path end

-- mpirun -np N ... needle-lua PROGRAM ARGS; returns output (stdout and
-- stderr), exit status and seconds taken
local function mpirun(n, worker, args, env)
  local exe, root = S.needle_lua()
  local cmd = ("cd %s && %s%s timeout 300 mpirun -np %d --oversubscribe --allow-run-as-root %s %s %s 2>&1")
    :format(S.q(root), sanitizer_env(root), env or "", n, S.q(exe), S.q(program(worker)), args or "")
  local t0 = nd.clock()
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code, nd.clock() - t0
end

-- a world of one, without mpirun
local function alone(worker, args)
  local exe, root = S.needle_lua()
  local p = assert(io.popen(("cd %s && %s %s %s 2>&1"):format(S.q(root), S.q(exe), S.q(program(worker)),
                                                              args or "")))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

local function have_mpirun()
  if not dist.is_available() then
    pending("nd.distributed: this build has no MPI (install libopenmpi-dev openmpi-bin, rerun scripts/setup.sh)")
    return false
  end
  if not S.shell_line("command -v mpirun") then
    pending("mpirun not found (Debian: openmpi-bin)")
    return false
  end
  return true
end

local function tmp(name) return os.tmpname() .. "-" .. name end

local function worst_relative(a_path, b_path)
  local a, b = nd.load(a_path), nd.load(b_path)
  local worst, where, n = 0, nil, 0
  for k, v in pairs(a) do
    assert(b[k], "missing " .. k .. " in " .. b_path)
    local x, y = v:double(), b[k]:double()
    local scale = math.max(x:abs():max():item(), 1e-30)
    local d = (x - y):abs():max():item() / scale
    n = n + 1
    if d > worst or where == nil then worst, where = d, k end
  end
  assert(n > 3, "too few tensors compared")
  return worst, where
end

describe("distributed: a world of one process", function()
  it("init, rank and world_size without mpirun", function()
    dist.init()
    assert.is_true(dist.is_initialized())
    assert.are.equal(0, dist.rank())
    assert.are.equal(1, dist.world_size())
    assert.are.equal(0, dist.local_rank())
    assert.are.equal(1, dist.local_size())
    dist.barrier()
  end)

  it("init rejects unknown options and a world_size that mpirun did not start", function()
    assert.has_error(function() dist.init{timout = 3} end,
                     "needle.distributed.init: unknown option 'timout' (valid: threads, timeout, world_size)")
    local ok, err = pcall(dist.init, {world_size = 4})
    assert.is_false(ok)
    assert.matches("world_size = 4 asked, but this process was not started by mpirun", err, 1, true)
    assert.matches("mpirun -np 4", err, 1, true)
    assert.has_error(function() dist.init{timeout = -1} end)
    ok, err = pcall(dist.init, {timeout = 0 / 0})
    assert.is_false(ok)
    assert.matches("timeout must be a finite number of seconds >= 0", err, 1, true)
    assert.has_error(function() dist.set_timeout(math.huge) end)
  end)

  it("collectives are local: all_reduce keeps values, all_gather adds a dim of 1", function()
    dist.init()
    for _, dtype in ipairs({"float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16"}) do
      local t = nd.tensor({1, 0, 3}):to(dtype)
      local before = t:double():totable()
      for _, op in ipairs({"sum", "max", "min"}) do dist.all_reduce(t, op) end
      assert.are.same(before, t:double():totable())
      local g = dist.all_gather(t)
      assert.are.same({1, 3}, g.shape)
      assert.are.equal(dtype, g.dtype)
      dist.broadcast(t, 0)
      assert.are.same(before, t:double():totable())
      local s = dist.reduce_scatter(t:reshape({3, 1}))
      assert.are.same({3, 1}, s.shape)
    end
    local h = dist.all_reduce(nd.ones({2}), {op = "mean", async = true})
    assert.is_true(h:is_completed())
    assert.are.same({1, 1}, h:wait():totable())
  end)

  it("bad arguments are errors that name the collective", function()
    dist.init()
    assert.has_error(function() dist.all_reduce(nd.ones({2}), "avg") end,
                     "needle.distributed.all_reduce: unknown op 'avg' (valid: max, mean, min, sum)")
    local ok, err = pcall(dist.all_reduce, nd.ones({2}, {dtype = "int64"}), "mean")
    assert.is_false(ok)
    assert.matches("op 'mean' needs a floating%-point tensor, got int64", err)
    ok, err = pcall(dist.broadcast, nd.ones({2}), 3)
    assert.is_false(ok)
    assert.matches("root rank 3 out of range (ranks are 0..0)", err, 1, true)
    assert.has_error(function() dist.all_reduce({1, 2}) end,
                     "needle.distributed.all_reduce: expected a tensor, got a table")
    assert.has_error(function() dist.all_reduce(nd.ones({2}), {op = "sum", asynch = true}) end,
                     "needle.distributed.all_reduce: unknown option 'asynch' (valid: async, channel, check, op)")
    assert.has_error(function() dist.all_gather(nd.ones({2}), {root = 1}) end)
  end)

  it("DistributedDataParallel in a world of one leaves training as it is", function()
    dist.init()
    nd.manual_seed(3)
    local model = nd.nn.Linear(4, 2, {dtype = "float64"})
    local ddp = nd.nn.parallel.DistributedDataParallel(model)
    local x = nd.randn({5, 4}):double()
    ddp(x):sum():backward()
    local want = x:sum(1):expand({2, 4})
    assert.are.same(want:totable(), model.weight.grad:totable())
    assert.has_error(function() nd.nn.parallel.DistributedDataParallel(model, {bucket = 1}) end,
      "needle.nn.parallel.DistributedDataParallel: unknown option 'bucket' (valid: broadcast_buffers, bucket_mb)")
    local keys = {}
    for k in pairs(ddp:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({"module.bias", "module.weight"}, keys)
  end)

  it("SyncBatchNorm is BatchNorm in a world of one, and converts a model's BatchNorms", function()
    nd.manual_seed(4)
    local x = nd.randn({6, 3, 4, 4}):double()
    local bn = nd.nn.BatchNorm2d(3, {dtype = "float64"})
    local sbn = nd.nn.SyncBatchNorm(3, {dtype = "float64"})
    assert.are.same(bn(x):totable(), sbn(x):totable())
    assert.are.same(bn.running_var:totable(), sbn.running_var:totable())
    local model = nd.nn.Sequential(nd.nn.Conv2d(3, 4, 3), nd.nn.BatchNorm2d(4), nd.nn.ReLU())
    local w = model[2].weight
    nd.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert.are.equal("SyncBatchNorm", model[2].__name)
    assert.are.equal(w, model[2].weight)
    assert.are.same({"0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean",
                     "1.running_var", "1.weight"}, (function()
      local k = {}
      for name in pairs(model:state_dict()) do k[#k + 1] = name end
      table.sort(k)
      return k
    end)())
  end)
end)

describe("distributed: DistributedSampler", function()
  local Sampler = nd.data.DistributedSampler

  it("gives the ranks disjoint shares that cover the data, padded to equal length", function()
    for _, W in ipairs({1, 2, 3, 4}) do
      local seen, len = {}, nil
      for r = 0, W - 1 do
        local s = Sampler(10, {num_replicas = W, rank = r, seed = 5})
        local idx = s:indices(2):totable()
        len = len or #idx
        assert.are.equal(len, #idx)
        assert.are.equal(math.ceil(10 / W), #idx)
        for _, i in ipairs(idx) do seen[i] = (seen[i] or 0) + 1 end
      end
      for i = 1, 10 do assert.is_truthy(seen[i], "item " .. i .. " never drawn with " .. W .. " ranks") end
      local total = 0
      for _, c in pairs(seen) do total = total + c end
      assert.are.equal(math.ceil(10 / W) * W, total)
    end
  end)

  it("with drop_last the shares are disjoint and cut to floor(n / W)", function()
    local seen = {}
    for r = 0, 2 do
      local idx = Sampler(10, {num_replicas = 3, rank = r, drop_last = true}):indices(1):totable()
      assert.are.equal(3, #idx)
      for _, i in ipairs(idx) do
        assert.is_nil(seen[i])
        seen[i] = true
      end
    end
  end)

  it("reshuffles per epoch from the shared seed, the same way on every rank", function()
    local a1 = Sampler(50, {num_replicas = 2, rank = 0, seed = 7}):indices(1):totable()
    local b1 = Sampler(50, {num_replicas = 2, rank = 0, seed = 7}):indices(1):totable()
    local a2 = Sampler(50, {num_replicas = 2, rank = 0, seed = 7}):indices(2):totable()
    assert.are.same(a1, b1)
    assert.are_not.same(a1, a2)
    local plain = Sampler(6, {num_replicas = 2, rank = 1, shuffle = false}):indices(1):totable()
    assert.are.same({2, 4, 6}, plain)
  end)

  it("splits a shuffled DataLoader epoch the way one process would batch it", function()
    -- rank r's batch b holds items of the one-process batch b (global batch 4 = 2 x 2)
    local ds = nd.data.TensorDataset(nd.arange(1, 13))
    local one = nd.data.DataLoader(ds, {batch_size = 4, shuffle = true, seed = 9})
    one:set_epoch(3)
    local batches = {}
    for b in one:iter() do batches[#batches + 1] = b:totable() end
    for r = 0, 1 do
      local l = nd.data.DataLoader(ds, {batch_size = 2, sampler = Sampler(ds, {num_replicas = 2, rank = r, seed = 9})})
      l:set_epoch(3)
      local k = 0
      for b in l:iter() do
        k = k + 1
        local global = {}
        for _, v in ipairs(batches[k]) do global[v] = true end
        for _, v in ipairs(b:totable()) do assert.is_true(global[v], "rank " .. r .. " batch " .. k) end
      end
      assert.are.equal(#batches, k)
    end
  end)

  it("its own set_epoch sets the loader's next epoch (PyTorch's habit)", function()
    local ds = nd.data.TensorDataset(nd.arange(1, 11))
    local s = Sampler(ds, {num_replicas = 2, rank = 0, seed = 3})
    local l = nd.data.DataLoader(ds, {batch_size = 5, sampler = s})
    s:set_epoch(7)
    local got = {}
    for b in l:iter() do for _, v in ipairs(b:totable()) do got[#got + 1] = v end end
    assert.are.same(s:indices(7):totable(), got)
    assert.are.equal(7, l.epoch)
    got = {}
    for b in l:iter() do for _, v in ipairs(b:totable()) do got[#got + 1] = v end end
    assert.are.same(s:indices(8):totable(), got)
  end)

  it("under mpirun before init it is an error, not a silent world of one", function()
    local out = S.run_program("OMPI_COMM_WORLD_SIZE=2", [[
      local nd = require "needle"
      local ok, err = pcall(nd.data.DistributedSampler, 10)
      print(ok, err)
    ]])
    assert.matches("runs under mpirun but nd.distributed.init() was not called", out, 1, true)
  end)

  it("rejects bad options and a sampler together with shuffle", function()
    assert.has_error(function() Sampler(10, {num_replicas = 2, rank = 2}) end,
      "needle.data.DistributedSampler: rank 2 out of range for 2 replicas (ranks are 0..1)")
    assert.has_error(function() Sampler(10, {shufle = true}) end,
      "needle.data.DistributedSampler: unknown option 'shufle' (valid: drop_last, num_replicas, rank, seed, shuffle)")
    assert.has_error(function()
      nd.data.DataLoader({1, 2, 3}, {shuffle = true, sampler = Sampler(3)})
    end, "needle.data.DataLoader: sampler and shuffle = true exclude each other (the sampler shuffles)")
  end)
end)

describe("distributed: jobs under mpirun", function()
  it("every collective, dtype and size against a reference (2 and 3 processes)", function()
    if not have_mpirun() then return end
    for _, n in ipairs({2, 3}) do
      local out, code = mpirun(n, "collectives.lua")
      assert.are.equal(0, code, out)
      local checks, failed = out:match("collectives: (%d+) checks, (%d+) failed %(rank 0%)")
      assert.is_truthy(checks, out)
      assert.are.equal("0", failed, out)
      assert.is_true(tonumber(checks) > 260, out)
      assert.is_nil(out:find("FAIL", 1, true), out)
    end
  end)

  it("works from a stock lua5.4 that requires needle", function()
    if not have_mpirun() then return end
    local _, root = S.needle_lua()
    local build = os.getenv("NEEDLE_BUILD_DIR") or "build"
    if build:sub(1, 1) ~= "/" then build = root .. "/" .. build end
    local prog = tmp("stock.lua")
    S.write_file(prog, ([[
      package.cpath = %q .. "/?.so;" .. package.cpath
      package.path = %q .. "/lua/?.lua;" .. %q .. "/lua/?/init.lua;" .. package.path
      local nd = require "needle"
      local dist = nd.distributed.init()
      local t = nd.ones({3}) * (dist.rank() + 1)
      dist.all_reduce(t)
      print(("rank %%d sum %%g"):format(dist.rank(), t:sum():item()))
      dist.finalize()
    ]]):format(build, root, root))
    -- an ASan build's module needs the ASan runtime first in an uninstrumented
    -- lua5.4, and lua_close unloads it, so leaks would be reported from an
    -- unnamed module: leak checking off there (as install_spec does)
    local env = ""
    if nd._SANITIZE then
      local lib = S.shell_line("cc -print-file-name=libasan.so")
      env = ("LD_PRELOAD=%s ASAN_OPTIONS=%s "):format(S.q(lib), S.q((os.getenv("ASAN_OPTIONS") or "") .. ":detect_leaks=0"))
    end
    local p = assert(io.popen(("%s timeout 120 mpirun -np 2 --oversubscribe --allow-run-as-root lua5.4 %s 2>&1")
      :format(env, S.q(prog))))
    local out = p:read("a")
    local _, _, code = p:close()
    os.remove(prog)
    assert.are.equal(0, code, out)
    assert.matches("rank 0 sum 9", out, 1, true)
    assert.matches("rank 1 sum 9", out, 1, true)
  end)

  it("DistributedDataParallel: failed and nested backwards, frozen and unused parameters, re-wrapping, "
     .. "create_graph, collected wrappers, dropped handles, an empty SyncBatchNorm batch", function()
    if not have_mpirun() then return end
    local out, code = mpirun(2, "ddp_cases.lua")
    assert.are.equal(0, code, out)
    local checks, failed = out:match("ddp cases: (%d+) checks, (%d+) failed %(rank 0%)")
    assert.is_truthy(checks, out)
    assert.are.equal("0", failed, out)
    assert.is_true(tonumber(checks) >= 20, out)
    assert.is_nil(out:find("FAIL", 1, true), out)
  end)

  it("OpenCL tensors are staged through the host", function()
    if not have_mpirun() then return end
    if require("spec.helpers.devices").pending_without_opencl(pending, "staging through the host") then return end
    local out, code = mpirun(2, "collectives.lua", "", "NEEDLE_SPEC_OPENCL=1")
    assert.are.equal(0, code, out)
    assert.matches("ok all_reduce on opencl", out, 1, true)
    assert.matches("ok all_gather on opencl", out, 1, true)
  end)

  -- 20 steps, global batch split over 2 processes, against 1 process
  local function equivalent(model, dtype, bound, mode)
    if not have_mpirun() then return end
    local one, two = tmp(model .. ".one"), tmp(model .. ".two")
    local out, code = alone("equivalence.lua", table.concat({model, dtype, S.q(one), mode or ""}, " "))
    assert.are.equal(0, code, out)
    out, code = mpirun(2, "equivalence.lua", table.concat({model, dtype, S.q(two), mode or ""}, " "))
    assert.are.equal(0, code, out)
    local worst, where = worst_relative(one, two)
    os.remove(one)
    os.remove(two)
    assert.is_true(worst <= bound, ("%s %s: parameters differ by %.3g (relative) at %s, bound %g"):format(
      model, dtype, worst, where, bound))
  end

  it("MLP: 2 processes end where 1 process ends (float64 1e-6, float32 1e-5)", function()
    equivalent("mlp", "float64", 1e-6)
    equivalent("mlp", "float32", 1e-5)
  end)

  it("MLP with gradient accumulation under no_sync", function()
    equivalent("mlp", "float64", 1e-6, "no_sync")
  end)

  it("LSTM language model (2 layers, clipped gradients)", function()
    equivalent("lstm", "float64", 1e-6)
    equivalent("lstm", "float32", 1e-5)
  end)

  it("ResNet9 with SyncBatchNorm against BatchNorm in one process", function()
    equivalent("resnet9", "float64", 1e-6)
    -- float32 at a learning rate where training is not chaotic (at lr 0.05,
    -- two one-process runs whose kernels round differently, the release and
    -- the sanitizer build, part by 30% within 20 steps: any rounding grows
    -- tenfold per step there, so no comparison could hold)
    equivalent("resnet9", "float32", 1e-5)
  end)

  it("a Lua error on one rank ends the job within seconds, naming the rank", function()
    if not have_mpirun() then return end
    local out, code, secs = mpirun(2, "faults.lua", "error")
    assert.are_not.equal(0, code)
    assert.matches("needle-lua (rank 1 of 2): spec/dist/faults.lua:22: rank one gives up", out, 1, true)
    assert.is_nil(out:find("unreachable", 1, true), out)
    assert.is_true(secs < 20, ("took %.1f s"):format(secs))
  end)

  it("a killed rank ends the job within seconds", function()
    if not have_mpirun() then return end
    local out, code, secs = mpirun(2, "faults.lua", "kill")
    assert.are_not.equal(0, code)
    assert.matches("signal 9", out, 1, true)
    assert.is_nil(out:find("unreachable", 1, true), out)
    assert.is_true(secs < 20, ("took %.1f s"):format(secs))
  end)

  it("a rank that never comes: the collective times out and the job ends", function()
    if not have_mpirun() then return end
    local out, code, secs = mpirun(2, "faults.lua", "timeout")
    assert.are_not.equal(0, code)
    assert.matches("distributed.all_reduce: timed out after 2 s on rank 0 of 2", out, 1, true)
    assert.is_true(secs < 20, ("took %.1f s"):format(secs))
  end)

  it("DistributedDataParallel: models that differ are an error naming the key and ranks", function()
    if not have_mpirun() then return end
    local out, code = mpirun(2, "faults.lua", "model")
    assert.are_not.equal(0, code)
    assert.matches("the ranks' models differ at parameter/buffer 1: rank 0 has 0.weight: float32 {5,4}, "
                   .. "rank 1 has 0.weight: float32 {6,4}", out, 1, true)
    assert.is_nil(out:find("unreachable", 1, true), out)
  end)

  it("memory stays flat over 2000 data-parallel steps", function()
    if not have_mpirun() then return end
    if nd._SANITIZE then
      pending("RSS bound not checked: ASan build (its quarantine holds freed memory)")
      return
    end
    local out, code = mpirun(2, "memory.lua", "2000")
    assert.are.equal(0, code, out)
    local warm, final = out:match("rss (%d+) (%d+)")
    assert.is_truthy(warm, out)
    local grown = tonumber(final) - tonumber(warm)
    assert.is_true(grown < 8 * 1024 * 1024, ("RSS grew by %.1f MiB"):format(grown / 2 ^ 20))
  end)
end)

describe("distributed: the training scripts with --distributed", function()
  local function script(n, name, args) return mpirun(n, "scripts/" .. name, args) end
  local function alone_script(name, args) return alone("scripts/" .. name, args) end

  it("train_mlp: 2 processes, rank 0 writes the checkpoint, 1 process resumes it", function()
    if not have_mpirun() then return end
    local out_dir = tmp("mlp-dist")
    local common = "--limit 1024 --epochs 2 --batch-size 64 --hidden 32 --out " .. S.q(out_dir)
    local out, code = script(2, "train_mlp.lua", "--distributed --stop-after 1 " .. common)
    assert.are.equal(0, code, out)
    assert.matches("2 processes of 32 images", out, 1, true)
    local _, epoch_lines = out:gsub("epoch 1/2  train loss", "")
    assert.are.equal(1, epoch_lines, "one rank prints:\n" .. out)
    assert.is_true(S.exists(out_dir .. "/checkpoint.safetensors"))
    out, code = alone_script("train_mlp.lua", "--resume " .. S.q(out_dir .. "/checkpoint.safetensors") .. " " .. common)
    assert.are.equal(0, code, out)
    assert.matches("resumed from .* after epoch 1", out)
    assert.matches("epoch 2/2  train loss", out, 1, true)
    os.execute("rm -rf " .. S.q(out_dir))
    out, code = script(2, "train_mlp.lua", "--distributed --batch-size 7 --limit 64 --out " .. S.q(out_dir))
    assert.are_not.equal(0, code)
    assert.matches("--batch-size 7 does not split over 2 processes", out, 1, true)
    os.execute("rm -rf " .. S.q(out_dir))
  end)

  it("train_lstm: 2 processes without dropout train exactly as 1", function()
    if not have_mpirun() then return end
    local args = "--epochs 1 --max-lines 600 --emsize 16 --nhid 16 --batch-size 8 --bptt 10 --dropout 0 --threads 1"
    local one_dir, two_dir = tmp("lstm1"), tmp("lstm2")
    local one, c1 = alone_script("train_lstm.lua", args .. " --out " .. S.q(one_dir))
    assert.are.equal(0, c1, one)
    local two, c2 = script(2, "train_lstm.lua", "--distributed " .. args .. " --out " .. S.q(two_dir))
    assert.are.equal(0, c2, two)
    -- the logs' losses (6 decimals): train loss summed over ranks, validation loss
    local function losses(dir)
      local text = assert(S.read_file(dir .. "/log.csv"), "no log in " .. dir)
      local row = text:match("\n(1,[^\n]+)")
      assert.is_truthy(row, text)
      local f = {}
      for v in row:gmatch("[^,]+") do f[#f + 1] = tonumber(v) end
      return f[3], f[5]
    end
    local train1, val1 = losses(one_dir)
    local train2, val2 = losses(two_dir)
    assert.is_true(math.abs(train1 - train2) <= 2e-6, ("train loss %.6f vs %.6f"):format(train1, train2))
    assert.is_true(math.abs(val1 - val2) <= 2e-6, ("validation loss %.6f vs %.6f"):format(val1, val2))
    os.execute("rm -rf " .. S.q(one_dir) .. " " .. S.q(two_dir))
  end)

  it("train_resnet: 2 processes with SyncBatchNorm", function()
    if not have_mpirun() then return end
    local out_dir = tmp("resnet-dist")
    local out, code = script(2, "train_resnet.lua", "--distributed --synthetic 200 --batch-size 20 --epochs 1 --out "
                             .. S.q(out_dir))
    assert.are.equal(0, code, out)
    assert.matches("SyncBatchNorm", out, 1, true)
    assert.is_true(S.exists(out_dir .. "/checkpoint.safetensors"))
    os.execute("rm -rf " .. S.q(out_dir))
  end)
end)
