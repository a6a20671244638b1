-- scripts/bert_qa.lua - extractive question answering with a fine-tuned BERT
-- or DistilBERT (Hugging Face weights, e.g. a SQuAD model): the answer to a
-- question, as a span of the context, with its score.
--
--   build/needle-lua scripts/bert_qa.lua --weights squad/pytorch_model.bin --vocab squad/vocab.txt \
--       --context "The Eiffel Tower was completed in 1889 ..." "When was the Eiffel Tower completed?"
--   ... --context-file article.txt --top-k 3 "question one" "question two"
--
-- Hugging Face's question-answering pipeline, step by step: the question and
-- the context are encoded as a pair, the context cut into windows of
-- --max-seq-len tokens that overlap by --doc-stride (truncation only_second
-- with overflowing tokens), every window goes through the model, and
-- nd.text.answer_spans picks the best spans over all windows
-- (docs/text.md). The weights are a BertForQuestionAnswering or
-- DistilBertForQuestionAnswering state dict (torch.save, read without
-- Python; or .safetensors), loaded through the converter entries
-- bert_for_question_answering / distilbert_for_question_answering.
local nd = require "needle"
local cli = require "needle.cli"

local PROG = "bert_qa"

local usage = [[
usage: needle-lua scripts/bert_qa.lua --weights FILE --vocab vocab.txt (--context TEXT | --context-file FILE)
                                      [options] QUESTION...

options:
  --weights FILE       a Hugging Face BertForQuestionAnswering or
                       DistilBertForQuestionAnswering state dict (.bin/.pt, .safetensors)
  --vocab FILE         the tokenizer's vocab.txt
  --context TEXT       the text the answers come from
  --context-file FILE  the same, read from a file (UTF-8)
  --model KIND         bert (default) or distilbert
  --nhead N            attention heads (default: hidden size / 64)
  --cased              keep case and accents (for cased models)
  --top-k N            answers per question (default 1)
  --max-seq-len N      tokens per window, question and special tokens included (default 384,
                       or the model's max_position_embeddings if fewer)
  --doc-stride N       tokens each window shares with the one before (default: half of
                       --max-seq-len, at most 128)
  --max-answer-len N   longest answer in tokens (default 15)
  --no-answer          also consider "no answer" (SQuAD 2.0 models)
  --device DEV         cpu (default), opencl or opencl:N
  -h, --help           this text
]]

local valued = {weights = true, vocab = true, context = true, ["context-file"] = true, model = true, nhead = true,
                ["top-k"] = true, ["max-seq-len"] = true, ["doc-stride"] = true, ["max-answer-len"] = true,
                device = true}
local argv, questions = cli.split_args(arg, valued)
local opts, given = cli.parse(argv, {model = "bert", ["top-k"] = 1, ["max-seq-len"] = 384, ["doc-stride"] = 128,
                                     ["max-answer-len"] = 15, device = "cpu"}, usage,
                              {prog = PROG, numbers = {nhead = true, ["top-k"] = true, ["max-seq-len"] = true,
                                                       ["doc-stride"] = true, ["max-answer-len"] = true},
                               flags = {cased = true, ["no-answer"] = true},
                               optional = {"weights", "vocab", "nhead", "context", "context-file"}})
for _, k in ipairs({"weights", "vocab"}) do
  if opts[k] == nil then cli.die(PROG, 2, "--%s is required (see --help)", k) end
end
if (opts.context == nil) == (opts["context-file"] == nil) then
  cli.die(PROG, 2, "give the context with --context TEXT or --context-file FILE (one of them)")
end
if #questions == 0 then cli.die(PROG, 2, "no question given (see --help)") end
cli.choice(PROG, opts, "model", {"bert", "distilbert"})
cli.positive_integers(PROG, opts, {"top-k", "max-seq-len", "max-answer-len"})
if opts["doc-stride"] < 0 or math.type(opts["doc-stride"]) ~= "integer" then
  cli.die(PROG, 2, "--doc-stride must be an integer, 0 or more, got %s", tostring(opts["doc-stride"]))
end
local device = cli.check_device(PROG, opts)

local context = opts.context
if context == nil then
  local f, err = io.open(opts["context-file"], "rb")
  if not f then cli.die(PROG, 1, "cannot read the context: %s", err) end
  context = f:read("a")
  f:close()
end

local ok, tok = pcall(nd.text.WordPiece.from_file, opts.vocab, {lowercase = not opts.cased})
if not ok then cli.die(PROG, 1, "%s", cli.message(tok)) end
local model = cli.convert_model(PROG, opts.model .. "_for_question_answering",
                                cli.read_state_dict(PROG, opts.weights), {nhead = opts.nhead}):to(device)
model:eval()

-- HF's pipeline: windows of min(384, the model's positions), stride min(half, 128)
local positions = model.config.max_position_embeddings
if given["max-seq-len"] and opts["max-seq-len"] > positions then
  cli.die(PROG, 2, "--max-seq-len %d exceeds the model's max_position_embeddings %d", opts["max-seq-len"], positions)
end
opts["max-seq-len"] = math.min(opts["max-seq-len"], positions)
if not given["doc-stride"] then opts["doc-stride"] = math.min(opts["max-seq-len"] // 2, 128) end

local pairs_in = {}
for i, q in ipairs(questions) do pairs_in[i] = {q, context} end
local enc
ok, enc = pcall(tok.encode_batch, tok, pairs_in, {
  max_length = opts["max-seq-len"], truncation = "only_second", return_overflowing_tokens = true,
  stride = opts["doc-stride"], return_offsets_mapping = true, padding = "longest", return_tensors = true})
if not ok then cli.die(PROG, 2, "%s", cli.message(enc)) end

local t0 = nd.clock()
local fwd = {attention_mask = enc.attention_mask:to(device)}
if opts.model == "bert" then fwd.token_type_ids = enc.token_type_ids:to(device) end
local starts, ends
ok, starts, ends = pcall(nd.no_grad, function() return model(enc.input_ids:to(device), fwd) end)
if not ok then cli.die(PROG, 1, "%s", cli.message(starts)) end
local seconds = nd.clock() - t0

local contexts = {}
for i = 1, #questions do contexts[i] = context end
local answers
ok, answers = pcall(nd.text.answer_spans, starts, ends, enc, contexts,
                    {top_k = opts["top-k"], max_answer_len = opts["max-answer-len"],
                     handle_impossible_answer = opts["no-answer"] == true})
if not ok then cli.die(PROG, 1, "%s", cli.message(answers)) end

for i, q in ipairs(questions) do
  print(("[%d] %s"):format(i, q))
  if #answers[i] == 0 then print("    (no answer: the context gave no tokens)") end
  for k, a in ipairs(answers[i]) do
    if a.first == 0 then
      print(("    %d. (no answer)  score %.4f"):format(k, a.score))
    else
      print(("    %d. \"%s\"  score %.4f  bytes %d-%d"):format(k, (a.answer:gsub("%s+", " ")), a.score, a.first,
                                                             a.last))
    end
  end
end
print(("%d questions, %d windows of up to %d tokens through %s in %.3f s on %s"):format(
  #questions, enc.input_ids:size(1), enc.input_ids:size(2), opts.model, seconds, device))
