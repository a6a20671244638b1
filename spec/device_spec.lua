-- device_spec.lua - devices: nd.devices(), transfers between the cpu and
-- every OpenCL device (all dtypes, non-contiguous, empty and 0-dim tensors),
-- device names, constructors with {device=}, *_like defaults, the same-device
-- rule (errors name both devices), copy_ across devices, reading device
-- tensors (item, totable, tostring, tobytes, nd.save), x:set_data_,
-- Module:to, NEEDLE_OPENCL_DEVICE, autograd through x:to(dev), and memory
-- accounting over many device allocations.
--
--   NEEDLE_BUILD_DIR=build build/needle-lua spec/run.lua spec/device_spec.lua
--
-- Without an OpenCL device the per-device part is one visible pending line
-- with the reason; the rest (the cpu, bad names, the message without a
-- driver) runs everywhere.
local nd = require "needle"
local D = require "spec.helpers.devices"
local S = require "spec.helpers.shell"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, has = A.errmsg, A.has

local exe = S.needle_lua()

local DTYPES = {"float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16"}

-- values every dtype holds exactly (bool: 0/1)
local function sample(dtype, shape)
  shape = shape or {2, 3}
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local x = nd.arange(n):reshape(shape) -- n < 256 here
  if dtype == "bool" then return x:gt(n // 2) end
  if dtype == "uint8" then return (x * 3):to("uint8") end
  if dtype == "float32" or dtype == "float64" or dtype == "float16" or dtype == "bfloat16" then
    return ((x - n / 2) * 0.25):to(dtype)
  end
  return (x - n // 2):to(dtype)
end

-- same dtype, shape and bytes (bytes: exact, any dtype)
local function same(a, b, what)
  what = what or ""
  assert.are.equal(a.dtype, b.dtype, what .. " dtype")
  assert.are.same(a.shape, b.shape, what .. " shape")
  assert.is_true(a:contiguous():tobytes() == b:contiguous():tobytes(), what .. " bytes differ")
end

-- runs `needle-lua -e code` with env (a string of VAR=value words); returns output, ok
local function run_lua(env, code)
  local out = os.tmpname()
  local ok = os.execute(("env %s %s -e %s > %s 2>&1"):format(env, S.q(exe), S.q(code), out))
  local text = S.read_file(out) or ""
  os.remove(out)
  return text, ok == true or ok == 0
end

describe("devices (every build)", function()
  it("nd.devices() lists the cpu first, then each OpenCL device with its properties", function()
    local devs = nd.devices()
    assert.are.equal("cpu", devs[1].name)
    assert.are.equal("cpu", devs[1].type)
    assert.is_true(math.type(devs[1].threads) == "integer" and devs[1].threads >= 1)
    for i = 2, #devs do
      local d = devs[i]
      assert.are.equal(("opencl:%d"):format(i - 2), d.name)
      assert.are.equal("opencl", d.type)
      for _, k in ipairs({"device", "vendor", "platform", "version"}) do
        assert.are.equal("string", type(d[k]), k)
      end
      for _, k in ipairs({"memory", "compute_units", "max_work_group_size"}) do
        assert.is_true(math.type(d[k]) == "integer" and d[k] > 0, k)
      end
      assert.are.equal("boolean", type(d.gpu))
      assert.are.equal("boolean", type(d.fp64))
      assert.are.equal("boolean", type(d.fp16))
    end
    assert.are.equal("boolean", type(devs[1].bf16))
    assert.are.equal("string", type(devs[1].gemm))
  end)

  it("nd.opencl_available() is true, or false and a reason that says how to get a device", function()
    local ok, why = nd.opencl_available()
    assert.are.equal("boolean", type(ok))
    if ok then
      assert.is_nil(why)
      assert.is_true(#nd.devices() >= 2)
    else
      assert.are.equal("string", type(why))
      assert.is_true(why:find("install", 1, true) ~= nil or why:find("NEEDLE_OPENCL", 1, true) ~= nil, why)
      assert.are.equal(1, #nd.devices())
    end
    assert.are.equal(nd.opencl.available, nd.opencl_available)
  end)

  it("tensors are on the cpu by default; :to('cpu') and :cpu() of a cpu tensor return it", function()
    local x = nd.randn({2, 3})
    assert.are.equal("cpu", x.device)
    assert.is_true(rawequal(x, x:to("cpu")))
    assert.is_true(x:cpu():shares_storage(x))
    assert.is_true(rawequal(x, x:to({device = "cpu"})))
    assert.are.equal("cpu", nd.zeros({2}, {device = "cpu"}).device)
    local y = x:to({device = "cpu", dtype = "float64"})
    assert.are.equal("float64", y.dtype)
    assert.are.equal("cpu", y.device)
  end)

  it("names that are not devices, and OpenCL indices that do not exist, are errors naming them", function()
    local m = errmsg(function() return nd.zeros({2}, {device = "tpu"}) end)
    has(m, "'tpu' is not a device name")
    has(m, "\"opencl:N\"")
    m = errmsg(function() return nd.ones({2}):to("opencl:x") end)
    has(m, "'opencl:x'")
    m = errmsg(function() return nd.ones({2}):to("opencl:99") end)
    has(m, "opencl:99")
    m = errmsg(function() return nd.tensor({1, 2}, {device = "cuda"}) end)
    has(m, "'cuda'")
  end)

  it("Module:to('cpu') returns the module; a bad device names the module and the device", function()
    local m = nd.nn.Linear(3, 2)
    local w = m.weight
    assert.is_true(rawequal(m, m:to("cpu")))
    assert.is_true(rawequal(m, m:to({device = "cpu"})))
    assert.is_true(rawequal(w, m.weight))
    local msg = errmsg(function() return m:to("tpu") end)
    has(msg, "needle.nn.Linear.to")
    has(msg, "'tpu'")
    msg = errmsg(function() return m:to("opencl:99") end)
    has(msg, "needle.nn.Linear.to")
    has(msg, "opencl:99")
    msg = errmsg(function() return m:to(42) end)
    has(msg, "expected a device name")
    -- a failed move leaves the module where it was
    assert.are.equal("cpu", m.weight.device)
    -- {dtype=} converts floating parameters and buffers only
    local bn = nd.nn.BatchNorm1d(3)
    bn:to({dtype = "float64"})
    assert.are.equal("float64", bn.weight.dtype)
    assert.are.equal("float64", bn.running_mean.dtype)
    assert.are.equal("int64", bn.num_batches_tracked.dtype)
    msg = errmsg(function() return bn:to({dtype = "int32"}) end)
    has(msg, "floating-point dtype")
  end)

  local hide, hide_why = D.hide_opencl_env()
  if not hide then
    pending("without an OpenCL driver: " .. hide_why)
  else
    it("without an OpenCL driver, opencl is an error that says how to get one", function()
      local text = run_lua(hide,
        [[local ok, why = nd.opencl_available()
          print("available", ok)
          print("devices", #nd.devices())
          local ok2, err = pcall(nd.zeros, {2}, {device = "opencl"})
          print("zeros", ok2, err)]])
      has(text, "available\tfalse")
      has(text, "devices\t1")
      has(text, "zeros\tfalse")
      assert.is_true(text:find("install", 1, true) ~= nil or text:find("NEEDLE_OPENCL", 1, true) ~= nil, text)
    end)
  end
end)

local DEVICES = D.opencl()
if #DEVICES == 0 then
  describe("OpenCL devices", function()
    D.pending_without_opencl(pending, "device transfers, constructors, mixed-device errors, Module:to")
  end)
end

for _, dev in ipairs(DEVICES) do
  describe("device " .. D.describe(dev), function()
    it("round trips every dtype exactly (float16 and bfloat16 included)", function()
      for _, dt in ipairs(DTYPES) do
        local x = sample(dt, {3, 5})
        local y = x:to(dev)
        assert.are.equal(dev, y.device, dt)
        assert.are.equal(dt, y.dtype)
        assert.are.same({3, 5}, y.shape)
        same(x, y:cpu(), dt)
        same(x, y:to("cpu"), dt)
      end
    end)

    it("transfers non-contiguous sources both ways (transposed, stepped, expanded, narrowed)", function()
      local base = nd.arange(60):reshape({3, 4, 5}):to("float32")
      local views = {
        transposed = function(t) return t:transpose(1, 3) end,
        stepped = function(t) return t:slice(3, 1, 5, 2) end,
        expanded = function(t) return t[{":", 1, {1, 1}}]:expand({3, 6}) end,
        narrowed = function(t) return t:narrow(2, 2, 2) end,
        selected = function(t) return t:select(2, 3) end,
        permuted = function(t) return t:permute({2, 3, 1}) end,
      }
      local dbase = base:to(dev)
      for name, v in pairs(views) do
        local want = v(base):contiguous()
        same(want, v(base):to(dev):cpu(), name .. " (cpu view to the device)")
        local dv = v(dbase)
        assert.are.equal(dev, dv.device, name)
        same(want, dv:cpu(), name .. " (device view to the cpu)")
        same(want, dv:contiguous():cpu(), name .. " (contiguous on the device)")
        for _, dt in ipairs({"int64", "uint8", "float16", "bool"}) do
          same(v(base):to(dt), v(base:to(dt)):to(dev):cpu(), name .. " " .. dt)
        end
      end
    end)

    it("empty and 0-dim tensors", function()
      for _, shape in ipairs({{0}, {2, 0, 3}, {0, 4}}) do
        local x = nd.zeros(shape)
        local y = x:to(dev)
        assert.are.equal(dev, y.device)
        assert.are.same(shape, y.shape)
        assert.are.equal(0, y:numel())
        assert.are.same(shape, y:cpu().shape)
        assert.are.same(x:totable(), y:totable())
      end
      local s = nd.tensor(3.5):to(dev)
      assert.are.equal(0, s:dim())
      assert.are.equal(3.5, s:item())
      assert.are.equal(3.5, s:cpu():item())
      local i = nd.tensor(-7, {dtype = "int64"}):to(dev)
      assert.are.equal(-7, i:item())
      assert.are.equal("integer", math.type(i:item()))
      assert.are.equal(true, nd.tensor(true):to(dev):item())
    end)

    it("device names: opencl:N, 'opencl' is the default device, {device=, dtype=} does both", function()
      local x = nd.randn({2, 2})
      assert.are.equal(dev, x:to(dev).device)
      local default = x:to("opencl").device
      assert.truthy(default:match("^opencl:%d+$"), default)
      local y = x:to({device = dev, dtype = "float64"})
      assert.are.equal(dev, y.device)
      assert.are.equal("float64", y.dtype)
      -- a tensor already there comes back as itself, as PyTorch
      local z = x:to(dev)
      assert.is_true(rawequal(z, z:to(dev)))
      -- a dtype conversion on the device stays there
      local w = z:to("int32")
      assert.are.equal(dev, w.device)
      assert.are.equal("int32", w.dtype)
      assert.are.equal("cpu", z:cpu().device)
    end)

    it("constructors take {device=} and give the cpu's values there", function()
      local o = {device = dev}
      local cases = {
        zeros = function(opts) return nd.zeros({2, 3}, opts) end,
        ones = function(opts) return nd.ones({2, 3}, opts) end,
        full = function(opts) return nd.full({2, 3}, -1.5, opts) end,
        full_int = function(opts) return nd.full({4}, 7, {dtype = "int64", device = opts and opts.device}) end,
        arange = function(opts) return nd.arange(1, 10, 2, opts) end,
        arange_float = function(opts) return nd.arange(0, 1, 0.25, opts) end,
        linspace = function(opts) return nd.linspace(-1, 1, 9, opts) end,
        eye = function(opts) return nd.eye(3, 4, opts) end,
        tensor = function(opts) return nd.tensor({{1, 2}, {3, 4}}, opts) end,
        tensor_int = function(opts) return nd.tensor({5, 6}, {dtype = "int32", device = opts and opts.device}) end,
        tensor_of_tensor = function(opts) return nd.tensor(nd.arange(4), opts) end,
      }
      for name, make in pairs(cases) do
        local want, got = make(nil), make(o)
        assert.are.equal(dev, got.device, name)
        same(want, got:cpu(), name)
      end
      local e = nd.empty({3, 2}, o)
      assert.are.equal(dev, e.device)
      assert.are.same({3, 2}, e.shape)
    end)

    it("*_like constructors follow the tensor's device unless told otherwise", function()
      local x = nd.randn({2, 3}):to(dev)
      for _, name in ipairs({"zeros_like", "ones_like", "empty_like"}) do
        if nd[name] then
          local y = nd[name](x)
          assert.are.equal(dev, y.device, name)
          assert.are.same({2, 3}, y.shape)
          assert.are.equal("cpu", nd[name](x, {device = "cpu"}).device, name)
        end
      end
      local f = nd.full_like(x, 2.5)
      assert.are.equal(dev, f.device)
      assert.are.same({{2.5, 2.5, 2.5}, {2.5, 2.5, 2.5}}, f:totable())
      assert.are.same({{1, 1, 1}, {1, 1, 1}}, nd.ones_like(x):totable())
      assert.are.equal("float64", nd.zeros_like(x, {dtype = "float64"}).dtype)
      assert.are.equal(dev, nd.zeros_like(x, {dtype = "float64"}).device)
      assert.are.equal("cpu", nd.zeros_like(nd.ones({2}), {}).device)
    end)

    it("random *_like constructors follow the tensor's device", function()
      local x = nd.randn({2, 3}):to(dev)
      assert.are.equal(dev, nd.rand_like(x).device)
      assert.are.equal(dev, nd.randn_like(x).device)
    end)

    it("ops on tensors of different devices are errors naming the op and both devices", function()
      local c, g = nd.ones({2, 2}), nd.ones({2, 2}):to(dev)
      local cases = {
        add = function() return c + g end,
        add_reversed = function() return g + c end,
        mul = function() return g * c end,
        maximum = function() return g:maximum(c) end,
        eq = function() return g:eq(c) end,
        where = function() return nd.where(g:gt(0), g, c) end,
        where_cond = function() return nd.where(c:gt(0), g, g) end,
        matmul = function() return c:matmul(g) end,
        cat = function() return nd.cat({c, g}, 1) end,
        stack = function() return nd.stack({g, c}, 1) end,
        gather = function() return g:gather(1, nd.ones({2, 2}, {dtype = "int64"})) end,
        index_select = function() return g:index_select(1, nd.tensor({1}, {dtype = "int64"})) end,
        masked_fill = function() return g:masked_fill(c:gt(0), 0) end,
      }
      for name, fn in pairs(cases) do
        local m = errmsg(fn)
        assert.truthy(m:find("cpu", 1, true), name .. ": " .. m)
        assert.truthy(m:find(dev, 1, true), name .. ": " .. m)
      end
      has(errmsg(cases.add), "needle.add")
      has(errmsg(cases.matmul), "needle.matmul")
      -- in-place ops, in a child process (a missing check there has crashed the process)
      for _, expr in ipairs({"g:add_(c)", "c:add_(g)", "g:mul_(c)", "c:sub_(g)", "g:div_(c)", "c:pow_(g)",
                             "g:clamp_(0, 1):add_(c)"}) do
        local text = run_lua("", ("local c, g = nd.ones({2, 2}), nd.ones({2, 2}):to(%q)\n"):format(dev) ..
          ("print('result', pcall(function() return %s end))"):format(expr))
        assert.truthy(text:find("result\tfalse", 1, true), expr .. ": " .. text)
        assert.truthy(text:find("cpu", 1, true) and text:find(dev, 1, true), expr .. ": " .. text)
      end
    end)

    it("copy_ works across devices (casting, broadcasting, into views)", function()
      local src = nd.arange(6):reshape({2, 3}):to("float32")
      -- cpu -> device
      local d = nd.zeros({2, 3}, {device = dev})
      d:copy_(src)
      same(src, d:cpu(), "cpu -> device")
      -- device -> cpu, with a cast
      local c = nd.zeros({2, 3}, {dtype = "int64"})
      c:copy_(src:to(dev))
      same(src:to("int64"), c, "device -> cpu (cast)")
      -- broadcast source, into a transposed device view
      local t = nd.zeros({3, 2}, {device = dev})
      t:t():copy_(nd.tensor({10, 20, 30}))
      assert.are.same({{10, 10}, {20, 20}, {30, 30}}, t:totable())
      -- into a narrowed cpu view from a device tensor
      local host = nd.zeros({2, 4})
      host:narrow(2, 2, 3):copy_(src:to(dev))
      assert.are.same({{0, 0, 1, 2}, {0, 3, 4, 5}}, host:totable())
      -- device -> device view
      local dd = nd.zeros({2, 3}, {device = dev})
      dd[2]:copy_(src[1]:to(dev))
      assert.are.same({{0, 0, 0}, {0, 1, 2}}, dd:totable())
      -- x[...] = tensor / number on a device tensor
      dd[{1, {2, 3}}] = nd.tensor({7, 8})
      dd[{2, 1}] = 9
      assert.are.same({{0, 7, 8}, {9, 1, 2}}, dd:totable())
    end)

    it("item, totable, tostring and tobytes read device tensors", function()
      for _, dt in ipairs(DTYPES) do
        local x = sample(dt)
        local y = x:to(dev)
        assert.are.same(x:totable(), y:totable(), dt)
        assert.are.equal(x[{2, 3}]:item(), y[{2, 3}]:item(), dt)
        assert.is_true(x:tobytes() == y:tobytes(), dt)
        -- printing shows the values, then the device
        local s, sc = tostring(y), tostring(x)
        has(s, "device=" .. dev)
        assert.are.equal(sc:gsub("%)$", ""), (s:gsub(", device=" .. dev:gsub("%p", "%%%0") .. "%)$", "")))
      end
      -- a non-contiguous device tensor reads in logical order
      local t = nd.arange(6):reshape({2, 3}):to(dev):t()
      assert.are.same({{0, 3}, {1, 4}, {2, 5}}, t:totable())
      assert.is_true(t:tobytes() == nd.arange(6):reshape({2, 3}):t():contiguous():tobytes())
    end)

    it("nd.save writes device tensors; nd.load reads them back on the cpu", function()
      local path = os.tmpname() .. ".safetensors"
      local x = nd.randn({3, 4})
      local i = nd.arange(5)
      nd.save({x = x:to(dev), i = i:to(dev), t = x:t():to(dev)}, path)
      local back = nd.load(path)
      os.remove(path)
      same(x, back.x, "x")
      same(i, back.i, "i")
      same(x:t():contiguous(), back.t, "t")
      assert.are.equal("cpu", back.x.device)
    end)

    it("x:set_data_(y) moves x in place: every reference sees the new device and data", function()
      local x = nd.randn({2, 3})
      x.requires_grad = true
      local holder = {x}
      local y = nd.ones({4}):to(dev)
      x:set_data_(y)
      assert.are.equal(dev, holder[1].device)
      assert.are.same({4}, holder[1].shape)
      assert.are.same({1, 1, 1, 1}, holder[1]:totable())
      assert.is_true(x.requires_grad)
      -- back to the cpu with a dtype change
      x:set_data_(nd.zeros({2}, {dtype = "float64"}))
      assert.are.equal("cpu", x.device)
      assert.are.equal("float64", x.dtype)
      -- a gradient on another device than the new data is dropped
      local p = nd.ones({3})
      p.requires_grad = true
      p.grad = nd.ones({3})
      p:set_data_(p:to(dev))
      assert.is_nil(p.grad)
      -- only leaves take new data
      local r = nd.ones({2}, {requires_grad = true}) * 2
      has(errmsg(function() r:set_data_(nd.zeros({2})) end), "set_data_")
    end)

    it("Module:to moves parameters, buffers and gradients in place; optimizers keep working", function()
      local nn = nd.nn
      nd.manual_seed(3)
      local model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))
      local params = model:parameters()
      local before = {}
      for i, p in ipairs(params) do before[i] = p:clone() end
      params[1].grad = nd.ones(params[1].shape)
      local opt = nd.optim.SGD(params, {lr = 0.1, momentum = 0.9})
      assert.is_true(rawequal(model, model:to(dev)))
      for i, p in ipairs(model:parameters()) do
        assert.is_true(rawequal(p, params[i]), "parameter " .. i .. " is the same tensor")
        assert.are.equal(dev, p.device)
        same(before[i], p:cpu(), "parameter " .. i)
      end
      assert.are.equal(dev, params[1].grad.device)
      for _, b in ipairs(model:named_buffers()) do assert.are.equal(dev, b[2].device, b[1]) end
      assert.are.equal("int64", model[2].num_batches_tracked.dtype)
      -- a tensor shared by two modules moves once
      local shared = nn.Linear(2, 2)
      local tied = nn.Sequential(shared, nn.ReLU(), shared)
      tied:to({device = dev})
      assert.are.equal(dev, shared.weight.device)
      -- training steps on the device match the cpu's
      local cpu_model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))
      cpu_model:load_state_dict(model:state_dict())
      local cpu_opt = nd.optim.SGD(cpu_model:parameters(), {lr = 0.1, momentum = 0.9})
      params[1].grad = nil
      local x = nd.randn({8, 4})
      local y = nd.tensor({1, 2, 3, 1, 2, 3, 1, 2}, {dtype = "int64"})
      for _ = 1, 3 do
        for _, pair in ipairs({{model, opt, x:to(dev), y:to(dev)}, {cpu_model, cpu_opt, x, y}}) do
          local m, o, xb, yb = pair[1], pair[2], pair[3], pair[4]
          local loss = nd.F.cross_entropy(m(xb), yb)
          o:zero_grad()
          loss:backward()
          o:step()
        end
      end
      local got, want = model:state_dict(), cpu_model:state_dict()
      for k, t in pairs(want) do
        assert.are.equal(dev, got[k].device, k)
        local a, b = got[k]:cpu():to("float64"), t:to("float64")
        local err = (a - b):abs():max():item()
        assert(err < 1e-5, ("%s differs by %g"):format(k, err))
      end
      -- and back
      model:to("cpu")
      for _, p in ipairs(model:parameters()) do assert.are.equal("cpu", p.device) end
    end)

    it("modules create their temporaries on the input's device (dropout, RNN states, masks, positions)", function()
      local nn = nd.nn
      local x = nd.randn({6, 2, 4}):to(dev)
      local checks = {
        dropout = function() return nd.F.dropout(x, 0.5, true) end,
        lstm = function() return (nn.LSTM(4, 3):to(dev)(x)) end,
        gru = function() return (nn.GRU(4, 3):to(dev)(x)) end,
        rnn_cell = function() return nn.RNNCell(4, 3):to(dev)(x[1]) end,
        lstm_cell = function() return (nn.LSTMCell(4, 3):to(dev)(x[1])) end,
        mha_causal = function()
          local mha = nn.MultiheadAttention(4, 2):to(dev)
          return (mha(x, x, x, {is_causal = true}))
        end,
        mha_bool_mask = function()
          local mha = nn.MultiheadAttention(4, 2):to(dev)
          local kpm = nd.tensor({{false, false, true, false, false, true}, {false, true, false, false, false, false}})
          return (mha(x, x, x, {key_padding_mask = kpm:to(dev)}))
        end,
        transformer = function()
          return (nn.Transformer(4, 8, 1, {num_head = 2, dim_head = 2, causal = true, sequence_len = 8}):to(dev)(x))
        end,
        embedding_table = function() return nn.Embedding(5, 3):to(dev)({1, 2, 5}) end,
        cross_entropy_table = function()
          return nn.CrossEntropyLoss():to(dev)(nd.randn({3, 4}):to(dev), {1, 4, 2})
        end,
        nll_table = function() return nd.F.nll_loss(nd.randn({3, 4}):to(dev), {1, 4, 2}, {ignore_index = 4}) end,
        mask = function()
          return nn.Transformer.generate_square_subsequent_mask(4, {device = dev})
        end,
      }
      local failures = {}
      for name, fn in pairs(checks) do
        local ok, y = pcall(fn)
        if not ok then failures[#failures + 1] = name .. ": " .. tostring(y)
        elseif y.device ~= dev then failures[#failures + 1] = name .. ": result on " .. y.device end
      end
      table.sort(failures)
      assert(#failures == 0, table.concat(failures, "\n"))
    end)

    it("autograd flows through :to(dev) back to the cpu leaf, and through :cpu() to a device leaf", function()
      local a = nd.tensor({1, -2, 3}, {requires_grad = true})
      local b = a:to(dev)
      local y = b * b * 3
      y:backward(nd.ones({3}):to(dev))
      assert.are.equal("cpu", a.grad.device)
      assert.are.same({6, -12, 18}, a.grad:totable())
      -- a leaf on the device, a loss computed on the cpu
      local w = nd.tensor({2, 5}):to(dev)
      w.requires_grad = true
      local z = w:cpu() * nd.tensor({3, 4})
      z:backward(nd.ones({2}))
      assert.are.equal(dev, w.grad.device)
      assert.are.same({3, 4}, w.grad:totable())
      -- a dtype change on the way
      local c = nd.tensor({1.5, 2.5}, {requires_grad = true})
      local cd = c:to({device = dev, dtype = "float64"})
      assert.are.equal("float64", cd.dtype)
      cd:backward(nd.tensor({1, 2}, {dtype = "float64"}):to(dev))
      assert.are.equal("float32", c.grad.dtype)
      assert.are.same({1, 2}, c.grad:totable())
    end)

    it("autograd through a scalar loss on the device", function()
      local a = nd.tensor({{1, 2}, {3, 4}}, {requires_grad = true})
      local loss = (a:to(dev) ^ 2):sum()
      loss:backward()
      assert.are.same({{2, 4}, {6, 8}}, a.grad:totable())
    end)

    it("a DataLoader over device tensors yields batches there, in the cpu's order", function()
      local x, y = nd.randn({10, 3}), nd.arange(10)
      local function batches(a, b)
        local dl = nd.data.DataLoader(nd.data.TensorDataset(a, b), {batch_size = 4, shuffle = true, seed = 5})
        local out = {}
        for xb, yb in dl:iter() do out[#out + 1] = {xb, yb} end
        return out
      end
      local want, got = batches(x, y), batches(x:to(dev), y:to(dev))
      assert.are.equal(#want, #got)
      for i = 1, #want do
        assert.are.equal(dev, got[i][1].device)
        assert.are.equal(dev, got[i][2].device)
        same(want[i][1], got[i][1]:cpu(), "x batch " .. i)
        same(want[i][2], got[i][2]:cpu(), "y batch " .. i)
      end
    end)

    it("nd.synchronize waits for all devices, one device or a tensor's device", function()
      local x = nd.ones({1000}, {device = dev}) * 2
      nd.synchronize()
      nd.synchronize(dev)
      nd.synchronize(x)
      nd.synchronize("opencl")
      assert.are.equal(2, x[1000]:item())
      has(errmsg(function() nd.synchronize("tpu") end), "tpu")
    end)

    it("many device allocations keep live bytes flat (the collector is told about device memory)", function()
      local src = nd.ones({256, 256})
      for _ = 1, 20 do local y = src:to(dev) + 1 end
      collectgarbage()
      local live0 = nd.live_bytes()
      local peak = live0
      for i = 1, 2000 do
        local a = nd.zeros({256, 256}, {device = dev}) -- 256 KiB each
        local b = a + i
        if i % 100 == 0 then
          local c = b:cpu()
          assert.are.equal(i, c[{1, 1}]:item())
        end
        local live = nd.live_bytes()
        if live > peak then peak = live end
      end
      collectgarbage()
      local live1 = nd.live_bytes()
      -- 2000 x 512 KiB = 1000 MiB went through; far less may be alive at once
      assert(peak - live0 < 256 * 1024 * 1024, ("live bytes peaked %d above the start"):format(peak - live0))
      assert(math.abs(live1 - live0) < 64 * 1024, ("live_bytes %d after the loop, %d before"):format(live1, live0))
    end)
  end)
end

describe("NEEDLE_OPENCL_DEVICE", function()
  if D.pending_without_opencl(pending, "NEEDLE_OPENCL_DEVICE") then return end

  it("a bad value is an error naming the variable; opencl:N still works; a good value picks the device", function()
    local probe = [[local ok, e = pcall(function() return nd.zeros({1}, {device = "opencl"}).device end)
      print("default", ok, e)
      print("explicit", pcall(function() return nd.zeros({1}, {device = "opencl:0"}).device end))]]
    local text = run_lua("NEEDLE_OPENCL_DEVICE=no-such-device-xyz", probe)
    has(text, "default\tfalse")
    has(text, "NEEDLE_OPENCL_DEVICE=no-such-device-xyz")
    has(text, "explicit\ttrue\topencl:0")
    text = run_lua("NEEDLE_OPENCL_DEVICE=99", probe)
    has(text, "default\tfalse")
    has(text, "NEEDLE_OPENCL_DEVICE=99")
    local n = #D.opencl()
    text = run_lua("NEEDLE_OPENCL_DEVICE=" .. (n - 1), probe)
    has(text, ("default\ttrue\topencl:%d"):format(n - 1))
    -- part of a device name selects it too
    local name = D.info(D.opencl()[1]).device
    local word = name:match("[%w%-]+")
    text = run_lua("NEEDLE_OPENCL_DEVICE=" .. S.q(word), probe)
    has(text, "default\ttrue\topencl:")
    -- the training scripts pass the error on
    text = run_lua("NEEDLE_OPENCL_DEVICE=no-such-device-xyz",
      [[local cli = require "needle.cli"; cli.check_device("probe", {device = "opencl"})]])
    has(text, "probe: device 'opencl' is not available")
    has(text, "NEEDLE_OPENCL_DEVICE=no-such-device-xyz")
  end)
end)
