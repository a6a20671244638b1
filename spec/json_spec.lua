-- json_spec.lua - needle.checkpoint's json (the C codec of src/io/json.c,
-- reached through core._json_encode/_json_decode): the value mapping
-- (arrays vs objects, integers vs floats, sorted keys), exact round trips of
-- checkpoint-like state, deterministic bytes, and errors that are Lua
-- errors naming the byte offset (decode) or the path of the value (encode).
local nd = require "needle"
local json = require("needle.checkpoint").json

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("needle.checkpoint json", function()
  it("round-trips checkpoint-like state exactly", function()
    local state = {
      step = 1200, lr = 3e-4, best = 0.1 + 0.2, neg0 = -0.0, big = math.maxinteger, small = math.mininteger,
      name = "run \"α\"\n\t/β 🙂 \0 \127", done = false, ok = true,
      betas = {0.9, 0.999}, params = {1, 2, 3}, empty_list = json.array(), empty_obj = {},
      groups = {{lr = 0.1, params = json.array({1})}, {lr = 1e-300, params = json.array()}},
      ["$table"] = json.array({json.array({1, "one"}), json.array({"k", {["$float"] = "nan"}})}),
    }
    local text = json.encode(state)
    local back = json.decode(text)
    assert.are.same(state, back)
    for _, k in ipairs({"step", "lr", "best", "neg0", "big", "small"}) do
      assert.are.equal(math.type(state[k]), math.type(back[k]), k)
    end
    assert.are.equal(-math.huge, 1 / back.neg0)
    assert.is_true(json.is_array(back.betas) and json.is_array(back.empty_list))
    assert.is_false(json.is_array(back.empty_obj) or json.is_array(back))
    -- the same value gives the same bytes, whatever order the table was built in
    assert.are.equal(text, json.encode(back))
  end)

  it("writes compact JSON with sorted keys, integers as integers and floats with a point", function()
    assert.are.equal('{"a":[1,2.0,-0.0],"b":true,"c":{},"d":[],"z":"x\\n\\u0001"}',
                     json.encode({z = "x\n\1", b = true, a = {1, 2.0, -0.0}, c = {}, d = json.array()}))
    assert.are.equal("0.10000000000000001", json.encode(0.1))
    assert.are.equal("1e+17", json.encode(1e17))
    assert.are.equal('{"A":1,"B":2,"a":3,"b\\u0000":4,"\195\169":5}',
                     json.encode({["\195\169"] = 5, a = 3, B = 2, A = 1, ["b\0"] = 4}))
  end)

  it("reads numbers as Lua integers and floats", function()
    assert.are.equal(math.mininteger, json.decode("-9223372036854775808"))
    assert.are.equal("integer", math.type(json.decode("-0")))
    assert.are.equal("float", math.type(json.decode("1e2")))
    assert.are.equal(100.0, json.decode("1E+2"))
    assert.are.equal(math.huge, json.decode("1e999"))
  end)

  it("raises 'json: <problem> at byte N' (N from 1) for bad text", function()
    local cases = {
      {"", "json: unexpected end of the JSON at byte 1"},
      {"[1,]", "json: unexpected ']' (expected an object, array, string, number, true or false) at byte 4"},
      {'{"a":1,"a":2}', "json: duplicate key 'a' at byte 8"},
      {'{"a" 1}', "json: expected ':' after an object key at byte 6"},
      {"[1] 2", "json: trailing characters after the JSON array at byte 5"},
      {"9223372036854775808", "json: integer out of the 64-bit range at byte 1"},
      {'"\\ud800"', "json: high surrogate \\ud800 without a low surrogate at byte 2"},
      {'"a\255"', "json: invalid UTF-8 in a string at byte 3"},
      {'["a\1"]', "json: unescaped control character 0x01 in a string at byte 4"},
      {"01", "json: number with a leading zero at byte 1"},
      {"null", "json: unexpected 'n' (expected an object, array, string, number, true or false) at byte 1"},
      {("["):rep(513), "json: nesting deeper than 512 levels at byte 513"},
    }
    for _, c in ipairs(cases) do
      assert.are.equal(c[2], err_of(json.decode, c[1]))
    end
    assert.are.equal("json: expected a string, got number", err_of(json.decode, 3))
  end)

  it("is not fooled by 100000 levels of nesting", function()
    local e = err_of(json.decode, ("[{\"k\":"):rep(50000))
    assert.matches("nesting deeper than 512 levels", e, 1, true)
    local deep = {}
    local t = deep
    for _ = 1, 100000 do t.k = {}; t = t.k end
    e = err_of(json.encode, deep)
    assert.matches("json: table at the root.k.k.k", e, 1, true)
    assert.matches("is nested too deeply (or contains itself)", e, 1, true)
    assert.truthy(#e < 150, e)
    local cyc = {}
    cyc[1] = cyc
    assert.matches("is nested too deeply (or contains itself)", err_of(json.encode, cyc), 1, true)
  end)

  it("names the value it cannot write", function()
    assert.are.equal("json: number at the root.x is NaN, which JSON cannot hold", err_of(json.encode, {x = 0 / 0}))
    assert.are.equal("json: number at the root[2].y is -inf, which JSON cannot hold",
                     err_of(json.encode, {1, {y = -math.huge}}))
    assert.are.equal("json: table at the root has a number key (1.5): JSON objects take string keys",
                     err_of(json.encode, {[1.5] = 1}))
    assert.are.equal("json: value at the root.f is a function, which JSON cannot hold",
                     err_of(json.encode, {f = print}))
    assert.are.equal("json: string at the root.s is not valid UTF-8", err_of(json.encode, {s = "\255"}))
    assert.are.equal("json: string at the root is not valid UTF-8", err_of(json.encode, {["\255"] = 1}))
    assert.are.equal("json: value at the root is a userdata, which JSON cannot hold", err_of(json.encode, nd.zeros({1})))
  end)

  it("writes checkpoint state byte for byte as the Lua codec it replaced did", function()
    -- the state string below is what checkpoint.save wrote before the codec moved to C
    local p = os.tmpname()
    local m = nd.nn.Linear(2, 3)
    nd.manual_seed(7)
    local checkpoint = require "needle.checkpoint"
    checkpoint.save(p, {model = m, step = 12, extra = {loss = 0.25, hist = {1.5, 2, -0.0}, name = "r\"1\n",
                                                     inf = math.huge, [3] = "three", ok = true}})
    local f = assert(io.open(p, "rb"))
    local first = f:read("a")
    f:close()
    local _, meta = nd.load(p)
    assert.are.equal('{"$table":[["extra",{"$table":[[3,"three"],["hist",{"$table":[[1,1.5],[2,2],[3,-0.0]]}],'
      .. '["inf",{"$float":"inf"}],["loss",0.25],["name","r\\"1\\n"],["ok",true]]}],["model",{"$table":[["bias",'
      .. '{"$tensor":"model.bias"}],["weight",{"$tensor":"model.weight"}]]}],["rng_state",{"$table":[["offset",0],'
      .. '["seed",7]]}],["step",12]]}', meta["needle.checkpoint.state"])
    -- and the same input gives the same file
    nd.manual_seed(7)
    checkpoint.save(p, {model = m, step = 12, extra = {ok = true, [3] = "three", inf = math.huge,
                                                     name = "r\"1\n", hist = {1.5, 2, -0.0}, loss = 0.25}})
    f = assert(io.open(p, "rb"))
    assert.are.equal(first, f:read("a"))
    f:close()
    os.remove(p)
  end)

  it("reads what it writes for many random values", function()
    math.randomseed(1234)
    local function value(depth)
      local r = math.random(depth > 3 and 3 or 6)
      if r == 1 then return math.random(-1e9, 1e9) end
      if r == 2 then return (math.random() - 0.5) * 10 ^ math.random(-300, 300) end
      if r == 3 then
        local b = {}
        for i = 1, math.random(0, 6) do b[i] = string.char(math.random(0, 127)) end
        return table.concat(b) .. (math.random(2) == 1 and "é🙂" or "")
      end
      if r == 4 then return math.random(2) == 1 end
      local t = {}
      for i = 1, math.random(1, 4) do
        if r == 5 then t[i] = value(depth + 1) else t["k" .. math.random(100)] = value(depth + 1) end
      end
      return t
    end
    for _ = 1, 500 do
      local v = value(0)
      local s = json.encode(v)
      local back = json.decode(s)
      assert.are.same(v, back)
      assert.are.equal(s, json.encode(back))
    end
  end)
end)
