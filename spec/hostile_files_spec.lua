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
local nd = require "needle"
local lfs = require "lfs"

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
