-- spec/dist/report.lua - what the mpirun workers in spec/dist/ share: one
-- line per check ("ok <name>" from rank 0, "FAIL <name> (rank r): <why>"
-- from any rank) and a last line "<title>: N checks, N failed (rank r)"
-- that spec/distributed_spec.lua reads.
--
--   local report = require("spec.dist.report").new(rank)
--   report.check(name, ok, why)
--   report.finish(title) -> true when nothing failed
local M = {}

function M.new(rank)
  local r = {checks = 0, failed = 0}
  function r.check(name, ok, why)
    r.checks = r.checks + 1
    if ok then
      if rank == 0 then print("ok " .. name) end
    else
      r.failed = r.failed + 1
      print(("FAIL %s (rank %d): %s"):format(name, rank, tostring(why)))
    end
  end
  function r.finish(title)
    print(("%s: %d checks, %d failed (rank %d)"):format(title, r.checks, r.failed, rank))
    return r.failed == 0
  end
  return r
end

return M
