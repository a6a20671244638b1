-- spec/options/zoo_gpt2.lua - the options tables of Hugging Face's GPT-2 in
-- needle (issue 21): the GPT2Config fields of nd.nn.models.GPT2LMHeadModel and
-- GPT2Model, their forward and generate options, and convert.model('gpt2').
-- Merged into options_spec.lua.
return function(nd)
  local models = nd.nn.models
  local CONFIG = "activation_function, attn_pdrop, embd_pdrop, layer_norm_epsilon, n_embd, n_head, n_inner, " ..
                 "n_layer, n_positions, resid_pdrop, vocab_size"
  -- small sizes: the defaults build the 124M-parameter gpt2
  local function small(o)
    for k, v in pairs({vocab_size = 10, n_positions = 8, n_embd = 64, n_layer = 1, n_head = 2}) do
      if o[k] == nil then o[k] = v end
    end
    return o
  end
  local lm = models.GPT2LMHeadModel(small({})):eval()
  local base = models.GPT2Model(small({})):eval()
  local ids = nd.tensor({{1, 2, 3}}, {dtype = "int64"})
  local FORWARD = "attention_mask, past_key_values, position_ids, use_cache"
  return {
    models = {
      GPT2LMHeadModel = {CONFIG, function(o) return models.GPT2LMHeadModel(small(o)) end},
      GPT2Model = {CONFIG, function(o) return models.GPT2Model(small(o)) end},
    },
    rest = {
      {"nn.models.GPT2LMHeadModel", FORWARD, function(o) return lm(ids, o) end},
      {"nn.models.GPT2Model", FORWARD, function(o) return base(ids, o) end},
      {"nn.models.GPT2LMHeadModel.generate", "attention_mask, do_sample, early_stopping, eos_token_id, " ..
       "length_penalty, max_new_tokens, num_beams, num_return_sequences, pad_token_id, seed, temperature, " ..
       "top_k, top_p, use_cache",
       function(o) o.max_new_tokens = o.max_new_tokens or 2; return lm:generate(ids, o) end},
      {"convert.model('gpt2')",
       "activation_function, convert_dtype, layer_norm_epsilon, mapping, n_head, nhead, strict",
       function(o) return nd.convert.model("gpt2", lm:state_dict(), o) end},
    },
  }
end
