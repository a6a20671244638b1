-- docs_spec.lua - the documentation's relative links lead somewhere (issue 15:
-- docs/tensor.md and docs/convert.md pointed at ../shared/API.md, which is
-- not in the repository).
--
--   build/needle-lua spec/run.lua spec/docs_spec.lua
--
-- Every relative link target in README.md, docs/*.md and examples/*/README.md
-- ([text](path), [text](path#anchor)) and every code span that names a
-- Markdown file (`../x/API.md`) must name a file or directory that exists,
-- relative to the page (or, for a code span, to the repository root).

local S = require "spec.helpers.shell"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function dir_of(path) return path:match("^(.*)/[^/]*$") or "." end

-- rel resolved against dir (both relative to the repository root); nil when
-- it climbs out of the repository (a file there is not part of it)
local function resolve(dir, rel)
  local parts = {}
  for p in (dir .. "/" .. rel):gmatch("[^/]+") do
    if p == ".." then
      if #parts == 0 then return nil end
      parts[#parts] = nil
    elseif p ~= "." then
      parts[#parts + 1] = p
    end
  end
  return #parts == 0 and "." or table.concat(parts, "/")
end

local function exists_in_repo(dir, rel)
  local path = resolve(dir, rel)
  return path ~= nil and exists(path)
end

local function pages()
  local list = {"README.md"}
  for _, pattern in ipairs({"docs/*.md", "examples/*/README.md"}) do
    local out = S.shell_line("ls " .. pattern .. " 2>/dev/null | tr '\\n' ' '") or ""
    for p in out:gmatch("%S+") do list[#list + 1] = p end
  end
  return list
end

-- the broken references of one page, as "page:line: target"
local function broken(page)
  local bad, n = {}, 0
  local fence = false
  for line in io.lines(page) do
    n = n + 1
    if line:match("^%s*```") then fence = not fence
    elseif not fence then
      for target in line:gmatch("%]%(([^)%s]+)[^)]*%)") do
        local path = target:gsub("#.*$", "")
        if path ~= "" and not target:match("^%a[%w+.-]*:") then -- not http:, mailto:, ...
          if not exists_in_repo(dir_of(page), path) then bad[#bad + 1] = ("%s:%d: %s"):format(page, n, target) end
        end
      end
      for span in line:gmatch("`([^`]+)`") do
        if span:match("^[%w_.%-/]+%.md$") and not exists_in_repo(dir_of(page), span)
           and not exists_in_repo(".", span) then
          bad[#bad + 1] = ("%s:%d: `%s`"):format(page, n, span)
        end
      end
    end
  end
  return bad
end

describe("documentation links", function()
  it("relative links and Markdown file names lead to files that exist", function()
    local all, count = {}, 0
    for _, page in ipairs(pages()) do
      count = count + 1
      for _, b in ipairs(broken(page)) do all[#all + 1] = b end
    end
    assert.is_true(count > 10, "found only " .. count .. " pages")
    assert.are.same({}, all)
  end)
end)
