-- scripts/generate.lua - text from a prompt with GPT-2 (Hugging Face weights)
-- and its byte-level BPE tokenizer, with the key/value cache: tokens/s printed.
--
--   build/needle-lua scripts/generate.lua --weights gpt2/pytorch_model.bin --vocab gpt2/vocab.json \
--       --merges gpt2/merges.txt --prompt "The meaning of life is" --max-new-tokens 40
--   ... --sample --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1
--
-- The weights are a Hugging Face GPT-2 state dict (torch.save, read without
-- Python; or a .safetensors file), loaded through the converter entry "gpt2"
-- (docs/models-gpt2.md); --n-head when it is not n_embd / 64. Greedy by
-- default; --sample draws with temperature, top-k and top-p from needle's
-- random stream (--seed makes it repeatable).
local nd = require "needle"
local cli = require "needle.cli"

local PROG = "generate"

local usage = [[
usage: needle-lua scripts/generate.lua --weights FILE --vocab vocab.json --merges merges.txt --prompt TEXT [options]

options:
  --weights FILE        GPT-2 weights (Hugging Face keys): .bin/.pt or .safetensors
  --vocab FILE          the tokenizer's vocab.json
  --merges FILE         the tokenizer's merges.txt
  --prompt TEXT         the text to continue
  --max-new-tokens N    tokens to generate (default 40)
  --n-head N            attention heads (default n_embd / 64, as every released GPT-2)
  --sample              sample instead of the greedy choice
  --temperature T       (with --sample; default 1)
  --top-k K             keep the K likeliest tokens (with --sample; default 0: all)
  --top-p P             nucleus sampling (with --sample; default 1)
  --seed N              for --sample (default 1)
  --num-beams N         beam search with N beams (default 1: greedy or sampling; with --sample, beam
                        sampling); prints the best sequence
  --length-penalty L    with --num-beams: a hypothesis' score is its log-probability / length^L (default 1)
  --no-cache            re-run the whole sequence for every token (slow; for comparison)
  --device DEV          cpu (default), opencl or opencl:N
  --dtype D             the weights in memory: float32 (default), bfloat16 or float16 (half the
                        memory; computed in float32, faster token by token on AVX-512 CPUs:
                        docs/tensor.md, "Half-precision models")
  -h, --help            this text
]]

local opts = cli.parse(arg, {["max-new-tokens"] = 40, temperature = 1, ["top-k"] = 0, ["top-p"] = 1, seed = 1,
                             device = "cpu", ["num-beams"] = 1, dtype = "float32"}, usage,
                       {prog = PROG, numbers = {["max-new-tokens"] = true, temperature = true, ["top-k"] = true,
                                                ["top-p"] = true, seed = true, ["n-head"] = true,
                                                ["num-beams"] = true, ["length-penalty"] = true},
                        flags = {sample = true, ["no-cache"] = true},
                        optional = {"weights", "vocab", "merges", "prompt", "n-head", "length-penalty"}})
for _, k in ipairs({"weights", "vocab", "merges", "prompt"}) do
  if opts[k] == nil then cli.die(PROG, 2, "--%s is required (see --help)", k) end
end
cli.positive_integers(PROG, opts, {"max-new-tokens", "num-beams"})
if opts["length-penalty"] ~= nil and opts["num-beams"] == 1 then
  cli.die(PROG, 2, "--length-penalty goes with --num-beams N (N > 1)")
end
local device = cli.check_device(PROG, opts)
cli.choice(PROG, opts, "dtype", {"float32", "bfloat16", "float16"})

local ok, tok = pcall(nd.text.ByteBPE.from_files, opts.vocab, opts.merges)
if not ok then cli.die(PROG, 1, "%s", cli.message(tok)) end
local model = cli.convert_model(PROG, "gpt2", cli.read_state_dict(PROG, opts.weights),
                                {n_head = opts["n-head"]}):to(device):to(opts.dtype)

local prompt_ids = tok:encode(opts.prompt)
if #prompt_ids == 0 then cli.die(PROG, 2, "the prompt is empty") end
local input = nd.tensor({prompt_ids}, {dtype = "int64", device = device})

local t0 = nd.clock()
local out
ok, out = pcall(function()
  return nd.no_grad(function()
    return model:generate(input, {max_new_tokens = opts["max-new-tokens"], do_sample = opts.sample or false,
                                  temperature = opts.temperature, top_k = opts["top-k"], top_p = opts["top-p"],
                                  seed = opts.sample and opts.seed or nil, use_cache = not opts["no-cache"],
                                  num_beams = opts["num-beams"], length_penalty = opts["length-penalty"]})
  end)
end)
if not ok then cli.die(PROG, 1, "%s", cli.message(out)) end
local seconds = nd.clock() - t0

local ids = {}
local row = out[1]:to("cpu")
for i = 1, row:numel() do ids[i] = row[i]:item() end
local new = {}
for i = #prompt_ids + 1, #ids do new[#new + 1] = ids[i] end
io.write(opts.prompt, tok:decode(new), "\n")
print(("%d prompt tokens, %d new in %.2f s: %.1f tokens/s (%s, %s, %s weights)"):format(#prompt_ids, #new, seconds,
  #new / math.max(seconds, 1e-9), opts["no-cache"] and "no cache" or "key/value cache", device, opts.dtype))
