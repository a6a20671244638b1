-- sequence_kernels_bench_spec.lua - scripts/bench/sequence_kernels.lua runs end to
-- end at --quick sizes: a row for the attention case with both paths' times and
-- memory, and a row per recurrent module (each also with its per-step cells); its options are checked. No timing
-- thresholds.
local H = require "spec.helpers.scripts"

describe("scripts/bench/sequence_kernels.lua", function()
  local run = H.runner("bench/sequence_kernels")

  it("times the fused attention against the composed ops, and the LSTM and GRU", function()
    local ok, text = run("--quick --threads 1")
    assert(ok, text)
    assert.truthy(text:find("needle sequence kernels on cpu, 1 thread(s), --quick", 1, true), text)
    assert.truthy(text:match("B1 H2 L16 D8, dropout 0%.1%s+%d+%.%d+%s+%d+%.%d+%s+%d+%.%d+x%s+%d+%.%d+%s+%d+%.%d+"), text)
    local num = "%s+%d+%.%d+%s+%d+%.%d+"
    assert.truthy(text:match("nn%.LSTM %(core%._lstm_layer%), 3 steps, batch 2, 4 %-> 8" .. num), text)
    assert.truthy(text:match("nn%.LSTM, per%-step cells, 3 steps, batch 2, 4 %-> 8" .. num), text)
    assert.truthy(text:match("nn%.GRU %(core%._gru_layer%), 3 steps, batch 2, 4 %-> 8" .. num), text)
    assert.truthy(text:match("nn%.GRU, per%-step cells, 3 steps, batch 2, 4 %-> 8" .. num), text)
  end)

  it("refuses an unknown option, naming the valid ones", function()
    local ok, text = run("--quik")
    assert.is_false(ok)
    assert.truthy(text:find("unknown argument '--quik' (valid: --device DEV, --threads N, --quick)", 1, true), text)
  end)
end)
