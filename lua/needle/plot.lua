-- needle.plot: line plots of training curves, for the training scripts.
--
--   plot.lines(path_without_extension, {title=, xlabel=, ylabel=,
--              series = {{name=, x={...}, y={...}}, ...}})
--     -> the file written: PNG through gnuplot when it is installed,
--        otherwise a self-contained SVG (no dependencies).
local M = {}

local function has_gnuplot()
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
  local script = table.concat({
    "set terminal pngcairo size 900,540 noenhanced",
    ("set output '%s'"):format(path),
    ("set title '%s'"):format((spec.title or ""):gsub("'", "")),
    ("set xlabel '%s'"):format((spec.xlabel or ""):gsub("'", "")),
    ("set ylabel '%s'"):format((spec.ylabel or ""):gsub("'", "")),
    "set grid",
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
  if xmin == math.huge then xmin, xmax, ymin, ymax = 0, 1, 0, 1 end
  if xmax == xmin then xmax = xmin + 1 end
  if ymax == ymin then ymax = ymin + 1 end
  local function px(x) return L + (x - xmin) / (xmax - xmin) * (W - L - R) end
  local function py(y) return H - B - (y - ymin) / (ymax - ymin) * (H - T - B) end
  local colors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"}
  local out = {('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'):format(W, H),
    ('<rect width="%d" height="%d" fill="white"/>'):format(W, H),
    ('<text x="%d" y="24" text-anchor="middle" font-size="15">%s</text>'):format(W / 2, esc(spec.title)),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'):format(L, H - B, W - R, H - B),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'):format(L, T, L, H - B)}
  for k = 0, 4 do
    local yv, xv = ymin + (ymax - ymin) * k / 4, xmin + (xmax - xmin) * k / 4
    out[#out + 1] = ('<text x="%d" y="%.1f" text-anchor="end">%.4g</text>'):format(L - 6, py(yv) + 4, yv)
    out[#out + 1] = ('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'):format(L, py(yv), W - R, py(yv))
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
  out[#out + 1] = "</svg>\n"
  local f = assert(io.open(path, "w"))
  f:write(table.concat(out, "\n"))
  f:close()
  return true
end

function M.lines(base, spec)
  spec = require("needle.options").check("plot.lines", spec, {title = "string", xlabel = "string", ylabel = "string",
                                                              series = "table"})
  spec.series = spec.series or {}
  if has_gnuplot() and gnuplot_png(base .. ".png", spec) then return base .. ".png" end
  svg(base .. ".svg", spec)
  return base .. ".svg"
end

return M
