-- fuzz_findings_spec.lua - what the libFuzzer harnesses (tests/fuzz/,
-- docs/fuzzing.md) found, kept as regression checks. Each reproducer sits
-- in spec/fixtures/fuzz/: a raw pickle found by fuzz_pickle is wrapped into
-- a minimal torch zip (tests/fuzz/wrap_pickle.py) so that it goes through
-- nd.load_torch like a real checkpoint. A file either loads to the value
-- given here or fails with a clean "needle.<loader>: '<path>': ..." error
-- holding the given text; the sanitizer build runs this spec too, which is
-- where the original crashes showed.
local nd = require "needle"

local DIR = "spec/fixtures/fuzz/"

-- {file, loader, error = substring} or {file, loader, check = function(value)}
local findings = {
  -- fuzz_pickle, first minute: MARK followed by TUPLE before any value was
  -- pushed computed `stack + 0` on a NULL stack (UBSan: applying zero offset
  -- to null pointer). The artifact itself goes on to an OBJ opcode.
  {file = "pickle_mark_tuple_empty_stack.pt", loader = "load_torch",
   error = "opcode OBJ (0x6f) is not supported"},
  -- the same bug reduced: PROTO 2, MARK, TUPLE, STOP is a valid empty tuple
  {file = "pickle_mark_tuple_at_start.pt", loader = "load_torch",
   check = function(v) assert.are.equal("table", type(v)); assert.are.equal(0, #v) end},
  -- fuzz_torch_load: a timeout in the harness's own tree walk. DUP and
  -- TUPLE3 build ((t,t,t),(t,t,t),...): a DAG of 150 bytes that is a tree of
  -- 3^40 nodes. The readers visit each shared node once (torch_load.c's walk,
  -- lt_torch.c's table memo), so nd.load_torch returns at once with shared
  -- subtables; the harnesses now count their visits too.
  {file = "harness_dag_tuples.pt", loader = "load_torch",
   check = function(v)
     assert.are.equal("table", type(v))
     assert.are.equal(3, #v)
   end},
}

describe("fuzz findings", function()
  for _, f in ipairs(findings) do
    it(f.file .. " (" .. f.loader .. ")", function()
      local path = DIR .. f.file
      local t0 = os.clock()
      local ok, res = pcall(nd[f.loader], path)
      assert.truthy(os.clock() - t0 < 5, path .. " took " .. (os.clock() - t0) .. " s")
      if f.error then
        assert.is_false(ok, path .. " was accepted")
        res = tostring(res)
        assert.truthy(res:find("needle." .. f.loader .. ": '" .. path .. "'", 1, true), res)
        assert.truthy(res:find(f.error, 1, true), res)
      else
        assert.is_true(ok, tostring(res))
        f.check(res)
      end
    end)
  end

  it("lists every file of spec/fixtures/fuzz/", function()
    local listed = {}
    for _, f in ipairs(findings) do listed[f.file] = true end
    local lfs = require "lfs"
    for name in lfs.dir(DIR) do
      if name:match("%.pt$") or name:match("%.safetensors$") or name:match("%.zip$") then
        assert.truthy(listed[name], name .. " is not checked by fuzz_findings_spec.lua")
      end
    end
  end)
end)
