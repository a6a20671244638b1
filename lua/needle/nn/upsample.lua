-- needle.nn.upsample: Upsample, PixelShuffle, PixelUnshuffle.
--
--   nd.nn.Upsample({scale_factor = 2, mode = "nearest"})
--   nd.nn.Upsample({size = {32, 32}, mode = "bilinear", align_corners = true})
--   nd.nn.PixelShuffle(2), nd.nn.PixelUnshuffle(2)
--
-- No parameters; the forward passes are nd.F.interpolate, pixel_shuffle and
-- pixel_unshuffle (needle.functional.resample).
local nd = require "needle"
local Module = require "needle.nn.module"
local util = require "needle.nn.util"
local A = require "needle.functional.spatial_args"

local M = {}

local Upsample = Module:extend("Upsample")

local OPTS = {size = "integer|table", scale_factor = "number|table", mode = "string", align_corners = "boolean",
              recompute_scale_factor = "boolean"}
local MODES = {nearest = true, ["nearest-exact"] = true, linear = true, bilinear = true, trilinear = true}

-- Upsample({size=, scale_factor=, mode="nearest", align_corners=, recompute_scale_factor=})
-- or Upsample(size[, opts]). The checks F.interpolate can make without an
-- input are made here, at the line that builds the module.
function Upsample:init(size, opts)
  if opts == nil and type(size) == "table" and size[1] == nil then size, opts = nil, size end
  local o = util.options(self, opts, OPTS)
  if size ~= nil and o.size ~= nil then util.fail(self, "size given twice (an argument and an option)") end
  self.size = size or o.size
  self.scale_factor = o.scale_factor
  self.mode = o.mode or "nearest"
  self.align_corners = o.align_corners
  self.recompute_scale_factor = o.recompute_scale_factor
  if not MODES[self.mode] then
    util.fail(self, "mode must be 'nearest', 'nearest-exact', 'linear', 'bilinear' or 'trilinear', got '%s'", self.mode)
  end
  if (self.size == nil) == (self.scale_factor == nil) then
    util.fail(self, self.size == nil and "either size or scale_factor must be given"
                                      or "only one of size and scale_factor may be given")
  end
  if self.align_corners ~= nil and self.mode:find("^nearest") then
    util.fail(self, "align_corners can only be set with the interpolating modes: linear, bilinear, trilinear " ..
              "(mode '%s')", self.mode)
  end
end

function Upsample:forward(x)
  if not nd.is_tensor(x) then util.fail(self, "expected a tensor input, got %s", type(x)) end
  return nd.F.interpolate(x, {size = self.size, scale_factor = self.scale_factor, mode = self.mode,
    align_corners = self.align_corners, recompute_scale_factor = self.recompute_scale_factor})
end

local function show(v)
  if type(v) == "table" then return "{" .. table.concat(v, ", ") .. "}" end
  return tostring(v)
end

function Upsample:extra_repr()
  local s = self.size ~= nil and "size=" .. show(self.size) or "scale_factor=" .. show(self.scale_factor)
  s = s .. ", mode='" .. self.mode .. "'"
  if self.align_corners ~= nil then s = s .. ", align_corners=" .. tostring(self.align_corners) end
  return s
end
M.Upsample = Upsample

-- PixelShuffle(upscale_factor) / PixelUnshuffle(downscale_factor)
local function shuffle_module(name, what, fn)
  local class = Module:extend(name)
  function class:init(r)
    if math.type(r) ~= "integer" or r < 1 then
      util.fail(self, "%s must be a positive integer, got %s", what, A.show(r))
    end
    self[what] = r
  end
  function class:forward(x)
    if not nd.is_tensor(x) then util.fail(self, "expected a tensor input, got %s", type(x)) end
    return nd.F[fn](x, self[what])
  end
  function class:extra_repr() return ("%s=%d"):format(what, self[what]) end
  return class
end

M.PixelShuffle = shuffle_module("PixelShuffle", "upscale_factor", "pixel_shuffle")
M.PixelUnshuffle = shuffle_module("PixelUnshuffle", "downscale_factor", "pixel_unshuffle")

return M
