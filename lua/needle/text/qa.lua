-- needle.text.qa: extractive question answering's last step, from a model's
-- start and end logits to answers in the context text (docs/text.md).
--
--   local enc = tok:encode_batch({{question, context}}, {max_length = 384, truncation = "only_second",
--     return_overflowing_tokens = true, stride = 128, return_offsets_mapping = true,
--     padding = true, return_tensors = true})
--   local s, e = model(enc.input_ids, {attention_mask = enc.attention_mask, token_type_ids = enc.token_type_ids})
--   local answers = nd.text.answer_spans(s, e, enc, {context}, {top_k = 3})
--   answers[1][1].answer, answers[1][1].score, answers[1][1].first, answers[1][1].last
--
-- The search is Hugging Face's question-answering pipeline's (postprocess
-- and decode_spans): in each window (row) the logits of the tokens that
-- cannot answer (not the context's, padding) are set to -10000, the first
-- token ([CLS]) being kept; start and end each go through a softmax; a span
-- (s, e) scores p_start(s) * p_end(e) for s <= e < s + max_answer_len, over
-- the context's tokens; each window's top_k spans, all windows' pooled per
-- text, best first. "No answer" scores the lowest [CLS] * [CLS] over the
-- text's windows (handle_impossible_answer). The probabilities are computed
-- in double precision (Hugging Face's in float32).
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local OPTS = {top_k = "integer", max_answer_len = "integer", handle_impossible_answer = "boolean",
              align_to_words = "boolean"}

-- a (rows, L) tensor or list of lists of numbers as a list of lists; a
-- 1-D one as one row
local function rows_of(fail, x, what)
  if core.is_tensor(x) then
    if x:dim() == 1 then x = x:view({1, x:size(1)}) end
    if x:dim() ~= 2 then fail("%s must be (windows, tokens), got shape %s", what, errors.shape_str(x)) end
    return x:to({device = "cpu", dtype = "float64"}):totable()
  end
  if type(x) ~= "table" then fail("%s must be a tensor or a list, got %s", what, type(x)) end
  if type(x[1]) == "number" then x = {x} end
  return x
end

-- field k of the encoding as a list of rows (tensors read back; one
-- encoding, tok:encode's, as one row)
local function field(fail, enc, k, need)
  local v = enc[k]
  if v == nil then
    if need then fail("the encoding has no %s: encode with return_offsets_mapping = true", k) end
    return nil
  end
  if core.is_tensor(v) then v = v:to("cpu"):totable() end
  if type(v) ~= "table" then fail("enc.%s must be a list or a tensor, got %s", k, type(v)) end
  if k == "overflow_to_sample_mapping" then return v end
  local one
  if k == "offset_mapping" then one = type(v[1]) == "table" and type(v[1][1]) == "number"
  else one = type(v[1]) == "number" end
  return one and {v} or v
end

-- the top k entries of list (each {score, s, e}), best first; ties by
-- position (earlier start, then earlier end)
local function best_first(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end

-- softmax of row with the positions where ok[j] is false at -10000 (as
-- Hugging Face's pipeline: they still count, a little)
local function masked_softmax(row, ok, n)
  local v, mx = {}, -math.huge
  for j = 1, n do
    v[j] = ok[j] and row[j] or -10000.0
    if v[j] > mx then mx = v[j] end
  end
  local sum = 0
  for j = 1, n do
    v[j] = math.exp(v[j] - mx)
    sum = sum + v[j]
  end
  for j = 1, n do v[j] = v[j] / sum end
  return v
end

-- the spans of one window, (score, s, e) with s and e both context tokens,
-- best first
local function window_spans(ps, pe, ctx, n, max_len)
  local cand = {}
  for s = 1, n do
    if ctx[s] and ps[s] > 0 then
      for e = s, math.min(n, s + max_len - 1) do
        if ctx[e] then cand[#cand + 1] = {ps[s] * pe[e], s, e} end
      end
    end
  end
  table.sort(cand, best_first)
  return cand
end

-- nd.text.answer_spans(start_logits, end_logits, enc, contexts, opts) ->
-- for each text of the batch, its answers best first, each {answer =,
-- score =, first =, last =} (context:sub(first, last) is the answer)
function M.answer_spans(start_logits, end_logits, enc, contexts, opts, ...)
  local fail = errors.failer("text.answer_spans")
  require("needle.text.files").no_extra("text.answer_spans",
    "answer_spans(start_logits, end_logits, enc, contexts[, opts])", 5, ...)
  opts = options.check("text.answer_spans", opts, OPTS)
  local top_k = opts.top_k or 1
  local max_len = opts.max_answer_len or 15
  if top_k < 1 then fail("top_k must be at least 1, got %d", top_k) end
  if max_len < 1 then fail("max_answer_len must be at least 1, got %d", max_len) end
  local align = opts.align_to_words ~= false
  if type(enc) ~= "table" then fail("enc must be the encoding (a table), got %s", type(enc)) end
  local S = rows_of(fail, start_logits, "start_logits")
  local E = rows_of(fail, end_logits, "end_logits")
  local offsets = field(fail, enc, "offset_mapping", true)
  local seqs = field(fail, enc, "sequence_ids", true)
  local words = field(fail, enc, "word_ids", true)
  local mask = field(fail, enc, "attention_mask", false)
  local sample = field(fail, enc, "overflow_to_sample_mapping", false)
  if type(contexts) == "string" then contexts = {contexts} end
  if type(contexts) ~= "table" then fail("contexts must be a list of the context texts, got %s", type(contexts)) end
  local rows = #offsets
  if #S ~= rows or #E ~= rows then
    fail("start_logits has %d rows and end_logits %d, the encoding %d windows", #S, #E, rows)
  end
  -- the context is the second text of a pair, else the one text: a row is
  -- a pair when a token has type 2 (a pair's last [SEP] has it even when
  -- the context gave no token) or, without token types, sequence id 2
  local types = field(fail, enc, "token_type_ids", false)
  local function context_seq(r)
    for _, q in ipairs(types and types[r] or seqs[r]) do if q == 2 then return 2 end end
    return 1
  end
  local answers, null = {}, {}
  for r = 1, rows do
    local i = sample and sample[r] or r
    local context = contexts[i]
    if type(context) ~= "string" then
      fail("window %d is from text %d, and contexts[%d] is %s (expected the context string)", r, i, i,
           context == nil and "missing" or type(context))
    end
    local n = #offsets[r]
    if #S[r] ~= n or #E[r] ~= n then
      fail("window %d has %d tokens, its logits %d and %d", r, n, #S[r], #E[r])
    end
    local ok, ctx, ctx_seq = {}, {}, context_seq(r)
    for j = 1, n do
      ctx[j] = seqs[r][j] == ctx_seq and (mask == nil or mask[r][j] == 1)
      ok[j] = ctx[j] or j == 1 -- the first token, [CLS], still takes part in the softmax
    end
    local ps, pe = masked_softmax(S[r], ok, n), masked_softmax(E[r], ok, n)
    local ns = ps[1] * pe[1]
    if null[i] == nil or ns < null[i] then null[i] = ns end
    -- each word's first and last byte in this window
    local wf, wl = {}, {}
    for j = 1, n do
      local w = words[r][j]
      if ctx[j] then
        if wf[w] == nil or offsets[r][j][1] < wf[w] then wf[w] = offsets[r][j][1] end
        if wl[w] == nil or offsets[r][j][2] > wl[w] then wl[w] = offsets[r][j][2] end
      end
    end
    -- the window's best top_k distinct spans of text (token spans that
    -- give one text, as two windows' do, count once, with the best score)
    answers[i] = answers[i] or {}
    local list, taken, seen = answers[i], 0, {}
    for _, c in ipairs(window_spans(ps, pe, ctx, n, max_len)) do
      local s, e = c[2], c[3]
      local first, last = offsets[r][s][1], offsets[r][e][2]
      if align then first, last = wf[words[r][s]], wl[words[r][e]] end
      if first < 1 or last > #context then
        fail("window %d's offsets %d..%d fall outside context %d (%d bytes): was it encoded from this text?",
             r, first, last, i, #context)
      end
      local key = first * 4294967296 + last
      if not seen[key] then
        seen[key], taken = true, taken + 1
        local have = list[key]
        if have == nil then
          list[key] = {answer = context:sub(first, last), score = c[1], first = first, last = last, window = r}
        elseif c[1] > have.score then
          have.score, have.window = c[1], r
        end
      end
      if taken >= top_k then break end
    end
  end
  local out = {}
  for i = 1, #contexts do
    local list = {}
    for _, a in pairs(answers[i] or {}) do list[#list + 1] = a end
    if opts.handle_impossible_answer and null[i] then
      list[#list + 1] = {answer = "", score = null[i], first = 0, last = 0}
    end
    table.sort(list, function(a, b)
      if a.score ~= b.score then return a.score > b.score end
      return a.first < b.first
    end)
    for k = #list, top_k + 1, -1 do list[k] = nil end
    out[i] = list
  end
  return out
end

return M
