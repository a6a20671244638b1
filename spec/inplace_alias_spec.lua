-- inplace_alias_spec.lua - in-place ops write straight into their target
-- when that is safe; operands that overlap the target must still give the
-- out-of-place answer (computed here by hand from the original values).
local nd = require "needle"

describe("in-place ops and aliasing", function()
  it("x:add_(x) doubles every element", function()
    local x = nd.arange(6):float()
    x:add_(x)
    assert.are.same({0, 2, 4, 6, 8, 10}, x:totable())
  end)

  it("x:add_(reversed view of x) uses the original values", function()
    local x = nd.arange(6):float()
    x:add_(x:flip(1))               -- flip copies: 5 everywhere
    assert.are.same({5, 5, 5, 5, 5, 5}, x:totable())
    local y = nd.arange(6):float()
    local rev = y:view({6}):slice(1, 1, 6)   -- same view: allowed in place
    y:mul_(rev)
    assert.are.same({0, 1, 4, 9, 16, 25}, y:totable())
  end)

  it("a shifted overlapping view reads the values before the write", function()
    local x = nd.arange(6):float()  -- {0,1,2,3,4,5}
    x[{{2, 6}}]:add_(x[{{1, 5}}])     -- x[i] += old x[i-1]
    assert.are.same({0, 1, 3, 5, 7, 9}, x:totable())
  end)

  it("broadcast operand and dtype change still work in place", function()
    local x = nd.ones({2, 3})
    x:add_(nd.tensor({1, 2, 3}))
    assert.are.same({{2, 3, 4}, {2, 3, 4}}, x:totable())
    local i = nd.arange(3)           -- int64 += int: stays exact
    i:add_(2)
    assert.are.same({2, 3, 4}, i:totable())
    assert.are.equal("int64", i.dtype)
  end)

  it("refuses a float result written into an integer tensor (as PyTorch)", function()
    local i = nd.arange(3)
    local ok, err = pcall(function() i:add_(0.5) end)
    assert.is_false(ok)
    assert.truthy(err:find("needle.add_: the result has dtype float32, which cannot be written in place into a tensor of dtype int64", 1, true), err)
    ok, err = pcall(function() i:div_(2) end)   -- true division gives float
    assert.is_false(ok)
    assert.truthy(err:find("float32", 1, true), err)
    assert.are.same({0, 1, 2}, i:totable())     -- untouched
  end)

  it("copy_ with an overlapping shifted source reads the original values", function()
    local x = nd.arange(20):reshape({10, 2})
    x[{{2, 10}, 1}] = x[{{1, 9}, 1}]
    assert.are.same({0, 0, 2, 4, 6, 8, 10, 12, 14, 16}, x[{":", 1}]:totable())
  end)

  it("copy_ of a transposed view of itself transposes", function()
    local y = nd.arange(9):reshape({3, 3})
    y:copy_(y:t())
    assert.are.same({{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}, y:totable())
  end)
end)
