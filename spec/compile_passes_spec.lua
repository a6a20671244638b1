-- compile_passes_spec.lua - the passes over a captured graph
-- (src/ops/graph_passes.c), each on its own: what it removes, what it must
-- keep, and that the replays still give the eager results.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function max_abs(a, b) return (a:double() - b:double()):abs():max():item() end

-- a compiled f with only the given passes; returns it after two calls
local function compiled(f, passes, ...)
  local cf = nd.compile(f, {passes = passes, verify = true})
  cf(...)
  cf(...)
  return cf
end

local function removed(cf, name)
  for _, p in ipairs(cf.last.passes) do if p[1] == name then return p[2] end end
  return nil
end

local function entries(cf)
  local out = {}
  for _, r in ipairs(cf.last.graph:records()) do
    local k = r.entry .. (r.detail and ("." .. r.detail) or "")
    out[k] = (out[k] or 0) + 1
  end
  return out
end

describe("pass dce", function()
  it("drops kernels whose results nothing reads", function()
    local f = function(x)
      local unused = (x * 3):exp() -- computed, never used
      local _ = unused:sum()
      return x + 1
    end
    local cf = compiled(f, {"dce"}, nd.ones(4))
    assert.are.equal(3, removed(cf, "dce"))
    assert.are.same({["binary_scalar.add"] = 1}, entries(cf))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(4) * i), f(nd.ones(4) * i))) end
  end)

  it("keeps what is seen after the call: outputs, arguments updated in place, parameters", function()
    local w = nd.ones(3)
    local f = function(x)
      x:mul_(2)          -- an argument updated in place
      w:add_(1)          -- a tensor from outside
      local y = x * 5    -- an output
      return y
    end
    local cf = compiled(f, {"dce"}, nd.ones(3))
    assert.are.equal(0, removed(cf, "dce"))
    for i = 1, 3 do -- replays: the argument and w still change
      local x = nd.ones(3) * i
      local before = w:clone()
      cf(x)
      assert.are.equal(0, max_abs(x, nd.ones(3) * 2 * i))
      assert.are.equal(0, max_abs(w, before + 1))
    end
  end)

  it("keeps index kernels whose results are unused (their bounds checks must still refuse)", function()
    local table_ = nd.randn(10, 2)
    local f = function(ids) local _ = table_:index_select(1, ids); return ids * 1 end
    local cf = compiled(f, {"dce"}, nd.tensor({1, 2}, {dtype = "int64"}))
    assert.are.equal(1, entries(cf).index_select)
    assert_contains(errmsg(cf, nd.tensor({1, 99}, {dtype = "int64"})), "out of bounds")
  end)

  it("keeps random draws (the stream must advance as eagerly) and host checks", function()
    local f = function(x, y)
      local _ = nd.F.dropout(x, 0.5, true) -- unused, but it draws
      local _ = nd.F.cross_entropy(x, y)   -- unused, but it checks the labels
      return x * 2
    end
    local x, y = nd.randn(3, 4), nd.tensor({1, 2, 3}, {dtype = "int64"})
    local cf = compiled(f, {"dce"}, x, y)
    local e = entries(cf)
    assert(e.random and e.random >= 1, "the dropout draw was dropped")
    assert(e.host_check and e.host_check >= 1, "the label check was dropped")
    assert_contains(errmsg(cf, x, nd.tensor({1, 2, 9}, {dtype = "int64"})), "out of range")
  end)

  it("drops a store that a later whole write overwrites before any read", function()
    local out = nd.zeros(3)
    local f = function(x)
      out:copy_(x * 2)   -- overwritten below before anyone reads it
      out:copy_(x * 3)
      return out * 1
    end
    local cf = compiled(f, {"dce"}, nd.ones(3))
    assert.are.equal(2, removed(cf, "dce"))
    assert.are.equal(9, cf(nd.ones(3)):sum():item())
  end)
end)

describe("pass cse", function()
  it("computes a repeated kernel once, and its readers read the first result", function()
    local f = function(x)
      local a = (x * 2):exp()
      local b = (x * 2):exp() -- the same two kernels again
      return a + b
    end
    local cf = compiled(f, {"cse"}, nd.ones(4))
    assert.are.equal(2, removed(cf, "cse"))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(4) * i), f(nd.ones(4) * i))) end
  end)

  it("does not merge when an input changed in between", function()
    local f = function(x)
      local a = x * 2
      x:add_(1)
      local b = x * 2 -- same kernel, but x is not what it was
      return a + b
    end
    local cf = compiled(f, {"cse"}, nd.ones(2))
    assert.are.equal(0, removed(cf, "cse"))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(2) * i), f(nd.ones(2) * i))) end
  end)

  it("does not merge different scalars, outputs seen outside, or random draws", function()
    local keep
    local f = function(x)
      local a = x * 2
      local b = x * 3
      keep = x * 2 -- held by Lua after the call
      local r1, r2 = nd.F.dropout(x, 0.5, true), nd.F.dropout(x, 0.5, true)
      return a + b + r1 + r2
    end
    local cf = compiled(f, {"cse"}, nd.ones(8))
    assert.are.equal(0, removed(cf, "cse"))
    local _ = keep
  end)
end)

describe("passes option", function()
  it("runs fold, simplify, cse, dce, epilogue, join, reorder then fuse by default, none with passes = false, and refuses unknown names", function()
    local f = function(x) local _ = x * 7; return (x * 2) + (x * 2) * 1 end
    local cf = compiled(f, nil, nd.ones(2))
    assert.are.equal(1, removed(cf, "simplify")) -- the * 1
    assert.are.equal(1, removed(cf, "cse"))
    assert.are.equal(1, removed(cf, "dce"))
    assert.are.equal(1, removed(cf, "fuse")) -- x * 2 and the add: one kernel
    assert.are.equal(0, removed(cf, "epilogue")) -- no GEMM
    assert.are.equal(0, removed(cf, "reorder")) -- nothing to move
    assert.are.equal(0, removed(cf, "fold")) -- x is an argument: nothing constant
    assert.are.equal(0, removed(cf, "join")) -- no linear layer
    assert_contains(cf:explain(), "passes: fold removed 0, simplify removed 1, cse removed 1, dce removed 1, "
                    .. "epilogue removed 0, join removed 0, reorder moved 0, fuse removed 1")
    local none = compiled(f, false, nd.ones(2))
    assert.are.equal(0, #none.last.passes)
    assert_contains(errmsg(nd.compile, f, {passes = {"dce", "flod"}}),
                    "unknown pass 'flod' (valid: fold, simplify, cse, dce, epilogue, join, reorder, fuse)")
    -- a set where a list is expected would have run no pass at all
    local msg = errmsg(nd.compile, f, {passes = {fuse = false}})
    assert_contains(msg, "passes must be a list of pass names")
    assert_contains(msg, "got the key 'fuse' (to leave 'fuse' out, list the passes to run: passes = "
                         .. '{"fold", "simplify", "cse", "dce", "epilogue", "join", "reorder"})')
    assert_contains(errmsg(nd.compile, f, {passes = {"dce", [3] = "cse"}}), "got the key 3")
    local g = require("needle.core")._graph_begin()
    g:finish()
    g:plan()
    assert_contains(errmsg(g.pass, g, "dce"), "passes run before the memory plan")
    g:free()
  end)
end)

describe("pass epilogue", function()
  local D = require "spec.helpers.devices"

  for _, dev in ipairs(D.all()) do
    it("lets a GEMM add into the accumulator its result was added to (weight gradients over steps), on " .. dev, function()
      -- what autograd does with a weight used at three steps: dW = h1^T d1 + h2^T d2 + h3^T d3,
      -- each product read transposed (the weight is (out, in))
      local f = function(h1, d1, h2, d2, h3, d3)
        local acc = h1:t():matmul(d1):t() + h2:t():matmul(d2):t()
        acc = acc + h3:t():matmul(d3):t()
        return acc * 0.5
      end
      local args = {}
      for i = 1, 6 do args[i] = nd.randn(5, i % 2 == 1 and 3 or 4):to(dev) end
      local cf = compiled(f, {"epilogue"}, table.unpack(args))
      local e = entries(cf)
      -- the first add reads both products transposed into a new tensor: it stays;
      -- the second adds the third product into that tensor
      assert.are.equal(1, removed(cf, "epilogue"))
      assert.are.equal(1, e["matmul_acc"])
      assert.are.equal(1, e["binary.add"])
      for i = 1, 3 do
        local xs = {}
        for k, t in ipairs(args) do xs[k] = t * i end
        assert.are.equal(0, max_abs(cf(table.unpack(xs)), f(table.unpack(xs)))) -- the same bits
      end
    end)
  end

  it("adds into the accumulator with the same bits on the CPU in every case its GEMM has", function()
    -- the CPU's accumulating GEMM adds each tile as it stores it when the product is one
    -- K block (up to 384) of float32 into rows or columns of unit stride; otherwise (long K,
    -- float64, a strided accumulator) a product into a temporary and an add: the same bits
    local cases = {
      {"float32, rows", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{13, 7}, {7, 37}, {13, 5}, {5, 37}}},
      {"float32, transposed", function(a, b, c, d) local acc = a:matmul(b):t() * 1.5; return (acc + c:matmul(d):t()) * 2 end,
       {{29, 7}, {7, 45}, {29, 3}, {3, 45}}},
      {"float32, K over one block", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{9, 7}, {7, 40}, {9, 900}, {900, 40}}},
      {"float32, wide enough for threads", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{200, 7}, {7, 300}, {200, 100}, {100, 300}}},
      {"float64", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{6, 7}, {7, 5}, {6, 3}, {3, 5}}, "float64"},
      -- one column or one row: cpu_gemm.c's dot / axpy path adds the finished product
      {"float32, one column", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{13, 7}, {7, 1}, {13, 5}, {5, 1}}},
      {"float32, one column, transposed", function(a, b, c, d) local acc = a:matmul(b):t() * 1.5; return (acc + c:matmul(d):t()) * 2 end,
       {{1, 7}, {7, 29}, {1, 3}, {3, 29}}},
      {"float32, one row, wide enough for threads", function(a, b, c, d) local acc = a:matmul(b) * 1.5; return (acc + c:matmul(d)) * 2 end,
       {{1, 7}, {7, 6000}, {1, 380}, {380, 6000}}},
    }
    for _, case in ipairs(cases) do
      local args = {}
      for i, sh in ipairs(case[3]) do args[i] = nd.randn(sh, {dtype = case[4] or "float32"}) end
      local cf = compiled(case[2], {"epilogue"}, table.unpack(args))
      assert.are.equal(1, entries(cf)["matmul_acc"], case[1])
      for i = 1, 2 do
        local xs = {}
        for k, t in ipairs(args) do xs[k] = t * i end
        assert.are.equal(0, max_abs(cf(table.unpack(xs)), case[2](table.unpack(xs))), case[1]) -- the same bits
      end
    end
  end)

  for _, dev in ipairs(D.all()) do
    it("lets a sum add into the accumulator its result was added to (bias gradients over steps), on " .. dev, function()
      local f = function(d1, d2, d3)
        local acc = d1:sum(1) + d2:sum(1)
        acc = acc + d3:sum(1)
        return acc * 0.5
      end
      local args = {nd.randn(6, 4):to(dev), nd.randn(6, 4):to(dev), nd.randn(6, 4):to(dev)}
      local cf = compiled(f, {"epilogue"}, table.unpack(args))
      local e = entries(cf)
      local on_device = dev ~= "cpu" -- no reduce_sum_acc on the CPU
      assert.are.equal(on_device and 2 or 0, removed(cf, "epilogue"))
      assert.are.equal(on_device and 2 or nil, e["reduce_sum_acc"])
      assert.are.equal(on_device and 1 or 3, e["reduce.sum"])
      for i = 1, 3 do
        local xs = {}
        for k, t in ipairs(args) do xs[k] = t * i end
        xs[1][1][1] = -0.0
        assert.are.equal(0, max_abs(cf(table.unpack(xs)), f(table.unpack(xs)))) -- the same bits
      end
    end)
  end

  for _, dev in ipairs(D.all()) do
  it("keeps a transposed sum's add, and an empty product's (its add of zeros turns -0 into +0), on " .. dev, function()
    local cases = {
      {function(w, x) return (w * 1.5 + x:sum(1):t()) * 2 end, {nd.randn(4, 3), nd.randn(6, 3, 4)}},
      {function(w, a, b) return ((w * 0) * -1 + a:matmul(b)) * 1 end, {nd.ones(3, 4), nd.randn(3, 0), nd.randn(0, 4)}},
    }
    for k, case in ipairs(cases) do
      local args = {}
      for i, t in ipairs(case[2]) do args[i] = t:to(dev) end
      local cf = compiled(case[1], {"epilogue"}, table.unpack(args))
      assert.are.equal(0, removed(cf, "epilogue"), "case " .. k)
      for _ = 1, 2 do
        local got, want = cf(table.unpack(args)), case[1](table.unpack(args))
        assert.are.equal(0, max_abs(got, want), "case " .. k)
        assert.are.equal((1 / want):sum():item(), (1 / got):sum():item(), "case " .. k .. ": signed zeros")
      end
    end
  end)
  end

  for _, dev in ipairs(D.all()) do
  it("keeps the add where the accumulator is read after it, or Lua holds it, on " .. dev, function()
    local b, c, d = nd.randn(3, 5):to(dev), nd.randn(5, 4):to(dev), nd.randn(3, 5):to(dev)
    local kept
    local cases = {
      {1, function(b, c, d) local acc = b:matmul(c) * 1.5; return (acc + d:matmul(c)) * 2 end},
      {0, function(b, c, d)
        local acc = b:matmul(c) * 1.5
        local s = acc + d:matmul(c)
        return s * 2, acc * 3 -- acc read after the add: adding into it at the GEMM would change this
      end},
      {0, function(b, c, d)
        local acc = b:matmul(c) * 1.5
        kept = acc -- Lua holds the accumulator
        return (acc + d:matmul(c)) * 2
      end},
      {0, function(b, c, d) local acc = b:matmul(c) * 1.5; return acc + d:matmul(c) end}, -- the sum is the output
      -- a chain whose first sum is read after the second add: only the first add goes
      -- (found by review: the second GEMM added into the partial sum still to be read)
      {1, function(b, c, d)
        local h = b:matmul(c) * 1.5
        local s1 = h + d:matmul(c)
        local s2 = s1 + (b * 2):matmul(c)
        return s2 * s1
      end},
    }
    for k, case in ipairs(cases) do
      local cf = compiled(case[2], {"epilogue"}, b, c, d)
      assert.are.equal(case[1], removed(cf, "epilogue"), "case " .. k)
      local got, want = {cf(b, c, d)}, {case[2](b, c, d)}
      for i = 1, #want do assert.are.equal(0, max_abs(got[i], want[i]), "case " .. k) end
    end
  end)
  end
end)

describe("pass epilogue: residuals", function()
  -- the record of the first fused layer kernel, and how many tensors it holds
  local function layer(cf)
    for _, r in ipairs(cf.last.graph:records()) do
      if r.entry == "linear_fused" or r.entry:find("^conv2d_fused") then return r, #r.args end
    end
  end
  local function run_same(cf, f, args, what)
    for i = 1, 2 do
      local xs = {}
      for k, t in ipairs(args) do xs[k] = t * i end
      local got, want = cf(table.unpack(xs)), f(table.unpack(xs))
      assert.are.equal(0, max_abs(got, want), what) -- the same bits
      assert.are.equal((1 / want):sum():item(), (1 / got):sum():item(), what .. ": signed zeros")
    end
  end

  it("adds a residual in a linear kernel's epilogue, after its ReLU, with the same bits on every path", function()
    local nn = nd.nn
    -- rows: 500 (needle's GEMM, the residual added to each tile), 5 (the small-M kernel,
    -- then an add), float64 (BLAS, then an add)
    for _, case in ipairs({{500, "float32"}, {5, "float32"}, {7, "float64"}}) do
      local m, dt = case[1], case[2]
      local lin = nn.Linear(24, 24):to({dtype = dt})
      for _, relu in ipairs({false, true}) do
        local f = function(x)
          return nd.no_grad(function()
            local y = lin(x)
            if relu then y = nd.relu(y) end
            return (x + y) * 1 -- (the add's result not the output: any kernel may write it)
          end)
        end
        local x = nd.randn({m, 24}, {dtype = dt})
        x[1][1] = -0.0
        local cf = compiled(f, {"epilogue"}, x)
        local what = ("%d rows, %s, relu %s"):format(m, dt, tostring(relu))
        local e = entries(cf)
        assert.is_nil(e["binary.add"], what)
        assert.is_nil(e["unary.relu"], what)
        local r, nargs = layer(cf)
        assert.are.equal("linear_fused", r.entry, what)
        assert.are.equal(5, nargs, what)
        run_same(cf, f, {x}, what)
      end
    end
  end)

  it("makes a GELU after a linear or convolution kernel its activation, with the same bits", function()
    -- (rows 500: needle's GEMM applies it to each tile; 6: after the small-M kernel)
    for _, rows in ipairs({500, 6}) do
      local lin = nd.nn.Linear(24, 40)
      local f = function(x) return nd.no_grad(function() return nd.F.gelu(lin(x)) * 1 end) end
      local x = nd.randn({rows, 24}) * 3
      x[1][1] = 0 / 0
      local cf = compiled(f, {"epilogue"}, x)
      assert.is_nil(entries(cf)["unary.gelu"], rows)
      local got, want = cf(x), f(x)
      assert.is_true(got[1][1] ~= got[1][1], "NaN stays NaN")
      got[1]:fill_(0); want[1]:fill_(0)
      assert.are.equal(0, max_abs(got, want), rows)
    end
    local conv = nd.nn.Conv2d(3, 8, 3, {padding = 1})
    conv:eval()
    local g = function(x) return nd.no_grad(function() return (x:sum(2, true) + nd.F.gelu(conv(x))) * 1 end) end
    local x = nd.randn({2, 3, 9, 9}) * 2
    for _, passes in ipairs({{"epilogue"}, {"fold", "epilogue"}}) do
      local cf = compiled(g, passes, x)
      assert.is_nil(entries(cf)["unary.gelu"])
      assert.are.equal(0, max_abs(cf(x), g(x)))
    end
  end)

  it("adds a residual in a convolution's epilogue (ResNet9's x + relu(conv(x)))", function()
    local conv = nd.nn.Conv2d(8, 8, 3, {padding = 1})
    conv:eval()
    local f = function(x) return nd.no_grad(function() return (x + nd.relu(conv(x))) * 1 end) end
    local x = nd.randn({2, 8, 9, 9})
    for _, passes in ipairs({{"epilogue"}, {"fold", "epilogue"}}) do -- the plain and the prepacked kernel
      local cf = compiled(f, passes, x)
      local r, nargs = layer(cf)
      assert.are.equal(5, nargs, r.entry)
      assert.is_nil(entries(cf)["binary.add"])
      run_same(cf, f, {x}, r.entry)
    end
  end)

  it("keeps the add where moving it would change a result", function()
    local lin = nd.nn.Linear(6, 6)
    local w = nd.randn({6, 6})
    local cases = {
      -- a residual of another shape (broadcast) or layout (transposed)
      {"broadcast", function(x) return nd.no_grad(function() return (lin(x) + x[1]) * 1 end) end},
      {"transposed", function(x) return nd.no_grad(function() return (lin(x) + (x * 2):t()) * 1 end) end},
      -- the residual written between the kernel and the add
      {"written between", function(x)
        return nd.no_grad(function()
          local r = x * 2
          local y = lin(x)
          r:mul_(3)
          return (y + r) * 1
        end)
      end},
      -- the kernel's result read again after the add
      {"result read again", function(x)
        return nd.no_grad(function() local y = lin(x); return (y + x) * y end)
      end},
    }
    local x = nd.randn({6, 6})
    for _, case in ipairs(cases) do
      local cf = compiled(case[2], {"epilogue"}, x)
      local _, nargs = layer(cf)
      assert.are.equal(4, nargs, case[1])
      assert.are.equal(0, max_abs(cf(x), case[2](x)), case[1])
    end
    _ = w
  end)

  it("keeps a ReLU after the residual's add a kernel of its own, also when the pass runs twice", function()
    -- relu(linear(x) + x): the kernel adds the residual after its activation, so the add
    -- moves into it and the ReLU stays; a second run must not make that ReLU the
    -- kernel's activation (relu(y) + x is another function)
    local lin = nd.nn.Linear(16, 16)
    local f = function(x) return nd.no_grad(function() return nd.relu(lin(x) + x) * 1 end) end
    local g = function(x) return nd.no_grad(function() return nd.relu(x + lin(x)) * 1 end) end
    local x = nd.randn({40, 16})
    for _, fn in ipairs({f, g}) do
      for _, passes in ipairs({{"epilogue"}, {"epilogue", "epilogue"}}) do
        local cf = compiled(fn, passes, x)
        local e = entries(cf)
        assert.are.equal(1, e["unary.relu"])
        assert.is_nil(e["binary.add"])
        local r, nargs = layer(cf)
        assert.are.equal(5, nargs)
        assert.are.equal(0, max_abs(cf(x), fn(x)))
      end
    end
  end)
end)

describe("pass join", function()
  local nn = nd.nn
  local function count(cf, entry) return entries(cf)[entry] or 0 end

  it("joins separate query, key and value layers into one product, with the same bits", function()
    -- BERT's attention as Hugging Face writes it: three Linear layers over one input
    for _, rows in ipairs({6, 500}) do -- the small-M kernel, needle's GEMM
      local q, k, v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
      local f = function(x)
        return nd.no_grad(function()
          local b, s = x:size(1), x:size(2)
          local function heads(t) return t:reshape(b, s, 4, 8):permute(1, 3, 2, 4) end
          local x2 = x:reshape(b * s, 32)
          local qh, kh, vh = heads(q(x2)), heads(k(x2)), heads(v(x2))
          local att = nd.softmax(qh:matmul(kh:transpose(3, 4)) * (1 / math.sqrt(8)), 4)
          return att:matmul(vh)
        end)
      end
      local x = nd.randn({2, rows / 2, 32})
      local cf = compiled(f, {"fold", "join"}, x)
      assert.are.equal(2, removed(cf, "join"), rows)
      assert.are.equal(1, count(cf, "linear_fused"), rows)
      assert.are.equal(0, max_abs(cf(x), f(x)), rows)
      -- the joined weight follows a change of one layer's weight (the prologue runs again)
      nd.no_grad(function() k.weight:mul_(2) end)
      assert.are.equal(0, max_abs(cf(x), f(x)), rows)
      assert.are.equal(1, cf.last.graph:stats().refolds)
    end
  end)

  it("joins layers with a ReLU made their activation, and without biases", function()
    local a, b = nn.Linear(16, 8, {bias = false}), nn.Linear(16, 24, {bias = false})
    local f = function(x) return nd.no_grad(function() return nd.relu(a(x)):t():matmul(nd.relu(b(x))) end) end
    local x = nd.randn({30, 16})
    local cf = compiled(f, {"fold", "epilogue", "join"}, x)
    assert.are.equal(1, removed(cf, "join"))
    assert.are.equal(0, count(cf, "unary.relu"))
    assert.are.equal(0, max_abs(cf(x), f(x)))
  end)

  it("leaves layers it cannot join", function()
    local a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    local nb = nn.Linear(8, 8, {bias = false})
    local ln = nn.LayerNorm(8)
    local a64, b64 = nn.Linear(8, 8):to({dtype = "float64"}), nn.Linear(8, 8):to({dtype = "float64"})
    local a3, b5 = nn.Linear(8, 3), nn.Linear(8, 5)
    local cases = {
      {"other inputs", function(x) return a(x) + b(x * 2) end},
      -- BLAS's order may follow the width; the small-M kernel sums leftover columns
      -- (past a multiple of 4) in another order (found by review: 6e-8 apart)
      {"float64", function(x) return a64(x:double()) * b64(x:double()) end},
      {"widths not multiples of 4", function(x) return a3(x):sum(2) + b5(x):sum(2) end},
      -- a whole reduction sums a slice of the joined result in another order (found by review)
      {"a whole reduction", function(x) return a(x):sum() + b(x) end},
      {"bias and no bias", function(x) return a(x) + nb(x) end},
      {"input written between", function(x)
        local y = x * 1
        local p = a(y)
        y:mul_(2)
        return p + b(y)
      end},
      -- a reader that needs a contiguous input (the layer norm): that layer stays alone
      {"a contiguous reader", function(x) return ln(a(x)) + b(x) end, 0},
      -- a result Lua keeps is no intermediate
      {"a result kept", function(x) local p = a(x); return p, p + b(x) end},
    }
    local x = nd.randn({5, 8})
    for _, case in ipairs(cases) do
      local f = function(x) return nd.no_grad(function() return case[2](x) end) end
      local cf = compiled(f, {"fold", "join"}, x)
      assert.are.equal(0, removed(cf, "join"), case[1])
      local got, want = {cf(x)}, {f(x)}
      for i = 1, #want do assert.are.equal(0, max_abs(got[i], want[i]), case[1]) end
    end
    -- a training step updates the weights: no constants, nothing joined
    local model = nn.Sequential(nn.Linear(8, 8))
    local m2 = nn.Linear(8, 8)
    local opt = nd.optim.SGD({model[1].weight, model[1].bias, m2.weight, m2.bias}, {lr = 0.1})
    local step = function(x)
      opt:zero_grad()
      local loss = (model(x) * m2(x)):sum()
      loss:backward()
      opt:step()
      return loss
    end
    local cs = compiled(step, {"fold", "join"}, x)
    assert.are.equal(0, removed(cs, "join"))
  end)

  it("leaves float32 layers alone on BLAS (NEEDLE_GEMM=openblas), whose order may follow the width", function()
    local S = require "spec.helpers.shell"
    local out = S.run_program("NEEDLE_GEMM=openblas", [[
      local nd = require "needle"
      local a, b = nd.nn.Linear(8, 8), nd.nn.Linear(8, 8)
      local f = function(x) return nd.no_grad(function() return a(x) * b(x) end) end
      local cf = nd.compile(f, {passes = {"fold", "join"}})
      local x = nd.randn({5, 8})
      cf(x); cf(x)
      for _, p in ipairs(cf.last.passes) do if p[1] == "join" then print("join removed " .. p[2]) end end
    ]])
    assert.truthy(out:find("join removed 0", 1, true), out)
  end)
end)

describe("pass reorder", function()
  local D = require "spec.helpers.devices"
  local function sequence(cf)
    local out = {}
    for _, r in ipairs(cf.last.graph:records()) do out[#out + 1] = r.entry .. (r.detail and ("." .. r.detail) or "") end
    return table.concat(out, " ")
  end

  for _, dev in ipairs(D.all()) do
    it("moves an elementwise kernel up to an earlier one of its shape, past kernels it shares nothing with, on " .. dev, function()
      -- as in the LSTM's backward: an add, two adds of other shapes, then arithmetic on the first add
      local f = function(a, b, w, v, c, d)
        local s = a + b                 -- (4, 3)
        local w2 = w + v                -- (5, 3): another shape
        local c2 = c * 2                -- (5): another shape
        return (s * 3):tanh(), w2, c2, d
      end
      local args = {nd.randn(4, 3):to(dev), nd.randn(4, 3):to(dev), nd.randn(5, 3):to(dev),
                    nd.randn(5, 3):to(dev), nd.randn(5):to(dev), nd.randn(2):to(dev)}
      local cf = compiled(f, {"reorder", "fuse"}, table.unpack(args))
      assert.are.equal(2, removed(cf, "reorder")) -- the multiply and the tanh, each above two adds
      assert.are.equal("fused_elementwise.add+mul+tanh binary.add binary_scalar.mul", sequence(cf))
      for i = 1, 3 do
        local xs = {}
        for k, t in ipairs(args) do xs[k] = t * i end
        local got, want = {cf(table.unpack(xs))}, {f(table.unpack(xs))}
        for k = 1, 3 do assert.are.equal(0, max_abs(got[k], want[k])) end
      end
    end)

    it("keeps a kernel below one that writes what it reads, or reads what it writes, on " .. dev, function()
      local f = function(a, b, w)
        local s = a + b       -- (4, 3)
        w:add_(1)             -- (5, 3), in place
        local t = s * w:sum() -- reads w after the update: cannot move above it (the sum sits between)
        local u = w * 2       -- reads the updated w: cannot move above the in-place add
        b:mul_(2)             -- writes b, which the first add read: the first add must stay above
        return t, u
      end
      local a, b, w = nd.randn(4, 3):to(dev), nd.randn(4, 3):to(dev), nd.randn(5, 3):to(dev)
      local cf = compiled(f, {"reorder"}, a, b:clone(), w:clone())
      for i = 1, 3 do
        local b1, w1, b2, w2 = b:clone() * i, w:clone() * i, b:clone() * i, w:clone() * i
        local t1, u1 = cf(a, b1, w1)
        local t2, u2 = f(a, b2, w2)
        assert.are.equal(0, max_abs(t1, t2))
        assert.are.equal(0, max_abs(u1, u2))
        assert.are.equal(0, max_abs(b1, b2))
        assert.are.equal(0, max_abs(w1, w2))
      end
    end)
  end

  it("does not move a kernel above a random draw or a host check", function()
    local f = function(a, b, p)
      local s = a + b
      local m = nd.F.dropout(p, 0.5, true) -- a random stream: a barrier
      return (s * 2):tanh(), m
    end
    local cf = compiled(f, {"reorder"}, nd.randn(4), nd.randn(4), nd.ones(6))
    assert.are.equal(0, removed(cf, "reorder"))
  end)
end)

describe("pass simplify", function()
  local D = require "spec.helpers.devices"
  for _, dev in ipairs(D.all()) do
    it("adds known zeros as a scalar +0 and drops zeros written all over before any read, on " .. dev, function()
      -- autograd's way with slices: zeros, then each slice's gradient added into its part
      local f = function(a, b)
        local z = nd.zeros({2, 8}, {device = dev})
        z:narrow(2, 1, 4):add_(a)
        z:narrow(2, 5, 4):add_(b)
        return z:tanh()
      end
      local a, b = nd.randn(2, 4):to(dev), nd.randn(2, 4):to(dev)
      local cf = compiled(f, {"simplify"}, a, b)
      local e = entries(cf)
      assert.are.equal(2, e["binary_scalar.add"]) -- a + 0 and b + 0: the zeros are not read
      assert.is_nil(e["binary.add"])
      assert.is_nil(e["fill"]) -- OpenCL's zero fill went (the CPU's zeros are no kernel)
      assert_contains(cf:explain(), "constants: 0") -- nor put back before each replay
      for i = 1, 3 do
        local x, y = nd.randn(2, 4):to(dev) * i, nd.randn(2, 4):to(dev)
        x[1][1] = -0.0 -- 0 + -0 is +0 eagerly; -0 + 0 is +0 as well
        local got, want = cf(x, y), f(x, y)
        assert.are.equal(0, max_abs(got, want))
        assert.are.equal(16, (1 / got):eq(1 / want):sum():item(), "the sign of a zero changed")
      end
    end)
  end

  it("keeps reading zeros Lua holds from call to call, and zeros read before they are overwritten", function()
    local acc
    local f = function(x)
      local z = nd.zeros(4)
      local s = z:sum() -- reads the zeros: the constant stays
      z:add_(x)
      if acc == nil then acc = nd.zeros(4) end
      acc:add_(x)       -- acc carries over between calls: not zero at a replay
      return z + s, acc * 1
    end
    local cf = nd.compile(f, {passes = {"simplify"}})
    for i = 1, 4 do
      local got = {cf(nd.ones(4) * i)}
      assert.are.equal(i * (i + 1) / 2 * 4, got[2]:sum():item())
      assert.are.equal(4 * i, got[1]:sum():item())
    end
  end)

  it("drops kernels whose result is their input (x * 1, x / 1, x - 0, x + -0, a clone)", function()
    local f = function(x)
      local y = ((x * 1) / 1 - 0 + (-0.0)):clone()
      return (y + x):exp()
    end
    local cf = compiled(f, {"simplify"}, nd.randn(4, 5))
    assert.are.equal(5, removed(cf, "simplify"))
    assert.are.same({["binary.add"] = 1, ["unary.exp"] = 1}, entries(cf))
    for i = 1, 3 do
      local x = nd.randn(4, 5) * i
      x[1][1] = -0.0 -- signed zeros stay
      assert.are.equal(0, max_abs(cf(x), f(x)))
    end
  end)

  it("keeps x + 0 (it turns -0 into +0), results seen outside, and inputs written later", function()
    local keep
    local f = function(x)
      local a = x + 0          -- not an identity: -0 + 0 is +0
      keep = x * 1             -- held by Lua after the call
      local c = x:clone()
      x:add_(1)                -- x changes after the clone: its readers must see the old x
      return a + c + x
    end
    local cf = compiled(f, {"simplify"}, nd.randn(3))
    assert.are.equal(0, removed(cf, "simplify"))
    for i = 1, 3 do
      local x1 = nd.randn(3) * i
      local x2 = x1:clone()
      assert.are.equal(0, max_abs(cf(x1), f(x2)))
      assert.are.equal(0, max_abs(x1, x2))
    end
    local _ = keep
  end)
end)

describe("pass fuse", function()
  local D = require "spec.helpers.devices"

  -- the records of cf's graph of one entry (fused_elementwise unless named)
  local function fused(cf, entry)
    local out = {}
    for _, r in ipairs(cf.last.graph:records()) do
      if r.entry == (entry or "fused_elementwise") then out[#out + 1] = r end
    end
    return out
  end

  local function writes(r)
    local n = 0
    for _, a in ipairs(r.args) do if a.role:find("w") then n = n + 1 end end
    return n
  end

  for _, dev in ipairs(D.all()) do
    it("turns a chain of elementwise kernels into one kernel that stores only its result on " .. dev, function()
      local b = nd.randn(33):to(dev)
      local f = function(x)
        local y = (x * 2 + b):sigmoid() * x - 1
        return nd.where(y:gt(0), y, y * -0.25):clamp(-0.3, 0.5) + y:tanh()
      end
      local cf = compiled(f, {"fuse"}, nd.randn(64, 33):to(dev))
      local runs = fused(cf)
      assert.are.equal(1, #cf.last.graph:records())
      assert.are.equal("mul+add+sigmoid+mul+sub+gt+mul+where+clamp+tanh+add", runs[1].detail)
      assert.are.equal(1, writes(runs[1])) -- y, the mask and the other intermediates: registers
      assert.are.equal(10, removed(cf, "fuse"))
      assert_contains(cf:explain(), "fused: 1 kernel(s) in place of 11 elementwise ones; 10 intermediate(s)")
      for _, dt in ipairs(D.fp64(dev) and {"float32", "float64"} or {"float32"}) do
        local g = nd.compile(f)
        local bb = b
        b = bb:to(dt)
        for i = 1, 3 do -- exactly the eager results (the same arithmetic, no contraction)
          local x = nd.randn(64, 33):to(dev):to(dt) * i
          assert.are.equal(0, max_abs(g(x), f(x)))
        end
        b = bb
      end
    end)

    -- NVIDIA's driver once gave a * 0.3 + c / 7 fused 1 ulp away from unfused on 60,000 of
    -- 262,144 elements (scalar division), and an Adam-trained Transformer drifted from eager:
    -- every program now asks for IEEE division and square root where the device has them
    it("agrees bit for bit with the unfused kernels on scalar operands, division and sqrt on " .. dev, function()
      nd.manual_seed(4)
      local n = 1 << 16
      local a, b, c = nd.randn(n):to(dev), nd.randn(n):to(dev), nd.randn(n):to(dev)
      local cases = {
        function(a, _, c) return a * 0.3 + c / 7 end,
        function(a, b, c) return (a / b) * c - a / 3 end,
        function(a, b) return a:abs():sqrt() / (b:abs() + 1e-3) + 0.1 end,
        function(a, b, c) return (c / 7) * 1.5 + a * b end,
        function(a, b) return a:exp() / (b:exp() + 1) end,
      }
      for k, fn in ipairs(cases) do
        local cf = nd.compile(fn)
        local out
        for _ = 1, 3 do out = cf(a, b, c) end
        assert.are.equal(1, #fused(cf), "case " .. k)
        local e = fn(a, b, c)
        assert.are.equal(0, out:ne(e):sum():item(), "case " .. k .. ": elements that differ")
      end
    end)

    it("stores a value read after the run, and updates an argument in place, on " .. dev, function()
      local f = function(x, y)
        x:mul_(2):add_(1)          -- in place, through the run
        local h = (x * y):tanh()   -- read again below, after a reduction
        local s = h:sum()
        return h * s + x, s
      end
      local x0, y = nd.randn(5, 7):to(dev), nd.randn(5, 7):to(dev)
      local cf = compiled(f, {"fuse"}, x0:clone(), y)
      local runs = fused(cf)
      assert.are.equal(2, #runs)
      assert.are.equal("mul+add+mul+tanh", runs[1].detail)
      assert.are.equal(2, writes(runs[1])) -- x (in place) and h (read by the sum and the second run)
      for i = 1, 3 do
        local xa, xb = x0:clone() * i, x0:clone() * i
        local ga, gs = cf(xa, y)
        local wa, ws = f(xb, y)
        assert.are.equal(0, max_abs(ga, wa))
        assert.are.equal(0, max_abs(gs, ws))
        assert.are.equal(0, max_abs(xa, xb)) -- the argument got the update
      end
    end)

    it("fuses writes into disjoint slices of one tensor, and copies, on " .. dev, function()
      local f = function(x)
        local out = nd.zeros({4, 12}, {device = x.device})
        out:narrow(2, 1, 4):copy_(x:sigmoid())  -- a copy into a slice
        out:narrow(2, 5, 4):add_(x * 2)         -- an update of another slice
        out:narrow(2, 9, 4):copy_(x:tanh())
        return out
      end
      local cf = compiled(f, {"fuse"}, nd.randn(4, 4):to(dev))
      local runs = fused(cf)
      assert.are.equal(1, #runs)
      assert.are.equal("sigmoid+copy+mul+add+tanh+copy", runs[1].detail)
      for i = 1, 3 do
        local x = nd.randn(4, 4):to(dev) * i
        assert.are.equal(0, max_abs(cf(x), f(x)))
      end
      -- slices that overlap (columns 3..4 in both) end the run between them
      local g = function(x)
        local out = nd.zeros({4, 12}, {device = x.device})
        out:narrow(2, 1, 4):add_(x:exp())
        out:narrow(2, 3, 4):mul_(x)
        return out
      end
      local cg = compiled(g, {"fuse"}, nd.randn(4, 4):to(dev))
      local gr = fused(cg)
      for _, r in ipairs(gr) do assert.falsy(r.detail:find("exp+add+mul", 1, true), r.detail) end
      for i = 1, 3 do
        local x = nd.randn(4, 4):to(dev) * i
        assert.are.equal(0, max_abs(cg(x), g(x)))
      end
    end)

    it("ends a run where a written tensor is read through another view on " .. dev, function()
      local f = function(x)
        local y = x * 2
        return y:t() + y -- y element (j, i) for output (i, j): not the element the run has
      end
      local cf = compiled(f, {"fuse"}, nd.randn(6, 6):to(dev))
      assert.are.equal(0, #fused(cf))
      for i = 1, 3 do
        local x = nd.randn(6, 6):to(dev) * i
        assert.are.equal(0, max_abs(cf(x), f(x)))
      end
    end)
  end

  it("runs broadcast and strided inputs larger than a tile, in parallel, exactly", function()
    local b = nd.randn(1, 257)
    local f = function(x) return ((x:t() * b):exp() - b):relu() * 0.5 end
    local cf = compiled(f, {"fuse"}, nd.randn(257, 300))
    assert.are.equal(1, #fused(cf))
    for i = 1, 3 do
      local x = nd.randn(257, 300) * i
      assert.are.equal(0, max_abs(cf(x), f(x)))
    end
  end)

  it("splits runs longer than a program's steps or with more tensors than it holds", function()
    local long = function(x) for k = 1, 60 do x = x * 1.01 + k * 1e-3 end return x end
    local cf = compiled(long, {"fuse"}, nd.randn(8))
    local runs = fused(cf)
    assert.are.equal(3, #runs) -- 120 kernels: 48 + 48 + 24 steps
    assert.are.equal(117, removed(cf, "fuse"))
    local x = nd.randn(8)
    assert.are.equal(0, max_abs(cf(x), long(x)))
    local ins = {}
    for k = 1, 20 do ins[k] = nd.randn(4) end
    local wide = function(...)
      local acc = select(1, ...)
      for k = 2, select("#", ...) do acc = acc + select(k, ...) end
      return acc
    end
    local cw = compiled(wide, {"fuse"}, table.unpack(ins))
    local wr = fused(cw)
    assert(#wr >= 2, "twenty inputs fit one program")
    for _, r in ipairs(wr) do assert(#r.args <= 16, "a program with more than 16 tensors") end
    assert.are.equal(0, max_abs(cw(table.unpack(ins)), wide(table.unpack(ins))))
  end)

  it("leaves integer kernels and runs of one kernel as they were", function()
    local f = function(x) return (x * 3 + 1) * 2 end
    local cf = compiled(f, {"fuse"}, nd.tensor({1, 2, 3}, {dtype = "int64"}))
    assert.are.equal(0, #fused(cf))
    local g = function(x) return x:sum() * 2 end
    local cg = compiled(g, {"fuse"}, nd.randn(3))
    assert.are.equal(0, #fused(cg))
  end)

  local function row_kernels(cf) return fused(cf, "fused_rows") end

  it("makes a softmax's or layer norm's input row by row in its prologue, never stored, bit for bit", function()
    nd.manual_seed(31)
    local w, b = nd.randn(3000), nd.randn(3000)
    local cases = {
      {"mul+add>softmax", function(x, m) return nd.softmax(x * 0.125 + m, -1) end, {4, 3, 9, 40}, {4, 1, 1, 40}},
      {"sub+exp>log_softmax", function(x, m) return nd.log_softmax((x - m):exp(), -1) end, {6, 33}, {33}},
      -- rows longer than a tile (the program runs in tiles inside each row), many rows (threads)
      {"add>layer_norm", function(x, m) return nd.F.layer_norm(x + m, {3000}, w, b) end, {70, 3000}, {70, 1}},
      {"mul+add>layer_norm", function(x, m) return nd.F.layer_norm(x * 2 + m, {3000}) end, {5, 3000}, {3000}},
      {"add>layer_norm", function(x, m) return nd.F.layer_norm(x + m, {3000}, w, nil) end, {3, 3000}, {3000}},
      -- strided and broadcast operands; a where on a bool mask
      {"gt+mul+where>softmax", function(x, m)
        local mt = m:t()
        return nd.softmax(nd.where(mt:gt(0), x, x * -2), -1)
      end, {7, 5}, {5, 7}},
      -- a value of the run that is also returned is still stored
      {"mul+tanh>softmax", function(x, m)
        local h = x * m
        return nd.softmax(h:tanh(), -1), h
      end, {8, 16}, {8, 16}},
    }
    for k, c in ipairs(cases) do
      for _, dt in ipairs({"float32", "float64"}) do
        local f = c[2]
        w, b = w:to(dt), b:to(dt)
        local cf = nd.compile(f, {verify = true})
        for i = 1, 3 do
          local x, m = nd.randn(c[3]):to(dt) * i, nd.randn(c[4]):to(dt)
          local got, want = table.pack(cf(x, m)), table.pack(f(x, m))
          for o = 1, want.n do
            assert.are.equal(0, got[o]:ne(want[o]):sum():item(), ("case %d %s output %d"):format(k, dt, o))
          end
        end
        local rows = row_kernels(cf)
        assert.are.equal(1, #rows, "case " .. k)
        assert.are.equal(c[1], rows[1].detail, "case " .. k)
        local gs = cf.last.graph:stats()
        assert.are.equal(1, gs.fused_rows, "case " .. k)
        assert(gs.fused_registers >= 1, "case " .. k .. ": the row kernel's input is not stored")
      end
    end
    -- explain() counts them
    local cf = nd.compile(function(x) return nd.softmax(x * 2 - 1, -1), nd.F.layer_norm(x:exp(), {6}) end)
    for _ = 1, 2 do cf(nd.randn(4, 6)) end
    assert_contains(cf:explain(), "fused: 2 kernel(s) in place of 3 elementwise ones and 2 row kernel(s) " ..
                    "(softmax, layer norm) that run theirs as a prologue, row by row")
    -- softmax: its output and the run's input x (its own input slot and x's in the
    -- program are empty); layer norm: y, mean, rstd and x (no weight, no bias)
    assert_contains(cf:explain(), "  mul+sub>softmax {4,6} cpu: 2 tensor(s)")
    assert_contains(cf:explain(), "  exp>layer_norm {4,6} cpu: 4 tensor(s)")
  end)

  it("leaves the row kernel apart where its input is needed or its rows are not the last dim", function()
    nd.manual_seed(32)
    local cases = {
      {"softmax over the first dim", function(x) return nd.softmax(x * 2, 1) end},
      {"layer norm over two dims", function(x) return nd.F.layer_norm(x * 2, {4, 6}) end},
      {"the input returned too", function(x) local y = x * 2; return nd.softmax(y, -1), y end},
      {"the input read again later", function(x) local y = x * 2; return nd.softmax(y, -1) + y end},
      {"an input of the function", function(x) return nd.softmax(x, -1) * 2 end},
    }
    for k, c in ipairs(cases) do
      local cf = nd.compile(c[2], {verify = true})
      local x = nd.randn(3, 4, 6)
      for _ = 1, 3 do
        local got, want = table.pack(cf(x)), table.pack(c[2](x))
        for o = 1, want.n do assert.are.equal(0, got[o]:ne(want[o]):sum():item(), c[1]) end
      end
      assert.are.equal(0, #row_kernels(cf), c[1])
    end
    -- training: the layer norm's backward reads its input, so the add stays a kernel of its own;
    -- the softmax's backward reads its output only, so its prologue fuses
    local w = nd.randn(6, {requires_grad = true})
    local function step(x, m)
      local y = nd.F.layer_norm(x + m, {6}, w, nil)
      local s = nd.softmax(y * 0.5 + m, -1)
      local loss = (s * s):sum()
      w.grad = nil
      loss:backward()
      return loss, w.grad
    end
    local cf = nd.compile(step, {verify = true})
    for i = 1, 3 do
      local x, m = nd.randn(5, 6) * i, nd.randn(1, 6)
      local l1, g1 = cf(x, m)
      local l2, g2 = step(x, m)
      assert.are.equal(0, max_abs(l1, l2))
      assert.are.equal(0, max_abs(g1, g2))
    end
    local rows = row_kernels(cf)
    assert.are.equal(1, #rows)
    assert.are.equal("mul+add>softmax", rows[1].detail)
  end)

  it("keeps a compiled training step bit for bit the eager one", function()
    local function make()
      nd.manual_seed(7)
      local m = nd.nn.Sequential(nd.nn.Linear(6, 8), nd.nn.Tanh(), nd.nn.Linear(8, 3))
      return m, nd.optim.Adam(m:parameters(), {lr = 1e-2})
    end
    local me, oe = make()
    local mc, oc = make()
    local function step(m, o, x, y)
      o:zero_grad()
      local loss = nd.F.cross_entropy(m(x), y)
      loss:backward()
      o:step()
      return loss
    end
    local cf = nd.compile(function(x, y) return step(mc, oc, x, y) end)
    for i = 1, 6 do
      nd.manual_seed(100 + i)
      local x, y = nd.randn(5, 6), nd.randint(1, 3, {5})
      assert.are.equal(0, max_abs(cf(x, y), step(me, oe, x, y)))
    end
    assert(#fused(cf) > 0, "the Adam update and the tanh backward have runs to fuse")
    local pe, pc = me:parameters(), mc:parameters()
    for k = 1, #pe do assert.are.equal(0, max_abs(pc[k], pe[k])) end
  end)
end)

describe("pass fold", function()
  local D = require "spec.helpers.devices"
  local nn = nd.nn

  local function rel(a, b) return max_abs(a, b) / math.max(b:double():abs():max():item(), 1e-30) end

  -- running statistics and affine parameters far from their initial values
  local function randomize_bn(bn)
    nd.no_grad(function()
      bn.running_mean:copy_(nd.randn(bn.running_mean.shape) * 0.5)
      bn.running_var:copy_(nd.rand(bn.running_var.shape) + 0.5)
      if bn.weight then bn.weight:copy_(nd.randn(bn.weight.shape)) end
      if bn.bias then bn.bias:copy_(nd.randn(bn.bias.shape)) end
    end)
  end

  for _, dev in ipairs(D.all()) do
    it("runs kernels that read only constants once, and again only when a constant changes, on " .. dev, function()
      local w = nd.randn(4):to(dev)
      local f = function(x) return x + (w * 2):exp() end
      local cf = compiled(f, {"fold"}, nd.ones(4):to(dev))
      assert.are.equal(2, removed(cf, "fold")) -- w * 2 and exp moved into the prologue
      assert.are.same({["binary.add"] = 1}, entries(cf))
      local s = cf.last.graph:stats()
      assert.are.equal(2, s.folded)
      assert.are.equal(1, s.fold_sources)
      for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(4):to(dev) * i), f(nd.ones(4):to(dev) * i))) end
      assert.are.equal(0, cf.last.graph:stats().refolds)
      nd.no_grad(function() w:copy_(nd.randn(4)) end) -- a new value: the next replay folds again
      assert.are.equal(0, max_abs(cf(nd.ones(4):to(dev)), f(nd.ones(4):to(dev))))
      w:mul_(3) -- an in-place op bumps the version as well
      assert.are.equal(0, max_abs(cf(nd.ones(4):to(dev)), f(nd.ones(4):to(dev))))
      assert.are.equal(2, cf.last.graph:stats().refolds)
      assert_contains(cf:explain(), "folded: 2 kernel(s) computed from constants")
    end)
  end

  it("leaves arguments, tensors the function writes, random draws and host checks alone", function()
    local w, v = nd.ones(3), nd.randn(3)
    local labels = nd.tensor({1, 2}, {dtype = "int64"})
    local f = function(x)
      w:add_(1)                         -- written by the graph: not a constant
      local a = (x * 2) + (w * 3)       -- x is an argument
      local r = nd.F.dropout(v, 0.5, true) -- a draw reads only v, but must draw anew
      local l = nd.F.cross_entropy(v:reshape(1, 3):expand(2, 3), labels) -- its label check reruns
      return a + r + l
    end
    local cf = compiled(f, {"fold"}, nd.ones(3))
    local e = entries(cf)
    assert.are.equal(1, e["random"])
    assert.are.equal(1, e["host_check"]) -- the labels
    assert.are.equal(1, e["binary_scalar.lt"]) -- dropout's mask from its uniforms, drawn anew
    assert.are.equal(1, e["cross_entropy"])
    assert.are.equal(1, e["binary_scalar.add"]) -- w:add_(1)
    assert.are.equal(3, e["binary_scalar.mul"]) -- x * 2, w * 3, dropout's scale of its mask
  end)

  it("folds an evaluation BatchNorm into the convolution before it, and its ReLU into the epilogue", function()
    nd.manual_seed(3)
    local m = nn.Sequential(nn.Conv2d(3, 8, 3, {padding = 1}), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Conv2d(8, 4, 3, {bias = false}), nn.BatchNorm2d(4, {affine = false}))
    randomize_bn(m[2])
    randomize_bn(m[5])
    m:eval()
    local cf = nd.compile(m, {verify = true})
    local x = nd.randn(2, 3, 9, 9)
    nd.no_grad(function()
      for _ = 1, 3 do assert.is_true(rel(cf(x), m(x)) < 1e-5) end
      -- no batch_norm, no relu; the weights packed once where the packed kernel runs
      local conv = nd.devices()[1].packed_conv and "conv2d_fused_packed" or "conv2d_fused"
      assert.are.same({[conv] = 2}, entries(cf))
      local x2 = nd.randn(2, 3, 9, 9)
      assert.is_true(rel(cf(x2), m(x2)) < 1e-5, "a new input")
      -- the statistics change (a checkpoint loaded into the same module): the fold follows
      local sd = m:state_dict()
      sd["1.running_var"] = sd["1.running_var"] * 4
      sd["3.weight"] = sd["3.weight"] * -1
      m:load_state_dict(sd)
      assert.is_true(rel(cf(x), m(x)) < 1e-5, "after load_state_dict")
      assert.are.equal(1, cf.last.graph:stats().refolds)
    end)
    -- train mode normalises with the batch's statistics: a retrace, nothing folded
    m:train()
    -- (the statistics move at every call: an eager twin moves them the same way)
    local twin = nn.Sequential(nn.Conv2d(3, 8, 3, {padding = 1}), nn.BatchNorm2d(8), nn.ReLU(),
                               nn.Conv2d(8, 4, 3, {bias = false}), nn.BatchNorm2d(4, {affine = false}))
    twin:load_state_dict(m:state_dict())
    for _ = 1, 3 do assert.is_true(rel(cf(x), twin(x)) < 1e-5) end
    assert.are.equal(2, entries(cf)["batch_norm"])
  end)

  it("folds a BatchNorm1d into the linear layer before it (2-D inputs) and keeps NaN where eager has it", function()
    nd.manual_seed(4)
    local m = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    randomize_bn(m[2])
    m:eval()
    local cf = nd.compile(function(x) return nd.no_grad(function() return m(x) end) end, {verify = true})
    local x = nd.randn(7, 5)
    for _ = 1, 3 do assert.is_true(rel(cf(x), nd.no_grad(function() return m(x) end)) < 1e-5) end
    assert.are.same({linear_fused = 2}, entries(cf))
    x[{3, 2}] = 0 / 0 -- row 3 is NaN all through, through the fused ReLU as through nd.relu
    local c, e = cf(x), nd.no_grad(function() return m(x) end)
    for i = 1, 7 do
      for j = 1, 2 do
        local cv, ev = c[{i, j}]:item(), e[{i, j}]:item()
        assert.are.equal(ev ~= ev, cv ~= cv, ("NaN at %d,%d"):format(i, j))
      end
    end
  end)

  it("packs a constant convolution weight once, in the prologue, with the same bits as eager", function()
    if not nd.devices()[1].packed_conv then
      pending("the packed convolution kernel needs AVX2 + FMA (and NEEDLE_CONV_BLAS unset)")
      return
    end
    nd.manual_seed(6)
    local w, b = nd.randn(8, 3, 3, 3), nd.randn(8)
    local f = function(x) return nd.no_grad(function()
      return nd.fused_conv2d(x, w, b, {padding = 1, activation = "relu"}) end) end
    local cf = compiled(f, {"fold"}, nd.randn(2, 3, 7, 7))
    assert.are.same({conv2d_fused_packed = 1}, entries(cf))
    assert.are.equal(1, cf.last.graph:stats().folded) -- the conv2d_prepack record
    for _ = 1, 3 do
      local x = nd.randn(2, 3, 7, 7)
      assert.are.equal(0, max_abs(cf(x), f(x)))
    end
    nd.no_grad(function() w:copy_(nd.randn(8, 3, 3, 3)) end) -- packed again on the next call
    local x = nd.randn(2, 3, 7, 7)
    assert.are.equal(0, max_abs(cf(x), f(x)))
    assert.are.equal(1, cf.last.graph:stats().refolds)
    -- a weight the graph writes is no constant: packed per call as eagerly
    local cg = compiled(function(x) w:mul_(1); return f(x) end, {"fold"}, nd.randn(2, 3, 7, 7))
    assert.are.equal(1, entries(cg).conv2d_fused)
  end)

  it("does not fold what reads zeros the capture freed, nor a write over content read before it", function()
    local w = nd.randn(3, 4)
    local f = function(x) -- an RNN's zero initial state: made inside, freed during the capture
      local a
      do local h0 = nd.zeros(2, 3); a = (h0 + 1):matmul(w) end
      collectgarbage(); collectgarbage()
      return x + a
    end
    local cf = compiled(f, {"fold"}, nd.ones(2, 4))
    for i = 1, 2 do
      if i == 2 then nd.no_grad(function() w:mul_(2) end) end
      assert.are.equal(0, max_abs(cf(nd.ones(2, 4)), f(nd.ones(2, 4))))
    end
    local v = nd.randn(3)
    local g = function(x) -- buf is read, then overwritten from a constant: a replay restores it first
      local buf = nd.tensor({1, 2, 3})
      local y = x + buf
      buf:copy_(v * 2)
      return y + buf, buf
    end
    local cg = compiled(g, {"fold"}, nd.ones(3))
    for _ = 1, 3 do assert.are.equal(0, max_abs(cg(nd.ones(3)), g(nd.ones(3)))) end
  end)

  it("runs twice without harm (passes = {'fold', 'fold'})", function()
    local m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    randomize_bn(m[2])
    m:eval()
    local cf = nd.compile(m, {passes = {"fold", "fold", "epilogue"}, verify = true})
    local x = nd.randn(1, 3, 6, 6)
    nd.no_grad(function()
      for _ = 1, 3 do assert.is_true(rel(cf(x), m(x)) < 1e-5) end
      nd.no_grad(function() m[1].weight:mul_(-1) end)
      assert.is_true(rel(cf(x), m(x)) < 1e-5)
    end)
  end)

  it("keeps a norm whose input is seen elsewhere, and one after an activation", function()
    local conv, bn = nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)
    randomize_bn(bn)
    conv:eval(); bn:eval()
    local seen
    local f = function(x)
      return nd.no_grad(function()
        local h = conv(x)
        seen = h                     -- Lua keeps the convolution's result: no fold
        return bn(h) + bn(nd.F.relu(conv(x * 2)))
      end)
    end
    local cf = compiled(f, {"fold"}, nd.randn(1, 2, 4, 4))
    assert.are.equal(2, entries(cf)["batch_norm"])
    local x = nd.randn(1, 2, 4, 4)
    assert.are.equal(0, max_abs(cf(x), f(x)))
    local _ = seen
  end)

  it("gives the fold's temporaries their memory back: the prologue keeps one copy of the folded weights", function()
    local m = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32))
    randomize_bn(m[2])
    m:eval()
    local cf = nd.compile(m)
    local x = nd.randn(1, 16, 8, 8)
    nd.no_grad(function() for _ = 1, 3 do cf(x) end end)
    -- the folded weight (packed: its 32 rows padded to 36, the kernel's 6-row panels) and
    -- bias, and the output (Lua receives it): no float64 copies, no unpacked copy
    local rows = nd.devices()[1].packed_conv and 36 or 32
    local weights, output = (rows * 16 * 9 + 32) * 4, 32 * 6 * 6 * 4
    local fixed = cf.last.graph:stats().fixed_bytes
    assert.are.equal(weights + output, fixed)
  end)
end)
