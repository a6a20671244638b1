-- needle.text.unicode: what the tokenizers need to know about code points
-- (internal), from tables generated out of Python's unicodedata
-- (spec/fixtures/gen/gen_text_unicode.py writes unicode_data.lua and
-- unicode_strip.lua; the Unicode version is U.version).
--
--   U.decode(s, i)   -> code point, index after it; or nil when the bytes at
--                       i are not a valid UTF-8 sequence (overlong forms,
--                       surrogates and values past U+10FFFF are invalid)
--   U.code(cp)       -> the class code: code & 15 is one of the CLASS values,
--                       code & U.CASED, & U.CASE_IGNORABLE, & U.WHITE_SPACE
--                       the properties of those names
--   U.lower(cp)      -> the lower-case code point (Python's str.lower), or a
--                       string when that is several (U+0130 only)
--   U.is_cased(code), U.is_case_ignorable(code)
--   U.strip_table()  -> cp -> its NFD without nonspacing marks (a string),
--                       where that differs from cp (loaded on first use)
--   U.hangul_nfd(cp) -> the jamo string of a Hangul syllable, or nil
--   U.is_cjk(cp)     -> BERT's _is_chinese_char
--
-- Codes are memoized per code point (a table keyed by integers: no strings
-- are made), so text with few distinct characters costs one lookup each.
local data = require "needle.text.unicode_data"

local U = {}

U.version = data.unicode_version
-- the grouped general categories (code & 15)
U.CLASS = {
  LC = 1, Lm = 2, Lo = 3,      -- letters: cased (Lu Ll Lt), modifier, other
  Mn = 4, Mc = 5, Me = 6,      -- marks
  N = 7, P = 8,                -- numbers (Nd Nl No), punctuation (all P*)
  Sk = 9, S = 10,              -- modifier symbols; the other symbols (Sm Sc So)
  Zs = 11, Zlp = 12,           -- space separators; line and paragraph separators
  Cc = 13, Cf = 14, Cx = 15,   -- controls; format; unassigned, private use, surrogates
}
U.CASED, U.CASE_IGNORABLE, U.WHITE_SPACE = 16, 32, 64

local starts, codes = data.starts, data.codes
local nranges = #starts
local memo = {}

local function lookup(cp)
  local lo, hi = 1, nranges
  while lo < hi do -- the last range whose start is <= cp
    local mid = (lo + hi + 1) // 2
    if starts[mid] <= cp then lo = mid else hi = mid - 1 end
  end
  local c = codes[lo]
  memo[cp] = c
  return c
end

function U.code(cp)
  return memo[cp] or lookup(cp)
end
for cp = 0, 127 do lookup(cp) end

function U.is_cased(code) return code & 16 ~= 0 end
function U.is_case_ignorable(code) return code & 32 ~= 0 end

local lower_map = {}
do
  local r = data.lower_runs
  for k = 1, #r, 4 do
    for cp = r[k], r[k + 1], r[k + 2] do lower_map[cp] = cp + r[k + 3] end
  end
  for cp, s in pairs(data.lower_special) do lower_map[cp] = s end
end
function U.lower(cp) return lower_map[cp] or cp end
U.lower_map = lower_map -- for loops that inline the lookup

local strip
function U.strip_table()
  strip = strip or require "needle.text.unicode_strip"
  return strip
end

-- Unicode's algorithmic decomposition of the 11172 Hangul syllables
-- (chapter 3.12): NFD turns each into two or three conjoining jamo (Lo),
-- which BERT's accent stripping keeps.
function U.hangul_nfd(cp)
  local s = cp - 0xAC00
  if s < 0 or s > 11171 then return nil end
  local l, v, t = 0x1100 + s // 588, 0x1161 + (s % 588) // 28, s % 28
  if t == 0 then return utf8.char(l, v) end
  return utf8.char(l, v, 0x11A7 + t)
end

-- the CJK Unified Ideographs blocks of BERT's _is_chinese_char (not Hangul,
-- Hiragana or Katakana, which BERT treats as letters of words)
function U.is_cjk(cp)
  return (cp >= 0x4E00 and cp <= 0x9FFF) or (cp >= 0x3400 and cp <= 0x4DBF)
      or (cp >= 0x20000 and cp <= 0x2A6DF) or (cp >= 0x2A700 and cp <= 0x2B73F)
      or (cp >= 0x2B740 and cp <= 0x2B81F) or (cp >= 0x2B820 and cp <= 0x2CEAF)
      or (cp >= 0xF900 and cp <= 0xFAFF) or (cp >= 0x2F800 and cp <= 0x2FA1F)
end

local byte = string.byte

function U.decode(s, i)
  local c = byte(s, i)
  if c == nil then return nil end
  if c < 0x80 then return c, i + 1 end
  if c < 0xC2 or c > 0xF4 then return nil end
  local c1 = byte(s, i + 1)
  if c1 == nil or c1 < 0x80 or c1 > 0xBF then return nil end
  if c < 0xE0 then return ((c & 0x1F) << 6) | (c1 & 0x3F), i + 2 end
  if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F) then return nil end
  local c2 = byte(s, i + 2)
  if c2 == nil or c2 < 0x80 or c2 > 0xBF then return nil end
  if c < 0xF0 then return ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (c2 & 0x3F), i + 3 end
  if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F) then return nil end
  local c3 = byte(s, i + 3)
  if c3 == nil or c3 < 0x80 or c3 > 0xBF then return nil end
  return ((c & 0x07) << 18) | ((c1 & 0x3F) << 12) | ((c2 & 0x3F) << 6) | (c3 & 0x3F), i + 4
end

return U
