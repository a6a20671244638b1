-- needle.data: datasets, batching and the readers of the standard data sets.
-- `nd.data` loads this on first use.
--
--   local data = nd.data
--   local ds = data.TensorDataset(x, y)
--   local loader = data.DataLoader(ds, {batch_size = 32, shuffle = true, seed = 0})
--   for xb, yb in loader:iter() do ... end
--
-- Also Subset, ConcatDataset, random_split, the samplers (Sequential, Random,
-- WeightedRandom, Batch, Distributed) and worker threads (num_workers).
-- Readers: data.mnist (IDX, MNIST and Fashion-MNIST), data.cifar10 (binary
-- batches), data.ptb (word-level text corpora); data.transforms for images.
local dataset = require "needle.data.dataset"
local DataLoader = require "needle.data.dataloader"
local sampler = require "needle.data.sampler"
local subset = require "needle.data.subset"

local data = {
  Dataset = dataset.Dataset,
  TensorDataset = dataset.TensorDataset,
  Subset = subset.Subset,
  ConcatDataset = subset.ConcatDataset,
  random_split = subset.random_split,
  DataLoader = DataLoader,
  SequentialSampler = sampler.SequentialSampler,
  RandomSampler = sampler.RandomSampler,
  WeightedRandomSampler = sampler.WeightedRandomSampler,
  BatchSampler = sampler.BatchSampler,
  DistributedSampler = sampler.DistributedSampler,
  default_collate = DataLoader.default_collate,
  -- from_module(module, fn, ...): require(module)[fn](...) that worker threads can rebuild
  from_module = function(...) return require("needle.data.recipe").from_module(...) end,
}

-- (torch.utils.data.get_worker_info) {id, num_workers, seed, dataset} inside a
-- DataLoader worker thread, nil elsewhere
function data.get_worker_info()
  local w = package.loaded["needle.data.worker"]
  return w and w.info() or nil
end

-- the readers and transforms load on first use
return require("needle.lazy")(data, {transforms = "needle.data.transforms", mnist = "needle.data.mnist",
                                     cifar10 = "needle.data.cifar10", ptb = "needle.data.ptb"})
