-- needle.data: datasets, batching and the readers of the standard data sets.
-- `nd.data` loads this on first use.
--
--   local data = nd.data
--   local ds = data.TensorDataset(x, y)
--   local loader = data.DataLoader(ds, {batch_size = 32, shuffle = true, seed = 0})
--   for xb, yb in loader:iter() do ... end
--
-- Readers: data.mnist (IDX, MNIST and Fashion-MNIST), data.cifar10 (binary
-- batches), data.ptb (word-level text corpora); data.transforms for images.
local dataset = require "needle.data.dataset"
local DataLoader = require "needle.data.dataloader"
local sampler = require "needle.data.sampler"

local data = {
  Dataset = dataset.Dataset,
  TensorDataset = dataset.TensorDataset,
  DataLoader = DataLoader,
  DistributedSampler = sampler.DistributedSampler,
  default_collate = DataLoader.default_collate,
}

-- the readers and transforms load on first use
return require("needle.lazy")(data, {transforms = "needle.data.transforms", mnist = "needle.data.mnist",
                                     cifar10 = "needle.data.cifar10", ptb = "needle.data.ptb"})
