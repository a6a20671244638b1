-- needle.text.bert_basic: BERT's BasicTokenizer (internal), the step before
-- WordPiece, as Hugging Face's BertTokenizer does it (tokenization_bert.py):
-- clean the text (drop NUL, U+FFFD and control characters; whitespace is a
-- separator), put CJK ideographs in words of their own, lower-case (Python's
-- str.lower, with its final-sigma rule), strip accents (NFD, then drop the
-- nonspacing marks Mn), and split each punctuation character (ASCII
-- 33-47, 58-64, 91-96, 123-126, or a Unicode P* category) into a word of
-- its own.
--
--   pieces(chunk, cfg, out[, spans]) appends to out the words of chunk, a
--   run of text with no ASCII whitespace (" \t\n\r") in it, as strings, with
--   their lengths in characters at out.nchars[k]. cfg: {lowercase =,
--   strip_accents =, chinese =} (booleans). With spans, out.bf[k] and
--   out.bl[k] also say where each byte of word k came from: the first and
--   last byte in chunk of the character it was made from (lower-casing and
--   accent stripping change lengths, so a word's bytes are not the chunk's;
--   the offsets of tokens, for question answering, are read from these).
--
-- A chunk of printable ASCII takes a short path (string.lower and a byte
-- scan); anything else is decoded into code points.
local U = require "needle.text.unicode"

local M = {}

local byte, sub, lower, concat, uchar = string.byte, string.sub, string.lower, table.concat, utf8.char
local C = U.CLASS
local lower_map = U.lower_map

-- ASCII bytes that BERT splits off: every printable non-alphanumeric
local ASCII_PUNCT = {}
for b = 33, 126 do
  local ch = string.char(b)
  if not ch:find("^[A-Za-z0-9]$") then ASCII_PUNCT[b] = true end
end

local function is_punct(cp, code)
  if cp < 128 then return ASCII_PUNCT[cp] == true end
  return code & 15 == C.P
end

local function push(out, s, n, bf, bl)
  local k = #out + 1
  out[k] = s
  out.nchars[k] = n
  if out.bf then out.bf[k], out.bl[k] = bf, bl end
end

-- the byte origins of an ASCII word at chunk bytes i..e: itself
local function identity_span(i, e)
  local bf = {}
  for p = i, e do bf[p - i + 1] = p end
  return bf, bf
end

local function ascii_pieces(chunk, cfg, out)
  if cfg.lowercase then chunk = lower(chunk) end
  local i, n = 1, #chunk
  while i <= n do
    local b = byte(chunk, i)
    local e = i
    if not ASCII_PUNCT[b] then e = select(2, chunk:find("^[A-Za-z0-9]+", i)) end
    if out.bf then
      push(out, sub(chunk, i, e), e - i + 1, identity_span(i, e))
    else
      push(out, sub(chunk, i, e), e - i + 1)
    end
    i = e + 1
  end
end

-- Python's str.lower of word[k] (a capital sigma looks at its neighbours:
-- Unicode's Final_Sigma context, with case-ignorable characters skipped)
local function lower_at(word, k)
  local cp = word[k]
  if cp ~= 0x3A3 then return lower_map[cp] or cp end
  local j = k - 1
  while j >= 1 and U.is_case_ignorable(U.code(word[j])) do j = j - 1 end
  if j < 1 or not U.is_cased(U.code(word[j])) then return 0x3C3 end
  j = k + 1
  while j <= #word and U.is_case_ignorable(U.code(word[j])) do j = j + 1 end
  if j <= #word and U.is_cased(U.code(word[j])) then return 0x3C3 end
  return 0x3C2
end

-- appends the code points of string s to list t (and, with a list from,
-- the origin o for each to from)
local function append_cps(t, s, from, o)
  for _, c in utf8.codes(s) do
    t[#t + 1] = c
    if from then from[#t] = o end
  end
end

-- the word's code points after lower-casing and accent stripping. word.at,
-- when present, gives each code point's origin (an index into the chunk's
-- characters); the result carries the origins along.
local function normalize(word, cfg)
  if cfg.lowercase then
    local lw, at = {}, word.at and {}
    for k = 1, #word do
      local l = lower_at(word, k)
      if type(l) == "string" then
        append_cps(lw, l, at, at and word.at[k])
      else
        lw[#lw + 1] = l
        if at then at[#lw] = word.at[k] end
      end
    end
    lw.at = at
    word = lw
  end
  if cfg.strip_accents then
    local strip, sw, at = U.strip_table(), {}, word.at and {}
    for k = 1, #word do
      local cp = word[k]
      local rep = strip[cp] or U.hangul_nfd(cp)
      if rep then
        append_cps(sw, rep, at, at and word.at[k]) -- already without Mn
      elseif U.code(cp) & 15 ~= C.Mn then
        sw[#sw + 1] = cp
        if at then at[#sw] = word.at[k] end
      end
    end
    sw.at = at
    word = sw
  end
  return word
end

-- splits a normalized word on punctuation into out
local function split_punct(word, out)
  local buf, nb = {}, 0
  local function flush()
    if nb > 0 then
      push(out, concat(buf, "", 1, nb), nb)
      nb = 0
    end
  end
  for k = 1, #word do
    local cp = word[k]
    if is_punct(cp, U.code(cp)) then
      flush()
      push(out, uchar(cp), 1)
    else
      nb = nb + 1
      buf[nb] = uchar(cp)
    end
  end
  flush()
end

-- split_punct with origins: word.at[k] is the chunk character code point k
-- came from, cf and cl the chunk characters' first and last bytes; each
-- piece's bytes get their character's origin (out.bf, out.bl)
local function split_punct_spans(word, out, cf, cl)
  local buf, nb = {}, 0
  local at, bf, bl = word.at, {}, {}
  local function flush()
    if nb > 0 then
      push(out, concat(buf, "", 1, nb), nb, bf, bl)
      nb, bf, bl = 0, {}, {}
    end
  end
  for k = 1, #word do
    local cp = word[k]
    local ch, o = uchar(cp), at[k]
    local punct = is_punct(cp, U.code(cp))
    if punct then flush() end
    for _ = 1, #ch do
      bf[#bf + 1], bl[#bl + 1] = cf[o], cl[o]
    end
    if punct then
      push(out, ch, 1, bf, bl)
      bf, bl = {}, {}
    else
      nb = nb + 1
      buf[nb] = ch
    end
  end
  flush()
end

local function unicode_pieces(chunk, cfg, out)
  -- with spans: the first and last byte of every character of the chunk,
  -- and each word's code points' characters (word.at)
  local spans = out.bf ~= nil
  local cf, cl, nc = spans and {} or nil, spans and {} or nil, 0
  local word, nw = {}, 0
  if spans then word.at = {} end
  local function finish()
    if nw > 0 then
      if spans then
        split_punct_spans(normalize(word, cfg), out, cf, cl)
        word = {at = {}}
      else
        split_punct(normalize(word, cfg), out)
        word = {}
      end
      nw = 0
    end
  end
  local decode = U.decode
  local i, n = 1, #chunk
  while i <= n do
    local cp, nx = decode(chunk, i) -- the text was checked: always valid here
    if spans then
      nc = nc + 1
      cf[nc], cl[nc] = i, nx - 1
    end
    local code = U.code(cp)
    local cls = code & 15
    if cp == 0 or cp == 0xFFFD or (cls >= C.Cc and cp ~= 9 and cp ~= 10 and cp ~= 13) then
      -- removed (HF's _clean_text)
    elseif cls == C.Zs or cls == C.Zlp or cp == 9 or cp == 10 or cp == 13 then
      finish() -- whitespace (Zl, Zp: str.split's separators)
    else
      local cjk = cfg.chinese and U.is_cjk(cp)
      if cjk then finish() end
      nw = nw + 1
      word[nw] = cp
      if spans then word.at[nw] = nc end
      if cjk then finish() end
    end
    i = nx
  end
  finish()
end

function M.pieces(chunk, cfg, out, spans)
  out.nchars = out.nchars or {}
  if spans then out.bf, out.bl = out.bf or {}, out.bl or {} end
  if not chunk:find("[^\33-\126]") then
    ascii_pieces(chunk, cfg, out)
  else
    unicode_pieces(chunk, cfg, out)
  end
  return out
end

return M
