-- gradcheck_spec.lua - every differentiable op against central finite
-- differences in float64, on plain, broadcast, transposed, sliced and
-- expanded inputs and size-1 dims; second-order checks for a
-- representative set. The last block walks the op registry (nd.ops()) and
-- fails for any differentiable op without a passing gradcheck here or in
-- the file G.ELSEWHERE names for it.
local nd = require "needle"
local G = require "spec.helpers.gradcheck"
local leaf = G.leaf
local C = G.bind(assert)
local check, check2 = C.check, C.check2

describe("gradcheck", function()
  before_each(function() nd.manual_seed(1234) end)

  describe("unary", function()
    local cases = {
      {"neg", function(x) return -x end, -1, 1},
      {"abs", function(x) return x:abs() end, 0.2, 1},
      {"abs (negative side)", function(x) return nd.abs(x) end, -1, -0.2},
      {"exp", function(x) return x:exp() end, -1, 1},
      {"log", function(x) return x:log() end, 0.5, 2},
      {"sqrt", function(x) return x:sqrt() end, 0.5, 2},
      {"rsqrt", function(x) return x:rsqrt() end, 0.5, 2},
      {"tanh", function(x) return x:tanh() end, -2, 2},
      {"sigmoid", function(x) return x:sigmoid() end, -2, 2},
      {"relu", function(x) return x:relu() end, 0.1, 1},
      {"relu (off)", function(x) return x:relu() end, -1, -0.1},
      {"sin", function(x) return x:sin() end, -2, 2},
      {"cos", function(x) return x:cos() end, -2, 2},
      {"erf", function(x) return x:erf() end, -2, 2},
      {"log1p", function(x) return x:log1p() end, -0.5, 2},
      {"expm1", function(x) return nd.expm1(x) end, -1, 1},
      {"gelu", function(x) return nd.gelu(x) end, -3, 3},
      {"gelu_tanh", function(x) return nd.gelu_tanh(x) end, -3, 3},
      -- zero almost everywhere: checked away from the jumps
      {"sign", function(x) return x:sign() end, 0.1, 0.9},
      {"floor", function(x) return x:floor() end, 0.1, 0.9},
      {"ceil", function(x) return x:ceil() end, 0.1, 0.9},
      {"round", function(x) return x:round() end, 0.1, 0.4},
    }
    for _, c in ipairs(cases) do
      it(c[1] .. " on a transposed input", function()
        check(function(x) return c[2](x:t()) end, {leaf({3, 4}, c[3], c[4])})
      end)
    end
    it("sign, floor, round have zero gradient", function()
      local x = leaf({5}, 0.1, 0.9)
      local g = nd.grad((x:sign() + x:floor() + x:round()):sum(), x)
      assert.are.same({0, 0, 0, 0, 0}, g:totable())
    end)
  end)

  describe("binary with broadcasting", function()
    local ops = {
      {"add", function(a, b) return a + b end},
      {"sub", function(a, b) return a - b end},
      {"mul", function(a, b) return a * b end},
      {"div", function(a, b) return a / b end},
      {"pow", function(a, b) return a ^ b end},
      {"maximum", function(a, b) return nd.maximum(a, b) end},
      {"minimum", function(a, b) return a:minimum(b) end},
    }
    for _, op in ipairs(ops) do
      it(op[1] .. " {3,1} with {1,4}", function()
        check(op[2], {leaf({3, 1}, 0.5, 1.5), leaf({1, 4}, 1.6, 2.5)})
      end)
      it(op[1] .. " {2,3,4} with {4} and a sliced operand", function()
        check(function(a, b) return op[2](a[{":", ":", {1, -1, 2}}], b) end,
          {leaf({2, 3, 8}, 0.5, 1.5), leaf({4}, 1.6, 2.5)})
      end)
      it(op[1] .. " with a 0-dim operand", function()
        check(op[2], {leaf({2, 3}, 0.5, 1.5), leaf({}, 1.6, 2.5)})
      end)
    end
    local scalar = {
      {"x + 2", function(x) return x + 2 end}, {"2 - x", function(x) return 2 - x end},
      {"x * 3", function(x) return x * 3 end}, {"x / 4", function(x) return x / 4 end},
      {"4 / x", function(x) return 4 / x end}, {"x ^ 3", function(x) return x ^ 3 end},
      {"x ^ 0.5", function(x) return x ^ 0.5 end}, {"2 ^ x", function(x) return 2 ^ x end},
      {"maximum(x, 1)", function(x) return x:maximum(1) end},
    }
    for _, c in ipairs(scalar) do
      it(c[1], function() check(c[2], {leaf({2, 3}, 0.5, 2)}) end)
    end
    it("where routes gradients by the condition", function()
      local cond = nd.tensor({{true, false, true}, {false, true, false}})
      check(function(a, b) return nd.where(cond, a, b) end, {leaf({2, 3}), leaf({3})})
    end)
    it("clamp passes gradient inside the bounds only", function()
      check(function(x) return x:clamp(-0.5, 0.5) end, {leaf({4, 3}, -1, 1)})
    end)
  end)

  describe("reductions", function()
    local reds = {"sum", "mean", "prod", "var", "std", "logsumexp", "max", "min"}
    for _, r in ipairs(reds) do
      it(r .. " over all dims", function()
        check(function(x) return x[r](x) end, {leaf({2, 3}, 0.5, 1.5)})
      end)
      it(r .. " over dim 2 with keepdim, expanded input", function()
        check(function(x) return x:expand({3, 4})[r](x:expand({3, 4}) * nd.arange(4):double(), 2, true) end,
          {leaf({3, 1}, 0.5, 1.5)})
      end)
      it(r .. " over dims {1,3} of a permuted input", function()
        check(function(x) return x:permute({3, 1, 2})[r](x:permute({3, 1, 2}), {1, 3}) end,
          {leaf({2, 3, 4}, 0.5, 1.5)})
      end)
    end
    it("prod with zeros: one zero gets the product of the others, two zeros give 0", function()
      local x = nd.tensor({{2, 0, 3}, {0, 5, 0}, {1, 2, 4}}, {dtype = "float64", requires_grad = true})
      local g = nd.grad(x:prod(2):sum(), x)
      assert.are.same({{0, 6, 0}, {0, 0, 0}, {8, 4, 2}}, g:totable())
      local y = nd.tensor({3, 0, 2}, {dtype = "float64", requires_grad = true})
      assert.are.same({0, 6, 0}, nd.grad(y:prod(), y):totable())
    end)
    it("var with correction 0", function()
      check(function(x) return x:var(2, false, 0) end, {leaf({3, 4})})
    end)
    it("max(dim) values", function()
      check(function(x) local v = x:max(2); return v end, {leaf({3, 5})})
    end)
    it("logsumexp of large values", function()
      check(function(x) return (x * 100):logsumexp(1) end, {leaf({4, 2}, 9, 11)}, {atol = 1e-4})
    end)
  end)

  describe("matmul", function()
    local cases = {
      {"2-D x 2-D", {3, 4}, {4, 2}},
      {"1-D x 1-D", {4}, {4}},
      {"1-D x 2-D", {4}, {4, 3}},
      {"2-D x 1-D", {3, 4}, {4}},
      {"batched", {2, 3, 4}, {2, 4, 2}},
      {"broadcast batch", {2, 1, 3, 4}, {5, 4, 2}},
      {"1-D x batched", {4}, {2, 4, 3}},
    }
    for _, c in ipairs(cases) do
      it(c[1], function() check(function(a, b) return a:matmul(b) end, {leaf(c[2]), leaf(c[3])}) end)
    end
    it("transposed operands", function()
      check(function(a, b) return a:t():matmul(b:t()) end, {leaf({4, 3}), leaf({2, 4})})
    end)
  end)

  describe("views and copies", function()
    local views = {
      {"reshape", function(x) return x:reshape({4, 3}) end},
      {"view", function(x) return x:view({2, 6}) end},
      {"reshape of a transposed input (copies)", function(x) return x:t():reshape({12}) end},
      {"permute", function(x) return x:reshape({2, 2, 3}):permute({3, 1, 2}) end},
      {"transpose", function(x) return x:transpose(1, 2) end},
      {"expand", function(x) return x[{{1}}]:expand({5, 4}) end},
      {"select", function(x) return x[2] end},
      {"select negative", function(x) return x:select(2, -1) end},
      {"narrow", function(x) return x:narrow(2, 2, 2) end, covers = {"narrow"}},
      {"slice with step", function(x) return x[{":", {1, 4, 2}}] end},
      {"squeeze/unsqueeze", function(x) return x:unsqueeze(2):squeeze(2):unsqueeze(-1) end},
      {"flatten", function(x) return x:flatten() end, covers = {"flatten"}},
      {"clone", function(x) return x:clone() end},
      {"contiguous of a transpose", function(x) return x:t():contiguous() end},
      {"index chain", function(x) return x[{{2, 3}, {1, -1, 3}}] end},
    }
    for _, v in ipairs(views) do
      it(v[1], function() check(function(x) return v[2](x) * 1.5 end, {leaf({3, 4})}, {covers = v.covers}) end)
    end
    it("float32 round trip passes the gradient through", function()
      local x = leaf({3})
      local g = nd.grad((x:float() * 2):double():sum(), x)
      assert.are.equal("float64", g.dtype)
      assert.are.same({2, 2, 2}, g:totable())
    end)
    it("to float32 and back (the gradient of a rounding is 1)", function()
      -- eps large enough that float32's rounding (6e-8) is noise
      check(function(x) return x:to("float32"):to("float64") end, {leaf({3, 4})}, {eps = 1e-2, atol = 1e-4})
    end)
  end)

  describe("fused ops off the fast path (composed, so gradients flow)", function()
    it("fused_linear with relu", function()
      check(function(x, w, b) return nd.fused_linear(x, w, b, {activation = "relu"}) end,
        {leaf({3, 4}), leaf({5, 4}), leaf({5}, 0.5, 1)}, {covers = {"fused_linear"}})
    end)
    it("fused_conv2d with padding and relu", function()
      check(function(x, w, b) return nd.fused_conv2d(x, w, b, {padding = 1, activation = "relu"}) end,
        {leaf({1, 2, 4, 4}), leaf({3, 2, 3, 3}), leaf({3}, 0.5, 1)}, {covers = {"fused_conv2d"}})
    end)
  end)

  describe("second order", function()
    local cases = {
      {"mul", function(a, b) return a * b end, 2},
      {"div", function(a, b) return a / b end, 2},
      {"exp", function(a) return a:exp() end, 1},
      {"tanh", function(a) return a:tanh() end, 1},
      {"sigmoid", function(a) return a:sigmoid() end, 1},
      {"matmul", function(a, b) return a:matmul(b) end, 2},
      {"sum", function(a) return (a * a):sum(2) end, 1},
      {"logsumexp", function(a) return a:logsumexp(2) end, 1},
      {"select and slice", function(a) return a[2]:exp() + a[{":", 1}]:exp() end, 1},
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local leaves = c[3] == 2 and {leaf({3, 3}, 0.5, 1.5), leaf({3, 3}, 0.5, 1.5)} or {leaf({3, 3}, 0.5, 1.5)}
        check2(c[2], leaves, {atol = 1e-5, rtol = 1e-4})
      end)
    end
    it("conv2d", function()
      check2(function(x, w) return nd.conv2d(x, w, nil, {padding = 1}) end,
        {leaf({1, 2, 4, 4}), leaf({2, 2, 3, 3})}, {atol = 1e-5, rtol = 1e-4})
    end)
    -- The ops that exist as gradients of other ops, checked as functions of
    -- the gradients flowing into them (the outer nd.grad records them).
    it("col2im: conv2d's weight gradient differentiated w.r.t. the input", function()
      local x, w = leaf({1, 2, 4, 4}), leaf({2, 2, 3, 3})
      check(function(g, h)
        local gw = nd.grad(nd.conv2d(x, w, nil, {padding = 1}), w, {grad_outputs = g, create_graph = true})
        return nd.grad(gw, x, {grad_outputs = h, create_graph = true})
      end, {leaf({1, 2, 4, 4}), leaf({2, 2, 3, 3})}, {allow_unused = true})
    end)
    it("max_pool2d_gather: max_pool2d's input gradient differentiated w.r.t. its grad_output", function()
      local x = leaf({1, 2, 4, 4})
      check(function(g, h)
        local gx = nd.grad(nd.max_pool2d(x, 2), x, {grad_outputs = g, create_graph = true})
        return nd.grad(gx, g, {grad_outputs = h, create_graph = true})
      end, {leaf({1, 2, 2, 2}), leaf({1, 2, 4, 4})}, {allow_unused = true})
    end)
  end)

  describe("the op registry", function()
    it("every differentiable op of nd.ops() has a passing gradcheck", function()
      local elsewhere = {}
      for file, ops in pairs(G.ELSEWHERE) do
        for _, op in ipairs(ops) do elsewhere[op] = file end
      end
      local missing = {}
      for _, op in ipairs(nd.ops()) do
        if op.differentiable and not G.covered[op.name] and not elsewhere[op.name] then
          missing[#missing + 1] = op.name .. (op.records_node and "" or " (no node: name it with covers =)")
        end
      end
      assert(#missing == 0, "differentiable ops without a gradcheck case: " .. table.concat(missing, ", "))
    end)
  end)
end)
