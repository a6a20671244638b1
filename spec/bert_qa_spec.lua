-- bert_qa_spec.lua - scripts/bert_qa.lua as a user runs it: small BERT and
-- DistilBERT question-answering models (Hugging Face keys) saved to
-- safetensors and the test vocabulary. The printed answers are
-- nd.text.answer_spans over the model's own logits on the windows of the
-- context (text_qa_spec.lua checks the span search itself); bad arguments are
-- clear errors.
local nd = require "needle"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local run = H.runner("bert_qa")
local VOCAB = "spec/fixtures/text/bert_vocab.txt"
local CONTEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all day long, " ..
                "and the fox runs away into the woods before night."

describe("scripts/bert_qa.lua", function()
  local dir, tok, models
  setup(function()
    dir = H.tmpdir()
    tok = nd.text.WordPiece.from_file(VOCAB)
    nd.manual_seed(7)
    models = {
      bert = nd.nn.models.BertForQuestionAnswering{vocab_size = 451, hidden_size = 32, num_hidden_layers = 2,
        num_attention_heads = 4, intermediate_size = 64, max_position_embeddings = 64},
      distilbert = nd.nn.models.DistilBertForQuestionAnswering{vocab_size = 451, dim = 32, n_layers = 2,
        n_heads = 4, hidden_dim = 64, max_position_embeddings = 64},
    }
    for name, m in pairs(models) do
      m:eval()
      nd.save(m:state_dict(), dir .. "/" .. name .. ".safetensors")
    end
    S.write_file(dir .. "/context.txt", CONTEXT)
  end)
  teardown(function() H.rmdir(dir) end)

  -- the answers computed here, window by window
  local function expected(kind, question, top_k)
    local enc = tok:encode_batch({{question, CONTEXT}}, {max_length = 32, truncation = "only_second",
      return_overflowing_tokens = true, stride = 8, return_offsets_mapping = true})
    local starts, ends = {}, {}
    for r = 1, #enc.input_ids do
      local o = {}
      if kind == "bert" then o.token_type_ids = nd.tensor({enc.token_type_ids[r]}, {dtype = "int64"}) end
      local s, e = nd.no_grad(function() return models[kind](nd.tensor({enc.input_ids[r]}, {dtype = "int64"}), o) end)
      starts[r], ends[r] = s:view({-1}):totable(), e:view({-1}):totable()
    end
    return nd.text.answer_spans(starts, ends, enc, {CONTEXT}, {top_k = top_k})[1], #enc.input_ids
  end

  for _, kind in ipairs({"bert", "distilbert"}) do
    it("prints the answers of the " .. kind .. " model over the context's windows", function()
      local q = "what does the fox do?"
      local ok, text = run(("--weights %s --vocab %s --nhead 4 --model %s --context-file %s --max-seq-len 32 " ..
                            "--doc-stride 8 --top-k 2 %s"):format(S.q(dir .. "/" .. kind .. ".safetensors"), VOCAB,
                           kind, S.q(dir .. "/context.txt"), S.q(q)))
      assert(ok, text)
      local want, windows = expected(kind, q, 2)
      assert.is_true(windows >= 3, "the context spans several windows")
      assert.are.equal(2, #want)
      for k, a in ipairs(want) do
        local line = ("%d. \"%s\"  score %.4f  bytes %d-%d"):format(k, a.answer, a.score, a.first, a.last)
        assert.truthy(text:find(line, 1, true), line .. "\n" .. text)
      end
      assert.truthy(text:find(("1 questions, %d windows"):format(windows), 1, true), text)
    end)
  end

  it("takes --context, several questions and --no-answer", function()
    local ok, text = run(("--weights %s --vocab %s --nhead 4 --context %s --no-answer --top-k 3 %s %s"):format(
      S.q(dir .. "/bert.safetensors"), VOCAB, S.q("the cat sat on the mat"), S.q("who sat?"), S.q("where?")))
    assert(ok, text)
    assert.truthy(text:find("[1] who sat?", 1, true) and text:find("[2] where?", 1, true), text)
    assert.truthy(text:find("(no answer)", 1, true), text)
  end)

  it("fits the windows to the model's positions, and says when a context gives nothing to answer", function()
    -- the models here have 64 positions: the default 384 becomes 64, the stride 32
    local long = (CONTEXT .. " "):rep(3)
    local ok, text = run(("--weights %s --vocab %s --nhead 4 --context %s q"):format(
      S.q(dir .. "/bert.safetensors"), VOCAB, S.q(long)))
    assert(ok, text)
    assert.truthy(text:find("windows of up to 64 tokens", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --max-seq-len 65 --context hi q"):format(
      S.q(dir .. "/bert.safetensors"), VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("--max-seq-len 65 exceeds the model's max_position_embeddings 64", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --context ' ' q"):format(S.q(dir .. "/bert.safetensors"), VOCAB))
    assert(ok, text)
    assert.truthy(text:find("(no answer: the context gave no tokens)", 1, true), text)
  end)

  it("says what is wrong with its arguments", function()
    local w = S.q(dir .. "/bert.safetensors")
    local ok, text = run(("--weights %s --vocab %s --nhead 4 %s"):format(w, VOCAB, S.q("who?")))
    assert.is_false(ok)
    assert.truthy(text:find("--context TEXT or --context-file FILE", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --context hi"):format(w, VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("no question given", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --context-file /nonexistent/c.txt q"):format(w, VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("cannot read the context", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --context %s --max-seq-len 16 --doc-stride 12 q"):format(
      w, VOCAB, S.q(CONTEXT)))
    assert.is_false(ok)
    assert.truthy(text:find("stride 12 must be less than", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --context hi --model distilbert q"):format(w, VOCAB))
    assert.is_false(ok) -- BERT weights are not a DistilBERT model: the converter says why
    assert.truthy(text:find("distilbert", 1, true), text)
  end)
end)
