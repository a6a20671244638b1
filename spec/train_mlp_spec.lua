-- train_mlp_spec.lua - scripts/train_mlp.lua run as a user runs it, and the
-- MLP it trains checked against PyTorch: a 784-32-10 model trained by PyTorch
-- (spec/fixtures/gen/gen_torch_mlp.py) loaded into needle's
-- Sequential(Linear, ReLU, Linear) gets exactly as many Fashion-MNIST test
-- images right as it did in PyTorch, with the same prediction for every image.
--
-- The cases that read the real data need Debian's dataset-fashion-mnist
-- (scripts/setup.sh installs it) and are pending without it; the others use a
-- small synthetic IDX directory passed with --data.
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local D = require "spec.helpers.devices"
local nd = require "needle"

local _, root = S.needle_lua()
local mnist = nd.data.mnist
local have_fashion = S.exists(mnist.FASHION_DIR .. "/t10k-images-idx3-ubyte.gz")
  and S.exists(mnist.FASHION_DIR .. "/train-images-idx3-ubyte.gz")
local NO_DATA = "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist, or scripts/setup.sh)"

-- runs the script; returns ok, the output (stdout and stderr) and the exit code
local run, csv, tmpdir, rmdir = H.runner("train_mlp"), H.csv_rows, H.tmpdir, H.rmdir

-- A small IDX data set: n images of class-dependent stripes plus noise, from
-- a generator of its own (the global random stream is left alone).
local function write_idx_set(dir, split, n, seed)
  local state = seed
  local function rnd()
    state = (state * 1103515245 + 12345) % 2147483648
    return state // 65536 % 256
  end
  local img, lab = {string.pack(">I4I4I4I4", 2051, n, 28, 28)}, {string.pack(">I4I4", 2049, n)}
  for i = 1, n do
    local label = (i * 7) % 10
    local px = {}
    for r = 0, 27 do
      local stripe = (r // 3) % 10 == label
      for _ = 0, 27 do
        px[#px + 1] = string.char(stripe and 200 + rnd() % 56 or rnd() % 100)
      end
    end
    img[#img + 1] = table.concat(px)
    lab[#lab + 1] = string.char(label)
  end
  S.write_file(dir .. "/" .. split .. "-images-idx3-ubyte", table.concat(img))
  S.write_file(dir .. "/" .. split .. "-labels-idx1-ubyte", table.concat(lab))
end

local function synthetic_data()
  local d = tmpdir()
  write_idx_set(d, "train", 300, 7)
  write_idx_set(d, "t10k", 100, 11)
  return d
end

describe("scripts/train_mlp.lua", function()
  it("--help, unknown options and bad values", function()
    local ok, text = run("--help")
    assert(ok, text)
    assert.truthy(text:find("usage: needle-lua scripts/train_mlp.lua", 1, true), text)
    assert.truthy(text:find("--limit N", 1, true), text)
    local code
    ok, text, code = run("--epoch 3")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("unknown option '--epoch'", 1, true), text)
    ok, text = run("--lr fast")
    assert.is_false(ok)
    assert.truthy(text:find("option --lr expects a number, got 'fast'", 1, true), text)
    ok, text = run("--epochs 1.5")
    assert.is_false(ok)
    assert.truthy(text:find("option --epochs expects a positive integer, got '1.5'", 1, true), text)
    ok, text = run("--limit")
    assert.is_false(ok)
    assert.truthy(text:find("option --limit needs a value", 1, true), text)
    ok, text = run("--hidden 64,x")
    assert.is_false(ok)
    assert.truthy(text:find("option --hidden expects positive integers", 1, true), text)
  end)

  it("--device: unknown names and missing devices are refused with exit code 2", function()
    local ok, text, code = run("--device tpu")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("unknown device 'tpu' (expected cpu, opencl or opencl:N)", 1, true), text)
    ok, text, code = run("--device opencl:99")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("device 'opencl:99' is not available", 1, true), text)
  end)

  local hide, hide_why = D.hide_opencl_env()
  if not hide then
    pending("--device opencl without an OpenCL driver: " .. hide_why)
  else
    it("--device opencl without an OpenCL driver says why and how to get one (exit code 2)", function()
      -- --data that does not exist: were a device found, the run would stop at once (exit 1)
      local d = tmpdir()
      local out = d .. "/out.txt"
      local rc = {os.execute(("env %s %s %s --device opencl --data /nonexistent --out %s > %s 2>&1"):format(hide,
        S.q((S.needle_lua())), S.q(root .. "/scripts/train_mlp.lua"), S.q(d .. "/o"), S.q(out)))}
      local text = S.read_file(out)
      rmdir(d)
      assert.are.equal(2, rc[3], text)
      assert.truthy(text:find("train_mlp: device 'opencl' is not available", 1, true), text)
      assert.truthy(text:find("install", 1, true) or text:find("NEEDLE_OPENCL", 1, true), text)
      assert.truthy(text:find("--device cpu", 1, true), text)
    end)
  end

  -- the same short run on the cpu and on each OpenCL device: the loss curves
  -- agree (dropout masks are the same draws on every device)
  local devices = D.opencl()
  if #devices == 0 then
    D.pending_without_opencl(pending, "train_mlp --device opencl matches the cpu run")
  end
  for _, dev in ipairs(devices) do
    it("--device " .. dev .. " trains to the cpu's loss curve", function()
      local d = synthetic_data()
      local common = "--data " .. S.q(d) .. " --epochs 2 --limit 96 --batch-size 32 --hidden 24 --seed 4 --threads 2"
      local ok, text = run(common .. " --out " .. S.q(d .. "/cpu"))
      assert(ok, text)
      ok, text = run(common .. " --device " .. dev .. " --out " .. S.q(d .. "/dev"))
      assert(ok, text)
      assert.truthy(text:find("device " .. dev, 1, true), text)
      local rc, rd = csv(d .. "/cpu/log.csv"), csv(d .. "/dev/log.csv")
      assert.are.equal(2, #rd)
      for i = 1, 2 do
        for _, c in ipairs({4, 6}) do -- train loss, test loss
          local a, b = tonumber(rc[i][c]), tonumber(rd[i][c])
          assert(math.abs(a - b) <= 1e-3 * math.max(1, math.abs(a)),
            ("epoch %d column %d: cpu %s, %s %s"):format(i, c, rc[i][c], dev, rd[i][c]))
        end
      end
      -- the checkpoint was written from the device and loads on the cpu
      local state = nd.checkpoint.read(d .. "/dev/checkpoint.safetensors")
      assert.are.equal("cpu", state.model["0.weight"].device)
      rmdir(d)
    end)
  end

  it("--compile trains exactly as the eager run", function()
    local d = synthetic_data()
    local common = "--data " .. S.q(d) .. " --epochs 2 --limit 96 --batch-size 32 --hidden 24 --seed 4 --threads 2"
    local ok, text = run(common .. " --out " .. S.q(d .. "/eager"))
    assert(ok, text)
    ok, text = run(common .. " --compile --out " .. S.q(d .. "/compiled"))
    assert(ok, text)
    local replays = tonumber(text:match("calls %d+: (%d+) replayed"))
    assert(replays and replays > 0, text)
    local re, rc = csv(d .. "/eager/log.csv"), csv(d .. "/compiled/log.csv")
    assert.are.equal(2, #rc)
    for i = 1, 2 do
      for _, c in ipairs({4, 5, 6, 7}) do -- train loss and accuracy, test loss and accuracy
        assert.are.equal(re[i][c], rc[i][c], ("epoch %d column %d"):format(i, c))
      end
    end
    H.same_model(d .. "/eager/checkpoint.safetensors", d .. "/compiled/checkpoint.safetensors")
    rmdir(d)
  end)

  it("--tune trains exactly as the eager run, and a second run takes its choices from disk", function()
    local d = synthetic_data()
    local common = "--data " .. S.q(d) .. " --epochs 1 --limit 64 --batch-size 32 --hidden 24 --seed 4 --threads 2"
    local env = "NEEDLE_CACHE_DIR=" .. S.q(d .. "/cache")
    local ok, text = run(common .. " --out " .. S.q(d .. "/eager"))
    assert(ok, text)
    ok, text = run(common .. " --tune 1 --out " .. S.q(d .. "/tuned"), env)
    assert(ok, text)
    local n, p, cached, timed =
      text:match("tuning: (%d+) fused kernel%(s%) and (%d+) product%(s%): (%d+) from the cache, (%d+) timed now")
    n, p, cached, timed = tonumber(n), tonumber(p), tonumber(cached), tonumber(timed)
    assert(n and n > 0 and p > 0 and timed > 0 and cached + timed == n + p, text)
    H.same_model(d .. "/eager/checkpoint.safetensors", d .. "/tuned/checkpoint.safetensors")
    ok, text = run(common .. " --tune 1 --out " .. S.q(d .. "/again"), env)
    assert(ok, text)
    assert.truthy(text:find(("tuning: %d fused kernel(s) and %d product(s): %d from the cache, 0 timed now")
                            :format(n, p, n + p), 1, true), text)
    H.same_model(d .. "/eager/checkpoint.safetensors", d .. "/again/checkpoint.safetensors")
    rmdir(d)
  end)

  it("a missing dataset is the loader's error (where it looked, what to install) and exit code 1", function()
    local ok, text, code = run("--data /nonexistent/fashion-mnist --out " .. S.q(os.tmpname() .. ".d"))
    assert.is_false(ok)
    assert.are.equal(1, code)
    assert.truthy(text:find("directory '/nonexistent/fashion-mnist' does not exist", 1, true), text)
    assert.truthy(text:find("dataset-fashion-mnist", 1, true), text)
    assert.truthy(text:find("/usr/share/datasets/fashion-mnist", 1, true), text)
    -- a directory without the files names the file it looked for
    local d = tmpdir()
    ok, text, code = run("--data " .. S.q(d) .. " --out " .. S.q(d .. "/out"))
    assert.is_false(ok)
    assert.are.equal(1, code)
    assert.truthy(text:find("train-images-idx3-ubyte", 1, true), text)
    rmdir(d)
  end)

  it("--data DIR trains on IDX files from another directory", function()
    local d = synthetic_data()
    local ok, text = run("--data " .. S.q(d) .. " --epochs 3 --batch-size 32 --hidden 64 --lr 0.003 --out "
                         .. S.q(d .. "/out"))
    assert(ok, text)
    assert.truthy(text:find("300 training images, 100 test images", 1, true), text)
    local rows = csv(d .. "/out/log.csv")
    assert.are.equal(3, #rows)
    -- stripes are easy: the loss falls and the test set is learnt
    assert(tonumber(rows[3][4]) < tonumber(rows[1][4]), text)
    assert(tonumber(rows[3][7]) >= 0.9, text)
    rmdir(d)
  end)

  it("a resumed run continues exactly as an uninterrupted one", function()
    local d = synthetic_data()
    local common = "--data " .. S.q(d) .. " --epochs 3 --batch-size 32 --hidden 48 --seed 5 --threads 2"
    local a, b = d .. "/a", d .. "/b"
    local ok, text = run(common .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(common .. " --stop-after 1 --out " .. S.q(b))
    assert(ok, text)
    assert.truthy(text:find("stopped early: continue with --resume", 1, true), text)
    assert.are.equal(1, #csv(b .. "/log.csv"))
    local ckpt = b .. "/checkpoint.safetensors"
    ok, text = run(common .. " --stop-after 2 --out " .. S.q(b) .. " --resume " .. S.q(ckpt))
    assert(ok, text)
    ok, text = run(common .. " --out " .. S.q(b) .. " --resume " .. S.q(ckpt))
    assert(ok, text)
    assert.truthy(text:find("resumed from", 1, true), text)
    local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
    assert.are.equal(3, #ra)
    assert.are.equal(3, #rb)
    -- epoch, step, lr, train loss/accuracy, test loss/accuracy/correct: identical
    -- (the speed and time columns differ)
    for i = 1, 3 do
      for c = 1, 8 do assert.are.equal(ra[i][c], rb[i][c], ("row %d column %d"):format(i, c)) end
    end
    -- the final weights too
    local wa = nd.checkpoint.read(a .. "/checkpoint.safetensors")
    local wb = nd.checkpoint.read(ckpt)
    assert.are.equal(3, wb.extra.epoch)
    for k, t in pairs(wa.model) do assert.is_true(t:tobytes() == wb.model[k]:tobytes(), k) end
    -- resuming with other options is refused, naming them
    local code
    ok, text, code = run(common:gsub("--epochs 3", "--epochs 4") .. " --out " .. S.q(b) .. " --resume " .. S.q(ckpt))
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(text:find("--epochs 3 (now 4)", 1, true), text)
    rmdir(d)
  end)

  if have_fashion then
    it("a quick run on Fashion-MNIST (--epochs 1 --limit 2000) writes the log, checkpoint and plots", function()
      local out = tmpdir()
      local ok, text = run("--epochs 1 --limit 2000 --out " .. S.q(out))
      assert(ok, text)
      assert.truthy(text:find("2000 training images (of 60000), 10000 test images", 1, true), text)
      assert.truthy(text:find("test acc", 1, true), text)
      local rows = csv(out .. "/log.csv")
      assert.are.equal(1, #rows)
      assert.are.equal("1", rows[1][1])
      assert.are.equal(tostring(math.ceil(2000 / 128)), rows[1][2])
      -- 2000 images and one epoch are enough for over half the test set (64.67% measured)
      assert(tonumber(rows[1][7]) > 0.5, text)
      local state = nd.checkpoint.read(out .. "/checkpoint.safetensors")
      assert.are.equal(1, state.extra.epoch)
      assert.are.equal(16, state.step)
      assert.are.same({512, 784}, state.model["0.weight"].shape)
      assert.is_true(S.exists(out .. "/loss.svg") or S.exists(out .. "/loss.png"))
      assert.is_true(S.exists(out .. "/accuracy.svg") or S.exists(out .. "/accuracy.png"))
      rmdir(out)
    end)
  else
    pending("quick run on Fashion-MNIST: " .. NO_DATA)
  end
end)

describe("an MLP trained by PyTorch on Fashion-MNIST", function()
  if not have_fashion then
    pending("PyTorch's 784-32-10 MLP on the Fashion-MNIST test set: " .. NO_DATA)
    return
  end

  it("classifies the test set exactly as in PyTorch (same count, same predictions)", function()
    local E = dofile(root .. "/spec/fixtures/torch_mlp_fashion_expected.lua")
    local weights = nd.load(root .. "/spec/fixtures/torch_mlp_fashion.safetensors")
    local nn = nd.nn
    local model = nn.Sequential(nn.Linear(784, E.hidden), nn.ReLU(), nn.Linear(E.hidden, 10))
    model:load_state_dict(weights, {strict = true})
    model:eval()
    local x, y = mnist.load(mnist.FASHION_DIR, {train = false})
    assert.are.equal(E.total, x:size(1))
    local logits = nd.no_grad(function() return model(x:reshape({E.total, 784})) end)
    local pred = logits:argmax(2)

    -- the first rows' logits agree with PyTorch's to float32 rounding
    for i, row in ipairs(E.logits) do
      local got = logits[i]:totable()
      for j, v in ipairs(row) do
        assert(math.abs(got[j] - v) <= 1e-5 * math.max(1, math.abs(v)),
               ("logit (%d, %d): needle %.9g, PyTorch %.9g"):format(i, j, got[j], v))
      end
    end

    local correct = pred:eq(y):sum():item()
    local p = pred:totable()
    local differ = {}
    for i = 1, E.total do
      local tp = tonumber(E.predictions:sub(i, i)) + 1
      if p[i] ~= tp then
        local row = logits[i]:totable()
        differ[#differ + 1] = ("image %d: needle %d (logit %.9g), PyTorch %d (logit %.9g)"):format(
          i, p[i], row[p[i]], tp, row[tp])
      end
    end
    if #differ > 0 then
      print(("\n%d predictions differ from PyTorch's (near-ties in PyTorch: %d):\n  %s"):format(
        #differ, #E.near_ties, table.concat(differ, "\n  ")))
    end
    assert.are.equal(E.correct, correct)
    assert.are.equal(0, #differ)
  end)
end)
