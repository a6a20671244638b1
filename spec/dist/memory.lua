-- spec/dist/memory.lua STEPS - run under mpirun by spec/distributed_spec.lua:
-- a data-parallel training loop (DistributedDataParallel, async bucketed
-- all-reduce) whose resident memory must not grow; prints the RSS after a
-- warm-up and at the end, in bytes, from rank 0.
local nd = require "needle"
local steps = tonumber(arg[1]) or 2000
local dist = nd.distributed.init{timeout = 120}
local function rss()
  local f = io.open("/proc/self/statm"); local s = f:read("a"); f:close()
  return tonumber(s:match("^%d+%s+(%d+)")) * 4096
end
nd.manual_seed(1)
local model = nd.nn.Sequential(nd.nn.Linear(64, 128), nd.nn.ReLU(), nd.nn.Linear(128, 10))
local ddp = nd.nn.parallel.DistributedDataParallel(model, {bucket_mb = 0.02})
local opt = nd.optim.Adam(model:parameters(), {lr = 1e-3})
local x, y = nd.randn({32, 64}), nd.randint(1, 10, {32})
local warm
for i = 1, steps do
  opt:zero_grad()
  nd.F.cross_entropy(ddp(x), y):backward()
  opt:step()
  if i == steps // 10 then warm = rss() end
end
if dist.rank() == 0 then print(("rss %d %d"):format(warm, rss())) end
dist.finalize()
