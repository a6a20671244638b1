-- elementwise_spec.lua - unary and binary ops, where, clamp, in-place ops,
-- integer and bool arithmetic, checked against the pure-Lua reference in
-- spec/helpers/reference.lua on contiguous, non-contiguous, broadcast,
-- size-1, 0-dim, empty and large (multi-threaded) operands.
--
--   build/needle-lua spec/run.lua spec/elementwise_spec.lua

local nd = require "needle"
local R = require "spec.helpers.reference"

local close, equal = R.asserts(assert)

local T = require("spec.helpers.tensors").T -- a needle tensor of a reference's values

-- Data generators: (shape, seed) -> reference tensor.
local function grid(shape, seed) return R.grid(shape, seed, -3, 3) end
local function positive(shape, seed) return R.grid(shape, seed, 0.25, 3) end
local function nonzero(shape, seed)
  local sgn = R.lcg(seed + 7)
  return R.map(R.grid(shape, seed, 0.25, 3), function(v) return sgn(0, 1) == 0 and v or -v end)
end
local function exponent(shape, seed) return R.grid(shape, seed, -2, 2) end

-- Operand layouts. make(gen, seed) -> needle tensor x, reference of x's values.
-- The non-contiguous ones say so (checked, so a layout cannot silently
-- become contiguous and stop testing the strided paths).
local layouts = {
  { name = "contiguous {3,4}", make = function(gen, seed)
      local r = gen({ 3, 4 }, seed)
      return T(r), r
    end },
  { name = "transposed x:t()", noncontig = true, make = function(gen, seed)
      local b = gen({ 4, 3 }, seed)
      return T(b):t(), R.transpose(b)
    end },
  { name = "{4,5,6} permuted (3,1,2) (partial merge)", noncontig = true, make = function(gen, seed)
      local b = gen({ 4, 5, 6 }, seed)
      return T(b):permute(3, 1, 2), R.permute(b, { 3, 1, 2 })
    end },
  { name = "step slice x[{{1,-1,2}, \":\"}]", noncontig = true, make = function(gen, seed)
      local b = gen({ 7, 4 }, seed)
      return T(b)[{ { 1, -1, 2 }, ":" }], R.slice(b, 1, 1, -1, 2)
    end },
  { name = "x:slice(2, 2, -1, 3)", noncontig = true, make = function(gen, seed)
      local b = gen({ 3, 9 }, seed)
      return T(b):slice(2, 2, -1, 3), R.slice(b, 2, 2, -1, 3)
    end },
  { name = "expanded {3,1} -> {3,4}", noncontig = true, make = function(gen, seed)
      local b = gen({ 3, 1 }, seed)
      return T(b):expand({ 3, 4 }), R.expand(b, { 3, 4 })
    end },
  { name = "size-1 dims {1,3,1}", make = function(gen, seed)
      local r = gen({ 1, 3, 1 }, seed)
      return T(r), r
    end },
  { name = "0-dim", make = function(gen, seed)
      local r = gen({}, seed)
      return T(r), r
    end },
  { name = "empty {0,3}", make = function(gen, seed)
      local r = gen({ 0, 3 }, seed)
      return T(r), r
    end },
}

local function check_layout(x, layout)
  if layout.noncontig then
    assert.is_false(x:is_contiguous(), layout.name .. " should be non-contiguous")
  end
end

-- Unary ops whose inputs must be positive.
local positive_unary = { log = true, sqrt = true, rsqrt = true, log1p = true }
-- Unary ops that are exact in float32 (compared bit for bit).
local exact_unary = { neg = true, abs = true, relu = true, sign = true, floor = true,
                      ceil = true, round = true }

local function unary_expected(name, ref)
  local f = R.unary[name]
  return R.map(ref, function(v) return f(v) end)
end

local function unary_opts(name)
  if exact_unary[name] then return { exact = true } end
  return { rtol = 1e-5, atol = 1e-6 }
end

---------------------------------------------------------------------------
describe("unary ops", function()
  it("every unary op of the registry (nd.ops()) is tested here against a reference", function()
    local listed = {}
    for _, name in ipairs(R.unary_names) do listed[name] = true end
    for _, op in ipairs(nd.ops()) do
      if op.kind == "unary" and op.expr then
        assert(listed[op.name] and R.unary[op.name],
          "unary op " .. op.name .. " has no reference in spec/helpers/reference.lua")
      end
    end
  end)

  -- the reason log1p and expm1 exist: log(1 + x) and exp(x) - 1 lose their
  -- digits near 0 (in float64 at x = 1e-12, about 4 of 16). Reference: the
  -- Taylor series, exact to double precision at these sizes.
  it("log1p and expm1 keep full precision near 0 (float64, against the series)", function()
    local xs = {1e-12, -3e-13, 2.5e-10, -7e-9, 1e-8}
    local t = nd.tensor(xs, {dtype = "float64"})
    local l, e = t:log1p():totable(), nd.expm1(t):totable()
    for i, x in ipairs(xs) do
      local want_l = x - x ^ 2 / 2 + x ^ 3 / 3
      local want_e = x + x ^ 2 / 2 + x ^ 3 / 6
      assert(math.abs(l[i] - want_l) <= 4e-16 * math.abs(want_l),
        ("log1p(%g) = %.17g, series %.17g"):format(x, l[i], want_l))
      assert(math.abs(e[i] - want_e) <= 4e-16 * math.abs(want_e),
        ("expm1(%g) = %.17g, series %.17g"):format(x, e[i], want_e))
    end
  end)

  it("log1p and expm1: integer inputs compute in float32, -1 and large values", function()
    local r = nd.tensor({0, 1, 3}, {dtype = "int64"}):log1p()
    assert.are.equal("float32", r.dtype)
    assert.is_true(math.abs(r:totable()[3] - math.log(4)) < 1e-6)
    assert.are.equal(-math.huge, nd.tensor({-1}, {dtype = "float64"}):log1p():item())
    local big = nd.expm1(nd.tensor({100}, {dtype = "float64"})):item()
    assert.is_true(math.abs(big - (math.exp(100) - 1)) <= 1e-15 * big)
  end)

  for _, name in ipairs(R.unary_names) do
    local gen = positive_unary[name] and positive or grid
    describe(name, function()
      for li, layout in ipairs(layouts) do
        it("as method and nd." .. name .. " on " .. layout.name, function()
          local x, ref = layout.make(gen, 100 + li)
          check_layout(x, layout)
          local want = unary_expected(name, ref)
          local a = x[name](x)
          local b = nd[name](x)
          assert.are.equal("float32", a.dtype)
          assert.are.equal("float32", b.dtype)
          close(a, want, unary_opts(name), "x:" .. name .. "()")
          close(b, want, unary_opts(name), "nd." .. name .. "(x)")
        end)
      end

      it("does not modify its input", function()
        local x, ref = layouts[2].make(gen, 7)
        local _ = x[name](x)
        equal(x, ref)
      end)
    end)
  end

  it("unary minus metamethod is neg, on contiguous and transposed inputs", function()
    for li = 1, 3 do
      local x, ref = layouts[li].make(grid, 30 + li)
      equal(-x, R.map(ref, R.unary.neg), layouts[li].name)
    end
  end)

  it("round rounds halves to even", function()
    local x = nd.tensor({ -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.25, -0.75 })
    equal(x:round(), { -2, -2, -0.0, 0, 2, 2, 4, 0, -1 })
  end)

  it("handles special values (inf, -inf, nan, 0) like the reference", function()
    local vals = { math.huge, -math.huge, 0 / 0, 0.0, -0.0, 1e-3, -1e-3 }
    local ref = R.new({ #vals }, vals)
    local x = nd.tensor(vals)
    for _, name in ipairs(R.unary_names) do
      local want = R.map(ref, function(v)
        if (name == "sin" or name == "cos") and (v == math.huge or v == -math.huge) then return 0 / 0 end
        return R.unary[name](v)
      end)
      close(x[name](x), want, { rtol = 1e-5, atol = 1e-6 }, name)
    end
  end)

  it("log, sqrt and rsqrt of negative numbers and zero", function()
    local x = nd.tensor({ -1, 0, 4 })
    close(x:log(), { 0 / 0, -math.huge, math.log(4) })
    close(x:sqrt(), { 0 / 0, 0, 2 })
    close(x:rsqrt(), { 0 / 0, math.huge, 0.5 })
  end)

  it("works on float64 inputs and keeps float64", function()
    local ref = R.generate({ 2, 3 }, function(i) return (i - 2.5) / 3 end)
    local x = T(ref, "float64")
    for _, name in ipairs(R.unary_names) do
      local src = positive_unary[name] and R.map(ref, math.abs) or ref
      local xx = positive_unary[name] and x:abs() or x
      local y = xx[name](xx)
      assert.are.equal("float64", y.dtype, name)
      close(y, unary_expected(name, src), { rtol = 1e-12, atol = 1e-12 }, name)
    end
  end)

  it("integer inputs: neg abs relu sign floor ceil round keep int64, the rest give float32", function()
    local ref = R.new({ 7 }, { -3, -2, -1, 0, 1, 2, 3 })
    local x = T(ref, "int64")
    local keeps = { neg = true, abs = true, relu = true, sign = true, floor = true, ceil = true, round = true }
    for _, name in ipairs(R.unary_names) do
      local y = x[name](x)
      if keeps[name] then
        assert.are.equal("int64", y.dtype, name)
        local want = R.map(ref, function(v)
          if name == "neg" then return -v elseif name == "abs" then return math.abs(v)
          elseif name == "relu" then return v > 0 and v or 0
          elseif name == "sign" then return v > 0 and 1 or v < 0 and -1 or 0
          else return v end
        end)
        equal(y, want, name)
        assert.are.equal("integer", math.type(y:totable()[1]), name)
      else
        assert.are.equal("float32", y.dtype, name)
        close(y, unary_expected(name, ref), nil, name)
      end
    end
  end)

  it("int32 inputs: integer-valued ops keep int32, the rest give float32", function()
    local ref = R.new({ 5 }, { -2, -1, 0, 1, 2 })
    local x = T(ref, "int32")
    for _, name in ipairs(R.unary_names) do
      local y = x[name](x)
      if name == "neg" or name == "abs" or name == "relu" or name == "sign" or name == "floor"
         or name == "ceil" or name == "round" then
        assert.are.equal("int32", y.dtype, name)
        equal(y, R.map(ref, function(v) return R.unary[name](v + 0.0) end), name)
      else
        assert.are.equal("float32", y.dtype, name)
        close(y, unary_expected(name, ref), nil, name)
      end
    end
  end)

  it("uint8 neg wraps modulo 256 and abs is the identity", function()
    local x = nd.tensor({ 0, 3, 200 }, { dtype = "uint8" })
    equal(x:neg(), { 0, 253, 56 })
    equal(x:abs(), { 0, 3, 200 })
  end)

  it("bool inputs: exp log sqrt rsqrt tanh sigmoid sin cos give float32 of 1 and 0", function()
    local x = nd.tensor({ true, false })
    local ref = R.new({ 2 }, { 1.0, 0.0 })
    for _, name in ipairs({ "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos" }) do
      local ok, y = pcall(x[name], x)
      assert.is_true(ok, name .. ": " .. tostring(y))
      assert.are.equal("float32", y.dtype, name)
      close(y, unary_expected(name, ref), nil, name)
    end
  end)

  -- float32 exp, tanh and sigmoid run vectorised polynomials (cpu_vmath.c)
  it("float32 exp, tanh and sigmoid: within 2 ulp of float64 over their ranges, denormals included", function()
    nd.manual_seed(11)
    local ranges = {{-20, 20}, {-1, 1}, {-1e-3, 1e-3}, {-103, 88.7}, {-0.7, 0.7}}
    for _, op in ipairs({"exp", "tanh", "sigmoid"}) do
      for _, rg in ipairs(ranges) do
        local x = nd.rand({20000}) * (rg[2] - rg[1]) + rg[1]
        local got, want = x[op](x):double(), x:double()[op](x:double())
        -- error in units of the float32 spacing at the reference (denormals: its fixed spacing)
        local ulp = (want:abs() * 2 ^ -23):clamp(2 ^ -149, math.huge)
        local worst = ((got - want):abs() / ulp):max():item()
        assert.is_true(worst <= 2, ("%s over [%g, %g]: %.2f ulp"):format(op, rg[1], rg[2], worst))
      end
    end
  end)

  -- float32 erf and gelu run vectorised too (cpu_vmath.c): erf checked against float64's
  -- (libm's erf in double), gelu as its formula over float32 kernels
  it("float32 erf: within 1 ulp of float64's; special values; the same bits for any layout", function()
    nd.manual_seed(12)
    for _, rg in ipairs({{-20, 20}, {-1, 1}, {-1e-3, 1e-3}, {-1e-35, 1e-35}, {-4, 4}, {1.9, 2.1}}) do
      local x = nd.rand({20000}) * (rg[2] - rg[1]) + rg[1]
      local got, want = x:erf():double(), x:double():erf()
      -- the float32 spacing at the reference: 2^(floor(log2 |want|) - 23), denormals' 2^-149
      local e = (want:abs():log() / math.log(2)):floor()
      local ulp = ((e - 23) * math.log(2)):exp():clamp(2 ^ -149, math.huge)
      local worst = ((got - want):abs() / ulp):max():item()
      assert.is_true(worst <= 1, ("erf over [%g, %g]: %.2f ulp"):format(rg[1], rg[2], worst))
    end
    local e = nd.tensor({math.huge, -math.huge, 0 / 0, 0, -0.0, 10, -10}):erf()
    assert.are.same({1, -1}, {e[1]:item(), e[2]:item()})
    assert.is_true(e[3]:item() ~= e[3]:item(), "erf(NaN)")
    assert.are.equal(math.huge, 1 / e[4]:item(), "erf(0) is +0")
    assert.are.equal(-math.huge, 1 / e[5]:item(), "erf(-0) is -0")
    assert.are.same({1, -1}, {e[6]:item(), e[7]:item()})
    local v = (nd.randn({64, 300}) * 3):t()
    for _, op in ipairs({"erf", "gelu"}) do
      assert.are.equal(v[op](v):contiguous():tobytes(), v:contiguous()[op](v:contiguous()):tobytes(), op)
    end
  end)

  it("float32 erf and gelu: blocks of 16 whose arguments are all small take the polynomial alone, with the same bits", function()
    -- cpu_vmath.c runs a block of 16 through erf's |x| < 2 branch alone when every
    -- argument allows it; a run shorter than 16 goes element by element through both
    -- branches. Every value of the blocked run must equal the element-by-element one,
    -- around the branch point (2 for erf, 2 sqrt 2 for gelu's x) and at specials too.
    nd.manual_seed(88)
    local n = 15 * 400
    local x = nd.randn({n}) * 2
    local specials = {2, -2, 1.9999999, -1.9999999, 2.0000002, 0, -0.0, 1 / 0, -1 / 0, 0 / 0, 1e-30, -1e-30}
    for i, v in ipairs(specials) do x[i] = v end
    for i = 1, 600 do x[#specials + i] = (i % 2 == 0 and 1 or -1) * (2.8284271 + (i - 300) * 1e-7) end
    for i = 1, 300 do x[1000 + i] = 1.9999 + i * 1e-6 end
    for _, op in ipairs({"erf", "gelu"}) do
      local blocked = x[op](x)
      local parts = {}
      for i = 0, n // 15 - 1 do
        local piece = x:narrow(1, i * 15 + 1, 15):clone()
        parts[#parts + 1] = piece[op](piece)
      end
      assert.are.equal(nd.cat(parts):tobytes(), blocked:tobytes(), op)
    end
  end)

  it("refuses a unary op's extra arguments (an options table would be dropped without a word)", function()
    local x = nd.randn({3})
    local ok, err = pcall(nd.gelu, x, {approximate = "tanh"})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("needle.gelu: takes gelu(x) only, got an extra argument #2 (table); the tanh form "
                                     .. "is nd.F.gelu(x, {approximate = \"tanh\"})", 1, true), err)
    ok, err = pcall(function() return x:erf(5) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("needle.erf: takes x:erf() only, got an extra argument #1 (number)", 1, true), err)
    assert.are.equal(0, ((-x) + x):abs():max():item()) -- (Lua's __unm passes x twice: still one)
  end)

  it("float32 gelu: 0.5 x (1 + erf(x / sqrt 2)) in float32 steps, bit for bit; NaN stays NaN", function()
    local x = nd.randn({5000}) * 4
    local steps = x * 0.5 * ((x * 0.70710678118654752440):erf() + 1)
    assert.are.equal(steps:tobytes(), x:gelu():tobytes())
    local g = nd.tensor({0 / 0, math.huge, -math.huge, -0.0}):gelu()
    assert.is_true(g[1]:item() ~= g[1]:item())
    assert.are.equal(math.huge, g[2]:item())
    assert.is_true(g[3]:item() ~= g[3]:item(), "gelu(-inf) is -inf * 0: NaN, as PyTorch's formula")
  end)

  it("float32 exp, tanh and sigmoid: special values, and the same bits for any layout", function()
    local x = nd.tensor({0, -0.0, math.huge, -math.huge, 0 / 0, 89, -104, -100, 1e-30, -1e-30, 20, -20})
    local function bits(t) return t:tobytes() end
    local e, th, sg = x:exp(), x:tanh(), x:sigmoid()
    assert.are.same({1, 1, math.huge, 0}, {e[1]:item(), e[2]:item(), e[3]:item(), e[4]:item()})
    assert.is_true(e[5]:item() ~= e[5]:item(), "exp(NaN)")
    assert.are.equal(math.huge, e[6]:item())
    assert.are.equal(0, e[7]:item())
    assert.is_true(math.abs(e[8]:item() - 3.783506e-44) < 1.5e-45, "exp(-100) is a denormal")
    assert.are.equal(math.huge, 1 / th[1]:item(), "tanh(0) is +0")
    assert.are.equal(-math.huge, 1 / th[2]:item(), "tanh(-0) is -0")
    assert.are.same({1, -1}, {th[3]:item(), th[4]:item()})
    assert.is_true(th[5]:item() ~= th[5]:item(), "tanh(NaN)")
    assert.are.same({1, -1}, {th[11]:item(), th[12]:item()})
    assert.is_true(math.abs(th[9]:item() - 1e-30) < 1e-37, "tanh(x) = x for tiny x")
    assert.are.same({0.5, 0.5, 1, 0}, {sg[1]:item(), sg[2]:item(), sg[3]:item(), sg[4]:item()})
    assert.is_true(sg[5]:item() ~= sg[5]:item(), "sigmoid(NaN)")
    assert.is_true(sg[8]:item() > 0, "sigmoid(-100) is a denormal, not 0")
    -- a strided view computes the same bits as a contiguous copy of it
    local big = nd.randn({64, 300}) * 6
    for _, op in ipairs({"exp", "tanh", "sigmoid"}) do
      local v = big:t()
      assert.are.equal(bits(v[op](v):contiguous()), bits(v:contiguous()[op](v:contiguous())), op)
    end
  end)

  it("large non-contiguous input above the threading threshold (exp of a transposed 400x250)", function()
    local b = R.generate({ 250, 400 }, function(i) return ((i * 37) % 101 - 50) / 25 end)
    local x = T(b):t()
    assert.is_false(x:is_contiguous())
    local y = x:exp()
    -- reference of the transpose, computed directly
    local want = R.generate({ 400, 250 }, function(i)
      local r, c = i // 250, i % 250
      return math.exp(b.data[c * 400 + r + 1])
    end)
    close(y, want, { rtol = 1e-5, atol = 1e-6 })
  end)
end)

---------------------------------------------------------------------------
-- Binary ops

local metamethod = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
}

local function gens_for(name)
  if name == "div" then return grid, nonzero end
  if name == "pow" then return positive, exponent end
  return grid, grid
end

local function binary_expected(name, a, b)
  return R.map2(a, b, R.binary[name])
end

local function binary_opts(name)
  if R.comparison[name] or name == "add" or name == "sub" or name == "mul"
     or name == "maximum" or name == "minimum" then
    return { exact = true }
  end
  return { rtol = 2e-6, atol = 1e-6 }
end

local function result_dtype(name) return R.comparison[name] and "bool" or "float32" end

-- Checks every spelling of op(a, b) against want.
local function check_binary(name, a, b, want, what)
  local forms = {
    { "a:" .. name .. "(b)", function() return a[name](a, b) end },
    { "nd." .. name .. "(a, b)", function() return nd[name](a, b) end },
  }
  if metamethod[name] then
    forms[#forms + 1] = { "metamethod", function() return metamethod[name](a, b) end }
  end
  for _, f in ipairs(forms) do
    local y = f[2]()
    assert.are.equal(result_dtype(name), y.dtype, what .. " " .. f[1])
    close(y, want, binary_opts(name), what .. " " .. f[1])
  end
end

describe("binary ops", function()
  for _, name in ipairs(R.binary_names) do
    local ga, gb = gens_for(name)
    describe(name, function()
      it("tensor-tensor, contiguous, same shape", function()
        local ra, rb = ga({ 3, 4 }, 1), gb({ 3, 4 }, 2)
        check_binary(name, T(ra), T(rb), binary_expected(name, ra, rb), "contiguous")
      end)

      for li, layout in ipairs(layouts) do
        if layout.noncontig then
          it("non-contiguous operands: " .. layout.name, function()
            local a, ra = layout.make(ga, 200 + li)
            check_layout(a, layout)
            local rb = gb(a.shape, 300 + li)
            local b = T(rb)
            -- strided left, contiguous right
            check_binary(name, a, b, binary_expected(name, ra, rb), "left strided")
            -- contiguous left, strided right
            local b2, rb2 = layout.make(gb, 400 + li)
            local ra2 = ga(b2.shape, 500 + li)
            check_binary(name, T(ra2), b2, binary_expected(name, ra2, rb2), "right strided")
            -- both strided the same way
            local a3, ra3 = layout.make(ga, 600 + li)
            local b3, rb3 = layout.make(gb, 700 + li)
            check_binary(name, a3, b3, binary_expected(name, ra3, rb3), "both strided")
          end)
        end
      end

      it("strided operands of different layouts ({4,5,6}:permute(3,1,2) with {5,6,4}:permute(2,3,1)... as {6,4,5})", function()
        local ba, bb = ga({ 4, 5, 6 }, 11), gb({ 5, 6, 4 }, 12)
        local a, ra = T(ba):permute(3, 1, 2), R.permute(ba, { 3, 1, 2 })
        local b, rb = T(bb):permute(2, 3, 1), R.permute(bb, { 2, 3, 1 })
        assert.are.same({ 6, 4, 5 }, a.shape)
        assert.are.same({ 6, 4, 5 }, b.shape)
        check_binary(name, a, b, binary_expected(name, ra, rb), "mixed permutes")
      end)

      local bshapes = {
        { { 3, 1 }, { 1, 4 } },
        { { 2, 3, 4 }, { 4 } },
        { { 4 }, { 2, 3, 4 } },
        { {}, { 2, 3 } },
        { { 2, 3 }, {} },
        { { 1, 3, 1 }, { 2, 1, 4 } },
        { { 0, 3 }, { 3 } },
        { { 0, 3 }, { 1, 3 } },
        { { 2, 0 }, {} },
      }
      for si, s in ipairs(bshapes) do
        it("broadcasts " .. R.shape_str(s[1]) .. " with " .. R.shape_str(s[2]), function()
          local ra, rb = ga(s[1], 20 + si), gb(s[2], 40 + si)
          local want = binary_expected(name, ra, rb)
          check_binary(name, T(ra), T(rb), want, "broadcast")
        end)
      end

      it("tensor-number forms (a:" .. name .. "(s), nd." .. name .. "(a, s))", function()
        local ra = ga({ 2, 3 }, 5)
        local s = name == "div" and -2 or 0.5
        local want = binary_expected(name, ra, s)
        local a = T(ra)
        close(a[name](a, s), want, binary_opts(name), "method")
        close(nd[name](a, s), want, binary_opts(name), "function")
        assert.are.equal(result_dtype(name), nd[name](a, s).dtype)
        if metamethod[name] then close(metamethod[name](a, s), want, binary_opts(name), "metamethod") end
        -- strided tensor with a number
        local t = T(ga({ 3, 2 }, 6)):t()
        close(t[name](t, s), binary_expected(name, R.from(t:totable()), s), binary_opts(name), "strided")
      end)

      it("number-tensor forms (nd." .. name .. "(s, b)" .. (metamethod[name] and ", s op b" or "") .. ")", function()
        local rb = (name == "div" and nonzero or name == "pow" and exponent or grid)({ 2, 3 }, 8)
        local s = 0.5
        local want = binary_expected(name, s, rb)
        local b = T(rb)
        close(nd[name](s, b), want, binary_opts(name), "function")
        assert.are.equal(result_dtype(name), nd[name](s, b).dtype)
        if metamethod[name] then close(metamethod[name](s, b), want, binary_opts(name), "metamethod") end
      end)
    end)
  end

  it("max(other) and min(other) are maximum and minimum", function()
    local ra, rb = grid({ 3, 4 }, 91), grid({ 4 }, 92)
    equal(T(ra):max(T(rb)), R.map2(ra, rb, R.binary.maximum))
    equal(T(ra):min(T(rb)), R.map2(ra, rb, R.binary.minimum))
  end)

  it("maximum and minimum propagate NaN from either side", function()
    local a = nd.tensor({ 0 / 0, 1, 2 })
    local b = nd.tensor({ 1, 0 / 0, 3 })
    close(nd.maximum(a, b), { 0 / 0, 0 / 0, 3 })
    close(nd.minimum(a, b), { 0 / 0, 0 / 0, 2 })
  end)

  it("comparisons with NaN: only ne is true", function()
    local a = nd.tensor({ 0 / 0 })
    local b = nd.tensor({ 0 / 0 })
    equal(a:eq(b), { false })
    equal(a:ne(b), { true })
    equal(a:lt(b), { false })
    equal(a:le(b), { false })
    equal(a:gt(b), { false })
    equal(a:ge(b), { false })
  end)

  it("pow with negative bases: integral exponents are exact, fractional ones give nan", function()
    local a = nd.tensor({ -2, -2, -3, -2 })
    local b = nd.tensor({ 3, 2, 0, 0.5 })
    close(a ^ b, { -8, 4, 1, 0 / 0 })
    close(a ^ 2, { 4, 4, 9, 4 })
  end)

  it("0-dim op number gives a 0-dim result", function()
    local y = nd.tensor(2) + 3
    assert.are.same({}, y.shape)
    close(y, 5)
  end)

  it("division by zero gives inf, -inf and nan", function()
    close(nd.tensor({ 1, -1, 0 }) / nd.tensor({ 0, 0, 0 }), { math.huge, -math.huge, 0 / 0 })
  end)

  it("a Lua table operand is converted (tensor + table, table * tensor)", function()
    local a = nd.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    equal(a + { 10, 20, 30 }, { { 11, 22, 33 }, { 14, 25, 36 } })
    equal(nd.mul({ 1, 0, -1 }, a), { { 1, 0, -3 }, { 4, 0, -6 } })
  end)

  it("a result does not alias its operands", function()
    local a = nd.tensor({ 1, 2, 3 })
    local b = a + 0
    b:fill_(9)
    equal(a, { 1, 2, 3 })
  end)

  describe("large tensors above the threading threshold", function()
    -- 100000 elements; every element and the sum are checked.
    local function check_large(y, want, opts)
      close(y, want, opts)
      local s = 0
      for i = 1, #want.data do s = s + want.data[i] end
      local got = 0
      for _, v in ipairs(R.flatten(y:totable())) do got = got + v end
      assert.is_true(math.abs(got - s) <= 1e-6 * math.abs(s) + 1e-3, ("sum %g, expected %g"):format(got, s))
    end

    local function big(shape, seed)
      local k = seed
      return R.generate(shape, function(i) return ((i * 7919 + k) % 97 - 48) / 16 end)
    end

    it("contiguous + transposed (400x250)", function()
      local ra, rbt = big({ 400, 250 }, 1), big({ 250, 400 }, 2)
      local a, b = T(ra), T(rbt):t()
      local want = R.generate({ 400, 250 }, function(i)
        local r, c = i // 250, i % 250
        return ra.data[i + 1] + rbt.data[c * 400 + r + 1]
      end)
      check_large(a + b, want, { exact = true })
      check_large(b + a, want, { exact = true })
    end)

    it("{40,50,50} permuted (3,1,2) * contiguous (partial merge, threaded)", function()
      local rb, rc = big({ 40, 50, 50 }, 3), big({ 50, 40, 50 }, 4)
      local a = T(rb):permute(3, 1, 2)
      assert.are.same({ 50, 40, 50 }, a.shape)
      local want = R.generate({ 50, 40, 50 }, function(i)
        local i1, i2, i3 = i // 2000, (i // 50) % 40, i % 50
        -- a[i1][i2][i3] = base[i2][i3][i1]
        return rb.data[i2 * 2500 + i3 * 50 + i1 + 1] * rc.data[i + 1]
      end)
      check_large(a * T(rc), want, { exact = true })
    end)

    it("strided tensor with a number, and broadcasting a row", function()
      local rb = big({ 250, 400 }, 5)
      local a = T(rb):t()
      local want = R.generate({ 400, 250 }, function(i)
        local r, c = i // 250, i % 250
        return rb.data[c * 400 + r + 1] - 0.5
      end)
      check_large(a - 0.5, want, { exact = true })
      local row = R.generate({ 250 }, function(i) return i / 4 end)
      local want2 = R.generate({ 400, 250 }, function(i) return want.data[i + 1] + 0.5 + row.data[i % 250 + 1] end)
      check_large(a + T(row), want2, { exact = true })
    end)

    it("odd-sized {37,41,23} permuted (3,1,2) + contiguous, under 1, 3, 4 and 7 threads", function()
      local rb = big({ 37, 41, 23 }, 7)
      local shape = { 23, 37, 41 }
      local rc = big(shape, 8)
      local want = R.generate(shape, function(i)
        local i1, i2, i3 = i // (37 * 41), (i // 41) % 37, i % 41
        -- a[i1][i2][i3] = base[i2][i3][i1]
        return rb.data[i2 * 41 * 23 + i3 * 23 + i1 + 1] + rc.data[i + 1]
      end)
      local a, c = T(rb):permute(3, 1, 2), T(rc)
      local n0 = nd.get_num_threads()
      local ok, err = pcall(function()
        for _, n in ipairs({ 1, 3, 4, 7 }) do
          nd.set_num_threads(n)
          close(a + c, want, { exact = true }, n .. " threads")
          close(c + a, want, { exact = true }, n .. " threads, swapped")
        end
      end)
      nd.set_num_threads(n0)
      if not ok then error(err, 0) end
    end)

    it("comparison of large strided tensors gives bool", function()
      local rb = big({ 250, 400 }, 6)
      local a = T(rb):t()
      local y = a:gt(0)
      assert.are.equal("bool", y.dtype)
      local flat = R.flatten(y:totable())
      local count, want = 0, 0
      for i = 1, #flat do if flat[i] then count = count + 1 end end
      for i = 1, #rb.data do if rb.data[i] > 0 then want = want + 1 end end
      assert.are.equal(want, count)
      -- sampled positions
      for _, p in ipairs({ { 1, 1 }, { 400, 250 }, { 137, 201 }, { 250, 3 }, { 399, 17 } }) do
        assert.are.equal(rb.data[(p[2] - 1) * 400 + p[1]] > 0, flat[(p[1] - 1) * 250 + p[2]])
      end
    end)
  end)

  it("shapes that cannot broadcast raise an error naming both shapes", function()
    local ok, err = pcall(function() return nd.ones({ 2, 3 }) + nd.ones({ 3, 2 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add:", 1, true), err)
    assert.truthy(err:find("{2,3}", 1, true), err)
    assert.truthy(err:find("{3,2}", 1, true), err)
    ok, err = pcall(nd.mul, nd.ones({ 4 }), nd.ones({ 5 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.mul:", 1, true), err)
    assert.truthy(err:find("{4}", 1, true) and err:find("{5}", 1, true), err)
  end)
end)

---------------------------------------------------------------------------
describe("where", function()
  it("selects from a where cond is true and b elsewhere", function()
    local c = nd.tensor({ { true, false, true }, { false, false, true } })
    local a = nd.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    local b = nd.tensor({ { -1, -2, -3 }, { -4, -5, -6 } })
    equal(nd.where(c, a, b), { { 1, -2, 3 }, { -4, -5, 6 } })
  end)

  it("broadcasts cond {3,1}, a {1,4} and a number", function()
    local rc = R.new({ 3, 1 }, { true, false, true })
    local ra = grid({ 1, 4 }, 3)
    local y = nd.where(T(rc, "bool"), T(ra), 7)
    equal(y, R.map3(rc, ra, 7, function(c, a, b) if c then return a end return b end))
    assert.are.same({ 3, 4 }, y.shape)
  end)

  it("broadcasts a 0-dim cond and a {2,3,4} with a {4}", function()
    local ra, rb = grid({ 2, 3, 4 }, 4), grid({ 4 }, 5)
    equal(nd.where(nd.tensor(false), T(ra), T(rb)), R.map2(ra, rb, function(_, b) return b end))
    equal(nd.where(nd.tensor(true), T(ra), T(rb)), R.map2(ra, rb, function(a) return a end))
  end)

  it("x:where(cond, y) is nd.where(cond, x, y)", function()
    local x = nd.tensor({ 1, 2, 3, 4 })
    local y = nd.tensor({ 10, 20, 30, 40 })
    equal(x:where(x:gt(2), y), { 10, 20, 3, 4 })
  end)

  it("works with a strided condition and strided values", function()
    local rv = grid({ 4, 3 }, 6)
    local v = T(rv):t()
    local rvt = R.transpose(rv)
    local cond = v:ge(0)
    equal(nd.where(cond, v, v:neg()), R.map(rvt, math.abs))
  end)

  it("promotes int64 and float32 values to float32", function()
    local y = nd.where(nd.tensor({ true, false }), nd.tensor({ 1, 2 }, { dtype = "int64" }), nd.tensor({ 0.5, 0.25 }))
    assert.are.equal("float32", y.dtype)
    equal(y, { 1, 0.25 })
  end)

  it("rejects a non-bool condition with a message", function()
    local ok, err = pcall(nd.where, nd.tensor({ 1, 0 }), nd.tensor({ 1, 2 }), nd.tensor({ 3, 4 }))
    assert.is_false(ok)
    assert.truthy(err:find("needle.where:", 1, true), err)
    assert.truthy(err:find("bool", 1, true), err)
  end)

  it("large: 100000 elements", function()
    local rc = R.generate({ 100000 }, function(i) return i % 3 == 0 end)
    local ra = R.generate({ 100000 }, function(i) return i end)
    local y = nd.where(T(rc, "bool"), T(ra, "float64"), -1)
    close(y, R.map2(rc, ra, function(c, a) return c and a or -1 end), { exact = true })
  end)
end)

---------------------------------------------------------------------------
describe("clamp", function()
  local ref = R.new({ 2, 4 }, { -3, -1.5, -0.5, 0, 0.5, 1, 2.5, 4 })
  local function clamp_ref(lo, hi)
    return R.map(ref, function(v)
      if lo and v < lo then v = lo end
      if hi and v > hi then v = hi end
      return v
    end)
  end

  it("with both bounds", function()
    equal(T(ref):clamp(-1, 1), clamp_ref(-1, 1))
    equal(nd.clamp(T(ref), -1, 1), clamp_ref(-1, 1))
  end)

  it("with min only", function()
    equal(T(ref):clamp(0), clamp_ref(0, nil))
    equal(T(ref):clamp(0, nil), clamp_ref(0, nil))
    equal(T(ref):clamp({ min = 0 }), clamp_ref(0, nil))
  end)

  it("with max only (nil min)", function()
    equal(T(ref):clamp(nil, 0.5), clamp_ref(nil, 0.5))
    equal(T(ref):clamp({ max = 0.5 }), clamp_ref(nil, 0.5))
  end)

  it("with no bounds is the identity", function()
    equal(T(ref):clamp(), ref)
    equal(T(ref):clamp(nil, nil), ref)
  end)

  it("on a transposed tensor", function()
    local x = T(ref):t()
    equal(x:clamp(-1, 2), R.transpose(clamp_ref(-1, 2)))
  end)

  it("keeps NaN and keeps the dtype of int64 tensors", function()
    close(nd.tensor({ 0 / 0, 5 }):clamp(0, 1), { 0 / 0, 1 })
    local y = nd.tensor({ -5, 0, 5 }, { dtype = "int64" }):clamp(-2, 2)
    assert.are.equal("int64", y.dtype)
    equal(y, { -2, 0, 2 })
  end)

  it("min greater than max is an error", function()
    local ok, err = pcall(function() return T(ref):clamp(2, 1) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.clamp:", 1, true), err)
  end)

  it("non-number bounds are an error", function()
    local ok, err = pcall(function() return T(ref):clamp("a") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.clamp:", 1, true), err)
  end)
end)

---------------------------------------------------------------------------
describe("in-place ops", function()
  local inplace = {
    add_ = R.binary.add, sub_ = R.binary.sub, mul_ = R.binary.mul, div_ = R.binary.div,
    pow_ = R.binary.pow,
  }
  local order = { "add_", "sub_", "mul_", "div_", "pow_" }

  for _, name in ipairs(order) do
    it(name .. " with a tensor returns self and writes the result", function()
      local ra = positive({ 3, 4 }, 1)
      local rb = (name == "pow_" and exponent or positive)({ 3, 4 }, 2)
      local a = T(ra)
      local r = a[name](a, T(rb))
      assert.is_true(rawequal(a, r))
      close(a, R.map2(ra, rb, inplace[name]), { rtol = 2e-6, atol = 1e-6 })
    end)

    it(name .. " with a number and with a broadcast operand", function()
      local ra = positive({ 3, 4 }, 3)
      local a = T(ra)
      assert.is_true(rawequal(a, a[name](a, 2)))
      local mid = R.map2(ra, 2, inplace[name])
      close(a, mid, { rtol = 2e-6, atol = 1e-6 })
      local row = R.new({ 4 }, { 1, 2, 0.5, 0.25 })
      assert.is_true(rawequal(a, a[name](a, T(row))))
      close(a, R.map2(mid, row, inplace[name]), { rtol = 2e-6, atol = 1e-6 })
    end)

    it(name .. " through a strided view writes into the base", function()
      local rbase = positive({ 5, 4 }, 4)
      local base = T(rbase)
      local v = base[{ { 1, -1, 2 }, ":" }] -- rows 1, 3, 5
      assert.is_true(rawequal(v, v[name](v, 2)))
      local want = R.generate({ 5, 4 }, function(i)
        local row = i // 4 + 1
        local x = rbase.data[i + 1]
        if row % 2 == 1 then return inplace[name](x, 2) end
        return x
      end)
      close(base, want, { rtol = 2e-6, atol = 1e-6 })
    end)
  end

  it("add_ with an operand that aliases self in another layout (x:add_(x:t()))", function()
    local x = nd.tensor({ { 1, 2 }, { 3, 4 } })
    x:add_(x:t())
    equal(x, { { 2, 5 }, { 5, 8 } })
  end)

  it("add_ through a transposed view writes into the base", function()
    local base = nd.zeros({ 2, 3 })
    local v = base:t()
    v:add_(nd.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }))
    equal(base, { { 1, 3, 5 }, { 2, 4, 6 } })
  end)

  it("in-place with a result shape larger than self is an error", function()
    local a = nd.ones({ 3, 1 })
    local ok, err = pcall(function() return a:add_(nd.ones({ 3, 4 })) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add", 1, true), err)
    assert.truthy(err:find("{3,4}", 1, true) and err:find("{3,1}", 1, true), err)
  end)

  it("fill_ returns self and fills a column view of the base", function()
    local base = nd.zeros({ 3, 4 })
    local col = base[{ ":", 2 }]
    assert.is_true(rawequal(col, col:fill_(7)))
    equal(base, { { 0, 7, 0, 0 }, { 0, 7, 0, 0 }, { 0, 7, 0, 0 } })
    assert.is_true(rawequal(base, base:fill_(-1.5)))
    equal(base, R.generate({ 3, 4 }, function() return -1.5 end))
  end)

  it("zero_ returns self and zeroes a step-sliced view only", function()
    local base = nd.ones({ 4, 2 })
    local v = base:slice(1, 2, -1, 2) -- rows 2 and 4
    assert.is_true(rawequal(v, v:zero_()))
    equal(base, { { 1, 1 }, { 0, 0 }, { 1, 1 }, { 0, 0 } })
  end)

  it("copy_ returns self, broadcasts the source and writes through a view", function()
    local base = nd.zeros({ 3, 4 })
    local v = base:t() -- {4,3}
    assert.is_true(rawequal(v, v:copy_(nd.tensor({ 1, 2, 3 }))))
    equal(base, { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 } })
    local d = nd.zeros({ 2, 2 })
    d:copy_(nd.tensor({ { 1.5, 2.5 }, { 3.5, 4.5 } }, { dtype = "float64" }))
    assert.are.equal("float32", d.dtype)
    equal(d, { { 1.5, 2.5 }, { 3.5, 4.5 } })
  end)

  -- x:<op>_() for every unary op: the kernel writes into x, which must hold exactly what
  -- the out-of-place op gives, on a contiguous tensor and through a strided view (the rows
  -- left out keep their values)
  for _, name in ipairs(R.unary_names) do
    it(name .. "_ writes " .. name .. "(x) into x, contiguous and through a strided view", function()
      local gen = positive_unary[name] and positive or grid
      local ref = gen({ 5, 4 }, 40)
      local x = T(ref)
      local want = x[name](x)
      assert.is_true(rawequal(x, x[name .. "_"](x)))
      assert.is_true(nd.equal(x, want), name)
      local base = T(ref)
      local v = base[{ { 1, -1, 2 }, ":" }]:t() -- rows 1, 3, 5, transposed
      local vwant = v[name](v)
      assert.is_true(rawequal(v, v[name .. "_"](v)))
      assert.is_true(nd.equal(v, vwant), name)
      assert.is_true(nd.equal(base[{ { 2, 4, 2 }, ":" }], T(ref)[{ { 2, 4, 2 }, ":" }]), name)
    end)
  end

  it("in-place unary ops: integer, bool and half dtypes, and what cannot be written back", function()
    local i = nd.tensor({ -3, 0, 5 }, { dtype = "int64" })
    i:relu_():neg_()
    assert.are.equal("int64", i.dtype)
    equal(i, { 0, 0, -5 })
    local b = nd.tensor({ true, false })
    b:relu_()
    assert.are.equal("bool", b.dtype)
    assert.are.same({ true, false }, b:totable())
    local h = nd.tensor({ -1.5, 0.3333, 2 }):to("float16")
    local want = h:exp()
    h:exp_()
    assert.are.equal("float16", h.dtype)
    assert.is_true(nd.equal(h, want:to("float16")))
    for _, case in ipairs({ { "exp_", nd.tensor({ 1 }, { dtype = "int64" }), "int64" },
                            { "sqrt_", nd.tensor({ true }), "bool" } }) do
      local ok, err = pcall(function() return case[2][case[1]](case[2]) end)
      assert.is_false(ok)
      assert.truthy(err:find("needle." .. case[1] .. ": the result has dtype float32", 1, true), err)
      assert.truthy(err:find("dtype " .. case[3], 1, true), err)
    end
    local e = nd.ones({ 3, 1 }):expand({ 3, 4 })
    local ok, err = pcall(function() return e:relu_() end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.relu_: cannot write in place into an expanded tensor", 1, true), err)
  end)

  it("in-place unary ops bump the version: a saved input changed afterwards fails backward", function()
    local w = nd.tensor({ 1, -2, 3 }, { requires_grad = true })
    local x = nd.tensor({ -1, 2, -3 })
    local y = (w * x):sum() -- saves x for w's gradient
    x:relu_()
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(err:find("modified", 1, true) or err:find("version", 1, true), err)
    local ok2, err2 = pcall(function() return w:relu_() end)
    assert.is_false(ok2)
    assert.truthy(err2:find("needle.relu_: in-place operation on a tensor that requires grad", 1, true), err2)
    nd.no_grad(function() w:relu_() end) -- allowed without grad mode, as every in-place op
    equal(w:detach(), { 1, 0, 3 })
  end)

  it("clamp_ writes into x (bounds, options, one side, a transposed view) and checks its arguments", function()
    local ref = { { -3, 0.5, 9 }, { 2, -0.25, 6 } }
    local x = nd.tensor(ref)
    assert.is_true(rawequal(x, x:clamp_(0, 6)))
    equal(x, { { 0, 0.5, 6 }, { 2, 0, 6 } })
    local y = nd.tensor(ref)
    y:clamp_({ max = 1 })
    equal(y, { { -3, 0.5, 1 }, { 1, -0.25, 1 } })
    local base = nd.tensor(ref)
    base:t():clamp_(-1)
    equal(base, { { -1, 0.5, 9 }, { 2, -0.25, 6 } })
    local n = nd.tensor({ 0 / 0, -7 }, { dtype = "float64" }):clamp_(-1, 1)
    assert.is_true(n:totable()[1] ~= n:totable()[1]) -- NaN stays NaN, as clamp
    assert.are.equal(-1, n:totable()[2])
    local ok, err = pcall(function() return nd.tensor({ 1 }):clamp_(2, 1) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.clamp_: min 2 is greater than max 1", 1, true), err)
    ok, err = pcall(function() return nd.tensor({ 1 }):clamp_({ mn = 0 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("clamp_", 1, true) and err:find("mn", 1, true), err)
    ok, err = pcall(function() return nd.tensor({ 1 }):clamp_("a") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.clamp_: bounds must be numbers or nil", 1, true), err)
  end)

  it("copy_ from a non-contiguous source", function()
    local src = nd.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    local d = nd.zeros({ 3, 2 })
    d:copy_(src:t())
    equal(d, { { 1, 4 }, { 2, 5 }, { 3, 6 } })
  end)
end)

---------------------------------------------------------------------------
describe("integer and bool arithmetic", function()
  local function i64(t) return nd.tensor(t, { dtype = "int64" }) end

  it("int64 add of huge values wraps around (two's complement)", function()
    local y = i64({ math.maxinteger, math.mininteger, 1 << 62 }) + i64({ 1, -1, 1 << 62 })
    assert.are.equal("int64", y.dtype)
    local t = y:totable()
    assert.are.equal(math.mininteger, t[1])
    assert.are.equal(math.maxinteger, t[2])
    assert.are.equal(math.mininteger, t[3])
  end)

  it("int64 mul and sub wrap around", function()
    local t = (i64({ 1 << 62, math.mininteger }) * i64({ 4, -1 })):totable()
    assert.are.equal(0, t[1])
    assert.are.equal(math.mininteger, t[2])
    t = (i64({ math.mininteger }) - i64({ 1 })):totable()
    assert.are.equal(math.maxinteger, t[1])
  end)

  it("int64 tensor-tensor arithmetic matches Lua integers on a strided operand", function()
    local ra = R.ints({ 4, 3 }, 1, -1000000, 1000000)
    local rb = R.ints({ 3, 4 }, 2, -1000000, 1000000)
    local a, b = T(ra, "int64"):t(), T(rb, "int64")
    local rat = R.transpose(ra)
    equal(a + b, R.map2(rat, rb, function(x, y) return x + y end))
    equal(a - b, R.map2(rat, rb, function(x, y) return x - y end))
    equal(a * b, R.map2(rat, rb, function(x, y) return x * y end))
    equal(nd.maximum(a, b), R.map2(rat, rb, math.max))
  end)

  it("int64 pow with integer exponents", function()
    local y = i64({ 2, 3, -2, 10 }):pow(i64({ 10, 3, 3, 0 }))
    assert.are.equal("int64", y.dtype)
    equal(y, { R.ipow(2, 10), 27, -8, 1 })
  end)

  it("int64 tensor plus a large integer scalar is exact (no trip through double)", function()
    local big = (1 << 53) + 1
    local t = (i64({ 0, 2 }) + big):totable()
    assert.are.equal(("%d"):format(big), ("%d"):format(t[1]))
    assert.are.equal(("%d"):format(big + 2), ("%d"):format(t[2]))
  end)

  it("int64 compared with a large integer scalar is exact", function()
    local big = (1 << 53) + 1
    local x = i64({ big, big - 1 })
    equal(x:eq(big), { true, false })
    equal(x:gt(big - 1), { true, false })
  end)

  it("fill_ and add_ of an int64 tensor with a large integer are exact", function()
    local big = (1 << 53) + 1
    local x = nd.zeros({ 2 }, { dtype = "int64" })
    x:fill_(big)
    assert.are.equal(("%d"):format(big), ("%d"):format(x:totable()[1]))
    local y = nd.zeros({ 1 }, { dtype = "int64" })
    y:add_(big)
    assert.are.equal(("%d"):format(big), ("%d"):format(y:totable()[1]))
  end)

  it("int32 add wraps around", function()
    local y = nd.tensor({ 2147483647 }, { dtype = "int32" }) + nd.tensor({ 1 }, { dtype = "int32" })
    assert.are.equal("int32", y.dtype)
    assert.are.equal(-2147483648, y:totable()[1])
  end)

  it("uint8 add wraps around modulo 256", function()
    local y = nd.tensor({ 250, 3 }, { dtype = "uint8" }) + nd.tensor({ 10, 4 }, { dtype = "uint8" })
    assert.are.equal("uint8", y.dtype)
    equal(y, { 4, 7 })
  end)

  it("division of integers gives float32 (true division)", function()
    local y = i64({ 7, -7, 1, 6 }) / i64({ 2, 2, 3, -4 })
    assert.are.equal("float32", y.dtype)
    close(y, { 3.5, -3.5, 1 / 3, -1.5 })
    local z = i64({ 7, 1 }) / 2
    assert.are.equal("float32", z.dtype)
    close(z, { 3.5, 0.5 })
    local w = nd.tensor({ 3 }, { dtype = "int32" }):div(nd.tensor({ 2 }, { dtype = "int32" }))
    assert.are.equal("float32", w.dtype)
    close(w, { 1.5 })
  end)

  it("bool + bool is logical or and stays bool", function()
    local a = nd.tensor({ true, true, false, false })
    local b = nd.tensor({ true, false, true, false })
    local y = a + b
    assert.are.equal("bool", y.dtype)
    equal(y, { true, true, true, false })
  end)

  it("bool * bool is logical and", function()
    local a = nd.tensor({ true, true, false, false })
    local b = nd.tensor({ true, false, true, false })
    local y = a * b
    assert.are.equal("bool", y.dtype)
    equal(y, { true, false, false, false })
  end)

  it("bool - bool is an error", function()
    local a = nd.tensor({ true, false })
    local ok, err = pcall(function() return a - a end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.sub:", 1, true), err)
    assert.truthy(err:find("bool", 1, true), err)
  end)

  it("unary minus of a bool tensor is an error", function()
    local ok, err = pcall(function() return -nd.tensor({ true }) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.neg:", 1, true), err)
  end)

  it("bool + int64 gives int64, bool + 1 gives int64, bool + 0.5 gives float32", function()
    local b = nd.tensor({ true, false })
    local y = b + i64({ 5, 5 })
    assert.are.equal("int64", y.dtype)
    equal(y, { 6, 5 })
    local z = b + 1
    assert.are.equal("int64", z.dtype)
    equal(z, { 2, 1 })
    local w = b + 0.5
    assert.are.equal("float32", w.dtype)
    equal(w, { 1.5, 0.5 })
  end)

  it("comparisons always give bool, for every dtype pair and with numbers", function()
    local a = i64({ 1, 2, 3 })
    local f = nd.tensor({ 1.5, 2, 2.5 })
    for _, name in ipairs({ "eq", "ne", "lt", "le", "gt", "ge" }) do
      local y = a[name](a, f)
      assert.are.equal("bool", y.dtype, name)
      equal(y, R.map2(R.new({ 3 }, { 1, 2, 3 }), R.new({ 3 }, { 1.5, 2, 2.5 }), R.binary[name]), name)
      local z = a[name](a, 2)
      assert.are.equal("bool", z.dtype, name)
      equal(z, R.map2(R.new({ 3 }, { 1, 2, 3 }), 2, R.binary[name]), name)
      local w = nd[name](2.5, a)
      assert.are.equal("bool", w.dtype, name)
      equal(w, R.map2(2.5, R.new({ 3 }, { 1, 2, 3 }), R.binary[name]), name)
    end
  end)

  it("int64 compared with a fractional number compares exactly (2 < 2.5)", function()
    equal(i64({ 2, 3 }):lt(2.5), { true, false })
    equal(i64({ 2, 3 }):eq(2.5), { false, false })
  end)
end)

---------------------------------------------------------------------------
describe("bad arguments", function()
  it("nd.exp('x') names the op and the wrong type", function()
    local ok, err = pcall(nd.exp, "x")
    assert.is_false(ok)
    assert.truthy(err:find("needle.exp:", 1, true), err)
    assert.truthy(err:find("string", 1, true), err)
  end)

  it("every unary function rejects a non-tensor", function()
    for _, name in ipairs(R.unary_names) do
      local ok, err = pcall(nd[name], {})
      assert.is_false(ok, name)
      assert.truthy(err:find("needle." .. name .. ":", 1, true), err)
    end
  end)

  it("tensor + string names the op and the type", function()
    local a = nd.ones({ 2 })
    local ok, err = pcall(function() return a + "s" end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add:", 1, true), err)
    assert.truthy(err:find("string", 1, true), err)
  end)

  it("string * tensor and nd.maximum(tensor, {}) are errors", function()
    local a = nd.ones({ 2 })
    local ok, err = pcall(function() return "s" * a end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.mul:", 1, true), err)
    ok, err = pcall(nd.maximum, a, function() end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.maximum:", 1, true), err)
  end)

  it("binary op with two non-tensors is an error", function()
    local ok, err = pcall(nd.add, "a", "b")
    assert.is_false(ok)
    assert.truthy(err:find("needle.add:", 1, true), err)
  end)

  it("in-place op with a string is an error", function()
    local a = nd.ones({ 2 })
    local ok, err = pcall(function() return a:add_("s") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add", 1, true), err)
    ok, err = pcall(function() return a:fill_("s") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.fill_:", 1, true), err)
  end)
end)
