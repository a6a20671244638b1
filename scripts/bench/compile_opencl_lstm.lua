-- scripts/bench/compile_opencl_lstm.lua: the bench's LSTM train step (workloads.lua's
-- lstm_train: vocab 10000, embedding 128, hidden 256, 2 layers, bptt 35, batch 20, SGD,
-- clip 0.25) on OpenCL, eager and through nd.compile: kernel launches (nd.opencl.launches())
-- and milliseconds per step, then cf:explain(). Issue 17's POCL launch figure.
--   build/needle-lua scripts/bench/compile_opencl_lstm.lua [device]   (default: opencl)
local nd = require "needle"
local dev = arg[1] or "opencl"
if not nd.opencl_available() then print("no OpenCL device: " .. select(2, nd.opencl_available())) return end

local V, T, B = 10000, 35, 20
nd.manual_seed(0)
local model = nd.nn.LanguageModel(V, {embedding_size = 128, hidden_size = 256, num_layers = 2}):to(dev)
model:train()
local opt = nd.optim.SGD(model:parameters(), {lr = 1.0})
local ids = nd.randint(1, V, {T, B}):to(dev)
local y = nd.randint(1, V, {T * B}):to(dev)
local function step(ids, y, h, c)
  opt:zero_grad()
  local logits, state = model(ids, h and {h, c} or nil)
  local loss = nd.F.cross_entropy(logits, y)
  loss:backward()
  nd.nn.utils.clip_grad_norm_(model:parameters(), 0.25)
  opt:step()
  return state[1]:detach(), state[2]:detach()
end
local cf = nd.compile(step)
local h, c = step(ids, y)
local t0 = nd.clock()
local l0 = nd.opencl.launches()
h, c = step(ids, y, h, c); nd.synchronize(dev)
print("eager launches per step", nd.opencl.launches() - l0, "ms", (nd.clock() - t0) * 1000)
for i = 1, 6 do
  t0 = nd.clock(); l0 = nd.opencl.launches()
  h, c = cf(ids, y, h, c); nd.synchronize(dev)
  print("compiled call", i, "launches", nd.opencl.launches() - l0, "ms", (nd.clock() - t0) * 1000)
end
print(cf:explain())
