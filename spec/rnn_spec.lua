-- rnn_spec.lua - RNN/LSTM/GRU and their cells against PyTorch: the fixture's
-- state_dict loads by name (so names and layouts are PyTorch's), and the
-- outputs, final states and gradients match at 1e-5 relative. The
-- bidirectional cases come from spec/fixtures/torch_sequence.lua
-- (gen_torch_sequence.py), in the same format.
local nd = require "needle"
local nn = nd.nn
local D = require "spec.helpers.devices"
local G = require "spec.helpers.gradcheck"
local fixtures = dofile("spec/fixtures/torch_rnn.lua")
local bidirectional = dofile("spec/fixtures/torch_sequence.lua").rnn

local function T(f) return nd.tensor(f.data):reshape(f.shape) end

local function close(what, got, want, tol)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g = got:contiguous():view({-1}):totable()
  for i, w in ipairs(want.data) do
    -- not (<=): a NaN in needle's result (or in the fixture) fails
    if not (g[i] == w or math.abs(g[i] - w) <= (tol or 1e-5) * math.abs(w) + 1e-5) then
      error(("%s: element %d is %.8g, PyTorch %.8g"):format(what, i, g[i], w), 2)
    end
  end
end

-- a fixture case on dev (the module moved there; inputs moved in and results
-- back, both differentiable), compared at rtol tol
local function run_case(c, dev, tol)
  local m = nn[c.kind](c.args[1], c.args[2], c.opts)
  if c.param_order then -- PyTorch's named_parameters() order
    local names = {}
    for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
    assert.are.same(c.param_order, names)
  end
  local sd = {}
  for k, v in pairs(c.state_dict) do sd[k] = T(v) end
  m:load_state_dict(sd) -- strict: the names and shapes must be PyTorch's
  m:to(dev)
  local x = T(c.x)
  x.requires_grad = true
  local state
  if c.state ~= nil then
    state = c.state_is_pair and {T(c.state[1]):to(dev), T(c.state[2]):to(dev)} or T(c.state):to(dev)
  end
  local outs
  if c.kind:match("Cell$") then
    outs = {m(x:to(dev), state)}
  else
    local y, st = m(x:to(dev), state)
    outs = {y}
    if type(st) == "table" and not nd.is_tensor(st) then outs[2], outs[3] = st[1], st[2]
    else outs[2] = st end
  end
  assert.are.equal(#c.outs, #outs)
  local loss
  for i, o in ipairs(outs) do
    o = o:to("cpu")
    close(c.name .. " output " .. i, o, c.outs[i], tol)
    local term = (o * T(c.ws[i])):sum()
    loss = loss and loss + term or term
  end
  loss:backward()
  close(c.name .. " grad x", x.grad, c.grad_x, tol)
  for name in pairs(m:state_dict()) do
    local g = nil
    for _, np in ipairs(m:named_parameters()) do if np[1] == name then g = np[2].grad end end
    close(c.name .. " grad " .. name, g:to("cpu"), c.grad_params[name], tol)
  end
end

describe("recurrent modules against PyTorch", function()
  for _, c in ipairs(fixtures) do
    it(c.name, function() run_case(c, "cpu") end)
  end
  it("the fixture has its four bidirectional cases", function()
    local names = {}
    for i, c in ipairs(bidirectional) do
      names[i] = c.name
      assert.is_true(c.opts.bidirectional, c.name)
    end
    assert.are.same({"lstm_bidirectional_2layers", "gru_bidirectional_batch_first", "rnn_bidirectional_relu",
                     "lstm_bidirectional_unbatched_nobias"}, names)
  end)
  for _, c in ipairs(bidirectional) do
    it(c.name, function() run_case(c, "cpu") end)
  end

  it("bidirectional: float64 gradients by finite differences; h0 and the output's layout", function()
    nd.manual_seed(81)
    local C = G.bind(assert)
    local gru = nn.GRU(3, 2, {num_layers = 2, bidirectional = true, dtype = "float64"})
    C.check(function(x, h0) local y, h = gru(x, h0); return nd.cat({y:reshape({-1}), h:reshape({-1})}, 1) end,
            {G.leaf({3, 2, 3}), G.leaf({4, 2, 2})})
    local lstm = nn.LSTM(3, 4, {bidirectional = true})
    local x = nd.randn({5, 2, 3})
    local y, hc = lstm(x)
    assert.are.same({5, 2, 8}, y.shape)
    assert.are.same({2, 2, 4}, hc[1].shape)
    -- h_n: the forward direction's last step, the reverse direction's first
    assert.are.same(y[{5, ":", {1, 4}}]:totable(), hc[1][1]:totable())
    assert.are.same(y[{1, ":", {5, 8}}]:totable(), hc[1][2]:totable())
    assert.are.equal("LSTM(3, 4, bidirectional=true)", tostring(lstm))
    local ok, e = pcall(function() local out = lstm(x, {nd.zeros({1, 2, 4}), nd.zeros({2, 2, 4})}); return out end)
    assert.is_false(ok)
    assert.truthy(e:find("needle.nn.LSTM(3, 4): expected h0 of shape (2, 2, 4), got {1,2,4}", 1, true), e)
  end)

  -- without OpenCL: one visible pending line instead of no test at all
  D.pending_without_opencl(pending, "bidirectional cases on OpenCL")
  for _, dev in ipairs(D.opencl()) do
    it("bidirectional cases on " .. D.describe(dev), function()
      for _, c in ipairs(bidirectional) do run_case(c, dev, 1e-4) end
    end)
  end

  it("parameter names, shapes and count are PyTorch's", function()
    local lstm = nn.LSTM(10, 20, {num_layers = 2})
    local names = {}
    for _, p in ipairs(lstm:named_parameters()) do names[#names + 1] = p[1] .. "=" .. table.concat(p[2].shape, "x") end
    assert.are.same({"weight_ih_l0=80x10", "weight_hh_l0=80x20", "bias_ih_l0=80", "bias_hh_l0=80",
      "weight_ih_l1=80x20", "weight_hh_l1=80x20", "bias_ih_l1=80", "bias_hh_l1=80"}, names)
    assert.are.equal(4 * 20 * (10 + 20 + 2) + 4 * 20 * (20 + 20 + 2), lstm:num_parameters())
  end)

  it("default initialisation is uniform(-1/sqrt(H), 1/sqrt(H))", function()
    nd.manual_seed(1)
    local g = nn.GRU(50, 100)
    local w = g.weight_hh_l0
    local k = 1 / math.sqrt(100)
    assert.is_true(w:max():item() <= k and w:min():item() >= -k)
    assert.is_true(math.abs(w:std():item() - k / math.sqrt(3)) < 0.01 * k)
  end)

  it("unbatched input and dropout between layers", function()
    local m = nn.LSTM(3, 4, {num_layers = 2, dropout = 0.5})
    local y, st = m(nd.randn({5, 3}))
    assert.are.same({5, 4}, y.shape)
    assert.are.same({2, 4}, st[1].shape)
    m:eval()
    local a = m(nd.ones({5, 1, 3}))
    local b = m(nd.ones({5, 1, 3}))
    assert.are.same(a:totable(), b:totable()) -- no dropout in evaluation
  end)

  it("bad input names the module and the expected shape", function()
    local m = nn.LSTM(10, 20)
    local ok, e = pcall(function() local y = m(nd.zeros({5, 3, 7})); return y end)
    assert.is_false(ok)
    assert.truthy(e:find("needle.nn.LSTM(10, 20): expected input of shape (T, B, 10), got {5,3,7}", 1, true), e)
    ok, e = pcall(function() local y = m(nd.zeros({5, 3, 10}), {nd.zeros({2, 3, 20}), nd.zeros({2, 3, 20})}); return y end)
    assert.is_false(ok)
    assert.truthy(e:find("expected h0 of shape (1, 3, 20), got {2,3,20}", 1, true), e)
  end)

  -- issue 15: it failed inside needle.stack ("expected a non-empty list of
  -- tensors"); PyTorch raises too (there is no last state to return)
  it("a sequence of 0 steps is an error naming the module and the input's shape", function()
    for _, kind in ipairs({"RNN", "LSTM", "GRU"}) do
      local m = nn[kind](2, 3)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, e = pcall(function() local y = m(nd.zeros({0, 4, 2})); return y end)
      assert.is_false(ok)
      assert.truthy(e:find(("rnn_spec.lua:%d: needle.nn.%s(2, 3): expected a sequence length larger than 0 " ..
        "(dim 1 of the input), got input of shape {0,4,2}"):format(line, kind), 1, true), e)
      ok, e = pcall(m, nd.zeros({0, 2}))                       -- unbatched (T, in)
      assert.truthy(e:find("(dim 1 of the input), got input of shape {0,2}", 1, true), e)
      ok, e = pcall(nn[kind](2, 3, {batch_first = true}), nd.zeros({4, 0, 2}))
      assert.truthy(e:find("(dim 2 of the input), got input of shape {4,0,2}", 1, true), e)
    end
    -- an empty batch still works: only the time dim must be nonempty
    local out, hc = nn.LSTM(2, 3)(nd.zeros({5, 0, 2}))
    assert.are.same({5, 0, 3}, out.shape)
    assert.are.same({1, 0, 3}, hc[1].shape)
  end)
end)
