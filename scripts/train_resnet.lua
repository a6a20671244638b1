-- scripts/train_resnet.lua - needle's ResNet9 (nd.nn.ResNet9, the CMU 10-714
-- hw4 model) trained on CIFAR-10 with data augmentation (random 32x32 crops of
-- the image padded by 4, horizontal flips), SGD with momentum or Adam, and a
-- one-cycle or cosine learning-rate schedule.
--
--   build/needle-lua scripts/train_resnet.lua --data DIR      # CIFAR-10 binary files
--   build/needle-lua scripts/train_resnet.lua --synthetic 2000 # generated CIFAR-format data
--   build/needle-lua scripts/train_resnet.lua --help
--
-- DIR holds data_batch_1.bin .. data_batch_5.bin and test_batch.bin (or a
-- cifar-10-batches-bin directory with them): the binary version of CIFAR-10,
-- cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html.
-- --synthetic N writes N training images (and N/5 test images) of the same
-- format with nd.data.cifar10.synthetic (class-dependent colours plus noise,
-- so a model can learn them) into a temporary directory and trains on them.
--
-- Per epoch it prints the training loss and accuracy and the test loss and
-- accuracy, with a live progress line, and writes to --out: a checkpoint
-- (atomically, every epoch; --resume continues exactly), a CSV log and plots of
-- the loss and the accuracy.
--
--   mpirun -np 2 build/needle-lua scripts/train_resnet.lua --distributed --synthetic 2000
-- trains data-parallel (docs/distributed.md): each process takes its share
-- of every global batch (DistributedSampler), with its own augmentation,
-- gradients are averaged by DistributedDataParallel, the BatchNorms become
-- SyncBatchNorms (statistics over the global batch; --local-bn keeps them per
-- process), and only rank 0 prints and writes files.
local nd = require "needle"
local cli = require "needle.cli"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local root = here:match("^(.*)/scripts$") or (here == "scripts" and ".") or (here .. "/..")

local defaults = {
  data = root .. "/data/cifar10", out = "runs/resnet", device = "cpu",
  epochs = 10, ["batch-size"] = 128, lr = nil, seed = 1,
  optimizer = "sgd", momentum = 0.9, ["weight-decay"] = 5e-4, schedule = "onecycle",
  ["eval-batch-size"] = 500,
}
-- options without a default value, and whether each is a number
local optional = {lr = true, checkpoint = false, resume = false, threads = true, synthetic = true,
                  ["stop-after"] = true, tune = true}
local numeric = {epochs = true, ["batch-size"] = true, lr = true, seed = true, momentum = true,
                 ["weight-decay"] = true, threads = true, synthetic = true, ["stop-after"] = true,
                 ["eval-batch-size"] = true, tune = true}

local usage = [[
usage: needle-lua scripts/train_resnet.lua [options]

Trains needle's ResNet9 on CIFAR-10 (the binary version) and reports the
training loss and accuracy and the test accuracy after every epoch.

options:
  --data DIR          CIFAR-10 binary files: data_batch_1.bin .. data_batch_5.bin and
                      test_batch.bin, in DIR or DIR/cifar-10-batches-bin
                      (default: data/cifar10)
  --synthetic N       train on N generated CIFAR-format images instead (N/5 test images;
                      written to a temporary directory with nd.data.cifar10.synthetic)
  --out DIR           where the checkpoint, CSV log and plots go (default: runs/resnet)
  --checkpoint PATH   checkpoint file (default: OUT/checkpoint.safetensors)
  --resume PATH       continue a run from its checkpoint (same options)
  --epochs N          epochs; the schedule spans them (default: 10)
  --stop-after N      stop after epoch N (the schedule still spans --epochs; --resume later)
  --batch-size N      images per training batch; a last partial batch is dropped (default: 128)
  --eval-batch-size N images per test batch (default: 500)
  --optimizer NAME    sgd (Nesterov momentum, weight decay) or adam (default: sgd)
  --lr X              peak learning rate (default: 0.05 for sgd, 0.002 for adam)
  --momentum X        SGD momentum (default: 0.9; one-cycle cycles it between 0.85 and 0.95)
  --weight-decay X    L2 weight decay (default: 0.0005)
  --schedule NAME     onecycle, cosine or constant, stepped every batch (default: onecycle)
  --seed N            random seed: initialisation, batch order, augmentation (default: 1)
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
                      the global batch, split over them (docs/distributed.md); the
                      BatchNorms normalise over the global batch (SyncBatchNorm)
  --local-bn          with --distributed: keep plain BatchNorms, whose statistics stay
                      per process (the checkpoint has rank 0's running statistics)
  -h, --help          this text
]]

local function fail(fmt, ...) cli.die("train_resnet", 2, fmt, ...) end

local function parse_args(argv)
  local opts, given = cli.parse(argv, defaults, usage, {prog = "train_resnet", numbers = numeric,
                                                        optional = optional,
                                                        flags = {compile = true, distributed = true, bf16 = true,
                                                                 ["local-bn"] = true}})
  cli.positive_integers("train_resnet", opts,
                        {"epochs", "batch-size", "eval-batch-size", "synthetic", "stop-after", "threads"})
  if opts.lr ~= nil and not (opts.lr > 0) then fail("option --lr expects a positive number, got %s", tostring(opts.lr)) end
  if not (opts.momentum >= 0 and opts.momentum < 1) then
    fail("option --momentum expects a number in [0, 1), got %s", tostring(opts.momentum))
  end
  cli.choice("train_resnet", opts, "optimizer", {"sgd", "adam"})
  cli.choice("train_resnet", opts, "schedule", {"onecycle", "cosine", "constant"})
  if given.data and given.synthetic then fail("--data and --synthetic exclude each other") end
  opts.lr = opts.lr or (opts.optimizer == "sgd" and 0.05 or 0.002)
  return opts
end

local opts = parse_args(arg)
local job = cli.distributed("train_resnet", opts)
-- only rank 0 talks
local print = job.main and print or function() end
local compile_opts = cli.compile_opts(opts)
local device, device_info = cli.check_device("train_resnet", opts)
local autocast, bf16_line = cli.bf16("train_resnet", opts, device)
local threads_line = cli.threads(opts.threads)
if job.world > 1 and compile_opts then fail("--distributed does not work with --compile or --tune yet") end
local local_batch = cli.local_batch("train_resnet", job, opts["batch-size"])

local q = cli.q
local tty = cli.is_tty()
local progress = job.main and cli.progress or function() end

-- data ------------------------------------------------------------------------

local cifar = nd.data.cifar10
local T = nd.data.transforms
local MEAN, STD = {0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}

local function no_data(dir, err)
  io.stderr:write(("train_resnet: no CIFAR-10 data in '%s'.\n"):format(dir),
    ("  Looked for data_batch_1.bin .. data_batch_5.bin and test_batch.bin (or .gz) in '%s'\n"):format(dir),
    ("  and in '%s/cifar-10-batches-bin'.\n"):format(dir),
    "  CIFAR-10 is not bundled with needle (and Debian has no package of it): download the\n",
    "  binary version, cifar-10-binary.tar.gz (about 160 MB), from\n",
    "  https://www.cs.toronto.edu/~kriz/cifar.html, unpack it with `tar xzf cifar-10-binary.tar.gz`\n",
    "  (it makes cifar-10-batches-bin/) and pass --data with that directory or its parent.\n",
    "  For a quick run without it: --synthetic 2000.\n",
    ("  (%s)\n"):format((tostring(err):gsub(";.*$", ""))))
  os.exit(1)
end

local t_load = nd.clock()
local data_dir, tmp_dir = opts.data, nil
if opts.synthetic then
  tmp_dir = os.tmpname()
  os.remove(tmp_dir)
  assert(cli.mkdir_p(tmp_dir))
  -- n records in each of the six files: 5n training images (N of them used), n test images
  cifar.synthetic(tmp_dir, {n = math.max(1, (opts.synthetic + 4) // 5), seed = opts.seed})
  data_dir = tmp_dir
end
local ok_files, files_err = pcall(function()
  cifar.files(data_dir, true)
  cifar.files(data_dir, false)
end)
if not ok_files then no_data(data_dir, files_err) end
local ok_load, train_x, train_y, test_x, test_y = pcall(function()
  local tx, ty = cifar.load(data_dir, {train = true, raw = true})   -- uint8, transformed per image
  local vx, vy = cifar.load(data_dir, {train = false})              -- float32 in [0, 1]
  return tx, ty, vx, vy
end)
if tmp_dir then os.execute("rm -rf " .. q(tmp_dir)) end
if not ok_load then
  io.stderr:write("train_resnet: ", tostring(train_x), "\n")
  os.exit(1)
end
if opts.synthetic then
  train_x, train_y = train_x:narrow(1, 1, opts.synthetic), train_y:narrow(1, 1, opts.synthetic)
end
local n_train, n_test = train_x:size(1), test_x:size(1)
if n_train < opts["batch-size"] then
  fail("%d training images are fewer than one batch of %d", n_train, opts["batch-size"])
end
-- the test set, normalised once
local mean = nd.tensor(MEAN):reshape({1, 3, 1, 1})
local std = nd.tensor(STD):reshape({1, 3, 1, 1})
test_x = (test_x - mean) / std
-- the test set moves to the device once; training batches move one by one
-- (augmentation runs on the cpu, in the loader)
test_x, test_y = test_x:to(device), test_y:to(device)

local train_tf = T.Compose({T.ScaleTo01(), T.RandomCrop(32, {padding = 4}), T.RandomFlipHorizontal(0.5),
                            T.Normalize(MEAN, STD)})
local train_set = nd.data.TensorDataset(train_x, train_y, {transform = train_tf})
-- data-parallel, each rank reads its share; the sampler drops the remainder
-- too, so every rank has the one-process run's number of steps
local loader = job.world == 1
  and nd.data.DataLoader(train_set, {batch_size = opts["batch-size"], shuffle = true,
                                     seed = opts.seed, drop_last = true})
  or nd.data.DataLoader(train_set, {batch_size = local_batch, drop_last = true,
                                    sampler = nd.data.DistributedSampler(train_set, {seed = opts.seed,
                                                                                    drop_last = true})})
local steps_per_epoch = #loader
print(("%s: %d training images, %d test images (%.1f s)"):format(
  opts.synthetic and ("synthetic CIFAR-10 (seed %d)"):format(opts.seed) or ("CIFAR-10 in " .. data_dir),
  n_train, n_test, nd.clock() - t_load))
print("augmentation: " .. tostring(train_tf))

-- model, optimizer, schedule -------------------------------------------------------

if job.main then cli.mkdir_p(opts.out) end
local ckpt_path = opts.checkpoint or (opts.out .. "/checkpoint.safetensors")

nd.manual_seed(opts.seed)
-- initialised on the cpu (the same weights for every device), then moved in
-- place before the optimizer sees the parameters
local model = nd.nn.ResNet9({num_classes = 10}):to(device)
-- data-parallel, batch statistics over the global batch (its parameters and buffers kept)
local sync_bn = job.world > 1 and not opts["local-bn"]
if sync_bn then nd.nn.SyncBatchNorm.convert_sync_batchnorm(model) end
local optimizer
if opts.optimizer == "sgd" then
  optimizer = nd.optim.SGD(model:parameters(), {lr = opts.lr, momentum = opts.momentum,
                                                weight_decay = opts["weight-decay"], nesterov = opts.momentum > 0})
else
  optimizer = nd.optim.Adam(model:parameters(), {lr = opts.lr, weight_decay = opts["weight-decay"]})
end
local total_steps = opts.epochs * steps_per_epoch
local sched
if opts.schedule == "onecycle" then
  -- cycles SGD's momentum (0.95 -> 0.85 -> 0.95) or Adam's beta1, unless momentum is off
  sched = nd.optim.lr_scheduler.OneCycleLR(optimizer, opts.lr, {total_steps = total_steps,
    cycle_momentum = opts.optimizer == "adam" or opts.momentum > 0})
elseif opts.schedule == "cosine" then
  sched = nd.optim.lr_scheduler.CosineAnnealingLR(optimizer, total_steps)
end
print(cli.device_line(device, device_info))
if bf16_line then print(bf16_line) end
print(model)
print(("%d parameters; %s lr %g (%s), weight decay %g, batch %d, %d steps/epoch, %d epochs, %s%s"):format(
  model:num_parameters(), opts.optimizer == "sgd" and (opts.momentum > 0 and ("SGD (nesterov momentum %g)"):format(opts.momentum) or "SGD")
  or "Adam", opts.lr, opts.schedule, opts["weight-decay"], opts["batch-size"], steps_per_epoch, opts.epochs,
  threads_line, job.world > 1 and (", %d processes of %d images, %s"):format(job.world, local_batch,
    sync_bn and "SyncBatchNorm" or "BatchNorm per process") or ""))

local checkpoint = nd.checkpoint
local start_epoch, step = 1, 0
if opts.resume then
  start_epoch, step = cli.resume("train_resnet", opts.resume, {model = model, optimizer = optimizer, scheduler = sched})
end
local last_epoch = math.min(opts.epochs, opts["stop-after"] or opts.epochs)

-- evaluation --------------------------------------------------------------------

local function evaluate()
  model:eval()
  local loss_sum, correct = 0, 0
  nd.no_grad(function()
    local B = opts["eval-batch-size"]
    for i = 1, n_test, B do
      local n = math.min(B, n_test - i + 1)
      local logits = model(test_x:narrow(1, i, n))
      local y = test_y:narrow(1, i, n)
      loss_sum = loss_sum + nd.F.cross_entropy(logits, y, {reduction = "sum"}):item()
      local _, pred = logits:max(2)
      correct = correct + pred:eq(y):sum():item()
    end
  end)
  model:train()
  return loss_sum / n_test, correct / n_test
end
evaluate = autocast(evaluate)

-- CSV log: rewritten up to the resumed epoch, then appended
local log_path = opts.out .. "/log.csv"
local HEADER = "epoch,step,lr,train_loss,train_acc,test_loss,test_acc,images_per_s,epoch_seconds,seconds"
local log = not job.main and {write = function() end, flush = function() end, close = function() end}
  or cli.open_log(log_path, HEADER, opts.resume, function(line)
  local e = tonumber(line:match("^(%d+),"))
  return e and e < start_epoch
end)

-- scalars (per step and per epoch) and parameter histograms (per epoch) for
-- TensorBoard, JSON lines and CSV (nd.log)
local run_log = cli.run_log(opts.out, opts.resume, job)

-- training ----------------------------------------------------------------------

-- one step (through nd.compile with --compile or --tune); data-parallel
-- through DistributedDataParallel, which averages the gradients over ranks
local trained = job.world > 1 and nd.nn.parallel.DistributedDataParallel(model) or model
local step_fn = cli.classifier_step(trained, optimizer, compile_opts)
local train_step = autocast(step_fn)

local t_start = nd.clock()
local epoch_times = {}
for epoch = start_epoch, last_epoch do
  model:train()
  loader:set_epoch(epoch)
  -- each rank its own augmentation, the same in every run
  if job.world > 1 then nd.manual_seed(opts.seed * 1000003 + epoch * 7919 + job.rank) end
  local t_epoch = nd.clock()
  local loss_sum, correct, seen, b = 0, 0, 0, 0
  for xb, yb in loader:iter() do
    b = b + 1
    xb, yb = xb:to(device), yb:to(device)
    local loss, logits = train_step(xb, yb)
    if sched then sched:step() end
    step = step + 1
    local n = yb:size(1)
    local l = loss:item()
    run_log:scalar("train/loss", l, step)
    local _, pred = logits:max(2)
    loss_sum, seen = loss_sum + l * n, seen + n
    correct = correct + pred:eq(yb):sum():item()
    local elapsed = nd.clock() - t_epoch
    local left = (steps_per_epoch - b) + (last_epoch - epoch) * steps_per_epoch
    progress(("epoch %d/%d  step %d/%d  loss %.3f  acc %.3f  lr %.4g  %.0f img/s  ETA %.0fs"):format(
      epoch, opts.epochs, b, steps_per_epoch, loss_sum / seen, correct / seen, optimizer.param_groups[1].lr,
      seen / math.max(elapsed, 1e-9), left * elapsed / b), not tty and (b % 50 == 0))
  end
  local seconds = nd.clock() - t_epoch
  epoch_times[#epoch_times + 1] = seconds
  loss_sum, correct, seen = table.unpack(cli.sum_over_ranks(job, {loss_sum, correct, seen}))
  local train_loss, train_acc = loss_sum / seen, correct / seen
  local t_eval = nd.clock()
  local test_loss, test_acc = evaluate()
  local eval_seconds = nd.clock() - t_eval
  local lr = optimizer.param_groups[1].lr
  progress(("epoch %d/%d  train loss %.4f  acc %.4f  test loss %.4f  acc %.4f  %.0f img/s  %.2fs (+%.2fs test)"):format(
    epoch, opts.epochs, train_loss, train_acc, test_loss, test_acc, seen / seconds, seconds, eval_seconds), true)
  log:write(("%d,%d,%.6g,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%.2f\n"):format(epoch, step, lr, train_loss, train_acc,
    test_loss, test_acc, seen / seconds, seconds, nd.clock() - t_start))
  log:flush()
  run_log:scalars({["epoch/train_loss"] = train_loss, ["epoch/train_acc"] = train_acc, ["test/loss"] = test_loss,
                   ["test/acc"] = test_acc, lr = lr, ["speed/images_per_s"] = seen / seconds}, step)
  cli.log_parameters(run_log, model, step)
  run_log:flush()
  if job.main then
    checkpoint.save(ckpt_path, {model = model, optimizer = optimizer, scheduler = sched, step = step,
                                extra = {epoch = epoch, train_loss = train_loss, test_acc = test_acc}})
  end
end
log:close()
run_log:close()

if #epoch_times > 0 then
  local sum = 0
  for _, s in ipairs(epoch_times) do sum = sum + s end
  print(("training: %d epochs in %.1f s, %.2f s per epoch (%.0f images/s)"):format(#epoch_times, sum,
    sum / #epoch_times, #epoch_times * steps_per_epoch * opts["batch-size"] / sum))
end
if last_epoch < opts.epochs then
  print(("stopped after epoch %d of %d; continue with --resume %s"):format(last_epoch, opts.epochs, ckpt_path))
end

-- plots, from the whole log (a resumed run's earlier epochs included): rank 0's
if not job.main then return end
local cols = {epoch = {}, train_loss = {}, test_loss = {}, train_acc = {}, test_acc = {}}
for line in io.lines(log_path) do
  local e, _, _, trl, tra, tel, tea = line:match("^(%d+),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)")
  if e then
    table.insert(cols.epoch, tonumber(e))
    table.insert(cols.train_loss, tonumber(trl))
    table.insert(cols.train_acc, tonumber(tra))
    table.insert(cols.test_loss, tonumber(tel))
    table.insert(cols.test_acc, tonumber(tea))
  end
end
local plot = require "needle.plot"
local loss_file = plot.lines(opts.out .. "/loss", {
  title = "ResNet9 on CIFAR-10: loss", xlabel = "epoch", ylabel = "cross-entropy",
  series = {{name = "train", x = cols.epoch, y = cols.train_loss},
            {name = "test", x = cols.epoch, y = cols.test_loss}}})
local acc_file = plot.lines(opts.out .. "/accuracy", {
  title = "ResNet9 on CIFAR-10: accuracy", xlabel = "epoch", ylabel = "accuracy",
  series = {{name = "train (augmented)", x = cols.epoch, y = cols.train_acc},
            {name = "test", x = cols.epoch, y = cols.test_acc}}})
if compile_opts then cli.compile_report(step_fn) end
print(("wrote %s, %s, %s and %s"):format(ckpt_path, log_path, loss_file, acc_file))
