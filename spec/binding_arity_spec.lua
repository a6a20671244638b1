-- binding_arity_spec.lua - every C binding (src/lua_bindings/*.c) refuses a
-- non-nil argument it does not take, naming the op, the form it takes and
-- the extra argument's position and type, instead of dropping it without a
-- word (x:sum(1, true, 5), x:float(5), nd.relu(x, 3)); trailing nils pass.
-- One check does it: lt_register wraps each binding with its lt_reg's
-- max_args (lt_internal.h).
--
--   build/needle-lua spec/run.lua spec/binding_arity_spec.lua
--
-- The last test walks the tensor methods and the needle.core module: every C
-- function there must refuse a far extra argument, unless it is on the short
-- list of variadic ones below, so a binding added without an arity is caught.

local nd = require "needle"
local core = require "needle.core"
local S = require "spec.helpers.shell"

local A = require("spec.helpers.assertions").bind(assert)
local err_of, has = A.errmsg, A.assert_contains

-- C functions that take any number of arguments: fn and the arguments to call it with
local VARIADIC = {no_grad = true, enable_grad = true, inference_mode = true, _call_no_yield = true}

describe("C bindings refuse extra arguments", function()
  local x = nd.randn({3, 4})

  it("name the op, the form a method call takes and the position after self", function()
    has(err_of(function() return x:sum(1, true, 5) end),
        "needle.sum: takes x:sum([dim, keepdim, opts]) only, got an extra argument #3 (number)")
    has(err_of(function() return x:float(5) end), "needle.float: takes x:float() only, got an extra argument #1 (number)")
    has(err_of(function() return x:size(1, 2) end), "needle.size: takes x:size([dim]) only, got an extra argument #2 (number)")
    has(err_of(function() return x:transpose(1, 2, x) end),
        "needle.transpose: takes x:transpose(dim0, dim1) only, got an extra argument #3 (tensor)")
    has(err_of(function() return x:view(4, 3, "a") end),
        "needle.view: takes x:view(size... | {sizes}) only, got an extra argument #3 (string)")
    has(err_of(function() return x:view({4, 3}, 1) end), "got an extra argument #2 (number)")
  end)

  it("count every argument in a function call", function()
    has(err_of(nd.sum, x, 1, true, 5), "needle.sum: takes sum(x[, dim, keepdim, opts]) only, got an extra argument #4 (number)")
    has(err_of(nd.relu, x, 3), "needle.relu: takes relu(x) only, got an extra argument #2 (number)")
    has(err_of(nd.gelu, x, {approximate = "tanh"}),
        "needle.gelu: takes gelu(x) only, got an extra argument #2 (table); the tanh form is nd.F.gelu(x, {approximate = \"tanh\"})")
    has(err_of(nd.matmul, x, x:t(), x), "needle.matmul: takes matmul(x, y) only, got an extra argument #3 (tensor)")
    has(err_of(nd.where, x:gt(0), x, 0, 4), "needle.where: takes where(cond, x, y) only, got an extra argument #4 (number)")
  end)

  it("in every binding file", function()
    local cases = {
      -- lt_construct.c
      {function() return nd.full({2}, 1, {}, 5) end, "needle.full: takes full(size, value[, opts]) only, got an extra argument #4"},
      {function() return nd.zeros_like(x, {}, 1) end, "needle.zeros_like: takes zeros_like(x[, opts]) only, got an extra argument #3"},
      {function() return x:item(1) end, "needle.item: takes x:item() only, got an extra argument #1"},
      {function() return nd.randint(1, 5, {2}, {}, 7) end, "needle.randint: takes randint(low, high, size[, opts]) only, got an extra argument #5"},
      {function() return nd.arange(1, {}, 5) end, "needle.arange: takes arange([start, ]end[, step][, opts]) only, got an extra argument #3"},
      {function() return nd.eye(2, {}, 5) end, "needle.eye: takes eye(n[, m][, opts]) only, got an extra argument #3"},
      -- lt_math.c: the options table ends a reduction's list; only var/std take a 4th number
      {function() return x:add(1, 2) end, "needle.add: takes x:add(y) only, got an extra argument #2 (number)"},
      {function() return x:sum({dim = 1}, true) end, "needle.sum: takes x:sum([dim, keepdim, opts]) only, got an extra argument #2 (boolean)"},
      {function() return x:max(1, true, 5) end, "needle.max: takes x:max(dim[, keepdim]) only, got an extra argument #3 (number)"},
      {function() return x:clamp({min = 0}, 1) end, "needle.clamp: takes x:clamp({min=, max=}) only, got an extra argument #2"},
      {function() return nd.layer_norm(x, 4, nil, nil, 1e-5, 3) end,
       "needle.layer_norm: takes layer_norm(x, normalized_shape[, weight, bias, eps]) only, got an extra argument #6"},
      -- lt_shape.c
      {function() return nd.cat({x, x}, 1, 2) end, "needle.cat: takes cat(tensors[, dim]) only, got an extra argument #3"},
      {function() return x:flip(1, "a") end, "needle.flip: takes x:flip(dim... | {dims}) only, got an extra argument #2 (string)"},
      -- lt_index.c
      {function() return x:topk(1, 1, true, 5) end, "needle.topk: takes x:topk(k[, dim, largest]) only, got an extra argument #4"},
      {function() return x:sort({dim = 1}, true) end, "needle.sort: takes x:sort({dim=, descending=}) only, got an extra argument #2"},
      -- lt_autograd.c, also a hook handle's and a grad guard's methods
      {function() return x:detach(1) end, "needle.detach: takes x:detach() only, got an extra argument #1"},
      {function() return nd.set_grad_enabled(true, 1) end, "needle.set_grad_enabled: takes set_grad_enabled(on) only, got an extra argument #2"},
      {function() return x:backward({retain_graph = true}, 1) end, "needle.backward: takes x:backward([gradient][, opts]) only, got an extra argument #2"},
      {function()
        local w = nd.randn({2}, {requires_grad = true})
        local h = w:register_hook(function() end)
        return h:remove(1)
      end, "needle.remove: takes handle:remove() only, got an extra argument #1"},
      {function()
        local g = nd.no_grad()
        local ok, err = pcall(g.close, g, 1)
        g:close()
        error(err, 0)
      end, "needle.close: takes close(guard) only, got an extra argument #2"},
      -- lt_nn.c
      {function() return core.linear(x, nd.randn({2, 4}), nil, 5) end, "needle.linear: takes linear(x, weight[, bias]) only, got an extra argument #4"},
      {function() return core.max_pool2d(nd.randn({1, 1, 4, 4}), 2, {}, 1) end, "needle.max_pool2d: takes max_pool2d(x, kernel_size[, opts]) only"},
      -- lt_io.c, lt_torch.c: refused before the file is opened
      {function() return x:tobytes(1) end, "needle.tobytes: takes x:tobytes() only, got an extra argument #1"},
      {function() return core.gunzip("no such file", 10, 5) end, "needle.gunzip: takes gunzip(path[, max_bytes]) only, got an extra argument #3"},
      {function() return core.load_torch("no such file", nil, nil, 5) end, "needle.load_torch: takes load_torch(path[, opts, op]) only, got an extra argument #4"},
      -- lt_device.c, lt_opencl_tune.c, lt_profile.c, lt_optim.c, lt_graph.c, lt_dist.c, lt_linalg.c, lt_workers.c, lt_module.c
      {function() return core.synchronize("cpu", 1) end, "needle.synchronize: takes synchronize([device]) only, got an extra argument #2"},
      {function() return core.opencl_tune({}, 1) end, "needle.opencl_tune: takes opencl_tune([opts]) only, got an extra argument #2"},
      {function() return core.profiler_enabled(1) end, "needle.profiler_enabled: takes profiler_enabled() only, got an extra argument #1"},
      {function() return core.amp_unscale_(x, 1, 2) end, "needle.amp_unscale_: takes amp_unscale_(grad, inv_scale) only, got an extra argument #3"},
      {function() return core._graph_capturing(false) end, "needle._graph_capturing: takes _graph_capturing() only, got an extra argument #1 (boolean)"},
      {function() return core.dist_info({}) end, "needle.dist_info: takes dist_info() only, got an extra argument #1 (table)"},
      {function() return core._linalg_inv(nd.eye(2), 1) end, "needle._linalg_inv: takes _linalg_inv(A) only, got an extra argument #2"},
      {function() return core._workers_live(1) end, "needle._workers_live: takes _workers_live() only, got an extra argument #1"},
      {function() return core.clock(1) end, "needle.clock: takes clock() only, got an extra argument #1"},
      -- lt_tensor.c
      {function() return nd.is_tensor(x, x) end, "needle.is_tensor: takes is_tensor(value) only, got an extra argument #2 (tensor)"},
    }
    for _, c in ipairs(cases) do has(err_of(c[1]), c[2]) end
  end)

  it("at the user's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local msg = err_of(function() return x:exp(1) end)
    has(msg, "binding_arity_spec.lua:" .. line .. ": needle.exp:")
  end)

  it("let trailing nils pass", function()
    assert.are.same({}, x:sum(nil, nil, nil, nil, nil, nil).shape)
    assert.are.same({3}, x:sum(2, nil, nil, nil, nil).shape)
    assert.are.same({3, 4}, x:float(nil).shape)
    assert.are.same({3, 4}, nd.relu(x, nil, nil).shape)
    assert.are.same({3, 4}, x:exp(nil).shape)
    assert.are.same({4, 3}, x:view(4, 3, nil, nil).shape)
    assert.are.same({2}, nd.zeros({2}, nil, nil).shape)
    assert.are.same({2}, nd.tensor({1, 2}, nil, nil).shape)
    assert.are.same({3, 4}, nd.where(x:gt(0), x, 0, nil).shape)
    assert.are.equal(4, x:size(2, nil))
    assert.is_true(nd.is_tensor(x, nil))
    assert.are.same({3}, nd.layer_norm(nd.randn({3}), 3, nil, nil, 1e-5, nil).shape)
  end)

  it("read an options table after a nil placeholder for arange's step and eye's m", function()
    local r = nd.arange(1, 5, nil, {dtype = "float64"})
    assert.are.equal("float64", r.dtype)
    assert.are.same({1, 2, 3, 4}, r:tolist())
    local e = nd.eye(3, nil, {dtype = "float64"})
    assert.are.equal("float64", e.dtype)
    assert.are.same({3, 3}, e.shape)
    assert.are.same(nd.eye(3):double():tolist(), e:tolist())
  end)

  it("keep the bindings C functions, one value for a method and a function", function()
    assert.are.equal("C", debug.getinfo(nd.sum, "S").what)
    assert.is_true(rawequal(core._methods.sum, nd.sum))
    assert.is_true(rawequal(x.exp, nd.exp))
    assert.are.equal(x.where, x.where)
    local ok, err = pcall(function() return x:smu() end)
    assert.is_false(ok)
    has(tostring(err), "did you mean 'sum'?")
  end)

  -- Calling every binding with bogus arguments runs in a child process: a
  -- binding without an arity would run on them and might crash, which must
  -- fail this test rather than end the suite. With 11 nils and a table at #12
  -- the check refuses before the function runs.
  it("in every C function of the tensor methods and the module (a walk)", function()
    local out = S.run_program("", [[
      local nd = require "needle"
      local core = require "needle.core"
      local variadic = {]] .. (function()
        local names = {}
        for k in pairs(VARIADIC) do names[#names + 1] = ("[%q] = true"):format(k) end
        return table.concat(names, ", ")
      end)() .. [[}
      local seen, n = {}, 0
      local function walk(where, tbl)
        local keys = {}
        for k, v in pairs(tbl) do
          if type(k) == "string" and type(v) == "function" and debug.getinfo(v, "S").what == "C" then
            keys[#keys + 1] = k
          end
        end
        table.sort(keys)
        for _, k in ipairs(keys) do
          local f = tbl[k]
          if not variadic[k] and not seen[f] then
            seen[f] = true
            n = n + 1
            local ok, err = pcall(f, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, {})
            err = tostring(err)
            if ok or not err:find("extra argument #12 (table)", 1, true) or not err:find("needle." .. k .. ":", 1, true) then
              print(("UNCHECKED %s.%s: %s"):format(where, k, ok and "no error" or err))
            end
          end
        end
      end
      walk("methods", core._methods)
      walk("core", core)
      walk("nd", nd)
      print("WALKED " .. n)
    ]])
    assert.falsy(out:find("UNCHECKED", 1, true), out)
    local n = tonumber(out:match("WALKED (%d+)"))
    assert.truthy(n, out)
    assert.is_true(n > 200, out)
  end)

  it("its variadic list names functions that are there and are variadic", function()
    for k in pairs(VARIADIC) do
      assert.are.equal("function", type(core[k]), k)
      -- a variadic function runs with the extra arguments: no arity error
      local ok, err = pcall(core[k], function(a, b) return a + b end, 1, 2)
      assert.is_true(ok, k .. ": " .. tostring(err))
      assert.are.equal(3, err)
    end
  end)
end)
