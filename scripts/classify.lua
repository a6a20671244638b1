-- scripts/classify.lua - image files through a torchvision ResNet or
-- MobileNetV2: the top-k classes with their probabilities.
--
--   build/needle-lua scripts/classify.lua cat.jpg dog.png --weights resnet50.pth
--   build/needle-lua scripts/classify.lua cat.jpg --weights mobilenet_v2.pth --model mobilenet_v2 --labels imagenet.txt
--   build/needle-lua scripts/classify.lua cat.jpg --random resnet18    # untrained weights (a smoke test)
--
-- The weights are torchvision's state dict, as torch.save wrote it (.pt/.pth,
-- read without Python) or converted by scripts/convert_torch.lua
-- (.safetensors). Images (PNG, JPEG, PPM) go through nd.image: resize the
-- shorter side to 256, centre-crop 224, normalise (docs/image.md).
local nd = require "needle"
local cli = require "needle.cli"

local PROG = "classify"

local usage = [[
usage: needle-lua scripts/classify.lua IMAGE... (--weights FILE | --random ARCH) [options]

Classifies each image with a torchvision ResNet-18/34/50 or MobileNetV2 and
prints its top classes.

options:
  --weights FILE   torchvision weights: a .pt/.pth file or a .safetensors file from
                   scripts/convert_torch.lua
  --model NAME     the converter entry the weights are for: resnet (default; 18, 34
                   or 50 from the weights) or mobilenet_v2
  --random ARCH    no weights: a randomly initialised resnet18, resnet34, resnet50 or
                   mobilenet_v2 (the classes mean nothing; for trying the pipeline)
  --labels FILE    class names, one per line (line n names class n); else numbers
  --top K          how many classes to print (default 5)
  --device DEV     cpu (default), opencl or opencl:N
  -h, --help       this text
]]

local argv, images = cli.split_args(arg, {weights = true, model = true, random = true, labels = true, top = true,
                                           device = true})
local opts = cli.parse(argv, {model = "resnet", top = 5, device = "cpu"}, usage,
                       {prog = PROG, numbers = {top = true}, optional = {"weights", "random", "labels"}})
if #images == 0 then cli.die(PROG, 2, "no image given (see --help)") end
if (opts.weights == nil) == (opts.random == nil) then cli.die(PROG, 2, "give either --weights FILE or --random ARCH") end
cli.positive_integers(PROG, opts, {"top"})
local device = cli.check_device(PROG, opts)

-- the model
local model
if opts.random then
  local ctor = nd.nn.models[opts.random]
  if not ({resnet18 = 1, resnet34 = 1, resnet50 = 1, mobilenet_v2 = 1})[opts.random] or not ctor then
    cli.die(PROG, 2, "--random takes resnet18, resnet34, resnet50 or mobilenet_v2, got '%s'", opts.random)
  end
  nd.manual_seed(1)
  model = ctor()
  model:eval()
else
  model = cli.convert_model(PROG, opts.model, cli.read_state_dict(PROG, opts.weights))
end
model = model:to(device)

local labels
if opts.labels then
  labels = {}
  local f, err = io.open(opts.labels, "r")
  if not f then cli.die(PROG, 1, "cannot read the labels: %s", err) end
  for line in f:lines() do labels[#labels + 1] = line end
  f:close()
end

local t0 = nd.clock()
local batch = {}
for i, path in ipairs(images) do
  local ok, img = pcall(nd.image.read, path)
  if not ok then cli.die(PROG, 1, "%s", cli.message(img)) end
  batch[i] = nd.image.preprocess(img)
end
local x = nd.stack(batch, 1):to(device)
local t1 = nd.clock()
local probs = nd.no_grad(function() return nd.F.softmax(model(x), 2) end):to("cpu")
local t2 = nd.clock()

local k = math.min(opts.top, probs:size(2))
local values, indices = probs:topk(k, 2)
for i, path in ipairs(images) do
  print(path)
  for j = 1, k do
    local c = indices[{i, j}]:item()
    print(("  %6.2f%%  %s"):format(100 * values[{i, j}]:item(), labels and labels[c] or ("class " .. c)))
  end
end
print(("%d image%s: decoding and preprocessing %.3f s, the model %.3f s on %s"):format(#images,
  #images == 1 and "" or "s", t1 - t0, t2 - t1, device))
