-- opencl_ops_spec.lua - every op of the op set on each OpenCL device, against
-- the cpu: the same inputs go through the same function on both devices; the
-- outputs must agree (float32: |got - want| <= atol + rtol |want| with rtol =
-- atol = 1e-5 unless a case says otherwise; integer, bool and index results
-- exactly) and so must the gradients of a fixed random weighting of the
-- float outputs w.r.t. every float input (nd.grad with grad_outputs: the
-- vector-Jacobian product, the same backward formulas a loss would run).
--
--   NEEDLE_BUILD_DIR=build build/needle-lua spec/run.lua spec/opencl_ops_spec.lua
--   NEEDLE_OPS_SPEC_SELF=1 ...   # runs the table cpu against cpu (checks the cases themselves)
--
-- One `it` per op case and device, generated from the CASES table; without an
-- OpenCL device one visible pending line. Error cases (ERROR_CASES) must fail
-- on the device as they fail on the cpu, with the same message. The last
-- case walks the op registry (nd.ops()): every op must have run on the
-- device in a case above (seen by the profiler, or named by a case's
-- covers = {...}), or be listed in HOST_ONLY with the reason.
local nd = require "needle"
local D = require "spec.helpers.devices"
local F = nd.F

local TARGETS = D.opencl()
if os.getenv("NEEDLE_OPS_SPEC_SELF") == "1" then TARGETS = {"cpu"} end

local FLOAT = {float32 = true, float64 = true}

-- inputs -------------------------------------------------------------------------

local function randn(shape, dtype) return nd.randn(shape, {dtype = dtype or "float32"}) end
-- uniform in [lo, hi)
local function unif(shape, lo, hi, dtype) return nd.rand(shape, {dtype = dtype or "float32"}) * (hi - lo) + lo end
local function ints(shape, lo, hi, dtype) return nd.randint(lo, hi, shape):to(dtype or "int64") end
local function bools(shape) return nd.rand(shape):gt(0.5) end
-- float values with many exact ties (small integers)
local function tied(shape) return nd.randint(-3, 3, shape):to("float32") end
local function i64(t) return nd.tensor(t, {dtype = "int64"}) end

-- the case table: {name, make = function() -> list of cpu inputs,
--   fn = function(inputs...) -> tensor(s) or a list of tensors,
--   rtol=, atol=, grad = false (no gradient comparison), nograd = {i = true}
--   (inputs that never require grad), fp64 = true (needs a float64 device)}
-- Ops with no OpenCL case, and why (the coverage check at the end accepts
-- only these).
local HOST_ONLY = {}

local CASES = {}
local function case(name, make, fn, o)
  o = o or {}
  o.name, o.make, o.fn = name, make, fn
  CASES[#CASES + 1] = o
end

-- elementwise unary -----------------------------------------------------------------

local unary = {
  neg = function(x) return -x end, abs = "abs", exp = "exp", tanh = "tanh", sigmoid = "sigmoid",
  relu = "relu", sign = "sign", floor = "floor", ceil = "ceil", round = "round", sin = "sin", cos = "cos",
  erf = "erf", expm1 = "expm1", gelu = "gelu", gelu_tanh = function(x) return nd.gelu_tanh(x) end,
}
for name, f in pairs(unary) do
  local fn = type(f) == "function" and f or function(x) return x[f](x) end
  case("unary " .. name, function() return {randn({3, 4}) * 2} end, fn)
  case("unary " .. name .. " (transposed input)", function() return {randn({4, 3}) * 2} end,
    function(x) return fn(x:t()) end)
end
case("unary round (halves go to even)", function() return {nd.tensor({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5})} end,
  function(x) return x:round() end)
for _, name in ipairs({"log", "sqrt", "rsqrt", "log1p"}) do
  case("unary " .. name, function() return {unif({3, 5}, 0.1, 4)} end, function(x) return x[name](x) end)
  case("unary " .. name .. " (stepped slice)", function() return {unif({3, 9}, 0.1, 4)} end,
    function(x) return x:slice(2, 1, 9, 2)[name](x:slice(2, 1, 9, 2)) end)
end
case("unary special values (inf, -inf, nan, 0, -0)", function()
  return {nd.tensor({math.huge, -math.huge, 0 / 0, 0.0, -0.0, 1e-30, -1e30})} end,
  function(x) return x:exp(), x:abs(), x:sign(), x:tanh(), x:sigmoid(), x:relu(), x:floor() end, {grad = false})
for _, dt in ipairs({"int64", "int32"}) do
  case("unary neg/abs/sign on " .. dt, function() return {ints({3, 4}, -9, 9, dt)} end,
    function(x) return -x, x:abs(), x:sign() end)
end
case("unary exp on an expanded input", function() return {randn({3, 1})} end,
  function(x) return x:expand({3, 4}):exp() end)

-- activations (nd.F)
case("F.gelu", function() return {randn({4, 5}) * 2} end, function(x) return F.gelu(x) end)
case("F.gelu tanh", function() return {randn({4, 5}) * 2} end, function(x) return F.gelu(x, {approximate = "tanh"}) end)
case("F.leaky_relu", function() return {randn({4, 5})} end, function(x) return F.leaky_relu(x, 0.1) end)
case("F.softplus", function() return {randn({4, 5}) * 10} end, function(x) return F.softplus(x, {beta = 2, threshold = 5}) end)
case("F.elu", function() return {randn({4, 5})} end, function(x) return F.elu(x, 0.7) end)
case("F.silu", function() return {randn({4, 5})} end, function(x) return F.silu(x) end)

-- elementwise binary -----------------------------------------------------------------

local binary = {
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
  maximum = function(a, b) return a:maximum(b) end, minimum = function(a, b) return a:minimum(b) end,
}
for name, fn in pairs(binary) do
  case("binary " .. name, function() return {randn({3, 4}), unif({3, 4}, 0.5, 2)} end, fn)
  case("binary " .. name .. " (broadcast {2,3,4} with {3,1})", function() return {randn({2, 3, 4}), unif({3, 1}, 0.5, 2)} end, fn)
  case("binary " .. name .. " (broadcast {4} with {2,3,4}, transposed)",
    function() return {unif({4}, 0.5, 2), randn({2, 4, 3})} end,
    function(a, b) return fn(a, b:transpose(2, 3)) end)
  case("binary " .. name .. " (number on the right)", function() return {randn({3, 4})} end,
    function(a) return fn(a, 1.75) end)
  if name ~= "maximum" and name ~= "minimum" then
    case("binary " .. name .. " (number on the left)", function() return {unif({3, 4}, 0.5, 2)} end,
      function(a) return fn(-2.5, a) end)
  end
end
case("binary pow", function() return {unif({3, 4}, 0.5, 2), randn({3, 4})} end, function(a, b) return a ^ b end)
case("binary pow (number exponent, number base)", function() return {unif({3, 4}, 0.5, 2)} end,
  function(a) return a ^ 3, a ^ 0.5, 2 ^ a end)
case("binary maximum/minimum with nan", function() return {nd.tensor({1, 0 / 0, 3}), nd.tensor({0 / 0, 2, 1})} end,
  function(a, b) return a:maximum(b), a:minimum(b) end, {grad = false})
for _, dt in ipairs({"int64", "int32", "uint8"}) do
  case("binary + - * on " .. dt .. " (exact, wrapping)", function()
    return {ints({3, 4}, 0, 200, dt), ints({3, 4}, 0, 100, dt)} end,
    function(a, b) return a + b, a - b, a * b, a * 3, a + 7 end)
  case("binary / on " .. dt .. " (true division, float32)", function()
    return {ints({3, 4}, 0, 50, dt), ints({3, 4}, 1, 9, dt)} end,
    function(a, b) return a / b end)
  case("binary maximum/minimum on " .. dt, function() return {ints({3, 4}, 0, 50, dt), ints({4}, 0, 50, dt)} end,
    function(a, b) return a:maximum(b), a:minimum(b) end)
end
case("binary int64 exact beyond 2^53", function() return {i64({2 ^ 53 + 1, -(2 ^ 60) - 3, 7})} end,
  function(a) return a + 1, a * 2, a - a end)
case("binary bool + and * (or, and)", function() return {bools({3, 4}), bools({3, 4})} end,
  function(a, b) return a + b, a * b end)
case("binary promotion int64 + float32, bool * float32, int + 2.5", function()
  return {ints({3, 4}, -5, 5), randn({3, 4}), bools({3, 4})} end,
  function(i, f, b) return i + f, b * f, i + 2.5 end, {nograd = {}})

-- comparisons, where, clamp ------------------------------------------------------------

for _, op in ipairs({"eq", "ne", "lt", "le", "gt", "ge"}) do
  case("compare " .. op, function() return {tied({3, 4}), tied({4})} end,
    function(a, b) return a[op](a, b), a[op](a, 1), a:t()[op](a:t(), 0) end)
  case("compare " .. op .. " on int64 and uint8", function()
    return {ints({3, 4}, 0, 5), ints({3, 4}, 0, 5, "uint8")} end,
    function(a, u) return a[op](a, 2), u[op](u, 3), u[op](u, 300) end)
end
case("compare with nan", function() return {nd.tensor({0 / 0, 1, 2})} end,
  function(a) return a:eq(a), a:ne(a), a:lt(2), a:ge(1) end)
case("where", function() return {bools({3, 4}), randn({3, 4}), randn({3, 4})} end,
  function(c, a, b) return nd.where(c, a, b) end)
case("where (broadcast cond {4}, a {3,1}, b {3,4} transposed)", function()
  return {bools({4}), randn({3, 1}), randn({4, 3})} end,
  function(c, a, b) return nd.where(c, a, b:t()) end)
case("where on int64", function() return {bools({5}), ints({5}, -9, 9), ints({5}, -9, 9)} end,
  function(c, a, b) return nd.where(c, a, b) end)
case("clamp both, min only, max only", function() return {randn({4, 5}) * 2} end,
  function(x) return x:clamp(-1, 0.5), x:clamp(-0.3, nil), x:clamp(nil, 0.2) end)
case("clamp on a transposed view", function() return {randn({5, 4})} end,
  function(x) return x:t():clamp(-0.5, 0.5) end)
case("clamp on int64", function() return {ints({6}, -9, 9)} end, function(x) return x:clamp(-3, 4) end)

-- reductions --------------------------------------------------------------------------

local reductions = {"sum", "mean", "prod", "var", "std", "logsumexp", "max", "min"}
local dims_list = {{nil, false}, {1, false}, {2, true}, {-1, false}, {{1, 3}, false}, {{1, 3}, true}, {{2, 3}, false}}
for _, r in ipairs(reductions) do
  for _, dk in ipairs(dims_list) do
    local d, k = dk[1], dk[2]
    local label = ("reduce %s dims=%s keepdim=%s"):format(r, type(d) == "table" and "{" .. table.concat(d, ",") .. "}"
      or tostring(d), tostring(k))
    local fn
    if r == "max" or r == "min" then
      -- a dim list gives values only; nil gives the single extreme
      fn = function(x)
        if d == nil then return x[r](x) end
        if type(d) == "table" then return x[r](x, d, k) end
        return x[r](x, d, k)
      end
    else
      fn = function(x) if d == nil then return x[r](x) end return x[r](x, d, k) end
    end
    case(label, function() return {unif({2, 3, 4}, 0.5, 1.5)} end, fn)
  end
  case("reduce " .. r .. " on a permuted input", function() return {unif({3, 4, 2}, 0.5, 1.5)} end,
    function(x) return x:permute({3, 1, 2})[r](x:permute({3, 1, 2}), 2) end)
end
case("reduce over a long row (4099 elements) and many rows", function() return {randn({3, 4099}), randn({513, 7})} end,
  function(a, b) return a:sum(2), a:mean(), b:sum(1), b:var(1), a:max(2) end, {rtol = 1e-5, atol = 1e-4})
case("reduce var/std corrections", function() return {randn({4, 6})} end,
  function(x) return x:var(2, false, 0), x:std(1, true, {correction = 2}), x:var(nil, false, {unbiased = false}) end)
case("reduce sum/prod/mean of integers (int64 sums, float32 means)", function()
  return {ints({3, 4}, -5, 5), ints({3, 4}, 0, 3, "uint8"), bools({3, 4})} end,
  function(a, u, b) return a:sum(), a:sum(2), a:prod(1), u:sum(1), b:sum(), a:mean(2), a:max(), u:min() end)
case("reduce of empty dims (sum 0, prod 1)", function() return {nd.zeros({0, 3})} end,
  function(x) return x:sum(1), x:prod(1), x:sum() end, {grad = false})
case("reduce with nan and inf", function() return {nd.tensor({{1, 0 / 0, 3}, {math.huge, 2, -1}})} end,
  function(x) return x:sum(2), x:max(2), x:min(1), x:logsumexp(2), x:max() end, {grad = false})
case("max/min/argmax/argmin with indices (ties keep the first)", function() return {tied({4, 6})} end,
  function(x)
    local v1, i1 = x:max(2)
    local v2, i2 = x:min(1, true)
    return v1, i1, v2, i2, x:argmax(), x:argmin(2), x:argmax(1, true)
  end)
case("max with indices on a transposed input", function() return {randn({5, 4})} end,
  function(x) return x:t():max(2) end)
case("max with indices on int64", function() return {ints({3, 5}, -4, 4)} end, function(x) return x:max(2) end)

-- matmul ----------------------------------------------------------------------------------

local MM = {rtol = 1e-5, atol = 1e-5}
local MMBIG = {rtol = 1e-4, atol = 1e-4}
case("matmul 1-D . 1-D", function() return {randn({7}), randn({7})} end, function(a, b) return a:matmul(b) end, MM)
case("matmul 1-D @ 2-D", function() return {randn({5}), randn({5, 3})} end, function(a, b) return a:matmul(b) end, MM)
case("matmul 2-D @ 1-D", function() return {randn({4, 5}), randn({5})} end, function(a, b) return a:matmul(b) end, MM)
case("matmul 2-D", function() return {randn({3, 5}), randn({5, 4})} end, function(a, b) return a:matmul(b) end, MM)
case("matmul 2-D odd sizes (33x47 @ 47x29)", function() return {randn({33, 47}), randn({47, 29})} end,
  function(a, b) return a:matmul(b) end, MMBIG)
case("matmul 2-D larger (130x257 @ 257x65)", function() return {randn({130, 257}), randn({257, 65})} end,
  function(a, b) return a:matmul(b) end, MMBIG)
case("matmul transposed A", function() return {randn({5, 3}), randn({5, 4})} end, function(a, b) return a:t():matmul(b) end, MM)
case("matmul transposed B", function() return {randn({3, 5}), randn({4, 5})} end, function(a, b) return a:matmul(b:t()) end, MM)
case("matmul both transposed", function() return {randn({5, 3}), randn({4, 5})} end,
  function(a, b) return a:t():matmul(b:t()) end, MM)
case("matmul stepped operand", function() return {randn({3, 10}), randn({5, 4})} end,
  function(a, b) return a:slice(2, 1, 10, 2):matmul(b) end, MM)
case("matmul batched 3-D", function() return {randn({2, 3, 5}), randn({2, 5, 4})} end,
  function(a, b) return a:matmul(b) end, MM)
case("matmul batched with broadcast batch dims ({2,1,3,5} @ {4,5,2})", function()
  return {randn({2, 1, 3, 5}), randn({4, 5, 2})} end, function(a, b) return a:matmul(b) end, MM)
case("matmul batched @ 2-D and transposed batches", function() return {randn({3, 5, 4}), randn({5, 2})} end,
  function(a, b) return a:transpose(2, 3):matmul(a), a:matmul(b:t():t()) end, MM)
case("matmul with K = 0", function() return {nd.zeros({3, 0}), nd.zeros({0, 4})} end,
  function(a, b) return a:matmul(b) end, {grad = false})
case("matmul int64 (exact)", function() return {ints({3, 4}, -9, 9), ints({4, 5}, -9, 9)} end,
  function(a, b) return a:matmul(b) end)
case("F.linear (3-D input, bias)", function() return {randn({2, 3, 5}), randn({4, 5}), randn({4})} end,
  function(x, w, b) return F.linear(x, w, b) end, MM)

-- views and contiguous --------------------------------------------------------------------

case("views: reshape/view/permute/transpose/narrow/select/slice/expand/squeeze/unsqueeze/flatten + contiguous",
  function() return {randn({2, 3, 4})} end,
  function(x)
    return x:reshape({6, 4}):contiguous(), x:view({4, 6}), x:permute({3, 1, 2}):contiguous(),
      x:transpose(1, 3):contiguous(), x:narrow(3, 2, 2):contiguous(), x:select(2, 2):contiguous(),
      x:slice(3, 1, 4, 3):contiguous(), x[{":", {1}, ":"}]:expand({2, 5, 4}):contiguous(),
      x:unsqueeze(2):squeeze(2):contiguous(), x:flatten(2):contiguous(), x:permute({3, 2, 1}):reshape({-1})
  end)
case("views: reshape of a transposed view copies", function() return {randn({3, 4})} end,
  function(x) return x:t():reshape({12}), x:t():clone() end)
case("indexing: x[i], x[{...}] ranges, steps and negative indices", function() return {randn({4, 5, 3})} end,
  function(x) return x[2], x[{-1, {2, 4}}], x[{{1, 4, 2}, ":", 3}], x[{{2}, {-2, -1}}] end)
case("indexing writes: x[...] = number / tensor (in place on a copy)", function() return {randn({4, 5}), randn({5})} end,
  function(x, r)
    local y = x:clone()
    y[{2, {2, 4}}] = 7.5
    y[3] = r
    y[{{1, 4, 3}, 5}] = -1
    return y
  end, {grad = false})
case("in-place ops on a copy (add_ sub_ mul_ div_ pow_ clamp_ fill_ zero_ copy_)", function()
  return {unif({3, 4}, 0.5, 2), unif({4}, 0.5, 2)} end,
  function(x, r)
    local a = x:clone():add_(r):mul_(2):sub_(1):div_(r):pow_(2):clamp_(0, 5)
    local b = x:clone():fill_(3.25)
    local c = x:clone():zero_()
    local d = x:clone()
    d:t():copy_(x:t():flip({1}))
    return a, b, c, d
  end, {grad = false})
case("in-place unary ops on a copy and through a transposed view (relu_ exp_ tanh_ sigmoid_ abs_ neg_)",
  function() return {randn({3, 4})} end,
  function(x)
    local a = x:clone():relu_()
    local b = x:clone():exp_():tanh_()
    local c = x:clone()
    c:t():sigmoid_()
    local d = x:clone():abs_():neg_():clamp_(-1, 0)
    return a, b, c, d
  end, {grad = false})
case("contiguous of an int64 and a bool view", function() return {ints({3, 4}, -9, 9), bools({3, 4})} end,
  function(a, b) return a:t():contiguous(), b:t():contiguous(), b:slice(2, 1, 4, 2):contiguous() end)

-- joining and reordering --------------------------------------------------------------------

case("cat (dims 1, 2, -1; a transposed part)", function() return {randn({2, 3}), randn({2, 3}), randn({3, 2})} end,
  function(a, b, c) return nd.cat({a, b}, 1), nd.cat({a, b, c:t()}, 2), nd.cat({a, c:t()}, -1) end)
case("cat of int64 and an empty part", function() return {ints({2, 3}, 0, 9), ints({0, 3}, 0, 9)} end,
  function(a, e) return nd.cat({a, e, a}, 1) end)
case("stack (dims 1, 3)", function() return {randn({2, 3}), randn({2, 3})} end,
  function(a, b) return nd.stack({a, b}, 1), nd.stack({a, b:t():t()}, 3) end)
case("split and chunk", function() return {randn({6, 5})} end,
  function(x) return x:split(2), x:split({1, 3, 1}, 2), x:chunk(4, 1) end)
case("flip (one dim, two dims)", function() return {randn({3, 4, 2})} end,
  function(x) return x:flip({1}), x:flip({2, 3}), x:transpose(1, 2):flip({1}) end)
case("pad (positive, negative, value)", function() return {randn({2, 3, 4})} end,
  function(x) return x:pad({1, 2}), x:pad({1, 0, 0, 2}, 9.5), x:pad({-1, 1, 2, -1}), x:pad({0, 0, 0, 0, 1, 1}) end)
case("pad on int64", function() return {ints({2, 3}, 0, 9)} end, function(x) return x:pad({1, 1}, 7) end)

-- index ops ----------------------------------------------------------------------------------

case("gather (dims 1 and 2)", function() return {randn({3, 4}), ints({2, 4}, 1, 3), ints({3, 6}, 1, 4)} end,
  function(x, i1, i2) return x:gather(1, i1), x:gather(2, i2) end)
case("gather from a transposed input", function() return {randn({4, 3}), ints({3, 5}, 1, 4)} end,
  function(x, i) return x:t():gather(2, i) end)
case("scatter (src and value)", function() return {randn({3, 4}), ints({1, 4}, 1, 3), randn({1, 4})} end,
  function(x, i, s) return x:scatter(1, i, s), x:scatter(1, i, 2.5) end)
case("scatter with a permutation index", function() return {randn({4, 3}), i64({{2, 1, 3}, {3, 2, 1}}), randn({2, 3})} end,
  function(x, i, s) return x:scatter(2, i, s) end)
case("scatter_add (repeated indices accumulate)", function()
  return {randn({3, 4}), ints({5, 4}, 1, 3), randn({5, 4})} end,
  function(x, i, s) return x:scatter_add(1, i, s) end)
case("index_select (dims 1, 2; repeated indices)", function() return {randn({4, 5}), i64({4, 1, 4, 2})} end,
  function(x, i) return x:index_select(1, i), x:index_select(2, i), x:t():index_select(1, i) end)
case("index_select with a Lua table index", function() return {randn({4, 5})} end,
  function(x) return x:index_select(1, {3, 1, 3}) end)
case("index_add (repeated indices, alpha)", function() return {randn({4, 3}), i64({1, 4, 1}), randn({3, 3})} end,
  function(x, i, s) return x:index_add(1, i, s), x:index_add(1, i, s, -2.5) end)
case("masked_fill (broadcast mask)", function() return {randn({3, 4}), bools({4})} end,
  function(x, m) return x:masked_fill(m, -1.5), x:t():masked_fill(m:view({4, 1}), 0) end)
case("masked_fill on int64", function() return {ints({3, 4}, 0, 9), bools({3, 4})} end,
  function(x, m) return x:masked_fill(m, -7) end)
case("one_hot", function() return {ints({6}, 1, 5), ints({2, 3}, 1, 4)} end,
  function(a, b) return nd.one_hot(a, 5), nd.one_hot(b, 4) end)
case("cumsum (dims 1, 2, -1; int64; long rows)", function()
  return {randn({3, 4}), ints({3, 5}, -9, 9), randn({2, 1000})} end,
  function(x, i, l) return x:cumsum(1), x:cumsum(2), x:t():cumsum(-1), i:cumsum(2), l:cumsum(2) end,
  {rtol = 1e-5, atol = 1e-4})
case("sort (ascending, descending, stable ties, dim 1)", function() return {tied({4, 7}), randn({5, 3})} end,
  function(t, x)
    local v1, i1 = t:sort(2)
    local v2, i2 = t:sort(2, true)
    local v3, i3 = x:sort(1)
    return v1, i1, v2, i2, v3, i3, t:argsort(1, true)
  end)
case("sort a long row (1500 elements) and int64", function() return {randn({2, 1500}), ints({3, 40}, -5, 5)} end,
  function(x, i)
    local v, ix = x:sort(2, true)
    local w, jx = i:sort(2)
    return v, ix, w, jx
  end)
case("topk (largest, smallest, dim 1)", function() return {randn({4, 9})} end,
  function(x)
    local v1, i1 = x:topk(3)
    local v2, i2 = x:topk(2, 2, false)
    local v3, i3 = x:topk(2, 1)
    return v1, i1, v2, i2, v3, i3
  end)

-- softmax and normalisation ----------------------------------------------------------------------

case("softmax / log_softmax (last dim, dim 1, transposed)", function() return {randn({3, 4, 5}) * 3} end,
  function(x) return F.softmax(x, -1), F.log_softmax(x, -1), F.softmax(x, 1), F.log_softmax(x:transpose(2, 3), 2) end)
case("softmax with large and -inf logits", function()
  return {nd.tensor({{1000, 999, -math.huge}, {-1000, -1000, -999}})} end,
  function(x) return F.softmax(x, 2), F.log_softmax(x, 2) end, {grad = false})
case("softmax of a long row (3000)", function() return {randn({2, 3000}) * 4} end,
  function(x) return F.softmax(x, 2), F.log_softmax(x, 2) end)
case("logsumexp (dims, keepdim)", function() return {randn({3, 4, 5}) * 4} end,
  function(x) return F.logsumexp(x, 2), F.logsumexp(x, {1, 3}, true) end)
case("attention (the fused kernel: a broadcast mask, causal with L < S, strided rows, no keys)", function()
  return {randn({2, 3, 5, 8}), randn({2, 3, 7, 8}), randn({2, 3, 7, 4}), randn({2, 1, 5, 7}), randn({2, 5, 3, 8})} end,
  function(q, k, v, m, x)
    local core = require "needle.core"
    return nd.no_grad(function()
      local heads = x:transpose(2, 3) -- (2, 3, 5, 8) with unit-stride rows, not contiguous
      return core._attention(q, k, v, m:expand({2, 3, 5, 7}), 0.4, false),
             core._attention(q, k, v, nil, 0.3, true),
             core._attention(heads, heads, heads, nil, 0.35, true),
             core._attention(q, k:narrow(3, 1, 0), v:narrow(3, 1, 0), nil, 1, false)
    end)
  end, {grad = false, covers = {"attention"}, rtol = 1e-4, atol = 1e-5})
case("attention's backward (the fused kernels: a broadcast mask, causal with L > S, strided rows, no keys)", function()
  return {randn({2, 3, 5, 8}), randn({2, 3, 4, 8}), randn({2, 3, 4, 6}), randn({2, 1, 5, 4}), randn({2, 5, 3, 8})} end,
  function(q, k, v, m, x)
    local core = require "needle.core"
    local heads = x:transpose(2, 3) -- unit-stride rows, not contiguous
    return core._attention(q, k, v, m:expand({2, 3, 5, 4}), 0.4, false),
           core._attention(q, k, v, nil, 0.3, true),
           core._attention(heads, heads, heads, nil, 0.35, true),
           core._attention(q, k:narrow(3, 1, 0), v:narrow(3, 1, 0), nil, 1, false)
  end, {nograd = {[4] = true}, covers = {"attention"}, rtol = 1e-4, atol = 1e-5})
case("lstm_cell (xw + hw, xw alone, c as the right half of [h | c'], strided rows)", function()
  return {randn({3, 12}) * 2, randn({3, 12}), randn({3, 6}), randn({12, 3}) * 2} end,
  function(a, hw, hc, at)
    local core = require "needle.core"
    return core._lstm_cell(a, hw, hc:narrow(2, 4, 3)), core._lstm_cell(at:t(), nil, hc:narrow(2, 1, 3))
  end)
case("lstm_layer (forward and reversed, bias or none, xw transposed in memory, 5 steps)", function()
  return {randn({5, 3, 12}), randn({12, 3}) * 0.5, randn({12}), randn({3, 3}), randn({3, 3}), randn({12, 3, 5})} end,
  function(xw, w, b, h0, c0, xt)
    local core = require "needle.core"
    return core._lstm_layer(xw, w, b, h0, c0, false), core._lstm_layer(xt:permute({3, 2, 1}), w, nil, h0, c0, true)
  end, {rtol = 1e-5, atol = 1e-6})
case("gru_layer (forward and reversed, bias or none, xw transposed in memory, 5 steps)", function()
  return {randn({5, 3, 9}), randn({9, 3}) * 0.5, randn({9}), randn({3, 3}), randn({9, 3, 5})} end,
  function(xw, w, b, h0, xt)
    local core = require "needle.core"
    return core._gru_layer(xw, w, b, h0, false), core._gru_layer(xt:permute({3, 2, 1}), w, nil, h0, true)
  end, {rtol = 1e-5, atol = 1e-6})
case("gru_cell (strided rows)", function()
  return {randn({3, 9}) * 2, randn({3, 9}), randn({3, 6}), randn({9, 3}) * 2} end,
  function(xw, hw, hh, xt)
    local core = require "needle.core"
    return core._gru_cell(xw, hw, hh:narrow(2, 4, 3)), core._gru_cell(xt:t(), hw, hh:narrow(2, 1, 3))
  end)
case("layer_norm (last dim, weight and bias)", function() return {randn({4, 6}) * 3 + 1, randn({6}), randn({6})} end,
  function(x, w, b) return F.layer_norm(x, 6, w, b) end, {rtol = 1e-5, atol = 2e-5})
case("layer_norm (last two dims, no affine, eps 1e-3)", function() return {randn({2, 3, 4, 5})} end,
  function(x) return F.layer_norm(x, {4, 5}, nil, nil, 1e-3) end, {rtol = 1e-5, atol = 2e-5})
case("layer_norm of a long row (2000) and a transposed input", function()
  return {randn({3, 2000}) + 5, randn({5, 3})} end,
  function(x, y) return F.layer_norm(x, 2000), F.layer_norm(y:t(), 5) end, {rtol = 1e-4, atol = 1e-4})
case("batch_norm training (N, C): output and updated running stats", function()
  return {randn({8, 3}) * 2 + 1, nd.zeros({3}), nd.ones({3}), randn({3}), randn({3})} end,
  function(x, rm, rv, w, b)
    local y = F.batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5)
    return y, rm, rv
  end, {nograd = {[2] = true, [3] = true}, rtol = 1e-5, atol = 2e-5})
case("batch_norm training (N, C, H, W), momentum 0.3, no affine", function()
  return {randn({4, 3, 5, 6}) * 2 - 1, randn({3}), unif({3}, 0.5, 2)} end,
  function(x, rm, rv)
    local y = F.batch_norm(x, rm, rv, nil, nil, true, 0.3, 1e-5)
    return y, rm, rv
  end, {nograd = {[2] = true, [3] = true}, rtol = 1e-5, atol = 2e-5})
case("batch_norm evaluation (running stats)", function()
  return {randn({4, 3, 2, 2}), randn({3}), unif({3}, 0.5, 2), randn({3}), randn({3})} end,
  function(x, rm, rv, w, b) return F.batch_norm(x, rm, rv, w, b, false) end,
  {nograd = {[2] = true, [3] = true}})
case("batch_norm without running stats (batch statistics only)", function() return {randn({6, 4}) * 3} end,
  function(x) return F.batch_norm(x, nil, nil, nil, nil, true) end, {rtol = 1e-5, atol = 2e-5})

-- losses -------------------------------------------------------------------------------------------

local function logits_labels(n, c) return function() return {randn({n, c}) * 2, ints({n}, 1, c)} end end
case("cross_entropy (mean, sum, none)", logits_labels(6, 5),
  function(x, y) return F.cross_entropy(x, y), F.cross_entropy(x, y, {reduction = "sum"}),
    F.cross_entropy(x, y, {reduction = "none"}) end)
case("cross_entropy ignore_index", function() return {randn({6, 4}), i64({1, 2, 2, 4, 2, 3})} end,
  function(x, y) return F.cross_entropy(x, y, {ignore_index = 2}), F.cross_entropy(x, y, {ignore_index = 2, reduction = "none"}) end)
case("cross_entropy label_smoothing (+ ignore_index)", logits_labels(5, 7),
  function(x, y) return F.cross_entropy(x, y, {label_smoothing = 0.1}),
    F.cross_entropy(x, y, {label_smoothing = 0.2, ignore_index = 3, reduction = "sum"}) end)
case("cross_entropy on many classes (1000) and a transposed input", function()
  return {randn({4, 1000}) * 3, ints({4}, 1, 1000), randn({5, 3}), ints({3}, 1, 5)} end,
  function(x, y, t, z) return F.cross_entropy(x, y), F.cross_entropy(t:t(), z, {reduction = "none"}) end)
case("cross_entropy with int32 labels and a Lua table of labels", function() return {randn({3, 4}), ints({3}, 1, 4, "int32")} end,
  function(x, y) return F.cross_entropy(x, y), F.cross_entropy(x, {4, 1, 2}) end)
case("nll_loss (ignore_index, reductions)", function() return {F.log_softmax(randn({5, 4}), 2):detach(), i64({1, 2, 4, 2, 3})} end,
  function(x, y) return F.nll_loss(x, y), F.nll_loss(x, y, {ignore_index = 2}), F.nll_loss(x, y, {reduction = "none"}) end)
case("mse_loss and binary_cross_entropy_with_logits", function() return {randn({4, 3}), randn({4, 3}), nd.rand({4, 3})} end,
  function(a, b, t) return F.mse_loss(a, b), F.mse_loss(a, b, {reduction = "none"}),
    F.binary_cross_entropy_with_logits(a * 5, t), F.binary_cross_entropy_with_logits(a, t, {reduction = "sum"}) end,
  {nograd = {[3] = true}})

-- convolution and pooling --------------------------------------------------------------------------

local CONV = {rtol = 1e-4, atol = 1e-4}
local conv_cases = {
  {"plain 3x3", {2, 3, 6, 5}, {4, 3, 3, 3}, true, {}},
  {"stride 2, padding 1", {2, 3, 7, 7}, {5, 3, 3, 3}, true, {stride = 2, padding = 1}},
  {"dilation 2, rectangular kernel", {1, 2, 9, 8}, {3, 2, 3, 2}, false, {dilation = 2, padding = {1, 0}}},
  {"groups 2, stride {1,2}", {2, 4, 6, 6}, {6, 2, 3, 3}, true, {groups = 2, stride = {1, 2}, padding = 1}},
  {"depthwise (groups = channels)", {1, 3, 5, 5}, {3, 1, 3, 3}, true, {groups = 3, padding = 1}},
  {"1x1", {3, 4, 4, 4}, {2, 4, 1, 1}, true, {}},
  {"larger image (32x32, 16 channels)", {2, 16, 32, 32}, {8, 16, 3, 3}, true, {padding = 1}},
}
for _, c in ipairs(conv_cases) do
  case("conv2d " .. c[1], function()
    local t = {randn(c[2]), randn(c[3]) * 0.3}
    if c[4] then t[3] = randn({c[3][1]}) end
    return t
  end, function(x, w, b) return F.conv2d(x, w, b, c[5]) end, CONV)
end
case("conv2d on an unbatched, transposed input", function() return {randn({3, 5, 6}), randn({2, 3, 3, 3})} end,
  function(x, w) return F.conv2d(x:transpose(2, 3), w) end, CONV)
local convt_cases = {
  {"stride 2, padding 1, output_padding 1, groups 2, bias", {1, 4, 3, 3}, {4, 2, 3, 3}, true,
    {stride = 2, padding = 1, output_padding = 1, groups = 2}},
  {"dilation 2 with output_padding 1", {1, 2, 3, 3}, {2, 2, 2, 2}, false, {dilation = 2, output_padding = 1}},
  {"rectangular stride and padding", {2, 2, 2, 3}, {2, 3, 2, 3}, true, {stride = {1, 2}, padding = {0, 1}}},
}
for _, c in ipairs(convt_cases) do
  case("conv_transpose2d " .. c[1], function()
    local t = {randn(c[2]), randn(c[3])}
    if c[4] then t[3] = randn({c[3][2] * (c[5].groups or 1)}) end
    return t
  end, function(x, w, b) return F.conv_transpose2d(x, w, b, c[5]) end, CONV)
end
local pool_cases = {
  {"kernel 2", {2, 2, 4, 4}, 2, {}},
  {"kernel 3, stride 2, padding 1, ceil_mode", {1, 2, 6, 6}, 3, {stride = 2, padding = 1, ceil_mode = true}},
  {"dilation {2,1}, rectangular", {1, 1, 7, 6}, {2, 3}, {stride = 1, padding = 1, dilation = {2, 1}}},
}
for _, c in ipairs(pool_cases) do
  case("max_pool2d " .. c[1] .. " (values and indices)", function() return {randn(c[2])} end,
    function(x)
      local o = {return_indices = true}
      for k, v in pairs(c[4]) do o[k] = v end
      return F.max_pool2d(x, c[3], o)
    end)
end
case("max_pool2d with ties and nan", function() return {tied({1, 2, 4, 4}), nd.tensor({{{{1, 0 / 0}, {3, 2}}}})} end,
  function(x, n) return F.max_pool2d(x, 2, {return_indices = true}), F.max_pool2d(n, 2) end, {grad = false})
case("max_pool2d ties: gradient to the first maximum", function() return {tied({1, 2, 4, 4})} end,
  function(x) return F.max_pool2d(x, 2, {stride = 1}) end)
case("max_pool2d on a transposed, unbatched input", function() return {randn({2, 5, 4})} end,
  function(x) return F.max_pool2d(x:transpose(2, 3), 2, {stride = 1}) end)
local avg_cases = {
  {"kernel 2", 2, {}},
  {"kernel 3, stride 2, padding 1", 3, {stride = 2, padding = 1}},
  {"kernel 3, stride 2, padding 1, count_include_pad false", 3, {stride = 2, padding = 1, count_include_pad = false}},
  {"kernel {2,3}, ceil_mode", {2, 3}, {stride = 2, ceil_mode = true}},
}
for _, c in ipairs(avg_cases) do
  case("avg_pool2d " .. c[1], function() return {randn({2, 2, 5, 5})} end,
    function(x) return F.avg_pool2d(x, c[2], c[3]) end)
end
case("adaptive_avg_pool2d (non-divisible {3,4} from 7x5, and 1x1)", function() return {randn({1, 2, 7, 5})} end,
  function(x) return F.adaptive_avg_pool2d(x, {3, 4}), F.adaptive_avg_pool2d(x, {1, 1}) end)
case("dilate / undilate", function() return {randn({2, 3, 4})} end,
  function(x) return F.dilate(x, {2, 3}, 1), F.undilate(F.dilate(x, {1}, 2), {1}, 2) end)

-- embedding ------------------------------------------------------------------------------------------

case("embedding (2-D indices, repeated rows)", function() return {i64({{1, 3, 3}, {5, 1, 2}}), randn({5, 4})} end,
  function(i, w) return F.embedding(i, w) end)
case("embedding padding_idx (no gradient to the padding row)", function() return {i64({2, 1, 2, 4}), randn({4, 3})} end,
  function(i, w) return F.embedding(i, w, {padding_idx = 2}) end)

-- dtype conversions -----------------------------------------------------------------------------------

case("convert float32 -> int64/int32/uint8/bool (truncation, saturation, nan -> 0)", function()
  return {nd.tensor({-2.7, -0.5, 0, 0.5, 2.7, 300.2, -1e20, 1e20, 0 / 0, math.huge})} end,
  function(x) return x:to("int64"), x:to("int32"), x:to("uint8"), x:to("bool") end, {grad = false})
case("convert float32 <-> float16 / bfloat16 (rounding, overflow to inf)", function()
  return {nd.tensor({1, 1 / 3, -2.5e-3, 65504, 70000, 1e-8, 3.14159, -0.0, 0 / 0, -math.huge})} end,
  function(x) return x:to("float16"), x:to("bfloat16"), x:to("float16"):to("float32"), x:to("bfloat16"):to("float32") end,
  {grad = false})
case("convert integers and bools -> float32, int64 <-> int32 <-> uint8", function()
  return {ints({6}, -300, 300), bools({6})} end,
  function(i, b) return i:to("float32"), i:to("int32"), i:to("uint8"), b:to("float32"), b:to("int64"), i:to("bool") end)
case("convert float32 -> float32 is the tensor itself; transposed conversion", function() return {randn({3, 4})} end,
  function(x) return x:to("float32"), x:t():to("int32"), x:t():to("float16") end)
case("float16 / bfloat16 inputs compute in float32", function()
  return {randn({3, 4}):to("float16"), randn({3, 4}):to("bfloat16")} end,
  function(h, b) return h + 1, b * 2, h:float():exp(), h:to("bfloat16") end, {grad = false})

-- float64 (devices with fp64) ---------------------------------------------------------------------------

case("float64 elementwise, reductions, matmul, softmax", function()
  return {randn({4, 5}, "float64"), randn({5, 3}, "float64")} end,
  function(a, b) return (a * 2 + 1):exp(), a:sum(2), a:max(1), a:matmul(b), F.softmax(a, 2), a:to("float32") end,
  {fp64 = true, rtol = 1e-12, atol = 1e-12})
case("float64 conv2d, layer_norm, cross_entropy", function()
  return {randn({2, 2, 5, 5}, "float64"), randn({3, 2, 3, 3}, "float64"), randn({4, 6}, "float64"), i64({1, 6, 2, 3})} end,
  function(x, w, l, y) return F.conv2d(x, w, nil, {padding = 1}), F.layer_norm(l, 6), F.cross_entropy(l, y) end,
  {fp64 = true, rtol = 1e-10, atol = 1e-10})

-- creation on the input's device, fused ops, optimizer updates -------------------------------------

case("empty (filled), arange, eye on the input's device", function() return {randn({2})} end,
  function(x)
    local o = {device = x.device}
    return nd.empty({2, 3}, o):fill_(1.5), nd.arange(1, 7, 0.5, o), nd.eye(3, 4, o)
  end, {grad = false})
case("fused_linear with relu (composed on devices without a fused kernel)",
  function() return {randn({5, 4}), randn({3, 4}), randn({3})} end,
  function(x, w, b) return nd.fused_linear(x, w, b, {activation = "relu"}) end)
case("fold_batch_norm (composed ops, in float64)",
  function() return {randn({4, 3, 2, 2}), randn({4}), randn({4}), randn({4}):abs() + 0.5, randn({4}), randn({4})} end,
  function(w, b, mean, rstd, g, beta) return nd.fold_batch_norm(w, b, mean, rstd, g, beta) end, {grad = false})
case("fused_conv2d with padding and relu",
  function() return {randn({2, 3, 5, 5}), randn({4, 3, 3, 3}), randn({4})} end,
  function(x, w, b) return nd.fused_conv2d(x, w, b, {padding = 1, activation = "relu"}) end, {rtol = 1e-4, atol = 1e-4})
-- sgd_step_ and adam_step_ are fused updates; where a device has no kernel
-- for one (OpenCL has neither), it says so (returns false) and nd.optim runs
-- the composed update: the parameters after two steps must agree either way
local function two_steps(Opt, o)
  return function(p, g)
    local prm = p:detach()
    prm.requires_grad = true
    local opt = Opt({prm}, o)
    prm.grad = g
    opt:step()
    prm.grad = g * 0.5
    opt:step()
    return prm:detach()
  end
end
-- (optim calls them through locals: no profiler event, hence covers)
case("optim.SGD steps with momentum and weight decay (sgd_step_, fused or composed)",
  function() return {randn({4, 5}), randn({4, 5})} end,
  two_steps(nd.optim.SGD, {lr = 0.1, momentum = 0.9, weight_decay = 0.01}),
  {grad = false, covers = {"sgd_step_"}})
case("optim.AdamW steps with weight decay (adam_step_, fused or composed)",
  function() return {randn({4, 5}), randn({4, 5})} end,
  two_steps(nd.optim.AdamW, {lr = 0.1, weight_decay = 0.01}),
  {grad = false, covers = {"adam_step_"}})
-- amp_unscale_ likewise (the CPU's kernel; nd.amp.GradScaler composes it elsewhere):
-- the unscaled gradient after a scaled backward, then the step taken
case("amp.GradScaler unscales and steps (amp_unscale_, fused or composed)",
  function() return {randn({4, 5}), randn({4, 5})} end,
  function(p, c)
    local prm = p:detach()
    prm.requires_grad = true
    local opt = nd.optim.SGD({prm}, {lr = 0.5})
    local scaler = nd.amp.GradScaler({init_scale = 8})
    scaler:scale((prm * c):sum()):backward()
    scaler:step(opt)
    return prm:detach()
  end,
  {grad = false, covers = {"amp_unscale_"}})

-- the ops that exist as gradients of others: second-order gradients, whose
-- outer nd.grad runs them (im2col, col2im, max_pool2d_gather)
local function leaf_of(t) local l = t:detach(); l.requires_grad = true; return l end
case("conv2d weight gradient differentiated w.r.t. the input (im2col, col2im)",
  function() return {randn({1, 2, 5, 5}), randn({3, 2, 3, 3}), randn({1, 3, 5, 5}), randn({3, 2, 3, 3})} end,
  function(x, w, g, h)
    x, w, g = leaf_of(x), leaf_of(w), leaf_of(g)
    local gw = nd.grad(nd.conv2d(x, w, nil, {padding = 1}), w, {grad_outputs = g, create_graph = true})
    local gx = nd.grad(gw, x, {grad_outputs = h, create_graph = true})
    return gw, gx, nd.grad(gx, g, {grad_outputs = x})
  end, {grad = false, rtol = 1e-4, atol = 1e-4})
case("max_pool2d input gradient differentiated w.r.t. its grad_output (max_pool2d_gather)",
  function() return {randn({1, 2, 4, 4}), randn({1, 2, 2, 2}), randn({1, 2, 4, 4})} end,
  function(x, g, h)
    x, g = leaf_of(x), leaf_of(g)
    local gx = nd.grad(nd.max_pool2d(x, 2), x, {grad_outputs = g, create_graph = true})
    return gx, nd.grad(gx, g, {grad_outputs = h, create_graph = true})
  end)

case("slice's input gradient differentiated w.r.t. its grad_output (slice_backward)",
  function() return {randn({4, 6}), randn({2, 3})} end,
  function(x, g)
    x = leaf_of(x)
    return nd.grad(x[{{2, 3}, {1, 6, 2}}], x, {grad_outputs = g, create_graph = true})
  end)
case("avg_pool2d's input gradient differentiated w.r.t. its grad_output (avg_pool2d_backward)",
  function() return {randn({1, 2, 4, 4}), randn({1, 2, 2, 2})} end,
  function(x, g)
    x = leaf_of(x)
    return nd.grad(nd.avg_pool2d(x, 2), x, {grad_outputs = g, create_graph = true})
  end)

case("a compiled forward's output, differentiated through its replayed backward graph (compiled_forward)",
  function() return {randn({5, 4}), randn({3, 4}), randn({3})} end,
  function(x, w, b)
    -- parameters as upvalues (a compiled function refuses arguments that require grad)
    local cf = nd.compile(function(a) return (F.linear(a, w, b):tanh() * a:sum(2, true)):sigmoid() end,
                          {warmup = 0})
    local xd = x:detach()
    cf(xd) -- captured
    return cf(xd) -- replayed: its output's backward replays the captured backward
  end, {nograd = {[1] = true}})

-- errors that must be errors on every device, with the cpu's message -----------------------------------

local ERROR_CASES = {
  {"gather index out of range", function() return {randn({3, 4}), i64({{1, 5}})} end,
    function(x, i) return x:gather(2, i) end},
  {"index_select index out of range", function() return {randn({3, 4}), i64({0})} end,
    function(x, i) return x:index_select(1, i) end},
  {"scatter index out of range", function() return {nd.zeros({3}), i64({1, 4}), nd.ones({2})} end,
    function(x, i, s) return x:scatter(1, i, s) end},
  {"index_add index out of range", function() return {nd.zeros({2, 2}), i64({1, 5}), nd.ones({2, 2})} end,
    function(x, i, s) return x:index_add(1, i, s) end},
  {"one_hot label out of range", function() return {i64({1, 4})} end, function(l) return nd.one_hot(l, 3) end},
  {"cross_entropy label out of range", function() return {randn({2, 3}), i64({1, 4})} end,
    function(x, y) return F.cross_entropy(x, y) end},
  {"embedding index out of range", function() return {i64({1, 6}), randn({5, 2})} end,
    function(i, w) return F.embedding(i, w) end},
  {"matmul shape mismatch", function() return {randn({2, 3}), randn({4, 5})} end,
    function(a, b) return a:matmul(b) end},
  {"uint8 + 256 (does not fit)", function() return {ints({3}, 0, 9, "uint8")} end, function(u) return u + 256 end},
}

-- running a case ---------------------------------------------------------------------------------------

-- the tensors in a result: multiple returns, lists (split) flattened
local function flatten(list, out)
  out = out or {}
  for _, v in ipairs(list) do
    if nd.is_tensor(v) then out[#out + 1] = v
    elseif type(v) == "table" then flatten(v, out) end
  end
  return out
end

local function seed_of(name)
  local h = 5381
  for i = 1, #name do h = (h * 33 + name:byte(i)) % 2147483647 end
  return h
end

-- runs case c on dev with the cpu inputs; returns outputs (on dev) and
-- gradients (on dev, nil where unused)
-- The registry's ops seen running on a device (profiler events: the
-- bindings called and, as "<op>_backward", the autograd nodes run), for the
-- coverage check at the end; c.covers names ops a case runs that no event
-- names (indexing x[i] is select/slice without an event of its own).
local SEEN, SEEN_NODE = {}, {} -- SEEN_NODE: ops whose autograd node's backward ran
local function observe(dev, fn, ...)
  if dev == "cpu" then return fn(...) end
  local args = table.pack(...)
  local r = table.pack(nd.profile(function() return fn(table.unpack(args, 1, args.n)) end))
  for name in pairs(r[1].by_name) do
    SEEN[name] = true
    local op = name:match("^(.+)_backward$")
    if op then SEEN[op], SEEN_NODE[op] = true, true end
  end
  return table.unpack(r, 2, r.n)
end

local function run_case(c, inputs, weights, dev)
  local leaves, grad_leaves = {}, {}
  for i, t in ipairs(inputs) do
    local x = t:clone():to(dev) -- a fresh copy: cases may modify inputs (running stats)
    if FLOAT[x.dtype] and c.grad ~= false and not (c.nograd and c.nograd[i]) then
      x.requires_grad = true
      grad_leaves[#grad_leaves + 1] = x
    end
    leaves[i] = x
  end
  local outs = flatten({observe(dev, c.fn, table.unpack(leaves, 1, #inputs))})
  local grads
  if #grad_leaves > 0 then
    local douts, ws = {}, {}
    for k, o in ipairs(outs) do
      if o.requires_grad and FLOAT[o.dtype] then
        douts[#douts + 1] = o
        ws[#ws + 1] = weights(k, o):to(dev)
      end
    end
    if #douts > 0 then
      grads = observe(dev, nd.grad, douts, grad_leaves, {grad_outputs = ws, allow_unused = true})
    end
  end
  if dev ~= "cpu" then
    for _, op in ipairs(c.covers or {}) do SEEN[op] = true end
  end
  return outs, grads, #grad_leaves
end

-- compares two results (cpu tensors); returns nil or a message
local function differ(want, got, rtol, atol, what)
  if want.dtype ~= got.dtype then return ("%s: dtype %s, expected %s"):format(what, got.dtype, want.dtype) end
  local ws, gs = table.concat(want.shape, ","), table.concat(got.shape, ",")
  if ws ~= gs then return ("%s: shape {%s}, expected {%s}"):format(what, gs, ws) end
  if want:numel() == 0 then return nil end
  local float = want.dtype == "float32" or want.dtype == "float64" or want.dtype == "float16" or want.dtype == "bfloat16"
  local a = want:contiguous():view({-1})
  local b = got:contiguous():view({-1})
  if float then a, b = a:to("float64"), b:to("float64") end
  local at, bt = a:totable(), b:totable()
  local worst, where_, nbad = 0, nil, 0
  for i = 1, #at do
    local x, y = at[i], bt[i]
    local bad
    if not float then
      bad = x ~= y
    elseif x ~= x or y ~= y then
      bad = (x ~= x) ~= (y ~= y)
    elseif x == math.huge or x == -math.huge or y == math.huge or y == -math.huge then
      bad = x ~= y
    else
      local e = math.abs(x - y) - (atol + rtol * math.abs(x))
      bad = e > 0
      if bad and e > worst then worst = e end
    end
    if bad then
      nbad = nbad + 1
      where_ = where_ or i
    end
  end
  if nbad > 0 then
    return ("%s: %d of %d elements differ, first at flat index %d: got %.9g, expected %.9g"):format(
      what, nbad, #at, where_, bt[where_], at[where_])
  end
  return nil
end

local function check_case(c, dev)
  local seed = seed_of(c.name)
  nd.manual_seed(seed)
  local inputs = c.make()
  local wcache = {}
  local function weights(k, o)
    if not wcache[k] then
      nd.manual_seed(seed + k)
      wcache[k] = nd.randn(o.shape, {dtype = o.dtype})
    end
    return wcache[k]
  end
  local want, want_g, ng = run_case(c, inputs, weights, "cpu")
  local got, got_g = run_case(c, inputs, weights, dev)
  local rtol, atol = c.rtol or 1e-5, c.atol or 1e-5
  local problems = {}
  if #got ~= #want then
    problems[#problems + 1] = ("%d results, expected %d"):format(#got, #want)
  else
    for k = 1, #want do
      if got[k].device ~= dev then
        problems[#problems + 1] = ("result %d is on %s, expected %s"):format(k, got[k].device, dev)
      else
        local m = differ(want[k], got[k]:cpu(), rtol, atol, "result " .. k)
        if m then problems[#problems + 1] = m end
      end
    end
  end
  if want_g then
    for k = 1, ng do
      local a, b = want_g[k], got_g and got_g[k]
      if (a == nil) ~= (b == nil) then
        problems[#problems + 1] = ("gradient %d: %s on %s, %s on the cpu"):format(k, b and "present" or "missing", dev,
          a and "present" or "missing")
      elseif a then
        if b.device ~= dev then
          problems[#problems + 1] = ("gradient %d is on %s, expected %s"):format(k, b.device, dev)
        else
          local m = differ(a, b:cpu(), rtol * 10, atol * 10, "gradient " .. k)
          if m then problems[#problems + 1] = m end
        end
      end
    end
  end
  return problems
end

-- the specs --------------------------------------------------------------------------------------------

if #TARGETS == 0 then
  describe("OpenCL ops against the cpu", function()
    D.pending_without_opencl(pending, "every op compared with the cpu (spec/opencl_ops_spec.lua)")
  end)
  return
end

for _, dev in ipairs(TARGETS) do
  describe("ops on " .. D.describe(dev) .. " match the cpu:", function()
    for _, c in ipairs(CASES) do
      if c.fp64 and not D.fp64(dev) then
        pending(c.name .. ": " .. dev .. " has no fp64")
      else
        it(c.name, function()
          local problems = check_case(c, dev)
          assert(#problems == 0, table.concat(problems, "\n"))
        end)
      end
    end

    for _, e in ipairs(ERROR_CASES) do
      it("error: " .. e[1], function()
        nd.manual_seed(seed_of(e[1]))
        local inputs = e[2]()
        local function attempt(d)
          local ins = {}
          for i, t in ipairs(inputs) do ins[i] = t:to(d) end
          return pcall(e[3], table.unpack(ins, 1, #inputs))
        end
        local ok_c, msg_c = attempt("cpu")
        assert(not ok_c, "the case does not fail on the cpu")
        local ok_d, msg_d = attempt(dev)
        assert(not ok_d, "no error on " .. dev .. " (the cpu says: " .. tostring(msg_c) .. ")")
        local strip = function(m) return (tostring(m):gsub("^[^:]*:%d+: ", "")) end
        assert.are.equal(strip(msg_c), strip(msg_d))
      end)
    end

    -- random draws: the same Philox streams on every device
    it("random: after nd.manual_seed the same draws as the cpu (uniform, int, bernoulli exact; normal 1e-5)", function()
      local function draw(d)
        nd.manual_seed(77)
        local o = {device = d}
        local r = {
          nd.rand({5, 7}, o), nd.rand({3}, {device = d, dtype = "float64"}),
          nd.randint(-3, 9, {4, 6}, o), nd.randint(1, 10, {1000}, o),
          nd.bernoulli(nd.full({6, 5}, 0.3, o)), nd.bernoulli(nd.linspace(0, 1, 50, o)),
          nd.rand_like(nd.zeros({2, 3}, o)),
          nd.randn({4, 9}, o), nd.randn({3}, {device = d, dtype = "float64"}), nd.randn_like(nd.zeros({5}, o)),
        }
        -- the stream moved on by the same amount
        r[#r + 1] = nd.rand({3}, o)
        r[#r + 1] = nd.zeros({1000}, o):bernoulli()
        r[#r + 1] = nd.randperm(20, o)
        return r
      end
      local want, got = draw("cpu"), observe(dev, draw, dev)
      local problems = {}
      for k = 1, #want do
        if got[k].device ~= dev then problems[#problems + 1] = ("draw %d on %s"):format(k, got[k].device) end
        local normal = k >= 8 and k <= 10
        local m = differ(want[k], got[k]:cpu(), normal and 1e-5 or 0, normal and 1e-5 or 0, "draw " .. k)
        if m then problems[#problems + 1] = m end
      end
      assert(#problems == 0, table.concat(problems, "\n"))
      assert.are.same(nd.get_rng_state(), (function() draw("cpu"); return nd.get_rng_state() end)())
    end)

    it("dropout: identity in evaluation; in training a mask with the right statistics, kept values scaled", function()
      local x = nd.ones({200, 100}):to(dev)
      -- evaluation mode and p = 0 return the input
      assert.are.same(x:totable(), F.dropout(x, 0.5, false):totable())
      local m = nd.nn.Dropout(0.25):to(dev)
      m:eval()
      assert.are.same(x:cpu():totable(), m(x):cpu():totable())
      -- training
      m:train()
      for _, p in ipairs({0.1, 0.5, 0.8}) do
        local y = F.dropout(x, p, true)
        assert.are.equal(dev, y.device)
        local flat = y:cpu():view({-1}):totable()
        local zeros, scale = 0, 1 / (1 - p)
        for _, v in ipairs(flat) do
          if v == 0 then zeros = zeros + 1
          else assert(math.abs(v - scale) < 1e-5, ("kept value %g, expected %g"):format(v, scale)) end
        end
        local frac, n = zeros / #flat, #flat
        local sd = math.sqrt(p * (1 - p) / n)
        assert(math.abs(frac - p) < 5 * sd, ("p = %g: %.4f of the values dropped"):format(p, frac))
      end
      -- two draws differ (the stream moves on); the gradient is the same mask, scaled
      local a = F.dropout(x, 0.5, true):cpu()
      local b = F.dropout(x, 0.5, true):cpu()
      assert.is_false(a:tobytes() == b:tobytes())
      local leaf = nd.ones({50, 40}):to(dev)
      leaf.requires_grad = true
      local y = F.dropout(leaf, 0.4, true)
      local g = nd.grad({y}, {leaf}, {grad_outputs = {nd.ones({50, 40}):to(dev)}})[1]
      assert.are.same(y:cpu():totable(), g:cpu():totable())
    end)

    -- after every case above (busted runs them in order); not in the cpu
    -- self-check, which observes nothing
    if dev ~= "cpu" then it("every op of nd.ops() ran on " .. dev .. " in a case above", function()
      local missing = {}
      for _, op in ipairs(nd.ops()) do
        -- an op that exists as another's gradient (slice_backward) shares its
        -- name with that op's backward event: only its own node's backward counts
        local seen = op.kind == "backward" and SEEN_NODE[op.name] or (op.kind ~= "backward" and SEEN[op.name])
        if not seen and not HOST_ONLY[op.name] then missing[#missing + 1] = op.name end
      end
      assert(#missing == 0, "ops without an OpenCL parity case: " .. table.concat(missing, ", "))
    end) end
  end)
end
