-- bert_embed_spec.lua - scripts/bert_embed.lua as a user runs it: a small BERT
-- (Hugging Face keys) saved to safetensors and the test vocabulary of
-- spec/fixtures/text; the saved embeddings are the model's own mean-pooled
-- (and [CLS]) states over the real tokens, and the printed similarities are
-- theirs. (BERT against PyTorch: spec/zoo_bert_spec.lua; WordPiece:
-- spec/text_spec.lua.)
local nd = require "needle"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local run = H.runner("bert_embed")
local VOCAB = "spec/fixtures/text/bert_vocab.txt"
local TEXTS = {"hello world", "the cat", "hello there world, again"}

describe("scripts/bert_embed.lua", function()
  local dir, model, tok
  setup(function()
    dir = H.tmpdir()
    nd.manual_seed(2)
    model = nd.nn.models.BertModel{vocab_size = 451, hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4,
                                   intermediate_size = 64, max_position_embeddings = 64}
    model:eval()
    nd.save(model:state_dict(), dir .. "/bert.safetensors")
    tok = nd.text.WordPiece.from_file(VOCAB)
  end)
  teardown(function() H.rmdir(dir) end)

  local function quoted() local q = {} for i, t in ipairs(TEXTS) do q[i] = S.q(t) end return table.concat(q, " ") end

  for _, pool in ipairs({"mean", "cls"}) do
    it("saves the model's own " .. pool .. "-pooled embeddings and prints their similarities", function()
      local out = dir .. "/emb_" .. pool .. ".safetensors"
      local ok, text = run(("--weights %s --vocab %s --nhead 4 --pool %s --out %s %s"):format(
        S.q(dir .. "/bert.safetensors"), VOCAB, pool, S.q(out), quoted()))
      assert(ok, text)
      local got = nd.load(out).embeddings
      -- each text alone (no padding): the same numbers as in the padded batch
      for i, t in ipairs(TEXTS) do
        local e = tok:encode(t)
        local hidden = nd.no_grad(function() return model(nd.tensor({e.input_ids}, {dtype = "int64"})) end)
        local want = pool == "cls" and hidden[{1, 1}] or hidden[1]:mean(1)
        assert.is_true(nd.allclose(got[i], want, {rtol = 1e-4, atol = 1e-5}), t)
      end
      local u = got / got:pow(2):sum(2, true):sqrt()
      local s12 = (u[1] * u[2]):sum():item()
      assert.truthy(text:find(("%7.4f"):format(s12), 1, true), text)
    end)
  end

  it("errors", function()
    local ok, text = run("--vocab " .. VOCAB .. " hi")
    assert.is_false(ok)
    assert.truthy(text:find("--weights is required", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4"):format(S.q(dir .. "/bert.safetensors"), VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("no text given", 1, true), text)
    ok, text = run(("--weights %s --vocab %s --nhead 4 --pool max hi"):format(S.q(dir .. "/bert.safetensors"), VOCAB))
    assert.is_false(ok)
    assert.truthy(text:find("pool", 1, true), text)
  end)
end)
