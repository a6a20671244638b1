/* gemm.cl - batched, strided matrix multiply: C[z] = A[z] @ B[z] with
 * A (M x K), B (K x N), C (M x N) for every batch index z.
 *
 * Every kernel takes the same arguments:
 *   (M, N, K, bg, A, a_sm, a_sk, B, b_sk, b_sn, C, c_sm, c_sn)
 * where element (m, k) of A[z] sits at A[off_a(z) + m * a_sm + k * a_sk]
 * (strides in elements, any sign, 0 for broadcast), the same for B and C,
 * and bg is an nd_geom over the batch dims whose operands are 0 = C, 1 = A,
 * 2 = B (it gives off_c(z), off_a(z), off_b(z)). So transposed and sliced
 * operands are read in place: nothing is copied. NDRange: dim 0 along N,
 * dim 1 along M, dim 2 the batch (so that neighbouring work-items write
 * neighbouring elements of C, which is contiguous along N).
 *
 * Build defines: T, T_FLOAT (common.cl), and for the tiled kernels
 *   TSM, TSN   the work-group's tile of C (rows x cols)
 *   WPTM, WPTN outputs per work-item (rows x cols), kept in registers; the
 *              work-group is (TSN/WPTN) x (TSM/WPTM) work-items and item
 *              (tn, tm) computes rows tm + i*(TSM/WPTM), cols tn + j*(TSN/WPTN)
 *   TSK        the K-slice staged in local memory per step (gemm_tiled)
 *   VW         vector width: of the tile loads (gemm_tiled: 1, 2, 4, 8), of
 *              B and the accumulators along N (gemm_direct: 1 .. 16), of the
 *              partial sums along K (gemm_dot: 1 .. 16)
 *   USE_LOCAL  1: gemm_tiled; 0: gemm_direct, or gemm_dot when DOT is defined
 *   A_LAYOUT   0: general strides, 1: contiguous along M (a_sm == 1, e.g. a
 *   B_LAYOUT      transposed view), 2: contiguous along K (a_sk == 1, row-
 *              major); B the same with N: 1 means b_sn == 1 (row-major).
 *              A layout turns the stride into the constant 1, and the tile
 *              loader reads VW consecutive elements along that dim.
 * Edges: M, N, K need not be multiples of the tiles: tile loads outside
 * the matrix read 0 and stores outside C are skipped. */

/* C = A @ B, or with ACCUMULATE (nd.compile's epilogue pass) C += A @ B:
 * one add per element after the whole product, as an add kernel after the
 * matmul rounds it (bit for bit the two kernels' result). */
#if defined(ACCUMULATE) && ACCUMULATE
#define STORE_C(dst, v) ((dst) = (dst) + (v))
#else
#define STORE_C(dst, v) ((dst) = (v))
#endif

/* Operand storage. A_HALF / B_HALF: 0 (default) A or B holds T; 1 it
 * holds float16, 2 bfloat16, with T float: a half operand of a float32
 * product is read as stored and widened on load, which is exact (every
 * half value is a float), so the product of half operands equals the
 * float32 product of their float32 copies bit for bit, while it reads half
 * the bytes and needs no conversion pass. vload_half is core OpenCL: a
 * device without cl_khr_fp16 runs it too. LDA(p, i) / LDB(p, i) read
 * element p[i] as T; LDVA(p) / LDVB(p) VW consecutive ones as a vector. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#ifndef A_HALF
#define A_HALF 0
#endif
#ifndef B_HALF
#define B_HALF 0
#endif
#define ST_0 T
#define ST_1 half
#define ST_2 ushort
#define A_ST CAT(ST_, A_HALF)
#define B_ST CAT(ST_, B_HALF)
#define LD_0(p, i) ((p)[i])
#define LD_1(p, i) vload_half((i), (p))
#define LD_2(p, i) as_float((uint)(p)[i] << 16)
#define LDA(p, i) CAT(LD_, A_HALF)(p, i)
#define LDB(p, i) CAT(LD_, B_HALF)(p, i)
#if defined(VW) && VW > 1
#define LDV_0(p) CAT(vload, VW)(0, (p))
#define LDV_1(p) CAT(vload_half, VW)(0, (p))
#define LDV_2(p) CAT(as_float, VW)(CAT(convert_uint, VW)(CAT(vload, VW)(0, (p))) << 16)
#define LDVA(p) CAT(LDV_, A_HALF)(p)
#define LDVB(p) CAT(LDV_, B_HALF)(p)
#endif

/* ------------------------------------------------------------- naive
 * One work-item per element of C: obviously correct, used for integer
 * dtypes, tiny products, and as the reference the autotuner checks every
 * candidate against. Integers accumulate in ulong, wrapping as the CPU's
 * (and PyTorch's) integer matmul does. */
__kernel void gemm_naive(long M, long N, long K, nd_geom bg,
                         __global const A_ST *A, long a_sm, long a_sk,
                         __global const B_ST *B, long b_sk, long b_sn,
                         __global T *C, long c_sm, long c_sn) {
    long n = get_global_id(0), m = get_global_id(1), z = get_global_id(2);
    if (n >= N || m >= M) return;
    long off[3];
    GEOM_OFFSETS(bg, z, 3, off);
    __global const A_ST *pa = A + off[1] + m * a_sm;
    __global const B_ST *pb = B + off[2] + n * b_sn;
#if T_FLOAT
    T acc = 0;
    for (long k = 0; k < K; k++) acc += LDA(pa, k * a_sk) * LDB(pb, k * b_sk);
    STORE_C(C[off[0] + m * c_sm + n * c_sn], acc);
#else
    ulong acc = 0;
    for (long k = 0; k < K; k++) acc += (ulong)(long)pa[k * a_sk] * (ulong)(long)pb[k * b_sk];
    STORE_C(C[off[0] + m * c_sm + n * c_sn], (T)acc);
#endif
}

#if defined(TSM) || defined(SKR) /* the layouts of the tiled and skinny kernels */
#if A_LAYOUT == 1
#define A_SM 1L
#else
#define A_SM a_sm
#endif
#if A_LAYOUT == 2
#define A_SK 1L
#else
#define A_SK a_sk
#endif
#if B_LAYOUT == 1
#define B_SN 1L
#else
#define B_SN b_sn
#endif
#if B_LAYOUT == 2
#define B_SK 1L
#else
#define B_SK b_sk
#endif
#endif

#ifdef TSM /* the tuned kernels: built only with tile defines */

#define RTSM (TSM / WPTM) /* work-items along M */
#define RTSN (TSN / WPTN) /* work-items along N */
#define WG (RTSM * RTSN)

/* v[0..VW-1] = A's (LOADV_A) or B's (LOADV_B) elements p[0..VW-1] as T,
 * in one vector load (vloadN needs only element alignment, so any offset
 * is fine) */
#if VW != 1 && VW != 2 && VW != 4 && VW != 8 && VW != 16
#error "VW must be 1, 2, 4, 8 or 16"
#endif
#if VW == 1
#define LOADV_A(v, p) ((v)[0] = LDA(p, 0))
#define LOADV_B(v, p) ((v)[0] = LDB(p, 0))
#else
#define LOADV_A(v, p) CAT(vstore, VW)(LDVA(p), 0, (v))
#define LOADV_B(v, p) CAT(vstore, VW)(LDVB(p), 0, (v))
#endif

#if defined(USE_LOCAL) && USE_LOCAL
/* Stages a TSK x TS slice of operand `which` (0: A at pa, 1: B at pb; a
 * constant after inlining, like ts and layout) in local memory, k-major:
 * dst[kk * TS + ii] = X(i0 + ii, k0 + kk), where X(i, k) = p[i * si + k * sk]
 * (i along the output dim: m for A, n for B) and is 0 outside ni x nk.
 * layout 1: si == 1, 2: sk == 1 (VW-wide loads along that dim), 0: scalar.
 * The work-items of the group share the loads (tid = 0 .. WG-1). With
 * constant ts and layout (after inlining) the branches fold away. */
#define LD_OP(i) (which ? LDB(pb, i) : LDA(pa, i))
#define LOADV_OP(v, i)                   \
    do {                                 \
        if (which) LOADV_B(v, pb + (i)); \
        else LOADV_A(v, pa + (i));       \
    } while (0)
inline void load_tile(__local T *dst, __global const A_ST *pa, __global const B_ST *pb,
                      const int which, long si, long sk, long i0, long k0, long ni, long nk,
                      const int ts, const int layout, int tid) {
    if (layout == 1) {
        for (int e = tid; e < ts * TSK / VW; e += WG) {
            int kk = e / (ts / VW), ii = (e % (ts / VW)) * VW;
            long gi = i0 + ii, gk = k0 + kk;
            T v[VW];
            if (gk < nk && gi + VW <= ni) {
                LOADV_OP(v, gk * sk + gi);
            } else {
#pragma unroll
                for (int j = 0; j < VW; j++) v[j] = (gk < nk && gi + j < ni) ? LD_OP(gk * sk + gi + j) : (T)0;
            }
#pragma unroll
            for (int j = 0; j < VW; j++) dst[kk * ts + ii + j] = v[j];
        }
    } else if (layout == 2) {
        for (int e = tid; e < ts * TSK / VW; e += WG) {
            int ii = e / (TSK / VW), kk = (e % (TSK / VW)) * VW;
            long gi = i0 + ii, gk = k0 + kk;
            T v[VW];
            if (gi < ni && gk + VW <= nk) {
                LOADV_OP(v, gi * si + gk);
            } else {
#pragma unroll
                for (int j = 0; j < VW; j++) v[j] = (gi < ni && gk + j < nk) ? LD_OP(gi * si + gk + j) : (T)0;
            }
#pragma unroll
            for (int j = 0; j < VW; j++) dst[(kk + j) * ts + ii] = v[j];
        }
    } else {
        for (int e = tid; e < ts * TSK; e += WG) {
            int ii = e % ts, kk = e / ts;
            long gi = i0 + ii, gk = k0 + kk;
            dst[kk * ts + ii] = (gi < ni && gk < nk) ? LD_OP(gi * si + gk * sk) : (T)0;
        }
    }
}

/* ------------------------------------------------------------- tiled
 * Per step, the group stages a TSM x TSK slice of A and a TSK x TSN slice
 * of B in local memory; each work-item then multiplies them out of
 * registers (WPTM values of A times WPTN values of B per k). */
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void gemm_tiled(long M, long N, long K, nd_geom bg,
                __global const A_ST *A, long a_sm, long a_sk,
                __global const B_ST *B, long b_sk, long b_sn,
                __global T *C, long c_sm, long c_sn) {
    __local T As[TSK * TSM];
    __local T Bs[TSK * TSN];
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int tid = tm * RTSN + tn;
    const long n0 = (long)get_group_id(0) * TSN, m0 = (long)get_group_id(1) * TSM;
    long off[3];
    GEOM_OFFSETS(bg, (long)get_global_id(2), 3, off);
    __global const A_ST *pa = A + off[1];
    __global const B_ST *pb = B + off[2];

    T acc[WPTM][WPTN];
#pragma unroll
    for (int i = 0; i < WPTM; i++)
#pragma unroll
        for (int j = 0; j < WPTN; j++) acc[i][j] = 0;

    for (long k0 = 0; k0 < K; k0 += TSK) {
        load_tile(As, pa, pb, 0, A_SM, A_SK, m0, k0, M, K, TSM, A_LAYOUT, tid);
        load_tile(Bs, pa, pb, 1, B_SN, B_SK, n0, k0, N, K, TSN, B_LAYOUT, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (int k = 0; k < TSK; k++) {
            T ar[WPTM], br[WPTN];
#pragma unroll
            for (int i = 0; i < WPTM; i++) ar[i] = As[k * TSM + tm + i * RTSM];
#pragma unroll
            for (int j = 0; j < WPTN; j++) br[j] = Bs[k * TSN + tn + j * RTSN];
#pragma unroll
            for (int i = 0; i < WPTM; i++)
#pragma unroll
                for (int j = 0; j < WPTN; j++) acc[i][j] += ar[i] * br[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    __global T *pc = C + off[0];
#if defined(C_LAYOUT) && C_LAYOUT == 1
    /* C contiguous along M (c_sm == 1: the transposed view of a weight
     * gradient's accumulator): neighbouring work-items hold neighbouring
     * columns, whose elements lie c_sn apart, so the tile goes through local
     * memory (column-major, rows padded by one against bank conflicts) and
     * is stored down the columns; the values are the same. */
    __local T Cs[TSN * (TSM + 1)];
#pragma unroll
    for (int i = 0; i < WPTM; i++)
#pragma unroll
        for (int j = 0; j < WPTN; j++) Cs[(tn + j * RTSN) * (TSM + 1) + tm + i * RTSM] = acc[i][j];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = tid; e < TSM * TSN; e += WG) {
        int mm = e % TSM, nn = e / TSM;
        long m = m0 + mm, n = n0 + nn;
        if (m < M && n < N) STORE_C(pc[m + n * c_sn], Cs[nn * (TSM + 1) + mm]);
    }
#else
#pragma unroll
    for (int i = 0; i < WPTM; i++) {
        long m = m0 + tm + i * RTSM;
        if (m >= M) break;
#pragma unroll
        for (int j = 0; j < WPTN; j++) {
            long n = n0 + tn + j * RTSN;
            if (n < N) STORE_C(pc[m * c_sm + n * c_sn], acc[i][j]);
        }
    }
#endif
}

#else /* !USE_LOCAL */

#if VW == 1
typedef T vec_t;
#else
typedef CAT(T, VW) vec_t;
#endif

#ifndef DOT
#if VW > 1 && B_LAYOUT != 1
#error "the direct kernel's vector loads need B contiguous along N"
#endif

/* ------------------------------------------------------------- direct
 * The same register tiling without local memory: each work-item reads its
 * WPTM rows of A and WPTN columns of B straight from global memory (the
 * caches do the sharing). Best where local memory is only emulated (CPU
 * drivers such as POCL) and a fallback where it is small. Here VW is the
 * vector width along N (B_LAYOUT 1 only; the host builds VW 1 otherwise):
 * the work-item's columns are WPTN / VW vectors of VW neighbours,
 * accumulated in vector registers, which is what makes a CPU driver use
 * its SIMD units (work-item vectorisation does not reach through the k
 * loop). Rows and columns past the edge are clamped for the loads and
 * skipped at the store, so the inner loop has no branches. */
#define NV (WPTN / VW) /* vectors per work-item along N */

__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void gemm_direct(long M, long N, long K, nd_geom bg,
                 __global const A_ST *A, long a_sm, long a_sk,
                 __global const B_ST *B, long b_sk, long b_sn,
                 __global T *C, long c_sm, long c_sn) {
    const int tn = get_local_id(0), tm = get_local_id(1);
    const long nb = (long)get_group_id(0) * TSN, m0 = (long)get_group_id(1) * TSM + tm;
    long off[3];
    GEOM_OFFSETS(bg, (long)get_global_id(2), 3, off);
    __global const A_ST *pa[WPTM];
#pragma unroll
    for (int i = 0; i < WPTM; i++) pa[i] = A + off[1] + min(m0 + i * RTSM, M - 1) * A_SM;
    __global const B_ST *pb = B + off[2];
    long col[NV]; /* first column of each vector */
#pragma unroll
    for (int j = 0; j < NV; j++) col[j] = nb + ((long)j * RTSN + tn) * VW;

    vec_t acc[WPTM][NV];
#pragma unroll
    for (int i = 0; i < WPTM; i++)
#pragma unroll
        for (int j = 0; j < NV; j++) acc[i][j] = (vec_t)0;

#if VW > 1
    if (col[NV - 1] + VW <= N) { /* every vector inside: plain vector loads */
        for (long k = 0; k < K; k++) {
            vec_t br[NV];
#pragma unroll
            for (int j = 0; j < NV; j++) br[j] = LDVB(pb + k * B_SK + col[j]);
#pragma unroll
            for (int i = 0; i < WPTM; i++) {
                T a = LDA(pa[i], k * A_SK);
#pragma unroll
                for (int j = 0; j < NV; j++) acc[i][j] += a * br[j];
            }
        }
    } else { /* the right edge: element loads, clamped */
        for (long k = 0; k < K; k++) {
            vec_t br[NV];
#pragma unroll
            for (int j = 0; j < NV; j++) {
                T t[VW];
#pragma unroll
                for (int v = 0; v < VW; v++) t[v] = LDB(pb, k * B_SK + min(col[j] + v, N - 1));
                br[j] = CAT(vload, VW)(0, t);
            }
#pragma unroll
            for (int i = 0; i < WPTM; i++) {
                T a = LDA(pa[i], k * A_SK);
#pragma unroll
                for (int j = 0; j < NV; j++) acc[i][j] += a * br[j];
            }
        }
    }
#else
    __global const B_ST *pbj[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) pbj[j] = pb + min(col[j], N - 1) * B_SN;
    for (long k = 0; k < K; k++) {
        T br[NV];
#pragma unroll
        for (int j = 0; j < NV; j++) br[j] = LDB(pbj[j], k * B_SK);
#pragma unroll
        for (int i = 0; i < WPTM; i++) {
            T a = LDA(pa[i], k * A_SK);
#pragma unroll
            for (int j = 0; j < NV; j++) acc[i][j] += a * br[j];
        }
    }
#endif

    __global T *pc = C + off[0];
#pragma unroll
    for (int i = 0; i < WPTM; i++) {
        long m = m0 + i * RTSM;
        if (m >= M) break;
#pragma unroll
        for (int j = 0; j < NV; j++) {
#if VW > 1
            if (c_sn == 1 && col[j] + VW <= N) {
#if defined(ACCUMULATE) && ACCUMULATE
                CAT(vstore, VW)(CAT(vload, VW)(0, pc + m * c_sm + col[j]) + acc[i][j], 0,
                                pc + m * c_sm + col[j]);
#else
                CAT(vstore, VW)(acc[i][j], 0, pc + m * c_sm + col[j]);
#endif
            } else {
                T t[VW];
                CAT(vstore, VW)(acc[i][j], 0, t);
#pragma unroll
                for (int v = 0; v < VW; v++)
                    if (col[j] + v < N) STORE_C(pc[m * c_sm + (col[j] + v) * c_sn], t[v]);
            }
#else
            if (col[j] < N) STORE_C(pc[m * c_sm + col[j] * c_sn], acc[i][j]);
#endif
        }
    }
}

#else /* DOT */

/* ------------------------------------------------------------- dot
 * For B contiguous along K (x @ W:t(), the Linear layer's product): each
 * work-item keeps WPTM x WPTN dot products as vectors of VW partial sums
 * along K, loading VW consecutive k of its rows of A and columns of B at a
 * time (element loads where an operand is not unit-stride along K), and
 * adds the lanes up at the end; the K % VW tail is scalar. Work-item
 * (tn, tm) computes rows tm + i*(TSM/WPTM) and cols tn + j*(TSN/WPTN). */
/* (two functions, not one: A and B may have different storage types, and
 * OpenCL C has no generic pointer to pass either) */
inline vec_t load_ka(__global const A_ST *p, long stride) {
#if VW == 1
    return LDA(p, 0);
#else
    T t[VW];
#pragma unroll
    for (int v = 0; v < VW; v++) t[v] = LDA(p, v * stride);
    return CAT(vload, VW)(0, t);
#endif
}

inline vec_t load_kb(__global const B_ST *p, long stride) {
#if VW == 1
    return LDB(p, 0);
#else
    T t[VW];
#pragma unroll
    for (int v = 0; v < VW; v++) t[v] = LDB(p, v * stride);
    return CAT(vload, VW)(0, t);
#endif
}

inline T lane_sum(vec_t x) {
#if VW == 1
    return x;
#else
    T t[VW];
    CAT(vstore, VW)(x, 0, t);
    T s = 0;
#pragma unroll
    for (int v = 0; v < VW; v++) s += t[v];
    return s;
#endif
}

__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void gemm_dot(long M, long N, long K, nd_geom bg,
              __global const A_ST *A, long a_sm, long a_sk,
              __global const B_ST *B, long b_sk, long b_sn,
              __global T *C, long c_sm, long c_sn) {
    const int tn = get_local_id(0), tm = get_local_id(1);
    const long m0 = (long)get_group_id(1) * TSM + tm, n0 = (long)get_group_id(0) * TSN + tn;
    long off[3];
    GEOM_OFFSETS(bg, (long)get_global_id(2), 3, off);
    __global const A_ST *pa[WPTM];
    __global const B_ST *pb[WPTN];
#pragma unroll
    for (int i = 0; i < WPTM; i++) pa[i] = A + off[1] + min(m0 + i * RTSM, M - 1) * A_SM;
#pragma unroll
    for (int j = 0; j < WPTN; j++) pb[j] = B + off[2] + min(n0 + j * RTSN, N - 1) * B_SN;

    vec_t acc[WPTM][WPTN];
#pragma unroll
    for (int i = 0; i < WPTM; i++)
#pragma unroll
        for (int j = 0; j < WPTN; j++) acc[i][j] = (vec_t)0;
    long k = 0;
    for (; k + VW <= K; k += VW) {
        vec_t av[WPTM], bv[WPTN];
#pragma unroll
        for (int i = 0; i < WPTM; i++) {
#if A_LAYOUT == 2 && VW > 1
            av[i] = LDVA(pa[i] + k);
#else
            av[i] = load_ka(pa[i] + k * A_SK, A_SK);
#endif
        }
#pragma unroll
        for (int j = 0; j < WPTN; j++) {
#if B_LAYOUT == 2 && VW > 1
            bv[j] = LDVB(pb[j] + k);
#else
            bv[j] = load_kb(pb[j] + k * B_SK, B_SK);
#endif
        }
#pragma unroll
        for (int i = 0; i < WPTM; i++)
#pragma unroll
            for (int j = 0; j < WPTN; j++) acc[i][j] += av[i] * bv[j];
    }
    T sum[WPTM][WPTN];
#pragma unroll
    for (int i = 0; i < WPTM; i++)
#pragma unroll
        for (int j = 0; j < WPTN; j++) sum[i][j] = lane_sum(acc[i][j]);
    for (; k < K; k++) {
#pragma unroll
        for (int i = 0; i < WPTM; i++)
#pragma unroll
            for (int j = 0; j < WPTN; j++) sum[i][j] += LDA(pa[i], k * A_SK) * LDB(pb[j], k * B_SK);
    }

    __global T *pc = C + off[0];
#pragma unroll
    for (int i = 0; i < WPTM; i++) {
        long m = m0 + i * RTSM;
        if (m >= M) break;
#pragma unroll
        for (int j = 0; j < WPTN; j++) {
            long n = n0 + j * RTSN;
            if (n < N) STORE_C(pc[m * c_sm + n * c_sn], sum[i][j]);
        }
    }
}

#endif /* DOT */
#endif /* USE_LOCAL */
#endif /* TSM */

/* ------------------------------------------------------------- skinny
 * Products with few rows (M <= 32: a recurrent step's h @ W, its gradient
 * dgates @ W) on a GPU. A tiled kernel gives such a product a handful of
 * work-groups (M / 64 x N / 64), each walking all of K alone, and leaves
 * most of the GPU idle. Here a work-group of SKN x SKS work-items computes
 * SKR rows x SKN columns of C and splits K among SKS slices: each
 * work-item keeps SKR sums for its column over its slice of K, and the
 * slices' sums are added in local memory in a fixed order (deterministic).
 * With SKL (B contiguous along K) the slices are the fast dimension and
 * interleave along K, so neighbouring work-items read neighbouring
 * elements; otherwise the columns are, and each slice is one contiguous
 * range of K. The matmul launcher picks this kernel (ocl_matmul.c); it
 * computes C^T = B^T A^T for few columns. Build defines: SKR, SKN, SKS,
 * SKL, A_LAYOUT, B_LAYOUT (and ACCUMULATE). */
#ifdef SKR
#if SKL
#define SK_LOCAL0 SKS
#define SK_LOCAL1 SKN
#else
#define SK_LOCAL0 SKN
#define SK_LOCAL1 SKS
#endif
__kernel __attribute__((reqd_work_group_size(SK_LOCAL0, SK_LOCAL1, 1)))
void gemm_skinny(long M, long N, long K, nd_geom bg,
                 __global const A_ST *A, long a_sm, long a_sk,
                 __global const B_ST *B, long b_sk, long b_sn,
                 __global T *C, long c_sm, long c_sn) {
    __local T red[SKR][SKN][SKS];
#if SKL
    const int s = get_local_id(0), j = get_local_id(1);
#else
    const int j = get_local_id(0), s = get_local_id(1);
#endif
    const long n = (long)get_group_id(0) * SKN + j, m0 = (long)get_group_id(1) * SKR;
    long off[3];
    GEOM_OFFSETS(bg, (long)get_group_id(2), 3, off);
    /* columns and rows past the edge read the last valid one; never stored */
    __global const B_ST *pb = B + off[2] + (n < N ? n : N - 1) * B_SN;
    __global const A_ST *pa[SKR];
#pragma unroll
    for (int i = 0; i < SKR; i++) pa[i] = A + off[1] + (m0 + i < M ? m0 + i : M - 1) * A_SM;
    T acc[SKR];
#pragma unroll
    for (int i = 0; i < SKR; i++) acc[i] = 0;
#if SKL
    for (long k = s; k < K; k += SKS) {
#else
    const long kc = (K + SKS - 1) / SKS, k1 = min(K, (s + 1) * kc);
    for (long k = s * kc; k < k1; k++) {
#endif
        const T b = LDB(pb, k * B_SK);
#pragma unroll
        for (int i = 0; i < SKR; i++) acc[i] += LDA(pa[i], k * A_SK) * b;
    }
#pragma unroll
    for (int i = 0; i < SKR; i++) red[i][j][s] = acc[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    /* SKR <= SKS: work-item (j, s < SKR) adds the slices of row m0 + s */
    if (s < SKR && n < N && m0 + s < M) {
        T v = 0;
        for (int q = 0; q < SKS; q++) v += red[s][j][q];
        STORE_C(C[off[0] + (m0 + s) * c_sm + n * c_sn], v);
    }
}
#endif /* SKR */
