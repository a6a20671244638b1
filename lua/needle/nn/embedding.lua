-- needle.nn.embedding: Embedding(num_embeddings, embedding_dim, {padding_idx=}).
--
--   local emb = nd.nn.Embedding(1000, 64, {padding_idx = 1})
--   emb(nd.tensor({{2, 5, 1}}, {dtype = "int64"}))   -- (1, 3, 64)
--
-- Indices are 1-based (1..num_embeddings), as everywhere in needle; so is
-- padding_idx (negative counts from the end). The weight is N(0, 1) with the
-- padding row zeroed, as PyTorch; the padding row gets no gradient.
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"
local capture = require "needle.compile.state"
local init = require "needle.nn.initializers"

local M = {}

local util = require "needle.nn.util"
local shape_str = require("needle.errors").shape_str

local Embedding = Module:extend("Embedding")

function Embedding:init(num_embeddings, embedding_dim, opts)
  for _, a in ipairs({{"num_embeddings", num_embeddings}, {"embedding_dim", embedding_dim}}) do
    if math.type(a[2]) ~= "integer" or a[2] < 1 then
      error(("needle.nn.Embedding: %s must be a positive integer, got %s"):format(a[1], require("needle.options").got(a[2])), 3)
    end
  end
  local o = util.options(self, opts, {padding_idx = "integer"}, true)
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local pad = o.padding_idx
  if pad ~= nil then
    if math.type(pad) ~= "integer" or pad == 0 or pad > num_embeddings or pad < -num_embeddings then
      error(("needle.nn.Embedding(%d, %d): padding_idx must be within 1..%d or -%d..-1, got %s"):format(
        num_embeddings, embedding_dim, num_embeddings, num_embeddings, tostring(pad)), 3)
    end
    if pad < 0 then pad = num_embeddings + 1 + pad end
  end
  self.padding_idx = pad
  local dtype = o.dtype or "float32"
  self.weight = Module.Parameter(nd.empty({num_embeddings, embedding_dim}, {dtype = dtype}))
  self:reset_parameters()
  util.place(self, o)
end

function Embedding:reset_parameters()
  init.normal_(self.weight)
  if self.padding_idx ~= nil then
    nd.no_grad(function() self.weight[self.padding_idx]:fill_(0) end)
  end
end

function Embedding:forward(indices)
  local sig = ("(%d, %d)"):format(self.num_embeddings, self.embedding_dim)
  local idx = indices
  if not nd.is_tensor(idx) then
    if type(idx) ~= "table" then
      error(("needle.nn.Embedding%s: expected integer indices (a tensor or a table), got %s"):format(sig, type(idx)), 2)
    end
    idx = nd.tensor(idx, {dtype = "int64", device = self.weight.device})
  end
  if idx.dtype ~= "int64" and idx.dtype ~= "int32" and idx.dtype ~= "uint8" then
    error(("needle.nn.Embedding%s: expected integer indices, got %s of shape %s"):format(
      sig, idx.dtype, shape_str(idx)), 2)
  end
  -- (inside nd.compile the lookup's own bounds check, run by every replay, refuses them)
  if idx:numel() > 0 and not capture.compiling() then
    local lo, hi = idx:min():item(), idx:max():item()
    if lo < 1 or hi > self.num_embeddings then
      error(("needle.nn.Embedding%s: index %d is out of range (expected 1..%d)"):format(
        sig, lo < 1 and lo or hi, self.num_embeddings), 2)
    end
  end
  return nd.F.embedding(idx, self.weight, {padding_idx = self.padding_idx})
end

function Embedding:extra_repr()
  local s = ("%d, %d"):format(self.num_embeddings, self.embedding_dim)
  if self.padding_idx ~= nil then s = s .. (", padding_idx=%d"):format(self.padding_idx) end
  return s
end
M.Embedding = Embedding

return M
