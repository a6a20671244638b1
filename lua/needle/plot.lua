-- needle.plot: line plots of training curves, for the training scripts.
--
--   plot.lines(path_without_extension, {title=, xlabel=, ylabel=,
--              series = {{name=, x={...}, y={...}}, ...},
--              hlines = {{name=, y=}, ...}, ylog = "auto" | true | false})
--     -> the file written: PNG through gnuplot when it is installed,
--        otherwise a self-contained SVG (no dependencies).
--
-- hlines are dashed horizontal reference lines (a best-achievable loss).
-- ylog = "auto" (the default) puts the y axis on a log scale when every value
-- is positive and they span a decade or more, as a loss curve that falls from
-- 2.3 to 0.01 does: on a linear axis its last 90% of training is a flat line.
local M = {}

-- M._has_gnuplot: a field, so that a spec can test the SVG writer on a
-- machine that has gnuplot
function M._has_gnuplot()
  local ok = os.execute("command -v gnuplot >/dev/null 2>&1")
  return ok == true or ok == 0
end

local function gnuplot_png(path, spec)
  local data = os.tmpname()
  local f = assert(io.open(data, "w"))
  for si, s in ipairs(spec.series) do
    for i = 1, #s.x do f:write(("%.10g %.10g\n"):format(s.x[i], s.y[i])) end
    if si < #spec.series then f:write("\n\n") end
  end
  f:close()
  local plots = {}
  for si, s in ipairs(spec.series) do
    plots[si] = ("'%s' index %d with lines lw 2 title '%s'"):format(data, si - 1, (s.name or ""):gsub("'", ""))
  end
  for _, h in ipairs(spec.hlines) do
    plots[#plots + 1] = ("%.10g with lines dashtype 2 lw 1.5 lc rgb '#555555' title '%s'"):format(
      h.y, (h.name or ""):gsub("'", ""))
  end
  local script = table.concat({
    "set terminal pngcairo size 900,540 noenhanced",
    ("set output '%s'"):format(path),
    ("set title '%s'"):format((spec.title or ""):gsub("'", "")),
    ("set xlabel '%s'"):format((spec.xlabel or ""):gsub("'", "")),
    ("set ylabel '%s'"):format((spec.ylabel or ""):gsub("'", "")),
    "set grid",
    spec.ylog and "set logscale y" or "unset logscale y",
    "plot " .. table.concat(plots, ", "),
  }, "\n")
  local p = io.popen("gnuplot 2>/dev/null", "w")
  p:write(script)
  local ok = p:close()
  os.remove(data)
  return ok
end

local function esc(s)
  return (tostring(s or ""):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"))
end

local function svg(path, spec)
  local W, H, L, R, T, B = 900, 540, 70, 20, 40, 50
  local xmin, xmax, ymin, ymax = math.huge, -math.huge, math.huge, -math.huge
  for _, s in ipairs(spec.series) do
    for i = 1, #s.x do
      xmin, xmax = math.min(xmin, s.x[i]), math.max(xmax, s.x[i])
      ymin, ymax = math.min(ymin, s.y[i]), math.max(ymax, s.y[i])
    end
  end
  for _, h in ipairs(spec.hlines) do ymin, ymax = math.min(ymin, h.y), math.max(ymax, h.y) end
  if xmin == math.huge then xmin, xmax, ymin, ymax = 0, 1, 0, 1 end
  if xmax == xmin then xmax = xmin + 1 end
  -- on a log axis the coordinates are log10(y), the ticks whole decades
  local f = spec.ylog and function(y) return math.log(y, 10) end or function(y) return y end
  local fmin, fmax = f(ymin), f(ymax)
  if spec.ylog then fmin, fmax = math.floor(fmin), math.ceil(fmax) end
  if fmin ~= fmin or fmax ~= fmax or fmin == -math.huge or fmax == math.huge then fmin, fmax = 0, 1 end
  if fmax == fmin then fmax = fmin + 1 end
  local function px(x) return L + (x - xmin) / (xmax - xmin) * (W - L - R) end
  local function py(y) return H - B - (f(y) - fmin) / (fmax - fmin) * (H - T - B) end
  local colors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"}
  local out = {('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'):format(W, H),
    ('<rect width="%d" height="%d" fill="white"/>'):format(W, H),
    ('<text x="%d" y="24" text-anchor="middle" font-size="15">%s</text>'):format(W / 2, esc(spec.title)),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'):format(L, H - B, W - R, H - B),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'):format(L, T, L, H - B)}
  local yticks = {}
  if spec.ylog then
    -- whole decades; with two decades or fewer, 2x and 5x too
    for d = fmin, fmax do
      for _, m in ipairs(fmax - fmin <= 2 and {1, 2, 5} or {1}) do
        if d + math.log(m, 10) <= fmax then yticks[#yticks + 1] = m * 10 ^ d end
      end
    end
  else
    for k = 0, 4 do yticks[#yticks + 1] = fmin + (fmax - fmin) * k / 4 end
  end
  for _, yv in ipairs(yticks) do
    out[#out + 1] = ('<text x="%d" y="%.1f" text-anchor="end">%.4g</text>'):format(L - 6, py(yv) + 4, yv)
    out[#out + 1] = ('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'):format(L, py(yv), W - R, py(yv))
  end
  for k = 0, 4 do
    local xv = xmin + (xmax - xmin) * k / 4
    out[#out + 1] = ('<text x="%.1f" y="%d" text-anchor="middle">%.4g</text>'):format(px(xv), H - B + 18, xv)
  end
  out[#out + 1] = ('<text x="%d" y="%d" text-anchor="middle">%s</text>'):format(W / 2, H - 8, esc(spec.xlabel))
  out[#out + 1] = ('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>'):format(H / 2, H / 2, esc(spec.ylabel))
  for si, s in ipairs(spec.series) do
    local pts = {}
    for i = 1, #s.x do pts[i] = ("%.1f,%.1f"):format(px(s.x[i]), py(s.y[i])) end
    local color = colors[(si - 1) % #colors + 1]
    out[#out + 1] = ('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'):format(color, table.concat(pts, " "))
    out[#out + 1] = ('<text x="%d" y="%d" fill="%s">%s</text>'):format(W - R - 160, T + 16 * si, color, esc(s.name))
  end
  for hi, h in ipairs(spec.hlines) do
    out[#out + 1] = ('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>')
      :format(L, py(h.y), W - R, py(h.y))
    out[#out + 1] = ('<text x="%d" y="%d" fill="#555">%s</text>'):format(W - R - 160, T + 16 * (#spec.series + hi), esc(h.name))
  end
  out[#out + 1] = "</svg>\n"
  local f = assert(io.open(path, "w"))
  f:write(table.concat(out, "\n"))
  f:close()
  return true
end

-- whether ylog = "auto" means a log axis: every value positive, spanning a
-- decade or more
function M.wants_log(spec)
  local lo, hi = math.huge, -math.huge
  local function see(y) lo, hi = math.min(lo, y), math.max(hi, y) end
  for _, s in ipairs(spec.series or {}) do for _, y in ipairs(s.y) do see(y) end end
  for _, h in ipairs(spec.hlines or {}) do see(h.y) end
  return lo > 0 and hi < math.huge and hi / lo >= 10
end

function M.lines(base, spec)
  local options = require "needle.options"
  spec = options.check("plot.lines", spec, {title = "string", xlabel = "string", ylabel = "string",
                                            series = "table", hlines = "table", ylog = "boolean|string"})
  local given = spec
  spec = {}
  for k, v in pairs(given) do spec[k] = v end
  spec.series = spec.series or {}
  spec.hlines = spec.hlines or {}
  if spec.ylog == nil or spec.ylog == "auto" then
    spec.ylog = M.wants_log(spec)
  elseif type(spec.ylog) == "string" then
    require("needle.errors").fail_at(2, "plot.lines", "ylog must be true, false or \"auto\", got %q", spec.ylog)
  end
  -- a log axis cannot show a value <= 0: drop such points rather than fail a run at its end
  if spec.ylog then
    local kept = {}
    for i, s in ipairs(spec.series) do
      local x, y = {}, {}
      for k = 1, #s.x do if s.y[k] > 0 then x[#x + 1], y[#y + 1] = s.x[k], s.y[k] end end
      kept[i] = {name = s.name, x = x, y = y}
    end
    spec.series = kept
    local hl = {}
    for _, h in ipairs(spec.hlines) do if h.y > 0 then hl[#hl + 1] = h end end
    spec.hlines = hl
    -- nothing positive left to draw: a linear axis (an empty plot) rather than log10(0)
    local any = #hl > 0
    for _, s in ipairs(spec.series) do any = any or #s.y > 0 end
    if not any then spec.ylog = false end
  end
  if M._has_gnuplot() and gnuplot_png(base .. ".png", spec) then return base .. ".png" end
  svg(base .. ".svg", spec)
  return base .. ".svg"
end

return M
