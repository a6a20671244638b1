-- scripts/gen_corpus.lua - writes data/ptb_synth: an original corpus in the
-- Penn Treebank text format (one sentence per line, words separated by
-- spaces), sampled from a small probabilistic context-free grammar of our own
-- with 152 words (153 tokens with "<eos>"), and the exact best perplexity a
-- model can reach on its test set.
--
--   build/needle-lua scripts/gen_corpus.lua [--out DIR] [--seed N]
--   lua5.4 scripts/gen_corpus.lua --out /tmp/x        (needs no needle)
--
-- The grammar carries agreement-like dependencies a language model has to
-- learn: subject-verb number agreement (also across relative clauses: "the
-- dog that the cats chase runs"), "a" / "an" before consonant / vowel sounds,
-- "who" for animate and "which" for inanimate heads, do-support ("does" /
-- "do" not), "together" only with plural subjects, and verbs that select
-- their subjects and objects (one eats food, reads texts, visits places).
--
-- Best achievable perplexity: sentences are independent, so the true model's
-- probability of token t given everything before it is the grammar's prefix
-- probability ratio P(w_1..w_t) / P(w_1..w_t-1) within the sentence. We get it
-- exactly with a forward pass over the grammar's leftmost derivations: the
-- state after a prefix is a distribution over parser stacks (what remains to
-- be derived), and each token's probability sums over every derivation that
-- produces it, so ambiguity ("read" is present and past, "the" is singular and
-- plural) is accounted for. Relative clauses nest at most two deep, so the
-- state space is finite. The test perplexity is exp(-(1/N) sum log p) over
-- every token of test.txt, "<eos>" (the end of each line) included: what a
-- language model reading the corpus as needle.data.ptb.Corpus does would get
-- at best.
--
-- Random numbers come from a splitmix64 generator written here, and every
-- choice walks lists in a fixed order, so a seed gives the same files on any
-- Lua 5.4. The run takes a few seconds.

---------------------------------------------------------------------------
-- options
---------------------------------------------------------------------------

local OUT, SEED, QUIET = "data/ptb_synth", 20240611, false
local TARGET = {train = 100000, valid = 10000, test = 10000}
do
  local args = {...}
  if #args == 0 and arg then args = arg end
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--out" then OUT = args[i + 1]; i = i + 2
    elseif a:match("^%-%-out=") then OUT = a:sub(7); i = i + 1
    elseif a == "--seed" then SEED = math.tointeger(tonumber(args[i + 1])); i = i + 2
    elseif a == "--quiet" then QUIET = true; i = i + 1
    elseif a == "-h" or a == "--help" then
      print("usage: gen_corpus.lua [--out DIR] [--seed N] [--quiet]")
      os.exit(0)
    else
      io.stderr:write("gen_corpus.lua: unknown argument '" .. tostring(a) .. "' (try --help)\n")
      os.exit(2)
    end
    if not OUT or not SEED then
      io.stderr:write("gen_corpus.lua: --out needs a directory and --seed an integer\n")
      os.exit(2)
    end
  end
end

---------------------------------------------------------------------------
-- vocabulary
---------------------------------------------------------------------------

-- nouns by class: A animate, F food, T texts, P places, O objects
local NOUNS = {
  A = {{"dog", "dogs"}, {"cat", "cats"}, {"bird", "birds"}, {"farmer", "farmers"}, {"teacher", "teachers"},
       {"child", "children"}, {"king", "kings"}, {"girl", "girls"}, {"owl", "owls"}, {"engineer", "engineers"}},
  F = {{"apple", "apples"}, {"cake", "cakes"}, {"egg", "eggs"}},
  T = {{"book", "books"}, {"letter", "letters"}, {"song", "songs"}},
  P = {{"house", "houses"}, {"river", "rivers"}, {"garden", "gardens"}, {"island", "islands"}},
  O = {{"stone", "stones"}, {"box", "boxes"}, {"key", "keys"}, {"umbrella", "umbrellas"}},
}
local CLASSES = {"A", "F", "T", "P", "O"}
local INANIMATE = {"F", "T", "P", "O"}

local ADJ = {
  A = {"happy", "angry", "clever", "big", "small", "old"},
  I = {"empty", "heavy", "red", "big", "small", "old"},
}

-- verbs: {3rd person singular, base (= plural present), past}
local V_INTR = {{{"runs", "run", "ran"}, 1.0}, {{"sleeps", "sleep", "slept"}, 1.0},
                {{"laughs", "laugh", "laughed"}, 0.8}, {{"waits", "wait", "waited"}, 0.7},
                {{"swims", "swim", "swam"}, 0.6}}
local V_INTR_INAN = {{{"falls", "fall", "fell"}, 1.0}, {{"shines", "shine", "shone"}, 0.7}}
-- transitive: forms, weight, object classes
local V_TR = {
  {{"chases", "chase", "chased"}, 1.0, {"A"}},
  {{"helps", "help", "helped"}, 1.0, {"A"}},
  {{"meets", "meet", "met"}, 0.8, {"A"}},
  {{"sees", "see", "saw"}, 1.5, {"A", "F", "T", "P", "O"}},
  {{"finds", "find", "found"}, 1.2, {"A", "F", "T", "P", "O"}},
  {{"eats", "eat", "ate"}, 1.0, {"F"}},
  {{"reads", "read", "read"}, 1.0, {"T"}},
  {{"writes", "write", "wrote"}, 0.7, {"T"}},
  {{"visits", "visit", "visited"}, 0.8, {"P"}},
  {{"carries", "carry", "carried"}, 0.8, {"O", "F", "T"}},
  {{"opens", "open", "opened"}, 0.7, {"O"}},
}
local GIVE = {"gives", "give", "gave"}
local COP = {sg = {"is", "was"}, pl = {"are", "were"}}
local WANT = {"wants", "want", "wanted"}

---------------------------------------------------------------------------
-- grammar: G[nonterminal] = list of {probability, {symbols...}}
-- (a symbol that is not a key of G is a word)
---------------------------------------------------------------------------

local G = {}
local function rule(lhs, alts)
  assert(G[lhs] == nil, "rule defined twice: " .. lhs)
  local total = 0
  for _, a in ipairs(alts) do total = total + a[1] end
  local out = {}
  for _, a in ipairs(alts) do
    if a[1] > 0 then out[#out + 1] = {a[1] / total, a[2]} end
  end
  assert(#out > 0, "no alternatives for " .. lhs)
  G[lhs] = out
end

local function vowel(w) return w:match("^[aeiou]") ~= nil end
local NUMS = {"sg", "pl"}
local NUM_P = {sg = 0.55, pl = 0.45}
local function form(forms, n, t) -- t: "pres" | "past"
  if t == "past" then return forms[3] end
  return n == "sg" and forms[1] or forms[2]
end

-- Zipf-like weights by position in a list: 1 / (k + 1)
local function zipf(k) return 1 / (k + 1) end

-- nouns: N.n.c (all), N.n.c.C / N.n.c.V (consonant- / vowel-initial)
local MASS = {} -- MASS[name] = share of the vowel-initial part, for a / an
for _, c in ipairs(CLASSES) do
  for ni, n in ipairs(NUMS) do
    local all, cons, vow = {}, {}, {}
    for k, pair in ipairs(NOUNS[c]) do
      local w = pair[ni]
      local alt = {zipf(k), {w}}
      all[#all + 1] = alt
      if vowel(w) then vow[#vow + 1] = alt else cons[#cons + 1] = alt end
    end
    rule(("N.%s.%s"):format(n, c), all)
    local mv, mall = 0, 0
    for _, a in ipairs(all) do mall = mall + a[1] end
    for _, a in ipairs(vow) do mv = mv + a[1] end
    MASS[("N.%s.%s"):format(n, c)] = mv / mall
    if #cons > 0 then rule(("N.%s.%s.C"):format(n, c), cons) end
    if #vow > 0 then rule(("N.%s.%s.V"):format(n, c), vow) end
  end
end
-- adjectives: ADJ.A (animate), ADJ.I (inanimate); AW[key][k] = weight of the k-th
local AW = {}
for _, key in ipairs({"A", "I"}) do
  local alts, total = {}, 0
  for k, w in ipairs(ADJ[key]) do alts[k] = {zipf(k), {w}}; total = total + zipf(k) end
  rule("ADJ." .. key, alts)
  AW[key] = {}
  for k in ipairs(ADJ[key]) do AW[key][k] = zipf(k) / total end
end

local function adjclass(c) return c == "A" and "A" or "I" end

-- NOM: up to two different adjectives, then the noun. NOM.C / NOM.V start
-- with a consonant / vowel and have NOM's distribution restricted to that
-- (for "a" / "an"). NOM.2.k: after adjective k, maybe a second one (not k).
local P_ADJ1, P_ADJ2 = 0.3, 0.15
for _, c in ipairs(CLASSES) do
  local a = adjclass(c)
  local adjs, aw = ADJ[a], AW[a]
  for _, n in ipairs(NUMS) do
    local N, NOM = ("N.%s.%s"):format(n, c), ("NOM.%s.%s"):format(n, c)
    for k in ipairs(adjs) do
      local alts, others = {{1 - P_ADJ2, {N}}}, 1 - aw[k]
      for j, adj2 in ipairs(adjs) do
        if j ~= k then alts[#alts + 1] = {P_ADJ2 * aw[j] / others, {adj2, N}} end
      end
      rule(("%s.2.%d"):format(NOM, k), alts)
    end
    local nv = MASS[N]
    local all, cons, vow, av = {{1 - P_ADJ1, {N}}}, {}, {}, 0
    if nv < 1 then cons[1] = {(1 - P_ADJ1) * (1 - nv), {N .. ".C"}} end
    if nv > 0 then vow[1] = {(1 - P_ADJ1) * nv, {N .. ".V"}} end
    for k, adj in ipairs(adjs) do
      local alt = {P_ADJ1 * aw[k], {adj, ("%s.2.%d"):format(NOM, k)}}
      all[#all + 1] = alt
      if vowel(adj) then vow[#vow + 1] = alt; av = av + aw[k] else cons[#cons + 1] = alt end
    end
    rule(NOM, all)
    rule(NOM .. ".C", cons)
    rule(NOM .. ".V", vow)
    MASS[NOM] = (1 - P_ADJ1) * nv + P_ADJ1 * av
  end
end

-- determiner phrases
for _, c in ipairs(CLASSES) do
  local sg = "NOM.sg." .. c
  rule("INDEF." .. c, {{1 - MASS[sg], {"a", sg .. ".C"}}, {MASS[sg], {"an", sg .. ".V"}}})
  rule("DP.sg." .. c, {{0.45, {"the", sg}}, {0.30, {"INDEF." .. c}}, {0.12, {"this", sg}}, {0.13, {"every", sg}}})
  local pl = "NOM.pl." .. c
  rule("DP.pl." .. c, {{0.40, {"the", pl}}, {0.15, {"some", pl}}, {0.12, {"these", pl}}, {0.13, {"two", pl}},
                       {0.20, {pl}}})
end

-- noun phrases with an optional relative clause; d = embedding depth (0..2)
local P_RC = {[0] = 0.15, [1] = 0.06, [2] = 0}
local MAXD = 2
local TENSE_P = {pres = 0.65, past = 0.35}

-- object of a verb selecting the classes in `set`, at depth d: OBJ.<set>.d
local function obj_name(set, d) return ("OBJ.%s.%d"):format(table.concat(set), d) end
local obj_defined = {}
local function define_obj(set, d)
  local name = obj_name(set, d)
  if obj_defined[name] then return name end
  obj_defined[name] = true
  local alts = {}
  local has_a = false
  for _, c in ipairs(set) do if c == "A" then has_a = true end end
  for _, c in ipairs(set) do
    local w = (#set == 1) and 1 or (c == "A" and 0.4 or (has_a and 0.6 or 1) / (#set - (has_a and 1 or 0)))
    for _, n in ipairs(NUMS) do
      local p = w * (n == "sg" and 0.6 or 0.4)
      if c == "A" then
        alts[#alts + 1] = {p * 0.9, {("NP.%s.A.%d"):format(n, d)}}
        if n == "sg" then
          alts[#alts + 1] = {p * 0.05, {"him"}}
          alts[#alts + 1] = {p * 0.05, {"her"}}
        else
          alts[#alts + 1] = {p * 0.1, {"them"}}
        end
      else
        alts[#alts + 1] = {p, {("NP.%s.%s.%d"):format(n, c, d)}}
      end
    end
  end
  rule(name, alts)
  return name
end

for d = 0, MAXD do
  for _, c in ipairs(CLASSES) do
    for _, n in ipairs(NUMS) do
      local NP, DP = ("NP.%s.%s.%d"):format(n, c, d), ("DP.%s.%s"):format(n, c)
      if P_RC[d] > 0 then
        rule(NP, {{1 - P_RC[d], {DP}}, {P_RC[d], {DP, ("RC.%s.%s.%d"):format(n, c, d)}}})
      else
        rule(NP, {{1, {DP}}})
      end
    end
  end
end

-- subjects
for d = 0, MAXD do
  rule("SUBJ.sg.A." .. d, {{0.88, {"NP.sg.A." .. d}}, {0.06, {"he"}}, {0.06, {"she"}}})
  rule("SUBJ.pl.A." .. d, {{0.88, {"NP.pl.A." .. d}}, {0.12, {"they"}}})
  for _, n in ipairs(NUMS) do
    local alts = {}
    for _, c in ipairs(INANIMATE) do alts[#alts + 1] = {1, {("NP.%s.%s.%d"):format(n, c, d)}} end
    rule(("SUBJI.%s.%d"):format(n, d), alts)
  end
end

-- adverbs (together: plural subjects only)
rule("ADV.sg", {{0.88, {}}, {0.07, {"quickly"}}, {0.05, {"often"}}})
rule("ADV.pl", {{0.84, {}}, {0.06, {"quickly"}}, {0.05, {"often"}}, {0.05, {"together"}}})

-- prepositional phrases (objects without relative clauses)
rule("PP", {{0.4, {"in", define_obj({"P"}, MAXD)}}, {0.35, {"near", define_obj({"P", "O", "A"}, MAXD)}},
            {0.25, {"with", define_obj({"A", "O"}, MAXD)}}})
rule("PPOPT", {{0.88, {}}, {0.12, {"PP"}}})

-- verb phrases. VP.n.A.d: animate subject of number n at depth d
for d = 0, MAXD do
  for _, n in ipairs(NUMS) do
    local adv = "ADV." .. n
    -- base-form verb phrase after "to", "can", "does not"
    local base = {}
    local inw, trw = 0, 0
    for _, v in ipairs(V_INTR) do inw = inw + v[2] end
    for _, v in ipairs(V_TR) do trw = trw + v[2] end
    for _, v in ipairs(V_INTR) do base[#base + 1] = {0.4 * v[2] / inw, {v[1][2], adv}} end
    for _, v in ipairs(V_TR) do base[#base + 1] = {0.6 * v[2] / trw, {v[1][2], define_obj(v[3], d)}} end
    rule(("BASEVP.%s.%d"):format(n, d), base)
    for _, t in ipairs({"pres", "past"}) do
      local alts = {}
      for _, v in ipairs(V_INTR) do alts[#alts + 1] = {0.24 * v[2] / inw, {form(v[1], n, t), adv}} end
      for _, v in ipairs(V_TR) do
        alts[#alts + 1] = {0.40 * v[2] / trw, {form(v[1], n, t), define_obj(v[3], d)}}
      end
      alts[#alts + 1] = {0.05, {form(GIVE, n, t), define_obj({"A"}, d), define_obj({"F", "T", "O"}, MAXD)}}
      local cop = COP[n][t == "pres" and 1 or 2]
      alts[#alts + 1] = {0.08, {cop, "ADJ.A"}}
      alts[#alts + 1] = {0.04, {cop, "PP"}}
      if t == "pres" then
        alts[#alts + 1] = {0.06, {n == "sg" and "does" or "do", "not", ("BASEVP.%s.%d"):format(n, d)}}
      end
      alts[#alts + 1] = {0.05, {"can", ("BASEVP.%s.%d"):format(n, d)}}
      alts[#alts + 1] = {0.07, {form(WANT, n, t), "to", ("BASEVP.%s.%d"):format(n, d)}}
      rule(("VPT.%s.%s.%d"):format(n, t, d), alts)
    end
    local tail = d == 0 and {"PPOPT"} or {}
    local function with_tail(list)
      local out = {table.unpack(list)}
      for _, s in ipairs(tail) do out[#out + 1] = s end
      return out
    end
    rule(("VP.%s.A.%d"):format(n, d), {{TENSE_P.pres, with_tail({("VPT.%s.pres.%d"):format(n, d)})},
                                       {TENSE_P.past, with_tail({("VPT.%s.past.%d"):format(n, d)})}})
    -- inanimate subjects
    local ialts = {}
    for _, t in ipairs({"pres", "past"}) do
      local tp = TENSE_P[t]
      for _, v in ipairs(V_INTR_INAN) do ialts[#ialts + 1] = {tp * 0.55 * v[2] / 1.7, {form(v[1], n, t), adv}} end
      local cop = COP[n][t == "pres" and 1 or 2]
      ialts[#ialts + 1] = {tp * 0.30, {cop, "ADJ.I"}}
      ialts[#ialts + 1] = {tp * 0.15, {cop, "PP"}}
    end
    rule(("VPI.%s.%d"):format(n, d), ialts)
  end
end

-- relative clauses on a head of number n and class c at depth d; the clause
-- itself is at depth d + 1. Object relatives: "that" + subject + a
-- transitive verb (agreeing with that subject) whose object class fits c.
for d = 0, MAXD - 1 do
  local e = d + 1
  for _, c in ipairs(CLASSES) do
    local gap = {}
    for _, m in ipairs(NUMS) do
      for _, t in ipairs({"pres", "past"}) do
        local verbs = {}
        for _, v in ipairs(V_TR) do
          for _, oc in ipairs(v[3]) do
            if oc == c then verbs[#verbs + 1] = {v[2], {form(v[1], m, t)}} end
          end
        end
        local vname = ("VGAP.%s.%s.%s"):format(m, t, c)
        if not G[vname] then rule(vname, verbs) end
        gap[#gap + 1] = {NUM_P[m] * TENSE_P[t], {("SUBJ.%s.A.%d"):format(m, e), vname}}
      end
    end
    rule(("OBJREL.%s.%d"):format(c, e), gap)
    for _, n in ipairs(NUMS) do
      local RC = ("RC.%s.%s.%d"):format(n, c, d)
      if c == "A" then
        rule(RC, {{0.6, {"who", ("VP.%s.A.%d"):format(n, e)}}, {0.4, {"that", ("OBJREL.%s.%d"):format(c, e)}}})
      else
        rule(RC, {{0.35, {"which", ("VPI.%s.%d"):format(n, e)}}, {0.65, {"that", ("OBJREL.%s.%d"):format(c, e)}}})
      end
    end
  end
end

-- clauses and sentences
local cl = {}
for _, n in ipairs(NUMS) do
  cl[#cl + 1] = {0.8 * NUM_P[n], {"SUBJ." .. n .. ".A.0", "VP." .. n .. ".A.0"}}
  cl[#cl + 1] = {0.2 * NUM_P[n], {"SUBJI." .. n .. ".0", "VPI." .. n .. ".0"}}
end
rule("CL", cl)
rule("S", {{0.72, {"CL"}}, {0.10, {"CL", "and", "CL"}}, {0.06, {"CL", "but", "CL"}},
           {0.07, {"CL", "because", "CL"}}, {0.05, {"CL", "when", "CL"}}})
rule("TOP", {{1, {"S", "<eos>"}}})

-- every symbol used is a word or has rules
local WORDS, nwords = {}, 0
for _, alts in pairs(G) do
  for _, a in ipairs(alts) do
    for _, s in ipairs(a[2]) do
      if not G[s] then
        assert(s:match("^[a-z]+$") or s == "<eos>", "undefined nonterminal " .. s)
        if not WORDS[s] then WORDS[s] = true; nwords = nwords + 1 end
      end
    end
  end
end

---------------------------------------------------------------------------
-- leftmost derivations: the stack after a prefix is the list of symbols
-- left to derive, kept as a string "A B C" (top first)
---------------------------------------------------------------------------

local function split(key)
  local out = {}
  for s in key:gmatch("%S+") do out[#out + 1] = s end
  return out
end

-- outcomes(key) -> list of {word, probability, next stack key}, in a fixed
-- order, one per way of deriving the next word from the stack
local memo, memo_size = {}, 0
local function outcomes(key)
  local o = memo[key]
  if o then return o end
  o = {}
  local function walk(syms, i, p)
    local X = syms[i]
    assert(X, "stack ran empty before a word")
    local alts = G[X]
    if not alts then
      o[#o + 1] = {X, p, table.concat(syms, " ", i + 1)}
      return
    end
    for _, a in ipairs(alts) do
      local rhs = a[2]
      local nsyms = {}
      for _, s in ipairs(rhs) do nsyms[#nsyms + 1] = s end
      for j = i + 1, #syms do nsyms[#nsyms + 1] = syms[j] end
      if #nsyms == 0 then error("a sentence derived no <eos>") end
      walk(nsyms, 1, p * a[1])
    end
  end
  walk(split(key), 1, 1.0)
  -- the next word's distribution from this stack sums to 1 (no mass lost:
  -- every derivation is finite), so the forward pass's ratios are exact
  local total = 0
  for _, e in ipairs(o) do total = total + e[2] end
  assert(math.abs(total - 1) < 1e-9, "outcomes of '" .. key .. "' sum to " .. total)
  local by = {}
  for _, e in ipairs(o) do
    local l = by[e[1]]
    if not l then l = {}; by[e[1]] = l end
    l[#l + 1] = e
  end
  o.by = by
  memo[key] = o
  memo_size = memo_size + 1
  if memo_size > 200000 then memo, memo_size = {}, 0 end
  return o
end

---------------------------------------------------------------------------
-- sampling
---------------------------------------------------------------------------

local rng_state = SEED
local function uniform() -- splitmix64 -> [0, 1)
  rng_state = rng_state + 0x9E3779B97F4A7C15
  local z = rng_state
  z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ~ (z >> 27)) * 0x94D049BB133111EB
  z = z ~ (z >> 31)
  return (z >> 11) * (1.0 / 9007199254740992.0)
end

local function sentence()
  local words, key = {}, "TOP"
  while true do
    local o = outcomes(key)
    local r, acc = uniform(), 0
    local pick = o[#o]
    for _, e in ipairs(o) do
      acc = acc + e[2]
      if r < acc then pick = e break end
    end
    if pick[1] == "<eos>" then return words end
    words[#words + 1] = pick[1]
    key = pick[3]
  end
end

local function generate(target)
  local lines, ntok = {}, 0
  while ntok < target do
    local s = sentence()
    lines[#lines + 1] = s
    ntok = ntok + #s + 1
  end
  return lines, ntok
end

---------------------------------------------------------------------------
-- exact log-probability of a text under the grammar (forward pass)
---------------------------------------------------------------------------

local function logprob(lines)
  local total, n = 0.0, 0
  for _, words in ipairs(lines) do
    local keys, probs = {"TOP"}, {1.0}
    local toks = {table.unpack(words)}
    toks[#toks + 1] = "<eos>"
    for _, w in ipairs(toks) do
      local nk, np, idx = {}, {}, {}
      for s = 1, #keys do
        local l = outcomes(keys[s]).by[w]
        if l then
          for _, e in ipairs(l) do
            local k = e[3]
            local j = idx[k]
            if not j then j = #nk + 1; idx[k] = j; nk[j] = k; np[j] = 0.0 end
            np[j] = np[j] + probs[s] * e[2]
          end
        end
      end
      local z = 0.0
      for j = 1, #np do z = z + np[j] end
      assert(z > 0, "the grammar cannot produce '" .. w .. "' here")
      total = total + math.log(z)
      n = n + 1
      for j = 1, #np do np[j] = np[j] / z end
      keys, probs = nk, np
    end
  end
  return total, n
end

---------------------------------------------------------------------------
-- n-gram baselines fitted on train (for scale in the README)
---------------------------------------------------------------------------

local function stream(lines)
  local s = {}
  for _, words in ipairs(lines) do
    for _, w in ipairs(words) do s[#s + 1] = w end
    s[#s + 1] = "<eos>"
  end
  return s
end

local function ngram_ppl(train, valid, test, V)
  local c1, c2, c3, n1 = {}, {}, {}, 0
  local h1, h2 = {}, {}
  for i = 1, #train do
    local w = train[i]
    c1[w] = (c1[w] or 0) + 1; n1 = n1 + 1
    if i > 1 then
      local a = train[i - 1]
      local k = a .. " " .. w
      c2[k] = (c2[k] or 0) + 1; h1[a] = (h1[a] or 0) + 1
      if i > 2 then
        local b = train[i - 2] .. " " .. a
        local k3 = b .. " " .. w
        c3[k3] = (c3[k3] or 0) + 1; h2[b] = (h2[b] or 0) + 1
      end
    end
  end
  local function p(s, i, l1, l2, l3)
    local w = s[i]
    local pu = ((c1[w] or 0) + 1) / (n1 + V)
    if i == 1 then return pu end
    local a = s[i - 1]
    local pb = h1[a] and (c2[a .. " " .. w] or 0) / h1[a] or 0
    local pt = 0
    if i > 2 then
      local b = s[i - 2] .. " " .. a
      pt = h2[b] and (c3[b .. " " .. w] or 0) / h2[b] or 0
    end
    return l1 * pu + l2 * pb + l3 * pt
  end
  local function ppl(s, l1, l2, l3)
    local t = 0.0
    for i = 1, #s do t = t + math.log(p(s, i, l1, l2, l3)) end
    return math.exp(-t / #s)
  end
  local uni = ppl(test, 1, 0, 0)
  local best2, best3 = {math.huge}, {math.huge}
  for _, l2 in ipairs({0.5, 0.6, 0.7, 0.8, 0.9, 0.95}) do
    local v = ppl(valid, 1 - l2, l2, 0)
    if v < best2[1] then best2 = {v, l2} end
  end
  for _, l3 in ipairs({0.3, 0.4, 0.5, 0.6, 0.7, 0.8}) do
    for _, l1 in ipairs({0.01, 0.03, 0.1}) do
      local v = ppl(valid, l1, 1 - l1 - l3, l3)
      if v < best3[1] then best3 = {v, l1, l3} end
    end
  end
  return uni, ppl(test, 1 - best2[2], best2[2], 0), ppl(test, best3[2], 1 - best3[2] - best3[3], best3[3])
end

---------------------------------------------------------------------------
-- main
---------------------------------------------------------------------------

local splits = {}
for _, name in ipairs({"train", "valid", "test"}) do
  local lines, ntok = generate(TARGET[name])
  splits[name] = {lines = lines, ntok = ntok}
end

local function write(path, text)
  local f, err = io.open(path, "wb")
  if not f then
    io.stderr:write(("gen_corpus.lua: cannot write '%s': %s (does the directory exist?)\n"):format(path, err))
    os.exit(1)
  end
  f:write(text)
  f:close()
end

os.execute("mkdir -p '" .. OUT:gsub("'", "'\\''") .. "'")

local vocab = {}
local nvocab = 0
for _, name in ipairs({"train", "valid", "test"}) do
  local parts = {}
  for i, words in ipairs(splits[name].lines) do
    parts[i] = table.concat(words, " ")
    for _, w in ipairs(words) do
      if not vocab[w] then vocab[w] = true; nvocab = nvocab + 1 end
    end
  end
  parts[#parts + 1] = ""
  write(OUT .. "/" .. name .. ".txt", table.concat(parts, "\n"))
end
nvocab = nvocab + 1 -- <eos>

local lp_test, n_test = logprob(splits.test.lines)
local lp_valid, n_valid = logprob(splits.valid.lines)
local lp_train, n_train = logprob(splits.train.lines)
assert(n_test == splits.test.ntok and n_valid == splits.valid.ntok and n_train == splits.train.ntok)
local H_test = -lp_test / n_test
local best_test = math.exp(H_test)
local best_valid = math.exp(-lp_valid / n_valid)
local best_train = math.exp(-lp_train / n_train)
local uni, bi, tri = ngram_ppl(stream(splits.train.lines), stream(splits.valid.lines),
                               stream(splits.test.lines), nvocab)

local nsent = #splits.train.lines + #splits.valid.lines + #splits.test.lines
local ntok_all = splits.train.ntok + splits.valid.ntok + splits.test.ntok

write(OUT .. "/stats.lua", ([[
-- written by scripts/gen_corpus.lua (seed %d); see README.md
return {
  best_test_ppl = %.6f,   -- exp(per-token entropy of the true model on test.txt, <eos> included)
  best_valid_ppl = %.6f,
  best_train_ppl = %.6f,
  test_entropy_nats = %.6f,
  test_entropy_bits = %.6f,
  vocab = %d,             -- distinct tokens in train + valid + test, <eos> included
  grammar_words = %d,     -- words the grammar can produce, <eos> included
  tokens = {train = %d, valid = %d, test = %d},   -- words + one <eos> per line
  sentences = {train = %d, valid = %d, test = %d},
  unigram_test_ppl = %.6f,
  bigram_test_ppl = %.6f,
  trigram_test_ppl = %.6f,
  seed = %d,
}
]]):format(SEED, best_test, best_valid, best_train, H_test, H_test / math.log(2), nvocab, nwords,
  splits.train.ntok, splits.valid.ntok, splits.test.ntok,
  #splits.train.lines, #splits.valid.lines, #splits.test.lines, uni, bi, tri, SEED))

write(OUT .. "/README.md", ([[
# ptb_synth: a synthetic corpus in the Penn Treebank format

Written by `scripts/gen_corpus.lua` (seed %d); `build/needle-lua scripts/gen_corpus.lua --out DIR`
writes the same files again (`lua5.4` runs it too: it needs no needle). The text is original:
sentences sampled from a small probabilistic context-free grammar defined in that script, not
taken from any published corpus.

Format: `train.txt`, `valid.txt`, `test.txt`, one sentence per line, words separated by single
spaces, as PTB's `ptb.*.txt`; `needle.data.ptb.Corpus("data/ptb_synth")` reads it and appends
`<eos>` to every line, as PyTorch's word_language_model example.

| | train | valid | test |
|---|---|---|---|
| sentences | %d | %d | %d |
| tokens (words + `<eos>`) | %d | %d | %d |

Vocabulary: %d tokens (`<eos>` and the words of the grammar, which has %d in all; the
corpus uses %d of them).
%d sentences, %.2f tokens per sentence on average.

## What a model can learn

- subject-verb number agreement, also across relative clauses and conjoined clauses
  (`the dog that the cats chase runs`, `the owls who help the farmer swim together`);
  past tense forms carry no number, and `read` is both present and past;
- `a` before a consonant and `an` before a vowel (`an old dog`, `a big owl`, `an umbrella`);
- `who` after animate heads, `which` after inanimate ones; `does not` / `do not` by number;
- `together` only after plural subjects; `he`/`she` singular, `they` plural;
- verbs that select their arguments: animals and people `eat` food, `read` and `write` texts,
  `visit` places, `chase`/`help`/`meet` animate objects; only inanimate subjects `fall`/`shine`;
- relative clauses nest at most two deep; PPs (`in`, `near`, `with`) end main clauses.

## Best achievable perplexity

The true model's probability of each test token given everything before it (sentences are
independent, so: given the words before it in its sentence) is computed exactly from the
grammar by a forward pass over its leftmost derivations, summing over every derivation of the
prefix. Over all %d tokens of `test.txt` (`<eos>` included):

| | value |
|---|---|
| per-token entropy | %.4f nats = %.4f bits |
| **best test perplexity** | **%.4f** |
| best valid perplexity | %.4f |
| best train perplexity | %.4f |

This is what the generating grammar itself scores; no model does better in expectation on text
from the grammar. It counts every token with its whole sentence before it as context. A language
model evaluated with `batchify`/`get_batch` reads the test stream in `bsz` columns, each starting
mid-sentence, and does not predict the first token of each column, so its number is measured on
slightly different terms (a few tokens per column lack their context).

For scale, n-gram models fitted on train.txt (Jelinek-Mercer interpolation, weights tuned on
valid.txt, add-one unigram) score on test.txt:

| model | test perplexity |
|---|---|
| unigram | %.2f |
| bigram | %.2f |
| trigram | %.2f |
| true grammar | %.2f |

The same numbers are in `stats.lua` (`return {best_test_ppl = ..., vocab = ..., tokens = {...}}`).
]]):format(SEED, #splits.train.lines, #splits.valid.lines, #splits.test.lines,
  splits.train.ntok, splits.valid.ntok, splits.test.ntok, nvocab, nwords - 1, nvocab - 1, nsent, ntok_all / nsent,
  n_test, H_test, H_test / math.log(2), best_test, best_valid, best_train, uni, bi, tri, best_test))

if not QUIET then
  print(("wrote %s: train %d, valid %d, test %d tokens; vocab %d; best test perplexity %.4f " ..
    "(unigram %.2f, bigram %.2f, trigram %.2f)"):format(OUT, splits.train.ntok, splits.valid.ntok,
    splits.test.ntok, nvocab, best_test, uni, bi, tri))
end
