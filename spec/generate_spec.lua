-- generate_spec.lua - scripts/generate.lua as a user runs it: a small GPT-2
-- (Hugging Face keys) saved to safetensors and the test tokenizer of
-- spec/fixtures/text; the script's text is the model's own greedy (and seeded
-- sampled) continuation, cached or not; bad arguments are clear errors. (GPT-2
-- against PyTorch: spec/zoo_gpt2_spec.lua; the tokenizer: spec/text_spec.lua.)
local nd = require "needle"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local run = H.runner("generate")
local VOCAB, MERGES = "spec/fixtures/text/gpt2_vocab.json", "spec/fixtures/text/gpt2_merges.txt"

describe("scripts/generate.lua", function()
  local dir, tok, model
  setup(function()
    dir = H.tmpdir()
    tok = nd.text.ByteBPE.from_files(VOCAB, MERGES)
    nd.manual_seed(3)
    model = nd.nn.models.GPT2LMHeadModel({vocab_size = 548, n_positions = 64, n_embd = 32, n_layer = 2, n_head = 4})
    model:eval()
    nd.save(model:state_dict(), dir .. "/gpt2.safetensors")
  end)
  teardown(function() H.rmdir(dir) end)

  local function expected(prompt, n, o)
    local ids = tok:encode(prompt)
    o = o or {}
    o.max_new_tokens = n
    local out = nd.no_grad(function() return model:generate(nd.tensor({ids}, {dtype = "int64"}), o) end)
    local new = {}
    for i = #ids + 1, out:size(2) do new[#new + 1] = out[{1, i}]:item() end
    return prompt .. tok:decode(new)
  end

  local function args(extra)
    return ("--weights %s --vocab %s --merges %s --n-head 4 %s"):format(S.q(dir .. "/gpt2.safetensors"), VOCAB, MERGES, extra)
  end

  it("--dtype bfloat16 keeps the weights in half precision: the continuation of the model with rounded weights",
     function()
    local half = nd.nn.models.GPT2LMHeadModel({vocab_size = 548, n_positions = 64, n_embd = 32, n_layer = 2,
                                               n_head = 4}):eval()
    half:load_state_dict(model:state_dict())
    half:bfloat16()
    local ids = tok:encode("Hello world")
    local out = nd.no_grad(function() return half:generate(nd.tensor({ids}, {dtype = "int64"}), {max_new_tokens = 8}) end)
    local new = {}
    for i = #ids + 1, out:size(2) do new[#new + 1] = out[{1, i}]:item() end
    local ok, text = run(args("--prompt 'Hello world' --max-new-tokens 8 --dtype bfloat16"))
    assert(ok, text)
    assert.are.equal("Hello world" .. tok:decode(new), text:match("^(.-)\n%d+ prompt tokens"), text)
    assert.truthy(text:find("bfloat16 weights", 1, true), text)
    local bad
    ok, bad = run(args("--prompt 'x' --dtype half"))
    assert.is_false(ok)
    assert.truthy(bad:find("--dtype", 1, true), bad)
  end)

  it("greedy, with and without the cache: the model's own continuation", function()
    local want = expected("Hello world", 12)
    for _, extra in ipairs({"", " --no-cache"}) do
      local ok, text = run(args("--prompt 'Hello world' --max-new-tokens 12" .. extra))
      assert(ok, text)
      assert.are.equal(want, text:match("^(.-)\n%d+ prompt tokens"), text)
      assert.truthy(text:find("2 prompt tokens, 12 new in", 1, true), text)
    end
  end)

  it("sampling with a seed is repeatable and is generate's", function()
    local want = expected("Hello world", 8, {do_sample = true, temperature = 0.9, top_k = 20, seed = 5})
    local ok, text = run(args("--prompt 'Hello world' --max-new-tokens 8 --sample --temperature 0.9 --top-k 20 --seed 5"))
    assert(ok, text)
    assert.are.equal(want, text:match("^(.-)\n%d+ prompt tokens"), text)
  end)

  it("beam search: generate's best beam, with and without the cache", function()
    local want = expected("Hello world", 10, {num_beams = 3, length_penalty = 0.8})
    assert.are_not.equal(expected("Hello world", 10), want, "the beams should differ from greedy here")
    for _, extra in ipairs({"", " --no-cache"}) do
      local ok, text = run(args("--prompt 'Hello world' --max-new-tokens 10 --num-beams 3 --length-penalty 0.8" .. extra))
      assert(ok, text)
      assert.are.equal(want, text:match("^(.-)\n%d+ prompt tokens"), text)
    end
    -- with --sample, beam sampling: generate's with the seed
    local sampled = expected("Hello world", 6, {num_beams = 2, do_sample = true, top_k = 8, seed = 3})
    local ok, text = run(args("--prompt 'Hello world' --max-new-tokens 6 --num-beams 2 --sample --top-k 8 --seed 3"))
    assert(ok, text)
    assert.are.equal(sampled, text:match("^(.-)\n%d+ prompt tokens"), text)
    ok, text = run(args("--prompt hi --length-penalty 0.5"))
    assert.is_false(ok)
    assert.truthy(text:find("--length-penalty goes with --num-beams", 1, true), text)
  end)

  it("errors", function()
    local ok, text = run("--prompt hi")
    assert.is_false(ok)
    assert.truthy(text:find("--weights is required", 1, true), text)
    ok, text = run(args("--prompt hi --max-new-tokens 0"))
    assert.is_false(ok)
    assert.truthy(text:find("max-new-tokens", 1, true), text)
    ok, text = run(("--weights /nonexistent --vocab %s --merges %s --prompt hi"):format(VOCAB, MERGES))
    assert.is_false(ok)
    assert.truthy(text:find("generate: cannot read /nonexistent", 1, true), text)
    ok, text = run(("--weights %s --vocab /nonexistent.json --merges %s --prompt hi"):format(S.q(dir .. "/gpt2.safetensors"), MERGES))
    assert.is_false(ok)
    assert.truthy(text:find("/nonexistent.json", 1, true), text)
  end)
end)
