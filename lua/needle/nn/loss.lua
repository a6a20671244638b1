-- needle.nn.loss: CrossEntropyLoss (and needle's SoftmaxLoss), NLLLoss, MSELoss,
-- BCEWithLogitsLoss, L1Loss, SmoothL1Loss, HuberLoss, BCELoss, KLDivLoss,
-- MarginRankingLoss, CosineEmbeddingLoss, TripletMarginLoss, CTCLoss - modules
-- around the nd.F losses.
--
--   local loss_fn = nd.nn.CrossEntropyLoss({label_smoothing = 0.1})
--   local loss = loss_fn(logits, labels)      -- labels 1..C
--
-- Options have PyTorch's names: reduction ("mean" | "sum" | "none"),
-- ignore_index (a 1-based class index), label_smoothing. Class-index losses
-- take logits (N, C) or (N, C, d1, ...) with labels (N) or (N, d1, ...), as
-- PyTorch.
local error = require("needle.errors").error -- positions at the user's line
local nd = require "needle"
local Module = require "needle.nn.module"

local M = {}

local util = require "needle.nn.util"
local shape_str = require("needle.errors").shape_str

local REDUCTIONS = {mean = true, sum = true, none = true}

-- spec: the options besides reduction (see needle.options)
local function loss_init(self, opts, spec)
  spec.reduction = "string"
  opts = util.options(self, opts, spec)
  local reduction = opts.reduction or "mean"
  if not REDUCTIONS[reduction] then
    error(("needle.nn.%s: reduction must be 'mean', 'sum' or 'none', got %s"):format(
      self.__name, tostring(reduction)), 4)
  end
  self.reduction = reduction
  return opts
end

local function check_input(self, x)
  if not nd.is_tensor(x) then
    error(("needle.nn.%s: expected a tensor input, got %s"):format(self.__name, type(x)), 4)
  end
end

-- (N, C, d1, ...) logits with (N, d1, ...) labels -> (N*d1*..., C) and a flat
-- label vector; calls fn(logits2d, labels1d) and reshapes a "none" result
local function class_loss(self, input, target, fn)
  check_input(self, input)
  if input:dim() == 2 or input:dim() == 1 then
    local one = input:dim() == 1
    if one then
      input = input:unsqueeze(1)
      if not nd.is_tensor(target) then target = nd.tensor(target, {dtype = "int64", device = input.device}) end
      target = target:reshape({1})
    end
    local out = fn(input, target)
    if one and self.reduction == "none" then out = out:reshape({}) end
    return out
  end
  if input:dim() < 1 then
    error(("needle.nn.%s: expected input of shape (N, C) or (N, C, d1, ...), got %s"):format(
      self.__name, shape_str(input)), 3)
  end
  local t = nd.is_tensor(target) and target or nd.tensor(target, {dtype = "int64", device = input.device})
  local want = input.shape
  table.remove(want, 2)
  if shape_str(t) ~= "{" .. table.concat(want, ",") .. "}" then
    error(("needle.nn.%s: input %s needs labels of shape {%s}, got %s"):format(
      self.__name, shape_str(input), table.concat(want, ","), shape_str(t)), 3)
  end
  local C = input:size(2)
  local perm = {1}
  for d = 3, input:dim() do perm[#perm + 1] = d end
  perm[#perm + 1] = 2
  local flat = input:permute(perm):reshape({-1, C})
  local out = fn(flat, t:reshape({-1}))
  if self.reduction == "none" then out = out:reshape(want) end
  return out
end

-- CrossEntropyLoss --------------------------------------------------------------

local CrossEntropyLoss = Module:extend("CrossEntropyLoss")

-- CrossEntropyLoss({ignore_index=, label_smoothing=0, reduction="mean"})
function CrossEntropyLoss:init(opts)
  opts = loss_init(self, opts, {ignore_index = "integer", label_smoothing = "number"})
  self.ignore_index = opts.ignore_index
  self.label_smoothing = opts.label_smoothing or 0
end

function CrossEntropyLoss:forward(input, target)
  return class_loss(self, input, target, function(x, t)
    return nd.F.cross_entropy(x, t, {ignore_index = self.ignore_index, label_smoothing = self.label_smoothing,
                                     reduction = self.reduction})
  end)
end

function CrossEntropyLoss:extra_repr()
  local s = ""
  if self.ignore_index ~= nil then s = ("ignore_index=%d, "):format(self.ignore_index) end
  if self.label_smoothing ~= 0 then s = s .. ("label_smoothing=%s, "):format(self.label_smoothing) end
  return s .. ("reduction='%s'"):format(self.reduction)
end
M.CrossEntropyLoss = CrossEntropyLoss

-- SoftmaxLoss: needle's name for the cross-entropy of logits
local SoftmaxLoss = CrossEntropyLoss:extend("SoftmaxLoss")
M.SoftmaxLoss = SoftmaxLoss

-- NLLLoss ----------------------------------------------------------------------

local NLLLoss = Module:extend("NLLLoss")

-- NLLLoss({ignore_index=, reduction="mean"}): input is log-probabilities
function NLLLoss:init(opts)
  self.ignore_index = loss_init(self, opts, {ignore_index = "integer"}).ignore_index
end

function NLLLoss:forward(input, target)
  return class_loss(self, input, target, function(x, t)
    return nd.F.nll_loss(x, t, {ignore_index = self.ignore_index, reduction = self.reduction})
  end)
end

function NLLLoss:extra_repr()
  local s = ""
  if self.ignore_index ~= nil then s = ("ignore_index=%d, "):format(self.ignore_index) end
  return s .. ("reduction='%s'"):format(self.reduction)
end
M.NLLLoss = NLLLoss

-- MSELoss, BCEWithLogitsLoss -------------------------------------------------------

local function check_same(self, input, target)
  check_input(self, input)
  if nd.is_tensor(target) and shape_str(target) ~= shape_str(input) then
    error(("needle.nn.%s: input %s and target %s must have the same shape"):format(
      self.__name, shape_str(input), shape_str(target)), 4)
  end
end

local MSELoss = Module:extend("MSELoss")

-- MSELoss({reduction="mean"})
function MSELoss:init(opts) loss_init(self, opts, {}) end

function MSELoss:forward(input, target)
  check_same(self, input, target)
  return nd.F.mse_loss(input, target, {reduction = self.reduction})
end

function MSELoss:extra_repr() return ("reduction='%s'"):format(self.reduction) end
M.MSELoss = MSELoss

local BCEWithLogitsLoss = Module:extend("BCEWithLogitsLoss")

-- BCEWithLogitsLoss({reduction="mean", pos_weight=}): pos_weight (C) weighs
-- the positive term, broadcast over the last dim, as PyTorch
function BCEWithLogitsLoss:init(opts)
  local pw = loss_init(self, opts, {pos_weight = "tensor|table|number"}).pos_weight
  if pw ~= nil then self:register_buffer("pos_weight", nd.is_tensor(pw) and pw or nd.tensor(pw)) end
end

function BCEWithLogitsLoss:forward(input, target)
  check_same(self, input, target)
  local pw = self.pos_weight
  if pw == nil then
    return nd.F.binary_cross_entropy_with_logits(input, target, {reduction = self.reduction})
  end
  -- (1 - y) x + (1 + (pw - 1) y) softplus(-x), softplus(-x) = max(-x, 0) + log(1 + exp(-|x|))
  local sp = (-input):maximum(0) + ((-input:abs()):exp() + 1):log()
  local loss = (1 - target) * input + ((pw - 1) * target + 1) * sp
  if self.reduction == "mean" then return loss:mean() end
  if self.reduction == "sum" then return loss:sum() end
  return loss
end

function BCEWithLogitsLoss:extra_repr() return ("reduction='%s'"):format(self.reduction) end
M.BCEWithLogitsLoss = BCEWithLogitsLoss

-- the losses that are one nd.F function with options ---------------------------

-- define(name, fn, spec, arity): a module whose init takes spec's options
-- (and reduction) and whose forward(inputs...) calls F[fn](inputs..., opts)
local function define(name, fn, spec, arity, reductions)
  local L = Module:extend(name)
  function L:init(opts)
    local given = util.options(self, opts, (function()
      local full = {reduction = "string"}
      for k, v in pairs(spec) do full[k] = v end
      return full
    end)())
    local reduction = given.reduction or "mean"
    if not (REDUCTIONS[reduction] or (reductions and reductions[reduction])) then
      util.fail(self, ("reduction must be 'mean', 'sum' or 'none'%s, got %s"):format(
        reductions and " (or 'batchmean')" or "", tostring(reduction)))
    end
    self.reduction = reduction
    self._opts = {}
    for k in pairs(spec) do self._opts[k] = given[k] end
  end
  function L:forward(...)
    local args = table.pack(...)
    for i = 1, arity do check_input(self, args[i]) end
    local o = {reduction = self.reduction}
    for k, v in pairs(self._opts) do o[k] = v end
    args[arity + 1] = o
    return nd.F[fn](table.unpack(args, 1, arity + 1))
  end
  function L:extra_repr()
    local parts = {}
    for k, v in pairs(self._opts) do parts[#parts + 1] = ("%s=%s"):format(k, tostring(v)) end
    table.sort(parts)
    parts[#parts + 1] = ("reduction='%s'"):format(self.reduction)
    return table.concat(parts, ", ")
  end
  M[name] = L
end

define("L1Loss", "l1_loss", {}, 2)
define("SmoothL1Loss", "smooth_l1_loss", {beta = "number"}, 2)
define("HuberLoss", "huber_loss", {delta = "number"}, 2)
define("BCELoss", "binary_cross_entropy", {weight = "tensor"}, 2)
define("KLDivLoss", "kl_div", {log_target = "boolean"}, 2, {batchmean = true})
define("MarginRankingLoss", "margin_ranking_loss", {margin = "number"}, 3)
define("CosineEmbeddingLoss", "cosine_embedding_loss", {margin = "number"}, 3)
define("TripletMarginLoss", "triplet_margin_loss", {margin = "number", p = "number", eps = "number",
                                                    swap = "boolean"}, 3)

-- CTCLoss ------------------------------------------------------------------------

local CTCLoss = Module:extend("CTCLoss")

-- CTCLoss({blank = 1, reduction = "mean", zero_infinity = false}): blank is a
-- 1-based class (1, the first class, is PyTorch's blank=0);
-- forward(log_probs (T, N, C), targets, input_lengths, target_lengths) is
-- nd.F.ctc_loss's
function CTCLoss:init(opts)
  opts = loss_init(self, opts, {blank = "integer", zero_infinity = "boolean"})
  self.blank = opts.blank or 1
  self.zero_infinity = opts.zero_infinity or false
end

function CTCLoss:forward(log_probs, targets, input_lengths, target_lengths)
  check_input(self, log_probs)
  return nd.F.ctc_loss(log_probs, targets, input_lengths, target_lengths,
                       {blank = self.blank, reduction = self.reduction, zero_infinity = self.zero_infinity})
end

function CTCLoss:extra_repr()
  return ("blank=%d, reduction='%s'%s"):format(self.blank, self.reduction,
                                               self.zero_infinity and ", zero_infinity=true" or "")
end
M.CTCLoss = CTCLoss

return M
