-- errors_spec.lua - bad calls raise clean Lua errors ("<where>: needle.<op>:
-- <what was wrong>") with a message that says what was wrong; never a crash.
--
--   build/needle-lua spec/run.lua spec/errors_spec.lua
--
-- Table-driven: each case is a name, a function making the bad call, and
-- the fragments its message must contain. A fragment may be a list of
-- alternatives ({any = {"a", "b"}}: one of them must appear).

local nd = require "needle"

local function x23() return nd.ones({2, 3}) end

-- A tensor that was closed by a to-be-closed variable, still referenced.
local function closed_tensor()
  local ref
  do
    local x <close> = nd.zeros({2})
    ref = x
  end
  return ref
end

local cases = {
  -- shape mismatch
  {"broadcast mismatch in +", function() return x23() + nd.ones({4, 5}) end,
   {"needle.add", "{2,3}", "{4,5}"}},
  {"broadcast mismatch in *", function() return x23() * nd.ones({3, 2}) end,
   {"needle.mul", "{2,3}", "{3,2}"}},
  {"matmul inner dims (as API.md)", function() return nd.matmul(nd.ones({2, 3}), nd.ones({4, 5})) end,
   {"needle.matmul: shapes {2,3} and {4,5} do not match (3 ~= 4)"}},
  {"cat of different shapes", function() return nd.cat({nd.ones({2, 2}), nd.ones({3, 3})}) end,
   {"needle.cat", "{2,2}", "{3,3}"}},
  {"stack of different shapes", function() return nd.stack({nd.ones({2}), nd.ones({3})}) end,
   {"needle.stack", "{2}", "{3}"}},
  {"view with the wrong element count", function() return nd.ones({6}):view({4, 2}) end,
   {"needle.view", "{4,2}"}},
  {"reshape with the wrong element count", function() return nd.ones({6}):reshape({5}) end,
   {"needle.reshape", "{5}", "{6}"}},
  {"two -1 in a shape", function() return nd.ones({6}):view({-1, -1}) end,
   {"needle.view", "-1"}},
  {"expand of a non-1 dim", function() return nd.ones({3}):expand({2, 4}) end,
   {"needle.expand"}},
  {"index assignment of a wrong shape", function() local x = x23(); x[1] = nd.ones({2}) end,
   {"needle."}},
  {"split sizes that do not sum", function() return nd.ones({5}):split({2, 2}) end,
   {"needle.split", "sum"}},
  {"grad of the wrong shape", function() local x = x23(); x.grad = nd.ones({3}) end,
   {"needle.grad", "{3}", "{2,3}"}},

  -- dims out of range
  {"sum over dim 3 of a 2-d tensor", function() return x23():sum(3) end,
   {"needle.sum", "dim 3", "2 dims"}},
  {"transpose with dim 5", function() return x23():transpose(1, 5) end,
   {"needle.transpose", "dim 5"}},
  {"select on dim 3", function() return x23():select(3, 1) end,
   {"needle.select", "dim 3"}},
  {"unsqueeze past the end", function() return x23():unsqueeze(5) end,
   {"needle.unsqueeze", "dim 5"}},
  {"cat along dim 3 of 2-d tensors", function() return nd.cat({x23(), x23()}, 3) end,
   {"needle.cat", "dim 3"}},
  {"flatten from dim 3", function() return x23():flatten(3) end,
   {"needle.flatten", "dim 3"}},
  {"size(-3) of a 2-d tensor", function() return x23():size(-3) end,
   {"needle.size", "-3"}},
  {"permute with a repeated dim", function() return x23():permute({1, 1}) end,
   {"needle.permute", "dim 1"}},
  {"permute with too few dims", function() return x23():permute({1}) end,
   {"needle.permute"}},
  {"pad crops to a negative size, naming the 1-based dim", function()
     return nd.ones({3}):pad({-5, 0}) end,
   {"needle.pad", "dim 1", "-2"}},
  {"topk k out of range, naming the 1-based dim", function() return nd.ones({3}):topk(4) end,
   {"needle.topk", "dim 1", "4"}},

  -- 0 dims and indices (1-based API)
  {"sum over dim 0", function() return x23():sum(0) end, {"needle.sum", "1-based"}},
  {"transpose dim 0", function() return x23():transpose(0, 1) end, {"needle.transpose", "1-based"}},
  {"squeeze dim 0", function() return x23():squeeze(0) end, {"needle.squeeze", "1-based"}},
  {"cat along dim 0", function() return nd.cat({x23(), x23()}, 0) end, {"needle.cat", "1-based"}},
  {"size(0)", function() return x23():size(0) end, {"needle.size", "1-based"}},
  {"x[0]", function() return x23()[0] end, {"needle.", "1-based"}},
  {"x[{1, 0}]", function() return x23()[{1, 0}] end, {"needle.", "1-based"}},
  {"select index 0", function() return x23():select(1, 0) end, {"needle.select", "1-based"}},
  {"narrow start 0", function() return x23():narrow(1, 0, 1) end, {"needle.narrow", "1-based"}},
  {"index_select index 0", function() return x23():index_select(1, {0}) end,
   {"needle.index_select", "1-based"}},
  {"one_hot label 0", function() return nd.one_hot({0, 1}) end, {"needle.one_hot", "1-based"}},

  -- reading past an index
  {"x[5] on a dim of size 2", function() return x23()[5] end,
   {"needle.", "index 5", "dim 1", "size 2"}},
  {"x[-3] on a dim of size 2", function() return x23()[-3] end,
   {"needle.", "index -3", "size 2"}},
  {"x[{1, 4}] names dim 2 of size 3", function() return x23()[{1, 4}] end,
   {"needle.", "index 4", "dim 2", "size 3"}},
  {"select past the end", function() return x23():select(2, 4) end,
   {"needle.select", "index 4", "dim 2", "size 3"}},
  {"narrow past the end", function() return x23():narrow(2, 3, 2) end,
   {"needle.narrow", "size 3"}},
  {"range past the end", function() return x23()[{{1, 3}}] end,
   {"needle.", "size 2"}},
  {"too many indices", function() return x23()[{1, 1, 1}] end,
   {"needle.", "too many indices"}},
  {"too many indices names the indexed tensor's shape, not the view's", function()
     return nd.zeros({3, 4})[{1, 1, 1}] end,
   {"needle.index: too many indices (3) for a tensor of shape {3,4}"}},
  {"too many indices with ':' names the indexed tensor's shape", function()
     return nd.zeros({3, 4})[{1, ":", ":"}] end,
   {"needle.index: too many indices (3) for a tensor of shape {3,4}"}},
  {"gather index past the end", function() return x23():gather(2, {{4, 1, 1}, {1, 1, 1}}) end,
   {"needle.gather", "index 4", "size 3"}},
  {"index_select index past the end", function() return x23():index_select(1, {3}) end,
   {"needle.index_select", "index 3", "size 2"}},
  {"one_hot label above num_classes", function() return nd.one_hot({1, 4}, 3) end,
   {"needle.one_hot", "4", "3"}},

  -- wrong argument types
  {"zeros of a string", function() return nd.zeros("a") end, {"needle.zeros", "string"}},
  {"zeros with a string size", function() return nd.zeros({2, "a"}) end,
   {"needle.zeros", "integer", "string"}},
  {"zeros with a fractional size", function() return nd.zeros({2.5}) end,
   {"needle.zeros", "integer", "2.5"}},
  {"zeros with a NaN size", function() return nd.zeros({0 / 0}) end,
   {"needle.zeros", "integer"}},
  {"zeros with a string after the sizes", function() return nd.zeros(2, "a") end,
   {"needle.zeros", "string"}},
  {"reshape of a string", function() return x23():reshape("foo") end,
   {"needle.reshape", "string"}},
  {"tensor + string", function() return x23() + "abc" end, {"needle.add", "string"}},
  -- "abc" * x: the string metamethod runs first and calls ours, so level 1 is a C
  -- function and the message has no position; only the text is checked.
  {"string * tensor", function() return "abc" * x23() end, {"needle.mul", "string"}, where = false},
  {"nd.exp of a string", function() return nd.exp("a") end, {"needle.exp", "string"}},
  {"cat of a number", function() return nd.cat(5) end, {"needle.cat", "number"}},
  {"cat of a list with a number", function() return nd.cat({x23(), 5}) end,
   {"needle.cat", "number"}},
  {"cat of an empty list", function() return nd.cat({}) end, {"needle.cat"}},
  {"unknown dtype", function() return nd.zeros({2}, {dtype = "float7"}) end,
   {"needle.zeros", "float7"}},
  {"dtype that is not a string", function() return nd.zeros({2}, {dtype = 3}) end,
   {"needle.zeros", "dtype"}},
  {"to an unknown dtype", function() return x23():to("float7") end, {"needle.to", "float7"}},
  {"unavailable device", function() return nd.zeros({2}, {device = "tpu"}) end,
   {"needle.zeros", "tpu"}},
  {"setting an unknown field", function() local x = x23(); x.foo = 1 end,
   {"needle.", "foo"}},
  {"requires_grad on an int tensor", function()
     local x = nd.zeros({2}, {dtype = "int64"}); x.requires_grad = true end,
   {"needle.requires_grad", "floating point"}},
  {"gather with a float index", function() return x23():gather(1, nd.ones({1, 3})) end,
   {"needle.gather", "float32"}},
  {"x[1.5]", function() return x23()[1.5] end, {"needle.", "integer", "1.5"}},
  {"indexing with a tensor", function() return x23()[nd.ones({1})] end, {"needle.index"}},
  {"dim given as a string", function() return x23():sum("a") end, {"needle.sum", "string"}},
  {"set_num_threads(0)", function() nd.set_num_threads(0) end, {"needle.set_num_threads"}},

  -- non-numbers and ragged nested tables
  {"ragged nested table", function() return nd.tensor({{1, 2}, {3}}) end,
   {"needle.tensor", "ragged", "{2}"}},
  {"number where a row belongs", function() return nd.tensor({{1, 2}, 3}) end,
   {"needle.tensor", "{2}"}},
  {"string element", function() return nd.tensor({1, "a"}) end,
   {"needle.tensor", "{2}", "string"}},
  {"nil hole / function element", function() return nd.tensor({{1, 2}, {3, print}}) end,
   {"needle.tensor", "{2,2}", "function"}},
  {"nesting deeper than 8", function()
     local t = 1
     for _ = 1, 9 do t = {t} end
     return nd.tensor(t) end,
   {"needle.tensor", "8"}},
  {"ragged table in arithmetic", function() return x23() + {{1, 2}, {3}} end,
   {"needle.", "ragged"}},

  -- negative sizes
  {"zeros({-1})", function() return nd.zeros({-1}) end, {"needle.zeros", "-1"}},
  {"ones(2, -3)", function() return nd.ones(2, -3) end, {"needle.ones", "-3"}},
  {"full({-2}, 1)", function() return nd.full({-2}, 1) end, {"needle.full", "-2"}},
  {"rand({-4})", function() return nd.rand({-4}) end, {"needle.rand", "-4"}},
  {"eye(-1)", function() return nd.eye(-1) end, {"needle.eye", "-1"}},
  {"randperm(-1)", function() return nd.randperm(-1) end, {"needle.randperm", "-1"}},
  {"linspace with -1 steps", function() return nd.linspace(0, 1, -1) end,
   {"needle.linspace", "-1"}},
  {"split size 0", function() return nd.ones({4}):split(0) end, {"needle.split", "0"}},
  {"chunk(0)", function() return nd.ones({4}):chunk(0) end, {"needle.chunk", "0"}},
  {"arange with step 0", function() return nd.arange(0, 10, 0) end, {"needle.arange", "step"}},

  -- absurd sizes: a Lua error, never a crash
  {"zeros({1e6,1e6,1e6}) is too large", function() return nd.zeros({1e6, 1e6, 1e6}) end,
   {{any = {"too large", "memory"}}}},
  {"zeros({1e6,1e6,1e6}) error names zeros", function() return nd.zeros({1e6, 1e6, 1e6}) end,
   {"needle.zeros:"}},
  {"zeros with numel overflowing int64", function() return nd.zeros({2 ^ 31, 2 ^ 31, 2 ^ 31}) end,
   {{any = {"too large", "memory"}}}},
  {"zeros({maxinteger})", function() return nd.zeros({math.maxinteger}) end,
   {{any = {"too large", "memory"}}}},
  {"rand of an absurd shape", function() return nd.rand({1e6, 1e6, 1e6}) end,
   {"needle.rand", {any = {"too large", "memory"}}}},
  {"full of an absurd shape names full", function() return nd.full({1e6, 1e6, 1e6}, 1) end,
   {"needle.full:", {any = {"too large", "memory"}}}},
  {"expand to an absurd shape", function() return nd.ones({1, 1}):expand({2 ^ 40, 2 ^ 40}) end,
   {"needle.expand", {any = {"too large", "memory"}}}},
  {"arange of 1e30 elements", function() return nd.arange(0, 1e30) end,
   {"needle.arange", {any = {"too large", "too many", "memory"}}}},
  -- More than this process can ever have (physical memory plus swap, or its
  -- cgroup's limit: nd.devices()[1].memory) is refused before any memory is
  -- touched, whatever the kernel's overcommit policy: on a machine that
  -- overcommits, zeros({2^40}) used to zero-fill until the kernel killed the
  -- process (issue 15, item 13). These machines have far less than 3.6 TiB.
  {"zeros({2^40}) is refused before it touches memory", function() return nd.zeros({2 ^ 40}) end,
   {"needle.zeros: cannot allocate a float32 tensor of shape {1099511627776}: 4.0 TiB is more than the",
    "of memory this process can have"}},
  {"eye(1e6) is refused before it touches memory", function() return nd.eye(1e6) end,
   {"needle.eye:", "{1000000,1000000}", "3.6 TiB", "of memory this process can have"}},
  {"one float64 element past the memory limit", function()
     return nd.empty({nd.devices()[1].memory // 8 + 1}, {dtype = "float64"})
   end, {"needle.empty:", "float64", "of memory this process can have"}},
  {"tobytes of a view too large for a string names the op and the size", function()
     local s = nd.zeros({1}):expand({2 ^ 46}):tobytes(); return s end,
   {"needle.tobytes: a string of 281474976710656 bytes (256.0 TiB, a float32 tensor of "
    .. "shape {70368744177664}) is more than the", "of memory this process can have"}},
  {"tobytes of a view past the memory limit is refused before Lua allocates", function()
     local s = nd.zeros({1}, {dtype = "uint8"}):expand({nd.devices()[1].memory + 1}):tobytes(); return s end,
   {"needle.tobytes: a string of", "of memory this process can have"}},
  {"too many dims", function() return nd.zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}) end,
   {"needle.zeros", "8"}},

  -- use after close
  {"arithmetic on a closed tensor", function() return closed_tensor() + 1 end,
   {"needle", "closed"}},
  {"shape of a closed tensor", function() return closed_tensor().shape end, {"needle", "closed"}},
  {"method on a closed tensor", function() return closed_tensor():numel() end,
   {"needle", "closed"}},
  {"indexing a closed tensor", function() return closed_tensor()[1] end, {"needle", "closed"}},
  {"writing into a closed tensor", function() local c = closed_tensor(); c[1] = 2 end,
   {"needle", "closed"}},
  {"a closed tensor as an argument", function() return x23():sum() + closed_tensor() end,
   {"needle", "closed"}},
  {"a closed tensor in a cat list", function() return nd.cat({nd.ones({2}), closed_tensor()}) end,
   {"needle", "closed"}},
  {"printing a closed tensor", function() return tostring(closed_tensor()) end,
   {"needle", "closed"}, where = false},
}

local function check_case(case)
  local name, fn, fragments = case[1], case[2], case[3]
  local ok, msg = pcall(fn)
  if ok then
    error(("%s: expected an error, the call succeeded"):format(name), 0)
  end
  assert.are.equal("string", type(msg), name .. ": error value is not a string")
  for _, frag in ipairs(fragments) do
    if type(frag) == "table" then
      local found = false
      for _, alt in ipairs(frag.any) do
        if string.find(msg, alt, 1, true) then found = true end
      end
      assert(found, ("%s: expected one of {%s} in %q"):format(name, table.concat(frag.any, ", "), msg))
    else
      assert(string.find(msg, frag, 1, true), ("%s: expected %q in %q"):format(name, frag, msg))
    end
  end
  if case.where ~= false then
    -- raised at the caller's position (error level 1), not inside the library
    assert(string.find(msg, "errors_spec.lua:", 1, true),
      ("%s: expected a position in errors_spec.lua, got %q"):format(name, msg))
  end
end

describe("bad calls raise clean errors:", function()
  for _, case in ipairs(cases) do
    it(case[1], function() check_case(case) end)
  end
end)

describe("after errors", function()
  it("the library keeps working", function()
    for _, case in ipairs(cases) do pcall(case[2]) end
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.same({{2, 4}, {6, 8}}, (x * 2):totable())
  end)

  it("a failed index assignment leaves the tensor unchanged", function()
    local x = nd.zeros({2, 3})
    pcall(function() x[{1, 5}] = 1 end)
    pcall(function() x[1] = nd.ones({2}) end)
    pcall(function() x[{":", 1}] = {1, 2, 3} end)
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, x:totable())
  end)

  it("closing twice and collecting a closed tensor are harmless", function()
    local ref
    do
      local x <close> = nd.zeros({4})
      ref = x
    end
    local mt = getmetatable(ref)
    assert.is_true(pcall(mt.__close, ref))
    ref = nil
    collectgarbage()
    collectgarbage()
    assert.are.same({1, 1}, nd.ones({2}):totable())
  end)

  it("a view outlives its closed base", function()
    local v
    do
      local x <close> = nd.arange(6)
      v = x[{{2, 4}}]
    end
    assert.are.same({1, 2, 3}, v:totable())
  end)
end)
