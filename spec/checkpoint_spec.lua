-- checkpoint_spec.lua - needle.checkpoint: a model, an optimizer and a
-- scheduler (any objects with state_dict/load_state_dict), the step, extra
-- values and the RNG state in one safetensors file; exact round trips of
-- nested state (integer vs string keys, integers vs floats), all-or-nothing
-- loading, and errors that name the file and the problem. Also the JSON
-- codec the state is stored with.
local nd = require "needle"
local S = require "spec.helpers.shell"
local checkpoint = require "needle.checkpoint"
local json = checkpoint.json
local Module = nd.nn.Module

-- a small two-layer model, defined here (the model zoo is written elsewhere)
local TwoLayer = Module:extend("TwoLayer")
function TwoLayer:init(i, h, o)
  self.fc1_weight = Module.Parameter(nd.randn({h, i}))
  self.fc1_bias = Module.Parameter(nd.zeros({h}))
  self.fc2_weight = Module.Parameter(nd.randn({o, h}))
  self:register_buffer("steps", nd.zeros({}, {dtype = "int64"}))
end
function TwoLayer:forward(x)
  return (x:matmul(self.fc1_weight:t()) + self.fc1_bias):relu():matmul(self.fc2_weight:t())
end

local Wrapper = Module:extend("Wrapper")
function Wrapper:init(i, h, o) self.body = TwoLayer(i, h, o) end
function Wrapper:forward(x) return self.body(x) end

-- an optimizer-like object: nested state with integer keys (parameter
-- indices), tensors, integers, floats, booleans, strings
local FakeOpt = {}
FakeOpt.__index = FakeOpt
local function fake_opt(params)
  local o = setmetatable({}, FakeOpt)
  o.state = {}
  for i, p in ipairs(params) do
    o.state[i] = {step = i * 10, exp_avg = nd.randn(p.shape), exp_avg_sq = nd.rand(p.shape)}
  end
  o.param_groups = {{lr = 0.001, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.0, amsgrad = false,
                     params = {1, 2, 3}, name = "main"}}
  return o
end
function FakeOpt:state_dict() return {state = self.state, param_groups = self.param_groups} end
function FakeOpt:load_state_dict(sd)
  assert(type(sd.state) == "table" and type(sd.param_groups) == "table", "FakeOpt: bad state")
  self.state, self.param_groups = sd.state, sd.param_groups
end

local FakeSched = {}
FakeSched.__index = FakeSched
function FakeSched:state_dict() return {last_epoch = self.last_epoch, base_lrs = self.base_lrs, gamma = self.gamma} end
function FakeSched:load_state_dict(sd) self.last_epoch, self.base_lrs, self.gamma = sd.last_epoch, sd.base_lrs, sd.gamma end
local function fake_sched() return setmetatable({last_epoch = 7, base_lrs = {0.1}, gamma = 0.5}, FakeSched) end

local function bytes_of(module)
  local out = {}
  for name, t in pairs(module:state_dict()) do out[name] = t:tobytes() end
  return out
end

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local dir
setup(function()
  dir = S.shell_line("mktemp -d \"${TMPDIR:-/tmp}/needle-checkpoint-spec.XXXXXX\"")
  assert(dir and dir:match("needle%-checkpoint%-spec"), "mktemp failed")
end)
teardown(function()
  if dir and dir:match("needle%-checkpoint%-spec") then os.execute("rm -rf " .. S.q(dir)) end
end)
local function tmp(name) return dir .. "/" .. name end

describe("checkpoint JSON", function()
  it("round-trips integers and floats exactly and keeps them apart", function()
    for _, v in ipairs({0, -1, 42, math.maxinteger, math.mininteger, 0.0, -0.0, 0.1, 1 / 3, 1e-310, 1.7976931348623157e308,
                        3.0, -2.5e-7}) do
      local back = json.decode(json.encode(v))
      assert.are.equal(math.type(v), math.type(back))
      assert.are.equal(v, back)
      if v == 0 and math.type(v) == "float" then assert.are.equal(1 / v, 1 / back) end
    end
  end)

  it("round-trips strings, booleans, arrays and objects", function()
    local v = {s = "quote\" back\\ tab\t nl\n ctl\1 é 🙂", b = true, f = false, list = {1, "two", {x = 3.5}},
               empty = json.array(), nested = {a = {b = {c = "d"}}}}
    local back = json.decode(json.encode(v))
    assert.are.same(v.s, back.s)
    assert.are.same(v.list, back.list)
    assert.are.same(v.nested, back.nested)
    assert.is_true(back.b)
    assert.is_false(back.f)
    assert.are.equal(0, #back.empty)
    assert.are.equal(json.encode(v), json.encode(back))
  end)

  it("is strict", function()
    for _, bad in ipairs({"", "01", "1.", ".5", "1e", "+1", "[1,]", '{"a":1,}', '{"a":1,"a":2}', "nul", "NaN",
                          '"\\ud800"', '"\\x"', '"a', "[1] 2", "9223372036854775808", '{"a" 1}'}) do
      assert.matches("^json: ", err_of(json.decode, bad))
    end
    assert.matches("NaN, which JSON cannot hold", err_of(json.encode, {x = 0 / 0}), 1, true)
    assert.matches("string keys", err_of(json.encode, {[1.5] = 1}), 1, true)
    assert.matches("not valid UTF-8", err_of(json.encode, "\255"), 1, true)
  end)
end)

describe("nd.checkpoint", function()
  it("round-trips a model, an optimizer, a scheduler, the step, extra values and the RNG state", function()
    nd.manual_seed(123)
    local model = Wrapper(3, 5, 2)
    local opt = fake_opt(model:parameters())
    local sched = fake_sched()
    local extra = {best_loss = 0.3125, history = {1.5, 2.0, 0.25}, name = "run-1", done = false,
                   counts = {[1] = "int key", ["1"] = "string key"}, big = math.maxinteger,
                   inf = math.huge, ninf = -math.huge, mask = nd.tensor({true, false})}
    local p = tmp("ckpt.safetensors")
    nd.rand({7}) -- move the RNG along
    checkpoint.save(p, {model = model, optimizer = opt, scheduler = sched, step = 1234, extra = extra})
    local expected_rand = nd.rand({5}):tobytes()

    nd.manual_seed(999)
    local model2 = Wrapper(3, 5, 2)
    local opt2 = setmetatable({state = {}, param_groups = {}}, FakeOpt)
    local sched2 = setmetatable({}, FakeSched)
    local state = checkpoint.load(p, {model = model2, optimizer = opt2, scheduler = sched2})

    assert.are.equal(expected_rand, nd.rand({5}):tobytes())
    assert.are.same(bytes_of(model), bytes_of(model2))
    assert.are.equal(1234, state.step)
    assert.are.equal("integer", math.type(state.step))
    -- optimizer: integer keys stay integers, numbers keep their kind
    for i = 1, 3 do
      local a, b = opt.state[i], opt2.state[i]
      assert.is_not_nil(b, "state[" .. i .. "]")
      assert.are.equal(a.step, b.step)
      assert.are.equal("integer", math.type(b.step))
      assert.are.equal(a.exp_avg:tobytes(), b.exp_avg:tobytes())
      assert.are.equal(a.exp_avg_sq:tobytes(), b.exp_avg_sq:tobytes())
    end
    assert.is_nil(opt2.state["1"])
    local g = opt2.param_groups[1]
    assert.are.same(opt.param_groups[1].betas, g.betas)
    assert.are.equal(1e-8, g.eps)
    assert.are.equal("float", math.type(g.weight_decay))
    assert.is_false(g.amsgrad)
    assert.are.same({1, 2, 3}, g.params)
    assert.are.equal("integer", math.type(g.params[1]))
    assert.are.equal("main", g.name)
    -- scheduler
    assert.are.equal(7, sched2.last_epoch)
    assert.are.same({0.1}, sched2.base_lrs)
    assert.are.equal(0.5, sched2.gamma)
    -- extra
    local e = state.extra
    assert.are.equal(0.3125, e.best_loss)
    assert.are.same({1.5, 2.0, 0.25}, e.history)
    assert.are.equal("float", math.type(e.history[2]))
    assert.are.equal("run-1", e.name)
    assert.is_false(e.done)
    assert.are.equal("int key", e.counts[1])
    assert.are.equal("string key", e.counts["1"])
    assert.are.equal(math.maxinteger, e.big)
    assert.are.equal(math.huge, e.inf)
    assert.are.equal(-math.huge, e.ninf)
    assert.are.same({true, false}, e.mask:totable())
    -- the state_dicts come back too
    assert.are.same({2, 5}, state.model["body.fc2_weight"].shape)
    assert.is_table(state.rng_state)
  end)

  it("is a safetensors file with prefixed tensor keys", function()
    local model = TwoLayer(2, 3, 1)
    local opt = fake_opt(model:parameters())
    local p = tmp("keys.safetensors")
    checkpoint.save(p, {model = model, optimizer = opt})
    local ts, meta = nd.load(p)
    local names = {}
    for k in pairs(ts) do names[#names + 1] = k end
    table.sort(names)
    assert.are.same({"model.fc1_bias", "model.fc1_weight", "model.fc2_weight", "model.steps",
                     "optimizer.state.1.exp_avg", "optimizer.state.1.exp_avg_sq",
                     "optimizer.state.2.exp_avg", "optimizer.state.2.exp_avg_sq",
                     "optimizer.state.3.exp_avg", "optimizer.state.3.exp_avg_sq"}, names)
    assert.are.equal("1", meta["needle.checkpoint.version"])
    assert.is_string(meta["needle.checkpoint.state"])
    -- read() rebuilds the state without loading it anywhere
    local state = checkpoint.read(p)
    assert.are.equal(ts["model.fc1_weight"]:tobytes(), state.model.fc1_weight:tobytes())
    assert.is_nil(state.step)
  end)

  it("leaves the model and the optimizer untouched when the architecture does not match", function()
    nd.manual_seed(5)
    local model = TwoLayer(3, 4, 2)
    local p = tmp("arch.safetensors")
    checkpoint.save(p, {model = model, optimizer = fake_opt(model:parameters()), step = 1})

    local Other = Module:extend("Other")
    function Other:init()
      self.fc1_weight = Module.Parameter(nd.randn({4, 3}))
      self.fc1_bias = Module.Parameter(nd.randn({5}))  -- wrong shape
      self.head = Module.Parameter(nd.randn({2}))      -- not in the checkpoint
    end
    local other = Other()
    local opt = fake_opt(other:parameters())
    local before, opt_before = bytes_of(other), opt.state[1].exp_avg:tobytes()
    local rng = nd.get_rng_state()
    local e = err_of(checkpoint.load, p, {model = other, optimizer = opt})
    assert.matches("needle.checkpoint.load: '" .. p .. "': model: ", e, 1, true)
    assert.matches("shape mismatch: fc1_bias (checkpoint {4}, model {5})", e, 1, true)
    assert.matches("missing keys: head", e, 1, true)
    assert.matches("unexpected keys: fc2_weight, steps", e, 1, true)
    assert.are.same(before, bytes_of(other))
    -- the optimizer (loaded before the model) was put back
    assert.are.equal(opt_before, opt.state[1].exp_avg:tobytes())
    assert.are.equal(10, opt.state[1].step)
    assert.are.same(rng, nd.get_rng_state())
    -- strict = false (passed on to load_state_dict) loads what matches
    local Partial = Module:extend("Partial")
    function Partial:init() self.fc1_weight = Module.Parameter(nd.zeros({4, 3})) end
    local part = Partial()
    checkpoint.load(p, {model = part, strict = false})
    assert.are.equal(model.fc1_weight:tobytes(), part.fc1_weight:tobytes())
  end)

  it("puts back an optimizer that fails half way through its load", function()
    local model = TwoLayer(2, 2, 2)
    local p = tmp("halfway.safetensors")
    checkpoint.save(p, {model = model, optimizer = fake_opt(model:parameters())})
    local Fragile = setmetatable({}, {__index = FakeOpt})
    Fragile.__index = Fragile
    function Fragile:load_state_dict(sd)
      self.state = sd.state -- changed before failing
      error("Fragile: refusing param_groups")
    end
    local opt = setmetatable(fake_opt(model:parameters()), Fragile)
    local before = opt.state[2].exp_avg:tobytes()
    local target = TwoLayer(2, 2, 2)
    local target_before = bytes_of(target)
    local e = err_of(checkpoint.load, p, {model = target, optimizer = opt})
    assert.matches("needle.checkpoint.load: '" .. p .. "': optimizer: Fragile: refusing param_groups", e, 1, true)
    assert.are.equal(before, opt.state[2].exp_avg:tobytes())
    assert.are.same(target_before, bytes_of(target))
  end)

  it("names an object that cannot be put back after a failed load", function()
    local model = TwoLayer(2, 2, 2)
    local p = tmp("unrestorable.safetensors")
    checkpoint.save(p, {model = model, scheduler = {version = 2}})
    -- takes the checkpoint's state, then refuses its own backup
    local stubborn = {version = 1}
    function stubborn:state_dict() return {version = self.version} end
    function stubborn:load_state_dict(sd)
      if sd.version == 1 then error("Stubborn: version 1 is gone") end
      self.version = sd.version
    end
    local e = err_of(checkpoint.load, p, {model = TwoLayer(3, 3, 3), scheduler = stubborn})
    assert.matches("': model: ", e, 1, true)
    assert.matches("; the scheduler could not be put back as it was (Stubborn: version 1 is gone)", e, 1, true)
  end)

  it("keeps a GradScaler with the rest, and puts it back when the model fails to load", function()
    local model = TwoLayer(2, 2, 2)
    local saved = nd.amp.GradScaler({init_scale = 1024})
    local p = tmp("scaler.safetensors")
    checkpoint.save(p, {model = model, scaler = saved})
    local scaler = nd.amp.GradScaler({init_scale = 8, growth_interval = 10})
    local w = nd.zeros(1):requires_grad_()
    for _ = 1, 5 do
      w.grad = nd.ones(1)
      scaler:step(nd.optim.SGD({w}, {lr = 0}))
      scaler:update()
    end
    scaler:set_growth_interval(3) -- a count past the interval: a state that must still load back
    local before = scaler:state_dict()
    local e = err_of(checkpoint.load, p, {model = TwoLayer(3, 3, 3), scaler = scaler})
    assert.matches("': model: ", e, 1, true)
    assert.is_nil(e:find("could not be put back", 1, true), e)
    assert.are.same(before, scaler:state_dict())
    checkpoint.load(p, {model = TwoLayer(2, 2, 2), scaler = scaler})
    assert.are.same(saved:state_dict(), scaler:state_dict())
  end)

  it("restores the RNG only when asked", function()
    local p = tmp("rng.safetensors")
    nd.manual_seed(42)
    checkpoint.save(p, {step = 0})
    local after_save = nd.rand({3}):tobytes()
    nd.manual_seed(7)
    local st = nd.get_rng_state()
    checkpoint.load(p, {restore_rng = false})
    assert.are.same(st, nd.get_rng_state())
    checkpoint.load(p)
    assert.are.equal(after_save, nd.rand({3}):tobytes())
  end)

  it("names the file and the problem when the checkpoint is bad", function()
    local p = tmp("bad.safetensors")
    -- a plain safetensors file
    nd.save({a = nd.zeros({1})}, p)
    assert.matches("needle.checkpoint.load: '" .. p .. "': not a needle checkpoint", err_of(checkpoint.load, p), 1, true)
    -- truncated
    checkpoint.save(p, {model = TwoLayer(2, 2, 2), step = 3})
    local f = assert(io.open(p, "rb"))
    local s = f:read("a")
    f:close()
    nd.write_file_atomic(p, s:sub(1, #s - 3))
    assert.matches("needle.checkpoint.load: '" .. p .. "': ", err_of(checkpoint.load, p), 1, true)
    assert.matches("lie outside the byte buffer", err_of(checkpoint.load, p), 1, true)
    -- state that is not JSON, names a missing tensor, or leaves one out
    local meta = {["needle.checkpoint.version"] = "1"}
    meta["needle.checkpoint.state"] = '{"$table":[["step",1]'
    nd.save({}, p, meta)
    assert.matches("corrupt checkpoint state: json: ", err_of(checkpoint.load, p), 1, true)
    meta["needle.checkpoint.state"] = '{"$table":[["extra",{"$tensor":"extra"}]]}'
    nd.save({}, p, meta)
    assert.matches("tensor 'extra' (for 'extra') is missing from the file", err_of(checkpoint.load, p), 1, true)
    meta["needle.checkpoint.state"] = '{"$table":[["step",1]]}'
    nd.save({stray = nd.zeros({1})}, p, meta)
    assert.matches("tensors not referenced by its state: stray", err_of(checkpoint.load, p), 1, true)
    meta["needle.checkpoint.version"] = "2"
    nd.save({}, p, meta)
    assert.matches("checkpoint format version 2 is not supported", err_of(checkpoint.load, p), 1, true)
    -- a target the checkpoint has no state for
    meta["needle.checkpoint.version"] = "1"
    meta["needle.checkpoint.state"] = '{"$table":[["rng_state",{"$table":[["offset",0],["seed",1]]}],["step",1]]}'
    nd.save({}, p, meta)
    assert.matches("the checkpoint has no optimizer state",
                   err_of(checkpoint.load, p, {optimizer = fake_opt({})}), 1, true)
    assert.matches("needle.checkpoint.load: cannot open '" .. tmp("missing") .. "': No such file or directory",
                   err_of(checkpoint.load, tmp("missing")), 1, true)
  end)

  it("refuses state it cannot store exactly", function()
    local p = tmp("refuse.safetensors")
    local function save_err(what) return err_of(checkpoint.save, p, what) end
    assert.matches("unknown field 'epoch'", save_err({epoch = 1}), 1, true)
    assert.matches("'extra.f' is a function", save_err({extra = {f = print}}), 1, true)
    assert.matches("'extra' has a float key (1.5)", save_err({extra = {[1.5] = 1}}), 1, true)
    assert.matches("'extra.m' is a table with a metatable", save_err({extra = {m = TwoLayer(1, 1, 1)}}), 1, true)
    local cyc = {}
    cyc.self = cyc
    assert.matches("'extra.self' contains itself", save_err({extra = cyc}), 1, true)
    assert.matches("two values map to the tensor key 'extra.a.b'",
                   save_err({extra = {["a.b"] = nd.zeros({1}), a = {b = nd.zeros({1})}}}), 1, true)
    assert.matches("not valid UTF-8", save_err({extra = {s = "\255"}}), 1, true)
    assert.matches("step must be a number", save_err({step = "3"}), 1, true)
    for _, s in ipairs({0 / 0, -1, 2.5, math.huge}) do
      assert.matches("step must be a whole number >= 0", save_err({step = s}), 1, true)
    end
    assert.matches("takes save(path, {model=, optimizer=, scheduler=, scaler=, step=, extra=}) only",
                   err_of(checkpoint.save, p, {step = 1}, 5), 1, true)
    assert.matches("model must have a state_dict() method", save_err({model = 3}), 1, true)
    assert.matches("needle.checkpoint.save: '" .. p .. "': ", save_err({epoch = 1}), 1, true)
    assert.is_nil(io.open(p, "rb"))
  end)

  it("load and read check their options and arguments (restore_rng = 'no' would restore)", function()
    local p = tmp("opts.safetensors")
    checkpoint.save(p, {step = 3})
    assert.matches("restore_rng must be a boolean, got string", err_of(checkpoint.load, p, {restore_rng = "no"}), 1, true)
    assert.matches("strict must be a boolean, got number", err_of(checkpoint.load, p, {strict = 1}), 1, true)
    assert.matches("takes load(path[, {model=, optimizer=, scheduler=, scaler=, strict=, restore_rng=}]) only",
                   err_of(checkpoint.load, p, {}, 5), 1, true)
    assert.matches("needle.checkpoint.read: takes read(path) only", err_of(checkpoint.read, p, {strict = false}), 1, true)
    assert.are.equal(3, checkpoint.read(p).step)
    os.remove(p)
  end)
end)

describe("nd.checkpoint files it refuses", function()
  local p
  before_each(function() p = tmp("root.safetensors") end)

  -- a checkpoint whose state is the JSON `state` (tensors: none)
  local function with_state(state)
    nd.save({}, p, {["needle.checkpoint.version"] = "1", ["needle.checkpoint.state"] = state})
  end
  local function tbl(entries) return '{"$table":[' .. entries .. ']}' end
  local RNG = '["rng_state",' .. tbl('["offset",0],["seed",5]') .. ']'

  it("a root without rng_state, with fields checkpoint.save never writes, or a bad rng_state", function()
    with_state(tbl(RNG .. ',["step",3]'))
    assert.are.equal(3, checkpoint.load(p).step) -- the valid one
    local cases = {
      {tbl('["step",3]'), "no rng_state (checkpoint.save always writes one)"},
      {tbl('["epoch",1],' .. RNG .. ',["zz",2]'), "unknown root fields epoch, zz (expected model, optimizer, "
        .. "scheduler, scaler, step, extra, rng_state)"},
      {tbl('["rng_state",3]'), "rng_state is a number, not a table"},
      {tbl('["rng_state",' .. tbl('["seed",5]') .. ']'), "rng_state.offset is missing, not an integer"},
      {tbl('["rng_state",' .. tbl('["offset",0],["seed",1.5]') .. ']'), "rng_state.seed is a float, not an integer"},
      {tbl('["rng_state",' .. tbl('["extra",1],["offset",0],["seed",1]') .. ']'),
       "rng_state has a field 'extra' (expected seed and offset)"},
      {tbl(RNG .. ',["step","3"]'), "step is a string, not a number"},
      {tbl('["model",1],' .. RNG), "the model state is a number, not a table"},
    }
    for _, c in ipairs(cases) do
      with_state(c[1])
      for _, fn in ipairs({"load", "read"}) do
        local e = err_of(checkpoint[fn], p)
        assert.matches("needle.checkpoint." .. fn .. ": '" .. p .. "': corrupt checkpoint state: " .. c[2], e, 1, true)
      end
    end
  end)

  it("keeps every seed nd.manual_seed takes, negative ones included", function()
    local before = nd.get_rng_state()
    for _, seed in ipairs({-1, -5, math.mininteger, math.maxinteger, 0}) do
      nd.manual_seed(seed)
      nd.rand({3})
      local st = nd.get_rng_state()
      checkpoint.save(p, {step = 1})
      local want = nd.rand({4}):totable()
      nd.manual_seed(123)
      assert.are.same(st, checkpoint.load(p).rng_state)
      assert.are.same(want, nd.rand({4}):totable())
    end
    nd.set_rng_state(before)
  end)

  it("checkpoint.read names itself in its errors", function()
    assert.matches("needle.checkpoint.read: cannot open '" .. tmp("missing") .. "'",
                   err_of(checkpoint.read, tmp("missing")), 1, true)
    nd.save({a = nd.zeros({1})}, p)
    assert.matches("needle.checkpoint.read: '" .. p .. "': not a needle checkpoint", err_of(checkpoint.read, p), 1,
                   true)
    assert.matches("needle.checkpoint.read: path must be a non-empty string", err_of(checkpoint.read, 3), 1, true)
  end)
end)

describe("nd.checkpoint and deep nesting", function()
  it("refuses 100000 nested tables at once, with a short path", function()
    local deep = {}
    local t = deep
    for _ = 1, 100000 do
      t.child_with_a_long_name = {}
      t = t.child_with_a_long_name
    end
    local p = tmp("deep.safetensors")
    local t0 = os.clock()
    local e = err_of(checkpoint.save, p, {extra = deep})
    assert.truthy(os.clock() - t0 < 2, "took " .. (os.clock() - t0) .. " s")
    assert.matches("needle.checkpoint.save: '" .. p .. "': 'extra.child_with_a_long_name.", e, 1, true)
    assert.matches("' is nested deeper than 64 tables", e, 1, true)
    assert.truthy(#e < 250, #e .. " characters: " .. e)
    assert.matches("...", e, 1, true)
    assert.is_nil(io.open(p, "rb"))
  end)

  it("saves and loads 63 levels, refuses 64 on save and on load", function()
    local function nest(n)
      local root = {}
      local t = root
      for _ = 1, n - 1 do t.k = {}; t = t.k end
      t.leaf = 1
      return root
    end
    local p = tmp("nest.safetensors")
    -- extra is itself one table below the root
    checkpoint.save(p, {extra = nest(62)})
    local back = checkpoint.load(p).extra
    for _ = 1, 61 do back = back.k end
    assert.are.equal(1, back.leaf)
    assert.matches("is nested deeper than 64 tables", err_of(checkpoint.save, p, {extra = nest(64)}), 1, true)
    -- a file written by someone else with the deeper state
    local function tree(n)
      if n == 0 then return "1" end
      return '{"$table":[["k",' .. tree(n - 1) .. ']]}'
    end
    local state = '{"$table":[["extra",' .. tree(64) .. '],["rng_state",{"$table":[["offset",0],["seed",1]]}]]}'
    nd.save({}, p, {["needle.checkpoint.version"] = "1", ["needle.checkpoint.state"] = state})
    local e = err_of(checkpoint.load, p)
    assert.matches("corrupt checkpoint state: 'extra.k.k.k", e, 1, true)
    assert.matches("is nested deeper than 64 tables", e, 1, true)
    assert.truthy(#e < 250, e)
  end)
end)
