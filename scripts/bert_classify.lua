-- scripts/bert_classify.lua - texts (or sentence pairs) through a fine-tuned
-- BERT or DistilBERT sequence classifier (Hugging Face weights): each text's
-- class probabilities.
--
--   build/needle-lua scripts/bert_classify.lua --weights sst2/pytorch_model.bin --vocab sst2/vocab.txt \
--       --labels negative,positive "a gripping, beautiful film" "tedious and far too long"
--   ... --model distilbert "premise ||| hypothesis"      # a pair: text_a ||| text_b
--
-- The weights are a BertForSequenceClassification or
-- DistilBertForSequenceClassification state dict (torch.save, read without
-- Python; or .safetensors), loaded through the converter entries
-- bert_for_sequence_classification / distilbert_for_sequence_classification
-- (docs/models-text.md); the number of classes comes from the weights.
local nd = require "needle"
local cli = require "needle.cli"

local PROG = "bert_classify"

local usage = [[
usage: needle-lua scripts/bert_classify.lua --weights FILE --vocab vocab.txt [options] TEXT...

A TEXT holding " ||| " is a sentence pair (text_a ||| text_b, token types 1 and 2).

options:
  --weights FILE     a Hugging Face BertForSequenceClassification or
                     DistilBertForSequenceClassification state dict (.bin/.pt, .safetensors)
  --vocab FILE       the tokenizer's vocab.txt
  --model KIND       bert (default) or distilbert
  --nhead N          attention heads (default: hidden size / 64)
  --labels A,B,...   class names, in the classifier's order (default: class 1, class 2, ...)
  --cased            keep case and accents (for cased models)
  --max-length N     truncate each input to N tokens with [CLS] and [SEP] (default 128)
  --device DEV       cpu (default), opencl or opencl:N
  -h, --help         this text
]]

local argv, texts = cli.split_args(arg, {weights = true, vocab = true, model = true, nhead = true, labels = true,
                                         ["max-length"] = true, device = true})
local opts = cli.parse(argv, {model = "bert", ["max-length"] = 128, device = "cpu"}, usage,
                       {prog = PROG, numbers = {nhead = true, ["max-length"] = true}, flags = {cased = true},
                        optional = {"weights", "vocab", "nhead", "labels"}})
for _, k in ipairs({"weights", "vocab"}) do
  if opts[k] == nil then cli.die(PROG, 2, "--%s is required (see --help)", k) end
end
if #texts == 0 then cli.die(PROG, 2, "no text given (see --help)") end
cli.choice(PROG, opts, "model", {"bert", "distilbert"})
cli.positive_integers(PROG, opts, {"max-length"})
local device = cli.check_device(PROG, opts)

local ok, tok = pcall(nd.text.WordPiece.from_file, opts.vocab, {lowercase = not opts.cased})
if not ok then cli.die(PROG, 1, "%s", cli.message(tok)) end
local model = cli.convert_model(PROG, opts.model .. "_for_sequence_classification",
                                cli.read_state_dict(PROG, opts.weights), {nhead = opts.nhead}):to(device)

local inputs = {}
for i, t in ipairs(texts) do
  local a, b = t:match("^(.-) |||%s(.*)$")
  inputs[i] = a and {a, b} or t
end
local enc = tok:encode_batch(inputs, {padding = "longest", truncation = true, max_length = opts["max-length"],
                                      return_tensors = true})
local fwd = {attention_mask = enc.attention_mask:to(device)}
if opts.model == "bert" then fwd.token_type_ids = enc.token_type_ids:to(device) end
local t0 = nd.clock()
local probs = nd.no_grad(function() return nd.F.softmax(model(enc.input_ids:to(device), fwd), 2) end):to("cpu")
local seconds = nd.clock() - t0

local labels = {}
if opts.labels then for l in opts.labels:gmatch("[^,]+") do labels[#labels + 1] = l end end
if #labels > 0 and #labels ~= probs:size(2) then
  cli.die(PROG, 2, "--labels names %d classes, the classifier has %d", #labels, probs:size(2))
end
for i, t in ipairs(texts) do
  local best, bi = probs[i]:max(1)
  local parts = {}
  for c = 1, probs:size(2) do parts[c] = ("%s %.4f"):format(labels[c] or ("class " .. c), probs[{i, c}]:item()) end
  print(("[%d] %s\n    %s  (%s)"):format(i, t, labels[bi:item()] or ("class " .. bi:item()), table.concat(parts, ", ")))
  local _ = best
end
print(("%d texts through %s in %.3f s on %s"):format(#texts, opts.model, seconds, device))
