-- serialize_spec.lua - nd.save / nd.load (safetensors), the binary I/O
-- primitives under them (nd.frombytes, t:tobytes, nd.gunzip,
-- nd.write_file_atomic), atomic replacement, the reader's errors on corrupt
-- files, and a file written from PyTorch tensors by an independent writer
-- (spec/fixtures/gen/gen_safetensors.py).
local nd = require "needle"
local S = require "spec.helpers.shell"
local serialize = require "needle.serialize"

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- a safetensors file from header text and data bytes
local function st_file(header, data) return string.pack("<I8", #header) .. header .. (data or "") end

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function same_tensor(a, b)
  assert.are.equal(b.dtype, a.dtype)
  assert.are.same(b.shape, a.shape)
  assert.are.equal(hex(b:tobytes()), hex(a:tobytes()))
end

local dir
setup(function()
  dir = S.shell_line("mktemp -d \"${TMPDIR:-/tmp}/needle-serialize-spec.XXXXXX\"")
  assert(dir and dir:match("needle%-serialize%-spec"), "mktemp failed")
end)
teardown(function()
  if dir and dir:match("needle%-serialize%-spec") then os.execute("chmod -R u+w " .. S.q(dir) .. "; rm -rf " .. S.q(dir)) end
end)

local function tmp(name) return dir .. "/" .. name end

-- files in dir whose name contains ".tmp." (leftover temporaries)
local function temporaries()
  local out = {}
  local p = io.popen("ls -a " .. S.q(dir))
  for name in p:lines() do
    if name:find(".tmp.", 1, true) then out[#out + 1] = name end
  end
  p:close()
  return out
end

describe("nd.frombytes / t:tobytes", function()
  it("round-trips every dtype's raw little-endian bytes", function()
    assert.are.equal(string.pack("<ff", 1.5, -2), nd.tensor({1.5, -2}):tobytes())
    assert.are.equal(string.pack("<i8i8", math.mininteger, math.maxinteger),
                     nd.tensor({math.mininteger, math.maxinteger}, {dtype = "int64"}):tobytes())
    for _, dt in ipairs(nd.dtypes) do
      local t = nd.tensor({{1, 0}, {1, 1}, {0, 1}}, {dtype = dt})
      local u = nd.frombytes(t:tobytes(), dt, {3, 2})
      same_tensor(t, u)
    end
  end)

  it("writes non-contiguous tensors row-major and reads a 1-D tensor without a shape", function()
    local t = nd.tensor({{1, 2, 3}, {4, 5, 6}}):t()
    assert.are.equal(nd.tensor({1, 4, 2, 5, 3, 6}):tobytes(), t:tobytes())
    local e = nd.tensor({7, 8}):reshape({2, 1}):expand({2, 3})
    assert.are.equal(nd.tensor({7, 7, 7, 8, 8, 8}):tobytes(), e:tobytes())
    local u = nd.frombytes("\1\2\3", "uint8")
    assert.are.same({3}, u.shape)
    assert.are.same({1, 2, 3}, u:totable())
    assert.are.equal("", nd.zeros({0, 3}):tobytes())
    same_tensor(nd.tensor(2.5), nd.frombytes(string.pack("<f", 2.5), "float32", {}))
  end)

  it("checks the byte count, the dtype and bool bytes", function()
    assert.matches("needle.frombytes: expected 48 bytes (shape {3,4} float32, 4 bytes per element), got 47",
                   err_of(nd.frombytes, ("x"):rep(47), "float32", {3, 4}), 1, true)
    assert.matches("not a whole number of float64 elements", err_of(nd.frombytes, "abc", "float64"), 1, true)
    assert.matches("needle.frombytes: bool element 2 has byte value 2", err_of(nd.frombytes, "\1\2", "bool"), 1, true)
    assert.matches("needle.frombytes", err_of(nd.frombytes, "abcd", "float33"), 1, true)
    assert.matches("needle.frombytes: data (argument 1) must be a string, got number",
                   err_of(nd.frombytes, 12, "uint8"), 1, true)
  end)
end)

describe("nd.gunzip", function()
  it("reads gzip files and passes plain files through", function()
    local plain = tmp("plain.txt")
    write(plain, "hello\0world")
    assert.are.equal("hello\0world", nd.gunzip(plain))
    os.execute("gzip -c " .. S.q(plain) .. " > " .. S.q(tmp("plain.txt.gz")))
    assert.are.equal("hello\0world", nd.gunzip(tmp("plain.txt.gz")))
    write(tmp("empty"), "")
    assert.are.equal("", nd.gunzip(tmp("empty")))
  end)

  it("names the file in its errors: missing, truncated, corrupt, too big", function()
    assert.matches("needle.gunzip: cannot open '" .. tmp("nope") .. "': No such file or directory",
                   err_of(nd.gunzip, tmp("nope")), 1, true)
    local big = ("needle "):rep(5000)
    write(tmp("big"), big)
    os.execute("gzip -c " .. S.q(tmp("big")) .. " > " .. S.q(tmp("big.gz")))
    local gz = read(tmp("big.gz"))
    write(tmp("trunc.gz"), gz:sub(1, #gz // 2))
    assert.matches("needle.gunzip: '" .. tmp("trunc.gz") .. "': truncated gzip stream",
                   err_of(nd.gunzip, tmp("trunc.gz")), 1, true)
    write(tmp("crc.gz"), gz:sub(1, -6) .. string.char(gz:byte(-5) ~ 1) .. gz:sub(-4))
    assert.matches("needle.gunzip: '" .. tmp("crc.gz") .. "': corrupt gzip stream",
                   err_of(nd.gunzip, tmp("crc.gz")), 1, true)
    assert.are.equal(#big, #nd.gunzip(tmp("big.gz"), #big))
    assert.matches("decompressed content exceeds the limit of 100 bytes", err_of(nd.gunzip, tmp("big.gz"), 100),
                   1, true)
    assert.matches("needle.gunzip: cannot open '" .. dir .. "': Is a directory", err_of(nd.gunzip, dir), 1, true)
  end)
end)

describe("nd.write_file_atomic", function()
  it("replaces a file and leaves no temporary", function()
    local p = tmp("atomic.txt")
    nd.write_file_atomic(p, "one")
    assert.are.equal("one", read(p))
    nd.write_file_atomic(p, ("two"):rep(1000000))
    assert.are.equal(("two"):rep(1000000), read(p))
    assert.are.same({}, temporaries())
  end)

  it("raises an error naming the path and the reason", function()
    assert.matches("needle.write_file_atomic: cannot write '" .. dir .. "/missing/x' (temporary '" .. dir ..
                   "/missing/x.tmp.", err_of(nd.write_file_atomic, dir .. "/missing/x", "data"), 1, true)
    assert.matches("No such file or directory", err_of(nd.write_file_atomic, dir .. "/missing/x", "data"), 1, true)
    os.execute("mkdir " .. S.q(tmp("adir")))
    assert.matches("needle.write_file_atomic: cannot replace '" .. tmp("adir") .. "': Is a directory",
                   err_of(nd.write_file_atomic, tmp("adir"), "data"), 1, true)
    assert.are.same({}, temporaries())
  end)
end)

describe("nd.save / nd.load", function()
  it("round-trips every dtype, 0-dim and empty tensors", function()
    nd.manual_seed(1)
    local ts = {
      f32 = nd.randn({3, 4}),
      f64 = nd.randn({2, 2}, {dtype = "float64"}),
      f16 = nd.tensor({0.5, -1.25, 65504, 6e-8}):to("float16"),
      bf16 = nd.tensor({0.5, -3e38, 1e-30}):to("bfloat16"),
      i64 = nd.tensor({math.mininteger, -1, 0, math.maxinteger}, {dtype = "int64"}),
      i32 = nd.tensor({-2147483648, 2147483647}, {dtype = "int32"}),
      u8 = nd.tensor({0, 128, 255}, {dtype = "uint8"}),
      b = nd.tensor({{true, false}, {false, true}}),
      scalar = nd.tensor(3.25),
      scalar_i = nd.tensor(7, {dtype = "int64"}),
      empty = nd.zeros({0}),
      empty2 = nd.zeros({2, 0, 3}, {dtype = "int32"}),
    }
    local p = tmp("all.safetensors")
    nd.save(ts, p)
    local back, meta = nd.load(p)
    assert.are.same({}, meta)
    local n = 0
    for k, t in pairs(back) do
      n = n + 1
      same_tensor(ts[k], t)
    end
    assert.are.equal(12, n)
    assert.is_false(back.f32.requires_grad)
  end)

  it("writes non-contiguous tensors row-major", function()
    local base = nd.arange(0, 24):reshape({2, 3, 4})
    local ts = {
      transposed = base:transpose(1, 3),
      stepped = base[{":", ":", {1, 4, 2}}],
      expanded = nd.tensor({1, 2}):reshape({2, 1}):expand({2, 3}),
      permuted = base:permute({3, 1, 2}),
    }
    local p = tmp("views.safetensors")
    nd.save(ts, p)
    local back = nd.load(p)
    for k, t in pairs(ts) do
      assert.is_true(back[k]:is_contiguous())
      same_tensor(t:contiguous(), back[k])
      assert.are.same(t:totable(), back[k]:totable())
    end
  end)

  it("keeps metadata and names that are any strings", function()
    local names = {"fc.weight", "", "with space", "quote\"back\\slash", "tab\tnew\nline", "\1ctl",
                   "unicode é 🙂", "__metadata", "0"}
    local ts = {}
    for i, name in ipairs(names) do ts[name] = nd.full({i}, i) end
    local meta = {format = "pt", epoch = "3", note = "multi\nline \"quoted\" é", empty = ""}
    local p = tmp("names.safetensors")
    nd.save(ts, p, meta)
    local back, m = nd.load(p)
    assert.are.same(meta, m)
    for i, name in ipairs(names) do
      assert.is_not_nil(back[name], name)
      assert.are.same(ts[name]:totable(), back[name]:totable())
    end
  end)

  it("lays the file out as the reference implementation", function()
    local p = tmp("layout.safetensors")
    nd.save({b = nd.zeros({3}, {dtype = "uint8"}), a = nd.ones({2}, {dtype = "float64"}),
             c = nd.ones({1}, {dtype = "float16"})}, p, {k = "v"})
    local s = read(p)
    local n = string.unpack("<I8", s)
    assert.are.equal(0, n % 8)
    local header = s:sub(9, 8 + n)
    assert.are.equal(header:gsub(" +$", ""),
      '{"__metadata__":{"k":"v"},"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},' ..
      '"b":{"dtype":"U8","shape":[3],"data_offsets":[18,21]},"c":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}}')
    assert.matches("^ *$", header:sub(#header:gsub(" +$", "") + 1))
    assert.are.equal(8 + n + 21, #s)
    local info, meta, start = serialize.read_header(p)
    assert.are.equal(8 + n, start)
    assert.are.same({k = "v"}, meta)
    assert.are.same({dtype = "float16", shape = {1}, data_offsets = {16, 18}}, info.c)
  end)

  it("saves a module through its state_dict", function()
    local Lin = nd.nn.Module:extend("Lin")
    function Lin:init() self.weight = nd.ones({2, 3}):requires_grad_(); self:register_buffer("n", nd.zeros({})) end
    local p = tmp("module.safetensors")
    nd.save(Lin(), p)
    local back = nd.load(p)
    assert.are.same({2, 3}, back.weight.shape)
    assert.are.same({}, back.n.shape)
  end)

  it("checks its arguments", function()
    local p = tmp("args.safetensors")
    assert.matches("needle.save: expected a table of tensors, got number", err_of(nd.save, 1, p), 1, true)
    assert.matches("needle.save: expected a table of named tensors", err_of(nd.save, nd.zeros({1}), p), 1, true)
    assert.matches("needle.save: value for 'a' is a number, not a tensor", err_of(nd.save, {a = 1}, p), 1, true)
    assert.matches("nested state: use nd.checkpoint.save", err_of(nd.save, {a = {b = nd.zeros({1})}}, p), 1, true)
    assert.matches("needle.save: tensor names must be strings, got number key 1", err_of(nd.save, {nd.zeros({1})}, p),
                   1, true)
    assert.matches("needle.save: metadata value for 'k' must be a string, got number",
                   err_of(nd.save, {a = nd.zeros({1})}, p, {k = 1}), 1, true)
    assert.matches("'__metadata__' cannot be a tensor name", err_of(nd.save, {__metadata__ = nd.zeros({1})}, p), 1, true)
    assert.matches("needle.save: '" .. p .. "': tensor name '\\xff' is not valid UTF-8",
                   err_of(nd.save, {["\255"] = nd.zeros({1})}, p), 1, true)
    assert.matches("needle.save: path must be a string, got nil", err_of(nd.save, {}), 1, true)
    assert.matches("needle.load: path must be a string, got nil", err_of(nd.load), 1, true)
    assert.is_nil(io.open(p, "rb"))
  end)
end)

describe("nd.save atomicity", function()
  it("leaves the old file intact when the write fails half way", function()
    local p = tmp("keep.safetensors")
    nd.save({old = nd.tensor({1, 2, 3})}, p)
    local before = read(p)
    -- a 1 KiB file size limit (SIGXFSZ ignored: write() fails with EFBIG)
    local exe = S.needle_lua()
    local code = ("local ok, e = pcall(nd.save, {new = nd.zeros({100000})}, %q); io.write(tostring(e))"):format(p)
    local msg = S.shell_line("trap '' XFSZ; ulimit -f 1; " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1")
    assert.matches("needle.save: cannot write '" .. p .. "': File too large", msg, 1, true)
    assert.are.equal(before, read(p))
    assert.are.same({}, temporaries())
    assert.are.same({1, 2, 3}, nd.load(p).old:totable())
  end)

  it("leaves the old file intact when the directory is not writable", function()
    if S.shell_line("id -u") == "0" then
      pending("running as root: permissions do not stop writes")
      return
    end
    local sub = tmp("ro")
    os.execute("mkdir " .. S.q(sub))
    local p = sub .. "/m.safetensors"
    nd.save({old = nd.tensor({1})}, p)
    local before = read(p)
    os.execute("chmod a-w " .. S.q(sub))
    local e = err_of(nd.save, {new = nd.tensor({2})}, p)
    os.execute("chmod u+w " .. S.q(sub))
    assert.matches("needle.save: cannot write '" .. p .. "'", e, 1, true)
    assert.matches("Permission denied", e, 1, true)
    assert.are.equal(before, read(p))
  end)

  it("leaves nothing behind when the target is a directory", function()
    os.execute("mkdir -p " .. S.q(tmp("target_dir")))
    assert.matches("needle.save: cannot replace '" .. tmp("target_dir") .. "': Is a directory",
                   err_of(nd.save, {a = nd.zeros({2})}, tmp("target_dir")), 1, true)
    assert.are.same({}, temporaries())
  end)
end)

describe("nd.load on corrupt files", function()
  local good_path, good
  setup(function()
    good_path = tmp("good.safetensors")
    nd.save({["fc.weight"] = nd.ones({3, 4}), ["fc.bias"] = nd.zeros({3})}, good_path)
    good = read(good_path)
  end)

  local function load_err(name, content)
    local p = tmp(name)
    write(p, content)
    return err_of(nd.load, p), p
  end

  it("names a missing file, a directory and a short file", function()
    assert.matches("needle.load: cannot open '" .. tmp("none") .. "': No such file or directory",
                   err_of(nd.load, tmp("none")), 1, true)
    assert.matches("needle.load: cannot open '" .. dir .. "': Is a directory", err_of(nd.load, dir), 1, true)
    local e, p = load_err("short.safetensors", "abc")
    assert.matches("needle.load: '" .. p .. "': file too short (3 bytes) to be a safetensors file", e, 1, true)
  end)

  it("rejects every truncation", function()
    for _, n in ipairs({7, 8, 20, #good - 49, #good - 1}) do
      local e, p = load_err("trunc.safetensors", good:sub(1, n))
      assert.matches("needle.load: '" .. p .. "': ", e, 1, true)
    end
    local e = load_err("trunc.safetensors", good:sub(1, #good - 1))
    assert.matches("lie outside the byte buffer", e, 1, true)
    e = load_err("trunc.safetensors", good:sub(1, 20))
    assert.matches("exceeds the file size", e, 1, true)
  end)

  it("checks the header length", function()
    local e = load_err("huge.safetensors", string.pack("<I8", 200000000) .. good:sub(9))
    assert.matches("header length 200000000 exceeds the limit of 100000000 bytes", e, 1, true)
    -- a zip goes to the PyTorch checkpoint reader, whose zip checks reject this one
    e = load_err("zip.pt", "PK\3\4" .. ("\0"):rep(60))
    assert.matches("no end of central directory record", e, 1, true)
  end)

  it("names what is wrong in the header", function()
    local function header_err(h, data)
      return (load_err("bad.safetensors", st_file(h, data)))
    end
    local cases = {
      {'{"fc.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,100]}}', ("\0"):rep(100),
       "tensor 'fc.weight' data_offsets [0, 100] do not match shape {3,4} float32 (48 bytes)"},
      {'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
       ("\0"):rep(12), "tensor 'b' data_offsets [4, 12] overlap those of tensor 'a' [0, 8]"},
      {'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', ("\0"):rep(8),
       "bytes [0, 4) of the byte buffer belong to no tensor"},
      {'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(6),
       "the byte buffer has 6 bytes but the tensors cover only the first 4"},
      {'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
       ("\0"):rep(8), "duplicate key 'a'"},
      {'{"a":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}}', "\0\0",
       "tensor 'a': dtype I16 is not supported by needle (supported: F64, F32, F16, BF16, I64, I32, U8, BOOL)"},
      {'{"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}', "\0", "tensor 'a': unknown dtype 'Q8'"},
      {'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}', "", "tensor 'a': shape entry 1 is negative (-1)"},
      {'{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}', "",
       "tensor 'a': shape {4294967296,4294967296} is too large"},
      {'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]', "\0\0\0\0",
       "invalid header JSON at byte 52: unexpected end of the header in an object"},
      {'{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}', "\0\0\0\0",
       "a number with a fraction or exponent"},
      {'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,99999999999999999999]}}', "",
       "integer out of the 64-bit range"},
      {'{"a":{"dtype":"U8","shape":[1]}}', "\0", "tensor 'a': missing \"data_offsets\""},
      {'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"k":1}}', "\0",
       "__metadata__ value of 'k' is not a string"},
      {'{"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}', "\1\7",
       "tensor 'a': bool element 2 has byte value 7 (expected 0 or 1)"},
      {'["a"]', "", "the header is not a JSON object"},
      {'{"\\ud800":1}', "", "high surrogate \\ud800 without a low surrogate"},
      {'{"a\255":1}', "", "the header is not valid UTF-8 (byte 3)"},
      {'{} extra', "", "trailing characters after the header object"},
      {"", "", "the header is empty"},
    }
    for _, c in ipairs(cases) do
      local e = header_err(c[1], c[2])
      assert.matches("needle.load: '" .. tmp("bad.safetensors") .. "': ", e, 1, true)
      assert.matches(c[3], e, 1, true)
    end
  end)

  it("reads what the specification allows: padding, extra fields, empty files", function()
    local p = tmp("ok.safetensors")
    write(p, st_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":[1,{"x":"y"}]}}   \n', "\5\6"))
    assert.are.same({5, 6}, nd.load(p).a:totable())
    write(p, st_file("{}", ""))
    local t, m = nd.load(p)
    assert.are.same({}, t)
    assert.are.same({}, m)
    nd.save({}, p)
    assert.are.same({}, (nd.load(p)))
  end)
end)

describe("a file written from PyTorch", function()
  local E = dofile("spec/fixtures/torch_state_expected.lua")

  it("loads with exact values, dtypes, shapes and metadata", function()
    local ts, meta = nd.load("spec/fixtures/torch_state.safetensors")
    assert.are.same(E.metadata, meta)
    local n = 0
    for name, e in pairs(E.tensors) do
      n = n + 1
      local t = ts[name]
      assert.is_not_nil(t, name)
      assert.are.equal(e.dtype, t.dtype, name)
      assert.are.same(e.shape, t.shape, name)
      assert.are.equal(e.bytes, hex(t:tobytes()), name)
      local flat = t:reshape({-1})
      if t.dtype == "float16" or t.dtype == "bfloat16" then flat = flat:to("float64") end
      local got = flat:totable()
      assert.are.equal(#e.values, #got, name)
      for i, v in ipairs(e.values) do
        if v ~= v then
          assert.is_true(got[i] ~= got[i], name)
        else
          assert.are.equal(v, got[i], name .. "[" .. i .. "]")
          if math.type(v) == "integer" then assert.are.equal("integer", math.type(got[i])) end
        end
      end
    end
    local count = 0
    for _ in pairs(ts) do count = count + 1 end
    assert.are.equal(n, count)
    -- -0.0 and the float32 extremes survive bit for bit
    assert.are.equal(-math.huge, 1 / ts["special.f32"]:totable()[2])
  end)

  it("writes it back byte-identical in content", function()
    local ts, meta = nd.load("spec/fixtures/torch_state.safetensors")
    local p = tmp("resaved.safetensors")
    nd.save(ts, p, meta)
    local again, meta2 = nd.load(p)
    assert.are.same(meta, meta2)
    for k, t in pairs(ts) do same_tensor(t, again[k]) end
  end)
end)
