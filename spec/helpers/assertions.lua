-- spec/helpers/assertions.lua - error-message checks shared by the specs.
--
--   local A = require("spec.helpers.assertions").bind(assert)
--   local errmsg, assert_contains = A.errmsg, A.assert_contains
--
--   errmsg(fn, ...)                -- calls fn(...), which must raise; returns
--                                  -- the error message as a string
--   err_of(fn)                     -- the same, returning the error value as raised
--   assert_contains(msg, fragment) -- msg contains fragment (plain text)
--   has(msg, fragment)             -- the same, failing with msg itself as the message
--
-- bind takes the spec's busted `assert` (a required module sees the global
-- environment, not the one busted gives spec files), as R.asserts does in
-- spec/helpers/reference.lua.

local M = {}

function M.bind(assert)
  local H = {}

  function H.err_of(fn, ...)
    local ok, e = pcall(fn, ...)
    assert.is_false(ok, "expected an error")
    return e
  end

  function H.errmsg(fn, ...)
    return tostring(H.err_of(fn, ...))
  end

  function H.assert_contains(msg, fragment)
    assert(string.find(msg, fragment, 1, true),
      ("expected message to contain %q, got %q"):format(fragment, msg))
  end

  function H.has(msg, fragment)
    assert.truthy(msg:find(fragment, 1, true), msg)
  end

  return H
end

return M
