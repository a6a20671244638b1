-- the tensor ops of needle.tensor_ops (spec/tensor_ops_spec.lua has the rest
-- of their errors): nd.<name> and, where PyTorch has one, the method
return function(nd)
  local x = nd.tensor({{1.0, 2.0}, {3.0, 4.0}})
  local i = nd.tensor({1, 2, 2}, {dtype = "int64"})
  local REDUCE = "dim, keepdim"
  local CLOSE = "atol, equal_nan, rtol"
  return {rest = {
    {"norm", "dim, dtype, keepdim, p", function(o) return nd.norm(x, o) end},
    {"norm", "dim, dtype, keepdim, p", function(o) return x:norm(2, o) end},
    {"amax", REDUCE, function(o) return nd.amax(x, o) end},
    {"amin", REDUCE, function(o) return x:amin(1, o) end},
    {"all", REDUCE, function(o) return nd.all(x, o) end},
    {"any", REDUCE, function(o) return x:any(o) end},
    {"nan_to_num", "nan, neginf, posinf", function(o) return nd.nan_to_num(x, o) end},
    {"tril", "diagonal", function(o) return nd.tril(x, o) end},
    {"triu", "diagonal", function(o) return x:triu(o) end},
    {"diag", "diagonal", function(o) return nd.diag(x, o) end},
    {"nonzero", "as_tuple", function(o) return nd.nonzero(x, o) end},
    {"unique", "dim, return_counts, return_inverse, sorted", function(o) return x:unique(o) end},
    {"roll", "dims, shifts", function(o) return nd.roll(x, 1, o) end},
    {"repeat_interleave", "dim, repeats", function(o) return x:repeat_interleave(2, o) end},
    {"bincount", "minlength, weights", function(o) return nd.bincount(i, o) end},
    {"searchsorted", "out_int32, right, side, sorter", function(o) return nd.searchsorted(x, x, o) end},
    {"multinomial", "num_samples, replacement", function(o) return nd.multinomial(x, 1, o) end},
    {"meshgrid", "indexing", function(o) return nd.meshgrid(i, i, o) end},
    {"isclose", CLOSE, function(o) return nd.isclose(x, x, o) end},
    {"allclose", CLOSE, function(o) return x:allclose(x, o) end},
    {"cumprod", "dim, dtype", function(o) return nd.cumprod(x, 1, o) end},
    {"logcumsumexp", "dim", function(o) return x:logcumsumexp(2, o) end},
    {"uniform_", "from, to", function(o) return nd.zeros({2}):uniform_(o) end},
    {"normal_", "mean, std", function(o) return nd.zeros({2}):normal_(o) end},
    {"bernoulli_", "p", function(o) return nd.zeros({2}):bernoulli_(o) end},
    -- no options: any key is refused
    {"bmm", "", function(o) return nd.bmm(nd.zeros({1, 2, 2}), nd.zeros({1, 2, 2}), o) end},
    {"outer", "", function(o) return nd.outer(i, i, o) end},
    {"trace", "", function(o) return x:trace(o) end},
    {"isnan", "", function(o) return nd.isnan(x, o) end},
    {"isinf", "", function(o) return x:isinf(o) end},
    {"isfinite", "", function(o) return nd.isfinite(x, o) end},
    {"equal", "", function(o) return nd.equal(x, x, o) end},
    {"masked_select", "", function(o) return nd.masked_select(x, x:gt(2), o) end},
    {"tolist", "", function(o) return x:tolist(o) end},
  }}
end
