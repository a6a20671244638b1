-- needle.nn.transformer: MultiheadAttention, TransformerEncoderLayer,
-- TransformerEncoder (PyTorch's) and Transformer: needle's decoder-only model
-- with learned positions, or, called with an options table, PyTorch's
-- encoder-decoder (in needle.nn.transformer_decoder, with the decoder layers).
--
--   local mha = nd.nn.MultiheadAttention(64, 8, {batch_first = true})
--   local out, weights = mha(q, k, v, {key_padding_mask = pad, is_causal = true})
--   local layer = nd.nn.TransformerEncoderLayer(64, 8, {dim_feedforward = 256, dropout = 0,
--                                                      batch_first = true, norm_first = true})
--   local enc = nd.nn.TransformerEncoder(layer, 6)     -- six deep copies of layer
--
-- Parameters and state_dict keys are PyTorch's: in_proj_weight (3E, E) with
-- q, k, v stacked, in_proj_bias, out_proj.weight, out_proj.bias; an encoder
-- layer's self_attn, linear1, linear2, norm1, norm2; an encoder's
-- layers.<i>.* (0-based, as PyTorch). Masks follow PyTorch: a bool mask is
-- true where attention is NOT allowed, a float mask is added to the scores.
-- is_causal = true with no attn_mask builds the causal mask (PyTorch treats
-- it only as a hint and needs the mask too).
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local Linear = require("needle.nn.linear").Linear
local linear_act = require("needle.nn.linear").linear_act
local Dropout = require("needle.nn.dropout").Dropout
local LayerNorm = require("needle.nn.norm").LayerNorm
local Embedding = require("needle.nn.embedding").Embedding
local ModuleList = require("needle.nn.container").ModuleList

local M = {}

local util = require "needle.nn.util"
local options = require "needle.options"
local shape_str = require("needle.errors").shape_str

-- clone_module(m): a deep copy (PyTorch's copy.deepcopy of a module):
-- parameters and buffers are copied (parameters stay leaves that require
-- grad, without .grad), children recursively; tensors shared inside m (tied
-- weights) stay shared in the copy. Plain tables among the attributes are
-- copied one level deep; functions are shared. The other raw fields
-- (training, _non_persistent, ...) are copied, plain tables deeply, so that
-- no clone shares per-module state with m. Hooks (module_hooks.lua) are
-- copied as PyTorch's deepcopy copies its hook dicts: the clone runs the same
-- functions from lists of its own (removing a hook of m, or registering one on
-- the clone, leaves the other alone), with a hooked metatable of its own; a
-- clone without hooks gets the class's plain metatable.
local function clone_module(m, memo)
  memo = memo or {}
  if memo[m] then return memo[m] end
  local function copy_tensor(t, as_param)
    if memo[t] then return memo[t] end
    local c = nd.no_grad(function() return t:detach():clone() end)
    if as_param then c.requires_grad = true end
    memo[t] = c
    return c
  end
  local function deep(v) -- a plain table (no metatable), deeply
    if type(v) ~= "table" or getmetatable(v) ~= nil then return v end
    if memo[v] then return memo[v] end
    local t = {}
    memo[v] = t
    for kk, vv in pairs(v) do t[deep(kk)] = deep(vv) end
    return t
  end
  local OWN = {_params = true, _buffers = true, _children = true, _attrs = true, _order = true, _hooks = true}
  local c = {}
  for k, v in next, m do                    -- raw fields (training, _non_persistent, ...; not __pairs)
    if not OWN[k] then c[k] = deep(v) end
  end
  c._params, c._buffers, c._children, c._attrs, c._order = {}, {}, {}, {}, {}
  local mt = getmetatable(m)
  local plain = rawget(mt, "plain") or mt   -- the class's instance metatable
  local hooks = rawget(m, "_hooks")
  if hooks and #hooks.pre + #hooks.fwd + #hooks.bwd > 0 then
    local own = {}
    for kind, list in pairs(hooks) do
      own[kind] = {}
      for i, rec in ipairs(list) do own[kind][i] = {fn = rec.fn} end
    end
    c._hooks = own
    local hooked = {}
    for k, v in next, mt do hooked[k] = v end
    hooked.__call, hooked.plain = require("needle.nn.module_hooks").hooked_call, plain
    setmetatable(c, hooked)
  else
    setmetatable(c, plain)
  end
  memo[m] = c
  for k, v in pairs(rawget(m, "_params")) do rawget(c, "_params")[k] = copy_tensor(v, true) end
  for k, v in pairs(rawget(m, "_buffers")) do rawget(c, "_buffers")[k] = copy_tensor(v, false) end
  for k, v in pairs(rawget(m, "_children")) do rawget(c, "_children")[k] = clone_module(v, memo) end
  for k, v in pairs(rawget(m, "_attrs")) do
    if nd.is_tensor(v) then
      v = copy_tensor(v, v.requires_grad)
    elseif type(v) == "table" and getmetatable(v) == nil then
      local t = {}
      for kk, vv in pairs(v) do t[kk] = vv end
      v = t
    end
    rawget(c, "_attrs")[k] = v
  end
  for i, e in ipairs(rawget(m, "_order")) do rawget(c, "_order")[i] = {e[1], e[2]} end
  return c
end
M.clone_module = clone_module

-- an additive float mask (0 or -inf) from a bool mask, on the mask's device;
-- float masks as they are
local function additive(mask, dtype)
  if mask.dtype == "bool" then
    local o = {dtype = dtype, device = mask.device}
    return nd.where(mask, nd.tensor(-math.huge, o), nd.tensor(0.0, o))
  end
  if mask.dtype ~= "float32" and mask.dtype ~= "float64" then
    error(("needle.nn.MultiheadAttention: masks must be bool or floating point, got %s"):format(mask.dtype), 4)
  end
  return mask
end

-- generate_square_subsequent_mask(sz, {dtype = "float32", device = "cpu"}):
-- the (sz, sz) float causal mask, -inf above the diagonal and 0 elsewhere
-- (PyTorch's Transformer static method)
function M.generate_square_subsequent_mask(sz, opts)
  opts = options.check("nn.Transformer.generate_square_subsequent_mask", opts, {dtype = "string", device = "string"})
  if math.type(sz) ~= "integer" or sz < 0 then
    util.fail("Transformer.generate_square_subsequent_mask", "sz must be an integer >= 0, got %s", tostring(sz))
  end
  local o = {dtype = opts.dtype or "float32", device = opts.device}
  local i = nd.arange(1, sz + 1, {device = o.device}):view({sz, 1})
  local j = nd.arange(1, sz + 1, {device = o.device}):view({1, sz})
  return nd.where(j:gt(i), nd.tensor(-math.huge, o), nd.tensor(0.0, o))
end

-- MultiheadAttention ---------------------------------------------------------------

local MHA = Module:extend("MultiheadAttention")
local attend_maybe_fused = require("needle.functional.attention").attend_maybe_fused

-- MultiheadAttention(embed_dim, num_heads, {dropout=0, bias=true, add_bias_kv=false,
--   add_zero_attn=false, kdim=embed_dim, vdim=embed_dim, batch_first=false, dtype=, device=})
-- With kdim and vdim equal to embed_dim the q, k, v projections are stacked in
-- in_proj_weight (3E, E); otherwise they are q_proj_weight (E, E),
-- k_proj_weight (E, kdim), v_proj_weight (E, vdim), as PyTorch (in_proj_bias
-- stays stacked). add_bias_kv appends a learnt key and value (bias_k, bias_v,
-- (1, 1, E)) to every sequence, add_zero_attn a zero one after the heads split.
function MHA:init(embed_dim, num_heads, opts)
  if math.type(embed_dim) ~= "integer" or embed_dim < 1 or math.type(num_heads) ~= "integer" or num_heads < 1 then
    error(("needle.nn.MultiheadAttention: embed_dim and num_heads must be positive integers, got %s and %s"):format(
      tostring(embed_dim), tostring(num_heads)), 3)
  end
  if embed_dim % num_heads ~= 0 then
    error(("needle.nn.MultiheadAttention(%d, %d): embed_dim must be divisible by num_heads"):format(
      embed_dim, num_heads), 3)
  end
  opts = util.options(self, opts, {dropout = "number", bias = "boolean", batch_first = "boolean", kdim = "integer",
                                   vdim = "integer", add_bias_kv = "boolean", add_zero_attn = "boolean"}, true)
  for _, k in ipairs({"kdim", "vdim"}) do
    if opts[k] ~= nil and opts[k] < 1 then
      error(("needle.nn.MultiheadAttention(%d, %d): %s must be a positive integer, got %d"):format(
        embed_dim, num_heads, k, opts[k]), 3)
    end
  end
  self.embed_dim, self.num_heads = embed_dim, num_heads
  self.kdim, self.vdim = opts.kdim or embed_dim, opts.vdim or embed_dim
  self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
  self.head_dim = embed_dim // num_heads
  self.dropout = opts.dropout or 0.0
  self.batch_first = opts.batch_first or false
  self.add_zero_attn = opts.add_zero_attn or false
  local bias = opts.bias ~= false
  local dtype = opts.dtype or "float32"
  -- registration order is PyTorch's (parameters() and the state_dict)
  if self._qkv_same_embed_dim then
    self.in_proj_weight = Module.Parameter(nd.empty({3 * embed_dim, embed_dim}, {dtype = dtype}))
  else
    self.q_proj_weight = Module.Parameter(nd.empty({embed_dim, embed_dim}, {dtype = dtype}))
    self.k_proj_weight = Module.Parameter(nd.empty({embed_dim, self.kdim}, {dtype = dtype}))
    self.v_proj_weight = Module.Parameter(nd.empty({embed_dim, self.vdim}, {dtype = dtype}))
  end
  if bias then
    self.in_proj_bias = Module.Parameter(nd.empty({3 * embed_dim}, {dtype = dtype}))
  else
    self:register_parameter("in_proj_bias", nil)
  end
  -- (PyTorch lists a module's own parameters before its children's: bias_k
  -- and bias_v come before out_proj.*)
  if opts.add_bias_kv then
    self.bias_k = Module.Parameter(nd.empty({1, 1, embed_dim}, {dtype = dtype}))
    self.bias_v = Module.Parameter(nd.empty({1, 1, embed_dim}, {dtype = dtype}))
  end
  self.out_proj = Linear(embed_dim, embed_dim, {bias = bias, dtype = dtype})
  self:reset_parameters()
  util.place(self, opts)
end

-- PyTorch's _reset_parameters: xavier_uniform_ projections, zero biases,
-- xavier_normal_ bias_k and bias_v (out_proj.weight keeps Linear's init)
function MHA:reset_parameters()
  if self._qkv_same_embed_dim then
    init.xavier_uniform_(self.in_proj_weight)
  else
    init.xavier_uniform_(self.q_proj_weight)
    init.xavier_uniform_(self.k_proj_weight)
    init.xavier_uniform_(self.v_proj_weight)
  end
  if self.in_proj_bias ~= nil then
    init.zeros_(self.in_proj_bias)
    init.zeros_(self.out_proj.bias)
  end
  if self.bias_k ~= nil then
    init.xavier_normal_(self.bias_k)
    init.xavier_normal_(self.bias_v)
  end
end

function MHA:_sig() return ("(%d, %d)"):format(self.embed_dim, self.num_heads) end

local function narrow(t, dim, i, E)
  if t == nil then return nil end
  return t:narrow(dim, i * E + 1, E)
end

-- t (..., S) with n zero columns appended on the last dim (the masks of the
-- keys added by add_bias_kv and add_zero_attn: not masked)
local function pad_keys(t, n)
  if n == 0 then return t end
  local shape = t.shape
  shape[#shape] = n
  return nd.cat({t, nd.zeros(shape, {dtype = t.dtype, device = t.device})}, -1)
end

-- the q, k, v projections of (N, T, *) inputs: packed (one GEMM when q = k = v,
-- two when k = v) or separate weights
function MHA:_project(query, key, value, q_in, k_in, v_in)
  local E, b = self.embed_dim, self.in_proj_bias
  if not self._qkv_same_embed_dim then
    return nd.F.linear(q_in, self.q_proj_weight, narrow(b, 1, 0, E)),
           nd.F.linear(k_in, self.k_proj_weight, narrow(b, 1, 1, E)),
           nd.F.linear(v_in, self.v_proj_weight, narrow(b, 1, 2, E))
  end
  local w = self.in_proj_weight
  if rawequal(query, key) and rawequal(key, value) then
    local qkv = nd.F.linear(q_in, w, b)
    return qkv:narrow(3, 1, E), qkv:narrow(3, E + 1, E), qkv:narrow(3, 2 * E + 1, E)
  end
  local q = nd.F.linear(q_in, narrow(w, 1, 0, E), narrow(b, 1, 0, E))
  if rawequal(key, value) then
    local kv = nd.F.linear(k_in, w:narrow(1, E + 1, 2 * E), b and b:narrow(1, E + 1, 2 * E))
    return q, kv:narrow(3, 1, E), kv:narrow(3, E + 1, E)
  end
  return q, nd.F.linear(k_in, narrow(w, 1, 1, E), narrow(b, 1, 1, E)),
         nd.F.linear(v_in, narrow(w, 1, 2, E), narrow(b, 1, 2, E))
end

-- forward(query, key, value, {key_padding_mask=, attn_mask=, need_weights=true,
--         average_attn_weights=true, is_causal=false})
-- -> output (shaped as query), weights (N, L, S) averaged over heads (or
-- (N, H, L, S) with average_attn_weights = false; nil with need_weights = false);
-- S counts the keys add_bias_kv and add_zero_attn add
-- the masks' types are checked below, with their shapes
local MHA_CALL = {key_padding_mask = "any", attn_mask = "any", need_weights = "boolean",
                  average_attn_weights = "boolean", is_causal = "boolean"}

function MHA:forward(query, key, value, opts)
  opts = options.check("nn.MultiheadAttention" .. self:_sig(), opts, MHA_CALL)
  key = key or query
  value = value or key
  local E, H, D = self.embed_dim, self.num_heads, self.head_dim
  for _, a in ipairs({{"query", query, E}, {"key", key, self.kdim}, {"value", value, self.vdim}}) do
    local x, F = a[2], a[3]
    if not nd.is_tensor(x) or (x:dim() ~= 2 and x:dim() ~= 3) or x:size(-1) ~= F then
      local want = self.batch_first and "(N, L, %d)" or "(L, N, %d)"
      error(("needle.nn.MultiheadAttention%s: expected %s of shape " .. want .. " or (L, %d), got %s"):format(
        self:_sig(), a[1], F, F, nd.is_tensor(x) and shape_str(x) or type(x)), 2)
    end
  end
  local batched = query:dim() == 3
  if key:dim() ~= query:dim() or value:dim() ~= query:dim() then
    error(("needle.nn.MultiheadAttention%s: query %s, key %s and value %s must all be batched or all unbatched"):format(
      self:_sig(), shape_str(query), shape_str(key), shape_str(value)), 2)
  end
  -- to (N, L, E)
  local function bf(x)
    if not batched then return x:unsqueeze(1) end
    if self.batch_first then return x end
    return x:transpose(1, 2)
  end
  local q_in, k_in, v_in = bf(query), bf(key), bf(value)
  local N, L, S = q_in:size(1), q_in:size(2), k_in:size(2)
  if k_in:size(1) ~= N or v_in:size(1) ~= N or v_in:size(2) ~= S then
    error(("needle.nn.MultiheadAttention%s: query %s, key %s and value %s do not agree in batch and sequence sizes"):format(
      self:_sig(), shape_str(query), shape_str(key), shape_str(value)), 2)
  end

  local q, k, v = self:_project(query, key, value, q_in, k_in, v_in)
  local extra = 0 -- keys appended after the user's S (their mask columns are 0)
  if self.bias_k ~= nil then
    k = nd.cat({k, self.bias_k:expand({N, 1, E})}, 2)
    v = nd.cat({v, self.bias_v:expand({N, 1, E})}, 2)
    extra = 1
  end
  -- heads: (N, T, E) -> (N, H, T, D)
  local Sk = S + extra
  q = q:reshape({N, L, H, D}):permute({1, 3, 2, 4})
  k = k:reshape({N, Sk, H, D}):permute({1, 3, 2, 4})
  v = v:reshape({N, Sk, H, D}):permute({1, 3, 2, 4})
  if self.add_zero_attn then
    local zero = nd.zeros({N, H, 1, D}, {dtype = k.dtype, device = k.device})
    k, v = nd.cat({k, zero}, 3), nd.cat({v, zero}, 3)
    extra = extra + 1
  end

  -- masks, as one additive mask broadcast to (N, H, L, S + extra)
  local attn_mask = opts.attn_mask
  local kpm = opts.key_padding_mask
  local dtype = q.dtype
  if attn_mask == nil and opts.is_causal then
    attn_mask = require("needle.functional.attention").causal_mask(L, S, dtype, q.device)
  end
  local mask
  if attn_mask ~= nil then
    if not nd.is_tensor(attn_mask) then
      error(("needle.nn.MultiheadAttention%s: attn_mask must be a tensor, got %s"):format(self:_sig(), type(attn_mask)), 2)
    end
    local m = additive(attn_mask, dtype)
    if m:dim() == 2 and m:size(1) == L and m:size(2) == S then
      m = pad_keys(m, extra):view({1, 1, L, S + extra})
    elseif m:dim() == 3 and m:size(1) == N * H and m:size(2) == L and m:size(3) == S then
      m = pad_keys(m, extra):reshape({N, H, L, S + extra})
    else
      error(("needle.nn.MultiheadAttention%s: attn_mask must have shape {%d,%d} or {%d,%d,%d}, got %s"):format(
        self:_sig(), L, S, N * H, L, S, shape_str(attn_mask)), 2)
    end
    mask = m
  end
  if kpm ~= nil then
    if not nd.is_tensor(kpm) then
      error(("needle.nn.MultiheadAttention%s: key_padding_mask must be a tensor, got %s"):format(self:_sig(), type(kpm)), 2)
    end
    local want = batched and ("{%d,%d}"):format(N, S) or ("{%d}"):format(S)
    if shape_str(kpm) ~= want then
      error(("needle.nn.MultiheadAttention%s: key_padding_mask must have shape %s (batch, source length), got %s"):format(
        self:_sig(), want, shape_str(kpm)), 2)
    end
    local m = pad_keys(additive(kpm, dtype):reshape({N, S}), extra):reshape({N, 1, 1, S + extra})
    mask = mask and mask + m or m
  end

  local p = (self.training and self.dropout > 0) and self.dropout or 0
  -- (N, H, L, D), (N, H, L, S); without the weights, the fused kernel where it applies
  local out, attn = attend_maybe_fused(q, k, v, mask, p, 1 / math.sqrt(D), opts.need_weights ~= false)
  out = out:permute({1, 3, 2, 4}):reshape({N, L, E})
  out = self.out_proj(out)

  local weights
  if opts.need_weights ~= false then
    weights = opts.average_attn_weights ~= false and attn:mean(2) or attn
    if not batched then weights = weights:squeeze(1) end
  end
  if not batched then
    out = out:squeeze(1)
  elseif not self.batch_first then
    out = out:transpose(1, 2)
  end
  return out, weights
end

function MHA:extra_repr()
  local s = ("embed_dim=%d, num_heads=%d"):format(self.embed_dim, self.num_heads)
  if self.dropout ~= 0 then s = s .. (", dropout=%s"):format(self.dropout) end
  if not self._qkv_same_embed_dim then s = s .. (", kdim=%d, vdim=%d"):format(self.kdim, self.vdim) end
  if self.bias_k ~= nil then s = s .. ", add_bias_kv=true" end
  if self.add_zero_attn then s = s .. ", add_zero_attn=true" end
  if self.batch_first then s = s .. ", batch_first=true" end
  return s
end
M.MultiheadAttention = MHA

-- TransformerEncoderLayer -------------------------------------------------------------

local ACTIVATIONS = {
  relu = function(x) return nd.F.relu(x) end,
  gelu = function(x) return nd.F.gelu(x) end,
}

-- self.activation from the option (default "relu"): a name, a function or a
-- module (which becomes a child, as PyTorch's); shared with the decoder layer
local function set_activation(self, act)
  act = act or "relu"
  if type(act) == "string" then
    if not ACTIVATIONS[act] then
      util.fail(self, "activation must be 'relu', 'gelu', a function or a module, got '%s'", act)
    end
    self.activation_name = act
    self.activation = ACTIVATIONS[act]
  elseif Module.is_module(act) or type(act) == "function" then
    self.activation = act
  else
    util.fail(self, "activation must be 'relu', 'gelu', a function or a module, got %s", type(act))
  end
end
M.set_activation = set_activation
local ACTIVATION = "string|function|module"
M.ACTIVATION = ACTIVATION

local TEL = Module:extend("TransformerEncoderLayer")

-- TransformerEncoderLayer(d_model, nhead, {dim_feedforward=2048, dropout=0.1,
--   activation="relu" | "gelu" | function | module, layer_norm_eps=1e-5,
--   batch_first=false, norm_first=false, bias=true, dtype=, device=})

function TEL:init(d_model, nhead, opts)
  opts = util.options(self, opts, {dim_feedforward = "integer", dropout = "number", activation = ACTIVATION,
                                   layer_norm_eps = "number", batch_first = "boolean", norm_first = "boolean",
                                   bias = "boolean"}, true)
  local dim_ff = opts.dim_feedforward or 2048
  local dropout = opts.dropout or 0.1
  local eps = opts.layer_norm_eps or 1e-5
  local bias = opts.bias ~= false
  local dtype = opts.dtype or "float32"
  self.d_model, self.nhead, self.dim_feedforward = d_model, nhead, dim_ff
  self.batch_first = opts.batch_first or false
  self.self_attn = MHA(d_model, nhead, {dropout = dropout, bias = bias, batch_first = self.batch_first, dtype = dtype})
  self.linear1 = Linear(d_model, dim_ff, {bias = bias, dtype = dtype})
  self.dropout = Dropout(dropout)
  self.linear2 = Linear(dim_ff, d_model, {bias = bias, dtype = dtype})
  self.norm_first = opts.norm_first or false
  self.norm1 = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})
  self.norm2 = LayerNorm(d_model, {eps = eps, bias = bias, dtype = dtype})
  self.dropout1 = Dropout(dropout)
  self.dropout2 = Dropout(dropout)
  set_activation(self, opts.activation)
  util.place(self, opts)
end

-- forward(src, {src_mask=, src_key_padding_mask=, is_causal=false}) or
-- forward(src, src_mask, src_key_padding_mask, is_causal) (PyTorch's order)
local ENCODER_CALL = {src_mask = "any", mask = "any", src_key_padding_mask = "any", is_causal = "boolean"}

function TEL:forward(src, mask, src_key_padding_mask, is_causal)
  if type(mask) == "table" and not nd.is_tensor(mask) then
    local o = options.check(("nn.TransformerEncoderLayer(%d, %d)"):format(self.d_model, self.nhead), mask, ENCODER_CALL)
    mask, src_key_padding_mask, is_causal = o.src_mask or o.mask, o.src_key_padding_mask, o.is_causal
  end
  local x = src
  if not nd.is_tensor(x) or (x:dim() ~= 2 and x:dim() ~= 3) or x:size(-1) ~= self.d_model then
    local want = self.batch_first and "(N, S, %d)" or "(S, N, %d)"
    error(("needle.nn.TransformerEncoderLayer(%d, %d): expected input of shape " .. want .. " or (S, %d), got %s"):format(
      self.d_model, self.nhead, self.d_model, self.d_model, nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  local function sa(y)
    local out = self.self_attn(y, y, y, {attn_mask = mask, key_padding_mask = src_key_padding_mask,
                                         need_weights = false, is_causal = is_causal})
    return self.dropout1(out)
  end
  local function ff(y) -- (linear1 and a named activation in one kernel: nn/linear.lua)
    return self.dropout2(self.linear2(self.dropout(linear_act(self.linear1, self.activation_name, self.activation, y))))
  end
  if self.norm_first then
    x = x + sa(self.norm1(x))
    x = x + ff(self.norm2(x))
  else
    x = self.norm1(x + sa(x))
    x = self.norm2(x + ff(x))
  end
  return x
end

function TEL:extra_repr()
  local s = ("d_model=%d, nhead=%d, dim_feedforward=%d"):format(self.d_model, self.nhead, self.dim_feedforward)
  if self.activation_name and self.activation_name ~= "relu" then
    s = s .. (", activation='%s'"):format(self.activation_name)
  end
  if self.norm_first then s = s .. ", norm_first=true" end
  if self.batch_first then s = s .. ", batch_first=true" end
  return s
end
M.TransformerEncoderLayer = TEL

-- TransformerEncoder ------------------------------------------------------------------

local TE = Module:extend("TransformerEncoder")

-- TransformerEncoder(encoder_layer, num_layers, {norm=}): num_layers deep
-- copies of encoder_layer (keys layers.0.*, layers.1.*, ...) and an optional
-- final norm module (keys norm.*)
function TE:init(encoder_layer, num_layers, opts)
  if not Module.is_module(encoder_layer) then
    error(("needle.nn.TransformerEncoder: encoder_layer must be a module, got %s"):format(type(encoder_layer)), 3)
  end
  if math.type(num_layers) ~= "integer" or num_layers < 1 then
    error(("needle.nn.TransformerEncoder: num_layers must be a positive integer, got %s"):format(tostring(num_layers)), 3)
  end
  local layers = {}
  for i = 1, num_layers do layers[i] = clone_module(encoder_layer) end
  self.layers = ModuleList(layers)
  self.num_layers = num_layers
  local norm = util.options(self, opts, {norm = "module"}).norm
  if norm ~= nil then self.norm = norm end
end

-- forward(src, {mask=, src_key_padding_mask=, is_causal=}) or
-- forward(src, mask, src_key_padding_mask, is_causal)
function TE:forward(src, mask, src_key_padding_mask, is_causal)
  if type(mask) == "table" and not nd.is_tensor(mask) then
    local o = options.check("nn.TransformerEncoder", mask, ENCODER_CALL)
    mask, src_key_padding_mask, is_causal = o.mask or o.src_mask, o.src_key_padding_mask, o.is_causal
  end
  local x = src
  for _, layer in ipairs(self.layers) do
    x = layer(x, mask, src_key_padding_mask, is_causal)
  end
  if self.norm ~= nil then x = self.norm(x) end
  return x
end
M.TransformerEncoder = TE

-- Transformer (needle's) ---------------------------------------------------------------

local Transformer = Module:extend("Transformer")
Transformer.generate_square_subsequent_mask = M.generate_square_subsequent_mask

-- One name, two models, told apart by the first argument: a number is
-- needle's decoder-only model, Transformer(embedding_size, hidden_size,
-- num_layers, opts); an options table or nothing is PyTorch's encoder-decoder
-- nn.Transformer{d_model=, nhead=, ...} (needle.nn.transformer_decoder), whose
-- arguments are keywords in PyTorch's own use.
function Transformer:new(first, ...)
  if rawequal(self, Transformer) and (first == nil or (type(first) == "table" and not Module.is_module(first))) then
    return require("needle.nn.transformer_decoder").Seq2SeqTransformer(first, ...)
  end
  return Module.new(self, first, ...)
end

-- Transformer(embedding_size, hidden_size, num_layers, {num_head=, dim_head=,
--   dropout=0, causal=true, batch_first=false, sequence_len=2048, activation="relu"}):
-- needle's decoder-only sequence model: learned positional embeddings
-- (pos_embedding, sequence_len positions) added to the input, then
-- num_layers pre-norm TransformerEncoderLayers (self-attention, causal by
-- default, and a feed-forward block of width hidden_size). Attention has
-- num_head heads of dim_head = embedding_size / num_head (PyTorch's layout
-- needs num_head * dim_head = embedding_size); num_head defaults to
-- embedding_size / dim_head when dim_head is given, else to the largest of
-- 8, 4, 2, 1 that divides embedding_size with heads of at least 8 dims.
-- forward(x (T, B, D) or (B, T, D) with batch_first, h) -> output, zeros
-- (the second result stands in for a recurrent state, as needle's).
function Transformer:init(embedding_size, hidden_size, num_layers, opts)
  for _, a in ipairs({{"embedding_size", embedding_size}, {"hidden_size", hidden_size}, {"num_layers", num_layers}}) do
    if math.type(a[2]) ~= "integer" or a[2] < 1 then
      error(("needle.nn.Transformer: %s must be a positive integer, got %s"):format(a[1], tostring(a[2])), 3)
    end
  end
  opts = util.options(self, opts, {num_head = "integer", dim_head = "integer", dropout = "number", causal = "boolean",
                                   batch_first = "boolean", sequence_len = "integer", activation = ACTIVATION}, true)
  local num_head, dim_head = opts.num_head, opts.dim_head
  if num_head == nil and dim_head ~= nil then
    num_head = embedding_size // dim_head
  elseif num_head == nil then
    for _, h in ipairs({8, 4, 2, 1}) do
      if embedding_size % h == 0 and (embedding_size // h >= 8 or h == 1) then num_head = h; break end
    end
  end
  if dim_head == nil then dim_head = embedding_size // num_head end
  if num_head < 1 or num_head * dim_head ~= embedding_size then
    error(("needle.nn.Transformer(%d, %d, %d): num_head (%s) * dim_head (%s) must equal embedding_size %d"):format(
      embedding_size, hidden_size, num_layers, tostring(num_head), tostring(dim_head), embedding_size), 3)
  end
  self.embedding_size, self.hidden_size, self.num_layers = embedding_size, hidden_size, num_layers
  self.num_head, self.dim_head = num_head, dim_head
  self.causal = opts.causal ~= false
  self.batch_first = opts.batch_first or false
  self.sequence_len = opts.sequence_len or 2048
  local dtype = opts.dtype or "float32"
  self.pos_embedding = Embedding(self.sequence_len, embedding_size, {dtype = dtype})
  local layers = {}
  for i = 1, num_layers do
    layers[i] = TEL(embedding_size, num_head, {dim_feedforward = hidden_size, dropout = opts.dropout or 0.0,
      activation = opts.activation or "relu", batch_first = true, norm_first = true, dtype = dtype})
  end
  self.layers = ModuleList(layers)
  util.place(self, opts)
end

function Transformer:forward(x, h)
  local sig = ("(%d, %d, %d)"):format(self.embedding_size, self.hidden_size, self.num_layers)
  if not nd.is_tensor(x) or x:dim() ~= 3 or x:size(3) ~= self.embedding_size then
    error(("needle.nn.Transformer%s: expected input of shape %s, got %s"):format(sig,
      self.batch_first and ("(B, T, %d)"):format(self.embedding_size) or ("(T, B, %d)"):format(self.embedding_size),
      nd.is_tensor(x) and shape_str(x) or type(x)), 2)
  end
  if not self.batch_first then x = x:transpose(1, 2) end        -- (B, T, D)
  local T = x:size(2)
  if T > self.sequence_len then
    error(("needle.nn.Transformer%s: sequence length %d exceeds sequence_len %d"):format(sig, T, self.sequence_len), 2)
  end
  x = x + self.pos_embedding(nd.arange(1, T + 1, {device = x.device}))
  for _, layer in ipairs(self.layers) do
    x = layer(x, {is_causal = self.causal})
  end
  if not self.batch_first then x = x:transpose(1, 2) end
  return x, nd.zeros_like(x)
end

function Transformer:extra_repr()
  return ("embedding_size=%d, hidden_size=%d, num_layers=%d, num_head=%d, causal=%s"):format(
    self.embedding_size, self.hidden_size, self.num_layers, self.num_head, tostring(self.causal))
end
M.Transformer = Transformer

return M
