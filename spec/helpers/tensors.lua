-- spec/helpers/tensors.lua - needle tensors from the pure-Lua reference
-- tensors of spec/helpers/reference.lua (which itself never calls needle).
--
--   local T = require("spec.helpers.tensors").T
--   local x = T(ref)            -- float32
--   local i = T(ref, "int64")   -- any dtype

local nd = require "needle"
local R = require "spec.helpers.reference"

local M = {}

-- A needle tensor holding a reference tensor's values.
function M.T(ref, dtype)
  local opts = { dtype = dtype or "float32" }
  if R.numel(ref.shape) == 0 then return nd.zeros(ref.shape, opts) end
  return nd.tensor(R.nested(ref), opts)
end

return M
