-- needle.optim.line_search: the strong-Wolfe line search of PyTorch's LBFGS
-- (torch/optim/lbfgs.py, itself ported from Torch7's optim/lswolfe.lua and
-- polyinterp.lua), step for step, so that LBFGS follows PyTorch's trajectory.
-- Scalars (steps, losses, directional derivatives) are Lua numbers; the
-- gradients are flat tensors.
local M = {}

local abs, sqrt = math.abs, math.sqrt

-- Python's max(a, b) / min(a, b): the first argument unless the second is
-- strictly greater / smaller (the same answer as PyTorch's when one is NaN)
local function pymax(a, b) if b > a then return b end return a end
local function pymin(a, b) if b < a then return b end return a end

-- the minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1
-- and g2, clamped to bounds (default: the interval between x1 and x2); the
-- middle of the bounds when the cubic has no minimum
function M.cubic_interpolate(x1, f1, g1, x2, f2, g2, xmin_bound, xmax_bound)
  if xmin_bound == nil then
    if x1 <= x2 then xmin_bound, xmax_bound = x1, x2 else xmin_bound, xmax_bound = x2, x1 end
  end
  local d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
  local d2_square = d1 * d1 - g1 * g2
  if d2_square >= 0 then
    local d2 = sqrt(d2_square)
    local min_pos
    if x1 <= x2 then
      min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else
      min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    end
    return pymin(pymax(min_pos, xmin_bound), xmax_bound)
  end
  return (xmin_bound + xmax_bound) / 2
end
local cubic_interpolate = M.cubic_interpolate

local function dot(a, b) return (a * b):sum():item() end

-- strong_wolfe(obj_func, x, t, d, f, g, gtd[, c1, c2, tolerance_change, max_ls])
--   obj_func(x, t, d) -> loss (number), flat gradient at x + t * d
--   x: the parameters' values at the start (restored by obj_func)
--   t: the first trial step; d: the direction; f, g, gtd: loss, gradient and
--   directional derivative at x
-- returns f_new, g_new, t, the number of evaluations
function M.strong_wolfe(obj_func, x, t, d, f, g, gtd, c1, c2, tolerance_change, max_ls)
  c1, c2 = c1 or 1e-4, c2 or 0.9
  tolerance_change, max_ls = tolerance_change or 1e-9, max_ls or 25
  local d_norm = d:abs():max():item()
  g = g:clone()
  local f_new, g_new = obj_func(x, t, d)
  local ls_func_evals = 1
  local gtd_new = dot(g_new, d)

  -- bracket an interval containing a point satisfying the Wolfe criteria
  local t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
  local done = false
  local ls_iter = 0
  local bracket, bracket_f, bracket_g, bracket_gtd
  while ls_iter < max_ls do
    if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev) then
      bracket, bracket_f = {t_prev, t}, {f_prev, f_new}
      bracket_g, bracket_gtd = {g_prev, g_new:clone()}, {gtd_prev, gtd_new}
      break
    end
    if abs(gtd_new) <= -c2 * gtd then
      bracket, bracket_f, bracket_g = {t}, {f_new}, {g_new}
      done = true
      break
    end
    if gtd_new >= 0 then
      bracket, bracket_f = {t_prev, t}, {f_prev, f_new}
      bracket_g, bracket_gtd = {g_prev, g_new:clone()}, {gtd_prev, gtd_new}
      break
    end
    -- interpolate
    local min_step = t + 0.01 * (t - t_prev)
    local max_step = t * 10
    local tmp = t
    t = cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, min_step, max_step)
    -- next step
    t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new:clone(), gtd_new
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = ls_func_evals + 1
    gtd_new = dot(g_new, d)
    ls_iter = ls_iter + 1
  end
  -- reached the most iterations
  if ls_iter == max_ls then
    bracket, bracket_f, bracket_g = {0, t}, {f, f_new}, {g, g_new}
  end

  -- zoom phase: we have a point satisfying the criteria, or a bracket around
  -- it; refine the bracket until the point is found
  local insuf_progress = false
  -- the low and high points of the bracket (1-based: PyTorch's 0 and 1)
  local low, high
  if bracket_f[1] <= bracket_f[#bracket_f] then low, high = 1, 2 else low, high = 2, 1 end
  while not done and ls_iter < max_ls do
    -- the bracket is too small
    if abs(bracket[2] - bracket[1]) * d_norm < tolerance_change then break end
    -- a new trial value
    t = cubic_interpolate(bracket[1], bracket_f[1], bracket_gtd[1], bracket[2], bracket_f[2], bracket_gtd[2])
    -- too close to a boundary: after insufficient progress, or at the
    -- boundary itself, move 0.1 * (bracket length) away from it
    local bmax, bmin = pymax(bracket[1], bracket[2]), pymin(bracket[1], bracket[2])
    local eps = 0.1 * (bmax - bmin)
    if pymin(bmax - t, t - bmin) < eps then
      if insuf_progress or t >= bmax or t <= bmin then
        if abs(t - bmax) < abs(t - bmin) then t = bmax - eps else t = bmin + eps end
        insuf_progress = false
      else
        insuf_progress = true
      end
    else
      insuf_progress = false
    end
    -- evaluate the new point
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = ls_func_evals + 1
    gtd_new = dot(g_new, d)
    ls_iter = ls_iter + 1

    if f_new > f + c1 * t * gtd or f_new >= bracket_f[low] then
      -- Armijo condition not met, or not lower than the lowest point
      bracket[high], bracket_f[high], bracket_g[high], bracket_gtd[high] = t, f_new, g_new:clone(), gtd_new
      if bracket_f[1] <= bracket_f[2] then low, high = 1, 2 else low, high = 2, 1 end
    else
      if abs(gtd_new) <= -c2 * gtd then
        done = true -- the Wolfe conditions hold
      elseif gtd_new * (bracket[high] - bracket[low]) >= 0 then
        -- the old high becomes the new low
        bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
        bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
      end
      -- the new point becomes the new low
      bracket[low], bracket_f[low], bracket_g[low], bracket_gtd[low] = t, f_new, g_new:clone(), gtd_new
    end
  end
  return bracket_f[low], bracket_g[low], bracket[low], ls_func_evals
end

return M
