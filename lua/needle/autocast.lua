-- needle.autocast: nd.autocast(fn, opts), mixed precision for a scope
-- (docs/tensor.md, "Mixed precision").
--
--   local loss = nd.autocast(function() return nd.F.cross_entropy(model(x), y) end)
--   loss:backward()      -- each product's gradient at its forward's precision
--
-- Inside fn, float32 matrix products (matmul, linear, conv2d's GEMMs,
-- attention) run on bfloat16 inputs with float32 sums where the CPU has
-- AVX512_BF16 - nd.set_float32_matmul_precision("medium") for the scope -
-- while everything else (elementwise ops, reductions, softmax, norms,
-- losses) stays float32; tensors stay float32 in memory. The autograd
-- nodes made inside remember the precision, so the backward's products run
-- at it too, wherever backward() is called (as PyTorch's autocast, whose
-- backward follows the forward's dtypes). On a CPU without AVX512_BF16, and
-- on OpenCL devices, products stay float32. enabled = false runs fn with
-- float32 products, inside an outer nd.autocast too. fn must not yield
-- (a coroutine suspended inside would leave the setting on, and the scope's
-- bounded weight cache in use). The precision is process-wide (as PyTorch's
-- set_float32_matmul_precision); the scope's weight cache is the calling
-- thread's.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

local OPTS = {dtype = "string", enabled = "boolean", device_type = "string"}

function M.autocast(fn, opts)
  local fail = errors.failer("autocast")
  if type(fn) ~= "function" then fail("expected a function to run, got %s", type(fn)) end
  opts = options.check("autocast", opts, OPTS)
  local dtype = opts.dtype or "bfloat16"
  if dtype == "float16" then
    fail("dtype float16 is not supported: products compute in bfloat16 on the CPU (AVX512_BF16); " ..
         "OpenCL half precision is not implemented")
  elseif dtype ~= "bfloat16" then
    fail("dtype must be \"bfloat16\", got %q", dtype)
  end
  local device = opts.device_type or "cpu"
  if device ~= "cpu" then
    fail("device_type must be \"cpu\", got %q (OpenCL products have no reduced-precision kernels yet)", device)
  end
  -- a replay would not run this scope's Lua: the precision is a guard of
  -- nd.compile instead (call the compiled function inside nd.autocast)
  core._graph_break("nd.autocast inside a compiled function: its precision would not be replayed; " ..
                    "call the compiled function inside nd.autocast instead")
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
