-- scripts/bench/compiled_vs_eager.lua: one workload of workloads.lua eager and
-- through nd.compile, alternating in one process (the fairest comparison on a
-- shared machine: both see the same load), median of ROUNDS rounds; with a
-- third argument, an nd.profile of five calls of each.
--
--   build/needle-lua scripts/bench/compiled_vs_eager.lua lstm_train [ROUNDS] [profile]
--
-- NAME is any workload with a compiled variant (NAME_compiled in workloads.lua).
local nd = require "needle"
local here = arg[0]:match("(.*/)") or "./"
local C = dofile(here .. "common.lua")
local W = dofile(here .. "workloads.lua")
local name, rounds = arg[1], tonumber(arg[2] or 5)
local w, wc = W.by_name[name or ""], W.by_name[(name or "") .. "_compiled"]
if not (w and wc) then
  local names = {}
  for _, x in ipairs(W.list) do if x.compiled_of then names[#names + 1] = x.compiled_of end end
  io.stderr:write(("usage: compiled_vs_eager.lua NAME [ROUNDS] [profile]; NAME one of %s\n"):format(
    table.concat(names, ", ")))
  os.exit(2)
end
nd.manual_seed(0)
local fe = w.setup(nd, "cpu")
nd.manual_seed(0)
local fc = wc.setup(nd, "cpu")
local inner = w.inner or 1
for _ = 1, 3 do fe(); fc() end -- warm-up: the capture, the caches
local te, tc = {}, {}
for r = 1, rounds do
  te[r] = C.per_iter(fe, inner, w.reps, inner) * 1e3
  tc[r] = C.per_iter(fc, inner, w.reps, inner) * 1e3
end
local me, mc = C.median_of(te), C.median_of(tc)
print(("%s: eager %.3f ms, compiled %.3f ms, speed-up %.2fx (%d threads, GEMM %s)"):format(
  name, me, mc, me / mc, nd.get_num_threads(), nd.devices()[1].gemm or "?"))
if arg[3] then
  nd.profile(function() for _ = 1, inner * 5 do fe() end end, {sort = "self", print = true})
  nd.profile(function() for _ = 1, inner * 5 do fc() end end, {sort = "self", print = true})
end
