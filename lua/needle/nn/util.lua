-- needle.nn.util: small helpers shared by the nn family files (internal).
local M = {}

-- "{2,3}", the way needle's errors spell a shape
function M.shape_str(t) return "{" .. table.concat(t.shape, ",") .. "}" end

-- opts[name] when opts is a table that has it, else default
function M.opt(opts, name, default)
  if type(opts) ~= "table" or opts[name] == nil then return default end
  return opts[name]
end

return M
