-- scripts/bench/data_parallel.lua - data-parallel training throughput: the
-- same global batch trained by 1 process and by N processes
-- (DistributedDataParallel over nd.distributed), 1 thread each, in paired
-- rounds; samples per second and the speed-up over 1 process.
--
--   build/needle-lua scripts/bench/data_parallel.lua [PROCESSES [ROUNDS [MODELS [weak]]]]
--
-- MODELS: comma-separated, of mlp (784-512-256-10, global batch 128) and
-- resnet9 (3x32x32, global batch 64, SyncBatchNorm). Target (issue 19):
-- 2 processes at least 1.7x the samples/s of 1 process. With "weak", each
-- process keeps the whole batch (the global batch grows with the processes,
-- as data-parallel training is scaled out); the target there (16 cores):
-- at least 80% efficiency at 8 processes (speed-up / processes).
--
-- A third column runs the N processes without reducing anything (every step
-- inside ddp:no_sync): what the machine gives N processes that share it,
-- the ceiling for data-parallel training there; "comm. eff." is the
-- data-parallel rate over that ceiling.
local nd = require "needle"

local function build(name)
  nd.manual_seed(0)
  if name == "mlp" then
    local model = nd.nn.Sequential(nd.nn.Linear(784, 512), nd.nn.ReLU(), nd.nn.Linear(512, 256),
                                   nd.nn.ReLU(), nd.nn.Linear(256, 10))
    return model, 128, function(n) return nd.randn({n, 784}), nd.randint(1, 10, {n}) end
  elseif name == "resnet9" then
    return nd.nn.ResNet9(), 64, function(n) return nd.randn({n, 3, 32, 32}), nd.randint(1, 10, {n}) end
  end
  error("unknown model " .. tostring(name))
end

if arg[1] == "--worker" then
  local name, steps, no_sync, weak = arg[2], tonumber(arg[3]) or 30, arg[4] == "no_sync", arg[5] == "weak"
  local dist = nd.distributed.init()
  local W = dist.world_size()
  local model, batch, data = build(name)
  if W > 1 and name == "resnet9" then nd.nn.SyncBatchNorm.convert_sync_batchnorm(model) end
  local ddp = nd.nn.parallel.DistributedDataParallel(model)
  local opt = nd.optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
  local per = weak and batch or batch // W
  local x, y = data(per)
  local function one_step()
    opt:zero_grad()
    nd.F.cross_entropy(ddp(x), y):backward()
    opt:step()
  end
  local function step()
    if no_sync then ddp:no_sync(one_step) else one_step() end
  end
  for _ = 1, 5 do step() end
  dist.barrier()
  local t0 = nd.clock()
  for _ = 1, steps do step() end
  dist.barrier()
  local dt = nd.clock() - t0
  if dist.rank() == 0 then print(("samples_per_s %.6g"):format(steps * per * W / dt)) end
  dist.finalize()
  return
end

local np = tonumber(arg[1]) or 2
local rounds = tonumber(arg[2]) or 3
local models = {}
for m in (arg[3] or "mlp,resnet9"):gmatch("[^,]+") do models[#models + 1] = m end
local weak = arg[4] == "weak"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local exe = arg[-1] or "needle-lua"
local steps = {mlp = 60, resnet9 = 15}

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  p:close()
  return tonumber(out:match("samples_per_s (%S+)")), out
end

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

print(("data-parallel training, 1 thread per process, %d processes vs 1, median of %d paired rounds, %s"):format(
  np, rounds, weak and "each process the whole batch (weak scaling)" or "one global batch split (strong scaling)"))
print(("%-9s %13s %13s %9s %16s %11s"):format("model", "1 proc (s/s)", np .. " procs (s/s)", "speed-up",
                                             np .. " without comm.", "comm. eff."))
for _, m in ipairs(models) do
  local one, many, free = {}, {}, {}
  local MPI = ("NEEDLE_NUM_THREADS=1 mpirun -np %d --oversubscribe --allow-run-as-root %s %s/data_parallel.lua --worker %s %d")
    :format(np, exe, here, m, steps[m])
  local mode = weak and " weak" or ""
  for _ = 1, rounds do
    local a, out_a = run(("NEEDLE_NUM_THREADS=1 %s %s/data_parallel.lua --worker %s %d"):format(exe, here, m, steps[m]))
    local b, out_b = run(MPI .. " sync" .. mode)
    local c, out_c = run(MPI .. " no_sync" .. mode)
    assert(a, out_a)
    assert(b, out_b)
    assert(c, out_c)
    one[#one + 1], many[#many + 1], free[#free + 1] = a, b, c
  end
  local a, b, c = median(one), median(many), median(free)
  print(("%-9s %13.1f %13.1f %8.2fx %16.1f %10.0f%%%s"):format(m, a, b, b / a, c, 100 * b / c,
    weak and ("  efficiency %.0f%%"):format(100 * b / a / np) or ""))
end
