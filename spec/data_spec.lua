-- data_spec.lua - needle.data: Dataset, TensorDataset, DataLoader (batching,
-- shuffling with its own generator, drop_last, collate), transforms, the IDX
-- (MNIST) and CIFAR-10 readers on small files written here, the PTB corpus
-- reader, batchify/get_batch, and the bundled synthetic corpus data/ptb_synth;
-- Subset, ConcatDataset, random_split, the samplers and DataLoader's
-- batch_sampler (worker threads: spec/data_workers_spec.lua).
--
--   build/needle-lua spec/run.lua spec/data_spec.lua
--
-- Expected values by hand, and torch.utils.data's where it is deterministic
-- (spec/fixtures/torch_data.lua, written by spec/fixtures/gen/gen_torch_data.py).

local nd = require "needle"
local S = require "spec.helpers.shell"

local A = require("spec.helpers.assertions").bind(assert)
local errmsg, has = A.errmsg, A.has

local data = nd.data

local function i64(t) return nd.tensor(t, {dtype = "int64"}) end
-- x is close to the nested table t (float32 results against decimal values)
local function close(t, x, tol)
  local d = (x:double() - nd.tensor(t, {dtype = "float64"})):abs():max():item()
  assert.is_true(d < (tol or 1e-6), ("off by %g: %s"):format(d, tostring(x)))
end
local function u8(t) return nd.tensor(t, {dtype = "uint8"}) end

local function tempdir()
  local d = S.shell_line("mktemp -d")
  assert(d and d ~= "", "mktemp -d failed")
  return d
end

local function rmdir(d)
  if d and d:match("^/tmp/") then os.execute("rm -rf " .. S.q(d)) end
end

-- collect(loader) -> list of the values each step of one epoch returned
local function collect(loader)
  local out = {}
  for a, b in loader:iter() do out[#out + 1] = {a, b} end
  return out
end

local function labels_of(loader)
  local order = {}
  for _, y in loader:iter() do
    for _, v in ipairs(y:totable()) do order[#order + 1] = v end
  end
  return order
end

local function range_ds(n)
  local x = nd.arange(1, n + 1):reshape({n, 1}):float() * 10
  local y = nd.arange(1, n + 1)
  return data.TensorDataset(x, y)
end

describe("Dataset", function()
  it("a subclass defines len and get; #ds and ds[i] use them", function()
    local Squares = data.Dataset:extend("Squares")
    function Squares:init(n) self.n = n end
    function Squares:len() return self.n end
    function Squares:get(i) return nd.tensor(i * i) end
    local ds = Squares(4)
    assert.are.equal(4, #ds)
    assert.are.equal(9, ds[3]:item())
    assert.are.equal(16, ds:get(4):item())
    assert.is_true(data.Dataset.is_dataset(ds))
    assert.is_false(data.Dataset.is_dataset({}))
    assert.are.equal("Squares(4 items)", tostring(ds))
  end)

  it("the base class says what a subclass must define", function()
    local Empty = data.Dataset:extend("Empty")
    has(errmsg(function() return #Empty() end), "needle.data.Empty: len is not defined")
  end)
end)

describe("TensorDataset", function()
  it("indexes every tensor along dim 1", function()
    local x = nd.tensor({{1, 2}, {3, 4}, {5, 6}})
    local y = i64({7, 8, 9})
    local ds = data.TensorDataset(x, y)
    assert.are.equal(3, #ds)
    local item = ds[2]
    assert.are.same({3, 4}, item[1]:totable())
    assert.are.equal(8, item[2]:item())
    assert.are.same({5, 6}, ds:get(-0 + 3)[1]:totable())
  end)

  it("with one tensor an item is the row itself", function()
    local ds = data.TensorDataset(nd.tensor({{1, 2}, {3, 4}}))
    assert.are.same({3, 4}, ds[2]:totable())
  end)

  it("applies transform to the first field and target_transform to the second", function()
    local ds = data.TensorDataset(nd.tensor({{1, 2}}), i64({3}), {
      transform = function(x) return x * 2 end, target_transform = function(y) return y + 100 end})
    local item = ds[1]
    assert.are.same({2, 4}, item[1]:totable())
    assert.are.equal(103, item[2]:item())
  end)

  it("rejects mismatched sizes, non-tensors and indices out of range", function()
    has(errmsg(data.TensorDataset, nd.zeros({3, 2}), nd.zeros({4})),
      "needle.data.TensorDataset: size mismatch along dim 1: tensor 1 has 3 rows, tensor 2 has 4")
    has(errmsg(data.TensorDataset, nd.zeros({3}), 5), "argument 2 is a number, expected a tensor")
    has(errmsg(data.TensorDataset), "expected at least one tensor")
    local ds = data.TensorDataset(nd.zeros({3}))
    has(errmsg(function() return ds:get(4) end), "index 4 out of range (expected 1..3)")
    has(errmsg(function() return ds:get(0) end), "index 0 out of range")
  end)

  -- audit S8: ds[2.0] and ds[4 / 2] were nil (and ds[2.5] too), with no error
  it("takes an integral float index as the integer; a fractional or out-of-range one is an error naming the size", function()
    local ds = data.TensorDataset(nd.arange(1, 5))
    assert.are.equal(2, ds[2.0]:item())
    assert.are.equal(2, ds[4 / 2]:item())
    assert.are.equal(3, ds:get(3.0):item())
    has(errmsg(function() return ds[2.5] end),
      "needle.data.TensorDataset: index must be an integer in 1..4 (the dataset has 4 items), got 2.5")
    for _, i in ipairs({0, -1, 5}) do
      has(errmsg(function() return ds[i] end),
        ("needle.data.TensorDataset: index %d out of range (expected 1..4) for a dataset of 4 items"):format(i))
    end
    has(errmsg(function() return ds:get("2") end), "index must be an integer in 1..4 (the dataset has 4 items), got \"2\"")
    -- the same for the other datasets, and a subclass's get is guarded by ds[i] too
    local sub = data.Subset(ds, {4, 1})
    assert.are.equal(1, sub[2.0]:item())
    has(errmsg(function() return sub[1.5] end), "needle.data.Subset: index must be an integer in 1..2")
    assert.are.equal(2, (ds + ds)[6.0]:item())
    has(errmsg(function() return (ds + ds)[9] end), "needle.data.ConcatDataset: index 9 out of range (expected 1..8)")
    local Sq = data.Dataset:extend("Squares")
    function Sq:init(n) self.n = n end
    function Sq:len() return self.n end
    function Sq:get(i) return i * i end
    assert.are.equal(4, Sq(3)[2.0])
    has(errmsg(function() return Sq(3)[4] end), "needle.data.Squares: index 4 out of range (expected 1..3) for a dataset of 3 items")
    has(errmsg(function() return data.Subset(ds, {1}, 5) end), "needle.data.Subset: takes Subset(dataset, indices) only, got an extra argument #3: 5")
  end)
end)

describe("DataLoader", function()
  it("batches in order, the last batch short; #loader is the number of batches", function()
    local loader = data.DataLoader(range_ds(10), {batch_size = 4})
    assert.are.equal(3, #loader)
    local b = collect(loader)
    assert.are.equal(3, #b)
    assert.are.same({{10}, {20}, {30}, {40}}, b[1][1]:totable())
    assert.are.same({1, 2, 3, 4}, b[1][2]:totable())
    assert.are.same({9, 10}, b[3][2]:totable())
    assert.are.same({2, 1}, b[3][1].shape)
    assert.are.equal("float32", b[1][1].dtype)
    assert.are.equal("int64", b[1][2].dtype)
  end)

  it("drop_last drops the short batch", function()
    local loader = data.DataLoader(range_ds(10), {batch_size = 4, drop_last = true})
    assert.are.equal(2, #loader)
    local b = collect(loader)
    assert.are.equal(2, #b)
    assert.are.same({5, 6, 7, 8}, b[2][2]:totable())
    assert.are.equal(0, #data.DataLoader(range_ds(3), {batch_size = 4, drop_last = true}))
    assert.are.equal(1, #data.DataLoader(range_ds(3), {batch_size = 4}))
  end)

  it("batch_size defaults to 1", function()
    local loader = data.DataLoader(range_ds(3))
    assert.are.equal(3, #loader)
    assert.are.same({1}, collect(loader)[1][2].shape)
  end)

  it("a batch does not share memory with the dataset", function()
    local ds = range_ds(4)
    local loader = data.DataLoader(ds, {batch_size = 2})
    for x in loader:iter() do x:fill_(0) end
    assert.are.same({{10}, {20}, {30}, {40}}, ds.tensors[1]:totable())
  end)

  it("shuffle gives every item once per epoch", function()
    local loader = data.DataLoader(range_ds(23), {batch_size = 5, shuffle = true, seed = 1})
    for _ = 1, 3 do
      local order = labels_of(loader)
      assert.are.equal(23, #order)
      table.sort(order)
      for i = 1, 23 do assert.are.equal(i, order[i]) end
    end
  end)

  it("shuffles x and y together", function()
    local loader = data.DataLoader(range_ds(12), {batch_size = 5, shuffle = true, seed = 4})
    for x, y in loader:iter() do
      assert.are.same((y:float() * 10):totable(), x:reshape({-1}):totable())
    end
  end)

  it("the same seed gives the same order, epoch by epoch", function()
    local a = data.DataLoader(range_ds(40), {batch_size = 8, shuffle = true, seed = 7})
    local b = data.DataLoader(range_ds(40), {batch_size = 8, shuffle = true, seed = 7})
    local a1, a2 = labels_of(a), labels_of(a)
    local b1, b2 = labels_of(b), labels_of(b)
    assert.are.same(a1, b1)
    assert.are.same(a2, b2)
    assert.are_not.same(a1, a2)  -- different epochs, different orders
    local c = data.DataLoader(range_ds(40), {batch_size = 8, shuffle = true, seed = 8})
    assert.are_not.same(a1, labels_of(c))
  end)

  it("epoch e's order is nd.randperm(n) after nd.manual_seed(seed * 1000003 + e)", function()
    local loader = data.DataLoader(range_ds(30), {batch_size = 7, shuffle = true, seed = 12})
    local got1, got2 = labels_of(loader), labels_of(loader)
    nd.manual_seed(12 * 1000003 + 1)
    assert.are.same(nd.randperm(30):totable(), got1)
    nd.manual_seed(12 * 1000003 + 2)
    assert.are.same(nd.randperm(30):totable(), got2)
    assert.are.same(got2, loader:permutation(2):totable())
    assert.are.equal(2, loader.epoch)
  end)

  it("set_epoch chooses the epoch the next iter() runs", function()
    local loader = data.DataLoader(range_ds(20), {batch_size = 4, shuffle = true, seed = 3})
    local e1, e2 = labels_of(loader), labels_of(loader)
    loader:set_epoch(2)
    assert.are.same(e2, labels_of(loader))
    loader:set_epoch(1)
    assert.are.same(e1, labels_of(loader))
  end)

  it("iterating leaves the global random stream where it was", function()
    nd.manual_seed(5)
    local loader = data.DataLoader(range_ds(50), {batch_size = 8, shuffle = true, seed = 11})
    for _ = 1, 3 do for _ in loader:iter() do end end
    local after = nd.rand({4}):totable()
    nd.manual_seed(5)
    local without = nd.rand({4}):totable()
    assert.are.same(without, after)
  end)

  it("without a seed, draws one at construction from the global generator (reproducible with manual_seed)", function()
    nd.manual_seed(21)
    local a = data.DataLoader(range_ds(40), {batch_size = 8, shuffle = true})
    local state = nd.get_rng_state()
    local oa = labels_of(a)
    assert.are.same(state, nd.get_rng_state())  -- iterating did not move it
    nd.manual_seed(21)
    local b = data.DataLoader(range_ds(40), {batch_size = 8, shuffle = true})
    assert.are.same(oa, labels_of(b))
    assert.are.equal(a.seed, b.seed)
  end)

  it("the TensorDataset fast path gives the same batches as item-by-item stacking", function()
    local x = nd.arange(0, 60):reshape({15, 2, 2}):float()
    local y = nd.arange(1, 16)
    local fast = data.DataLoader(data.TensorDataset(x, y), {batch_size = 4, shuffle = true, seed = 9})
    -- an identity transform turns the fast path off
    local slow = data.DataLoader(data.TensorDataset(x, y, {transform = function(v) return v end}),
                                 {batch_size = 4, shuffle = true, seed = 9})
    local f, s = collect(fast), collect(slow)
    assert.are.equal(#f, #s)
    for i = 1, #f do
      assert.are.same(s[i][1]:totable(), f[i][1]:totable())
      assert.are.same(s[i][2]:totable(), f[i][2]:totable())
      assert.are.same(s[i][1].shape, f[i][1].shape)
    end
  end)

  it("the default collate stacks the fields of items from any Dataset", function()
    local Pairs = data.Dataset:extend("Pairs")
    function Pairs:len() return 5 end
    function Pairs:get(i) return {nd.full({2, 3}, i), i, i / 2} end
    local loader = data.DataLoader(Pairs(), {batch_size = 2})
    local n = 0
    for x, y, z in loader:iter() do
      n = n + 1
      if n == 1 then
        assert.are.same({2, 2, 3}, x.shape)
        assert.are.same({{2, 2, 2}, {2, 2, 2}}, x[2]:totable())
        assert.are.same({1, 2}, y:totable())
        assert.are.equal("int64", y.dtype)
        assert.are.equal("float32", z.dtype)
        assert.are.same({0.5, 1}, z:totable())
      end
    end
    assert.are.equal(3, n)
  end)

  it("a single-tensor item gives one value per batch; records collate by key", function()
    local loader = data.DataLoader(data.TensorDataset(nd.arange(1, 6)), {batch_size = 2})
    local batches = {}
    for b in loader:iter() do batches[#batches + 1] = b:totable() end
    assert.are.same({{1, 2}, {3, 4}, {5}}, batches)

    local recs = {{img = nd.ones({2}), label = 1}, {img = nd.zeros({2}), label = 2}}
    for b in data.DataLoader(recs, {batch_size = 2}):iter() do
      assert.are.same({{1, 1}, {0, 0}}, b.img:totable())
      assert.are.same({1, 2}, b.label:totable())
    end
  end)

  it("takes a Lua list as a dataset", function()
    local out = {}
    for b in data.DataLoader({5, 6, 7}, {batch_size = 2}):iter() do out[#out + 1] = b:totable() end
    assert.are.same({{5, 6}, {7}}, out)
  end)

  it("a custom collate_fn gets the list of items and its results are returned as they are", function()
    local loader = data.DataLoader({"a", "b", "c", "d", "e"}, {batch_size = 2, collate_fn = function(items)
      return table.concat(items), #items
    end})
    local got = {}
    for s, n in loader:iter() do got[#got + 1] = s .. n end
    assert.are.same({"ab2", "cd2", "e1"}, got)
  end)

  it("rejects bad options with messages that say what was wrong", function()
    has(errmsg(data.DataLoader, range_ds(3), {batch_size = 0}),
      "needle.data.DataLoader: batch_size must be a positive integer, got 0")
    has(errmsg(data.DataLoader, range_ds(3), {batchsize = 2}), "unknown option 'batchsize'")
    has(errmsg(data.DataLoader, 42), "dataset must be a Dataset (with len and get) or a Lua list")
    has(errmsg(data.DataLoader, range_ds(3), {seed = 1.5}), "seed must be an integer")
    -- audit U5: a string is shown as a string
    has(errmsg(data.DataLoader, {1, 2, 3}, {batch_size = "2"}),
      "needle.data.DataLoader: batch_size must be a positive integer, got \"2\"")
    has(errmsg(data.DataLoader, {1, 2, 3}, {seed = "2"}), "seed must be an integer, got \"2\"")
    assert.are.equal(2, #data.DataLoader({1, 2, 3}, {batch_size = 4 / 2}))
    local bad = data.DataLoader({nd.zeros({2}), nd.zeros({3})}, {batch_size = 2})
    has(errmsg(function() for _ in bad:iter() do end end), "collate: cannot stack")
  end)

  -- audit S20, R3, R4 and the extra arguments that were ignored
  it("refuses bad epochs, bad samples for default_collate and extra arguments", function()
    local ds = data.TensorDataset(nd.randn({4, 2}))
    local l = data.DataLoader(ds, {shuffle = true, seed = 1})
    has(errmsg(function() l:set_epoch(-1) end), "needle.data.DataLoader: set_epoch: epoch must be an integer >= 0, got -1")
    has(errmsg(function() l:set_epoch(2.5) end), "set_epoch: epoch must be an integer >= 0, got 2.5")
    has(errmsg(function() l:set_epoch("1") end), "set_epoch: epoch must be an integer >= 0, got \"1\"")
    l:set_epoch(2.0)
    assert.are.equal("integer", math.type(l._next_epoch))
    has(errmsg(function() l:permutation(2.5) end),
      "needle.data.DataLoader: permutation: epoch must be an integer >= 0, got 2.5")
    has(errmsg(function() l:permutation(-1) end), "permutation: epoch must be an integer >= 0, got -1")
    assert.are.same(l:permutation(1):totable(), l:permutation(1.0):totable())
    has(errmsg(data.default_collate, nil), "needle.data.default_collate: samples must be a Lua list of items, got nil")
    has(errmsg(data.default_collate, 5), "samples must be a Lua list of items, got 5")
    has(errmsg(data.default_collate, {}), "needle.data.default_collate: samples is an empty list")
    has(errmsg(data.default_collate, {1}, {}), "takes default_collate(samples) only, got an extra argument #2: a table")
    assert.are.same({1, 2}, data.default_collate({1, 2}):totable())
    has(errmsg(data.DataLoader, ds, {}, 5),
      "needle.data.DataLoader: takes DataLoader(dataset[, opts]) only, got an extra argument #3: 5")
    has(errmsg(function() return l:iter(5) end), "needle.data.DataLoader: takes loader:iter() only, got an extra argument #1: 5")
    has(errmsg(function() return l:set_epoch(1, 2) end), "takes loader:set_epoch(epoch) only, got an extra argument #2: 2")
    -- a nil in the extra place is no argument (an optional passed along)
    assert.are.equal(4, #data.DataLoader(ds, nil, nil))
  end)

  -- issue 15: these ran into Lua's "stack overflow" after seconds
  it("collating a table that contains itself, or nests too deep, is an error naming the path", function()
    local t = {x = 1}
    t.self = t
    local loader = data.DataLoader({t, t}, {batch_size = 2})
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, e = pcall(function() for _ in loader:iter() do end end)
    assert.is_false(ok)
    has(e, ("data_spec.lua:%d: needle.data.DataLoader: collate: item 1 contains itself (at item.self): " ..
            "a table with a cycle cannot be batched"):format(line))
    local list = {1, {}}
    list[2][1] = list
    has(errmsg(data.default_collate, {list}), "item 1 contains itself (at item[2][1])")
    local deep = {}
    local c = deep
    for _ = 1, 150 do c.a = {}; c = c.a end
    local t0 = os.clock()
    e = errmsg(data.default_collate, {deep, deep})
    assert.is_true(os.clock() - t0 < 1)
    has(e, "needle.data.DataLoader: collate: items nest tables more than 100 levels deep " ..
           "(at item.a.a.a.a.a.a...(92 more)....a.a)")
    -- the same table twice (not a cycle) and nesting within the limit are fine
    local shared = {1, 2}
    local b = data.default_collate({{p = shared, q = shared}, {p = shared, q = shared}})
    assert.are.same({{1, 1}, {2, 2}}, {b.p[1]:totable(), b.q[2]:totable()})
    local ok_deep = {}
    c = ok_deep
    for _ = 1, 99 do c.a = {}; c = c.a end
    c.v = 3
    local r = data.default_collate({ok_deep})
    for _ = 1, 99 do r = r.a end
    assert.are.same({3}, r.v:totable())
  end)
end)

describe("transforms", function()
  local T = data.transforms
  local img = nd.arange(1, 13):reshape({1, 3, 4}):float()   -- C=1, H=3, W=4

  it("RandomFlipHorizontal flips W with p=1 and never with p=0", function()
    assert.are.same({{{4, 3, 2, 1}, {8, 7, 6, 5}, {12, 11, 10, 9}}}, T.RandomFlipHorizontal(1)(img):totable())
    assert.are.same(img:totable(), T.RandomFlipHorizontal(0)(img):totable())
  end)

  it("RandomFlipHorizontal(0.5) is reproducible with nd.manual_seed and flips about half", function()
    local f = T.RandomFlipHorizontal(0.5)
    local function run()
      nd.manual_seed(17)
      local flips = 0
      for _ = 1, 200 do
        if f(img)[1][1][1]:item() == 4 then flips = flips + 1 end
      end
      return flips
    end
    local a = run()
    assert.are.equal(a, run())
    assert.is_true(a > 70 and a < 130, "flips: " .. a)
  end)

  it("RandomCrop without padding at full size is the identity", function()
    assert.are.same(img:totable(), T.RandomCrop({3, 4})(img):totable())
  end)

  it("RandomCrop with padding cuts a window of the zero-padded image", function()
    local crop = T.RandomCrop({3, 4}, {padding = 1})
    local padded = img:pad({1, 1, 1, 1}, 0)
    local seen = {}
    nd.manual_seed(2)
    for _ = 1, 60 do
      local out = crop(img)
      assert.are.same({1, 3, 4}, out.shape)
      local found
      for i = 1, 3 do
        for j = 1, 3 do
          local window = padded:narrow(2, i, 3):narrow(3, j, 4)
          if not found and window:eq(out):sum():item() == 12 then found = i .. "," .. j end
        end
      end
      assert.truthy(found, "the crop is no window of the padded image")
      seen[found] = true
    end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.are.equal(9, n)  -- every offset turns up in 60 draws
    -- and the same seed gives the same crops
    nd.manual_seed(2)
    local first = crop(img):totable()
    nd.manual_seed(2)
    assert.are.same(first, crop(img):totable())
  end)

  it("RandomCrop to the padded size is the padded image", function()
    local out = T.RandomCrop({5, 6}, {padding = 1})(img)
    assert.are.same(img:pad({1, 1, 1, 1}, 0):totable(), out:totable())
  end)

  it("Normalize subtracts and divides per channel", function()
    local x = nd.tensor({{{1, 3}}, {{10, 20}}})       -- C=2, H=1, W=2
    local y = T.Normalize({1, 10}, {2, 5})(x)
    assert.are.same({{{0, 1}}, {{0, 2}}}, y:totable())
    assert.are.same({{{0, 1}}, {{4.5, 9.5}}}, T.Normalize(1, 2)(x):totable())
    has(errmsg(T.Normalize({1, 2, 3}, {1, 1, 1}), x), "expected 3 channels (dim -3)")
  end)

  it("ScaleTo01, ToFloat and Compose", function()
    local x = u8({{{0, 255}, {51, 102}}})
    close({{{0, 1}, {0.2, 0.4}}}, T.ScaleTo01()(x))
    assert.are.equal("float32", T.ToFloat()(x).dtype)
    local tf = T.Compose({T.ScaleTo01(), T.RandomFlipHorizontal(1), T.Normalize(0.5, 0.5)})
    close({{{1, -1}, {-0.2, -0.6}}}, tf(x))
    assert.truthy(tostring(tf):find("Compose(ScaleTo01(), RandomFlipHorizontal(p=1)", 1, true))
  end)

  it("rejects bad arguments", function()
    has(errmsg(T.RandomFlipHorizontal, 2), "p must be a number in [0, 1], got 2")
    has(errmsg(T.RandomCrop(8), img), "crop {8, 8} is larger than the padded image {3, 4}")
    has(errmsg(T.Normalize, {1, 2}, {1}), "mean has 2 values but std has 1")
  end)

  -- audit S7: Compose(t1, t2) was an empty Compose() that dropped both
  it("Compose takes a list of callables only", function()
    has(errmsg(T.Compose, T.ScaleTo01(), T.ToFloat()),
      "needle.data.transforms.Compose: expected a list of transforms: Compose({t1, t2}), got the transform ScaleTo01()")
    has(errmsg(T.Compose, T.ScaleTo01()), "expected a list of transforms: Compose({t1, t2})")
    has(errmsg(T.Compose, function(x) return x end), "expected a list of transforms: Compose({t1, t2}), got a function")
    has(errmsg(T.Compose), "expected a list of transforms: Compose({t1, t2}), got nil")
    has(errmsg(T.Compose, {T.ScaleTo01(), 5}), "item 2 is 5, expected a callable transform")
    has(errmsg(T.Compose, {T.ScaleTo01(), x = 1}), "expected a list of transforms (keys 1..1), got the key \"x\"")
    assert.are.equal("Compose()", tostring(T.Compose({})))
  end)

  -- audit S19: a NaN or infinite mean or std was taken (std = 0 was refused)
  it("Normalize refuses a mean or std that is not finite", function()
    has(errmsg(T.Normalize, 0, 0 / 0), "needle.data.transforms.Normalize: std must be finite, got nan")
    has(errmsg(T.Normalize, 1 / 0, 1), "mean must be finite, got inf")
    has(errmsg(T.Normalize, {0, 0 / 0}, {1, 1}), "mean[2] must be finite")
    has(errmsg(T.Normalize, {0, 0}, {1, -1 / 0}), "std[2] must be finite, got -inf")
    has(errmsg(T.Normalize, 0, 0), "std[1] is 0")
  end)

  it("the transforms refuse extra arguments, naming the accepted form", function()
    has(errmsg(T.Normalize, 0, 1, {inplace = true}),
      "needle.data.transforms.Normalize: takes Normalize(mean, std) only, got an extra argument #3: a table")
    has(errmsg(T.ToFloat, 5), "needle.data.transforms.ToFloat: takes ToFloat() only, got an extra argument #1: 5")
    has(errmsg(T.ScaleTo01, "x"), "takes ScaleTo01() only, got an extra argument #1: \"x\"")
    has(errmsg(T.RandomCrop, 3, {}, 1), "takes RandomCrop(size[, opts]) only, got an extra argument #3: 1")
    has(errmsg(T.RandomFlipHorizontal, 0.5, 1), "takes RandomFlipHorizontal([p]) only")
    has(errmsg(T.Lambda, print, 1), "takes Lambda(fn) only")
  end)
end)

---------------------------------------------------------------------------
-- IDX (MNIST)
---------------------------------------------------------------------------

local function idx_images(n, rows, cols, bytes)
  return string.pack(">I4I4I4I4", 2051, n, rows, cols) .. string.char(table.unpack(bytes))
end
local function idx_labels(labels)
  return string.pack(">I4I4", 2049, #labels) .. string.char(table.unpack(labels))
end

describe("mnist (IDX reader)", function()
  local mnist = data.mnist
  local dir
  local img_bytes = {0, 1, 2, 3, 10, 20, 30, 40, 255, 254, 253, 252}   -- 3 images of 2x2
  local labels = {0, 9, 4}

  before_each(function()
    dir = tempdir()
    S.write_file(dir .. "/train-images-idx3-ubyte", idx_images(3, 2, 2, img_bytes))
    S.write_file(dir .. "/train-labels-idx1-ubyte", idx_labels(labels))
    -- the test split gzip-compressed, by the gzip tool
    S.write_file(dir .. "/t10k-images-idx3-ubyte", idx_images(2, 2, 2, {5, 6, 7, 8, 9, 10, 11, 12}))
    S.write_file(dir .. "/t10k-labels-idx1-ubyte", idx_labels({3, 7}))
    assert.is_true(os.execute("gzip " .. S.q(dir .. "/t10k-images-idx3-ubyte") .. " " ..
      S.q(dir .. "/t10k-labels-idx1-ubyte")))
  end)
  after_each(function() rmdir(dir) end)

  it("reads plain files: uint8 (N, rows, cols) raw and labels + 1", function()
    local x, y = mnist.load(dir, {raw = true})
    assert.are.equal("uint8", x.dtype)
    assert.are.same({{{0, 1}, {2, 3}}, {{10, 20}, {30, 40}}, {{255, 254}, {253, 252}}}, x:totable())
    assert.are.equal("int64", y.dtype)
    assert.are.same({1, 10, 5}, y:totable())
  end)

  it("gives float (N, 1, rows, cols) / 255 by default", function()
    local x = mnist.load(dir)
    assert.are.equal("float32", x.dtype)
    assert.are.same({3, 1, 2, 2}, x.shape)
    assert.is_true(math.abs(x[3][1][1][1]:item() - 1) < 1e-7)
    assert.is_true(math.abs(x[2][1][1][2]:item() - 20 / 255) < 1e-7)
  end)

  it("reads gzip files (the test split)", function()
    assert.is_false(S.exists(dir .. "/t10k-images-idx3-ubyte"))
    local x, y = mnist.load(dir, {train = false, raw = true})
    assert.are.same({{{5, 6}, {7, 8}}, {{9, 10}, {11, 12}}}, x:totable())
    assert.are.same({4, 8}, y:totable())
    assert.are.same({4, 8}, mnist.read_labels(dir .. "/t10k-labels-idx1-ubyte.gz"):totable())
  end)

  it("dataset() is a TensorDataset of (image, label)", function()
    local ds = mnist.dataset(dir, {transform = function(x) return x * 255 end})
    assert.are.equal(3, #ds)
    local item = ds[2]
    assert.are.same({{{10, 20}, {30, 40}}}, item[1]:round():totable())
    assert.are.equal(10, item[2]:item())
  end)

  it("a missing directory says where it looked and how to get Fashion-MNIST", function()
    local msg = errmsg(mnist.load, dir .. "/nope")
    has(msg, "needle.data.mnist: no MNIST data: directory '" .. dir .. "/nope' does not exist")
    has(msg, "dataset-fashion-mnist")
    has(msg, "/usr/share/datasets/fashion-mnist")
  end)

  it("a missing file is named with the names tried", function()
    os.remove(dir .. "/train-labels-idx1-ubyte")
    local msg = errmsg(mnist.load, dir)
    has(msg, "no training labels file in '" .. dir .. "'")
    has(msg, "train-labels-idx1-ubyte, train-labels-idx1-ubyte.gz")
  end)

  it("truncated data names the file and the sizes", function()
    local p = dir .. "/train-images-idx3-ubyte"
    S.write_file(p, idx_images(3, 2, 2, img_bytes):sub(1, -3))
    has(errmsg(mnist.load, dir), "needle.data.mnist: '" .. p .. "': truncated: the header gives shape {3,2,2} " ..
      "(12 bytes of data) but only 10 bytes follow the 16-byte header")
  end)

  it("extra bytes, a truncated header and an empty file are errors naming the file", function()
    local p = dir .. "/train-images-idx3-ubyte"
    S.write_file(p, idx_images(3, 2, 2, img_bytes) .. "xy")
    has(errmsg(mnist.load, dir), "'" .. p .. "': the header gives shape {3,2,2} (12 bytes of data) but 14 bytes follow")
    S.write_file(p, idx_images(3, 2, 2, img_bytes):sub(1, 10))
    has(errmsg(mnist.load, dir), "'" .. p .. "': truncated IDX header: 3 dimensions need a 16-byte header, the file has 10 bytes")
    S.write_file(p, "")
    has(errmsg(mnist.load, dir), "'" .. p .. "': truncated IDX header: the file has 0 bytes")
  end)

  it("a wrong magic number names the file, the number and what it is", function()
    local p = dir .. "/train-images-idx3-ubyte"
    S.write_file(p, idx_labels(labels))   -- a label file where images belong
    local msg = errmsg(mnist.load, dir)
    has(msg, "'" .. p .. "': bad magic number 2049 (0x00000801), expected 2051 (0x00000803) for IDX image file")
    has(msg, "this is an IDX label file")
    S.write_file(p, "GIF89a" .. string.rep("\0", 40))
    has(errmsg(mnist.load, dir), "'" .. p .. "': bad magic number")
  end)

  it("a corrupt or truncated gzip file names the file", function()
    local p = dir .. "/t10k-images-idx3-ubyte.gz"
    local gz = S.read_file(p)
    S.write_file(p, gz:sub(1, #gz - 12))
    local msg = errmsg(mnist.load, dir, {train = false})
    has(msg, "needle.data.mnist:")
    has(msg, p)
    has(msg, "truncated gzip stream")
    S.write_file(p, gz:sub(1, -9) .. "\1\2\3\4" .. gz:sub(-4))   -- a wrong CRC
    msg = errmsg(mnist.load, dir, {train = false})
    has(msg, p)
    has(msg, "corrupt gzip stream")
  end)

  it("images and labels of different counts are an error naming both files", function()
    S.write_file(dir .. "/train-labels-idx1-ubyte", idx_labels({1, 2}))
    has(errmsg(mnist.load, dir), "has 3 images but '" .. dir .. "/train-labels-idx1-ubyte' has 2 labels")
  end)

  local fashion = mnist.FASHION_DIR .. "/t10k-labels-idx1-ubyte.gz"
  if S.exists(fashion) then
    it("reads Debian's Fashion-MNIST (dataset-fashion-mnist)", function()
      local x, y = mnist.fashion({train = false})
      assert.are.same({10000, 1, 28, 28}, x.shape)
      assert.are.same({10000}, y.shape)
      -- PyTorch's first ten test labels are 9 2 1 1 6 1 4 6 5 7
      assert.are.same({10, 3, 2, 2, 7, 2, 5, 7, 6, 8}, y:narrow(1, 1, 10):totable())
      assert.are.equal(1, y:min():item())
      assert.are.equal(10, y:max():item())
    end)
  else
    pending("Fashion-MNIST: apt-get install dataset-fashion-mnist to read the real files")
  end
end)

---------------------------------------------------------------------------
-- CIFAR-10
---------------------------------------------------------------------------

describe("cifar10", function()
  local cifar = data.cifar10
  local dir
  before_each(function() dir = tempdir() end)
  after_each(function() rmdir(dir) end)

  local function record(label, fill)
    local px = {}
    for i = 1, 3072 do px[i] = fill(i) end
    local parts = {string.char(label)}
    for k = 1, 3072, 1024 do parts[#parts + 1] = string.char(table.unpack(px, k, k + 1023)) end
    return table.concat(parts)
  end

  it("reads 3073-byte records as CHW uint8 images and 1-based labels", function()
    local p = dir .. "/test_batch.bin"
    S.write_file(p, record(3, function(i) return (i - 1) % 256 end) .. record(9, function(i) return (i * 7) % 256 end))
    local x, y = cifar.read_batch(p)
    assert.are.same({2, 3, 32, 32}, x.shape)
    assert.are.equal("uint8", x.dtype)
    assert.are.same({4, 10}, y:totable())
    -- record 1: byte i of the 3072 is channel (i-1)//1024, row ((i-1)%1024)//32, column (i-1)%32
    local i = 1024 + 5 * 32 + 7 + 1
    assert.are.equal((i - 1) % 256, x[1][2][6][8]:item())
    assert.are.equal((3072 * 7) % 256, x[2][3][32][32]:item())
    local xf, yf = cifar.load(dir, {train = false})
    assert.are.equal("float32", xf.dtype)
    assert.is_true(math.abs(xf[1][2][6][8]:item() - ((i - 1) % 256) / 255) < 1e-7)
    assert.are.same({4, 10}, yf:totable())
  end)

  it("synthetic() writes all six batches; load joins the five training ones", function()
    local paths = cifar.synthetic(dir, {n = 4})
    assert.are.equal(6, #paths)
    local x, y = cifar.load(dir, {raw = true})
    assert.are.same({20, 3, 32, 32}, x.shape)
    assert.are.same({20}, y.shape)
    assert.is_true(y:min():item() >= 1 and y:max():item() <= 10)
    local xt, yt = cifar.load(dir, {train = false})
    assert.are.same({4, 3, 32, 32}, xt.shape)
    -- the first training record straight from the file
    local s = S.read_file(dir .. "/data_batch_1.bin")
    assert.are.equal(s:byte(1) + 1, y[1]:item())
    assert.are.equal(s:byte(2 + 2048 + 31 * 32 + 31), x[1][3][32][32]:item())
    -- reproducible
    local dir2 = tempdir()
    cifar.synthetic(dir2, {n = 4})
    assert.are.equal(s, S.read_file(dir2 .. "/data_batch_1.bin"))
    rmdir(dir2)
    local ds = cifar.dataset(dir, {train = false})
    assert.are.equal(4, #ds)
  end)

  it("finds the batches in a cifar-10-batches-bin subdirectory", function()
    os.execute("mkdir " .. S.q(dir .. "/cifar-10-batches-bin"))
    cifar.synthetic(dir .. "/cifar-10-batches-bin", {n = 2})
    local x = cifar.load(dir, {train = false})
    assert.are.same({2, 3, 32, 32}, x.shape)
  end)

  it("truncated files, bad labels and missing files are errors naming the file", function()
    cifar.synthetic(dir, {n = 2})
    local p = dir .. "/data_batch_3.bin"
    local s = S.read_file(p)
    S.write_file(p, s:sub(1, -101))
    has(errmsg(cifar.load, dir), "needle.data.cifar10: '" .. p .. "': truncated or corrupt: 6046 bytes is not a " ..
      "whole number of 3073-byte records (1 records and 2973 bytes left over)")
    S.write_file(p, s:sub(1, 3073) .. "\10" .. s:sub(3075))
    has(errmsg(cifar.load, dir), "'" .. p .. "': record 2 has label byte 10 (expected 0..9)")
    os.remove(p)
    has(errmsg(cifar.load, dir), "'" .. p .. "' is missing")
    S.write_file(dir .. "/test_batch.bin", "")
    has(errmsg(cifar.load, dir, {train = false}), "'" .. dir .. "/test_batch.bin': empty file")
    local msg = errmsg(cifar.load, dir .. "/none")
    has(msg, "no CIFAR-10 data: directory '" .. dir .. "/none' does not exist")
    has(msg, "cifar-10-binary.tar.gz")
  end)
end)

---------------------------------------------------------------------------
-- PTB
---------------------------------------------------------------------------

describe("ptb", function()
  local ptb = data.ptb
  local dir
  before_each(function()
    dir = tempdir()
    S.write_file(dir .. "/train.txt", " a b c \nb  c\n\n")
    S.write_file(dir .. "/valid.txt", "c a\n")
    S.write_file(dir .. "/test.txt", "d")   -- no final newline
  end)
  after_each(function() rmdir(dir) end)

  it("Corpus: one dictionary, <eos> after every line (empty ones too), 1-based indices", function()
    local c = ptb.Corpus(dir)
    local d = c.dictionary
    assert.are.equal(5, #d)
    assert.are.same({"a", "b", "c", "<eos>", "d"}, d.idx2word)
    assert.are.equal(4, d.word2idx["<eos>"])
    assert.are.equal("int64", c.train.dtype)
    assert.are.same({1, 2, 3, 4, 2, 3, 4, 4}, c.train:totable())
    assert.are.same({3, 1, 4}, c.valid:totable())
    assert.are.same({5, 4}, c.test:totable())
  end)

  it("Corpus max_lines reads at most that many lines per file", function()
    local c = ptb.Corpus(dir, {max_lines = 1})
    assert.are.same({1, 2, 3, 4}, c.train:totable())
  end)

  it("Dictionary adds words once", function()
    local d = ptb.Dictionary()
    assert.are.equal(1, d:add_word("x"))
    assert.are.equal(2, d:add_word("y"))
    assert.are.equal(1, d:add_word("x"))
    assert.are.equal(2, #d)
    assert.are.equal("y", d:word(2))
    assert.are.equal(1, d:index("x"))
  end)

  it("a missing file or directory is named", function()
    os.remove(dir .. "/valid.txt")
    has(errmsg(ptb.Corpus, dir), "needle.data.ptb: cannot open '" .. dir .. "/valid.txt'")
    has(errmsg(ptb.Corpus, dir .. "/x"), "directory '" .. dir .. "/x' does not exist")
  end)

  it("batchify cuts the stream into bsz columns, as PyTorch's example", function()
    local src = ptb.batchify(nd.arange(1, 11), 3)   -- 10 tokens, the 10th dropped
    assert.are.same({3, 3}, src.shape)
    assert.are.same({{1, 4, 7}, {2, 5, 8}, {3, 6, 9}}, src:totable())
    assert.is_true(src:is_contiguous())
    assert.are.same({{1, 2}, {3, 4}}, ptb.batchify(nd.arange(1, 5), 1):reshape({2, 2}):totable())
    has(errmsg(ptb.batchify, nd.arange(1, 3), 5), "2 tokens do not fill one row of 5 columns")
  end)

  it("get_batch gives input rows i..i+seq_len-1 and the flattened next rows", function()
    local src = ptb.batchify(nd.arange(1, 11), 3)
    local x, y = ptb.get_batch(src, 1, 2)
    assert.are.same({{1, 4, 7}, {2, 5, 8}}, x:totable())
    assert.are.same({2, 5, 8, 3, 6, 9}, y:totable())
    x, y = ptb.get_batch(src, 2, 5)   -- seq_len = min(5, 3 - 2) = 1
    assert.are.same({{2, 5, 8}}, x:totable())
    assert.are.same({3, 6, 9}, y:totable())
    has(errmsg(ptb.get_batch, src, 3, 2), "row 3 out of range (expected 1..2 for a source of 3 rows")
  end)

  describe("data/ptb_synth", function()
    local stats = dofile("data/ptb_synth/stats.lua")

    it("reads with the vocabulary and token counts of stats.lua", function()
      local c = ptb.Corpus("data/ptb_synth")
      assert.are.equal(stats.vocab, #c.dictionary)
      assert.are.equal(stats.tokens.train, c.train:numel())
      assert.are.equal(stats.tokens.valid, c.valid:numel())
      assert.are.equal(stats.tokens.test, c.test:numel())
      local eos = c.dictionary.word2idx["<eos>"]
      assert.are.equal(stats.sentences.test, c.test:eq(eos):sum():item())
      assert.is_true(stats.tokens.train >= 100000 and stats.tokens.test >= 10000)
      assert.is_true(stats.best_test_ppl > 1 and stats.best_test_ppl < stats.trigram_test_ppl)
      local src = ptb.batchify(c.train, 20)
      assert.are.same({stats.tokens.train // 20, 20}, src.shape)
    end)

    it("stays under 1 MB", function()
      local total = 0
      for _, f in ipairs({"train.txt", "valid.txt", "test.txt", "README.md", "stats.lua"}) do
        total = total + #S.read_file("data/ptb_synth/" .. f)
      end
      assert.is_true(total < 1000000, "total " .. total)
    end)

    it("is reproducible: scripts/gen_corpus.lua --out DIR writes identical files", function()
      local exe = S.needle_lua()
      local out = tempdir()
      local ok = os.execute(S.q(exe) .. " scripts/gen_corpus.lua --quiet --out " .. S.q(out .. "/c"))
      assert.is_true(ok)
      for _, f in ipairs({"train.txt", "valid.txt", "test.txt", "README.md", "stats.lua"}) do
        local a, b = S.read_file("data/ptb_synth/" .. f), S.read_file(out .. "/c/" .. f)
        assert.truthy(b, f .. " was not written")
        assert.is_true(a == b, f .. " differs")
      end
      rmdir(out)
    end)
  end)
end)

---------------------------------------------------------------------------
-- issue 20: Subset, ConcatDataset, random_split, samplers, batch_sampler
---------------------------------------------------------------------------

local FIX = dofile("spec/fixtures/torch_data.lua")
local function cases(name)
  local out = {}
  for _, c in ipairs(FIX) do
    if c.name == name then out[#out + 1] = c end
  end
  assert.is_true(#out > 0, name)
  return out
end

-- a list dataset of the values v (items are the values themselves)
local function values_ds(list) return data.DataLoader._wrap_dataset(list) end

describe("Subset and ConcatDataset", function()
  it("Subset(ds, indices) gives ds[indices[k]], as torch.utils.data.Subset", function()
    for _, c in ipairs(cases("Subset")) do
      local sub = data.Subset(values_ds(c.data), c.indices)
      assert.are.equal(#c.items, #sub)
      for k, v in ipairs(c.items) do assert.are.equal(v, sub[k]) end
    end
    local sub = data.Subset(range_ds(5), i64({5, 2}))
    assert.are.same({5}, sub[1][2]:totable() == nil and {} or {sub[1][2]:item()})
    assert.are.equal(2, sub:get(2)[2]:item())
  end)

  it("ConcatDataset's cumulative sizes and item positions are PyTorch's", function()
    for _, c in ipairs(cases("ConcatDataset")) do
      local parts = {}
      for d, n in ipairs(c.sizes) do
        local items = {}
        for j = 1, n do items[j] = {d, j} end
        parts[d] = values_ds(items)
      end
      local cd = data.ConcatDataset(parts)
      assert.are.same(c.cumulative_sizes, cd.cumulative_sizes)
      assert.are.equal(#c.items, #cd)
      for i, want in ipairs(c.items) do assert.are.same(want, cd[i]) end
    end
  end)

  it("ds1 + ds2 is their ConcatDataset; both batch through a DataLoader", function()
    local cd = range_ds(3) + range_ds(2)
    assert.are.equal("ConcatDataset", getmetatable(cd).class.__name)
    assert.are.same({1, 2, 3, 1, 2}, labels_of(data.DataLoader(cd, {batch_size = 2})))
    local sub = data.Subset(cd, {5, 1})
    assert.are.same({2, 1}, labels_of(data.DataLoader(sub, {batch_size = 2})))
  end)

  it("reject bad indices and datasets with messages naming them", function()
    has(errmsg(data.Subset, range_ds(3), {1, 4}),
        "needle.data.Subset: indices[2] = 4 is out of range for a dataset of 3 items (expected 1..3)")
    has(errmsg(data.Subset, range_ds(3), {1, 1.5}), "needle.data.Subset: indices[2] is 1.5, expected an integer")
    has(errmsg(data.Subset, range_ds(3), nd.zeros({2})), "indices must be a 1-D integer tensor or a Lua list, got a float32 tensor of shape {2}")
    has(errmsg(data.Subset, 7, {1}), "needle.data.Subset: the dataset is 7, expected a dataset (with len and get) or a Lua list of items")
    assert.are.same({"c", "a"}, {data.Subset({"a", "b", "c"}, {3, 1})[1], data.Subset({"a", "b", "c"}, {3, 1})[2]})
    has(errmsg(function() return data.Subset(range_ds(3), {2})[2] end), "needle.data.Subset: index 2 out of range (expected 1..1)")
    has(errmsg(data.ConcatDataset, {}), "needle.data.ConcatDataset: datasets must not be empty")
    has(errmsg(data.ConcatDataset, {range_ds(2), 5}), "needle.data.ConcatDataset: datasets[2] is 5, expected a dataset")
    assert.are.equal("y", data.ConcatDataset({{"x"}, {"y"}})[2])
    has(errmsg(function() return data.ConcatDataset({range_ds(2)})[3] end), "index 3 out of range (expected 1..2)")
  end)
end)

describe("random_split", function()
  it("splits fractions with PyTorch's rounding rule and counts as given", function()
    for _, c in ipairs(cases("random_split")) do
      local parts = {data.random_split(values_ds(c.n > 0 and nd.arange(1, c.n + 1):totable() or {}), c.lengths,
                                       {generator_seed = 1})}
      local sizes = {}
      for k, p in ipairs(parts) do sizes[k] = #p end
      assert.are.same(c.sizes, sizes, ("n = %d, lengths %s"):format(c.n, table.concat(c.lengths, ",")))
    end
  end)

  it("the splits are disjoint and cover the dataset; generator_seed fixes them and leaves nd.rand alone", function()
    local ds = range_ds(23)
    nd.manual_seed(4)
    local a, b, c = data.random_split(ds, {0.5, 0.3, 0.2}, {generator_seed = 7})
    local after = nd.rand({3})
    nd.manual_seed(4)
    assert.is_true(nd.equal(after, nd.rand({3})))
    local seen = {}
    for _, part in ipairs({a, b, c}) do
      for k = 1, #part do
        local v = part[k][2]:item()
        assert.is_nil(seen[v])
        seen[v] = true
      end
    end
    for v = 1, 23 do assert.is_true(seen[v], v) end
    local a2 = data.random_split(ds, {0.5, 0.3, 0.2}, {generator_seed = 7})
    assert.are.same(a.indices, a2.indices)
    local a3 = data.random_split(ds, {0.5, 0.3, 0.2}, {generator_seed = 8})
    assert.are_not.same(a.indices, a3.indices)
    -- without a seed: the global stream, reproducible with nd.manual_seed
    nd.manual_seed(11)
    local g1 = data.random_split(ds, {20, 3})
    nd.manual_seed(11)
    local g2 = data.random_split(ds, {20, 3})
    assert.are.same(g1.indices, g2.indices)
  end)

  it("rejects lengths that do not fit, naming them", function()
    has(errmsg(data.random_split, range_ds(5), {3, 3}), "needle.data.random_split: the lengths sum to 6 but the dataset has 5 items")
    has(errmsg(data.random_split, range_ds(5), {1.5, -0.5}), "fraction lengths[1] = 1.5 is not between 0 and 1")
    has(errmsg(data.random_split, range_ds(5), {0 / 0, 1}), "lengths[1] is")
    has(errmsg(data.transforms.RandomFlipHorizontal, 0 / 0), "p must be a number in [0, 1]")
    has(errmsg(data.random_split, range_ds(5), {2.5, 2.5}), "lengths[1] = 2.5: counts must be non-negative integers")
    has(errmsg(data.random_split, range_ds(5), {}), "lengths must be a non-empty Lua list")
    has(errmsg(data.random_split, range_ds(5), {5}, {seed = 1}), "unknown option 'seed' (valid: generator_seed)")
  end)
end)

describe("samplers", function()
  it("SequentialSampler gives 1..n", function()
    local s = data.SequentialSampler(range_ds(4))
    assert.are.same({1, 2, 3, 4}, s:indices():totable())
    assert.are.equal(4, #s)
  end)

  it("RandomSampler: a permutation per epoch, reproducible by seed, the global stream untouched", function()
    local s = data.RandomSampler(range_ds(9), {seed = 3})
    nd.manual_seed(1)
    local e1, e2 = s:indices(1), s:indices(2)
    local after = nd.rand({2})
    nd.manual_seed(1)
    assert.is_true(nd.equal(after, nd.rand({2})))
    assert.are.same(nd.arange(1, 10):totable(), e1:sort():totable())
    assert.is_false(nd.equal(e1, e2))
    assert.is_true(nd.equal(e1, data.RandomSampler(range_ds(9), {seed = 3}):indices(1)))
    -- set_epoch picks indices()'s default epoch
    s:set_epoch(2)
    assert.is_true(nd.equal(e2, s:indices()))
    -- without a seed: drawn at construction from the global generator
    nd.manual_seed(5)
    local u = data.RandomSampler(range_ds(9)):indices(0)
    nd.manual_seed(5)
    assert.is_true(nd.equal(u, data.RandomSampler(range_ds(9)):indices(0)))
  end)

  it("RandomSampler's lengths and index counts are PyTorch's (replacement, num_samples)", function()
    for _, c in ipairs(cases("RandomSampler")) do
      local s = data.RandomSampler(c.n, {replacement = c.replacement, num_samples = c.num_samples, seed = 2})
      assert.are.equal(c.len, #s)
      local idx = s:indices(0)
      assert.are.equal(c.len, idx:numel())
      assert.is_true(idx:min():item() >= 1 and idx:max():item() <= c.n)
      if c.sorted_counts then
        local counts = nd.bincount(idx, {minlength = c.n}):sort():totable()
        assert.are.same(c.sorted_counts, counts)
      end
    end
  end)

  it("RandomSampler with replacement draws every index about equally often", function()
    local idx = data.RandomSampler(4, {replacement = true, num_samples = 8000, seed = 9}):indices(0)
    local counts = nd.bincount(idx, {minlength = 4}):totable()
    for i = 1, 4 do assert.is_true(math.abs(counts[i] - 2000) < 200, tostring(counts[i])) end
  end)

  it("WeightedRandomSampler draws in proportion to the weights (and without replacement, distinct indices)", function()
    local w = {0.1, 0, 0.6, 0.3}
    local s = data.WeightedRandomSampler(w, 20000, {seed = 4})
    local counts = nd.bincount(s:indices(0), {minlength = 4}):totable()
    assert.are.equal(0, counts[2])
    for i, p in ipairs(w) do
      -- 4 standard deviations of a binomial count
      local sd = math.sqrt(20000 * p * (1 - p))
      assert.is_true(math.abs(counts[i] - 20000 * p) <= 4 * sd + 1, ("%d: %d"):format(i, counts[i]))
    end
    for _, c in ipairs(cases("WeightedRandomSampler")) do
      local ws = data.WeightedRandomSampler(c.weights, c.num_samples, {replacement = c.replacement, seed = 1})
      assert.are.equal(c.len, #ws)
      local got = ws:indices(0)
      if c.distinct then assert.are.equal(c.distinct, got:unique():numel()) end
      local support = {}
      for _, i in ipairs(c.support) do support[i] = true end
      for _, i in ipairs(got:totable()) do assert.is_true(support[i], i) end
    end
    -- reproducible by seed and epoch
    assert.is_true(nd.equal(s:indices(3), data.WeightedRandomSampler(w, 20000, {seed = 4}):indices(3)))
    assert.is_false(nd.equal(s:indices(3), s:indices(4)))
  end)

  it("BatchSampler's batches are PyTorch's", function()
    for _, c in ipairs(cases("BatchSampler")) do
      local b = data.BatchSampler(data.SequentialSampler(c.n), c.batch_size, c.drop_last)
      assert.are.equal(c.len, #b)
      assert.are.same(c.batches, b:batches())
    end
    for _, c in ipairs(cases("BatchSampler_order")) do
      local b = data.BatchSampler(c.order, c.batch_size, c.drop_last)
      assert.are.equal(c.len, #b)
      assert.are.same(c.batches, b:batches())
      assert.are.same(c.batches, data.BatchSampler(i64(c.order), c.batch_size, c.drop_last):batches())
    end
  end)

  it("reject bad arguments, naming them", function()
    has(errmsg(data.RandomSampler, range_ds(3), {num_samples = 0}),
        "needle.data.RandomSampler: num_samples must be a positive integer, got 0")
    has(errmsg(data.RandomSampler, {}), "num_samples must be a positive integer, got 0 (the data source is empty)")
    has(errmsg(data.RandomSampler, range_ds(3), {replacement = 1}), "option 'replacement' must be a boolean, got 1")
    has(errmsg(data.WeightedRandomSampler, {1, -2}, 3), "needle.data.WeightedRandomSampler: weights must be >= 0, got -2 at index 2")
    has(errmsg(data.WeightedRandomSampler, {1, 0 / 0}, 3), "weights must be finite, got")
    has(errmsg(data.WeightedRandomSampler, {0, 0}, 3), "weights sum to 0")
    has(errmsg(data.WeightedRandomSampler, nd.ones({2, 2}), 3), "weights must be 1-D (one weight per item), got shape {2,2}")
    has(errmsg(data.WeightedRandomSampler, {1, 0, 1}, 3, {replacement = false}),
        "cannot draw 3 samples without replacement: only 2 of the 3 weights are positive")
    has(errmsg(data.WeightedRandomSampler, {1, 2}, 0), "num_samples must be a positive integer, got 0")
    has(errmsg(data.BatchSampler, data.SequentialSampler(3), 0, false), "needle.data.BatchSampler: batch_size must be a positive integer, got 0")
    has(errmsg(data.BatchSampler, data.SequentialSampler(3), 2), "drop_last must be a boolean, got nil")
    has(errmsg(data.BatchSampler, nd.zeros({3}), 2, false), "sampler must be a sampler (with len() and indices(epoch)), a Lua list of indices or a 1-D integer tensor, got a float32 tensor of shape {3}")
    -- audit S17: a list of indices is checked when the sampler is made
    has(errmsg(data.BatchSampler, {1, 2.5}, 2, false),
      "needle.data.BatchSampler: sampler[2] is 2.5, expected a positive integer (a 1-based item number)")
    has(errmsg(data.BatchSampler, {0, -3}, 2, false), "sampler[1] is 0, expected a positive integer")
    has(errmsg(data.BatchSampler, {1, "2"}, 2, false), "sampler[2] is \"2\", expected a positive integer")
    has(errmsg(data.BatchSampler, i64({2, 0}), 2, false), "sampler's indices must be positive (1-based item numbers), got 0")
    assert.are.same({{1, 2}, {3}}, data.BatchSampler({1, 2.0, 3}, 2, false):batches())
    assert.are.equal("integer", math.type(data.BatchSampler({2.0}, 1, false):batches()[1][1]))
    has(errmsg(data.BatchSampler, {1, 2}, 2, false, 5),
      "needle.data.BatchSampler: takes BatchSampler(sampler, batch_size, drop_last) only, got an extra argument #4: 5")
    has(errmsg(data.RandomSampler, 3, {}, 1), "takes RandomSampler(data_source[, opts]) only")
    -- epochs are integers >= 0 everywhere
    local rs = data.RandomSampler(4, {seed = 1})
    has(errmsg(function() rs:set_epoch(-1) end), "needle.data.RandomSampler: set_epoch: epoch must be an integer >= 0, got -1")
    has(errmsg(function() rs:indices(2.5) end), "indices: epoch must be an integer >= 0, got 2.5")
    has(errmsg(function() data.DistributedSampler(4, {num_replicas = 1, rank = 0}):set_epoch(-2) end),
      "needle.data.DistributedSampler: set_epoch: epoch must be an integer >= 0, got -2")
  end)
end)

describe("DataLoader with samplers", function()
  it("batch_sampler gives the batches; the loader's epochs reach a random sampler", function()
    local bsm = data.BatchSampler(data.RandomSampler(range_ds(10), {seed = 6}), 4, false)
    local loader = data.DataLoader(range_ds(10), {batch_sampler = bsm})
    assert.are.equal(3, #loader)
    local got, want = {}, {}
    for _, y in loader:iter() do got[#got + 1] = y:totable() end
    for _, b in ipairs(bsm:batches(1)) do want[#want + 1] = b end
    assert.are.same(want, got)
    -- the second epoch is the sampler's epoch 2
    got = {}
    for _, y in loader:iter() do got[#got + 1] = y:totable() end
    assert.are.same(bsm:batches(2), got)
    -- a generic dataset (item by item) with a batch sampler
    local list = {{s = "a"}, {s = "b"}, {s = "c"}, {s = "d"}, {s = "e"}}
    local out = {}
    for batch in data.DataLoader(list, {batch_sampler = data.BatchSampler({5, 1, 3}, 2, false)}):iter() do
      out[#out + 1] = table.concat(batch.s, "")
    end
    assert.are.same({"ea", "c"}, out)
  end)

  it("sampler = RandomSampler / WeightedRandomSampler picks the items", function()
    local sm = data.RandomSampler(range_ds(7), {seed = 2})
    local loader = data.DataLoader(range_ds(7), {batch_size = 3, sampler = sm})
    assert.are.same(sm:indices(1):totable(), labels_of(loader))
    local ws = data.WeightedRandomSampler({0, 1, 0, 0, 0, 0, 0}, 5)
    assert.are.same({2, 2, 2, 2, 2}, labels_of(data.DataLoader(range_ds(7), {batch_size = 2, sampler = ws})))
  end)

  it("rejects batch_sampler with batch_size, shuffle, sampler or drop_last, and the worker options without workers", function()
    local bsm = data.BatchSampler({1, 2}, 1, false)
    for _, o in ipairs({{batch_size = 2}, {shuffle = true}, {sampler = data.SequentialSampler(2)}, {drop_last = true}}) do
      o.batch_sampler = bsm
      has(errmsg(data.DataLoader, range_ds(2), o),
          "needle.data.DataLoader: batch_sampler excludes batch_size, shuffle, sampler and drop_last")
    end
    has(errmsg(data.DataLoader, range_ds(2), {batch_sampler = {}}), "batch_sampler must have len() and iter(epoch) methods")
    has(errmsg(data.DataLoader, range_ds(2), {prefetch_factor = 2}), "prefetch_factor needs num_workers > 0")
    has(errmsg(data.DataLoader, range_ds(2), {persistent_workers = true}), "persistent_workers needs num_workers > 0")
    has(errmsg(data.DataLoader, range_ds(2), {num_workers = -1}), "num_workers must be in 0..256, got -1")
    has(errmsg(data.DataLoader, range_ds(2), {num_workers = 1, prefetch_factor = 0}), "prefetch_factor must be 1..1048576, got 0")
    has(errmsg(data.DataLoader, range_ds(2), {num_workers = 1, prefetch_factor = 1 << 40}),
        "prefetch_factor must be 1..1048576, got 1099511627776")
    has(errmsg(data.DataLoader, range_ds(2), {timeout = -1}), "timeout must be >= 0")
    has(errmsg(data.DataLoader, range_ds(2), {collate_fn = {fn = "x"}}), "collate_fn must be a function or a recipe")
  end)

  it("collate_fn may name a module's function ({module =, fn =})", function()
    local loader = data.DataLoader(range_ds(4), {batch_size = 2, collate_fn = {module = "needle.data.dataloader",
                                                                            fn = "default_collate"}})
    local out = {}
    for batch in loader:iter() do out[#out + 1] = batch[2]:totable() end
    assert.are.same({{1, 2}, {3, 4}}, out)
  end)
end)

describe("the data tools on every device", function()
  local D = require "spec.helpers.devices"
  for _, dev in ipairs(D.all()) do
    it("Subset / ConcatDataset / samplers batch a dataset on " .. D.describe(dev), function()
      local x = (nd.arange(1, 13):reshape({6, 2}):float()):to(dev)
      local y = nd.arange(1, 7):to(dev)
      local ds = data.TensorDataset(x, y)
      local sub = data.Subset(ds, {6, 2, 4})
      local out = {}
      for xb, yb in data.DataLoader(sub, {batch_size = 2}):iter() do
        assert.are.equal(dev, xb.device)
        for _, v in ipairs(yb:cpu():totable()) do out[#out + 1] = v end
      end
      assert.are.same({6, 2, 4}, out)
      local bsm = data.BatchSampler(data.RandomSampler(ds, {seed = 1}), 4, false)
      local seen = {}
      for xb, yb in data.DataLoader(ds, {batch_sampler = bsm}):iter() do
        assert.are.equal(dev, xb.device)
        local xs, ys = xb:cpu():totable(), yb:cpu():totable()
        for k, v in ipairs(ys) do
          seen[#seen + 1] = v
          assert.are.same({2 * v - 1, 2 * v}, xs[k])
        end
      end
      table.sort(seen)
      assert.are.same({1, 2, 3, 4, 5, 6}, seen)
      local a, b = data.random_split(ds + ds, {0.5, 0.5}, {generator_seed = 3})
      assert.are.equal(6, #a + #b - 6)
      assert.are.equal(dev, a[1][1].device)
    end)
  end
end)
