-- needle.data.ptb: word-level text corpora in the Penn Treebank format
-- (one sentence per line, words separated by spaces), as PyTorch's
-- word_language_model example reads them, with 1-based word indices.
--
--   local ptb = nd.data.ptb
--   local corpus = ptb.Corpus("data/ptb_synth")      -- train.txt, valid.txt, test.txt
--   print(#corpus.dictionary)                         -- vocabulary size (with "<eos>")
--   local train = ptb.batchify(corpus.train, 20)      -- (nbatch, 20) int64
--   for i = 1, train:size(1) - 1, 35 do
--     local input, target = ptb.get_batch(train, i, 35)  -- (seq_len, 20), (seq_len * 20)
--   end
local error = require("needle.errors").error -- positions at the user's line
local core = require "needle.core"
local options = require "needle.options"
local util = require "needle.data.util"

local M = {}
local WHO = "needle.data.ptb"

M.EOS = "<eos>"

---------------------------------------------------------------------------
-- Dictionary: word <-> index (1-based, in order of first appearance)
---------------------------------------------------------------------------

local Dictionary = {}
Dictionary.__index = Dictionary
Dictionary.__name = "Dictionary"

function Dictionary.new()
  return setmetatable({word2idx = {}, idx2word = {}}, Dictionary)
end

setmetatable(Dictionary, {__call = function() return Dictionary.new() end})

-- add_word(w) -> its index (a new word gets #dict + 1)
function Dictionary:add_word(w)
  local i = self.word2idx[w]
  if i == nil then
    i = #self.idx2word + 1
    self.idx2word[i] = w
    self.word2idx[w] = i
  end
  return i
end

function Dictionary:len() return #self.idx2word end
Dictionary.__len = Dictionary.len

-- index(w) -> index or nil; word(i) -> word or nil
function Dictionary:index(w) return self.word2idx[w] end
function Dictionary:word(i) return self.idx2word[i] end

function Dictionary:__tostring() return ("Dictionary(%d words)"):format(#self.idx2word) end

M.Dictionary = Dictionary

---------------------------------------------------------------------------
-- Corpus
---------------------------------------------------------------------------

local Corpus = {}
Corpus.__index = Corpus
Corpus.__name = "Corpus"

-- tokenize(path[, max_lines]) -> int64 1-D tensor of the file's word indices,
-- "<eos>" after every line, new words added to the dictionary.
function Corpus:tokenize(path, max_lines)
  -- read by the C reader: only a regular file (a FIFO is refused, not waited on)
  local s = util.read(path, WHO)
  local dict = self.dictionary
  local w2i = dict.word2idx
  local ids, n, lines = {}, 0, 0
  -- the lines as f:lines() gives them: a last line without "\n" counts
  if s ~= "" and s:sub(-1) ~= "\n" then s = s .. "\n" end
  for line in s:gmatch("(.-)\n") do
    if max_lines and lines >= max_lines then break end
    lines = lines + 1
    for w in line:gmatch("%S+") do
      n = n + 1
      ids[n] = w2i[w] or dict:add_word(w)
    end
    n = n + 1
    ids[n] = w2i[M.EOS] or dict:add_word(M.EOS)
  end
  if n == 0 then return core.zeros({0}, {dtype = "int64"}) end
  return core.tensor(ids, {dtype = "int64"})
end

-- Corpus(dir, {max_lines =}) reads dir/train.txt, dir/valid.txt and
-- dir/test.txt (in that order, one dictionary for all three, as PyTorch's
-- example): corpus.dictionary, corpus.train, corpus.valid, corpus.test.
function Corpus.new(dir, opts)
  opts = options.check("data.ptb.Corpus", opts, {max_lines = "integer"})
  if type(dir) ~= "string" then error(("%s: Corpus: expected a directory name, got %s"):format(WHO, type(dir)), 3) end
  if not util.is_dir(dir) then
    error(("%s: Corpus: directory '%s' does not exist (it should hold train.txt, valid.txt and test.txt)")
      :format(WHO, dir), 0)
  end
  local max_lines = opts.max_lines
  if max_lines ~= nil and (math.type(max_lines) ~= "integer" or max_lines < 0) then
    error(("%s: Corpus: max_lines must be a non-negative integer, got %s"):format(WHO, tostring(max_lines)), 3)
  end
  local self = setmetatable({dictionary = Dictionary.new(), dir = dir}, Corpus)
  for _, split in ipairs({"train", "valid", "test"}) do
    self[split] = self:tokenize(util.join(dir, split .. ".txt"), max_lines)
  end
  return self
end

setmetatable(Corpus, {__call = function(_, ...) return Corpus.new(...) end})

function Corpus:__tostring()
  return ("Corpus('%s': %d words; train %d, valid %d, test %d tokens)"):format(self.dir, #self.dictionary,
    self.train:numel(), self.valid:numel(), self.test:numel())
end

M.Corpus = Corpus

---------------------------------------------------------------------------
-- batching for truncated backpropagation through time
---------------------------------------------------------------------------

-- batchify(data, bsz) -> (nbatch, bsz): the 1-D token stream cut into bsz
-- contiguous columns (trailing tokens that do not fill a row are dropped), as
-- PyTorch's example: data[:nbatch*bsz].view(bsz, -1).t().contiguous().
function M.batchify(data, bsz)
  if not core.is_tensor(data) or data:dim() ~= 1 then
    error(("%s: batchify: expected a 1-D tensor of token indices, got %s"):format(WHO,
      core.is_tensor(data) and ("shape {" .. table.concat(data.shape, ",") .. "}") or type(data)), 2)
  end
  if math.type(bsz) ~= "integer" or bsz < 1 then
    error(("%s: batchify: bsz must be a positive integer, got %s"):format(WHO, tostring(bsz)), 2)
  end
  local nbatch = data:size(1) // bsz
  if nbatch == 0 then
    error(("%s: batchify: %d tokens do not fill one row of %d columns"):format(WHO, data:size(1), bsz), 2)
  end
  return data:narrow(1, 1, nbatch * bsz):reshape({bsz, nbatch}):t():contiguous()
end

-- get_batch(source, i, bptt) -> input (seq_len, bsz), target (seq_len * bsz)
-- for rows i .. i + seq_len - 1 (1-based i), seq_len = min(bptt, nrows - i);
-- target is the next row's token for each input token, flattened as in
-- PyTorch's example (source[i+1 .. i+seq_len]:reshape(-1)).
function M.get_batch(source, i, bptt)
  if not core.is_tensor(source) or source:dim() < 1 then
    error(("%s: get_batch: expected a batchified tensor, got %s"):format(WHO, type(source)), 2)
  end
  local nrows = source:size(1)
  if math.type(bptt) ~= "integer" or bptt < 1 then
    error(("%s: get_batch: bptt must be a positive integer, got %s"):format(WHO, tostring(bptt)), 2)
  end
  if math.type(i) ~= "integer" or i < 1 or i >= nrows then
    error(("%s: get_batch: row %s out of range (expected 1..%d for a source of %d rows: the last row has no target)")
      :format(WHO, tostring(i), nrows - 1, nrows), 2)
  end
  local seq_len = math.min(bptt, nrows - i)
  local input = source:narrow(1, i, seq_len)
  local target = source:narrow(1, i + 1, seq_len):reshape({-1})
  return input, target
end

return M
