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

  it("refuse arguments they do not take, and never name their errors after one", function()
    local p = tmp("extra.safetensors")
    nd.save({w = nd.ones({2})}, p, nil, nil) -- (trailing nils are no arguments)
    local missing = tmp("missing.safetensors")
    local function refused(fn, want, ...)
      local e = err_of(fn, ...)
      assert.are.equal(1, select(2, e:gsub("needle%.", "")), e) -- one name, the function's
      assert.matches(want, e, 1, true)
    end
    refused(nd.load, "needle.load: takes load(path) only, got an extra argument #2: a table", p, {device = "cpu"})
    refused(nd.load, 'needle.load: takes load(path) only, got an extra argument #2: "cuda"', p, "cuda")
    refused(nd.load, 'needle.load: takes load(path) only, got an extra argument #2: "cuda"', missing, "cuda")
    refused(nd.load_torch, "needle.load_torch: takes load_torch(path[, opts]) only, got an extra argument #3: a table",
            "spec/fixtures/torch_ckpt/mlp.pt", {}, {})
    refused(nd.save, "needle.save: takes save(tensors, path[, metadata]) only, got an extra argument #4: a table",
            {w = nd.ones({2})}, p, {}, {})
    refused(nd.save, 'needle.save: takes save(tensors, path[, metadata]) only, got an extra argument #4: "x"',
            {w = nd.ones({2})}, p, nil, "x")
    refused(serialize.read_header, 'needle.read_header: takes read_header(path) only, got an extra argument #2: "x"',
            p, "x")
    refused(serialize.file_format, "needle.file_format: takes file_format(path) only, got an extra argument #2: 1", p, 1)
    -- a missing file is named under load's name whatever follows it
    assert.matches("needle.load: cannot open '" .. missing .. "'", err_of(nd.load, missing, nil), 1, true)
    -- (nd.checkpoint names its errors through the internal save_as / load_as)
    assert.matches("needle.checkpoint.load: ", err_of(nd.checkpoint.load, missing), 1, true)
    assert.are.same({2}, nd.load(p).w.shape)
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

  it("returns File too large under a file size limit with SIGXFSZ at its default (no trap)", function()
    local p = tmp("keep_nosig.safetensors")
    nd.save({old = nd.tensor({1, 2, 3})}, p)
    local before = read(p)
    -- SIGXFSZ's default action kills the process (exit 153) if a write crosses the limit
    local exe = S.needle_lua()
    for _, call in ipairs({
      ("nd.save({new = nd.zeros({100000})}, %q)"):format(p),
      ("nd.write_file_atomic(%q, (\"x\"):rep(5000))"):format(p),
      ("nd.checkpoint.save(%q, {extra = {t = nd.zeros({100000})}})"):format(p),
    }) do
      local code = ("local ok, e = pcall(function() %s end); io.write(tostring(e), '\\n')"):format(call)
      local f = io.popen("ulimit -f 4; " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1; echo \"exit $?\"")
      local out = f:read("a")
      f:close()
      local want = "cannot write '" .. p .. "': File too large\nexit 0\n"
      assert.are.equal(want, out:sub(-#want), out)
      assert.are.equal(before, read(p))
      assert.are.same({}, temporaries())
    end
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

describe("what a file is (nd.load, nd.load_torch: src/io/format.c)", function()
  -- the header length of a file nd.save wrote
  local function header_len(p) return (string.unpack("<I8", read(p))) end

  -- nd.save of one tensor with metadata padded so that the header is exactly n bytes long
  local function save_with_header(p, n)
    local t = {w = nd.tensor({1, 2, 3})}
    local pad = 0
    for _ = 1, 4 do
      nd.save(t, p, {pad = ("x"):rep(pad)})
      local got = header_len(p)
      if got == n then return end
      pad = pad + (n - got)
      assert(pad >= 0, "header too long already")
    end
    error("could not reach a header of " .. n .. " bytes")
  end

  it("reads back files of nd.save whose header length starts like a pickle (0x80 0x02..0x05)", function()
    local p = tmp("pickle_like.safetensors")
    for _, n in ipairs({640, 896, 1152, 1408, 65536 + 640, 2 * 65536 + 896, 3 * 65536 + 1152, 4 * 65536 + 1408}) do
      save_with_header(p, n)
      local head = read(p):sub(1, 2)
      assert.are.equal(0x80, head:byte(1))
      assert.truthy(head:byte(2) >= 2 and head:byte(2) <= 5)
      local back, meta = nd.load(p)
      assert.are.same({1, 2, 3}, back.w:totable(), "header length " .. n)
      assert.is_string(meta.pad) -- the metadata came back
      assert.are.equal("safetensors", serialize.file_format(p))
    end
  end)

  it("reads back a 784-512-512-512-512-512-10 MLP saved with nd.save", function()
    nd.manual_seed(0)
    local layers = {nd.nn.Linear(784, 512)}
    for _ = 1, 4 do
      layers[#layers + 1] = nd.nn.ReLU()
      layers[#layers + 1] = nd.nn.Linear(512, 512)
    end
    layers[#layers + 1] = nd.nn.ReLU()
    layers[#layers + 1] = nd.nn.Linear(512, 10)
    local model = nd.nn.Sequential(table.unpack(layers))
    local p = tmp("mlp.safetensors")
    nd.save(model, p)
    local back = nd.load(p)
    local n = 0
    for k, t in pairs(model:state_dict()) do
      assert.are.equal(t:tobytes(), back[k]:tobytes(), k)
      n = n + 1
    end
    assert.are.equal(12, n)
    -- and as a checkpoint
    local c = tmp("mlp.ckpt")
    nd.checkpoint.save(c, {model = model, step = 1})
    local other = nd.nn.Sequential(table.unpack(layers))
    assert.are.equal(1, nd.checkpoint.load(c, {model = other}).step)
  end)

  it("reads every header length from 1 to 1500", function()
    local p = tmp("sweep.safetensors")
    local json = '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    local bad = {}
    for n = #json, 1500 do
      write(p, st_file(json .. (" "):rep(n - #json), "\7\9"))
      local ok, back = pcall(nd.load, p)
      if not ok or back.w:totable()[2] ~= 9 then bad[#bad + 1] = n .. ": " .. tostring(back) end
    end
    assert.are.same({}, bad)
    for n = 1, #json - 1 do -- too short for the header: refused as safetensors, never as something else
      write(p, st_file(("{"):rep(n), ""))
      assert.matches("needle.load: '" .. p .. "': invalid header JSON", err_of(nd.load, p), 1, true)
    end
  end)

  it("reads a file whose header length spells PK\\3\\4 (a zip's first bytes)", function()
    local json = '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    local n = string.unpack("<I4", "PK\3\4")
    local p = tmp("pk.safetensors")
    write(p, st_file(json .. (" "):rep(n - #json), "\42"))
    assert.are.equal("PK\3\4", read(p):sub(1, 4))
    assert.are.same({42}, nd.load(p).w:totable())
    assert.are.equal("safetensors", serialize.file_format(p))
  end)

  it("sends zips and torch's legacy files to load_torch, the rest to the safetensors reader", function()
    assert.are.equal("zip", serialize.file_format("spec/fixtures/torch_ckpt/mlp.pt"))
    assert.are.equal("torch_legacy", serialize.file_format("spec/fixtures/torch_ckpt/legacy.pt"))
    assert.are.equal("safetensors", serialize.file_format("spec/fixtures/torch_state.safetensors"))
    local cases = {
      {"empty", "", "file too short (0 bytes)"},
      {"text", "just some text, nothing else", "header length"},
      {"gzip", "\31\139\8\0\0\0\0\0\0\3\3\0\0\0\0\0\0\0\0\0", "(this looks like a gzip file)"},
      {"bare pickle", "\x80\x02cos\nsystem\n(X\2\0\0\0lstR.", "header length"},
      {"no brace", string.pack("<I8", 4) .. "    ", "invalid header JSON"},
    }
    for _, c in ipairs(cases) do
      local p = tmp(c[1])
      write(p, c[2])
      assert.are.equal("unknown", serialize.file_format(p), c[1])
      local e = err_of(nd.load, p)
      assert.matches("needle.load: '" .. p .. "': ", e, 1, true)
      assert.matches(c[3], e, 1, true)
      assert.matches("needle.load_torch: '" .. p .. "': not a PyTorch checkpoint (zip) file",
                     err_of(nd.load_torch, p), 1, true)
    end
    assert.matches("it is a bare pickle stream without the magic number", err_of(nd.load_torch, tmp("bare pickle")), 1,
                   true)
    assert.matches("needle.load_torch: 'spec/fixtures/torch_state.safetensors': not a PyTorch checkpoint (zip) file: it "
                   .. "is a safetensors file, which nd.load reads",
                   err_of(nd.load_torch, "spec/fixtures/torch_state.safetensors"), 1, true)
  end)
end)

describe("paths with a NUL byte", function()
  it("are refused by every function that takes a path, before any file is touched", function()
    local p = tmp("nul")
    local bad = p .. "\0.safetensors"
    local want = "path '" .. p .. "\\0...' contains a NUL byte"
    local core = require "needle.core"
    local calls = { -- {the op the error names, the call}
      {"save", function() nd.save({a = nd.zeros({1})}, bad) end},
      {"load", function() nd.load(bad) end},
      {"load_torch", function() nd.load_torch(bad) end},
      {"read_header", function() serialize.read_header(bad) end},
      {"file_format", function() serialize.file_format(bad) end},
      {"gunzip", function() nd.gunzip(bad) end},
      {"write_file_atomic", function() nd.write_file_atomic(bad, "x") end},
      {"checkpoint.save", function() nd.checkpoint.save(bad, {step = 1}) end},
      {"checkpoint.load", function() nd.checkpoint.load(bad) end},
      {"checkpoint.read", function() nd.checkpoint.read(bad) end},
      -- the bindings themselves, under the Lua layer
      {"save", function() core._safetensors_save(bad, {}) end},
      {"load", function() core._safetensors_load(bad) end},
      {"load", function() core._file_format(bad) end},
      {"load_torch", function() core.load_torch(bad) end},
      {"file_type", function() core._file_type(bad) end},
    }
    write(p, "not a checkpoint")
    for _, c in ipairs(calls) do
      local e = err_of(c[2])
      assert.truthy(e:find("needle." .. c[1] .. ": " .. want, 1, true), e)
    end
    assert.are.equal("not a checkpoint", read(p))
    assert.are.same({}, temporaries())
  end)
end)

describe("nd.save onto something that is not a regular file", function()
  it("refuses a FIFO, a socket's or device's place, a symlink to one, and leaves them alone", function()
    local fifo = tmp("target.fifo")
    assert.is_true(os.execute("mkfifo " .. S.q(fifo)))
    local link = tmp("null.link")
    assert.is_true(os.execute("ln -s /dev/null " .. S.q(link)))
    local t = {a = nd.zeros({2})}
    local function kind(p) return S.shell_line("stat -c %F " .. S.q(p)) end
    for _, case in ipairs({
      {fifo, "it is a FIFO, not a regular file"},
      {link, "it is a symbolic link to a character device, not a regular file"},
    }) do
      local p, why = case[1], case[2]
      local before = kind(p)
      assert.matches("needle.save: cannot replace '" .. p .. "': " .. why, err_of(nd.save, t, p), 1, true)
      assert.matches("needle.write_file_atomic: cannot replace '" .. p .. "': " .. why,
                     err_of(nd.write_file_atomic, p, "x"), 1, true)
      assert.matches("needle.checkpoint.save: cannot replace '" .. p .. "': " .. why,
                     err_of(nd.checkpoint.save, p, {step = 1}), 1, true)
      assert.are.equal(before, kind(p))
    end
    assert.are.equal("symbolic link", kind(link))
    assert.are.equal("character special file", kind("/dev/null"))
    assert.are.same({}, temporaries())
    if S.shell_line("id -u") == "0" then
      -- a character device node of our own (as root, the old writer replaced it)
      local dev = tmp("null.dev")
      assert.is_true(os.execute("mknod " .. S.q(dev) .. " c 1 3"))
      assert.matches("needle.save: cannot replace '" .. dev .. "': it is a character device, not a regular file",
                     err_of(nd.save, t, dev), 1, true)
      assert.are.equal("character special file", kind(dev))
    end
  end)

  it("still replaces a symlink to a regular file (the link, not the file it points to)", function()
    local target, link = tmp("real.safetensors"), tmp("real.link")
    nd.save({a = nd.ones({1})}, target)
    os.execute("ln -sfn " .. S.q(target) .. " " .. S.q(link))
    nd.save({a = nd.zeros({1})}, link)
    assert.are.same({0}, nd.load(link).a:totable())
    assert.are.same({1}, nd.load(target).a:totable())
  end)
end)

describe("readers on a FIFO", function()
  it("refuse it at once instead of waiting for a writer", function()
    local fifo = tmp("reader.fifo")
    assert.is_true(os.execute("mkfifo " .. S.q(fifo)))
    os.execute("mkdir -p " .. S.q(tmp("fifo_data")))
    assert.is_true(os.execute("mkfifo " .. S.q(tmp("fifo_data") .. "/train.txt")))
    -- in a child process with a time limit: a reader that blocks cannot hang the suite
    local exe = S.needle_lua()
    local code = ([[
      local nd = require "needle"
      local fifo, dir = %q, %q
      local calls = {
        {"load", function() return nd.load(fifo) end},
        {"load_torch", function() return nd.load_torch(fifo) end},
        {"gunzip", function() return nd.gunzip(fifo) end},
        {"read_header", function() return require("needle.serialize").read_header(fifo) end},
        {"checkpoint.load", function() return nd.checkpoint.load(fifo) end},
        {"checkpoint.read", function() return nd.checkpoint.read(fifo) end},
        {"data.mnist", function() return nd.data.mnist.read_idx(fifo) end},
        {"data.ptb", function() return nd.data.ptb.Corpus(dir) end},
      }
      for _, c in ipairs(calls) do
        local ok, e = pcall(c[2])
        io.write(c[1], "\t", tostring(ok), "\t", tostring(e):gsub("\n", " "), "\n")
      end
      io.write("done\n")
    ]]):format(fifo, tmp("fifo_data"))
    local p = io.popen("timeout 30 " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1")
    local out = p:read("a")
    p:close()
    assert.matches("done\n$", out)
    local n = 0
    for name, ok, msg in out:gmatch("([^\t\n]+)\t([^\t\n]+)\t([^\n]*)\n") do
      n = n + 1
      assert.are.equal("false", ok, name)
      local path = name == "data.ptb" and tmp("fifo_data") .. "/train.txt" or fifo
      assert.matches("cannot open '" .. path .. "': not a regular file (a FIFO)", msg, 1, true)
      assert.matches("needle.", msg, 1, true)
    end
    assert.are.equal(8, n, out)
  end)
end)

describe("stale temporaries of interrupted saves", function()
  -- a pid no process has: a child that has exited
  local function dead_pid()
    local pid = tonumber(S.shell_line("sh -c 'echo $$'"))
    assert.is_false(os.execute("kill -0 " .. pid .. " 2>/dev/null") == true)
    return pid
  end

  it("are removed by the next save to the same path when their process is gone", function()
    local p = tmp("stale.safetensors")
    local dead, dead2 = dead_pid(), dead_pid()
    local me = tonumber(S.shell_line("echo $PPID")) -- this process (the shell's parent)
    local files = {
      gone = p .. ".tmp." .. dead,                 -- removed
      gone_k = p .. ".tmp." .. dead .. ".3",       -- removed
      mine = p .. ".tmp." .. me,                   -- this process: kept
      init = p .. ".tmp.1",                        -- pid 1 lives: kept
      not_pid = p .. ".tmp.12x",                   -- not a temporary's name: kept
      other = tmp("other.safetensors") .. ".tmp." .. dead, -- another path's: kept
    }
    for _, f in pairs(files) do write(f, ("x"):rep(100)) end
    local dirlike = p .. ".tmp." .. dead2          -- a directory: kept
    os.execute("mkdir " .. S.q(dirlike))
    local link = p .. ".tmp." .. dead2 .. ".1"     -- a symlink: kept (and its target)
    os.execute("ln -s " .. S.q(files.other) .. " " .. S.q(link))
    local foreign
    if S.shell_line("id -u") == "0" then         -- someone else's: kept
      foreign = p .. ".tmp." .. dead2 .. ".2"
      write(foreign, "x")
      os.execute("chown 65534 " .. S.q(foreign))
    end
    nd.save({a = nd.zeros({1})}, p)
    assert.is_nil(io.open(files.gone, "rb"))
    assert.is_nil(io.open(files.gone_k, "rb"))
    for _, k in ipairs({"mine", "init", "not_pid", "other"}) do
      assert.are.equal(("x"):rep(100), read(files[k]), k)
    end
    assert.are.equal("directory", S.shell_line("stat -c %F " .. S.q(dirlike)))
    assert.are.equal("symbolic link", S.shell_line("stat -c %F " .. S.q(link)))
    if foreign then assert.are.equal("x", read(foreign)) end
    assert.are.same({0}, nd.load(p).a:totable())
    -- nd.write_file_atomic and checkpoint.save clean up the same way
    write(files.gone, "x")
    nd.write_file_atomic(p, "y")
    assert.is_nil(io.open(files.gone, "rb"))
    write(files.gone, "x")
    nd.checkpoint.save(p, {step = 1})
    assert.is_nil(io.open(files.gone, "rb"))
    os.execute("rm -rf " .. S.q(dirlike) .. " " .. S.q(link) .. (foreign and (" " .. S.q(foreign)) or ""))
    for _, f in pairs(files) do os.remove(f) end
  end)

  it("are kept while a writer holds their lock (a process kill() cannot see, as in another container)", function()
    local p = tmp("locked.safetensors")
    local t = p .. ".tmp." .. dead_pid()
    write(t, "x")
    -- flock(1) holds the lock while its child runs; READY says it has it
    local ready = p .. ".ready"
    local holder = S.shell_line(("flock %s sh -c 'echo > %s; exec sleep 30' >/dev/null 2>&1 & echo $!")
                                :format(S.q(t), S.q(ready)))
    for _ = 1, 500 do
      if S.exists(ready) then break end
      os.execute("sleep 0.01")
    end
    -- its child first (it inherited the locked descriptor), then flock itself
    local function release()
      os.execute("pkill -P " .. holder .. " 2>/dev/null; kill " .. holder .. " 2>/dev/null; sleep 0.1")
    end
    finally(release)
    assert.is_true(S.exists(ready), "flock did not start")
    nd.save({a = nd.zeros({1})}, p)
    assert.are.equal("x", read(t))
    release()
    nd.save({a = nd.zeros({1})}, p) -- unlocked now: removed
    assert.is_nil(io.open(t, "rb"))
    os.remove(ready)
  end)
end)
