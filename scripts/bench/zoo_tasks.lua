-- scripts/bench/zoo_tasks.lua: the rows of scripts/bench/zoo.lua - which
-- model, which task, at which sizes - in one place, so that needle's worker
-- and PyTorch's get the same numbers (zoo.lua passes them to both as
-- key=value arguments).
--
--   local Z = dofile("scripts/bench/zoo_tasks.lua")
--   Z.group_names                 the --models names, in table order
--   Z.groups[name]                true for each
--   Z.rows{quick=, batch={I, T}, text_batch={I, T}, want={name=true}}
--       -> list of {name, model, task, what, unit, cfg, keys, reps, warmup, target, latency,
--                   torch_wait (PyTorch's OMP_WAIT_POLICY under --torch-wait auto; nil: as set)}
--
-- Full sizes are the real configurations (torchvision's resnet50 and
-- mobilenet_v2 at 224x224; bert-base-uncased, distilbert-base-uncased and
-- bert-large at sequence 128; GPT-2 124M); --quick shrinks them (64x64 images,
-- 2-layer 64-wide BERTs, a 2-layer 64-wide GPT-2) so that a spec runs the whole
-- pipeline in seconds. `target` is issue 21's, on the throughput ratio
-- needle / PyTorch: at least 1, and for the batch-1 latency needle's at most
-- 0.8x PyTorch's, i.e. a ratio of at least 1.25.
local Z = {}

Z.group_names = {"resnet50", "mobilenet_v2", "distilbert", "bert", "bert_latency", "gpt2", "bert_large",
                 "resnext50_32x4d"}
-- the groups a default run leaves out (named with --models, or --large for bert_large)
Z.optional = {bert_large = true, resnext50_32x4d = true}
Z.groups = {}
for _, g in ipairs(Z.group_names) do Z.groups[g] = true end

-- the torchvision CNN rows (nd.nn.models' constructors of the same names)
Z.cnn = {resnet50 = true, mobilenet_v2 = true, resnext50_32x4d = true}

local TEXT_KEYS = {"batch", "seq", "vocab", "hidden", "layers", "heads", "inter"}
local GPT2_KEYS = {"vocab", "positions", "embd", "layers", "heads", "prompt", "new", "ctx", "steps"}

local function text_cfg(quick, large, distil)
  if quick then return {seq = 32, vocab = 1000, hidden = 64, layers = 2, heads = 4, inter = 128} end
  if large then return {seq = 128, vocab = 30522, hidden = 1024, layers = 24, heads = 16, inter = 4096} end
  return {seq = 128, vocab = 30522, hidden = 768, layers = distil and 6 or 12, heads = 12, inter = 3072}
end

local function with(t, extra)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  for k, v in pairs(extra) do r[k] = v end
  return r
end

function Z.rows(o)
  local quick, rows = o.quick, {}
  local reps = function(full) return quick and 2 or full end
  local warmup = 1
  local function add(group, row)
    if o.want[group] then
      row.warmup = row.warmup or warmup
      -- PyTorch's faster wait policy (see zoo.lua): passive where its GEMMs
      -- go to OpenBLAS, the environment's for oneDNN's convolutions
      if not Z.cnn[row.model] then row.torch_wait = "passive" end
      rows[#rows + 1] = row
    end
  end
  local size = quick and 64 or 224
  for _, m in ipairs({"resnet50", "mobilenet_v2", "resnext50_32x4d"}) do
    for k, task in ipairs({"infer", "train"}) do
      add(m, {name = m .. "_" .. task, model = m, task = task, unit = "images/s", target = 1,
              what = ("%s %s, batch %d, %dx%d"):format(m, task == "infer" and "inference" or "training step (SGD)",
                                                       o.batch[k], size, size),
              cfg = {batch = o.batch[k], size = size}, keys = {"batch", "size"},
              items = o.batch[k], reps = reps(m == "mobilenet_v2" and 5 or 3)})
    end
  end
  for _, m in ipairs({"distilbert", "bert", "bert_large"}) do
    local base = text_cfg(quick, m == "bert_large", m == "distilbert")
    for k, task in ipairs({"infer", "train"}) do
      add(m, {name = m .. "_" .. task, model = m == "bert_large" and "bert" or m, task = task,
              unit = "seq/s", target = 1,
              what = ("%s %s, batch %d, sequence %d"):format(m, task == "infer" and "inference" or "training step (SGD)",
                                                            o.text_batch[k], base.seq),
              cfg = with(base, {batch = o.text_batch[k]}), keys = TEXT_KEYS, items = o.text_batch[k],
              reps = reps(m == "bert_large" and 2 or 3)})
    end
  end
  local lat = text_cfg(quick, false, false)
  add("bert_latency", {name = "bert_latency_b1", model = "bert", task = "infer", unit = "seq/s", target = 1.25,
                       latency = true, what = ("BERT-base inference latency, batch 1, sequence %d"):format(lat.seq),
                       cfg = with(lat, {batch = 1}), keys = TEXT_KEYS, items = 1, reps = reps(10), warmup = 2})
  local g = quick and {vocab = 1000, positions = 128, embd = 64, layers = 2, heads = 4, prompt = 8, new = 8,
                       ctx = 32, steps = 4}
                   or {vocab = 50257, positions = 1024, embd = 768, layers = 12, heads = 12, prompt = 32, new = 32,
                       ctx = 256, steps = 8}
  add("gpt2", {name = "gpt2_gen_kv", model = "gpt2", task = "gen_kv", unit = "tokens/s", target = 1,
               what = ("GPT-2 greedy generation with the KV cache, batch 1, prompt %d, %d new tokens")
                 :format(g.prompt, g.new), cfg = g, keys = GPT2_KEYS, items = g.new, reps = reps(3)})
  add("gpt2", {name = "gpt2_step_kv", model = "gpt2", task = "step_kv", unit = "tokens/s",
               what = ("GPT-2 one new token with the KV cache at %d tokens of context"):format(g.ctx),
               cfg = g, keys = GPT2_KEYS, items = g.steps, reps = reps(3)})
  add("gpt2", {name = "gpt2_full", model = "gpt2", task = "full", unit = "tokens/s",
               what = ("GPT-2 one new token without a cache (the whole %d-token context again)"):format(g.ctx),
               cfg = g, keys = GPT2_KEYS, items = 1, reps = reps(3)})
  return rows
end

return Z
