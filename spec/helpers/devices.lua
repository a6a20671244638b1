-- spec/helpers/devices.lua - the devices the specs run on.
--
--   local D = require "spec.helpers.devices"
--   D.all()                    -- {"cpu", "opencl:0", ...}: the cpu, then every OpenCL device
--   D.opencl()                 -- {"opencl:0", ...} (empty without OpenCL)
--   D.available, D.reason      -- nd.opencl_available()'s answer
--   D.info(dev)                -- the nd.devices() entry of "opencl:N" (nil for the cpu)
--   D.fp64(dev)                -- whether dev computes in float64 (the cpu always does)
--   D.hide_opencl_env()        -- env assignments (for a shell command line) under which a
--                              -- child process finds no OpenCL driver; nil (and why) when
--                              -- that cannot be arranged here (probed once in a child)
--   D.pending_without_opencl(pending, what)
--       -- without OpenCL, registers one visible pending line ("<what>: no OpenCL
--       -- device (<reason>)") with the spec's busted `pending` and returns true;
--       -- with OpenCL returns false. Specs call it at describe level:
--       --   if D.pending_without_opencl(pending, "OpenCL ops") then return end
--
-- NEEDLE_SPEC_DEVICES (a comma-separated list, e.g. "opencl:1") restricts the
-- OpenCL devices tested; NEEDLE_SPEC_DEVICES=cpu tests none (their specs then
-- show as pending with that reason).
local nd = require "needle"

local D = {}

D.available, D.reason = nd.opencl_available()

local infos, names = {}, {}
if D.available then
  for i, d in ipairs(nd.devices()) do
    if i > 1 and d.type == "opencl" then
      infos[d.name] = d
      names[#names + 1] = d.name
    end
  end
end

local only = os.getenv("NEEDLE_SPEC_DEVICES")
if only and only ~= "" and D.available then
  local keep, want = {}, {}
  for n in only:gmatch("[^,%s]+") do want[n] = true end
  for _, n in ipairs(names) do
    if want[n] then keep[#keep + 1] = n end
  end
  names = keep
  if #names == 0 then
    D.available, D.reason = false, ("NEEDLE_SPEC_DEVICES=%s selects no OpenCL device"):format(only)
  end
end

function D.opencl()
  local out = {}
  for i, n in ipairs(names) do out[i] = n end
  return out
end

function D.all()
  local out = {"cpu"}
  for _, n in ipairs(names) do out[#out + 1] = n end
  return out
end

function D.info(dev) return infos[dev] end

function D.fp64(dev)
  if dev == "cpu" then return true end
  local i = infos[dev]
  return i ~= nil and i.fp64 == true
end

-- a short description for test names: "opencl:0 (pthread-haswell-..., POCL)"
function D.describe(dev)
  local i = infos[dev]
  if not i then return dev end
  return ("%s (%s)"):format(dev, i.device)
end

local hide_env, hide_why
function D.hide_opencl_env()
  if hide_env ~= nil or hide_why ~= nil then return hide_env, hide_why end
  local S = require "spec.helpers.shell"
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. S.q(dir))
  -- an empty vendor directory hides every ICD from the ocl-icd and Khronos loaders
  local env = ("OCL_ICD_VENDORS=%s OCL_ICD_FILENAMES= OPENCL_VENDOR_PATH=%s"):format(S.q(dir), S.q(dir))
  local exe = S.needle_lua()
  local line = S.shell_line(("env %s %s -e %s 2>&1"):format(env, S.q(exe),
    S.q("print(tostring((nd.opencl_available())))")))
  if line == "false" then
    hide_env = env
  else
    hide_why = ("cannot hide the OpenCL driver from a child process (OCL_ICD_VENDORS): it printed %s"):format(
      tostring(line))
  end
  return hide_env, hide_why
end

function D.pending_without_opencl(pending, what)
  if D.available and #names > 0 then return false end
  pending(("%s: no OpenCL device (%s)"):format(what, tostring(D.reason)))
  return true
end

return D
