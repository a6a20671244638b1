-- help_spec.lua - nd.help and the REPL's ?name (issue 20): signatures and
-- summaries read from the docs pages, the one source (docs/needle-lua.md,
-- "Help").
--
--   build/needle-lua spec/run.lua spec/help_spec.lua
--
-- The REPL side (?name typed at the prompt) is in spec/repl_spec.lua.

local nd = require "needle"
local H = require "needle.help"
local index = require "needle.help_index"

-- The names that must be documented. Each is looked up by name and, where it
-- says so, by value; the text must show the documented signature.
local CORE = {
  {"nd.zeros", "nd.zeros(shape, opts)", value = nd.zeros},
  {"nd.tensor", "nd.tensor(data, {dtype=, device=, requires_grad=})", value = nd.tensor},
  {"nd.cat", "nd.cat(list, dim)", value = nd.cat},
  {"nd.matmul", "nd.matmul"},
  {"nd.no_grad", "nd.no_grad(fn, ...)", value = nd.no_grad},
  {"nd.save", "nd.save(tensors, path[, metadata])"},
  {"nd.load", "nd.load(path)"},
  {"nd.help", "nd.help(obj_or_name)", value = nd.help},
  {"nd.F.gelu", 'nd.F.gelu(x, {approximate = "none" | "tanh"})', value = nd.F.gelu},
  {"nd.F.relu", "nd.F.relu", value = nd.F.relu},
  {"nd.F.cross_entropy", "nd.F.cross_entropy(logits (N, C), labels, {ignore_index=", value = nd.F.cross_entropy},
  {"nd.F.conv2d", "nd.F.conv2d(x, w, b, {stride=", value = nd.F.conv2d},
  {"nd.nn.Linear", "nd.nn.Linear(in, out, {bias})", value = nd.nn.Linear},
  {"nd.nn.Sequential", "nd.nn.Sequential(...)", value = nd.nn.Sequential},
  {"nd.nn.Conv2d", "nd.nn.Conv2d(in, out, k, {stride", value = nd.nn.Conv2d},
  {"nd.nn.LSTM", "nd.nn.LSTM", value = nd.nn.LSTM},
  {"nd.optim.Adam", "nd.optim.Adam", value = nd.optim.Adam},
  {"nd.optim.SGD", "nd.optim.SGD", value = nd.optim.SGD},
  {"nd.optim.AdamW", "nd.optim.AdamW", value = nd.optim.AdamW},
  {"x:reshape", "x:reshape"},
  {"x:view", "x:view"},
  {"x:sum", "x:sum"},
  {"x:matmul", "x:matmul(y)"},
  {"x:permute", "x:permute"},
  {"x:backward", "y:backward([grad]"},
  {"x.shape", "x.shape"},
  {"x.T", "x.T"},
  {"module:parameters", "module:parameters"},
  {"module:state_dict", "module:state_dict()"},
  {"module:load_state_dict", "module:load_state_dict(sd, {strict = true})"},
  {"opt:step", "opt:step([closure])"},
  {"opt:zero_grad", "opt:zero_grad("},
}

describe("nd.help", function()
  it("finds the docs pages", function()
    local dir = H.docs_dir()
    assert.truthy(dir, "no docs directory beside lua/needle")
    assert.truthy(io.open(dir .. "tensor.md"), dir)
  end)

  for _, c in ipairs(CORE) do
    it("documents " .. c[1], function()
      local text = H.text(c[1])
      assert.are.equal(c[2], text:sub(1, #c[2]), text)
      assert.truthy(text:find("\n  %(docs/[%w%-]+%.md:%d+%)$"), text) -- where the docs say it
      if c.value then assert.are.equal(text, H.text(c.value)) end
    end)
  end

  it("finds methods and classes through values", function()
    local x = nd.ones({2, 3})
    assert.truthy(H.text(x.reshape):find("^x:reshape"), H.text(x.reshape))
    local m = nd.nn.Linear(2, 3)
    assert.truthy(H.text(m):find("^nd%.nn%.Linear%(in, out, {bias}%)"), H.text(m))
    assert.truthy(H.text(m.parameters):find("^module:parameters"), H.text(m.parameters))
    local opt = nd.optim.SGD(m:parameters(), {lr = 0.1})
    assert.truthy(H.text(opt):find("^nd%.optim%.SGD"), H.text(opt))
    assert.truthy(H.text(opt.step):find("^opt:step%(%[closure%]%)"), H.text(opt.step))
    assert.truthy(H.text(nd.F):find("^nd%.F\n"), H.text(nd.F))
    assert.truthy(H.text(x):find("^a tensor %(float32, shape {2,3}, cpu%)"), H.text(x))
  end)

  it("says when a name has no documentation, and what is close", function()
    assert.are.equal("no documentation for nd.F.geluu; did you mean 'gelu'?", H.text("F.geluu"))
    assert.are.equal("no documentation for nd.F.qqqq", H.text("nd.F.qqqq"))
    assert.are.equal("no documentation for this function (not a part of needle)", H.text(print))
    local Net = nd.nn.Module:extend("Net")
    assert.are.equal("no documentation for an instance of Net (not a class of needle)", H.text(Net()))
  end)

  it("prints with nd.help and explains itself without an argument", function()
    local printed = {}
    local saved = _G.print
    _G.print = function(s) printed[#printed + 1] = s end
    local ok, e = pcall(function() nd.help("nd.F.gelu"); nd.help() end)
    _G.print = saved
    assert.is_true(ok, e)
    assert.are.equal(H.text("nd.F.gelu"), printed[1])
    assert.truthy(printed[2]:find("^nd%.help%(obj_or_name%)"), printed[2])
  end)

  it("reports how many public names lack documentation", function()
    local missing, by_area, total = {}, {}, 0
    for _, p in ipairs(H.public_names()) do
      total = total + 1
      if not H.documented(p.queries) then
        missing[#missing + 1] = p.name
        local area = p.name:match("^(nd%.%a+)%.") or p.name:match("^(%a+)[:.]") or "nd"
        by_area[area] = (by_area[area] or 0) + 1
      end
    end
    local areas = {}
    for a, n in pairs(by_area) do areas[#areas + 1] = ("%s %d"):format(a, n) end
    table.sort(areas)
    io.write(("\n[help_spec] %d of %d public names have no documentation (%s):\n  %s\n")
      :format(#missing, total, table.concat(areas, ", "), table.concat(missing, " ")))
    assert.is_true(total > 300, "public_names found only " .. total)
    -- A ratchet: a new public name must come with documentation. Lower this
    -- number whenever docs are added for names in the list above (61 of 544 when
    -- it was set); never raise it.
    local MAX_UNDOCUMENTED = 60
    assert.is_true(#missing <= MAX_UNDOCUMENTED, ("%d public names have no documentation, more than the %d allowed:\n  %s")
      :format(#missing, MAX_UNDOCUMENTED, table.concat(missing, " ")))
  end)
end)

-- The parser, on a page made up for it: which spans document which names.
describe("help_index.parse", function()
  local page = table.concat({
    "# Things (`nd.things`)",
    "",
    "Intro with `nd.other(a)` inside.",
    "",
    "## `nd.things.made(x, {flag=})`",
    "",
    "Makes a thing. More words.",
    "",
    "| call | notes |",
    "|---|---|",
    "| `alpha(x)`, `beta` | the first two \\| with a pipe |",
    "| `nd.zeros, ones (shape, opts)` | listed |",
    "| kind | `Gamma(n, {k})` (a class), `Delta` |",
    "",
    "```lua",
    "local y = fake(1)",
    "```",
    "",
    "## Sub (`nd.things.sub`)",
    "",
    "`x:omega(d)` (a method), `x.size_field` and `sigma` and `neg abs`, in a namespace.",
    "A message `needle.x: bad {1,2}` and a value `lr = 0.1` are not names.",
  }, "\n")
  local entries, title = index.parse("things.md", page)
  local function find(path, recv)
    for _, e in ipairs(entries) do
      if table.concat(e.path, ".") == path and e.recv == recv then return e end
    end
  end

  it("reads the title's namespace", function()
    assert.are.same({"things"}, title)
    local e = find("things")
    assert.are.equal(1, e.rank)
    assert.are.equal("Intro with nd.other(a) inside.", e.summary)
  end)

  it("reads headings, table cells and prose, with their summaries", function()
    local made = find("things.made")
    assert.are.same({rank = 1, summary = "Makes a thing.", line = 5, args = "(x, {flag=})"},
                    {rank = made.rank, summary = made.summary, line = made.line, args = made.args})
    local alpha, beta = find("alpha"), find("beta")
    assert.are.same({2, "the first two | with a pipe", {"things"}}, {alpha.rank, alpha.summary, alpha.ns})
    assert.are.same({2, "(x)"}, {alpha.rank, alpha.args})
    assert.are.equal("", beta.args)
    local ones = find("ones")
    assert.are.same({2, "(shape, opts)", "listed"}, {ones.rank, ones.args, ones.summary})
    local gamma, delta = find("Gamma"), find("Delta")
    assert.are.same({3, "a class"}, {gamma.rank, gamma.summary})
    assert.are.same({3, "kind (nd.things.made(x, {flag=}))"}, {delta.rank, delta.summary}) -- the section's heading
    assert.are.same({4, "(d)", "a method"}, {find("omega", "x").rank, find("omega", "x").args, find("omega", "x").summary})
    assert.truthy(find("size_field", "x"))
    local sigma = find("sigma")
    assert.are.same({5, {"things", "sub"}}, {sigma.rank, sigma.ns})
    assert.truthy(find("neg") and find("abs"))
    assert.are.equal(4, find("other").rank)
  end)

  it("skips code blocks, messages and assignments", function()
    assert.is_nil(find("fake"))
    assert.is_nil(find("needle.x"))
    assert.is_nil(find("x"))
    assert.is_nil(find("lr"))
  end)
end)
