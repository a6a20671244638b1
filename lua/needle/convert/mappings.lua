-- needle.convert.mappings: state-dict mappings for layouts that differ from
-- needle's modules, and the helpers they are built from.
--
-- A mapping is a function(sd) -> new sd. It never changes its argument: the
-- result is a new table that shares the tensors it does not touch, so a
-- conversion that fails later leaves the caller's state dict as it was.
--
--   local mappings = require "needle.convert.mappings"
--   local sd2 = mappings.lstm_lm(sd)                        -- a named mapping
--   local m = mappings.compose(mappings.strip_prefix("module."), mappings.lstm_lm)
--   local sd3 = mappings.get("separate_qkv")(sd)            -- by name
--
-- Named mappings (mappings.names() lists them, mappings.descriptions[name]
-- says what each does):
--   lstm_lm          PyTorch word_language_model's RNNModel: encoder.* -> embedding.*
--   lstm_single_bias one LSTM/GRU/RNN bias per layer (bias_l<k>, as Keras or TF keep
--                    it) -> bias_ih_l<k> = that bias, bias_hh_l<k> = zeros
--   separate_qkv     <p>q_proj.*, <p>k_proj.*, <p>v_proj.* (Hugging Face style) ->
--                    <p>in_proj_weight / <p>in_proj_bias stacked q, k, v (out_proj kept)
--   torch_encoder_as_needle_transformer
--                    PyTorch TransformerEncoder layers (encoder.layers.<n>.*) ->
--                    needle's Transformer (layers.<n>.*); pos_embedding.* kept
--
-- Helpers that return mappings, to compose your own:
--   rename_prefix(from, to)       keys starting with `from` start with `to` instead
--   strip_prefix(p)               rename_prefix(p, "")
--   rename(fn)                    fn(key) -> new key, or nil to drop the entry
--   cat(keys, new_key, dim)       concatenates the tensors at keys (in order) along dim
--                                 (1-based) into new_key; keys are removed
--   split(key, new_keys, dim[, sizes])  the inverse: equal parts unless sizes is given
--   compose(m1, m2, ...)          m1 first, then m2, ...
local errors = require "needle.errors"
local core = require "needle.core"

local M = {}

local fail = errors.failer("convert", 0)

local function copy(sd)
  local out = {}
  for k, v in pairs(sd) do out[k] = v end
  return out
end

local function sorted_keys(sd)
  local keys = {}
  for k in pairs(sd) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end
M.sorted_keys = sorted_keys

local shape_str = errors.shape_str

-- helpers ------------------------------------------------------------------

-- rename(fn): each key k becomes fn(k) (nil drops the entry). Two keys that
-- end up with the same name are an error.
function M.rename(fn)
  return function(sd)
    local out, from = {}, {}
    for _, k in ipairs(sorted_keys(sd)) do
      local nk = fn(k)
      if nk ~= nil then
        if from[nk] ~= nil then
          fail("mapping renames both '%s' and '%s' to '%s'", from[nk], k, nk)
        end
        out[nk], from[nk] = sd[k], k
      end
    end
    return out
  end
end

local function starts(s, p) return type(s) == "string" and s:sub(1, #p) == p end

function M.rename_prefix(from, to)
  return M.rename(function(k)
    if starts(k, from) then return to .. k:sub(#from + 1) end
    return k
  end)
end

function M.strip_prefix(p) return M.rename_prefix(p, "") end

local function need_tensor(sd, k, what)
  local t = sd[k]
  if t == nil then fail("%s: key '%s' is not in the state dict", what, k) end
  if not core.is_tensor(t) then fail("%s: '%s' is a %s, not a tensor", what, k, type(t)) end
  return t
end

-- cat(keys, new_key, dim = 1): one tensor from several (q, k, v -> in_proj)
function M.cat(keys, new_key, dim)
  dim = dim or 1
  return function(sd)
    local out, parts = copy(sd), {}
    for i, k in ipairs(keys) do
      parts[i] = need_tensor(sd, k, "cat")
      out[k] = nil
    end
    for i = 2, #parts do
      if parts[i].dtype ~= parts[1].dtype then
        fail("cat: '%s' is %s but '%s' is %s", keys[1], parts[1].dtype, keys[i], parts[i].dtype)
      end
    end
    local ok, r = pcall(core.cat, parts, dim)
    if not ok then
      local shapes = {}
      for i, t in ipairs(parts) do shapes[i] = keys[i] .. " " .. shape_str(t) end
      fail("cat: cannot join %s along dim %d", table.concat(shapes, ", "), dim)
    end
    if out[new_key] ~= nil then fail("cat: '%s' is already in the state dict", new_key) end
    out[new_key] = r
    return out
  end
end

-- split(key, new_keys, dim = 1, sizes): the tensor at key cut into parts
-- (contiguous copies, so that no part keeps the others alive)
function M.split(key, new_keys, dim, sizes)
  dim = dim or 1
  return function(sd)
    local t = need_tensor(sd, key, "split")
    local n = #new_keys
    local len = t:size(dim)
    local list = sizes
    if list == nil then
      if len % n ~= 0 then
        fail("split: '%s' %s has %d entries along dim %d, not divisible into %d parts", key, shape_str(t), len, dim, n)
      end
      list = {}
      for i = 1, n do list[i] = len // n end
    end
    local ok, parts = pcall(t.split, t, list, dim)
    if not ok then fail("split: cannot split '%s' %s into %s along dim %d", key, shape_str(t),
                        "{" .. table.concat(list, ",") .. "}", dim) end
    local out = copy(sd)
    out[key] = nil
    for i, k in ipairs(new_keys) do
      if out[k] ~= nil then fail("split: '%s' is already in the state dict", k) end
      out[k] = parts[i]:contiguous()
    end
    return out
  end
end

function M.compose(...)
  local fns = table.pack(...)
  for i = 1, fns.n do
    if type(fns[i]) ~= "function" then fail("compose: argument %d is a %s, not a mapping function", i, type(fns[i])) end
  end
  return function(sd)
    for i = 1, fns.n do sd = fns[i](sd) end
    return sd
  end
end

-- named mappings -------------------------------------------------------------

M.descriptions = {}
local named = {}

local function define(name, description, fn)
  named[name] = fn
  M.descriptions[name] = description
  M[name] = fn
end
-- register(name, description, fn): a named mapping defined elsewhere (a model
-- file's checkpoint layout, e.g. needle.zoo.register_bert), listed with these
M.register = define

define("lstm_lm",
  "PyTorch word_language_model RNNModel -> needle LanguageModel: encoder.* -> embedding.*",
  M.rename_prefix("encoder.", "embedding."))

-- bias_l<k>[_reverse] -> bias_ih_l<k> (the bias) and bias_hh_l<k> (zeros): the
-- gates see b_ih + b_hh, so the sum is all that matters
define("lstm_single_bias",
  "one bias per recurrent layer (<p>bias_l<k>, Keras/TF style) -> bias_ih_l<k> = that bias, bias_hh_l<k> = zeros",
  function(sd)
    local out = copy(sd)
    for _, k in ipairs(sorted_keys(sd)) do
      local prefix, layer, rev = tostring(k):match("^(.-)bias_l(%d+)(_?[%w]*)$")
      if prefix and (rev == "" or rev == "_reverse") then
        local b = need_tensor(sd, k, "lstm_single_bias")
        local ih, hh = prefix .. "bias_ih_l" .. layer .. rev, prefix .. "bias_hh_l" .. layer .. rev
        if sd[ih] ~= nil or sd[hh] ~= nil then
          fail("lstm_single_bias: '%s' and '%s' are both in the state dict", k, sd[ih] ~= nil and ih or hh)
        end
        out[k] = nil
        out[ih] = b
        out[hh] = core.zeros(b.shape, {dtype = b.dtype})
      end
    end
    return out
  end)

-- <p>q_proj.weight, <p>k_proj.weight, <p>v_proj.weight (+ biases) ->
-- <p>in_proj_weight (3E, E), <p>in_proj_bias (3E). A projection without a bias
-- (some models drop k's) gets zeros when the others have one.
define("separate_qkv",
  "<p>q_proj/k_proj/v_proj .weight/.bias (Hugging Face style) -> <p>in_proj_weight/<p>in_proj_bias stacked q, k, v; out_proj kept",
  function(sd)
    local out = copy(sd)
    for _, k in ipairs(sorted_keys(sd)) do
      local prefix = tostring(k):match("^(.-)q_proj%.weight$")
      if prefix then
        local names = {prefix .. "q_proj", prefix .. "k_proj", prefix .. "v_proj"}
        local ws, bs, any_bias = {}, {}, false
        for i, n in ipairs(names) do
          ws[i] = need_tensor(sd, n .. ".weight", "separate_qkv")
          bs[i] = sd[n .. ".bias"]
          if bs[i] ~= nil then any_bias = true end
          out[n .. ".weight"], out[n .. ".bias"] = nil, nil
        end
        for i = 2, 3 do
          if shape_str(ws[i]) ~= shape_str(ws[1]) then
            fail("separate_qkv: %s.weight %s and %s.weight %s differ in shape (kdim/vdim other than embed_dim are not supported)",
                 names[1], shape_str(ws[1]), names[i], shape_str(ws[i]))
          end
        end
        local wk, bk = prefix .. "in_proj_weight", prefix .. "in_proj_bias"
        if sd[wk] ~= nil then fail("separate_qkv: both '%s' and '%s' are in the state dict", k, wk) end
        out[wk] = core.cat(ws, 1)
        if any_bias then
          for i = 1, 3 do
            bs[i] = bs[i] or core.zeros({ws[i]:size(1)}, {dtype = ws[i].dtype})
          end
          out[bk] = core.cat(bs, 1)
        end
      end
    end
    return out
  end)

define("torch_encoder_as_needle_transformer",
  "PyTorch pos_embedding + TransformerEncoder (norm_first, batch_first) -> needle Transformer: encoder.layers.<n>.* -> layers.<n>.*",
  M.rename_prefix("encoder.layers.", "layers."))

function M.names()
  local list = {}
  for k in pairs(named) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- get(name_or_fn): the mapping function (nil and false give nil)
function M.get(m)
  if m == nil or m == false then return nil end
  if type(m) == "function" then return m end
  if type(m) == "string" then
    local fn = named[m]
    if fn == nil then
      fail("unknown mapping '%s' (known: %s)", m, table.concat(M.names(), ", "))
    end
    return fn
  end
  fail("a mapping must be a name or a function(sd) -> sd, got %s", type(m))
end

return M
