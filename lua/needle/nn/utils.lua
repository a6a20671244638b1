-- needle.nn.utils (nd.nn.utils): gradient clipping, as torch.nn.utils.
--
--   local total = nd.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
--
-- `parameters` is a tensor, a list of tensors or a module. Parameters whose
-- grad is nil are skipped. The clipped gradient is a new tensor assigned to
-- p.grad (a grad tensor someone holds is never modified, as everywhere in
-- needle).
local core = require "needle.core"
local errors = require "needle.errors"
local options = require "needle.options"
local capture = require "needle.compile.state"

local M = {}

-- raised at the caller's code (the first frame outside the package)
local function raise(fn, msg) errors.fail("nn.utils." .. fn, "%s", msg) end

local function with_grads(fn, parameters)
  if core.is_tensor(parameters) then parameters = {parameters} end
  if type(parameters) ~= "table" then
    raise(fn, ("parameters must be a tensor, a list of tensors or a module, got %s"):format(
      type(parameters)))
  end
  local mt = getmetatable(parameters)
  if mt and mt.class ~= nil then parameters = parameters:parameters() end
  local list = {}
  for i, p in ipairs(parameters) do
    if not core.is_tensor(p) then raise(fn, ("parameters[%d] is a %s, not a tensor"):format(i, type(p))) end
    if p.grad ~= nil then list[#list + 1] = p end
  end
  return list
end

-- A CPU float gradient's squared 2-norm as a dot product: no g * g
-- temporary (a language model's 2.6M-float gradient: 3.4 -> 0.5 ms). nil
-- where that does not apply. Eager and compiled clipping both use it, so
-- they keep the same bits.
local function dot_squared(g)
  if g.device == "cpu" and (g.dtype == "float32" or g.dtype == "float64") and g:is_contiguous() then
    local v = g:reshape({-1})
    return v:matmul(v)
  end
end

local function norm_of(g, norm_type)
  if norm_type == math.huge then
    return g:abs():max():item()
  elseif norm_type == -math.huge then
    return g:abs():min():item()
  elseif norm_type == 0 then
    return g:ne(0):sum():item()
  elseif norm_type == 1 then
    return g:abs():sum():item()
  elseif norm_type == 2 then
    return math.sqrt((dot_squared(g) or (g * g):sum()):item())
  end
  return ((g:abs() ^ norm_type):sum():item()) ^ (1 / norm_type)
end

-- the total norm over several per-parameter norms (the norm of their vector)
local function combine(norms, norm_type)
  if #norms == 1 then return norms[1] end
  if norm_type == math.huge then return math.max(table.unpack(norms)) end
  if norm_type == -math.huge then return math.min(table.unpack(norms)) end
  local s = 0
  if norm_type == 0 then
    for _, n in ipairs(norms) do if n ~= 0 then s = s + 1 end end
    return s
  end
  for _, n in ipairs(norms) do s = s + n ^ norm_type end
  return s ^ (1 / norm_type)
end

-- Inside nd.compile the norm never reaches the host: the same formulas as
-- norm_of and combine in float64 tensors (the per-parameter sums in the
-- grad's dtype, as above, then float64 as Lua numbers are), and every grad
-- is multiplied by min(coef, 1) (by exactly 1 when no clipping is due).
-- Returns the total norm as a 0-dim float64 tensor.
local function clip_on_device(params, max_norm, norm_type)
  local total
  for _, p in ipairs(params) do
    local g, n = p.grad, nil
    if norm_type == math.huge then n = g:abs():max():double()
    elseif norm_type == -math.huge then n = g:abs():min():double()
    elseif norm_type == 0 then n = g:ne(0):sum():double()
    elseif norm_type == 1 then n = g:abs():sum():double()
    elseif norm_type == 2 then n = (dot_squared(g) or (g * g):sum()):double():sqrt()
    else n = ((g:abs() ^ norm_type):sum():double()) ^ (1 / norm_type) end
    if #params == 1 then total = n
    elseif norm_type == math.huge then total = total and core.maximum(total, n) or n
    elseif norm_type == -math.huge then total = total and core.minimum(total, n) or n
    elseif norm_type == 0 then total = total and total + n:ne(0):double() or n:ne(0):double()
    else total = total and total + n ^ norm_type or n ^ norm_type end
  end
  if #params > 1 and norm_type ~= math.huge and norm_type ~= -math.huge and norm_type ~= 0 then
    total = total ^ (1 / norm_type)
  end
  -- min(coef, 1), where a NaN norm leaves the grads as they are (as eagerly: coef < 1 is false)
  local coef = max_norm / (total + 1e-6)
  coef = core.where(coef:lt(1), coef, core.ones_like(coef))
  for _, p in ipairs(params) do p.grad = p.grad * coef:to(p.grad.dtype) end
  return total
end

local function clip_grad_norm_(parameters, max_norm, norm_type, opts)
  if type(norm_type) == "table" and opts == nil then norm_type, opts = nil, norm_type end
  if type(max_norm) ~= "number" then
    raise("clip_grad_norm_", ("max_norm must be a number, got %s"):format(type(max_norm)))
  end
  -- (a negative one would flip every gradient's sign; NaN passes `max_norm < 0`)
  if not (max_norm >= 0) then
    raise("clip_grad_norm_", ("max_norm must be a number >= 0, got %s"):format(tostring(max_norm)))
  end
  norm_type = norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(norm_type) ~= "number" or norm_type ~= norm_type then
    raise("clip_grad_norm_", ("norm_type must be a number (or math.huge / 'inf'), got %s"):format(
      tostring(norm_type)))
  end
  opts = options.check("nn.utils.clip_grad_norm_", opts, {error_if_nonfinite = "boolean"})
  local error_if_nonfinite = opts.error_if_nonfinite or false
  local params = with_grads("clip_grad_norm_", parameters)
  if #params == 0 then return 0.0 end
  if capture.compiling() then
    if error_if_nonfinite then
      raise("clip_grad_norm_", "error_if_nonfinite = true reads the norm on the host, which a " ..
            "compiled function cannot do (a graph break)")
    end
    return core.no_grad(clip_on_device, params, max_norm, norm_type)
  end
  return core.no_grad(function()
    local grads, norms = {}, {}
    for i, p in ipairs(params) do
      grads[i] = p.grad
      norms[i] = norm_of(grads[i], norm_type)
    end
    local total = combine(norms, norm_type)
    if error_if_nonfinite and (total ~= total or total == math.huge or total == -math.huge) then
      raise("clip_grad_norm_", ("the total norm of order %s of the gradients is non-finite (%s), so " ..
            "they cannot be clipped; pass error_if_nonfinite = false to clip anyway"):format(
            tostring(norm_type), tostring(total)))
    end
    local coef = max_norm / (total + 1e-6)
    if coef < 1 then
      for i, p in ipairs(params) do p.grad = grads[i] * coef end
    end
    return total
  end)
end

-- clip_grad_norm_(parameters, max_norm[, norm_type = 2][, {error_if_nonfinite = false}]):
-- scales the gradients so that their total norm (the norm of all gradients as
-- one vector) is at most max_norm: each grad is multiplied by
-- max_norm / (total + 1e-6) when that is below 1. Returns the total norm
-- before clipping (a number). norm_type may be math.huge (or "inf").
M.clip_grad_norm_ = clip_grad_norm_
M.clip_grad_norm = clip_grad_norm_

-- clip_grad_value_(parameters, clip_value): every grad clamped to
-- [-clip_value, clip_value].
function M.clip_grad_value_(parameters, clip_value, ...)
  if type(clip_value) ~= "number" then
    raise("clip_grad_value_", ("clip_value must be a number, got %s"):format(type(clip_value)))
  end
  if not (clip_value >= 0) then
    raise("clip_grad_value_", ("clip_value must be a number >= 0 (gradients go to [-clip_value, clip_value]), got %s")
          :format(tostring(clip_value)))
  end
  if select("#", ...) > 0 then
    raise("clip_grad_value_", "takes clip_grad_value_(parameters, clip_value) only, got more arguments")
  end
  local params = with_grads("clip_grad_value_", parameters)
  core.no_grad(function()
    for _, p in ipairs(params) do p.grad = p.grad:clamp(-clip_value, clip_value) end
  end)
end
M.clip_grad_value = M.clip_grad_value_

return M
