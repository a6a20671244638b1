-- compile_tune_spec.lua - nd.compile's autotuning (opts.tune, src/ops/graph_tune.c) and
-- scripts/tune_model.lua, run as a user runs them: each in a child process with its own
-- cache directory (NEEDLE_CACHE_DIR), so nothing here touches the user's cache and the
-- choices can be seen on disk. (train_mlp_spec.lua checks that a tuned training run
-- equals the eager one.)
local nd = require "needle"
local A = require("spec.helpers.assertions").bind(assert)
local D = require "spec.helpers.devices"
local H = require "spec.helpers.scripts"
local S = require "spec.helpers.shell"
local errmsg, assert_contains = A.errmsg, A.assert_contains

local tune_model = H.runner("tune_model")

local function read_lines(path)
  local out = {}
  local f = io.open(path)
  if not f then return out end
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

local write = S.write_file
-- runs a Lua program in a child process with the cache in dir
local function run_lua(dir, program)
  local exe = S.needle_lua()
  local file = os.tmpname()
  write(file, program)
  local out = os.tmpname()
  local ok = os.execute(("NEEDLE_CACHE_DIR=%s %s %s > %s 2>&1"):format(S.q(dir), S.q(exe), S.q(file), out))
  local text = S.read_file(out)
  os.remove(file)
  os.remove(out)
  return ok == true or ok == 0, text
end

describe("nd.compile tuning", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.rmdir(dir) end)

  it("tune_model.lua tunes a workload, and a second process takes the choices from disk", function()
    local env = "NEEDLE_CACHE_DIR=" .. S.q(dir)
    -- a budget long enough for every kernel under the sanitizers too (tuning ends when all are timed)
    local ok, text = tune_model("--workload mlp_train --seconds 120 --threads 2", env)
    assert(ok, text)
    local pattern = "tuning: (%d+) fused kernel%(s%) and (%d+) product%(s%): (%d+) from the cache, (%d+) timed now"
    local n, p, cached, timed = text:match(pattern)
    n, p, cached, timed = tonumber(n), tonumber(p), tonumber(cached), tonumber(timed)
    -- every kernel and product either timed or, the same as one timed before it, taken from that
    assert(n and n > 0 and p > 0 and timed > 0 and cached + timed == n + p, text)
    assert.is_nil(text:find("left at the default"), text)
    local lines = read_lines(dir .. "/compile/tune.txt")
    assert.are.equal("needle-compile-tune 1", lines[1])
    assert.are.equal(timed + 1, #lines)
    local gemm_lines = 0
    for i = 2, #lines do
      local g = lines[i]:match("^%x+ gemm %d+ %d+ [012] [012]$")
      if g then gemm_lines = gemm_lines + 1 end
      assert.truthy(g or lines[i]:match("^%x+ %d+ [01]$"), lines[i])
    end
    assert(gemm_lines > 0 and gemm_lines <= p, text)
    ok, text = tune_model("--workload mlp_train --seconds 120 --threads 2", env)
    assert(ok, text)
    assert_contains(text, ("tuning: %d fused kernel(s) and %d product(s): %d from the cache, 0 timed now")
                          :format(n, p, n + p))
    -- another thread count is another machine as far as the choices go
    ok, text = tune_model("--workload mlp_train --seconds 0 --threads 1", env)
    assert(ok, text)
    assert_contains(text, ("tuning: %d fused kernel(s) and %d product(s): 0 from the cache, 0 timed now")
                          :format(n, p))
    -- on one thread, "at most one thread" and the thread splits are no candidates (the default itself)
    local one = H.tmpdir()
    ok, text = tune_model("--workload mlp_train --seconds 120 --threads 1", "NEEDLE_CACHE_DIR=" .. S.q(one))
    assert(ok, text)
    local one_lines = read_lines(one .. "/compile/tune.txt")
    H.rmdir(one)
    local one_gemm = 0
    for i = 2, #one_lines do
      if one_lines[i]:find(" gemm ", 1, true) then
        one_gemm = one_gemm + 1
        assert.truthy(one_lines[i]:match("^%x+ gemm 0 %d+ [012] 0$"), one_lines[i])
      end
    end
    assert(one_gemm > 0, text)
    -- a budget spent before all are timed: the rest keep their default, and the line says how many
    local fresh = H.tmpdir()
    ok, text = tune_model("--workload mlp_train --seconds 0.000001 --threads 2", "NEEDLE_CACHE_DIR=" .. S.q(fresh))
    H.rmdir(fresh)
    assert(ok, text)
    local t2, left = text:match("(%d+) timed now in [%d.]+ s[^;\n]*; (%d+) left at the default, the 1e%-06 s budget spent")
    assert(t2 and tonumber(t2) + tonumber(left) == n + p, text)
  end)

  it("ignores a malformed choices file and replaces it with a valid one", function()
    os.execute("mkdir -p " .. S.q(dir .. "/compile"))
    local junk = {"needle-compile-tune 1", "0123456789abcdef 512 0", "zzzz 1 1", "0123456789abcdef 99999999 0",
                  "0123456789abcdee 5 0", "0123456789abcded 512 7", "0123456789abcdec 512 0 trailing",
                  ("f"):rep(400), "\0\1\2\255", "0123456789abcdeb -16 1", "12345 64 0",
                  "0123456789abcdea gemm 1 96 2 1", -- valid
                  "0123456789abcde9 gemm 1 96 3 1", "0123456789abcde8 gemm -1 0 0 0", "0123456789abcde7 gemm 1 96 2",
                  "0123456789abcde6 gemm 0 99999 0 0", "0123456789abcde5 gemm 0 0 0 0 0", "0123456789abcde4 gemm 0 0 0 x",
                  "0123456789abcde3 gemm 5000 0 0 0", "0123456789abcde2 GEMM 0 0 0 0", ""}
    write(dir .. "/compile/tune.txt", table.concat(junk, "\n"))
    local env = "NEEDLE_CACHE_DIR=" .. S.q(dir)
    local ok, text = tune_model("--workload mlp_train --seconds 0 --threads 2", env)
    assert(ok, text)
    assert_contains(text, "0 from the cache, 0 timed now")
    ok, text = tune_model("--workload mlp_train --seconds 1 --threads 2", env)
    assert(ok, text)
    local lines = read_lines(dir .. "/compile/tune.txt")
    assert.are.equal("needle-compile-tune 1", lines[1])
    assert.are.equal("0123456789abcdef 512 0", lines[2]) -- the two valid lines stay
    assert.are.equal("0123456789abcdea gemm 1 96 2 1", lines[3])
    local hex16 = ("%x"):rep(16)
    for i = 4, #lines do
      assert.truthy(lines[i]:match("^" .. hex16 .. " %d+ [01]$") or lines[i]:match("^" .. hex16 .. " gemm %d+ %d+ [012] [012]$"),
                    lines[i])
    end
    -- a file of random bytes, or one without the header, is ignored as a whole
    local rng = 7
    local bytes = {}
    for i = 1, 3000 do
      rng = (rng * 1103515245 + 12345) % 2147483648
      bytes[i] = string.char(rng % 256)
    end
    write(dir .. "/compile/tune.txt", table.concat(bytes))
    ok, text = tune_model("--workload mlp_train --seconds 0 --threads 2", env)
    assert(ok, text)
    assert_contains(text, "0 from the cache")
  end)

  it("keeps compiled results exact on every device, and parameters as they were", function()
    for _, dev in ipairs(D.all()) do
      local ok, text = run_lua(dir, ([[
        local nd = require "needle"
        local dev = %q
        nd.manual_seed(3)
        local b = nd.randn(257):to(dev)
        local w = nd.randn(300, 257):to(dev)
        local m = nd.randn(257, 700):to(dev)
        local f = function(x)
          w:mul_(0.5):add_(1) -- an update in place: tuning must not repeat it
          return ((x * 2 + b):sigmoid() * x - w):tanh():matmul(m)
        end
        local cf = nd.compile(f, {tune = 60}) -- ends when both are timed
        local w0 = w:clone()
        local x = nd.randn(300, 257):to(dev)
        local got = cf(x) -- eager
        got = cf(x)       -- captured and tuned
        local want_w = ((w0 * 0.5 + 1) * 0.5 + 1)
        assert((w - want_w):abs():max():item() == 0, "tuning changed the parameter")
        for i = 1, 3 do
          local x = nd.randn(300, 257):to(dev) * i
          local w_before = w:clone()
          got = cf(x)
          local w_after = w:clone()
          w:copy_(w_before)
          local want = f(x)
          assert((w - w_after):abs():max():item() == 0)
          assert((got - want):abs():max():item() == 0, "tuned result differs")
        end
        print(cf:explain():match("tuning: [^\n]*"))
      ]]):format(dev))
      assert(ok, text)
      -- the CPU's products take work-split hints; OpenCL's GEMM has its own tuner (tune_opencl.lua)
      assert_contains(text, dev == "cpu" and "tuning: 1 fused kernel(s) and 1 product(s): 0 from the cache, 2 timed now"
                            or "tuning: 1 fused kernel(s) and 0 product(s): 0 from the cache, 1 timed now")
    end
  end)

  it("applies a product's work split from the file, and its results stay the untuned ones bit for bit", function()
    -- a training step of two linear layers (one without a bias): linear_fused forward, matmul backward
    local program = [[
      local nd = require "needle"
      nd.manual_seed(5)
      local lin = nd.nn.Sequential(nd.nn.Linear(300, 700), nd.nn.Tanh(), nd.nn.Linear(700, 50, {bias = false}))
      local opt = nd.optim.SGD(lin:parameters(), {lr = 0.01})
      local x = nd.randn(260, 300)
      local step = function(x)
        opt:zero_grad()
        local loss = lin(x):tanh():sum()
        loss:backward()
        opt:step()
        return loss
      end
      local want_lin = nd.nn.Sequential(nd.nn.Linear(300, 700), nd.nn.Tanh(), nd.nn.Linear(700, 50, {bias = false}))
      want_lin:load_state_dict(lin:state_dict())
      local want_opt = nd.optim.SGD(want_lin:parameters(), {lr = 0.01})
      local cf = nd.compile(step, {tune = TUNE})
      for i = 1, 4 do
        local got = cf(x * i)
        want_opt:zero_grad()
        local loss = want_lin(x * i):tanh():sum()
        loss:backward()
        want_opt:step()
        assert(got:item() == loss:item(), "loss differs at step " .. i)
        local want_p = want_lin:parameters()
        for k, p in ipairs(lin:parameters()) do
          assert((p - want_p[k]):abs():max():item() == 0, ("parameter %d differs at step %d"):format(k, i))
        end
      end
      print(cf:explain())
    ]]
    local ok, text = run_lua(dir, (program:gsub("TUNE", "120"))) -- every product timed, sanitizers too
    assert(ok, text)
    local lines = read_lines(dir .. "/compile/tune.txt")
    local hinted = {lines[1]}
    for i = 2, #lines do -- every product's choice replaced by one that moves all the work around
      hinted[#hinted + 1] = lines[i]:gsub("^(%x+) gemm .*$", "%1 gemm 1 12 2 2")
    end
    assert(#hinted > 1, text)
    write(dir .. "/compile/tune.txt", table.concat(hinted, "\n") .. "\n")
    ok, text = run_lua(dir, (program:gsub("TUNE", "0")))
    assert(ok, text)
    local p = tonumber(text:match("and (%d+) product%(s%): %d+ from the cache, 0 timed now"))
    assert(p and p >= 4, text) -- two linear_fused forward, the weight gradients' and an input gradient's matmul
    assert_contains(text, ("tuned products: %d with another work split than the default"):format(p))
    assert_contains(text, "at most 1 thread(s), 12 rows per block, A panel stays, B streams, threads take column ranges")
  end)

  it("refuses a bad tune option, and bad script arguments", function()
    assert_contains(errmsg(nd.compile, function() end, {tune = -1}), "tune must be a number of seconds >= 0")
    assert_contains(errmsg(nd.compile, function() end, {tune = "fast"}), "tune")
    assert_contains(errmsg(nd.compile, function() end, {tunes = 1}), "tunes")
    local ok, text, code = tune_model("--workload nope")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert_contains(text, "unknown workload 'nope'")
    ok, text = tune_model("--list")
    assert(ok, text)
    assert_contains(text, "lstm_train")
  end)
end)
