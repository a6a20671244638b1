-- needle.text.encoding: what turns the token ids of one text (or a pair of
-- texts) into a model's inputs (internal): special tokens, truncation,
-- padding, batches and tensors, with Hugging Face's rules
-- (PreTrainedTokenizerBase: truncate_sequences, pad, prepare_for_model).
--
--   E.resolve(who, o, model_max_length) -> {max_length, truncation, padding}:
--       the options of encode / encode_batch checked and made explicit
--   E.build(who, tok, a, b, r, add_special) -> {input_ids, token_type_ids,
--       attention_mask} for the id lists a (and b), truncated, not padded
--       (and offset_mapping, sequence_ids, word_ids where a carries spans)
--   E.build_windows(who, tok, a, b, r, add_special, stride) -> a list of
--       such encodings: the overflowing windows of a text too long
--   E.pad(enc, length, pad_id)       pads enc (in place) to length
--   E.to_tensors(who, batch, device) the lists of a batch as int64 tensors
--   E.id_list(who, ids, size[, known]) -> a new list of the ids (a list or a
--       1-D tensor), each checked to be an integer in 1..size (and a key of
--       known, when given)
--
-- Every id is needle's (1-based): token_type_ids are 1 for the first text and
-- 2 for the second (indices of the token type embedding, as input_ids are of
-- the word embedding); attention_mask is a mask, 1 for a token, 0 for padding.
local errors = require "needle.errors"

local M = {}

local STRATEGIES = {longest_first = true, only_first = true, only_second = true, do_not_truncate = true}
local PADDINGS = {longest = true, max_length = true, do_not_pad = true}

function M.resolve(who, o, model_max_length)
  local max_length = o.max_length
  if max_length ~= nil and max_length < 1 then
    errors.fail(who, "max_length must be a positive integer, got %d", max_length)
  end
  local padding = o.padding
  if padding == true then padding = "longest" elseif padding == false or padding == nil then padding = "do_not_pad" end
  if not PADDINGS[padding] then
    errors.fail(who, "padding must be true, false, \"longest\", \"max_length\" or \"do_not_pad\", got %q", padding)
  end
  local truncation = o.truncation
  if truncation == nil then
    -- HF: a max_length without padding to it means truncation (it warns)
    truncation = (max_length ~= nil and padding ~= "max_length") and "longest_first" or "do_not_truncate"
  elseif truncation == true then
    truncation = "longest_first"
  elseif truncation == false then
    truncation = "do_not_truncate"
  end
  if not STRATEGIES[truncation] then
    errors.fail(who, "truncation must be true, false, \"longest_first\", \"only_first\", \"only_second\" " ..
      "or \"do_not_truncate\", got %q", truncation)
  end
  if max_length == nil and (truncation ~= "do_not_truncate" or padding == "max_length") then
    max_length = model_max_length
    if max_length == nil then
      errors.fail(who, "%s needs max_length (the tokenizer has no model_max_length)",
        padding == "max_length" and "padding = \"max_length\"" or "truncation")
    end
  end
  return {max_length = max_length, truncation = truncation, padding = padding}
end

-- ids[i..j] as a new list, with the parallel lists of where each token
-- came from (first, last, word: WordPiece's _text_tokens) when ids has them
local function slice(ids, i, j)
  local out = {}
  for k = i, j do out[k - i + 1] = ids[k] end
  if ids.first then
    out.first, out.last, out.word = {}, {}, {}
    for k = i, j do
      out.first[k - i + 1], out.last[k - i + 1], out.word[k - i + 1] = ids.first[k], ids.last[k], ids.word[k]
    end
  end
  return out
end

local function take(ids, n) return slice(ids, 1, n) end

-- HF's truncate_sequences (right side): longest_first removes one token at a
-- time from the longer list (from the second on a tie); only_* cut one list
-- and fail when it is too short (HF logs that and returns the sequence too
-- long; here it is an error, since a model would fail on it later).
local function truncate(who, a, b, remove, strategy, max_length)
  if remove <= 0 or strategy == "do_not_truncate" then return a, b end
  local na, nb = #a, b and #b or 0
  if strategy == "only_second" and b == nil then
    errors.fail(who, "truncation = \"only_second\" needs a pair of texts ({text_a, text_b}) to shorten to " ..
      "max_length %d, got one text", max_length)
  end
  if strategy == "longest_first" and b ~= nil then
    for _ = 1, remove do
      if na > nb then na = na - 1 else nb = nb - 1 end
    end
    if na < 0 or nb < 0 then
      errors.fail(who, "cannot truncate the pair to max_length %d: the special tokens alone need more", max_length)
    end
    return take(a, na), take(b, nb)
  elseif strategy ~= "only_second" then
    -- as HF: at least one token of the text stays
    if na <= remove then
      errors.fail(who, "cannot truncate the %s (%d tokens) by %d to fit max_length %d%s", b and "first text" or "text",
        na, remove, max_length,
        b and (" (the second has %d): use truncation = \"longest_first\""):format(nb) or "")
    end
    return take(a, na - remove), b
  else -- only_second
    if nb <= remove then
      errors.fail(who, "cannot truncate the second text (%d tokens) by %d to fit max_length %d (the first has %d): " ..
        "use truncation = \"longest_first\"", nb, remove, max_length, na)
    end
    return a, take(b, nb - remove)
  end
end

-- the encoding of a (and b) as they are: special tokens added, nothing
-- cut. With spans (a.first present), also offset_mapping (each token's
-- {first, last} bytes in its text, {0, 0} for the special tokens),
-- sequence_ids (1 or 2, the text each token is from, 0 for the special
-- tokens) and word_ids (the token's word in its text, 0 for the special
-- tokens).
local function assemble(who, tok, a, b, add_special)
  local spans = a.first ~= nil
  local ids, types = {}, {}
  local offsets, seqs, words = spans and {} or nil, spans and {} or nil, spans and {} or nil
  local function put(id, t, seq, first, last, word)
    local n = #ids + 1
    ids[n], types[n] = id, t
    if spans then offsets[n], seqs[n], words[n] = {first, last}, seq, word end
  end
  local function put_text(x, t)
    for i = 1, #x do
      if spans then put(x[i], t, t, x.first[i], x.last[i], x.word[i]) else put(x[i], t) end
    end
  end
  local cls, sep
  if add_special then cls, sep = tok:_special_id(who, "cls"), tok:_special_id(who, "sep") end
  if add_special then put(cls, 1, 0, 0, 0, 0) end
  put_text(a, 1)
  if add_special then put(sep, 1, 0, 0, 0, 0) end
  if b then
    put_text(b, 2)
    if add_special then put(sep, 2, 0, 0, 0, 0) end
  end
  local mask = {}
  for i = 1, #ids do mask[i] = 1 end
  return {input_ids = ids, token_type_ids = types, attention_mask = mask, offset_mapping = offsets,
          sequence_ids = seqs, word_ids = words}
end

function M.build(who, tok, a, b, r, add_special)
  local nspecial = add_special and (b and 3 or 2) or 0
  if r.max_length ~= nil then
    a, b = truncate(who, a, b, #a + (b and #b or 0) + nspecial - r.max_length, r.truncation, r.max_length)
  end
  return assemble(who, tok, a, b, add_special)
end

-- E.build_windows(who, tok, a, b, r, add_special, stride) -> a list of
-- encodings: as build when everything fits in r.max_length (or nothing is
-- truncated); else the text that truncation cuts (the second of a pair for
-- only_second, the first for only_first or one text) in windows of the
-- tokens that fit, each starting `stride` tokens before the previous one
-- ended, until one reaches the text's end (Hugging Face's overflowing
-- tokens: return_overflowing_tokens with stride, as its fast tokenizers
-- make them, the first window being the truncated encoding)
function M.build_windows(who, tok, a, b, r, add_special, stride)
  local nspecial = add_special and (b and 3 or 2) or 0
  local max_length = r.max_length
  if max_length == nil or r.truncation == "do_not_truncate" or #a + (b and #b or 0) + nspecial <= max_length then
    return {M.build(who, tok, a, b, r, add_special)}
  end
  if b ~= nil and r.truncation == "longest_first" then
    errors.fail(who, "return_overflowing_tokens for a pair of texts needs truncation = \"only_second\" (windows " ..
      "over the second text, as for question answering) or \"only_first\"; longest_first would cut both")
  end
  if b == nil and r.truncation == "only_second" then
    errors.fail(who, "truncation = \"only_second\" needs a pair of texts ({text_a, text_b}), got one text")
  end
  local second = r.truncation == "only_second"
  local seq = second and b or a
  local other = second and #a or (b and #b or 0)
  local room = max_length - nspecial - other
  if room < 1 then
    errors.fail(who, "no room for the %s text in max_length %d: the %s text (%d tokens) and %d special tokens " ..
      "fill it", second and "second" or "first", max_length, second and "first" or "second", other, nspecial)
  end
  if stride >= room then
    errors.fail(who, "stride %d must be less than the %d tokens of the %s text that each window holds " ..
      "(max_length %d less the other text and the special tokens)", stride, room,
      second and "second" or (b and "first" or "one"), max_length)
  end
  local out, start = {}, 1
  while true do
    local stop = math.min(start + room - 1, #seq)
    local w = slice(seq, start, stop)
    out[#out + 1] = assemble(who, tok, second and a or w, second and w or b, add_special)
    if stop == #seq then break end
    start = start + room - stride
  end
  return out
end

-- pads on the right with pad_id, token type 1 (HF's pad_token_type_id 0)
-- and mask 0; offsets {0, 0}, sequence and word 0
function M.pad(enc, length, pad_id)
  local ids, types, mask = enc.input_ids, enc.token_type_ids, enc.attention_mask
  local offsets, seqs, words = enc.offset_mapping, enc.sequence_ids, enc.word_ids
  for i = #ids + 1, length do
    ids[i], types[i], mask[i] = pad_id, 1, 0
    if offsets then offsets[i], seqs[i], words[i] = {0, 0}, 0, 0 end
  end
end

function M.to_tensors(who, batch, device)
  local nd = require "needle"
  local len = #batch.input_ids[1]
  for i, ids in ipairs(batch.input_ids) do
    if #ids ~= len then
      errors.fail(who, "return_tensors needs rows of one length, got %d tokens in row 1 and %d in row %d " ..
        "(a row is a text, or with return_overflowing_tokens a window of one): pass padding = true " ..
        "(or \"max_length\")", len, #ids, i)
    end
  end
  local out = {}
  for k, v in pairs(batch) do
    if k == "overflow_to_sample_mapping" then
      out[k] = nd.tensor(v, {dtype = "int64", device = device})
    elseif len == 0 then
      out[k] = nd.zeros(k == "offset_mapping" and {#v, 0, 2} or {#v, 0}, {dtype = "int64", device = device})
    else
      out[k] = nd.tensor(v, {dtype = "int64", device = device})
    end
  end
  return out
end

function M.id_list(who, ids, size, known)
  local nd = require "needle"
  if nd.is_tensor(ids) then
    if ids:dim() ~= 1 then errors.fail(who, "expected a 1-D tensor of ids, got shape %s", errors.shape_str(ids)) end
    ids = ids:totable()
  elseif type(ids) ~= "table" then
    errors.fail(who, "expected a list (or 1-D tensor) of ids, got %s", type(ids))
  end
  local out = {}
  for k = 1, #ids do
    local id = ids[k]
    if math.type(id) == "float" and math.tointeger(id) then id = math.tointeger(id) end
    if math.type(id) ~= "integer" or id < 1 or id > size then
      errors.fail(who, "id %s at position %d is not a token id (1..%d: needle's ids are 1-based)", tostring(ids[k]), k, size)
    end
    if known and known[id] == nil then
      errors.fail(who, "id %d at position %d is not a token id (no token of the vocabulary has it)", id, k)
    end
    out[k] = id
  end
  return out
end

return M
