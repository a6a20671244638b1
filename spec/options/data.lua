-- spec/options/data.lua - the options tables of nd.data's issue-20 additions
-- (merged into spec/options_spec.lua's "rest"; DataLoader's own line is there).
return function(nd)
  local data = nd.data
  local ds = data.TensorDataset(nd.zeros({4, 2}))
  return {rest = {
    {"data.RandomSampler", "num_samples, replacement, seed", function(o) return data.RandomSampler(ds, o) end},
    {"data.WeightedRandomSampler", "replacement, seed",
     function(o) return data.WeightedRandomSampler({1, 2}, 3, o) end},
    {"data.random_split", "generator_seed", function(o) return data.random_split(ds, {2, 2}, o) end},
  }}
end
