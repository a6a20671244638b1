-- needle/cli.lua - the plumbing the training scripts (scripts/train_*.lua)
-- share: option parsing and checks, messages that end the program, the live
-- progress line, directories, the CSV log and resuming from a checkpoint.
--
--   local cli = require "needle.cli"
--   local opts, given = cli.parse(arg, defaults, usage, {prog = "train_x",
--     optional = {"resume", "threads"}, numbers = {epochs = true, threads = true}})
--   cli.die(prog, code, fmt, ...)           -- "prog: message" on stderr, exit code
--   local dev, info = cli.check_device(prog, opts) -- "cpu" / "opencl[:N]"; exit 2 otherwise
--   cli.device_line(dev, info)              -- "device opencl:0: <name> (...)"
--   cli.positive_integers(prog, opts, names[, fmt])
--   cli.choice(prog, opts, name, {"a", "b"}) -- "... expects 'a' or 'b', got '...'"
--   cli.is_tty(); cli.progress(line, final)
--   cli.q(s); cli.mkdir_p(dir)
--   local log = cli.open_log(path, header, resume[, keep])
--   local start_epoch, step = cli.resume(prog, path, objects[, check])
--   local D = cli.distributed(prog, opts)   -- --distributed: {rank, world, main, dist}
--   local n = cli.local_batch(prog, D, batch) -- this rank's share of a global batch
--   local autocast, line = cli.bf16(prog, opts, dev) -- --bf16: fn -> fn inside nd.autocast
local M = {}

-- "prog: message\n" on stderr, then exit with code
function M.die(prog, code, fmt, ...)
  io.stderr:write(prog, ": ", fmt:format(...), "\n")
  -- in a data-parallel job, the others may be waiting for this one
  local dist = package.loaded["needle.distributed"]
  if code ~= 0 and dist and dist.is_initialized() and dist.world_size() > 1 then dist.abort(code) end
  os.exit(code)
end

-- Parses argv (--name value pairs, -h/--help) over a copy of defaults.
-- o.prog names the program in messages; o.optional lists the options that
-- have no default value (a list of names, or a table keyed by them); o.numbers
-- is the set of options whose value is a number; o.flags the set of options
-- that take no value (--compile: true when given). --help writes usage and
-- exits 0; an unknown option, a missing value or a value that is not a number
-- ends the program with status 2. Returns the options and the set of those
-- given on the command line.
function M.parse(argv, defaults, usage, o)
  local prog, numbers, flags = o.prog, o.numbers or {}, o.flags or {}
  local known = {}
  for k in pairs(defaults) do known[k] = true end
  for k in pairs(flags) do known[k] = true end
  for k, v in pairs(o.optional or {}) do
    if type(k) == "number" then known[v] = true else known[k] = true end
  end
  local opts, given = {}, {}
  for k, v in pairs(defaults) do opts[k] = v end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "-h" or a == "--help" then io.write(usage); os.exit(0) end
    local name = a:match("^%-%-([%w%-]+)$")
    if not name or not known[name] then
      io.stderr:write(("%s: unknown option '%s'\n\n"):format(prog, a), usage)
      os.exit(2)
    end
    if flags[name] then
      opts[name], given[name] = true, true
      i = i + 1
      goto next
    end
    local v = argv[i + 1]
    if v == nil then M.die(prog, 2, "option --%s needs a value", name) end
    if numbers[name] then
      local num = tonumber(v)
      if not num then M.die(prog, 2, "option --%s expects a number, got '%s'", name, v) end
      v = num
    end
    opts[name], given[name] = v, true
    i = i + 2
    ::next::
  end
  return opts, given
end

-- --device: "cpu", "opencl" (the default OpenCL device: NEEDLE_OPENCL_DEVICE,
-- else the first GPU, else the first device) or "opencl:N" (nd.devices()
-- order). Anything else, or an OpenCL device that is not there, ends the
-- program with status 2 and a message saying what exists and, when OpenCL is
-- missing altogether, how to install it. Returns the device's full name
-- ("cpu", "opencl:0") and its nd.devices() entry.
-- (nd.opencl_available()'s reason already says how to install a driver)
local OPENCL_HINT = "--device cpu trains on the CPU"

function M.check_device(prog, opts)
  local nd = require "needle"
  local name = opts.device
  if name == nil or name == "cpu" then
    opts.device = "cpu"
    return "cpu", nd.devices()[1]
  end
  name = tostring(name)
  if not (name == "opencl" or name:match("^opencl:%d+$")) then
    M.die(prog, 2, "unknown device '%s' (expected cpu, opencl or opencl:N)", name)
  end
  local ok, why = nd.opencl_available()
  if not ok then
    M.die(prog, 2, "device '%s' is not available: %s\n  (%s)", name, tostring(why), OPENCL_HINT)
  end
  local devices = nd.devices()
  local probe_ok, probe = pcall(nd.zeros, {0}, {device = name})
  if not probe_ok then
    local list = {}
    for i = 2, #devices do
      list[#list + 1] = ("%s (%s)"):format(devices[i].name, devices[i].device)
    end
    M.die(prog, 2, "device '%s' is not available: %s\n  OpenCL devices here: %s", name,
      (tostring(probe):gsub("^.-needle%.[%w_]+: ", ""):gsub("^device '[^']*': ", "")), table.concat(list, ", "))
  end
  local full = probe.device
  opts.device = full
  for i = 2, #devices do
    if devices[i].name == full then return full, devices[i] end
  end
  return full, nil
end

-- one line describing a device entry of nd.devices() (for the scripts' banners)
function M.device_line(name, info)
  if name == "cpu" or info == nil then return ("device %s"):format(name) end
  return ("device %s: %s (%s, %d compute units, %.1f GiB%s)"):format(name, info.device, info.platform or info.vendor,
    info.compute_units or 0, (info.memory or 0) / 2^30, info.fp64 and ", fp64" or "")
end

-- The scripts' --threads: n (a number) fixes the thread count at n, so that
-- a run is reproducible bit for bit (a few kernels sum per-thread partial
-- results); nil keeps the default, every CPU while no other process keeps
-- them busy (docs/threads.md). Returns "N threads" or "up to N threads
-- (adaptive)" for the run's summary line.
function M.threads(n)
  local nd = require "needle"
  if n then nd.set_num_threads(n, {adaptive = false}) end
  local t = nd.threads()
  if t.adaptive then return ("up to %d threads (adaptive)"):format(t.max) end
  return ("%d threads"):format(t.max)
end

-- each of the named options, when set, must be an integer >= 1; fmt (with
-- the option's name and its value) is the message otherwise
function M.positive_integers(prog, opts, names, fmt)
  fmt = fmt or "option --%s expects a positive integer, got %s"
  for _, name in ipairs(names) do
    local v = opts[name]
    if v ~= nil and (math.type(v) ~= "integer" or v < 1) then M.die(prog, 2, fmt, name, tostring(v)) end
  end
end

-- opts[name] must be one of the strings in list
function M.choice(prog, opts, name, list)
  for _, c in ipairs(list) do
    if opts[name] == c then return end
  end
  local quoted = {}
  for i, c in ipairs(list) do quoted[i] = "'" .. c .. "'" end
  local text = #quoted > 1
    and table.concat(quoted, ", ", 1, #quoted - 1) .. " or " .. quoted[#quoted] or quoted[1]
  M.die(prog, 2, "option --%s expects %s, got '%s'", name, text, tostring(opts[name]))
end

-- live progress: one rewritten line on a terminal, plain lines otherwise
local tty
function M.is_tty()
  -- mpirun gives every process a terminal for its output, whatever the
  -- user's stdout is: plain lines there
  if tty == nil and os.getenv("OMPI_COMM_WORLD_SIZE") then tty = false end
  if tty == nil then
    local ok = os.execute("test -t 1")
    tty = ok == true or ok == 0
  end
  return tty
end

-- On a terminal, line replaces the current line (final ends it); otherwise
-- only final lines are written.
function M.progress(line, final)
  if M.is_tty() then
    io.write("\r\27[K", line)
    if final then io.write("\n") end
  elseif final then
    io.write(line, "\n")
  end
  io.flush()
end

-- --distributed (docs/distributed.md): joins the job mpirun started
-- (nd.distributed.init, which also gives each process its share of the
-- node's cores). Returns {rank =, world =, main = (rank 0: the one that
-- prints and writes files), dist = nd.distributed or nil}; without the flag,
-- a world of one.
function M.distributed(prog, opts)
  if not opts.distributed then return {rank = 0, world = 1, main = true} end
  local dist = require("needle").distributed
  local ok, err = pcall(dist.init)
  if not ok then M.die(prog, 2, "--distributed: %s", tostring(err)) end
  local D = {rank = dist.rank(), world = dist.world_size(), dist = dist}
  D.main = D.rank == 0
  return D
end

-- this rank's share of a global batch (which the world size must divide)
function M.local_batch(prog, D, batch)
  if batch % D.world ~= 0 then
    M.die(prog, 2, "--batch-size %d does not split over %d processes; use a multiple of %d", batch,
          D.world, D.world)
  end
  return batch // D.world
end

-- the sums of a table of numbers over the ranks (a world of one: as they are)
function M.sum_over_ranks(D, values)
  if D.world == 1 then return values end
  local nd = require "needle"
  local t = nd.tensor(values, {dtype = "float64"})
  D.dist.all_reduce(t, "sum")
  return t:totable()
end

-- s quoted for the shell
function M.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- creates dir and its parents; os.execute's results
function M.mkdir_p(dir) return os.execute("mkdir -p " .. M.q(dir)) end

-- The CSV log at path, open for appending rows. A new run writes header
-- first. A resumed run without keep appends to the file as it is; with keep,
-- the file is rewritten as the header and its lines for which keep(line) is
-- true (a missing file gives just the header), and then appended to.
function M.open_log(path, header, resume, keep)
  if resume and not keep then return assert(io.open(path, "a")) end
  local lines = {header}
  if resume then
    local f = io.open(path, "r")
    if f then
      for line in f:lines() do
        if keep(line) then lines[#lines + 1] = line end
      end
      f:close()
    end
  end
  local f = assert(io.open(path, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  return assert(io.open(path, "a"))
end

-- argv split into the words cli.parse reads (options; one named in `valued`
-- takes the next word as its value) and the positional ones (images, texts),
-- which may come anywhere on the line.
function M.split_args(argv, valued)
  local words, positional = {}, {}
  local i = 1
  while i <= #argv do
    local name = argv[i]:match("^%-%-([%w%-]+)$")
    if name and valued[name] then
      words[#words + 1], words[#words + 2] = argv[i], argv[i + 1]
      i = i + 2
    elseif name or argv[i] == "-h" then
      words[#words + 1] = argv[i]
      i = i + 1
    else
      positional[#positional + 1] = argv[i]
      i = i + 1
    end
  end
  return words, positional
end

-- an error's message without the "file:line: " position Lua put in front
function M.message(e) return (tostring(e):gsub("^[^:\n]*:%d+: ", "")) end

-- The state dict in path: a .safetensors file (nd.load), else what torch.save
-- wrote (nd.load_torch, read without running anything; the usual wrappers
-- removed by nd.convert.unwrap). A file that cannot be read ends the program
-- with status 1, naming it.
function M.read_state_dict(prog, path)
  local ok, sd = pcall(function()
    if path:match("%.safetensors$") then return require("needle").load(path) end
    local nd = require "needle"
    return nd.convert.unwrap(nd.load_torch(path))
  end)
  if not ok then M.die(prog, 1, "cannot read %s: %s", path, M.message(sd)) end
  return sd
end

-- nd.convert.model(name, sd, opts), or the end of the program (status 1) with
-- the converter's reason
function M.convert_model(prog, name, sd, opts)
  local ok, model = pcall(require("needle").convert.model, name, sd, opts)
  if not ok then M.die(prog, 1, "%s", M.message(model)) end
  return model
end

-- The run's nd.log logger (docs/logging.md) in dir: scalars.csv, log.jsonl
-- and a TensorBoard event file, appended to when resuming. Only the main rank
-- of a distributed job writes; the others get a logger that does nothing.
function M.run_log(dir, resume, job)
  if job and not job.main then
    local none = function() end
    return {scalar = none, scalars = none, histogram = none, flush = none, close = none, files = {}}
  end
  return require("needle.log").open(dir, {resume = resume and true or false})
end

-- One histogram per parameter of model (tag "params/<name>"), and one per
-- gradient where there is one ("grads/<name>").
function M.log_parameters(log, model, step)
  for _, entry in ipairs(model:named_parameters()) do
    local name, p = entry[1], entry[2]
    log:histogram("params/" .. name, p, step)
    if p.grad then log:histogram("grads/" .. name, p.grad, step) end
  end
end

-- Loads the checkpoint at path into objects ({model = ..., optimizer = ...,
-- scheduler = ...}); check(state), when given, first sees the checkpoint as
-- read (nd.checkpoint.read). A checkpoint that cannot be read or loaded ends
-- the program with status 1. Prints where the run resumes and returns the
-- first epoch to run and the step count.
function M.resume(prog, path, objects, check)
  local checkpoint = require "needle.checkpoint"
  local ok, state
  if check then
    ok, state = pcall(checkpoint.read, path)
    if not ok then M.die(prog, 1, "cannot resume: %s", tostring(state)) end
    check(state)
  end
  ok, state = pcall(checkpoint.load, path, objects)
  if not ok then M.die(prog, 1, "cannot resume: %s", tostring(state)) end
  local start_epoch = (state.extra and state.extra.epoch or 0) + 1
  local step = state.step or 0
  local dist = package.loaded["needle.distributed"]
  if not (dist and dist.is_initialized() and dist.rank() ~= 0) then
    print(("resumed from %s after epoch %d (step %d)"):format(path, start_epoch - 1, step))
  end
  return start_epoch, step
end

-- The training step of a classifier, shared by the scripts: forward,
-- cross-entropy, zero_grad, backward, optimizer step; returns the loss and
-- the logits. With compile (--compile) it goes through nd.compile: captured
-- once per batch shape (a smaller last batch is another entry) and replayed
-- without Lua in the loop; schedules change lr and momentum through the
-- optimizer's replay hooks, without a retrace (docs/compile.md).
function M.classifier_step(model, optimizer, compile)
  local nd = require "needle"
  local function step(xb, yb)
    local logits = model(xb)
    local loss = nd.F.cross_entropy(logits, yb)
    optimizer:zero_grad()
    loss:backward()
    optimizer:step()
    return loss, logits
  end
  return compile and nd.compile(step, type(compile) == "table" and compile or nil) or step
end

-- The nd.compile options of the training scripts' --compile and --tune
-- SECONDS (--tune implies --compile), or false when neither was given.
function M.compile_opts(opts)
  if opts.tune ~= nil and not (opts.tune >= 0) then
    M.die(opts.prog or "needle", 2, "option --tune expects seconds >= 0, got %s", tostring(opts.tune))
  end
  if not (opts.compile or opts.tune) then return false end
  return {tune = opts.tune}
end

-- --bf16: a training script's step and evaluation run inside nd.autocast
-- (docs/tensor.md, "Mixed precision"): float32 products on bfloat16 inputs
-- where the CPU has AVX512_BF16. Returns wrap(fn) -> fn inside nd.autocast
-- (fn itself without --bf16) and the line the script prints about it (nil
-- without --bf16). On an OpenCL device it is an error (exit code 2).
function M.bf16(prog, opts, device)
  if not opts.bf16 then return function(fn) return fn end, nil end
  if device ~= "cpu" then
    M.die(prog, 2, "--bf16 is for the CPU: OpenCL devices have no bfloat16 kernels yet (got --device %s)", device)
  end
  local nd = require "needle"
  local line = nd.devices()[1].bf16 and "--bf16: float32 products on bfloat16 inputs (nd.autocast, AVX512_BF16)"
    or "--bf16: this CPU has no AVX512_BF16, so products stay float32"
  local function wrap(fn)
    return function(...)
      local args = table.pack(...)
      return nd.autocast(function() return fn(table.unpack(args, 1, args.n)) end)
    end
  end
  return wrap, line
end

-- What the compiler did, after training (docs/compile.md): explain()'s first
-- line, and its tuning line when there is one.
function M.compile_report(step)
  local text = step:explain()
  print((text:match("^[^\n]*")))
  local tuning = text:match("\n(tuning: [^\n]*)")
  if tuning then print(tuning) end
end

return M
