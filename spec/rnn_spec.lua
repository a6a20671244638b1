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
    -- batch_first leaves an unbatched (T, in) input alone, as PyTorch's
    for _, kind in ipairs({"LSTM", "GRU", "RNN"}) do
      local plain, bf = nn[kind](3, 4), nn[kind](3, 4, {batch_first = true})
      bf:load_state_dict(plain:state_dict())
      local x = nd.randn({5, 3})
      local y1, s1 = plain(x)
      local y2, s2 = bf(x)
      assert.are.same({5, 4}, y2.shape, kind)
      assert.are.equal(0, (y1 - y2):abs():max():item(), kind)
      local h1, h2 = kind == "LSTM" and s1[1] or s1, kind == "LSTM" and s2[1] or s2
      assert.are.same({1, 4}, h2.shape, kind)
      assert.are.equal(0, (h1 - h2):abs():max():item(), kind)
      local st = kind == "LSTM" and {nd.zeros({1, 4}), nd.zeros({1, 4})} or nd.zeros({1, 4})
      assert.are.same({5, 4}, bf(x, st).shape, kind)
    end
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

-- module m's output and parameter gradients over x, with core[entry] (the
-- fused cell) or, when replacement is given, that function in its place;
-- last_state(state) picks the final state the loss also sums
local function train_with_cell(m, x, entry, replacement, last_state)
  local core = require "needle.core"
  for _, p in ipairs(m:parameters()) do p.grad = nil end
  local saved = core[entry]
  core[entry] = replacement or saved
  local ok, out, state = pcall(m, x)
  core[entry] = saved
  assert(ok, out)
  ;((out * out):sum() + last_state(state):sum()):backward()
  local gs = {}
  for i, p in ipairs(m:parameters()) do gs[i] = p.grad:clone() end
  return out, gs
end

describe("the fused LSTM cell (core._lstm_cell, nn.LSTM's step)", function()
  local core = require "needle.core"
  local C = G.bind(assert)
  -- the cell as the ops nn.LSTM composed before the kernel (and still composes for half dtypes)
  local function composed(a, c, H)
    local i = a:narrow(-1, 1, H):sigmoid()
    local f = a:narrow(-1, H + 1, H):sigmoid()
    local g = a:narrow(-1, 2 * H + 1, H):tanh()
    local o = a:narrow(-1, 3 * H + 1, H):sigmoid()
    local c2 = f * c + i * g
    return o * c2:tanh(), c2
  end
  local function max_diff(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end

  it("float64 gradients by finite differences, and gradients of gradients (create_graph)", function()
    nd.manual_seed(91)
    local function cell(xw, hw, c) return core._lstm_cell(xw, hw, c) end
    C.check(cell, {G.leaf({3, 8}, -2, 2), G.leaf({3, 8}, -1, 1), G.leaf({3, 2})})
    C.check(function(a, c) return core._lstm_cell(a, nil, c) end, {G.leaf({3, 8}, -2, 2), G.leaf({3, 2})})
    -- c as the right half of an earlier [h | c'] (strided rows), gates transposed in memory
    C.check(function(a, hc) return core._lstm_cell(a:t(), nil, hc:narrow(2, 3, 2)) end,
            {G.leaf({8, 3}, -2, 2), G.leaf({3, 4})})
    C.check2(cell, {G.leaf({2, 8}, -2, 2), G.leaf({2, 8}), G.leaf({2, 2})})
  end)

  it("computes the composed ops' values and gradients bit for bit on the CPU (float32, float64)", function()
    for _, dt in ipairs({"float32", "float64"}) do
      nd.manual_seed(92)
      local B, H = 6, 33
      local a = nd.randn({B, 4 * H}, {dtype = dt}) * 3
      local hw = nd.randn({B, 4 * H}, {dtype = dt})
      local c = nd.randn({B, H}, {dtype = dt})
      a.requires_grad, hw.requires_grad, c.requires_grad = true, true, true
      local wh, wc = nd.randn({B, H}, {dtype = dt}), nd.randn({B, H}, {dtype = dt})
      local hc = core._lstm_cell(a, hw, c)
      local h1, c1 = hc:narrow(2, 1, H), hc:narrow(2, H + 1, H)
      local g1 = nd.grad((h1 * wh):sum() + (c1 * wc):sum(), {a, hw, c})
      local h2, c2 = composed(a + hw, c, H)
      local g2 = nd.grad((h2 * wh):sum() + (c2 * wc):sum(), {a, hw, c})
      assert.are.equal(0, max_diff(h1, h2), dt .. " h")
      assert.are.equal(0, max_diff(c1, c2), dt .. " c")
      assert.are.equal(0, max_diff(g1[1], g2[1]), dt .. " xw's gradient")
      assert.are.equal(0, max_diff(g1[2], g2[2]), dt .. " hw's gradient")
      assert.are.equal(0, max_diff(g1[3], g2[3]), dt .. " c's gradient")
      -- only h used (c' left to the next step that never comes), only the gates wanting grad
      local ga = nd.grad((core._lstm_cell(a, nil, c:detach()):narrow(2, 1, H) * wh):sum(), {a})[1]
      local gb = nd.grad((composed(a, c:detach(), H) * wh):sum(), {a})[1]
      assert.are.equal(0, max_diff(ga, gb), dt .. " h alone")
      -- saturated gates (zero gradients, whose sign the composed ops leave to how the engine
      -- put the slices together: docs/nn-sequence.md)
      local sat = nd.grad((core._lstm_cell(a * 40, nil, c):narrow(2, 1, H) * wh):sum(), {a})[1]
      local sat2 = nd.grad((composed(a * 40, c, H) * wh):sum(), {a})[1]
      assert.are.equal(0, max_diff(sat, sat2))
      assert.is_true(sat:eq(0):sum():item() > 0, "saturated")
      -- only hw wanting grad
      local gh = nd.grad((core._lstm_cell(a:detach(), hw, c:detach()):sum()), {hw})[1]
      local h3, c3 = composed(a:detach() + hw, c:detach(), H)
      assert.are.equal(0, max_diff(gh, nd.grad(h3:sum() + c3:sum(), {hw})[1]), dt .. " hw alone")
    end
  end)

  it("nn.LSTMCell trains as with the composed cell: its outputs and every gradient", function()
    nd.manual_seed(93)
    local m = nn.LSTMCell(5, 12)
    local x = nd.randn({3, 5})
    local function c_of(c) return c end
    local out1, g1 = train_with_cell(m, x, "_lstm_cell", nil, c_of)
    -- the composed cell in its place, through the same entry
    local out2, g2 = train_with_cell(m, x, "_lstm_cell", function(xw, hw, c)
      local h, c2 = composed(xw + hw, c, 12)
      return nd.cat({h, c2}, 2)
    end, c_of)
    assert.are.equal(0, max_diff(out1, out2))
    for i = 1, #g1 do assert.are.equal(0, max_diff(g1[i], g2[i]), "parameter " .. i) end
  end)

  it("LSTMCell returns h and c of their own; a state broadcast over the batch still works", function()
    for _, B in ipairs({1, 2}) do
      local h, c = nn.LSTMCell(3, 4)(nd.randn({B, 3}, {requires_grad = true}))
      assert.is_true(h:is_contiguous() and c:is_contiguous())
      assert.are.same({4 * B}, h:view({4 * B}).shape)
      nd.no_grad(function() h:zero_() end) -- (not the cell's saved result)
      c:sum():backward()
    end
    for _, kind in ipairs({"LSTMCell", "GRUCell"}) do
      local m = nn[kind](4, 5)
      local s = nd.randn({1, 5})
      local out = m(nd.randn({3, 4}), kind == "LSTMCell" and {s, s} or s)
      assert.are.same({3, 5}, out.shape)
    end
  end)

  it("checks its arguments", function()
    local function err(...)
      local ok, e = pcall(core._lstm_cell, ...)
      assert.is_false(ok)
      return e
    end
    assert.truthy(err(nd.randn({2, 8}), nil, nd.randn({2, 3})):find(
      "lstm_cell: expected gates (B, 4H), the state's products (B, 4H) or none, and c (B, H), got gates {2,8}, " ..
      "products none and c {2,3}", 1, true))
    assert.truthy(err(nd.randn({2, 8}), nd.randn({2, 4}), nd.randn({2, 2})):find(
      "got gates {2,8}, products {2,4} and c {2,2}", 1, true))
    assert.truthy(err(nd.randn({2, 8}), nil, nd.randn({2, 2}):double()):find(
      "lstm_cell: expected float32 or float64 gates, products and c of one dtype, got float32, none and float64",
      1, true))
    assert.truthy(err(nd.randn({2, 8}):half(), nd.randn({2, 8}):half(), nd.randn({2, 2}):half()):find(
      "got float16, float16 and float16", 1, true))
  end)
end)

describe("the LSTM layer (core._lstm_layer, one direction of nn.LSTM)", function()
  local core = require "needle.core"
  local C = G.bind(assert)
  local function max_diff(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end
  local function rel_diff(a, b) return max_diff(a, b) / math.max(b:to("cpu"):double():abs():max():item(), 1e-30) end
  -- the layer as the steps nn.LSTM composed before it: each step's product
  -- (F.linear, its bias in the GEMM) and the cell's ops
  local function steps(xw, w, b, h, c, reverse)
    local T, H = xw:size(1), w:size(2)
    local ys = {}
    for i = 1, T do
      local t = reverse and T + 1 - i or i
      local a = xw[t] + nd.F.linear(h, w, b)
      local ig, fg = a:narrow(2, 1, H):sigmoid(), a:narrow(2, H + 1, H):sigmoid()
      local gg, og = a:narrow(2, 2 * H + 1, H):tanh(), a:narrow(2, 3 * H + 1, H):sigmoid()
      c = fg * c + ig * gg
      h = og * c:tanh()
      ys[t] = h
    end
    return nd.cat({nd.stack(ys, 1), c:unsqueeze(1)}, 1)
  end

  it("float64 gradients by finite differences, forward and reversed, and gradients of gradients", function()
    nd.manual_seed(96)
    local function layer(rev) return function(xw, w, b, h0, c0) return core._lstm_layer(xw, w, b, h0, c0, rev) end end
    local leaves = function() return {G.leaf({4, 2, 8}, -2, 2), G.leaf({8, 2}), G.leaf({8}), G.leaf({2, 2}), G.leaf({2, 2})} end
    C.check(layer(false), leaves())
    C.check(layer(true), leaves())
    -- no bias; xw transposed in memory, h0 and c0 strided rows of wider states
    C.check(function(xt, w, hc) return core._lstm_layer(xt:permute({3, 2, 1}), w, nil, hc:narrow(2, 1, 2),
                                                        hc:narrow(2, 3, 2), true) end,
            {G.leaf({8, 2, 3}, -2, 2), G.leaf({8, 2}), G.leaf({2, 4})})
    C.check2(layer(false), {G.leaf({3, 2, 8}, -2, 2), G.leaf({8, 2}), G.leaf({8}), G.leaf({2, 2}), G.leaf({2, 2})})
    C.check2(layer(true), {G.leaf({2, 1, 8}, -2, 2), G.leaf({8, 2}), G.leaf({8}), G.leaf({1, 2}), G.leaf({1, 2})})
  end)

  it("computes the composed steps' values on the CPU bit for bit, their gradients to rounding", function()
    for _, dt in ipairs({"float32", "float64"}) do
      for _, rev in ipairs({false, true}) do
        nd.manual_seed(97)
        local T, B, H = 9, 5, 33
        local function leaf(shape, scale) return (nd.randn(shape, {dtype = dt}) * scale):requires_grad_() end
        local xw, w, b = leaf({T, B, 4 * H}, 2), leaf({4 * H, H}, 0.3), leaf({4 * H}, 1)
        local h0, c0 = leaf({B, H}, 1), leaf({B, H}, 1)
        local wt = nd.randn({T + 1, B, H}, {dtype = dt})
        local what = dt .. (rev and " reversed" or "")
        local o1 = core._lstm_layer(xw, w, b, h0, c0, rev)
        local g1 = nd.grad((o1 * wt):sum(), {xw, w, b, h0, c0})
        local o2 = steps(xw, w, b, h0, c0, rev)
        local g2 = nd.grad((o2 * wt):sum(), {xw, w, b, h0, c0})
        assert.are.equal(0, max_diff(o1, o2), what .. " outputs")
        -- backward, each step's dh_{t-1} = dgates_t W_hh is the small-M kernel's against
        -- W_hh^T (the composed steps' matmul packs W_hh: other sums); the weight's and the
        -- bias's gradients sum the steps in one product and one sum
        local tol = dt == "float32" and 2e-5 or 1e-12
        for k, name in ipairs({"xw", "w_hh", "b_hh", "h0", "c0"}) do
          local r = rel_diff(g1[k], g2[k])
          assert.is_true(r < tol, what .. " " .. name .. "'s gradient " .. r)
        end
      end
    end
  end)

  it("nn.LSTM runs its layers through it: a 2-layer bidirectional step's outputs and gradients", function()
    nd.manual_seed(98)
    local m = nn.LSTM(5, 12, {num_layers = 2, bidirectional = true})
    local x = nd.randn({7, 3, 5})
    local function c_n(hc) return hc[2] end
    local calls, layer = 0, core._lstm_layer
    local out1, g1 = train_with_cell(m, x, "_lstm_layer", function(...)
      calls = calls + 1
      return layer(...)
    end, c_n)
    assert.are.equal(4, calls)
    local out2, g2 = train_with_cell(m, x, "_lstm_layer", steps, c_n)
    assert.are.equal(0, max_diff(out1, out2))
    for i = 1, #g1 do assert.is_true(rel_diff(g1[i], g2[i]) < 2e-5, "parameter " .. i) end
  end)

  it("keeps its result for the backward: an in-place change of it is an error; under no_grad the same values", function()
    local w = nd.randn({8, 2}, {requires_grad = true})
    local out = core._lstm_layer(nd.randn({3, 1, 8}), w, nil, nd.zeros({1, 2}), nd.zeros({1, 2}), false)
    nd.no_grad(function() out:add_(1) end)
    local ok, e = pcall(function() out:sum():backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("modified", 1, true), tostring(e))
    -- without a graph the steps' buffers are one or two steps long: the same values
    for _, T in ipairs({1, 2, 5}) do
      for _, rev in ipairs({false, true}) do
        local xw, b, h0, c0 = nd.randn({T, 3, 8}), nd.randn({8}), nd.randn({3, 2}), nd.randn({3, 2})
        local with = core._lstm_layer(xw, w, b, h0, c0, rev)
        local y = nd.no_grad(function() return core._lstm_layer(xw, w, b, h0, c0, rev) end)
        assert.is_true(with.requires_grad)
        assert.is_false(y.requires_grad)
        assert.are.equal(0, max_diff(y, with), T .. (rev and " reversed" or ""))
      end
    end
  end)

  it("checks its arguments", function()
    local function err(...)
      local ok, e = pcall(core._lstm_layer, ...)
      assert.is_false(ok)
      return e
    end
    local xw, w, s = nd.randn({3, 2, 8}), nd.randn({8, 2}), nd.randn({2, 2})
    assert.truthy(err(xw, nd.randn({8, 3}), nil, s, s):find(
      "lstm_layer: expected the input's products (T, B, 4H) with T, B, H > 0, w_hh (4H, H), b_hh (4H) or none, " ..
      "h0 and c0 (B, H), got {3,2,8}, {8,3}, none, {2,2} and {2,2}", 1, true))
    assert.truthy(err(xw, w, nd.randn({4}), s, s):find("got {3,2,8}, {8,2}, {4}, {2,2} and {2,2}", 1, true))
    assert.truthy(err(xw, w, nil, nd.randn({3, 2}), s):find("{3,2} and {2,2}", 1, true))
    assert.truthy(err(nd.randn({0, 2, 8}), w, nil, s, s):find("got {0,2,8}", 1, true))
    assert.truthy(err(xw, w:double(), nil, s, s):find(
      "lstm_layer: expected float32 or float64 products, weight, bias and state of one dtype, got float32, " ..
      "float64, none, float32 and float32", 1, true))
    assert.truthy(err(xw:half(), w:half(), nil, s:half(), s:half()):find("got float16, float16", 1, true))
  end)
end)

describe("the GRU layer (core._gru_layer, one direction of nn.GRU)", function()
  local core = require "needle.core"
  local C = G.bind(assert)
  local function max_diff(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end
  local function rel_diff(a, b) return max_diff(a, b) / math.max(b:to("cpu"):double():abs():max():item(), 1e-30) end
  -- the layer as the steps nn.GRU composed before it
  local function steps(xw, w, b, h, reverse)
    local T, H = xw:size(1), w:size(2)
    local ys = {}
    for i = 1, T do
      local t = reverse and T + 1 - i or i
      local x, hw = xw[t], nd.F.linear(h, w, b)
      local r = (x:narrow(2, 1, H) + hw:narrow(2, 1, H)):sigmoid()
      local z = (x:narrow(2, H + 1, H) + hw:narrow(2, H + 1, H)):sigmoid()
      local n = (x:narrow(2, 2 * H + 1, H) + r * hw:narrow(2, 2 * H + 1, H)):tanh()
      h = (1 - z) * n + z * h
      ys[t] = h
    end
    return nd.stack(ys, 1)
  end

  it("float64 gradients by finite differences, forward and reversed, and gradients of gradients", function()
    nd.manual_seed(99)
    local function layer(rev) return function(xw, w, b, h0) return core._gru_layer(xw, w, b, h0, rev) end end
    local leaves = function() return {G.leaf({4, 2, 6}, -2, 2), G.leaf({6, 2}), G.leaf({6}), G.leaf({2, 2})} end
    C.check(layer(false), leaves())
    C.check(layer(true), leaves())
    -- no bias; xw transposed in memory, h0 strided rows of a wider state
    C.check(function(xt, w, hh) return core._gru_layer(xt:permute({3, 2, 1}), w, nil, hh:narrow(2, 2, 2), true) end,
            {G.leaf({6, 2, 3}, -2, 2), G.leaf({6, 2}), G.leaf({2, 4})})
    C.check2(layer(false), {G.leaf({3, 2, 6}, -2, 2), G.leaf({6, 2}), G.leaf({6}), G.leaf({2, 2})})
    C.check2(layer(true), {G.leaf({2, 1, 6}, -2, 2), G.leaf({6, 2}), G.leaf({6}), G.leaf({1, 2})})
  end)

  it("computes the composed steps' values on the CPU bit for bit, their gradients to rounding", function()
    for _, dt in ipairs({"float32", "float64"}) do
      for _, rev in ipairs({false, true}) do
        nd.manual_seed(100)
        local T, B, H = 9, 5, 33
        local function leaf(shape, scale) return (nd.randn(shape, {dtype = dt}) * scale):requires_grad_() end
        local xw, w, b, h0 = leaf({T, B, 3 * H}, 2), leaf({3 * H, H}, 0.3), leaf({3 * H}, 1), leaf({B, H}, 1)
        local wt = nd.randn({T, B, H}, {dtype = dt})
        local what = dt .. (rev and " reversed" or "")
        local o1 = core._gru_layer(xw, w, b, h0, rev)
        local g1 = nd.grad((o1 * wt):sum(), {xw, w, b, h0})
        local o2 = steps(xw, w, b, h0, rev)
        local g2 = nd.grad((o2 * wt):sum(), {xw, w, b, h0})
        assert.are.equal(0, max_diff(o1, o2), what .. " outputs")
        -- (h's gradient sums three parts a step, in another order than the engine did)
        local tol = dt == "float32" and 2e-5 or 1e-12
        for k, name in ipairs({"xw", "w_hh", "b_hh", "h0"}) do
          assert.is_true(rel_diff(g1[k], g2[k]) < tol, what .. " " .. name .. "'s gradient " .. rel_diff(g1[k], g2[k]))
        end
        -- without a graph the product's buffer is one step long: the same values
        local y = nd.no_grad(function() return core._gru_layer(xw, w, b, h0, rev) end)
        assert.is_false(y.requires_grad)
        assert.are.equal(0, max_diff(y, o1), what .. " under no_grad")
      end
    end
  end)

  it("nn.GRU runs its layers through it: a 2-layer bidirectional step's outputs and gradients", function()
    nd.manual_seed(101)
    local m = nn.GRU(5, 12, {num_layers = 2, bidirectional = true})
    local x = nd.randn({7, 3, 5})
    local function h_n(h) return h end
    local calls, layer = 0, core._gru_layer
    local out1, g1 = train_with_cell(m, x, "_gru_layer", function(...)
      calls = calls + 1
      return layer(...)
    end, h_n)
    assert.are.equal(4, calls)
    local out2, g2 = train_with_cell(m, x, "_gru_layer", steps, h_n)
    assert.are.equal(0, max_diff(out1, out2))
    for i = 1, #g1 do assert.is_true(rel_diff(g1[i], g2[i]) < 2e-5, "parameter " .. i) end
  end)

  it("checks its arguments", function()
    local function err(...)
      local ok, e = pcall(core._gru_layer, ...)
      assert.is_false(ok)
      return e
    end
    local xw, w, s = nd.randn({3, 2, 6}), nd.randn({6, 2}), nd.randn({2, 2})
    assert.truthy(err(xw, nd.randn({6, 3}), nil, s):find(
      "gru_layer: expected the input's products (T, B, 3H) with T, B, H > 0, w_hh (3H, H), b_hh (3H) or none " ..
      "and h0 (B, H), got {3,2,6}, {6,3}, none and {2,2}", 1, true))
    assert.truthy(err(xw, w, nd.randn({5}), s):find("got {3,2,6}, {6,2}, {5} and {2,2}", 1, true))
    assert.truthy(err(nd.randn({0, 2, 6}), w, nil, s):find("got {0,2,6}", 1, true))
    assert.truthy(err(xw, w, nil, s:double()):find(
      "gru_layer: expected float32 or float64 products, weight, bias and state of one dtype, got float32, " ..
      "float32, none and float64", 1, true))
  end)
end)

describe("the fused GRU cell (core._gru_cell, nn.GRU's step)", function()
  local core = require "needle.core"
  local C = G.bind(assert)
  local function composed(xw, hw, h, H)
    local r = (xw:narrow(-1, 1, H) + hw:narrow(-1, 1, H)):sigmoid()
    local z = (xw:narrow(-1, H + 1, H) + hw:narrow(-1, H + 1, H)):sigmoid()
    local n = (xw:narrow(-1, 2 * H + 1, H) + r * hw:narrow(-1, 2 * H + 1, H)):tanh()
    return (1 - z) * n + z * h
  end
  local function max_diff(a, b) return (a:to("cpu"):double() - b:to("cpu"):double()):abs():max():item() end

  it("float64 gradients by finite differences, and gradients of gradients (create_graph)", function()
    nd.manual_seed(94)
    local function cell(xw, hw, h) return core._gru_cell(xw, hw, h) end
    C.check(cell, {G.leaf({3, 6}, -2, 2), G.leaf({3, 6}, -2, 2), G.leaf({3, 2})})
    -- strided rows: products transposed in memory, h a narrow of a wider tensor
    C.check(function(xt, hw, hh) return core._gru_cell(xt:t(), hw, hh:narrow(2, 2, 2)) end,
            {G.leaf({6, 3}, -2, 2), G.leaf({3, 6}), G.leaf({3, 4})})
    C.check2(cell, {G.leaf({2, 6}, -2, 2), G.leaf({2, 6}), G.leaf({2, 2})})
    G.assert_covers(assert, "rnn_spec.lua") -- (the LSTM's and gru_layer's ran in the describes above)
  end)

  it("computes the composed ops' values and gradients bit for bit on the CPU (float32, float64)", function()
    for _, dt in ipairs({"float32", "float64"}) do
      nd.manual_seed(95)
      local B, H = 5, 37
      local xw, hw = nd.randn({B, 3 * H}, {dtype = dt}) * 2, nd.randn({B, 3 * H}, {dtype = dt}) * 2
      local h = nd.randn({B, H}, {dtype = dt})
      xw.requires_grad, hw.requires_grad, h.requires_grad = true, true, true
      local w = nd.randn({B, H}, {dtype = dt})
      local o1 = core._gru_cell(xw, hw, h)
      local g1 = nd.grad((o1 * w):sum(), {xw, hw, h})
      local o2 = composed(xw, hw, h, H)
      local g2 = nd.grad((o2 * w):sum(), {xw, hw, h})
      assert.are.equal(0, max_diff(o1, o2), dt .. " h'")
      for j, what in ipairs({"xw", "hw", "h"}) do
        assert.are.equal(0, max_diff(g1[j], g2[j]), dt .. " " .. what .. "'s gradient")
      end
      -- saturated gates (zero gradients: their sign as in the LSTM's case)
      local s1 = nd.grad((core._gru_cell(xw * 40, hw * 40, h) * w):sum(), {xw, hw})
      local s2 = nd.grad((composed(xw * 40, hw * 40, h, H) * w):sum(), {xw, hw})
      for j = 1, 2 do assert.are.equal(0, max_diff(s1[j], s2[j])) end
      -- only h wanting grad
      local gh = nd.grad((core._gru_cell(xw:detach(), hw:detach(), h) * w):sum(), {h})[1]
      local gc = nd.grad((composed(xw:detach(), hw:detach(), h, H) * w):sum(), {h})[1]
      assert.are.equal(0, max_diff(gh, gc), dt .. " h alone")
    end
  end)

  it("nn.GRU trains as with the composed cell: a 2-layer step's outputs and every gradient", function()
    nd.manual_seed(96)
    local m = nn.GRU(5, 12, {num_layers = 2})
    local x = nd.randn({7, 3, 5})
    local function h_n(h) return h end
    local out1, g1 = train_with_cell(m, x, "_gru_cell", nil, h_n)
    local out2, g2 = train_with_cell(m, x, "_gru_cell", function(xw, hw, h) return composed(xw, hw, h, 12) end, h_n)
    assert.are.equal(0, max_diff(out1, out2))
    for i = 1, #g1 do assert.are.equal(0, max_diff(g1[i], g2[i]), "parameter " .. i) end
  end)

  it("checks its arguments", function()
    local function err(...)
      local ok, e = pcall(core._gru_cell, ...)
      assert.is_false(ok)
      return e
    end
    assert.truthy(err(nd.randn({2, 6}), nd.randn({2, 6}), nd.randn({2, 3})):find(
      "gru_cell: expected the input's and the state's products (B, 3H) and h (B, H), got {2,6}, {2,6} and h {2,3}",
      1, true))
    assert.truthy(err(nd.randn({2, 6}), nd.randn({2, 6}):double(), nd.randn({2, 2})):find(
      "gru_cell: expected float32 or float64 products and h of one dtype, got float32, float64 and float32", 1, true))
  end)
end)
