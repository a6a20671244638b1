-- needle.nn.rnn: RNNCell, RNN, LSTMCell, LSTM, GRUCell, GRU.
--
-- Parameter names, shapes, gate order and initialisation are PyTorch's:
-- weight_ih_l{k} (G*H, in), weight_hh_l{k} (G*H, H), bias_ih_l{k},
-- bias_hh_l{k} (G*H) with G = 1 (RNN), 4 (LSTM: i, f, g, o) or 3 (GRU: r, z,
-- n), all uniform(-1/sqrt(H), 1/sqrt(H)); so a PyTorch state_dict loads by
-- name. Inputs are (T, B, in), or (B, T, in) with batch_first; the input
-- projection of all T steps is one GEMM, so a step costs one (B, H) x (H, G*H)
-- product and the gate arithmetic.
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local core = require "needle.core"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"

local M = {}

local util = require "needle.nn.util"
local errors = require "needle.errors"
local shape_str = errors.shape_str

local function fail(self, fmt, ...)
  errors.fail_at(3, ("nn.%s(%d, %d)"):format(self.__name, self.input_size, self.hidden_size), fmt, ...)
end

local function init_uniform(shape, k, dtype)
  return Module.Parameter(init._random_scaled(nd.rand, shape, dtype, 2 * k, -k))
end

-- one layer's parameters, registered under PyTorch's names
local function add_layer_params(self, suffix, gates, input_size, hidden_size, bias, dtype)
  local k = 1 / math.sqrt(hidden_size)
  self["weight_ih" .. suffix] = init_uniform({gates * hidden_size, input_size}, k, dtype)
  self["weight_hh" .. suffix] = init_uniform({gates * hidden_size, hidden_size}, k, dtype)
  if bias then
    self["bias_ih" .. suffix] = init_uniform({gates * hidden_size}, k, dtype)
    self["bias_hh" .. suffix] = init_uniform({gates * hidden_size}, k, dtype)
  end
end

local function check_sizes(self, input_size, hidden_size)
  for _, a in ipairs({{"input_size", input_size}, {"hidden_size", hidden_size}}) do
    if math.type(a[2]) ~= "integer" or a[2] < 1 then
      util.fail(self, "%s must be a positive integer, got %s", a[1], tostring(a[2]))
    end
  end
end

local function layer_params(self, suffix)
  return self["weight_ih" .. suffix], self["weight_hh" .. suffix], self["bias_ih" .. suffix],
         self["bias_hh" .. suffix]
end

-- the per-step cell arithmetic, shared by the cells and the layers:
-- xw is x @ W_ih^T + b_ih for this step (B, G*H)
-- x @ w^T + b in one C call (nd.linear: the bias in the GEMM's epilogue)
local linear = nd.F.linear

local function rnn_step(xw, h, w_hh, b_hh, relu)
  local a = xw + linear(h, w_hh, b_hh)
  return relu and a:relu() or a:tanh()
end

-- The cell after its products as one kernel with one backward
-- (core._lstm_cell, the sum xw + hw included: the composed ops' values and gradients, bit for bit on
-- the CPU) for float32 and float64; h and c come back as the two halves of
-- its (B, 2H) result. float16/bfloat16 compose the ops.
local CELL_DTYPES = {float32 = true, float64 = true}

local function lstm_step(xw, h, c, w_hh, b_hh, H)
  local hw = linear(h, w_hh, b_hh)
  -- (a state broadcast over the batch composes; so does an nd.compile capture,
  -- whose fuse pass makes fewer kernels of the composed ops, with their
  -- neighbours, than the cell and the copy and add that put its two views'
  -- gradients together: 590 against 729 launches a replay of the bench's
  -- language model on POCL; a 2-layer GRU's, 455 against 581)
  if CELL_DTYPES[xw.dtype] and xw.dtype == hw.dtype and xw.dtype == c.dtype and xw:dim() == 2
     and c:dim() == 2 and c:size(1) == xw:size(1) and not core._graph_capturing() then
    local hc = core._lstm_cell(xw, hw, c)
    return hc:narrow(2, 1, H), hc:narrow(2, H + 1, H)
  end
  local a = xw + hw
  local i = a:narrow(-1, 1, H):sigmoid()
  local f = a:narrow(-1, H + 1, H):sigmoid()
  local g = a:narrow(-1, 2 * H + 1, H):tanh()
  local o = a:narrow(-1, 3 * H + 1, H):sigmoid()
  c = f * c + i * g
  return o * c:tanh(), c
end

-- whether an LSTM (GRU) direction runs as core._lstm_layer (core._gru_layer,
-- with c = h): float32 or float64 throughout, a state of its own per batch
-- entry (one broadcast over the batch composes the steps)
local function layer_applies(xw, h, c, w_hh, b_hh)
  local dt = xw.dtype
  return CELL_DTYPES[dt] and h.dtype == dt and c.dtype == dt and w_hh.dtype == dt
     and (b_hh == nil or b_hh.dtype == dt) and xw:dim() == 3 and h:dim() == 2 and c:dim() == 2
     and h:size(1) == xw:size(2) and c:size(1) == xw:size(2) and xw:size(2) > 0
end

local function gru_step(xw, h, w_hh, b_hh, H)
  local hw = linear(h, w_hh, b_hh)
  if CELL_DTYPES[xw.dtype] and xw.dtype == hw.dtype and xw.dtype == h.dtype and xw:dim() == 2
     and h:dim() == 2 and h:size(1) == xw:size(1) and not core._graph_capturing() then -- (as the LSTM's)
    return core._gru_cell(xw, hw, h) -- (one kernel, as the LSTM's)
  end
  local r = (xw:narrow(-1, 1, H) + hw:narrow(-1, 1, H)):sigmoid()
  local z = (xw:narrow(-1, H + 1, H) + hw:narrow(-1, H + 1, H)):sigmoid()
  local n = (xw:narrow(-1, 2 * H + 1, H) + r * hw:narrow(-1, 2 * H + 1, H)):tanh()
  return (1 - z) * n + z * h -- = n + z * (h - n)
end

local GATES = {RNN = 1, LSTM = 4, GRU = 3}

local function check_nonlinearity(self, nl)
  if nl ~= "tanh" and nl ~= "relu" then
    util.fail(self, "nonlinearity must be 'tanh' or 'relu', got '%s'", nl)
  end
end

-- cells -----------------------------------------------------------------------

local function make_cell(kind)
  local Cell = Module:extend(kind .. "Cell")
  -- (input_size, hidden_size, {bias=true, nonlinearity="tanh" (RNNCell), dtype=, device=})
  function Cell:init(input_size, hidden_size, opts)
    check_sizes(self, input_size, hidden_size)
    local spec = {bias = "boolean"}
    if kind == "RNN" then spec.nonlinearity = "string" end
    opts = util.options(self, opts, spec, true)
    self.input_size, self.hidden_size = input_size, hidden_size
    self.bias = opts.bias ~= false
    self.nonlinearity = opts.nonlinearity or "tanh"
    if kind == "RNN" then check_nonlinearity(self, self.nonlinearity) end
    add_layer_params(self, "", GATES[kind], input_size, hidden_size, self.bias, opts.dtype)
    util.place(self, opts)
  end
  function Cell:extra_repr()
    return ("%d, %d%s"):format(self.input_size, self.hidden_size, self.bias and "" or ", bias=false")
  end
  -- forward(x (B, in) or (in), state): RNN/GRU state h; LSTM state {h, c};
  -- returns h (RNN/GRU) or h, c (LSTM)
  function Cell:forward(x, state)
    if not nd.is_tensor(x) then fail(self, "expected a tensor input (B, %d), got %s", self.input_size, type(x)) end
    if x:size(-1) ~= self.input_size then
      fail(self, "expected input with last dim %d, got %s", self.input_size, shape_str(x))
    end
    local unbatched = x:dim() == 1
    if unbatched then x = x:unsqueeze(1) end
    local B, H = x:size(1), self.hidden_size
    local w_ih, w_hh, b_ih, b_hh = layer_params(self, "")
    local xw = linear(x, w_ih, b_ih)
    local function batched(t) return (t ~= nil and unbatched) and t:unsqueeze(1) or t end
    local h, c
    if kind == "LSTM" then
      h, c = batched(state and state[1]), batched(state and state[2])
      h = h or nd.zeros({B, H}, {dtype = x.dtype, device = x.device})
      c = c or nd.zeros({B, H}, {dtype = x.dtype, device = x.device})
      h, c = lstm_step(xw, h, c, w_hh, b_hh, H)
      -- (two tensors of their own, as PyTorch's: the fused cell's are halves of
      -- one result, which its backward keeps)
      h, c = h:clone(), c:clone()
      if unbatched then return h:squeeze(1), c:squeeze(1) end
      return h, c
    end
    h = batched(state) or nd.zeros({B, H}, {dtype = x.dtype, device = x.device})
    if kind == "GRU" then h = gru_step(xw, h, w_hh, b_hh, H)
    else h = rnn_step(xw, h, w_hh, b_hh, self.nonlinearity == "relu") end
    return unbatched and h:squeeze(1) or h
  end
  return Cell
end

M.RNNCell = make_cell("RNN")
M.LSTMCell = make_cell("LSTM")
M.GRUCell = make_cell("GRU")

-- multi-layer sequence modules -------------------------------------------------

local function make_rnn(kind)
  local R = Module:extend(kind)
  -- (input_size, hidden_size, {num_layers=1, bias=true, batch_first=false,
  --  dropout=0, bidirectional=false, nonlinearity="tanh" (RNN), dtype=, device=})
  -- bidirectional: each layer also runs backwards in time (parameters
  -- *_l{k}_reverse); its output is the two directions concatenated (2H) and
  -- the states are (num_layers * 2, B, H), forward then reverse per layer
  function R:init(input_size, hidden_size, opts)
    check_sizes(self, input_size, hidden_size)
    local spec = {num_layers = "integer", bias = "boolean", batch_first = "boolean", dropout = "number",
                  bidirectional = "boolean"}
    if kind == "RNN" then spec.nonlinearity = "string" end
    opts = util.options(self, opts, spec, true)
    self.input_size, self.hidden_size = input_size, hidden_size
    self.num_layers = opts.num_layers or 1
    self.bias = opts.bias ~= false
    self.batch_first = opts.batch_first == true
    self.dropout = opts.dropout or 0
    self.bidirectional = opts.bidirectional == true
    self.nonlinearity = opts.nonlinearity or "tanh"
    if kind == "RNN" then check_nonlinearity(self, self.nonlinearity) end
    if self.num_layers < 1 then error(("needle.nn.%s: num_layers must be >= 1"):format(kind), 3) end
    if not (self.dropout >= 0 and self.dropout <= 1) then -- (NaN too)
      error(("needle.nn.%s: dropout must be in [0, 1], got %s"):format(kind, tostring(self.dropout)), 3)
    end
    local dirs = self.bidirectional and 2 or 1
    for l = 0, self.num_layers - 1 do
      for d = 1, dirs do
        add_layer_params(self, "_l" .. l .. (d == 2 and "_reverse" or ""), GATES[kind],
                         l == 0 and input_size or dirs * hidden_size, hidden_size, self.bias, opts.dtype)
      end
    end
    util.place(self, opts)
  end

  function R:extra_repr()
    local s = ("%d, %d"):format(self.input_size, self.hidden_size)
    if self.num_layers ~= 1 then s = s .. ", num_layers=" .. self.num_layers end
    if self.batch_first then s = s .. ", batch_first=true" end
    if self.dropout ~= 0 then s = s .. ", dropout=" .. self.dropout end
    if self.bidirectional then s = s .. ", bidirectional=true" end
    return s
  end

  -- one direction of one layer over the whole sequence: xw (T, B, G*H) is the
  -- input projection; steps run t = 1..T, or T..1 when reverse (the output at
  -- t is then the state after reading t..T). Returns the outputs (T, B, H) and
  -- the last state(s).
  local function run_direction(self, xw, h, c, suffix, reverse)
    local _, w_hh, _, b_hh = layer_params(self, suffix)
    local T, H = xw:size(1), self.hidden_size
    if kind == "LSTM" and layer_applies(xw, h, c, w_hh, b_hh) then
      -- the whole direction as one op (core._lstm_layer): two kernels a step
      -- each way and the weight's gradient as one product over all steps;
      -- its result holds the outputs, then the last c
      local out = core._lstm_layer(xw, w_hh, b_hh, h, c, reverse)
      return out:narrow(1, 1, T), out[reverse and 1 or T], out[T + 1]
    end
    if kind == "GRU" and layer_applies(xw, h, h, w_hh, b_hh) then
      local out = core._gru_layer(xw, w_hh, b_hh, h, reverse) -- (as the LSTM's: core._gru_layer)
      return out, out[reverse and 1 or T]
    end
    local outs = {}
    -- without a graph nothing keeps a step's [h | c'] but its h kept for the
    -- output: a copy of h lets the rest go (half the output's memory)
    local own_h = kind == "LSTM" and not nd.is_grad_enabled()
    for i = 1, T do
      local t = reverse and T + 1 - i or i
      if kind == "LSTM" then
        h, c = lstm_step(xw[t], h, c, w_hh, b_hh, H)
        if own_h and not h:is_contiguous() then h = h:contiguous() end
      elseif kind == "GRU" then
        h = gru_step(xw[t], h, w_hh, b_hh, H)
      else
        h = rnn_step(xw[t], h, w_hh, b_hh, self.nonlinearity == "relu")
      end
      outs[t] = h
    end
    return nd.stack(outs, 1), h, c
  end

  -- forward(x (T, B, in), state) -> output (T, B, D*H), state_n
  -- (D = 2 when bidirectional, else 1)
  -- state: RNN/GRU h0 (D*L, B, H); LSTM {h0, c0}; nil for zeros.
  -- LSTM returns output, {h_n, c_n} (as PyTorch's tuple).
  function R:forward(x, state)
    if not nd.is_tensor(x) then fail(self, "expected a tensor input (T, B, %d), got %s", self.input_size, type(x)) end
    local input = x
    local unbatched = x:dim() == 2
    if unbatched then x = x:unsqueeze(2) end
    if x:dim() ~= 3 or x:size(3) ~= self.input_size then
      fail(self, "expected input of shape (T, B, %d)%s, got %s", self.input_size,
           self.batch_first and " with batch_first: (B, T, in)" or "", shape_str(x))
    end
    -- (an unbatched input is (T, in) either way, as PyTorch's)
    local batch_first = self.batch_first and not unbatched
    if batch_first then x = x:transpose(1, 2) end
    local T, B, H, L = x:size(1), x:size(2), self.hidden_size, self.num_layers
    local D = self.bidirectional and 2 or 1
    if T == 0 then -- an error, as in PyTorch (there is no last state to return)
      fail(self, "expected a sequence length larger than 0 (dim %d of the input), got input of shape %s",
           (self.batch_first and not unbatched) and 2 or 1, shape_str(input))
    end
    local h0, c0
    if kind == "LSTM" then
      if state ~= nil then h0, c0 = state[1], state[2] end
    else
      h0 = state
    end
    local function check_state(s, what)
      if s ~= nil and not (nd.is_tensor(s) and s:dim() == 3 and s:size(1) == D * L and s:size(2) == B
                           and s:size(3) == H) then
        fail(self, "expected %s of shape (%d, %d, %d), got %s", what, D * L, B, H,
             nd.is_tensor(s) and shape_str(s) or type(s))
      end
    end
    if unbatched then
      if nd.is_tensor(h0) then h0 = h0:unsqueeze(2) end
      if nd.is_tensor(c0) then c0 = c0:unsqueeze(2) end
    end
    check_state(h0, "h0")
    check_state(c0, "c0")
    local zeros = function() return nd.zeros({B, H}, {dtype = x.dtype, device = x.device}) end
    local layer_input = x
    local hs_n, cs_n = {}, {}
    for l = 1, L do
      local outs = {}
      for d = 1, D do
        local suffix = "_l" .. (l - 1) .. (d == 2 and "_reverse" or "")
        local k = (l - 1) * D + d -- the state's index: layer by layer, forward then reverse
        local w_ih, _, b_ih = layer_params(self, suffix)
        -- all steps' input projections at once: (T, B, in) @ (in, G*H) + b, one GEMM
        -- forward and one per gradient backward (nd.linear)
        local xw = linear(layer_input, w_ih, b_ih)
        local h = h0 ~= nil and h0[k] or zeros()
        local c = c0 ~= nil and c0[k] or zeros()
        outs[d], hs_n[k], cs_n[k] = run_direction(self, xw, h, c, suffix, d == 2)
      end
      layer_input = D == 1 and outs[1] or nd.cat(outs, 3)
      if l < L and self.dropout > 0 and self.training then
        layer_input = nd.F.dropout(layer_input, self.dropout, true)
      end
    end
    local output = layer_input
    local h_n = nd.stack(hs_n, 1)
    local c_n = kind == "LSTM" and nd.stack(cs_n, 1) or nil
    if batch_first then output = output:transpose(1, 2) end
    if unbatched then
      output = output:squeeze(2)
      h_n = h_n:squeeze(2)
      if c_n then c_n = c_n:squeeze(2) end
    end
    if kind == "LSTM" then return output, {h_n, c_n} end
    return output, h_n
  end
  return R
end

M.RNN = make_rnn("RNN")
M.LSTM = make_rnn("LSTM")
M.GRU = make_rnn("GRU")

return M
