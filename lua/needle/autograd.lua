-- needle.autograd (nd.autograd): custom differentiable functions, as
-- PyTorch's torch.autograd.Function.
--
--   local Square = nd.autograd.Function{
--     name = "square",                       -- shown by y.grad_fn (optional)
--     forward = function(ctx, x)             -- runs without recording
--       ctx:save_for_backward(x)
--       return x * x
--     end,
--     backward = function(ctx, grad)         -- one gradient (or nil) per argument
--       local x = ctx.saved_tensors[1]
--       return grad * 2 * x
--     end,
--   }
--   local y = Square(x)                      -- or Square:apply(x)
--
-- forward returns one tensor. backward runs with grad mode on only under
-- create_graph, so a backward written with differentiable ops gives
-- gradients of gradients. Arguments that are not tensors (numbers, tables)
-- get no gradient: return nil for them.
local core = require "needle.core"
local options = require "needle.options"
local errors = require "needle.errors"

local M = {}

local Ctx = {}
Ctx.__index = Ctx
function Ctx:save_for_backward(...)
  self.saved_tensors = table.pack(...)
end

local Function = {}
Function.__index = Function

function Function:apply(...)
  local args = table.pack(...)
  local ctx = setmetatable({saved_tensors = {}}, Ctx)
  local out = core.no_grad(function() return self.forward(ctx, table.unpack(args, 1, args.n)) end)
  if not core.is_tensor(out) then
    errors.fail("autograd.Function", "%s: forward must return a tensor, got %s", self.name, options.got(out))
  end
  if args.n == 0 then return out end
  local backward = self.backward
  local list = {}
  for i = 1, args.n do list[i] = core.is_tensor(args[i]) and args[i] or false end
  return core._custom_record(self.name, list, out, function(grad) return backward(ctx, grad) end)
end
Function.__call = function(self, ...) return self:apply(...) end

function M.Function(spec)
  local o = options.check("autograd.Function", spec,
                          {forward = "function", backward = "function", name = "string"})
  if not o.forward or not o.backward then
    errors.fail("autograd.Function", "needs both forward and backward functions")
  end
  return setmetatable({forward = o.forward, backward = o.backward, name = o.name or "custom"}, Function)
end

return M
