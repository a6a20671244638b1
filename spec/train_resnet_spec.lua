-- train_resnet_spec.lua - scripts/train_resnet.lua run as a user runs it, on
-- small synthetic CIFAR-format data (--synthetic): it trains (the loss falls),
-- logs, checkpoints and plots; a run stopped after one epoch and resumed
-- matches an uninterrupted one; bad options and missing data give clear errors.
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local D = require "spec.helpers.devices"

-- csv: the data rows of the CSV log, each as a list of fields
local run, csv, tmpdir = H.runner("train_resnet"), H.csv_rows, H.tmpdir

describe("scripts/train_resnet.lua", function()
  it("--help, unknown options and bad values", function()
    local ok, text = run("--help")
    assert(ok, text)
    assert.truthy(text:find("usage: needle-lua scripts/train_resnet.lua", 1, true), text)
    for _, opt in ipairs({"--data DIR", "--synthetic N", "--resume PATH", "--optimizer NAME", "--schedule NAME",
                          "--stop-after N"}) do
      assert.truthy(text:find(opt, 1, true), opt)
    end
    ok, text = run("--epoch 3")
    assert.is_false(ok)
    assert.truthy(text:find("unknown option '--epoch'", 1, true), text)
    ok, text = run("--lr fast")
    assert.is_false(ok)
    assert.truthy(text:find("option --lr expects a number, got 'fast'", 1, true), text)
    ok, text = run("--optimizer lbfgs")
    assert.is_false(ok)
    assert.truthy(text:find("--optimizer expects 'sgd' or 'adam'", 1, true), text)
    ok, text = run("--batch-size 0")
    assert.is_false(ok)
    assert.truthy(text:find("--batch-size expects a positive integer", 1, true), text)
  end)

  it("--device: unknown names and missing devices are refused with exit code 2", function()
    local ok, text, code = run("--device tpu")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("unknown device 'tpu'", 1, true), text)
    ok, text, code = run("--device opencl:99")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("device 'opencl:99' is not available", 1, true), text)
  end)

  -- the same short run on the cpu and on each OpenCL device: the losses agree
  local devices = D.opencl()
  if #devices == 0 then
    D.pending_without_opencl(pending, "train_resnet --device opencl matches the cpu run")
  end
  for _, dev in ipairs(devices) do
    it("--device " .. dev .. " trains to the cpu's losses", function()
      local a, b = tmpdir(), tmpdir()
      local short = "--synthetic 32 --batch-size 16 --epochs 1"
      local ok, text = run(short .. " --out " .. S.q(a))
      assert(ok, text)
      ok, text = run(short .. " --device " .. dev .. " --out " .. S.q(b))
      assert(ok, text)
      assert.truthy(text:find("device " .. dev, 1, true), text)
      local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
      assert.are.equal(1, #rb)
      for _, c in ipairs({4, 6}) do -- train loss, test loss
        local x, y = tonumber(ra[1][c]), tonumber(rb[1][c])
        assert(math.abs(x - y) <= 2e-3 * math.max(1, math.abs(x)),
          ("column %d: cpu %s, %s %s"):format(c, ra[1][c], dev, rb[1][c]))
      end
      os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
    end)
  end

  it("--compile trains exactly as the eager run (one-cycle lr and momentum, no retrace)", function()
    local a, b = tmpdir(), tmpdir()
    local short = "--synthetic 64 --batch-size 16 --epochs 2 --threads 2"
    local ok, text = run(short .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(short .. " --compile --out " .. S.q(b))
    assert(ok, text)
    assert.truthy(text:find(", 0 retraced", 1, true), text)
    local replays = tonumber(text:match("calls %d+: (%d+) replayed"))
    assert(replays and replays > 0, text)
    local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
    assert.are.equal(2, #rb)
    for i = 1, 2 do
      for _, c in ipairs({4, 5, 6, 7}) do
        assert.are.equal(ra[i][c], rb[i][c], ("epoch %d column %d"):format(i, c))
      end
    end
    H.same_model(a .. "/checkpoint.safetensors", b .. "/checkpoint.safetensors")
    os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
  end)

  it("a missing data directory says where it looked and how to get CIFAR-10", function()
    local ok, text = run("--data /nonexistent/cifar --out /nonexistent/out")
    assert.is_false(ok)
    for _, s in ipairs({"no CIFAR-10 data in '/nonexistent/cifar'", "data_batch_1.bin", "test_batch.bin",
                        "/nonexistent/cifar/cifar-10-batches-bin", "cifar-10-binary.tar.gz",
                        "https://www.cs.toronto.edu/~kriz/cifar.html", "--synthetic"}) do
      assert.truthy(text:find(s, 1, true), s .. " not in:\n" .. text)
    end
    -- a directory that exists but lacks the files
    local empty = tmpdir()
    ok, text = run("--data " .. S.q(empty))
    assert.is_false(ok)
    assert.truthy(text:find("no CIFAR-10 data in '" .. empty .. "'", 1, true), text)
    assert.truthy(text:find("data_batch_1.bin", 1, true), text)
    os.execute("rm -rf " .. S.q(empty))
  end)

  it("trains on synthetic data: the loss falls; CSV, checkpoint and plots are written", function()
    local out = tmpdir()
    local ok, text = run("--synthetic 256 --epochs 2 --batch-size 32 --out " .. S.q(out))
    assert(ok, text)
    assert.truthy(text:find("256 training images", 1, true), text)
    assert.truthy(text:find("431946 parameters", 1, true), text)
    assert.truthy(text:find("s per epoch", 1, true), text)
    local header = io.lines(out .. "/log.csv")()
    assert.are.equal("epoch,step,lr,train_loss,train_acc,test_loss,test_acc,images_per_s,epoch_seconds,seconds",
      header)
    local rows = csv(out .. "/log.csv")
    assert.are.equal(2, #rows)
    assert.are.equal("8", rows[1][2])
    assert.are.equal("16", rows[2][2])
    local l1, l2 = tonumber(rows[1][4]), tonumber(rows[2][4])
    assert(l2 < l1, ("training loss did not fall: %g then %g"):format(l1, l2))
    -- the synthetic classes are learnable: above chance (0.1) by epoch 2
    assert(tonumber(rows[2][5]) > 0.2, "train accuracy " .. rows[2][5])
    assert(tonumber(rows[2][7]) > 0.2, "test accuracy " .. rows[2][7])
    assert.is_true(S.exists(out .. "/checkpoint.safetensors"))
    local state = require("needle.checkpoint").read(out .. "/checkpoint.safetensors")
    assert.are.equal(2, state.extra.epoch)
    assert.are.equal(16, state.step)
    assert.truthy(state.model["model.0.conv.weight"])
    assert.truthy(state.scheduler)
    for _, name in ipairs({"loss", "accuracy"}) do
      assert.is_true(S.exists(out .. "/" .. name .. ".svg") or S.exists(out .. "/" .. name .. ".png"), name)
    end
    os.execute("rm -rf " .. S.q(out))
  end)

  it("a run stopped after epoch 1 and resumed matches an uninterrupted one", function()
    local tiny = "--synthetic 64 --batch-size 16 --epochs 2 --threads 2"
    local a, b = tmpdir(), tmpdir()
    local ok, text = run(tiny .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(tiny .. " --stop-after 1 --out " .. S.q(b))
    assert(ok, text)
    assert.truthy(text:find("stopped after epoch 1 of 2", 1, true), text)
    assert.are.equal(1, #csv(b .. "/log.csv"))
    ok, text = run(tiny .. " --out " .. S.q(b) .. " --resume " .. S.q(b .. "/checkpoint.safetensors"))
    assert(ok, text)
    assert.truthy(text:find("resumed from", 1, true), text)
    local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
    assert.are.equal(2, #ra)
    assert.are.equal(2, #rb)
    -- epoch, step, lr, losses and accuracies identical (the timing columns differ)
    for i = 1, 2 do
      for c = 1, 7 do assert.are.equal(ra[i][c], rb[i][c], ("row %d column %d"):format(i, c)) end
    end
    os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
  end)
end)
