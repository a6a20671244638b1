-- amp_spec.lua - nd.amp.GradScaler, dynamic loss scaling (issue 22, item 4).
--
--   build/needle-lua spec/run.lua spec/amp_spec.lua
--
-- The references are worked out by hand from PyTorch's algorithm
-- (torch.amp.GradScaler; Debian's PyTorch 1.13 has no CPU scaler to make
-- fixtures with): a power-of-two scale multiplies every gradient exactly, so
-- scaled training must equal unscaled training bit for bit; the scale's
-- sequence under a known pattern of overflowing steps is written out below;
-- an overflow that backs off 2^120 until 1e6 * scale fits float32 takes
-- exactly 12 skipped steps.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function mlp(seed, dtype)
  nd.manual_seed(seed)
  local m = nd.nn.Sequential(nd.nn.Linear(6, 16), nd.nn.ReLU(), nd.nn.Linear(16, 3))
  if dtype == "float64" then m:double() end
  return m
end

local function batch(step, dtype)
  nd.manual_seed(1000 + step)
  local x = nd.randn(8, 6)
  local y = nd.randint(1, 3, {8})
  if dtype == "float64" then x = x:double() end
  return x, y
end

local function params_of(m)
  local r = {}
  for i, p in ipairs(m:parameters()) do r[i] = p:clone() end
  return r
end

local function assert_same(a, b, what)
  assert.are.equal(#a, #b)
  for i = 1, #a do
    assert(nd.equal(a[i], b[i]), ("%s: parameter %d differs"):format(what, i))
  end
end

-- trains a fresh MLP for `steps` steps; with `scaler`, through it
local function train(make_opt, steps, scaler, dtype)
  local m = mlp(7, dtype)
  local opt = make_opt(m)
  for s = 1, steps do
    local x, y = batch(s, dtype)
    opt:zero_grad()
    local loss = nd.F.cross_entropy(m(x), y)
    if scaler then
      scaler:scale(loss):backward()
      scaler:step(opt)
      scaler:update()
    else
      loss:backward()
      opt:step()
    end
  end
  return params_of(m), m, opt
end

describe("nd.amp.GradScaler", function()
  local OPTIMIZERS = {
    {"SGD momentum", function(m) return nd.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9}) end},
    {"Adam", function(m) return nd.optim.Adam(m:parameters(), {lr = 1e-2}) end},
  }
  for _, dtype in ipairs({"float32", "float64"}) do
    for _, o in ipairs(OPTIMIZERS) do
      it(("trains bit for bit as without it when nothing overflows (%s, %s)"):format(o[1], dtype), function()
        local plain = train(o[2], 10, nil, dtype)
        -- growth_interval 4: the scale grows twice (2^16 -> 2^18), still exact
        local scaler = nd.amp.GradScaler({growth_interval = 4})
        local scaled = train(o[2], 10, scaler, dtype)
        assert_same(plain, scaled, o[1])
        assert.are.equal(2 ^ 18, scaler:get_scale())
        assert.are.equal(2, scaler:state_dict()._growth_tracker)
      end)
    end
  end

  it("skips a step whose gradients overflow and backs off until they fit: 12 skips from 2^120", function()
    -- d(1e6 * sum(w)) / dw = 1e6; times 2^k it overflows float32 for k >= 109
    local w = nd.zeros(4):requires_grad_()
    local opt = nd.optim.SGD({w}, {lr = 1e-6})
    local scaler = nd.amp.GradScaler({init_scale = 2 ^ 120})
    local skipped = 0
    for _ = 1, 20 do
      opt:zero_grad()
      scaler:scale((w * 1e6):sum()):backward()
      local before = w:clone()
      scaler:step(opt)
      if nd.equal(before, w) then skipped = skipped + 1 end
      scaler:update()
      if not nd.equal(before, w) then break end
    end
    assert.are.equal(12, skipped)
    assert.are.equal(2 ^ 108, scaler:get_scale())
    -- the one step taken used the true gradient, 1e6: w = -lr * 1e6 = -1
    assert(nd.allclose(w, nd.full({4}, -1.0), 1e-6, 0), tostring(w))
    assert(nd.equal(w.grad, nd.full({4}, 1e6)), "the gradients are left unscaled")
  end)

  it("follows PyTorch's scale updates for a known pattern of inf and NaN steps", function()
    -- init 8, interval 3; a non-finite gradient at steps 2 (inf), 5 (NaN) and 6 (-inf):
    -- step 1 ok (tracker 1); 2 bad -> 4 (0); 3, 4 ok (2); 5 bad -> 2 (0); 6 bad -> 1 (0);
    -- 7, 8 ok (2); 9 ok -> 3 = interval: 2 (0); 10 ok (1)
    local want = {8, 4, 4, 4, 2, 1, 1, 1, 2, 2}
    local bad = {[2] = math.huge, [5] = 0 / 0, [6] = -math.huge}
    local p = nd.zeros(5):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 8, growth_interval = 3})
    local stepped = 0
    for s = 1, 10 do
      opt:zero_grad()
      local g = nd.full({5}, 2.0)
      if bad[s] then g[{3}] = bad[s] end
      scaler:scale((p * g):sum()):backward()
      scaler:step(opt)
      scaler:update()
      assert.are.equal(want[s], scaler:get_scale(), "scale after step " .. s)
      if not bad[s] then stepped = stepped + 1 end
      -- each step taken subtracts the true gradient, 2
      assert(nd.equal(p, nd.full({5}, -2.0 * stepped)), ("step %d: %s"):format(s, tostring(p)))
    end
  end)

  it("finds inf and NaN alike in one pass (contiguous gradients) and in two (others), float32 and float64", function()
    for _, dtype in ipairs({"float32", "float64"}) do
      for _, bad in ipairs({math.huge, -math.huge, 0 / 0, false}) do
        local results = {}
        for _, layout in ipairs({"contiguous", "transposed"}) do
          local p = nd.zeros(5, 4, {dtype = dtype}):requires_grad_()
          local g = nd.full({4, 5}, 6.0, {dtype = dtype})
          if bad then g[{2, 3}] = bad end
          p.grad = layout == "contiguous" and g:t():contiguous() or g:t() -- a view: no in-place kernel
          local opt = nd.optim.SGD({p}, {lr = 1})
          local scaler = nd.amp.GradScaler({init_scale = 4})
          scaler:unscale_(opt)
          local st = scaler._per_optimizer[opt]
          results[layout] = {found = st.found_inf, grad = p.grad:contiguous()}
        end
        local what = ("%s, %s"):format(dtype, tostring(bad))
        assert.are.equal(bad ~= false, results.contiguous.found, what)
        assert.are.equal(results.contiguous.found, results.transposed.found, what)
        -- the unscaled gradients agree bit for bit (NaN where NaN)
        local a, b = results.contiguous.grad, results.transposed.grad
        assert(nd.equal(a:eq(a), b:eq(b)) and nd.equal(a:masked_fill(a:ne(a), 0), b:masked_fill(b:ne(b), 0)), what)
        assert.are.equal(1.5, a[{1, 1}]:item(), what)
      end
    end
  end)

  it("does not grow the scale past float32's largest value", function()
    local p = nd.zeros(2):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 0})
    local scaler = nd.amp.GradScaler({init_scale = 2 ^ 127, growth_interval = 1})
    for _ = 1, 3 do
      opt:zero_grad()
      p.grad = nd.ones(2) -- a finite gradient, as if backward had run
      scaler:step(opt)
      scaler:update()
      assert.are.equal(2 ^ 127, scaler:get_scale())
      assert.are.equal(0, scaler:state_dict()._growth_tracker)
    end
  end)

  it("unscale_ gives the true gradients for clipping, and step does not unscale them again", function()
    local m = mlp(3)
    local x, y = batch(1)
    nd.F.cross_entropy(m(x), y):backward()
    local ref = {}
    for i, p in ipairs(m:parameters()) do ref[i] = p.grad:clone(); p.grad = nil end
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.5})
    local scaler = nd.amp.GradScaler()
    scaler:scale(nd.F.cross_entropy(m(x), y)):backward()
    scaler:unscale_(opt)
    for i, p in ipairs(m:parameters()) do
      assert(nd.equal(p.grad, ref[i]), "unscaled gradient " .. i)
    end
    local before = params_of(m)
    nd.nn.utils.clip_grad_value_(m:parameters(), 0.01)
    scaler:step(opt)
    for i, p in ipairs(m:parameters()) do
      local want = before[i] - ref[i]:clamp(-0.01, 0.01) * 0.5
      assert(nd.allclose(p, want, 1e-6, 1e-7), "parameter " .. i .. " after the clipped step")
    end
    scaler:update()
    assert.are.equal(65536, scaler:get_scale())
  end)

  it("with two optimizers: the one whose gradients overflow skips, the other steps, the scale backs off once", function()
    local a = nd.zeros(3):requires_grad_()
    local b = nd.zeros(3):requires_grad_()
    local oa, ob = nd.optim.SGD({a}, {lr = 1}), nd.optim.SGD({b}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 4})
    local loss = (a * nd.tensor({1, math.huge, 1})):sum() + (b * 3):sum()
    scaler:scale(loss):backward()
    scaler:step(oa)
    scaler:step(ob)
    scaler:update()
    assert(nd.equal(a, nd.zeros(3)), "a's step was skipped")
    assert(nd.equal(b, nd.full({3}, -3.0)), "b stepped with its true gradient")
    assert.are.equal(2, scaler:get_scale())
  end)

  it("takes parameters with no elements", function()
    local e = nd.zeros(0, 3):requires_grad_()
    local p = nd.zeros(2):requires_grad_()
    local opt = nd.optim.SGD({e, p}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 8})
    scaler:scale((p * 3):sum() + e:sum()):backward()
    scaler:step(opt)
    scaler:update()
    assert(nd.equal(p, nd.full({2}, -3.0)))
    assert.are.same({0, 3}, e.grad.shape)
  end)

  it("unscales a gradient autograd made by broadcasting (stride 0) without writing into it", function()
    local a, w = nd.zeros(2):requires_grad_(), nd.zeros(3):requires_grad_()
    local opt = nd.optim.SGD({a, w}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 4})
    scaler:scale((a * 2):sum() + w:sum() * 0.5):backward()
    scaler:step(opt)
    scaler:update()
    assert(nd.equal(a, nd.full({2}, -2.0)), tostring(a))
    assert(nd.equal(w, nd.full({3}, -0.5)), tostring(w))
  end)

  it("a gradient it cannot take leaves every gradient as it was", function()
    local p = nd.zeros(2):requires_grad_()
    p.grad = nd.full({2}, 8.0)
    local fake = {param_groups = {{params = {p, 5}}}, step = function() end}
    local scaler = nd.amp.GradScaler({init_scale = 4})
    assert_contains(errmsg(function() scaler:step(fake) end),
                    "unscale_: param_groups[1].params[2] is a number, not a tensor")
    assert(nd.equal(p.grad, nd.full({2}, 8.0)), "untouched")
    -- and the call may be made again once the optimizer is right
    fake.param_groups[1].params[2] = nil
    scaler:step(fake)
    assert(nd.equal(p.grad, nd.full({2}, 2.0)))
  end)

  it("keeps every optimizer's overflow until update(), even one nothing else refers to", function()
    local keep = nd.zeros(1):requires_grad_()
    local oa = nd.optim.SGD({keep}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 8, growth_interval = 1})
    keep.grad = nd.ones(1)
    scaler:step(oa)
    do
      local q = nd.zeros(1):requires_grad_()
      q.grad = nd.full({1}, math.huge)
      scaler:step(nd.optim.SGD({q}, {lr = 1}))
    end
    collectgarbage()
    collectgarbage()
    scaler:update()
    assert.are.equal(4, scaler:get_scale())
  end)

  it("grows at the next clean step when the interval is lowered below the count, and saves any state it reaches",
     function()
    local p = nd.zeros(1):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 0})
    local scaler = nd.amp.GradScaler({init_scale = 8, growth_interval = 10})
    local function clean_step()
      p.grad = nd.ones(1)
      scaler:step(opt)
      scaler:update()
    end
    for _ = 1, 5 do clean_step() end
    scaler:set_growth_interval(3)
    local other = nd.amp.GradScaler()
    other:load_state_dict(scaler:state_dict()) -- tracker 5 >= interval 3: still loads
    assert.are.same(scaler:state_dict(), other:state_dict())
    clean_step()
    assert.are.equal(16, scaler:get_scale())
    assert.are.equal(0, scaler:state_dict()._growth_tracker)
    -- a scale backed off to 0 (a model that overflows at every scale) loads too, and skips every step
    other:load_state_dict({scale = 0.0, growth_factor = 2.0, backoff_factor = 0.5, growth_interval = 3,
                           _growth_tracker = 0})
    p.grad = nd.ones(1)
    local before = p:clone()
    other:step(nd.optim.SGD({p}, {lr = 1}))
    assert(nd.equal(p, before), "a zero scale's reciprocal is inf: the step is skipped")
    other:update()
    assert.are.equal(0, other:get_scale())
  end)

  it("rounds a grown scale to float32 as C does: just past the largest float32 is the largest", function()
    local p = nd.zeros(1):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 0})
    -- 2^127 (2 - 1.5 2^-24) is FLT_MAX + half of half an ulp: it rounds to FLT_MAX
    local scaler = nd.amp.GradScaler({init_scale = 2 ^ 127, growth_interval = 1, growth_factor = 2 - 1.5 * 2 ^ -24})
    p.grad = nd.ones(1)
    scaler:step(opt)
    scaler:update()
    assert.are.equal(3.4028234663852886e38, scaler:get_scale())
  end)

  it("unscales by the float32 reciprocal of a scale that is not a power of two", function()
    local p = nd.zeros(3, {dtype = "float64"}):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 1})
    local scaler = nd.amp.GradScaler({init_scale = 3})
    local c = {0.1, 0.7, 1e-3}
    scaler:scale((p * nd.tensor(c, {dtype = "float64"})):sum()):backward()
    scaler:unscale_(opt)
    local inv = string.unpack("<f", string.pack("<f", 1 / 3))
    assert.are_not.equal(1 / 3, inv)
    for i = 1, 3 do
      assert.are.equal(c[i] * 3 * inv, p.grad[{i}]:item(), "element " .. i)
    end
  end)

  it("an optimizer whose only parameter has no elements steps", function()
    local e = nd.zeros(0):requires_grad_()
    local opt = nd.optim.SGD({e}, {lr = 1})
    local scaler = nd.amp.GradScaler()
    scaler:scale(e:sum()):backward()
    scaler:step(opt)
    scaler:update()
    assert.are.equal(65536, scaler:get_scale())
  end)

  it("scale keeps the structure of nested outputs and their dtypes", function()
    local scaler = nd.amp.GradScaler({init_scale = 4})
    local r = scaler:scale({nd.tensor({1, 2}), {nd.tensor({3.0}, {dtype = "float64"})}})
    assert(nd.equal(r[1], nd.tensor({4, 8})))
    assert.are.equal("float64", r[2][1].dtype)
    assert(nd.equal(r[2][1], nd.tensor({12.0}, {dtype = "float64"})))
    for _, dt in ipairs({"float16", "bfloat16"}) do
      local h = scaler:scale(nd.tensor({1.5, -2}):to(dt))
      assert.are.equal(dt, h.dtype)
      assert(nd.equal(h:float(), nd.tensor({6, -8})))
    end
    local cyc = {nd.ones(1)}
    cyc[2] = cyc
    assert_contains(errmsg(function() scaler:scale(cyc) end), "scale: outputs[2] contains itself")
  end)

  it("disabled, it is the identity around the optimizer", function()
    local scaler = nd.amp.GradScaler({enabled = false})
    local loss = nd.tensor({3.0})
    assert(rawequal(loss, scaler:scale(loss)))
    assert.are.equal(1.0, scaler:get_scale())
    assert.is_false(scaler:is_enabled())
    local p = nd.ones(2):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 1})
    p.grad = nd.full({2}, math.huge) -- not checked: the step runs
    scaler:unscale_(opt)
    scaler:step(opt)
    scaler:update()
    assert.are.equal(-math.huge, p[{1}]:item())
    assert.are.same({}, scaler:state_dict())
  end)

  it("state_dict has PyTorch's keys, and nd.checkpoint saves and restores the scaler", function()
    local scaler = nd.amp.GradScaler({init_scale = 1024, growth_interval = 5, growth_factor = 4,
                                      backoff_factor = 0.25})
    local p = nd.zeros(1):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 1})
    for _ = 1, 2 do
      p.grad = nd.ones(1)
      scaler:step(opt)
      scaler:update()
    end
    local sd = scaler:state_dict()
    assert.are.same({scale = 1024, growth_factor = 4, backoff_factor = 0.25, growth_interval = 5,
                     _growth_tracker = 2}, sd)
    local path = os.tmpname()
    nd.checkpoint.save(path, {scaler = scaler, step = 2})
    local other = nd.amp.GradScaler()
    assert.are.equal(2, nd.checkpoint.load(path, {scaler = other}).step)
    os.remove(path)
    assert.are.same(sd, other:state_dict())
    assert.are.equal("integer", math.type(other:get_growth_interval()))
    -- three more clean steps reach the interval: the scale grows by 4
    for _ = 1, 3 do
      p.grad = nd.ones(1)
      other:step(opt)
      other:update()
    end
    assert.are.equal(4096, other:get_scale())
  end)

  it("a state dict that does not fit is an error and leaves the scaler as it was", function()
    local scaler = nd.amp.GradScaler({init_scale = 16})
    local before = scaler:state_dict()
    local good = {scale = 8, growth_factor = 2, backoff_factor = 0.5, growth_interval = 10, _growth_tracker = 3}
    local function with(k, v)
      local t = {}
      for key, x in pairs(good) do t[key] = x end
      t[k] = v
      return t
    end
    local cases = {
      {{}, "state dict is empty"},
      {with("_growth_tracker", -1), "load_state_dict: _growth_tracker must be an integer >= 0, got -1"},
      {with("scale", 1e39), "load_state_dict: scale must be a number in [0, 3.40282347e+38]"},
      {with("scale", 0 / 0), "load_state_dict: scale must be a number in [0"},
      {with("scale", "8"), "option 'scale' must be a number, got \"8\""},
      {with("backoff_factor", 1), "load_state_dict: backoff_factor must be a number in (0, 1)"},
      {with("growth_interval", 2.5), "option 'growth_interval' must be an integer"},
      {with("scales", 1), "unknown option 'scales' in the state dict (valid: _growth_tracker, backoff_factor, " ..
                          "growth_factor, growth_interval, scale)"},
      {with("scale", nil), "the state dict has no 'scale'"},
      {"x", "load_state_dict: expected a table, got string"},
    }
    for _, c in ipairs(cases) do
      local msg = errmsg(function() scaler:load_state_dict(c[1]) end)
      assert_contains(msg, "needle.amp.GradScaler")
      assert_contains(msg, c[2])
      assert.are.same(before, scaler:state_dict())
    end
  end)

  it("refuses calls out of order, naming the rule", function()
    local p = nd.zeros(2):requires_grad_()
    local opt = nd.optim.SGD({p}, {lr = 1})
    local scaler = nd.amp.GradScaler()
    assert_contains(errmsg(function() scaler:update() end), "no inf checks were recorded since the last update()")
    assert_contains(errmsg(function() scaler:step(opt) end),
                    "no inf checks were recorded for this optimizer: none of its parameters has a gradient")
    scaler:update(1024) -- a new scale needs no step (and forgets the failed step's record)
    p.grad = nd.ones(2)
    scaler:unscale_(opt)
    assert_contains(errmsg(function() scaler:unscale_(opt) end),
                    "unscale_() has already been called on this optimizer since the last update()")
    scaler:step(opt)
    assert_contains(errmsg(function() scaler:step(opt) end),
                    "step() has already been called on this optimizer since the last update()")
    assert_contains(errmsg(function() scaler:unscale_(opt) end), "unscale_() is being called after step()")
    scaler:update()
    assert_contains(errmsg(function() scaler:step(opt, function() return 0 end) end),
                    "a closure is not supported while the scaler is enabled")
    assert_contains(errmsg(function() scaler:step(p) end), "step expects an optimizer")
    assert_contains(errmsg(function() nd.amp.GradScaler({enabled = false}):step(nil) end),
                    "step expects an optimizer (a table with param_groups and step), got nil")
    for _, m in ipairs({"get_scale", "get_growth_factor", "is_enabled", "state_dict", "update"}) do
      assert_contains(errmsg(function() scaler[m]() end), "call it as scaler:" .. m .. "(...)")
    end
    assert_contains(errmsg(function() scaler.set_growth_interval(5) end), "call it as scaler:set_growth_interval")
    assert_contains(errmsg(function() scaler.step(opt) end), "call it as scaler:step(...)")
    assert_contains(errmsg(function() scaler:scale(nd.tensor({1, 2}, {dtype = "int64"})) end),
                    "scale: outputs is a int64 tensor; expected floating-point outputs")
    assert_contains(errmsg(function() scaler:scale({nd.ones(1), 3}) end),
                    "scale: outputs[2] is a number; expected a tensor")
    assert_contains(errmsg(function() scaler:update(0) end),
                    "update: new_scale must be a number in [5.87747175e-39, 3.40282347e+38] (float32's range, " ..
                    "with a reciprocal it holds), got 0")
    assert_contains(errmsg(function() scaler:update("1024") end),
                    "new_scale must be a number or a one-element floating-point tensor, got the string \"1024\"")
    assert_contains(errmsg(function() scaler:update({}) end), "got a table")
    assert_contains(errmsg(function() scaler:update(nd.ones(2)) end),
                    "new_scale must be a number or a one-element floating-point tensor, got a float32 tensor " ..
                    "of shape {2}")
    scaler:update(nd.tensor({512}))
    assert.are.equal(512, scaler:get_scale())
  end)

  it("checks its settings", function()
    local cases = {
      {{growth_factor = 1}, "growth_factor must be a finite number > 1, got 1"},
      {{backoff_factor = 0}, "backoff_factor must be a number in (0, 1), got 0"},
      {{growth_interval = 0}, "growth_interval must be an integer >= 1, got 0"},
      {{init_scale = -1}, "init_scale must be a number in [5.87747175e-39, 3.40282347e+38]"},
      {{init_scale = math.huge}, "init_scale must be a number in"},
      {{init_scale = 2 ^ -128}, "with a reciprocal it holds"},
    }
    for _, c in ipairs(cases) do
      assert_contains(errmsg(function() nd.amp.GradScaler(c[1]) end), c[2])
      assert_contains(errmsg(function() nd.amp.GradScaler({}, 5) end), "takes GradScaler([opts]) only, got an extra argument #2: 5")
    end
    local s = nd.amp.GradScaler()
    s:set_growth_factor(3); s:set_backoff_factor(0.1); s:set_growth_interval(7)
    assert.are.same({3, 0.1, 7}, {s:get_growth_factor(), s:get_backoff_factor(), s:get_growth_interval()})
    assert_contains(errmsg(function() s:set_growth_interval(1.5) end), "growth_interval must be an integer >= 1")
    assert_contains(errmsg(function() s:set_backoff_factor(2) end), "backoff_factor must be a number in (0, 1)")
    -- the scale is a float32 value, as PyTorch's
    assert.are.equal(string.unpack("<f", string.pack("<f", 0.1)), nd.amp.GradScaler({init_scale = 0.1}):get_scale())
  end)

  describe("under nd.compile", function()
    -- a compiled forward + scaled backward; step and update outside it
    local function run(compiled, steps)
      local m = mlp(11)
      local opt = nd.optim.SGD(m:parameters(), {lr = 0.1})
      -- the first step overflows: the loss is multiplied by 1e30 * 2^100
      local scaler = nd.amp.GradScaler({init_scale = 2 ^ 100, growth_interval = 4})
      local function fwd_bwd(x, y, k)
        local loss = nd.F.cross_entropy(m(x), y) * k
        scaler:scale(loss):backward()
        return loss
      end
      local f = compiled and nd.compile(fwd_bwd) or fwd_bwd
      local scales = {}
      for s = 1, steps do
        local x, y = batch(s)
        opt:zero_grad()
        f(x, y, s == 1 and 1e30 or 1)
        scaler:step(opt)
        scaler:update()
        scales[s] = scaler:get_scale()
      end
      return params_of(m), scales, f
    end

    it("trains as eagerly; a new scale traces the function again", function()
      local pe, se = run(false, 12)
      local pc, sc, f = run(true, 12)
      assert.are.same(se, sc)
      assert_same(pe, pc, "compiled")
      assert(f.stats.replays > 0, "some calls replayed")
      -- the scale grew twice after the capture (steps 5 and 9: 4 clean steps each)
      assert.are.equal(2, f.stats.retraces, "each new scale traced the function again")
    end)

    it("step inside a compiled function is a graph break that names the scaler", function()
      local p = nd.zeros(3):requires_grad_()
      local opt = nd.optim.SGD({p}, {lr = 1})
      local scaler = nd.amp.GradScaler({init_scale = 2})
      local f = nd.compile(function(x)
        opt:zero_grad()
        scaler:scale((p * x):sum()):backward()
        scaler:step(opt)
      end, {warmup = 0})
      local msg = errmsg(function() f(nd.ones(3)) end)
      assert_contains(msg, "nd.amp.GradScaler:step reads on the host whether the gradients are finite")
      assert_contains(msg, "a graph break")
      -- with fallback the function runs eagerly, the scaler working as without nd.compile
      local p2 = nd.zeros(3):requires_grad_()
      local opt2 = nd.optim.SGD({p2}, {lr = 1})
      local s2 = nd.amp.GradScaler({init_scale = 2})
      local g = nd.compile(function(x)
        opt2:zero_grad()
        s2:scale((p2 * x):sum()):backward()
        s2:step(opt2)
        s2:update()
      end, {fallback = true})
      for _ = 1, 3 do g(nd.ones(3)) end
      assert(nd.equal(p2, nd.full({3}, -3.0)))
    end)

    it("nd.amp_unscale_ in a compiled function is a graph break (its answer is a host value)", function()
      local f = nd.compile(function(g) return nd.amp_unscale_(g, 0.5) end, {warmup = 0})
      assert_contains(errmsg(function() f(nd.ones(3)) end),
                      "amp_unscale_ returns whether a gradient was finite, on the host (a graph break)")
      local h = nd.compile(function(g) local _, bad = nd.amp_unscale_(g, 0.5); return bad end, {fallback = true})
      local g = nd.ones(3)
      g[{2}] = math.huge
      for call = 1, 3 do assert.is_true(h(g), "call " .. call) end -- eager each time: the flag is fresh
      assert.are.equal(0.125, g[{1}]:item())
    end)

    it("step alone in a compiled function, after an eager unscale_, still skips an overflowing step", function()
      local p = nd.zeros(3):requires_grad_()
      local opt = nd.optim.SGD({p}, {lr = 1})
      local scaler = nd.amp.GradScaler({init_scale = 2, growth_interval = 1000})
      local f = nd.compile(function(x) scaler:step(opt); return x end, {fallback = true})
      p.grad = nd.zeros(3)
      for i = 1, 6 do
        local g = i == 5 and nd.tensor({1, math.huge, 1}) or nd.ones(3)
        p.grad:copy_(g * scaler:get_scale())
        scaler:unscale_(opt)
        f(nd.ones(1))
        scaler:update()
        local want = i < 5 and -i or -(i - 1)
        assert(nd.equal(p, nd.full({3}, want)), ("call %d: %s"):format(i, tostring(p)))
      end
    end)
  end)

  describe("on OpenCL", function()
    if D.pending_without_opencl(pending, "GradScaler on OpenCL") then return end
    for _, dev in ipairs(D.opencl()) do
      it("finds an inf among an OpenCL device's gradients and unscales them there (" .. dev .. ")", function()
        local p = nd.zeros(4, {device = dev}):requires_grad_()
        local q = nd.zeros(1000, {device = dev}):requires_grad_()
        local opt = nd.optim.SGD({p, q}, {lr = 1})
        local scaler = nd.amp.GradScaler({init_scale = 4})
        local gq = nd.ones(1000)
        gq[{777}] = 0 / 0
        scaler:scale((p * 2):sum() + (q * gq:to(dev)):sum()):backward()
        scaler:step(opt)
        scaler:update()
        assert(nd.equal(p:to("cpu"), nd.zeros(4)), "skipped")
        assert(nd.equal(p.grad:to("cpu"), nd.full({4}, 2.0)), "unscaled on the device")
        assert.are.equal(2, scaler:get_scale())
        opt:zero_grad()
        scaler:scale((p * 2):sum() + (q * 3):sum()):backward()
        scaler:step(opt)
        scaler:update()
        assert(nd.equal(p:to("cpu"), nd.full({4}, -2.0)), "stepped")
        assert(nd.equal(q:to("cpu"), nd.full({1000}, -3.0)), "stepped")
        -- -inf (the min's case) is found too
        opt:zero_grad()
        local gm = nd.ones(1000)
        gm[{3}] = -math.huge
        scaler:scale((p * 2):sum() + (q * gm:to(dev)):sum()):backward()
        scaler:step(opt)
        scaler:update()
        assert(nd.equal(q:to("cpu"), nd.full({1000}, -3.0)), "skipped")
        assert.are.equal(1, scaler:get_scale())
      end)
    end
  end)
end)
