// K-quant kernels (Q4_K, Q5_K, Q6_K): activation quantization to Q8_K
// records, the decode matrix-vector product, the embedding and the f16
// dequantization for cuBLAS. Compiled after kernels.cu and matvec.cu,
// whose helpers (h2f, f2h, dp4a, pdl, warp_max, MV_WARPS) they use. The
// weights' device layout is described in kquant.go: per row its
// super-blocks' quants (KQ bytes each), then from byte dOff a 16-byte
// header per super-block, then for Q6_K an f16 scale per super-block.

// The types (W_Q4_K ... W_IQ4_XS) are defined in kernels.cu.

// iq4_map turns four codebook indices (0..15, one a byte) into IQ4_NL's
// and IQ4_XS's int8 levels: a byte permute into each half of the table,
// the half chosen by each index's top bit.
__device__ __forceinline__ int iq4_map(u32 v) {
    u32 s = (v & 0x7u) | ((v >> 4) & 0x70u) | ((v >> 8) & 0x700u) | ((v >> 12) & 0x7000u);
    u32 lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, s); // -127 -104 -83 -65 | -49 -35 -22 -10
    u32 hi = __byte_perm(0x26190D01u, 0x71594535u, s); //    1   13  25  38 |  53  69  89 113
    u32 m = ((v >> 3) & 0x01010101u) * 0xffu;
    return (int)((lo & ~m) | (hi & m));
}
#define KV_BATCH 4 // 16-byte weight loads a lane keeps in flight
// MVK_EARLY (0 or 1): the K-quant products issue their first batch of
// weight loads before their dependency wait, as matvec.cu's MV_EARLY.
// Same run, tg128 of 1B-shaped models: Q4_K 1,071 / 1,076 tok/s against
// 909 / 966, Q6_K 987 / 980 against 890 / 886.
#ifndef MVK_EARLY
#define MVK_EARLY 1
#endif

template <int T>
__device__ __forceinline__ constexpr int kq_bytes() {
    return T == W_Q4_K || T == W_Q2_K || T == W_IQ4_XS ? 128 : T == W_Q5_K ? 160 : 192;
}

// A super-block of 256 activations quantized as ggml's Q8_K: levels
// q = min(round(x·(−127/m)), 127) with m the element of largest
// magnitude (the positive one on a tie), d = 1/(−127/m); s holds the sums
// of its 16 groups of 16 levels.
struct q8k_rec {
    float d;
    short s[16];
};

// q8k_levels quantizes lane's 8 consecutive elements x of a super-block
// (every lane of the warp calls it) and returns d.
__device__ __forceinline__ float q8k_levels(const float (&x)[8], int (&q)[8]) {
    float hi = x[0], lo = x[0];
#pragma unroll
    for (int k = 1; k < 8; k++) {
        hi = fmaxf(hi, x[k]);
        lo = fminf(lo, x[k]);
    }
    hi = warp_max(hi);
    lo = -warp_max(-lo);
    float mx = hi < -lo ? lo : hi;
    if (mx == 0.f) {
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = 0;
        return 0.f;
    }
    float iscale = -127.f / mx;
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = min((int)rintf(__fmul_rn(iscale, x[k])), 127);
    return 1.f / iscale;
}

__device__ __forceinline__ void load8(const float* a, float (&x)[8]) {
    float4 v0 = *(const float4*)a, v1 = *(const float4*)(a + 4);
    x[0] = v0.x, x[1] = v0.y, x[2] = v0.z, x[3] = v0.w;
    x[4] = v1.x, x[5] = v1.y, x[6] = v1.z, x[7] = v1.w;
}

// q8k_store writes lane's 8 levels q of super-block sb of row r, and
// from the even lanes the sums of 16 and from lane 0 d, as quantize_q8k.
__device__ __forceinline__ void q8k_store(signed char* qa, q8k_rec* ds, u64 at, u64 rec, const int (&q)[8], float d,
                                          int lane) {
    u32 lo = 0, hi = 0;
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        lo |= (u32)(q[k] & 255) << (8 * k);
        hi |= (u32)(q[k + 4] & 255) << (8 * k);
        s += q[k] + q[k + 4];
    }
    *(uint2*)(qa + at) = make_uint2(lo, hi);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 1) == 0) ds[rec].s[lane >> 1] = (short)s;
    if (lane == 0) ds[rec].d = d;
}

// normk_chunk scales lane's 8 elements x (chunk c of the row: elements
// 8c..8c+7) by inv and the norm weights g into y, and quantizes them as
// quantize_q8k does (the warp's chunks are super-block c/32). Every lane
// of the warp calls it.
__device__ __forceinline__ void normk_chunk(const float (&x)[8], const float (&g)[8], acc_t inv, int c, float* y,
                                            signed char* qa, q8k_rec* ds, int lane) {
    float v[8];
    int q[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = norm_apply(x[k], inv, g[k]);
    *(float4*)(y + 8 * c) = make_float4(v[0], v[1], v[2], v[3]);
    *(float4*)(y + 8 * c + 4) = make_float4(v[4], v[5], v[6], v[7]);
    float d = q8k_levels(v, q);
    q8k_store(qa, ds, (u64)8 * c, (u64)(c >> 5), q, d, lane);
}

// rmsnorm_q8k is rmsnorm over whole rows (group = cols, a multiple of 256)
// that also quantizes its output as quantize_q8k does, for the K-quant
// product that reads it next. Thread t of T takes the 8-element chunks t,
// t+T, ... (T a multiple of 32, so a warp's chunks are one super-block);
// as rmsnorm_q8 does, the first NORM_HELD of them stay in registers
// between the sum and the scaling, and their norm weights are loaded
// before the wait for the kernel before. Grid (1, rows). FIRST: the
// next launch may start before this one waits (the _first twin,
// plan.go's triggerFirst).
template <bool FIRST>
__device__ __forceinline__ void rmsnorm_q8k_t(float* out, const float* a, const float* w, const int* meta, int which,
                                              int cols, float eps, signed char* qa, q8k_rec* ds) {
    int lane = threadIdx.x & 31, T = blockDim.x, nc = cols >> 3, nsb = cols >> 8;
    float wv[NORM_HELD][8], xv[NORM_HELD][8];
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * T;
        if (c < nc) {
            load8(w + 8 * c, wv[t]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) wv[t][k] = 0.f;
        }
    }
    PDL_AT(FIRST);
    // The row is loaded before the row count is known (rows past the
    // batch are allocated), so the two loads overlap.
    int r = blockIdx.y;
    const float* x = a + (u64)r * cols;
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * T;
        if (c < nc) {
            load8(x + 8 * c, xv[t]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) xv[t][k] = 0.f;
        }
    }
    if (r >= meta[which]) return;
    acc_t ss = 0.f;
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++)
#pragma unroll
        for (int k = 0; k < 8; k++) ss += sq(xv[t][k]);
    for (int c = threadIdx.x + NORM_HELD * T; c < nc; c += T) {
        float v[8];
        load8(x + 8 * c, v);
#pragma unroll
        for (int k = 0; k < 8; k++) ss += sq(v[k]);
    }
    ss = block_sum(ss);
    acc_t inv = norm_inv(ss, cols, eps);
    float* y = out + (u64)r * cols;
    signed char* q = qa + (u64)r * cols;
    q8k_rec* rec = ds + (u64)r * nsb;
    // A warp's chunks are all in the row or all past it (nc is a multiple
    // of 32), so every lane of a working warp takes part in the shuffles.
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * T;
        if (c - lane >= nc) break;
        normk_chunk(xv[t], wv[t], inv, c, y, q, rec, lane);
    }
    for (int c = threadIdx.x + NORM_HELD * T; c - lane < nc; c += T) {
        float v[8], g[8];
        load8(x + 8 * c, v);
        load8(w + 8 * c, g);
        normk_chunk(v, g, inv, c, y, q, rec, lane);
    }
}
#define RMSNORM_Q8K(name, FIRST)                                                                                   \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        name(float* out, const float* a, const float* w, const int* meta, int which, int cols, int group, float eps, \
             signed char* qa, q8k_rec* ds) {                                                                        \
        rmsnorm_q8k_t<FIRST>(out, a, w, meta, which, cols, eps, qa, ds);                                            \
    }
RMSNORM_Q8K(rmsnorm_q8k, false)
RMSNORM_Q8K(rmsnorm_q8k_first, true)

// glu_q8k is glu that also quantizes its output as quantize_q8k does
// (cols a multiple of 256). A block of 256 threads per super-block: grid
// (cols/256, rows). FIRST as rmsnorm_q8k's.
template <bool FIRST>
__device__ __forceinline__ void glu_q8k_t(float* out, const float* a, const float* b, const int* meta, int which,
                                          int cols, int act, signed char* qa, q8k_rec* ds) {
    PDL_AT(FIRST);
    __shared__ float part[2][8];
    int r = blockIdx.y, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (r >= meta[which]) return;
    u64 at = (u64)r * cols + (u64)blockIdx.x * 256 + t;
    float v = glu_value(a[at], b[at], act);
    out[at] = v;
    float hi = warp_max(v), lo = -warp_max(-v);
    if (lane == 0) part[0][warp] = hi, part[1][warp] = lo;
    __syncthreads();
    hi = part[0][0], lo = part[1][0];
#pragma unroll
    for (int k = 1; k < 8; k++) hi = fmaxf(hi, part[0][k]), lo = fminf(lo, part[1][k]);
    float mx = hi < -lo ? lo : hi, iscale = mx != 0.f ? -127.f / mx : 0.f;
    int q = mx != 0.f ? min((int)rintf(__fmul_rn(iscale, v)), 127) : 0;
    qa[at] = (signed char)q;
    for (int o = 1; o < 16; o <<= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    u64 rec = (u64)r * (cols >> 8) + blockIdx.x;
    if ((t & 15) == 0) ds[rec].s[t >> 4] = (short)q;
    if (t == 0) ds[rec].d = mx != 0.f ? 1.f / iscale : 0.f;
}
#define GLU_Q8K(name, FIRST)                                                                                       \
    extern "C" __global__ void name(float* out, const float* a, const float* b, const int* meta, int which, int cols, \
                                    int act, signed char* qa, q8k_rec* ds) {                                        \
        glu_q8k_t<FIRST>(out, a, b, meta, which, cols, act, qa, ds);                                                \
    }
GLU_Q8K(glu_q8k, false)
GLU_Q8K(glu_q8k_first, true)

// quantize_q8k quantizes activation rows a [rows, K] (K a multiple of
// 256) into levels qa [rows, K] and records ds [rows, K/256]. One warp per
// super-block, 8 elements a lane; grid (ceil(K/256/warps), rows). FIRST
// as rmsnorm_q8k's.
template <bool FIRST>
__device__ __forceinline__ void quantize_q8k_t(signed char* qa, q8k_rec* ds, const float* a, const int* meta, int which,
                                               int K) {
    PDL_AT(FIRST);
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    int nsb = K >> 8, sb = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (sb >= nsb) return;
    u64 at = (u64)r * K + (u64)sb * 256 + lane * 8;
    float x[8];
    int q[8];
    load8(a + at, x);
    float d = q8k_levels(x, q);
    q8k_store(qa, ds, at, (u64)r * nsb + sb, q, d, lane);
}
#define QUANTIZE_Q8K(name, FIRST)                                                                                   \
    extern "C" __global__ void name(signed char* qa, q8k_rec* ds, const float* a, const int* meta, int which, int K) { \
        quantize_q8k_t<FIRST>(qa, ds, a, meta, which, K);                                                            \
    }
QUANTIZE_Q8K(quantize_q8k, false)
QUANTIZE_Q8K(quantize_q8k_first, true)

// to_f16_q8k writes activation rows as f16 after rounding them to the
// levels of quantize_q8k (d·q), for cuBLAS products by K-quant weights.
// Grid as quantize_q8k.
extern "C" __global__ void to_f16_q8k(u16* out, const float* a, const int* meta, int which, int K) {
    PDL;
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    int sb = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (sb >= (K >> 8)) return;
    u64 at = (u64)r * K + (u64)sb * 256 + lane * 8;
    float x[8];
    int q[8];
    load8(a + at, x);
    float d = q8k_levels(x, q);
    u32 p[4];
#pragma unroll
    for (int k = 0; k < 4; k++) p[k] = f2h(d * (float)q[2 * k]) | ((u32)f2h(d * (float)q[2 * k + 1]) << 16);
    *(uint4*)(out + at) = make_uint4(p[0], p[1], p[2], p[3]);
}

// kscale_min decodes the 6-bit scale and min of sub-block j (0..7) of a
// Q4_K or Q5_K header h (d, dmin, then 12 bytes of scales in y, z, w).
__device__ __forceinline__ void kscale_min(uint4 h, int j, int* sc, int* m) {
    // Byte i of the scales, selected without indexing an array (which
    // would put it in local memory).
#define KB(i) ((int)((((i) < 4 ? h.y : (i) < 8 ? h.z : h.w) >> (8 * ((i) & 3))) & 255))
    if (j < 4) {
        *sc = KB(j) & 63;
        *m = KB(j + 4) & 63;
    } else {
        *sc = (KB(j + 4) & 15) | ((KB(j - 4) >> 6) << 4);
        *m = (KB(j + 4) >> 4) | ((KB(j) >> 6) << 4);
    }
#undef KB
}

#ifndef KHEAD_GGML
#define KHEAD_GGML 0
#endif
// kscale_pair decodes the 6-bit scales and minimums of sub-blocks 2p and
// 2p + 1 (p = 0..3) of a Q4_K or Q5_K header h: for Q4_K from kquant.go's
// pairScales fields (the 24 bits from bit 24p of h.y, h.z, h.w), for
// Q5_K, or with KHEAD_GGML, from ggml's packing (kscale_min).
template <int T>
__device__ __forceinline__ void kscale_pair(uint4 h, int p, int* sc0, int* m0, int* sc1, int* m1) {
    if constexpr (T != W_Q4_K || KHEAD_GGML) {
        kscale_min(h, 2 * p, sc0, m0);
        kscale_min(h, 2 * p + 1, sc1, m1);
    } else {
        u32 lo = p < 2 ? h.y : p == 2 ? h.z : h.w, hi = p < 2 ? h.z : h.w;
        u32 f = __funnelshift_r(lo, hi, (24 * p) & 31);
        *sc0 = (int)(f & 63);
        *sc1 = (int)((f >> 6) & 63);
        *m0 = (int)((f >> 12) & 63);
        *m1 = (int)((f >> 18) & 63);
    }
}

// kscale_one decodes the 6-bit scale and min of sub-block j (0..7) alone,
// from the header as kscale_pair reads it: for Q4_K the half of its pair's
// field, else kscale_min.
template <int T>
__device__ __forceinline__ void kscale_one(uint4 h, int j, int* sc, int* m) {
    if constexpr (T != W_Q4_K || KHEAD_GGML) {
        kscale_min(h, j, sc, m);
    } else {
        int p = j >> 1;
        u32 lo = p < 2 ? h.y : p == 2 ? h.z : h.w, hi = p < 2 ? h.z : h.w;
        u32 f = __funnelshift_r(lo, hi, (24 * p) & 31) >> (6 * (j & 1));
        *sc = (int)(f & 63);
        *m = (int)((f >> 12) & 63);
    }
}

// deqk returns element i of row `row` of a K-quant weight, computed with
// package quant's float32 operations in its order.
template <int T>
__device__ __forceinline__ float deqk(const u8* w, long long rowBytes, long long dOff, u64 row, int i) {
    const int KQ = kq_bytes<T>();
    u64 nsb = (u64)rowBytes / KQ;
    int sb = i >> 8, e = i & 255;
    u64 blk = row * nsb + sb;
    const u8* q = w + row * (u64)rowBytes + (u64)sb * KQ;
    const u8* h = w + dOff + blk * 16;
    if constexpr (T == W_IQ4_XS) {
        // package quant's (d·sc)·kvalue
        int v = (q[32 * (e >> 6) + (e & 31)] >> (4 * ((e >> 5) & 1))) & 15;
        float dl = __fmul_rn(h2f((u16)(h[0] | (h[1] << 8))), (float)(signed char)h[2 + (e >> 5)]);
        return __fmul_rn(dl, (float)(signed char)(iq4_map((u32)v) & 0xff));
    } else if constexpr (T == W_Q2_K) {
        // package quant's float32(dl·q) − ml, dl = d·sc, ml = dmin·m
        u32 dd = ((const u32*)(w + dOff + (u64)dOff / (u64)rowBytes * nsb * 16))[blk];
        int s = e >> 4, v = (q[32 * (e >> 6) + (e & 31)] >> (4 * ((e >> 5) & 1))) & 15;
        float dl = __fmul_rn(h2f((u16)(dd & 0xffff)), (float)(h[s] & 15));
        float ml = __fmul_rn(h2f((u16)(dd >> 16)), (float)(h[s] >> 4));
        return __fsub_rn(__fmul_rn(dl, (float)v), ml);
    } else if constexpr (T == W_Q6_K) {
        const u16* d6 = (const u16*)(w + dOff + (u64)dOff / (u64)rowBytes * nsb * 16);
        int hh = e >> 7, k = (e >> 5) & 3, l = e & 31;
        int b = q[64 * hh + 32 * (k & 1) + l];
        int v = (k >= 2 ? b >> 4 : b & 15) | (((q[128 + 32 * hh + l] >> (2 * k)) & 3) << 4);
        float dl = __fmul_rn(h2f(d6[blk]), (float)(signed char)h[e >> 4]);
        return __fmul_rn(dl, (float)(v - 32));
    } else {
        uint4 hd = *(const uint4*)h;
        int s = e >> 5, l = e & 31, sc, m;
        kscale_one<T>(hd, s, &sc, &m);
        const u8* qs = T == W_Q5_K ? q + 32 : q;
        int v = (qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 15;
        if constexpr (T == W_Q5_K) v |= ((q[l] >> s) & 1) << 4;
        float dl = __fmul_rn(h2f((u16)(hd.x & 0xffff)), (float)sc);
        float ml = __fmul_rn(h2f((u16)(hd.x >> 16)), (float)m);
        return __fsub_rn(__fmul_rn(dl, (float)v), ml);
    }
}

// kq_chunk unpacks chunk c (0..7) of a super-block's quants: 16 bytes q
// (and for Q5_K, Q6_K their high bits hb) holding 16 elements from offset
// elo of the super-block and 16 from ehi, as levels in lo[] and hi[].
template <int T>
__device__ __forceinline__ void kq_chunk(int c, uint4 q, uint4 hb, int (&lo)[4], int (&hi)[4], int* elo, int* ehi) {
    u32 qw[4] = {q.x, q.y, q.z, q.w}, hw[4] = {hb.x, hb.y, hb.z, hb.w};
    if constexpr (T == W_Q6_K) {
        // ql byte l of a half holds element l (low nibble) and l + 64; at
        // 32 + l elements 32 + l and 96 + l. qh has bits 4-5 of each.
        int isc = (c >> 1) & 1, slo = 2 * isc, shi = 4 + 2 * isc;
        *elo = 128 * (c >> 2) + 32 * isc + 16 * (c & 1);
        *ehi = *elo + 64;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = (int)((qw[k] & 0x0f0f0f0fu) | (((hw[k] >> slo) & 0x03030303u) << 4));
            hi[k] = (int)(((qw[k] >> 4) & 0x0f0f0f0fu) | (((hw[k] >> shi) & 0x03030303u) << 4));
#if K_A32
            // q − 32 in each byte (q < 64): q + 128 − 32 borrows from no
            // byte, and flipping the top bit takes the 128 back off.
            lo[k] = (int)((((u32)lo[k] | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
            hi[k] = (int)((((u32)hi[k] | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
#endif
        }
    } else {
        // qs byte 32p + l holds element 64p + l (sub-block 2p) and 64p + 32 + l.
        int p = c >> 1;
        *elo = 64 * p + 16 * (c & 1);
        *ehi = *elo + 32;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = (int)(qw[k] & 0x0f0f0f0fu);
            hi[k] = (int)((qw[k] >> 4) & 0x0f0f0f0fu);
            if constexpr (T == W_Q5_K) {
                lo[k] |= (int)(((hw[k] >> (2 * p)) & 0x01010101u) << 4);
                hi[k] |= (int)(((hw[k] >> (2 * p + 1)) & 0x01010101u) << 4);
            }
            if constexpr (T == W_IQ4_XS) {
                lo[k] = iq4_map((u32)lo[k]);
                hi[k] = iq4_map((u32)hi[k]);
            }
        }
    }
}

// mvk_dot: this thread's part of M activation rows against NW K-quant
// weight rows of one shape (a gate and an up row: NW = 2), B chunks of
// each in flight. A lane takes chunks of 16 bytes of quants, 32 elements
// each (16 at elo and 16 at ehi of a super-block); per sub-block the
// integer dot product is scaled by the weight's and the activations'
// scales. Under K_A32 (kernels.cu) the activations are quantize_q8's
// records ds (float2: d and d·Σq a 32): Q4_K/Q5_K d·Σ da·sc·(q·a) − dmin·Σ
// m·(da·Σa), a chunk taking half of each sum of its two sub-blocks; Q6_K's
// levels q − 32 as signed bytes (kq_chunk); Q2_K's minimums by the
// chunk's own level sums. Else ds are Q8_K records (q8k_rec) and the
// sums are the CPU backend's: Q4_K/Q5_K d·da·Σ sc·(q·a) − dmin·da·Σ m·Σa,
// Q6_K d·da·Σ sc·(q·a − 32·Σa). With E and early set, the thread issues
// its first batch of weight loads and then waits for the kernel before
// (MVK_EARLY, as mvq_dot's early).
template <int T, int M, int B, int NW, bool E>
__device__ __forceinline__ void mvk_dot(acc_t (&acc)[NW][M], const signed char* qa, const void* dsv,
                                        const u8* const (&row)[NW], const uint4* const (&hdr)[NW],
                                        const u16* const (&d6)[NW], int r0, int K, bool live, int sub, int nsub,
                                        int early) {
    const int KQ = kq_bytes<T>();
#if K_A32
    const float2* ds = (const float2*)dsv;
#else
    const q8k_rec* ds = (const q8k_rec*)dsv;
#endif
#pragma unroll
    for (int w = 0; w < NW; w++)
#pragma unroll
        for (int k = 0; k < M; k++) acc[w][k] = 0.f;
    int nsb = K >> 8, nc = nsb * 8;
    if (live) {
        for (int c0 = sub; c0 < nc; c0 += B * nsub) {
            uint4 q[NW][B], hb[NW][B];
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = c0 + u * nsub;
                if (c >= nc) continue;
                int cc = c & 7;
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    const u8* blk = row[w] + (u64)(c >> 3) * KQ;
                    if constexpr (T == W_Q4_K || T == W_Q2_K || T == W_IQ4_XS) {
                        q[w][u] = ldw<E>(blk + cc * 16);
                        hb[w][u] = make_uint4(0, 0, 0, 0);
                    } else if constexpr (T == W_Q5_K) {
                        q[w][u] = ldw<E>(blk + 32 + cc * 16);
                        hb[w][u] = __ldg((const uint4*)(blk + (cc & 1) * 16));
                    } else {
                        q[w][u] = ldw<E>(blk + cc * 16);
                        hb[w][u] = __ldg((const uint4*)(blk + 128 + (cc >> 2) * 32 + (cc & 1) * 16));
                    }
                }
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
                int sb = c >> 3, cc = c & 7;
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    int lo[4], hi[4], elo, ehi;
                    kq_chunk<T>(cc, q[w][u], hb[w][u], lo, hi, &elo, &ehi);
                    float d, dmin = 0.f;
                    int sclo, schi, mlo = 0, mhi = 0;
                    if constexpr (T == W_Q6_K) {
                        const signed char* sc = (const signed char*)(hdr[w] + sb);
                        sclo = __ldg(sc + (elo >> 4));
                        schi = __ldg(sc + (ehi >> 4));
                        d = h2f(__ldg(d6[w] + sb));
                    } else if constexpr (T == W_IQ4_XS) {
                        // the scales of the 32 elements at elo and at ehi; no min
                        const signed char* sc = (const signed char*)(hdr[w] + sb);
                        sclo = __ldg(sc + 2 + (elo >> 5));
                        schi = __ldg(sc + 2 + (ehi >> 5));
                        d = h2f(__ldg((const u16*)(hdr[w] + sb)));
                    } else if constexpr (T == W_Q2_K) {
                        // scale and min of the 16 elements at elo and at ehi
                        const u8* sc = (const u8*)(hdr[w] + sb);
                        int blo = __ldg(sc + (elo >> 4)), bhi = __ldg(sc + (ehi >> 4));
                        sclo = blo & 15, mlo = blo >> 4, schi = bhi & 15, mhi = bhi >> 4;
                        u32 dd = __ldg((const unsigned int*)d6[w] + sb);
                        d = h2f((u16)(dd & 0xffff));
                        dmin = h2f((u16)(dd >> 16));
                    } else {
                        uint4 h = __ldg(hdr[w] + sb);
                        d = h2f((u16)(h.x & 0xffff));
                        dmin = h2f((u16)(h.x >> 16));
                        kscale_pair<T>(h, cc >> 1, &sclo, &mlo, &schi, &mhi);
                    }
#pragma unroll
                    for (int k = 0; k < M; k++) {
                        u64 at = (u64)(r0 + k) * K + (u64)sb * 256;
                        const signed char* x = qa + at;
                        int4 xl = *(const int4*)(x + elo), xh = *(const int4*)(x + ehi);
                        int dl = dp4a(lo[0], xl.x, 0);
                        dl = dp4a(lo[1], xl.y, dl);
                        dl = dp4a(lo[2], xl.z, dl);
                        dl = dp4a(lo[3], xl.w, dl);
                        int dh = dp4a(hi[0], xh.x, 0);
                        dh = dp4a(hi[1], xh.y, dh);
                        dh = dp4a(hi[2], xh.z, dh);
                        dh = dp4a(hi[3], xh.w, dh);
#if K_A32
                        float2 alo = ds[(at + elo) >> 5], ahi = ds[(at + ehi) >> 5];
                        float s = (float)(sclo * dl) * alo.x + (float)(schi * dh) * ahi.x;
                        if constexpr (T == W_Q4_K || T == W_Q5_K) {
                            // each of the sub-blocks' two chunks takes half its min term
                            acc[w][k] += d * s - (0.5f * dmin) * ((float)mlo * alo.y + (float)mhi * ahi.y);
                        } else if constexpr (T == W_Q2_K) {
                            const int ones = 0x01010101;
                            int sl = dp4a(ones, xl.x, dp4a(ones, xl.y, dp4a(ones, xl.z, dp4a(ones, xl.w, 0))));
                            int sh = dp4a(ones, xh.x, dp4a(ones, xh.y, dp4a(ones, xh.z, dp4a(ones, xh.w, 0))));
                            acc[w][k] += d * s - dmin * ((float)(mlo * sl) * alo.x + (float)(mhi * sh) * ahi.x);
                        } else {
                            acc[w][k] += d * s;
                        }
#else
                        const q8k_rec* rec = ds + (u64)(r0 + k) * nsb + sb;
                        float da = rec->d;
                        int slo = rec->s[elo >> 4], shi = rec->s[ehi >> 4];
                        // Under WEFT_EXACT the integer sums and fl32(d·da),
                        // fl32(dmin·da) as float64: exact products.
                        if constexpr (T == W_Q6_K) {
                            acc[w][k] += (acc_t)(sclo * (dl - 32 * slo) + schi * (dh - 32 * shi)) * (acc_t)(d * da);
                        } else {
                            acc[w][k] += (acc_t)(sclo * dl + schi * dh) * (acc_t)(d * da) -
                                         (acc_t)(mlo * slo + mhi * shi) * (acc_t)(dmin * da);
                        }
#endif
                    }
                }
            }
        }
    }
    if constexpr (E)
        if (early) pdl_late(early == 1); // no chunk of its own: the thread still waits
}

// mvk_pass: M activation rows against one K-quant weight row (mvk_dot),
// the results written.
template <int T, int M, bool E = false>
__device__ __forceinline__ void mvk_pass(float* out, float* resid, const signed char* qa, const void* ds,
                                         const u8* row, const uint4* hdr, const u16* d6, const float* bias, int r0,
                                         int K, int N, int j, bool live, int sub, int nsub, int wpr, int lpr,
                                         int early = 0) {
    acc_t acc[1][M];
    const u8* rows[1] = {row};
    const uint4* hdrs[1] = {hdr};
    const u16* d6s[1] = {d6};
    mvk_dot<T, M, KV_BATCH, 1, E>(acc, qa, ds, rows, hdrs, d6s, r0, K, live, sub, nsub, early);
    mv_reduce<M>(acc[0], out, resid, bias, r0, j, N, live, wpr, lpr); // matvec.cu
}

// mvk_group computes output rows [g*rpb, g*rpb+rpb) of one K-quant
// weight for the first n activation rows, as matvec.cu's mv_group: blocks
// of MV_WARPS warps cover rpb output rows (8, 4, 2 or 1), in passes of up
// to 8 activation rows, or (MAXM = 1: matvec1_q*_k and matvec13_q*_k,
// onerow.go) of the one row of a decode step, whose kernel then keeps
// only that pass's registers. first: g is the block's first group (of
// every weight of its launch), in which it waits for the kernel before.
template <int T, int MAXM>
__device__ __forceinline__ void mvk_group(float* out, float* resid, const signed char* qa, const void* ds,
                                          const u8* w, long long rowBytes, long long dOff, const float* bias, int n,
                                          int K, int N, int rpb, int g, bool first) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int lpr = rpb > MV_WARPS ? 32 * MV_WARPS / rpb : 32;
    int wpr = rpb >= MV_WARPS ? 1 : MV_WARPS / rpb;
    int sub = (warp % wpr) * lpr + (lane & (lpr - 1)), nsub = wpr * lpr, nsb = K >> 8;
    int early = MVK_EARLY && first ? (TRIGGER_MV ? 1 : 2) : 0;
    int j = g * rpb + (warp / wpr) * (32 / lpr) + lane / lpr;
    bool live = j < N;
    u64 jj = live ? j : 0;
    const u8* row = w + jj * (u64)rowBytes;
    const uint4* hdr = (const uint4*)(w + dOff) + jj * nsb;
    const u16* d6 = (const u16*)(w + dOff + (u64)N * nsb * 16) + jj * nsb * (T == W_Q2_K ? 2 : 1);
    if constexpr (MAXM == 1) {
        mvk_pass<T, 1, MVK_EARLY>(out, resid, qa, ds, row, hdr, d6, bias, 0, K, N, j, live, sub, nsub, wpr, lpr, early);
        return;
    }
    for (int r0 = 0; r0 < n; r0 += 8) {
        int m = min(8, n - r0);
#define MVK_CASE(M)                                                                                                  \
    case M:                                                                                                          \
        mvk_pass<T, M, MVK_EARLY>(out, resid, qa, ds, row, hdr, d6, bias, r0, K, N, j, live, sub, nsub, wpr, lpr,  \
                                  r0 == 0 ? early : 0);                                                              \
        break;
        switch (m) {
            MVK_CASE(1)
            MVK_CASE(2)
            MVK_CASE(3)
            MVK_CASE(4)
            MVK_CASE(5)
            MVK_CASE(6)
            MVK_CASE(7)
            MVK_CASE(8)
        }
#undef MVK_CASE
    }
}

// matvec_k is matvec.cu's matvec for K-quant weights: blocks loop over
// the groups of rpb rows. Its loop keeps mvk_group's code written out:
// calling mvk_group from it changed NVRTC's register allocation of
// matvec1_q*_k and matvec_q*_k (matvec1_q6_k 64 → 66 registers, past the
// 8 blocks a multiprocessor its grid assumes).
template <int T, int MAXM = 8>
__device__ void matvec_k(float* out, float* resid, const signed char* qa, const void* ds, const u8* w,
                         long long rowBytes, long long dOff, const float* bias, const int* meta, int which, int K,
                         int N, int rpb) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int lpr = rpb > MV_WARPS ? 32 * MV_WARPS / rpb : 32;
    int wpr = rpb >= MV_WARPS ? 1 : MV_WARPS / rpb;
    int sub = (warp % wpr) * lpr + (lane & (lpr - 1)), nsub = wpr * lpr;
    int n = meta[which], groups = (N + rpb - 1) / rpb, nsb = K >> 8;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        int early = MVK_EARLY && g == (int)blockIdx.x ? (TRIGGER_MV ? 1 : 2) : 0;
        int j = g * rpb + (warp / wpr) * (32 / lpr) + lane / lpr;
        bool live = j < N;
        u64 jj = live ? j : 0;
        const u8* row = w + jj * (u64)rowBytes;
        const uint4* hdr = (const uint4*)(w + dOff) + jj * nsb;
        const u16* d6 = (const u16*)(w + dOff + (u64)N * nsb * 16) + jj * nsb * (T == W_Q2_K ? 2 : 1);
        if constexpr (MAXM == 1) {
            mvk_pass<T, 1, MVK_EARLY>(out, resid, qa, ds, row, hdr, d6, bias, 0, K, N, j, live, sub, nsub, wpr, lpr, early);
            continue;
        }
        for (int r0 = 0; r0 < n; r0 += 8) {
            int m = min(8, n - r0);
#define MVK_CASE(M)                                                                                                  \
    case M:                                                                                                          \
        mvk_pass<T, M, MVK_EARLY>(out, resid, qa, ds, row, hdr, d6, bias, r0, K, N, j, live, sub, nsub, wpr, lpr,  \
                                  r0 == 0 ? early : 0);                                                              \
        break;
            switch (m) {
                MVK_CASE(1)
                MVK_CASE(2)
                MVK_CASE(3)
                MVK_CASE(4)
                MVK_CASE(5)
                MVK_CASE(6)
                MVK_CASE(7)
                MVK_CASE(8)
            }
#undef MVK_CASE
        }
    }
}

// matvec3_k is matvec.cu's matvec3 for K-quant weights: up to three
// weights of one type and width that read the same input (a layer's q, k
// and v, or its gate and up) in one launch, whose groups of rpb rows run
// over the weights' rows in turn. A weight with N = 0 is absent.
template <int T, int MAXM>
__device__ void matvec3_k(const signed char* qa, const void* ds, long long rowBytes, const int* meta, int which,
                          int K, int rpb, float* out0, const u8* w0, long long dOff0, const float* bias0, int N0,
                          float* out1, const u8* w1, long long dOff1, const float* bias1, int N1, float* out2,
                          const u8* w2, long long dOff2, const float* bias2, int N2) {
    int n = meta[which], g0 = (N0 + rpb - 1) / rpb, g1 = (N1 + rpb - 1) / rpb, g2 = (N2 + rpb - 1) / rpb;
    for (int g = blockIdx.x; g < g0 + g1 + g2; g += gridDim.x) {
        bool a = g < g0, b = !a && g < g0 + g1;
        mvk_group<T, MAXM>(a ? out0 : b ? out1 : out2, nullptr, qa, ds, a ? w0 : b ? w1 : w2, rowBytes,
                           a ? dOff0 : b ? dOff1 : dOff2, a ? bias0 : b ? bias1 : bias2, n, K, a ? N0 : b ? N1 : N2,
                           rpb, a ? g : b ? g - g0 : g - g0 - g1, g == (int)blockIdx.x);
    }
}

template <int T>
__device__ void embed_k(float* out, const u8* w, long long rowBytes, long long dOff, const int* meta,
                        const int* tokens, int cols, float scale) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= cols) return;
    out[(u64)r * cols + i] = deqk<T>(w, rowBytes, dOff, (u64)tokens[r], i) * scale;
}

template <int T>
__device__ void deq_f16_k(u16* out, const u8* w, long long rowBytes, long long dOff, int N, int K) {
    u64 e = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e >= (u64)N * K) return;
    u64 j = e / K;
    int i = (int)(e - j * K);
    u32 p[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        p[k] = f2h(deqk<T>(w, rowBytes, dOff, j, i + 2 * k)) | ((u32)f2h(deqk<T>(w, rowBytes, dOff, j, i + 2 * k + 1)) << 16);
    *(uint4*)(out + e) = make_uint4(p[0], p[1], p[2], p[3]);
}

// The entry points, with the signatures of matvec.cu's and kernels.cu's.
#define MVK_ARGS                                                                                                   \
    float *out, float *resid, const void *x, const void *ds, const u8 *w, long long rowBytes, long long dOff,      \
        const float *bias, const int *meta, int which, int K, int N, int rpb
#define MVK_CALL(T, MAXM)                                                                                          \
    PDL_DEFER_(TRIGGER_MV, MVK_EARLY);                                                                           \
    matvec_k<T, MAXM>(out, resid, (const signed char*)x, ds, w, rowBytes, dOff, bias, meta, which, K, N,          \
                      rpb)
#define MVK3_ARGS                                                                                                  \
    const void *x, const void *ds, long long rowBytes, const int *meta, int which, int K, int rpb, float *out0,    \
        const u8 *w0, long long dOff0, const float *bias0, int N0, float *out1, const u8 *w1, long long dOff1,      \
        const float *bias1, int N1, float *out2, const u8 *w2, long long dOff2, const float *bias2, int N2
#define MVK3_CALL(T, MAXM)                                                                                         \
    PDL_DEFER_(TRIGGER_MV, MVK_EARLY);                                                                           \
    matvec3_k<T, MAXM>((const signed char*)x, ds, rowBytes, meta, which, K, rpb, out0, w0, dOff0,                  \
                       bias0, N0, out1, w1, dOff1, bias1, N1, out2, w2, dOff2, bias2, N2)
#define EMK_ARGS float *out, const u8 *w, long long rowBytes, long long dOff, const int *meta, const int *tokens, int cols, float scale
#define DQK_ARGS u16 *out, const u8 *w, long long rowBytes, long long dOff, int N, int K

extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec_q4_k(MVK_ARGS) { MVK_CALL(W_Q4_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec_q5_k(MVK_ARGS) { MVK_CALL(W_Q5_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec_q6_k(MVK_ARGS) { MVK_CALL(W_Q6_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec1_q4_k(MVK_ARGS) { MVK_CALL(W_Q4_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec1_q5_k(MVK_ARGS) { MVK_CALL(W_Q5_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec1_q6_k(MVK_ARGS) { MVK_CALL(W_Q6_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec_q2_k(MVK_ARGS) { MVK_CALL(W_Q2_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec1_q2_k(MVK_ARGS) { MVK_CALL(W_Q2_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec_iq4_xs(MVK_ARGS) { MVK_CALL(W_IQ4_XS, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec1_iq4_xs(MVK_ARGS) { MVK_CALL(W_IQ4_XS, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec3_q4_k(MVK3_ARGS) { MVK3_CALL(W_Q4_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec3_q5_k(MVK3_ARGS) { MVK3_CALL(W_Q5_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec3_q6_k(MVK3_ARGS) { MVK3_CALL(W_Q6_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec3_q2_k(MVK3_ARGS) { MVK3_CALL(W_Q2_K, 8); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS) void matvec3_iq4_xs(MVK3_ARGS) { MVK3_CALL(W_IQ4_XS, 8); }
// The one-row grouped kernels bounded for the 8 blocks a multiprocessor
// that onerow.go's grid assumes (oneRowQuantGrid).
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec13_q4_k(MVK3_ARGS) { MVK3_CALL(W_Q4_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec13_q5_k(MVK3_ARGS) { MVK3_CALL(W_Q5_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec13_q6_k(MVK3_ARGS) { MVK3_CALL(W_Q6_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec13_q2_k(MVK3_ARGS) { MVK3_CALL(W_Q2_K, 1); }
extern "C" __global__ __launch_bounds__(32 * MV_WARPS, 8) void matvec13_iq4_xs(MVK3_ARGS) { MVK3_CALL(W_IQ4_XS, 1); }
extern "C" __global__ void embed_q4_k(EMK_ARGS) { PDL; embed_k<W_Q4_K>(out, w, rowBytes, dOff, meta, tokens, cols, scale); }
extern "C" __global__ void embed_q5_k(EMK_ARGS) { PDL; embed_k<W_Q5_K>(out, w, rowBytes, dOff, meta, tokens, cols, scale); }
extern "C" __global__ void embed_q6_k(EMK_ARGS) { PDL; embed_k<W_Q6_K>(out, w, rowBytes, dOff, meta, tokens, cols, scale); }
extern "C" __global__ void embed_q2_k(EMK_ARGS) { PDL; embed_k<W_Q2_K>(out, w, rowBytes, dOff, meta, tokens, cols, scale); }
extern "C" __global__ void embed_iq4_xs(EMK_ARGS) { PDL; embed_k<W_IQ4_XS>(out, w, rowBytes, dOff, meta, tokens, cols, scale); }
extern "C" __global__ void deq_f16_q4_k(DQK_ARGS) { PDL; deq_f16_k<W_Q4_K>(out, w, rowBytes, dOff, N, K); }
extern "C" __global__ void deq_f16_q5_k(DQK_ARGS) { PDL; deq_f16_k<W_Q5_K>(out, w, rowBytes, dOff, N, K); }
extern "C" __global__ void deq_f16_q6_k(DQK_ARGS) { PDL; deq_f16_k<W_Q6_K>(out, w, rowBytes, dOff, N, K); }
extern "C" __global__ void deq_f16_q2_k(DQK_ARGS) { PDL; deq_f16_k<W_Q2_K>(out, w, rowBytes, dOff, N, K); }
extern "C" __global__ void deq_f16_iq4_xs(DQK_ARGS) { PDL; deq_f16_k<W_IQ4_XS>(out, w, rowBytes, dOff, N, K); }

// The gate and up products fused with the GLU (matvec.cu's matvec_glu,
// glu_pass through mvk_dot), for K_A32's activations only: the plan fuses
// them where it reads those (plan.go's kA32). K_GLU_BATCH chunks of each
// row in flight a lane (the two rows' quants and high bits held at once).
// One, against two (H100, same call, tg128 drawn): 8B Q4_K 440.3 against
// 429.3, Q5_K 326.6 against 288.9 (two spilled: NVRTC 11.8 gave the wide
// Q5_K kernel 92 bytes of spills at 64 registers), Q6_K 324.5 against
// 311.9; 1B Q4_K 1,843 against 1,850, Q5_K 1,489 against 1,396, Q6_K
// 1,460 against 1,443. Unfused (WEFT_CUDA_KGLU=0: gate and up grouped,
// then glu_q8) the GLU lost everywhere: 8B Q4_K 382.6, 1B 1,637.
#ifndef K_GLU_BATCH
#define K_GLU_BATCH 1
#endif
MATVEC_GLU(matvec_glu_q4_k, W_Q4_K, MVR, K_GLU_BATCH)
MATVEC_GLU(matvec_glu_q5_k, W_Q5_K, MVR, K_GLU_BATCH)
MATVEC_GLU(matvec_glu_q6_k, W_Q6_K, MVR, K_GLU_BATCH)
MATVEC_GLU(matvec_glu_q2_k, W_Q2_K, MVR, K_GLU_BATCH)
MATVEC_GLU(matvec_glu_iq4_xs, W_IQ4_XS, MVR, K_GLU_BATCH)
MATVEC_GLU(matvec1_glu_q4_k, W_Q4_K, 1, K_GLU_BATCH)
MATVEC_GLU(matvec1_glu_q5_k, W_Q5_K, 1, K_GLU_BATCH)
MATVEC_GLU(matvec1_glu_q6_k, W_Q6_K, 1, K_GLU_BATCH)
MATVEC_GLU(matvec1_glu_q2_k, W_Q2_K, 1, K_GLU_BATCH)
MATVEC_GLU(matvec1_glu_iq4_xs, W_IQ4_XS, 1, K_GLU_BATCH)
#define MATVEC1_GLU_K(name, T) MATVEC1_GLU_B(name, T, K_GLU_BATCH)
MATVEC1_GLU_K(matvec1w_glu_q4_k, W_Q4_K)
MATVEC1_GLU_K(matvec1w_glu_q5_k, W_Q5_K)
MATVEC1_GLU_K(matvec1w_glu_q6_k, W_Q6_K)
MATVEC1_GLU_K(matvec1w_glu_q2_k, W_Q2_K)
MATVEC1_GLU_K(matvec1w_glu_iq4_xs, W_IQ4_XS)
