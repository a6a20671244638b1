-- spec/dist/equivalence.lua MODEL DTYPE OUT [no_sync]: 20 training steps
-- of MODEL (mlp, resnet9, lstm) in DTYPE with a global batch split over the
-- ranks of the job (all of it in a world of one), through
-- DistributedDataParallel (ResNet9's BatchNorms become SyncBatchNorm when
-- there are several ranks); rank 0 saves the parameters, buffers and the
-- per-step global loss to OUT (safetensors). spec/distributed_spec.lua runs it
-- alone and under mpirun and compares the files. With no_sync, each step
-- accumulates two half-batches, the first inside ddp:no_sync().
local nd = require "needle"
local model_name, dtype, out, mode = arg[1], arg[2], arg[3], arg[4]
local dist = nd.distributed.init{timeout = 120}
local R, W = dist.rank(), dist.world_size()
local nn = nd.nn
local STEPS = 20

nd.manual_seed(42)
local model, batch, data
if model_name == "mlp" then
  model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))
  batch = 16
  data = {x = nd.randn({STEPS * batch, 20}), y = nd.randint(1, 5, {STEPS * batch})}
elseif model_name == "resnet9" then
  model = nn.ResNet9({num_classes = 4})
  batch = 8
  data = {x = nd.randn({STEPS * batch, 3, 16, 16}), y = nd.randint(1, 4, {STEPS * batch})}
elseif model_name == "lstm" then
  model = nn.LanguageModel(50, {embedding_size = 16, hidden_size = 24, num_layers = 2})
  batch = 8 -- columns of the token stream
  data = {ids = nd.randint(1, 50, {STEPS * 6 + 1, batch})}
else
  error("unknown model " .. tostring(model_name))
end
model:to({dtype = dtype})
if W > 1 and model_name == "resnet9" then nn.SyncBatchNorm.convert_sync_batchnorm(model) end
if W > 1 and R == 1 then
  -- rank 1 starts from other values: DistributedDataParallel must send rank 0's
  nd.no_grad(function() for _, p in ipairs(model:parameters()) do p:mul_(-2) end end)
end
local ddp = nn.parallel.DistributedDataParallel(model, {bucket_mb = 0.01})
-- ResNet9 at 0.05 is chaotic over 20 steps in float32 (a rounding difference
-- grows tenfold per step): see spec/distributed_spec.lua
local lr = model_name == "resnet9" and 0.005 or 0.05
local opt = nd.optim.SGD(model:parameters(), {lr = lr, momentum = 0.9})
local per = batch // W
local losses = {}

local function loss_of(lo, n, state)
  if model_name == "lstm" then
    local T = 6
    local cols = data.ids:narrow(2, lo, n)
    local step_rows = (#losses) * T + 1
    local x = cols:narrow(1, step_rows, T)
    local y = cols:narrow(1, step_rows + 1, T):reshape({-1})
    local logits, new_state = ddp(x, state)
    return nd.F.cross_entropy(logits, y), new_state
  end
  local first = #losses * batch + lo
  local x = data.x:narrow(1, first, n):to(dtype)
  local y = data.y:narrow(1, first, n)
  return nd.F.cross_entropy(ddp(x), y)
end

local state
for _ = 1, STEPS do
  opt:zero_grad()
  local lo = R * per + 1
  local loss
  if mode == "no_sync" then
    local half, first = per // 2, nil
    ddp:no_sync(function()
      first = loss_of(lo, half) * 0.5
      first:backward()
    end)
    local second = loss_of(lo + half, per - half) * 0.5
    second:backward()
    loss = first:detach() + second:detach()
  else
    local new_state
    loss, new_state = loss_of(lo, per, state)
    loss:backward()
    if new_state then
      state = {}
      for k, v in ipairs(new_state) do state[k] = v:detach() end
    end
  end
  if model_name == "lstm" then nn.utils.clip_grad_norm_(model:parameters(), 0.5) end
  opt:step()
  local l = loss:detach():double():reshape({1})
  dist.all_reduce(l, "mean")
  losses[#losses + 1] = l:item()
end

if R == 0 then
  local tensors = {losses = nd.tensor(losses, {dtype = "float64"})}
  for k, v in pairs(model:state_dict()) do tensors[k] = v end
  nd.save(tensors, out)
end
dist.finalize()
