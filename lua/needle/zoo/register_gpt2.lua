-- needle.zoo.register_gpt2: the "gpt2" entry of needle.convert's model registry
-- (loaded by needle.convert.models).
--
--   local model = nd.convert.model("gpt2", nd.load_torch("pytorch_model.bin"))
--   build/needle-lua scripts/convert_torch.lua pytorch_model.bin gpt2.safetensors --model gpt2
--
-- Takes a Hugging Face GPT-2 checkpoint in any of its layouts: GPT2LMHeadModel's
-- keys (transformer.*, with or without lm_head.weight) or the bare GPT2Model keys
-- of the original gpt2 files (wte.weight, h.0.attn.c_attn.weight, ...), with or
-- without the attn.bias / attn.masked_bias buffers (dropped). The config comes
-- from the shapes: vocab_size and n_embd from wte, n_positions from wpe, n_layer
-- from the h.N keys, n_inner from mlp.c_fc. n_head is not in the weights: the
-- n_head option (nhead too: scripts/convert_torch.lua's --nhead), else
-- n_embd / 64 (every released GPT-2 has 64-dim heads: 768/12, 1024/16,
-- 1280/20, 1600/25). The key variants go through the named mapping "hf_gpt2"
-- (needle.zoo.gpt2.hf_state_dict).
local errors = require "needle.errors"
local core = require "needle.core"
local mappings = require "needle.convert.mappings"

local fail = errors.failer("convert", 0)
local shape_str = errors.shape_str
local NAME = "gpt2"

local function need(sd, key, dims) return require("needle.convert.state_dict").need(sd, key, dims, NAME) end

-- models: the needle.convert.models table being loaded (its register)
local M = {}

function M.register(models)
  mappings.register("hf_gpt2",
    "Hugging Face GPT-2 checkpoints -> GPT2LMHeadModel's keys: bare GPT2Model keys get 'transformer.', "
    .. "attn.bias / attn.masked_bias dropped, lm_head.weight dropped when equal to transformer.wte.weight (tied)",
    function(sd) return require("needle.zoo.gpt2").hf_state_dict(sd) end)
  models.register(NAME, {
    options = {n_head = "integer", nhead = "integer", activation_function = "string",
               layer_norm_epsilon = "number"},
    mapping = "hf_gpt2",
    description = "Hugging Face GPT2LMHeadModel (or bare GPT2Model keys) -> nd.nn.models.GPT2LMHeadModel; sizes from "
               .. "the weights, n_head from opts (default n_embd / 64); ids 1-based (HF id + 1)",
    build = function(sd, opts)
      opts = opts or {}
      local wte = need(sd, "transformer.wte.weight", 2)
      local wpe = need(sd, "transformer.wpe.weight", 2)
      local E = wte:size(2)
      if wpe:size(2) ~= E then
        fail("%s: transformer.wpe.weight %s and transformer.wte.weight %s disagree on n_embd", NAME,
             shape_str(wpe), shape_str(wte))
      end
      local n_layer = 0
      while sd[("transformer.h.%d.ln_1.weight"):format(n_layer)] ~= nil do n_layer = n_layer + 1 end
      if n_layer == 0 then fail("%s: no blocks (transformer.h.0.ln_1.weight) in the state dict", NAME) end
      local fc = need(sd, "transformer.h.0.mlp.c_fc.weight", 2)
      if opts.n_head ~= nil and opts.nhead ~= nil and opts.n_head ~= opts.nhead then
        fail("%s: n_head %d and nhead %d disagree (one name for the same option)", NAME, opts.n_head, opts.nhead)
      end
      local n_head = opts.n_head or opts.nhead
      if n_head == nil then
        if E % 64 ~= 0 then
          fail("%s: n_embd %d is not a multiple of 64: give n_head (the weights do not hold it)", NAME, E)
        end
        n_head = E // 64
      elseif n_head < 1 or E % n_head ~= 0 then
        fail("%s: n_head must be a positive integer dividing n_embd %d, got %d", NAME, E, n_head)
      end
      return require("needle.zoo.gpt2").GPT2LMHeadModel({
        vocab_size = wte:size(1), n_positions = wpe:size(1), n_embd = E, n_layer = n_layer, n_head = n_head,
        n_inner = fc:size(2), activation_function = opts.activation_function,
        layer_norm_epsilon = opts.layer_norm_epsilon})
    end,
    input_example = function(model)
      return core.randint(1, model.config.vocab_size, {1, math.min(8, model.config.n_positions)},
                          {dtype = "int64"})
    end,
  })
end

return M
