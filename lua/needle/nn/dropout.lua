-- needle.nn.dropout: Dropout(p = 0.5), Dropout2d(p = 0.5).
--
-- In training mode each element (Dropout) or each whole channel (Dropout2d,
-- of (N, C, H, W) or (N, C, L)) is zeroed with probability p and the rest
-- are scaled by 1 / (1 - p); in evaluation mode (model:eval()) it is the
-- identity.
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local util = require "needle.nn.util"

local M = {}

local Dropout = Module:extend("Dropout")

-- Dropout(p = 0.5[, {inplace=}]) or Dropout({p=, inplace=}); inplace, as
-- in nn.ReLU, is accepted and the result is a new tensor
function Dropout:init(p, opts)
  p, opts = util.first_or_options(self, p, opts, "p", "number", {inplace = "boolean"})
  self.inplace = opts.inplace
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then -- (NaN too)
    error(("needle.nn.%s: p must be a probability in [0, 1], got %s"):format(self.__name, tostring(p)), 3)
  end
  self.p = p
end

function Dropout:forward(x) return nd.F.dropout(x, self.p, self.training) end

function Dropout:extra_repr() return ("p=%s%s"):format(self.p, self.inplace and ", inplace=true" or "") end
M.Dropout = Dropout

-- Dropout2d(p = 0.5[, {inplace=}]) or Dropout2d({p=, inplace=}): F.dropout2d
local Dropout2d = Dropout:extend("Dropout2d")

function Dropout2d:forward(x) return nd.F.dropout2d(x, self.p, self.training) end
M.Dropout2d = Dropout2d

return M
