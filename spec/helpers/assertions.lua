-- spec/helpers/assertions.lua - error-message checks shared by the specs.
--
--   local A = require("spec.helpers.assertions").bind(assert)
--   local errmsg, assert_contains = A.errmsg, A.assert_contains
--
--   errmsg(fn, ...)                -- calls fn(...), which must raise; returns
--                                  -- the error message as a string
--   assert_contains(msg, fragment) -- msg contains fragment (plain text)
--
-- bind takes the spec's busted `assert` (a required module sees the global
-- environment, not the one busted gives spec files), as R.asserts does in
-- spec/helpers/reference.lua.

local M = {}

function M.bind(assert)
  local H = {}

  function H.errmsg(fn, ...)
    local ok, msg = pcall(fn, ...)
    assert.is_false(ok, "expected an error")
    return tostring(msg)
  end

  function H.assert_contains(msg, fragment)
    assert(string.find(msg, fragment, 1, true),
      ("expected message to contain %q, got %q"):format(fragment, msg))
  end

  return H
end

return M
