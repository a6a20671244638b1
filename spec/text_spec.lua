-- text_spec.lua - nd.text's tokenizers (issue 21, item 3): WordPiece (BERT)
-- and byte-level BPE (GPT-2).
--
--   build/needle-lua spec/run.lua spec/text_spec.lua
--
-- Three kinds of checks: tokenizations worked out by hand from the published
-- algorithms on small vocabularies built here; cross-checks against
-- spec/fixtures/text/expected.lua, computed by independent Python
-- implementations (spec/fixtures/gen/gen_text_reference.py: a port of
-- Hugging Face's BertTokenizer, OpenAI's encoder.py with its regex written
-- out, checked against the `regex` module) on tricky strings; and files that
-- are wrong in every way we could think of, which must give clear errors.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local S = require "spec.helpers.shell"
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local T = nd.text
local FIX = "spec/fixtures/text/"
local X = dofile(FIX .. "expected.lua")

local function plus1(list)
  local out = {}
  for k, v in ipairs(list) do out[k] = v + 1 end
  return out
end

-- a reproducible stream of integers 1..n (xorshift)
local function rng(seed)
  local s = seed
  return function(n)
    s = s ~ (s << 13)
    s = s ~ (s >> 7)
    s = s ~ (s << 17)
    return (s >> 1) % n + 1
  end
end

local function tmpfile(content)
  local p = os.tmpname()
  S.write_file(p, content)
  return p
end

-- the hand-worked WordPiece vocabulary: id = position (1-based)
local WP_VOCAB = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "want", "##ed",
                  ",", "runn", "##ing", "a", "ab", "##c", "##bc", "hello", "!", "中", "cafe", ".", "'", "s",
                  "##s", "the", "?", "##b", "##want"}

describe("nd.text", function()
  it("is a lazy entry of nd with the two tokenizers", function()
    assert.are.equal("needle.text", getmetatable(nd).__lazy.text)
    assert.is_table(T.WordPiece)
    assert.is_table(T.ByteBPE)
  end)
end)

describe("WordPiece, by hand", function()
  local tok = T.WordPiece.new(WP_VOCAB)

  it("splits words greedily, longest match first, with ## continuations", function()
    assert.are.same({"un", "##aff", "##able"}, tok:tokenize("unaffable"))
    -- "abc": "abc" is not a token, "ab" is, then "##c" ("a" + "##bc" is never tried)
    assert.are.same({"ab", "##c"}, tok:tokenize("abc"))
    assert.are.same({"un", "##want", "##ed", ",", "runn", "##ing"}, tok:tokenize("UNwanted,running"))
    -- a word with a piece that matches nothing is [UNK] as a whole
    assert.are.same({"[UNK]", "the"}, tok:tokenize("unzzz the"))
  end)

  it("gives ids that are vocabulary lines (1-based)", function()
    assert.are.same({6, 7, 8}, tok:encode("unaffable", {add_special_tokens = false}).input_ids)
    assert.are.equal(2, tok.unk_token_id)
    assert.are.equal(1, tok.pad_token_id)
    assert.are.equal("##aff", tok:convert_ids_to_tokens(7))
    assert.are.same({18, 2}, tok:convert_tokens_to_ids({"hello", "nope"}))
  end)

  it("runs BERT's basic tokenizer: case, accents, punctuation, CJK, controls, whitespace", function()
    assert.are.same({"cafe", "."}, tok:tokenize("Café."))               -- lower, NFD, drop Mn
    assert.are.same({"cafe"}, tok:tokenize("Cafe\u{301}"))             -- a combining accent
    assert.are.same({"hello", "中", "the"}, tok:tokenize("hello中the"))  -- CJK on its own
    assert.are.same({"hello"}, tok:tokenize("hel\0lo\u{200B}"))        -- NUL, Cf removed
    assert.are.same({"hello", "the"}, tok:tokenize("hello\u{A0}the"))   -- Zs separates
    assert.are.same({"hello", "the"}, tok:tokenize("hello\u{2028}the")) -- so does Zl
    assert.are.same({"the", "'", "s", "?"}, tok:tokenize(" the's? "))
    assert.are.same({}, tok:tokenize(" \t\n "))
    local cased = T.WordPiece.new(WP_VOCAB, {lowercase = false})
    assert.are.same({"[UNK]", "the"}, cased:tokenize("Café the"))
    assert.is_false(cased.strip_accents) -- follows lowercase, as HF's strip_accents = None
    local nocjk = T.WordPiece.new(WP_VOCAB, {tokenize_chinese_chars = false})
    assert.are.same({"[UNK]"}, nocjk:tokenize("hello中the"))
  end)

  it("counts max_input_chars_per_word in characters", function()
    local t4 = T.WordPiece.new(WP_VOCAB, {max_input_chars_per_word = 4})
    assert.are.same({"[UNK]", "cafe"}, t4:tokenize("hello café"))
  end)

  it("keeps special tokens written in the text whole", function()
    assert.are.same({3, 18, 4, 5}, tok:encode("[CLS]hello [SEP][MASK]", {add_special_tokens = false}).input_ids)
  end)

  it("encodes one text and pairs: [CLS] a [SEP] b [SEP], token types 1 and 2, attention mask", function()
    assert.are.same({input_ids = {3, 18, 19, 4}, token_type_ids = {1, 1, 1, 1}, attention_mask = {1, 1, 1, 1}},
                    tok:encode("hello!"))
    assert.are.same({input_ids = {3, 18, 4, 26, 21, 4}, token_type_ids = {1, 1, 1, 2, 2, 2},
                     attention_mask = {1, 1, 1, 1, 1, 1}}, tok:encode({"hello", "the cafe"}))
    assert.are.same({input_ids = {18, 26}, token_type_ids = {1, 1}, attention_mask = {1, 1}},
                    tok:encode("hello the", {add_special_tokens = false}))
  end)

  it("pads to max_length with [PAD], token type 1, mask 0", function()
    assert.are.same({input_ids = {3, 18, 4, 1, 1, 1}, token_type_ids = {1, 1, 1, 1, 1, 1},
                     attention_mask = {1, 1, 1, 0, 0, 0}}, tok:encode("hello", {max_length = 6, padding = "max_length"}))
  end)

  it("truncates with Hugging Face's strategies", function()
    local h3, t1 = "hello hello hello", "the"
    -- longest_first: one token at a time from the longer text
    assert.are.same({3, 18, 18, 4, 26, 4}, tok:encode({h3, t1}, {max_length = 6, truncation = true}).input_ids)
    -- ... and from the second on a tie
    assert.are.same({3, 18, 18, 4, 26, 4},
                    tok:encode({"hello hello", "the the"}, {max_length = 6, truncation = "longest_first"}).input_ids)
    assert.are.same({3, 18, 4, 26, 26, 4},
                    tok:encode({"hello", "the the the"}, {max_length = 6, truncation = "only_second"}).input_ids)
    assert.are.same({3, 18, 18, 4, 26, 4}, tok:encode({h3, t1}, {max_length = 6, truncation = "only_first"}).input_ids)
    -- max_length alone truncates; with padding to it, it does not (HF's rule)
    assert.are.same({3, 18, 18, 4}, tok:encode(h3, {max_length = 4}).input_ids)
    assert.are.same({3, 18, 18, 18, 4}, tok:encode(h3, {max_length = 4, padding = "max_length"}).input_ids)
    assert.are.same({3, 18, 18, 18, 4}, tok:encode(h3, {max_length = 4, truncation = false}).input_ids)
    -- model_max_length stands in for max_length
    local t5 = T.WordPiece.new(WP_VOCAB, {model_max_length = 3})
    assert.are.same({3, 18, 4}, t5:encode(h3, {truncation = true}).input_ids)
  end)

  it("encodes batches, padded to the longest, as lists or int64 tensors", function()
    local b = tok:encode_batch({"hello", {"the", "cafe ."}}, {padding = true})
    assert.are.same({{3, 18, 4, 1, 1, 1}, {3, 26, 4, 21, 22, 4}}, b.input_ids)
    assert.are.same({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 2, 2, 2}}, b.token_type_ids)
    assert.are.same({{1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 1}}, b.attention_mask)
    local t = tok:encode_batch({"hello", {"the", "cafe ."}}, {padding = true, return_tensors = true})
    assert.are.equal("int64", t.input_ids.dtype)
    assert.are.same({2, 6}, t.input_ids.shape)
    assert.are.same(b.input_ids, t.input_ids:totable())
    assert.are.same(b.attention_mask, t.attention_mask:totable())
    local m = tok:encode_batch({"hello", "the"}, {max_length = 5, padding = "max_length", return_tensors = true})
    assert.are.same({{3, 18, 4, 1, 1}, {3, 26, 4, 1, 1}}, m.input_ids:totable())
  end)

  it("feeds nd.nn.Embedding directly (1-based ids, no shifting)", function()
    local emb = nd.nn.Embedding(#WP_VOCAB, 4, {padding_idx = tok.pad_token_id})
    local t = tok:encode_batch({"hello", "the cafe"}, {padding = true, return_tensors = true})
    local out = emb(t.input_ids)
    assert.are.same({2, 4, 4}, out.shape)
    assert.are.same({0, 0, 0, 0}, out[1][4]:totable()) -- the [PAD] row
  end)

  it("decodes: joins ## pieces, removes spaces before punctuation, skips special tokens on request", function()
    local ids = {3, 6, 7, 8, 11, 12, 13, 4}
    assert.are.equal("[CLS] unaffable, running [SEP]", tok:decode(ids))
    assert.are.equal("unaffable, running", tok:decode(ids, {skip_special_tokens = true}))
    assert.are.equal("the cafe's", tok:decode({26, 21, 23, 24}))
    assert.are.equal("the cafe ' s", tok:decode({26, 21, 23, 24}, {clean_up_tokenization_spaces = false}))
    assert.are.equal("hello", tok:decode(nd.tensor({18}, {dtype = "int64"})))
  end)
end)

describe("WordPiece on tensors of every device", function()
  if D.pending_without_opencl(pending, "WordPiece encode_batch on OpenCL") then return end
  local tok = T.WordPiece.new(WP_VOCAB)
  for _, dev in ipairs(D.all()) do
    it("returns tensors on " .. D.describe(dev), function()
      local t = tok:encode_batch({"hello the", {"cafe", "a"}}, {padding = true, return_tensors = true, device = dev})
      assert.are.equal(dev, t.input_ids.device)
      assert.are.equal("int64", t.token_type_ids.dtype)
      assert.are.same({{3, 18, 26, 4, 1}, {3, 21, 4, 14, 4}}, t.input_ids:totable())
      assert.are.same({{1, 1, 1, 1, 1}, {1, 1, 1, 2, 2}}, t.token_type_ids:totable())
      assert.are.same({{1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}}, t.attention_mask:totable())
    end)
  end
end)

describe("WordPiece against the Python reference (HF's BertTokenizer)", function()
  local cfgs = {uncased = {}, cased = {lowercase = false}, lower_keep_accents = {strip_accents = false},
                cased_strip = {lowercase = false, strip_accents = true}, no_chinese = {tokenize_chinese_chars = false}}
  local toks = {}
  for k, o in pairs(cfgs) do toks[k] = T.WordPiece.from_file(FIX .. "bert_vocab.txt", o) end

  it("tokenizes every tricky string as the reference does, in five configurations", function()
    assert.is_true(#X.bert >= 140)
    local unk = 0
    for _, c in ipairs(X.bert) do
      local tok = toks[c.config]
      local why = ("%s: %q"):format(c.config, c.text)
      assert.are.same(c.tokens, tok:tokenize(c.text), why)
      assert.are.same(plus1(c.hf_ids), tok:encode(c.text, {add_special_tokens = false}).input_ids, why)
      for _, t in ipairs(c.tokens) do if t == "[UNK]" then unk = unk + 1 end end
    end
    assert.is_true(unk > 5, "the cases include unknown words")
  end)

  it("encodes pairs with truncation and padding as the reference does", function()
    local tok = toks.uncased
    for _, c in ipairs(X.bert_encode) do
      local x = c.b and {c.a, c.b} or c.a
      local o = {}
      for k, v in pairs(c.opts) do o[k] = v end
      local got = tok:encode(x, o)
      local why = ("%q / %q"):format(c.a, tostring(c.b))
      assert.are.same(plus1(c.input_ids), got.input_ids, why)
      assert.are.same(plus1(c.token_type_ids), got.token_type_ids, why)
      assert.are.same(c.attention_mask, got.attention_mask, why)
    end
  end)

  it("decodes back to the normalized text for plain words", function()
    local tok = toks.uncased
    local ids = tok:encode("The quick brown fox jumps over the lazy dog. The dog sleeps.").input_ids
    assert.are.equal("the quick brown fox jumps over the lazy dog. the dog sleeps.",
                     tok:decode(ids, {skip_special_tokens = true}))
  end)
end)

describe("ByteBPE, by hand", function()
  local B = T.ByteBPE.bytes_to_unicode
  local function bytes_vocab(extra)
    local v = {}
    for b = 0, 255 do v[#v + 1] = B[b] end
    for _, t in ipairs(extra or {}) do v[#v + 1] = t end
    return v
  end

  it("maps bytes as GPT-2's bytes_to_unicode", function()
    assert.are.equal("!", B[33])
    assert.are.equal("\u{100}", B[0])    -- the 68 unprintable bytes count up from U+0100
    assert.are.equal("\u{10A}", B[10])   -- "Ċ"
    assert.are.equal("\u{120}", B[32])   -- "Ġ"
    assert.are.equal("\u{143}", B[173])  -- soft hyphen: the last of them
    assert.are.equal("\u{FF}", B[255])
  end)

  it("pre-tokenizes with GPT-2's regex", function()
    local split = require("needle.text.gpt2_split").split
    local function pieces(s)
      local out = {}
      split(s, 1, #s, function(a, b) out[#out + 1] = s:sub(a, b) end)
      return out
    end
    assert.are.same({"Hello", " world"}, pieces("Hello world"))
    assert.are.same({"I", "'m", " here"}, pieces("I'm here"))
    assert.are.same({"it", "'s", "'", "S"}, pieces("it's'S"))           -- contractions are lower case
    assert.are.same({"a", " ", " b"}, pieces("a  b"))                 -- \s+(?!\S) leaves one space
    assert.are.same({"x", " \n"}, pieces("x \n"))                     -- at the end, all of it
    assert.are.same({"x", "\n", "\n", "y"}, pieces("x\n\ny"))
    assert.are.same({"hi", "!!'", "s", " 42", "x"}, pieces("hi!!'s 42x"))
    assert.are.same({" ", " hi"}, pieces("  hi"))
    assert.are.same({"é", "1½", "x"}, pieces("é1½x"))                -- ½ is a number (No)
    assert.are.same({"x", "\xff", "y"}, pieces("x\xffy"))            -- a stray byte is "other"
    assert.are.same({"a", " 😀", "b"}, pieces("a 😀b"))
    assert.are.same({}, pieces(""))
  end)

  it("merges by rank: the lowest-ranked pair first", function()
    local v = bytes_vocab({"el", "ll"})
    local el_first = T.ByteBPE.new(v, {"e l", "l l"})
    local ll_first = T.ByteBPE.new(v, {"l l", "e l"})
    assert.are.same({"el", "l"}, el_first:tokenize("ell"))
    assert.are.same({"e", "ll"}, ll_first:tokenize("ell"))
    assert.are.same({257, 109}, el_first:encode("ell")) -- 256 bytes, then "el"; "l" is byte 108
  end)

  it("merges every occurrence of the pair, left to right", function()
    local tok = T.ByteBPE.new(bytes_vocab({"aa"}), {{"a", "a"}})
    assert.are.same({"aa", "aa", "a"}, tok:tokenize("aaaaa"))
  end)

  it("carries the space into the word (Ġ) and builds whole words", function()
    local tok = T.ByteBPE.new(bytes_vocab({"Ġh", "Ġhe", "ll", "Ġhell", "Ġhello"}),
                              {"Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o"})
    assert.are.same({"h", "e", "ll", "o", "Ġhello"}, tok:tokenize("hello hello"))
  end)

  it("keeps allowed special tokens whole and encodes the others as text", function()
    local tok = T.ByteBPE.new(bytes_vocab({"<|endoftext|>"}), {})
    assert.are.same({"<|endoftext|>"}, tok.special_tokens)
    assert.are.equal(257, tok.eos_token_id)
    local s = "a<|endoftext|>b"
    assert.are.same({98, 257, 99}, tok:encode(s, {allowed_special = "all"}))
    assert.are.same({98, 257, 99}, tok:encode(s, {allowed_special = {"<|endoftext|>"}}))
    local plain = tok:encode(s)
    assert.are.equal(#s, #plain) -- byte by byte: no merges
    assert.are.equal(s, tok:decode(plain))
    assert.are.equal(s, tok:decode(tok:encode(s, {allowed_special = "all"})))
    assert.are.equal("ab", tok:decode({98, 257, 99}, {skip_special_tokens = true}))
  end)

  it("gives each token's bytes with return_offsets_mapping, the leading space included", function()
    local tok = T.ByteBPE.new(bytes_vocab({"Ġh", "Ġhe", "ll", "Ġhell", "Ġhello", "<|endoftext|>", "Ã©"}),
                              {"Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o", "Ã ©"})
    -- "hello hello<|endoftext|>é!": h e ll o | Ġhello | <|endoftext|> | é (two bytes, one token) | !
    local s = "hello hello<|endoftext|>\xc3\xa9!"
    local ids, offs = tok:encode(s, {allowed_special = "all", return_offsets_mapping = true})
    assert.are.same({"h", "e", "ll", "o", "Ġhello", "<|endoftext|>", "Ã©", "!"}, tok:convert_ids_to_tokens(ids))
    assert.are.same({{1, 1}, {2, 2}, {3, 4}, {5, 5}, {6, 11}, {12, 24}, {25, 26}, {27, 27}}, offs)
    -- a token that is part of a character (no merge for é's bytes here) gets its own byte
    local t2, o2 = T.ByteBPE.new(bytes_vocab(), {}):tokenize("\xc3\xa9", {return_offsets_mapping = true})
    assert.are.same({"Ã", "©"}, t2)
    assert.are.same({{1, 1}, {2, 2}}, o2)
    -- not allowed, the special token is text, byte by byte
    local _, o3 = tok:encode("<|endoftext|>", {return_offsets_mapping = true})
    assert.are.equal(13, #o3)
    assert.are.same({13, 13}, o3[13])
    -- without the option, one result, as before
    assert.are.equal(1, select("#", tok:encode(s)))
    local _, none = tok:encode("", {return_offsets_mapping = true})
    assert.are.same({}, none)
  end)
end)

describe("ByteBPE against the Python reference (OpenAI's encoder.py)", function()
  local tok = T.ByteBPE.from_files(FIX .. "gpt2_vocab.json", FIX .. "gpt2_merges.txt")
  local split = require("needle.text.gpt2_split").split

  it("loads GPT-2's file formats", function()
    assert.are.equal(548, tok.vocab_size)
    assert.are.equal(291, tok.num_merges)
    assert.are.equal(548, tok.eos_token_id)
  end)

  it("splits and encodes every string (invalid UTF-8 too) as the reference does", function()
    assert.is_true(#X.gpt2 >= 30)
    local multi = 0
    for _, c in ipairs(X.gpt2) do
      local why = ("%q"):format(c.text)
      local got = {}
      split(c.text, 1, #c.text, function(a, b) got[#got + 1] = c.text:sub(a, b) end)
      assert.are.same(c.pieces, got, why)
      local ids = tok:encode(c.text)
      assert.are.same(plus1(c.hf_ids), ids, why)
      if #ids < #c.text then multi = multi + 1 end
      assert.are.equal(c.text, tok:decode(ids), why)
    end
    assert.is_true(multi > 10, "merges apply in most strings")
  end)

  it("offsets tile every string: each token's bytes are the text it decodes to", function()
    local texts = {}
    for _, c in ipairs(X.gpt2) do texts[#texts + 1] = c.text end
    texts[#texts + 1] = "a<|endoftext|>b <|endoftext|><|endoftext|> c"
    for _, text in ipairs(texts) do
      local why = ("%q"):format(text)
      local ids, offs = tok:encode(text, {allowed_special = "all", return_offsets_mapping = true})
      assert.are.same(tok:encode(text, {allowed_special = "all"}), ids, why)
      assert.are.equal(#ids, #offs, why)
      local at = 1
      for k, o in ipairs(offs) do
        assert.are.equal(at, o[1], why .. " token " .. k .. " starts where the last ended")
        assert.is_true(o[2] >= o[1], why)
        assert.are.equal(tok:decode({ids[k]}), text:sub(o[1], o[2]), why .. " token " .. k)
        at = o[2] + 1
      end
      assert.are.equal(#text + 1, at, why .. ": the offsets cover the text")
    end
  end)

  it("round-trips any bytes exactly", function()
    local r = rng(12345)
    local alphabet = {" ", "a", "e", "l", "t", "'", "s", "\n", "1", ".", "\xc3", "\xa9", "\xe4", "\xb8", "\xad",
                      "\xf0", "\x9f", "\x98", "\x80", "\xff", "\0", "\t", "é", "中", "😀"}
    for _ = 1, 300 do
      local parts = {}
      for k = 1, r(40) - 1 do parts[k] = alphabet[r(#alphabet)] end
      local s = table.concat(parts)
      local ids = tok:encode(s)
      assert.are.equal(s, tok:decode(ids), ("%q"):format(s))
      for _, id in ipairs(ids) do assert.is_true(id >= 1 and id <= tok.vocab_size) end
    end
  end)
end)

describe("tokenizer files that are wrong", function()
  local function from_file(content, opts)
    local p = tmpfile(content)
    local ok, e = pcall(T.WordPiece.from_file, p, opts)
    os.remove(p)
    return ok, tostring(e)
  end
  local function from_files(vocab, merges)
    local pv, pm = tmpfile(vocab), tmpfile(merges)
    local ok, e = pcall(T.ByteBPE.from_files, pv, pm)
    os.remove(pv)
    os.remove(pm)
    return ok, tostring(e)
  end
  local VJSON = S.read_file(FIX .. "gpt2_vocab.json")
  local MERGES = S.read_file(FIX .. "gpt2_merges.txt")
  local VTXT = S.read_file(FIX .. "bert_vocab.txt")

  it("name a missing file", function()
    assert_contains(errmsg(T.WordPiece.from_file, "/nonexistent/vocab.txt"),
      "needle.text.WordPiece.from_file: cannot open vocabulary '/nonexistent/vocab.txt'")
    assert_contains(errmsg(T.ByteBPE.from_files, "/nonexistent/vocab.json", FIX .. "gpt2_merges.txt"),
      "needle.text.ByteBPE.from_files: cannot open vocabulary '/nonexistent/vocab.json'")
    assert_contains(errmsg(T.ByteBPE.from_files, FIX .. "gpt2_vocab.json", "/nonexistent/merges.txt"),
      "cannot open merges '/nonexistent/merges.txt'")
    assert_contains(errmsg(T.WordPiece.from_file, 42), "vocabulary must be a path (a string), got number")
    assert_contains(errmsg(T.WordPiece.from_file, "spec/fixtures"), "cannot read vocabulary 'spec/fixtures': Is a directory")
  end)

  it("refuse a broken vocab.txt", function()
    local ok, e = from_file("")
    assert.is_false(ok); assert_contains(e, "is empty: no tokens")
    ok, e = from_file("[PAD]\n[UNK]\nab\xffc\n")
    assert.is_false(ok); assert_contains(e, "line 3 is not valid UTF-8 (byte 3 of the line): not a vocab.txt")
    ok, e = from_file("[PAD]\nhello\n")
    assert.is_false(ok); assert_contains(e, "unk_token \"[UNK]\" is not in the vocabulary (2 tokens)")
    ok, e = from_file("<unk>\nhello\n", {unk_token = "<unk>"})
    assert.is_true(ok, e)
    -- CRLF line ends, an empty line (a token "", as HF), no newline at the end
    local p = tmpfile("[UNK]\r\n\r\nhello\r\nthe")
    local tok = T.WordPiece.from_file(p)
    os.remove(p)
    assert.are.same({"[UNK]", "", "hello", "the"}, tok.vocab)
    assert.are.same({3, 4}, tok:encode("hello the", {add_special_tokens = false}).input_ids)
  end)

  it("refuse a broken vocab.json or merges.txt", function()
    local cases = {
      {"{\"a\": 0,", MERGES, "is not valid JSON"},
      {"[1, 2]", MERGES, "must hold a JSON object {token: id, ...}, got a JSON array"},
      {"\"x\"", MERGES, "got a JSON string"},
      {"{}", MERGES, "has no tokens"},
      {"{\"a\": 1.5}", MERGES, "the id of \"a\" must be an integer in 0..16777214, got 1.5"},
      {"{\"a\": -1}", MERGES, "the id of \"a\" must be an integer"},
      {"{\"a\": \"0\"}", MERGES, "the id of \"a\" must be an integer in 0..16777214, got the string \"0\""},
      {"{\"a\": true}", MERGES, "the id of \"a\" must be an integer in 0..16777214, got true"},
      {"{\"a\": {\"b\": 1}}", MERGES, "got a JSON object"},
      {"{\"a\": 99999999999}", MERGES, "must be an integer in 0..16777214"},
      {"{\"a\": 0, \"b\": 0}", MERGES, "tokens \"a\" and \"b\" share the id 0"},
      {"{\"a\": 0, \"a\": 1}", MERGES, "duplicate key"},
      {"{\"a\": 0}", MERGES, "the vocabulary has no token for byte 0x00"},
      {VJSON, "#version: 0.2\nĠ t\nĠt\n", "line 3: expected two tokens separated by one space, got \"Ġt\""},
      {VJSON, "Ġ  t\n", "line 1: expected two tokens separated by one space"},
      {VJSON, "Ġ zzz\n", "line 1 merges \"Ġ\" and \"zzz\", but \"zzz\" is not in the vocabulary"},
      {VJSON, "z z\n", "\"zz\" is not in the vocabulary"},
    }
    for _, c in ipairs(cases) do
      local ok, e = from_files(c[1], c[2])
      assert.is_false(ok, c[3])
      assert_contains(e, "needle.text.ByteBPE.from_files: ")
      assert_contains(e, c[3])
    end
    -- an empty merges.txt is a tokenizer of bytes
    local ok, e = from_files(VJSON, "")
    assert.is_true(ok, e)
  end)

  it("give clear errors, never a crash, for truncated and garbage files", function()
    local r = rng(777)
    local tried, refused = 0, 0
    local function check(ok, e, who)
      tried = tried + 1
      if not ok then
        refused = refused + 1
        assert.truthy(e:find("needle.text." .. who .. ": ", 1, true), e)
      end
    end
    for _ = 1, 40 do
      local cut = r(#VJSON)
      local ok, e = from_files(VJSON:sub(1, cut), MERGES)
      check(ok, e, "ByteBPE.from_files")
      ok, e = from_files(VJSON, MERGES:sub(1, r(#MERGES)))
      check(ok, e, "ByteBPE.from_files")
      ok, e = from_file(VTXT:sub(1, r(#VTXT)))
      check(ok, e, "WordPiece.from_file")
    end
    for _ = 1, 40 do
      local g = {}
      for k = 1, r(300) do g[k] = string.char(r(256) - 1) end
      local junk = table.concat(g)
      local ok, e = from_files(junk, MERGES)
      check(ok, e, "ByteBPE.from_files")
      ok, e = from_files(VJSON, junk)
      check(ok, e, "ByteBPE.from_files")
      ok, e = from_file(junk)
      check(ok, e, "WordPiece.from_file")
    end
    assert.are.equal(240, tried)
    assert.is_true(refused > 100, "most of them are refused: " .. refused)
  end)
end)

describe("tokenizer calls that are wrong", function()
  local tok = T.WordPiece.new(WP_VOCAB)
  local bpe = T.ByteBPE.from_files(FIX .. "gpt2_vocab.json", FIX .. "gpt2_merges.txt")

  it("name the problem, at the caller's line", function()
    local e = errmsg(function() local r = tok:encode(5); return r end) -- not a tail call: this line stays
    assert_contains(e, "needle.text.WordPiece.encode: text must be a string or a pair of strings {text_a, text_b}, got number")
    assert.truthy(e:find("text_spec.lua:%d+: needle"), e)
    assert_contains(errmsg(function() return tok:encode({"a", "b", "c"}) end), "got a table of 3 items")
    assert_contains(errmsg(function() return tok:encode("ab\xffc") end),
      "needle.text.WordPiece.encode: text is not valid UTF-8 (byte 3)")
    assert_contains(errmsg(function() return tok.encode("x") end),
      "needle.text.WordPiece.encode: call it as a method (tok:encode(...)), got string as the tokenizer")
    assert_contains(errmsg(function() return bpe:encode({}) end), "needle.text.ByteBPE.encode: text must be a string, got table")
  end)

  it("check encode's options", function()
    assert_contains(errmsg(function() return tok:encode("a", {truncation = "sideways"}) end),
      "truncation must be true, false, \"longest_first\", \"only_first\", \"only_second\" or \"do_not_truncate\", got \"sideways\"")
    assert_contains(errmsg(function() return tok:encode("a", {padding = "max_length"}) end),
      "needle.text.WordPiece.encode: padding = \"max_length\" needs max_length (the tokenizer has no model_max_length)")
    assert_contains(errmsg(function() return tok:encode("a", {truncation = true}) end), "truncation needs max_length")
    assert_contains(errmsg(function() return tok:encode("a", {max_length = 0}) end), "max_length must be a positive integer, got 0")
    assert_contains(errmsg(function() return tok:encode("hello the", {max_length = 3, truncation = "only_second"}) end),
      "truncation = \"only_second\" needs a pair of texts")
    assert_contains(errmsg(function() return tok:encode("hello the", {max_length = 2}) end),
      "cannot truncate the text (2 tokens) by 2 to fit max_length 2")
    assert_contains(errmsg(function() return tok:encode({"hello", "the the"}, {max_length = 5, truncation = "only_first"}) end),
      "cannot truncate the first text (1 tokens) by 1 to fit max_length 5 (the second has 2)")
    assert_contains(errmsg(function() return tok:encode_batch({"a", "the a"}, {return_tensors = true}) end),
      "return_tensors needs rows of one length, got 3 tokens in row 1 and 4 in row 2")
    assert_contains(errmsg(function() return tok:encode_batch({"a"}, {device = "cpu"}) end), "device needs return_tensors = true")
    assert_contains(errmsg(function() return tok:encode_batch({}) end), "the list of texts is empty")
    assert_contains(errmsg(function() return tok:encode_batch({"a", 3}) end), "texts[2] must be a string")
    assert_contains(errmsg(function() return bpe:encode("x", {allowed_special = {"<|nope|>"}}) end),
      "allowed_special[1] (<|nope|>) is not a token of the vocabulary")
  end)

  -- audit R5 / R5b: a nil or a number ran into "attempt to get length of a nil value"
  it("check the tokens given to convert_tokens_to_ids", function()
    for _, t in ipairs({tok, bpe}) do
      local name = t == tok and "WordPiece" or "ByteBPE"
      assert_contains(errmsg(function() return t:convert_tokens_to_ids(nil) end),
        "needle.text." .. name .. ".convert_tokens_to_ids: expected a token string or a list of them, got nil")
      assert_contains(errmsg(function() return t:convert_tokens_to_ids(5) end),
        "expected a token string or a list of them, got 5")
      assert_contains(errmsg(function() return t:convert_tokens_to_ids({"a", 5}) end), "tokens[2] is 5, expected a string")
      assert.are.equal(t:convert_tokens_to_ids("a"), t:convert_tokens_to_ids({"a"})[1])
    end
  end)

  -- extra positional arguments were ignored (tok:tokenize("a", {foo = 1}))
  it("refuse extra arguments, naming the accepted form", function()
    assert_contains(errmsg(function() return tok:tokenize("a", {foo = 1}) end),
      "needle.text.WordPiece.tokenize: takes tok:tokenize(text) only, got an extra argument #2: a table")
    assert_contains(errmsg(T.WordPiece.new, WP_VOCAB, {}, 5),
      "needle.text.WordPiece.new: takes WordPiece.new(vocab[, opts]) only, got an extra argument #3: 5")
    assert_contains(errmsg(function() return tok:encode("a", nil, true) end), "takes tok:encode(text[, opts]) only")
    assert_contains(errmsg(function() return tok:decode({1}, {}, 1) end), "takes tok:decode(ids[, opts]) only")
    assert_contains(errmsg(function() return tok:convert_tokens_to_ids("a", "b") end),
      "takes tok:convert_tokens_to_ids(token or list) only, got an extra argument #2: \"b\"")
    assert_contains(errmsg(function() return bpe:tokenize("a", {}, 1) end),
      "needle.text.ByteBPE.tokenize: takes tok:tokenize(text[, opts]) only, got an extra argument #3: 1")
    assert_contains(errmsg(function() return bpe:convert_ids_to_tokens({1}, 2) end),
      "takes tok:convert_ids_to_tokens(id or list) only")
    assert_contains(errmsg(T.ByteBPE.from_files, FIX .. "gpt2_vocab.json", FIX .. "gpt2_merges.txt", {}, 4),
      "takes ByteBPE.from_files(vocab_path, merges_path[, opts]) only, got an extra argument #4: 4")
    -- a nil in the extra place is no argument
    assert.are.same(tok:tokenize("a"), tok:tokenize("a", nil))
  end)

  it("check the ids given to decode (1-based)", function()
    assert_contains(errmsg(function() return tok:decode({1, 0}) end),
      "needle.text.WordPiece.decode: id 0 at position 2 is not a token id (1..29: needle's ids are 1-based)")
    assert_contains(errmsg(function() return bpe:decode({549}) end), "id 549 at position 1 is not a token id (1..548")
    assert_contains(errmsg(function() return bpe:decode({1.5}) end), "id 1.5 at position 1")
    assert_contains(errmsg(function() return bpe:decode(nd.zeros({2, 2}, {dtype = "int64"})) end),
      "expected a 1-D tensor of ids, got shape {2,2}")
    assert_contains(errmsg(function() return bpe:decode("abc") end), "expected a list (or 1-D tensor) of ids, got string")
  end)

  it("check the constructors' arguments", function()
    assert_contains(errmsg(T.WordPiece.new, {}), "needle.text.WordPiece.new: the vocabulary is empty")
    assert_contains(errmsg(T.WordPiece.new, {"[UNK]", 3}), "token 2 must be a string, got number")
    assert_contains(errmsg(T.WordPiece.new, {"[UNK]"}, {max_input_chars_per_word = 0}),
      "max_input_chars_per_word must be positive, got 0")
    -- model_max_length, as max_length: a positive integer, refused when the tokenizer is made
    for _, n in ipairs({0, -1}) do
      assert_contains(errmsg(T.WordPiece.new, {"[UNK]"}, {model_max_length = n}),
        "needle.text.WordPiece.new: model_max_length must be a positive integer, got " .. n)
      assert_contains(errmsg(T.WordPiece.from_file, FIX .. "bert_vocab.txt", {model_max_length = n}),
        "needle.text.WordPiece.from_file: model_max_length must be a positive integer, got " .. n)
    end
    assert.are.equal(1, T.WordPiece.new({"[UNK]"}, {model_max_length = 1}).model_max_length)
    local v = {}
    for b = 0, 255 do v[#v + 1] = T.ByteBPE.bytes_to_unicode[b] end
    assert_contains(errmsg(T.ByteBPE.new, v, {"a"}), "merges[1] must be \"a b\" (two tokens, one space), got \"a\"")
    assert_contains(errmsg(T.ByteBPE.new, {"a", "a"}, {}), "token \"a\" is listed twice (ids 1 and 2)")
    assert_contains(errmsg(T.ByteBPE.new, v, {}, {special_tokens = {"<x>"}}), "special_tokens[1] (<x>) is not a token")
  end)
end)
