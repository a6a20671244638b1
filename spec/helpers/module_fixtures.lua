-- spec/helpers/module_fixtures.lua - runs the PyTorch module fixtures of
-- spec/fixtures/torch_modules.lua (written by
-- spec/fixtures/gen/gen_torch_modules.py) against needle modules: load the
-- fixture's state_dict by name, forward, backward of sum(out * w)
-- (+ sum(weights * w2)), compare outputs and gradients.
local nd = require "needle"

local M = {}

M.fixtures = dofile("spec/fixtures/torch_modules.lua")

-- a needle tensor from a fixture tensor {shape=, dtype=, data=}
function M.tensor(t)
  local x = nd.tensor(t.data, {dtype = t.dtype})
  return x:reshape(t.shape)
end

function M.case(name)
  for _, c in ipairs(M.fixtures.cases) do
    if c.name == name then return c end
  end
  error("no module fixture named " .. name, 2)
end

function M.state_dict(c, field)
  local sd = {}
  for _, kv in ipairs(c[field or "state"]) do sd[kv[1]] = M.tensor(kv[2]) end
  return sd
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- plain checks (a required module does not see the assert busted gives specs)
local function same_list(what, want, got)
  if table.concat(want, " ") ~= table.concat(got, " ") then
    error(("%s: expected\n  %s\ngot\n  %s"):format(what, table.concat(want, " "), table.concat(got, " ")), 3)
  end
end

-- elementwise |got - want| <= rtol |want| + atol
function M.close(what, got, want, rtol, atol)
  rtol, atol = rtol or 1e-5, atol or 1e-6
  if shape_str(got.shape) ~= shape_str(want.shape) then
    error(("%s: shape %s, PyTorch %s"):format(what, shape_str(got.shape), shape_str(want.shape)), 2)
  end
  local g = got:contiguous():reshape({-1}):totable()
  for i, w in ipairs(want.data) do
    local v = g[i]
    if type(w) == "number" then
      if v ~= v or math.abs(v - w) > rtol * math.abs(w) + atol then
        error(("%s: element %d is %.9g, PyTorch %.9g"):format(what, i, v, w), 2)
      end
    elseif v ~= w then
      error(("%s: element %d is %s, PyTorch %s"):format(what, i, tostring(v), tostring(w)), 2)
    end
  end
end

-- run(c, module, call, tol): call(module, inputs...) -> output[, weights].
-- Checks parameter names/order/count, loads the state, compares the output,
-- the attention weights (c.weights), the gradients of every parameter and
-- float input, and the buffers after the forward pass (c.state_after).
function M.run(c, module, call, tol)
  tol = tol or {}
  local rtol, atol = tol.rtol or 1e-5, tol.atol or 1e-6
  -- parameters in PyTorch's order, same count
  local names = {}
  for i, p in ipairs(module:named_parameters()) do names[i] = p[1] end
  local want_names = {}
  for i, kv in ipairs(c.param_grads) do want_names[i] = kv[1] end
  same_list(c.name .. ": parameter names (PyTorch's order)", want_names, names)
  if c.num_parameters ~= module:num_parameters() then
    error(("%s: %d parameters, PyTorch %d"):format(c.name, module:num_parameters(), c.num_parameters), 2)
  end
  -- state_dict keys equal PyTorch's; then load by name
  local keys, want_keys = {}, {}
  for k in pairs(module:state_dict()) do keys[#keys + 1] = k end
  for _, kv in ipairs(c.state) do want_keys[#want_keys + 1] = kv[1] end
  table.sort(keys); table.sort(want_keys)
  same_list(c.name .. ": state_dict keys", want_keys, keys)
  module:load_state_dict(M.state_dict(c))
  if c.train then module:train() else module:eval() end

  local inputs, float_inputs = {}, {}
  for i, t in ipairs(c.inputs) do
    inputs[i] = M.tensor(t)
    if t.dtype == "float32" then
      inputs[i].requires_grad = true
      float_inputs[#float_inputs + 1] = inputs[i]
    end
  end
  local out, weights = call(module, table.unpack(inputs))
  M.close(c.name .. " output", out, c.output, rtol, atol)
  local obj = (out * M.tensor(c.w)):sum()
  if c.weights then
    if weights == nil then error(c.name .. ": no attention weights returned", 2) end
    M.close(c.name .. " attention weights", weights, c.weights, rtol, math.max(atol, 1e-5))
    obj = obj + (weights * M.tensor(c.w2)):sum()
  end
  local params = module:parameters()
  local wrt = {}
  for _, p in ipairs(params) do wrt[#wrt + 1] = p end
  for _, x in ipairs(float_inputs) do wrt[#wrt + 1] = x end
  local grads = nd.grad(obj, wrt, {allow_unused = true})
  for i, kv in ipairs(c.param_grads) do
    local g = grads[i] or nd.zeros(kv[2].shape)
    M.close(c.name .. " grad " .. kv[1], g, kv[2], rtol, atol)
  end
  for i, want in ipairs(c.input_grads) do
    local g = grads[#params + i] or nd.zeros(want.shape)
    M.close(c.name .. " grad input " .. i, g, want, rtol, atol)
  end
  if c.state_after then
    local sd = module:state_dict()
    for _, kv in ipairs(c.state_after) do
      M.close(c.name .. " " .. kv[1] .. " after forward", sd[kv[1]]:to("float32"), {shape = kv[2].shape,
        data = kv[2].data}, rtol, atol)
    end
  end
  return out, weights
end

-- the keys of module m's state_dict, sorted
function M.sorted_keys(m)
  local keys = {}
  for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- a sorted copy of list
function M.sorted(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = v end
  table.sort(out)
  return out
end

function M.max_abs_diff(a, b) return (a - b):abs():max():item() end

return M
