-- demo.lua - a first look at needle-lua: fit y = X w by gradient descent.
--
--   build/needle-lua scripts/demo.lua
--
-- Builds a noisy linear data set and fits w with hand-written gradients
-- (matmul, transpose, elementwise arithmetic, mean, sum, item).
local nd = require "needle"

nd.manual_seed(0)

local n, d = 256, 3
local w_true = nd.tensor({{2.0}, {-3.0}, {0.5}})        -- (3, 1)
local X = nd.randn({n, d})                               -- (256, 3)
local y = X:matmul(w_true) + nd.randn({n, 1}) * 0.05     -- (256, 1)

print("X: " .. X:size(1) .. " x " .. X:size(2) .. ", y: " .. y:size(1) .. " x " .. y:size(2))
print("first rows of X:")
print(X[{{1, 3}, ":"}])

-- loss(w) = mean((X w - y)^2);  d loss / d w = 2/n * X^T (X w - y)
local function loss_and_grad(w)
  local err = X:matmul(w) - y
  local loss = (err * err):mean()
  local grad = X:transpose(1, 2):matmul(err) * (2 / n)
  return loss, grad
end

local w = nd.zeros({d, 1})
local lr = 0.2
for step = 1, 60 do
  local loss, grad = loss_and_grad(w)
  w = w - grad * lr
  if step == 1 or step % 10 == 0 then
    print(string.format("step %3d   loss %.6f", step, loss:item()))
  end
end

print("learned w:")
print(w)
print("true w:")
print(w_true)
local w_err = (w - w_true):abs():sum():item()
print(string.format("sum |w - w_true| = %.4f", w_err))

assert(w_err < 0.05, "gradient descent did not recover w")
print("demo ok")
