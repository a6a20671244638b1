-- row_prologue_bench_spec.lua - scripts/bench/row_prologue.lua runs end to end
-- (small sizes) and its compiled calls take the row-kernel prologue it measures.
local H = require "spec.helpers.scripts"

describe("scripts/bench/row_prologue.lua", function()
  it("prints eager and compiled times with the fused_rows records it measures", function()
    local ok, text = H.runner("bench/row_prologue")("1 quick")
    assert(ok, text)
    assert.truthy(text:find("softmax(s * 0.125 + m), quick", 1, true), text)
    assert.truthy(text:find("first record fused_rows.mul+add>softmax", 1, true), text)
    assert.truthy(text:find("first record fused_rows.add>layer_norm", 1, true), text)
    assert.truthy(text:match("eager %d+%.%d+ ms, compiled %d+%.%d+ ms"), text)
  end)
end)
