-- needle.text.WordPiece: BERT's tokenizer (Hugging Face's BertTokenizer):
-- BERT's BasicTokenizer (needle.text.bert_basic), then greedy
-- longest-match-first WordPiece with "##" continuations. docs/text.md.
--
--   local tok = nd.text.WordPiece.from_file("vocab.txt", {lowercase = true})
--   local enc = tok:encode({"a question", "a passage"}, {max_length = 128, padding = "max_length"})
--   enc.input_ids, enc.token_type_ids, enc.attention_mask   -- Lua lists
--
-- Ids are needle's, 1-based: the token on line k of vocab.txt has id k
-- (Hugging Face's id k - 1), so they index nd.nn.Embedding rows directly.
local errors = require "needle.errors"
local options = require "needle.options"
local files = require "needle.text.files"
local basic = require "needle.text.bert_basic"
local E = require "needle.text.encoding"

local WordPiece = {}
WordPiece.__index = WordPiece
WordPiece.__name = "needle.text.WordPiece"

local byte, sub, find, lower = string.byte, string.sub, string.find, string.lower

-- the whole-word cache is emptied when it holds this many chunks, so that
-- memory stays bounded on text with unbounded distinct words
local CACHE_MAX = 200000

local NEW_OPTS = {
  lowercase = "boolean", strip_accents = "boolean", tokenize_chinese_chars = "boolean",
  unk_token = "string", sep_token = "string", pad_token = "string", cls_token = "string",
  mask_token = "string", max_input_chars_per_word = "integer", model_max_length = "integer",
}

local function check_self(self, who)
  if getmetatable(self) ~= WordPiece then
    errors.fail(who, "call it as a method (tok:%s(...)), got %s as the tokenizer", who:match("[^.]+$"), type(self))
  end
end

-- WordPiece.new(vocab, opts): vocab is a list of token strings, the id of
-- each its position
function WordPiece.new(vocab, opts, ...)
  local who = "text.WordPiece.new"
  files.no_extra(who, "WordPiece.new(vocab[, opts])", 2, ...)
  if type(vocab) ~= "table" then errors.fail(who, "expected a list of tokens, got %s", type(vocab)) end
  local n = #vocab
  if n == 0 then errors.fail(who, "the vocabulary is empty") end
  for k, v in pairs(vocab) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      errors.fail(who, "the vocabulary must be a list (keys 1..%d), got the key %s", n, tostring(k))
    end
    if type(v) ~= "string" then errors.fail(who, "token %d must be a string, got %s", k, type(v)) end
    files.check_utf8(who, v, ("token %d"):format(k))
  end
  return WordPiece._build(who, vocab, opts)
end

-- WordPiece.from_file(path, opts): vocab.txt, one token a line (UTF-8)
function WordPiece.from_file(path, opts, ...)
  local who = "text.WordPiece.from_file"
  files.no_extra(who, "WordPiece.from_file(path[, opts])", 2, ...)
  options.check(who, opts, NEW_OPTS)
  local s = files.read(who, path, "vocabulary")
  local vocab = {}
  for k, line in files.lines(s) do
    local ok, bad = utf8.len(line)
    if ok == nil then
      errors.fail(who, "'%s' line %d is not valid UTF-8 (byte %d of the line): not a vocab.txt", path, k, bad)
    end
    vocab[k] = line
  end
  if #vocab == 0 then errors.fail(who, "'%s' is empty: no tokens", path) end
  return WordPiece._build(who, vocab, opts)
end

function WordPiece._build(who, vocab, opts)
  local o = options.check(who, opts, NEW_OPTS)
  local self = setmetatable({}, WordPiece)
  -- the tokens as a trie of byte edges in one table (key: node * 256 +
  -- byte -> child node; node 1 is the root of whole tokens, node 2 the root
  -- of the "##" continuations without their "##"), so that the longest
  -- match is a walk with no string made
  local ids, edges, node_id, count = {}, {}, {}, 2
  local function insert(root, tok, from, id)
    local node = root
    for i = from, #tok do
      local key = node * 256 + byte(tok, i)
      local nx = edges[key]
      if nx == nil then
        count = count + 1
        nx = count
        edges[key] = nx
      end
      node = nx
    end
    node_id[node] = id
  end
  for id, tok in ipairs(vocab) do
    ids[tok] = id -- a token listed twice: its last line, as HF's dict
    insert(1, tok, 1, id)
    if sub(tok, 1, 2) == "##" then insert(2, tok, 3, id) end
  end
  node_id[1], node_id[2] = nil, nil -- "" and "##" match nothing
  self.vocab, self._ids, self._edges, self._node_id = vocab, ids, edges, node_id
  self.vocab_size = #vocab
  self.lowercase = o.lowercase ~= false
  local strip = o.strip_accents
  if strip == nil then strip = self.lowercase end
  self.strip_accents = strip
  self.tokenize_chinese_chars = o.tokenize_chinese_chars ~= false
  self.max_input_chars_per_word = o.max_input_chars_per_word or 100
  if self.max_input_chars_per_word < 1 then
    errors.fail(who, "max_input_chars_per_word must be positive, got %d", self.max_input_chars_per_word)
  end
  if o.model_max_length ~= nil and o.model_max_length < 1 then
    errors.fail(who, "model_max_length must be a positive integer, got %d", o.model_max_length)
  end
  self.model_max_length = o.model_max_length
  self.special = {}
  for _, k in ipairs({"unk", "sep", "pad", "cls", "mask"}) do
    local t = o[k .. "_token"] or ("[" .. k:upper() .. "]")
    self[k .. "_token"] = t
    self[k .. "_token_id"] = ids[t]
    if ids[t] ~= nil then self.special[#self.special + 1] = t end
  end
  if self.unk_token_id == nil then
    errors.fail(who, "unk_token %q is not in the vocabulary (%d tokens)", self.unk_token, #vocab)
  end
  self._special_ids = {}
  for _, t in ipairs(self.special) do self._special_ids[ids[t]] = true end
  self._cfg = {lowercase = self.lowercase, strip_accents = strip, chinese = self.tokenize_chinese_chars}
  self._cache, self._ncache = {}, 0
  self._spans, self._nspans = {}, 0
  return self
end

function WordPiece:__tostring()
  return ("needle.text.WordPiece(%d tokens, lowercase = %s)"):format(self.vocab_size, tostring(self.lowercase))
end

-- the id of a special token the operation needs ("cls", "sep", "pad")
function WordPiece:_special_id(who, k)
  local id = self[k .. "_token_id"]
  if id == nil then
    errors.fail(who, "%s_token %q is not in the vocabulary: pass %s_token = (a token of it) to the constructor",
      k, self[k .. "_token"], k)
  end
  return id
end

-- greedy longest-match-first over one piece of nchars characters; appends
-- the ids to out (or the unknown token's id alone). The longest token that
-- starts the rest of the piece is the deepest token node on its trie path.
-- With a list ends, appends to it the piece's byte at which each token ends.
function WordPiece:_wordpiece(piece, nchars, out, ends)
  local unk = self.unk_token_id
  if nchars > self.max_input_chars_per_word then
    out[#out + 1] = unk
    if ends then ends[#out] = #piece end
    return
  end
  local edges, node_id = self._edges, self._node_id
  local base, n = #out, #piece
  local start, root = 1, 1
  while start <= n do
    local node, found, stop = root, nil, nil
    for i = start, n do
      node = edges[node * 256 + byte(piece, i)]
      if node == nil then break end
      local id = node_id[node]
      if id then
        local nb = byte(piece, i + 1)
        -- only at the end of a character: the next byte is not a continuation
        if nb == nil or nb < 0x80 or nb > 0xBF then found, stop = id, i end
      end
    end
    if not found then
      for k = #out, base + 1, -1 do
        out[k] = nil
        if ends then ends[k] = nil end
      end
      out[#out + 1] = unk
      if ends then ends[#out] = #piece end
      return
    end
    out[#out + 1] = found
    if ends then ends[#out] = stop end
    start, root = stop + 1, 2
  end
end

-- the ids of one chunk (text without ASCII whitespace): a number for one
-- id, else a list
function WordPiece:_chunk(chunk)
  local out = {}
  if find(chunk, "^[A-Za-z0-9]+$") then
    -- a plain ASCII word (most chunks): no basic tokenization to do but case
    self:_wordpiece(self.lowercase and lower(chunk) or chunk, #chunk, out)
  else
    local pieces = basic.pieces(chunk, self._cfg, {})
    for k = 1, #pieces do self:_wordpiece(pieces[k], pieces.nchars[k], out) end
  end
  if #out == 1 then out = out[1] end
  if self._ncache >= CACHE_MAX then self._cache, self._ncache = {}, 0 end
  self._cache[chunk] = out
  self._ncache = self._ncache + 1
  return out
end

-- appends the ids of text (no special tokens in it) to out
function WordPiece:_ids_plain(text, out)
  local cache = self._cache
  local n = #out
  for chunk in text:gmatch("[^ \t\n\r]+") do
    local v = cache[chunk] or self:_chunk(chunk)
    if type(v) == "number" then
      n = n + 1
      out[n] = v
    else
      for k = 1, #v do out[n + k] = v[k] end
      n = n + #v
    end
  end
end

-- calls seg(from, to) for each run of text between the special tokens
-- written in it ("[SEP]", ...) and special(token, at) for each of those, in
-- order. Each special token's next place is kept and searched again only
-- once passed, so text with many of them costs one scan per kind.
function WordPiece:_split_special(text, seg, special)
  local specials, nexts = self.special, {}
  for k, t in ipairs(specials) do nexts[k] = find(text, t, 1, true) or false end
  local pos = 1
  while true do
    local first, fk
    for k = 1, #specials do
      local p = nexts[k]
      if p and p < pos then
        p = find(text, specials[k], pos, true) or false
        nexts[k] = p
      end
      if p and (first == nil or p < first) then first, fk = p, k end
    end
    if first == nil then
      seg(pos, #text)
      return
    end
    seg(pos, first - 1)
    special(specials[fk], first)
    pos = first + #specials[fk]
  end
end

-- the ids of text, special tokens written in it ("[SEP]", ...) kept whole
-- as Hugging Face's tokenizers keep them
function WordPiece:_text_ids(who, text, what)
  if type(text) ~= "string" then errors.fail(who, "%s must be a string, got %s", what, type(text)) end
  files.check_utf8(who, text, what)
  local out = {}
  self:_split_special(text, function(from, to)
    if to >= from then self:_ids_plain(sub(text, from, to), out) end
  end, function(tok)
    out[#out + 1] = self._ids[tok]
  end)
  return out
end

-- the tokens of one chunk with where they came from, for offsets: {ids,
-- first =, last = (the chunk's bytes each token spans), word = (the word,
-- 1.., of the chunk each token is part of: BERT's basic tokenizer's
-- pieces, i.e. Hugging Face's word_ids)}; cached as _chunk's ids are
function WordPiece:_chunk_spans(chunk)
  local pieces = basic.pieces(chunk, self._cfg, {}, true)
  local ids, first, last, word = {}, {}, {}, {}
  for k = 1, #pieces do
    local n0, ends = #ids, {}
    self:_wordpiece(pieces[k], pieces.nchars[k], ids, ends)
    local bf, bl = pieces.bf[k], pieces.bl[k]
    local from = 1
    for t = n0 + 1, #ids do
      first[t], last[t], word[t] = bf[from], bl[ends[t]], k
      from = ends[t] + 1
    end
  end
  local v = {ids = ids, first = first, last = last, word = word, nwords = #pieces}
  if self._nspans >= CACHE_MAX then self._spans, self._nspans = {}, 0 end
  self._spans[chunk] = v
  self._nspans = self._nspans + 1
  return v
end

-- appends the tokens of text (no special tokens in it; its bytes at base +
-- 1 .. in the whole text) to out, with their spans and words (see
-- _text_tokens)
function WordPiece:_tokens_plain(text, base, out)
  local cache = self._spans
  for at, chunk in text:gmatch("()([^ \t\n\r]+)") do
    local v = cache[chunk] or self:_chunk_spans(chunk)
    local n, off, w = #out, base + at - 1, out.nwords
    for k = 1, #v.ids do
      out[n + k], out.first[n + k], out.last[n + k], out.word[n + k] = v.ids[k], off + v.first[k], off + v.last[k],
        w + v.word[k]
    end
    out.nwords = w + v.nwords
  end
end

-- the ids of text as _text_ids, and where each came from: ids.first[k] and
-- ids.last[k], the bytes of text that token k spans (text:sub(first, last)
-- is its source), and ids.word[k], the word (1.., as counted by BERT's
-- basic tokenizer; a special token written in the text is a word) it is
-- part of
function WordPiece:_text_tokens(who, text, what)
  if type(text) ~= "string" then errors.fail(who, "%s must be a string, got %s", what, type(text)) end
  files.check_utf8(who, text, what)
  local out = {first = {}, last = {}, word = {}, nwords = 0}
  self:_split_special(text, function(from, to)
    if to >= from then self:_tokens_plain(sub(text, from, to), from - 1, out) end
  end, function(tok, at)
    local n = #out + 1
    out.nwords = out.nwords + 1
    out[n], out.first[n], out.last[n], out.word[n] = self._ids[tok], at, at + #tok - 1, out.nwords
  end)
  return out
end

-- tok:tokenize(text) -> the tokens (strings), as HF's tokenize
function WordPiece:tokenize(text, ...)
  check_self(self, "text.WordPiece.tokenize")
  files.no_extra("text.WordPiece.tokenize", "tok:tokenize(text)", 1, ...)
  local ids = self:_text_ids("text.WordPiece.tokenize", text, "text")
  local out = {}
  for k = 1, #ids do out[k] = self.vocab[ids[k]] end
  return out
end

local ENCODE_OPTS = {add_special_tokens = "boolean", max_length = "integer", truncation = "boolean|string",
                     padding = "boolean|string", return_offsets_mapping = "boolean"}
local BATCH_OPTS = {return_tensors = "boolean", device = "string", return_overflowing_tokens = "boolean",
                    stride = "integer"}
for k, v in pairs(ENCODE_OPTS) do BATCH_OPTS[k] = v end

-- one text or a pair {text_a, text_b} -> its two id lists (b nil for one),
-- with where each token came from when spans (_text_tokens)
function WordPiece:_input_ids(who, x, where, spans)
  local ids = spans and self._text_tokens or self._text_ids
  if type(x) == "string" then return ids(self, who, x, where) end
  if type(x) == "table" and #x == 2 and type(x[1]) == "string" and type(x[2]) == "string" then
    return ids(self, who, x[1], where .. "[1]"), ids(self, who, x[2], where .. "[2]")
  end
  errors.fail(who, "%s must be a string or a pair of strings {text_a, text_b}, got %s", where,
    type(x) == "table" and ("a table of %d items"):format(#x) or type(x))
end

-- the encodings of one input: one, or with o.return_overflowing_tokens its windows
local function encode_one(self, who, x, where, r, o)
  local a, b = self:_input_ids(who, x, where, o.return_offsets_mapping)
  local add = o.add_special_tokens ~= false
  if o.return_overflowing_tokens then return E.build_windows(who, self, a, b, r, add, o.stride or 0) end
  return {E.build(who, self, a, b, r, add)}
end

-- tok:encode(text | {text_a, text_b}, opts) -> {input_ids =, token_type_ids =, attention_mask =}
-- (and offset_mapping, sequence_ids, word_ids with return_offsets_mapping)
function WordPiece:encode(x, opts, ...)
  local who = "text.WordPiece.encode"
  check_self(self, who)
  files.no_extra(who, "tok:encode(text[, opts])", 2, ...)
  local o = options.check(who, opts, ENCODE_OPTS)
  local r = E.resolve(who, o, self.model_max_length)
  local enc = encode_one(self, who, x, "text", r, o)[1]
  if r.padding == "max_length" then E.pad(enc, r.max_length, self:_special_id(who, "pad")) end
  return enc
end

-- tok:encode_batch(texts, opts) -> {input_ids =, token_type_ids =,
-- attention_mask =}, lists of lists, or (B, L) int64 tensors with
-- return_tensors = true (on opts.device); offset_mapping (B, L, 2),
-- sequence_ids and word_ids with return_offsets_mapping; with
-- return_overflowing_tokens a row for each window of a text too long, and
-- overflow_to_sample_mapping (the text of each row)
function WordPiece:encode_batch(texts, opts, ...)
  local who = "text.WordPiece.encode_batch"
  check_self(self, who)
  files.no_extra(who, "tok:encode_batch(texts[, opts])", 2, ...)
  local o = options.check(who, opts, BATCH_OPTS)
  if o.device ~= nil and not o.return_tensors then
    errors.fail(who, "device needs return_tensors = true (lists have no device)")
  end
  if type(texts) ~= "table" then errors.fail(who, "expected a list of texts, got %s", type(texts)) end
  if #texts == 0 then errors.fail(who, "the list of texts is empty") end
  if o.stride ~= nil and not o.return_overflowing_tokens then
    errors.fail(who, "stride needs return_overflowing_tokens = true (it is the overlap of the windows)")
  end
  if o.stride ~= nil and o.stride < 0 then errors.fail(who, "stride must be 0 or more, got %d", o.stride) end
  local r = E.resolve(who, o, self.model_max_length)
  local batch = {input_ids = {}, token_type_ids = {}, attention_mask = {}}
  local keys = {"input_ids", "token_type_ids", "attention_mask"}
  if o.return_offsets_mapping then
    for _, k in ipairs({"offset_mapping", "sequence_ids", "word_ids"}) do
      batch[k] = {}
      keys[#keys + 1] = k
    end
  end
  -- with overflow, each window is a row of the batch and says which text it is from
  if o.return_overflowing_tokens then batch.overflow_to_sample_mapping = {} end
  local longest, rows = 0, 0
  for i = 1, #texts do
    for _, enc in ipairs(encode_one(self, who, texts[i], ("texts[%d]"):format(i), r, o)) do
      rows = rows + 1
      for _, k in ipairs(keys) do batch[k][rows] = enc[k] end
      if batch.overflow_to_sample_mapping then batch.overflow_to_sample_mapping[rows] = i end
      if #enc.input_ids > longest then longest = #enc.input_ids end
    end
  end
  local target = r.padding == "max_length" and r.max_length or (r.padding == "longest" and longest) or nil
  if target then
    local pad = self:_special_id(who, "pad")
    for i = 1, rows do
      local enc = {}
      for _, k in ipairs(keys) do enc[k] = batch[k][i] end
      E.pad(enc, target, pad)
    end
  end
  if o.return_tensors then return E.to_tensors(who, batch, o.device) end
  return batch
end

-- HF's clean_up_tokenization: no space before . ? ! , and English contractions
local CLEANUPS = {{" %.", "."}, {" %?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
                  {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}}

-- tok:decode(ids, {skip_special_tokens = false, clean_up_tokenization_spaces = true}) -> text
function WordPiece:decode(ids, opts, ...)
  local who = "text.WordPiece.decode"
  check_self(self, who)
  files.no_extra(who, "tok:decode(ids[, opts])", 2, ...)
  local o = options.check(who, opts, {skip_special_tokens = "boolean", clean_up_tokenization_spaces = "boolean"})
  ids = E.id_list(who, ids, self.vocab_size)
  local toks = {}
  for k = 1, #ids do
    if not (o.skip_special_tokens and self._special_ids[ids[k]]) then toks[#toks + 1] = self.vocab[ids[k]] end
  end
  local s = table.concat(toks, " "):gsub(" ##", "")
  s = s:match("^%s*(.-)%s*$")
  if o.clean_up_tokenization_spaces ~= false then
    for _, c in ipairs(CLEANUPS) do s = s:gsub(c[1], c[2]) end
  end
  return s
end

-- tok:convert_tokens_to_ids(token | list) -> id(s); a token outside the vocabulary is the unknown token's id
function WordPiece:convert_tokens_to_ids(t, ...)
  local who = "text.WordPiece.convert_tokens_to_ids"
  check_self(self, who)
  files.no_extra(who, "tok:convert_tokens_to_ids(token or list)", 1, ...)
  if files.check_tokens(who, t) then return self._ids[t] or self.unk_token_id end
  local out = {}
  for k = 1, #t do out[k] = self._ids[t[k]] or self.unk_token_id end
  return out
end

-- tok:convert_ids_to_tokens(id | list) -> token(s)
function WordPiece:convert_ids_to_tokens(ids, ...)
  local who = "text.WordPiece.convert_ids_to_tokens"
  check_self(self, who)
  files.no_extra(who, "tok:convert_ids_to_tokens(id or list)", 1, ...)
  if type(ids) == "number" then return self.vocab[E.id_list(who, {ids}, self.vocab_size)[1]] end
  ids = E.id_list(who, ids, self.vocab_size)
  local out = {}
  for k = 1, #ids do out[k] = self.vocab[ids[k]] end
  return out
end

return WordPiece
