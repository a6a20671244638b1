-- needle.tensor_ops.einsum: nd.einsum(equation, a, b, ...) (internal;
-- docs/tensor.md).
--
-- The operands are contracted left to right, two at a time, as batched
-- matrix products: each pair is permuted to (batch, kept, contracted) and
-- (batch, contracted, kept), reshaped to three dims and multiplied, so the
-- broadcast product of all the operands is never materialised. A subscript
-- repeated within one operand takes that operand's diagonal first, and a
-- subscript that appears in one operand only and not in the output is
-- summed away before any product. Everything is permute, reshape, sum,
-- index_select and matmul: gradients (of any order) and OpenCL follow.
local core = require "needle.core"
local A = require "needle.tensor_ops.args"
local matrix = require "needle.tensor_ops.matrix"

local fail = A.fail
local MAX_DIMS = 8

-- "ab...c" -> {"a", "b", "...", "c"}
local function subscripts(term, eq, what)
  local out, i, seen_ellipsis = {}, 1, false
  while i <= #term do
    local ch = term:sub(i, i)
    if term:sub(i, i + 2) == "..." then
      if seen_ellipsis then fail("einsum", "%s has more than one '...' in equation %q", what, eq) end
      seen_ellipsis = true
      out[#out + 1] = "..."
      i = i + 3
    elseif ch:match("^%a$") then
      out[#out + 1] = ch
      i = i + 1
    else
      fail("einsum", "invalid subscript %q in equation %q (subscripts are letters a-z, A-Z and '...')", ch, eq)
    end
  end
  return out
end

local function byte_less(a, b) return a:byte() < b:byte() end

-- the equation's terms and output as lists of labels, with each "..."
-- expanded to labels "1", "2", ... (right-aligned across operands, so that
-- ellipsis dims broadcast as NumPy's do)
local function parse(eq, operands)
  local text = eq:gsub("%s", "")
  local lhs, rhs = text:match("^(.-)%->(.*)$")
  if lhs == nil then lhs = text end
  if lhs:find("[-<>]") or (rhs and rhs:find("[-<>]")) then
    fail("einsum", "invalid equation %q (expected 'inputs->output' with one '->')", eq)
  end
  local terms = {}
  for term in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = term end
  if #terms ~= #operands then
    fail("einsum", "equation %q has %d operand%s but %d tensor%s given", eq, #terms, #terms == 1 and "" or "s",
         #operands, #operands == 1 and " was" or "s were")
  end
  local ell = 0
  local parsed = {}
  for k, term in ipairs(terms) do
    local subs = subscripts(term, eq, ("operand %d"):format(k))
    local letters = #subs
    for _, s in ipairs(subs) do if s == "..." then letters = letters - 1 end end
    local nd = operands[k]:dim()
    local has = #subs ~= letters
    if (not has and letters ~= nd) or (has and letters > nd) then
      fail("einsum", "operand %d has %d dims (%s) but %d subscripts in %q", k, nd, A.shape_str(operands[k]),
           letters, term)
    end
    parsed[k] = {subs = subs, ell = has and nd - letters or 0}
    ell = math.max(ell, parsed[k].ell)
  end
  local labels = {}
  local count = {}
  for k, p in ipairs(parsed) do
    local l = {}
    for _, s in ipairs(p.subs) do
      if s == "..." then
        for e = ell - p.ell + 1, ell do l[#l + 1] = tostring(e) end
      else
        l[#l + 1] = s
        count[s] = (count[s] or 0) + 1
      end
    end
    labels[k] = l
  end
  local out = {}
  if rhs == nil then
    -- implicit output: the ellipsis dims, then every letter used once, sorted
    for e = 1, ell do out[#out + 1] = tostring(e) end
    local once = {}
    for s, c in pairs(count) do if c == 1 then once[#once + 1] = s end end
    table.sort(once, byte_less)
    for _, s in ipairs(once) do out[#out + 1] = s end
  else
    local seen = {}
    for _, s in ipairs(subscripts(rhs, eq, "the output")) do
      if s == "..." then
        for e = 1, ell do out[#out + 1] = tostring(e) end
      else
        if seen[s] then fail("einsum", "output subscript '%s' appears more than once in %q", s, eq) end
        if count[s] == nil then fail("einsum", "output subscript '%s' is not in any operand of %q", s, eq) end
        seen[s] = true
        out[#out + 1] = s
      end
    end
  end
  return labels, out
end

local function describe(l)
  return l:match("^%d") and ("'...' dim " .. l) or ("subscript '" .. l .. "'")
end

local function index_of(list, v)
  for i, x in ipairs(list) do if x == v then return i end end
end

-- operand x with labels: each repeated label taken as a diagonal
local function take_diagonals(x, labels)
  while true do
    local p, q
    for i = 1, #labels do
      for j = i + 1, #labels do
        if labels[i] == labels[j] then p, q = i, j break end
      end
      if p then break end
    end
    if not p then return x, labels end -- (equal sizes: checked in einsum)
    local perm, rest = {}, {}
    for i = 1, #labels do
      if i ~= p and i ~= q then perm[#perm + 1] = i; rest[#rest + 1] = labels[i] end
    end
    perm[#perm + 1], perm[#perm + 2] = p, q
    rest[#rest + 1] = labels[p]
    x, labels = matrix.diagonal_last(x:permute(perm), 0), rest
  end
end

-- sums away the labels of x for which drop(label) is true
local function sum_labels(x, labels, drop)
  local dims, rest = {}, {}
  for i, l in ipairs(labels) do
    if drop(l) then dims[#dims + 1] = i else rest[#rest + 1] = l end
  end
  if #dims == 0 then return x, labels end
  return x:sum(dims), rest
end

local function product(sizes)
  local n = 1
  for _, s in ipairs(sizes) do n = n * s end
  return n
end

-- a (labels la) times b (labels lb), keeping the labels for which keep(l)
local function contract(a, la, b, lb, keep)
  local in_a, in_b = {}, {}
  for _, l in ipairs(la) do in_a[l] = true end
  for _, l in ipairs(lb) do in_b[l] = true end
  a, la = sum_labels(a, la, function(l) return not in_b[l] and not keep(l) end)
  b, lb = sum_labels(b, lb, function(l) return not in_a[l] and not keep(l) end)
  -- a label of size 1 on one side broadcasts: kept, the other side is
  -- expanded to it; contracted, the other side is summed and the 1 dropped
  local sa, sb = a.shape, b.shape
  local sum_a, sum_b = {}, {}
  local expand_a, expand_b = false, false
  for i, l in ipairs(la) do
    local j = index_of(lb, l)
    if j and sa[i] ~= sb[j] then
      if keep(l) then
        if sa[i] == 1 then sa[i] = sb[j]; expand_a = true else sb[j] = sa[i]; expand_b = true end
      else -- summing the side of size 1 only drops its dim
        sum_a[l], sum_b[l] = true, true
      end
    end
  end
  if expand_a then a = a:expand(sa) end
  if expand_b then b = b:expand(sb) end
  a, la = sum_labels(a, la, function(l) return sum_a[l] end)
  b, lb = sum_labels(b, lb, function(l) return sum_b[l] end)
  -- batch (in both, kept), left (a only), contracted (in both, not kept), right (b only)
  local batch, left, con, right = {}, {}, {}, {}
  for _, l in ipairs(la) do
    if index_of(lb, l) then
      if keep(l) then batch[#batch + 1] = l else con[#con + 1] = l end
    else
      left[#left + 1] = l
    end
  end
  for _, l in ipairs(lb) do
    if not index_of(la, l) then right[#right + 1] = l end
  end
  local labels = {}
  for _, g in ipairs({batch, left, right}) do
    for _, l in ipairs(g) do labels[#labels + 1] = l end
  end
  if #labels > MAX_DIMS then
    fail("einsum", "an intermediate product would have %d dims (needle tensors have at most %d)", #labels, MAX_DIMS)
  end
  local function arrange(x, lx, groups)
    local perm, sizes, shape = {}, {}, x.shape
    for g, group in ipairs(groups) do
      sizes[g] = {}
      for _, l in ipairs(group) do
        local i = index_of(lx, l)
        perm[#perm + 1] = i
        sizes[g][#sizes[g] + 1] = shape[i]
      end
    end
    if #perm > 0 then x = x:permute(perm) end
    local flat = {}
    for g = 1, #groups do flat[g] = product(sizes[g]) end
    return x:reshape(flat), sizes
  end
  local a3, asz = arrange(a, la, {batch, left, con})
  local b3, bsz = arrange(b, lb, {batch, con, right})
  local shape = {}
  for _, s in ipairs(asz[1]) do shape[#shape + 1] = s end
  for _, s in ipairs(asz[2]) do shape[#shape + 1] = s end
  for _, s in ipairs(bsz[3]) do shape[#shape + 1] = s end
  return core.matmul(a3, b3):reshape(shape), labels
end

local function einsum(eq, ...)
  if type(eq) ~= "string" then fail("einsum", "the equation must be a string, got %s", A.got(eq)) end
  local operands = table.pack(...)
  if operands.n == 1 and type(operands[1]) == "table" and not core.is_tensor(operands[1]) then
    operands = table.pack(table.unpack(operands[1])) -- the caller's list is left alone
  end
  if operands.n == 0 then fail("einsum", "expected at least one operand") end
  for k = 1, operands.n do
    A.tensor("einsum", operands[k], ("operand %d"):format(k))
    if k > 1 then
      if operands[k].dtype ~= operands[1].dtype then
        fail("einsum", "operands 1 and %d have dtypes %s and %s (expected one dtype)", k, operands[1].dtype,
             operands[k].dtype)
      end
      A.same_device("einsum", operands[1], operands[k])
    end
  end
  local labels, out = parse(eq, operands)
  -- sizes must agree, up to broadcasting a 1
  local size, first = {}, {}
  for k = 1, operands.n do
    local shape, own = operands[k].shape, {}
    for i, l in ipairs(labels[k]) do
      local s = shape[i]
      if own[l] ~= nil and own[l] ~= s then
        fail("einsum", "%s is repeated in operand %d with sizes %d and %d (a diagonal needs equal sizes)",
             describe(l), k, own[l], s)
      end
      own[l] = s
      if size[l] == nil or (size[l] == 1 and s ~= 1) then
        size[l], first[l] = s, k
      elseif s ~= size[l] and s ~= 1 then
        fail("einsum", "%s has size %d in operand %d but %d in operand %d", describe(l), size[l], first[l], s, k)
      end
    end
  end
  local in_out = {}
  for _, l in ipairs(out) do in_out[l] = true end
  -- how many operands still to come use each label
  local uses = {}
  for k = 1, operands.n do
    local seen = {}
    for _, l in ipairs(labels[k]) do
      if not seen[l] then uses[l] = (uses[l] or 0) + 1; seen[l] = true end
    end
  end
  local xs, ls = {}, {}
  for k = 1, operands.n do
    xs[k], ls[k] = take_diagonals(operands[k], labels[k])
    xs[k], ls[k] = sum_labels(xs[k], ls[k], function(l) return uses[l] == 1 and not in_out[l] end)
  end
  local acc, la = xs[1], ls[1]
  local function release(lx) for _, l in ipairs(lx) do uses[l] = uses[l] - 1 end end
  local function unique(lx)
    local seen, r = {}, {}
    for _, l in ipairs(lx) do if not seen[l] then seen[l] = true; r[#r + 1] = l end end
    return r
  end
  release(unique(labels[1]))
  for k = 2, operands.n do
    release(unique(labels[k]))
    acc, la = contract(acc, la, xs[k], ls[k], function(l) return in_out[l] or uses[l] > 0 end)
  end
  acc, la = sum_labels(acc, la, function(l) return not in_out[l] end)
  local perm, identity = {}, true
  for i, l in ipairs(out) do
    perm[i] = index_of(la, l)
    identity = identity and perm[i] == i
  end
  if identity then return acc end
  return acc:permute(perm)
end

return {einsum = einsum}
