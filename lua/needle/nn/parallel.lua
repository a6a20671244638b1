-- needle.nn.parallel (nd.nn.parallel): DistributedDataParallel, as PyTorch's
-- (docs/distributed.md).
--
--   nd.distributed.init()
--   local ddp = nd.nn.parallel.DistributedDataParallel(model, {bucket_mb = 25})
--   local loss = loss_fn(ddp(x), y)   -- x: this rank's share of the batch
--   loss:backward()                   -- gradients come back averaged over ranks
--   opt:step()
--
-- At construction every rank checks that the others hold the same parameter
-- and buffer names, dtypes and shapes (an error names the first difference
-- and the ranks), then takes rank 0's values. Gradients are packed into
-- buckets of about bucket_mb MiB, in reverse parameter order (the order
-- backward produces them); a bucket is all-reduced (mean) with a
-- non-blocking call as soon as its last gradient is complete, while backward
-- goes on, and buckets are launched in the same order on every rank (on a
-- communicator of their own). When backward ends, the reduced gradients
-- become the parameters' grads. A parameter that got no gradient on a rank
-- counts as zeros there; one that no rank used keeps grad nil, as do frozen
-- parameters (requires_grad false: not reduced at all). A backward that
-- fails leaves no state behind (the buckets it started are waited for); a
-- backward inside a custom function's backward makes the wrapper take every
-- gradient again at the end; backward{create_graph = true} is an error.
--
-- Options: bucket_mb (25), broadcast_buffers (false: buffers such as
-- BatchNorm's running statistics stay per rank, unless SyncBatchNorm keeps
-- them equal; true: rank 0's buffers are sent to all before each forward).
-- ddp:no_sync(fn) runs fn (forward and backward) without reducing, for
-- gradient accumulation; ddp:no_sync() returns a value for a `<close>`
-- variable that does the same until the end of its block.
-- state_dict keys are the model's with a "module." prefix, as in PyTorch;
-- ddp.module is the model. Wrapping a model again takes its parameters from
-- the earlier wrapper, which stops synchronising (as ddp:close() does).
local core = require "needle.core"
local nd = require "needle"
local Module = require "needle.nn.module"
local options = require "needle.options"
local errors = require "needle.errors"

local M = {}

local WHO = "nn.parallel.DistributedDataParallel"
local DESC_BYTES = 256

local DDP = Module:extend("DistributedDataParallel")

local function fail(fmt, ...) errors.fail(WHO, fmt, ...) end

-- a 48-bit FNV-1a hash of a string: what the ranks compare first
local function hash(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do
    h = (h ~ s:byte(i)) * 0x100000001b3
  end
  return h & 0xffffffffffff
end

local function describe(name, t)
  return ("%s: %s %s"):format(name, t.dtype, errors.shape_str(t))
end

-- Every rank's list of "name: dtype shape" must equal rank 0's.
local function check_same_model(dist, entries)
  local W = dist.world_size()
  local n = nd.tensor({#entries}, {dtype = "int64"})
  dist.all_reduce(n, "max")
  local width = n:item()
  local mine = {}
  for i = 1, width do mine[i] = entries[i] and hash(entries[i]) or -1 end
  local all = dist.all_gather(nd.tensor(width > 0 and mine or {-1}, {dtype = "int64"}))
  local rows = all:totable()
  local bad_i, bad_r
  for i = 1, math.max(width, 1) do
    for r = 2, W do
      if rows[r][i] ~= rows[1][i] then bad_i, bad_r = i, r - 1 break end
    end
    if bad_i then break end
  end
  if not bad_i then return end
  -- every rank sends its description of entry bad_i, so all can say the same
  local bytes = {}
  local s = entries[bad_i] or "(nothing)"
  for i = 1, DESC_BYTES do bytes[i] = s:byte(i) or 0 end
  local texts = dist.all_gather(nd.tensor(bytes, {dtype = "uint8"})):totable()
  local function text(r)
    local chars = {}
    for _, b in ipairs(texts[r + 1]) do
      if b == 0 then break end
      chars[#chars + 1] = string.char(b)
    end
    return table.concat(chars)
  end
  fail("the ranks' models differ at parameter/buffer %d: rank 0 has %s, rank %d has %s", bad_i,
       text(0), bad_r, text(bad_r))
end

-- Buckets: parameters in reverse order (the order backward completes them),
-- one dtype and device per bucket, about cap_bytes each. A bucket's buffer
-- holds its gradients, then one flag per parameter: 1 where this rank had a
-- gradient, so that after the mean a parameter no rank used is told apart
-- (its grad stays nil) from one that some rank used.
local function build_buckets(params, cap_bytes)
  local buckets, where = {}, {}
  local open = {} -- dtype/device -> the bucket being filled
  for i = #params, 1, -1 do
    local p = params[i]
    local key = p.dtype .. "@" .. p.device
    local b = open[key]
    local bytes = p:numel() * p:element_size()
    if not b or (b.bytes > 0 and b.bytes + bytes > cap_bytes) then
      b = {dtype = p.dtype, device = p.device, params = {}, offsets = {}, numel = 0, bytes = 0}
      buckets[#buckets + 1] = b
      open[key] = b
    end
    b.params[#b.params + 1] = i
    b.offsets[#b.params] = b.numel
    where[i] = {bucket = #buckets, slot = #b.params}
    b.numel = b.numel + p:numel()
    b.bytes = b.bytes + bytes
  end
  for _, b in ipairs(buckets) do
    b.buffer = nd.zeros({b.numel + #b.params}, {dtype = b.dtype, device = b.device})
    b.flags = b.buffer:narrow(1, b.numel + 1, #b.params)
    b.got = {}
    b.ready = 0
  end
  return buckets, where
end

-- the slice of b's buffer that holds parameter slot k
local function slot_view(b, k, p)
  return b.buffer:narrow(1, b.offsets[k] + 1, p:numel()):view(p.shape)
end

local function launch(st, b)
  -- the gradients' own channel: its calls keep their order whatever
  -- collectives (SyncBatchNorm's) run on the default one in between
  b.handle = st.dist.all_reduce(b.buffer, {op = "mean", async = true, check = false, channel = "gradients"})
end

local function launch_ready(st)
  local buckets = st.buckets
  while st.next_launch <= #buckets do
    local b = buckets[st.next_launch]
    if b.ready < #b.params then break end
    launch(st, b)
    st.next_launch = st.next_launch + 1
  end
  -- MPI progresses a non-blocking collective only inside MPI calls
  for k = 1, st.next_launch - 1 do
    local h = buckets[k].handle
    if h then h:is_completed() end
  end
end

-- this backward's state goes (launched buckets are waited for: every rank
-- launched the same ones, in the same order)
local function reset(st)
  for _, b in ipairs(st.buckets) do
    if b.handle then
      local h = b.handle
      b.handle = nil
      h:wait()
    end
    b.got = {}
    b.ready = 0
  end
  st.next_launch = 1
  st.active = false
end

-- slot k of bucket b from the parameter's gradient now (zeros and flag 0
-- without one)
local function fill_slot(st, b, k)
  local p = st.params[b.params[k]]
  if p.grad ~= nil then
    slot_view(b, k, p):copy_(p.grad)
    b.flags:narrow(1, k, 1):fill_(1)
  else
    slot_view(b, k, p):zero_()
    b.flags:narrow(1, k, 1):fill_(0)
  end
  b.got[k] = true
  b.ready = b.ready + 1
end

local function on_grad_ready(st, i)
  if not st.sync then return end
  st.active = true
  local w = st.where[i]
  local b = st.buckets[w.bucket]
  if b.got[w.slot] then return end
  fill_slot(st, b, w.slot)
  if b.ready == #b.params then launch_ready(st) end
end

local function on_backward_end(st, ok, nested, create_graph)
  if not st.sync or not (st.active or nested) then return end
  if not ok then
    reset(st)
    return
  end
  if create_graph then
    reset(st)
    fail("backward with create_graph is not supported: the reduced gradients have no graph")
  end
  if nested then
    -- a backward inside a custom function's backward: hooks may have fired
    -- early (or not at all) for the leaves it reached, so every gradient is
    -- taken again now, and the buckets started before are dropped
    reset(st)
  end
  for _, b in ipairs(st.buckets) do
    for k = 1, #b.params do
      if not b.got[k] then fill_slot(st, b, k) end
    end
  end
  launch_ready(st)
  for _, b in ipairs(st.buckets) do
    local h = b.handle
    b.handle = nil
    h:wait()
    local flags = b.flags:totable()
    for k, i in ipairs(b.params) do
      local p = st.params[i]
      -- no rank had a gradient: none, as in one process
      if flags[k] > 0 then p.grad = slot_view(b, k, p) else p.grad = nil end
    end
  end
  reset(st)
end

-- parameters already synchronised by a wrapper (weak: a collected wrapper
-- lets go of them)
local owners = setmetatable({}, {__mode = "kv"})

local function unhook(st)
  if not st.hooked then return end
  st.hooked = false
  for _, p in ipairs(st.params) do
    if owners[p] == st then
      core._set_grad_hook(p, nil)
      owners[p] = nil
    end
  end
  core._set_backward_end_hook(st, nil)
end

function DDP:init(module, opts)
  if not Module.is_module(module) then fail("expected a module, got %s", options.got(module)) end
  local o = options.check(WHO, opts, {bucket_mb = "number", broadcast_buffers = "boolean"})
  if o.bucket_mb ~= nil and not (o.bucket_mb > 0) then fail("bucket_mb must be > 0, got %s", o.bucket_mb) end
  local dist = nd.distributed
  if not dist.is_initialized() then fail("call nd.distributed.init() first") end
  self.module = module
  self.bucket_mb = o.bucket_mb or 25
  self.broadcast_buffers = o.broadcast_buffers == true
  local params, all_params, names = {}, {}, {}
  for _, e in ipairs(module:named_parameters()) do
    names[#names + 1] = describe(e[1], e[2])
    all_params[#all_params + 1] = e[2]
    -- frozen parameters get no gradient, here as in one process
    if e[2].requires_grad then params[#params + 1] = e[2] end
  end
  local buffers = {}
  for _, e in ipairs(module:named_buffers()) do
    names[#names + 1] = describe(e[1], e[2])
    buffers[#buffers + 1] = e[2]
  end
  local st = {dist = dist, params = params, buffers = buffers, sync = true, active = false,
              next_launch = 1, hooked = false}
  self._state = st
  if dist.world_size() == 1 then return end -- nothing to synchronise
  -- a model wrapped again: the earlier wrapper stops synchronising
  for _, p in ipairs(params) do
    if owners[p] then unhook(owners[p]) end
  end
  check_same_model(dist, names)
  nd.no_grad(function()
    for _, t in ipairs(all_params) do dist.broadcast(t, {root = 0, check = false}) end
    for _, t in ipairs(buffers) do dist.broadcast(t, {root = 0, check = false}) end
  end)
  st.buckets, st.where = build_buckets(params, self.bucket_mb * 1024 * 1024)
  -- the hooks hold the state weakly: a wrapper nobody holds is collected,
  -- and its finaliser takes the hooks away
  local ref = setmetatable({st = st}, {__mode = "v"})
  for i, p in ipairs(params) do
    owners[p] = st
    core._set_grad_hook(p, function()
      local s = ref.st
      if s then on_grad_ready(s, i) end
    end)
  end
  core._set_backward_end_hook(st, function(ok, nested, create_graph)
    local s = ref.st
    if s then on_backward_end(s, ok, nested, create_graph) end
  end)
  st.hooked = true
  setmetatable(st, {__gc = unhook})
end

function DDP:forward(...)
  local st = self._state
  if self.broadcast_buffers and #st.buffers > 0 and st.dist.world_size() > 1 then
    nd.no_grad(function()
      for _, t in ipairs(st.buffers) do st.dist.broadcast(t, {root = 0, check = false}) end
    end)
  end
  return self.module(...)
end

function DDP:no_sync(fn)
  local st = self._state
  local prev = st.sync
  st.sync = false
  if fn == nil then
    return setmetatable({}, {__close = function() st.sync = prev end})
  end
  local ok, err = pcall(fn)
  st.sync = prev
  if not ok then error(err, 0) end
end

-- Stops synchronising: the hooks go (a model can be wrapped again). A
-- wrapper that is collected does this itself.
function DDP:close()
  unhook(self._state)
end

function DDP:extra_repr()
  return ("world_size=%d, bucket_mb=%s, broadcast_buffers=%s"):format(
    self._state.dist.world_size(), self.bucket_mb, tostring(self.broadcast_buffers))
end

M.DistributedDataParallel = DDP

return M
