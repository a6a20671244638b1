-- text_qa_spec.lua - what extractive question answering needs from nd.text
-- (issue 21): token offsets into the original text (return_offsets_mapping,
-- with sequence_ids and word_ids), windows over a long context
-- (return_overflowing_tokens with stride), and nd.text.answer_spans, Hugging
-- Face's question-answering pipeline's span search.
--
--   build/needle-lua spec/run.lua spec/text_qa_spec.lua
--
-- Offsets are checked by hand on small vocabularies and, on every tricky
-- string of spec/fixtures/text/expected.lua (accents, Greek final sigma,
-- Hangul, CJK, controls), by what they must satisfy: each token's source
-- bytes, normalized, are the token. Windows are worked out by hand from the
-- fast tokenizers' rule; answer scores are products of softmax
-- probabilities computed by hand here.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local T = nd.text
local FIX = "spec/fixtures/text/"
local X = dofile(FIX .. "expected.lua")

local WP_VOCAB = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "want", "##ed",
                  ",", "runn", "##ing", "a", "ab", "##c", "##bc", "hello", "!", "中", "cafe", ".", "'", "s",
                  "##s", "the", "?", "##b", "##want"}

-- the token strings of a list of ids
local function toks(tok, ids) return tok:convert_ids_to_tokens(ids) end

describe("WordPiece offsets (return_offsets_mapping)", function()
  local tok = T.WordPiece.new(WP_VOCAB)

  it("give each token's bytes in the text, through case, accents, punctuation and special tokens", function()
    local text = "Unaffable, CAFÉ  runnings!中 x[SEP]ab\tİ"
    local e = tok:encode(text, {return_offsets_mapping = true})
    assert.are.same({"[CLS]", "un", "##aff", "##able", ",", "cafe", "runn", "##ing", "##s", "!", "中", "[UNK]",
                     "[SEP]", "ab", "[UNK]", "[SEP]"}, toks(tok, e.input_ids))
    -- worked out by hand: "CAFÉ" is bytes 12-16 (É is two), "中" three bytes,
    -- "İ" (two bytes) lower-cases to i + a combining dot, stripped, then unknown
    assert.are.same({{0, 0}, {1, 2}, {3, 5}, {6, 9}, {10, 10}, {12, 16}, {19, 22}, {23, 25}, {26, 26}, {27, 27},
                     {28, 30}, {32, 32}, {33, 37}, {38, 39}, {41, 42}, {0, 0}}, e.offset_mapping)
    assert.are.same({0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, e.sequence_ids)
    -- words as BERT's basic tokenizer splits them (punctuation and CJK alone)
    assert.are.same({0, 1, 1, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8, 9, 10, 0}, e.word_ids)
    -- the same ids as without offsets
    assert.are.same(tok:encode(text).input_ids, e.input_ids)
  end)

  it("cover dropped characters inside a word and count characters, not bytes", function()
    -- the control character (U+0001) is dropped inside the word, the accents stripped
    local text = "ab\1c Ünaffable"
    local e = tok:encode(text, {return_offsets_mapping = true, add_special_tokens = false})
    assert.are.same({"ab", "##c", "un", "##aff", "##able"}, toks(tok, e.input_ids))
    assert.are.same({{1, 2}, {4, 4}, {6, 8}, {9, 11}, {12, 15}}, e.offset_mapping)
    assert.are.same({1, 1, 2, 2, 2}, e.word_ids)
  end)

  it("number the words and texts of a pair apart, padding at {0, 0}", function()
    local b = tok:encode_batch({{"want,", "the cafe"}, "hello"},
                               {return_offsets_mapping = true, padding = true})
    assert.are.same({{0, 0}, {1, 4}, {5, 5}, {0, 0}, {1, 3}, {5, 8}, {0, 0}}, b.offset_mapping[1])
    assert.are.same({0, 1, 1, 0, 2, 2, 0}, b.sequence_ids[1])
    assert.are.same({0, 1, 2, 0, 1, 2, 0}, b.word_ids[1])
    assert.are.same({{0, 0}, {1, 5}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}}, b.offset_mapping[2])
    assert.are.same({0, 1, 0, 0, 0, 0, 0}, b.sequence_ids[2])
    local t = tok:encode_batch({{"want,", "the cafe"}, "hello"},
                               {return_offsets_mapping = true, padding = true, return_tensors = true})
    assert.are.same({2, 7, 2}, t.offset_mapping.shape)
    assert.are.equal("int64", t.offset_mapping.dtype)
    assert.are.same(b.offset_mapping, t.offset_mapping:totable())
    assert.are.same(b.word_ids, t.word_ids:totable())
  end)

  it("are absent unless asked for", function()
    local e = tok:encode("hello")
    assert.is_nil(e.offset_mapping)
    assert.is_nil(e.sequence_ids)
  end)

  it("point at bytes that normalize to the token, on every tricky string and configuration", function()
    local basic = require "needle.text.bert_basic"
    local cfgs = {uncased = {}, cased = {lowercase = false}, lower_keep_accents = {strip_accents = false},
                  cased_strip = {lowercase = false, strip_accents = true}, no_chinese = {tokenize_chinese_chars = false}}
    local n, checked = 0, 0
    for _, c in ipairs(X.bert) do
      local t = T.WordPiece.from_file(FIX .. "bert_vocab.txt", cfgs[c.config])
      local e = t:encode(c.text, {add_special_tokens = false, return_offsets_mapping = true})
      local why = ("%s: %q"):format(c.config, c.text)
      assert.are.same(t:encode(c.text, {add_special_tokens = false}).input_ids, e.input_ids, why)
      local prev_first, prev_last = 0, 0
      for k, id in ipairs(e.input_ids) do
        local first, last = e.offset_mapping[k][1], e.offset_mapping[k][2]
        -- in order, not overlapping (tokens made from one character share it)
        assert.is_true((first > prev_last or (first == prev_first and last == prev_last)) and first <= last
                       and last <= #c.text, why)
        prev_first, prev_last = first, last
        local src = c.text:sub(first, last)
        local token = t.vocab[id]
        local special = t._special_ids[id] and src == token
        if not special then
          -- the source, normalized by BERT's basic tokenizer, is one piece:
          -- the token (without ##), or for [UNK] a whole word
          local p = basic.pieces(src, t._cfg, {})
          assert.are.equal(1, #p, why .. " token " .. k .. " source " .. ("%q"):format(src))
          if token ~= "[UNK]" then
            -- (a capital sigma alone lower-cases to σ: ς needs the word around
            -- it; a Hangul syllable becomes several jamo, which can be tokens
            -- of their own: those are part of their source)
            local want, got = token:gsub("^##", ""):gsub("ς", "σ"), p[1]:gsub("ς", "σ")
            if want == got then
              checked = checked + 1
            else
              assert.truthy(got:find(want, 1, true) and utf8.len(c.text:sub(first, last)) == 1,
                            why .. " token " .. k .. ": " .. want .. " from " .. got)
            end
          end
        end
        n = n + 1
      end
      -- every token of one word has the same word id, words counted up from 1
      for k = 2, #e.word_ids do assert.is_true(e.word_ids[k] - e.word_ids[k - 1] <= 1, why) end
    end
    assert.is_true(n > 1000 and checked > 800, ("%d tokens, %d equal to their source"):format(n, checked))
  end)
end)

describe("WordPiece windows (return_overflowing_tokens, stride)", function()
  local tok = T.WordPiece.new(WP_VOCAB)
  -- the context: 9 tokens, un ##aff ##able runn ##ing ##s hello cafe the (1..9)
  local context = "unaffable runnings hello cafe the"

  it("cut the second text into windows that overlap by stride, the question in each", function()
    -- max_length 10 - [CLS] want [SEP] ... [SEP] leaves 6 context tokens a
    -- window; stride 2: windows start at context tokens 1, 5 (1 + 6 - 2)
    local b = tok:encode_batch({{"want", context}}, {max_length = 10, truncation = "only_second",
                               return_overflowing_tokens = true, stride = 2, return_offsets_mapping = true})
    assert.are.same({"[CLS]", "want", "[SEP]", "un", "##aff", "##able", "runn", "##ing", "##s", "[SEP]"},
                    toks(tok, b.input_ids[1]))
    assert.are.same({"[CLS]", "want", "[SEP]", "##ing", "##s", "hello", "cafe", "the", "[SEP]"},
                    toks(tok, b.input_ids[2]))
    assert.are.equal(2, #b.input_ids)
    assert.are.same({1, 1}, b.overflow_to_sample_mapping)
    -- the offsets and words still point into the whole context
    assert.are.same({15, 17}, b.offset_mapping[2][4]) -- "ing" of "runnings"
    assert.are.same({2, 2, 3, 4, 5}, {b.word_ids[2][4], b.word_ids[2][5], b.word_ids[2][6], b.word_ids[2][7],
                                      b.word_ids[2][8]})
    assert.are.same({1, 1, 1, 2, 2, 2, 2, 2, 2}, b.token_type_ids[2])
  end)

  it("step by the window less the stride until one reaches the end", function()
    -- 4 context tokens a window, stride 1: starts 1, 4, 7 (7..9 the last)
    local b = tok:encode_batch({{"want", context}, {"want", "hello"}},
                               {max_length = 8, truncation = "only_second", return_overflowing_tokens = true,
                                stride = 1, padding = true, return_tensors = true})
    assert.are.same({4, 8}, b.input_ids.shape)
    assert.are.same({1, 1, 1, 2}, b.overflow_to_sample_mapping:totable())
    local rows = b.input_ids:totable()
    assert.are.same({"un", "##aff", "##able", "runn"}, {table.unpack(toks(tok, rows[1]), 4, 7)})
    assert.are.same({"runn", "##ing", "##s", "hello"}, {table.unpack(toks(tok, rows[2]), 4, 7)})
    assert.are.same({"[CLS]", "want", "[SEP]", "hello", "cafe", "the", "[SEP]", "[PAD]"}, toks(tok, rows[3]))
    assert.are.same({"[CLS]", "want", "[SEP]", "hello", "[SEP]", "[PAD]", "[PAD]", "[PAD]"}, toks(tok, rows[4]))
    assert.are.same({1, 1, 1, 1, 1, 1, 1, 0}, b.attention_mask:totable()[3])
  end)

  it("cut one text the same way, and leave a text that fits whole", function()
    local b = tok:encode_batch({context, "hello"}, {max_length = 7, truncation = true,
                                                    return_overflowing_tokens = true, stride = 0})
    assert.are.same({"[CLS]", "un", "##aff", "##able", "runn", "##ing", "[SEP]"}, toks(tok, b.input_ids[1]))
    assert.are.same({"[CLS]", "##s", "hello", "cafe", "the", "[SEP]"}, toks(tok, b.input_ids[2]))
    assert.are.same({"[CLS]", "hello", "[SEP]"}, toks(tok, b.input_ids[3]))
    assert.are.same({1, 1, 2}, b.overflow_to_sample_mapping)
  end)

  it("refuse what cannot be windowed, saying why", function()
    local function enc(x, o) return errmsg(function() tok:encode_batch(x, o) end) end
    assert_contains(enc({{"want", context}}, {max_length = 8, truncation = true, return_overflowing_tokens = true}),
                    "longest_first would cut both")
    assert_contains(enc({{"want", context}}, {max_length = 8, truncation = "only_second",
                                              return_overflowing_tokens = true, stride = 4}),
                    "stride 4 must be less than the 4 tokens of the second text that each window holds")
    assert_contains(enc({{"want want want want", context}}, {max_length = 7, truncation = "only_second",
                                                             return_overflowing_tokens = true}),
                    "no room for the second text in max_length 7")
    assert_contains(enc({context}, {max_length = 8, stride = 2}), "stride needs return_overflowing_tokens = true")
    assert_contains(enc({context}, {max_length = 8, stride = -1, return_overflowing_tokens = true}),
                    "stride must be 0 or more")
    -- tok:encode returns one encoding: windows are encode_batch's
    assert_contains(errmsg(function() tok:encode(context, {return_overflowing_tokens = true}) end),
                    "return_overflowing_tokens")
  end)
end)

describe("nd.text.answer_spans", function()
  local tok = T.WordPiece.new(WP_VOCAB)
  local context = "unaffable cafe, the runnings hello!"
  -- [CLS] want ? [SEP] un ##aff ##able cafe , the runn ##ing ##s hello ! [SEP]
  --   1    2   3   4    5   6     7     8   9  10  11   12   13   14  15  16
  local enc = tok:encode_batch({{"want?", context}}, {return_offsets_mapping = true})
  local L = #enc.input_ids[1]

  -- logits -inf-like everywhere but at the given positions
  local function logits(at)
    local row = {}
    for j = 1, L do row[j] = -30 end
    for j, v in pairs(at) do row[j] = v end
    return {row}
  end

  it("scores spans as p_start(s) p_end(e), softmax over the context and [CLS], worked by hand", function()
    -- start: [CLS] log 4, "hello" (14) log 2, "cafe" (8) log 1 -> with the
    -- rest ~0: p = 4/7, 2/7, 1/7; end: "hello" log 3, "!" (15) log 1 -> 3/4, 1/4
    -- (the question's "want" at +50 is masked to -10000 and counts for nothing)
    local s = logits({[1] = math.log(4), [14] = math.log(2), [8] = 0, [2] = 50})
    local e = logits({[14] = math.log(3), [15] = 0, [2] = 50})
    local a = T.answer_spans(s, e, enc, {context}, {top_k = 3, align_to_words = false})[1]
    local eps = 1e-9 -- (the other tokens' e^-30 shift the sums by ~1e-12)
    assert.are.equal("hello", a[1].answer)
    assert.is_true(math.abs(a[1].score - (2 / 7) * (3 / 4)) < eps, a[1].score)
    assert.are.same({30, 34}, {a[1].first, a[1].last})
    -- "cafe, the runnings hello" is 7 tokens: within max_answer_len 15
    assert.are.equal("cafe, the runnings hello", a[2].answer)
    assert.is_true(math.abs(a[2].score - (1 / 7) * (3 / 4)) < eps)
    assert.are.equal("hello!", a[3].answer)
    assert.is_true(math.abs(a[3].score - (2 / 7) * (1 / 4)) < eps)
    -- max_answer_len 6 leaves it out ("cafe" .. "hello" spans 7 tokens)
    local b = T.answer_spans(s, e, enc, {context}, {top_k = 3, max_answer_len = 6, align_to_words = false})[1]
    assert.are.same({"hello", "hello!"}, {b[1].answer, b[2].answer})
    assert.are_not.equal("cafe, the runnings hello", b[3].answer)
    -- no answer: [CLS] x [CLS] = 4/7 * (~0), below the spans here
    local c = T.answer_spans(s, e, enc, {context}, {top_k = 8, handle_impossible_answer = true})[1]
    local last = c[#c]
    assert.is_true(last.score < 1e-10)
  end)

  it("takes no answer when [CLS] wins, with handle_impossible_answer", function()
    local s = logits({[1] = 10, [14] = 1})
    local e = logits({[1] = 10, [14] = 1})
    local a = T.answer_spans(s, e, enc, {context}, {top_k = 2, handle_impossible_answer = true})[1]
    assert.are.same({"", 0, 0}, {a[1].answer, a[1].first, a[1].last})
    assert.are.equal("hello", a[2].answer)
    assert.are.equal("hello", T.answer_spans(s, e, enc, {context})[1][1].answer)
  end)

  it("widens an answer to whole words (align_to_words), and not when asked not to", function()
    -- the best start is ##ing (12), the best end ##s (13)
    local s, e = logits({[12] = 5}), logits({[13] = 5})
    assert.are.equal("runnings", T.answer_spans(s, e, enc, {context})[1][1].answer)
    assert.are.equal("ings", T.answer_spans(s, e, enc, {context}, {align_to_words = false})[1][1].answer)
    -- an end before the start is no span: the best is then elsewhere
    s, e = logits({[12] = 5, [5] = 2}), logits({[10] = 5})
    local a = T.answer_spans(s, e, enc, {context}, {align_to_words = false})[1][1]
    assert.are.equal("unaffable cafe, the", a.answer)
  end)

  it("pools the windows of a text, each span once with its best score, on tensors", function()
    local b = tok:encode_batch({{"want", "unaffable runnings hello cafe the"}, {"want", "cafe"}},
                               {max_length = 8, truncation = "only_second", return_overflowing_tokens = true,
                                stride = 1, return_offsets_mapping = true, padding = true, return_tensors = true})
    -- rows: un ##aff ##able runn | runn ##ing ##s hello | hello cafe the | cafe
    local s, e = nd.full({4, 8}, -30.0), nd.full({4, 8}, -30.0)
    -- "hello": token 7 of row 2 and token 4 of row 3; row 3 is surer of it
    s[{2, 7}], e[{2, 7}] = 3.0, 3.0
    s[{3, 4}], e[{3, 4}] = 6.0, 6.0
    s[{2, 4}], e[{2, 6}] = 2.0, 2.0 -- "runnings" in row 2
    s[{4, 4}], e[{4, 4}] = 1.0, 1.0 -- the second text's only word
    local ans = T.answer_spans(s, e, b, {"unaffable runnings hello cafe the", "cafe"}, {top_k = 2})
    assert.are.equal(2, #ans)
    -- row 2's second best is runn..hello, widened to "runnings hello"
    assert.are.same({"hello", "runnings hello"}, {ans[1][1].answer, ans[1][2].answer})
    assert.are.equal(3, ans[1][1].window)
    -- row 3: softmax over [CLS] and its 3 context tokens
    local p = math.exp(6) / (math.exp(6) + 3 * math.exp(-30))
    assert.is_true(math.abs(ans[1][1].score - p * p) < 1e-12)
    assert.are.equal("cafe", ans[2][1].answer)
    assert.are.equal(1, #ans[2])
  end)

  it("finds no answer in a context that gave no tokens, row by row", function()
    -- the context is the second text of each pair even when empty or all
    -- control characters (its last [SEP] still has token type 2)
    for _, ctx in ipairs({"", "   ", ("\1"):rep(12)}) do
      local e = tok:encode_batch({{"hello the", ctx}, "hello cafe"}, {return_offsets_mapping = true, padding = true})
      local z = {}
      for j = 1, #e.input_ids[1] do z[j] = 0 end
      local a = T.answer_spans({z, z}, {z, z}, e, {ctx, "hello cafe"}, {top_k = 3})
      assert.are.same({}, a[1], ("%q"):format(ctx))
      -- the single text in the same batch is its own context
      assert.is_true(#a[2] > 0 and (a[2][1].answer == "hello" or a[2][1].answer == "cafe"))
      local with_null = T.answer_spans({z, z}, {z, z}, e, {ctx, "hello cafe"}, {handle_impossible_answer = true})
      assert.are.same({"", 0}, {with_null[1][1].answer, with_null[1][1].first})
    end
  end)

  it("answers a single text's context too (no pair)", function()
    local e1 = tok:encode("hello cafe", {return_offsets_mapping = true})
    local a = T.answer_spans({-9, -9, 4, -9}, {-9, -9, 4, -9}, e1, "hello cafe")[1][1]
    assert.are.same({"cafe", 7, 10}, {a.answer, a.first, a.last})
  end)

  it("names what is wrong with its arguments", function()
    local s, e = logits({}), logits({})
    local function err(...) local args = table.pack(...)
      return errmsg(function() T.answer_spans(table.unpack(args, 1, args.n)) end) end
    assert_contains(err(s, e, tok:encode_batch({{"want?", context}}), {context}), "return_offsets_mapping = true")
    assert_contains(err(s, e, enc, {context}, {top_k = 0}), "top_k must be at least 1")
    assert_contains(err(s, e, enc, {context}, {max_answer_length = 3}), "max_answer_len")
    assert_contains(err({s[1], s[1]}, e, enc, {context}), "start_logits has 2 rows and end_logits 1")
    assert_contains(err(s, e, enc, {}), "contexts[1] is missing")
    assert_contains(err(s, e, enc, {"short"}), "fall outside context 1")
    assert_contains(err(nd.zeros({1, 2, 3}), e, enc, {context}), "start_logits must be (windows, tokens)")
    assert_contains(err(s, e, enc, {context}, {}, 5), "needle.text.answer_spans: takes " ..
      "answer_spans(start_logits, end_logits, enc, contexts[, opts]) only, got an extra argument #6: 5")
  end)
end)
