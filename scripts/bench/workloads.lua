-- scripts/bench/workloads.lua: the workloads of the needle-vs-PyTorch
-- benchmark (issue 7), defined once for needle. scripts/bench/torch_ref.py
-- holds the same table for PyTorch: same names, shapes, optimizers and
-- per-call counts; keep the two in step.
--
--   local W = dofile(here .. "/workloads.lua")
--   W.list            the workloads in table order, each:
--     name            the key for --only, the JSON and the worker
--     issue           the workload's number in issue 7 (--only accepts it too)
--     what            one line for the table's legend and docs/benchmarks.md
--     target          the highest needle/reference ratio that meets the issue's target
--     metric          "ms" (ratio of times) or "rss" (ratio of peak RSS, workload 9)
--     reps, warmup    default timed runs (the median is reported) and untimed calls
--     inner           calls per timed run (ms is per call), for sub-millisecond calls
--     cblas           {M, K, N}: also compared with cblas_sgemm called directly
--     steps           (metric "rss") the number of steps run, all timed, none warm-up
--     rounds          rounds run.lua makes of it unless --rounds is given (default 3);
--                     peak RSS hardly varies between runs, and 200 PyTorch LSTM steps take
--                     about two minutes
--     kind            "startup": timed by run.lua launching processes, not by a worker
--     setup(nd, dev)  -> the function one call of which is the workload (needle side), its
--                     model and inputs on device dev ("cpu" unless run.lua --device)
--     setup_args(nd, dev) -> fn, args (or fn alone): the workload as fn(table.unpack(args)),
--                     so that its compiled variant takes args as arguments (inference inputs)
--     host_only       the workload means nothing on another device (start-up, peak RSS)
--   W.by_name[name]   the same entries by name
--
-- Inputs are random (seed 0); labels and word ids are 1-based on this side,
-- 0-based in torch_ref.py. Training steps are zero_grad (grads set to nil,
-- PyTorch: set_to_none=True), forward, cross-entropy, backward, step.
local W = {}

local function lstm_step(nd, dev)
  local V, T, B = 10000, 35, 20
  local model = nd.nn.LanguageModel(V, {embedding_size = 128, hidden_size = 256, num_layers = 2}):to(dev)
  model:train()
  local opt = nd.optim.SGD(model:parameters(), {lr = 1.0})
  local ids = nd.randint(1, V, {T, B}):to(dev)
  local y = nd.randint(1, V, {T * B}):to(dev)
  local state
  return function()
    opt:zero_grad()
    state = nd.nn.LanguageModel.detach_state(state) -- truncated backpropagation through time
    local logits
    logits, state = model(ids, state)
    local loss = nd.F.cross_entropy(logits, y)
    loss:backward()
    nd.nn.utils.clip_grad_norm_(model:parameters(), 0.25)
    opt:step()
  end
end

local function train_step(nd, dev, model, opt, x, y)
  x, y = x:to(dev), y:to(dev)
  return function()
    opt:zero_grad()
    local loss = nd.F.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
  end
end

-- an inference workload takes its input as an argument ({x} is returned with
-- it): compiled, the input is then an argument as in real use, not a constant
-- the fold pass could compute once
local function infer(nd, dev, model, x)
  model:to(dev):eval()
  return function(input) return nd.no_grad(function() return model(input) end) end, {x:to(dev)}
end

W.list = {
  {name = "matmul_1024", issue = 1, target = 1.0, reps = 10, warmup = 3, inner = 1,
   cblas = {1024, 1024, 1024},
   what = "matmul (1024,1024) @ (1024,1024) float32",
   setup = function(nd, dev)
     local a, b = nd.rand({1024, 1024}):to(dev), nd.rand({1024, 1024}):to(dev)
     return function() return a:matmul(b) end
   end},
  {name = "matmul_bert", issue = 1, target = 1.0, reps = 15, warmup = 3, inner = 1,
   cblas = {128, 3072, 768},
   what = "matmul (128,3072) @ (3072,768) float32 (BERT's FFN output GEMM)",
   setup = function(nd, dev)
     local a, b = nd.rand({128, 3072}):to(dev), nd.rand({3072, 768}):to(dev)
     return function() return a:matmul(b) end
   end},
  -- 30 warm-up calls (30000 adds, about 10 ms): a fresh process's first few
  -- thousand small ops run while Lua's collector and the allocator's free
  -- lists grow to their steady size, and with 3 warm-up calls needle's median
  -- landed at 0.25 or at 0.40 ms from run to run
  {name = "small_ops", issue = 2, target = 0.3, reps = 30, warmup = 30, inner = 1,
   what = "1000 additions of 16-element tensors, no autograd",
   setup = function(nd, dev)
     local x, y = nd.rand({16}):to(dev), nd.rand({16}):to(dev)
     return function() for _ = 1, 1000 do local _ = x + y end end
   end},
  {name = "small_ops_grad", issue = 2, target = 0.3, reps = 30, warmup = 30, inner = 1,
   what = "1000 additions of 16-element tensors, recording autograd",
   setup = function(nd, dev)
     local x, y = nd.rand({16}):to(dev):requires_grad_(), nd.rand({16}):to(dev)
     return function() for _ = 1, 1000 do local _ = x + y end end
   end},
  {name = "mlp_train", issue = 3, target = 0.8, reps = 15, warmup = 3, inner = 1,
   what = "MLP 784-512-256-10 (ReLU) train step, batch 128, SGD momentum 0.9",
   setup = function(nd, dev)
     local nn = nd.nn
     local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, 10)):to(dev)
     local opt = nd.optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
     return train_step(nd, dev, model, opt, nd.randn({128, 784}), nd.randint(1, 10, {128}))
   end},
  {name = "lstm_train", issue = 4, target = 1.0, reps = 7, warmup = 2, inner = 1,
   what = "LSTM LM train step: vocab 10000, emb 128, hidden 256, 2 layers, bptt 35, batch 20, SGD, clip 0.25",
   setup = lstm_step},
  {name = "resnet9_train", issue = 5, target = 1.0, reps = 7, warmup = 2, inner = 1,
   what = "needle's ResNet9 train step, batch 128, 3x32x32, SGD momentum 0.9",
   setup = function(nd, dev)
     local model = nd.nn.ResNet9():to(dev)
     model:train()
     local opt = nd.optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
     return train_step(nd, dev, model, opt, nd.randn({128, 3, 32, 32}), nd.randint(1, 10, {128}))
   end},
  {name = "transformer_infer", issue = 6, target = 1.0, reps = 7, warmup = 2, inner = 1,
   what = "Transformer encoder inference: 4 layers, d 256, 4 heads, ff 1024, batch 8, seq 128",
   setup = function(nd, dev)
     local nn = nd.nn
     local layer = nn.TransformerEncoderLayer(256, 4, {dim_feedforward = 1024, dropout = 0,
                                                       batch_first = true})
     return infer(nd, dev, nn.TransformerEncoder(layer, 4), nd.randn({8, 128, 256}))
   end},
  {name = "mlp5_infer", issue = 7, target = 0.8, reps = 15, warmup = 3, inner = 20,
   what = "5 x (Linear 512->512 + ReLU) inference, batch 8",
   setup = function(nd, dev)
     local nn = nd.nn
     local mods = {}
     for _ = 1, 5 do mods[#mods + 1] = nn.Linear(512, 512); mods[#mods + 1] = nn.ReLU() end
     return infer(nd, dev, nn.Sequential(mods), nd.randn({8, 512}))
   end},
  {name = "resnet9_infer", issue = 7, target = 0.8, reps = 15, warmup = 3, inner = 5,
   what = "needle's ResNet9 inference (eval), batch 8, 3x32x32",
   setup = function(nd, dev) return infer(nd, dev, nd.nn.ResNet9(), nd.randn({8, 3, 32, 32})) end},
  {name = "startup", issue = 8, target = 0.05, reps = 7, warmup = 1, kind = "startup", host_only = true,
   what = "start-up: needle-lua -e 'require \"needle\"' vs python3 -c 'import torch'"},
  {name = "lstm_rss", issue = 9, target = 0.5, metric = "rss", steps = 200, rounds = 1, host_only = true,
   what = "peak RSS over 200 LSTM LM train steps (workload 4); ms is the median step",
   setup = lstm_step},
}

-- Compiled variants (issue 17): the same workload through nd.compile; the
-- reference side runs the same eager PyTorch code. run.lua also prints each
-- one's speed-up over the eager needle row (speedup_target: the issue's aim).
local COMPILED = {mlp_train = 1.3, lstm_train = 1.3, resnet9_train = 1.3, transformer_infer = 1.3,
                  mlp5_infer = 2.0, resnet9_infer = 2.0, small_ops = 2.0}
-- small_ops discards its sums: the dce pass would remove all 1000 adds, so its
-- compiled variant runs without passes and measures the replay of 1000 kernels
local COMPILE_OPTS = {small_ops = {passes = false}}
do
  local base = {}
  for _, w in ipairs(W.list) do base[w.name] = w end
  for _, name in ipairs({"small_ops", "mlp_train", "lstm_train", "resnet9_train", "transformer_infer",
                         "mlp5_infer", "resnet9_infer"}) do
    local b = base[name]
    W.list[#W.list + 1] = {name = name .. "_compiled", issue = 17, compiled_of = name,
      speedup_target = COMPILED[name], target = b.target, reps = b.reps, warmup = b.warmup + 2,
      inner = b.inner, what = b.what .. ", through nd.compile",
      setup = function(nd, dev)
        local fn, args = b.setup_args(nd, dev)
        local cf = nd.compile(fn, COMPILE_OPTS[name])
        if not args then return cf end
        return function() return cf(table.unpack(args)) end
      end}
  end
end

W.by_name = {}
for _, w in ipairs(W.list) do
  w.metric = w.metric or "ms"
  local setup = w.setup
  if setup then w.setup = function(nd, dev) return setup(nd, dev or "cpu") end end
  -- (a setup may return fn, args: one call of the workload is fn(table.unpack(args)))
  if setup and not w.compiled_of then
    w.setup_args = w.setup
    w.setup = function(nd, dev)
      local fn, args = w.setup_args(nd, dev)
      if not args then return fn end
      return function() return fn(table.unpack(args)) end
    end
  end
  W.by_name[w.name] = w
end

return W
