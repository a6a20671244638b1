-- needle.linalg (nd.linalg): linear algebra as torch.linalg (docs/linalg.md).
--
-- The factorizations are LAPACK's, on the host (the C half: core._linalg_*,
-- src/ops/op_linalg.c and src/backends/cpu/cpu_linalg.c); a tensor on
-- OpenCL is copied there and its results copied back. Their gradients are
-- written here with differentiable needle ops, the standard matrix-calculus
-- formulas PyTorch uses, so they run on every device and give gradients of
-- gradients. Each result that has a gradient is recorded as a node of its
-- own whose backward is that result's share of the formula (the formulas
-- are linear in the incoming gradients, so the shares add up to the whole).
-- A backward keeps its inputs and the plain results (no autograd node);
-- under create_graph it computes the results again through these functions,
-- so that they are differentiable in turn.
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"

local M = {}

-- helpers ------------------------------------------------------------------------

local function check_tensor(fn, x, what)
  if not core.is_tensor(x) then
    errors.fail("linalg." .. fn, "%s must be a tensor, got %s", what, options.got(x))
  end
end

local function wants_grad(...)
  if not core.is_grad_enabled() then return false end
  for i = 1, select("#", ...) do
    if select(i, ...).requires_grad then return true end
  end
  return false
end

-- name: a string constant of this file (the node keeps a pointer to it, so
-- a string made at run time could be collected while the node lives)
local function record(name, inputs, value, backward)
  return core._custom_record(name, inputs, value, backward)
end

-- inside a backward: the plain value, or under create_graph (grad mode on)
-- the same value computed again with a graph
local function again(value, fn)
  if core.is_grad_enabled() then return fn() end
  return value
end

local function mT(x) return x:transpose(-2, -1) end
local function eye(n, like) return core.eye(n, {dtype = like.dtype, device = like.device}) end
local function diag_embed(v) return v:unsqueeze(-1) * eye(v:size(-1), v) end
local function diagonal(x) return (x * eye(x:size(-1), x)):sum(-1) end
-- x with 0 outside its lower (upper) triangle; k shifts the diagonal as tril/triu's
local function tri(x, upper, k)
  local r = core.arange(x:size(-2), {device = x.device}):unsqueeze(2)
  local c = core.arange(x:size(-1), {device = x.device}):unsqueeze(1)
  local d = c - r
  return core.where(upper and d:ge(k or 0) or d:le(k or 0), x, 0)
end
local function outer(u, v) return u:unsqueeze(-1) * v:unsqueeze(-2) end

-- the batch shape of two tensors' leading dims (before their last nd dims each)
local function batch_shape(a, na, b, nb)
  local sa, sb = a.shape, b.shape
  local la, lb = #sa - na, #sb - nb
  local n = math.max(la, lb)
  local out = {}
  for i = 1, n do
    local x, y = sa[la - n + i] or 1, sb[lb - n + i] or 1
    out[i] = x == 1 and y or x
  end
  return out
end
local function with(batch, ...)
  local s = {table.unpack(batch)}
  for _, v in ipairs({...}) do s[#s + 1] = v end
  return s
end

-- inv --------------------------------------------------------------------------

-- inv(A): A^-1 of each square matrix in the batch
function M.inv(A)
  check_tensor("inv", A, "A")
  local Y = core._linalg_inv(A)
  if not wants_grad(A) then return Y end
  return record("linalg.inv", {A}, Y, function(g)
    local Yt = mT(again(Y, function() return M.inv(A) end))
    return -(Yt:matmul(g):matmul(Yt)) -- d(A^-1) = -A^-1 dA A^-1
  end)
end

-- solve ------------------------------------------------------------------------

local function is_vector_rhs(A, B)
  if B:dim() == 1 then return true end
  if B:dim() ~= A:dim() - 1 then return false end
  for i = 1, B:dim() do
    if B:size(i) ~= A:size(i) then return false end
  end
  return true
end

-- solve(A, B, {left = true}): X with A X = B (left = false: X A = B); B a
-- matrix (..., n, k) or a vector (PyTorch's rule), batch dims broadcast
function M.solve(A, B, opts)
  local o = options.check("linalg.solve", opts, {left = "boolean"})
  check_tensor("solve", A, "A")
  check_tensor("solve", B, "B")
  if o.left == false then
    if core.is_tensor(A) and A:dim() >= 2 and is_vector_rhs(A, B) then
      errors.fail("linalg.solve", "B %s is a vector: X A = B (left = false) needs B of shape (..., k, %d)",
                  errors.shape_str(B), A:size(-1))
    end
    if B:dim() < 2 then
      errors.fail("linalg.solve", "B must have at least 2 dims for X A = B (left = false), got %s",
                  errors.shape_str(B))
    end
    if A:dim() >= 2 and B:size(-1) ~= A:size(-1) then
      errors.fail("linalg.solve", "incompatible shapes of A %s and B %s for X A = B (%dx%d and %dx%d)",
                  errors.shape_str(A), errors.shape_str(B), A:size(-2), A:size(-1), B:size(-2), B:size(-1))
    end
    return mT(M.solve(mT(A), mT(B))) -- X A = B is A^T X^T = B^T
  end
  local X = core._linalg_solve(A, B)
  if not wants_grad(A, B) then return X end
  -- the node's inputs are A and B broadcast to the batch, so its backward
  -- gives gradients of their shapes (expand's backward sums the rest)
  local vec = is_vector_rhs(A, B)
  local batch = batch_shape(A, 2, B, vec and 1 or 2)
  local n = A:size(-1)
  local Ae = A:expand(with(batch, n, n))
  local Be = vec and B:expand(with(batch, n)) or B:expand(with(batch, n, B:size(-1)))
  return record("linalg.solve", {Ae, Be}, X, function(g)
    -- B = A X: gB = A^-T g, gA = -gB X^T
    local gB = M.solve(mT(Ae), g)
    local gA
    if Ae.requires_grad then
      local Xd = again(X, function() return M.solve(Ae, Be) end)
      gA = vec and -outer(gB, Xd) or -gB:matmul(mT(Xd))
    end
    return gA, gB
  end)
end

-- det, slogdet -----------------------------------------------------------------

-- det(A) adj(A)^T = det(A) A^-T, continued to singular A through the SVD:
-- A = U S Vh gives det(U) det(Vh) U diag(prod_{j ~= i} s_j) Vh
local function cofactor(A, d)
  local singular = d:eq(0):sum():item() > 0
  if not singular then
    return d:unsqueeze(-1):unsqueeze(-1) * mT(M.inv(A))
  end
  local U, S, Vh = M.svd(A, {full_matrices = false})
  local n = S:size(-1)
  local others = core.where(eye(n, S):bool(), 1, S:unsqueeze(-2):expand(with(S.shape, n))):prod(-1)
  local sign = core._linalg_det(U:detach()) * core._linalg_det(Vh:detach())
  return (U * (others * sign:unsqueeze(-1)):unsqueeze(-2)):matmul(Vh)
end

-- det(A)
function M.det(A)
  check_tensor("det", A, "A")
  local d = core._linalg_det(A)
  if not wants_grad(A) then return d end
  return record("linalg.det", {A}, d, function(g)
    local dd = again(d, function() return M.det(A) end)
    return g:unsqueeze(-1):unsqueeze(-1) * cofactor(A, dd)
  end)
end

-- slogdet(A) -> sign, logabsdet (sign 0 and logabsdet -inf when singular)
function M.slogdet(A)
  check_tensor("slogdet", A, "A")
  local sign, logabs = core._linalg_slogdet(A)
  if not wants_grad(A) then return sign, logabs end
  return sign, record("linalg.slogdet", {A}, logabs, function(g)
    return g:unsqueeze(-1):unsqueeze(-1) * mT(M.inv(A)) -- d log|det A| = tr(A^-1 dA)
  end)
end

-- cholesky ---------------------------------------------------------------------

-- cholesky(A, {upper = false}): L (lower) with A = L L^T, from A's lower
-- triangle; upper: U = L^T, from its upper one
function M.cholesky(A, opts)
  local o = options.check("linalg.cholesky", opts, {upper = "boolean"})
  check_tensor("cholesky", A, "A")
  local upper = o.upper == true
  local Lr = core._linalg_cholesky(A, upper)
  if not wants_grad(A) then return Lr end
  return record("linalg.cholesky", {A}, Lr, function(g)
    -- Murray (2016), as PyTorch: gA = sym(L^-T Phi(L^T gL) L^-1), Phi the
    -- lower triangle with its diagonal halved; symmetric, as A is
    local L = again(Lr, function() return M.cholesky(A, {upper = upper}) end)
    if upper then L, g = mT(L), mT(g) end
    local phi = tri(mT(L):matmul(g), false)
    phi = phi - diag_embed(diagonal(phi)) * 0.5
    local Li = M.inv(L)
    local gA = mT(Li):matmul(phi):matmul(Li)
    return (gA + mT(gA)) * 0.5
  end)
end

-- qr ---------------------------------------------------------------------------

-- The gradient of A = Q R (Q m x n with orthonormal columns, R n x n upper,
-- m >= n): gA = (gQ + Q copyltu(M)) R^-T, M = R gR^T - Q^T gQ, copyltu
-- mirroring M's upper triangle into its lower one. gQ or gR may be nil.
local function qr_backward_tall(Q, R, gQ, gR)
  local Mx
  if gR then Mx = gR:matmul(mT(R)) end
  if gQ then
    local t = mT(Q):matmul(gQ)
    Mx = Mx and Mx - t or -t
  end
  local up = tri(Mx, true)
  local b = Q:matmul(up + mT(tri(Mx, true, 1)))
  if gQ then b = b + gQ end
  return mT(M.solve(R, mT(b))) -- b R^-T
end

-- m < n: A = [X | Y], Q R_X = X, R_Y = Q^T Y
local function qr_backward(A, Q, R, gQ, gR)
  local m, n = A:size(-2), A:size(-1)
  if m >= n then return qr_backward_tall(Q, R, gQ, gR) end
  local Y = A:narrow(-1, m + 1, n - m)
  local RX = R:narrow(-1, 1, m)
  local gRX = gR and gR:narrow(-1, 1, m)
  local gRY = gR and gR:narrow(-1, m + 1, n - m)
  local gQX = gQ
  if gRY then
    local t = Y:matmul(mT(gRY))
    gQX = gQX and gQX + t or t
  end
  local gX = qr_backward_tall(Q, RX, gQX, gRX)
  local gY = gRY and Q:matmul(gRY) or core.zeros_like(Y)
  return core.cat({gX, gY}, -1)
end

local QR_MODES = {reduced = true, complete = true, r = true}

-- qr(A, {mode = "reduced"}) -> Q, R ("complete": Q m x m; "r": R only, Q
-- an empty tensor); mode may also be the second argument
function M.qr(A, opts)
  if type(opts) == "string" then opts = {mode = opts} end
  local o = options.check("linalg.qr", opts, {mode = "string"})
  check_tensor("qr", A, "A")
  local mode = o.mode or "reduced"
  if not QR_MODES[mode] then
    errors.fail("linalg.qr", "mode must be 'reduced', 'complete' or 'r', got '%s'", mode)
  end
  local Q, R = core._linalg_qr(A, mode)
  if not wants_grad(A) then return Q, R end
  local m, n = A:size(-2), A:size(-1)
  local why
  if mode == "r" then
    why = "the gradient of linalg.qr needs Q, which mode 'r' does not compute: use mode 'reduced'"
  elseif mode == "complete" and m > n then
    why = ("linalg.qr with mode 'complete' has no gradient when A has more rows than columns (%dx%d)"):format(m, n)
  end
  local function values()
    return again({Q, R}, function() return {M.qr(A, {mode = mode})} end)
  end
  local function fails()
    errors.fail("linalg.qr", "%s", why)
  end
  local Qo = Q
  if mode ~= "r" then
    Qo = record("linalg.qr", {A}, Q, function(g)
      if why then fails() end
      local v = values()
      return qr_backward(A, v[1], v[2], g, nil)
    end)
  end
  local Ro = record("linalg.qr", {A}, R, function(g)
    if why then fails() end
    local v = values()
    return qr_backward(A, v[1], v[2], nil, g)
  end)
  return Qo, Ro
end

-- svd --------------------------------------------------------------------------

-- The gradient of A = U diag(S) Vh (reduced: k = min(m, n)), from any of
-- gU, gS, gVh (nil: not used), as PyTorch's svd_backward:
--   gA = U [(skew(U^T gU) / E) S + S (skew(V^T gV) / E) + diag(gS)] Vh
--        + (I - U U^T) gU S^-1 Vh + U S^-1 gV^T (I - V V^T)
-- skew(X) = X - X^T, E_jk = s_k^2 - s_j^2 (1 on the diagonal). Repeated
-- singular values give inf/NaN in the U and Vh terms, as in PyTorch.
local function svd_backward(U, S, Vh, gU, gS, gVh)
  local m, n, k = U:size(-2), Vh:size(-1), S:size(-1)
  if not gU and not gVh then
    return (U * gS:unsqueeze(-2)):matmul(Vh)
  end
  local S2 = S * S
  local E = S2:unsqueeze(-2) - S2:unsqueeze(-1) + eye(k, S)
  local inner
  if gU then
    local UtgU = mT(U):matmul(gU)
    inner = ((UtgU - mT(UtgU)) / E) * S:unsqueeze(-2)
  end
  if gVh then
    local VhgV = Vh:matmul(mT(gVh))
    local t = S:unsqueeze(-1) * ((VhgV - mT(VhgV)) / E)
    inner = inner and inner + t or t
  end
  if gS then inner = inner + diag_embed(gS) end
  local gA = U:matmul(inner):matmul(Vh)
  if gU and m > k then
    local gUSinv = gU / S:unsqueeze(-2)
    gA = gA + (gUSinv - U:matmul(mT(U):matmul(gUSinv))):matmul(Vh)
  end
  if gVh and n > k then
    local gVSinv = mT(gVh) / S:unsqueeze(-2) -- gV S^-1, n x k
    gA = gA + U:matmul(mT(gVSinv - mT(Vh):matmul(Vh:matmul(gVSinv))))
  end
  return gA
end

-- svd(A, {full_matrices = true}) -> U, S, Vh with A = U diag(S) Vh, S
-- descending; full_matrices = false: U (..., m, k), Vh (..., k, n)
function M.svd(A, opts)
  local o = options.check("linalg.svd", opts, {full_matrices = "boolean"})
  check_tensor("svd", A, "A")
  local full = o.full_matrices ~= false
  local U, S, Vh = core._linalg_svd(A, full)
  if not wants_grad(A) then return U, S, Vh end
  local k = S:size(-1)
  -- as PyTorch: with full matrices, only the first k columns of U (rows of
  -- Vh) take part in the gradient
  local function values()
    local v = again({U, S, Vh}, function() return {M.svd(A, {full_matrices = full})} end)
    if full then v[1], v[3] = v[1]:narrow(-1, 1, k), v[3]:narrow(-2, 1, k) end
    return v[1], v[2], v[3]
  end
  local Uo = record("linalg.svd", {A}, U, function(g)
    local u, s, vh = values()
    return svd_backward(u, s, vh, full and g:narrow(-1, 1, k) or g, nil, nil)
  end)
  local So = record("linalg.svd", {A}, S, function(g)
    local u, s, vh = values()
    return svd_backward(u, s, vh, nil, g, nil)
  end)
  local Vho = record("linalg.svd", {A}, Vh, function(g)
    local u, s, vh = values()
    return svd_backward(u, s, vh, nil, nil, full and g:narrow(-2, 1, k) or g)
  end)
  return Uo, So, Vho
end

-- svdvals(A): the singular values, descending
function M.svdvals(A)
  check_tensor("svdvals", A, "A")
  if not wants_grad(A) then return core._linalg_svdvals(A) end
  local U, S, Vh = core._linalg_svd(A, false)
  return record("linalg.svdvals", {A}, S, function(g)
    local v = again({U, S, Vh}, function() return {M.svd(A, {full_matrices = false})} end)
    return svd_backward(v[1], v[2], v[3], nil, g, nil)
  end)
end

-- eigh -------------------------------------------------------------------------

-- The gradient of A = V diag(L) V^T, as PyTorch's (symmetric):
-- gA = V (diag(gL) + (skew(V^T gV) / 2) / E) V^T, E_jk = l_k - l_j (1 on
-- the diagonal); repeated eigenvalues give inf/NaN, as in PyTorch.
local function eigh_backward(L, V, gL, gV)
  local inner
  if gV then
    local n = L:size(-1)
    local E = L:unsqueeze(-2) - L:unsqueeze(-1) + eye(n, L)
    local VtgV = mT(V):matmul(gV)
    inner = ((VtgV - mT(VtgV)) * 0.5) / E
  end
  if gL then
    local d = diag_embed(gL)
    inner = inner and inner + d or d
  end
  return V:matmul(inner):matmul(mT(V))
end

local function uplo(fn, opts)
  if type(opts) == "string" then opts = {UPLO = opts} end
  local o = options.check("linalg." .. fn, opts, {UPLO = "string"})
  local u = o.UPLO or "L"
  if u ~= "L" and u ~= "U" then errors.fail("linalg." .. fn, "UPLO must be 'L' or 'U', got '%s'", u) end
  return u == "U"
end

-- eigh(A, {UPLO = "L"}) -> eigenvalues (ascending), eigenvectors (columns)
-- of the symmetric matrix in A's lower triangle ("U": its upper one)
function M.eigh(A, opts)
  local upper = uplo("eigh", opts)
  check_tensor("eigh", A, "A")
  local L, V = core._linalg_eigh(A, upper)
  if not wants_grad(A) then return L, V end
  local function values()
    local v = again({L, V}, function() return {M.eigh(A, {UPLO = upper and "U" or "L"})} end)
    return v[1], v[2]
  end
  local Lo = record("linalg.eigh", {A}, L, function(g)
    local l, v = values()
    return eigh_backward(l, v, g, nil)
  end)
  local Vo = record("linalg.eigh", {A}, V, function(g)
    local l, v = values()
    return eigh_backward(l, v, nil, g)
  end)
  return Lo, Vo
end

-- eigvalsh(A, {UPLO = "L"}): the eigenvalues alone, ascending
function M.eigvalsh(A, opts)
  local upper = uplo("eigvalsh", opts)
  check_tensor("eigvalsh", A, "A")
  if not wants_grad(A) then return core._linalg_eigvalsh(A, upper) end
  local L, V = core._linalg_eigh(A, upper)
  return record("linalg.eigvalsh", {A}, L, function(g)
    local v = again({L, V}, function() return {M.eigh(A, {UPLO = upper and "U" or "L"})} end)
    return eigh_backward(v[1], v[2], g, nil)
  end)
end

-- lstsq ------------------------------------------------------------------------

-- lstsq(A, B, {rcond =, driver = "gelsd"}) -> solution, residuals, rank,
-- singular_values: the minimum-norm least-squares solution of A X = B
-- (B (..., m, k), or (..., m) when it has one dim fewer than A). The
-- solution's gradient is that of (A^T A)^-1 A^T B: A must be tall (m >= n)
-- with full rank.
function M.lstsq(A, B, opts)
  local o = options.check("linalg.lstsq", opts, {rcond = "number", driver = "string"})
  check_tensor("lstsq", A, "A")
  check_tensor("lstsq", B, "B")
  if o.driver ~= nil and o.driver ~= "gelsd" then
    errors.fail("linalg.lstsq", "driver must be 'gelsd' (the one LAPACK driver needle uses), got '%s'",
                tostring(o.driver))
  end
  local X, res, rank, sv = core._linalg_lstsq(A, B, o.rcond)
  if not wants_grad(A, B) then return X, res, rank, sv end
  local m, n = A:size(-2), A:size(-1)
  local vec = B:dim() == A:dim() - 1
  local batch = batch_shape(A, 2, B, vec and 1 or 2)
  local Ae = A:expand(with(batch, m, n))
  local Be = vec and B:expand(with(batch, m)) or B:expand(with(batch, m, B:size(-1)))
  local full_rank = rank:ne(n):sum():item() == 0
  local Xo = record("linalg.lstsq", {Ae, Be}, X, function(g)
    if m < n or not full_rank then
      errors.fail("linalg.lstsq", "the gradient is implemented for A of full rank with at least as many "
                  .. "rows as columns; got %dx%d matrices%s", m, n, full_rank and "" or " of lower rank")
    end
    -- X = (A^T A)^-1 A^T B: with Z = (A^T A)^-1 gX and the residual R = B - A X,
    -- gB = A Z and gA = R Z^T - A Z X^T
    local G = vec and g:unsqueeze(-1) or g
    local Xd = again(X, function() return M.solve(mT(Ae):matmul(Ae), mT(Ae):matmul(Be)) end)
    local Xm = vec and Xd:unsqueeze(-1) or Xd
    local Bm = vec and Be:unsqueeze(-1) or Be
    local Z = M.solve(mT(Ae):matmul(Ae), G)
    local gB = Ae:matmul(Z)
    local gA
    if Ae.requires_grad then
      gA = (Bm - Ae:matmul(Xm)):matmul(mT(Z)) - gB:matmul(mT(Xm))
    end
    if vec then gB = gB:squeeze(-1) end
    return gA, gB
  end)
  return Xo, res, rank, sv
end

return M
