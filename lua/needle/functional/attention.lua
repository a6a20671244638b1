-- needle.functional.attention: the sequence functions of nd.F (merged into it
-- by needle.functional):
--
--   F.scaled_dot_product_attention(q, k, v, {attn_mask=, dropout_p=, is_causal=, scale=})
--   F.ctc_loss(log_probs, targets, input_lengths, target_lengths, {blank=, reduction=, zero_infinity=})
--
-- Both are compositions of differentiable ops, so gradients (and OpenCL)
-- come from the ops; attention takes a fused kernel with its own backward
-- where one applies (fused_applies). The attention core (`attend`) is shared with
-- nn.MultiheadAttention, which also needs the weights; it is reached as
-- require("needle.functional.attention").attend through the table's
-- metatable, so that the merge into nd.F (pairs) leaves it out.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local shape_str = errors.shape_str

local M = {}

-- q (..., L, E) scaled, times k^T, plus an additive mask, softmax over the
-- keys, dropout, times v: returns out (..., L, Ev) and the weights (..., L, S).
-- q is scaled before the product (L E multiplications instead of L S).
local function attend(q, k, v, mask, dropout_p, scale)
  local scores = (q * scale):matmul(k:transpose(-2, -1))
  if mask ~= nil then scores = scores + mask end
  local attn = core.softmax(scores, -1)
  -- (nd.F is loaded by the time anything attends; this file is part of it)
  if dropout_p > 0 then attn = require("needle.functional").dropout(attn, dropout_p, true) end
  return attn:matmul(v), attn
end

-- the (L, S) additive causal mask: -inf where key j comes after query i (the
-- top-left aligned lower triangle attends, as PyTorch's is_causal)
local function causal_mask(L, S, dtype, device)
  local i = core.arange(1, L + 1, {device = device}):view({L, 1})
  local j = core.arange(1, S + 1, {device = device}):view({1, S})
  local o = {dtype = dtype, device = device}
  return core.where(j:gt(i), core.tensor(-math.huge, o), core.tensor(0.0, o))
end

-- a bool mask (true: attend, as PyTorch's scaled_dot_product_attention) as an
-- additive one; a float mask as it is
local function additive_attend_mask(mask, dtype)
  local o = {dtype = dtype, device = mask.device}
  return core.where(mask, core.tensor(0.0, o), core.tensor(-math.huge, o))
end

local FLOATS = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

-- true when shape a broadcasts to shape b (right-aligned, each dim equal or 1)
local function broadcasts_to(a, b)
  if #a > #b then return false end
  for i = 1, #a do
    local da, db = a[#a + 1 - i], b[#b + 1 - i]
    if da ~= db and da ~= 1 then return false end
  end
  return true
end

-- the broadcast of the batch dims (all but the last two) of a and b, or nil
local function batch_broadcast(a, b)
  local na, nb = #a - 2, #b - 2
  local out = {}
  for i = 1, math.max(na, nb) do
    local da = i <= na and a[na + 1 - i] or 1
    local db = i <= nb and b[nb + 1 - i] or 1
    if da ~= db and da ~= 1 and db ~= 1 then return nil end
    out[math.max(na, nb) + 1 - i] = math.max(da, db)
  end
  return out
end

local function numel(dims)
  local n = 1
  for _, d in ipairs(dims) do n = n * d end
  return n
end

-- batch dims followed by the matrix dims r, c (a new table)
local function with_mats(batch, r, c)
  local s = {}
  for i, d in ipairs(batch) do s[i] = d end
  s[#s + 1], s[#s + 2] = r, c
  return s
end

local SDPA = {attn_mask = "tensor", dropout_p = "number", is_causal = "boolean", scale = "number"}

-- The fused kernel (core._attention: the scores of a block of queries made,
-- masked, softmaxed, dropped out and multiplied into v in cache, no (..., L, S)
-- tensor; its backward makes them again from each row's log-sum-exp) when the
-- device has it (the CPU, float32), for at most two batch dims (the kernel's
-- (B, H)). It draws the dropout from the counters F.dropout would take, so
-- both paths keep the same weights (an nd.compile replay takes fresh ones,
-- as the rand op's replays do). A mask that requires grad composes the ops
-- (the kernel gives it none).
local function fused_applies(q, k, v, mask, p, batch)
  if q.device ~= "cpu" or q.dtype ~= "float32" or #batch > 2 or p >= 1 then return false end
  if mask ~= nil and (mask.device ~= q.device or (mask.dtype ~= "bool" and mask.dtype ~= q.dtype)) then
    return false -- (the checks below name the problem)
  end
  return not (mask ~= nil and mask.requires_grad and core.is_grad_enabled())
end

-- t (batch..., r, c) as the kernel's (B, H, r, c): batch expanded to the
-- broadcast batch dims, then 1s in front (views: the kernel copies what is
-- not contiguous, and reads the mask through its strides)
local function as_bh(t, batch, r, c)
  local shape = with_mats(batch, r, c)
  t = t:expand(shape)
  while t:dim() < 4 do t = t:unsqueeze(1) end
  return t
end

local function attend_fused(q, k, v, mask, causal, scale, batch, p)
  local L, E, S, Ev = q:size(-2), q:size(-1), k:size(-2), v:size(-1)
  local out = core._attention(as_bh(q, batch, L, E), as_bh(k, batch, S, E), as_bh(v, batch, S, Ev),
                              mask ~= nil and as_bh(mask, batch, L, S) or nil, scale, causal == true, p)
  return out:view(with_mats(batch, L, Ev))
end

-- scaled_dot_product_attention(q (..., L, E), k (..., S, E), v (..., S, Ev),
-- {attn_mask=, dropout_p = 0, is_causal = false, scale = 1/sqrt(E)}) ->
-- (..., L, Ev): softmax(q k^T scale + mask) v, PyTorch's. A bool attn_mask is
-- true where attention is allowed; a float one is added to the scores; both
-- broadcast to (..., L, S). is_causal masks key j > query i and excludes
-- attn_mask. Dropout (on the weights) applies whenever dropout_p > 0, as
-- PyTorch's function (pass 0 in evaluation).
function M.scaled_dot_product_attention(q, k, v, opts, ...)
  local fail = errors.failer("scaled_dot_product_attention")
  for i = 1, select("#", ...) do
    if select(i, ...) ~= nil then
      fail("takes scaled_dot_product_attention(query, key, value[, {attn_mask=, dropout_p=, is_causal=, scale=}]) " ..
           "only, got an extra argument #%d: %s", 4 + i, options.got((select(i, ...))))
    end
  end
  for _, a in ipairs({{"query", q}, {"key", k}, {"value", v}}) do
    if not core.is_tensor(a[2]) then fail("%s must be a tensor, got %s", a[1], options.got(a[2])) end
    if a[2]:dim() < 2 then fail("%s must have at least 2 dims (..., L, E), got %s", a[1], shape_str(a[2])) end
    if not FLOATS[a[2].dtype] then fail("%s must be floating point, got %s", a[1], a[2].dtype) end
  end
  opts = options.check("scaled_dot_product_attention", opts, SDPA)
  if q.dtype ~= k.dtype or q.dtype ~= v.dtype then
    fail("query, key and value must have one dtype, got %s, %s and %s", q.dtype, k.dtype, v.dtype)
  end
  if q.device ~= k.device or q.device ~= v.device then
    fail("query, key and value must be on one device, got %s, %s and %s", q.device, k.device, v.device)
  end
  local L, E, S = q:size(-2), q:size(-1), k:size(-2)
  if k:size(-1) ~= E or v:size(-2) ~= S then
    fail("query %s, key %s and value %s do not fit (..., L, E), (..., S, E), (..., S, Ev)",
         shape_str(q), shape_str(k), shape_str(v))
  end
  local batch = batch_broadcast(q.shape, k.shape)
  if batch ~= nil then batch = batch_broadcast(with_mats(batch, 1, 1), v.shape) end
  if batch == nil then
    fail("the batch dims of query %s, key %s and value %s do not broadcast", shape_str(q), shape_str(k), shape_str(v))
  end
  local p = opts.dropout_p or 0
  if not (p >= 0 and p <= 1) then fail("dropout_p must be in [0, 1], got %s", tostring(p)) end
  local scale = opts.scale or 1 / math.sqrt(E)
  if scale ~= scale or scale == math.huge or scale == -math.huge then
    fail("scale must be a finite number, got %s", tostring(scale))
  end
  local mask = opts.attn_mask
  if mask ~= nil and opts.is_causal then
    fail("attn_mask and is_causal = true exclude each other (is_causal builds the causal mask)")
  end
  local fused = fused_applies(q, k, v, mask, p, batch)
  if fused and p > 0 and numel(batch_broadcast(q.shape, k.shape)) ~= numel(batch) then
    -- v broadcasts the batch further: the composed ops draw one dropout mask
    -- for q and k's batch and share it across v's, the kernel one per product
    fused = false
  end
  if mask ~= nil then
    local scores = with_mats(batch, L, S)
    if mask.dtype ~= "bool" and mask.dtype ~= q.dtype then
      fail("attn_mask must be bool or %s (the query's dtype), got %s", q.dtype, mask.dtype)
    end
    if not broadcasts_to(mask.shape, scores) then
      fail("attn_mask %s does not broadcast to the scores' shape %s", shape_str(mask), shape_str(scores))
    end
    if mask.device ~= q.device then
      fail("attn_mask is on %s, query on %s", mask.device, q.device)
    end
    if mask.dtype == "bool" then mask = additive_attend_mask(mask, q.dtype) end
  elseif opts.is_causal and not fused then
    mask = causal_mask(L, S, q.dtype, q.device)
  end
  if fused then return attend_fused(q, k, v, mask, opts.is_causal, scale, batch, p) end
  return (attend(q, k, v, mask, p, scale))
end

-- CTC -------------------------------------------------------------------------

-- log(exp(a) + exp(b) + exp(c)) elementwise, -inf where all three are -inf,
-- with a gradient that is 0 there instead of 0/0 (nd.logsumexp's backward
-- reads exp(x - lse), NaN for an all -inf row): the max is a constant of the
-- graph (the value does not depend on it), dead cells take log(1) on a branch
-- that where() cuts off.
local function logaddexp3(a, b, c)
  local m = core.no_grad(function() return a:maximum(b):maximum(c) end)
  local alive = m:gt(-math.huge)
  local zero = core.zeros_like(m)
  local shift = core.where(alive, m, zero)
  local s = (a - shift):exp() + (b - shift):exp() + (c - shift):exp()
  local lse = core.where(alive, s, core.ones_like(s)):log() + shift
  return core.where(alive, lse, core.full_like(m, -math.huge))
end

-- lengths (a tensor or a table of n integers, or a number when n is 1) as
-- an int64 tensor on device, and as a Lua list (the host needs the values
-- to check them and to size the recursion)
local function lengths_of(fail, x, what, n, device)
  local ok, t = pcall(core._ints, x, "ctc_loss", what, device)
  if not ok then errors.raise(t) end
  if t:numel() ~= n or t:dim() > 1 then
    fail("%s must have %d values (one per sequence), got shape %s", what, n, shape_str(t))
  end
  t = t:reshape({n}):to({dtype = "int64", device = device})
  return t, t:to("cpu"):totable()
end

local REDUCTIONS = {mean = true, sum = true, none = true}
local CTC = {blank = "integer", reduction = "string", zero_infinity = "boolean"}

-- ctc_loss(log_probs (T, N, C) or (T, C), targets (N, S) padded or the
-- sum(target_lengths) labels concatenated (1-D), input_lengths (N),
-- target_lengths (N), {blank = 1, reduction = "mean", zero_infinity = false})
-- -> the negative log-likelihood of each target under the CTC alignments
-- (PyTorch's). Classes are 1..C; blank defaults to 1, the first class
-- (PyTorch's blank=0), and no target may be the blank. reduction "mean"
-- divides each loss by its target length (at least 1), then averages over the
-- batch. zero_infinity: an impossible alignment (infinite loss) counts 0.
-- Computed by the log-space alpha recursion, one step of tensor ops per time
-- step for the whole batch; the gradient is the exact derivative with respect
-- to log_probs (PyTorch's own backward assumes log_probs came out of a
-- log_softmax; through a log_softmax the two agree).
function M.ctc_loss(log_probs, targets, input_lengths, target_lengths, opts)
  local fail = errors.failer("ctc_loss")
  if not core.is_tensor(log_probs) then fail("log_probs must be a tensor, got %s", options.got(log_probs)) end
  opts = options.check("ctc_loss", opts, CTC)
  if log_probs:dim() ~= 3 and log_probs:dim() ~= 2 then
    fail("expected log_probs of shape (T, N, C) or (T, C), got %s", shape_str(log_probs))
  end
  if not FLOATS[log_probs.dtype] then fail("log_probs must be floating point, got %s", log_probs.dtype) end
  local reduction = opts.reduction or "mean"
  if not REDUCTIONS[reduction] then fail("reduction must be 'mean', 'sum' or 'none', got %s", reduction) end
  local unbatched = log_probs:dim() == 2
  local lp = unbatched and log_probs:unsqueeze(2) or log_probs
  local T, N, C = lp:size(1), lp:size(2), lp:size(3)
  local blank = opts.blank or 1
  if blank < 1 or blank > C then fail("blank must be a class index in 1..%d, got %d", C, blank) end
  local dev = lp.device

  local in_len, in_host = lengths_of(fail, input_lengths, "input_lengths", N, dev)
  local tg_len, tg_host = lengths_of(fail, target_lengths, "target_lengths", N, dev)
  local S, total = 0, 0
  for n = 1, N do
    if in_host[n] < 0 or in_host[n] > T then
      fail("input_lengths[%d] = %d is out of range for %d time steps (expected 0..%d)", n, in_host[n], T, T)
    end
    if tg_host[n] < 0 then fail("target_lengths[%d] = %d is negative", n, tg_host[n]) end
    S, total = math.max(S, tg_host[n]), total + tg_host[n]
  end

  -- targets as a padded (N, S) int64 tensor on dev
  local ok, tg = pcall(core._ints, targets, "ctc_loss", "targets", dev)
  if not ok then errors.raise(tg) end
  tg = tg:to({dtype = "int64", device = dev})
  local padded
  if unbatched and tg:dim() == 1 then tg = tg:unsqueeze(1) end
  if tg:dim() == 2 then
    if tg:size(1) ~= N or tg:size(2) < S then
      fail("padded targets must have shape (%d, S) with S >= %d (the longest target), got %s", N, S, shape_str(tg))
    end
    padded = tg:narrow(2, 1, S)
  elseif tg:dim() == 1 then
    if tg:numel() ~= total then
      fail("concatenated targets must hold sum(target_lengths) = %d labels, got %s", total, shape_str(tg))
    end
    -- row n takes labels offset_n + 1 .. offset_n + len_n; the rest of the row
    -- is padding (clamped to a valid index, masked below)
    local offsets = tg_len:cumsum(1) - tg_len
    local j = core.arange(0, S, {dtype = "int64", device = dev}):view({1, S})
    local idx = (offsets:view({N, 1}) + j):clamp(0, math.max(total - 1, 0)) + 1
    padded = total == 0 and core.zeros({N, S}, {dtype = "int64", device = dev})
             or tg:index_select(1, idx:reshape({-1})):view({N, S})
  else
    fail("targets must be (N, S) padded or 1-D concatenated, got %s", shape_str(tg))
  end
  -- the labels within each target's length must be classes other than blank
  local valid = core.arange(1, S + 1, {dtype = "int64", device = dev}):view({1, S}):le(tg_len:view({N, 1}))
  if N * S > 0 then
    local bad = valid * (padded:lt(1) + padded:gt(C) + padded:eq(blank))
    if bad:sum():item() > 0 then -- (only an error reads the labels themselves back)
      local flags, values = bad:reshape({-1}):to("cpu"):totable(), padded:reshape({-1}):to("cpu"):totable()
      for i, b in ipairs(flags) do
        if b then
          fail("target %d of sequence %d is %d: expected a class in 1..%d other than blank (%d)",
               (i - 1) % S + 1, (i - 1) // S + 1, values[i], C, blank)
        end
      end
    end
  end
  padded = core.where(valid, padded, core.full_like(padded, blank))

  -- the extended labels: blank, l1, blank, l2, ..., blank (N, 2S + 1)
  local K = 2 * S + 1
  local blanks = core.full({N, S}, blank, {dtype = "int64", device = dev})
  local ext = core.cat({core.stack({blanks, padded}, 3):view({N, 2 * S}),
                       core.full({N, 1}, blank, {dtype = "int64", device = dev})}, 2)
  -- a skip from s - 2 to s is allowed onto a label that differs from the one
  -- two back (never onto a blank)
  local skip = core.zeros({N, K}, {dtype = "bool", device = dev})
  if S > 1 then
    local prev = ext:narrow(2, 1, K - 2)
    local cur = ext:narrow(2, 3, K - 2)
    skip = core.cat({core.zeros({N, 2}, {dtype = "bool", device = dev}), cur:ne(blank) * cur:ne(prev)}, 2)
  end
  -- the log-probabilities of the extended labels at every step: (T, N, K)
  local lp_ext = lp:gather(3, ext:view({1, N, K}):expand({T, N, K}))

  local o = {dtype = lp.dtype, device = dev}
  local neg = core.full({N, 1}, -math.huge, o)
  local neg2 = core.full({N, 2}, -math.huge, o)
  local dead = core.full({N, K}, -math.huge, o)
  -- alpha before the first step: all mass on the leading blank's left, so
  -- that step 1 gives alpha_1(1) = lp(blank), alpha_1(2) = lp(l1)
  local alpha = core.cat({core.zeros({N, 1}, o), core.full({N, K - 1}, -math.huge, o)}, 2)
  -- active[t][n]: step t is within sequence n's input length
  local active = core.arange(1, T + 1, {dtype = "int64", device = dev}):view({T, 1}):le(in_len:view({1, N}))
  for t = 1, T do
    local s1 = core.cat({neg, alpha:narrow(2, 1, K - 1)}, 2)
    local s2 = K > 2 and core.where(skip, core.cat({neg2, alpha:narrow(2, 1, K - 2)}, 2), dead) or dead
    local nxt = logaddexp3(alpha, s1, s2) + lp_ext[t]
    -- sequences already past their length keep their last alpha
    alpha = core.where(active[t]:view({N, 1}), nxt, alpha)
  end
  -- the likelihood ends on the last label or the trailing blank: positions
  -- 2 len + 1 and 2 len (the latter absent for an empty target)
  local last = (tg_len * 2 + 1):view({N, 1})
  local a_end = alpha:gather(2, last)
  local a_lab = alpha:gather(2, (last - 1):clamp(1, K))
  a_lab = core.where(tg_len:gt(0):view({N, 1}), a_lab, neg)
  local loss = -logaddexp3(a_end, a_lab, neg):view({N})
  if opts.zero_infinity then
    loss = core.where(loss:eq(math.huge), core.zeros_like(loss), loss)
  end
  if reduction == "none" then return unbatched and loss:view({}) or loss end
  if reduction == "sum" then return loss:sum() end
  return (loss / tg_len:clamp(1, nil):to(lp.dtype)):mean()
end

-- attend's choice for a caller that may not need the weights
-- (nn.MultiheadAttention with need_weights = false): the fused kernel when it
-- applies (q, k, v (N, H, T, D), mask broadcast to (N, H, L, S) or nil), else
-- attend. Returns out and, from attend only, the weights.
local function attend_maybe_fused(q, k, v, mask, dropout_p, scale, want_weights)
  local batch = {q:size(1), q:size(2)}
  if not want_weights and q:dim() == 4 and fused_applies(q, k, v, mask, dropout_p, batch) then
    return attend_fused(q, k, v, mask, false, scale, batch, dropout_p), nil
  end
  return attend(q, k, v, mask, dropout_p, scale)
end

return setmetatable(M, {__index = {attend = attend, attend_maybe_fused = attend_maybe_fused,
                                   causal_mask = causal_mask}})
