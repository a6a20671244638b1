-- The needle-lua executable as a command-line tool: options, the `arg`
-- table, stdin scripts, exit status and error reports (as the stock lua),
-- and finding the needle package from any working directory.
--
-- The executable is $NEEDLE_LUA, else build/needle-lua under the repository.

local S = require "spec.helpers.shell"
local q, shell_line, read_file, write_file = S.q, S.shell_line, S.read_file, S.write_file

local exe = S.needle_lua()

local function tmpdir()
  return shell_line("mktemp -d")
end

-- Runs needle-lua with `args` (already shell-quoted) and returns
-- {out=, err=, code=}. opts: stdin (text), cwd, env (a "K=V ..." prefix).
-- stdin is never the terminal, and `timeout` bounds every run.
local function run(args, opts)
  opts = opts or {}
  local out, err, input = os.tmpname(), os.tmpname(), os.tmpname()
  write_file(input, opts.stdin or "")
  local cmd = string.format("%senv -u LUA_INIT -u LUA_INIT_5_4 %s timeout -k 5 30 %s %s <%s >%s 2>%s",
    opts.cwd and ("cd " .. q(opts.cwd) .. " && ") or "", opts.env or "",
    q(exe), args, q(input), q(out), q(err))
  local _, how, code = os.execute(cmd)
  local r = {out = read_file(out), err = read_file(err),
             code = how == "exit" and code or 128 + code, cmd = cmd}
  os.remove(out); os.remove(err); os.remove(input)
  return r
end

local function show(r)
  return ("command: %s\nexit: %d\nstdout:\n%s\nstderr:\n%s"):format(r.cmd, r.code, r.out, r.err)
end

describe("needle-lua command line", function()
  local dir

  setup(function()
    local f = io.open(exe, "rb")
    assert(f, "needle-lua not found at " .. exe ..
      " (build it with cmake --build build, or set NEEDLE_LUA)")
    f:close()
    dir = tmpdir()
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  it("-v prints the needle-lua and Lua versions", function()
    local r = run("-v")
    assert.equal(0, r.code, show(r))
    assert.matches("^needle%-lua %d+%.%d+", r.out, 1, false, show(r))
    assert.matches("Lua 5%.4", r.out, 1, false, show(r))
  end)

  it("-h and --help print usage to stdout and succeed", function()
    for _, opt in ipairs { "-h", "--help" } do
      local r = run(opt)
      assert.equal(0, r.code, show(r))
      assert.matches("usage: needle%-lua %[options%] %[script %[args%]%]", r.out, 1, false, show(r))
      for _, o in ipairs { "-e stat", "-l mod", "-i", "-v", "-E", "-W", "--", "-  " } do
        assert.truthy(r.out:find(o, 1, true), "usage lacks " .. o .. "\n" .. show(r))
      end
    end
  end)

  it("rejects a bad option with usage on stderr and status 1", function()
    local r = run("-x")
    assert.equal(1, r.code, show(r))
    assert.matches("needle%-lua: unrecognized option '%-x'", r.err, 1, false, show(r))
    assert.matches("usage:", r.err, 1, false, show(r))
    r = run("--bogus")
    assert.equal(1, r.code, show(r))
    r = run("-e")
    assert.equal(1, r.code, show(r))
    assert.matches("needle%-lua: '%-e' needs argument", r.err, 1, false, show(r))
  end)

  it("-e runs code, in order, and can be repeated", function()
    local r = run("-e 'x = 20' -e 'print(x + 22)'")
    assert.equal(0, r.code, show(r))
    assert.equal("42\n", r.out)
    r = run("-e'print(7)'") -- argument glued to the option
    assert.equal("7\n", r.out, show(r))
  end)

  it("-e has the needle package as the global nd", function()
    local r = run([[-e 'print(type(nd), nd == require "needle")']])
    assert.equal(0, r.code, show(r))
    assert.equal("table\ttrue\n", r.out, show(r))
    r = run([[-e 'print(nd.zeros({2}):numel())']])
    assert.equal("2\n", r.out, show(r))
  end)

  it("-l mod and -l g=mod require a module into a global", function()
    write_file(dir .. "/mymod.lua", "return { answer = 42 }")
    local env = "LUA_PATH=" .. q(dir .. "/?.lua;;")
    local r = run("-l mymod -e 'print(mymod.answer)'", {env = env})
    assert.equal("42\n", r.out, show(r))
    r = run("-l m=mymod -e 'print(m.answer, mymod)'", {env = env})
    assert.equal("42\tnil\n", r.out, show(r))
  end)

  it("runs a script with arg and ... as lua does", function()
    local script = dir .. "/args.lua"
    write_file(script, [[
print(select("#", ...), ...)
for i = -3, #arg do print(i, arg[i]) end
]])
    local r = run("-e 'x=1' " .. q(script) .. " a 'b c'")
    assert.equal(0, r.code, show(r))
    assert.equal(table.concat({
      "2\ta\tb c",
      "-3\t" .. exe,
      "-2\t-e",
      "-1\tx=1",
      "0\t" .. script,
      "1\ta",
      "2\tb c",
    }, "\n") .. "\n", r.out, show(r))
  end)

  it("does not make nd a global for plain scripts", function()
    local script = dir .. "/plain.lua"
    write_file(script, "print(nd, package.loaded.needle)")
    local r = run(q(script))
    assert.equal(0, r.code, show(r))
    assert.equal("nil\tnil\n", r.out, show(r))
  end)

  it("without a script, arg[0] is the interpreter", function()
    local r = run("-e 'print(arg[0] == arg[-0], #arg, arg[1], arg[2])'")
    assert.equal("true\t2\t-e\tprint(arg[0] == arg[-0], #arg, arg[1], arg[2])\n", r.out, show(r))
  end)

  it("-- stops option handling", function()
    local script = dir .. "/opts.lua"
    write_file(script, "print(...)")
    local r = run("-- " .. q(script) .. " -e -v")
    assert.equal(0, r.code, show(r))
    assert.equal("-e\t-v\n", r.out, show(r))
  end)

  it("- runs the script from stdin, with arguments", function()
    local r = run("- a b", {stdin = "print(arg[0], ...)"})
    assert.equal(0, r.code, show(r))
    assert.equal("-\ta\tb\n", r.out, show(r))
  end)

  it("runs stdin as a script when it is not a terminal", function()
    local r = run("", {stdin = "print(1 + 1, nd)\n"})
    assert.equal(0, r.code, show(r))
    assert.equal("2\tnil\n", r.out, show(r)) -- no banner, no REPL, no nd
  end)

  it("-i runs the REPL after the script, with nd, reading stdin", function()
    local script = dir .. "/setup.lua"
    write_file(script, "answer = 41")
    local r = run("-i " .. q(script), {stdin = "answer + 1\nprint(nd ~= nil)\n"})
    assert.equal(0, r.code, show(r))
    assert.matches("^needle%-lua ", r.out, 1, false, show(r))
    assert.truthy(r.out:find("\n> 42\n> true\n> \n", 1, true), show(r))
  end)

  it("reports a runtime error with traceback and status 1", function()
    local r = run([[-e 'error("boom")']])
    assert.equal(1, r.code, show(r))
    assert.matches("^needle%-lua: %(command line%):1: boom\n", r.err, 1, false, show(r))
    assert.matches("stack traceback:", r.err, 1, false, show(r))

    local script = dir .. "/fail.lua"
    write_file(script, "local function f() error('deep') end\nf()\n")
    r = run(q(script))
    assert.equal(1, r.code, show(r))
    assert.truthy(r.err:find("needle-lua: " .. script .. ":1: deep", 1, true), show(r))
    assert.matches("in local 'f'", r.err, 1, false, show(r))
  end)

  it("reports error objects that are not strings", function()
    local r = run([[-e 'error(setmetatable({}, {__tostring = function() return "custom" end}))']])
    assert.equal(1, r.code, show(r))
    assert.equal("needle-lua: custom\n", r.err, show(r))
    r = run([[-e 'error({})']])
    assert.matches("^needle%-lua: %(error object is a table value%)", r.err, 1, false, show(r))
  end)

  it("reports syntax errors and missing scripts with status 1", function()
    local script = dir .. "/syntax.lua"
    write_file(script, "x = = 1\n")
    local r = run(q(script))
    assert.equal(1, r.code, show(r))
    assert.truthy(r.err:find("needle-lua: " .. script .. ":1:", 1, true), show(r))
    r = run(q(dir .. "/does-not-exist.lua"))
    assert.equal(1, r.code, show(r))
    assert.matches("needle%-lua: cannot open ", r.err, 1, false, show(r))
  end)

  it("passes os.exit status through", function()
    assert.equal(3, run("-e 'os.exit(3)'").code)
    assert.equal(0, run("-e 'os.exit(true)'").code)
    assert.equal(1, run("-e 'os.exit(false)'").code)
  end)

  it("stops at the first failing -e and runs no script", function()
    local script = dir .. "/never.lua"
    write_file(script, "print('ran')")
    local r = run("-e 'error(1)' -e 'print(2)' " .. q(script))
    assert.equal(1, r.code, show(r))
    assert.equal("", r.out, show(r))
  end)

  it("runs LUA_INIT_5_4, else LUA_INIT, unless -E", function()
    local r = run("-e 'print(x)'", {env = "LUA_INIT='x = 1'"})
    assert.equal("1\n", r.out, show(r))
    r = run("-e 'print(x)'", {env = "LUA_INIT='x = 1' LUA_INIT_5_4='x = 2'"})
    assert.equal("2\n", r.out, show(r))
    write_file(dir .. "/init.lua", "x = 3")
    r = run("-e 'print(x)'", {env = "LUA_INIT=@" .. q(dir .. "/init.lua")})
    assert.equal("3\n", r.out, show(r))
    r = run("-E -e 'print(x)'", {env = "LUA_INIT='x = 1'"})
    assert.equal("nil\n", r.out, show(r))
  end)

  it("keeps LUA_PATH after its own package directories; -E ignores LUA_PATH", function()
    local r = run("-e 'print(package.path)'", {env = "LUA_PATH='/nowhere/?.lua'"})
    assert.matches("/lua/%?%.lua;", r.out, 1, false, show(r))
    assert.matches("/share/lua/5%.4/%?/init%.lua;/nowhere/%?%.lua\n$", r.out, 1, false, show(r))
    r = run("-E -e 'print(package.path)'", {env = "LUA_PATH='/nowhere/?.lua'"})
    assert.falsy(r.out:find("/nowhere/", 1, true), show(r))
  end)

  it("-W turns warnings on", function()
    local r = run([[-W -e 'warn("careful")']])
    assert.equal(0, r.code, show(r))
    assert.matches("Lua warning: careful", r.err, 1, false, show(r))
    r = run([[-e 'warn("careful")']])
    assert.equal("", r.err, show(r))
  end)

  it("finds the needle package from another working directory", function()
    local script = dir .. "/use_needle.lua"
    write_file(script, [[
local nd = require "needle"
print(type(nd), nd.zeros({3}):numel())
]])
    local r = run(q(script), {cwd = "/"})
    assert.equal(0, r.code, show(r))
    assert.equal("table\t3\n", r.out, show(r))
    r = run([[-e 'print(require("needle") == nd)']], {cwd = dir})
    assert.equal("true\n", r.out, show(r))
  end)

  it("warns but still starts the REPL when the package cannot load", function()
    local r = run("-i", {
      env = [[LUA_INIT='package.preload.needle = function() error("broken package") end']],
      stdin = "1 + 1\n",
    })
    assert.equal(0, r.code, show(r))
    assert.matches("warning", r.err, 1, false, show(r))
    assert.matches("broken package", r.err, 1, false, show(r))
    assert.truthy(r.out:find("> 2\n", 1, true), show(r))
  end)
end)

describe("needle.cli's helpers for the model scripts", function()
  local cli = require "needle.cli"
  it("split_args: options with values, flags and positional words in any order", function()
    local words, pos = cli.split_args({"a.png", "--weights", "w.pt", "--cased", "b.png", "--top", "3", "c d"},
                                      {weights = true, top = true})
    assert.are.same({"--weights", "w.pt", "--cased", "--top", "3"}, words)
    assert.are.same({"a.png", "b.png", "c d"}, pos)
  end)
  it("message: an error without its position", function()
    assert.are.equal("needle.x: bad", cli.message("scripts/a.lua:12: needle.x: bad"))
    assert.are.equal("no position here", cli.message("no position here"))
  end)
end)
