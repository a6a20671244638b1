-- needle.zoo.gpt2: Hugging Face's GPT-2 (GPT2Model, GPT2LMHeadModel) with its
-- module structure, key names and weight layouts, a key/value cache and
-- generate(). Exposed as nd.nn.models.GPT2LMHeadModel and nd.nn.models.GPT2Model;
-- docs/models-gpt2.md is the user's guide.
--
--   local model = nd.nn.models.GPT2LMHeadModel{n_layer = 2, n_embd = 64, n_head = 4}
--   local logits, cache = model(ids, {use_cache = true})   -- ids (B, T) int64, 1-based
--   local out = model:generate(ids, {max_new_tokens = 20, do_sample = true, top_p = 0.9})
--
-- TOKEN IDS ARE 1-BASED: needle id = Hugging Face id + 1 (vocab.json's 0 is
-- needle's 1), as every index in needle (nn.Embedding, cross_entropy labels,
-- argmax). Logits are (B, T, vocab_size) and logits:argmax(-1) is the next
-- id directly, with no +1/-1 anywhere in a generation loop; a tokenizer that
-- hands out vocab.json's numbers must add 1 (needle's nd.text does).
-- position_ids are 1-based likewise (1..n_positions).
--
-- Layouts are Hugging Face's: Conv1D's weight is (in, out) and y = x @ W + b
-- (nn.Linear's is (out, in)); the state_dict keys are GPT2LMHeadModel's
-- (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...,
-- lm_head.weight, the last the same tensor as transformer.wte.weight).
local error = require("needle.errors").error -- positions at the user's line
local errors = require "needle.errors"
local nd = require "needle"
local core = require "needle.core"
local Module = require "needle.nn.module"
local init = require "needle.nn.initializers"
local options = require "needle.options"

local M = {}

local shape_str = errors.shape_str

-- finfo(dtype).min: the masked score, as HF's eager attention (finite, so a
-- row whose keys are all masked, a left-padding position, stays NaN-free)
local FMIN = {float32 = -3.4028234663852886e38, float64 = -1.7976931348623157e308,
              float16 = -65504.0, bfloat16 = -3.3895313892515355e38}

local INT_DTYPES = {int64 = true, int32 = true, uint8 = true}

-- the model's config: HF's GPT2Config fields and defaults (gpt2, 124M)
local CONFIG = {vocab_size = "integer", n_positions = "integer", n_embd = "integer", n_layer = "integer",
                n_head = "integer", n_inner = "integer", layer_norm_epsilon = "number",
                activation_function = "string", resid_pdrop = "number", embd_pdrop = "number",
                attn_pdrop = "number"}
local DEFAULTS = {vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12,
                  layer_norm_epsilon = 1e-5, activation_function = "gelu_new", resid_pdrop = 0.1,
                  embd_pdrop = 0.1, attn_pdrop = 0.1}

-- HF's ACT2FN names GPT-2 configs use; gelu_new, gelu_pytorch_tanh and
-- gelu_fast are one formula (the tanh approximation)
local function gelu_tanh(x) return nd.F.gelu(x, {approximate = "tanh"}) end
local ACTIVATIONS = {
  gelu_new = gelu_tanh, gelu_pytorch_tanh = gelu_tanh, gelu_fast = gelu_tanh,
  gelu = function(x) return nd.F.gelu(x) end,
  relu = function(x) return nd.F.relu(x) end,
  silu = function(x) return nd.F.silu(x) end, swish = function(x) return nd.F.silu(x) end,
  tanh = function(x) return x:tanh() end,
}

local function names_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ", ")
end

-- the checked config with HF's defaults filled in (a new table)
local function config_of(who, opts)
  local o = options.check(who, opts, CONFIG)
  local c = {}
  for k, v in pairs(DEFAULTS) do c[k] = v end
  for k, v in pairs(o) do c[k] = v end
  for _, k in ipairs({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"}) do
    if c[k] < 1 then errors.fail(who, "%s must be a positive integer, got %d", k, c[k]) end
  end
  if c.n_embd % c.n_head ~= 0 then
    errors.fail(who, "n_embd (%d) must be a multiple of n_head (%d)", c.n_embd, c.n_head)
  end
  c.n_inner = c.n_inner or 4 * c.n_embd
  if c.n_inner < 1 then errors.fail(who, "n_inner must be a positive integer, got %d", c.n_inner) end
  for _, k in ipairs({"resid_pdrop", "embd_pdrop", "attn_pdrop"}) do
    if not (c[k] >= 0 and c[k] <= 1) then errors.fail(who, "%s must be in [0, 1], got %s", k, tostring(c[k])) end
  end
  if not (c.layer_norm_epsilon > 0) then
    errors.fail(who, "layer_norm_epsilon must be positive, got %s", tostring(c.layer_norm_epsilon))
  end
  if not ACTIVATIONS[c.activation_function] then
    errors.fail(who, "activation_function must be one of %s, got %q", names_of(ACTIVATIONS), c.activation_function)
  end
  return c
end

-- Conv1D ------------------------------------------------------------------------

-- Conv1D(nf, nx): HF's transposed linear layer (transformers.pytorch_utils),
-- argument order (out, in) as HF's. weight is (nx, nf) = (in, out), the
-- layout of GPT-2 checkpoints, bias (nf); y = x @ weight + bias.
--
-- The parameter is a transposed view of an (out, in) row-major buffer:
-- weight:t() is then contiguous, and F.linear takes the small-batch GEMV
-- path (cpu_linear_small.c) that one generated token needs; x @ W on the
-- (in, out) layout took 4x as long for 768 -> 2304 at one row. The keys,
-- shapes and values a state_dict shows are HF's all the same. (:to() lays
-- tensors out row-major again; the models' :to puts this layout back.)
local Conv1D = Module:extend("Conv1D")

function Conv1D:init(nf, nx)
  self.nf, self.nx = nf, nx
  self.weight = Module.Parameter(core.empty({nf, nx}):t())
  self.bias = Module.Parameter(core.zeros({nf}))
  init.normal_(self.weight, 0, 0.02) -- HF's _init_weights: N(0, initializer_range)
end

function Conv1D:forward(x)
  return nd.F.linear(x, self.weight:t(), self.bias)
end

function Conv1D:extra_repr() return ("nf=%d, nx=%d"):format(self.nf, self.nx) end

-- the (out, in) row-major layout back under every Conv1D of root (after a move)
local function relayout(root)
  core.no_grad(function()
    for _, m in ipairs(root:modules()) do
      if getmetatable(m).class == Conv1D and not m.weight:t():is_contiguous() then
        m.weight:set_data_(m.weight:t():contiguous():t())
      end
    end
  end)
  return root
end

function Conv1D:to(...)
  Module.to(self, ...)
  return relayout(self)
end

M.Conv1D = Conv1D

-- the key/value cache ---------------------------------------------------------

-- Per layer a key and a value buffer (B, n_head, capacity, head_dim),
-- allocated once; a forward writes its new positions into them through a
-- narrow view + copy_ and attends over the first `length` positions (a view
-- again), so a generated token costs one position, with no concatenation.
-- Made by model:new_cache(batch_size, max_length) or by forward with
-- use_cache = true (which grows it by doubling, up to n_positions, when a
-- later forward needs more room). Used in place: a forward given it as
-- past_key_values extends it and returns it.
local Cache = {}
Cache.__index = Cache
Cache.__name = "GPT2Cache"

-- the dtype a model with weights of dtype computes in: float32 for a model
-- kept in half precision (its ops read the half weights as float32)
local function compute_dtype(dtype)
  return (dtype == "float16" or dtype == "bfloat16") and "float32" or dtype
end

local function new_cache(cfg, batch, capacity, device, dtype)
  local H, D = cfg.n_head, cfg.n_embd // cfg.n_head
  local c = setmetatable({batch_size = batch, capacity = capacity, length = 0, n_head = H, head_dim = D,
                          n_layer = cfg.n_layer, max_capacity = cfg.n_positions, device = device,
                          dtype = dtype, keys = {}, values = {}}, Cache)
  for l = 1, cfg.n_layer do
    c.keys[l] = core.zeros({batch, H, capacity, D}, {device = device, dtype = dtype})
    c.values[l] = core.zeros({batch, H, capacity, D}, {device = device, dtype = dtype})
  end
  return c
end

-- the number of positions held (HF's Cache.get_seq_length)
function Cache:get_seq_length() return self.length end

-- layer(l) -> key, value: views (B, n_head, length, head_dim) of layer l (1-based)
function Cache:layer(l)
  if math.type(l) ~= "integer" or l < 1 or l > self.n_layer then
    errors.fail("GPT2Cache.layer", "layer must be an integer in 1..%d, got %s", self.n_layer, tostring(l))
  end
  return self.keys[l]:narrow(3, 1, self.length), self.values[l]:narrow(3, 1, self.length)
end

-- reset(): empty again (the buffers are kept for the next sequence)
function Cache:reset()
  self.length = 0
  return self
end

-- room for n positions: a larger buffer holding what there is (doubling, so
-- that growing one position at a time copies O(n) in all)
function Cache:_reserve(n)
  if n <= self.capacity then return end
  local cap = math.min(self.max_capacity, math.max(n, 2 * self.capacity))
  core.no_grad(function()
    for l = 1, self.n_layer do
      for _, list in ipairs({self.keys, self.values}) do
        local old = list[l]
        local new = core.zeros({self.batch_size, self.n_head, cap, self.head_dim},
                               {device = self.device, dtype = self.dtype})
        if self.length > 0 then new:narrow(3, 1, self.length):copy_(old:narrow(3, 1, self.length)) end
        list[l] = new
      end
    end
  end)
  self.capacity = cap
end

function Cache:__tostring()
  return ("GPT2Cache(batch_size=%d, length=%d, capacity=%d, n_layer=%d)"):format(
    self.batch_size, self.length, self.capacity, self.n_layer)
end

M.Cache = Cache

-- attention, MLP, block ----------------------------------------------------------

-- GPT2Attention: c_attn (E -> 3E: query, key, value), causal multi-head
-- attention through F.scaled_dot_product_attention, c_proj (E -> E).
-- HF's `attn.bias` (the causal tril) and `attn.masked_bias` buffers are not
-- registered: the mask is built per forward (the checkpoints' copies are
-- dropped on load; docs/models-gpt2.md).
local Attention = Module:extend("GPT2Attention")

function Attention:init(cfg)
  local nn = nd.nn
  self.embed_dim, self.num_heads = cfg.n_embd, cfg.n_head
  self.head_dim = cfg.n_embd // cfg.n_head
  self.c_attn = Conv1D(3 * cfg.n_embd, cfg.n_embd)
  self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
  self.attn_dropout = nn.Dropout(cfg.attn_pdrop)
  self.resid_dropout = nn.Dropout(cfg.resid_pdrop)
end

-- x (B, T, E); ctx: {mask = additive (B|1, 1, T, S) or nil, cache =, layer =, past = P}
function Attention:forward(x, ctx)
  local B, T = x:size(1), x:size(2)
  local E, H, D = self.embed_dim, self.num_heads, self.head_dim
  local qkv = self.c_attn(x)
  local function heads(i) return qkv:narrow(3, i * E + 1, E):view({B, T, H, D}):permute({1, 3, 2, 4}) end
  local q, k, v = heads(0), heads(1), heads(2)
  local cache = ctx.cache
  if cache ~= nil then
    local l, P = ctx.layer, ctx.past
    local kb, vb = cache.keys[l], cache.values[l]
    kb:narrow(3, P + 1, T):copy_(k)
    vb:narrow(3, P + 1, T):copy_(v)
    if k.requires_grad then
      -- the buffers' copy_ is not recorded by autograd: attend over the
      -- new keys themselves so that gradients reach them (training with a cache)
      if P > 0 then k, v = core.cat({kb:narrow(3, 1, P), k}, 3), core.cat({vb:narrow(3, 1, P), v}, 3) end
    else
      k, v = kb:narrow(3, 1, P + T), vb:narrow(3, 1, P + T)
    end
  end
  local out = nd.F.scaled_dot_product_attention(q, k, v, {attn_mask = ctx.mask,
    dropout_p = self.training and self.attn_dropout.p or 0})
  out = out:permute({1, 3, 2, 4}):reshape({B, T, E})
  return self.resid_dropout(self.c_proj(out))
end

function Attention:extra_repr() return ("embed_dim=%d, num_heads=%d"):format(self.embed_dim, self.num_heads) end

local MLP = Module:extend("GPT2MLP")

function MLP:init(cfg)
  self.c_fc = Conv1D(cfg.n_inner, cfg.n_embd)
  self.c_proj = Conv1D(cfg.n_embd, cfg.n_inner)
  self.act_name = cfg.activation_function
  self.dropout = nd.nn.Dropout(cfg.resid_pdrop)
end

function MLP:forward(x)
  return self.dropout(self.c_proj(ACTIVATIONS[self.act_name](self.c_fc(x))))
end

function MLP:extra_repr() return "activation=" .. self.act_name end

-- GPT2Block: pre-LayerNorm residual block, x + attn(ln_1(x)), then + mlp(ln_2(.))
local Block = Module:extend("GPT2Block")

function Block:init(cfg)
  local nn = nd.nn
  self.ln_1 = nn.LayerNorm(cfg.n_embd, {eps = cfg.layer_norm_epsilon})
  self.attn = Attention(cfg)
  self.ln_2 = nn.LayerNorm(cfg.n_embd, {eps = cfg.layer_norm_epsilon})
  self.mlp = MLP(cfg)
end

function Block:forward(x, ctx)
  x = x + self.attn(self.ln_1(x), ctx)
  return x + self.mlp(self.ln_2(x))
end

M.GPT2Attention, M.GPT2MLP, M.GPT2Block = Attention, MLP, Block

-- checking a forward's inputs ----------------------------------------------------

-- an id tensor (int64) from a tensor or a Lua list (nested for a batch)
local function as_ids(who, what, ids, device)
  if not core.is_tensor(ids) then
    if type(ids) ~= "table" then
      errors.fail(who, "%s must be an integer tensor or a Lua list of ids, got %s", what, options.got(ids))
    end
    local ok, t = pcall(core.tensor, ids, {dtype = "int64"})
    if not ok then errors.fail(who, "%s: cannot make an integer tensor of the list (%s)", what, tostring(t)) end
    ids = t
  elseif not INT_DTYPES[ids.dtype] then
    errors.fail(who, "%s must be integers (int64, int32 or uint8), got %s of shape %s", what, ids.dtype,
                shape_str(ids))
  end
  if ids.device ~= device then ids = ids:to(device) end
  if ids.dtype ~= "int64" then ids = ids:to("int64") end
  return ids
end

-- every value of t within lo..hi, or an error naming the first one outside
local function check_range(who, what, t, lo, hi, hint)
  if t:numel() == 0 then return end
  local mn, mx = t:min():item(), t:max():item()
  if mn < lo or mx > hi then
    errors.fail(who, "%s %d is out of range (expected %d..%d%s)", what, mn < lo and mn or mx, lo, hi, hint or "")
  end
end

local ID_HINT = "; needle's token ids are 1-based: Hugging Face's id + 1"

-- the additive mask (B|1, 1, T, S) for T new positions after P cached ones:
-- key j is visible to query i when j <= P + i, and (attention_mask) when its
-- mask value is 1; finfo.min elsewhere. nil when nothing is masked (one new
-- position and no attention_mask).
local function build_mask(T, P, attention_mask, dtype, device)
  local S = P + T
  local mn = FMIN[dtype] or FMIN.float32
  local o = {dtype = dtype, device = device}
  local mask
  if T > 1 then
    local i = core.arange(P + 1, P + T + 1, {device = device}):view({T, 1})
    local j = core.arange(1, S + 1, {device = device}):view({1, S})
    mask = core.where(j:gt(i), core.tensor(mn, o), core.tensor(0.0, o)):view({1, 1, T, S})
  end
  if attention_mask ~= nil then
    local B = attention_mask:size(1)
    local pad = ((1 - attention_mask:to(dtype)) * mn):view({B, 1, 1, S})
    mask = mask and (mask + pad) or pad
  end
  return mask
end

-- GPT2Model ------------------------------------------------------------------------

-- GPT2Model(config): wte, wpe, drop, h (ModuleList of GPT2Block), ln_f.
-- forward(input_ids, {past_key_values=, use_cache=, attention_mask=,
-- position_ids=}) -> last_hidden_state (B, T, n_embd), presents (the cache, or nil)
local GPT2Model = Module:extend("GPT2Model")

function GPT2Model:init(config)
  local nn = nd.nn
  local cfg = config_of("nn.models." .. self.__name, config)
  self.config = cfg
  self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
  self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
  self.drop = nn.Dropout(cfg.embd_pdrop)
  local blocks = {}
  for i = 1, cfg.n_layer do blocks[i] = Block(cfg) end
  self.h = nn.ModuleList(blocks)
  self.ln_f = nn.LayerNorm(cfg.n_embd, {eps = cfg.layer_norm_epsilon})
  -- HF's _init_weights: embeddings N(0, 0.02); each residual projection
  -- (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer))
  -- (scaling the N(0, 1) and N(0, 0.02) draws already made: drawing 124M
  -- normals again would double the constructor's time)
  local scale = 1 / math.sqrt(2 * cfg.n_layer)
  core.no_grad(function()
    self.wte.weight:mul_(0.02)
    self.wpe.weight:mul_(0.02)
    for _, b in ipairs(blocks) do
      b.attn.c_proj.weight:mul_(scale)
      b.mlp.c_proj.weight:mul_(scale)
    end
  end)
end

local FORWARD = {past_key_values = "table", use_cache = "boolean", attention_mask = "tensor|table",
                 position_ids = "tensor|table"}

-- the checked forward: ids (B, T) int64 on the model's device, plus ctx
-- fields; returns hidden (B, T, E), the cache (or nil)
function GPT2Model:_run(ids, cache, attention_mask, position_ids)
  local cfg = self.config
  local B, T = ids:size(1), ids:size(2)
  local dev, dtype = self.wte.weight.device, compute_dtype(self.wte.weight.dtype)
  local P = cache and cache.length or 0
  if position_ids == nil then
    position_ids = core.arange(P + 1, P + T + 1, {dtype = "int64", device = dev}):view({1, T})
  end
  local x = nd.F.embedding(ids, self.wte.weight) + nd.F.embedding(position_ids, self.wpe.weight)
  x = self.drop(x)
  if cache then cache:_reserve(P + T) end
  local ctx = {mask = build_mask(T, P, attention_mask, dtype, dev), cache = cache, past = P}
  for l, block in ipairs(self.h:totable()) do
    ctx.layer = l
    x = block(x, ctx)
  end
  if cache then cache.length = P + T end
  return self.ln_f(x), cache
end

-- checks what forward was given; returns the _run arguments and whether the
-- ids were one sequence (1-D)
function GPT2Model:_inputs(who, input_ids, opts)
  local cfg = self.config
  opts = options.check(who, opts, FORWARD)
  local dev = self.wte.weight.device
  local ids = as_ids(who, "input_ids", input_ids, dev)
  local flat = ids:dim() == 1
  if flat then ids = ids:view({1, -1}) end
  if ids:dim() ~= 2 then errors.fail(who, "input_ids must be (B, T) or (T), got shape %s", shape_str(ids)) end
  local B, T = ids:size(1), ids:size(2)
  if T == 0 then errors.fail(who, "input_ids has no positions (shape %s)", shape_str(ids)) end
  check_range(who, "token id", ids, 1, cfg.vocab_size, ID_HINT)
  local cache = opts.past_key_values
  if cache ~= nil then
    if getmetatable(cache) ~= Cache then
      errors.fail(who, "past_key_values must be a cache from model:new_cache or a forward with use_cache = true, " ..
                  "got %s", options.got(cache))
    end
    if cache.batch_size ~= B or cache.n_layer ~= cfg.n_layer or cache.n_head ~= cfg.n_head
       or cache.head_dim ~= cfg.n_embd // cfg.n_head then
      errors.fail(who, "past_key_values (%s) does not fit this model and input_ids %s (n_layer %d, n_head %d)",
                  tostring(cache), shape_str(ids), cfg.n_layer, cfg.n_head)
    end
    if cache.device ~= dev or cache.dtype ~= compute_dtype(self.wte.weight.dtype) then
      errors.fail(who, "past_key_values holds %s on %s, the model computes in %s on %s (make the cache after " ..
                  "moving the model)", cache.dtype, cache.device, compute_dtype(self.wte.weight.dtype), dev)
    end
  elseif opts.use_cache then
    cache = new_cache(cfg, B, T, dev, compute_dtype(self.wte.weight.dtype))
  end
  local P = cache and cache.length or 0
  if P + T > cfg.n_positions then
    errors.fail(who, "%d positions (%d cached + %d new) exceed n_positions %d", P + T, P, T, cfg.n_positions)
  end
  local mask = opts.attention_mask
  if mask ~= nil then
    if not core.is_tensor(mask) then mask = core.tensor(mask) end
    if mask:dim() == 1 and flat then mask = mask:view({1, -1}) end
    if mask:dim() ~= 2 or mask:size(1) ~= B or mask:size(2) ~= P + T then
      errors.fail(who, "attention_mask must be (B, past + T) = {%d,%d} (1: attend, 0: padding), got shape %s",
                  B, P + T, shape_str(mask))
    end
    if mask.dtype == "bool" then mask = mask:to("int64") end
    if mask.device ~= dev then mask = mask:to(dev) end
  end
  local pos = opts.position_ids
  if pos ~= nil then
    pos = as_ids(who, "position_ids", pos, dev)
    if pos:dim() == 1 and flat then pos = pos:view({1, -1}) end
    if pos:dim() ~= 2 or (pos:size(1) ~= B and pos:size(1) ~= 1) or pos:size(2) ~= T then
      errors.fail(who, "position_ids must be (B, T) or (1, T) with T = %d, got shape %s", T, shape_str(pos))
    end
    check_range(who, "position id", pos, 1, cfg.n_positions, "; position ids are 1-based: Hugging Face's + 1")
  end
  return ids, cache, mask, pos, flat
end

function GPT2Model:forward(input_ids, opts)
  local who = "nn.models." .. self.__name
  local ids, cache, mask, pos, flat = self:_inputs(who, input_ids, opts)
  local h, presents = self:_run(ids, cache, mask, pos)
  if flat then h = h:view({h:size(2), h:size(3)}) end
  return h, presents
end

function GPT2Model:new_cache(batch_size, max_length)
  local who = "nn.models." .. self.__name .. ".new_cache"
  if math.type(batch_size) ~= "integer" or batch_size < 1 then
    errors.fail(who, "batch_size must be a positive integer, got %s", options.got(batch_size))
  end
  max_length = max_length or self.config.n_positions
  if math.type(max_length) ~= "integer" or max_length < 1 or max_length > self.config.n_positions then
    errors.fail(who, "max_length must be an integer in 1..%d (n_positions), got %s", self.config.n_positions,
                options.got(max_length))
  end
  return new_cache(self.config, batch_size, max_length, self.wte.weight.device,
                   compute_dtype(self.wte.weight.dtype))
end

function GPT2Model:to(...)
  Module.to(self, ...)
  return relayout(self)
end

function GPT2Model:extra_repr()
  local c = self.config
  return ("vocab_size=%d, n_positions=%d, n_embd=%d, n_layer=%d, n_head=%d"):format(
    c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head)
end

-- Hugging Face's key variants ---------------------------------------------------------

-- hf_state_dict(sd, model) -> a new table with GPT2LMHeadModel's keys:
-- bare GPT2Model keys (wte.weight, h.0..., the original gpt2 checkpoint's)
-- get the "transformer." prefix; the attn.bias / attn.masked_bias buffers
-- are dropped (needle builds the causal mask itself); lm_head.weight is
-- dropped when it equals transformer.wte.weight (tied: one tensor), an error
-- when it differs. With prefix = "" the result has GPT2Model's keys.
function M.hf_state_dict(sd, prefix, who)
  prefix = prefix or "transformer."
  who = who or "convert.model('gpt2')"
  local bare = sd["wte.weight"] ~= nil and sd["transformer.wte.weight"] == nil
  local out = {}
  for k, v in pairs(sd) do
    if type(k) == "string" and not k:match("%.attn%.bias$") and not k:match("%.attn%.masked_bias$") then
      local key = k
      if bare and k ~= "lm_head.weight" then key = "transformer." .. k end
      if prefix == "" then key = key:gsub("^transformer%.", "") end
      out[key] = v
    end
  end
  local lm, wte = out["lm_head.weight"], out[prefix .. "wte.weight"]
  if lm ~= nil and core.is_tensor(lm) and core.is_tensor(wte) then
    -- (elementwise in wte's dtype: no float64 copies of two 38M-element tensors)
    local same = lm == wte or (shape_str(lm) == shape_str(wte) and core.no_grad(function()
      return lm:to({dtype = wte.dtype, device = wte.device}):eq(wte):all():item()
    end))
    if not same then
      errors.fail(who, "lm_head.weight %s differs from %swte.weight %s: GPT-2's output layer is tied to the " ..
                  "token embedding (tie_word_embeddings), and needle's GPT2LMHeadModel has one tensor for both",
                  shape_str(lm), prefix, shape_str(wte))
    end
    out["lm_head.weight"] = nil
  end
  if prefix == "" then out["lm_head.weight"] = nil end
  return out
end

function GPT2Model:load_state_dict(sd, opts)
  return Module.load_state_dict(self, M.hf_state_dict(sd, "", "nn.models.GPT2Model.load_state_dict"), opts)
end

M.GPT2Model = GPT2Model

-- GPT2LMHeadModel -------------------------------------------------------------------

-- GPT2LMHeadModel(config): transformer (GPT2Model) and lm_head (Linear(n_embd,
-- vocab_size, bias = false)) whose weight is transformer.wte.weight.
-- forward(input_ids, opts) -> logits (B, T, vocab_size), presents
local GPT2LMHeadModel = Module:extend("GPT2LMHeadModel")

function GPT2LMHeadModel:init(config)
  -- (checked under this class's name: errors read nn.models.GPT2LMHeadModel)
  local cfg = config_of("nn.models." .. self.__name, config)
  self.transformer = GPT2Model(cfg)
  self.config = self.transformer.config
  self.lm_head = nd.nn.Linear(cfg.n_embd, cfg.vocab_size, {bias = false})
  self.lm_head.weight = self.transformer.wte.weight -- tied, as HF's tie_word_embeddings
end

function GPT2LMHeadModel:forward(input_ids, opts)
  local who = "nn.models." .. self.__name
  local ids, cache, mask, pos, flat = self.transformer:_inputs(who, input_ids, opts)
  local h, presents = self.transformer:_run(ids, cache, mask, pos)
  local logits = self.lm_head(h)
  if flat then logits = logits:view({logits:size(2), logits:size(3)}) end
  return logits, presents
end

-- new_cache(batch_size, max_length = n_positions): an empty key/value cache
-- on the model's device, for past_key_values
function GPT2LMHeadModel:new_cache(batch_size, max_length)
  return self.transformer:new_cache(batch_size, max_length)
end

-- the keys of HF's GPT2LMHeadModel.state_dict(): lm_head.weight included
-- (the tied tensor under its second name, as PyTorch lists it)
function GPT2LMHeadModel:state_dict()
  local sd = Module.state_dict(self)
  sd["lm_head.weight"] = self.lm_head.weight:detach()
  return sd
end

-- load_state_dict(sd, {strict = true}): HF's layouts as hf_state_dict takes them
function GPT2LMHeadModel:load_state_dict(sd, opts)
  return Module.load_state_dict(self, M.hf_state_dict(sd, "transformer.", "nn.models.GPT2LMHeadModel.load_state_dict"),
                                opts)
end

function GPT2LMHeadModel:to(...)
  Module.to(self, ...)
  return relayout(self)
end

function GPT2LMHeadModel:generate(input_ids, opts, ...)
  return require("needle.zoo.gpt2_generate").generate(self, input_ids, opts, ...)
end

M.GPT2LMHeadModel = GPT2LMHeadModel

return M
