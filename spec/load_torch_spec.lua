-- load_torch_spec.lua - the Lua face of nd.load_torch (src/lua_bindings/lt_torch.c):
-- how the unpickled object becomes Lua values (nd.null for None, keys of kind
-- str/int/bool/float, sequences for lists and tuples, one Lua table for a
-- container the pickle shares), tensors (0-dim, empty,
-- expanded, views that share memory, with and without half_to_float, int8
-- widened), options, nd.load on a torch zip, errors that name the file, and no
-- leak when a conversion fails half-way. Fixtures: spec/fixtures/load_torch/lt_*.pt
-- (spec/fixtures/gen/gen_load_torch.py) and torch_ckpt/'s mlp and legacy files. The checkpoint
-- files themselves (dtypes, ZIP64, deflate, protocols) are
-- torch_checkpoint_files_spec.lua's; hostile files hostile_files_spec.lua's. The last
-- describe block replays what the fuzzers found (spec/fixtures/fuzz/).
local nd = require "needle"
local S = require "spec.helpers.shell"

local DIR = "spec/fixtures/torch_ckpt/" -- gen_torch_checkpoints.py's (mlp.pt, legacy.pt)
local LT = "spec/fixtures/load_torch/"  -- gen_load_torch.py's lt_*.pt

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

-- msg starts with "needle.<op>: '<path>': " and then mentions what
local function expect_error(msg, op, path, what)
  local head = ("needle.%s: '%s': "):format(op, path)
  assert.are.equal(head, msg:sub(1, #head), msg)
  if what then assert.truthy(msg:find(what, #head + 1, true), ("expected %q in: %s"):format(what, msg)) end
end

local dir
setup(function()
  dir = S.shell_line("mktemp -d \"${TMPDIR:-/tmp}/needle-load-torch-spec.XXXXXX\"")
  assert(dir and dir:match("needle%-load%-torch%-spec"), "mktemp failed")
end)
teardown(function()
  if dir and dir:match("needle%-load%-torch%-spec") then os.execute("rm -rf " .. S.q(dir)) end
end)
local function tmp(name, content)
  local p = dir .. "/" .. name
  S.write_file(p, content)
  return p
end

describe("nd.null", function()
  it("is one light userdata, the same every time", function()
    assert.are.equal("userdata", type(nd.null))
    assert.are.equal(nd.null, require("needle").null)
    assert.are.equal(nd.null, require("needle.core").null)
    assert.is_nil(getmetatable(nd.null) and getmetatable(nd.null).__index)
  end)
end)

describe("nd.load_torch values", function()
  local v
  setup(function() v = nd.load_torch(LT .. "lt_values.pt") end)

  it("gives numbers, strings and booleans their Lua form", function()
    assert.are.equal(3, v.int)
    assert.are.equal("integer", math.type(v.int))
    assert.are.equal(1 << 62, v.big)
    assert.are.equal(-5, v.neg)
    assert.are.equal(1.5, v.float)
    assert.are.equal("float", math.type(v.float))
    assert.are.equal(1e300, v.huge)
    assert.are.equal("h\xc3\xa9llo", v.str) -- str as UTF-8
    assert.are.equal(true, v.yes)
    assert.are.equal(false, v.no)
    assert.are.equal("float16", v.dtype) -- a torch dtype value: its name
  end)

  it("turns None into nd.null, in dicts and in sequences", function()
    assert.are.equal(nd.null, v.none)
    assert.are.equal(2, #v.nones)
    assert.are.equal(nd.null, v.nones[1])
    assert.are.same({nd.null, 1}, v.nones[2])
    assert.are.same({1, "a", nd.null}, v.tuple) -- a tuple is a sequence
  end)

  it("keeps int, float and bool keys as Lua keys", function()
    assert.are.same({[1] = "one", [2] = "two", [-7] = "minus seven"}, v.int_keys)
    assert.are.equal("integer", math.type(next(v.int_keys)))
    assert.are.same({[0.5] = "half"}, v.float_keys)
    assert.are.same({[true] = "t", [false] = "f"}, v.bool_keys)
  end)

  it("makes a container reached twice one Lua table", function()
    assert.are.same({1, 2}, v.a)
    assert.is_true(rawequal(v.a, v.b))
    assert.is_true(rawequal(v.t1, v.t2)) -- one tensor saved twice: one userdata
  end)

  it("reads 0-dim, empty and expanded tensors", function()
    assert.are.same({}, v.scalar.shape)
    assert.are.equal(2.5, v.scalar:item())
    assert.are.same({0, 3}, v.empty.shape)
    assert.are.equal(0, v.empty:numel())
    assert.are.same({4, 3}, v.expanded.shape)
    assert.are.same({0, 1}, v.expanded:stride())
    assert.are.same({{1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}}, v.expanded:totable())
    assert.are.same({{0, 1, 2}, {3, 4, 5}}, v.t1:totable())
    for _, k in ipairs({"scalar", "empty", "expanded", "t1"}) do
      assert.is_false(v[k].requires_grad, k)
      assert.are.equal("cpu", v[k].device, k)
    end
  end)

  it("reads bytes as a Lua string", function()
    assert.are.equal("\0\255ab", nd.load_torch(LT .. "lt_bytes.pt").bytes)
  end)

  it("reads protocol-2 bytes (_codecs.encode, bytes()) as Lua strings", function()
    -- torch.save's default protocol 2 has no bytes opcode: it pickles
    -- _codecs.encode(<str>, 'latin1') and __builtin__.bytes(), read as data
    local v = nd.load_torch(LT .. "lt_bytes_proto2.pt")
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    assert.are.equal(table.concat(all), v.b)
    assert.are.equal(256, #v.b)
    assert.are.equal("", v.e)
    assert.are.equal("int64", v.t.dtype)
    assert.are.same({0, 1, 2}, v.t:totable())
  end)

  it("returns a bare storage as a 1-D tensor sharing memory with its views", function()
    local s = nd.load_torch(LT .. "lt_storage.pt")
    assert.are.same({1, 2, 3, 4}, s.storage:totable())
    assert.are.same({2, 3, 4}, s.tensor:totable())
    s.storage:fill_(9)
    assert.are.same({9, 9, 9}, s.tensor:totable())
  end)

  it("refuses a dict key with no Lua form, naming the file", function()
    local p = LT .. "lt_tuple_key.pt"
    expect_error(err_of(nd.load_torch, p), "load_torch", p, "a dict has a tuple key")
  end)

  it("leaks nothing when the conversion fails half-way", function()
    local p = LT .. "lt_tuple_key.pt" -- a 1000-element tensor converts before the bad key
    collectgarbage()
    collectgarbage()
    local before = nd.live_bytes()
    for _ = 1, 50 do assert.is_false((pcall(nd.load_torch, p))) end
    for _ = 1, 20 do nd.load_torch(LT .. "lt_values.pt") end
    collectgarbage()
    collectgarbage()
    assert.are.equal(before, nd.live_bytes())
  end)
end)

describe("nd.load_torch views", function()
  it("keep sharing one storage (float16 stays float16)", function()
    local v = nd.load_torch(LT .. "lt_views.pt")
    assert.are.equal("float16", v.h.dtype)
    assert.are.equal("float16", v.h_t.dtype)
    assert.are.same({4, 1}, v.h:stride())
    assert.are.same({1, 4}, v.h_t:stride())
    assert.are.equal(4, v.h_row:storage_offset())
    assert.are.same({4, 5, 6, 7}, v.h_row:float():totable())
    assert.are.same({0, 4, 8}, v.h_t:float():totable()[1])
  end)

  it("keep sharing after half_to_float and int8 widening", function()
    local v = nd.load_torch(LT .. "lt_views.pt", {half_to_float = true})
    for _, k in ipairs({"h", "h_t", "h_row"}) do assert.are.equal("float32", v[k].dtype, k) end
    v.h_row:fill_(-1)
    assert.are.same({{0, 1, 2, 3}, {-1, -1, -1, -1}, {8, 9, 10, 11}}, v.h:totable())
    assert.are.same({1, -1, 9}, v.h_t:totable()[2])
    v.h_t[1]:fill_(100) -- column 1 of h
    assert.are.same({100, 1, 2, 3}, v.h:totable()[1])
    assert.are.equal("int32", v.i8.dtype)
    assert.are.equal("int32", v.i8_mid.dtype)
    assert.are.same({-4, -3, -2, -1, 0, 1, 2, 3}, v.i8:totable())
    assert.are.same({-2, -1, 0}, v.i8_mid:totable())
    v.i8_mid:fill_(50)
    assert.are.same({-4, -3, 50, 50, 50, 1, 2, 3}, v.i8:totable())
  end)

  it("are independent between two loads", function()
    local a = nd.load_torch(LT .. "lt_views.pt", {half_to_float = true})
    local b = nd.load_torch(LT .. "lt_views.pt", {half_to_float = true})
    a.h:fill_(0)
    assert.are.same({4, 5, 6, 7}, b.h_row:totable())
  end)
end)

describe("nd.load on a torch checkpoint", function()
  it("returns what nd.load_torch returns", function()
    local a, b = nd.load(DIR .. "mlp.pt"), nd.load_torch(DIR .. "mlp.pt")
    local n = 0
    for k, t in pairs(b) do
      assert.are.same(t:totable(), a[k]:totable(), k)
      n = n + 1
    end
    assert.are.equal(6, n)
  end)

  it("still reads safetensors files", function()
    local p = dir .. "/x.safetensors"
    nd.save({w = nd.tensor({1, 2, 3})}, p)
    assert.are.same({1, 2, 3}, nd.load(p).w:totable())
  end)

  it("names itself in errors about a damaged zip", function()
    local p = tmp("zip.pt", "PK\3\4" .. ("\0"):rep(60))
    expect_error(err_of(nd.load, p), "load", p, "no end of central directory")
  end)

  it("explains the legacy torch format", function()
    local p = DIR .. "legacy.pt"
    expect_error(err_of(nd.load, p), "load", p, "legacy (pre-1.6) format")
  end)
end)

describe("nd.load_torch errors", function()
  it("name the file and say what is wrong", function()
    local p = dir .. "/missing.pt"
    local msg = err_of(nd.load_torch, p)
    assert.are.equal(("needle.load_torch: cannot open '%s': No such file or directory"):format(p), msg)

    p = tmp("garbage.pt", "not a checkpoint at all")
    expect_error(err_of(nd.load_torch, p), "load_torch", p, "not a PyTorch checkpoint (zip) file")
    p = tmp("empty.pt", "")
    expect_error(err_of(nd.load_torch, p), "load_torch", p, "not a PyTorch checkpoint (zip) file")
    -- a bare pickle: what torch.save wrote before 1.6
    p = tmp("old.pt", "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.")
    expect_error(err_of(nd.load_torch, p), "load_torch", p,
                 "legacy (pre-1.6) format, which needle does not read; re-save it in PyTorch >= 1.6: "
                 .. "torch.save(torch.load(path), path)")
    p = dir
    msg = err_of(nd.load_torch, p)
    assert.truthy(msg:find("needle.load_torch: cannot open '" .. p .. "': Is a directory", 1, true), msg)
  end)

  it("name the file for a truncated checkpoint, at any length", function()
    local good = S.read_file(DIR .. "mlp.pt")
    for _, n in ipairs({4, 30, 100, #good // 2, #good - 22, #good - 1}) do
      local p = tmp("cut.pt", good:sub(1, n))
      expect_error(err_of(nd.load_torch, p), "load_torch", p)
    end
    -- a flipped byte inside a tensor's data: the CRC catches it
    local at = assert(good:find("mlp/data/0", 1, true))
    local data = assert(good:find("mlp/data/1", at + 1, true)) - 80 -- inside entry 0's data
    local p = tmp("flip.pt", good:sub(1, data - 1) .. string.char(good:byte(data) ~ 0x10) .. good:sub(data + 1))
    local ok, msg = pcall(nd.load_torch, p)
    assert.is_false(ok)
    expect_error(msg, "load_torch", p)
  end)

  it("check the arguments", function()
    assert.truthy(err_of(nd.load_torch, 3):find("needle.load_torch: path must be a string", 1, true))
    assert.truthy(err_of(nd.load_torch, ""):find("needle.load_torch: path is empty", 1, true))
    local p = DIR .. "mlp.pt"
    assert.truthy(err_of(nd.load_torch, p, 1):find("needle.load_torch: options must be a table", 1, true))
    assert.truthy(err_of(nd.load_torch, p, {half_to_floats = true})
                  :find("needle.load_torch: unknown option 'half_to_floats'", 1, true))
    assert.truthy(err_of(nd.load_torch, p, {half_to_float = 1})
                  :find("needle.load_torch: option 'half_to_float' must be a boolean, got number", 1, true))
    assert.are.equal(6, (function() local n = 0 for _ in pairs(nd.load_torch(p, {})) do n = n + 1 end return n end)())
  end)
end)

describe("nd.load_torch budget options", function()
  local Z = require "spec.helpers.torch_zip"

  it("name every valid option when one is unknown, and check their values", function()
    local p = DIR .. "mlp.pt"
    assert.truthy(err_of(nd.load_torch, p, {max_item = 1}):find(
      "needle.load_torch: unknown option 'max_item' (valid: half_to_float, max_decompressed_bytes, max_items)", 1, true))
    for _, bad in ipairs({0, -1, 1.5, "10"}) do
      assert.truthy(err_of(nd.load_torch, p, {max_items = bad}):find(
        "needle.load_torch: option 'max_items' must be a positive integer", 1, true), tostring(bad))
      assert.truthy(err_of(nd.load_torch, p, {max_decompressed_bytes = bad}):find(
        "needle.load_torch: option 'max_decompressed_bytes' must be a positive integer", 1, true), tostring(bad))
    end
    assert.are.equal(6, (function()
      local n = 0
      for _ in pairs(nd.load_torch(p, {max_items = 1 << 40, max_decompressed_bytes = 1 << 40})) do n = n + 1 end
      return n
    end)())
  end)

  it("max_items counts every value and every list, tuple and dict item of the pickle, to the item", function()
    -- {"a": [None x 100], "b": (None x 50)}: 6 values (the dict, "a", the list, "b", the
    -- tuple, and None, built once and then shared) and 2 + 100 + 50 elements = 158 items
    local pkl = "\x80\x02}(" .. Z.pickle_str("a") .. "](" .. ("N"):rep(100) .. "e" .. Z.pickle_str("b") .. "("
                .. ("N"):rep(50) .. "tu."
    local p = tmp("items.pt", Z.checkpoint(pkl))
    local v = nd.load_torch(p, {max_items = 158})
    assert.are.equal(100, #v.a)
    assert.are.equal(50, #v.b)
    local msg = err_of(nd.load_torch, p, {max_items = 157})
    expect_error(msg, "load_torch", p, "more than 157 items (values, and list, tuple and dict elements) in all")
    assert.truthy(msg:find("nd.load_torch's option max_items raises it", 1, true), msg)
  end)

  it("max_decompressed_bytes counts the storages' deflated entries, before any is read", function()
    -- two storages that claim 1000 bytes each behind bytes that are no deflate stream
    local pkl = Z.pickle_storages({a = {key = "0", numel = 1000}, b = {key = "1", numel = 1000}})
    local junk = ("\xa5"):rep(100)
    local bytes = Z.zip({{name = "archive/data.pkl", data = pkl},
                         {name = "archive/data/0", data = junk, size = 1000, deflated = true},
                         {name = "archive/data/1", data = junk, size = 1000, deflated = true}})
    local p = tmp("deflated.pt", bytes)
    local msg = err_of(nd.load_torch, p, {max_decompressed_bytes = 1999})
    expect_error(msg, "load_torch", p, "its 2 deflated storages decompress to 2000 bytes in all, more than the 1999 "
                 .. "left of the limit of 1999 decompressed bytes per load (nd.load_torch's option "
                 .. "max_decompressed_bytes raises it)")
    -- within the budget they are inflated, and the junk is found
    expect_error(err_of(nd.load_torch, p, {max_decompressed_bytes = 2000}), "load_torch", p, "deflate stream")
  end)
end)

describe("nd.load_torch on a whole pickled module", function()
  local Z = require "spec.helpers.torch_zip"

  it("says to save its state_dict() instead", function()
    local cases = {
      {"torch.nn.modules.linear", "Linear", "it is a torch.nn class: the file holds a whole pickled torch.nn module"},
      {"__main__", "Net", "it is a class of the script that saved the file"},
      {"torch.optim.adam", "Adam", "it is a torch.optim class: the file holds a whole pickled torch.optim object"},
    }
    for _, c in ipairs(cases) do
      -- what torch.save(model) starts with: NEWOBJ of the model's class
      local pkl = "\x80\x02c" .. c[1] .. "\n" .. c[2] .. "\n)\x81}b."
      local p = tmp("model.pt", Z.checkpoint(pkl))
      local msg = err_of(nd.load_torch, p)
      expect_error(msg, "load_torch", p, ("global '%s.%s' is not allowed: %s"):format(c[1], c[2], c[3]))
      local fix = c[1] == "torch.optim.adam" and "save `optimizer.state_dict()` instead"
                  or "save `model.state_dict()` instead"
      assert.truthy(msg:find(fix, 1, true), msg)
    end
    -- a class of another package (torchvision's models, a project's own): the warning and the fix
    for _, c in ipairs({{"torchvision.models.resnet", "ResNet"}, {"mypkg.models", "Net"}}) do
      local p = tmp("model.pt", Z.checkpoint("\x80\x02c" .. c[1] .. "\n" .. c[2] .. "\n)\x81}b."))
      local msg = err_of(nd.load_torch, p)
      expect_error(msg, "load_torch", p, ("global '%s.%s' is not allowed"):format(c[1], c[2]))
      assert.truthy(msg:find("this file may try to run code", 1, true), msg)
      assert.truthy(msg:find("if it is a class of a whole model saved with torch.save(model), save "
                             .. "`model.state_dict()` instead", 1, true), msg)
    end
    -- anything else keeps its warning alone
    local p = tmp("eval.pt", Z.checkpoint("\x80\x02cbuiltins\neval\n."))
    local msg = err_of(nd.load_torch, p)
    expect_error(msg, "load_torch", p, "this file may try to run code")
    assert.falsy(msg:find("state_dict", 1, true), msg)
  end)
end)

-- What the libFuzzer harnesses (tests/fuzz/, docs/fuzzing.md) found, kept as
-- regression checks. Each reproducer sits in spec/fixtures/fuzz/: a raw pickle
-- found by fuzz_pickle is wrapped into a minimal torch zip
-- (tests/fuzz/wrap_pickle.py) so that it goes through nd.load_torch like a real
-- checkpoint. A file either loads to the value given here or fails with a clean
-- "needle.<loader>: '<path>': ..." error holding the given text; the sanitizer
-- build runs this spec too, which is where the original crashes showed.
local FUZZ_DIR = "spec/fixtures/fuzz/"

-- {file, loader, error = substring} or {file, loader, check = function(value)}
local findings = {
  -- fuzz_pickle, first minute: MARK followed by TUPLE before any value was
  -- pushed computed `stack + 0` on a NULL stack (UBSan: applying zero offset
  -- to null pointer). The artifact itself goes on to an OBJ opcode.
  {file = "pickle_mark_tuple_empty_stack.pt", loader = "load_torch",
   error = "opcode OBJ (0x6f) is not supported"},
  -- the same bug reduced: PROTO 2, MARK, TUPLE, STOP is a valid empty tuple
  {file = "pickle_mark_tuple_at_start.pt", loader = "load_torch",
   check = function(v) assert.are.equal("table", type(v)); assert.are.equal(0, #v) end},
  -- fuzz_torch_load: a timeout in the harness's own tree walk. DUP and
  -- TUPLE3 build ((t,t,t),(t,t,t),...): a DAG of 150 bytes that is a tree of
  -- 3^40 nodes. The readers visit each shared node once (torch_load.c's walk,
  -- lt_torch.c's table memo), so nd.load_torch returns at once with shared
  -- subtables; the harnesses now count their visits too.
  {file = "harness_dag_tuples.pt", loader = "load_torch",
   check = function(v)
     assert.are.equal("table", type(v))
     assert.are.equal(3, #v)
   end},
}

describe("nd.load_torch on the fuzzers' findings", function()
  for _, f in ipairs(findings) do
    it(f.file .. " (" .. f.loader .. ")", function()
      local path = FUZZ_DIR .. f.file
      local t0 = os.clock()
      local ok, res = pcall(nd[f.loader], path)
      assert.truthy(os.clock() - t0 < 5, path .. " took " .. (os.clock() - t0) .. " s")
      if f.error then
        assert.is_false(ok, path .. " was accepted")
        res = tostring(res)
        assert.truthy(res:find("needle." .. f.loader .. ": '" .. path .. "'", 1, true), res)
        assert.truthy(res:find(f.error, 1, true), res)
      else
        assert.is_true(ok, tostring(res))
        f.check(res)
      end
    end)
  end

  it("lists every file of spec/fixtures/fuzz/", function()
    local listed = {}
    for _, f in ipairs(findings) do listed[f.file] = true end
    local lfs = require "lfs"
    for name in lfs.dir(FUZZ_DIR) do
      if name:match("%.pt$") or name:match("%.safetensors$") or name:match("%.zip$") then
        assert.truthy(listed[name], name .. " is not checked by load_torch_spec.lua")
      end
    end
  end)
end)
