-- spec/dist/collectives.lua - run under mpirun by spec/distributed_spec.lua:
-- every collective, every dtype, odd and zero sizes, strided and OpenCL
-- tensors, blocking and async, each against the value it must have,
-- computed on this rank from what every rank contributes (rank r's input is
-- a known function of r). Prints "ok <check>" or "FAIL <check>: <why>" per
-- check and "collectives: N checks, N failed" last; exits 1 on a failure.
local nd = require "needle"
local dist = nd.distributed.init{timeout = 60}
local R, W = dist.rank(), dist.world_size()
local report = require("spec.dist.report").new(R)
local check = report.check

local function same(a, b)
  if a.dtype ~= b.dtype then return false, ("dtype %s vs %s"):format(a.dtype, b.dtype) end
  local sa, sb = table.concat(a.shape, ","), table.concat(b.shape, ",")
  if sa ~= sb then return false, ("shape {%s} vs {%s}"):format(sa, sb) end
  if a:numel() == 0 then return true end
  local x, y = a:double():reshape({-1}):totable(), b:double():reshape({-1}):totable()
  for i = 1, #x do
    if x[i] ~= y[i] and not (x[i] ~= x[i] and y[i] ~= y[i]) then
      return false, ("element %d: %s vs %s"):format(i, x[i], y[i])
    end
  end
  return true
end

-- rank r's values: small integers (exact in every dtype, halves included)
local function values(r, n, dtype)
  local t = {}
  for i = 1, n do
    if dtype == "bool" then t[i] = ((i + r) % 3 == 0) and 1 or 0
    elseif dtype == "uint8" then t[i] = (i * 7 + r * 5) % 50
    else t[i] = ((i * 7 + r * 5) % 23) - 11 end
  end
  return t
end

local function input(r, shape, dtype)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local flat = nd.tensor(values(r, n, dtype), {dtype = "float64"})
  if n == 0 then flat = nd.zeros({0}, {dtype = "float64"}) end
  return flat:reshape(shape):to(dtype)
end

local function reference(shape, dtype, op)
  local acc
  for r = 0, W - 1 do
    local t = input(r, shape, dtype):double()
    if not acc then acc = t
    elseif op == "sum" or op == "mean" then acc = acc + t
    elseif op == "max" then acc = nd.maximum(acc, t)
    else acc = nd.minimum(acc, t) end
  end
  if op == "mean" then acc = acc / W end
  if dtype == "bool" then
    if op == "min" then
      local all = input(0, shape, dtype):double()
      for r = 1, W - 1 do all = all * input(r, shape, dtype):double() end
      acc = all
    else
      acc = acc:gt(0):double()
    end
  end
  return acc:to(dtype)
end

local DTYPES = {"float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16"}
local SHAPES = {{7}, {3, 5}, {0}, {1}, {2, 0, 3}}
local FLOATS = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

for _, dtype in ipairs(DTYPES) do
  for _, shape in ipairs(SHAPES) do
    local sname = "{" .. table.concat(shape, ",") .. "}"
    for _, op in ipairs({"sum", "mean", "max", "min"}) do
      if op ~= "mean" or FLOATS[dtype] then
        local t = input(R, shape, dtype)
        dist.all_reduce(t, op)
        check(("all_reduce %s %s %s"):format(op, dtype, sname), same(t, reference(shape, dtype, op)))
      end
    end
    local b = input(R, shape, dtype)
    dist.broadcast(b, W - 1)
    check(("broadcast %s %s"):format(dtype, sname), same(b, input(W - 1, shape, dtype)))
    local g = dist.all_gather(input(R, shape, dtype))
    local parts = {}
    for r = 0, W - 1 do parts[r + 1] = input(r, shape, dtype):unsqueeze(1) end
    check(("all_gather %s %s"):format(dtype, sname), same(g, nd.cat(parts, 1)))
  end
  -- reduce_scatter: {W * 3, 2} in, {3, 2} out: this rank's block of the reduction
  local shape = {W * 3, 2}
  for _, op in ipairs({"sum", "mean", "max", "min"}) do
    if op ~= "mean" or FLOATS[dtype] then
      local s = dist.reduce_scatter(input(R, shape, dtype), op)
      local want = reference(shape, dtype, op):narrow(1, R * 3 + 1, 3)
      check(("reduce_scatter %s %s"):format(op, dtype), same(s, want))
    end
  end
end

-- odd sizes, one large message (several MiB: MPI's pipelined algorithms)
for _, n in ipairs({1, 3, 1023, 1000003}) do
  local t = input(R, {n}, "float32")
  dist.all_reduce(t)
  check(("all_reduce float32 n=%d"):format(n), same(t, reference({n}, "float32", "sum")))
end

-- strided (a transposed view) and a slice: written back in place
do
  local base = input(R, {4, 6}, "float64")
  local tv = base:t()
  dist.all_reduce(tv)
  check("all_reduce of a transposed view", same(base, reference({4, 6}, "float64", "sum")))
  local big = nd.zeros({10}, {dtype = "float64"})
  local mid = big:narrow(1, 3, 4)
  mid:copy_(input(R, {4}, "float64"))
  dist.all_reduce(mid, "max")
  local want = nd.zeros({10}, {dtype = "float64"})
  want:narrow(1, 3, 4):copy_(reference({4}, "float64", "max"))
  check("all_reduce of a slice leaves the rest", same(big, want))
end

-- broadcast into a strided view, reduce_scatter and all_gather of one
do
  local base = input(R, {3, 4}, "float32")
  dist.broadcast(base:t(), 0)
  check("broadcast into a transposed view", same(base, input(0, {3, 4}, "float32")))
  local src = input(R, {2 * W, 3}, "float64")
  local s = dist.reduce_scatter(src:t():contiguous():t(), "sum")
  check("reduce_scatter of a strided tensor",
        same(s, reference({2 * W, 3}, "float64", "sum"):narrow(1, R * 2 + 1, 2)))
  local g = dist.all_gather(input(R, {4, 2}, "float32"):t())
  local parts = {}
  for r = 0, W - 1 do parts[r + 1] = input(r, {4, 2}, "float32"):t():unsqueeze(1) end
  check("all_gather of a transposed view", same(g, nd.cat(parts, 1)))
end

-- the gradients' channel keeps its own order: a bucket started on it before
-- a collective on the default channel, finished after
do
  local bucket = input(R, {9}, "float64")
  local h = dist.all_reduce(bucket, {async = true, check = false, channel = "gradients"})
  local t = input(R, {2}, "float64")
  dist.all_reduce(t, "max")
  h:wait()
  check("gradients channel beside the default one", same(bucket, reference({9}, "float64", "sum"))
        and same(t, reference({2}, "float64", "max")))
end

-- async: several in flight at once, waited in reverse order
do
  local ts, hs = {}, {}
  for k = 1, 4 do
    ts[k] = input(R + k, {5, k}, "float32")
    hs[k] = dist.all_reduce(ts[k], {op = "sum", async = true})
  end
  local g = dist.all_gather(input(R, {3}, "int32"), {async = true})
  local gathered = g:wait()
  -- is_completed drives the request until it is done (it must end true)
  local spins, done = 0, false
  while not done and spins < 1e7 do
    done = hs[4]:is_completed()
    spins = spins + 1
  end
  check("is_completed turns true", done, spins)
  for k = 4, 1, -1 do
    local out = hs[k]:wait()
    local acc = input(k, {5, k}, "float32")
    for r = 1, W - 1 do acc = acc + input(r + k, {5, k}, "float32") end
    check(("async all_reduce %d"):format(k), same(out, acc) and same(ts[k], acc))
  end
  local parts = {}
  for r = 0, W - 1 do parts[r + 1] = input(r, {3}, "int32"):unsqueeze(1) end
  check("async all_gather", same(gathered, nd.cat(parts, 1)))
  local ok, err = pcall(function() return hs[1]:wait() end)
  check("a handle waits once", not ok and tostring(err):find("already waited", 1, true), tostring(err))
  local b = input(R, {2}, "float64")
  dist.broadcast(b, {root = 0, async = true}):wait()
  check("async broadcast", same(b, input(0, {2}, "float64")))
  local rs = dist.reduce_scatter(input(R, {W * 2}, "float64"), {op = "mean", async = true}):wait()
  check("async reduce_scatter mean", same(rs, reference({W * 2}, "float64", "mean"):narrow(1, R * 2 + 1, 2)))
end

-- OpenCL tensors are staged through the host
if os.getenv("NEEDLE_SPEC_OPENCL") == "1" then
  local t = input(R, {3, 4}, "float32"):to("opencl")
  dist.all_reduce(t, "mean")
  check("all_reduce on opencl", t.device:find("opencl", 1, true) and same(t:to("cpu"),
        reference({3, 4}, "float32", "mean")))
  local g = dist.all_gather(input(R, {2}, "float32"):to("opencl"))
  local parts = {}
  for r = 0, W - 1 do parts[r + 1] = input(r, {2}, "float32"):unsqueeze(1) end
  check("all_gather on opencl", g.device:find("opencl", 1, true) and same(g:to("cpu"), nd.cat(parts, 1)))
end

-- disagreement is an error on every rank, and the job goes on
if W > 1 then
  local ok, err = pcall(dist.all_reduce, nd.ones({R + 2}))
  check("different shapes: an error", not ok and tostring(err):find("rank 0 called all_reduce of float32 {2}", 1, true)
        and tostring(err):find("rank 1 called all_reduce of float32 {3}", 1, true), tostring(err))
  ok, err = pcall(dist.all_reduce, nd.ones({2}, {dtype = R == 0 and "float32" or "float64"}))
  check("different dtypes: an error", not ok and tostring(err):find("float64", 1, true), tostring(err))
  ok, err = pcall(function()
    if R == 0 then dist.all_reduce(nd.ones({2})) else dist.broadcast(nd.ones({2}), 0) end
  end)
  check("different collectives: an error", not ok and tostring(err):find("called broadcast", 1, true), tostring(err))
  ok, err = pcall(dist.all_reduce, nd.ones({2}), R == 0 and "sum" or "max")
  check("different ops: an error", not ok and tostring(err):find("(max)", 1, true), tostring(err))
  local t = nd.ones({3})
  dist.all_reduce(t)
  check("after the errors the ranks are in step", same(t, nd.full({3}, W)))
end

-- an in-place collective counts as a modification for autograd: a tensor a
-- backward saved, reduced afterwards, is an error, not a wrong gradient
if W > 1 then
  local a = nd.tensor({1, 2, 3})
  local w = nd.ones({3}, {requires_grad = true})
  local y = (w * a):sum()
  dist.all_reduce(a)
  local ok, err = pcall(function() y:backward() end)
  check("in place, seen by autograd", not ok and tostring(err):find("modified in place", 1, true), err)
end

-- the differentiable all_reduce: its gradient is the sum of the ranks' gradients
do
  local x = nd.tensor({1, 2, 3}, {dtype = "float64", requires_grad = true})
  local y = dist.functional.all_reduce(x * (R + 1))
  ;(y * (R + 1)):sum():backward()
  -- d/dx_r of sum_k (k+1) * sum_j (j+1) x_j = (r+1) * sum_k (k+1)
  local s = 0
  for k = 0, W - 1 do s = s + k + 1 end
  check("functional.all_reduce forward", same(y:detach(), nd.tensor({1, 2, 3}, {dtype = "float64"}) * s))
  check("functional.all_reduce backward", same(x.grad, nd.full({3}, (R + 1) * s, {dtype = "float64"})))
end

dist.barrier()
local ok = report.finish("collectives")
dist.finalize()
os.exit(ok and 0 or 1)
