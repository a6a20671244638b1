-- spec/helpers/scripts.lua - for the specs that run the training scripts
-- (scripts/train_*.lua) as a user runs them.
--
--   local H = require "spec.helpers.scripts"
--   local run = H.runner("train_mlp") -- run(args[, env]): ok, output (stdout and stderr), exit
--                                     -- code; env: "NAME=value ..." put before the command
--   H.tmpdir()                        -- a new empty directory
--   H.rmdir(d)                        -- rm -rf d
--   H.csv_lines(path)                 -- the data rows of a CSV log, as lines (the epochs':
--                                     -- not the header, not train_lstm's final "test" row)
--   H.csv_test_row(path)              -- that "test" row's fields, or nil
--   H.csv_rows(path)                  -- the data rows, each a list of fields (strings)
--   H.fake_python(d, body)            -- d/python3, a stand-in for PyTorch's Python (below)
local S = require "spec.helpers.shell"

local H = {}

-- d/python3: a stand-in for PyTorch's Python for the benchmark specs: "-c"
-- (the version query) answers 9.9-fake, anything else runs body (sh) as the
-- *_torch.py process; returns its path
function H.fake_python(d, body)
  local fake = d .. "/python3"
  S.write_file(fake, '#!/bin/sh\nif [ "$1" = "-c" ]; then echo 9.9-fake; exit 0; fi\n' .. body)
  os.execute("chmod +x " .. S.q(fake))
  return fake
end

-- A function that runs scripts/NAME.lua with args (already quoted for the
-- shell) and returns whether it succeeded, its output and its exit code.
function H.runner(name)
  local exe, root = S.needle_lua()
  local script = root .. "/scripts/" .. name .. ".lua"
  return function(args, env)
    local out = os.tmpname()
    local ok, _, code = os.execute(("%s%s %s %s > %s 2>&1"):format(env and env .. " " or "", S.q(exe),
                                                                 S.q(script), args, out))
    local text = S.read_file(out)
    os.remove(out)
    return ok == true or ok == 0, text, code
  end
end

function H.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. S.q(d))
  return d
end

function H.rmdir(d) os.execute("rm -rf " .. S.q(d)) end

-- the lines of a CSV log but its header
function H.csv_lines(path)
  local rows = {}
  for line in io.lines(path) do
    if not line:match("^epoch") and not line:match("^test,") then rows[#rows + 1] = line end
  end
  return rows
end

function H.csv_test_row(path)
  for line in io.lines(path) do
    if line:match("^test,") then
      local r = {}
      for f in (line .. ","):gmatch("([^,]*),") do r[#r + 1] = f end
      return r
    end
  end
end

function H.csv_rows(path)
  local rows = {}
  for _, line in ipairs(H.csv_lines(path)) do
    local r = {}
    for f in line:gmatch("[^,]+") do r[#r + 1] = f end
    rows[#rows + 1] = r
  end
  return rows
end

-- The model tensors of two checkpoints (checkpoint.safetensors files) are
-- identical, bit for bit: same keys, same dtypes and shapes, same values.
function H.same_model(path_a, path_b)
  local nd = require "needle"
  local a, b = nd.checkpoint.read(path_a).model, nd.checkpoint.read(path_b).model
  local n, seen = 0, 0
  for k, t in pairs(a) do
    n, seen = n + 1, seen + 1
    local u = b[k]
    assert(u ~= nil, "second checkpoint lacks " .. k)
    assert(t.dtype == u.dtype and table.concat(t.shape, ",") == table.concat(u.shape, ","), k .. ": dtype or shape")
    assert(t:tobytes() == u:tobytes(), k .. ": values differ")
  end
  for _ in pairs(b) do n = n - 1 end
  assert(n == 0, "the checkpoints hold different numbers of tensors")
  assert(seen > 0, "the checkpoints hold no model tensors")
end

return H
