-- half_operands_spec.lua - float16 and bfloat16 parameters (a model kept in
-- half precision with m:half() / m:bfloat16()): linear, conv2d,
-- conv_transpose2d, batch_norm, layer_norm, group_norm, instance_norm and
-- rms_norm compute them in float32, as elementwise ops and matmul always
-- did (issue 22, item 4: storage-only half precision).
--
--   build/needle-lua spec/run.lua spec/half_operands_spec.lua
--
-- The reference is independent of the new path: the same layer in float32
-- holding the half weights converted back (x:bfloat16():float() is exact),
-- whose result must be the half layer's bit for bit; gradients too.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains
local nn = nd.nn

-- m with random affine parameters (and running statistics, when it has them):
-- the defaults (ones, zeros) would hide a parameter read wrong
local function randomized(m, C)
  nd.no_grad(function()
    if m.running_mean then m.running_mean:copy_(nd.randn(C)); m.running_var:copy_(nd.rand(C) + 0.5) end
    if m.weight then m.weight:copy_(nd.randn(C)) end
    if m.bias then m.bias:copy_(nd.randn(C)) end
  end)
  return m
end

-- {name, make(), input(), call(m, x)}
local LAYERS = {
  {"Linear", function() return nn.Linear(8, 5) end, function() return nd.randn(3, 8) end},
  {"Linear without bias, 3-D input", function() return nn.Linear(8, 5, {bias = false}) end,
   function() return nd.randn(2, 3, 8) end},
  {"Conv2d", function() return nn.Conv2d(3, 4, 3, {padding = 1}) end, function() return nd.randn(2, 3, 6, 6) end},
  {"Conv2d, groups", function() return nn.Conv2d(4, 4, 3, {groups = 2}) end, function() return nd.randn(1, 4, 5, 5) end},
  {"ConvTranspose2d", function() return nn.ConvTranspose2d(3, 2, 3, {stride = 2}) end,
   function() return nd.randn(1, 3, 4, 4) end},
  {"BatchNorm2d (eval)", function() return randomized(nn.BatchNorm2d(3), 3):eval() end,
   function() return nd.randn(2, 3, 4, 4) end},
  {"LayerNorm", function() return randomized(nn.LayerNorm(8), 8) end, function() return nd.randn(3, 8) end},
  {"GroupNorm", function() return randomized(nn.GroupNorm(2, 4), 4) end, function() return nd.randn(2, 4, 3, 3) end},
  {"MultiheadAttention", function() return nn.MultiheadAttention(8, 2, {batch_first = true}) end,
   function() return nd.randn(2, 5, 8) end, function(m, x) return (m(x, x, x)) end},
  {"LSTM", function() return nn.LSTM(4, 6) end, function() return nd.randn(3, 2, 4) end,
   function(m, x) return (m(x)) end},
  {"InstanceNorm2d (affine, running statistics, eval)", function()
    return randomized(nn.InstanceNorm2d(3, {affine = true, track_running_stats = true}), 3):eval()
  end, function() return nd.randn(2, 3, 4, 4) end},
  {"RMSNorm", function() return randomized(nn.RMSNorm(8), 8) end, function() return nd.randn(3, 8) end},
  {"Conv1d", function() return nn.Conv1d(3, 4, 3, {padding = 1}) end, function() return nd.randn(2, 3, 9) end},
  {"ConvTranspose1d", function() return nn.ConvTranspose1d(3, 2, 3) end, function() return nd.randn(2, 3, 5) end},
  {"fused conv + batch norm + relu (nn.fuse)", function()
    local m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()):eval()
    nd.no_grad(function() m[2].running_var:copy_(nd.rand(4) + 0.5) end)
    return nn.fuse(m)
  end, function() return nd.randn(2, 3, 6, 6) end},
  {"TransformerEncoderLayer", function()
    return nn.TransformerEncoderLayer(8, 2, {dim_feedforward = 16, dropout = 0, batch_first = true}):eval()
  end, function() return nd.randn(2, 4, 8) end},
}

local function call(l, m, x) return l[4] and l[4](m, x) or m(x) end

-- the layer in dtype, and the float32 layer holding its values
local function pair(l, dtype, device)
  nd.manual_seed(3)
  local half = l[2]():to(dtype):to(device)
  local ref = l[2]():to(device)
  ref:load_state_dict(half:state_dict()) -- each value converted back to float32, exactly
  return half, ref
end

describe("half-precision parameters", function()
  for _, dtype in ipairs({"bfloat16", "float16"}) do
    for _, l in ipairs(LAYERS) do
      it(("%s in %s computes as float32 with the rounded values, bit for bit"):format(l[1], dtype), function()
        local half, ref = pair(l, dtype, "cpu")
        for _, p in ipairs(half:parameters()) do assert.are.equal(dtype, p.dtype) end
        nd.manual_seed(4)
        local x = l[3]()
        local y, want = call(l, half, x), call(l, ref, x)
        assert.are.equal("float32", y.dtype)
        assert(nd.equal(y, want), l[1])
      end)
    end

    it(("gives %s parameters gradients of their own dtype, the float32 ones rounded"):format(dtype), function()
      local half, ref = pair(LAYERS[1], dtype, "cpu")
      for _, p in ipairs(half:parameters()) do p:requires_grad_() end
      nd.manual_seed(5)
      local x = nd.randn(3, 8)
      local xh, xr = x:clone():requires_grad_(), x:clone():requires_grad_()
      local yh, yr = call(LAYERS[1], half, xh), call(LAYERS[1], ref, xr)
      local lh, lr = (yh * yh):sum(), (yr * yr):sum()
      lh:backward()
      lr:backward()
      assert(nd.equal(xh.grad, xr.grad), "the input's gradient")
      local hp, rp = half:parameters(), ref:parameters()
      for i = 1, #hp do
        assert.are.equal(dtype, hp[i].grad.dtype)
        assert(nd.equal(hp[i].grad, rp[i].grad:to(dtype)), "parameter " .. i)
      end
    end)
  end

  it("without gradients, linear reads a half weight as it is, with the float32 kernel's bits", function()
    -- every shape class of the kernel: rows past a multiple of 4, outputs past
    -- a multiple of 4, depths past a multiple of 16, one row
    local shapes = {{1, 16, 4}, {3, 37, 5}, {5, 100, 37}, {8, 512, 512}, {17, 33, 9}, {64, 768, 130}}
    for _, dtype in ipairs({"bfloat16", "float16"}) do
      for _, sh in ipairs(shapes) do
        local M, K, O = sh[1], sh[2], sh[3]
        nd.manual_seed(M * 1000 + K + O)
        local w = nd.randn(O, K):to(dtype)
        local b = nd.randn(O):to(dtype)
        local x = nd.randn(M, K)
        local what = ("%s %dx%d by %dx%d"):format(dtype, M, K, O, K)
        nd.no_grad(function()
          assert(nd.equal(nd.F.linear(x, w, b), nd.F.linear(x, w:float(), b:float())), what)
          assert(nd.equal(nd.F.linear(x, w), nd.F.linear(x, w:float())), what .. ", no bias")
          local fused = nd.F.fused_linear(x, w, b, {activation = "relu"})
          assert(nd.equal(fused, nd.F.linear(x, w:float(), b:float()):relu()), what .. ", relu")
        end)
      end
    end
  end)

  it("without gradients, reads the half weight without a float32 copy where the CPU has AVX-512", function()
    local gemm = nd.devices()[1].gemm or ""
    if not gemm:find("^avx512") then
      pending("the half-weight kernel is AVX-512's (this CPU's GEMM: " .. gemm .. ")")
      return
    end
    local w = nd.randn(256, 512):bfloat16()
    local x = nd.randn(2, 512)
    local report = nd.no_grad(function()
      return nd.profile(function() return nd.F.linear(x, w) end)
    end)
    local alloc
    for _, row in ipairs(report.rows) do
      if row.name == "linear" then alloc = row.bytes end
    end
    assert(alloc, "the profile has a linear row")
    assert(alloc < 256 * 512 * 4, ("linear allocated %d bytes: a float32 copy of the weight"):format(alloc))
  end)

  it("inside nd.autocast, a bfloat16 weight goes into the weight cache as it is, the float32 copy's bits", function()
    if not nd.devices()[1].bf16 then
      pending("products run on bfloat16 only on a CPU with AVX512_BF16")
      return
    end
    for _, sh in ipairs({{1, 64, 96}, {3, 100, 70}, {96, 256, 130}, {200, 33, 64}}) do
      local M, K, O = sh[1], sh[2], sh[3]
      nd.manual_seed(M + K + O)
      local w, b, x = nd.randn(O, K):bfloat16(), nd.randn(O), nd.randn(M, K)
      local got, want = nd.no_grad(function()
        return nd.autocast(function()
          return nd.F.linear(x, w, b), nd.F.linear(x, w:float(), b)
        end)
      end)
      assert(nd.equal(got, want), ("%dx%d by %dx%d"):format(M, K, O, K))
      -- and a product on bfloat16 inputs it is: it differs from float32's
      if M >= 64 then assert.is_false(nd.equal(got, nd.F.linear(x, w:float(), b))) end
    end
  end)

  it("where the float32 copy runs on bfloat16 products, a half weight does too: float16, views, medium", function()
    if not nd.devices()[1].bf16 then
      pending("products run on bfloat16 only on a CPU with AVX512_BF16")
      return
    end
    nd.manual_seed(31)
    local x = nd.randn(100, 96)
    local big = nd.randn(200, 96):bfloat16()
    local cases = {
      {"float16", nd.randn(80, 96):half()},
      {"a bfloat16 view", big:narrow(1, 11, 80)},
      {"bfloat16", nd.randn(80, 96):bfloat16()},
    }
    nd.no_grad(function()
      for _, c in ipairs(cases) do
        local w = c[2]
        local got = nd.autocast(function() return nd.F.linear(x, w) end)
        local want = nd.autocast(function() return nd.F.linear(x, w:float()) end)
        assert(nd.equal(got, want), c[1] .. " inside nd.autocast")
        nd.set_float32_matmul_precision("medium")
        local ok, err = pcall(function()
          assert(nd.equal(nd.F.linear(x, w), nd.F.linear(x, w:float())), c[1] .. " at medium")
        end)
        nd.set_float32_matmul_precision("highest")
        assert(ok, err)
      end
      -- a compiled function whose half weight is an intermediate (an arena view at replay)
      local p = nd.randn(80, 96)
      local f = nd.compile(function(xx) return nd.F.linear(xx, (p * 2):to("bfloat16")) end)
      for call = 1, 4 do
        local got = nd.autocast(function() return f(x) end)
        local want = nd.autocast(function() return nd.F.linear(x, (p * 2):to("bfloat16"):float()) end)
        assert(nd.equal(got, want), "compiled call " .. call)
      end
    end)
  end)

  it("compiles a half Linear + BatchNorm1d (not folded: the kernel reads the half weight) as eagerly", function()
    nd.manual_seed(32)
    local m = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8)):eval()
    nd.no_grad(function() m[2].running_var:copy_(nd.rand(8) + 0.5); m[2].running_mean:copy_(nd.randn(8)) end)
    m:to("bfloat16")
    local f = nd.compile(function(x) return nd.no_grad(function() return m(x) end) end)
    for call = 1, 4 do
      local x = nd.randn(5, 16)
      assert(nd.equal(f(x), nd.no_grad(function() return m(x) end)), "call " .. call)
    end
  end)

  it("a float64 input makes the half parameters float64", function()
    local half, ref = pair(LAYERS[1], "bfloat16", "cpu")
    ref:double()
    local x = nd.randn(3, 8):double()
    local y = half(x)
    assert.are.equal("float64", y.dtype)
    assert(nd.equal(y, ref(x)))
  end)

  it("a half input computes in float32 too", function()
    local half, ref = pair(LAYERS[3], "bfloat16", "cpu")
    local x = nd.randn(2, 3, 6, 6):bfloat16()
    assert(nd.equal(half(x), ref(x:float())))
  end)

  it("refuses to update half running statistics in training mode, and says what to do", function()
    local bn = nn.BatchNorm2d(3):bfloat16()
    local msg = errmsg(function() bn(nd.randn(2, 3, 4, 4)) end)
    assert_contains(msg, "needle.batch_norm: running statistics in bfloat16 cannot be updated in training mode " ..
                         "(half precision is storage for inference); use eval() or keep them in float32")
    assert.are.same({0, 0, 0}, bn.running_mean:float():totable(), "left as they were")
    -- one of the two is enough
    local x = nd.randn(2, 3, 4, 4)
    assert_contains(errmsg(function()
      nd.F.batch_norm(x, nd.zeros(3), nd.ones(3):half(), nil, nil, true)
    end), "running statistics in float16 cannot be updated in training mode")
    local inorm = nn.InstanceNorm2d(3, {track_running_stats = true}):bfloat16()
    assert_contains(errmsg(function() inorm(x) end),
                    "needle.instance_norm: running statistics in bfloat16 cannot be updated with the input's " ..
                    "statistics (half precision is storage for inference); use eval() or keep them in float32")
  end)

  it("sums a half parameter's gradients to its own dtype (a layer used twice, two backward calls)", function()
    local lin = nn.Linear(4, 4):bfloat16()
    local x = nd.randn(2, 4)
    lin(lin(x)):sum():backward()
    assert.are.equal("bfloat16", lin.weight.grad.dtype)
    lin(x):sum():backward()
    assert.are.equal("bfloat16", lin.weight.grad.dtype)
    local lstm = nn.LSTM(3, 4):bfloat16()
    local out = lstm(nd.randn(5, 2, 3))
    out:sum():backward()
    for _, p in ipairs(lstm:parameters()) do assert.are.equal("bfloat16", p.grad.dtype) end
  end)

  it("names the dtypes the caller passed in shape errors", function()
    local x = nd.randn(2, 8)
    assert_contains(errmsg(function() nd.F.layer_norm(x, {8}, nd.ones(7):bfloat16()) end),
                    "layer_norm: weight of shape {7} (bfloat16) does not match the normalized shape {8}")
    assert_contains(errmsg(function()
      nd.F.batch_norm(nd.randn(2, 3, 4), nd.zeros(5):bfloat16(), nd.ones(3), nil, nil, false)
    end), "batch_norm: running_mean must have shape {3} (one value per channel), got bfloat16 {5}")
  end)

  it("still refuses other dtype mixes, naming them", function()
    local lin = nn.Linear(4, 2):double()
    assert_contains(errmsg(function() lin(nd.randn(1, 4)) end),
                    "needle.linear: input (float32) and weight (float64) must have the same dtype")
    local ln = nn.LayerNorm(4):double()
    assert_contains(errmsg(function() ln(nd.randn(2, 4)) end),
                    "needle.layer_norm: weight (float64) and input (float32) must have the same dtype")
    assert_contains(errmsg(function() nd.F.linear(nd.tensor({{1, 2}}, {dtype = "int64"}),
                                                  nd.ones(3, 2):bfloat16()) end),
                    "needle.linear: expected a float32 or float64 input, got int64")
    -- a half operand does not let a float32 / float64 mix through
    assert_contains(errmsg(function() nd.F.linear(nd.randn(1, 4), nd.randn(2, 4):double(), nd.ones(2):bfloat16()) end),
                    "needle.linear: input (float32) and weight (float64) must have the same dtype")
    -- and the operand named is the one the caller got wrong
    assert_contains(errmsg(function() nd.F.linear(nd.randn(1, 4), nd.randn(2, 4):bfloat16(), nd.ones(2):double()) end),
                    "needle.linear: input (float32) and bias (float64) must have the same dtype")
  end)

  it("runs a half model under nd.compile as eagerly", function()
    local half = pair(LAYERS[#LAYERS], "bfloat16", "cpu")
    local f = nd.compile(function(x) return half(x) end)
    for s = 1, 4 do
      nd.manual_seed(10 + s)
      local x = nd.randn(2, 4, 8)
      assert(nd.equal(f(x), half(x)), "call " .. s)
    end
    assert(f.stats.replays > 0)
  end)

  it("keeps a BERT in bfloat16 at half the bytes, its outputs those of the float32 model with the rounded weights",
     function()
    local M = nd.nn.models
    nd.manual_seed(6)
    local cfg = {vocab_size = 50, hidden_size = 16, num_hidden_layers = 2, num_attention_heads = 2,
                 intermediate_size = 32, max_position_embeddings = 16}
    local half = M.BertModel(cfg):eval()
    local bytes32 = 0
    for _, p in ipairs(half:parameters()) do bytes32 = bytes32 + p:numel() * 4 end
    half:bfloat16()
    local bytes16 = 0
    for _, p in ipairs(half:parameters()) do bytes16 = bytes16 + p:numel() * 2 end
    assert.are.equal(bytes32 / 2, bytes16)
    local ref = M.BertModel(cfg):eval()
    ref:load_state_dict(half:state_dict())
    local ids = nd.tensor({{1, 5, 9, 2}, {3, 4, 7, 8}}, {dtype = "int64"})
    local yh, yr = half(ids), ref(ids)
    yh = type(yh) == "table" and not nd.is_tensor(yh) and (yh.last_hidden_state or yh[1]) or yh
    yr = type(yr) == "table" and not nd.is_tensor(yr) and (yr.last_hidden_state or yr[1]) or yr
    assert(nd.equal(yh, yr))
  end)

  it("generates with GPT-2 in bfloat16 (its cache in float32), as the float32 model with the rounded weights",
     function()
    local M = nd.nn.models
    local cfg = {vocab_size = 64, n_positions = 32, n_embd = 32, n_layer = 2, n_head = 2}
    nd.manual_seed(8)
    local half = M.GPT2LMHeadModel(cfg):eval():bfloat16()
    local ref = M.GPT2LMHeadModel(cfg):eval()
    ref:load_state_dict(half:state_dict())
    local prompt = nd.tensor({{5, 9, 2, 11}}, {dtype = "int64"})
    nd.no_grad(function()
      assert(nd.equal(half(prompt), ref(prompt)), "logits")
      assert.are.equal("float32", half:new_cache(1, 8).dtype)
    end)
    local a = half:generate(prompt, {max_new_tokens = 6})
    local b = ref:generate(prompt, {max_new_tokens = 6})
    assert.are.same(b:totable(), a:totable())
  end)

  describe("on OpenCL", function()
    if D.pending_without_opencl(pending, "half-precision parameters on OpenCL") then return end
    for _, dev in ipairs(D.opencl()) do
      for _, i in ipairs({1, 3, 6, 7}) do
        local l = LAYERS[i]
        it(("%s in float16 on %s computes as float32 with the rounded values"):format(l[1], dev), function()
          local half, ref = pair(l, "float16", dev)
          nd.manual_seed(4)
          local x = l[3]():to(dev)
          assert(nd.equal(call(l, half, x):to("cpu"), call(l, ref, x):to("cpu")), l[1])
        end)
      end
    end
  end)
end)
-- matmul on OpenCL reads float16 / bfloat16 operands of a float32 product as
-- they are stored (gemm.cl's A_HALF / B_HALF: widened on load), with no
-- conversion pass: the result must be the float32 product of the operands'
-- float32 copies bit for bit (the same kernel on the same values), and
-- match float64 products of those values; the profile's allocations show
-- that nothing was converted.
describe("matmul of half operands on OpenCL", function()
  if D.pending_without_opencl(pending, "half operands of OpenCL products") then return end
  local SHAPES = {{1, 7, 5}, {33, 65, 17}, {128, 96, 200}, {3, 300, 40}, {70, 2, 129}}
  -- operand of shape (r, c) in layout "n" (row-major) or "t" (a transposed view)
  local function operand(r, c, layout, dt)
    local t = layout == "n" and nd.randn({r, c}) or nd.randn({c, r}):t()
    return t:to(dt)
  end
  local function ref64(a, b) return a:to("cpu"):double():matmul(b:to("cpu"):double()) end

  for _, dev in ipairs(D.opencl()) do
    for _, dt in ipairs({"float16", "bfloat16"}) do
      it(("multiplies %s operands on %s in every layout, as their float32 copies bit for bit"):format(dt, dev), function()
        nd.manual_seed(11)
        for _, sh in ipairs(SHAPES) do
          local M, N, K = sh[1], sh[2], sh[3]
          for _, lay in ipairs({"nn", "nt", "tn", "tt"}) do
            local a = operand(M, K, lay:sub(1, 1), dt):to(dev)
            local b = operand(K, N, lay:sub(2, 2), dt):to(dev)
            for _, mix in ipairs({"hh", "fh", "hf"}) do
              local aa = mix:sub(1, 1) == "f" and a:float() or a
              local bb = mix:sub(2, 2) == "f" and b:float() or b
              local r = nd.matmul(aa, bb)
              local what = ("%dx%dx%d %s %s"):format(M, N, K, lay, mix)
              assert.are.equal("float32", r.dtype, what)
              assert(nd.equal(r, nd.matmul(a:float(), b:float())), what .. ": differs from the float32 copies' product")
              local err = (r:to("cpu"):double() - ref64(a, b)):abs():max():item()
              assert(err < 1e-4, what .. ": off the float64 product by " .. err)
            end
          end
        end
      end)

      it(("broadcasts batched %s operands on %s"):format(dt, dev), function()
        nd.manual_seed(12)
        local a = nd.randn({2, 3, 20, 30}):to(dt):to(dev)
        local b = nd.randn({3, 30, 10}):to(dt):to(dev)
        local r = nd.matmul(a, b)
        assert.are.same({2, 3, 20, 10}, r.shape)
        assert(nd.equal(r, nd.matmul(a:float(), b:float())))
        assert((r:to("cpu"):double() - ref64(a, b)):abs():max():item() < 1e-4)
      end)

      it(("reads %s operands on %s without converting them first"):format(dt, dev), function()
        local M, N, K = 64, 48, 256
        local a = nd.randn({M, K}):to(dt):to(dev)
        local b = nd.randn({K, N}):to(dt):to(dev)
        local report = nd.profile(function() for _ = 1, 3 do nd.matmul(a, b) end end)
        -- the three results' storage only: a float32 copy of an operand
        -- would add (M*K or K*N) * 4 bytes a call
        assert.are.equal(3 * M * N * 4, report.by_name.matmul.bytes)
      end)

      it(("runs a linear layer with a %s weight on %s unconverted, gradients in the weight's dtype"):format(dt, dev), function()
        nd.manual_seed(13)
        local M, K, O = 4, 256, 128
        local x = nd.randn({M, K}):to(dev)
        local w = nd.randn({O, K}):to(dt):to(dev):requires_grad_()
        local b = nd.randn({O}):to(dt):to(dev):requires_grad_()
        local wf = w:detach():float():requires_grad_()
        local bf = b:detach():float():requires_grad_()
        local y = nd.F.linear(x, w, b)
        local yf = nd.F.linear(x, wf, bf)
        assert.are.equal("float32", y.dtype)
        assert(nd.equal(y, yf), "forward")
        local g = nd.randn({M, O}):to(dev)
        y:backward(g)
        yf:backward(g)
        assert.are.equal(dt, w.grad.dtype)
        assert.are.equal(dt, b.grad.dtype)
        assert(nd.equal(w.grad, wf.grad:to(dt)), "weight gradient")
        assert(nd.equal(b.grad, bf.grad:to(dt)), "bias gradient")
        local report = nd.profile(function()
          nd.no_grad(function() nd.F.linear(x, w, b) end)
        end)
        -- a float32 copy of the weight would be O * K * 4 bytes
        assert(report.by_name.linear.bytes < O * K * 4, "the weight was converted: " .. report.by_name.linear.bytes .. " bytes")
      end)

      it(("convolves with a %s weight and bias on %s unconverted, gradients in their dtype"):format(dt, dev), function()
        nd.manual_seed(15)
        -- {C, O, k, stride, padding, groups}: 3x3, strided grouped, 1x1, depthwise (its
        -- own kernel, which converts the weight)
        for _, cfg in ipairs({{4, 8, 3, 1, 1, 1}, {6, 6, 3, 2, 1, 3}, {3, 5, 1, 1, 0, 1}, {4, 4, 3, 1, 1, 4}}) do
          local C, O, k, stride, pad, groups = table.unpack(cfg)
          local what = table.concat(cfg, ",")
          local o = {stride = stride, padding = pad, groups = groups}
          local x = nd.randn({2, C, 9, 9}):to(dev)
          local w = nd.randn({O, C // groups, k, k}):to(dt):to(dev):requires_grad_()
          local b = nd.randn({O}):to(dt):to(dev):requires_grad_()
          local wf, bf = w:detach():float():requires_grad_(), b:detach():float():requires_grad_()
          local y, yf = nd.F.conv2d(x, w, b, o), nd.F.conv2d(x, wf, bf, o)
          assert.are.equal("float32", y.dtype)
          assert(nd.equal(y, yf), what .. ": forward")
          local g = nd.randn(y.shape):to(dev)
          y:backward(g)
          yf:backward(g)
          assert.are.equal(dt, w.grad.dtype)
          assert(nd.equal(w.grad, wf.grad:to(dt)), what .. ": weight gradient")
          assert(nd.equal(b.grad, bf.grad:to(dt)), what .. ": bias gradient")
          local wt = nd.randn({C, O // groups, k, k}):to(dt):to(dev)
          assert(nd.equal(nd.F.conv_transpose2d(x, wt, b, o), nd.F.conv_transpose2d(x, wt:float(), b:float(), o)),
                 what .. ": conv_transpose2d")
        end
        -- allocations: the same as with a float32 weight (a float32 copy would add its 295 KB)
        local x = nd.randn({2, 64, 16, 16}):to(dev)
        local w = nd.randn({128, 64, 3, 3}):to(dev)
        local function bytes(weight)
          return nd.profile(function()
            nd.no_grad(function() nd.F.conv2d(x, weight, nil, {padding = 1}) end)
          end).by_name["F.conv2d"].bytes
        end
        assert.are.equal(bytes(w), bytes(w:to(dt)))
      end)

      it(("rounds a product's operands once inside nd.autocast to %s on %s"):format(dt, dev), function()
        nd.manual_seed(14)
        local M, N, K = 64, 48, 256
        local a = nd.randn({M, K}):to(dev)
        local b = nd.randn({K, N}):to(dev)
        local other = dt == "float16" and "bfloat16" or "float16"
        local bo = b:to(other) -- a half operand of the other type is rounded to the scope's
        local r, ro
        local report = nd.profile(function()
          r, ro = nd.autocast(function() return nd.matmul(a, b), nd.matmul(a, bo) end,
                              {device_type = "opencl", dtype = dt})
        end)
        local e = ref64(a:to(dt), b:to(dt))
        assert((r:to("cpu"):double() - e):abs():max():item() < 1e-4)
        local eo = ref64(a:to(dt), bo:float():to(dt))
        assert((ro:to("cpu"):double() - eo):abs():max():item() < 1e-4)
        -- per product: the result and one half copy of each operand (2 bytes an element)
        assert.are.equal(2 * (M * N * 4 + (M * K + K * N) * 2), report.by_name.matmul.bytes)
      end)
    end
  end
end)
