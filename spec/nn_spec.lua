-- nn_spec.lua - nd.nn modules: PyTorch fixtures (state_dict loaded by name,
-- outputs and gradients), state_dict keys and parameter counts, printing,
-- default initialisation, train/eval behaviour, containers, initialisers,
-- losses and error messages. The attention modules are in
-- nn_transformer_spec.lua.
local nd = require "needle"
local nn = nd.nn
local F = nd.F
local MF = require "spec.helpers.module_fixtures"

local A = require("spec.helpers.assertions").bind(assert)
local sorted_keys, sorted, max_abs_diff = MF.sorted_keys, MF.sorted, MF.max_abs_diff
local errmsg = A.errmsg

describe("nn modules against PyTorch fixtures", function()
  local builders = {
    linear = function() return nn.Linear(5, 4) end,
    linear_nobias = function() return nn.Linear(3, 2, {bias = false}) end,
    conv2d_groups = function() return nn.Conv2d(4, 6, 3, {stride = 2, padding = 1, groups = 2}) end,
    conv2d_dilation_nobias = function()
      return nn.Conv2d(2, 3, {3, 2}, {padding = {2, 1}, dilation = 2, bias = false})
    end,
    conv_transpose2d = function() return nn.ConvTranspose2d(4, 3, 3, {stride = 2, padding = 1, output_padding = 1}) end,
    batch_norm1d_train = function() return nn.BatchNorm1d(3, {momentum = 0.2}) end,
    batch_norm1d_eval = function() return nn.BatchNorm1d(3, {momentum = 0.2}) end,
    batch_norm1d_3d_train = function() return nn.BatchNorm1d(3, {momentum = 0.2}) end,
    batch_norm1d_3d_eval = function() return nn.BatchNorm1d(3, {momentum = 0.2}) end,
    batch_norm2d_train = function() return nn.BatchNorm2d(3, {momentum = 0.2}) end,
    batch_norm2d_eval = function() return nn.BatchNorm2d(3, {momentum = 0.2}) end,
    layer_norm = function() return nn.LayerNorm(6) end,
    layer_norm_2dims = function() return nn.LayerNorm({4, 5}, {eps = 1e-3}) end,
    embedding_padding = function() return nn.Embedding(7, 3, {padding_idx = 3}) end,
    sequential = function() return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)) end,
  }
  local call = function(m, x) return m(x) end
  for _, c in ipairs(MF.fixtures.cases) do
    if builders[c.name] then
      it(c.name .. " (" .. c.config .. ")", function()
        MF.run(c, builders[c.name](), call)
      end)
    end
  end

  it("the embedding's padding row gets no gradient and starts at zero", function()
    local c = MF.case("embedding_padding")
    local g = c.param_grads[1][2]
    for j = 1, 3 do assert.are.equal(0, g.data[(c.padding_idx - 1) * 3 + j]) end
    local e = nn.Embedding(7, 3, {padding_idx = 3})
    assert.are.same({0, 0, 0}, e.weight[3]:totable())
    assert.are.same({0, 0, 0}, nn.Embedding(7, 3, {padding_idx = -1}).weight[7]:totable())
  end)
end)

describe("state_dict keys and parameter counts equal PyTorch's", function()
  local builders = {
    mlp = function() return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10)) end,
    conv_bn = function()
      return nn.Sequential(nn.Conv2d(3, 16, 3, {padding = 1, bias = false}), nn.BatchNorm2d(16), nn.ReLU(),
                           nn.MaxPool2d(2))
    end,
    batch_norm_no_affine = function() return nn.BatchNorm1d(10, {affine = false}) end,
    batch_norm_untracked = function() return nn.BatchNorm2d(10, {track_running_stats = false}) end,
    layer_norm_no_affine = function() return nn.LayerNorm(10, {elementwise_affine = false}) end,
    conv_transpose_groups = function() return nn.ConvTranspose2d(8, 4, 3, {groups = 2}) end,
    embedding = function() return nn.Embedding(1000, 64) end,
  }
  for _, k in ipairs(MF.fixtures.keys) do
    if builders[k.name] then
      it(k.name .. " (" .. k.config .. ")", function()
        local m = builders[k.name]()
        assert.are.same(sorted(k.keys), sorted_keys(m))
        assert.are.equal(k.num_parameters, m:num_parameters())
      end)
    end
  end

  it("a PyTorch Sequential's state_dict loads into the needle Sequential", function()
    local c = MF.case("sequential")
    local m = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    m:load_state_dict(MF.state_dict(c))
    assert.are.same(MF.tensor(c.state[1][2]):totable(), m[1].weight:totable())
    assert.are.same(MF.tensor(c.state[4][2]):totable(), m[3].bias:totable())
  end)

  it("num_batches_tracked is an int64 scalar buffer, not a parameter", function()
    local bn = nn.BatchNorm2d(4)
    assert.are.equal("int64", bn.num_batches_tracked.dtype)
    assert.are.equal(0, bn.num_batches_tracked:dim())
    assert.are.equal(8, bn:num_parameters())
    assert.are.equal(2, #bn:parameters())
    assert.are.equal(3, #bn:named_buffers())
  end)
end)

describe("printing", function()
  it("shows the module tree with PyTorch's child names", function()
    local m = nn.Sequential(nn.Conv2d(3, 16, 3, {padding = 1}), nn.BatchNorm2d(16), nn.ReLU(),
                            nn.Flatten(), nn.Linear(16, 10))
    assert.are.equal(table.concat({
      "Sequential(",
      "  (0): Conv2d(3, 16, kernel_size={3, 3}, stride={1, 1}, padding={1, 1})",
      "  (1): BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)",
      "  (2): ReLU()",
      "  (3): Flatten(start_dim=2, end_dim=-1)",
      "  (4): Linear(in_features=16, out_features=10, bias=true)",
      ")"}, "\n"), tostring(m))
  end)

  it("nests containers and shows layer configurations", function()
    local m = nn.Sequential(nn.Residual(nn.Sequential(nn.Linear(4, 4), nn.GELU({approximate = "tanh"}))),
                            nn.Dropout(0.25), nn.LayerNorm(4), nn.Embedding(10, 4, {padding_idx = 1}))
    local s = tostring(m)
    assert.truthy(s:find("(0): Residual(\n    (fn): Sequential(\n      (0): Linear(in_features=4, out_features=4, bias=true)\n      (1): GELU(approximate='tanh')\n    )\n  )", 1, true))
    assert.truthy(s:find("(1): Dropout(p=0.25)", 1, true))
    assert.truthy(s:find("(2): LayerNorm({4}, eps=1e-05, elementwise_affine=true)", 1, true))
    assert.truthy(s:find("(3): Embedding(10, 4, padding_idx=1)", 1, true))
    assert.are.equal("Linear(in_features=3, out_features=2, bias=false)", tostring(nn.Linear(3, 2, {bias = false})))
    assert.are.equal("Conv2d(4, 8, kernel_size={3, 3}, stride={2, 2}, groups=2, bias=false)",
                     tostring(nn.Conv2d(4, 8, 3, {stride = 2, groups = 2, bias = false})))
    assert.truthy(m:summary({verbose = 0}):find("Trainable params: 68", 1, true)) -- (spec/module_api_spec.lua)
  end)
end)

describe("default initialisation matches PyTorch's distributions", function()
  local init_stats = MF.fixtures.init
  local function stats(t)
    local d = t:detach():double()
    return d:mean():item(), d:std():item(), d:min():item(), d:max():item()
  end

  it("Linear: weight and bias U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a = sqrt(5))", function()
    nd.manual_seed(1)
    local m = nn.Linear(1024, 512)
    local bound = 1 / math.sqrt(1024)
    local mean, std, lo, hi = stats(m.weight)
    local pt = init_stats.linear_weight
    assert.is_true(math.abs(mean) < 0.02 * bound, "weight mean " .. mean)
    assert.is_true(math.abs(std - bound / math.sqrt(3)) < 0.01 * bound, "weight std " .. std)
    assert.is_true(math.abs(std - pt.std) < 0.01 * pt.std, ("weight std %g, PyTorch %g"):format(std, pt.std))
    assert.is_true(lo >= -bound and hi <= bound)
    assert.is_true(hi > 0.99 * pt.max and lo < 0.99 * pt.min)
    mean, std, lo, hi = stats(m.bias)
    assert.is_true(lo >= -bound and hi <= bound)
    assert.is_true(math.abs(std - init_stats.linear_bias.std) < 0.1 * init_stats.linear_bias.std)
  end)

  it("Conv2d: the same bounds with fan_in = in * kh * kw", function()
    nd.manual_seed(2)
    local m = nn.Conv2d(64, 128, 3)
    local bound = 1 / math.sqrt(64 * 9)
    local mean, std, lo, hi = stats(m.weight)
    assert.is_true(math.abs(mean) < 0.02 * bound)
    assert.is_true(math.abs(std - init_stats.conv_weight.std) < 0.01 * init_stats.conv_weight.std)
    assert.is_true(lo >= -bound and hi <= bound)
    _, std, lo, hi = stats(m.bias)
    assert.is_true(lo >= -bound and hi <= bound)
    assert.is_true(math.abs(std - init_stats.conv_bias.std) < 0.2 * init_stats.conv_bias.std)
  end)

  it("Embedding N(0, 1); norms ones and zeros", function()
    nd.manual_seed(3)
    local m = nn.Embedding(1000, 256)
    local mean, std = stats(m.weight)
    assert.is_true(math.abs(mean) < 0.01)
    assert.is_true(math.abs(std - init_stats.embedding_weight.std) < 0.01)
    assert.are.same({"weight"}, sorted_keys(nn.LayerNorm(5, {bias = false})))
    local bn, ln = nn.BatchNorm2d(5), nn.LayerNorm(5)
    for _, t in ipairs({bn.weight, bn.running_var, ln.weight}) do assert.are.same({1, 1, 1, 1, 1}, t:totable()) end
    for _, t in ipairs({bn.bias, bn.running_mean, ln.bias}) do assert.are.same({0, 0, 0, 0, 0}, t:totable()) end
  end)
end)

describe("train and eval", function()
  it("Dropout zeroes and rescales in training, is the identity in eval", function()
    nd.manual_seed(4)
    local d = nn.Dropout(0.5)
    local x = nd.ones({1000})
    local y = d(x)
    local zeros = y:eq(0):sum():item()
    assert.is_true(zeros > 400 and zeros < 600, "zeros " .. zeros)
    assert.are.equal(1000 - zeros, y:eq(2):sum():item())
    d:eval()
    assert.is_false(d.training)
    assert.are.same(x:totable(), d(x):totable())
    d:train()
    assert.is_true(d(x):eq(0):sum():item() > 0)
  end)

  it("model:eval() reaches every descendant", function()
    local m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Dropout(0.5), nn.BatchNorm1d(4)))
    m:eval()
    for _, sub in ipairs(m:modules()) do assert.is_false(sub.training) end
    m:train()
    for _, sub in ipairs(m:modules()) do assert.is_true(sub.training) end
  end)

  it("BatchNorm uses batch statistics and updates the running ones in training, the running ones in eval", function()
    nd.manual_seed(5)
    local bn = nn.BatchNorm1d(3)
    local x = nd.randn({16, 3}) * 2 + 1
    local y = bn(x)
    -- normalised with the batch statistics: zero mean, unit (biased) variance per feature
    assert.is_true(y:mean(1):abs():max():item() < 1e-5)
    assert.is_true(max_abs_diff(y:var(1, false, {correction = 0}), nd.ones({3})) < 1e-3)
    assert.is_true(max_abs_diff(bn.running_mean, x:mean(1) * 0.1) < 1e-6)
    assert.is_true(max_abs_diff(bn.running_var, x:var(1) * 0.1 + 0.9) < 1e-5)
    assert.are.equal(1, bn.num_batches_tracked:item())
    bn:eval()
    local rm, rv = bn.running_mean:clone(), bn.running_var:clone()
    local y2 = bn(x)
    assert.is_true(max_abs_diff(y2, (x - rm) / (rv + 1e-5):sqrt()) < 1e-5)
    assert.are.same(rm:totable(), bn.running_mean:totable())
    assert.are.equal(1, bn.num_batches_tracked:item())
  end)

  it("BatchNorm momentum = false keeps a cumulative average; track_running_stats = false always uses the batch", function()
    nd.manual_seed(6)
    local bn = nn.BatchNorm1d(2, {momentum = false})
    local a, b = nd.randn({8, 2}), nd.randn({8, 2}) + 3
    bn(a); bn(b)
    assert.is_true(max_abs_diff(bn.running_mean, (a:mean(1) + b:mean(1)) / 2) < 1e-5)
    local un = nn.BatchNorm1d(2, {track_running_stats = false})
    assert.is_nil(un.running_mean)
    un:eval()
    local y = un(b)
    assert.is_true(y:mean(1):abs():max():item() < 1e-5)
  end)
end)

describe("containers", function()
  it("Sequential: children named 0..n-1, 1-based indexing, #, ipairs, append, insert", function()
    local l1, r, l2 = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    local m = nn.Sequential(l1, r, l2)
    assert.are.equal(3, #m)
    assert.are.equal(l1, m[1]); assert.are.equal(l2, m[3]); assert.are.equal(l2, m[-1])
    assert.is_nil(m[4]); assert.is_nil(m[0])
    local seen = {}
    for i, sub in ipairs(m) do seen[i] = sub end
    assert.are.same({l1, r, l2}, seen)
    assert.are.same({"0.bias", "0.weight", "2.bias", "2.weight"}, sorted_keys(m))
    local names = {}
    for i, c in ipairs(m:named_children()) do names[i] = c[1] end
    assert.are.same({"0", "1", "2"}, names)
    m:append(nn.Sigmoid())
    assert.are.equal(4, #m)
    m:insert(1, nn.Identity())
    assert.are.equal("Identity", m[1].__name)
    assert.are.equal(l1, m[2])
    assert.are.same({"1.bias", "1.weight", "3.bias", "3.weight"}, sorted_keys(m))
    local x = nd.randn({5, 2})
    assert.are.same(l2(r(l1(x))):sigmoid():totable(), m(x):totable())
    m[1] = nn.Tanh()
    assert.are.equal("Tanh", m[1].__name)
  end)

  it("Sequential takes a list; ModuleList holds modules; Residual adds its input", function()
    local m = nn.Sequential({nn.Linear(2, 2), nn.ReLU()})
    assert.are.equal(2, #m)
    local ml = nn.ModuleList({nn.Linear(2, 2), nn.Linear(2, 2)})
    ml:append(nn.Linear(2, 1))
    assert.are.equal(3, #ml)
    assert.are.same({"0.bias", "0.weight", "1.bias", "1.weight", "2.bias", "2.weight"}, sorted_keys(ml))
    assert.are.equal(2 * 6 + 3, ml:num_parameters())
    assert.truthy(errmsg(ml, nd.zeros({1})):find("not callable", 1, true))
    local empty = nn.ModuleList()
    assert.are.equal(0, #empty)
    local lin = nn.Linear(3, 3)
    local res = nn.Residual(lin)
    local x = nd.randn({2, 3})
    assert.is_true(max_abs_diff(res(x), lin(x) + x) == 0)
    assert.are.same({"fn.bias", "fn.weight"}, sorted_keys(res))
    assert.truthy(errmsg(nn.Sequential, nn.Linear(1, 1), 5):find("needle.nn.Sequential: argument 2 must be a module", 1, true))
  end)

  it("gradients flow through a Sequential to every parameter", function()
    local m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2))
    local loss = nn.CrossEntropyLoss()(m(nd.randn({5, 4})), {1, 2, 2, 1, 1})
    loss:backward()
    for _, p in ipairs(m:named_parameters()) do
      assert.truthy(p[2].grad, p[1] .. " has no grad")
      assert.are.same(p[2].shape, p[2].grad.shape)
    end
  end)
end)

describe("layers", function()
  it("Linear accepts any leading dims; Identity, Flatten, Unflatten", function()
    local m = nn.Linear(4, 3)
    local x = nd.randn({2, 5, 4})
    local y = m(x)
    assert.are.same({2, 5, 3}, y.shape)
    assert.is_true(max_abs_diff(y, x:matmul(m.weight:t()) + m.bias) < 1e-6)
    assert.are.equal(x, nn.Identity()(x))
    assert.are.same({2, 20}, nn.Flatten()(x).shape)
    assert.are.same({40}, nn.Flatten(1)(x).shape)
    assert.are.same({10, 4}, nn.Flatten({start_dim = 1, end_dim = 2})(x).shape)
    assert.are.same({2, 5, 2, 2}, nn.Unflatten(3, {2, 2})(x).shape)
    assert.are.same({2, 5, 2, 2}, nn.Unflatten(-1, {-1, 2})(x).shape)
  end)

  it("activations equal the nd.F functions", function()
    local x = nd.randn({3, 4})
    local pairs_ = {
      {nn.ReLU(), F.relu(x)}, {nn.Tanh(), F.tanh(x)}, {nn.Sigmoid(), F.sigmoid(x)}, {nn.SiLU(), F.silu(x)},
      {nn.GELU(), F.gelu(x)}, {nn.GELU({approximate = "tanh"}), F.gelu(x, {approximate = "tanh"})},
      {nn.LeakyReLU(0.2), F.leaky_relu(x, 0.2)}, {nn.LeakyReLU(), F.leaky_relu(x)},
      {nn.Softmax(1), F.softmax(x, 1)}, {nn.Softmax(), F.softmax(x, -1)}, {nn.LogSoftmax(-1), F.log_softmax(x, -1)},
    }
    for _, p in ipairs(pairs_) do
      assert.are.same(p[2]:totable(), p[1](x):totable(), tostring(p[1]))
    end
  end)

  it("pooling modules equal the nd.F functions", function()
    local x = nd.randn({2, 3, 6, 6})
    assert.are.same(F.max_pool2d(x, 2):totable(), nn.MaxPool2d(2)(x):totable())
    assert.are.same(F.max_pool2d(x, 3, {stride = 2, padding = 1}):totable(),
                    nn.MaxPool2d(3, {stride = 2, padding = 1})(x):totable())
    assert.are.same(F.avg_pool2d(x, 2):totable(), nn.AvgPool2d(2)(x):totable())
    assert.are.same(F.adaptive_avg_pool2d(x, {1, 1}):totable(), nn.AdaptiveAvgPool2d(1)(x):totable())
    assert.are.same({2, 3, 1, 1}, nn.AdaptiveAvgPool2d({1, 1})(x).shape)
  end)

  it("Conv2d padding 'same' keeps the spatial size (odd and even kernels)", function()
    local x = nd.randn({1, 2, 7, 6})
    assert.are.same({1, 4, 7, 6}, nn.Conv2d(2, 4, 3, {padding = "same"})(x).shape)
    local m = nn.Conv2d(2, 4, 4, {padding = "same", bias = false})
    assert.are.same({1, 4, 7, 6}, m(x).shape)
    -- PyTorch pads the extra row/column at the bottom/right
    local ref = F.conv2d(x:pad({1, 2, 1, 2}), m.weight)
    assert.is_true(max_abs_diff(ref, m(x)) < 1e-6)
    assert.are.same({1, 4, 5, 4}, nn.Conv2d(2, 4, 3, {padding = "valid"})(x).shape)
  end)
end)

describe("losses", function()
  local logits = nd.randn({6, 4})
  local labels = nd.tensor({1, 4, 2, 2, 3, 1}, {dtype = "int64"})

  it("CrossEntropyLoss and SoftmaxLoss equal F.cross_entropy", function()
    assert.are.equal(F.cross_entropy(logits, labels):item(), nn.CrossEntropyLoss()(logits, labels):item())
    assert.are.equal(F.cross_entropy(logits, labels):item(), nn.SoftmaxLoss()(logits, labels):item())
    local o = {ignore_index = 2, label_smoothing = 0.1, reduction = "sum"}
    assert.are.equal(F.cross_entropy(logits, labels, o):item(), nn.CrossEntropyLoss(o)(logits, labels):item())
    assert.are.same({6}, nn.CrossEntropyLoss({reduction = "none"})(logits, labels).shape)
  end)

  it("CrossEntropyLoss takes (N, C, d) logits with (N, d) labels, as PyTorch", function()
    local x = nd.randn({2, 4, 3})
    local t = nd.tensor({{1, 2, 4}, {3, 3, 1}}, {dtype = "int64"})
    local flat = x:permute({1, 3, 2}):reshape({6, 4})
    local want = F.cross_entropy(flat, t:reshape({6})):item()
    assert.is_true(math.abs(nn.CrossEntropyLoss()(x, t):item() - want) < 1e-6)
    assert.are.same({2, 3}, nn.CrossEntropyLoss({reduction = "none"})(x, t).shape)
    assert.truthy(errmsg(nn.CrossEntropyLoss(), x, nd.ones({2, 4}, {dtype = "int64"}))
      :find("needle.nn.CrossEntropyLoss: input {2,4,3} needs labels of shape {2,3}, got {2,4}", 1, true))
  end)

  it("NLLLoss, MSELoss, BCEWithLogitsLoss", function()
    local lp = F.log_softmax(logits, 2)
    assert.are.equal(F.nll_loss(lp, labels):item(), nn.NLLLoss()(lp, labels):item())
    local a, b = nd.randn({3, 4}), nd.randn({3, 4})
    assert.are.equal(F.mse_loss(a, b):item(), nn.MSELoss()(a, b):item())
    assert.are.equal(F.mse_loss(a, b, {reduction = "sum"}):item(), nn.MSELoss({reduction = "sum"})(a, b):item())
    local y = nd.rand({3, 4})
    assert.is_true(math.abs(F.binary_cross_entropy_with_logits(a, y):item() - nn.BCEWithLogitsLoss()(a, y):item()) < 1e-6)
    -- pos_weight: -(pw y log s(x) + (1 - y) log(1 - s(x)))
    local pw = nd.tensor({1, 2, 3, 0.5})
    local s = a:sigmoid()
    local want = -(pw * y * s:log() + (1 - y) * (1 - s):log())
    assert.is_true(max_abs_diff(nn.BCEWithLogitsLoss({pos_weight = pw, reduction = "none"})(a, y), want) < 1e-5)
    assert.truthy(errmsg(nn.MSELoss, {reduction = "avg"}):find("reduction must be 'mean', 'sum' or 'none'", 1, true))
    assert.truthy(errmsg(nn.MSELoss(), a, nd.zeros({4, 3})):find("needle.nn.MSELoss: input {3,4} and target {4,3}", 1, true))
  end)
end)

describe("nd.nn.init", function()
  local init = nn.init

  it("fills in place under no_grad and returns the tensor", function()
    local p = nn.Parameter(nd.zeros({4, 5}))
    assert.are.equal(p, init.ones_(p))
    assert.are.same(nd.ones({4, 5}):totable(), p:totable())
    assert.is_true(p.requires_grad)
    assert.are.equal(p, init.constant_(p, 0.5))
    assert.are.equal(0.5, p:mean():item())
    init.zeros_(p)
    assert.are.equal(0, p:abs():sum():item())
    init.uniform_(p, -3, -2)
    assert.is_true(p:min():item() >= -3 and p:max():item() <= -2)
    init.uniform_(p, {a = 5, b = 6})
    assert.is_true(p:min():item() >= 5)
    nd.manual_seed(7)
    local big = nd.empty({200, 300})
    init.normal_(big, 2, 0.5)
    assert.is_true(math.abs(big:mean():item() - 2) < 0.01)
    assert.is_true(math.abs(big:std():item() - 0.5) < 0.01)
  end)

  it("has the names without the trailing underscore as aliases", function()
    for _, n in ipairs({"uniform", "normal", "constant", "zeros", "ones", "xavier_uniform", "xavier_normal",
                        "kaiming_uniform", "kaiming_normal", "orthogonal"}) do
      assert.are.equal(init[n .. "_"], init[n], n)
    end
  end)

  it("calculate_gain as PyTorch", function()
    assert.are.equal(1, init.calculate_gain("linear"))
    assert.are.equal(1, init.calculate_gain("sigmoid"))
    assert.are.equal(5 / 3, init.calculate_gain("tanh"))
    assert.are.equal(math.sqrt(2), init.calculate_gain("relu"))
    assert.are.equal(math.sqrt(2 / (1 + 0.01 ^ 2)), init.calculate_gain("leaky_relu"))
    assert.are.equal(math.sqrt(2 / (1 + 5)), init.calculate_gain("leaky_relu", math.sqrt(5)))
    assert.are.equal(0.75, init.calculate_gain("selu"))
    assert.truthy(errmsg(init.calculate_gain, "swish"):find("unsupported nonlinearity 'swish'", 1, true))
  end)

  it("xavier and kaiming bounds and standard deviations", function()
    nd.manual_seed(8)
    local t = nd.empty({400, 600})
    init.xavier_uniform_(t)
    local a = math.sqrt(6 / 1000)
    assert.is_true(t:abs():max():item() <= a)
    assert.is_true(math.abs(t:std():item() - a / math.sqrt(3)) < 0.01 * a)
    init.xavier_normal_(t, 2)
    assert.is_true(math.abs(t:std():item() - 2 * math.sqrt(2 / 1000)) < 0.01 * math.sqrt(2 / 1000) * 2)
    init.kaiming_uniform_(t, {nonlinearity = "relu"})
    local b = math.sqrt(2) * math.sqrt(3 / 600)
    assert.is_true(t:abs():max():item() <= b)
    assert.is_true(math.abs(t:std():item() - b / math.sqrt(3)) < 0.01 * b)
    init.kaiming_normal_(t, 0, "fan_out", "relu")
    assert.is_true(math.abs(t:std():item() - math.sqrt(2 / 400)) < 0.01 * math.sqrt(2 / 400))
    init.kaiming_uniform_(t, {gain = 1, mode = "fan_out"})
    assert.is_true(t:abs():max():item() <= math.sqrt(3 / 400))
    -- conv fans include the receptive field
    local w = nd.empty({16, 8, 3, 3})
    init.kaiming_uniform_(w, math.sqrt(5))
    assert.is_true(w:abs():max():item() <= 1 / math.sqrt(72))
    assert.truthy(errmsg(init.xavier_uniform_, nd.empty({5}))
      :find("needle.nn.init.xavier_uniform_: fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape {5})", 1, true))
  end)

  it("orthogonal_ gives orthonormal rows or columns, scaled by gain", function()
    for _, shape in ipairs({{6, 4}, {4, 6}, {3, 2, 2}}) do
      local t = init.orthogonal_(nd.empty(shape))
      local m = t:reshape({shape[1], -1})
      local g = m:size(1) >= m:size(2) and m:t():matmul(m) or m:matmul(m:t())
      assert.is_true(max_abs_diff(g, nd.eye(g:size(1))) < 1e-5, table.concat(shape, "x"))
    end
    local t = init.orthogonal_(nd.empty({5, 5}), 2)
    assert.is_true(max_abs_diff(t:t():matmul(t), nd.eye(5) * 4) < 1e-4)
  end)

  it("refuses arguments that would fill NaN, a wrong type or an extra argument, naming the initialiser", function()
    local function msg(fn, ...) return errmsg(init[fn], nd.zeros({3, 4}), ...) end
    local function has(m, fragment) assert.truthy(m:find(fragment, 1, true), m) end
    has(msg("uniform_", 1, 0), "needle.nn.init.uniform_: expected a <= b, got a = 1 and b = 0")
    has(msg("uniform_", 0 / 0), "needle.nn.init.uniform_: a must be a finite number, got")
    has(msg("uniform_", 0, math.huge), "needle.nn.init.uniform_: b must be a finite number, got inf")
    has(msg("uniform_", "a"), "needle.nn.init.uniform_: a (argument 2) must be a number, got \"a\"")
    has(msg("normal_", 0, -1), "needle.nn.init.normal_: std must be a finite number >= 0, got -1")
    has(msg("normal_", {std = 0 / 0}), "needle.nn.init.normal_: std must be a finite number >= 0, got")
    has(msg("normal_", 0, "x"), "needle.nn.init.normal_: std (argument 3) must be a number, got \"x\"")
    has(msg("constant_", 0 / 0), "needle.nn.init.constant_: val must be a finite number, got")
    has(msg("xavier_uniform_", "relu"), "needle.nn.init.xavier_uniform_: gain (argument 2) must be a number, got " ..
        "\"relu\" (a nonlinearity's gain is nn.init.calculate_gain(\"relu\"))")
    has(msg("xavier_uniform_", 0 / 0), "needle.nn.init.xavier_uniform_: gain must be a finite number >= 0, got")
    has(msg("xavier_normal_", -1), "needle.nn.init.xavier_normal_: gain must be a finite number >= 0, got -1")
    has(msg("kaiming_normal_", 0 / 0), "needle.nn.init.kaiming_normal_: a must be a finite number, got")
    has(msg("kaiming_uniform_", {gain = math.huge}), "needle.nn.init.kaiming_uniform_: gain must be a finite number >= 0, got inf")
    has(msg("kaiming_normal_", 0, 5), "needle.nn.init.kaiming_normal_: mode (argument 3) must be a string, got 5")
    has(msg("kaiming_uniform_", "relu"), "needle.nn.init.kaiming_uniform_: a (argument 2) must be a number, got \"relu\" " ..
        "(the nonlinearity goes fourth, or as {nonlinearity = \"relu\"})")
    has(msg("orthogonal_", 0 / 0), "needle.nn.init.orthogonal_: gain must be a finite number, got")
    -- extra arguments
    has(msg("zeros_", 5), "needle.nn.init.zeros_: takes zeros_(tensor) only, got an extra argument #2: 5")
    has(msg("ones_", 5), "needle.nn.init.ones_: takes ones_(tensor) only, got an extra argument #2: 5")
    has(msg("uniform_", 0, 1, 5),
        "needle.nn.init.uniform_: takes uniform_(tensor[, a, b]) or uniform_(tensor, {a=, b=}) only, got an extra argument #4: 5")
    has(msg("uniform_", {a = 0}, 5), "needle.nn.init.uniform_: takes uniform_(tensor[, a, b]) or uniform_(tensor, {a=, b=}) " ..
        "only, got an extra argument #3: 5")
    has(errmsg(init.calculate_gain, "relu", 5), "needle.nn.init.calculate_gain: param (the negative slope) is for " ..
        "leaky_relu only, got 5 for 'relu'")
    has(errmsg(init.calculate_gain, "leaky_relu", 0.1, 1), "needle.nn.init.calculate_gain: takes calculate_gain(" ..
        "nonlinearity[, param]) only, got an extra argument #3: 1")
    has(errmsg(init.calculate_gain, "leaky_relu", 0 / 0), "needle.nn.init.calculate_gain: negative_slope must be a finite number")
    has(errmsg(init.calculate_gain, nil), "needle.nn.init.calculate_gain: nonlinearity must be a string, got nil")
    -- a relu's a (leaky_relu's slope) is ignored, as PyTorch's; a = b and std 0 are fine
    init.kaiming_normal_(nd.zeros({3, 4}), 0.2, "fan_in", "relu")
    assert.are.same({{2, 2}, {2, 2}}, init.uniform_(nd.zeros({2, 2}), 2, 2):totable())
    assert.are.same({{1, 1}, {1, 1}}, init.normal_(nd.zeros({2, 2}), 1, 0):totable())
  end)
end)

describe("nn errors name the module, its config and the shapes", function()
  it("Conv2d channels", function()
    local m = nn.Conv2d(3, 16, 3)
    assert.truthy(errmsg(m, nd.zeros({8, 4, 32, 32}))
      :find("needle.nn.Conv2d(3, 16): expected input with 3 channels (N, 3, H, W), got {8,4,32,32}", 1, true))
    assert.truthy(errmsg(m, nd.zeros({32, 32}))
      :find("needle.nn.Conv2d(3, 16): expected input with 3 channels (N, 3, H, W), got {32,32}", 1, true))
    assert.truthy(errmsg(nn.ConvTranspose2d(4, 2, 3), nd.zeros({1, 2, 5, 5}))
      :find("needle.nn.ConvTranspose2d(4, 2): expected input with 4 channels (N, 4, H, W), got {1,2,5,5}", 1, true))
    assert.truthy(errmsg(nn.Conv2d, 3, 16, 3, {groups = 2})
      :find("needle.nn.Conv2d(3, 16): in_channels and out_channels must be divisible by groups (2)", 1, true))
    assert.truthy(errmsg(nn.Conv2d, 3, 16, 0):find("needle.nn.Conv2d: kernel_size must be an integer >= 1", 1, true))
  end)

  it("Linear last dim", function()
    local m = nn.Linear(784, 128)
    assert.truthy(errmsg(m, nd.zeros({32, 100}))
      :find("needle.nn.Linear(784, 128): expected input with last dim 784, got {32,100}", 1, true))
    assert.truthy(errmsg(m, "x"):find("needle.nn.Linear(784, 128): expected a tensor input, got string", 1, true))
    assert.truthy(errmsg(nn.Linear, 3.5, 2):find("needle.nn.Linear: in_features must be an integer", 1, true))
  end)

  it("settings with a range (eps, momentum, dropout, dim_feedforward, activations' numbers) are checked at construction, NaN too", function()
    local nan = 0 / 0
    local cases = {
      {function() return nn.BatchNorm2d(3, {eps = -1}) end, "needle.nn.BatchNorm2d: eps must be a finite number >= 0, got -1"},
      {function() return nn.BatchNorm1d(3, {eps = nan}) end, "needle.nn.BatchNorm1d: eps must be a finite number >= 0"},
      {function() return nn.BatchNorm2d(3, {momentum = 2}) end, "needle.nn.BatchNorm2d: momentum must be a number in [0, 1], got 2"},
      {function() return nn.SyncBatchNorm(3, {momentum = nan}) end, "needle.nn.SyncBatchNorm: momentum must be a number in [0, 1]"},
      {function() return nn.InstanceNorm2d(3, {momentum = 5}) end, "needle.nn.InstanceNorm2d: momentum must be a number in [0, 1], got 5"},
      {function() return nn.LayerNorm(3, {eps = -1}) end, "needle.nn.LayerNorm: eps must be a finite number >= 0, got -1"},
      {function() return nn.GroupNorm(1, 3, {eps = nan}) end, "needle.nn.GroupNorm: eps must be a finite number >= 0"},
      {function() return nn.RMSNorm(3, {eps = -1}) end, "needle.nn.RMSNorm: eps must be a finite number >= 0, got -1"},
      {function() return nn.MultiheadAttention(4, 2, {dropout = 2}) end, "needle.nn.MultiheadAttention: dropout must be a probability in [0, 1], got 2"},
      {function() return nn.TransformerEncoderLayer(4, 2, {dim_feedforward = 0}) end,
       "needle.nn.TransformerEncoderLayer: dim_feedforward must be a positive integer, got 0"},
      {function() return nn.TransformerDecoderLayer(4, 2, {layer_norm_eps = -1}) end,
       "needle.nn.TransformerDecoderLayer: layer_norm_eps must be a finite number >= 0, got -1"},
      {function() return nn.GRU(3, 3, {dropout = nan}) end, "needle.nn.GRU: dropout must be a probability in [0, 1]"},
      {function() return nn.ELU(nan) end, "needle.nn.ELU: alpha must be a finite number"},
      {function() return nn.ELU("a") end, "needle.nn.ELU: alpha must be a finite number, got \"a\""},
      {function() return nn.LeakyReLU(nan) end, "needle.nn.LeakyReLU: negative_slope must be a finite number"},
      {function() return nn.PReLU({init = nan}) end, "needle.nn.PReLU: init must be a finite number"},
      {function() return nn.Softplus({beta = 0}) end, "needle.nn.Softplus: beta must not be 0"},
      {function() return nn.Softplus({threshold = nan}) end, "needle.nn.Softplus: threshold must be a finite number"},
    }
    for _, c in ipairs(cases) do
      local msg = errmsg(c[1])
      assert.truthy(msg:find(c[2], 1, true), msg)
    end
    -- the module API's own arguments
    local m = nn.Linear(2, 2)
    assert.truthy(errmsg(m.train, m, "no"):find("needle.nn.Linear.train: mode must be a boolean", 1, true))
    assert.truthy(errmsg(m.load_state_dict, m, nil):find("expected a state_dict (a table of name = tensor)", 1, true))
    assert.truthy(errmsg(m.apply, m, 5):find("needle.nn.Linear.apply: expected a function of a module, got 5", 1, true))
    assert.truthy(errmsg(m.named_parameters, m, {}):find("prefix must be a string", 1, true))
    assert.truthy(errmsg(nn.Parameter, 3):find("needle.nn.Parameter: takes Parameter(tensor) only, got 3", 1, true))
    assert.truthy(errmsg(nn.Parameter, nd.ones(2), false):find("takes Parameter(tensor) only", 1, true))
    assert.is_true(m.training) -- (refused: unchanged)
    -- arguments a constructor or a forward would drop (as PyTorch's TypeError)
    assert.truthy(errmsg(nn.Linear, 2, 3, {}, 5):find("needle.nn.Linear: the constructor takes 3 argument(s), got 4 (argument 4 is 5)", 1, true))
    assert.truthy(errmsg(m, nd.ones(1, 2), nd.ones(1)):find("needle.nn.Linear: forward takes 1 argument(s), got 2 (argument 2 is a tensor)", 1, true))
    assert.are.same({1, 2}, m(nd.ones(1, 2), nil).shape) -- (a trailing nil is no argument)
    local V = nn.Module:extend("V")
    function V:forward(...) return select("#", ...) end
    assert.are.equal(3, V()(1, 2, 3)) -- a vararg forward takes any
  end)

  it("norms, embedding, containers", function()
    assert.truthy(errmsg(nn.BatchNorm2d(16), nd.zeros({8, 4, 3, 3}))
      :find("needle.nn.BatchNorm2d(16): expected input with 16 channels (N, 16, H, W), got {8,4,3,3}", 1, true))
    assert.truthy(errmsg(nn.BatchNorm1d(5), nd.zeros({8, 4}))
      :find("needle.nn.BatchNorm1d(5): expected input with 5 features (N, 5) or (N, 5, L), got {8,4}", 1, true))
    local bn = nn.BatchNorm1d(3)
    assert.truthy(errmsg(bn, nd.zeros({1, 3}))
      :find("needle.nn.BatchNorm1d(3): expected more than 1 value per channel when training, got input of shape {1,3}", 1, true))
    assert.are.equal(0, bn.num_batches_tracked:item())
    bn:eval()
    assert.are.same({1, 3}, bn(nd.zeros({1, 3})).shape)
    assert.truthy(errmsg(nn.LayerNorm(64), nd.zeros({2, 32}))
      :find("needle.nn.LayerNorm(64): expected input with last dims {64}, got {2,32}", 1, true))
    assert.truthy(errmsg(nn.LayerNorm({4, 5}), nd.zeros({2, 5, 4}))
      :find("needle.nn.LayerNorm({4, 5}): expected input with last dims {4,5}, got {2,5,4}", 1, true))
    assert.truthy(errmsg(nn.LayerNorm1d(8), nd.zeros({2, 4}))
      :find("needle.nn.LayerNorm1d(8): expected input with last dims {8}, got {2,4}", 1, true))
    local e = nn.Embedding(10, 4)
    assert.truthy(errmsg(e, {1, 11}):find("needle.nn.Embedding(10, 4): index 11 is out of range (expected 1..10)", 1, true))
    assert.truthy(errmsg(e, nd.tensor({0}, {dtype = "int64"}))
      :find("needle.nn.Embedding(10, 4): index 0 is out of range (expected 1..10)", 1, true))
    assert.truthy(errmsg(e, nd.zeros({2})):find("needle.nn.Embedding(10, 4): expected integer indices, got float32", 1, true))
    assert.truthy(errmsg(nn.Dropout, 1.5):find("needle.nn.Dropout: p must be a probability in [0, 1], got 1.5", 1, true))
    -- NaN compares false with both bounds: refused all the same
    assert.truthy(errmsg(nn.Dropout, 0 / 0):find("needle.nn.Dropout: p must be a probability in [0, 1], got", 1, true))
    assert.truthy(errmsg(nd.F.dropout, nd.ones(2), 0 / 0):find("needle.dropout: p must be in [0, 1]", 1, true))
    assert.truthy(errmsg(nn.LSTM, 3, 3, {dropout = 0 / 0}):find("needle.nn.LSTM: dropout must be a probability in [0, 1]", 1, true))
    assert.truthy(errmsg(nn.Unflatten(2, {3, 3}), nd.zeros({2, 8}))
      :find("needle.nn.Unflatten(2, {3, 3}): dim 2 of input {2,8} has size 8, which does not split into {3,3}", 1, true))
  end)

  it("load_state_dict with a wrong shape names the key", function()
    local m = nn.Sequential(nn.Linear(4, 3))
    local sd = m:state_dict()
    sd["0.weight"] = nd.zeros({4, 4})
    assert.truthy(errmsg(m.load_state_dict, m, sd):find("0.weight (checkpoint {4,4}, model {3,4})", 1, true))
  end)
end)

-- Issue 15: errors raised inside the library (a Linear called by a
-- Sequential, an op inside a container's forward, a module built by another's
-- constructor) carry the position of the user's line, not a library line.
describe("nn errors point at the user's line", function()
  -- fn must raise; returns the message and the line fn's own call started on
  local function raised(fn)
    local ok, e = pcall(fn)
    assert.is_false(ok)
    return tostring(e)
  end
  local function here() return debug.getinfo(2, "l").currentline end

  it("a module's error through Sequential and nested containers", function()
    local model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Sequential(nn.Linear(2, 2)))
    local line
    local e = raised(function() line = here(); local y = model(nd.zeros({1, 4})); return y end)
    assert.truthy(e:find(("^spec/nn_spec%%.lua:%d: needle%%.nn%%.Linear%%(2, 2%%): expected input with last dim 2"):format(line)), e)
    assert.is_nil(e:find("container.lua", 1, true), e)
  end)

  it("an op's error inside a library forward", function()
    local res = nn.Residual(nn.Linear(2, 3))
    local line
    local e = raised(function() line = here(); local y = res(nd.zeros({1, 2})); return y end)
    assert.truthy(e:find(("^spec/nn_spec%%.lua:%d: needle%%.add: "):format(line)), e)
  end)

  it("inside a user's module: the user's own line in its forward", function()
    local Net = nn.Module:extend("Net")
    local inner_line
    function Net:init() self.fc = nn.Linear(4, 2) end
    function Net:forward(x)
      inner_line = here(); local y = self.fc(x); return y
    end
    local net = nn.Sequential(Net())
    local e = raised(function() local y = net(nd.zeros({1, 5})); return y end)
    assert.truthy(e:find(("^spec/nn_spec%%.lua:%d: needle%%.nn%%.Linear%%(4, 2%%)"):format(inner_line)), e)
  end)

  it("a constructor's error raised while building an inner module", function()
    local line
    local e = raised(function() line = here(); local m = nn.TransformerEncoderLayer(6, 4); return m end)
    assert.truthy(e:find(("^spec/nn_spec%%.lua:%d: needle%%.nn%%.MultiheadAttention%%(6, 4%%): embed_dim must be " ..
                          "divisible by num_heads"):format(line)), e)
    e = raised(function() line = here(); local m = nn.models.MLP({2, 3, 1}, {dropout = "x"}); return m end)
    assert.truthy(e:find(("^spec/nn_spec%%.lua:%d: needle%%.nn%%.models%%.MLP: option 'dropout'"):format(line)), e)
  end)

  it("errors that are not needle's own pass through unchanged", function()
    local Bad = nn.Module:extend("Bad")
    function Bad:forward(_) error({code = 7}) end
    local ok, e = pcall(nn.Sequential(Bad()), nd.zeros({1}))
    assert.is_false(ok)
    assert.are.same({code = 7}, e)
    function Bad:forward(_) error("my own message", 0) end
    ok, e = pcall(nn.Sequential(Bad()), nd.zeros({1}))
    assert.are.equal("my own message", e)
  end)
end)

describe("nd.nn.models", function()
  it("holds the ready-made models, as convert_torch.lua --list names them", function()
    assert.are.equal(nn.MLP, nn.models.MLP)
    assert.are.equal(nn.ResNet9, nn.models.ResNet9)
    assert.are.equal(nn.LanguageModel, nn.models.LanguageModel)
    local cm = require "needle.convert.models"
    assert.are.equal(cm.ResNetCIFAR, nn.models.ResNetCIFAR)
    assert.are.equal(cm.TransformerClassifier, nn.models.TransformerClassifier)
    local m = nn.models.MLP({4, 3, 2})
    assert.are.same({1, 2}, m(nd.zeros({1, 4})).shape)
    -- every nd.nn.models.<Name> the converter's descriptions mention exists
    for _, name in ipairs(cm.names()) do
      for ref in (cm.get(name).description or ""):gmatch("nd%.nn%.models%.([%w_]+)") do
        assert.is_not_nil(nn.models[ref], ref)
      end
    end
  end)
end)
