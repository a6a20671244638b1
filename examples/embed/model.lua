-- model.lua: a tiny "model" for examples/embed/host.c.
-- The chunk returns the model: a function from a {batch, 4} tensor to a
-- {batch} tensor, relu(x W + b) summed over its features.
-- host.c computes the same thing by hand, with the same weights.
local nd = require "needle"

local W = nd.tensor({
  { 1.0, -1.0,  0.5},
  { 2.0,  0.0, -1.0},
  { 0.0,  1.0,  1.0},
  {-1.0,  2.0,  0.0},
})                                   -- {4, 3}
local b = nd.tensor({0.5, -1.0, 0.0}) -- {3}, broadcast over the batch

return function(x)
  return (x:matmul(W) + b):relu():sum(2) -- dims are 1-based in Lua: 2 = features
end
