-- needle.text.gpt2_split: GPT-2's pre-tokenizer (internal), the regular
-- expression of OpenAI's encoder.py
--
--   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
--
-- written out by hand over UTF-8 (no regex library): at each position the
-- alternatives are tried in that order, as the regex engine does. \p{L} and
-- \p{N} are the Unicode letter and number categories and \s is White_Space
-- (needle.text.unicode's tables). A byte that is not part of valid UTF-8 is a
-- character of its own in none of those classes (as Python sees it after
-- decoding with errors = "surrogateescape"), so any byte string splits, and
-- the pieces concatenate back to it.
--
--   piece_end(s, i, j) -> the last byte of the piece that starts at byte i
--   (the text is s:sub(i, j); byte positions in s)
--   split(s, i, j, fn) calls fn(start, stop) for each piece of s:sub(i, j),
--   left to right
local U = require "needle.text.unicode"

local M = {}

local byte = string.byte
local decode, code_of = U.decode, U.code

local L, N, W, O = 1, 2, 3, 4 -- letter, number, whitespace, anything else

-- the kind of each code point below 128
local ASCII = {}
for b = 0, 127 do
  local ch = string.char(b)
  if ch:find("^[A-Za-z]$") then ASCII[b] = L
  elseif ch:find("^[0-9]$") then ASCII[b] = N
  elseif b == 32 or (b >= 9 and b <= 13) then ASCII[b] = W
  else ASCII[b] = O end
end

local function kind_of_code(c)
  if c & 64 ~= 0 then return W end
  local cls = c & 15
  if cls <= 3 then return L end
  if cls == 7 then return N end
  return O
end

-- the kind of the character at byte i of s, and the byte after it
local function kind_at(s, i)
  local b = byte(s, i)
  if b < 128 then return ASCII[b], i + 1 end
  local cp, nx = decode(s, i)
  if cp == nil then return O, i + 1 end
  return kind_of_code(code_of(cp)), nx
end
M.kind_at = kind_at
M.L, M.N, M.W, M.O = L, N, W, O

-- the ASCII characters of each kind, as Lua pattern sets: a run of them is
-- found by string.find in C, and only a non-ASCII character after it takes
-- the decoding loop
local RUN = {
  [L] = "^[A-Za-z]*",
  [N] = "^[0-9]*",
  [O] = "^[^A-Za-z0-9\t\n\v\f\r \128-\255]*",
}
local find = string.find

-- the byte after the run of characters of kind k that starts at i (j: the
-- last byte to look at)
local function run_end(s, i, j, k)
  local pat = RUN[k]
  while i <= j do
    local _, e = find(s, pat, i)
    i = e + 1
    if i > j then return j + 1 end
    if byte(s, i) < 128 then return i end
    local kk, nx = kind_at(s, i)
    if kk ~= k then return i end
    i = nx
  end
  return j + 1
end

-- the contraction at i (s[i] is "'"), or nil: its last byte
local function contraction(s, i, j)
  if i + 1 > j then return nil end
  local a = byte(s, i + 1)
  if a == 115 or a == 116 or a == 109 or a == 100 then return i + 1 end -- s t m d
  if i + 2 > j then return nil end
  local b = byte(s, i + 2)
  if (a == 114 and b == 101) or (a == 118 and b == 101) or (a == 108 and b == 108) then -- re ve ll
    return i + 2
  end
  return nil
end

-- the last byte of the piece that starts at byte i of s (i <= j)
function M.piece_end(s, i, j)
  -- most pieces are " ?[A-Za-z]+" followed by ASCII: one find in C
  local _, e = find(s, "^ ?[A-Za-z]+", i)
  if e ~= nil and e <= j and (e == j or byte(s, e + 1) < 128) then return e end
  local b = byte(s, i)
  if b == 39 then
    local stop = contraction(s, i, j)
    if stop then return stop end
  end
  local k, nx
  if b < 128 then k, nx = ASCII[b], i + 1 else k, nx = kind_at(s, i) end
  if b == 32 and nx <= j then
    -- " ?X+": a space followed by a letter, number or other character
    local k2, nx2 = kind_at(s, nx)
    if k2 ~= W then k, nx = k2, nx2 end
  end
  if k ~= W then return run_end(s, nx, j, k) - 1 end
  -- \s+(?!\S) then \s+: the whitespace run, less its last character when
  -- a non-space follows and the run is longer than one
  local last, p = i, nx
  while p <= j do
    local kk, q = kind_at(s, p)
    if kk ~= W then break end
    last, p = p, q
  end
  if p <= j and last > i then return last - 1 end
  return p - 1
end

-- split(s, i, j, fn): fn(start, stop) for each piece of s:sub(i, j)
function M.split(s, i, j, fn)
  local piece_end = M.piece_end
  while i <= j do
    local stop = piece_end(s, i, j)
    fn(i, stop)
    i = stop + 1
  end
end

return M
