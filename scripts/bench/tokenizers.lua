-- scripts/bench/tokenizers.lua - how many MB of text per second nd.text's
-- tokenizers encode (issue 21's target: at least 1 MB/s each, so that
-- tokenizing is never what a model waits for):
--
--   build/needle-lua scripts/bench/tokenizers.lua [--mb N] [--bert vocab.txt]
--                                                 [--gpt2 vocab.json merges.txt]
--
-- The text is generated (N MB, default 3): sentences of words drawn from a
-- Zipf distribution over a lexicon of 30000 made-up words (so that, as in
-- real text, a few words are most of it and a long tail is rare), with
-- punctuation, numbers, contractions, newlines, and one word in ten
-- non-ASCII (accented Latin, Greek, Cyrillic, CJK). Without files, the
-- vocabularies are synthetic and of about real size: WordPiece gets BERT's
-- shape (characters, "##" characters, common suffixes and the text's words,
-- at most 25000: about 18000 tokens in all); ByteBPE gets merges that build the 12000 most
-- frequent words (with and without their leading space) letter by letter,
-- about 40000 merges, GPT-2's order of size. With the real files (bert-base-uncased's vocab.txt,
-- gpt2's vocab.json and merges.txt) it measures those.
--
-- "built" is the time the constructor takes (from_file / new: reading and
-- checking the vocabulary and merges). "cold" is the first encode of the text by a new tokenizer (every distinct
-- word goes through the whole algorithm once); "warm" encodes it again
-- (the per-word caches hold everything). Both count the text's bytes.
local nd = require "needle"

local args = {...}
local MB, BERT, GPT2V, GPT2M = 3, nil, nil, nil
do
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--mb" then MB = tonumber(args[i + 1]); i = i + 2
    elseif a == "--bert" then BERT = args[i + 1]; i = i + 2
    elseif a == "--gpt2" then GPT2V, GPT2M = args[i + 1], args[i + 2]; i = i + 3
    else error("usage: tokenizers.lua [--mb N] [--bert vocab.txt] [--gpt2 vocab.json merges.txt]", 0) end
  end
end

-- a reproducible random stream (xorshift), so every run times the same text
local state = 88172645463325252
local function rand(n)
  state = state ~ (state << 13)
  state = state ~ (state >> 7)
  state = state ~ (state << 17)
  return (state >> 1) % n + 1
end

local SYL = {"ka", "to", "ri", "men", "sa", "lo", "ter", "ing", "pre", "con", "a", "e", "i", "o", "u", "st",
             "ble", "tion", "ly", "th", "qu", "ver", "ex", "de", "na", "po", "ran", "is", "ed", "er"}
local NONASCII = {"café", "naïve", "résumé", "Ångström", "Straße", "ελληνικά", "σοφός", "Привет", "мир",
                  "中文", "字符", "日本語", "über", "piñata", "façade", "crème"}
local NLEX = 30000
local lexicon = {}
for k = 1, NLEX do
  if k % 10 == 0 then
    lexicon[k] = NONASCII[rand(#NONASCII)] .. (k % 30 == 0 and SYL[rand(#SYL)] or "")
  else
    local w = {}
    for _ = 1, 1 + rand(3) do w[#w + 1] = SYL[rand(#SYL)] end
    lexicon[k] = table.concat(w)
  end
end

-- Zipf(1) over the lexicon: cumulative weights 1/k, sampled by bisection
local cum, total = {}, 0
for k = 1, NLEX do total = total + 1 / k; cum[k] = total end
local function zipf()
  local x = (rand(1 << 30) / (1 << 30)) * total
  local lo, hi = 1, NLEX
  while lo < hi do
    local mid = (lo + hi) // 2
    if cum[mid] < x then lo = mid + 1 else hi = mid end
  end
  return lo
end

local function make_text(bytes)
  local parts, n = {}, 0
  while n < bytes do
    local sent = {}
    for i = 1, 4 + rand(14) do
      local w = lexicon[zipf()]
      if i == 1 then w = w:gsub("^%l", string.upper) end
      local r = rand(40)
      if r == 1 then w = w .. "," elseif r == 2 then w = w .. "'s" elseif r == 3 then w = tostring(rand(2025))
      elseif r == 4 then w = "(" .. w .. ")" end
      sent[#sent + 1] = w
    end
    local s = table.concat(sent, " ") .. (rand(5) == 1 and ".\n" or ". ")
    parts[#parts + 1] = s
    n = n + #s
  end
  return table.concat(parts)
end

local text = make_text(math.floor(MB * 1e6))
local mb = #text / 1e6

-- the most frequent words of the text (lower-cased for BERT's vocabulary)
local function frequent(lower, limit)
  local count = {}
  for w in text:gmatch("[^%s%p]+") do
    if lower then w = w:lower() end
    count[w] = (count[w] or 0) + 1
  end
  local words = {}
  for w in pairs(count) do words[#words + 1] = w end
  table.sort(words, function(a, b) return count[a] > count[b] or (count[a] == count[b] and a < b) end)
  local out = {}
  for k = 1, math.min(limit, #words) do out[k] = words[k] end
  return out
end

local function bert_tokenizer()
  if BERT then return function() return nd.text.WordPiece.from_file(BERT) end, BERT end
  local vocab, seen = {}, {}
  local function add(t) if not seen[t] then seen[t] = true; vocab[#vocab + 1] = t end end
  for _, t in ipairs({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) do add(t) end
  for _, c in utf8.codes(text:lower()) do
    local ch = utf8.char(c)
    if not ch:find("^%s$") then add(ch); add("##" .. ch) end
  end
  for _, s in ipairs({"s", "ing", "ed", "ly", "er", "tion", "st", "ka", "ri", "men", "sa", "ter", "con"}) do add("##" .. s) end
  for _, w in ipairs(frequent(true, 25000)) do add(w) end
  return function() return nd.text.WordPiece.new(vocab) end, ("synthetic, %d tokens"):format(#vocab)
end

local function gpt2_tokenizer()
  if GPT2V then return function() return nd.text.ByteBPE.from_files(GPT2V, GPT2M) end, GPT2V end
  local B = nd.text.ByteBPE.bytes_to_unicode
  local vocab, seen, merges = {}, {}, {}
  local function add(t) if not seen[t] then seen[t] = true; vocab[#vocab + 1] = t end end
  for b = 0, 255 do add(B[b]) end
  local function build(w)
    -- merges that make the byte-level form of w left to right
    local cur
    for i = 1, #w do
      local c = B[w:byte(i)]
      if cur == nil then cur = c else
        local m = cur .. c
        if not seen[m] then merges[#merges + 1] = cur .. " " .. c; add(m) end
        cur = m
      end
    end
  end
  for _, w in ipairs(frequent(false, 12000)) do build(w); build(" " .. w) end
  add("<|endoftext|>")
  return function() return nd.text.ByteBPE.new(vocab, merges) end,
    ("synthetic, %d tokens, %d merges"):format(#vocab, #merges)
end

-- wall-clock seconds, and the process's CPU seconds (os.clock): on a
-- machine others are busy on, the CPU time is what the code costs
local function time(fn)
  collectgarbage()
  local t0, c0 = nd.clock(), os.clock()
  local r = fn()
  return nd.clock() - t0, r, os.clock() - c0
end

print(("text: %.2f MB, %d lines (generated; Lua %s)"):format(mb, select(2, text:gsub("\n", "")), _VERSION))
for _, case in ipairs({
  {"WordPiece", bert_tokenizer, function(t) return t:encode(text, {add_special_tokens = false}).input_ids end},
  -- with each token's bytes in the text (for question answering's answers)
  {"WordPiece", bert_tokenizer, function(t)
    return t:encode(text, {add_special_tokens = false, return_offsets_mapping = true}).input_ids
  end, "offsets"},
  {"ByteBPE", gpt2_tokenizer, function(t) return t:encode(text) end},
}) do
  local make, what = case[2]()
  local tbuild, tok = time(make)
  local cold, ids, ccpu = time(function() return case[3](tok) end)
  local warm, _, wcpu = time(function() return case[3](tok) end)
  print(("%-9s (%s%s; built in %.2f s): %d tokens\n  cold %.2f MB/s (%.2f s; CPU time %.2f s: %.2f MB/s)\n" ..
         "  warm %.2f MB/s (%.2f s; CPU time %.2f s: %.2f MB/s)"):format(case[1], what,
    case[4] and (", " .. case[4]) or "", tbuild, #ids,
    mb / cold, cold, ccpu, mb / ccpu, mb / warm, warm, wcpu, mb / wcpu))
end
