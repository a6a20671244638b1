-- compile_fuzz_spec.lua - the graph fuzzer of nd.compile: random programs
-- of ops (elementwise with broadcasting, views with strides, reductions over
-- random dims, in-place updates, host-made constants, mixed dtypes, matmul,
-- cat, where) run eagerly and compiled on fresh random inputs; every replay
-- must give exactly the eager results (the same kernels run). A failure
-- names the seed: NEEDLE_FUZZ_SEED=<seed> NEEDLE_FUZZ_CASES=1 reruns it.
--   NEEDLE_FUZZ_CASES (default 300) programs, from NEEDLE_FUZZ_SEED (default 1)
local nd = require "needle"
local D = require "spec.helpers.devices"

local CASES = tonumber(os.getenv("NEEDLE_FUZZ_CASES")) or 300
local SEED0 = tonumber(os.getenv("NEEDLE_FUZZ_SEED")) or 1

-- a program: a list of steps over a growing list of values (tensors)
local function gen_program(rand)
  local steps = {}
  for _ = 1, rand(4, 14) do steps[#steps + 1] = {kind = rand(1, 18), a = rand(1, 1000), b = rand(1, 1000),
                                                  c = rand(1, 1000), d = rand(1, 1000)} end
  return steps
end

local function pick(vals, k) return vals[(k - 1) % #vals + 1] end

-- the float value of v (int64 values come back as float32)
local function float(v) return v.dtype == "float32" and v or v:float() end

-- Runs a program on inputs (a list of float32 tensors); returns its outputs.
-- Every op is chosen so that any shapes work (broadcast partners are made to
-- fit), so a program never fails: a failure is the compiler's.
local function run_program(steps, inputs)
  local vals = {}
  for i, x in ipairs(inputs) do vals[i] = x end
  for _, s in ipairs(steps) do
    local x = pick(vals, s.a)
    local k = s.kind
    local r
    if k == 1 then r = x:relu()
    elseif k == 2 then r = x:clamp(-3, 3):exp()
    elseif k == 3 then r = x:tanh() * 1.5
    elseif k == 4 then r = x:abs():sqrt() - x:sigmoid()
    elseif k == 5 then -- broadcasting binary op with a value reduced to fit
      local y = pick(vals, s.b)
      local yy = y:sum():reshape({1}) -- broadcasts against anything
      local ops = {"add", "mul", "sub", "maximum"}
      r = nd[ops[s.c % 4 + 1]](x, yy)
    elseif k == 6 then -- a reduction over a random dim, keepdim sometimes
      if x:dim() == 0 then r = x * 2
      else
        local d = s.b % x:dim() + 1
        if s.c % 3 == 0 then r = x:sum(d, s.d % 2 == 0)
        elseif s.c % 3 == 1 then r = x:mean(d, true)
        else r = (x:max(d)) end
      end
    elseif k == 7 then -- a strided view: transpose or narrow
      if x:dim() >= 2 then r = x:transpose(1, x:dim())
      elseif x:dim() == 1 and x:size(1) > 1 then r = x:narrow(1, 2, x:size(1) - 1)
      else r = x + 1 end
    elseif k == 8 then -- in place on a fresh copy, through a view
      local c = x:clone()
      if c:dim() >= 1 and c:size(1) > 1 then c:narrow(1, 1, 1):mul_(-2) else c:add_(0.5) end
      r = c
    elseif k == 9 then -- host-made constants updated in place
      local z = nd.zeros(x.shape, {device = x.device})
      z:add_(x)
      z:add_(1)
      r = z * nd.ones(x.shape, {device = x.device})
    elseif k == 10 then -- integer arithmetic and back
      r = float((x * 4):long() * 3 + 1)
    elseif k == 11 then -- float64 round trip
      r = (x:double() * 1.25):float()
    elseif k == 12 then -- matmul with its own transpose
      if x:dim() == 2 then r = x:matmul(x:t())
      elseif x:dim() == 1 then r = (x * x):sum()
      else r = x * 0.5 end
    elseif k == 13 then -- cat with itself
      if x:dim() >= 1 then r = nd.cat({x, x * 2}, s.b % x:dim() + 1) else r = x - 1 end
    elseif k == 14 then -- where on a mask
      r = nd.where(x:gt(0), x, x * -0.25)
    elseif k == 15 then -- reshape to flat and back through unsqueeze/expand
      local f = x:reshape({-1})
      r = f:unsqueeze(1):expand({2, f:size(1)}):contiguous()
    elseif k == 16 then -- softmax / log_softmax along the last dim
      if x:dim() >= 1 then r = s.b % 2 == 0 and nd.F.softmax(x, x:dim()) or nd.F.log_softmax(x, x:dim())
      else r = x:exp() end
    elseif k == 17 then -- elementwise work, then softmax along the last dim (a row kernel's prologue)
      local y = x * 0.7 + pick(vals, s.b):sum():reshape({1})
      if s.c % 3 == 0 then y = y:tanh() end
      if x:dim() >= 1 then r = s.d % 2 == 0 and nd.F.softmax(y, -1) or nd.F.log_softmax(y, -1)
      else r = y end
    else -- elementwise work, then layer norm over the last dim, with weight and bias sometimes
      if x:dim() >= 1 then
        local n = x:size(x:dim())
        local w = s.c % 2 == 0 and nd.linspace(0.5, 1.5, n):to(x.device) or nil
        local b = s.c % 4 < 2 and nd.linspace(-1, 1, n):to(x.device) or nil
        r = nd.F.layer_norm(x:abs() - x * 0.5, {n}, w, b)
      else r = x:abs() end
    end
    vals[#vals + 1] = r
  end
  -- outputs: the last value and two random ones
  return {vals[#vals], pick(vals, steps[1].d), pick(vals, steps[#steps].c)}
end

local function same(a, b)
  if a.dtype ~= b.dtype then return false, "dtype " .. a.dtype .. " vs " .. b.dtype end
  if table.concat(a.shape, ",") ~= table.concat(b.shape, ",") then return false, "shape" end
  local x, y = a:to("cpu"):double():reshape({-1}):totable(), b:to("cpu"):double():reshape({-1}):totable()
  for i = 1, #x do
    if not (x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i])) then
      return false, ("element %d: %.17g vs %.17g"):format(i, x[i], y[i])
    end
  end
  return true
end

local function random_inputs(rand, shapes, device)
  local xs = {}
  for i, sh in ipairs(shapes) do
    nd.manual_seed(rand(1, 1e6))
    xs[i] = nd.randn(sh):to(device)
  end
  return xs
end

for _, device in ipairs(D.all()) do
  describe("nd.compile graph fuzzer on " .. device, function()
    local cases = device == "cpu" and CASES or math.max(1, CASES // 4)
    it(("%d random programs, compiled and replayed, equal eager (seeds %d..%d)"):format(
        cases, SEED0, SEED0 + cases - 1), function()
      local fused_runs, fused_rows, moved, prepared = 0, 0, 0, 0
      -- on OpenCL two more replays: the first two record each kernel call's launches, the
      -- later ones enqueue them prepared (ocl_prepared.c)
      local calls = device == "cpu" and 3 or 5
      for seed = SEED0, SEED0 + cases - 1 do
        local rng = seed
        local function rand(lo, hi) -- a small LCG: the program depends on the seed only
          rng = (rng * 1103515245 + 12345) % 2147483648
          return lo + rng % (hi - lo + 1)
        end
        local steps = gen_program(rand)
        local shapes = {}
        for i = 1, rand(1, 3) do
          local sh = {}
          for d = 1, rand(1, 3) do sh[d] = rand(1, 5) end
          shapes[i] = sh
        end
        local cf = nd.compile(function(...) return run_program(steps, {...}) end, {warmup = 0, verify = true})
        for call = 1, calls do
          local xs = random_inputs(rand, shapes, device)
          local ok, got = pcall(cf, table.unpack(xs))
          if not ok then
            error(("seed %d, call %d: compiled call failed: %s"):format(seed, call, tostring(got)), 0)
          end
          local want = run_program(steps, xs)
          for o = 1, #want do
            local eq, why = same(got[o], want[o])
            if not eq then
              error(("seed %d (NEEDLE_FUZZ_SEED=%d NEEDLE_FUZZ_CASES=1), call %d, output %d differs: %s%s")
                    :format(seed, seed, call, o, why,
                            os.getenv("NEEDLE_FUZZ_SEED") and "\n" .. cf:ir() or ""), 0)
            end
          end
        end
        assert(cf.stats.replays == calls - 1, ("seed %d: %d replays"):format(seed, cf.stats.replays))
        local gs = cf.last.graph:stats()
        fused_runs = fused_runs + gs.fused_runs
        fused_rows = fused_rows + gs.fused_rows
        prepared = prepared + gs.prepared
        for _, p in ipairs(cf.last.passes) do if p[1] == "reorder" then moved = moved + p[2] end end
      end
      -- the programs must exercise the passes, not just pass around them
      assert(fused_runs >= cases // 5, ("only %d fused kernels in %d programs"):format(fused_runs, cases))
      assert(moved >= cases // 20, ("the reorder pass moved only %d kernels in %d programs"):format(moved, cases))
      if device == "cpu" then -- (OpenCL has no row kernels with a prologue)
        assert(fused_rows >= cases // 10, ("only %d row kernels with a prologue in %d programs"):format(fused_rows, cases))
      else
        assert(prepared >= cases, ("only %d prepared kernel calls in %d programs"):format(prepared, cases))
      end
    end)
  end)
end
