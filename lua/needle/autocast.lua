-- needle.autocast: nd.autocast(fn, opts), mixed precision for a scope
-- (docs/tensor.md, "Mixed precision").
--
--   local loss = nd.autocast(function() return nd.F.cross_entropy(model(x), y) end)
--   loss:backward()      -- each product's gradient at its forward's precision
--
-- device_type = "cpu" (the default): inside fn, float32 matrix products
-- (matmul, linear, conv2d's GEMMs, attention) run on bfloat16 inputs with
-- float32 sums where the CPU has AVX512_BF16 -
-- nd.set_float32_matmul_precision("medium") for the scope - while
-- everything else (elementwise ops, reductions, softmax, norms, losses)
-- stays float32; tensors stay float32 in memory. On a CPU without
-- AVX512_BF16 products stay float32.
-- device_type = "opencl": float32 products on OpenCL devices (matmul,
-- linear, conv2d's im2col GEMMs, the recurrent layers' projections) round
-- their operands to dtype (float16, the default as PyTorch's "cuda"
-- autocast, or bfloat16) and sum in float32: half precision's numerics.
-- The fused attention and depthwise kernels stay float32, and so does the
-- speed: needle has no half-arithmetic GEMM kernels for OpenCL yet.
-- Each scope touches only its device type's products (as PyTorch's).
-- The autograd nodes made inside remember the setting, so the backward's
-- products run at it too, wherever backward() is called (as PyTorch's
-- autocast, whose backward follows the forward's dtypes). enabled = false
-- runs fn with float32 products, inside an outer nd.autocast too. fn must
-- not yield (a coroutine suspended inside would leave the setting on, and
-- the scope's bounded weight cache in use). The setting is process-wide
-- (as PyTorch's set_float32_matmul_precision); the scope's weight cache is
-- the calling thread's.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local OPTS = {dtype = "string", enabled = "boolean", device_type = "string"}

function M.autocast(fn, opts)
  local fail = errors.failer("autocast")
  if type(fn) ~= "function" then fail("expected a function to run, got %s", type(fn)) end
  opts = options.check("autocast", opts, OPTS)
  local device = opts.device_type or "cpu"
  if device ~= "cpu" and device ~= "opencl" then
    fail("device_type must be \"cpu\" or \"opencl\", got %q", device)
  end
  local dtype = opts.dtype or (device == "cpu" and "bfloat16" or "float16")
  if dtype ~= "bfloat16" and dtype ~= "float16" then
    fail("dtype must be \"float16\" or \"bfloat16\", got %q", dtype)
  elseif device == "cpu" and dtype == "float16" then
    fail("dtype float16 with device_type \"cpu\": the CPU's reduced-precision products are bfloat16 " ..
         "(AVX512_BF16); use dtype = \"bfloat16\", or device_type = \"opencl\" for float16")
  end
  -- a replay would not run this scope's Lua: the precision is a guard of
  -- nd.compile instead (call the compiled function inside nd.autocast)
  core._graph_break("nd.autocast inside a compiled function: its precision would not be replayed; " ..
                    "call the compiled function inside nd.autocast instead")
  if device == "opencl" then
    local prev = core._get_opencl_matmul_dtype()
    local restore <close> = setmetatable({}, {__close = function() core._set_opencl_matmul_dtype(prev) end})
    core._set_opencl_matmul_dtype(opts.enabled == false and "float32" or dtype)
    return fn()
  end
  local prev = core.get_float32_matmul_precision()
  -- restored however fn ends, an error keeping its own traceback; the
  -- scope's cache of weights packed to bfloat16 goes with the outermost one
  local restore <close> = setmetatable({}, {__close = function()
    core.set_float32_matmul_precision(prev)
    core._autocast_exit()
  end})
  core._autocast_enter()
  -- enabled = false: float32 products, also inside an outer nd.autocast (as PyTorch's)
  core.set_float32_matmul_precision(opts.enabled == false and "highest" or "medium")
  return fn()
end

return M
