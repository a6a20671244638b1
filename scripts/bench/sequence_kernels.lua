-- scripts/bench/sequence_kernels.lua: the fused sequence kernels against what they
-- replaced, a forward and backward each, in one run:
--
--   needle-lua scripts/bench/sequence_kernels.lua [--device DEV] [--threads N] [--quick]
--
-- attention: F.scaled_dot_product_attention (the fused kernel and its backward on the
--   CPU in float32) against the composed ops (functional/attention.lua's attend: q k^T,
--   the mask, softmax, dropout, the product with v), ms (median of 5) and the peak of
--   live tensor bytes above the start (nd.peak_live_bytes), for BERT-base's shape and
--   long sequences with dropout, causal and plain;
--   (on the CPU only: F.scaled_dot_product_attention composes the ops elsewhere);
-- recurrent: nn.LSTM and nn.GRU (2 layers, 35 steps, batch 20, input 128, hidden 256),
--   forward and backward and no_grad inference, ms and, on OpenCL, kernel launches per
--   training step (nd.opencl.launches); nn.LSTM and nn.GRU through core._lstm_layer and
--   core._gru_layer and, as a reference, with their layers run as the per-step cells did
--   before (docs/nn-sequence.md).
-- --quick: tiny sizes (spec/sequence_kernels_bench_spec.lua).
local nd = require "needle"
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local A = require "needle.functional.attention"

local opts = {device = "cpu", threads = 2, quick = false}
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--quick" then opts.quick = true
  elseif a == "--device" or a == "--threads" then
    opts[a:sub(3)] = a == "--threads" and math.tointeger(tonumber(arg[i + 1])) or arg[i + 1]
    i = i + 1
  else
    io.stderr:write(("sequence_kernels.lua: unknown argument '%s' (valid: --device DEV, --threads N, --quick)\n"):format(a))
    os.exit(2)
  end
  i = i + 1
end
if not opts.threads or opts.threads < 1 then
  io.stderr:write("sequence_kernels.lua: --threads takes a positive integer\n")
  os.exit(2)
end
nd.set_num_threads(opts.threads, {adaptive = false})
local dev = opts.device
local reps = opts.quick and 1 or 5
local function sync() if dev ~= "cpu" then nd.synchronize(dev) end end

-- ms of fn (median) and the peak live bytes one call adds, MB
local function measure(fn)
  local ms = C.median_time(function() fn(); sync() end, reps, 1) * 1000
  collectgarbage()
  collectgarbage()
  local base = nd.live_bytes()
  nd.reset_peak_live_bytes()
  fn()
  sync()
  return ms, (nd.peak_live_bytes() - base) / 2 ^ 20
end

print(("needle sequence kernels on %s, %d thread(s)%s"):format(dev, nd.get_num_threads(), opts.quick and ", --quick" or ""))
print(("%-44s %12s %12s %9s %12s %12s"):format("attention, forward and backward", "fused ms", "composed ms", "ratio",
                                               "fused MB", "composed MB"))
local cases = opts.quick and {{"B1 H2 L16 D8, dropout 0.1", 1, 2, 16, 8, 0.1, false}}
  or {{"BERT-base b4 s128 (4 x 12 x 128 x 64), dropout 0.1", 4, 12, 128, 64, 0.1, false},
      {"2 x 8 x 1024 x 64, dropout 0.1", 2, 8, 1024, 64, 0.1, false},
      {"2 x 8 x 1024 x 64, causal", 2, 8, 1024, 64, 0, true},
      {"1 x 12 x 2048 x 64", 1, 12, 2048, 64, 0, false}}
if dev ~= "cpu" then
  -- (F.scaled_dot_product_attention composes the ops off the CPU: both columns would be those)
  print("  (the fused kernel is routed on the CPU only: nothing to compare on " .. dev .. ")")
  cases = {}
end
for _, c in ipairs(cases) do
  local name, B, H, L, D, p, causal = table.unpack(c)
  nd.manual_seed(1)
  local q = nd.randn({B, H, L, D}):to(dev)
  local k, v, w = nd.randn({B, H, L, D}):to(dev), nd.randn({B, H, L, D}):to(dev), nd.randn({B, H, L, D}):to(dev)
  for _, t in ipairs({q, k, v}) do t.requires_grad = true end
  local function run(attend)
    q.grad, k.grad, v.grad = nil, nil, nil
    ;(attend() * w):sum():backward()
  end
  local fused_ms, fused_mb = measure(function()
    run(function() return nd.F.scaled_dot_product_attention(q, k, v, {dropout_p = p, is_causal = causal}) end)
  end)
  local mask = causal and A.causal_mask(L, L, q.dtype, q.device) or nil
  local comp_ms, comp_mb = measure(function()
    run(function() return (A.attend(q, k, v, mask, p, 1 / math.sqrt(D))) end)
  end)
  print(("%-44s %12.2f %12.2f %8.2fx %12.1f %12.1f"):format(name, fused_ms, comp_ms, comp_ms / fused_ms, fused_mb, comp_mb))
end

-- nn.LSTM's layers as the per-step cells ran them before core._lstm_layer: each
-- step's product (F.linear) and core._lstm_cell, the outputs stacked
local core = require "needle.core"
local lstm_layer = core._lstm_layer
local function lstm_steps(xw, w_hh, b_hh, h, c, reverse)
  local T, H = xw:size(1), w_hh:size(2)
  local ys = {}
  for s = 1, T do
    local t = reverse and T + 1 - s or s
    local hc = core._lstm_cell(xw[t], nd.F.linear(h, w_hh, b_hh), c)
    h, c = hc:narrow(2, 1, H), hc:narrow(2, H + 1, H)
    ys[t] = h
  end
  return nd.cat({nd.stack(ys, 1), c:unsqueeze(1)}, 1)
end
local gru_layer = core._gru_layer
local function gru_steps(xw, w_hh, b_hh, h, reverse)
  local T = xw:size(1)
  local ys = {}
  for s = 1, T do
    local t = reverse and T + 1 - s or s
    h = core._gru_cell(xw[t], nd.F.linear(h, w_hh, b_hh), h)
    ys[t] = h
  end
  return nd.stack(ys, 1)
end

print(("%-58s %12s %12s %12s"):format("recurrent module (2 layers)", "train ms", "infer ms",
                                      dev ~= "cpu" and "launches" or ""))
local T, Bt, In, Hd = 35, 20, 128, 256
if opts.quick then T, Bt, In, Hd = 3, 2, 4, 8 end
local rows = {{"LSTM", "nn.LSTM (core._lstm_layer)"}, {"LSTM", "nn.LSTM, per-step cells", lstm_steps},
              {"GRU", "nn.GRU (core._gru_layer)"}, {"GRU", "nn.GRU, per-step cells", nil, gru_steps}}
for _, row in ipairs(rows) do
  local kind, label, layer, glayer = row[1], row[2], row[3], row[4]
  nd.manual_seed(0)
  local m = nd.nn[kind](In, Hd, {num_layers = 2}):to(dev)
  local x = nd.randn({T, Bt, In}):to(dev)
  local function step()
    for _, prm in ipairs(m:parameters()) do prm.grad = nil end
    m(x):sum():backward()
  end
  local function infer() nd.no_grad(function() return m(x) end) end
  core._lstm_layer, core._gru_layer = layer or lstm_layer, glayer or gru_layer
  local ok, err = pcall(function()
    local ms = measure(step)
    local ims = measure(infer)
    local launches = ""
    if dev ~= "cpu" then
      local l0 = nd.opencl.launches()
      step()
      sync()
      launches = tostring(nd.opencl.launches() - l0)
    end
    print(("%-58s %12.2f %12.2f %12s"):format(("%s, %d steps, batch %d, %d -> %d"):format(label, T, Bt, In, Hd), ms,
                                              ims, launches))
  end)
  core._lstm_layer, core._gru_layer = lstm_layer, gru_layer
  if not ok then error(err, 0) end
end
