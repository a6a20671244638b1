-- scripts/bench/scaling.lua: scripts/bench/run.lua --scaling 1,2,4,8,16 (issue 18).
-- Every selected workload at each thread count (needle, PyTorch, and cblas_sgemm
-- for the matmuls, each in a process of its own through run.lua's measure_round),
-- time against threads: a table with each side's speed-up over the first count
-- and needle / PyTorch at each count, OUT/scaling.json and OUT/scaling.svg (one
-- panel per workload: speed-up against threads, log2 axes, the ideal dashed).
local nd = require "needle"
local json = require("needle.checkpoint").json

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local C = dofile(here .. "/common.lua")
local median, fmt = C.median_of, C.fmt

local S = {}

local SIDES = {{key = "needle", label = "needle", color = "#1f77b4"},
               {key = "torch", label = "PyTorch", color = "#ff7f0e"},
               {key = "cblas", label = "cblas", color = "#7f7f7f"}}

local function svg(rows, counts, title)
  local PW, PH, L, T, COLS = 280, 220, 50, 30, 3
  local n = #rows
  local nrows = (n + COLS - 1) // COLS
  local Wd, H = COLS * PW + 20, nrows * PH + 70
  local maxc = counts[#counts] / counts[1]
  local top, bottom = maxc, 1 -- the y range spans every speed-up, slow-downs (< 1) too
  for _, r in ipairs(rows) do
    for _, p in ipairs(r.points) do
      for _, side in ipairs(SIDES) do
        local v = p[side.key .. "_speedup"]
        if v then top, bottom = math.max(top, v), math.min(bottom, math.max(v, 1 / 64)) end
      end
    end
  end
  local lx, lo = math.log(maxc, 2), math.log(bottom, 2)
  local ly = math.log(top, 2) - lo
  local out = {('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'):format(Wd, H),
    ('<rect width="%d" height="%d" fill="white"/>'):format(Wd, H),
    ('<text x="%d" y="20" text-anchor="middle" font-size="14">speed-up over %d thread(s) against threads (log2 axes; dashed: ideal)  %s</text>')
      :format(Wd / 2, counts[1], title)}
  for i, r in ipairs(rows) do
    local ox, oy = 10 + ((i - 1) % COLS) * PW, 40 + ((i - 1) // COLS) * PH
    local x0, y0, w, h = ox + L, oy + T, PW - L - 20, PH - T - 40
    local function px(c) return x0 + (lx > 0 and math.log(c / counts[1], 2) / lx or 0) * w end
    local function py(s) return y0 + h - (ly > 0 and (math.log(math.max(s, 1 / 64), 2) - lo) / ly or 0) * h end
    out[#out + 1] = ('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'):format(x0 + w / 2, oy + 18, r.workload)
    out[#out + 1] = ('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#ccc"/>'):format(x0, y0, w, h)
    for _, c in ipairs(counts) do
      out[#out + 1] = ('<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>'):format(px(c), y0 + h + 14, c)
    end
    for e = math.ceil(lo), math.floor(lo + ly) do
      out[#out + 1] = ('<text x="%.1f" y="%.1f" text-anchor="end">%g</text>'):format(x0 - 4, py(2 ^ e) + 4, 2 ^ e)
    end
    out[#out + 1] = ('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="4,3"/>')
      :format(px(counts[1]), py(1), px(counts[#counts]), py(maxc))
    for _, side in ipairs(SIDES) do
      local pts = {}
      for _, p in ipairs(r.points) do
        local s = p[side.key .. "_speedup"]
        if s then pts[#pts + 1] = ("%.1f,%.1f"):format(px(p.threads), py(s)) end
      end
      if #pts > 1 then
        out[#out + 1] = ('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>'):format(table.concat(pts, " "), side.color)
      end
    end
  end
  for k, side in ipairs(SIDES) do
    local x = Wd / 2 - 150 + (k - 1) * 110
    out[#out + 1] = ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s</text>')
      :format(x, H - 14, x + 24, H - 14, side.color, x + 30, H - 10, side.label)
  end
  out[#out + 1] = "</svg>\n"
  return table.concat(out, "\n")
end

-- o: selected (workloads), counts (thread counts), rounds, out (directory),
-- set_threads(n) and measure_round(w, ref_first) from run.lua, have_torch
function S.run(o)
  local work = {}
  for _, w in ipairs(o.selected) do
    if w.kind ~= "startup" and w.metric ~= "rss" then work[#work + 1] = w end
  end
  local ms = {} -- ms[name][threads] = {needle = , torch = , cblas = }
  local t_start = nd.clock()
  for _, n in ipairs(o.counts) do
    o.set_threads(n)
    for _, w in ipairs(work) do
      local got = {needle = {}, torch = {}, cblas = {}}
      for k = 1, o.rounds do
        local mine, theirs, cblas = o.measure_round(w, k % 2 == 0)
        got.needle[k], got.torch[k], got.cblas[k] = mine.ms, theirs and theirs.ms, cblas and cblas.ms
      end
      ms[w.name] = ms[w.name] or {}
      ms[w.name][n] = {needle = median(got.needle), torch = median(got.torch), cblas = median(got.cblas)}
      io.stderr:write(("%d threads %-22s needle %s ms, PyTorch %s ms\n"):format(n, w.name,
        fmt(ms[w.name][n].needle), fmt(ms[w.name][n].torch)))
    end
  end

  local first = o.counts[1]
  local rows = {}
  print(("needle-lua thread scaling  %s  %d CPUs, GEMM %s, %s round(s), threads %s"):format(
    os.date("!%Y-%m-%dT%H:%M:%SZ"), nd.threads().cpus, nd.devices()[1].gemm, o.rounds,
    table.concat(o.counts, ",")))
  local header = ("%-24s %7s %11s %8s %11s %8s %11s %8s %9s"):format("workload", "threads", "needle ms", "speed-up",
    "PyTorch ms", "speed-up", "cblas ms", "speed-up", "n/PyTorch")
  print(header)
  print(("-"):rep(#header))
  for _, w in ipairs(work) do
    local base = ms[w.name][first]
    local row = {workload = w.name, points = json.array({})}
    for _, n in ipairs(o.counts) do
      local m = ms[w.name][n]
      local p = {threads = n, needle_ms = m.needle, torch_ms = m.torch, cblas_ms = m.cblas}
      for _, side in ipairs(SIDES) do
        local b, v = base[side.key], m[side.key]
        if b and v and v > 0 then p[side.key .. "_speedup"] = b / v end
      end
      if m.needle and m.torch then p.ratio = m.needle / m.torch end
      row.points[#row.points + 1] = p
      print(("%-24s %7d %11s %8s %11s %8s %11s %8s %9s"):format(n == first and w.name or "", n,
        fmt(m.needle), fmt(p.needle_speedup, "%.2fx"), fmt(m.torch), fmt(p.torch_speedup, "%.2fx"),
        fmt(m.cblas), fmt(p.cblas_speedup, "%.2fx"), fmt(p.ratio)))
    end
    rows[#rows + 1] = row
  end
  print(("speed-up = time at %d thread(s) / time at N; n/PyTorch = needle / PyTorch at N; %.0f s")
    :format(first, nd.clock() - t_start))

  os.execute("mkdir -p '" .. o.out:gsub("'", "'\\''") .. "'")
  local function write(name, text)
    local f = assert(io.open(o.out .. "/" .. name, "w"))
    f:write(text)
    f:close()
  end
  write("scaling.json", json.encode({date = os.date("!%Y-%m-%dT%H:%M:%SZ"), cpus = nd.threads().cpus,
    gemm = nd.devices()[1].gemm, counts = json.array(o.counts), rounds = o.rounds, rows = json.array(rows)}) .. "\n")
  write("scaling.svg", svg(rows, o.counts, os.date("!%Y-%m-%d")))
  print(("wrote %s/scaling.json, scaling.svg"):format(o.out))
end

return S
