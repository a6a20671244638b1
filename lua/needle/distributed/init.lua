-- needle.distributed (nd.distributed): data-parallel training over MPI
-- (docs/distributed.md). The C half is src/dist (the world, the agreement
-- check, bounded waits) behind src/lua_bindings/lt_dist.c.
--
--   dist.init([{timeout =, world_size =, threads =}])
--   dist.rank(), dist.world_size(), dist.local_rank(), dist.local_size()
--   dist.is_available(), dist.is_initialized(), dist.is_launched()
--   dist.barrier()
--   dist.all_reduce(t[, op | {op =, async =, check =, channel =}]) in place
--   dist.broadcast(t[, root | {root =, async =, check =}])     in place
--   dist.all_gather(t[, {async =, check =}])      -> {world_size, ...t's shape}
--   dist.reduce_scatter(t[, op | {op =, async =, check =}])   -> {n, ...}
--   dist.finalize(), dist.abort([code])
--
-- op: "sum" (default), "mean", "max", "min". With async = true a
-- collective returns a handle: h:wait() (-> the result of all_gather and
-- reduce_scatter) and h:is_completed(). check (default true) makes the ranks
-- compare what they are about to do first, so that different shapes, dtypes
-- or calls fail on every rank with one message instead of hanging.
-- Ranks are 0-based, as in MPI and PyTorch.
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"

local M = {}

local DEFAULT_TIMEOUT = 1800 -- seconds, as PyTorch's default process-group timeout

local function fail(who, fmt, ...) errors.fail("distributed." .. who, fmt, ...) end

function M.is_available() return core.dist_info().available end
function M.is_launched() return core.dist_info().launched end
function M.is_initialized() return core.dist_info().initialized end

-- Threads per process: the processes of one node share its cores, so each
-- gets its share unless the user said otherwise (NEEDLE_NUM_THREADS,
-- OMP_NUM_THREADS, opts.threads); mpirun may also have bound each process to
-- fewer CPUs, which nd.get_num_threads already sees.
local function share_threads(info, threads)
  if threads then
    core.set_num_threads(threads)
    return
  end
  if os.getenv("NEEDLE_NUM_THREADS") or os.getenv("OMP_NUM_THREADS") then return end
  if info.local_size > 1 then
    core.set_num_threads(math.max(1, core.get_num_threads() // info.local_size))
  end
end

function M.init(opts)
  local o = options.check("distributed.init", opts,
                          {timeout = "number", world_size = "integer", threads = "integer"})
  if o.timeout ~= nil and not (o.timeout >= 0 and o.timeout < math.huge) then
    fail("init", "timeout must be a finite number of seconds >= 0 (0: wait forever), got %s", o.timeout)
  end
  if o.threads ~= nil and o.threads < 1 then
    fail("init", "threads must be >= 1, got %d", o.threads)
  end
  local before = core.dist_info()
  if not before.launched and o.world_size and o.world_size ~= 1 then
    fail("init", "world_size = %d asked, but this process was not started by mpirun (a world of "
         .. "one); run it as: mpirun -np %d needle-lua script.lua", o.world_size, o.world_size)
  end
  core.dist_init(o.timeout or (before.initialized and before.timeout) or DEFAULT_TIMEOUT)
  local info = core.dist_info()
  if o.world_size and o.world_size ~= info.world_size then
    fail("init", "world_size = %d asked, but mpirun started %d processes", o.world_size, info.world_size)
  end
  if not before.initialized then share_threads(info, o.threads) end
  return M
end

local function info_checked(who)
  local info = core.dist_info()
  if not info.initialized then
    fail(who, info.finalized and "called after finalize" or "call nd.distributed.init() first")
  end
  return info
end

function M.rank() return info_checked("rank").rank end
function M.world_size() return info_checked("world_size").world_size end
function M.local_rank() return info_checked("local_rank").local_rank end
function M.local_size() return info_checked("local_size").local_size end
function M.timeout() return core.dist_info().timeout end
function M.set_timeout(s)
  if type(s) ~= "number" or not (s >= 0 and s < math.huge) then
    fail("set_timeout", "expected seconds >= 0 (0: wait forever), got %s", options.got(s))
  end
  core.dist_set_timeout(s)
end

function M.barrier() core.dist_barrier() end

-- (t, op_or_opts) -> op, async, check, channel
local OPS = {sum = true, mean = true, max = true, min = true}
local CHANNELS = {default = 0, gradients = 1}
local function reduce_args(who, t, arg, spec)
  if not core.is_tensor(t) then fail(who, "expected a tensor, got %s", options.got(t)) end
  local op, o = "sum", {}
  if type(arg) == "string" then
    op = arg
  elseif arg ~= nil then
    o = options.check("distributed." .. who, arg, spec or {op = "string", async = "boolean", check = "boolean"})
    op = o.op or "sum"
  end
  if not OPS[op] then fail(who, "unknown op '%s' (valid: max, mean, min, sum)", tostring(op)) end
  local channel = CHANNELS[o.channel or "default"]
  if not channel then
    fail(who, "unknown channel '%s' (valid: default, gradients)", tostring(o.channel))
  end
  return op, o.async == true, o.check ~= false, channel
end

-- channel "gradients": a communicator of its own, whose calls keep their
-- order among themselves whatever runs on the default one between them
-- (DistributedDataParallel's buckets)
function M.all_reduce(t, arg)
  local op, async, check, channel = reduce_args("all_reduce", t, arg,
    {op = "string", async = "boolean", check = "boolean", channel = "string"})
  return core.dist_all_reduce(t, op, check, async, channel)
end

function M.reduce_scatter(t, arg)
  local op, async, check = reduce_args("reduce_scatter", t, arg)
  return core.dist_reduce_scatter(t, op, check, async)
end

function M.broadcast(t, arg)
  if not core.is_tensor(t) then fail("broadcast", "expected a tensor, got %s", options.got(t)) end
  local root, o = 0, {}
  if math.type(arg) == "integer" then
    root = arg
  elseif arg ~= nil then
    o = options.check("distributed.broadcast", arg, {root = "integer", async = "boolean", check = "boolean"})
    root = o.root or 0
  end
  return core.dist_broadcast(t, root, o.check ~= false, o.async == true)
end

function M.all_gather(t, opts)
  if not core.is_tensor(t) then fail("all_gather", "expected a tensor, got %s", options.got(t)) end
  local o = options.check("distributed.all_gather", opts, {async = "boolean", check = "boolean"})
  return core.dist_all_gather(t, o.check ~= false, o.async == true)
end

-- Differentiable collectives (PyTorch's torch.distributed.nn.functional):
-- out-of-place, recorded by autograd. all_reduce's backward all-reduces
-- the gradient (a sum's gradient on every rank is the sum of the ranks'
-- gradients), which is what SyncBatchNorm's statistics need.
local AllReduceSum = require("needle.autograd").Function{
  name = "all_reduce",
  forward = function(ctx, x, check)
    ctx.check = check
    local y = x:clone()
    core.dist_all_reduce(y, "sum", check, false)
    return y
  end,
  backward = function(ctx, g)
    local h = g:contiguous():clone()
    core.dist_all_reduce(h, "sum", ctx.check, false)
    return h
  end,
}

M.functional = {}
-- dist.functional.all_reduce(t[, op | {op = "sum", check = true}]) -> the sum
-- over ranks, differentiable
function M.functional.all_reduce(t, arg)
  if not core.is_tensor(t) then fail("functional.all_reduce", "expected a tensor, got %s", options.got(t)) end
  local o = type(arg) == "table" and options.check("distributed.functional.all_reduce", arg,
                                                   {op = "string", check = "boolean"}) or {op = arg}
  if o.op ~= nil and o.op ~= "sum" then
    fail("functional.all_reduce", "only op 'sum' is differentiable here, got %s", options.got(o.op))
  end
  info_checked("functional.all_reduce")
  return AllReduceSum(t, o.check ~= false)
end

function M.finalize() core.dist_finalize() end
function M.abort(code) core.dist_abort(code or 1) end

return M
