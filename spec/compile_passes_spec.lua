-- compile_passes_spec.lua - the passes over a captured graph
-- (src/ops/graph_passes.c), each on its own: what it removes, what it must
-- keep, and that the replays still give the eager results.
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local errmsg, assert_contains = A.errmsg, A.assert_contains

local function max_abs(a, b) return (a:double() - b:double()):abs():max():item() end

-- a compiled f with only the given passes; returns it after two calls
local function compiled(f, passes, ...)
  local cf = nd.compile(f, {passes = passes, verify = true})
  cf(...)
  cf(...)
  return cf
end

local function removed(cf, name)
  for _, p in ipairs(cf.last.passes) do if p[1] == name then return p[2] end end
  return nil
end

local function entries(cf)
  local out = {}
  for _, r in ipairs(cf.last.graph:records()) do
    local k = r.entry .. (r.detail and ("." .. r.detail) or "")
    out[k] = (out[k] or 0) + 1
  end
  return out
end

describe("pass dce", function()
  it("drops kernels whose results nothing reads", function()
    local f = function(x)
      local unused = (x * 3):exp() -- computed, never used
      local _ = unused:sum()
      return x + 1
    end
    local cf = compiled(f, {"dce"}, nd.ones(4))
    assert.are.equal(3, removed(cf, "dce"))
    assert.are.same({["binary_scalar.add"] = 1}, entries(cf))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(4) * i), f(nd.ones(4) * i))) end
  end)

  it("keeps what is seen after the call: outputs, arguments updated in place, parameters", function()
    local w = nd.ones(3)
    local f = function(x)
      x:mul_(2)          -- an argument updated in place
      w:add_(1)          -- a tensor from outside
      local y = x * 5    -- an output
      return y
    end
    local cf = compiled(f, {"dce"}, nd.ones(3))
    assert.are.equal(0, removed(cf, "dce"))
    for i = 1, 3 do -- replays: the argument and w still change
      local x = nd.ones(3) * i
      local before = w:clone()
      cf(x)
      assert.are.equal(0, max_abs(x, nd.ones(3) * 2 * i))
      assert.are.equal(0, max_abs(w, before + 1))
    end
  end)

  it("keeps index kernels whose results are unused (their bounds checks must still refuse)", function()
    local table_ = nd.randn(10, 2)
    local f = function(ids) local _ = table_:index_select(1, ids); return ids * 1 end
    local cf = compiled(f, {"dce"}, nd.tensor({1, 2}, {dtype = "int64"}))
    assert.are.equal(1, entries(cf).index_select)
    assert_contains(errmsg(cf, nd.tensor({1, 99}, {dtype = "int64"})), "out of bounds")
  end)

  it("keeps random draws (the stream must advance as eagerly) and host checks", function()
    local f = function(x, y)
      local _ = nd.F.dropout(x, 0.5, true) -- unused, but it draws
      local _ = nd.F.cross_entropy(x, y)   -- unused, but it checks the labels
      return x * 2
    end
    local x, y = nd.randn(3, 4), nd.tensor({1, 2, 3}, {dtype = "int64"})
    local cf = compiled(f, {"dce"}, x, y)
    local e = entries(cf)
    assert(e.random and e.random >= 1, "the dropout draw was dropped")
    assert(e.host_check and e.host_check >= 1, "the label check was dropped")
    assert_contains(errmsg(cf, x, nd.tensor({1, 2, 9}, {dtype = "int64"})), "out of range")
  end)

  it("drops a store that a later whole write overwrites before any read", function()
    local out = nd.zeros(3)
    local f = function(x)
      out:copy_(x * 2)   -- overwritten below before anyone reads it
      out:copy_(x * 3)
      return out * 1
    end
    local cf = compiled(f, {"dce"}, nd.ones(3))
    assert.are.equal(2, removed(cf, "dce"))
    assert.are.equal(9, cf(nd.ones(3)):sum():item())
  end)
end)

describe("pass cse", function()
  it("computes a repeated kernel once, and its readers read the first result", function()
    local f = function(x)
      local a = (x * 2):exp()
      local b = (x * 2):exp() -- the same two kernels again
      return a + b
    end
    local cf = compiled(f, {"cse"}, nd.ones(4))
    assert.are.equal(2, removed(cf, "cse"))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(4) * i), f(nd.ones(4) * i))) end
  end)

  it("does not merge when an input changed in between", function()
    local f = function(x)
      local a = x * 2
      x:add_(1)
      local b = x * 2 -- same kernel, but x is not what it was
      return a + b
    end
    local cf = compiled(f, {"cse"}, nd.ones(2))
    assert.are.equal(0, removed(cf, "cse"))
    for i = 1, 3 do assert.are.equal(0, max_abs(cf(nd.ones(2) * i), f(nd.ones(2) * i))) end
  end)

  it("does not merge different scalars, outputs seen outside, or random draws", function()
    local keep
    local f = function(x)
      local a = x * 2
      local b = x * 3
      keep = x * 2 -- held by Lua after the call
      local r1, r2 = nd.F.dropout(x, 0.5, true), nd.F.dropout(x, 0.5, true)
      return a + b + r1 + r2
    end
    local cf = compiled(f, {"cse"}, nd.ones(8))
    assert.are.equal(0, removed(cf, "cse"))
    local _ = keep
  end)
end)

describe("passes option", function()
  it("runs cse then dce by default, none with passes = false, and refuses unknown names", function()
    local f = function(x) local _ = x * 7; return (x * 2) + (x * 2) end
    local cf = compiled(f, nil, nd.ones(2))
    assert.are.equal(1, removed(cf, "cse"))
    assert.are.equal(1, removed(cf, "dce"))
    assert_contains(cf:explain(), "passes: cse removed 1, dce removed 1")
    local none = compiled(f, false, nd.ones(2))
    assert.are.equal(0, #none.last.passes)
    assert_contains(errmsg(nd.compile, f, {passes = {"dce", "fuse"}}), "unknown pass 'fuse'")
    local g = require("needle.core")._graph_begin()
    g:finish()
    g:plan()
    assert_contains(errmsg(g.pass, g, "dce"), "passes run before the memory plan")
    g:free()
  end)
end)
