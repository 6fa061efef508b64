// Matrix products: the matrix-vector kernels of decode and the f16
// conversions that feed cuBLAS for prefill. Compiled after kernels.cu,
// whose helpers (deq, dp4a, pdl, ...) they use.

// The matrix-vector kernels compute out[r, j] = W[j] · a[r] (+ bias[j])
// for r < meta[which], MVR rows of a per pass over the weights. A block is
// MV_WARPS warps covering rpb output rows (1, 2 or 4, so 4/rpb warps split
// each row's K; or 8, half a warp a row); lanes stream 16-byte chunks of
// the row. With resid set,
// resid[r, j] += the result too (a fused residual add; resid is never a).
#define MV_WARPS 4
#define MVR 8

// no_epi is the products' epilogue by default: nothing after the store. An
// epilogue type F has a constexpr bool on and, where on, a member
// took(v, j) that the thread storing output j of a one-row product calls
// with the value it stored (sample.cu's fold_draw).
struct no_epi {
    static constexpr bool on = false;
    __device__ __forceinline__ void took(float, int) const {}
};

// mv_reduce sums each row's partial dot products over its warps and
// writes the M results of this pass. Every thread of the block calls it.
template <int M, typename F = no_epi>
__device__ __forceinline__ void mv_reduce(acc_t (&acc)[M], float* out, float* resid, const float* bias, int r0, int j,
                                          int N, bool live, int wpr, int lpr, const F& epi = F()) {
    __shared__ acc_t part[MV_WARPS][MVR];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < M; k++)
        for (int o = lpr >> 1; o > 0; o >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    if (wpr > 1) {
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < M; k++) part[warp][k] = acc[k];
        __syncthreads();
        if (lane == 0 && warp % wpr == 0)
#pragma unroll
            for (int k = 0; k < M; k++) {
                acc_t s = 0.f;
                for (int w = 0; w < wpr; w++) s += part[warp + w][k];
                acc[k] = s;
            }
        __syncthreads();
    }
    if (!live || (lane & (lpr - 1)) != 0 || warp % wpr != 0) return;
    float bj = bias ? bias[j] : 0.f;
#pragma unroll
    for (int k = 0; k < M; k++) {
        u64 at = (u64)(r0 + k) * N + j;
        float v = (float)acc[k] + bj;
        out[at] = v;
        if (resid) resid[at] += v;
        if constexpr (F::on) {
            static_assert(M == 1, "an epilogue takes one-row products");
            epi.took(v, j);
        }
    }
}

// MV_EARLY (0 or 1): the quantized types' one-row kernels (matvec1_*,
// matvec13_*, matvec1_glu_*, matvec1w_glu_*) issue their first batch of
// weight loads before they wait for the kernel before them (pdl_late):
// weights never depend on it, and under programmatic dependent launch a
// kernel's blocks are placed while the one before it runs (a norm, a
// rope, the decode attention: a few blocks), so those loads fly during
// it. Same run on an H100, tg128 against the build before: 8B Q4_0 427.0
// / 425.9 tok/s against 391.2 / 392.2, Q8_0 286.3 / 285.4 against 268.0
// / 265.4; 1B Q4_0 1,533 / 1,535 against 1,391, Q8_0 1,164 / 1,161
// against 1,070 / 1,066. MVF_EARLY does the same for the float types:
// 1B BF16 747.7 / 745.8 against 734.3 / 731.1, 8B BF16 even.
// WEFT_CUDA_DEFINES=MV_EARLY=0,MVF_EARLY=0 waits first, for comparisons.
#ifndef MV_EARLY
#define MV_EARLY 1
#endif
// MVF_EARLY: the same for the float types' one-row kernels.
#ifndef MVF_EARLY
#define MVF_EARLY 1
#endif
// MVB_EARLY: the same for the kernels of batches of up to MVR rows
// (matvec_*, matvec3_*, matvec_glu_*), in their first pass. Same run,
// `weft bench --parallel 4` tg128: 8B Q4_0 873 / 882 tok/s against 830 /
// 828, 8B Q8_0 758 / 757 against 733 / 729, 1B Q4_0 3,546 / 3,635
// against 3,329 / 3,390.
#ifndef MVB_EARLY
#define MVB_EARLY 1
#endif

// mv_defers says whether the T kernels for up to MAXM rows wait in their
// first mv_dot rather than at their start.
template <int T, int MAXM>
__device__ constexpr bool mv_defers() {
    return MAXM == 1 ? (int8_act<T>() || k_type<T>() ? MV_EARLY : MVF_EARLY) : MVB_EARLY;
}

// ldw loads 16 bytes of weights that are read once per step: through the
// non-coherent path, without keeping them in L1 (the activations stay).
// V (volatile): the compiler keeps the load where it is, ahead of a
// dependency wait after it (mv_defers).
template <bool V = false>
__device__ __forceinline__ uint4 ldw(const u8* p) {
    uint4 v;
    if constexpr (V)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    return v;
}

// MV_BATCH chunks of a row are loaded before any is used, so that each
// lane keeps MV_BATCH 16-byte loads in flight.
#define MV_BATCH 4

// MVQ_XPRE_Q8 and MVQ_XPRE_Q4 (0 or 1): the one-row kernels (ONE:
// matvec1_* and matvec13_*) over Q8_0 (Q4_0) weights load each
// chunk's activations and scale with its weights, rather than as the
// chunk is summed, so that they are in flight together; the sums are the
// same. The Q8_0 kernels stay within 64 registers (matvec13_q8_0: 72), and
// the 8B shape decodes 2.8 % faster (H100, same run, tg128: 267.3 / 267.2
// against 260.7 / 259.3 tok/s; the 1B shape even). Q4_0's two activation
// vectors a chunk take matvec1_q4_0 to 79 registers, past the 8 blocks a
// multiprocessor it runs: 8B Q4_0 lost 11 %, so Q4_0 keeps its loads
// where they were. MVQ_XPRE_Q4=2 loads only Q4_0's first activation
// vector and scale with the weights: within the spread (8B Q4_0 393.4 /
// 395.0 against 392.9 / 393.0, 1B even), so not the default.
// WEFT_CUDA_DEFINES may set either, for comparisons.
#ifndef MVQ_XPRE_Q8
#define MVQ_XPRE_Q8 1
#endif
#ifndef MVQ_XPRE_Q4
#define MVQ_XPRE_Q4 0
#endif

// mv_term adds a chunk's term, its integer sum dot scaled by dw·da, to
// acc: (dw·da)·dot in float32, or under WEFT_EXACT fl32(dw·da) and dot as
// float64, whose product is exact.
__device__ __forceinline__ void mv_term(acc_t& acc, float dw, float da, int dot) {
#if WEFT_EXACT
    acc += (double)(dw * da) * (double)dot;
#else
    acc += dw * da * (float)dot;
#endif
}

// mvq_scales loads the scale of chunk c of a row whose scales start at d
// (and, for Q8_A, the min).
template <int T>
__device__ __forceinline__ void mvq_scales(float& dw, float& mw, const u16* d, int c) {
    if constexpr (T == W_Q8_A) {
        u32 dm = ((const u32*)d)[c >> 1];
        dw = h2f((u16)(dm & 0xffff));
        mw = h2f((u16)(dm >> 16));
    } else {
        dw = h2f(d[T == W_Q4_0 ? c : c >> 1]);
    }
}

// mvq_loadx loads the int8 activations (one 16-byte vector, or with two
// Q4_0's pair) and block scale of chunk c of row r0 for mvq_dot's
// activation preload.
template <int T, bool TWO, int NV>
__device__ __forceinline__ void mvq_loadx(int4 (&x)[NV], float& da, const signed char* qa, const float2* ds, int r0,
                                          int K, int nb, int c) {
    const int4* p = (const int4*)(qa + (u64)r0 * K + (u64)c * (T == W_Q4_0 ? 32 : 16));
    x[0] = p[0];
    if constexpr (TWO) x[TWO ? 1 : 0] = p[1];
    da = ds[(u64)r0 * nb + (T == W_Q4_0 ? c : c >> 1)].x;
}

// mvq_dot: this thread's part of M rows of int8 activations against NW
// Q8_0 or Q4_0 rows of one shape (a gate and an up row: NW = 2), B chunks
// of each in flight. A chunk is 16 bytes of quants: a whole block (Q4_0;
// byte i holds elements i and i+16) or half a block (Q8_0). The
// activations are loaded once for the NW rows. With early set (1: and
// trigger the next launch, 2: not) the thread waits for the kernel before
// (pdl_late) once its first batch of weight loads is issued, and loads
// activations only after that.
template <int T, int M, int B, int NW, bool ONE = false, bool E = false>
__device__ __forceinline__ void mvq_dot(acc_t (&acc)[NW][M], const signed char* qa, const float2* ds,
                                        const u8* const (&row)[NW], const u16* const (&d)[NW], int r0, int K,
                                        bool live, int sub, int nsub, int early = 0) {
#pragma unroll
    for (int w = 0; w < NW; w++)
#pragma unroll
        for (int k = 0; k < M; k++) acc[w][k] = 0.f;
    int nb = K >> 5, nc = T == W_Q4_0 ? nb : K >> 4;
    constexpr int lvl = ONE && NW == 1 ? (T == W_Q4_0 ? MVQ_XPRE_Q4 : MVQ_XPRE_Q8) : 0;
    constexpr bool pre = lvl > 0, pre1 = T == W_Q4_0 && lvl == 1; // pre1: Q4_0's second vector too
    constexpr int XB = pre ? B : 1;
    if (live) {
        for (int c0 = sub; c0 < nc; c0 += B * nsub) {
            uint4 q[NW][B];
            float dw[NW][B], mw[NW][T == W_Q8_A ? B : 1]; // mw: Q8_A's mins
            int4 xp[XB][pre1 ? 2 : 1];
            float dp[XB];
            if constexpr (E) {
                // The block's first batch: the weights' loads fly across
                // the wait, the activations' come after it.
                bool wait = early && c0 == sub;
#pragma unroll
                for (int u = 0; u < B; u++) {
                    int c = c0 + u * nsub;
                    if (c < nc) {
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            q[w][u] = ldw<true>(row[w] + (u64)c * 16);
                            mvq_scales<T>(dw[w][u], mw[w][T == W_Q8_A ? u : 0], d[w], c);
                        }
                        if constexpr (pre)
                            if (!wait) mvq_loadx<T, pre1>(xp[u], dp[u], qa, ds, r0, K, nb, c);
                    }
                }
                if (wait) {
                    pdl_late(early == 1);
                    early = 0;
                    if constexpr (pre)
#pragma unroll
                        for (int u = 0; u < B; u++)
                            if (c0 + u * nsub < nc)
                                mvq_loadx<T, pre1>(xp[u], dp[u], qa, ds, r0, K, nb, c0 + u * nsub);
                }
            } else {
                // Kept apart from the loop above, so that with the early
                // loads off (MV_EARLY, MVB_EARLY = 0) the kernels compile as
                // they did before them (one loop for both gave matvec_q4_0
                // 128 registers and spills instead of 91).
#pragma unroll
                for (int u = 0; u < B; u++) {
                    int c = c0 + u * nsub;
                    if (c < nc) {
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            q[w][u] = ldw(row[w] + (u64)c * 16);
                            mvq_scales<T>(dw[w][u], mw[w][T == W_Q8_A ? u : 0], d[w], c);
                        }
                        if constexpr (pre) mvq_loadx<T, pre1>(xp[u], dp[u], qa, ds, r0, K, nb, c);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = c0 + u * nsub;
                if (c >= nc) continue;
                if constexpr (T == W_Q4_0) {
                    // The levels n - 8 as signed bytes (nib_lo /
                    // nib_hi), so the block's integer sum Σ (n-8)·q is
                    // exact and scaled once by dw·da, as the CPU backend
                    // does.
#pragma unroll
                    for (int k = 0; k < M; k++) {
                        const int4* x = (const int4*)(qa + (u64)(r0 + k) * K + (u64)c * 32);
                        int4 x0, x1;
                        float da;
                        if constexpr (pre) {
                            x0 = xp[u][0], x1 = pre1 ? xp[u][pre1 ? 1 : 0] : x[1], da = dp[u];
                        } else {
                            x0 = x[0], x1 = x[1], da = ds[(u64)(r0 + k) * nb + c].x;
                        }
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            int dot = dp4a((int)nib_lo(q[w][u].x), x0.x, 0);
                            dot = dp4a((int)nib_lo(q[w][u].y), x0.y, dot);
                            dot = dp4a((int)nib_lo(q[w][u].z), x0.z, dot);
                            dot = dp4a((int)nib_lo(q[w][u].w), x0.w, dot);
                            dot = dp4a((int)nib_hi(q[w][u].x), x1.x, dot);
                            dot = dp4a((int)nib_hi(q[w][u].y), x1.y, dot);
                            dot = dp4a((int)nib_hi(q[w][u].z), x1.z, dot);
                            dot = dp4a((int)nib_hi(q[w][u].w), x1.w, dot);
                            mv_term(acc[w][k], dw[w][u], da, dot);
                        }
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < M; k++) {
                        int4 x;
                        float da;
                        if constexpr (pre) {
                            x = xp[u][0], da = dp[u];
                        } else {
                            x = *(const int4*)(qa + (u64)(r0 + k) * K + (u64)c * 16);
                            da = ds[(u64)(r0 + k) * nb + (c >> 1)].x;
                        }
                        // Q8_A: the min times the half block's level sum
                        int sa = 0;
                        if constexpr (T == W_Q8_A)
                            sa = dp4a(0x01010101, x.x, dp4a(0x01010101, x.y, dp4a(0x01010101, x.z, dp4a(0x01010101, x.w, 0))));
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            int dot = dp4a((int)q[w][u].x, x.x, 0);
                            dot = dp4a((int)q[w][u].y, x.y, dot);
                            dot = dp4a((int)q[w][u].z, x.z, dot);
                            dot = dp4a((int)q[w][u].w, x.w, dot);
                            mv_term(acc[w][k], dw[w][u], da, dot);
                            if constexpr (T == W_Q8_A) mv_term(acc[w][k], mw[w][u], da, sa);
                        }
                    }
                }
            }
        }
    }
    if constexpr (E)
        if (early) pdl_late(early == 1); // no chunk of its own: the thread still waits
}

// mvf_dot: this thread's part of M float32 activation rows against NW
// F32, F16 or BF16 rows of one shape; 16-byte chunks (B of each row in
// flight) when K allows (vec), else one element per lane. early and E as
// for mvq_dot.
template <int T, int M, int B, int NW, bool E = false>
__device__ __forceinline__ void mvf_dot(acc_t (&acc)[NW][M], const float* a, const u8* const (&row)[NW], int r0,
                                        int K, bool live, int sub, int nsub, bool vec, int early = 0) {
#pragma unroll
    for (int w = 0; w < NW; w++)
#pragma unroll
        for (int k = 0; k < M; k++) acc[w][k] = 0.f;
    if (live && vec) {
        const int per = T == W_F32 ? 4 : 8; // elements in a chunk
        int nc = K / per;
        for (int c0 = sub; c0 < nc; c0 += B * nsub) {
            uint4 q[NW][B];
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = c0 + u * nsub;
                if (c < nc)
#pragma unroll
                    for (int w = 0; w < NW; w++) q[w][u] = ldw<E>(row[w] + (u64)c * 16);
            }
            if constexpr (E)
                if (early) {
                    pdl_late(early == 1);
                    early = 0;
                }
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = c0 + u * nsub;
                if (c >= nc) continue;
                float wv[NW][8];
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    u32 p[4] = {q[w][u].x, q[w][u].y, q[w][u].z, q[w][u].w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if constexpr (T == W_F32) {
                            wv[w][e] = __uint_as_float(p[e]);
                        } else if constexpr (T == W_F16) {
                            wv[w][2 * e] = h2f((u16)(p[e] & 0xffff));
                            wv[w][2 * e + 1] = h2f((u16)(p[e] >> 16));
                        } else {
                            wv[w][2 * e] = __uint_as_float(p[e] << 16);
                            wv[w][2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
                        }
                    }
                }
#pragma unroll
                for (int k = 0; k < M; k++) {
                    const float4* x = (const float4*)(a + (u64)(r0 + k) * K + (u64)c * per);
                    float4 x0 = x[0], x1;
                    if constexpr (T != W_F32) x1 = x[1];
#pragma unroll
                    for (int w = 0; w < NW; w++) {
#if WEFT_EXACT
                        // each product exact in float64
                        acc_t v = (acc_t)wv[w][0] * x0.x + (acc_t)wv[w][1] * x0.y + (acc_t)wv[w][2] * x0.z +
                                  (acc_t)wv[w][3] * x0.w;
                        if constexpr (T != W_F32)
                            v += (acc_t)wv[w][4] * x1.x + (acc_t)wv[w][5] * x1.y + (acc_t)wv[w][6] * x1.z +
                                 (acc_t)wv[w][7] * x1.w;
#else
                        float v = wv[w][0] * x0.x + wv[w][1] * x0.y + wv[w][2] * x0.z + wv[w][3] * x0.w;
                        if constexpr (T != W_F32) v += wv[w][4] * x1.x + wv[w][5] * x1.y + wv[w][6] * x1.z + wv[w][7] * x1.w;
#endif
                        acc[w][k] += v;
                    }
                }
            }
        }
    } else if (live) {
        if constexpr (E)
            if (early) {
                pdl_late(early == 1);
                early = 0;
            }
        for (int i = sub; i < K; i += nsub) {
#pragma unroll
            for (int w = 0; w < NW; w++) {
                float wi = deq<T>(row[w], 0, i);
#pragma unroll
                for (int k = 0; k < M; k++) acc[w][k] += (acc_t)wi * a[(u64)(r0 + k) * K + i];
            }
        }
    }
    if constexpr (E)
        if (early) pdl_late(early == 1); // no chunk of its own: the thread still waits
}

// mv_dot is this thread's part of the products of M activation rows (x
// from row r0: int8 with block scales ds for Q8_0 and Q4_0, else float32)
// with NW weight rows of one shape (their scales at d), B chunks of each
// in flight.
template <int T, int M, int B, int NW, bool ONE = false, bool E = false>
__device__ __forceinline__ void mv_dot(acc_t (&acc)[NW][M], const void* x, const float2* ds,
                                       const u8* const (&row)[NW], const u16* const (&d)[NW], int r0, int K,
                                       bool live, int sub, int nsub, int early = 0) {
    if constexpr (int8_act<T>())
        mvq_dot<T, M, B, NW, ONE, E>(acc, (const signed char*)x, ds, row, d, r0, K, live, sub, nsub, early);
    else
        mvf_dot<T, M, B, NW, E>(acc, (const float*)x, row, r0, K, live, sub, nsub,
                                T == W_F32 ? (K & 3) == 0 : (K & 7) == 0, early);
}

// mv_pass: M activation rows against one weight row, the results written.
template <int T, int M, int B, bool ONE = false, bool E = false, typename F = no_epi>
__device__ __forceinline__ void mv_pass(float* out, float* resid, const void* x, const float2* ds, const u8* row,
                                        const u16* d, const float* bias, int r0, int K, int N, int j, bool live,
                                        int sub, int nsub, int wpr, int lpr, int early = 0, const F& epi = F()) {
    acc_t acc[1][M];
    const u8* rows[1] = {row};
    const u16* ds1[1] = {d};
    mv_dot<T, M, B, 1, ONE, E>(acc, x, ds, rows, ds1, r0, K, live, sub, nsub, early);
    mv_reduce<M>(acc[0], out, resid, bias, r0, j, N, live, wpr, lpr, epi);
}

// mv_group computes output rows [g*rpb, g*rpb+rpb) of one weight for the
// first n activation rows, MVR rows a pass, each pass dispatched to the
// pass of exactly that many rows. For the quantized types x is qa and ds
// the block scales; for the others x is the float32 activation. A block
// covers rpb output rows: 8 (two a warp, 16 lanes each: short rows), 4 (a
// warp a row), 2 or 1 (2 or 4 warps a row: few rows). first: g is the
// block's first group (of every weight of its launch), in which a kernel
// that defers its dependency wait (mv_defers) waits.
template <int T, int MAXM, int B, typename F = no_epi>
__device__ __forceinline__ void mv_group(float* out, float* resid, const void* x, const float2* ds, const u8* w,
                                         long long rowBytes, long long dOff, const float* bias, int n, int K, int N,
                                         int rpb, int g, bool first, const F& epi = F()) {
    // The block's first group waits for the kernel before (mv_defers).
    int early = mv_defers<T, MAXM>() && first ? (TRIGGER_MV ? 1 : 2) : 0;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int lpr = rpb > MV_WARPS ? 32 * MV_WARPS / rpb : 32; // lanes a row
    int wpr = rpb >= MV_WARPS ? 1 : MV_WARPS / rpb;     // warps a row
    int sub = (warp % wpr) * lpr + (lane & (lpr - 1)), nsub = wpr * lpr;
    int j = g * rpb + (warp / wpr) * (32 / lpr) + lane / lpr;
    bool live = j < N;
    const u8* row = w + (u64)(live ? j : 0) * rowBytes;
    const u16* d = (const u16*)(w + dOff) + (u64)(live ? j : 0) * (K >> 5) * scale_words<T>();
    if constexpr (MAXM == 1) {
        mv_pass<T, 1, B, true, mv_defers<T, 1>()>(out, resid, x, ds, row, d, bias, 0, K, N, j, live, sub, nsub, wpr, lpr,
                                                  early, epi);
        return;
    } else {
        static_assert(!F::on, "an epilogue takes one-row products");
    }
    for (int r0 = 0; r0 < n; r0 += MVR) {
        int m = min(MVR, n - r0);
#define MV_CASE(M)                                                                           \
    case M:                                                                                  \
        mv_pass<T, M, B, false, mv_defers<T, MAXM>()>(out, resid, x, ds, row, d, bias, r0, K, N, j, live, sub, nsub, \
                                                      wpr, lpr, r0 == 0 ? early : 0);                              \
        break;
        switch (m) {
            MV_CASE(1)
            MV_CASE(2)
            MV_CASE(3)
            MV_CASE(4)
            MV_CASE(5)
            MV_CASE(6)
            MV_CASE(7)
            MV_CASE(8)
        }
#undef MV_CASE
    }
    // A batch of no rows would run no pass and so never wait; Validate
    // allows none (branch attn-q adds a guard, not yet run on a GPU).
}

// matvec: out[r, j] = W[j] · x[r] (+ bias[j]) for r < meta[which]. Blocks
// loop over the groups of rpb rows, so the grid need not cover them all.
template <int T, int MAXM, int B, typename F = no_epi>
__device__ void matvec(float* out, float* resid, const void* x, const float2* ds, const u8* w, long long rowBytes,
                       long long dOff, const float* bias, const int* meta, int which, int K, int N, int rpb,
                       const F& epi = F()) {
    int n = meta[which], groups = (N + rpb - 1) / rpb;
    for (int g = blockIdx.x; g < groups; g += gridDim.x)
        mv_group<T, MAXM, B>(out, resid, x, ds, w, rowBytes, dOff, bias, n, K, N, rpb, g, g == (int)blockIdx.x, epi);
}

// matvec3 is matvec over up to three weights of one type and width that
// read the same input (a layer's q, k and v): one launch whose groups of
// rpb rows run over the weights' rows in turn. A weight with N = 0 is
// absent.
template <int T, int MAXM, int B>
__device__ void matvec3(const void* x, const float2* ds, long long rowBytes, const int* meta, int which, int K,
                        int rpb, float* out0, const u8* w0, long long dOff0, const float* bias0, int N0, float* out1,
                        const u8* w1, long long dOff1, const float* bias1, int N1, float* out2, const u8* w2,
                        long long dOff2, const float* bias2, int N2) {
    int n = meta[which], g0 = (N0 + rpb - 1) / rpb, g1 = (N1 + rpb - 1) / rpb, g2 = (N2 + rpb - 1) / rpb;
    for (int g = blockIdx.x; g < g0 + g1 + g2; g += gridDim.x) {
        bool a = g < g0, b = !a && g < g0 + g1;
        mv_group<T, MAXM, B>(a ? out0 : b ? out1 : out2, nullptr, x, ds, a ? w0 : b ? w1 : w2, rowBytes,
                    a ? dOff0 : b ? dOff1 : dOff2, a ? bias0 : b ? bias1 : bias2, n, K, a ? N0 : b ? N1 : N2, rpb,
                    a ? g : b ? g - g0 : g - g0 - g1, g == (int)blockIdx.x);
    }
}

// GLU_ROWS output rows of a GLU block: one int8 block of the down
// product's input. The block's warps (a power of two, at most GLU_WARPS,
// so that its passes tile GLU_ROWS; the plan picks) take its rows a warp
// (or, for rows of at most 64 chunks, half a warp) a row, gate and up
// together.
#define GLU_ROWS 32
#define GLU_WARPS 8
// The wide one-row GLU kernels (matvec1w_glu_*) take blocks of up to
// GLU1_WARPS warps and fit in 64 registers, so that 32 warps a
// multiprocessor can run (the plan sizes their blocks to the weight,
// gluTwin).
#define GLU1_WARPS 8
// GLU1_MINB: the wide GLU kernels' blocks a multiprocessor in their launch
// bounds (4: 64 registers), for comparisons.
#ifndef GLU1_MINB
#define GLU1_MINB 4
#endif

// mvk_dot is mv_dot for K-quant weights (matvec_k.cu): rows at row, their
// super-blocks' headers at hdr and Q6_K's scales (Q2_K's d and dmin) at d6.
template <int T, int M, int B, int NW, bool E>
__device__ __forceinline__ void mvk_dot(acc_t (&acc)[NW][M], const signed char* qa, const void* ds,
                                        const u8* const (&row)[NW], const uint4* const (&hdr)[NW],
                                        const u16* const (&d6)[NW], int r0, int K, bool live, int sub, int nsub,
                                        int early);

// glu_pass: M activation rows against the gate and up rows of group g,
// then the block's GLU_ROWS results through shared memory, so that each
// warp writes (and quantizes, with qo set) one activation row's block.
template <int T, int M, int B, bool E = false>
__device__ __forceinline__ void glu_pass(float* out, float* gout, float* uout, signed char* qo, float2* dso,
                                         const void* x, const float2* ds, const u8* wg, const u8* wu,
                                         long long rowBytes, long long dOffG, long long dOffU, int r0, int K, int N,
                                         int g, int lpr, int act, int early = 0) {
    __shared__ float res[MVR][GLU_ROWS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane & (lpr - 1);
    int nw = blockDim.x >> 5, rpw = 32 / lpr, per = nw * rpw; // warps, rows a warp, rows a pass of the block
    for (int lr0 = 0; lr0 < GLU_ROWS; lr0 += per) {
        int lr = lr0 + warp * rpw + lane / lpr, j = g * GLU_ROWS + lr;
        bool live = j < N;
        u64 jr = live ? j : 0;
        const u8* rows[2] = {wg + jr * rowBytes, wu + jr * rowBytes};
        acc_t a[2][M];
        if constexpr (k_type<T>()) {
            // K_A32's records: kernels.cu
            u64 nsb = K >> 8, dw = T == W_Q2_K ? 2 : 1;
            const uint4* hdr[2] = {(const uint4*)(wg + dOffG) + jr * nsb, (const uint4*)(wu + dOffU) + jr * nsb};
            const u16* d6[2] = {(const u16*)(wg + dOffG + (u64)N * nsb * 16) + jr * nsb * dw,
                                (const u16*)(wu + dOffU + (u64)N * nsb * 16) + jr * nsb * dw};
            mvk_dot<T, M, B, 2, E>(a, (const signed char*)x, ds, rows, hdr, d6, r0, K, live, sub, lpr,
                                   lr0 == 0 ? early : 0);
        } else {
            const u16* sc[2] = {(const u16*)(wg + dOffG) + jr * (K >> 5) * scale_words<T>(),
                                (const u16*)(wu + dOffU) + jr * (K >> 5) * scale_words<T>()};
            mv_dot<T, M, B, 2, false, E>(a, x, ds, rows, sc, r0, K, live, sub, lpr, lr0 == 0 ? early : 0);
        }
#pragma unroll
        for (int k = 0; k < M; k++)
            for (int o = lpr >> 1; o > 0; o >>= 1) {
                a[0][k] += __shfl_xor_sync(0xffffffffu, a[0][k], o);
                a[1][k] += __shfl_xor_sync(0xffffffffu, a[1][k], o);
            }
        if (live && sub == 0)
#pragma unroll
            for (int k = 0; k < M; k++) {
                u64 at = (u64)(r0 + k) * N + j;
                res[k][lr] = glu_value((float)a[0][k], (float)a[1][k], act);
                if (gout) gout[at] = (float)a[0][k];
                if (uout) uout[at] = (float)a[1][k];
            }
    }
    __syncthreads();
    int i = g * GLU_ROWS + lane;
    for (int k = warp; k < M; k += nw) {
        float v = i < N ? res[k][lane] : 0.f;
        u64 at = (u64)(r0 + k) * N + i;
        if (i < N) out[at] = v;
        if (qo) q8_store(v, qo + at, dso + (at >> 5), lane);
    }
    __syncthreads();
}

// matvec_glu is the products by a gate and an up weight of one type and
// shape that read the same input, and the GLU of the two: out[r, j] =
// act(Wg[j] · x[r]) * (Wu[j] · x[r]). The products are also written to
// gout and uout where those are set (their own buffers), and with qo set
// (N a multiple of 32) the GLU is quantized as quantize_q8 does for the
// down product. A block covers GLU_ROWS rows (one int8 block) at a time.
template <int T, int MAXM, int B>
__device__ void matvec_glu(float* out, float* gout, float* uout, signed char* qo, float2* dso, const void* x,
                           const float2* ds, const u8* wg, const u8* wu, long long rowBytes, long long dOffG,
                           long long dOffU, const int* meta, int which, int K, int N, int act) {
    int n = meta[which], groups = (N + GLU_ROWS - 1) / GLU_ROWS;
    int chunks = T == W_Q4_0 || k_type<T>() ? K >> 5 : T == W_Q8_0 || T == W_Q8_A ? K >> 4 : T == W_F32 ? K >> 2 : K >> 3;
    int lpr = chunks <= 64 ? 16 : 32;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        int early = mv_defers<T, MAXM>() && g == (int)blockIdx.x ? (TRIGGER_GLU ? 1 : 2) : 0;
        if constexpr (MAXM == 1) {
            glu_pass<T, 1, B, mv_defers<T, MAXM>()>(out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, 0,
                                                    K, N, g, lpr, act, early);
            continue;
        }
        for (int r0 = 0; r0 < n; r0 += MVR) {
            int m = min(MVR, n - r0);
#define GLU_CASE(M)                                                                                            \
    case M:                                                                                                    \
        glu_pass<T, M, B, mv_defers<T, MAXM>()>(out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, r0, K, \
                                                N, g, lpr, act, r0 == 0 ? early : 0);                              \
        break;
            switch (m) {
                GLU_CASE(1)
                GLU_CASE(2)
                GLU_CASE(3)
                GLU_CASE(4)
                GLU_CASE(5)
                GLU_CASE(6)
                GLU_CASE(7)
                GLU_CASE(8)
            }
#undef GLU_CASE
        }
    }
}

// Each kernel comes for batches of up to MVR rows a pass, and also
// (matvec1_*, onerow.go) for a single row, whose only pass needs fewer
// registers: the float types' keep MV_BATCH1 loads in flight a lane, the
// quantized types' MV_BATCH (8 were slower).
#define MV_BATCH1 8
// The quantized types' one-row kernels: loads in flight a lane for matvec1_*
// and matvec13_* (WEFT_CUDA_DEFINES may set them, for comparisons).
#ifndef MV1Q_BATCH
#define MV1Q_BATCH MV_BATCH
#endif
#ifndef MV13Q_BATCH
#define MV13Q_BATCH MV_BATCH
#endif
#define MATVEC(name, T, MAXM, B) MATVEC_LB(name, T, MAXM, B, 32 * MV_WARPS)
#define MATVEC_LB(name, T, MAXM, B, ...)                                                                         \
    extern "C" __global__ void __launch_bounds__(__VA_ARGS__)                                                    \
        name(float* out, float* resid, const void* x, const float2* ds, const u8* w, long long rowBytes,         \
             long long dOff, const float* bias, const int* meta, int which, int K, int N, int rpb) {                 \
        PDL_DEFER_(TRIGGER_MV, (mv_defers<T, MAXM>()));                                                          \
        matvec<T, MAXM, B>(out, resid, x, ds, w, rowBytes, dOff, bias, meta, which, K, N, rpb);                  \
    }
MATVEC(matvec_f32, W_F32, MVR, MV_BATCH)
MATVEC(matvec_f16, W_F16, MVR, MV_BATCH)
MATVEC(matvec_bf16, W_BF16, MVR, MV_BATCH)
MATVEC(matvec_q8_0, W_Q8_0, MVR, MV_BATCH)
MATVEC(matvec_q4_0, W_Q4_0, MVR, MV_BATCH)
MATVEC(matvec_q8_a, W_Q8_A, MVR, MV_BATCH)
MATVEC(matvec1_q8_a, W_Q8_A, 1, MV1Q_BATCH)
MATVEC(matvec1_f32, W_F32, 1, MV_BATCH1)
MATVEC(matvec1_f16, W_F16, 1, MV_BATCH1)
MATVEC(matvec1_bf16, W_BF16, 1, MV_BATCH1)
MATVEC(matvec1_q8_0, W_Q8_0, 1, MV1Q_BATCH)
#if MVQ_XPRE_Q4 == 2
// Its first activation vector in flight too takes 70 registers: bounded to
// the 64 at which the 8 blocks a multiprocessor it runs fit.
MATVEC_LB(matvec1_q4_0, W_Q4_0, 1, MV1Q_BATCH, 32 * MV_WARPS, 8)
#else
MATVEC(matvec1_q4_0, W_Q4_0, 1, MV1Q_BATCH)
#endif

// The grouped and GLU kernels have more code paths than matvec; their
// register count is held at 128, where mvGridPerSM blocks of MV_WARPS
// warps (or half as many of GLU_WARPS) fit on a multiprocessor at once (at
// 168 registers, seen with 8 loads in flight, a GLU grid took two waves).
#define MV_BLOCKS_PER_SM 4

#define MATVEC3(name, T, MAXM, B) MATVEC3_LB(name, T, MAXM, B, MV_BLOCKS_PER_SM)
#define MATVEC3_LB(name, T, MAXM, B, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, MINB)                                              \
        name(const void* x, const float2* ds, long long rowBytes, const int* meta, int which, int K, int rpb,      \
             float* out0, const u8* w0, long long dOff0, const float* bias0, int N0, float* out1, const u8* w1,    \
             long long dOff1, const float* bias1, int N1, float* out2, const u8* w2, long long dOff2,              \
             const float* bias2, int N2) {                                                                         \
        PDL_DEFER_(TRIGGER_MV, (mv_defers<T, MAXM>()));                                                          \
        matvec3<T, MAXM, B>(x, ds, rowBytes, meta, which, K, rpb, out0, w0, dOff0, bias0, N0, out1, w1, dOff1,     \
                            bias1, N1, out2, w2, dOff2, bias2, N2);                                                \
    }
MATVEC3(matvec3_f32, W_F32, MVR, MV_BATCH)
MATVEC3(matvec3_f16, W_F16, MVR, MV_BATCH)
MATVEC3(matvec3_bf16, W_BF16, MVR, MV_BATCH)
MATVEC3(matvec3_q8_0, W_Q8_0, MVR, MV_BATCH)
MATVEC3(matvec3_q4_0, W_Q4_0, MVR, MV_BATCH)
MATVEC3(matvec3_q8_a, W_Q8_A, MVR, MV_BATCH)
MATVEC3(matvec13_f32, W_F32, 1, MV_BATCH1)
MATVEC3(matvec13_f16, W_F16, 1, MV_BATCH1)
MATVEC3(matvec13_bf16, W_BF16, 1, MV_BATCH1)
// The quantized one-row kernels bounded for 7 blocks a multiprocessor (73
// registers): the early loads (MV_EARLY) took matvec13_q8_0 to 78
// unbounded; bounded, NVRTC picks 64 and 62, so 8 fit.
MATVEC3_LB(matvec13_q8_0, W_Q8_0, 1, MV13Q_BATCH, 7)
MATVEC3_LB(matvec13_q4_0, W_Q4_0, 1, MV13Q_BATCH, 7)
MATVEC3_LB(matvec13_q8_a, W_Q8_A, 1, MV13Q_BATCH, 7)

#define MATVEC_GLU(name, T, MAXM, B)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * GLU_WARPS, MV_BLOCKS_PER_SM * MV_WARPS / GLU_WARPS)          \
        name(float* out, float* gout, float* uout, signed char* qo, float2* dso, const void* x, const float2* ds,  \
             const u8* wg, const u8* wu, long long rowBytes, long long dOffG, long long dOffU, const int* meta,    \
             int which, int K, int N, int act) {                                                                   \
        PDL_DEFER_(TRIGGER_GLU, (mv_defers<T, MAXM>()));                                                         \
        matvec_glu<T, MAXM, B>(out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, meta, which, K, N, act);   \
    }
MATVEC_GLU(matvec_glu_f32, W_F32, MVR, MV_BATCH)
MATVEC_GLU(matvec_glu_f16, W_F16, MVR, MV_BATCH)
MATVEC_GLU(matvec_glu_bf16, W_BF16, MVR, MV_BATCH)
MATVEC_GLU(matvec_glu_q8_0, W_Q8_0, MVR, MV_BATCH)
MATVEC_GLU(matvec_glu_q4_0, W_Q4_0, MVR, MV_BATCH)
MATVEC_GLU(matvec_glu_q8_a, W_Q8_A, MVR, MV_BATCH)
// The one-row GLU kernels already keep 2·MV_BATCH loads in flight a lane.
MATVEC_GLU(matvec1_glu_f32, W_F32, 1, MV_BATCH)
MATVEC_GLU(matvec1_glu_f16, W_F16, 1, MV_BATCH)
MATVEC_GLU(matvec1_glu_bf16, W_BF16, 1, MV_BATCH)
MATVEC_GLU(matvec1_glu_q8_0, W_Q8_0, 1, MV_BATCH)
MATVEC_GLU(matvec1_glu_q4_0, W_Q4_0, 1, MV_BATCH)
MATVEC_GLU(matvec1_glu_q8_a, W_Q8_A, 1, MV_BATCH)
#define MATVEC1_GLU(name, T) MATVEC1_GLU_B(name, T, MV_BATCH)
#define MATVEC1_GLU_B(name, T, B)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * GLU1_WARPS, GLU1_MINB)                                       \
        name(float* out, float* gout, float* uout, signed char* qo, float2* dso, const void* x, const float2* ds,  \
             const u8* wg, const u8* wu, long long rowBytes, long long dOffG, long long dOffU, const int* meta,    \
             int which, int K, int N, int act) {                                                                   \
        PDL_DEFER_(TRIGGER_GLU, (mv_defers<T, 1>()));                                                            \
        matvec_glu<T, 1, B>(out, gout, uout, qo, dso, x, ds, wg, wu, rowBytes, dOffG, dOffU, meta, which, K, N, act); \
    }
MATVEC1_GLU(matvec1w_glu_f32, W_F32)
MATVEC1_GLU(matvec1w_glu_f16, W_F16)
MATVEC1_GLU(matvec1w_glu_bf16, W_BF16)
MATVEC1_GLU(matvec1w_glu_q8_0, W_Q8_0)
MATVEC1_GLU(matvec1w_glu_q4_0, W_Q4_0)
MATVEC1_GLU(matvec1w_glu_q8_a, W_Q8_A)

// The matrix-matrix path hands cuBLAS f16 operands: to_f16 converts
// activation rows, deq_f16_* a whole weight ([N, K], 8 elements a thread),
// add_bias adds a bias to every row of the float32 product.
extern "C" __global__ void to_f16(u16* out, const float* a, const int* meta, int which, int K) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= K) return;
    u64 at = (u64)r * K + i;
    out[at] = f2h(a[at]);
}

template <int T>
__device__ void deq_f16(u16* out, const u8* w, long long rowBytes, long long dOff, int N, int K) {
    u64 e = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e >= (u64)N * K) return;
    u64 j = e / K;
    int i = (int)(e - j * K);
    const u8* row = w + j * rowBytes;
    const u16* d = (const u16*)(w + dOff) + j * (K >> 5) * scale_words<T>();
    u32 p[4];
#pragma unroll
    for (int k = 0; k < 4; k++) p[k] = f2h(deq<T>(row, d, i + 2 * k)) | ((u32)f2h(deq<T>(row, d, i + 2 * k + 1)) << 16);
    *(uint4*)(out + e) = make_uint4(p[0], p[1], p[2], p[3]);
}

#define DEQ_F16(name, T)                                                                                  \
    extern "C" __global__ void name(u16* out, const u8* w, long long rowBytes, long long dOff, int N, int K) { PDL; \
        deq_f16<T>(out, w, rowBytes, dOff, N, K);                                                         \
    }
DEQ_F16(deq_f16_bf16, W_BF16)
DEQ_F16(deq_f16_q8_0, W_Q8_0)
DEQ_F16(deq_f16_q4_0, W_Q4_0)
DEQ_F16(deq_f16_q8_a, W_Q8_A)

extern "C" __global__ void add_bias(float* out, const float* bias, const int* meta, int which, int N) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= N) return;
    out[(u64)r * N + i] += bias[i];
}
