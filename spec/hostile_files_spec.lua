-- hostile_files_spec.lua - every malicious or malformed file of
-- spec/fixtures/hostile/ (written by spec/fixtures/gen/gen_hostile.py, listed
-- with the loader and the expected error in its manifest.lua) is refused:
-- nd.load_torch / nd.load raise an error that starts with "needle.<loader>:",
-- names the file and says what is wrong, and the attempt has no side effect:
-- no payload ran (the os.system / eval payloads would create
-- /tmp/needle-hostile-marker-*), no file appeared next to the hostile ones,
-- and a model whose load_state_dict was fed the result is unchanged.
--
-- The sanitizer build runs this spec too (scripts/test.sh --asan), which is
-- how every malicious file is loaded under ASan/UBSan in CI.
--
-- Files too big to keep as fixtures, or that are not files, are made at run
-- time (the last describe block): archives that ask for more than a load's
-- budget (decompressed bytes, pickle items), polyglots built to be taken for
-- another format, and FIFOs and devices in a checkpoint's place. A file
-- truncated while it is read is tests/c/test_io_truncated.c's (it needs to
-- act between the reader's system calls).
local nd = require "needle"
local lfs = require "lfs"
local S = require "spec.helpers.shell"
local Z = require "spec.helpers.torch_zip"

local DIR = "spec/fixtures/hostile/"
local MARKER_PREFIX = "needle-hostile-marker-"

local manifest = dofile(DIR .. "manifest.lua")

local function listing(dir)
  local out = {}
  for name in lfs.dir(dir) do
    if name ~= "." and name ~= ".." then out[#out + 1] = name end
  end
  table.sort(out)
  return out
end

-- payload markers present in /tmp
local function markers()
  local out = {}
  for name in lfs.dir("/tmp") do
    if name:sub(1, #MARKER_PREFIX) == MARKER_PREFIX then out[#out + 1] = "/tmp/" .. name end
  end
  return out
end

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

local function snapshot(model)
  local out = {}
  for k, v in pairs(model:state_dict()) do out[k] = hex(v:tobytes()) end
  return out
end

describe("hostile files", function()
  setup(function()
    -- a leftover of an earlier run that went wrong must not hide this one
    for _, m in ipairs(markers()) do os.remove(m) end
  end)

  it("are all listed in the manifest (and every listed file exists)", function()
    local listed = {}
    for i, e in ipairs(manifest) do
      assert.are.equal("string", type(e.file), "entry " .. i)
      assert.truthy(e.loader == "load_torch" or e.loader == "load", e.file .. ": loader")
      assert.are.equal("string", type(e.error), e.file .. ": error")
      assert.truthy(#e.error > 0, e.file .. ": empty error text")
      assert.are.equal("string", type(e.why), e.file .. ": why")
      listed[e.file] = true
    end
    local missing = {}
    for _, name in ipairs(listing(DIR)) do
      if name ~= "manifest.lua" and not listed[name] then missing[#missing + 1] = name end
    end
    assert.are.same({}, missing, "files of " .. DIR .. " missing from manifest.lua")
    for name in pairs(listed) do
      assert.is_true(lfs.attributes(DIR .. name, "mode") == "file", name .. " is listed but absent")
    end
    assert.truthy(#manifest >= 60)
  end)

  local before
  for _, e in ipairs(manifest) do
    it(("%s: %s is refused (%s)"):format(e.file, e.loader, e.why), function()
      before = before or listing(DIR)
      local path = DIR .. e.file
      local ok, msg = pcall(nd[e.loader], path)
      assert.is_false(ok, path .. " was accepted by nd." .. e.loader)
      assert.are.equal("string", type(msg))
      local head = "needle." .. e.loader .. ":"
      assert.are.equal(head, msg:sub(1, #head), msg)
      local _, name_end = msg:find(e.file, 1, true)
      assert.truthy(name_end, "the message does not name the file: " .. msg)
      -- the expected text after the file name (names like storage_too_small.pt
      -- would otherwise match it themselves)
      assert.truthy(msg:find(e.error, name_end + 1, true), ("expected %q in: %s"):format(e.error, msg))
      assert.are.same({}, markers(), "a payload ran")
      assert.are.same(before, listing(DIR), "a file appeared or vanished next to the hostile files")
    end)
  end

  it("leave a model untouched when its load_state_dict is fed the result", function()
    assert.are.equal("function", type(nd.load_torch))
    -- the hostile archives' tensors are called "weight", as a Linear's is, so
    -- a non-strict load would copy whatever got through
    local model = nd.nn.Linear(2, 2)
    local want = snapshot(model)
    local n = 0
    for _, e in ipairs(manifest) do
      if e.loader == "load_torch" then
        for _, opts in ipairs({{}, {strict = false}}) do
          -- (that nd.load_torch fails is the per-file tests' business)
          pcall(function() model:load_state_dict(nd.load_torch(DIR .. e.file), opts) end)
          assert.are.same(want, snapshot(model), e.file .. " changed the model")
        end
        n = n + 1
      end
    end
    assert.truthy(n > 0)
    assert.are.same({}, markers(), "a payload ran")
  end)

  it("are refused again on a second attempt (no state kept between loads)", function()
    assert.are.equal("function", type(nd.load_torch))
    for _, e in ipairs(manifest) do
      local ok1, m1 = pcall(nd[e.loader], DIR .. e.file)
      local ok2, m2 = pcall(nd[e.loader], DIR .. e.file)
      assert.is_false(ok1, e.file)
      assert.is_false(ok2, e.file)
      assert.are.equal(m1, m2, e.file)
    end
  end)
end)

describe("hostile files made at run time", function()
  local dir
  setup(function()
    dir = S.shell_line("mktemp -d \"${TMPDIR:-/tmp}/needle-hostile-spec.XXXXXX\"")
    assert(dir and dir:match("needle%-hostile%-spec"), "mktemp failed")
    for _, m in ipairs(markers()) do os.remove(m) end
  end)
  teardown(function()
    if dir and dir:match("needle%-hostile%-spec") then os.execute("rm -rf " .. S.q(dir)) end
  end)
  local function file(name, content)
    local p = dir .. "/" .. name
    S.write_file(p, content)
    return p
  end
  -- pcall(nd[loader], path) fails with "needle.<loader>: '<path>': " and then want
  local function refused(loader, path, want)
    local ok, msg = pcall(nd[loader], path)
    assert.is_false(ok, path .. " was accepted by nd." .. loader)
    local head = ("needle.%s: '%s': "):format(loader, path)
    assert.are.equal(head, msg:sub(1, #head), msg)
    assert.truthy(msg:find(want, #head + 1, true), ("expected %q in: %s"):format(want, msg))
    assert.are.same({}, markers(), "a payload ran")
  end

  it("a 5 MB archive of four deflated storages claiming 5 GiB: refused before one is inflated", function()
    local claim = 5 << 28 -- 1.25 GiB each
    local junk = ("\xa5"):rep(claim // 1000) -- not a deflate stream: inflating it would fail at once
    local entries = {{name = "archive/data.pkl", data = Z.pickle_storages({
      a = {key = "0", numel = claim}, b = {key = "1", numel = claim},
      c = {key = "2", numel = claim}, d = {key = "3", numel = claim}})}}
    for k = 0, 3 do
      entries[#entries + 1] = {name = "archive/data/" .. k, data = junk, size = claim, deflated = true}
    end
    local p = file("deflated_5gib.pt", Z.zip(entries))
    for _, loader in ipairs({"load_torch", "load"}) do
      refused(loader, p, "its 4 deflated storages decompress to 5368709120 bytes in all, more than the "
              .. "4294967296 left of the limit of 4294967296 decompressed bytes per load (nd.load_torch's option "
              .. "max_decompressed_bytes raises it)")
    end
  end)

  it("a pickle of four lists of 1.1 million items: refused at the limit of 4 Mi items per load", function()
    local list = "]" .. ("(" .. ("N"):rep(1000) .. "e"):rep(1100)
    local p = file("many_items.pt", Z.checkpoint("\x80\x02(" .. list:rep(4) .. "t."))
    for _, loader in ipairs({"load_torch", "load"}) do
      refused(loader, p, "more than 4194304 items (values, and list, tuple and dict elements) in all, the limit per "
              .. "load (nd.load_torch's option max_items raises it)")
    end
  end)

  it("polyglots are read as the format their start says, so a payload behind them never runs", function()
    local payload = "\x80\x02cos\nsystem\nX" .. string.pack("<I4", 40) .. ("touch " .. MARKER_PREFIX):sub(1, 40)
                    .. "\x85R."
    -- a safetensors header around a torch zip that would run os.system: nd.load reads the
    -- safetensors file, nd.load_torch refuses it; neither unpickles anything
    local zip = Z.checkpoint(payload)
    local json = '{"z":{"dtype":"U8","shape":[' .. #zip .. '],"data_offsets":[0,' .. #zip .. ']}}'
    local p = file("safetensors_around_zip.pt", string.pack("<I8", #json) .. json .. zip)
    assert.are.equal(#zip, #nd.load(p).z:tobytes())
    refused("load_torch", p, "it is a safetensors file, which nd.load reads")
    -- torch's legacy magic number in front of a zip: the legacy format, refused
    local legacy = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19."
    p = file("legacy_then_zip.pt", legacy .. zip)
    refused("load_torch", p, "legacy (pre-1.6) format")
    refused("load", p, "legacy (pre-1.6) format")
    -- a header length that reads like a pickle (640: 0x80 0x02) followed by a pickle
    p = file("pickle_like_header.pt", string.pack("<I8", 640) .. payload .. (" "):rep(640))
    refused("load", p, "the header is not valid UTF-8")
    refused("load_torch", p, "bare pickle stream without the magic number")
    assert.are.same({}, markers(), "a payload ran")
  end)

  it("a FIFO or a device in a checkpoint's place is refused at once", function()
    local fifo = dir .. "/fifo.pt"
    assert.is_true(os.execute("mkfifo " .. S.q(fifo)))
    local exe = S.needle_lua()
    local code = ([[
      local nd = require "needle"
      for _, path in ipairs({%q, "/dev/zero", "/dev/stdin"}) do
        for _, loader in ipairs({"load_torch", "load"}) do
          local ok, e = pcall(nd[loader], path)
          io.write(tostring(ok), "\t", tostring(e), "\n")
        end
        local ok, e = pcall(nd.checkpoint.load, path)
        io.write(tostring(ok), "\t", tostring(e), "\n")
      end
      io.write("done\n")
    ]]):format(fifo)
    -- a reader that blocked would hang the child, never the suite; stdin is a pipe
    local p = io.popen("echo | timeout 30 " .. S.q(exe) .. " -e " .. S.q(code) .. " 2>&1")
    local out = p:read("a")
    p:close()
    assert.matches("done\n$", out)
    local n = 0
    for ok, msg in out:gmatch("([^\t\n]+)\t([^\n]*)\n") do
      n = n + 1
      assert.are.equal("false", ok, msg)
      assert.truthy(msg:find("not a regular file (a ", 1, true), msg)
    end
    assert.are.equal(9, n, out)
  end)
end)
