-- train_lstm_spec.lua - the main job, run as a user runs it (tiny settings):
-- it trains, perplexity falls, a resumed run continues exactly as an
-- uninterrupted one, and bad options or data give clear errors.
local S = require "spec.helpers.shell"
local H = require "spec.helpers.scripts"
local D = require "spec.helpers.devices"

local tiny = "--epochs 2 --max-lines 300 --emsize 16 --nhid 32 --batch-size 8 --bptt 10 --threads 2"

local run, csv, tmpdir = H.runner("train_lstm"), H.csv_lines, H.tmpdir

-- two runs' logs hold the same losses and perplexities (the timing columns differ)
local function same_log(a, b)
  local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
  assert.are.equal(#ra, #rb)
  for i = 1, #ra do
    assert.are.equal(ra[i]:match("^([^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*)"),
                     rb[i]:match("^([^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*)"))
  end
end

describe("scripts/train_lstm.lua", function()
  it("trains on the bundled corpus, logs, checkpoints and plots", function()
    local out = tmpdir()
    local ok, text = run(tiny .. " --out " .. S.q(out))
    assert(ok, text)
    assert.truthy(text:find("vocabulary 153", 1, true), text)
    assert.truthy(text:find("best achievable", 1, true), text)
    local rows = csv(out .. "/log.csv")
    assert.are.equal(2, #rows)
    local p1 = tonumber(rows[1]:match("^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,([^,]*)"))
    local p2 = tonumber(rows[2]:match("^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,([^,]*)"))
    assert(p2 < p1, ("validation perplexity did not fall: %g then %g"):format(p1, p2))
    assert.is_true(S.exists(out .. "/checkpoint.safetensors"))
    assert.is_true(S.exists(out .. "/loss.svg") or S.exists(out .. "/loss.png"))
    -- the last CSV row is the test set's result, as printed
    local test = H.csv_test_row(out .. "/log.csv")
    assert(test, "no test row in log.csv")
    local printed = text:match("test perplexity ([%d.]+)")
    assert.are.equal(tonumber(printed), tonumber(("%.2f"):format(tonumber(test[6]))))
    assert.are.equal(select(2, io.open(out .. "/log.csv"):read("a"):gsub("\ntest,", "")), 1)
    -- nd.log's files: the per-step loss, the epochs' and the test result, histograms
    local scalars = S.read_file(out .. "/scalars.csv")
    assert.truthy(scalars:find("\n1,train/loss,", 1, true), scalars:sub(1, 200))
    assert.truthy(scalars:find(",test/ppl,", 1, true))
    assert.truthy(S.read_file(out .. "/log.jsonl"):find('"tag":"params/', 1, true))
    assert.truthy(S.shell_line("ls " .. S.q(out) .. " | grep -c tfevents") == "1")
    -- the loss plot: a log axis (perplexity spans a decade with the best-achievable line) and that line
    local has_svg = S.exists(out .. "/loss.svg")
    if has_svg then
      local svg = S.read_file(out .. "/loss.svg")
      assert.truthy(svg:find("best achievable", 1, true))
      assert.truthy(svg:find("stroke-dasharray", 1, true))
    end
    os.execute("rm -rf " .. S.q(out))
    -- gnuplot wrote a PNG: the plot's content went unchecked, so say so (pending ends the test: last)
    if not has_svg then pending("loss.png (gnuplot): the plot's log axis and best-achievable line are checked only in the SVG") end
  end)

  it("a resumed run continues exactly as an uninterrupted one", function()
    local a, b = tmpdir(), tmpdir()
    local ok, text = run(tiny .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(tiny:gsub("--epochs 2", "--epochs 1") .. " --out " .. S.q(b))
    assert(ok, text)
    ok, text = run(tiny .. " --out " .. S.q(b) .. " --resume " .. S.q(b .. "/checkpoint.safetensors"))
    assert(ok, text)
    assert.truthy(text:find("resumed from", 1, true), text)
    assert.are.equal(2, #csv(b .. "/log.csv"))
    -- the first run's test row is gone; the resumed run wrote its own at the end
    local all = S.read_file(b .. "/log.csv")
    assert.are.equal(1, select(2, all:gsub("\ntest,", "")))
    assert.truthy(all:match("\ntest,[^\n]*\n$"))
    same_log(a, b)
    os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
  end)

  it("--compile trains exactly as the eager run (losses and perplexities)", function()
    local a, b = tmpdir(), tmpdir()
    local ok, text = run(tiny .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(tiny .. " --compile --out " .. S.q(b))
    assert(ok, text)
    local replays = tonumber(text:match("calls %d+: (%d+) replayed"))
    assert(replays and replays > 0, text)
    assert.are.equal(2, #csv(b .. "/log.csv"))
    same_log(a, b)
    H.same_model(a .. "/checkpoint.safetensors", b .. "/checkpoint.safetensors")
    os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
  end)

  it("--bf16 trains with bfloat16 products (close to float32's losses), --compile exactly as eagerly", function()
    local a, b, c = tmpdir(), tmpdir(), tmpdir()
    local ok, text = run(tiny .. " --out " .. S.q(a))
    assert(ok, text)
    ok, text = run(tiny .. " --bf16 --out " .. S.q(b))
    assert(ok, text)
    local bf16 = require("needle").devices()[1].bf16
    assert.truthy(text:find(bf16 and "--bf16: float32 products on bfloat16 inputs" or
                            "--bf16: this CPU has no AVX512_BF16, so products stay float32", 1, true), text)
    local ra, rb = csv(a .. "/log.csv"), csv(b .. "/log.csv")
    assert.are.equal(#ra, #rb)
    local differ = false
    for i = 1, #ra do
      local la, lb = tonumber(ra[i]:match("^[^,]*,[^,]*,([^,]*)")), tonumber(rb[i]:match("^[^,]*,[^,]*,([^,]*)"))
      assert(math.abs(la - lb) <= 0.02 * la, ("epoch %d: train loss %g in float32, %g with --bf16"):format(i, la, lb))
      differ = differ or la ~= lb
    end
    -- with AVX512_BF16 the products round their inputs: the losses move; without, nothing changes
    assert.are.equal(bf16 and true or false, differ)
    ok, text = run(tiny .. " --bf16 --compile --out " .. S.q(c))
    assert(ok, text)
    same_log(b, c)
    H.same_model(b .. "/checkpoint.safetensors", c .. "/checkpoint.safetensors")
    os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b) .. " " .. S.q(c))
  end)

  it("--help, unknown options and missing data", function()
    local ok, text = run("--help")
    assert(ok, text)
    assert.truthy(text:find("usage: needle-lua scripts/train_lstm.lua", 1, true), text)
    ok, text = run("--epoch 3")
    assert.is_false(ok)
    assert.truthy(text:find("unknown option '--epoch'", 1, true), text)
    ok, text = run("--lr fast")
    assert.is_false(ok)
    assert.truthy(text:find("option --lr expects a number, got 'fast'", 1, true), text)
    ok, text = run("--data /nonexistent/ptb")
    assert.is_false(ok)
    assert.truthy(text:find("/nonexistent/ptb", 1, true), text)
    local code
    ok, text, code = run("--bf16 --device opencl:0 --out " .. S.q(os.tmpname() .. ".d"))
    assert.is_false(ok)
    assert.are.equal(2, code)
    -- without an OpenCL driver the device is refused first; with one, --bf16 is
    assert.truthy(text:find(D.available and "--bf16 is for the CPU: OpenCL devices have no bfloat16 kernels yet"
                            or "opencl", 1, true), text)
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

  -- the same short run on the cpu and on each OpenCL device: the loss curves agree
  local devices = D.opencl()
  if #devices == 0 then
    D.pending_without_opencl(pending, "train_lstm --device opencl matches the cpu run")
  end
  for _, dev in ipairs(devices) do
    it("--device " .. dev .. " trains to the cpu's loss curve", function()
      local a, b = tmpdir(), tmpdir()
      local short = "--epochs 1 --max-lines 100 --emsize 16 --nhid 32 --batch-size 8 --bptt 10"
      local ok, text = run(short .. " --out " .. S.q(a))
      assert(ok, text)
      ok, text = run(short .. " --device " .. dev .. " --out " .. S.q(b))
      assert(ok, text)
      assert.truthy(text:find("device " .. dev, 1, true), text)
      local ra, rb = H.csv_rows(a .. "/log.csv"), H.csv_rows(b .. "/log.csv")
      assert.are.equal(1, #rb)
      for _, c in ipairs({3, 5}) do -- train loss, validation loss
        local x, y = tonumber(ra[1][c]), tonumber(rb[1][c])
        assert(math.abs(x - y) <= 1e-3 * math.max(1, math.abs(x)),
          ("column %d: cpu %s, %s %s"):format(c, ra[1][c], dev, rb[1][c]))
      end
      os.execute("rm -rf " .. S.q(a) .. " " .. S.q(b))
    end)
  end
end)
