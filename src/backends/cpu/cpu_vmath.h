/* cpu_vmath.h - float32 exp, tanh, sigmoid, erf and gelu over arrays,
 * vectorised.
 *
 * libm's expf and tanhf are scalar calls the compiler cannot vectorise:
 * tanh of 20,480 floats took 426 us (21 ns each), the LSTM gates' fused
 * kernel most of its time. These are polynomials the compiler vectorises
 * (AVX2 + FMA clones where the CPU has them; the build keeps ISO C's
 * fp-contract=off, so every clone rounds the same way and a result does
 * not depend on the CPU or on the tensor's strides):
 *   exp      Cephes' expf (about 1 ulp) with its range reduced in two
 *            steps, so that results below FLT_MIN come out as the
 *            denormals they are; inf above 88.72, NaN stays NaN.
 *   tanh     Cephes' tanhf: an odd polynomial for |x| < 0.625 (tanh(-0)
 *            = -0), else 1 - 2 / (exp(2|x|) + 1) with x's sign; about
 *            2 ulp.
 *   sigmoid  1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|):
 *            no overflow, and sigmoid(-100) is the denormal 3.8e-44, not 0.
 *   erf      a polynomial in double below |x| = 2, 1 - erfc above (erfc by
 *            the exp above); within 1 ulp. glibc's erff branches on the
 *            range of x: 11 ns an element on normally distributed inputs,
 *            these 2.6 (one core).
 *   gelu     0.5 x (1 + erf(x / sqrt 2)) with that erf.
 * erf and gelu go 16 elements at a time, through the polynomial alone where
 * all 16 arguments of erf are below 2 in magnitude (the same values: it is
 * the first branch), else through both: GELU over normally distributed
 * activations 4.1 -> 1.8 ns an element on one core (PyTorch 1.13's, whose
 * erf is a looser approximation: 0.8).
 * NaN in, NaN out. o may be x itself. */
#ifndef ND_CPU_VMATH_H
#define ND_CPU_VMATH_H

#include <stdint.h>

void nd_cpu_vexp_f32(float *o, const float *x, int64_t n);
void nd_cpu_vtanh_f32(float *o, const float *x, int64_t n);
void nd_cpu_vsigmoid_f32(float *o, const float *x, int64_t n);
void nd_cpu_verf_f32(float *o, const float *x, int64_t n);
void nd_cpu_vgelu_f32(float *o, const float *x, int64_t n);
/* GELU's tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), with the tanh above */
void nd_cpu_vgelu_tanh_f32(float *o, const float *x, int64_t n);

#endif
