-- The needle-lua REPL, driven through a pseudo-terminal as a person would use
-- it: auto-printing, multi-line input, errors, Ctrl-C, history and tab
-- completion (readline only runs on a terminal, so pipes cannot test this).
--
-- The executable is $NEEDLE_LUA, else build/needle-lua under the repository.
-- The pty driver is $NEEDLE_PTYDRIVE, else ptydrive next to the executable,
-- else it is compiled here from spec/tools/ptydrive.c.
-- Every step of a session is bounded by ptydrive's timeout: nothing hangs.

local S = require "spec.helpers.shell"
local q, shell_line, read_file, write_file, exists =
  S.q, S.shell_line, S.read_file, S.write_file, S.exists

local exe, root = S.needle_lua()

-- Steps for ptydrive. Text is plain Lua text; escapes are added here.
local function escape(s)
  return (s:gsub("[%c\\]", function(c)
    if c == "\\" then return "\\\\" end
    return ("\\x%02x"):format(c:byte())
  end))
end
local function send(text) return "send " .. escape(text) end
local function expect(text) return "expect " .. escape(text) end
local function sleep(ms) return "sleep " .. ms end
local CTRL_C, CTRL_D, CTRL_P, CTRL_U = "\3", "\4", "\16", "\21"

-- Types `input` and waits for the line `output` and the next prompt. (One
-- string of three steps: in a table constructor only a last call expands to
-- several values.)
local function eval(input, output)
  return table.concat({send(input .. "\n"), expect("\n" .. output .. "\r\n"), expect("> ")}, "\n")
end

describe("needle-lua REPL", function()
  local ptydrive, dir

  setup(function()
    assert(exists(exe), "needle-lua not found at " .. exe ..
      " (build it with cmake --build build, or set NEEDLE_LUA)")
    dir = shell_line("mktemp -d")
    ptydrive = os.getenv("NEEDLE_PTYDRIVE") or exe:gsub("[^/]*$", "ptydrive")
    if not exists(ptydrive) then -- not built by CMake (yet): build it here
      ptydrive = dir .. "/ptydrive"
      local ok = os.execute(("cc -std=c11 -O2 -o %s %s -lutil"):format(
        q(ptydrive), q(root .. "/spec/tools/ptydrive.c")))
      assert(ok, "could not build spec/tools/ptydrive.c")
    end
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  -- Runs one REPL session. opts: args (shell-quoted), env (a "K=V ..."
  -- prefix), history (contents of the history file before the session).
  -- Returns {out = transcript with \r\n as \n, code =, history =}.
  local function session(steps, opts)
    opts = opts or {}
    local steps_file, out = dir .. "/steps", dir .. "/out"
    local history = dir .. "/history"
    os.remove(history)
    if opts.history then write_file(history, opts.history) end
    write_file(steps_file, table.concat(steps, "\n") .. "\n")
    local env = opts.env or ("NEEDLE_HISTORY=" .. q(history))
    local cmd = ("cd %s && env -u LUA_INIT -u LUA_INIT_5_4 %s TERM=dumb INPUTRC=/dev/null %s -t 10 -- %s %s <%s >%s 2>&1")
      :format(q(dir), env, q(ptydrive), q(exe), opts.args or "", q(steps_file), q(out))
    local _, how, code = os.execute(cmd)
    return {
      out = (read_file(out) or ""):gsub("\r\n", "\n"),
      code = how == "exit" and code or 128 + code,
      history = read_file(history),
    }
  end

  local function show(r)
    return ("exit: %d\ntranscript:\n%s"):format(r.code, r.out)
  end

  it("prints a banner, auto-prints expressions and exits on Ctrl-D", function()
    local r = session {
      expect("> "),
      eval("1+1", "2"),
      eval([[1, "a", nil]], "1\ta\tnil"),
      eval("=2*3", "6"),
      send("x = 5\n"), expect("> "), -- a statement prints nothing
      eval("x", "5"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
    assert.matches("^needle%-lua %d+%.%d+[^\n]*Lua 5%.4", r.out, 1, false, show(r))
    assert.truthy(r.out:find("> x = 5\n> x\n5\n", 1, true), show(r))
  end)

  it("continues incomplete input with the >> prompt", function()
    local r = session {
      expect("> "),
      send("function f()\n"), expect(">> "),
      send("return 3\n"), expect(">> "),
      send("end\n"), expect("> "),
      eval("f()", "3"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("shows errors with a traceback and keeps going", function()
    local r = session {
      expect("> "),
      send([[error("oops")]] .. "\n"), expect("stdin:1: oops"), expect("stack traceback:"),
      expect("> "),
      send("x = = 1\n"), expect("unexpected symbol"), expect("> "),
      eval("1+1", "2"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("has nd preloaded and pretty-prints tensors", function()
    local r = session {
      expect("> "),
      eval("nd == require 'needle'", "true"),
      send("nd.zeros({2})\n"), expect("> "),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
    local printed = r.out:match("> nd%.zeros%({2}%)\n(.-)\n> ")
    assert.truthy(printed, show(r))
    assert.falsy(printed:find("^userdata"), show(r))
  end)

  it("Ctrl-C interrupts a running chunk without leaving the REPL", function()
    local r = session {
      expect("> "),
      -- Ctrl-C once the loop surely runs (the text shows only in the output)
      send("print('run' .. 'ning') while true do end\n"), expect("running\r\n"),
      sleep(100), send(CTRL_C), expect("interrupted!"), expect("> "),
      eval("1+1", "2"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("Ctrl-C at the prompt discards the input, even a multi-line chunk", function()
    local r = session {
      expect("> "),
      send("function g()\n"), expect(">> "),
      send("return 1"), send(CTRL_C), expect("> "),
      eval("g", "nil"),
      send("1 +"), send(CTRL_C), expect("> "),
      eval("2", "2"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("keeps history in $NEEDLE_HISTORY across sessions", function()
    local r = session({
      expect("> "),
      send(CTRL_P .. "\n"), expect("\n42\r\n"), expect("> "), -- recalls 40+2
      send("x = 1\n"), expect("> "),
      eval("1+1", "2"),
      send(CTRL_D),
    }, {history = "40+2\n"})
    assert.equal(0, r.code, show(r))
    assert.truthy(r.history, "no history file written")
    assert.truthy(r.history:find("40+2\n", 1, true), r.history)
    assert.truthy(r.history:find("1+1\n", 1, true), r.history)
  end)

  it("writes ~/.needle_history by default, and nothing without HOME", function()
    local home = dir .. "/home"
    os.execute("mkdir -p " .. q(home))
    local steps = {expect("> "), eval("1+1", "2"), send(CTRL_D)}
    local r = session(steps, {env = "-u NEEDLE_HISTORY HOME=" .. q(home)})
    assert.equal(0, r.code, show(r))
    assert.equal("1+1\n", read_file(home .. "/.needle_history"))
    r = session(steps, {env = "-u NEEDLE_HISTORY -u HOME"})
    assert.equal(0, r.code, show(r))
    assert.falsy(exists(dir .. "/.needle_history"))
  end)

  it("completes global names and fields of tables", function()
    local r = session {
      expect("> "),
      send("string.fo\t"), expect("string.format"),
      eval([[("%d", 42)]], "42"),
      send("stri\t"), expect("string."), send(CTRL_U), -- a table gets "."
      send("t = {alpha = 1}; setmetatable(t, {__index = {beta = 2}})\n"), expect("> "),
      send("t.be\t"), expect("t.beta"), -- through __index tables
      eval("", "2"),
      send("s = 'abc'\n"), expect("> "),
      send("s:up\t"), expect("s:upper("), -- ':' appends '(' to functions
      eval(")", "ABC"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("completes tensor methods", function()
    local r = session {
      expect("> "),
      send("x = nd.zeros({2})\n"), expect("> "),
      send("x:nu\t"), expect("x:numel("),
      eval(")", "2"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("prints tables as tables and modules as their tree", function()
    local r = session {
      expect("> "),
      eval("nd.zeros({3, 4}).shape", "{3, 4}"),
      eval("{b = 1, a = {1, 2}, 'first'}", [[{"first", a = {1, 2}, b = 1}]]),
      eval("{}", "{}"),
      eval("t = {}; t.self = t; return t", "{self = <cycle>}"),
      send("nd.nn.Sequential(nd.nn.Linear(2, 3))\n"),
      expect("Sequential(\r\n  (0): Linear(in_features=2, out_features=3, bias=true)\r\n)\r\n"),
      expect("> "),
      eval("'a string', 2", "a string\t2"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("?name prints the documentation", function()
    local r = session {
      expect("> "),
      send("?nd.F.gelu\n"), expect('nd.F.gelu(x, {approximate = "none" | "tanh"})\r\n'),
      expect("(docs/nn-functional.md:"), expect("> "),
      send("x = nd.zeros({2})\n"), expect("> "),
      send("?x:reshape\n"), expect("x:reshape\r\n"), expect("(docs/tensor.md:"), expect("> "),
      send("?nd.nn.Linear\n"), expect("nd.nn.Linear(in, out, {bias})\r\n"), expect("> "),
      send("?nd.F.qqqq\n"), expect("no documentation for nd.F.qqqq\r\n"), expect("> "),
      send("?'\\\n"), expect("no documentation for"), expect("> "), -- quotes are never code
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
    assert.truthy(r.history:find("?nd.F.gelu\n", 1, true), r.history)
  end)

  it("raises missing names with a suggestion at the typed line", function()
    local r = session {
      expect("> "),
      send("x = nd.zeros({2})\n"), expect("> "),
      send("x:resahpe(2)\n"), expect("stdin:1: needle: no method 'resahpe' on a tensor; did you mean 'reshape'?"),
      expect("> "),
      send("x.shpae\n"), expect("stdin:1: needle: no field 'shpae' on a tensor; did you mean 'shape'?"),
      expect("> "),
      send([[My = nd.nn.Module:extend("My"); function My:forward(_) error("needle.My: bad", 2) end]] .. "\n"),
      expect("> "),
      send("\n\nnd.nn.Sequential(My())(1)\n"), expect("stdin:1: needle.My: bad\r\n"), expect("> "),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("completes lazily loaded entries without loading them", function()
    local r = session {
      expect("> "),
      eval("rawget(nd, 'optim') == nil and package.loaded['needle.nn.linear'] == nil", "true"),
      send("nd.opti\t"), expect("nd.optim."), send(CTRL_U),
      eval("rawget(nd, 'optim') == nil", "true"), -- listed, not loaded
      send("nd.nn.Li\t"), expect("nd.nn.Linear"),
      eval("(2, 3)", "Linear(in_features=2, out_features=3, bias=true)"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("completes module methods and fields, and tensor fields", function()
    local r = session {
      expect("> "),
      send("m = nd.nn.Linear(2, 3)\n"), expect("> "),
      send("m:forw\t"), expect("m:forward("), send(CTRL_U),       -- the class
      send("m:zero_g\t"), expect("m:zero_grad("), send(CTRL_U),   -- the base class
      send("m.wei\t"), expect("m.weight"),                        -- a parameter
      eval(".shape", "{3, 2}"),
      send("x = nd.zeros({2})\n"), expect("> "),
      send("x.shap\t"), expect("x.shape"),
      eval("", "{2}"),
      send("x:resh\t"), expect("x:reshape("),
      eval("{2, 1}).shape", "{2, 1}"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)

  it("never runs code while completing", function()
    local r = session {
      expect("> "),
      send("called = 0; p = setmetatable({}, {__index = function() called = called + 1 end})\n"),
      expect("> "),
      send("p.a.b\t\t\t"), sleep(200), send(CTRL_U),
      send("p:x\t\t\t"), sleep(200), send(CTRL_U),
      eval("called", "0"),
      send(CTRL_D),
    }
    assert.equal(0, r.code, show(r))
  end)
end)

-- How the REPL shows values (needle.pretty), without a terminal.
describe("needle.pretty", function()
  local nd = require "needle"
  local P = require "needle.pretty"

  it("shows a shape and flat tables on one line, keys sorted", function()
    assert.are.equal("{3, 4}", P.format(nd.zeros({3, 4}).shape))
    assert.are.equal("{}", P.format({}))
    assert.are.equal([[{"a", [2.5] = 2, [3] = true, ["a b"] = 1, betas = {0.9, 0.999}, lr = 0.001}]],
      P.format({"a", lr = 0.001, betas = {0.9, 0.999}, [3] = true, ["a b"] = 1, [2.5] = 2}))
    assert.are.equal([[{["end"] = 0, f = false}]], P.format({f = false, ["end"] = 0})) -- a keyword is quoted
    assert.are.equal([[{"line\nbreak", "q\"uote"}]], P.format({"line\nbreak", 'q"uote'}))
  end)

  it("goes multi-line past 80 columns, packs list items and stops at the limits", function()
    local long = {}
    for i = 1, 100 do long[i] = i end
    local text = P.format(long)
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal("{", lines[1])
    assert.are.equal("  ... (60 more)", lines[#lines - 1])
    assert.are.equal("}", lines[#lines])
    for _, l in ipairs(lines) do assert.is_true(#l <= 80, l) end
    assert.truthy(text:find("\n  1, 2, 3, ", 1, true), text)
    assert.truthy(text:find(" 40,\n", 1, true), text)
    assert.are.equal("{a = {b = {c = {...}}}}", P.format({a = {b = {c = {d = 1}}}}))
    local t = {}
    t.self = t
    assert.are.equal("{self = <cycle>}", P.format(t))
  end)

  it("keeps tensors and modules as tostring shows them, aligned under their key", function()
    local x = nd.tensor({{1, 2}, {3, 4}})
    assert.are.equal(tostring(x), P.format(x))
    local m = nd.nn.Sequential(nd.nn.Linear(2, 3))
    assert.are.equal(tostring(m), P.format(m))
    local lines = {}
    for l in tostring(x):gmatch("[^\n]+") do lines[#lines + 1] = l end
    local want = "{\n  weight = " .. lines[1] .. "\n" .. ("  weight = "):gsub(".", " ") .. lines[2] .. ",\n}"
    assert.are.equal(want, P.format({weight = x}))
  end)

  it("never fails on a __tostring that raises", function()
    local bad = setmetatable({}, {__tostring = function() error("boom") end})
    assert.truthy(P.format(bad):find("__tostring failed", 1, true))
    assert.truthy(P.format({bad}):find("__tostring failed", 1, true))
  end)
end)
