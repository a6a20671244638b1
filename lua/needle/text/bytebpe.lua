-- needle.text.ByteBPE: GPT-2's byte-level BPE tokenizer (OpenAI's
-- encoder.py, Hugging Face's GPT2Tokenizer). docs/text.md.
--
--   local tok = nd.text.ByteBPE.from_files("vocab.json", "merges.txt")
--   local ids = tok:encode("Hello world<|endoftext|>", {allowed_special = "all"})
--   tok:decode(ids) == "Hello world<|endoftext|>"
--
-- Text is split by GPT-2's pre-tokenizer (needle.text.gpt2_split), each
-- piece's bytes become GPT-2's printable stand-ins (bytes_to_unicode), and
-- merges apply by rank. Any byte string encodes (bytes that are not UTF-8
-- too) and decodes back to itself. Ids are needle's, 1-based: vocab.json's
-- id + 1, so they index nd.nn.Embedding rows directly.
local errors = require "needle.errors"
local options = require "needle.options"
local files = require "needle.text.files"
local piece_end = require("needle.text.gpt2_split").piece_end
local E = require "needle.text.encoding"

local ByteBPE = {}
ByteBPE.__index = ByteBPE
ByteBPE.__name = "needle.text.ByteBPE"

local byte, sub, concat = string.byte, string.sub, table.concat

-- token ids are below 2^24 (GPT-2 has 50257), so a pair of ids is one
-- integer key: a * SHIFT + b, with no string made per lookup
local MAX_ID = 1 << 24
local SHIFT = 1 << 24
local CACHE_MAX = 200000

-- GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
-- the other 68 for U+0100 onwards, in byte order
local BYTE_CHAR, CHAR_BYTE = {}, {}
do
  local n = 0
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174)
    local cp = printable and b or 256 + n
    if not printable then n = n + 1 end
    BYTE_CHAR[b] = utf8.char(cp)
    CHAR_BYTE[BYTE_CHAR[b]] = b
  end
end
ByteBPE.bytes_to_unicode = BYTE_CHAR

local NEW_OPTS = {special_tokens = "table"}

local function check_self(self, who)
  if getmetatable(self) ~= ByteBPE then
    errors.fail(who, "call it as a method (tok:%s(...)), got %s as the tokenizer", who:match("[^.]+$"), type(self))
  end
end

-- tokens: id -> token; merges: list of {a, b, line}; where(k): how to name
-- merge k in a message
local function build(who, tokens, ids, merges, opts, where)
  local o = options.check(who, opts, NEW_OPTS)
  local self = setmetatable({}, ByteBPE)
  self._tokens, self._ids = tokens, ids
  local size = 0
  for id in pairs(tokens) do if id > size then size = id end end
  self.vocab_size = size
  local byte_id = {}
  for b = 0, 255 do
    byte_id[b] = ids[BYTE_CHAR[b]]
    if byte_id[b] == nil then
      errors.fail(who, "the vocabulary has no token for byte 0x%02X (%q): not a byte-level BPE vocabulary",
        b, BYTE_CHAR[b])
    end
  end
  local rank, merged = {}, {}
  for k, m in ipairs(merges) do
    local a, b = ids[m[1]], ids[m[2]]
    local ab = ids[m[1] .. m[2]]
    for _, p in ipairs({{a, m[1]}, {b, m[2]}, {ab, m[1] .. m[2]}}) do
      if p[1] == nil then
        errors.fail(who, "%s merges %q and %q, but %q is not in the vocabulary", where(k, m), m[1], m[2], p[2])
      end
    end
    rank[a * SHIFT + b] = k -- a merge listed twice: its last rank, as encoder.py's dict
    merged[a * SHIFT + b] = ab
  end
  self._byte_id, self._rank, self._merged = byte_id, rank, merged
  self.num_merges = #merges
  local special = o.special_tokens
  if special == nil then
    special = {}
    for t in pairs(ids) do
      if t:find("^<|.*|>$") then special[#special + 1] = t end
    end
    table.sort(special)
  end
  self.special_tokens, self._special_ids = {}, {}
  for k, t in ipairs(special) do
    if type(t) ~= "string" or ids[t] == nil then
      errors.fail(who, "special_tokens[%d] (%s) is not a token of the vocabulary", k, tostring(t))
    end
    self.special_tokens[k] = t
    self._special_ids[ids[t]] = true
  end
  self.eos_token_id = ids["<|endoftext|>"]
  self.bos_token_id = self.eos_token_id
  self._cache, self._ncache = {}, 0
  return self
end

-- ByteBPE.new(vocab, merges, opts): vocab a list of tokens (the id of each
-- its position), merges a list of "a b" strings or {a, b} pairs, by rank
function ByteBPE.new(vocab, merges, opts, ...)
  local who = "text.ByteBPE.new"
  files.no_extra(who, "ByteBPE.new(vocab, merges[, opts])", 3, ...)
  if type(vocab) ~= "table" then errors.fail(who, "expected a list of tokens, got %s", type(vocab)) end
  if type(merges) ~= "table" then errors.fail(who, "expected a list of merges, got %s", type(merges)) end
  local ids = {}
  for k = 1, #vocab do
    local t = vocab[k]
    if type(t) ~= "string" or t == "" then errors.fail(who, "token %d must be a non-empty string, got %q", k, tostring(t)) end
    if ids[t] then errors.fail(who, "token %q is listed twice (ids %d and %d)", t, ids[t], k) end
    ids[t] = k
  end
  if #vocab == 0 then errors.fail(who, "the vocabulary is empty") end
  if #vocab >= MAX_ID then errors.fail(who, "the vocabulary has %d tokens, more than %d", #vocab, MAX_ID - 1) end
  local ms = {}
  for k = 1, #merges do
    local m = merges[k]
    if type(m) == "string" then
      local a, b = m:match("^(%S+) (%S+)$")
      if a == nil then errors.fail(who, "merges[%d] must be \"a b\" (two tokens, one space), got %q", k, m) end
      ms[k] = {a, b}
    elseif type(m) == "table" and type(m[1]) == "string" and type(m[2]) == "string" then
      ms[k] = {m[1], m[2]}
    else
      errors.fail(who, "merges[%d] must be a string \"a b\" or a pair {a, b}, got %s", k, type(m))
    end
  end
  local tokens = {}
  for k = 1, #vocab do tokens[k] = vocab[k] end
  return build(who, tokens, ids, ms, opts,
    function(k) return ("merges[%d]"):format(k) end)
end

-- ByteBPE.from_files(vocab_json, merges_txt, opts): GPT-2's files
function ByteBPE.from_files(vocab_path, merges_path, opts, ...)
  local who = "text.ByteBPE.from_files"
  files.no_extra(who, "ByteBPE.from_files(vocab_path, merges_path[, opts])", 3, ...)
  options.check(who, opts, NEW_OPTS)
  local core = require "needle.core"
  local js = files.read(who, vocab_path, "vocabulary")
  local array_mt = {}
  local v, err = core._json_decode(js, array_mt)
  if err ~= nil then errors.fail(who, "'%s' is not valid JSON: %s", vocab_path, err) end
  if type(v) ~= "table" or getmetatable(v) == array_mt then
    errors.fail(who, "'%s' must hold a JSON object {token: id, ...}, got a JSON %s", vocab_path,
      type(v) == "table" and "array" or type(v))
  end
  local tokens, ids, n = {}, {}, 0
  for t, id in pairs(v) do
    if math.type(id) ~= "integer" or id < 0 or id >= MAX_ID - 1 then
      errors.fail(who, "'%s': the id of %q must be an integer in 0..%d, got %s", vocab_path, t, MAX_ID - 2,
        type(id) == "table" and "a JSON " .. (getmetatable(id) == array_mt and "array" or "object")
        or type(id) == "string" and ("the string %q"):format(id) or tostring(id))
    end
    if t == "" then errors.fail(who, "'%s': the empty string is not a token", vocab_path) end
    if tokens[id + 1] then
      local a, b = tokens[id + 1], t
      if b < a then a, b = b, a end
      errors.fail(who, "'%s': tokens %q and %q share the id %d", vocab_path, a, b, id)
    end
    tokens[id + 1], ids[t] = t, id + 1
    n = n + 1
  end
  if n == 0 then errors.fail(who, "'%s' has no tokens", vocab_path) end
  local ms = files.read(who, merges_path, "merges")
  local merges, lines = {}, {}
  for k, line in files.lines(ms) do
    if line ~= "" and not (k == 1 and line:find("^#version")) then
      local a, b = line:match("^([^ ]+) ([^ ]+)$")
      if a == nil then
        errors.fail(who, "'%s' line %d: expected two tokens separated by one space, got %q", merges_path, k,
          #line > 60 and line:sub(1, 60) .. "..." or line)
      end
      merges[#merges + 1] = {a, b}
      lines[#merges] = k
    end
  end
  return build(who, tokens, ids, merges, opts,
    function(k) return ("'%s' line %d"):format(merges_path, lines[k]) end)
end

function ByteBPE:__tostring()
  return ("needle.text.ByteBPE(%d tokens, %d merges)"):format(self.vocab_size, self.num_merges)
end

-- the ids of one piece (a number for one id, else a list), cached
function ByteBPE:_bpe(piece)
  local byte_id, rank, merged = self._byte_id, self._rank, self._merged
  local n = #piece
  local sym = {byte(piece, 1, n <= 4000 and n or 4000)}
  for k = 4001, n do sym[k] = byte(piece, k) end
  for k = 1, n do sym[k] = byte_id[sym[k]] end
  while n > 1 do
    local best, at = nil, 0
    local prev = sym[1]
    for k = 2, n do
      local cur = sym[k]
      local r = rank[prev * SHIFT + cur]
      if r and (best == nil or r < best) then best, at = r, k - 1 end
      prev = cur
    end
    if best == nil then break end
    -- merge every occurrence of the pair, left to right (encoder.py's bpe)
    local a, b = sym[at], sym[at + 1]
    local m = merged[a * SHIFT + b]
    local w, k = at - 1, at
    while k <= n do
      w = w + 1
      if k < n and sym[k] == a and sym[k + 1] == b then
        sym[w] = m
        k = k + 2
      else
        sym[w] = sym[k]
        k = k + 1
      end
    end
    for q = w + 1, n do sym[q] = nil end
    n = w
  end
  local out = n == 1 and sym[1] or sym
  if self._ncache >= CACHE_MAX then self._cache, self._ncache = {}, 0 end
  self._cache[piece] = out
  self._ncache = self._ncache + 1
  return out
end

-- appends the ids of s:sub(i, j) (no special tokens) to out and, when offs
-- is given, each id's {first, last} bytes of s to offs: a piece's tokens
-- spell its bytes in order, each token the bytes it stands for
function ByteBPE:_encode_plain(s, i, j, out, offs)
  local cache = self._cache
  local n = #out
  while i <= j do
    local stop = piece_end(s, i, j)
    local piece = sub(s, i, stop)
    local v = cache[piece] or self:_bpe(piece)
    if type(v) == "number" then
      n = n + 1
      out[n] = v
      if offs then offs[n] = {i, stop} end
    else
      local at = i
      for k = 1, #v do
        out[n + k] = v[k]
        if offs then
          local len = #self:_bytes_of(v[k])
          offs[n + k] = {at, at + len - 1}
          at = at + len
        end
      end
      n = n + #v
    end
    i = stop + 1
  end
end

-- the special tokens of allowed_special, checked
local function allowed_list(self, who, allowed)
  if allowed == nil then return {} end
  if allowed == "all" then return self.special_tokens end
  if type(allowed) ~= "table" then
    errors.fail(who, "allowed_special must be \"all\" or a list of special tokens, got %s", type(allowed))
  end
  for k, t in ipairs(allowed) do
    if type(t) ~= "string" or self._ids[t] == nil or t == "" then
      errors.fail(who, "allowed_special[%d] (%s) is not a token of the vocabulary", k, tostring(t))
    end
  end
  return allowed
end

-- tok:encode(text, {allowed_special = nil | "all" | {tokens},
-- return_offsets_mapping = false}) -> ids[, offsets]. The allowed special
-- tokens written in text become their one id; anything else (special tokens
-- not allowed included) is encoded as plain text. With
-- return_offsets_mapping, offsets[k] = {first, last}: the bytes of text that
-- token k stands for (1-based, inclusive; a leading space included, as
-- GPT-2's fast tokenizer, whose post-processor does not trim offsets).
function ByteBPE:encode(text, opts, ...)
  local who = "text.ByteBPE.encode"
  check_self(self, who)
  files.no_extra(who, "tok:encode(text[, opts])", 2, ...)
  return self:_encode(who, text, opts)
end

function ByteBPE:_encode(who, text, opts)
  local o = options.check(who, opts, {allowed_special = "string|table", return_offsets_mapping = "boolean"})
  if type(text) ~= "string" then errors.fail(who, "text must be a string, got %s", type(text)) end
  local allowed = allowed_list(self, who, o.allowed_special)
  local out = {}
  local offs = o.return_offsets_mapping and {} or nil
  local pos, n = 1, #text
  while pos <= n do
    local first, ftok
    for _, t in ipairs(allowed) do
      local p = text:find(t, pos, true)
      if p and (first == nil or p < first or (p == first and #t > #ftok)) then first, ftok = p, t end
    end
    if first == nil then
      self:_encode_plain(text, pos, n, out, offs)
      break
    end
    self:_encode_plain(text, pos, first - 1, out, offs)
    out[#out + 1] = self._ids[ftok]
    if offs then offs[#out] = {first, first + #ftok - 1} end
    pos = first + #ftok
  end
  if offs then return out, offs end
  return out
end

-- tok:tokenize(text, opts) -> the tokens (byte-level strings, "Ġworld"), as
-- HF's tokenize[, offsets]; opts as encode's
function ByteBPE:tokenize(text, opts, ...)
  local who = "text.ByteBPE.tokenize"
  check_self(self, who)
  files.no_extra(who, "tok:tokenize(text[, opts])", 2, ...)
  local ids, offs = self:_encode(who, text, opts)
  for k = 1, #ids do ids[k] = self._tokens[ids[k]] end
  if offs then return ids, offs end
  return ids
end

-- id -> the bytes the token stands for (a token that is not made of
-- byte stand-ins, an added or special token, stands for its own text)
function ByteBPE:_bytes_of(id)
  local bytes = self._bytes
  if bytes == nil then
    bytes = {}
    self._bytes = bytes
  end
  local s = bytes[id]
  if s then return s end
  local t = self._tokens[id]
  local out, ok = {}, true
  for _, c in utf8.codes(t) do
    local b = CHAR_BYTE[utf8.char(c)]
    if b == nil then ok = false break end
    out[#out + 1] = string.char(b)
  end
  s = ok and concat(out) or t
  bytes[id] = s
  return s
end

-- tok:decode(ids, {skip_special_tokens = false}) -> the bytes of the text
function ByteBPE:decode(ids, opts, ...)
  local who = "text.ByteBPE.decode"
  check_self(self, who)
  files.no_extra(who, "tok:decode(ids[, opts])", 2, ...)
  local o = options.check(who, opts, {skip_special_tokens = "boolean"})
  ids = E.id_list(who, ids, self.vocab_size, self._tokens)
  local parts = {}
  for k = 1, #ids do
    if not (o.skip_special_tokens and self._special_ids[ids[k]]) then parts[#parts + 1] = self:_bytes_of(ids[k]) end
  end
  return concat(parts)
end

-- tok:convert_tokens_to_ids(token | list) -> id(s), nil for a token outside the vocabulary
function ByteBPE:convert_tokens_to_ids(t, ...)
  local who = "text.ByteBPE.convert_tokens_to_ids"
  check_self(self, who)
  files.no_extra(who, "tok:convert_tokens_to_ids(token or list)", 1, ...)
  if files.check_tokens(who, t) then return self._ids[t] end
  local out = {}
  for k = 1, #t do out[k] = self._ids[t[k]] end
  return out
end

-- tok:convert_ids_to_tokens(id | list) -> token(s)
function ByteBPE:convert_ids_to_tokens(ids, ...)
  local who = "text.ByteBPE.convert_ids_to_tokens"
  check_self(self, who)
  files.no_extra(who, "tok:convert_ids_to_tokens(id or list)", 1, ...)
  if type(ids) == "number" then return self._tokens[E.id_list(who, {ids}, self.vocab_size, self._tokens)[1]] end
  ids = E.id_list(who, ids, self.vocab_size, self._tokens)
  local out = {}
  for k = 1, #ids do out[k] = self._tokens[ids[k]] end
  return out
end

return ByteBPE
