-- scripts/bench/conv_paths.lua - every convolution of a model, each of its
-- three products (forward, grad x, grad w) timed alone on needle's two CPU
-- paths and as needle chooses (docs/cpu-gemm.md, "Which path runs a
-- convolution"), beside PyTorch's time for the same product:
--
--   build/needle-lua scripts/bench/conv_paths.lua [--model resnet50|mobilenet_v2|resnet9]
--        [--batch N] [--size S] [--reps N] [--no-torch] [--python PATH]
--
-- The shapes come from one forward of the model with forward hooks on its
-- Conv2d layers (depthwise ones left out: they have their own kernel), each
-- distinct shape once with its count. Each column runs in a process of its
-- own (NEEDLE_CONV_PACKED=1, NEEDLE_CONV_BLAS=1, the default; PyTorch:
-- scripts/bench/conv_paths_torch.py), one after another, at the same thread
-- count. A product's time is the median of --reps runs after one warm-up;
-- grad x and grad w are a forward + backward with only that input requiring
-- grad, less the forward alone. The totals weight each shape by its count.
-- Float32; prints the table and the totals, `needle / PyTorch` last.
local nd = require "needle"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")

local function die(msg)
  io.stderr:write("conv_paths.lua: ", msg, "\n")
  os.exit(2)
end

local opts = {model = "resnet50", batch = 4, reps = 5}
do
  local i = 1
  while i <= #arg do
    local a, v = arg[i], arg[i + 1]
    if a == "--model" then opts.model, i = v, i + 1
    elseif a == "--batch" then opts.batch, i = math.tointeger(tonumber(v)), i + 1
    elseif a == "--size" then opts.size, i = math.tointeger(tonumber(v)), i + 1
    elseif a == "--reps" then opts.reps, i = math.tointeger(tonumber(v)), i + 1
    elseif a == "--python" then C.python, i = v, i + 1
    elseif a == "--no-torch" then opts.no_torch = true
    elseif a == "--worker" then opts.worker, i = v, i + 1 -- (internal: a shapes file to time)
    elseif a == "-h" or a == "--help" then
      io.write("usage: needle-lua scripts/bench/conv_paths.lua [--model resnet50|mobilenet_v2|resnet9] " ..
               "[--batch N] [--size S] [--reps N] [--no-torch] [--python PATH]\n")
      os.exit(0)
    else die(("unknown option '%s' (see --help)"):format(a)) end
    i = i + 1
  end
  if not (opts.batch and opts.batch >= 1) then die("--batch takes a positive integer") end
  if not (opts.reps and opts.reps >= 1) then die("--reps takes a positive integer") end
end

-- worker: time the products of each "C,H,O,k,stride,pad" line, print
-- "fwd gx gw" ms per line (common.lua's timing: one warm-up, the median)
local function median_ms(fn, reps) return C.median_time(fn, reps, 1) * 1e3 end

if opts.worker then
  nd.manual_seed(0)
  for line in io.lines(opts.worker) do
    local c = {}
    for n in line:gmatch("[^,]+") do c[#c + 1] = math.tointeger(tonumber(n)) end
    local Cin, H, O, k, s, p = table.unpack(c)
    local x, w = nd.randn({opts.batch, Cin, H, H}), nd.randn({O, Cin, k, k}) * 0.05
    local o = {stride = s, padding = p}
    local dy = nd.randn(nd.conv2d(x, w, nil, o).shape)
    local fwd = median_ms(function() nd.no_grad(function() return nd.conv2d(x, w, nil, o) end) end, opts.reps)
    local xg, wg = x:clone():requires_grad_(), w:clone():requires_grad_()
    local gx = median_ms(function() nd.conv2d(xg, w, nil, o):backward(dy); xg.grad = nil end, opts.reps) - fwd
    local gw = median_ms(function() nd.conv2d(x, wg, nil, o):backward(dy); wg.grad = nil end, opts.reps) - fwd
    print(("%.4f %.4f %.4f"):format(fwd, gx, gw))
  end
  os.exit(0)
end

-- the model's distinct (non-depthwise) convolution shapes, in order of first use
local makers = {resnet50 = function() return nd.nn.models.resnet50() end,
                mobilenet_v2 = function() return nd.nn.models.mobilenet_v2() end,
                resnet9 = function() return nd.nn.ResNet9() end}
if not makers[opts.model] then die("--model takes resnet50, mobilenet_v2 or resnet9") end
local size = opts.size or (opts.model == "resnet9" and 32 or 224)
local model = makers[opts.model]()
local seen, shapes = {}, {}
for _, m in ipairs(model:modules()) do
  if m.__name == "Conv2d" and (m.groups or 1) == 1 then
    m:register_forward_hook(function(self, inp)
      local x, w = inp[1], self.weight
      local st = type(self.stride) == "table" and self.stride[1] or self.stride
      local pd = type(self.padding) == "table" and self.padding[1] or self.padding
      local key = table.concat({x:size(2), x:size(3), w:size(1), w:size(3), st, pd}, ",")
      if not seen[key] then
        seen[key] = {key = key, count = 0}
        shapes[#shapes + 1] = seen[key]
      end
      seen[key].count = seen[key].count + 1
    end)
  end
end
model:eval()
nd.no_grad(function() model(nd.randn({1, 3, size, size})) end)
if #shapes == 0 then die("no convolutions found") end
local list = os.tmpname()
do
  local f = assert(io.open(list, "w"))
  for _, s in ipairs(shapes) do f:write(s.key, "\n") end
  f:close()
end

local exe, me = arg[-1] or "needle-lua", debug.getinfo(1, "S").source:sub(2)
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function column(cmd)
  local out = C.shell_out(cmd .. " 2>/dev/null")
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local a, b, c = line:match("^(%S+) (%S+) (%S+)$")
    if a then rows[#rows + 1] = {tonumber(a), tonumber(b), tonumber(c)} end
  end
  return #rows == #shapes and rows or nil
end
local common = ("--worker %s --batch %d --reps %d"):format(q(list), opts.batch, opts.reps)
local cols = {
  {"packed", column(("NEEDLE_CONV_PACKED=1 %s %s %s"):format(q(exe), q(me), common))},
  {"GEMM", column(("NEEDLE_CONV_BLAS=1 %s %s %s"):format(q(exe), q(me), common))},
  {"chosen", column(("%s %s %s"):format(q(exe), q(me), common))},
}
if not opts.no_torch then
  cols[#cols + 1] = {"PyTorch", column(("%s %s %s %d %d %d"):format(C.python, q(here .. "/conv_paths_torch.py"), q(list),
                                                                   opts.batch, opts.reps, nd.get_num_threads()))}
end
os.remove(list)

print(("conv_paths: %s at %dx%d, batch %d, %d threads, median of %d; ms per product (fwd / grad x / grad w)")
  :format(opts.model, size, size, opts.batch, nd.get_num_threads(), opts.reps))
local head = ("%-24s %5s"):format("C,H,O,k,stride,pad", "count")
for _, c in ipairs(cols) do head = head .. ("  %-22s"):format(c[1]) end
print(head)
local totals = {}
for i, s in ipairs(shapes) do
  local line = ("%-24s %5d"):format(s.key, s.count)
  for j, c in ipairs(cols) do
    local r = c[2] and c[2][i]
    line = line .. ("  %-22s"):format(r and ("%6.2f %6.2f %6.2f"):format(r[1], r[2], r[3]) or "missing")
    if r then
      totals[j] = totals[j] or {0, 0, 0}
      for k = 1, 3 do totals[j][k] = totals[j][k] + s.count * r[k] end
    end
  end
  print(line)
end
for j, c in ipairs(cols) do
  local t = totals[j]
  if t then
    print(("total %-8s fwd %8.1f  grad x %8.1f  grad w %8.1f  all %8.1f ms"):format(c[1], t[1], t[2], t[3],
                                                                                  t[1] + t[2] + t[3]))
  else
    print(("total %-8s missing (its process failed)"):format(c[1]))
  end
end
if totals[3] and totals[4] then
  local a, b = totals[3][1] + totals[3][2] + totals[3][3], totals[4][1] + totals[4][2] + totals[4][3]
  print(("needle / PyTorch (all products, chosen paths): %.3f (> 1: needle slower)"):format(a / b))
end
