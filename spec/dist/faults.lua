-- spec/dist/faults.lua CASE - run under mpirun by spec/distributed_spec.lua:
-- one rank fails in the way CASE names while the others wait for it in a
-- collective; the job must end within seconds, with a message naming the
-- failing rank.
--   error    rank 1 raises a Lua error
--   kill     rank 1 is killed (SIGKILL)
--   timeout  rank 1 sleeps; rank 0's all_reduce times out after 2 s
--   model    rank 1 builds a model with another shape (DistributedDataParallel)
local nd = require "needle"
local case = arg[1]
local dist = nd.distributed.init{timeout = case == "timeout" and 2 or 60}
local R = dist.rank()
if case == "model" then
  local model = nd.nn.Sequential(nd.nn.Linear(4, R == 1 and 6 or 5), nd.nn.ReLU())
  nd.nn.parallel.DistributedDataParallel(model)
  print("unreachable: the models differ")
  dist.finalize()
  return
end
if R == 1 then
  if case == "error" then
    error("rank one gives up")
  elseif case == "kill" then
    local f = assert(io.open("/proc/self/stat"))
    local pid = f:read("a"):match("^(%d+)")
    f:close()
    os.execute("kill -9 " .. pid)
  elseif case == "timeout" then
    os.execute("sleep 30")
  end
end
dist.all_reduce(nd.ones({4}))
print("unreachable: rank " .. R .. " passed the all_reduce")
dist.finalize()
