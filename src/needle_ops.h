/* needle_ops.h - the op registry: every op of needle, described once.
 *
 * The lists below are X-macros: each consumer defines X to pick the columns
 * it needs, so the enums, the name tables, the CPU kernels, the OpenCL
 * kernel cases, the dtype rules and the backward formulas of the
 * elementwise ops are all derived from one line per op. A column that a
 * consumer needs and an entry lacks is a preprocessor error (wrong number of
 * macro arguments), not a silent default. docs/ARCHITECTURE.md ("Adding an
 * op") walks through adding one.
 *
 * Part of the core layer: it names ops and holds expressions as text; it
 * calls nothing. Installed next to needle.h, which includes it. */
#ifndef ND_NEEDLE_OPS_H
#define ND_NEEDLE_OPS_H

/* ---- elementwise unary ops ----
 * X(name, ints, bools, save, float_expr, int_expr, backward)
 *   ints   KEEP: integer inputs compute in their own dtype with int_expr;
 *          FLOAT: integer inputs compute in float32 (int_expr unused: -).
 *   bools  UINT8: a bool input computes as uint8 and the result is bool;
 *          FLOAT: as float32; REFUSE: an error (whose hint, what to use
 *          instead, is bool_hint in ops/op_elementwise.c).
 *   save   what the backward formula reads: NONE, INPUT (x) or OUTPUT (y).
 *   float_expr  the value for an element x of float type T. It is C with
 *          <tgmath.h> on the CPU and OpenCL C on OpenCL, so only functions
 *          both have (exp, log, sqrt, tanh, fabs, floor, ceil, rint, sin,
 *          cos, erf, expm1, log1p, isnan, ...) and casts to T. The C compiler
 *          checks it at build time; OpenCL compiles it at run time, so
 *          spec/opencl_ops_spec.lua is where an expression OpenCL C rejects
 *          shows up.
 *   int_expr    the same for an integer T; U is an unsigned type at least
 *          as wide as T (signed arithmetic wraps, as in PyTorch).
 *   backward    the gradient with respect to x, given the incoming gradient
 *          g, written with differentiable ops (so gradients of gradients
 *          work): MUL, DIV, ADD, SUB (tensor, tensor); MULS, ADDS, POWS,
 *          GTS (tensor, number); RSUBS (number, tensor): number - tensor;
 *          UN(op, t); ZEROS (zeros of x's shape). x or y as save says; a
 *          formula that reads the other one does not compile. */
#define ND_UNARY_OPS(X)                                                                      \
    X(neg,     KEEP,  REFUSE, NONE,   -x,                            (T)(0 - (U)x),         \
      UN(neg, g))                                                                           \
    X(abs,     KEEP,  UINT8,  INPUT,  fabs(x),                       x < 0 ? (T)(0 - (U)x) : x, \
      MUL(g, UN(sign, x)))                                                                  \
    X(exp,     FLOAT, FLOAT,  OUTPUT, exp(x),                        -,                     \
      MUL(g, y))                                                                            \
    X(log,     FLOAT, FLOAT,  INPUT,  log(x),                        -,                     \
      DIV(g, x))                                                                            \
    X(sqrt,    FLOAT, FLOAT,  OUTPUT, sqrt(x),                       -,                     \
      DIV(g, MULS(y, 2)))                                                                   \
    X(rsqrt,   FLOAT, FLOAT,  OUTPUT, (T)1 / sqrt(x),                -,                     \
      MUL(g, MULS(POWS(y, 3), -0.5)))                                                      \
    X(tanh,    FLOAT, FLOAT,  OUTPUT, tanh(x),                       -,                     \
      MUL(g, RSUBS(1, MUL(y, y))))                                                          \
    X(sigmoid, FLOAT, FLOAT,  OUTPUT, (T)1 / ((T)1 + exp(-x)),       -,                     \
      MUL(g, MUL(y, RSUBS(1, y))))                                                          \
    X(relu,    KEEP,  UINT8,  OUTPUT, x > 0 ? x : (isnan(x) ? x : (T)0), x > 0 ? x : (T)0,  \
      MUL(g, GTS(y, 0)))                                                                    \
    X(sign,    KEEP,  UINT8,  NONE,   x > 0 ? (T)1 : x < 0 ? (T)-1 : x, (T)((x > 0) - (x < 0)), \
      ZEROS)                                                                                \
    X(floor,   KEEP,  UINT8,  NONE,   floor(x),                      x,                     \
      ZEROS)                                                                                \
    X(ceil,    KEEP,  UINT8,  NONE,   ceil(x),                       x,                     \
      ZEROS)                                                                                \
    X(round,   KEEP,  UINT8,  NONE,   rint(x),                       x,                     \
      ZEROS)                                                                                \
    X(sin,     FLOAT, FLOAT,  INPUT,  sin(x),                        -,                     \
      MUL(g, UN(cos, x)))                                                                   \
    X(cos,     FLOAT, FLOAT,  INPUT,  cos(x),                        -,                     \
      MUL(g, UN(neg, UN(sin, x))))                                                          \
    X(erf,     FLOAT, FLOAT,  INPUT,  erf(x),                        -,                     \
      MUL(g, MULS(UN(exp, UN(neg, MUL(x, x))), 1.1283791670955126)))                        \
    X(log1p,   FLOAT, FLOAT,  INPUT,  log1p(x),                      -,                     \
      DIV(g, ADDS(x, 1)))                                                                   \
    X(expm1,   FLOAT, FLOAT,  OUTPUT, expm1(x),                      -,                     \
      MUL(g, ADDS(y, 1)))                                                                   \
    /* GELU (PyTorch's exact form, approximate = "none"): 0.5 x (1 + erf(x / sqrt 2)); its    \
     * derivative 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi) */                \
    X(gelu,    FLOAT, FLOAT,  INPUT,  (T)0.5 * x * ((T)1 + erf(x * (T)0.70710678118654752440)), -, \
      MUL(g, ADD(ADDS(MULS(UN(erf, MULS(x, 0.70710678118654752440)), 0.5), 0.5),               \
                 MUL(x, MULS(UN(exp, MULS(MUL(x, x), -0.5)), 0.39894228040143267794)))))       \
    /* GELU's tanh form (approximate = "tanh", GPT-2's gelu_new): 0.5 x (1 + t),              \
     * t = tanh(sqrt(2/pi) (x + 0.044715 x^3)); its derivative 0.5 (1 + t) +                 \
     * 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2) */                                    \
    X(gelu_tanh, FLOAT, FLOAT, INPUT,                                                         \
      (T)0.5 * x * ((T)1 + tanh((T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x))), -, \
      MUL(g, ADD(MULS(ADDS(UN(tanh, MULS(ADD(x, MULS(MUL(MUL(x, x), x), 0.044715)),           \
                                         0.79788456080286535588)), 1), 0.5),                  \
                 MUL(MULS(x, 0.5),                                                            \
                     MUL(RSUBS(1, MUL(UN(tanh, MULS(ADD(x, MULS(MUL(MUL(x, x), x), 0.044715)), \
                                                  0.79788456080286535588)),                   \
                                      UN(tanh, MULS(ADD(x, MULS(MUL(MUL(x, x), x), 0.044715)), \
                                                  0.79788456080286535588)))),                 \
                         MULS(ADDS(MULS(MUL(x, x), 0.134145), 1), 0.79788456080286535588))))))

/* ---- elementwise binary ops ----
 * X(name, kind, ints, bools, float_expr, int_expr, bool_expr)
 *   kind   ARITH: the result has the compute dtype; CMP: the result is bool.
 *   ints   KEEP: integer operands compute in their dtype with int_expr;
 *          FLOAT: they compute in float32 (true division).
 *   bools  KEEP: bool operands compute with bool_expr (0/1 bytes);
 *          INT64 / FLOAT: they compute in that dtype; REFUSE: an error.
 *   a and b are the operands (type T; U as for unary ops). The backward
 *   formulas are in op_elementwise.c, one switch case per op, checked
 *   complete at compile time (-Werror=switch there). */
#define ND_BINARY_OPS(X)                                                                     \
    X(add,     ARITH, KEEP,  KEEP,   a + b,                      (T)((U)a + (U)b), a | b)   \
    X(sub,     ARITH, KEEP,  REFUSE, a - b,                      (T)((U)a - (U)b), -)       \
    X(mul,     ARITH, KEEP,  KEEP,   a * b,                      (T)((U)a * (U)b), a & b)   \
    X(div,     ARITH, FLOAT, FLOAT,  a / b,                      -,                -)       \
    X(pow,     ARITH, KEEP,  INT64,  pow(a, b),                  (T)ipow64(a, b),  -)       \
    X(maximum, ARITH, KEEP,  KEEP,   (a > b || isnan(a)) ? a : b, a > b ? a : b,   a | b)   \
    X(minimum, ARITH, KEEP,  KEEP,   (a < b || isnan(a)) ? a : b, a < b ? a : b,   a & b)   \
    X(eq,      CMP,   KEEP,  KEEP,   a == b,                     a == b,           a == b)  \
    X(ne,      CMP,   KEEP,  KEEP,   a != b,                     a != b,           a != b)  \
    X(lt,      CMP,   KEEP,  KEEP,   a < b,                      a < b,            a < b)   \
    X(le,      CMP,   KEEP,  KEEP,   a <= b,                     a <= b,           a <= b)  \
    X(gt,      CMP,   KEEP,  KEEP,   a > b,                      a > b,            a > b)   \
    X(ge,      CMP,   KEEP,  KEEP,   a >= b,                     a >= b,           a >= b)

/* ---- reductions ---- X(name, grad): grad as for the other ops below (max
 * and min with a dim, giving values and indices, record the same nodes). */
#define ND_REDUCE_OPS(X) \
    X(sum, NODE) X(mean, NODE) X(prod, NODE) X(max, NODE) X(min, NODE) X(argmax, NONE) \
    X(argmin, NONE) X(var, NODE) X(std, NODE) X(logsumexp, NODE)

/* ---- every other op ----
 * X(name, kind, arity, dtype_rule, grad)
 *   kind        what a compiler may assume: TERNARY, UNARY (elementwise with
 *               parameters), REDUCE, VIEW, COPY, CREATE, INDEX, NORM, LOSS,
 *               GEMM, CONV, POOL, JOIN, SCAN, SORT, RANDOM, OPTIM, CELL
 *               (an RNN cell's gates and state update, row by row, or a
 *               layer of them over a sequence with its products),
 *               BACKWARD (an op that exists as the gradient of another, with
 *               a backward of its own so second derivatives work), or GRAPH
 *               (the output of a function nd.compile replays: its inputs are
 *               the parameters, its backward replays a captured backward).
 *   arity       tensor inputs, optional ones counted (-1: a list of tensors).
 *   dtype_rule  SAME: the result has the input's dtype; FLOAT: float inputs
 *               only; PROMOTE: the operands' promoted dtype; INDEX: values
 *               keep the dtype, indices are int64; OUTPUT: chosen by the
 *               caller (creation, conversion, random).
 *   grad        NODE: records an autograd node named after the op (its
 *               backward formula lives with the forward, in
 *               src/ops/op_<family>.c); VIA: differentiable through the ops
 *               it is made of (no node of its own); NONE: no gradient. */
#define ND_OTHER_OPS(X)                                                    \
    X(where,               TERNARY,  3, PROMOTE, NODE)                     \
    X(clamp,               UNARY,    1, SAME,    NODE)                     \
    X(view,                VIEW,     1, SAME,    NODE)                     \
    X(reshape,             VIEW,     1, SAME,    NODE)                     \
    X(permute,             VIEW,     1, SAME,    NODE)                     \
    X(transpose,           VIEW,     1, SAME,    NODE)                     \
    X(expand,              VIEW,     1, SAME,    NODE)                     \
    X(select,              VIEW,     1, SAME,    NODE)                     \
    X(slice,               VIEW,     1, SAME,    NODE)                     \
    X(narrow,              VIEW,     1, SAME,    VIA)                      \
    X(squeeze,             VIEW,     1, SAME,    NODE)                     \
    X(unsqueeze,           VIEW,     1, SAME,    NODE)                     \
    X(flatten,             VIEW,     1, SAME,    VIA)                      \
    X(contiguous,          COPY,     1, SAME,    NODE)                     \
    X(clone,               COPY,     1, SAME,    NODE)                     \
    X(to,                  COPY,     1, OUTPUT,  NODE)                     \
    X(copy_,               COPY,     2, SAME,    NONE)                     \
    X(fill_,               CREATE,   1, SAME,    NONE)                     \
    X(empty,               CREATE,   0, OUTPUT,  NONE)                     \
    X(zeros,               CREATE,   0, OUTPUT,  NONE)                     \
    X(full,                CREATE,   0, OUTPUT,  NONE)                     \
    X(arange,              CREATE,   0, OUTPUT,  NONE)                     \
    X(linspace,            CREATE,   0, OUTPUT,  NONE)                     \
    X(eye,                 CREATE,   0, OUTPUT,  NONE)                     \
    X(one_hot,             INDEX,    1, OUTPUT,  NONE)                     \
    X(softmax,             NORM,     1, FLOAT,   NODE)                     \
    X(log_softmax,         NORM,     1, FLOAT,   NODE)                     \
    X(layer_norm,          NORM,     3, FLOAT,   NODE)                     \
    X(batch_norm,          NORM,     5, FLOAT,   NODE)                     \
    X(fold_batch_norm,     NORM,     6, FLOAT,   NONE)                     \
    X(cross_entropy,       LOSS,     2, FLOAT,   NODE)                     \
    X(matmul,              GEMM,     2, PROMOTE, NODE)                     \
    X(linear,              GEMM,     3, FLOAT,   NODE)                     \
    X(fused_linear,        GEMM,     3, FLOAT,   VIA)                      \
    X(attention,           GEMM,     4, FLOAT,   NODE)                     \
    X(lstm_cell,           CELL,     3, FLOAT,   NODE)                     \
    X(gru_cell,            CELL,     3, FLOAT,   NODE)                     \
    X(lstm_layer,          CELL,     5, FLOAT,   NODE)                     \
    X(gru_layer,           CELL,     4, FLOAT,   NODE)                     \
    X(conv2d,              CONV,     3, FLOAT,   NODE)                     \
    X(conv_transpose2d,    CONV,     3, FLOAT,   NODE)                     \
    X(fused_conv2d,        CONV,     3, FLOAT,   VIA)                      \
    X(im2col,              CONV,     1, FLOAT,   NODE)                     \
    X(col2im,              CONV,     1, FLOAT,   NODE)                     \
    X(dilate,              VIEW,     1, SAME,    NODE)                     \
    X(undilate,            VIEW,     1, SAME,    NODE)                     \
    X(max_pool2d,          POOL,     1, FLOAT,   NODE)                     \
    X(avg_pool2d,          POOL,     1, FLOAT,   NODE)                     \
    X(adaptive_avg_pool2d, POOL,     1, FLOAT,   NODE)                     \
    X(cat,                 JOIN,    -1, PROMOTE, NODE)                     \
    X(stack,               JOIN,    -1, PROMOTE, NODE)                     \
    X(flip,                INDEX,    1, SAME,    NODE)                     \
    X(pad,                 INDEX,    1, SAME,    NODE)                     \
    X(cumsum,              SCAN,     1, SAME,    NODE)                     \
    X(sort,                SORT,     1, INDEX,   NODE)                     \
    X(topk,                SORT,     1, INDEX,   NODE)                     \
    X(gather,              INDEX,    2, SAME,    NODE)                     \
    X(scatter,             INDEX,    3, SAME,    NODE)                     \
    X(scatter_add,         INDEX,    3, SAME,    NODE)                     \
    X(index_select,        INDEX,    2, SAME,    NODE)                     \
    X(index_add,           INDEX,    3, SAME,    NODE)                     \
    X(masked_fill,         INDEX,    2, SAME,    NODE)                     \
    X(rand,                RANDOM,   0, OUTPUT,  NONE)                     \
    X(randn,               RANDOM,   0, OUTPUT,  NONE)                     \
    X(randint,             RANDOM,   0, OUTPUT,  NONE)                     \
    X(bernoulli,           RANDOM,   1, SAME,    NONE)                     \
    X(randperm,            RANDOM,   0, OUTPUT,  NONE)                     \
    X(sgd_step_,           OPTIM,    3, FLOAT,   NONE)                     \
    X(adam_step_,          OPTIM,    4, FLOAT,   NONE)                     \
    X(amp_unscale_,        OPTIM,    1, FLOAT,   NONE)                     \
    X(slice_backward,      BACKWARD, 1, SAME,    NODE)                     \
    X(max_pool2d_backward, BACKWARD, 1, FLOAT,   NODE)                     \
    X(max_pool2d_gather,   BACKWARD, 1, FLOAT,   NODE)                     \
    X(avg_pool2d_backward, BACKWARD, 1, FLOAT,   NODE)                     \
    X(compiled_forward,    GRAPH,   -1, OUTPUT,  NODE)

#endif
