-- scripts/bert_embed.lua - sentence embeddings from BERT (Hugging Face
-- weights) and WordPiece, and their cosine similarities.
--
--   build/needle-lua scripts/bert_embed.lua --weights bert/pytorch_model.bin --vocab bert/vocab.txt \
--       "A cat sat on the mat." "A kitten sat on a rug." "Stocks fell sharply."
--
-- Each text is tokenised ([CLS] ... [SEP], one padded batch with its attention
-- mask), run through BertModel and pooled: the mean of the last hidden states
-- over the real tokens (--pool mean, the default) or the [CLS] state (--pool
-- cls). Prints each embedding's size and norm and the matrix of cosine
-- similarities; --out FILE saves the embeddings (safetensors, "embeddings").
local nd = require "needle"
local cli = require "needle.cli"

local PROG = "bert_embed"

local usage = [[
usage: needle-lua scripts/bert_embed.lua --weights FILE --vocab vocab.txt [options] TEXT...

options:
  --weights FILE     BERT weights (Hugging Face keys, BertModel or a BertFor* head's):
                     .bin/.pt or .safetensors
  --vocab FILE       the tokenizer's vocab.txt
  --nhead N          attention heads (default: hidden size / 64, as bert-base and -large)
  --cased            keep case and accents (for cased models)
  --pool KIND        mean (default) or cls
  --max-length N     truncate each text to N tokens with [CLS] and [SEP] (default 128)
  --out FILE         save the embeddings (safetensors, tensor "embeddings")
  --device DEV       cpu (default), opencl or opencl:N
  -h, --help         this text
]]

local argv, texts = cli.split_args(arg, {weights = true, vocab = true, nhead = true, pool = true,
                                         ["max-length"] = true, out = true, device = true})
local opts = cli.parse(argv, {pool = "mean", ["max-length"] = 128, device = "cpu"}, usage,
                       {prog = PROG, numbers = {nhead = true, ["max-length"] = true}, flags = {cased = true},
                        optional = {"weights", "vocab", "nhead", "out"}})
for _, k in ipairs({"weights", "vocab"}) do
  if opts[k] == nil then cli.die(PROG, 2, "--%s is required (see --help)", k) end
end
if #texts == 0 then cli.die(PROG, 2, "no text given (see --help)") end
cli.choice(PROG, opts, "pool", {"mean", "cls"})
cli.positive_integers(PROG, opts, {"max-length"})
local device = cli.check_device(PROG, opts)

local ok, tok = pcall(nd.text.WordPiece.from_file, opts.vocab, {lowercase = not opts.cased})
if not ok then cli.die(PROG, 1, "%s", cli.message(tok)) end
local model = cli.convert_model(PROG, "bert", cli.read_state_dict(PROG, opts.weights),
                                {num_attention_heads = opts.nhead}):to(device)

local enc = tok:encode_batch(texts, {padding = "longest", truncation = true, max_length = opts["max-length"],
                                     return_tensors = true})
local ids, mask = enc.input_ids:to(device), enc.attention_mask:to(device)
local t0 = nd.clock()
local emb = nd.no_grad(function()
  local hidden = model(ids, {attention_mask = mask, token_type_ids = enc.token_type_ids:to(device)})
  if opts.pool == "cls" then return hidden:select(2, 1) end
  local m = mask:to({dtype = hidden.dtype}):unsqueeze(3)
  return (hidden * m):sum(2) / m:sum(2)
end):to("cpu")
local seconds = nd.clock() - t0

local unit = emb / emb:pow(2):sum(2, true):sqrt()
local sim = unit:matmul(unit:t())
for i, t in ipairs(texts) do
  print(("[%d] %s\n    %d tokens, embedding %d, norm %.4f"):format(i, t, mask[i]:sum():item(), emb:size(2),
                                                                   emb[i]:pow(2):sum():sqrt():item()))
end
print("cosine similarity:")
for i = 1, #texts do
  local row = {}
  for j = 1, #texts do row[j] = ("%7.4f"):format(sim[{i, j}]:item()) end
  print(("  [%d] %s"):format(i, table.concat(row, " ")))
end
if opts.out then
  ok = pcall(nd.save, {embeddings = emb}, opts.out)
  if not ok then cli.die(PROG, 1, "cannot write %s", opts.out) end
  print("wrote " .. opts.out)
end
print(("%d texts through BERT in %.3f s on %s"):format(#texts, seconds, device))
