-- needle: the Lua face of the needle-lua runtime.
-- `local nd = require "needle"` gives the tensor library (C core bindings in
-- needle.core) plus the Lua-side pieces. No globals are created.
local core = require "needle.core"

local nd = {}
for k, v in pairs(core) do nd[k] = v end

local tensor_print = require "needle.tensor_print"
core._metatable.__tostring = tensor_print.format
nd.set_printoptions = tensor_print.set_printoptions
nd.get_printoptions = tensor_print.get_printoptions

nd.F = require "needle.functional"

nd.dtypes = { "float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16" }
nd.version = core._VERSION

return nd
