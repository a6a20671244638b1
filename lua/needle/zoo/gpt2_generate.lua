-- needle.zoo.gpt2_generate: GPT2LMHeadModel:generate and the logits warpers
-- it samples through (internal; docs/models-gpt2.md documents the method).
--
--   model:generate(input_ids, {max_new_tokens = 20, do_sample = false, temperature = 1,
--                  top_k = 0, top_p = 1, eos_token_id =, pad_token_id =, seed =,
--                  use_cache = true, attention_mask =}) -> ids (B, T + n)
--
-- Ids are 1-based (Hugging Face's + 1), the prompt's and the result's alike.
-- With the cache (the default) the prompt runs once, filling per-layer key
-- and value buffers sized T + max_new_tokens, and every new token runs the
-- model on that one position; use_cache = false re-runs the whole sequence
-- for every token (the reference the spec compares the cache with).
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
                  use_cache = "boolean", attention_mask = "tensor|table"}

-- warp(scores (B, V), {temperature = 1, top_k = 0, top_p = 1}) -> scores with
-- -inf at the tokens sampling must not pick, as HF's TemperatureLogitsWarper,
-- TopKLogitsWarper and TopPLogitsWarper applied in that order: top-k keeps
-- the scores at least the k-th largest (ties included); top-p keeps the
-- smallest set of the most likely tokens whose probabilities sum to more
-- than 1 - top_p... as HF: sorted ascending, a token goes when the
-- cumulative probability up to it is <= 1 - top_p, and the likeliest always
-- stays.
function M.warp(scores, o)
  local t, k, p = o.temperature or 1, o.top_k or 0, o.top_p or 1
  local B, V = scores:size(1), scores:size(2)
  if t ~= 1 then scores = scores / t end
  if k > 0 and k < V then
    local top = scores:topk(k, 2)
    local kth = top:min(2, true) -- (B, 1): the k-th largest
    scores = core.where(scores:lt(kth), -math.huge, scores)
  end
  if p < 1 then
    local sorted, order = scores:sort(2, false)
    local cum = sorted:softmax(2):cumsum(2)
    local drop = cum:le(1 - p)
    drop = core.cat({drop:narrow(2, 1, V - 1), core.zeros({B, 1}, {dtype = "bool", device = scores.device})}, 2)
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
  return n
end

-- HF's position ids for a padded batch (generate's prepare_inputs), 1-based:
-- the running count of attended positions, and 2 (HF's 1) at padding
local function padded_positions(mask)
  return core.where(mask:eq(1), mask:cumsum(2), 2)
end

function M.generate(model, input_ids, opts)
  local who = "nn.models." .. model.__name .. ".generate"
  opts = options.check(who, opts, GENERATE)
  local tr, cfg = model.transformer, model.config
  local ids, _, mask, _, flat = tr:_inputs(who, input_ids, {attention_mask = opts.attention_mask})
  local B, T = ids:size(1), ids:size(2)
  local n = check(who, opts, cfg, T)
  local eos = opts.eos_token_id
  local pad = opts.pad_token_id or eos
  local dev = tr.wte.weight.device
  local out_dev = core.is_tensor(input_ids) and input_ids.device or "cpu"
  if opts.seed ~= nil then core.manual_seed(opts.seed) end
  local use_cache = opts.use_cache ~= false
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
