-- image_spec.lua - nd.image (issue 21): PNG, JPEG and PPM/PGM files decoded as
-- PIL decodes them (spec/fixtures/gen/gen_images.py wrote the files and
-- spec/fixtures/images_expected.lua), torchvision's resize and evaluation
-- transform, and hostile files: truncated, corrupt, huge headers.
--
--   build/needle-lua spec/run.lua spec/image_spec.lua
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local S = require "spec.helpers.shell"
local D = require "spec.helpers.devices"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local DIR = "spec/fixtures/images/"
local want = dofile("spec/fixtures/images_expected.lua")

local function flat(t)
  local out = {}
  local c = t:reshape({-1}):to({device = "cpu", dtype = "int64"})
  for i = 1, c:numel() do out[i] = c[i]:item() end
  return out
end

local function tmpfile(bytes)
  local path = os.tmpname()
  S.write_file(path, bytes)
  return path
end

describe("nd.image.read", function()
  it("decodes every fixture as PIL does, in RGB and in gray", function()
    local n = 0
    for name, e in pairs(want.images) do
      local rgb = nd.image.read(DIR .. name)
      assert.are.same({3, e.h, e.w}, rgb.shape, name)
      assert.are.equal("uint8", rgb.dtype)
      assert.are.same(e.rgb, flat(rgb), name .. " (rgb)")
      local gray = nd.image.read(DIR .. name, {mode = "gray"})
      assert.are.same({1, e.h, e.w}, gray.shape, name)
      assert.are.same(e.gray, flat(gray), name .. " (gray)")
      assert.are.equal(e.channels, nd.image.read(DIR .. name, {mode = "unchanged"}):size(1), name)
      n = n + 1
    end
    assert.are.equal(8, n)
  end)

  it("onto a device", function()
    for _, dev in ipairs(D.opencl()) do
      local x = nd.image.read(DIR .. "rgb.png", {device = dev})
      assert.are.equal(dev, x.device)
      assert.are.same(want.images["rgb.png"].rgb, flat(x))
    end
    if #D.opencl() == 0 then pending("reading onto OpenCL: no OpenCL device (" .. tostring(D.reason) .. ")") end
  end)

  it("hostile files are errors naming the file, never crashes", function()
    local png = S.read_file(DIR .. "rgb.png")
    local jpg = S.read_file(DIR .. "rgb.jpg")
    local cases = {
      {"", "is not a PNG, JPEG or binary PPM/PGM image"},
      {"GIF89a....", "is not a PNG, JPEG or binary PPM/PGM image"},
      {png:sub(1, 40), "PNG"},
      {png:sub(1, 8) .. ("\0"):rep(200), "PNG"},
      {jpg:sub(1, 3), "JPEG"},
      {"P6\n70000 2\n255\n", "more than needle reads"},
      {"P6\n30000 30000\n255\n", "more than needle reads"},
      {"P6\n2 2\n255\n123", "truncated"},
      {"P5\n2 2\n65535\n", "maxval 65535 is not supported"},
      {"P6\nx 2\n255\n", "a malformed P6 header"},
      {"P5\n0 2\n255\n", "no pixels"},
      {"P6 99999999999 1 255\n", "a malformed P6 header"},
    }
    -- a PNG whose header claims 100000 x 100000 pixels (CRC fixed, so the decoder reads it)
    local ihdr = "IHDR" .. string.pack(">I4I4", 100000, 100000) .. "\8\2\0\0\0"
    local function crc32(s)
      local c = 0xFFFFFFFF
      for i = 1, #s do
        c = c ~ s:byte(i)
        for _ = 1, 8 do c = (c & 1 == 1) and ((c >> 1) ~ 0xEDB88320) or (c >> 1) end
      end
      return c ~ 0xFFFFFFFF
    end
    local idat = "IDAT" .. "\120\1"
    cases[#cases + 1] = {"\137PNG\r\n\26\n" .. string.pack(">I4", 13) .. ihdr .. string.pack(">I4", crc32(ihdr))
                         .. string.pack(">I4", 2) .. idat .. string.pack(">I4", crc32(idat)),
                         "more than needle reads"}
    -- corrupt JPEG data after a valid header: flip bytes in the middle
    local bad = jpg:sub(1, 200) .. ("\255\0"):rep(100) .. jpg:sub(401)
    cases[#cases + 1] = {bad, nil} -- libjpeg may decode a damaged scan with a warning: only no crash
    for i, c in ipairs(cases) do
      local path = tmpfile(c[1])
      local ok, e = pcall(nd.image.read, path)
      os.remove(path)
      if c[2] then
        assert.is_false(ok, ("case %d read"):format(i))
        assert_contains(tostring(e), "needle.image.read: " .. path)
        assert_contains(tostring(e), c[2])
      end
    end
    assert_contains(errmsg(nd.image.read, "/nonexistent/x.png"), "needle.image.read: cannot open /nonexistent/x.png")
  end)

  it("rejects bad options", function()
    assert_contains(errmsg(nd.image.read, DIR .. "rgb.png", {mode = "cmyk"}),
                    "needle.image.read: mode must be 'rgb', 'gray' or 'unchanged', got 'cmyk'")
    assert_contains(errmsg(nd.image.read, DIR .. "rgb.png", {chanels = 3}),
                    "needle.image.read: unknown option 'chanels' (valid: device, mode)")
    assert_contains(errmsg(nd.image.read, 3), "needle.image.read: expected a file name, got number")
  end)
end)

describe("nd.image transforms", function()
  it("resize (shorter side) and preprocess equal torchvision's", function()
    local x = nd.image.read(DIR .. "rgb.png")
    local r = nd.image.resize(x, 6)
    assert.are.same(want.resize6.shape, r.shape)
    local got = flat(r)
    for i, v in ipairs(want.resize6.data) do
      assert(math.abs(got[i] - v) <= 1, ("resize element %d: %d, torchvision %d"):format(i, got[i], v))
    end
    local p = nd.image.preprocess(x, {resize = 6, crop = 5})
    assert.are.same(want.preprocess.shape, p.shape)
    local pf = p:reshape({-1})
    -- from the uint8 resize: one grey level is 1/255/std ~ 0.0175 after normalising
    for i, v in ipairs(want.preprocess.data) do
      local g = pf[i]:item()
      assert(math.abs(g - v) <= 0.018, ("preprocess element %d: %g, torchvision %g"):format(i, g, v))
    end
  end)

  it("center_crop and the errors", function()
    local x = nd.arange(2 * 5 * 7):reshape({2, 5, 7})
    local c = nd.image.center_crop(x, {3, 4})
    assert.are.same({2, 3, 4}, c.shape)
    assert.are.equal(x[{1, 2, 3}]:item(), c[{1, 1, 1}]:item()) -- top (5-3)/2 = 1, left round(1.5) = 2
    local d = nd.image.center_crop(nd.arange(6 * 8):reshape({1, 6, 8}), 5) -- top round(0.5) = 0, as Python's round
    assert.are.equal(2, d[{1, 1, 1}]:item())
    assert_contains(errmsg(nd.image.center_crop, x, 9), "needle.image.center_crop: cannot crop 9x9 from an image of 5x7")
    assert_contains(errmsg(nd.image.resize, nd.zeros({4, 4}), 2), "needle.image.resize: expected an image tensor (C, H, W)")
    assert_contains(errmsg(nd.image.preprocess, nd.zeros({2, 8, 8}, {dtype = "uint8"}), {resize = 8, crop = 4}),
                    "mean and std need 2 values")
  end)
end)
