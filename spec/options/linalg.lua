-- nd.linalg (spec/linalg_spec.lua has the rest of its errors)
return function(nd)
  local L = nd.linalg
  local A = nd.eye(3) * 2
  local B = nd.ones({3, 2})
  return {rest = {
    {"linalg.solve", "left", function(o) return L.solve(A, B, o) end},
    {"linalg.cholesky", "upper", function(o) return L.cholesky(A, o) end},
    {"linalg.qr", "mode", function(o) return L.qr(A, o) end},
    {"linalg.svd", "full_matrices", function(o) return L.svd(A, o) end},
    {"linalg.eigh", "UPLO", function(o) return L.eigh(A, o) end},
    {"linalg.eigvalsh", "UPLO", function(o) return L.eigvalsh(A, o) end},
    {"linalg.lstsq", "driver, rcond", function(o) return L.lstsq(A, B, o) end},
  }}
end
