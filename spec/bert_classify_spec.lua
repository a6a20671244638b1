-- bert_classify_spec.lua - scripts/bert_classify.lua as a user runs it: small
-- BERT and DistilBERT classifiers (Hugging Face keys) saved to safetensors and
-- the test vocabulary; the printed probabilities are the model's own on each
-- text (and sentence pair) run alone; bad arguments are clear errors.
local nd = require "needle"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local run = H.runner("bert_classify")
local VOCAB = "spec/fixtures/text/bert_vocab.txt"

describe("scripts/bert_classify.lua", function()
  local dir, tok, models
  setup(function()
    dir = H.tmpdir()
    tok = nd.text.WordPiece.from_file(VOCAB)
    nd.manual_seed(4)
    models = {
      bert = nd.nn.models.BertForSequenceClassification{vocab_size = 451, hidden_size = 32, num_hidden_layers = 2,
        num_attention_heads = 4, intermediate_size = 64, max_position_embeddings = 64, num_labels = 3},
      distilbert = nd.nn.models.DistilBertForSequenceClassification{vocab_size = 451, dim = 32, n_layers = 2,
        n_heads = 4, hidden_dim = 64, max_position_embeddings = 64, num_labels = 2},
    }
    for name, m in pairs(models) do
      m:eval()
      nd.save(m:state_dict(), dir .. "/" .. name .. ".safetensors")
    end
  end)
  teardown(function() H.rmdir(dir) end)

  local function probs_alone(kind, input)
    local e = tok:encode(input)
    local o = {}
    if kind == "bert" then o.token_type_ids = nd.tensor({e.token_type_ids}, {dtype = "int64"}) end
    return nd.no_grad(function()
      return nd.F.softmax(models[kind](nd.tensor({e.input_ids}, {dtype = "int64"}), o), 2)
    end)
  end

  for _, kind in ipairs({"bert", "distilbert"}) do
    it("prints the " .. kind .. " classifier's own probabilities", function()
      local texts = {"hello world", "the cat sat ||| a dog ran away"}
      local ok, text = run(("--weights %s --vocab %s --nhead 4 --model %s %s %s"):format(
        S.q(dir .. "/" .. kind .. ".safetensors"), VOCAB, kind, S.q(texts[1]), S.q(texts[2])))
      assert(ok, text)
      local inputs = {texts[1], {"the cat sat", "a dog ran away"}}
      for i, input in ipairs(inputs) do
        local p = probs_alone(kind, input)
        local line = text:match(("%%[%d%%][^\n]*\n([^\n]*)"):format(i))
        assert(line, text)
        for c = 1, p:size(2) do
          assert.truthy(line:find(("class %d %.4f"):format(c, p[{1, c}]:item()), 1, true), line)
        end
      end
    end)
  end

  it("labels and errors", function()
    local w = S.q(dir .. "/bert.safetensors")
    local ok, text = run(("--weights %s --vocab %s --nhead 4 --labels neg,neu,pos hi"):format(w, VOCAB))
    assert(ok, text)
    assert.truthy(text:find("neg 0.", 1, true) and text:find("pos 0.", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --labels a,b hi"):format(w, VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("--labels names 2 classes, the classifier has 3", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --model gpt hi"):format(w, VOCAB))
    assert.is_false(ok)
    ok, text = run(("--weights %s --vocab %s --nhead 4"):format(w, VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("no text given", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --model distilbert hi"):format(w, VOCAB))
    assert.is_false(ok) -- BERT weights are not a DistilBERT classifier: the converter says why
    assert.truthy(text:find("distilbert", 1, true), text)
  end)
end)
