-- torch_checkpoint_files_spec.lua - nd.load_torch on real torch.save files
-- (spec/fixtures/torch_ckpt/, written by spec/fixtures/gen/gen_torch_checkpoints.py
-- with PyTorch; PyTorch is not needed here): every special checkpoint reads
-- back exactly as its <name>_expected.safetensors (written by an independent
-- writer), views of one storage stay views, half types stay half unless
-- asked, int16/int8 come back as int32, non-tensor values of a nested
-- checkpoint keep their Lua form, and the legacy format is refused with a
-- hint. The reference models' own checkpoints are loaded here too (their
-- conversion and outputs are the convert/fuse specs' business).
local nd = require "needle"

local DIR = "spec/fixtures/torch_ckpt/"

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

local function keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out, function(a, b) return tostring(a) < tostring(b) end)
  return out
end

-- got equals want exactly: dtype, shape and every byte (row-major)
local function same(name, got, want)
  assert.is_true(nd.is_tensor(got), name .. ": not a tensor")
  assert.are.equal(want.dtype, got.dtype, name .. ": dtype")
  assert.are.same(want.shape, got.shape, name .. ": shape")
  assert.are.equal(hex(want:tobytes()), hex(got:tobytes()), name .. ": values")
end

-- every tensor of the expected file equals got[key] (with prefix: the
-- expected key "<prefix>.<k>" is got[prefix][k]); returns how many
local function same_as_expected(got, expected_file, prefix)
  local want = nd.load(DIR .. expected_file)
  local n = 0
  for _, k in ipairs(keys(want)) do
    local t, sub = got, k
    if prefix then
      assert.are.equal(prefix .. ".", k:sub(1, #prefix + 1), k)
      t, sub = got[prefix], k:sub(#prefix + 2)
    end
    same(k, t[sub], want[k])
    n = n + 1
  end
  return n
end

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("nd.load_torch on torch.save files", function()
  it("is a function", function()
    assert.are.equal("function", type(nd.load_torch))
  end)

  it("reads a state_dict saved with pickle protocol 4", function()
    local sd = nd.load_torch(DIR .. "proto4.pt")
    assert.are.same({"0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"}, keys(sd))
    assert.are.equal(6, same_as_expected(sd, "proto4_expected.safetensors"))
    for _, k in ipairs(keys(sd)) do assert.is_false(sd[k].requires_grad, k) end
  end)

  it("reads the default protocol (2) the same as protocol 4", function()
    local a, b = nd.load_torch(DIR .. "mlp.pt"), nd.load_torch(DIR .. "proto4.pt")
    assert.are.same(keys(b), keys(a))
    for _, k in ipairs(keys(a)) do same(k, a[k], b[k]) end
  end)

  it("reads a zip re-written with deflated entries and another root folder", function()
    assert.are.equal(6, same_as_expected(nd.load_torch(DIR .. "deflated.pt"), "deflated_expected.safetensors"))
  end)

  it("reads a zip with ZIP64 records", function()
    assert.are.equal(6, same_as_expected(nd.load_torch(DIR .. "zip64.pt"), "zip64_expected.safetensors"))
  end)

  it("keeps views of one storage as views that share memory", function()
    local v = nd.load_torch(DIR .. "shared_views.pt")
    assert.are.same({"base", "other", "slice", "strided", "t"}, keys(v))
    assert.are.equal(5, same_as_expected(v, "shared_views_expected.safetensors"))
    -- the geometry PyTorch saved
    assert.are.same({6, 1}, v.base:stride())
    assert.are.same({1, 6}, v.t:stride())
    assert.are.same({6, 1}, v.slice:stride())
    assert.are.equal(6, v.slice:storage_offset())
    assert.are.same({6, 2}, v.strided:stride())
    assert.is_false(v.t:is_contiguous())
    assert.is_false(v.strided:is_contiguous())
    -- one buffer: a write through base shows in every view, not in other
    local other = hex(v.other:tobytes())
    v.base:fill_(7)
    for _, k in ipairs({"t", "slice", "strided"}) do
      for _, x in ipairs(v[k]:contiguous():view({-1}):totable()) do
        assert.are.equal(7, x, k .. " does not share base's storage")
      end
    end
    assert.are.equal(other, hex(v.other:tobytes()))
    -- and a write through a view shows in base
    v.slice:fill_(-1)
    local b = v.base:totable()
    assert.are.same({7, 7, 7, 7, 7, 7}, b[1])
    assert.are.same({-1, -1, -1, -1, -1, -1}, b[2])
    assert.are.same({-1, -1, -1, -1, -1, -1}, b[3])
    assert.are.same({7, 7, 7, 7, 7, 7}, b[4])
  end)

  it("reads float16 and bfloat16 as half types by default", function()
    local h = nd.load_torch(DIR .. "half.pt")
    assert.are.equal("float16", h.f16.dtype)
    assert.are.equal("bfloat16", h.bf16.dtype)
    assert.are.equal(4, same_as_expected(h, "half_expected.safetensors"))
    -- f16_col is a column of f16: a strided view of the same storage
    assert.are.same({4}, h.f16_col:stride())
    assert.are.equal(1, h.f16_col:storage_offset())
  end)

  it("converts half types to float32 with {half_to_float = true}", function()
    local h = nd.load_torch(DIR .. "half.pt", {half_to_float = true})
    local want = nd.load(DIR .. "half_expected.safetensors")
    for _, k in ipairs(keys(want)) do
      assert.are.equal("float32", h[k].dtype, k)
      same(k, h[k], want[k]:float())
    end
    local s = h.f16_special:totable()
    assert.are.equal(65504, s[3])
    assert.are.equal(math.huge, s[5])
    assert.are.equal(-1.5, s[6])
    assert.are.equal("-0.0", tostring(s[2]))
  end)

  it("reads every integer, bool and float64 dtype (int16 and int8 as int32)", function()
    local d = nd.load_torch(DIR .. "dtypes.pt")
    assert.are.equal(7, same_as_expected(d, "dtypes_expected.safetensors"))
    local want = {int64 = "int64", int32 = "int32", int16 = "int32", int8 = "int32",
                  uint8 = "uint8", bool = "bool", float64 = "float64"}
    for k, dt in pairs(want) do assert.are.equal(dt, d[k].dtype, k) end
    assert.are.same({-32768, -2, 3, 32767}, d.int16:totable())
    assert.are.same({-128, -1, 0, 127, 5}, d.int8:totable())
    assert.are.same({0, 1, 128, 255}, d.uint8:totable())
    assert.are.same({true, false, false, true}, d.bool:totable())
    assert.are.equal(-(1 << 62), d.int64:totable()[1])
    assert.are.equal((1 << 62) + 5, d.int64:totable()[4])
  end)

  it("returns the non-tensor values of a nested checkpoint", function()
    local c = nd.load_torch(DIR .. "nested.pt")
    assert.are.same({"epoch", "flags", "ints", "lr", "model", "name"}, keys(c))
    assert.are.equal(3, c.epoch)
    assert.is_true(math.type(c.epoch) == "integer")
    assert.are.equal(0.1, c.lr)
    assert.are.equal("x", c.name)
    assert.are.equal(2, #c.flags)
    assert.are.equal(true, c.flags[1])
    assert.are.equal(nd.null, c.flags[2])
    assert.is_not_nil(nd.null)
    assert.are.same({1, 2}, c.ints)
    assert.are.same({"bias", "weight"}, keys(c.model))
    assert.are.equal(2, same_as_expected(c, "nested_expected.safetensors", "model"))
  end)

  it("refuses the legacy format with a hint on re-saving it", function()
    local msg = err_of(nd.load_torch, DIR .. "legacy.pt")
    assert.are.equal(1, msg:find("needle.load_torch: ", 1, true))
    assert.truthy(msg:find(DIR .. "legacy.pt", 1, true), msg)
    assert.truthy(msg:find("legacy", 1, true), msg)
    assert.truthy(msg:find("_use_new_zipfile_serialization", 1, true)
                  or msg:find("torch.save", 1, true), msg)
  end)

  it("is what nd.load returns for a torch zip", function()
    local a, b = nd.load(DIR .. "proto4.pt"), nd.load_torch(DIR .. "proto4.pt")
    assert.are.same(keys(b), keys(a))
    for _, k in ipairs(keys(a)) do same(k, a[k], b[k]) end
  end)

  it("reads the reference and mapping checkpoints", function()
    local expect = {
      mlp = {["0.weight"] = {32, 20}, ["4.bias"] = {5}},
      resnet9 = {["model.0.conv.weight"] = {16, 3, 7, 7}, ["model.9.weight"] = {10, 128},
                 ["model.0.bn.num_batches_tracked"] = {}},
      resnet18_cifar = {["conv1.weight"] = {8, 3, 3, 3}, ["layer2.0.downsample.0.weight"] = {16, 8, 1, 1},
                        ["layer4.1.bn2.running_var"] = {64}, ["fc.weight"] = {10, 64}},
      lstm_lm = {["encoder.weight"] = {50, 16}, ["rnn.weight_ih_l1"] = {96, 24}, ["decoder.bias"] = {50}},
      transformer_classifier = {["embedding.weight"] = {30, 32}, ["pos_embedding.weight"] = {16, 32},
                                ["encoder.layers.1.self_attn.in_proj_weight"] = {96, 32},
                                ["classifier.weight"] = {3, 32}},
      lstm_single_bias = {weight_ih_l0 = {32, 6}, weight_hh_l0 = {32, 8}, bias_l0 = {32}},
      attention_separate_qkv = {["q_proj.weight"] = {16, 16}, ["v_proj.bias"] = {16},
                                ["out_proj.weight"] = {16, 16}},
      torch_encoder_as_needle_transformer = {["pos_embedding.weight"] = {12, 16},
                                             ["encoder.layers.1.linear1.weight"] = {32, 16}},
    }
    for name, shapes in pairs(expect) do
      local sd = nd.load_torch(DIR .. name .. ".pt")
      for k, shape in pairs(shapes) do
        assert.is_true(nd.is_tensor(sd[k]), name .. ": " .. k)
        assert.are.same(shape, sd[k].shape, name .. ": " .. k)
      end
      local io_ = nd.load(DIR .. name .. "_io.safetensors")
      assert.is_true(nd.is_tensor(io_.input) and nd.is_tensor(io_.output), name)
    end
    local sd = nd.load_torch(DIR .. "resnet9.pt")
    assert.are.equal("int64", sd["model.0.bn.num_batches_tracked"].dtype)
    assert.are.equal(7, sd["model.0.bn.num_batches_tracked"]:item())
  end)

  it("names the file in the error for a file that does not exist", function()
    local msg = err_of(nd.load_torch, DIR .. "no_such_file.pt")
    assert.are.equal(1, msg:find("needle.load_torch: ", 1, true))
    assert.truthy(msg:find("no_such_file.pt", 1, true), msg)
  end)
end)
