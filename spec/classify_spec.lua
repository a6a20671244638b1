-- classify_spec.lua - scripts/classify.lua as a user runs it: weights saved
-- from a needle ResNet-18 (torchvision's keys) and from a MobileNetV2, images
-- from spec/fixtures/images; its top classes are the model's own on the same
-- preprocessed images; bad arguments are clear errors. (The models against
-- PyTorch: spec/zoo_vision_spec.lua; decoding and preprocessing against PIL and
-- torchvision: spec/image_spec.lua.)
local nd = require "needle"
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"

local run = H.runner("classify")
local IMGS = {"spec/fixtures/images/rgb.png", "spec/fixtures/images/rgb.jpg", "spec/fixtures/images/gray100.pgm"}

local function top1_of(model)
  local xs = {}
  for i, p in ipairs(IMGS) do xs[i] = nd.image.preprocess(nd.image.read(p)) end
  local probs = nd.no_grad(function() return nd.F.softmax(model(nd.stack(xs, 1)), 2) end)
  local v, idx = probs:max(2)
  local out = {}
  for i = 1, #IMGS do out[i] = {idx[i]:item(), v[i]:item()} end
  return out
end

describe("scripts/classify.lua", function()
  for _, arch in ipairs({{"resnet18", "resnet"}, {"mobilenet_v2", "mobilenet_v2"}}) do
    it("prints the model's top classes for each image (" .. arch[1] .. ")", function()
      local dir = H.tmpdir()
      nd.manual_seed(7)
      local model = nd.nn.models[arch[1]]()
      model:eval()
      nd.save(model:state_dict(), dir .. "/w.safetensors")
      local want = top1_of(model)
      local ok, text = run(table.concat(IMGS, " ") .. " --weights " .. S.q(dir .. "/w.safetensors") ..
                           " --model " .. arch[2] .. " --top 2")
      assert(ok, text)
      local blocks = {}
      for path, first in text:gmatch("([%w/_.]+)\n%s+[%d.]+%%%s+class (%d+)") do blocks[#blocks + 1] = {path, tonumber(first)} end
      assert.are.equal(#IMGS, #blocks, text)
      for i = 1, #IMGS do
        assert.are.equal(IMGS[i], blocks[i][1])
        assert.are.equal(want[i][1], blocks[i][2], text)
      end
      H.rmdir(dir)
    end)
  end

  it("labels, and the errors", function()
    local dir = H.tmpdir()
    local f = io.open(dir .. "/labels.txt", "w")
    for i = 1, 1000 do f:write("label", i, "\n") end
    f:close()
    local ok, text = run(IMGS[1] .. " --random resnet18 --top 1 --labels " .. S.q(dir .. "/labels.txt"))
    assert(ok, text)
    assert.truthy(text:match("%%  label%d+\n"), text)
    ok, text = run(IMGS[1])
    assert.is_false(ok)
    assert.truthy(text:find("give either --weights FILE or --random ARCH", 1, true), text)
    ok, text = run("--random resnet18")
    assert.is_false(ok)
    assert.truthy(text:find("no image given", 1, true), text)
    ok, text = run("/nonexistent.png --random resnet18")
    assert.is_false(ok)
    assert.truthy(text:find("classify: needle.image.read: cannot open /nonexistent.png", 1, true), text)
    ok, text = run(IMGS[1] .. " --random vgg16")
    assert.is_false(ok)
    assert.truthy(text:find("--random takes resnet18, resnet34, resnet50 or mobilenet_v2, got 'vgg16'", 1, true), text)
    ok, text = run(IMGS[1] .. " --weights " .. S.q(dir .. "/labels.txt"))
    assert.is_false(ok)
    assert.truthy(text:find("cannot read " .. dir .. "/labels.txt", 1, true), text)
    H.rmdir(dir)
  end)
end)
