-- data_workers_spec.lua - DataLoader{num_workers = N}: worker threads with
-- Lua states of their own (src/lua_bindings/lt_workers.c,
-- lua/needle/data/workers.lua). The batches equal the in-process ones
-- whatever N and the timing; per-batch seeds; values crossing between the
-- states; errors raised in the main state with the worker's traceback; early
-- breaks, errors and garbage collection stop and join the threads; no tensor
-- bytes leak. Run it under ASan too (docs/data.md):
--
--   build/needle-lua spec/run.lua spec/data_workers_spec.lua
--   ASAN_OPTIONS=detect_leaks=1 NEEDLE_BUILD_DIR=build-asan build-asan/needle-lua spec/run.lua spec/data_workers_spec.lua

local nd = require "needle"
local S = require "spec.helpers.shell"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, has = A.errmsg, A.has

local data = nd.data

-- The datasets the workers rebuild: a module on package.path, which the
-- worker states copy when they start.
local DIR = S.shell_line("mktemp -d")
assert(DIR and DIR:match("^/tmp/"), "mktemp -d failed")
S.write_file(DIR .. "/workers_ds.lua", [[
local nd = require "needle"
local data = nd.data
local M = {}

-- Items(n, opts): item i is {tensor {i, 2i}, i} unless opts.kind says otherwise;
-- opts.fail_at raises at that item, opts.slow_at spins opts.slow seconds there
local Items = data.Dataset:extend("Items")
function Items:init(n, opts)
  self.n, self.opts = n, opts or {}
  self.__worker = {module = "workers_ds", fn = "Items", args = {n, opts}}
end
function Items:len() return self.n end
function Items:get(i)
  local o = self.opts
  if o.fail_at == i then error("boom at item " .. i) end
  if o.slow_at == i then
    local t = nd.clock()
    while nd.clock() - t < o.slow do end
  end
  local k = o.kind
  if k == "info" then
    local w = data.get_worker_info()
    return {i, w and w.id or 0, w and w.num_workers or 0, nd.is_grad_enabled(), nd.threads().in_use}
  elseif k == "random" then return {i, nd.rand({3})}
  elseif k == "device" then return nd.zeros({1}, {device = "opencl"})
  elseif k == "grad" then nd.enable_grad(function() end)
  elseif k == "values" then
    return {i = i, f = i + 0.5, s = ("s%d"):format(i), b = i % 2 == 0, t = {x = i, y = {z = -i}},
            u8 = nd.tensor({i % 256}, {dtype = "uint8"}), f64 = nd.tensor({i / 3}, {dtype = "float64"}),
            flag = nd.tensor({i % 3 == 0}, {dtype = "bool"}), i32 = nd.tensor({{i, -i}}, {dtype = "int32"})}
  end
  return {nd.tensor({i, 2 * i}), i}
end
M.Items = Items

function M.count_collate(samples) return #samples, samples[1][2] end
function M.returns_function() return function() end end
function M.returns_meta() return setmetatable({}, {}) end
return M
]])
package.path = DIR .. "/?.lua;" .. package.path
local wds = require "workers_ds"

-- every batch of one epoch, each as the packed list of its values
local function epoch(loader)
  local out = {}
  for a, b, c in loader:iter() do out[#out + 1] = table.pack(a, b, c) end
  return out
end

local function same_value(a, b, where)
  if nd.is_tensor(a) then
    assert.is_true(nd.is_tensor(b), where)
    assert.are.equal(a.dtype, b.dtype, where)
    assert.are.same(a.shape, b.shape, where)
    assert.is_true(nd.equal(a, b), where)
  elseif type(a) == "table" then
    assert.are.equal("table", type(b), where)
    for k, v in pairs(a) do same_value(v, b[k], where .. "." .. tostring(k)) end
    for k in pairs(b) do assert.is_not_nil(a[k], where .. "." .. tostring(k)) end
  else
    assert.are.equal(a, b, where)
    assert.are.equal(math.type(a), math.type(b), where)
  end
end

local function same_epochs(a, b)
  assert.are.equal(#a, #b)
  for i = 1, #a do same_value(a[i], b[i], "batch " .. i) end
end

local function live() return nd._workers_live() end

describe("DataLoader worker threads", function()
  teardown(function() os.execute("rm -rf " .. S.q(DIR)) end)

  it("give the in-process batches, whatever num_workers and prefetch_factor (TensorDataset, shuffled)", function()
    local x = nd.randn({103, 3, 2})
    local y = nd.arange(1, 104)
    local ds = data.TensorDataset(x, y)
    local want = epoch(data.DataLoader(ds, {batch_size = 8, shuffle = true, seed = 4}))
    for _, n in ipairs({1, 2, 3, 7}) do
      for _, p in ipairs({1, 2, 5}) do
        local loader = data.DataLoader(ds, {batch_size = 8, shuffle = true, seed = 4, num_workers = n,
                                            prefetch_factor = p})
        same_epochs(want, epoch(loader))
      end
    end
    assert.are.equal(0, live())
  end)

  it("give the in-process batches item by item: a Lua list, records, strings, Subset and ConcatDataset", function()
    local list = {}
    for i = 1, 37 do list[i] = {id = i, name = "n" .. i, ok = i % 2 == 0, v = nd.tensor({i, -i})} end
    local want = epoch(data.DataLoader(list, {batch_size = 5, shuffle = true, seed = 1}))
    same_epochs(want, epoch(data.DataLoader(list, {batch_size = 5, shuffle = true, seed = 1, num_workers = 3})))
    local base = data.TensorDataset(nd.arange(1, 21):reshape({10, 2}), nd.arange(1, 11))
    local mixed = data.Subset(base + wds.Items(6), {1, 12, 3, 15, 10, 11, 2})
    local t = data.TensorDataset(nd.arange(1, 15):reshape({7, 2}), nd.arange(1, 8))
    local composite = data.ConcatDataset({data.Subset(base, {4, 5}), t})
    for _, ds in ipairs({composite, data.Subset(base, {9, 1, 5})}) do
      same_epochs(epoch(data.DataLoader(ds, {batch_size = 3})), epoch(data.DataLoader(ds, {batch_size = 3, num_workers = 2})))
    end
    -- Items from the module and TensorDataset rows stack into the same fields
    local a, b = epoch(data.DataLoader(mixed, {batch_size = 1})), epoch(data.DataLoader(mixed, {batch_size = 1, num_workers = 4}))
    same_epochs(a, b)
  end)

  it("many workers, batches of one item, the order kept; twice the work a second epoch", function()
    local ds = wds.Items(301)
    local loader = data.DataLoader(ds, {batch_size = 1, shuffle = true, seed = 9, num_workers = 16, prefetch_factor = 3})
    for _ = 1, 2 do
      local order = loader:permutation(loader._next_epoch):totable()
      local k = 0
      for x, i in loader:iter() do
        k = k + 1
        assert.are.equal(order[k], i[1]:item())
        assert.are.same({{order[k], 2 * order[k]}}, x:totable())
      end
      assert.are.equal(301, k)
    end
    assert.are.equal(0, live())
  end)

  it("seed each batch's random stream from (seed, epoch, batch): the same draws whatever num_workers", function()
    local ds = wds.Items(40, {kind = "random"})
    local runs = {}
    for _, n in ipairs({1, 2, 5}) do runs[n] = epoch(data.DataLoader(ds, {batch_size = 3, seed = 12, num_workers = n})) end
    same_epochs(runs[1], runs[2])
    same_epochs(runs[1], runs[5])
    -- different batches draw differently, and so does the next epoch
    assert.is_false(nd.equal(runs[1][1][2], runs[1][2][2]))
    local loader = data.DataLoader(ds, {batch_size = 3, seed = 12, num_workers = 2})
    local e1, e2 = epoch(loader), epoch(loader)
    same_epochs(runs[1], e1)
    assert.is_false(nd.equal(e1[1][2], e2[1][2]))
    -- and the random transforms of a TensorDataset too
    local T = data.transforms
    local tds = data.TensorDataset(nd.rand({12, 1, 4, 4}), {transform = T.Compose({T.RandomCrop(3, {padding = 1}),
                                                                                  T.RandomFlipHorizontal()})})
    same_epochs(epoch(data.DataLoader(tds, {batch_size = 4, seed = 2, num_workers = 1})),
                epoch(data.DataLoader(tds, {batch_size = 4, seed = 2, num_workers = 3})))
  end)

  it("leave the global random stream alone; nd.manual_seed makes a loader without seed reproducible", function()
    local ds = wds.Items(10, {kind = "random"})
    nd.manual_seed(3)
    local loader = data.DataLoader(ds, {batch_size = 2, num_workers = 2})
    local before = nd.get_rng_state()
    local a = epoch(loader)
    assert.are.same(before, nd.get_rng_state())
    nd.manual_seed(3)
    same_epochs(a, epoch(data.DataLoader(ds, {batch_size = 2, num_workers = 3})))
  end)

  it("copy numbers, strings, booleans and nested tables; hand tensors over without copying their data", function()
    local ds = wds.Items(9, {kind = "values"})
    same_epochs(epoch(data.DataLoader(ds, {batch_size = 4})), epoch(data.DataLoader(ds, {batch_size = 4, num_workers = 2})))
    for batch in data.DataLoader(ds, {batch_size = 4, num_workers = 2}):iter() do
      assert.are.equal("int64", batch.i.dtype)
      assert.are.equal("float32", batch.f.dtype)
      assert.are.same({"s1", "s2", "s3", "s4"}, batch.s)
      assert.are.equal("uint8", batch.u8.dtype)
      assert.are.same({{-1, -2, -3, -4}}, {batch.t.y.z:totable()})
      break
    end
    -- the dataset's tensors are shared with the workers, not copied: a batch
    -- of the whole (in-order) dataset is one copy, made in the worker
    local big = data.TensorDataset(nd.zeros({256, 1024}))
    local before = nd.live_bytes()
    local seen
    for xb in data.DataLoader(big, {batch_size = 256, num_workers = 2}):iter() do seen = nd.live_bytes() - before end
    assert.is_true(seen <= 256 * 1024 * 4 + 4096, tostring(seen))
  end)

  it("run each batch on its worker, which reports its id, num_workers, grad off and one kernel thread", function()
    for _, n in ipairs({1, 3}) do
      local b = 0
      for _, id, count, grad, threads in data.DataLoader(wds.Items(12, {kind = "info"}), {batch_size = 2, num_workers = n}):iter() do
        b = b + 1
        assert.are.same({(b - 1) % n + 1, (b - 1) % n + 1}, id:totable())
        assert.are.same({n, n}, count:totable())
        assert.are.same({false, false}, grad:totable())
        assert.are.same({1, 1}, threads:totable())
      end
      assert.are.equal(6, b)
    end
    assert.is_nil(data.get_worker_info())
    assert.is_true(nd.is_grad_enabled())
  end)

  it("raise a worker's error in the main state with its traceback, at the user's line, and stop the workers", function()
    local loader = data.DataLoader(wds.Items(40, {fail_at = 23}), {batch_size = 2, num_workers = 3})
    for _ = 1, 3 do
      local got = 0
      local msg = errmsg(function() for _ in loader:iter() do got = got + 1 end end)
      -- item 23 is in batch 12, which worker (12 - 1) % 3 + 1 = 3 makes
      has(msg, "data_workers_spec.lua:")
      has(msg, "needle.data.DataLoader: worker 3 failed: ")
      has(msg, "workers_ds.lua:")
      has(msg, ": boom at item 23")
      has(msg, "stack traceback:")
      has(msg, "in method 'get'")
      assert.are.equal(11, got)
      assert.are.equal(0, live())
    end
    -- a module that is not there fails every worker at the start
    local ds = wds.Items(4)
    ds.__worker = {module = "no_such_module_here", fn = "X", args = {}}
    has(errmsg(function() for _ in data.DataLoader(ds, {num_workers = 2}):iter() do end end),
        "worker 1 failed: ")
    has(errmsg(function() for _ in data.DataLoader(ds, {num_workers = 2}):iter() do end end),
        "module 'no_such_module_here' not found")
    ds.__worker = {module = "workers_ds", fn = "Nope"}
    has(errmsg(function() for _ in data.DataLoader(ds, {num_workers = 1}):iter() do end end),
        "recipe: module 'workers_ds' has no field 'Nope'")
    assert.are.equal(0, live())
  end)

  it("refuse what a worker thread must not do: another device, autograd, values that cannot cross", function()
    -- (the OpenCL-specific messages: the next test)
    local msg = errmsg(function() for _ in data.DataLoader(wds.Items(2, {kind = "device"}), {num_workers = 1}):iter() do end end)
    has(msg, "worker 1 failed: ")
    has(errmsg(function() for _ in data.DataLoader(wds.Items(2, {kind = "grad"}), {num_workers = 1}):iter() do end end),
        "needle.enable_grad: not available in a DataLoader worker thread")
    has(errmsg(function()
      for _ in data.DataLoader(wds.Items(2), {num_workers = 1, collate_fn = {module = "workers_ds", fn = "returns_function"}}):iter() do end
    end), "worker 1 failed: the batch[1] is a function (only plain tables")
    has(errmsg(function()
      for _ in data.DataLoader(wds.Items(2), {num_workers = 1, collate_fn = {module = "workers_ds", fn = "returns_meta"}}):iter() do end
    end), "the batch[1] is a table with a metatable")
    -- checked when the loader is built
    has(errmsg(data.DataLoader, data.TensorDataset(nd.zeros({2}, {requires_grad = true})), {num_workers = 1}),
        "needle.data.DataLoader: num_workers > 0: the dataset.__worker.args[1] is a tensor that requires grad")
    has(errmsg(data.DataLoader, {function() end}, {num_workers = 1}),
        "num_workers > 0: the dataset.__worker.args[1][1] is a function, which a worker thread cannot rebuild")
    has(errmsg(data.DataLoader, wds.Items(2), {num_workers = 1, collate_fn = function() end}),
        "num_workers > 0: collate_fn is a function, which a worker thread cannot rebuild")
    local T = data.transforms
    has(errmsg(data.DataLoader, data.TensorDataset(nd.zeros({2}), {transform = T.Lambda(function(v) return v end)}),
               {num_workers = 1}), "the dataset.__worker.args[2].transform is Lambda() without a recipe, which a worker thread cannot rebuild")
    local plain = data.Dataset:extend("Plain")
    function plain:len() return 1 end
    function plain:get() return 1 end
    has(errmsg(data.DataLoader, plain(), {num_workers = 1}), "the dataset is a Plain without a recipe")
    assert.are.equal(0, live())
  end)

  it("refuse OpenCL in a worker thread, and a dataset tensor on an OpenCL device", function()
    local D = require "spec.helpers.devices"
    if D.pending_without_opencl(pending, "DataLoader workers and OpenCL") then return end
    local msg = errmsg(function() for _ in data.DataLoader(wds.Items(2, {kind = "device"}), {num_workers = 1}):iter() do end end)
    has(msg, "worker 1 failed: ")
    has(msg, "cannot be used on this thread (a DataLoader worker thread makes its tensors on the CPU")
    for _, dev in ipairs(D.opencl()) do
      has(errmsg(data.DataLoader, data.TensorDataset(nd.zeros({2}, {device = dev})), {num_workers = 1}),
          "is a tensor on " .. dev .. "; worker threads work on the CPU")
    end
    assert.are.equal(0, live())
  end)

  it("a collate_fn naming a module's function runs in the workers", function()
    local out = {}
    for n, first in data.DataLoader(wds.Items(7), {batch_size = 3, num_workers = 2,
                                                   collate_fn = {module = "workers_ds", fn = "count_collate"}}):iter() do
      out[#out + 1] = {n, first}
    end
    assert.are.same({{3, 1}, {3, 4}, {1, 7}}, out)
    local ds = data.from_module("workers_ds", "Items", 5)
    same_epochs(epoch(data.DataLoader(ds, {batch_size = 2})), epoch(data.DataLoader(ds, {batch_size = 2, num_workers = 2})))
  end)

  it("stop and join on break, many times over, with batches in flight", function()
    local ds = wds.Items(500)
    local loader = data.DataLoader(ds, {batch_size = 1, num_workers = 6, prefetch_factor = 4})
    for round = 1, 12 do
      local k = 0
      for _, i in loader:iter() do
        k = k + 1
        if k == round % 5 + 1 then break end
      end
      assert.are.equal(0, live())
    end
  end)

  it("run two loaders' workers side by side; an error in the loop's body stops them", function()
    local a = data.DataLoader(wds.Items(50), {batch_size = 3, num_workers = 3})
    local b = data.DataLoader(wds.Items(50), {batch_size = 5, num_workers = 2, shuffle = true, seed = 1})
    local order = b:permutation(1):totable()
    local sa, _, _, ca = a:iter()
    local sb, _, _, cb = b:iter()
    for k = 1, 10 do
      local _, ia = sa()
      local _, ib = sb()
      assert.are.same({3 * k - 2, 3 * k - 1, 3 * k}, ia:totable())
      assert.are.same({table.unpack(order, 5 * k - 4, 5 * k)}, ib:totable())
    end
    assert.are.equal(5, live())
    ca:close()
    cb:close()
    assert.are.equal(0, live())
    has(errmsg(function() for _ in a:iter() do error("in the body") end end), "in the body")
    assert.are.equal(0, live())
  end)

  it("stop and join when an iterator or its loader is garbage-collected mid-epoch, leaking no tensor bytes", function()
    collectgarbage()
    local base = nd.live_bytes()
    for _ = 1, 5 do
      local loader = data.DataLoader(data.TensorDataset(nd.rand({64, 32})), {batch_size = 2, num_workers = 4})
      local step = loader:iter()
      step()
      step()
      assert.is_true(live() >= 4) -- earlier loops' threads go when the collector finds them
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(0, live())
    assert.are.equal(base, nd.live_bytes())
    -- the same with a loader that keeps its workers
    do
      local loader = data.DataLoader(data.TensorDataset(nd.rand({64, 32})), {batch_size = 2, num_workers = 3,
                                                                            persistent_workers = true})
      for _ in loader:iter() do break end
      assert.are.equal(3, live())
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(0, live())
    assert.are.equal(base, nd.live_bytes())
  end)

  it("persistent_workers keeps the threads between epochs with the same batches", function()
    local ds = wds.Items(33, {kind = "random"})
    local fresh = data.DataLoader(ds, {batch_size = 4, shuffle = true, seed = 5, num_workers = 3})
    local kept = data.DataLoader(ds, {batch_size = 4, shuffle = true, seed = 5, num_workers = 3, persistent_workers = true})
    for e = 1, 3 do
      if e == 2 then
        -- leave epoch 2 early: the next epoch drops what was in flight
        for _ in kept:iter() do break end
        for _ in fresh:iter() do break end
      else
        same_epochs(epoch(fresh), epoch(kept))
        assert.are.equal(3, live())
      end
    end
    kept._pool:close()
    assert.are.equal(0, live())
  end)

  it("time out a worker that takes longer than the timeout option", function()
    local ds = wds.Items(6, {slow_at = 3, slow = 0.6})
    local t0 = nd.clock()
    has(errmsg(function() for _ in data.DataLoader(ds, {batch_size = 1, num_workers = 2, timeout = 0.1}):iter() do end end),
        "needle.data.DataLoader: worker 1 timed out: no batch after 0.1 s (the timeout option)")
    assert.is_true(nd.clock() - t0 < 5)
    assert.are.equal(0, live())
  end)

  it("run beside the main thread's own ops and profiler", function()
    local ds = data.TensorDataset(nd.randn({200, 16}), nd.arange(1, 201))
    local w = nd.randn({16, 4}, {requires_grad = true})
    local report = nd.profile(function()
      for xb in data.DataLoader(ds, {batch_size = 4, num_workers = 4, shuffle = true, seed = 1}):iter() do
        local loss = (xb:matmul(w)):pow(2):sum()
        loss:backward()
      end
    end)
    assert.is_true(report.calls > 0)
    assert.are.same({16, 4}, w.grad.shape)
    assert.are.equal(0, live())
  end)
end)
