-- needle.tensor_ops: tensor ops written in Lua over the C ops (issue 20):
-- einsum, bmm, tril/triu, diag, trace, outer, norm, all/any, isnan/isinf/
-- isfinite, nan_to_num, amax/amin, masked_select, nonzero, unique, roll,
-- repeat_interleave, bincount, searchsorted, multinomial, meshgrid,
-- allclose/isclose/equal, tolist, uniform_/normal_/bernoulli_, cumprod,
-- logcumsumexp (docs/tensor.md, "More tensor ops").
--
-- Each is made of differentiable C ops (views, sums, where, gather,
-- index_select, matmul, ...), so gradients and OpenCL come from those. The
-- few whose output size depends on the data (nonzero, masked_select, unique,
-- repeat_interleave with a tensor, bincount) read one count back from the
-- device. install(nd, core) puts each one where PyTorch has it: nd.<name>
-- (torch.<name>) and/or the tensor method x:<name>(...) (Tensor.<name>).

local FAMILIES = {
  "needle.tensor_ops.einsum", "needle.tensor_ops.matrix", "needle.tensor_ops.reduce",
  "needle.tensor_ops.compare", "needle.tensor_ops.select", "needle.tensor_ops.order",
  "needle.tensor_ops.random", "needle.tensor_ops.scan", "needle.tensor_ops.shape",
}

-- name -> where it goes: "both", "nd" (a function only) or "method"
local PLACES = {
  einsum = "nd", meshgrid = "nd", searchsorted = "nd",
  bmm = "both", outer = "both", tril = "both", triu = "both", diag = "both", trace = "both",
  norm = "both", all = "both", any = "both", amax = "both", amin = "both",
  isnan = "both", isinf = "both", isfinite = "both", nan_to_num = "both",
  allclose = "both", isclose = "both", equal = "both",
  masked_select = "both", nonzero = "both", unique = "both", bincount = "both", repeat_interleave = "both",
  multinomial = "both", roll = "both", cumprod = "both", logcumsumexp = "both",
  tolist = "method", uniform_ = "method", normal_ = "method", bernoulli_ = "method",
}

local M = {}

function M.install(nd, core)
  local found = {}
  for _, name in ipairs(FAMILIES) do
    for op, fn in pairs(require(name)) do
      local place = PLACES[op]
      if place ~= nil then
        found[op] = true
        if place ~= "method" then nd[op] = fn end
        if place ~= "nd" then core._methods[op] = fn end
      end
    end
  end
  for op in pairs(PLACES) do assert(found[op], "needle.tensor_ops: no family defines " .. op) end
end

return M
