-- scripts/bench/zoo_svg.lua: the bar chart of scripts/bench/zoo.lua, like the
-- seeds' throughput charts: per row (model and task) a needle bar and a
-- PyTorch bar, each row scaled to its faster side, the values at the bars'
-- ends and the ratio needle / PyTorch at the right. A row without PyTorch's
-- number says "PyTorch missing" instead of a bar. A self-contained SVG (no
-- plotting library).
--
--   local svg = dofile("scripts/bench/zoo_svg.lua")(results, meta)  -- the text
local function esc(s) return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end

return function(rows, meta)
  local L, R, T, BH, GAP = 170, 210, 56, 13, 12
  local W = 900
  local H = T + #rows * (2 * BH + GAP) + 40
  local span = W - L - R
  local out = {
    ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">')
      :format(W, H),
    ('<rect width="%d" height="%d" fill="white"/>'):format(W, H),
    ('<text x="%d" y="20" text-anchor="middle" font-size="14">needle vs PyTorch %s: throughput (higher is better)</text>')
      :format(W / 2, esc(meta.torch)),
    ('<text x="%d" y="38" text-anchor="middle">%s, %d threads, %d round(s)%s; each row scaled to its faster side</text>')
      :format(W / 2, esc(meta.date), meta.threads, meta.rounds, meta.quick and ", --quick sizes" or ""),
    ('<rect x="%d" y="%d" width="10" height="10" fill="#1f77b4"/><text x="%d" y="%d">needle</text>')
      :format(W - 140, 44, W - 126, 53),
    ('<rect x="%d" y="%d" width="10" height="10" fill="#ff7f0e"/><text x="%d" y="%d">PyTorch</text>')
      :format(W - 75, 44, W - 61, 53),
  }
  for i, r in ipairs(rows) do
    local y = T + (i - 1) * (2 * BH + GAP)
    local top = math.max(r.needle or 0, r.torch or 0)
    out[#out + 1] = ('<text x="%d" y="%.1f" text-anchor="end">%s</text>'):format(L - 8, y + BH + 4, esc(r.name))
    for k, side in ipairs({{"needle", "#1f77b4"}, {"torch", "#ff7f0e"}}) do
      local v, by = r[side[1]], y + (k - 1) * BH
      if v and top > 0 then
        local w = math.max(1, v / top * span)
        out[#out + 1] = ('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>'):format(L, by, w, BH - 1, side[2])
        out[#out + 1] = ('<text x="%.1f" y="%.1f">%.4g %s</text>'):format(L + w + 4, by + BH - 3, v, esc(r.unit))
      else
        out[#out + 1] = ('<text x="%d" y="%.1f" fill="#d62728">%s missing</text>'):format(L + 4, by + BH - 3,
          side[1] == "torch" and "PyTorch" or "needle")
      end
    end
    out[#out + 1] = ('<text x="%d" y="%.1f" font-weight="bold">%s</text>'):format(W - 55, y + BH + 4,
      r.ratio and ("%.2fx"):format(r.ratio) or "-")
  end
  out[#out + 1] = ('<text x="%d" y="%d" text-anchor="middle">ratio (right) = median over rounds of needle / PyTorch throughput; &gt; 1: needle faster</text>')
    :format(W / 2, H - 12)
  out[#out + 1] = "</svg>\n"
  return table.concat(out, "\n")
end
