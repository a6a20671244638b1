-- torch_fixtures_spec.lua - outputs and gradients against PyTorch, from the
-- fixtures spec/fixtures/gen/gen_torch_ops.py wrote (float32; relative
-- tolerance 1e-5 with a small absolute floor). PyTorch is not needed here.
local nd = require "needle"
local F = nd.F
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local fixtures = X.load("torch_ops")

-- the needle call for each fixture name
local ops = {
  neg = function(x) return -x end, abs = nd.abs, exp = nd.exp, log = nd.log, sqrt = nd.sqrt,
  rsqrt = nd.rsqrt, tanh = nd.tanh, sigmoid = nd.sigmoid, relu = nd.relu, sin = nd.sin,
  cos = nd.cos, erf = nd.erf, log1p = nd.log1p, log1p_tiny = nd.log1p, expm1 = nd.expm1,
  expm1_tiny = nd.expm1,
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end, maximum = nd.maximum, minimum = nd.minimum,
  sum_dim2 = function(x) return x:sum(2) end, mean_dim2 = function(x) return x:mean(2) end,
  prod_dim2 = function(x) return x:prod(2) end,
  amax_dim2 = function(x) return x:max({2}) end, amin_dim2 = function(x) return x:min({2}) end,
  logsumexp_dim2 = function(x) return x:logsumexp(2) end,
  var_dim2 = function(x) return x:var(2) end, std_dim2 = function(x) return x:std(2) end,
  var_all_c0 = function(x) return x:var(nil, false, {correction = 0}) end,
  matmul_2d = nd.matmul, matmul_batched_broadcast = nd.matmul, matmul_vec = nd.matmul,
  softmax_dim2 = function(x) return F.softmax(x, 2) end,
  log_softmax_dim1 = function(x) return F.log_softmax(x, 1) end,
  gelu = F.gelu, gelu_tanh = function(x) return F.gelu(x, {approximate = "tanh"}) end,
  leaky_relu = function(x) return F.leaky_relu(x, 0.1) end, softplus = F.softplus,
  elu = F.elu, silu = F.silu, mse_loss = F.mse_loss,
  bce_with_logits = F.binary_cross_entropy_with_logits,
  layer_norm_2dims = function(x, w, b) return F.layer_norm(x, {4, 5}, w, b) end,
  layer_norm_plain = function(x) return F.layer_norm(x, {6}) end,
  batch_norm_train = function(x, w, b) return F.batch_norm(x, nil, nil, w, b, true) end,
}

local function fn_for(c)
  if c.name == "cross_entropy" then
    return function(x) return F.cross_entropy(x, c.labels) end
  elseif c.name == "cross_entropy_ignore_smooth" then
    return function(x)
      return F.cross_entropy(x, c.labels, {ignore_index = c.ignore_index, label_smoothing = c.label_smoothing})
    end
  end
  if c.name == "embedding" then
    return function(w) return F.embedding(c.indices, w) end
  end
  return ops[c.name]
end

describe("against PyTorch fixtures", function()
  for _, c in ipairs(fixtures) do
    it(c.name, function()
      local fn = assert(fn_for(c), "no needle op for fixture " .. c.name)
      X.check_case(c.name, c, fn, {allow_unused = true})
    end)
  end
end)
