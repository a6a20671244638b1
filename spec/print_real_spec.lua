-- print_real_spec.lua - tostring of real tensors (print_spec.lua checks the
-- formatter in depth on a fake tensor; this checks the wiring: __tostring on
-- the metatable, strided views, dtypes, summarisation through narrow).
-- Expected strings follow PyTorch's repr with needle's dtype/shape suffix.
local nd = require "needle"

describe("printing real tensors", function()
  local cases = {
    {"integral float matrix", function() return nd.tensor({{1, 2, 3}, {4, 5, 6}}) end,
     "tensor([[1., 2., 3.],\n        [4., 5., 6.]], dtype=float32, shape={2,3})"},
    {"mixed signs align", function() return nd.tensor({0.1, -2, 3.5}) end,
     "tensor([ 0.1000, -2.0000,  3.5000], dtype=float32, shape={3})"},
    {"int64", function() return nd.arange(5) end,
     "tensor([0, 1, 2, 3, 4], dtype=int64, shape={5})"},
    {"bool", function() return nd.tensor({true, false}) end,
     "tensor([ true, false], dtype=bool, shape={2})"},
    {"0-dim", function() return nd.tensor(3.5) end,
     "tensor(3.5000, dtype=float32, shape={})"},
    {"empty", function() return nd.zeros({0}) end,
     "tensor([], dtype=float32, shape={0})"},
    {"transposed view", function() return nd.tensor({{1, 2}, {3, 4}}):t() end,
     "tensor([[1., 3.],\n        [2., 4.]], dtype=float32, shape={2,2})"},
    {"3-D blocks", function() return nd.arange(8):reshape({2, 2, 2}) end,
     "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], dtype=int64, shape={2,2,2})"},
    {"summarised 1-D", function() return nd.arange(2000) end,
     "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], dtype=int64, shape={2000})"},
    {"scientific float64", function() return nd.tensor({1e-5, 1}, {dtype = "float64"}) end,
     "tensor([1.0000e-05, 1.0000e+00], dtype=float64, shape={2})"},
    {"float16 storage", function() return nd.tensor({0.5, 2}):half() end,
     "tensor([0.5000, 2.0000], dtype=float16, shape={2})"},
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      assert.are.equal(c[3], tostring(c[2]()))
    end)
  end

  it("requires_grad shows in the suffix", function()
    local x = nd.zeros({2}, {requires_grad = true})
    assert.are.equal("tensor([0., 0.], dtype=float32, shape={2}, requires_grad=true)", tostring(x))
  end)
end)
