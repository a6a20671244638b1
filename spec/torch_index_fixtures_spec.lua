-- torch_index_fixtures_spec.lua - outputs and gradients of the index, join
-- and sort ops against PyTorch, from the fixtures
-- spec/fixtures/gen/gen_torch_index.py wrote (float32; relative tolerance
-- 1e-5 with an absolute floor of 1e-6). PyTorch is not needed here. Dims and
-- index values in the fixtures are 1-based.
local nd = require "needle"
local X = require("spec.helpers.fixtures").bind(assert, 1e-6)
local fixtures = X.load("torch_index")

local function index(t)
  return nd.tensor(t.data, {dtype = "int64"}):reshape(t.shape)
end

local function mask(t)
  return nd.tensor(t.data, {dtype = "int64"}):reshape(t.shape):gt(0)
end

-- the needle call for each fixture name, given the case's arguments
local ops = {
  gather = function(c) return function(x) return x:gather(c.dim, index(c.index)) end end,
  scatter = function(c) return function(x, s) return x:scatter(c.dim, index(c.index), s) end end,
  scatter_add = function(c)
    return function(x, s) return x:scatter_add(c.dim, index(c.index), s) end
  end,
  index_select = function(c) return function(x) return x:index_select(c.dim, index(c.index)) end end,
  index_add = function(c)
    return function(x, s) return x:index_add(c.dim, index(c.index), s, c.alpha) end
  end,
  masked_fill = function(c) return function(x) return x:masked_fill(mask(c.mask), c.value) end end,
  cumsum = function(c) return function(x) return x:cumsum(c.dim) end end,
  sort = function(c) return function(x) return (x:sort(c.dim, c.descending)) end end,
  topk = function(c) return function(x) return (x:topk(c.k, c.dim, c.largest)) end end,
  cat = function(c) return function(...) return nd.cat({...}, c.dim) end end,
  stack = function(c) return function(...) return nd.stack({...}, c.dim) end end,
  flip = function(c) return function(x) return x:flip(c.dims) end end,
  pad = function(c) return function(x) return x:pad(c.pads, c.value) end end,
}

describe("index, join and sort ops against PyTorch fixtures", function()
  for n, c in ipairs(fixtures) do
    local name = ("%s (case %d)"):format(c.name, n)
    it(name, function()
      local make = assert(ops[c.name], "no needle op for fixture " .. c.name)
      local fn = make(c)
      X.check_case(name, c, function(...)
        local out = fn(...)
        assert.are.equal("float32", out.dtype)
        return out
      end, {allow_unused = true})
    end)
  end
end)
