-- needle.zoo.gpt2_generate: GPT2LMHeadModel:generate and the logits warpers
-- it samples through (internal; docs/models-gpt2.md documents the method).
--
--   model:generate(input_ids, {max_new_tokens = 20, do_sample = false, temperature = 1,
--                  top_k = 0, top_p = 1, eos_token_id =, pad_token_id =, seed =,
--                  use_cache = true, attention_mask =, num_beams = 1, length_penalty = 1,
--                  early_stopping = false, num_return_sequences = 1}) -> ids (B * num_return_sequences, T + n)
--
-- Ids are 1-based (Hugging Face's + 1), the prompt's and the result's alike.
-- With the cache (the default) the prompt runs once, filling per-layer key
-- and value buffers sized T + max_new_tokens, and every new token runs the
-- model on that one position; use_cache = false re-runs the whole sequence
-- for every token (the reference the spec compares the cache with).
-- num_beams > 1 is Hugging Face's beam search (beam_search below), and
-- with do_sample its beam sampling.
-- Greedy decoding takes the argmax of the last position's logits; sampling
-- applies HF's warpers in HF's order (temperature, top-k, top-p) and draws
-- with nd.multinomial, from needle's random stream (seed calls
-- nd.manual_seed(seed) first). The token is chosen on the cpu (the logits of
-- one position come back from a device anyway, to test for eos), so a seed
-- draws the same tokens on every device.
local core = require "needle.core"
local nd = require "needle"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local GENERATE = {max_new_tokens = "integer", do_sample = "boolean", temperature = "number", top_k = "integer",
                  top_p = "number", eos_token_id = "integer", pad_token_id = "integer", seed = "integer",
                  use_cache = "boolean", attention_mask = "tensor|table", num_beams = "integer",
                  length_penalty = "number", early_stopping = "boolean", num_return_sequences = "integer"}

-- warp(scores (B, V), {temperature = 1, top_k = 0, top_p = 1}[, min_keep = 1])
-- -> scores with -inf at the tokens sampling must not pick, as HF's
-- TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper applied in
-- that order: top-k keeps the scores at least the k-th largest (ties
-- included; k at least min_keep); top-p keeps the smallest set of the most
-- likely tokens whose probabilities sum to more than 1 - top_p... as HF:
-- sorted ascending, a token goes when the cumulative probability up to it
-- is <= 1 - top_p, and the likeliest min_keep always stay (HF's
-- min_tokens_to_keep: 2 with beams, 1 without).
function M.warp(scores, o, min_keep)
  local t, k, p = o.temperature or 1, o.top_k or 0, o.top_p or 1
  min_keep = min_keep or 1
  local B, V = scores:size(1), scores:size(2)
  if t ~= 1 then
    local scaled = scores / t
    -- a tiny temperature overflows: scores / t is +-inf (softmax: NaN) where
    -- the scores are finite. Its limit is greedy: such a row keeps its
    -- largest scores (0, ties all) and nothing else (-inf)
    local top = scores:max(2, true)
    local over = core.where(top:isfinite(), scaled:isfinite():all(2, true):eq(false), false)
    if over:any():item() then
      local greedy = core.where(scores:eq(top), 0.0, -math.huge)
      scaled = core.where(over, greedy, scaled)
    end
    scores = scaled
  end
  if k > 0 then k = math.max(k, min_keep) end
  if k > 0 and k < V then
    local top = scores:topk(k, 2)
    local kth = top:min(2, true) -- (B, 1): the k-th largest
    scores = core.where(scores:lt(kth), -math.huge, scores)
  end
  if p < 1 then
    local sorted, order = scores:sort(2, false)
    local cum = sorted:softmax(2):cumsum(2)
    local drop = cum:le(1 - p)
    local keep = math.min(min_keep, V) -- (the likeliest min_keep always stay)
    if keep < V then
      drop = core.cat({drop:narrow(2, 1, V - keep), core.zeros({B, keep}, {dtype = "bool", device = scores.device})}, 2)
    else
      drop = core.zeros({B, V}, {dtype = "bool", device = scores.device})
    end
    local remove = core.zeros({B, V}, {dtype = "bool", device = scores.device}):scatter(2, order, drop)
    scores = core.where(remove, -math.huge, scores)
  end
  return scores
end

-- the next token of each row (a Lua list of 1-based ids) from the last
-- position's logits (B, V) on the cpu
local function choose(logits, o)
  if not o.do_sample then return logits:argmax(2):totable() end
  local probs = M.warp(logits, o):softmax(2)
  return nd.multinomial(probs, 1):view({logits:size(1)}):totable()
end

local function check(who, o, cfg, T)
  local V = cfg.vocab_size
  local n = o.max_new_tokens or 20
  if n < 0 then errors.fail(who, "max_new_tokens must be >= 0, got %d", n) end
  if T + n > cfg.n_positions then
    errors.fail(who, "the prompt's %d positions + max_new_tokens %d exceed n_positions %d", T, n, cfg.n_positions)
  end
  if o.temperature ~= nil and not (o.temperature > 0) then
    errors.fail(who, "temperature must be > 0, got %s (greedy decoding is do_sample = false)", tostring(o.temperature))
  end
  if o.top_k ~= nil and o.top_k < 0 then errors.fail(who, "top_k must be >= 0 (0: off), got %d", o.top_k) end
  if o.top_p ~= nil and not (o.top_p > 0 and o.top_p <= 1) then
    errors.fail(who, "top_p must be in (0, 1] (1: off), got %s", tostring(o.top_p))
  end
  for _, key in ipairs({"eos_token_id", "pad_token_id"}) do
    local id = o[key]
    if id ~= nil and (id < 1 or id > V) then
      errors.fail(who, "%s %d is out of range (expected 1..%d; needle's token ids are 1-based: Hugging Face's id + 1)",
                  key, id, V)
    end
  end
  local beams = o.num_beams or 1
  if beams < 1 then errors.fail(who, "num_beams must be >= 1, got %d", beams) end
  local ret = o.num_return_sequences or 1
  if ret < 1 or ret > beams then
    errors.fail(who, "num_return_sequences must be in 1..num_beams (%d), got %d", beams, ret)
  end
  if beams == 1 then
    for _, key in ipairs({"length_penalty", "early_stopping"}) do
      if o[key] ~= nil then errors.fail(who, "%s applies to beam search only (num_beams > 1)", key) end
    end
  end
  local lp = o.length_penalty
  if lp ~= nil and not (lp > -math.huge and lp < math.huge) then
    errors.fail(who, "length_penalty must be a finite number (1: the mean log-probability, 0: the sum), got %s",
                tostring(lp))
  end
  return n
end

-- HF's position ids for a padded batch (generate's prepare_inputs), 1-based:
-- the running count of attended positions, and 2 (HF's 1) at padding
local function padded_positions(mask)
  return core.where(mask:eq(1), mask:cumsum(2), 2)
end

-- Beam search as Hugging Face's (transformers' BeamSearchScorer and
-- BeamHypotheses): num_beams sequences per prompt, each step's candidates the
-- 2 * num_beams best continuations by summed log-probability; a candidate that
-- is eos_token_id (among the first num_beams) ends a hypothesis scored
-- sum / generated_length ^ length_penalty (the new tokens, eos included); a
-- prompt is done when num_beams hypotheses exist and the step's best candidate
-- could not beat the worst (or, with early_stopping, at once). Rows: prompt b's
-- beams are rows (b - 1) * nb + 1 .. b * nb; the key/value cache follows the
-- beams (index_select along the batch, as HF's _reorder_cache). Returns the
-- num_return_sequences best of each prompt, eos appended and pad after it.
-- the k candidates of each prompt (a row of flat: (B, num_beams * V) summed
-- scores), best first: the k best (beam search), or with do_sample k drawn
-- without replacement with the softmax of the scores as probabilities, then
-- ordered by score (HF's beam sampling)
local function candidates(flat, k, sample, who)
  if not sample then return flat:topk(k, 2) end
  local probs = flat:softmax(2)
  local alive = probs:gt(0):sum(2):min():item()
  if alive < k then
    errors.fail(who, "beam sampling draws 2 * num_beams (%d) distinct continuations a step, and only %d have a " ..
                "nonzero probability (top_k below 2 * num_beams, a low temperature, or a vocabulary too small " ..
                "for the beams): raise top_k or the temperature, or use fewer beams", k, alive)
  end
  local idx = nd.multinomial(probs, k)
  local top, order = flat:gather(2, idx):sort(2, true)
  return top, idx:gather(2, order)
end

local function beam_search(model, ids, mask, o, n, dev, out_dev, who)
  local tr, cfg = model.transformer, model.config
  local B, T = ids:size(1), ids:size(2)
  local nb, nret = o.num_beams, o.num_return_sequences or 1
  local lp, early = o.length_penalty or 1.0, o.early_stopping == true
  local eos = o.eos_token_id
  local pad = o.pad_token_id or eos
  local use_cache = o.use_cache ~= false
  local R = B * nb
  local rep = {}
  for b = 1, B do for _ = 1, nb do rep[#rep + 1] = b end end
  local rep_t = core.tensor(rep, {dtype = "int64", device = dev})
  local prompt = ids:to("cpu"):totable()
  local seqs, scores = {}, {}
  for r = 1, R do
    seqs[r] = {table.unpack(prompt[rep[r]])}
    scores[r] = (r - 1) % nb == 0 and 0.0 or -1e9 -- the first step expands beam 1 only
  end
  local hyps, worst, done = {}, {}, {}
  for b = 1, B do hyps[b], worst[b], done[b] = {}, 1e9, false end
  local function add(b, tokens, sum, gen_len)
    local score = sum / gen_len ^ lp
    local h = hyps[b]
    if #h < nb or score > worst[b] then
      h[#h + 1] = {score = score, tokens = tokens}
      if #h > nb then
        local lo = 1
        for i = 2, #h do if h[i].score < h[lo].score then lo = i end end
        table.remove(h, lo)
        worst[b] = math.huge
        for i = 1, #h do worst[b] = math.min(worst[b], h[i].score) end
      else
        worst[b] = math.min(score, worst[b])
      end
    end
  end
  local rmask = mask and mask:index_select(1, rep_t) or nil
  local ones = rmask and rmask:to("cpu"):sum(2):totable() or nil
  local cache = use_cache and tr:new_cache(R, T + n) or nil
  local V = cfg.vocab_size
  for step = 1, n do
    local len = #seqs[1]
    local cur_len = len + 1
    local cols = rmask and core.ones({R, cur_len - 1}, {dtype = "int64", device = dev}) or nil
    if cols then cols:narrow(2, 1, T):copy_(rmask) end
    local h
    if use_cache then
      local input, pos
      if step == 1 then
        input = ids:index_select(1, rep_t)
        if rmask then pos = padded_positions(rmask) end
      else
        local col = {}
        for r = 1, R do col[r] = {seqs[r][len]} end
        input = core.tensor(col, {dtype = "int64", device = dev})
        if rmask then
          local p = {}
          for r = 1, R do p[r] = {ones[r] + step - 1} end
          pos = core.tensor(p, {dtype = "int64", device = dev})
        end
      end
      h = tr:_run(input, cache, cols, pos)
    else
      local m = cols
      h = tr:_run(core.tensor(seqs, {dtype = "int64", device = dev}), nil, m, m and padded_positions(m))
    end
    local last = h:narrow(2, h:size(2), 1):view({R, cfg.n_embd})
    local logp = model.lm_head(last):to({dtype = "float32", device = "cpu"}):log_softmax(2)
    -- (beam sampling: the warpers act on the step's log-probabilities, before
    -- the beams' scores are added, as transformers' _beam_search since 4.39)
    if o.do_sample then logp = M.warp(logp, o, 2) end
    logp = logp + core.tensor(scores, {dtype = "float32"}):view({R, 1})
    local top, idx = candidates(logp:view({B, nb * V}), 2 * nb, o.do_sample, who)
    top, idx = top:totable(), idx:totable()
    local next_scores, next_tokens, next_rows = {}, {}, {}
    for b = 1, B do
      local k = 0
      if done[b] then
        for j = 1, nb do
          local r = (b - 1) * nb + j
          next_scores[r], next_tokens[r], next_rows[r] = 0.0, pad or 1, r
        end
      else
        for rank = 1, 2 * nb do
          local score, flat = top[b][rank], idx[b][rank] - 1
          local beam, token = flat // V, flat % V + 1
          local row = (b - 1) * nb + beam + 1
          if eos ~= nil and token == eos then
            if rank <= nb then add(b, {table.unpack(seqs[row])}, score, cur_len - T) end
          else
            k = k + 1
            local r = (b - 1) * nb + k
            next_scores[r], next_tokens[r], next_rows[r] = score, token, row
          end
          if k == nb then break end
        end
        if #hyps[b] >= nb then
          if early then
            done[b] = true
          else -- (the best of all 2 nb candidates, an eos among them included, as HF's process)
            done[b] = worst[b] >= top[b][1] / (cur_len - T) ^ lp
          end
        end
      end
    end
    local all_done = true
    for b = 1, B do all_done = all_done and done[b] end
    if all_done then break end
    local new = {}
    for r = 1, R do
      new[r] = {table.unpack(seqs[next_rows[r]])}
      new[r][#new[r] + 1] = next_tokens[r]
    end
    seqs, scores = new, next_scores
    if cache then -- the cache follows the beams
      local sel = core.tensor(next_rows, {dtype = "int64", device = dev})
      for l = 1, cache.n_layer do
        cache.keys[l] = cache.keys[l]:index_select(1, sel)
        cache.values[l] = cache.values[l]:index_select(1, sel)
      end
    end
  end
  for b = 1, B do
    if not done[b] then
      for j = 1, nb do
        local r = (b - 1) * nb + j
        add(b, seqs[r], scores[r], #seqs[r] - T)
      end
    end
  end
  local out, width = {}, 0
  for b = 1, B do
    table.sort(hyps[b], function(x, y) return x.score > y.score end)
    for i = 1, nret do
      out[#out + 1] = hyps[b][i].tokens
      width = math.max(width, #hyps[b][i].tokens)
    end
  end
  if eos ~= nil and width < T + n then width = width + 1 end
  for _, t in ipairs(out) do
    if #t < width and eos ~= nil then t[#t + 1] = eos end
    while #t < width do t[#t + 1] = pad or 1 end
  end
  return core.tensor(out, {dtype = "int64", device = out_dev})
end

function M.generate(model, input_ids, opts, ...)
  local who = "nn.models." .. model.__name .. ".generate"
  options.no_extra(who, "model:generate(input_ids[, opts])", 2, ...)
  opts = options.check(who, opts, GENERATE)
  local tr, cfg = model.transformer, model.config
  local ids, _, mask, _, flat = tr:_inputs(who, input_ids, {attention_mask = opts.attention_mask})
  local B, T = ids:size(1), ids:size(2)
  -- the mask as forward takes it (a tensor of any dtype or a Lua list), held
  -- as int64 0/1 here: the positions of a padded batch count its ones
  if mask ~= nil and mask.dtype ~= "int64" then
    if core.where(mask:eq(1), 0, mask):ne(0):any():item() then
      errors.fail(who, "attention_mask must hold 0 (padding) and 1 (attend) only, got other values in a %s mask",
                  mask.dtype)
    end
    mask = mask:to("int64")
  end
  local n = check(who, opts, cfg, T)
  local eos = opts.eos_token_id
  local pad = opts.pad_token_id or eos
  local dev = tr.wte.weight.device
  local out_dev = core.is_tensor(input_ids) and input_ids.device or "cpu"
  if opts.seed ~= nil then core.manual_seed(opts.seed) end
  local use_cache = opts.use_cache ~= false
  if (opts.num_beams or 1) > 1 then
    local result = core.no_grad(function() return beam_search(model, ids, mask, opts, n, dev, out_dev, who) end)
    if flat and result:size(1) == 1 then result = result:view({result:size(2)}) end
    return result
  end
  local rows = ids:to("cpu"):totable()

  local result = core.no_grad(function()
    local total = T + n
    -- the whole sequence's ids and mask, written column by column
    local seq = core.zeros({B, total}, {dtype = "int64", device = dev})
    seq:narrow(2, 1, T):copy_(ids)
    local full_mask, ones
    if mask ~= nil then
      full_mask = core.ones({B, total}, {dtype = "int64", device = dev})
      full_mask:narrow(2, 1, T):copy_(mask)
      ones = mask:to("cpu"):sum(2):totable()
    end
    local cache = use_cache and tr:new_cache(B, math.max(total, 1)) or nil
    local finished, n_done = {}, 0
    local len = T
    for step = 1, n do
      local h
      if use_cache then
        local input, pos
        if step == 1 then
          input = ids
          if full_mask then pos = padded_positions(mask) end
        else
          input = seq:narrow(2, len, 1)
          if full_mask then
            local p = {}
            for b = 1, B do p[b] = {ones[b] + step - 1} end
            pos = core.tensor(p, {dtype = "int64", device = dev})
          end
        end
        h = tr:_run(input, cache, full_mask and full_mask:narrow(2, 1, len), pos)
      else
        local m = full_mask and full_mask:narrow(2, 1, len)
        h = tr:_run(seq:narrow(2, 1, len), nil, m, m and padded_positions(m))
      end
      local last = h:narrow(2, h:size(2), 1):view({B, cfg.n_embd})
      local logits = model.lm_head(last):to("cpu")
      local next_ids = choose(logits, opts)
      local col = {}
      for b = 1, B do
        local id = finished[b] and pad or next_ids[b]
        if eos ~= nil and id == eos and not finished[b] then finished[b] = true; n_done = n_done + 1 end
        rows[b][#rows[b] + 1] = id
        col[b] = {id}
      end
      len = len + 1
      seq:narrow(2, len, 1):copy_(core.tensor(col, {dtype = "int64", device = dev}))
      if n_done == B then break end
    end
    return core.tensor(rows, {dtype = "int64", device = out_dev})
  end)
  if flat then result = result:view({result:size(2)}) end
  return result
end

return M
