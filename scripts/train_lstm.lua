-- scripts/train_lstm.lua - the main job: a word-level LSTM language model
-- (needle's LanguageModel: Embedding -> LSTM -> Linear) trained on PTB-format
-- text with truncated backpropagation through time.
--
--   build/needle-lua scripts/train_lstm.lua            # bundled corpus, ~2 min
--   build/needle-lua scripts/train_lstm.lua --data DIR # real PTB: train.txt, valid.txt, test.txt
--   build/needle-lua scripts/train_lstm.lua --help
--
-- With no arguments it trains on data/ptb_synth, a corpus generated from a
-- known stochastic grammar (scripts/gen_corpus.lua), so the best achievable
-- perplexity is known and printed next to the model's. It shows a live
-- progress line, validation perplexity per epoch, and writes a checkpoint
-- (atomically, every epoch), a CSV log and a plot to --out.
--
--   mpirun -np 2 build/needle-lua scripts/train_lstm.lua --distributed
-- trains data-parallel (docs/distributed.md): the training text is batchified
-- into --batch-size columns as in one process, each process takes its own
-- contiguous block of those columns (and keeps its own hidden state),
-- gradients are averaged by DistributedDataParallel, and only rank 0 prints
-- and writes files.
local nd = require "needle"
local cli = require "needle.cli"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local root = here .. "/.."

local defaults = {
  data = root .. "/data/ptb_synth", out = "runs/lstm", device = "cpu",
  epochs = 6, ["batch-size"] = 20, lr = 3e-3, seed = 1, bptt = 35,
  emsize = 128, nhid = 256, nlayers = 1, dropout = 0.2, clip = 0.5,
  checkpoint = nil, resume = nil, threads = nil, ["max-lines"] = nil,
}

local usage = [[
usage: needle-lua scripts/train_lstm.lua [options]

Trains a word-level LSTM language model on PTB-format text (train.txt,
valid.txt, test.txt; one sentence per line) and reports perplexity.

options:
  --data DIR          corpus directory (default: data/ptb_synth, bundled)
  --out DIR           where the checkpoint, CSV log and plot go (default: runs/lstm)
  --checkpoint PATH   checkpoint file (default: OUT/checkpoint.safetensors)
  --resume PATH       continue a run from its checkpoint (same options)
  --epochs N          epochs (default: 6)
  --batch-size N      sequences per batch (default: 20)
  --bptt N            steps of truncated backpropagation (default: 35)
  --lr X              Adam learning rate (default: 0.003)
  --emsize N          embedding size (default: 128)
  --nhid N            LSTM hidden size (default: 256)
  --nlayers N         LSTM layers (default: 1)
  --dropout X         dropout on embeddings and LSTM outputs (default: 0.2)
  --clip X            gradient norm clipping (default: 0.5)
  --seed N            random seed (default: 1)
  --device NAME       cpu, opencl (the default OpenCL device) or opencl:N (nd.devices()
                      order); the model and every batch move there (default: cpu)
  --threads N         exactly N CPU threads, reproducible bit for bit (default:
                      all CPUs, fewer while other processes keep them busy)
  --max-lines N       read at most N lines of each file (quick runs)
  --bf16              float32 products on bfloat16 inputs, in training and evaluation
                      (nd.autocast; CPUs with AVX512_BF16; docs/tensor.md)
  --compile           run each training step through nd.compile (docs/compile.md)
  --tune S            --compile, and tune its fused kernels within S seconds (choices are
                      kept on disk: a later run starts with them)
  --distributed       data-parallel over the processes mpirun started: --batch-size is
                      the global number of columns, split over them (docs/distributed.md)
  -h, --help          this text
]]

local numbers = {epochs = true, ["batch-size"] = true, lr = true, seed = true, bptt = true, emsize = true,
                 nhid = true, nlayers = true, dropout = true, clip = true, threads = true, ["max-lines"] = true,
                 tune = true}
local opts = cli.parse(arg, defaults, usage, {prog = "train_lstm", numbers = numbers,
                                              flags = {compile = true, distributed = true, bf16 = true},
                                              optional = {"checkpoint", "resume", "threads", "max-lines", "tune"}})
local job = cli.distributed("train_lstm", opts)
-- only rank 0 talks
local print = job.main and print or function() end
local compile_opts = cli.compile_opts(opts)
local device, device_info = cli.check_device("train_lstm", opts)
local autocast, bf16_line = cli.bf16("train_lstm", opts, device)
local threads_line = cli.threads(opts.threads)
if job.world > 1 and compile_opts then
  cli.die("train_lstm", 2, "--distributed does not work with --compile or --tune yet")
end
local local_batch = cli.local_batch("train_lstm", job, opts["batch-size"])
if job.main then cli.mkdir_p(opts.out) end
local ckpt_path = opts.checkpoint or (opts.out .. "/checkpoint.safetensors")

local tty = cli.is_tty()
local progress = job.main and cli.progress or function() end

-- data ------------------------------------------------------------------------

local ptb = nd.data.ptb
local t_load = nd.clock()
local ok_corpus, corpus = pcall(ptb.Corpus, opts.data, {max_lines = opts["max-lines"]})
if not ok_corpus then
  io.stderr:write("train_lstm: ", tostring(corpus), "\n")
  os.exit(1)
end
local V = #corpus.dictionary
local train = ptb.batchify(corpus.train, opts["batch-size"])
if job.world > 1 then
  -- this rank's block of columns: together the ranks hold the one-process batch
  train = train:narrow(2, job.rank * local_batch + 1, local_batch):contiguous()
end
local valid = ptb.batchify(corpus.valid, 10)
local test = ptb.batchify(corpus.test, 10)
local stats = (function()
  local f = loadfile(opts.data .. "/stats.lua")
  return f and f() or nil
end)()
print(("corpus %s: vocabulary %d, train %d tokens, valid %d, test %d (%.1f s)"):format(
  opts.data, V, corpus.train:numel(), corpus.valid:numel(), corpus.test:numel(), nd.clock() - t_load))

-- model -----------------------------------------------------------------------

nd.manual_seed(opts.seed)
-- initialised on the cpu (the same weights for every device), then moved in
-- place before the optimizer sees the parameters
local model = nd.nn.LanguageModel(V, {embedding_size = opts.emsize, hidden_size = opts.nhid,
                                      num_layers = opts.nlayers, dropout = opts.dropout}):to(device)
local optimizer = nd.optim.Adam(model:parameters(), {lr = opts.lr})
local checkpoint = nd.checkpoint
print(cli.device_line(device, device_info))
if bf16_line then print(bf16_line) end
print(model)
print(("%d parameters; Adam lr %g, batch %d, bptt %d, %d epochs, %s%s"):format(
  model:num_parameters(), opts.lr, opts["batch-size"], opts.bptt, opts.epochs, threads_line,
  job.world > 1 and (", %d processes of %d columns"):format(job.world, local_batch) or ""))

local start_epoch, step = 1, 0
local history = {steps = {}, losses = {}, epochs = {}, val_ppl = {}}
if opts.resume then
  start_epoch, step = cli.resume("train_lstm", opts.resume, {model = model, optimizer = optimizer})
end

local function evaluate(source)
  model:eval()
  local total, count, state = 0, 0, nil
  nd.no_grad(function()
    for i = 1, source:size(1) - 1, opts.bptt do
      local x, y = ptb.get_batch(source, i, opts.bptt)
      x, y = x:to(device), y:to(device)
      local logits
      logits, state = model(x, state)
      total = total + nd.F.cross_entropy(logits, y, {reduction = "sum"}):item()
      count = count + y:numel()
    end
  end)
  model:train()
  return total / count
end
evaluate = autocast(evaluate)

-- One step of truncated backpropagation; with --compile it is captured once
-- per batch shape (the last, shorter batch of an epoch is a second entry)
-- and replayed without Lua in the loop. Data-parallel, the forward goes
-- through DistributedDataParallel: the loss is the mean over this rank's
-- tokens (every rank has as many), so the averaged gradients are the
-- one-process gradients, and clipping sees them.
local trained = job.world > 1 and nd.nn.parallel.DistributedDataParallel(model) or model
local function train_step(x, y, state)
  local logits
  logits, state = trained(x, state)
  local loss = nd.F.cross_entropy(logits, y)
  optimizer:zero_grad()
  loss:backward()
  nd.nn.utils.clip_grad_norm_(model:parameters(), opts.clip)
  optimizer:step()
  return loss, state
end
if compile_opts then train_step = nd.compile(train_step, compile_opts) end
local step_fn = train_step
train_step = autocast(train_step) -- outside the compiled function (the precision is a guard of its calls)

-- CSV log: one row per epoch, then a row "test" with the test set's loss and
-- perplexity in the val_* columns. A resumed run keeps the rows of the epochs
-- before its checkpoint (an earlier run's test row is dropped) and appends.
local log_path = opts.out .. "/log.csv"
local log = not job.main and {write = function() end, flush = function() end, close = function() end}
  or cli.open_log(log_path, "epoch,step,train_loss,train_ppl,val_loss,val_ppl,tokens_per_s,seconds", opts.resume,
                  function(line)
                    local e = tonumber(line:match("^(%d+),"))
                    return e ~= nil and e < start_epoch
                  end)
-- scalars (per step and per epoch) and parameter histograms (per epoch) for
-- TensorBoard, JSON lines and CSV (nd.log)
local run_log = cli.run_log(opts.out, opts.resume, job)

local steps_per_epoch = math.ceil((train:size(1) - 1) / opts.bptt)
local t_start = nd.clock()
local best_val = math.huge
for epoch = start_epoch, opts.epochs do
  local t_epoch, tokens, state = nd.clock(), 0, nil
  local loss_sum, loss_n = 0, 0
  local b = 0
  -- each rank its own dropout masks, the same in every run
  if job.world > 1 then nd.manual_seed(opts.seed * 1000003 + epoch * 7919 + job.rank) end
  for i = 1, train:size(1) - 1, opts.bptt do
    b = b + 1
    local x, y = ptb.get_batch(train, i, opts.bptt)
    x, y = x:to(device), y:to(device)
    local loss
    loss, state = train_step(x, y, nd.nn.LanguageModel.detach_state(state)) -- truncated backpropagation
    step = step + 1
    local l = loss:item()
    loss_sum, loss_n = loss_sum + l, loss_n + 1
    tokens = tokens + y:numel()
    history.steps[#history.steps + 1] = step
    history.losses[#history.losses + 1] = l
    run_log:scalar("train/loss", l, step)
    local elapsed = nd.clock() - t_epoch
    local rate = tokens / math.max(elapsed, 1e-9)
    local left = (steps_per_epoch - b) + (opts.epochs - epoch) * steps_per_epoch
    if b % 10 == 0 or b == steps_per_epoch then
      local line = ("epoch %d/%d  step %d/%d  loss %.3f  ppl %.2f  %.0f tok/s  ETA %.0fs"):format(
        epoch, opts.epochs, b, steps_per_epoch, l, math.exp(l), rate, left * elapsed / b)
      progress(line, not tty and b % 50 == 0)
    end
  end
  local seconds = nd.clock() - t_epoch
  loss_sum, loss_n, tokens = table.unpack(cli.sum_over_ranks(job, {loss_sum, loss_n, tokens}))
  local train_loss = loss_sum / loss_n
  -- every rank evaluates the whole validation set (they stay in step); rank 0 reports
  local val_loss = evaluate(valid)
  best_val = math.min(best_val, val_loss)
  history.epochs[#history.epochs + 1] = step
  history.val_ppl[#history.val_ppl + 1] = math.exp(val_loss)
  progress(("epoch %d/%d  train ppl %.2f  valid ppl %.2f%s  %.0f tok/s  %.1fs"):format(
    epoch, opts.epochs, math.exp(train_loss), math.exp(val_loss),
    stats and (" (best achievable %.2f)"):format(stats.best_valid_ppl) or "",
    tokens / seconds, seconds), true)
  log:write(("%d,%d,%.6f,%.4f,%.6f,%.4f,%.1f,%.2f\n"):format(epoch, step, train_loss,
    math.exp(train_loss), val_loss, math.exp(val_loss), tokens / seconds, nd.clock() - t_start))
  log:flush()
  run_log:scalars({["epoch/train_loss"] = train_loss, ["epoch/train_ppl"] = math.exp(train_loss),
                   ["val/loss"] = val_loss, ["val/ppl"] = math.exp(val_loss), ["speed/tokens_per_s"] = tokens / seconds},
                  step)
  cli.log_parameters(run_log, model, step)
  run_log:flush()
  if job.main then
    checkpoint.save(ckpt_path, {model = model, optimizer = optimizer, step = step,
                                extra = {epoch = epoch, val_loss = val_loss}})
  end
end
local test_loss = evaluate(test)
log:write(("test,%d,,,%.6f,%.4f,,%.2f\n"):format(step, test_loss, math.exp(test_loss), nd.clock() - t_start))
log:close()
run_log:scalars({["test/loss"] = test_loss, ["test/ppl"] = math.exp(test_loss)}, step)
run_log:close()
print(("test perplexity %.2f%s  (%.1f s of training)"):format(math.exp(test_loss),
  stats and ("; best achievable %.2f (the generating grammar's own perplexity)"):format(stats.best_test_ppl) or "",
  nd.clock() - t_start))
if not job.main then return end
local plot = require "needle.plot"
local file = plot.lines(opts.out .. "/loss", {
  title = "LSTM language model", xlabel = "step", ylabel = "perplexity",
  series = {
    {name = "train (per batch)", x = history.steps, y = (function()
      local p = {}
      for i, l in ipairs(history.losses) do p[i] = math.exp(l) end
      return p
    end)()},
    {name = "valid", x = history.epochs, y = history.val_ppl},
  },
  -- the grammar that generated the corpus: no model can do better on average
  hlines = stats and {{name = ("best achievable (%.2f)"):format(stats.best_valid_ppl), y = stats.best_valid_ppl}} or nil})
if compile_opts then cli.compile_report(step_fn) end
print(("wrote %s, %s and %s; scalars and histograms in %s (tensorboard --logdir %s)"):format(ckpt_path, log_path,
  file, opts.out, opts.out))
