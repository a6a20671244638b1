-- scripts/bench/row_prologue.lua: nd.compile's row-kernel prologues (docs/compile.md,
-- "Into a row kernel"): softmax(s * 0.125 + m), attention's scores, and a layer norm
-- of a sum, eager and compiled, alternating in one process (median of ROUNDS), and
-- a profile of the compiled call's kernels (the fused_rows record's own time).
--
--   build/needle-lua scripts/bench/row_prologue.lua [ROUNDS] [quick]
--
-- quick: small sizes (the pipeline only, for spec/row_prologue_bench_spec.lua).
-- The unfused compiled figures in the docs came from the same script on the build
-- before the prologues (commit 1bb83e4).
local nd = require "needle"
local here = arg[0]:match("(.*/)") or "./"
local C = dofile(here .. "common.lua")
local rounds = tonumber(arg[1] or 5)
local quick = arg[2] == "quick"

nd.manual_seed(0)
local cases = {
  {"softmax(s * 0.125 + m), 8x12x128x128 (BERT's scores)", {8, 12, 128, 128}, {8, 1, 1, 128},
   function(s, m) return nd.softmax(s * 0.125 + m, -1) end},
  {"softmax(s * 0.125 + m), 2x12x1024x1024 (100 MB)", {2, 12, 1024, 1024}, {2, 1, 1, 1024},
   function(s, m) return nd.softmax(s * 0.125 + m, -1) end},
  {"layer_norm(e + p), 8x128x768 (BERT's embeddings)", {8, 128, 768}, {128, 768},
   function(e, p) return nd.F.layer_norm(e + p, {e:size(-1)}) end},
}
if quick then
  cases = {{"softmax(s * 0.125 + m), quick", {2, 3, 16, 16}, {2, 1, 1, 16}, cases[1][4]},
           {"layer_norm(e + p), quick", {2, 8, 32}, {8, 32}, cases[3][4]}}
end
for _, c in ipairs(cases) do
  local a, b = nd.randn(c[2]), nd.randn(c[3])
  local fn = c[4]
  local cf = nd.compile(fn)
  local eager = function() return nd.no_grad(function() return fn(a, b) end) end
  local compiled = function() return cf(a, b) end
  for _ = 1, 3 do eager(); compiled() end
  local te, tc = {}, {}
  for r = 1, rounds do
    te[r] = C.per_iter(eager, 3, 3, 1) * 1e3
    tc[r] = C.per_iter(compiled, 3, 3, 1) * 1e3
  end
  local rec = cf.last.graph:records()[1]
  local report = nd.profile(function() for _ = 1, 5 do compiled() end end)
  local kernel = 0
  for name, row in pairs(report.by_name) do
    if name:match("^compiled:") then kernel = kernel + row.self_ms end
  end
  print(("%-52s eager %.3f ms, compiled %.3f ms (kernels %.3f ms; first record %s%s)"):format(
    c[1], C.median_of(te), C.median_of(tc), kernel / 5, rec.entry, rec.detail and ("." .. rec.detail) or ""))
end
