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
  -- constructors' numbers: the op and the argument named (not "bad argument #2 to 'full'")
  {"full with a string value", function() return nd.full({2}, "a") end, {"needle.full: value must be a number, got string"}},
  {"linspace without steps", function() return nd.linspace(0, 1) end, {"needle.linspace: steps must be an integer, got no value"}},
  {"randint with a fractional high", function() return nd.randint(0, 2.5, {3}) end,
   {"needle.randint: high must be an integer, got 2.5"}},
  {"eye of 2.5 rows", function() return nd.eye(2.5) end, {"needle.eye: n must be an integer, got 2.5"}},
  {"randperm of 2.5", function() return nd.randperm(2.5) end, {"needle.randperm: n must be an integer, got 2.5"}},
  {"manual_seed of 2.5", function() return nd.manual_seed(2.5) end, {"needle.manual_seed: seed must be an integer, got 2.5"}},
  {"zeros with an argument after its options", function() return nd.zeros({2}, {}, 5) end,
   {"needle.zeros: the options table is the last argument, got an extra argument #3 (number)"}},
  {"randn of sizes with one after its options", function() return nd.randn(2, 3, {}, true) end,
   {"needle.randn: the options table is the last argument, got an extra argument #4 (boolean)"}},
  {"tensor with an argument after its options", function() return nd.tensor({1}, {}, 5) end,
   {"needle.tensor: takes tensor(data[, opts]) only, got an extra argument #3 (number)"}},
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

  -- missing methods and fields (issue 20): an error naming the closest name
  {"a misspelt tensor method", function() return x23():resahpe(6) end,
   {"needle: no method 'resahpe' on a tensor; did you mean 'reshape'?"}},
  {"a misspelt tensor field", function() return x23().shpae end,
   {"needle: no field 'shpae' on a tensor; did you mean 'shape'?"}},
  {"a method name in the wrong case", function() return x23():Sum() end,
   {"needle: no method 'Sum' on a tensor; did you mean 'sum'?"}},
  {"a name close to nothing", function() return x23():qqqqqq() end,
   {"needle: no method or field 'qqqqqq' on a tensor"}},
  {"mT below 2 dims", function() return nd.ones({3}).mT end,
   {"needle.mT: expects a matrix or a batch of matrices (at least 2 dims), got shape {3}"}},
  {"a misspelt module method", function() return nd.nn.Linear(2, 3):forwrd(nd.ones({2})) end,
   {"needle: no method 'forwrd' on module Linear; did you mean 'forward'?"}},
  {"a misspelt container method", function() return nd.nn.Sequential():apend(nd.nn.ReLU()) end,
   {"needle: no method 'apend' on module Sequential; did you mean 'append'?"}},
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

-- Issue 20: names a tensor or a module does not have.
describe("missing names", function()
  local core = require "needle.core"

  it("a method added from Lua is found, and suggested when misspelt", function()
    core._methods.issue20_probe = function(x) return x:numel() end
    local ok, e = pcall(function() return x23():issue20_prob() end)
    core._methods.issue20_probe = nil
    assert.is_false(ok)
    assert.truthy(tostring(e):find("did you mean 'issue20_probe'?", 1, true), e)
  end)

  it("the properties stay readable, and nil where they are nil", function()
    local x = x23()
    assert.is_nil(x.grad)
    assert.is_nil(x.grad_fn)
    assert.is_true(x.is_leaf)
    assert.are.equal(2, x.ndim)
    local names = {}
    for _, k in ipairs(getmetatable(x).__properties) do names[k] = true end
    for _, k in ipairs({"shape", "dtype", "device", "ndim", "requires_grad", "grad", "is_leaf", "grad_fn",
                        "T", "mT"}) do
      assert.is_true(names[k], k)
    end
  end)

  it("a module still reads an absent attribute as nil unless it is a misspelt method", function()
    local m = nd.nn.Linear(2, 3, {bias = false})
    assert.is_nil(m.bias)
    assert.is_nil(m.wieght)       -- a field: not taken for a misspelling
    assert.is_nil(m.zzzzzzzz)
    assert.is_nil(m.fwd)          -- shorter than 4 letters
    assert.is_nil(m._forwrd)      -- private
    local Net = nd.nn.Module:extend("Net")
    function Net:init() self.fc = nd.nn.Linear(2, 2) end
    function Net:forward(x) return self.fc(x) end
    local ok, e = pcall(function() return Net():forwadr(nd.ones({2})) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("errors_spec.lua:%d+: needle: no method 'forwadr' on module Net; " ..
                                   "did you mean 'forward'%?"), e)
  end)
end)

describe("x.T and x.mT", function()
  local D = require "spec.helpers.devices"
  local C = require("spec.helpers.gradcheck").bind(assert)

  for _, dev in ipairs(D.all()) do
    it("on " .. dev, function()
      local x = nd.tensor({{1, 2, 3}, {4, 5, 6}}, {device = dev})
      assert.are.same({{1, 4}, {2, 5}, {3, 6}}, x.T:to("cpu"):totable())
      assert.are.same({{1, 4}, {2, 5}, {3, 6}}, x.mT:to("cpu"):totable())
      assert.is_true(x.T:shares_storage(x)) -- a view, as PyTorch's
      -- 3 dims: T reverses all of them, mT swaps the last two
      local b = nd.arange(24, {device = dev}):reshape({2, 3, 4})
      assert.are.same({4, 3, 2}, b.T.shape)
      assert.are.same({2, 4, 3}, b.mT.shape)
      local bt, bm, v = b.T:to("cpu"):totable(), b.mT:to("cpu"):totable(), b:to("cpu"):totable()
      for i = 1, 2 do for j = 1, 3 do for k = 1, 4 do
        assert.are.equal(v[i][j][k], bt[k][j][i])
        assert.are.equal(v[i][j][k], bm[i][k][j])
      end end end
      -- 0 and 1 dims: x.T is x
      assert.are.same({1, 2}, nd.tensor({1, 2}, {device = dev}).T:to("cpu"):totable())
      assert.are.same({}, nd.tensor(7, {device = dev}).T.shape)
      -- the gradient of sum(x.T * w) is w transposed back
      local leaf = nd.tensor({{1, 2, 3}, {4, 5, 6}}, {device = dev, requires_grad = true})
      local w = nd.tensor({{1, 2}, {3, 4}, {5, 6}}, {device = dev})
      ;(leaf.T * w):sum():backward()
      assert.are.same({{1, 3, 5}, {2, 4, 6}}, leaf.grad:to("cpu"):totable())
      leaf.grad = nil
      ;(leaf.mT * w):sum():backward()
      assert.are.same({{1, 3, 5}, {2, 4, 6}}, leaf.grad:to("cpu"):totable())
    end)
  end

  it("float64 gradcheck", function()
    nd.manual_seed(20)
    local G = require "spec.helpers.gradcheck"
    C.check(function(t) return t.T * t.T:exp() end, {G.leaf({2, 3, 4})})
    C.check(function(t) return t.mT * t.mT:exp() end, {G.leaf({2, 3, 4})})
  end)
end)

-- Issue 20: an error that names a line of the package although the package
-- did not raise it (a user's forward raising at level 2 names the container
-- that called it; a runtime error inside a library function names that
-- function) is moved to the user's line by the message handler.
describe("errors.at_user_line", function()
  local errors = require "needle.errors"
  local function here() return debug.getinfo(2, "l").currentline end

  it("moves a level-2 error of a user's forward from the container to the call", function()
    local My = nd.nn.Module:extend("My")
    function My:forward(_) error("needle.My: custom failure", 2) end
    local model = nd.nn.Sequential(nd.nn.Sequential(My()))
    local line
    local ok, e = xpcall(function() line = here(); return model(nd.ones({2})) end, errors.at_user_line)
    assert.is_false(ok)
    assert.are.equal(("spec/errors_spec.lua:%d: needle.My: custom failure"):format(line), e)
    -- without the handler the position is the container's (what the handler fixes)
    ok, e = pcall(model, nd.ones({2}))
    assert.truthy(tostring(e):find("nn/container.lua:%d+: needle.My: custom failure"), e)
  end)

  it("moves a runtime error inside the package to the user's line", function()
    local m = nd.nn.Linear(2, 2)
    local line
    -- (apply checks for a callable; a table whose __call is no function fails inside it)
    local not_callable = setmetatable({}, {__call = 42})
    local ok, e = xpcall(function() line = here(); return m:apply(not_callable) end, errors.at_user_line)
    assert.is_false(ok)
    assert.truthy(e:find(("^spec/errors_spec.lua:%d: attempt to call a number value"):format(line)), e)
  end)

  it("leaves the user's own positions, other messages and other values alone", function()
    local ok, e = xpcall(function() error("plain") end, errors.at_user_line)
    assert.is_false(ok)
    assert.truthy(e:find("^spec/errors_spec.lua:%d+: plain$"), e)
    ok, e = xpcall(function() error("no position", 0) end, errors.at_user_line)
    assert.are.equal("no position", e)
    local obj = {code = 7}
    ok, e = xpcall(function() error(obj) end, errors.at_user_line)
    assert.are.equal(obj, e)
  end)

  it("needle-lua reports the user's line and keeps the traceback", function()
    local S = require "spec.helpers.shell"
    local out = S.run_program("", table.concat({
      'local nd = require "needle"',
      'local My = nd.nn.Module:extend("My")',
      'function My:forward(x) error("needle.My: custom failure", 2) end',
      'local model = nd.nn.Sequential(nd.nn.Linear(2, 2), My())',
      'local y = model(nd.ones({2}))',
    }, "\n") .. "\n")
    assert.truthy(out:find("^needle%-lua: [^\n]*:5: needle%.My: custom failure\n"), out)
    assert.truthy(out:find("stack traceback:", 1, true), out)
    assert.truthy(out:find("nn/container.lua", 1, true), out) -- every frame is still there
    assert.truthy(out:find(":3: in ", 1, true), out)
  end)
end)
