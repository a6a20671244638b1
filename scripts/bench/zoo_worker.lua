-- scripts/bench/zoo_worker.lua: needle's side of scripts/bench/zoo.lua, one
-- (model, task) measurement in a process of its own (so that its peak RSS is
-- its own and one model's allocator cache does not carry into the next):
--
--   needle-lua scripts/bench/zoo_worker.lua MODEL TASK key=value ...
--
-- prints the same "key value" lines as scripts/bench/zoo_torch.py, its
-- PyTorch twin (same models, sizes, batch, modes, optimizer, timing):
--   ms N        the median over `reps` timed runs (after `warmup` untimed) of
--               one iteration, in milliseconds
--   items N     what one iteration produces (images, sequences, tokens)
--   rss_mb N    peak resident set (VmHWM) of this process, MB
--   threads N   nd.get_num_threads()
--
-- Token ids are drawn 1-based (1..vocab), as needle's models take them; class
-- labels 1-based too. Randomly initialised models: speed does not depend on
-- trained weights.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local Z = dofile(here .. "/zoo_tasks.lua")
local models = nd.nn.models

local model_name, task = arg[1], arg[2]
local c = {}
for i = 3, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(.+)$")
  if k == "device" then
    c.device = v
  elseif not k or not tonumber(v) then
    io.stderr:write(("zoo_worker.lua: bad argument '%s' (expected key=number or device=DEV)\n"):format(arg[i]))
    os.exit(2)
  else
    c[k] = math.tointeger(tonumber(v)) or tonumber(v)
  end
end
-- the device the model and its inputs live on (zoo.lua --device); off the
-- CPU each timed call ends with nd.synchronize, so its kernels are counted
local dev = c.device or "cpu"
local function sync() if dev ~= "cpu" then nd.synchronize() end end
if not (model_name and task and c.threads and c.reps and c.warmup) then
  io.stderr:write("usage: needle-lua scripts/bench/zoo_worker.lua MODEL TASK threads=N reps=N warmup=N ...\n")
  os.exit(2)
end

nd.set_num_threads(c.threads)
nd.manual_seed(0)
-- zoo.lua --bf16: each timed iteration inside nd.autocast (bfloat16
-- products forward and backward, weights packed once per iteration), as
-- PyTorch's side runs each under torch.autocast
local function scoped(fn)
  if c.bf16 ~= 1 then return fn end
  return function() return nd.autocast(fn) end
end

-- zoo.lua --compile: fn through nd.compile, with at least 3 warm-up calls:
-- nd.compile runs the first call eagerly (a training step's optimizer makes
-- its state then), captures the second, and the third is the first replay
-- (cf.stats counts them).
local compiled_fn -- (its cf.stats.replays is printed: the timed calls were replays)
local function compiled(fn)
  if c.compile ~= 1 then return fn end
  c.warmup = math.max(c.warmup, 3)
  compiled_fn = nd.compile(fn)
  return compiled_fn
end

-- ms of one fn() call: warmup untimed calls, then the median of reps timed
-- ones; reset() (untimed) runs before every call
local function timed(fn, reps, warmup, reset)
  fn = scoped(fn)
  for _ = 1, warmup do
    if reset then reset() end
    fn()
  end
  sync()
  local ts = {}
  for i = 1, reps do
    if reset then reset() end
    sync()
    local t0 = nd.clock()
    fn()
    sync()
    ts[i] = nd.clock() - t0
  end
  return C.median_of(ts) * 1e3
end

-- as zoo_torch.py: SGD, lr 0.01, momentum 0.9; gradients set to none
local function train_step(model, forward, labels)
  local opt = nd.optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
  return compiled(function()
    opt:zero_grad()
    local loss = nd.F.cross_entropy(forward(), labels)
    loss:backward()
    opt:step()
  end)
end

local function cnn()
  local model = models[model_name]():to(dev)
  local x = nd.randn({c.batch, 3, c.size, c.size}, {device = dev})
  if task == "infer" then
    model:eval()
    local f = compiled(model)
    return function() nd.no_grad(function() return f(x) end) end, c.batch
  end
  model:train()
  local labels = nd.randint(1, 1000, {c.batch}, {device = dev})
  return train_step(model, function() return model(x) end, labels), c.batch
end

local function bert(train)
  local b, t = c.batch, c.seq
  local ids = nd.randint(1, c.vocab, {b, t}, {device = dev})
  local mask = nd.ones({b, t}, {dtype = "int64", device = dev})
  local labels = nd.randint(1, 2, {b}, {device = dev})
  local model
  if model_name == "distilbert" then
    local cfg = {vocab_size = c.vocab, n_layers = c.layers, n_heads = c.heads, dim = c.hidden,
                 hidden_dim = c.inter, num_labels = train and 2 or nil}
    model = train and models.DistilBertForSequenceClassification(cfg) or models.DistilBertModel(cfg)
  else
    local cfg = {vocab_size = c.vocab, hidden_size = c.hidden, num_hidden_layers = c.layers,
                 num_attention_heads = c.heads, intermediate_size = c.inter, num_labels = train and 2 or nil}
    model = train and models.BertForSequenceClassification(cfg) or models.BertModel(cfg)
  end
  model:to(dev)
  local function forward() return model(ids, {attention_mask = mask}) end
  if train then
    model:train()
    return train_step(model, forward, labels), b
  end
  model:eval()
  local f = compiled(model)
  return function() nd.no_grad(function() return f(ids, {attention_mask = mask}) end) end, b
end

-- GPT-2: the logits of the last position only, as generate computes them
-- (and HF's generate, logits_to_keep = 1); zoo_torch.py does the same
local function gpt2()
  local model = models.GPT2LMHeadModel{vocab_size = c.vocab, n_positions = c.positions, n_embd = c.embd,
                                       n_layer = c.layers, n_head = c.heads}
  model:to(dev)
  model:eval()
  local tr = model.transformer
  local function next_id(h)
    local last = h:narrow(2, h:size(2), 1):view({1, c.embd})
    return model.lm_head(last):argmax(2):view({1, 1})
  end
  if task == "gen_kv" then
    -- the public API: greedy generation with the cache (the default)
    local prompt = nd.randint(1, c.vocab, {1, c.prompt}, {device = dev})
    return timed(function() model:generate(prompt, {max_new_tokens = c.new}) end, c.reps, c.warmup), c.new
  end
  local ctx = nd.randint(1, c.vocab, {1, c.ctx}, {device = dev})
  local guard <close> = nd.no_grad()
  if task == "step_kv" then
    -- one new token with ctx tokens cached: the prefill untimed before each
    -- timed run of `steps` decode steps
    local cache = model:new_cache(1, c.ctx + c.steps + 1)
    local nxt
    local function reset()
      cache:reset()
      nxt = next_id((tr(ctx, {past_key_values = cache})))
    end
    local function fn()
      for _ = 1, c.steps do nxt = next_id((tr(nxt, {past_key_values = cache}))) end
    end
    return timed(fn, c.reps, c.warmup, reset), c.steps
  end
  -- "full": without a cache a new token is a forward over the whole context
  return timed(function() next_id((tr(ctx))) end, c.reps, c.warmup), 1
end

local ms, items
if model_name == "gpt2" then
  ms, items = gpt2()
else
  local fn
  if Z.cnn[model_name] then
    fn, items = cnn()
  else
    fn, items = bert(task == "train")
  end
  ms = timed(fn, c.reps, c.warmup)
end
print(("ms %.6f"):format(ms))
print(("items %d"):format(items))
local rss = C.peak_rss_mb()
if rss then print(("rss_mb %.3f"):format(rss)) end
print(("threads %d"):format(nd.get_num_threads()))
if compiled_fn then print(("replays %d"):format(compiled_fn.stats.replays)) end
print(("device %s"):format(dev))
