-- nd.log (spec/log_spec.lua has the rest of its errors)
return function(nd)
  local function with_logger(fn)
    local dir = os.tmpname()
    os.remove(dir)
    local log = nd.log.open(dir, {tensorboard = false})
    local ok, e = pcall(fn, log)
    log:close()
    os.execute("rm -rf '" .. dir .. "'")
    if not ok then error(e, 0) end
  end
  return {rest = {
    {"log.open", "csv, jsonl, resume, tensorboard", function(o)
      if next(o) == nil then return end -- writes files
      return nd.log.open("/nonexistent/log", o)
    end},
    {"log.scalar", "wall_time", function(o) with_logger(function(l) l:scalar("x", 1, 1, o) end) end},
    {"log.scalars", "wall_time", function(o) with_logger(function(l) l:scalars({x = 1}, 1, o) end) end},
    {"log.histogram", "bins, wall_time", function(o) with_logger(function(l) l:histogram("x", {1}, 1, o) end) end},
    {"plot.lines", "hlines, series, title, xlabel, ylabel, ylog", function(o)
      if next(o) == nil then return end -- writes a file
      return nd.plot.lines("/nonexistent/plot", o)
    end},
  }}
end
