-- scripts/train_mlp.lua - a multilayer perceptron (784-512-256-10, ReLU,
-- dropout) trained on Fashion-MNIST with AdamW and cross-entropy.
--
--   build/needle-lua scripts/train_mlp.lua              # ~89% test accuracy
--   build/needle-lua scripts/train_mlp.lua --data DIR   # IDX files elsewhere (e.g. MNIST)
--   build/needle-lua scripts/train_mlp.lua --help
--
-- The data come from Debian's dataset-fashion-mnist (/usr/share/datasets/
-- fashion-mnist; scripts/setup.sh installs it). The script shows a live
-- progress line, the train loss/accuracy and test accuracy per epoch, and
-- writes a checkpoint (atomically, every epoch), a CSV log and plots to --out.
-- --resume continues a run exactly: the model, the optimizer, the scheduler
-- and the random state come from the checkpoint, and the loader's order of
-- epoch e depends only on its seed and e (loader:set_epoch).
--
--   mpirun -np 2 build/needle-lua scripts/train_mlp.lua --distributed
-- trains data-parallel (docs/distributed.md): each process takes its share
-- of every global batch (DistributedSampler), gradients are averaged by
-- DistributedDataParallel, and only rank 0 prints and writes files.
local nd = require "needle"
local cli = require "needle.cli"

local defaults = {
  data = nil, out = "runs/mlp", device = "cpu",
  epochs = 10, ["batch-size"] = 128, lr = 1e-3, ["weight-decay"] = 1e-2, dropout = 0.2,
  hidden = "512,256", seed = 1,
  checkpoint = nil, resume = nil, threads = nil, limit = nil, ["stop-after"] = nil,
}
-- options that take a number, and those that have no default value
local numeric = {epochs = true, ["batch-size"] = true, lr = true, ["weight-decay"] = true,
                 dropout = true, seed = true, threads = true, limit = true, ["stop-after"] = true, tune = true}
local optional = {"data", "checkpoint", "resume", "threads", "limit", "stop-after", "tune"}

local usage = [[
usage: needle-lua scripts/train_mlp.lua [options]

Trains a multilayer perceptron on Fashion-MNIST (28x28 grey images of ten
kinds of clothing) and reports train loss/accuracy and test accuracy.

options:
  --data DIR          directory with the IDX files (train-images-idx3-ubyte[.gz], ...)
                      (default: /usr/share/datasets/fashion-mnist, Debian's
                      dataset-fashion-mnist)
  --out DIR           where the checkpoint, CSV log and plots go (default: runs/mlp)
  --checkpoint PATH   checkpoint file (default: OUT/checkpoint.safetensors)
  --resume PATH       continue a run from its checkpoint (same options)
  --stop-after N      stop after epoch N (the schedule still spans --epochs); --resume
                      continues exactly where it stopped
  --epochs N          epochs (default: 10)
  --batch-size N      images per batch (default: 128)
  --lr X              AdamW peak learning rate, cosine-annealed to 0 (default: 0.001)
  --weight-decay X    AdamW weight decay (default: 0.01)
  --dropout X         dropout after each hidden layer (default: 0.2)
  --hidden LIST       hidden layer sizes, comma-separated (default: 512,256)
  --seed N            random seed: initialisation, dropout and data order (default: 1)
  --limit N           train on the first N training images only (quick runs)
  --device NAME       cpu, opencl (the default OpenCL device) or opencl:N (nd.devices()
                      order); the model and every batch move there (default: cpu)
  --threads N         exactly N CPU threads, reproducible bit for bit (default:
                      all CPUs, fewer while other processes keep them busy)
  --bf16              float32 products on bfloat16 inputs, in training and evaluation
                      (nd.autocast; CPUs with AVX512_BF16; docs/tensor.md)
  --compile           run each training step through nd.compile (docs/compile.md)
  --tune S            --compile, and tune its fused kernels within S seconds (choices are
                      kept on disk: a later run starts with them)
  --distributed       data-parallel over the processes mpirun started: --batch-size is
                      the global batch, split over them (docs/distributed.md)
  -h, --help          this text
]]

local function die(code, fmt, ...) cli.die("train_mlp", code, fmt, ...) end

local opts = cli.parse(arg, defaults, usage, {prog = "train_mlp", numbers = numeric, optional = optional,
                                             flags = {compile = true, distributed = true, bf16 = true}})
local job = cli.distributed("train_mlp", opts)
-- only rank 0 talks
local print = job.main and print or function() end
local compile_opts = cli.compile_opts(opts)
local device, device_info = cli.check_device("train_mlp", opts)
local autocast, bf16_line = cli.bf16("train_mlp", opts, device)
cli.positive_integers("train_mlp", opts, {"epochs", "batch-size", "threads", "limit", "stop-after"},
                      "option --%s expects a positive integer, got '%s'")
if math.type(opts.seed) ~= "integer" then die(2, "option --seed expects an integer, got '%s'", tostring(opts.seed)) end
if opts.dropout < 0 or opts.dropout >= 1 then die(2, "option --dropout expects 0 <= p < 1, got %s", opts.dropout) end
local hidden = {}
for s in tostring(opts.hidden):gmatch("[^,]+") do
  local n = math.tointeger(tonumber(s))
  if not n or n < 1 then die(2, "option --hidden expects positive integers separated by commas, got '%s'", opts.hidden) end
  hidden[#hidden + 1] = n
end
local threads_line = cli.threads(opts.threads)
if job.world > 1 and compile_opts then die(2, "--distributed does not work with --compile or --tune yet") end
local local_batch = cli.local_batch("train_mlp", job, opts["batch-size"])

-- data ------------------------------------------------------------------------

local mnist = nd.data.mnist
local data_dir = opts.data or mnist.FASHION_DIR
local t_load = nd.clock()
local ok_data, err = pcall(function()
  local x, y = mnist.load(data_dir, {train = true})
  local xt, yt = mnist.load(data_dir, {train = false})
  return {x = x, y = y, xt = xt, yt = yt}
end)
if not ok_data then die(1, "%s", tostring(err)) end
local D = err
local n_all = D.x:size(1)
local n_train = math.min(opts.limit or n_all, n_all)
local n_in = D.x:numel() // n_all               -- 784 for 28x28 images
local x_train = D.x:narrow(1, 1, n_train):reshape({n_train, n_in})
local y_train = D.y:narrow(1, 1, n_train)
-- the test set moves to the device once; training batches move one by one
local x_test = D.xt:reshape({D.xt:size(1), n_in}):to(device)
local y_test = D.yt:to(device)
print(("data %s: %d training images%s, %d test images (%.1f s)"):format(data_dir, n_train,
  n_train < n_all and (" (of %d)"):format(n_all) or "", x_test:size(1), nd.clock() - t_load))

if job.main then cli.mkdir_p(opts.out) end
local ckpt_path = opts.checkpoint or (opts.out .. "/checkpoint.safetensors")

local tty = cli.is_tty()
local progress = job.main and cli.progress or function() end

-- model -----------------------------------------------------------------------

nd.manual_seed(opts.seed)
local nn = nd.nn
local layers, prev = {}, n_in
for _, h in ipairs(hidden) do
  layers[#layers + 1] = nn.Linear(prev, h)
  layers[#layers + 1] = nn.ReLU()
  if opts.dropout > 0 then layers[#layers + 1] = nn.Dropout(opts.dropout) end
  prev = h
end
layers[#layers + 1] = nn.Linear(prev, 10)
-- initialised on the cpu (the same weights for every device), then moved in
-- place before the optimizer sees the parameters
local model = nn.Sequential(table.unpack(layers)):to(device)
local optimizer = nd.optim.AdamW(model:parameters(), {lr = opts.lr, weight_decay = opts["weight-decay"]})
local scheduler = nd.optim.lr_scheduler.CosineAnnealingLR(optimizer, opts.epochs)
local train_set = nd.data.TensorDataset(x_train, y_train)
local loader = job.world == 1
  and nd.data.DataLoader(train_set, {batch_size = opts["batch-size"], shuffle = true, seed = opts.seed})
  or nd.data.DataLoader(train_set, {batch_size = local_batch,
                                    sampler = nd.data.DistributedSampler(train_set, {seed = opts.seed})})
local checkpoint = nd.checkpoint
print(cli.device_line(device, device_info))
if bf16_line then print(bf16_line) end
print(model)
print(("%d parameters; AdamW lr %g (cosine), weight decay %g, batch %d, %d epochs, %s%s"):format(
  model:num_parameters(), opts.lr, opts["weight-decay"], opts["batch-size"], opts.epochs,
  threads_line, job.world > 1 and (", %d processes of %d images"):format(job.world, local_batch) or ""))

-- the options a run must keep for --resume to continue it exactly
local run_options = {"epochs", "batch-size", "lr", "weight-decay", "dropout", "hidden", "seed"}
local function run_config()
  local c = {}
  for _, k in ipairs(run_options) do c[k] = opts[k] end
  c.limit = n_train
  return c
end

local start_epoch, step = 1, 0
if opts.resume then
  -- a checkpoint of a run with other options cannot be continued exactly
  start_epoch, step = cli.resume("train_mlp", opts.resume,
                                 {model = model, optimizer = optimizer, scheduler = scheduler}, function(state)
    local saved = state.extra and state.extra.options
    if type(saved) == "table" then
      local diff = {}
      for k, v in pairs(run_config()) do
        if saved[k] ~= nil and saved[k] ~= v then
          diff[#diff + 1] = ("--%s %s (now %s)"):format(k, tostring(saved[k]), tostring(v))
        end
      end
      table.sort(diff)
      if #diff > 0 then
        die(2, "cannot resume: '%s' was written by a run with %s; resume with that run's options",
            opts.resume, table.concat(diff, ", "))
      end
    end
  end)
end

-- loss (mean) and number of correct predictions over a whole set, in batches
local function evaluate(x, y)
  model:eval()
  local loss_sum, correct, n = 0, 0, x:size(1)
  nd.no_grad(function()
    for i = 1, n, 1000 do
      local m = math.min(1000, n - i + 1)
      local logits = model(x:narrow(1, i, m))
      local yb = y:narrow(1, i, m)
      loss_sum = loss_sum + nd.F.cross_entropy(logits, yb, {reduction = "sum"}):item()
      correct = correct + logits:argmax(2):eq(yb):sum():item()
    end
  end)
  model:train()
  return loss_sum / n, correct
end
evaluate = autocast(evaluate)

-- CSV log. When resuming, the rows of the epochs before the checkpoint's are
-- kept (a row written after the last checkpoint is dropped) and feed the plots.
local history = {steps = {}, losses = {}, epochs = {}, test_loss = {}, train_acc = {}, test_acc = {}}
local log_path = opts.out .. "/log.csv"
local header = "epoch,step,lr,train_loss,train_acc,test_loss,test_acc,test_correct,images_per_s,seconds"
local seconds_before = 0
local log = not job.main and {write = function() end, flush = function() end, close = function() end}
  or cli.open_log(log_path, header, opts.resume, function(line)
  local v = {}
  for field in line:gmatch("[^,]+") do v[#v + 1] = tonumber(field) end
  if #v >= 8 and v[1] < start_epoch then
    seconds_before = v[10] or seconds_before
    history.epochs[#history.epochs + 1] = v[2]
    history.test_loss[#history.test_loss + 1] = v[6]
    history.train_acc[#history.train_acc + 1] = 100 * v[5]
    history.test_acc[#history.test_acc + 1] = 100 * v[7]
    return true
  end
end)

-- scalars (per step and per epoch) and parameter histograms (per epoch) for
-- TensorBoard, JSON lines and CSV (nd.log)
local run_log = cli.run_log(opts.out, opts.resume, job)

-- one step (through nd.compile with --compile or --tune); data-parallel
-- through DistributedDataParallel, which averages the gradients over ranks
local trained = job.world > 1 and nn.parallel.DistributedDataParallel(model) or model
local step_fn = cli.classifier_step(trained, optimizer, compile_opts)
local train_step = autocast(step_fn)

local n_test = x_test:size(1)
local batches = #loader
local t_start = nd.clock()
local test_acc = nil
model:train()
local last_epoch = math.min(opts.epochs, opts["stop-after"] or opts.epochs)
for epoch = start_epoch, last_epoch do
  local t_epoch = nd.clock()
  local lr = optimizer.param_groups[1].lr
  local loss_sum, correct, seen, b = 0, 0, 0, 0
  loader:set_epoch(epoch)
  -- each rank its own dropout masks, the same in every run
  if job.world > 1 then nd.manual_seed(opts.seed * 1000003 + epoch * 7919 + job.rank) end
  for xb, yb in loader:iter() do
    b = b + 1
    xb, yb = xb:to(device), yb:to(device)
    local loss, logits = train_step(xb, yb)
    step = step + 1
    local l, m = loss:item(), yb:size(1)
    loss_sum, seen = loss_sum + l * m, seen + m
    correct = correct + logits:detach():argmax(2):eq(yb):sum():item()
    history.steps[#history.steps + 1] = step
    history.losses[#history.losses + 1] = l
    run_log:scalar("train/loss", l, step)
    if b % 20 == 0 or b == batches then
      local elapsed = nd.clock() - t_epoch
      local left = (batches - b) + (last_epoch - epoch) * batches
      progress(("epoch %d/%d  batch %d/%d  loss %.4f  acc %.2f%%  %.0f img/s  ETA %.0fs"):format(
        epoch, opts.epochs, b, batches, loss_sum / seen, 100 * correct / seen,
        seen / math.max(elapsed, 1e-9), left * elapsed / b), not tty and b % 100 == 0)
    end
  end
  scheduler:step()
  local seconds = nd.clock() - t_epoch
  loss_sum, correct, seen = table.unpack(cli.sum_over_ranks(job, {loss_sum, correct, seen}))
  local train_loss, train_acc = loss_sum / seen, correct / seen
  local test_loss, test_correct = evaluate(x_test, y_test)
  test_acc = test_correct / n_test
  history.epochs[#history.epochs + 1] = step
  history.test_loss[#history.test_loss + 1] = test_loss
  history.train_acc[#history.train_acc + 1] = 100 * train_acc
  history.test_acc[#history.test_acc + 1] = 100 * test_acc
  progress(("epoch %d/%d  train loss %.4f  train acc %.2f%%  test loss %.4f  test acc %.2f%%  %.0f img/s  %.1fs"):format(
    epoch, opts.epochs, train_loss, 100 * train_acc, test_loss, 100 * test_acc, seen / seconds, seconds), true)
  log:write(("%d,%d,%.9g,%.6f,%.6f,%.6f,%.6f,%d,%.1f,%.2f\n"):format(epoch, step, lr, train_loss,
    train_acc, test_loss, test_acc, test_correct, seen / seconds, seconds_before + nd.clock() - t_start))
  log:flush()
  run_log:scalars({["epoch/train_loss"] = train_loss, ["epoch/train_acc"] = train_acc, ["test/loss"] = test_loss,
                   ["test/acc"] = test_acc, lr = lr, ["speed/images_per_s"] = seen / seconds}, step)
  cli.log_parameters(run_log, model, step)
  run_log:flush()
  if job.main then
    checkpoint.save(ckpt_path, {model = model, optimizer = optimizer, scheduler = scheduler, step = step,
                                extra = {epoch = epoch, test_acc = test_acc, options = run_config()}})
  end
end
log:close()
run_log:close()

if test_acc then
  print(("test accuracy %.2f%% after epoch %d (%.1f s of training)%s"):format(100 * test_acc, last_epoch,
    nd.clock() - t_start, last_epoch < opts.epochs
      and ("; stopped early: continue with --resume %s"):format(ckpt_path) or ""))
else
  print(("nothing to do: the checkpoint is already at epoch %d of %d"):format(start_epoch - 1, opts.epochs))
end
local plot = require "needle.plot"
local files = {}
if #history.steps > 0 and job.main then
  files[#files + 1] = plot.lines(opts.out .. "/loss", {
    title = "MLP on Fashion-MNIST", xlabel = "step", ylabel = "cross-entropy",
    series = {{name = "train (per batch)", x = history.steps, y = history.losses},
              {name = "test", x = history.epochs, y = history.test_loss}}})
  files[#files + 1] = plot.lines(opts.out .. "/accuracy", {
    title = "MLP on Fashion-MNIST", xlabel = "step", ylabel = "accuracy (%)",
    series = {{name = "train", x = history.epochs, y = history.train_acc},
              {name = "test", x = history.epochs, y = history.test_acc}}})
end
if compile_opts then cli.compile_report(step_fn) end
print(("wrote %s, %s%s"):format(ckpt_path, log_path,
  #files > 0 and (" and " .. table.concat(files, ", ")) or ""))
