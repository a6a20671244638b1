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

-- Submodules load on first use (nd.nn, nd.optim, nd.data), so `require
-- "needle"` stays fast and a script pays only for what it touches.
require("needle.lazy")(nd, {nn = "needle.nn", optim = "needle.optim", data = "needle.data",
                            checkpoint = "needle.checkpoint", amp = "needle.amp", plot = "needle.plot", convert = "needle.convert",
                            distributed = "needle.distributed", autograd = "needle.autograd",
                            linalg = "needle.linalg", image = "needle.image", text = "needle.text"})

-- nd.log is two things: called, the natural logarithm (torch.log); indexed,
-- the training logger (nd.log.open(dir), docs/logging.md), loaded on first use.
-- The call is a tail call, so an error still points at the caller's line.
nd.log = setmetatable({}, {
  __call = function(_, ...) return core.log(...) end,
  __index = function(_, k) return require("needle.log")[k] end,
  __name = "needle.log",
})

-- the tensor ops written in Lua over the C ops (einsum, norm, tril, unique, ...):
-- installed as nd.<name> and as tensor methods (docs/tensor.md)
require("needle.tensor_ops").install(nd, core)

-- checkpoints (safetensors): nd.save(tensors, path[, metadata]) / nd.load(path);
-- nd.load also reads a PyTorch checkpoint (zip), as nd.load_torch does.
function nd.save(...) return require("needle.serialize").save(...) end
function nd.load(...) return require("needle.serialize").load(...) end
-- PyTorch checkpoints (torch.save, PyTorch >= 1.6), read without Python and
-- without running any of the file's code (docs/torch-checkpoints.md):
-- nd.load_torch(path[, {half_to_float = false}]) -> the unpickled object, with
-- None as nd.null (a unique light userdata) and tensors as needle tensors.
function nd.load_torch(...) return require("needle.serialize").load_torch(...) end
nd.null = core.null
-- nd.profile(fn[, {trace=, print=, sort=}]) -> report (docs/profiler.md)
function nd.profile(...) return require("needle.profile").profile(...) end
-- nd.help(obj_or_name): its documented signature and summary (docs/needle-lua.md)
function nd.help(...) return require("needle.help").help(...) end

-- nd.autocast(fn[, {dtype = "bfloat16", enabled = true, device_type = "cpu"}]) -> fn's
-- results, its float32 products on bfloat16 inputs where the CPU has AVX512_BF16
-- (needle.autocast; nd.set_float32_matmul_precision sets it for the process)
function nd.autocast(...) return require("needle.autocast").autocast(...) end

-- nd.compile(fn_or_module[, {warmup=, cache_size=, fallback=, verify=}]) -> a
-- callable that replays the captured kernels (docs/compile.md)
function nd.compile(...) return require("needle.compile").compile(...) end

-- OpenCL: nd.opencl.available() -> true | false, why; nd.opencl.tune{...}
-- autotunes the GEMM for a device (docs/opencl-gemm.md); nd.devices() lists
-- every device.
nd.opencl = {
  available = core.opencl_available,
  tune = function(...) return core.opencl_tune(...) end,
  launches = core.opencl_launches, -- kernels launched so far (docs/devices.md)
  -- device time per kernel: timing(true), run, kernel_times() (docs/profiler.md)
  timing = core.opencl_timing,
  kernel_times = core.opencl_kernel_times,
}

nd.dtypes = { "float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16" }
nd.version = core._VERSION

return nd
