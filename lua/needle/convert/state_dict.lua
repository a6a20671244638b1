-- needle.convert.state_dict: what the registry's build functions read from a
-- state dict to size a model (internal; needle.convert.models and the
-- needle.zoo registrations share it).
--
--   need(sd, key, dims, model) -> sd[key], a tensor of `dims` dims (any when
--       dims is nil), or a needle.convert error naming model and key
--   count_indexed(sd, fmt) -> the largest n such that fmt:format(0 .. n-1) are
--       all keys of sd ("layers.%d.weight": how many layers)
local errors = require "needle.errors"
local core = require "needle.core"

local M = {}

local fail = errors.failer("convert", 0)

function M.need(sd, key, dims, model)
  local t = sd[key]
  if t == nil then fail("%s: the state dict has no '%s'", model, key) end
  if not core.is_tensor(t) then fail("%s: '%s' is a %s, not a tensor", model, key, type(t)) end
  if dims and t:dim() ~= dims then
    fail("%s: '%s' should have %d dims, has shape %s", model, key, dims, errors.shape_str(t))
  end
  return t
end

function M.count_indexed(sd, fmt)
  local n = 0
  while sd[fmt:format(n)] ~= nil do n = n + 1 end
  return n
end

return M
