-- spec/dist/ddp_cases.lua - run under mpirun by spec/distributed_spec.lua:
-- DistributedDataParallel in the cases a plain training step does not
-- reach, each against gradients computed without it (the same model and
-- batch, plain autograd, then each gradient all-reduced by hand). Prints
-- "ok <case>" or "FAIL <case>: <why>", and "ddp cases: N checks, N failed".
local nd = require "needle"
local dist = nd.distributed.init{timeout = 60}
local R = dist.rank()
local nn = nd.nn
local report = require("spec.dist.report").new(R)
local check = report.check

local function close(a, b)
  if a == nil or b == nil then return a == b, ("%s vs %s"):format(tostring(a), tostring(b)) end
  local d = (a:double() - b:double()):abs():max():item()
  return d < 1e-12, ("differ by %g"):format(d)
end

-- the gradients plain autograd gives for loss_fn(model), averaged over ranks
-- by hand (nil where no rank has one)
local function reference(model, loss_fn)
  local copy = {}
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  loss_fn(model):backward()
  for i, p in ipairs(model:parameters()) do
    local has = nd.tensor({p.grad and 1 or 0}, {dtype = "float64"})
    dist.all_reduce(has, "max")
    if has:item() > 0 then
      local g = p.grad and p.grad:clone() or nd.zeros_like(p)
      dist.all_reduce(g, "mean")
      copy[i] = g
    end
    p.grad = nil
  end
  return copy
end

local function compare(name, model, want)
  for i, p in ipairs(model:parameters()) do
    local ok, why = close(p.grad, want[i])
    check(("%s: parameter %d"):format(name, i), ok, why)
  end
end

local function mlp()
  nd.manual_seed(5)
  return nn.Sequential(nn.Linear(6, 8, {dtype = "float64"}), nn.Tanh(), nn.Linear(8, 3, {dtype = "float64"}))
end
nd.manual_seed(100 + R)
local x = nd.randn({4, 6}):double()
local y = nd.randint(1, 3, {4})
local function loss_of(m) return nd.F.cross_entropy(m(x), y) end

-- a backward that fails part-way leaves no state: the next step is right
do
  local model = mlp()
  local want = reference(model, loss_of)
  local ddp = nn.parallel.DistributedDataParallel(model, {bucket_mb = 1e-4})
  local Boom = nd.autograd.Function{forward = function(_, t) return t * 1 end,
                                    backward = function() error("boom in backward") end}
  local ok = pcall(function() nd.F.cross_entropy(model[3](Boom(model[2](model[1](x)))), y):backward() end)
  check("failed backward raises", not ok)
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  loss_of(ddp):backward()
  compare("after a failed backward", model, want)
  ddp:close()
end

-- a backward inside a custom function's backward (activation checkpointing)
do
  local model = mlp()
  local want = reference(model, loss_of)
  local ddp = nn.parallel.DistributedDataParallel(model, {bucket_mb = 1e-4})
  local inner = model[1]
  -- recompute the first layer in backward, and backward through it there
  local Checkpoint = nd.autograd.Function{
    forward = function(ctx, t) ctx.t = t; return nd.no_grad(function() return inner(t) end) end,
    backward = function(ctx, g)
      local out = nd.enable_grad(function() return inner(ctx.t) end)
      out:backward(g)
      return nil
    end,
  }
  -- the input requires grad, so that the checkpoint is a node of the graph
  local xin = x:clone()
  xin.requires_grad = true
  local function loss_ckpt() return nd.F.cross_entropy(model[3](model[2](Checkpoint(xin))), y) end
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  loss_ckpt():backward()
  compare("nested backward", model, want)
  ddp:close()
end

-- frozen parameters stay without grad; a parameter no rank uses too; one
-- only rank 0 uses gets the mean with rank 1's zeros
do
  nd.manual_seed(6)
  local a, b, c = nn.Linear(6, 3, {dtype = "float64"}), nn.Linear(6, 3, {dtype = "float64"}),
                  nn.Linear(6, 3, {dtype = "float64"})
  local model = nn.ModuleList({a, b, c})
  a.bias.requires_grad = false
  local function f(m)
    local out = m[1](x)
    if R == 0 then out = out + m[3](x) end
    return nd.F.cross_entropy(out, y)
  end
  local want = reference(model, f)
  local ddp = nn.parallel.DistributedDataParallel(model)
  f(model):backward()
  check("frozen bias has no grad", a.bias.grad == nil, a.bias.grad)
  check("unused parameter has no grad", b.weight.grad == nil and b.bias.grad == nil)
  local ok, why = close(c.weight.grad, want[5])
  check("parameter used on rank 0 only: the mean with zeros", ok, why)
  -- wrapped again: the new wrapper synchronises, the old one no longer
  local again = nn.parallel.DistributedDataParallel(model)
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  f(model):backward()
  local ok2, why2 = close(c.weight.grad, want[5])
  check("wrapped again: the new wrapper reduces", ok2, why2)
  ddp:close() -- closing the old one leaves the new one alone
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  f(model):backward()
  ok2, why2 = close(c.weight.grad, want[5])
  check("closing the earlier wrapper leaves the new one", ok2, why2)
  again:close()
end

-- create_graph is an error, not a silently graph-less gradient
do
  local model = mlp()
  local ddp = nn.parallel.DistributedDataParallel(model)
  local ok, err = pcall(function() loss_of(ddp):backward({create_graph = true}) end)
  check("create_graph is refused", not ok and tostring(err):find("create_graph is not supported", 1, true), err)
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  local want = reference(model, loss_of)
  loss_of(ddp):backward()
  compare("after create_graph was refused", model, want)
  ddp:close()
end

-- a wrapper nobody holds goes, with its buckets
do
  collectgarbage()
  collectgarbage()
  local before = nd.live_bytes()
  local model = nn.Linear(256, 256)
  for _ = 1, 10 do
    local ddp = nn.parallel.DistributedDataParallel(model)
    local _ = ddp
  end
  collectgarbage()
  collectgarbage()
  local grown = nd.live_bytes() - before
  check("dropped wrappers are collected", grown < 2 * 256 * 257 * 4, ("%d bytes live"):format(grown))
  local ok = pcall(nn.parallel.DistributedDataParallel, model)
  check("their parameters can be wrapped again", ok)
end

-- a handle dropped before its wait does not break the world
do
  local h = dist.all_reduce(nd.ones({1000}), {async = true})
  h = nil
  collectgarbage()
  collectgarbage()
  local t = nd.ones({3})
  local ok, err = pcall(dist.all_reduce, t)
  check("after a dropped handle the next collective works", ok and t[1]:item() == dist.world_size(), err)
  local _ = h
end

-- SyncBatchNorm with no samples on one rank: the others' statistics
do
  nd.manual_seed(7)
  local all = nd.randn({6, 3, 2, 2}):double()
  local bn = nn.BatchNorm2d(3, {dtype = "float64"})
  local want = bn(all)
  local sbn = nn.SyncBatchNorm(3, {dtype = "float64"})
  local mine = R == 0 and all or all:narrow(1, 1, 0)
  local out = sbn(mine)
  if R == 0 then
    local ok, why = close(out, want)
    check("SyncBatchNorm with an empty rank: output", ok, why)
  end
  local ok, why = close(sbn.running_mean, bn.running_mean)
  check("SyncBatchNorm with an empty rank: running mean", ok, why)
end

dist.barrier()
local ok = report.finish("ddp cases")
dist.finalize()
os.exit(ok and 0 or 1)
