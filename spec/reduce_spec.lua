-- reduce_spec.lua - sum mean prod max min argmax argmin var std logsumexp
-- over each dim, several dims and all dims, with and without keepdim, with
-- negative dims, on contiguous and non-contiguous inputs; checked against
-- the pure-Lua reference in spec/helpers/reference.lua.
--
--   build/needle-lua spec/run.lua spec/reduce_spec.lua

local nd = require "needle"
local R = require "spec.helpers.reference"
local S = require "spec.helpers.shell"

local close, equal = R.asserts(assert)

local T = require("spec.helpers.tensors").T -- a needle tensor of a reference's values

-- Distinct values (a permutation of 0..n-1, scaled), so that max/min and
-- their indices are unambiguous.
local function distinct(shape, seed)
  local n = R.numel(shape)
  local perm = {}
  for i = 1, n do perm[i] = i - 1 end
  local rnd = R.lcg(seed)
  for i = n, 2, -1 do
    local j = rnd(1, i)
    perm[i], perm[j] = perm[j], perm[i]
  end
  return R.generate(shape, function(i) return (perm[i + 1] - n / 2) / 4 end)
end

-- values near 1 so that products over 60 elements stay moderate
local function near_one(shape, seed) return R.grid(shape, seed, 0.5, 1.5) end

local value_ops = { "sum", "mean", "prod", "max", "min", "var", "std", "logsumexp" }
local ref_fn = {
  sum = R.red.sum, mean = R.red.mean, prod = R.red.prod, max = R.red.max, min = R.red.min,
  var = R.red.var, std = R.red.std, logsumexp = R.red.logsumexp,
  argmax = R.red.argmax, argmin = R.red.argmin,
}
local function data_for(op)
  if op == "prod" then return near_one end
  return distinct
end
local tol = { rtol = 1e-5, atol = 1e-5 }

-- Input layouts of a {3,4,5} tensor (make(gen, seed) -> x, reference).
local layouts = {
  { name = "contiguous {3,4,5}", make = function(gen, seed)
      local r = gen({ 3, 4, 5 }, seed)
      return T(r), r
    end },
  { name = "permuted {5,3,4}:permute(2,3,1)", noncontig = true, make = function(gen, seed)
      local b = gen({ 5, 3, 4 }, seed)
      return T(b):permute(2, 3, 1), R.permute(b, { 2, 3, 1 })
    end },
  { name = "transpose(1,3) of {5,4,3}", noncontig = true, make = function(gen, seed)
      local b = gen({ 5, 4, 3 }, seed)
      return T(b):transpose(1, 3), R.permute(b, { 3, 2, 1 })
    end },
  { name = "step slice of {3,8,5} along dim 2", noncontig = true, make = function(gen, seed)
      local b = gen({ 3, 8, 5 }, seed)
      return T(b):slice(2, 1, -1, 2), R.slice(b, 2, 1, -1, 2)
    end },
  { name = "expanded {3,1,5} -> {3,4,5}", noncontig = true, make = function(gen, seed)
      local b = gen({ 3, 1, 5 }, seed)
      return T(b):expand({ 3, 4, 5 }), R.expand(b, { 3, 4, 5 })
    end },
}

local function call(x, op, dims, keepdim)
  return x[op](x, dims, keepdim)
end

---------------------------------------------------------------------------
describe("reductions", function()
  for _, op in ipairs(value_ops) do
    describe(op, function()
      for li, layout in ipairs(layouts) do
        it("over each dim (1, 2, 3, -1, -2, -3) with and without keepdim: " .. layout.name, function()
          local x, ref = layout.make(data_for(op), 10 + li)
          if layout.noncontig then assert.is_false(x:is_contiguous()) end
          assert.are.same({ 3, 4, 5 }, x.shape)
          for _, d in ipairs({ 1, 2, 3, -1, -2, -3 }) do
            for _, keep in ipairs({ false, true }) do
              local y = call(x, op, d, keep)
              if op == "max" or op == "min" then y = (x[op](x, d, keep)) end
              close(y, R.reduce(ref, d, keep, ref_fn[op]), tol,
                    ("%s(%d, %s)"):format(op, d, tostring(keep)))
            end
          end
        end)

        it("over several dims ({1,3}, {3,1}, {-1,2}) and all dims: " .. layout.name, function()
          if op == "max" or op == "min" then
            -- max/min take one dim (several returns); the dim-list form is amax/amin in
            -- PyTorch: only the all-dims form is checked here
            local x, ref = layout.make(data_for(op), 20 + li)
            close(x[op](x), R.reduce(ref, nil, false, ref_fn[op]), tol, op .. "()")
            return
          end
          local x, ref = layout.make(data_for(op), 20 + li)
          for _, dims in ipairs({ { 1, 3 }, { 3, 1 }, { -1, 2 }, { 1, 2, 3 } }) do
            for _, keep in ipairs({ false, true }) do
              close(call(x, op, dims, keep), R.reduce(ref, dims, keep, ref_fn[op]), tol,
                    ("%s(%s, %s)"):format(op, R.shape_str(dims), tostring(keep)))
            end
          end
          local all = x[op](x)
          assert.are.same({}, all.shape)
          close(all, R.reduce(ref, nil, false, ref_fn[op]), tol, op .. "()")
          local allk = x[op](x, nil, true)
          assert.are.same({ 1, 1, 1 }, allk.shape)
          close(allk, R.reduce(ref, nil, true, ref_fn[op]), tol, op .. "(nil, true)")
        end)
      end

      it("as nd." .. op .. "(x, dim) and nd." .. op .. "(x)", function()
        local x, ref = layouts[1].make(data_for(op), 33)
        local y = nd[op](x, 2)
        if op == "max" or op == "min" then y = (nd[op](x, 2)) end
        close(y, R.reduce(ref, 2, false, ref_fn[op]), tol)
        close(nd[op](x), R.reduce(ref, nil, false, ref_fn[op]), tol)
      end)

      it("result dtype is float32 for float32 input and the input is unchanged", function()
        local x, ref = layouts[2].make(data_for(op), 34)
        local y = x[op](x, 1)
        assert.are.equal("float32", y.dtype)
        equal(x, ref)
      end)

      it("float64 input gives float64 with double precision", function()
        local ref = R.generate({ 4, 6 }, function(i) return 1 + (i % 7) / 3 end)
        local x = T(ref, "float64")
        local y = x[op](x, 2)
        if op == "max" or op == "min" then y = (x[op](x, 2)) end
        assert.are.equal("float64", y.dtype)
        close(y, R.reduce(ref, 2, false, ref_fn[op]), { rtol = 1e-12, atol = 1e-12 })
      end)
    end)
  end

  it("reduce a 0-dim tensor (dim 1 or -1 or none)", function()
    local x = nd.tensor(2.5)
    for _, op in ipairs({ "sum", "mean", "prod", "logsumexp" }) do
      close(x[op](x), 2.5, nil, op)
      close(x[op](x, 1), 2.5, nil, op .. "(1)")
      close(x[op](x, -1), 2.5, nil, op .. "(-1)")
    end
    close(x:max(), 2.5)
  end)

  it("reduce over a size-1 dim keeps the values", function()
    local ref = distinct({ 3, 1, 4 }, 5)
    local x = T(ref)
    for _, op in ipairs({ "sum", "mean", "prod", "logsumexp" }) do
      close(x[op](x, 2), R.reduce(ref, 2, false, ref_fn[op]), tol, op)
    end
    local v, i = x:max(2)
    equal(v, R.reduce(ref, 2, false, R.red.max))
    equal(i, R.generate({ 3, 4 }, function() return 1 end))
  end)
end)

---------------------------------------------------------------------------
describe("max(dim) and min(dim)", function()
  for li, layout in ipairs(layouts) do
    it("return values and 1-based indices along each dim: " .. layout.name, function()
      local x, ref = layout.make(distinct, 40 + li)
      for _, d in ipairs({ 1, 2, 3, -1 }) do
        for _, keep in ipairs({ false, true }) do
          local v, i = x:max(d, keep)
          close(v, R.reduce(ref, d, keep, R.red.max), tol, "max values " .. d)
          assert.are.equal("int64", i.dtype)
          equal(i, R.reduce(ref, d, keep, R.red.argmax), "max indices " .. d)
          v, i = x:min(d, keep)
          close(v, R.reduce(ref, d, keep, R.red.min), tol, "min values " .. d)
          equal(i, R.reduce(ref, d, keep, R.red.argmin), "min indices " .. d)
        end
      end
    end)
  end

  it("nd.max(x, dim) also returns both", function()
    local x = nd.tensor({ { 1, 9, 3 }, { 7, 2, 8 } })
    local v, i = nd.max(x, 2)
    equal(v, { 9, 8 })
    equal(i, { 2, 3 })
    v, i = nd.min(x, 1)
    equal(v, { 1, 2, 3 })
    equal(i, { 1, 2, 1 })
  end)

  it("indices are usable to index back (values == x[row][index])", function()
    local ref = distinct({ 6, 7 }, 44)
    local x = T(ref)
    local v, i = x:max(2)
    local vt, it_ = v:totable(), i:totable()
    for r = 1, 6 do
      assert.are.equal(R.get(ref, { r, it_[r] }), vt[r])
    end
  end)

  it("int64 input keeps int64 values", function()
    local x = nd.tensor({ { 3, -7, 5 }, { math.maxinteger, 0, math.mininteger } }, { dtype = "int64" })
    local v, i = x:max(2)
    assert.are.equal("int64", v.dtype)
    assert.are.equal(math.maxinteger, v:totable()[2])
    equal(i, { 3, 1 })
    v, i = x:min(2)
    assert.are.equal(math.mininteger, v:totable()[2])
    equal(i, { 2, 3 })
  end)
end)

---------------------------------------------------------------------------
describe("argmax and argmin", function()
  for li, layout in ipairs(layouts) do
    it("without dim give the flattened 1-based index: " .. layout.name, function()
      local x, ref = layout.make(distinct, 50 + li)
      if layout.name:find("expanded") then return end -- repeated values: ties
      local am, an = x:argmax(), x:argmin()
      assert.are.equal("int64", am.dtype)
      assert.are.same({}, am.shape)
      assert.are.equal(R.red.argmax(ref.data), am:item())
      assert.are.equal(R.red.argmin(ref.data), an:item())
    end)

    it("along each dim with and without keepdim: " .. layout.name, function()
      local x, ref = layout.make(distinct, 60 + li)
      for _, d in ipairs({ 1, 2, 3, -1, -3 }) do
        for _, keep in ipairs({ false, true }) do
          equal(x:argmax(d, keep), R.reduce(ref, d, keep, R.red.argmax), "argmax " .. d)
          equal(x:argmin(d, keep), R.reduce(ref, d, keep, R.red.argmin), "argmin " .. d)
        end
      end
    end)
  end

  it("nd.argmax(x) and nd.argmin(x, dim)", function()
    local x = nd.tensor({ { 1, 9, 3 }, { 7, 2, 8 } })
    assert.are.equal(2, nd.argmax(x):item())
    assert.are.equal(1, nd.argmin(x):item())
    equal(nd.argmin(x, 2), { 1, 2 })
  end)

  it("with several dims is an error", function()
    local ok, err = pcall(function() return nd.ones({ 2, 3 }):argmax({ 1, 2 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.argmax:", 1, true), err)
  end)
end)

---------------------------------------------------------------------------
describe("var and std", function()
  local ref = distinct({ 3, 4, 5 }, 70)
  for _, c in ipairs({ 0, 1 }) do
    it("with correction " .. c .. " over each dim (positional correction)", function()
      local x = T(ref)
      for _, d in ipairs({ 1, 2, 3, -1 }) do
        close(x:var(d, false, c), R.reduce(ref, d, false, R.red.var_c(c)), tol, "var " .. d)
        close(x:std(d, false, c), R.reduce(ref, d, false, R.red.std_c(c)), tol, "std " .. d)
        close(x:var(d, true, c), R.reduce(ref, d, true, R.red.var_c(c)), tol, "var keepdim " .. d)
      end
    end)

    it("with {correction = " .. c .. "} as fourth argument, over all dims and {1,3}", function()
      local x = T(ref)
      close(x:var(nil, false, { correction = c }), R.reduce(ref, nil, false, R.red.var_c(c)), tol)
      close(x:std(nil, false, { correction = c }), R.reduce(ref, nil, false, R.red.std_c(c)), tol)
      close(x:var({ 1, 3 }, false, { correction = c }), R.reduce(ref, { 1, 3 }, false, R.red.var_c(c)), tol)
      close(nd.std(x, 2, false, { correction = c }), R.reduce(ref, 2, false, R.red.std_c(c)), tol)
    end)
  end

  it("default correction is 1 (unbiased)", function()
    local x = nd.tensor({ 1, 2, 3, 4 })
    close(x:var(), 5 / 3)
    close(x:std(), math.sqrt(5 / 3))
  end)

  it("{unbiased = false} means correction 0", function()
    local x = nd.tensor({ 1, 2, 3, 4 })
    close(x:var(nil, false, { unbiased = false }), 1.25)
  end)

  it("options table as the trailing argument: x:var({correction = 0}) and x:var(2, {correction = 0})", function()
    -- API.md: "PyTorch's keyword arguments in a trailing options table"
    local x = nd.tensor({ { 1, 2, 3, 4 }, { 2, 4, 6, 8 } })
    local rx = R.from({ { 1, 2, 3, 4 }, { 2, 4, 6, 8 } })
    close(x:var({ correction = 0 }), R.reduce(rx, nil, false, R.red.var_c(0)), tol, "x:var({correction=0})")
    local y = x:var(2, { correction = 0 })
    close(y, R.reduce(rx, 2, false, R.red.var_c(0)), tol, "x:var(2, {correction=0})")
  end)

  it("var of a single element with correction 1 is nan", function()
    close(nd.tensor({ 3 }):var(), 0 / 0)
    close(nd.tensor({ 3 }):var(nil, false, 0), 0)
  end)

  it("var and std of int64 give float32", function()
    local x = nd.tensor({ 1, 2, 3, 4 }, { dtype = "int64" })
    local v = x:var()
    assert.are.equal("float32", v.dtype)
    close(v, 5 / 3)
  end)

  it("is stable for large offsets (two-pass)", function()
    local x = nd.tensor({ 1e6 + 1, 1e6 + 2, 1e6 + 3, 1e6 + 4 }, { dtype = "float64" })
    close(x:var(nil, false, 0), 1.25, { rtol = 1e-9, atol = 1e-9 })
  end)
end)

---------------------------------------------------------------------------
describe("logsumexp", function()
  it("is stable with large values (1000)", function()
    local x = nd.tensor({ { 1000, 1000 }, { 1000, 0 }, { -1000, -1000 } })
    local y = x:logsumexp(2)
    close(y, { 1000 + math.log(2), 1000, -1000 + math.log(2) }, { rtol = 1e-6, atol = 1e-4 })
    close(nd.tensor({ 1000, 1000, 1000 }):logsumexp(), 1000 + math.log(3), { rtol = 1e-6, atol = 1e-4 })
  end)

  it("over dim 1 of large values, keepdim", function()
    local ref = R.map(distinct({ 3, 4 }, 80), function(v) return v * 100 + 1000 end)
    local x = T(ref)
    close(x:logsumexp(1, true), R.reduce(ref, 1, true, R.red.logsumexp), { rtol = 1e-6, atol = 1e-3 })
  end)

  it("handles -inf and +inf entries", function()
    close(nd.tensor({ -math.huge, -math.huge }):logsumexp(), -math.huge)
    close(nd.tensor({ -math.huge, 0 }):logsumexp(), 0)
    close(nd.tensor({ math.huge, 0 }):logsumexp(), math.huge)
  end)

  it("nd.logsumexp(x, dim)", function()
    local ref = distinct({ 2, 5 }, 81)
    close(nd.logsumexp(T(ref), -1), R.reduce(ref, -1, false, R.red.logsumexp), tol)
  end)
end)

---------------------------------------------------------------------------
describe("NaN", function()
  local nan = 0 / 0
  it("max and min of a tensor with NaN are NaN", function()
    local x = nd.tensor({ 1, nan, 3 })
    close(x:max(), nan)
    close(x:min(), nan)
  end)

  it("max(dim) propagates NaN per row and points at it", function()
    local x = nd.tensor({ { 1, nan, 3 }, { 4, 5, 6 }, { nan, 9, 0 } })
    local v, i = x:max(2)
    close(v, { nan, 6, nan })
    equal(i, { 2, 3, 1 })
    v, i = x:min(2)
    close(v, { nan, 4, nan })
    equal(i, { 2, 1, 1 })
  end)

  it("argmax points at the NaN", function()
    assert.are.equal(3, nd.tensor({ 1, 5, nan, 2 }):argmax():item())
    assert.are.equal(3, nd.tensor({ 1, 5, nan, 2 }):argmin():item())
  end)

  it("sum and mean propagate NaN", function()
    local x = nd.tensor({ { 1, nan }, { 2, 3 } })
    close(x:sum(2), { nan, 5 })
    close(x:mean(), nan)
  end)
end)

---------------------------------------------------------------------------
describe("integer and bool inputs", function()
  it("sum of int64, int32, uint8 and bool tensors gives int64", function()
    for _, dt in ipairs({ "int64", "int32", "uint8", "bool" }) do
      local data = dt == "bool" and { { true, false, true }, { true, true, false } } or { { 1, 2, 3 }, { 4, 5, 6 } }
      local x = nd.tensor(data, { dtype = dt })
      local s = x:sum()
      assert.are.equal("int64", s.dtype, dt)
      assert.are.equal("integer", math.type(s:item()), dt)
      local want = dt == "bool" and 4 or 21
      assert.are.equal(want, s:item(), dt)
      local s2 = x:sum(1)
      assert.are.equal("int64", s2.dtype, dt)
    end
  end)

  it("sum of uint8 does not wrap at 256", function()
    local x = nd.full({ 100 }, 200, { dtype = "uint8" })
    assert.are.equal(20000, x:sum():item())
  end)

  it("int64 sum is exact above 2^53 and wraps like Lua integers", function()
    local big = (1 << 53) + 1
    local x = nd.tensor({ big, 2, math.maxinteger }, { dtype = "int64" })
    local t = x:sum():totable()
    assert.are.equal(("%d"):format(big + 2 + math.maxinteger), ("%d"):format(t))
    local y = nd.tensor({ big, 2 }, { dtype = "int64" })
    assert.are.equal(("%d"):format(big + 2), ("%d"):format(y:sum():totable()))
  end)

  it("prod of int64 gives int64", function()
    local x = nd.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "int64" })
    local p = x:prod(2)
    assert.are.equal("int64", p.dtype)
    equal(p, { 6, 120 })
  end)

  it("int64 sum over a dim of a transposed tensor", function()
    local ref = R.ints({ 5, 4 }, 3, -1000, 1000)
    local x = T(ref, "int64"):t()
    equal(x:sum(2), R.reduce(R.transpose(ref), 2, false, R.red.sum))
    equal(x:sum(1), R.reduce(R.transpose(ref), 1, false, R.red.sum))
  end)

  it("mean of int64 gives float32", function()
    local m = nd.tensor({ 1, 2, 4 }, { dtype = "int64" }):mean()
    assert.are.equal("float32", m.dtype)
    close(m, 7 / 3)
  end)

  it("max of int32 and of bool keep the dtype", function()
    local m = nd.tensor({ 1, 7, 3 }, { dtype = "int32" }):max()
    assert.are.equal("int32", m.dtype)
    assert.are.equal(7, m:item())
    local b = nd.tensor({ false, true }):max()
    assert.are.equal("bool", b.dtype)
  end)
end)

---------------------------------------------------------------------------
describe("empty tensors", function()
  local e = nd.zeros({ 0, 3 })

  it("mean of an empty tensor is nan", function()
    close(e:mean(), 0 / 0)
    close(nd.zeros({ 0 }):mean(), 0 / 0)
  end)

  it("sum of an empty tensor is 0 and prod is 1", function()
    close(e:sum(), 0)
    close(e:prod(), 1)
    local s = e:sum(1)
    assert.are.same({ 3 }, s.shape)
    equal(s, { 0, 0, 0 })
    local s2 = e:sum(2)
    assert.are.same({ 0 }, s2.shape)
  end)

  it("logsumexp of an empty tensor is -inf", function()
    close(e:logsumexp(), -math.huge)
  end)

  it("max and min of an empty tensor are errors", function()
    for _, op in ipairs({ "max", "min", "argmax", "argmin" }) do
      local ok, err = pcall(function() return e[op](e) end)
      assert.is_false(ok, op)
      assert.truthy(err:find("needle." .. op .. ":", 1, true), err)
      assert.truthy(err:find("{0,3}", 1, true), err)
    end
  end)

  it("max(dim) over a zero-size dim is an error, over a non-empty dim gives an empty result", function()
    local ok, err = pcall(function() return e:max(1) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.max:", 1, true), err)
    local v, i = e:max(2)
    assert.are.same({ 0 }, v.shape)
    assert.are.same({ 0 }, i.shape)
  end)
end)

---------------------------------------------------------------------------
describe("large inputs (threaded paths)", function()
  local function big(n, seed)
    return R.generate({ n }, function(i) return ((i * 7919 + seed) % 1001 - 500) / 64 end)
  end

  it("sum, mean, max, min of 100000 contiguous elements", function()
    local ref = big(100000, 1)
    local x = T(ref)
    close(x:sum(), R.red.sum(ref.data), { rtol = 1e-5, atol = 1e-3 })
    close(x:mean(), R.red.mean(ref.data), { rtol = 1e-5, atol = 1e-6 })
    close(x:max(), R.red.max(ref.data))
    close(x:min(), R.red.min(ref.data))
    assert.are.equal(R.red.argmax(ref.data), x:argmax():item())
  end)

  it("sum and max of a step-sliced 200000 -> 100000 view", function()
    local ref = big(200000, 2)
    local x = T(ref):slice(1, 2, -1, 2)
    assert.are.same({ 100000 }, x.shape)
    local vals = {}
    for i = 2, 200000, 2 do vals[#vals + 1] = ref.data[i] end
    close(x:sum(), R.red.sum(vals), { rtol = 1e-5, atol = 1e-3 })
    close(x:max(), R.red.max(vals))
    close(x:min(), R.red.min(vals))
  end)

  it("NaN in a large tensor propagates through the threaded max", function()
    local ref = big(150000, 3)
    ref.data[140000] = 0 / 0
    local x = T(ref)
    close(x:max(), 0 / 0)
    close(x:min(), 0 / 0)
  end)

  it("sum over each dim of a transposed 500x200 tensor", function()
    local ref = R.generate({ 200, 500 }, function(i) return ((i * 31) % 17 - 8) / 4 end)
    local x = T(ref):t()
    local rt = R.transpose(ref)
    close(x:sum(1), R.reduce(rt, 1, false, R.red.sum), { rtol = 1e-5, atol = 1e-4 })
    close(x:sum(2), R.reduce(rt, 2, false, R.red.sum), { rtol = 1e-5, atol = 1e-4 })
    local v, i = x:max(2)
    close(v, R.reduce(rt, 2, false, R.red.max))
    equal(i, R.reduce(rt, 2, false, R.red.argmax))
  end)

  it("results do not depend on the thread count", function()
    local ref = big(120000, 4)
    local x = T(ref)
    local n0 = nd.get_num_threads()
    local results = {}
    local ok, err = pcall(function()
      for _, n in ipairs({ 1, 3, 4 }) do
        nd.set_num_threads(n)
        results[#results + 1] = { x:max():item(), x:min():item(), x:sum():item() }
      end
    end)
    nd.set_num_threads(n0)
    if not ok then error(err, 0) end
    for _, r in ipairs(results) do
      assert.are.equal(R.red.max(ref.data), r[1])
      assert.are.equal(R.red.min(ref.data), r[2])
      assert.is_true(math.abs(r[3] - R.red.sum(ref.data)) <= 1e-5 * math.abs(R.red.sum(ref.data)) + 1e-3)
    end
  end)

  it("a full reduction is right when OpenMP grants fewer threads than asked", function()
    local exe = S.needle_lua()
    local out = S.shell_line("OMP_NUM_THREADS=8 OMP_THREAD_LIMIT=2 " .. S.q(exe) ..
      " -e 'print(nd.ones({1000000}):sum():item(), nd.ones({1000000}):max():item())'")
    assert.are.equal("1000000.0\t1.0", out)
  end)
end)

---------------------------------------------------------------------------
describe("bad arguments", function()
  local x = nd.ones({ 2, 3, 4 })

  it("a dim out of range names the 1-based dim and the valid range", function()
    local ok, err = pcall(function() return x:sum(4) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.sum: dim 4 out of range", 1, true), err)
    assert.truthy(err:find("1..3", 1, true), err)
    assert.truthy(err:find("-3..-1", 1, true), err)
    ok, err = pcall(function() return x:mean(-4) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.mean: dim -4 out of range", 1, true), err)
    assert.truthy(err:find("1..3", 1, true), err)
  end)

  it("out-of-range dims for every reduction, in a list too", function()
    for _, op in ipairs({ "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "logsumexp" }) do
      local ok, err = pcall(function() return x[op](x, 5) end)
      assert.is_false(ok, op)
      assert.truthy(err:find("needle." .. op .. ": dim 5 out of range", 1, true), err)
    end
    local ok, err = pcall(function() return x:sum({ 1, 7 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("dim 7 out of range", 1, true), err)
  end)

  it("dim 0 is invalid (dims are 1-based)", function()
    local ok, err = pcall(function() return x:sum(0) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.sum:", 1, true), err)
    assert.truthy(err:find("dim 0", 1, true), err)
  end)

  it("a repeated dim is an error naming it", function()
    local ok, err = pcall(function() return x:sum({ 2, -2 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.sum:", 1, true), err)
    assert.truthy(err:find("more than once", 1, true), err)
  end)

  it("a string dim is an error", function()
    local ok, err = pcall(function() return x:sum("x") end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.sum:", 1, true), err)
    assert.truthy(err:find("string", 1, true), err)
  end)

  it("a non-tensor self is an error", function()
    local ok, err = pcall(nd.sum, "x")
    assert.is_false(ok)
    assert.truthy(err:find("needle.sum:", 1, true), err)
  end)
end)

describe("sum and mean over rows (the kept dims contiguous)", function()
  -- cpu_reduce.c adds such rows in order into accumulators: the same additions as
  -- summing each column of a transposed copy, so the same bits
  it("give the bits of the column-by-column sum, for float32 and float64, in blocks and in parallel", function()
    nd.manual_seed(12)
    for _, dt in ipairs({"float32", "float64"}) do
      for _, shape in ipairs({{20, 1024}, {700, 1030}, {3, 5}, {35, 20, 300}, {2, 2, 257}}) do
        local x = nd.randn(shape, {dtype = dt}) * 3
        local d = #shape == 3 and 2 or 1
        for _, op in ipairs({"sum", "mean"}) do
          local rows = x[op](x, d)
          local moved = x:transpose(d, #shape):contiguous() -- the reduced dim last, dense
          local cols = moved[op](moved, #shape)
          assert.are.equal(cols:tobytes(), rows:tobytes(), ("%s %s over dim %d of {%s}"):format(
            dt, op, d, table.concat(shape, ",")))
          -- and against float64 arithmetic
          local want = x:double()[op](x:double(), d)
          assert.is_true(((rows:double() - want):abs():max():item()) <= 1e-5 * want:abs():max():item() + 1e-6)
        end
      end
    end
  end)

  it("read a view with an offset, and agree with the strided walk on a non-contiguous input", function()
    local v = nd.randn({10, 64})[{{3, 8}}] -- rows 3..8: an offset, rows dense
    assert.are.equal(v:t():contiguous():sum(2):tobytes(), v:sum(1):tobytes())
    local w = nd.randn({50, 8, 2})[{{}, {}, 1}] -- (50, 8), its kept dim of stride 2: the column walk
    assert.is_false(w:is_contiguous())
    assert.are.equal(w:contiguous():sum(1):tobytes(), w:sum(1):tobytes())
    assert.are.equal(w:contiguous():mean(1):tobytes(), w:mean(1):tobytes())
  end)
end)
