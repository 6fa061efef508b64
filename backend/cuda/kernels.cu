// weft's CUDA kernels, compiled at run time by NVRTC (no headers: every
// helper used here is a compiler builtin). The Go side (plan.go) chooses
// the launch shapes and the argument order, which must match the
// signatures below.
//
// Activations are float32 [MaxRows, cols] row-major. Batch data lives in
// one device array "meta" of int32: meta[0] = rows, meta[1] = selected
// rows, then the tokens, positions, slots and selected row indices, each
// MaxRows long. Kernels read the row count from meta (argument "which": 0
// for every row, 1 for the selected rows) so a launch's arguments never
// change between batches; blocks past the count return at once, so a grid
// may cover more rows than the batch has.
//
// Q8_0 and Q4_0 weights are repacked on upload (repack_*): a tensor of
// `rows` rows of K elements keeps every row's quants first, 16-byte
// aligned (K bytes a row for Q8_0, K/2 for Q4_0, in the GGUF nibble order
// within each block of 32), then every block's f16 scale ([rows, K/32] at
// byte offset dOff). Matrix-vector kernels then stream 16-byte quant loads.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64; // offsets: tensors may pass 2^31 elements

#define NEG_INF __int_as_float(0xff800000)

// Weight storage types.
#define W_F32 0
#define W_F16 1
#define W_BF16 2
#define W_Q8_0 3
#define W_Q4_0 4

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

// dp4a: c + the dot product of a's and b's four signed bytes.
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("{ dp4a.s32.s32 %0, %1, %2, %3; }" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// deq returns element i of a weight row in its device layout: row points
// at the row's values (F32, F16, BF16) or quants (Q8_0, Q4_0), d at the
// row's block scales (quantized types only).
template <int T>
__device__ __forceinline__ float deq(const u8* __restrict__ row, const u16* __restrict__ d, int i) {
    if (T == W_F32) return ((const float*)row)[i];
    if (T == W_F16) return h2f(((const u16*)row)[i]);
    if (T == W_BF16) return bf2f(((const u16*)row)[i]);
    if (T == W_Q8_0) return h2f(d[i >> 5]) * (float)(signed char)row[i];
    int j = i & 31;
    u8 q = row[(i >> 5) * 16 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return h2f(d[i >> 5]) * (float)(v - 8);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block_sum returns the sum of v over the block to every thread. It
// contains barriers, so every thread of the block must call it.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? part[lane] : 0.f;
    return warp_sum(v);
}

// repack_q8_0 / repack_q4_0 turn n GGUF blocks (34 or 18 bytes: f16 scale,
// then the quants) into the device layout. One thread per block.
extern "C" __global__ void repack_q8_0(u8* dst, const u8* src, long long n, long long dOff) {
    u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= (u64)n) return;
    const u8* s = src + b * 34;
    ((u16*)(dst + dOff))[b] = (u16)(s[0] | (s[1] << 8));
    u32 w[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        w[k] = s[2 + 4 * k] | (s[3 + 4 * k] << 8) | (s[4 + 4 * k] << 16) | ((u32)s[5 + 4 * k] << 24);
    uint4* q = (uint4*)(dst + b * 32);
    q[0] = make_uint4(w[0], w[1], w[2], w[3]);
    q[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

extern "C" __global__ void repack_q4_0(u8* dst, const u8* src, long long n, long long dOff) {
    u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= (u64)n) return;
    const u8* s = src + b * 18;
    ((u16*)(dst + dOff))[b] = (u16)(s[0] | (s[1] << 8));
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        w[k] = s[2 + 4 * k] | (s[3 + 4 * k] << 8) | (s[4 + 4 * k] << 16) | ((u32)s[5 + 4 * k] << 24);
    *(uint4*)(dst + b * 16) = make_uint4(w[0], w[1], w[2], w[3]);
}

// embed: out[r, i] = deq(W[token[r]], i) * scale. Grid (ceil(cols/block), rows).
template <int T>
__device__ void embed(float* out, const u8* w, long long rowBytes, long long dOff, const int* meta, const int* tokens,
                      int cols, float scale) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= cols) return;
    u64 t = (u64)tokens[r];
    out[(u64)r * cols + i] = deq<T>(w + t * rowBytes, (const u16*)(w + dOff) + t * (cols >> 5), i) * scale;
}

#define EMBED(name, T)                                                                                    \
    extern "C" __global__ void name(float* out, const u8* w, long long rowBytes, long long dOff,         \
                                    const int* meta, const int* tokens, int cols, float scale) {         \
        embed<T>(out, w, rowBytes, dOff, meta, tokens, cols, scale);                                      \
    }
EMBED(embed_f32, W_F32)
EMBED(embed_f16, W_F16)
EMBED(embed_bf16, W_BF16)
EMBED(embed_q8_0, W_Q8_0)
EMBED(embed_q4_0, W_Q4_0)

// q8_level is lane's element of a block of 32 quantized to int8 the way
// the CPU backend (and ggml on x86) does it: d = max|x|/127, q =
// round-half-even(x * (127/max|x|)). Every lane of the warp calls it.
__device__ __forceinline__ int q8_level(float x, float* d) {
    float amax = warp_max(fabsf(x));
    *d = amax / 127.f;
    float id = amax != 0.f ? 127.f / amax : 0.f;
    return (int)rintf(__fmul_rn(x, id));
}

// quantize_q8 quantizes activation rows a [rows, K] (K a multiple of 32)
// in blocks of 32 for the dp4a kernels: qa [rows, K] int8 with x ≈ d*q,
// and ds [rows, K/32] holding (d, d*Σq). One warp per block; grid
// (ceil(K/32/warps), rows).
extern "C" __global__ void quantize_q8(signed char* qa, float2* ds, const float* a, const int* meta, int which, int K) {
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    int nb = K >> 5, b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (b >= nb) return;
    u64 at = (u64)r * K + b * 32 + lane;
    float d;
    int q = q8_level(a[at], &d);
    qa[at] = (signed char)q;
    int s = q;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) ds[(u64)r * nb + b] = make_float2(d, d * (float)s);
}

// to_f16_q8 writes activation rows as f16 after rounding them to the int8
// levels of quantize_q8 (d*q), so that cuBLAS products by Q8_0 and Q4_0
// weights see the activations the matrix-vector kernels (and the CPU
// backend) see. Grid as quantize_q8.
extern "C" __global__ void to_f16_q8(u16* out, const float* a, const int* meta, int which, int K) {
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (b >= (K >> 5)) return;
    u64 at = (u64)r * K + b * 32 + lane;
    float d;
    int q = q8_level(a[at], &d);
    out[at] = f2h(d * (float)q);
}

// The matrix-vector kernels compute out[r, j] = W[j] · a[r] (+ bias[j])
// for r < meta[which], MVR rows of a per pass over the weights. A block is
// MV_WARPS warps covering rpb output rows (1, 2 or 4), so 4/rpb warps split
// each row's K; lanes stream 16-byte chunks of the row. With resid set,
// resid[r, j] += the result too (a fused residual add; resid is never a).
#define MV_WARPS 4
#define MVR 8

// mv_reduce sums each row's partial dot products over its warps and
// writes the M results of this pass. Every thread of the block calls it.
template <int M>
__device__ __forceinline__ void mv_reduce(float (&acc)[M], float* out, float* resid, const float* bias, int r0, int j,
                                          int N, bool live, int wpr) {
    __shared__ float part[MV_WARPS][MVR];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < M; k++) acc[k] = warp_sum(acc[k]);
    if (wpr > 1) {
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < M; k++) part[warp][k] = acc[k];
        __syncthreads();
        if (lane == 0 && warp % wpr == 0)
#pragma unroll
            for (int k = 0; k < M; k++) {
                float s = 0.f;
                for (int w = 0; w < wpr; w++) s += part[warp + w][k];
                acc[k] = s;
            }
        __syncthreads();
    }
    if (!live || lane != 0 || warp % wpr != 0) return;
    float bj = bias ? bias[j] : 0.f;
#pragma unroll
    for (int k = 0; k < M; k++) {
        u64 at = (u64)(r0 + k) * N + j;
        float v = acc[k] + bj;
        out[at] = v;
        if (resid) resid[at] += v;
    }
}

// mvq_pass: M rows of int8 activations against a Q8_0 or Q4_0 row.
template <int T, int M>
__device__ __forceinline__ void mvq_pass(float* out, float* resid, const signed char* qa, const float2* ds,
                                         const u8* row, const u16* d, const float* bias, int r0, int K, int N, int j,
                                         bool live, int sub, int nsub, int wpr) {
    float acc[M];
#pragma unroll
    for (int k = 0; k < M; k++) acc[k] = 0.f;
    int nb = K >> 5;
    if (live) {
        if constexpr (T == W_Q4_0) {
            // One 16-byte chunk is one block: byte i holds elements i (low
            // nibble) and i+16 (high nibble).
#pragma unroll 2
            for (int b = sub; b < nb; b += nsub) {
                uint4 q = *(const uint4*)(row + (u64)b * 16);
                float dw = h2f(d[b]);
                int lo[4] = {(int)(q.x & 0x0f0f0f0f), (int)(q.y & 0x0f0f0f0f), (int)(q.z & 0x0f0f0f0f), (int)(q.w & 0x0f0f0f0f)};
                int hi[4] = {(int)((q.x >> 4) & 0x0f0f0f0f), (int)((q.y >> 4) & 0x0f0f0f0f), (int)((q.z >> 4) & 0x0f0f0f0f),
                             (int)((q.w >> 4) & 0x0f0f0f0f)};
#pragma unroll
                for (int k = 0; k < M; k++) {
                    const int4* x = (const int4*)(qa + (u64)(r0 + k) * K + (u64)b * 32);
                    int4 x0 = x[0], x1 = x[1];
                    float2 s = ds[(u64)(r0 + k) * nb + b];
                    int dot = dp4a(lo[0], x0.x, 0);
                    dot = dp4a(lo[1], x0.y, dot);
                    dot = dp4a(lo[2], x0.z, dot);
                    dot = dp4a(lo[3], x0.w, dot);
                    dot = dp4a(hi[0], x1.x, dot);
                    dot = dp4a(hi[1], x1.y, dot);
                    dot = dp4a(hi[2], x1.z, dot);
                    dot = dp4a(hi[3], x1.w, dot);
                    // Σ (n-8) q = Σ n q - 8 Σ q.
                    acc[k] += dw * (s.x * (float)dot - 8.f * s.y);
                }
            }
        } else {
            // Q8_0: a chunk is half a block.
            int nc = K >> 4;
#pragma unroll 2
            for (int c = sub; c < nc; c += nsub) {
                int4 q = *(const int4*)(row + (u64)c * 16);
                float dw = h2f(d[c >> 1]);
#pragma unroll
                for (int k = 0; k < M; k++) {
                    int4 x = *(const int4*)(qa + (u64)(r0 + k) * K + (u64)c * 16);
                    float da = ds[(u64)(r0 + k) * nb + (c >> 1)].x;
                    int dot = dp4a(q.x, x.x, 0);
                    dot = dp4a(q.y, x.y, dot);
                    dot = dp4a(q.z, x.z, dot);
                    dot = dp4a(q.w, x.w, dot);
                    acc[k] += dw * da * (float)dot;
                }
            }
        }
    }
    mv_reduce<M>(acc, out, resid, bias, r0, j, N, live, wpr);
}

// mvf_pass: M float32 activation rows against an F32, F16 or BF16 row;
// 16-byte chunks when K allows (vec), else one element per lane.
template <int T, int M>
__device__ __forceinline__ void mvf_pass(float* out, float* resid, const float* a, const u8* row, const float* bias,
                                         int r0, int K, int N, int j, bool live, int sub, int nsub, int wpr, bool vec) {
    float acc[M];
#pragma unroll
    for (int k = 0; k < M; k++) acc[k] = 0.f;
    if (live) {
        if (vec && T == W_F32) {
            int nc = K >> 2;
#pragma unroll 2
            for (int c = sub; c < nc; c += nsub) {
                float4 w = *(const float4*)(row + (u64)c * 16);
#pragma unroll
                for (int k = 0; k < M; k++) {
                    float4 x = *(const float4*)(a + (u64)(r0 + k) * K + (u64)c * 4);
                    acc[k] += w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
                }
            }
        } else if (vec) {
            int nc = K >> 3;
#pragma unroll 2
            for (int c = sub; c < nc; c += nsub) {
                uint4 q = *(const uint4*)(row + (u64)c * 16);
                u32 p[4] = {q.x, q.y, q.z, q.w};
                float w[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (T == W_F16) {
                        w[2 * e] = h2f((u16)(p[e] & 0xffff));
                        w[2 * e + 1] = h2f((u16)(p[e] >> 16));
                    } else {
                        w[2 * e] = __uint_as_float(p[e] << 16);
                        w[2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
                    }
                }
#pragma unroll
                for (int k = 0; k < M; k++) {
                    const float4* x = (const float4*)(a + (u64)(r0 + k) * K + (u64)c * 8);
                    float4 x0 = x[0], x1 = x[1];
                    acc[k] += w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y +
                              w[6] * x1.z + w[7] * x1.w;
                }
            }
        } else {
            for (int i = sub; i < K; i += nsub) {
                float w = deq<T>(row, 0, i);
#pragma unroll
                for (int k = 0; k < M; k++) acc[k] += w * a[(u64)(r0 + k) * K + i];
            }
        }
    }
    mv_reduce<M>(acc, out, resid, bias, r0, j, N, live, wpr);
}

// matvec dispatches each pass of up to MVR rows to the pass of exactly
// that many rows. For the quantized types x is qa and ds the block
// scales; for the others x is the float32 activation.
template <int T>
__device__ void matvec(float* out, float* resid, const void* x, const float2* ds, const u8* w, long long rowBytes,
                       long long dOff, const float* bias, const int* meta, int which, int K, int N, int rpb) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wpr = MV_WARPS / rpb;
    int j = blockIdx.x * rpb + warp / wpr;
    int sub = (warp % wpr) * 32 + lane, nsub = wpr * 32;
    bool live = j < N;
    const u8* row = w + (u64)(live ? j : 0) * rowBytes;
    const u16* d = (const u16*)(w + dOff) + (u64)(live ? j : 0) * (K >> 5);
    bool vec = T == W_F32 ? (K & 3) == 0 : (K & 7) == 0;
    int n = meta[which];
    for (int r0 = 0; r0 < n; r0 += MVR) {
        int m = min(MVR, n - r0);
#define MV_CASE(M)                                                                                                  \
    case M:                                                                                                         \
        if constexpr (T == W_Q8_0 || T == W_Q4_0)                                                                   \
            mvq_pass<T, M>(out, resid, (const signed char*)x, ds, row, d, bias, r0, K, N, j, live, sub, nsub, wpr); \
        else                                                                                                        \
            mvf_pass<T, M>(out, resid, (const float*)x, row, bias, r0, K, N, j, live, sub, nsub, wpr, vec);         \
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
}

#define MATVEC(name, T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                                  \
        name(float* out, float* resid, const void* x, const float2* ds, const u8* w, long long rowBytes,         \
             long long dOff, const float* bias, const int* meta, int which, int K, int N, int rpb) {             \
        matvec<T>(out, resid, x, ds, w, rowBytes, dOff, bias, meta, which, K, N, rpb);                           \
    }
MATVEC(matvec_f32, W_F32)
MATVEC(matvec_f16, W_F16)
MATVEC(matvec_bf16, W_BF16)
MATVEC(matvec_q8_0, W_Q8_0)
MATVEC(matvec_q4_0, W_Q4_0)

// The matrix-matrix path hands cuBLAS f16 operands: to_f16 converts
// activation rows, deq_f16_* a whole weight ([N, K], 8 elements a thread),
// add_bias adds a bias to every row of the float32 product.
extern "C" __global__ void to_f16(u16* out, const float* a, const int* meta, int which, int K) {
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
    const u16* d = (const u16*)(w + dOff) + j * (K >> 5);
    u32 p[4];
#pragma unroll
    for (int k = 0; k < 4; k++) p[k] = f2h(deq<T>(row, d, i + 2 * k)) | ((u32)f2h(deq<T>(row, d, i + 2 * k + 1)) << 16);
    *(uint4*)(out + e) = make_uint4(p[0], p[1], p[2], p[3]);
}

#define DEQ_F16(name, T)                                                                                  \
    extern "C" __global__ void name(u16* out, const u8* w, long long rowBytes, long long dOff, int N, int K) { \
        deq_f16<T>(out, w, rowBytes, dOff, N, K);                                                         \
    }
DEQ_F16(deq_f16_bf16, W_BF16)
DEQ_F16(deq_f16_q8_0, W_Q8_0)
DEQ_F16(deq_f16_q4_0, W_Q4_0)

extern "C" __global__ void add_bias(float* out, const float* bias, const int* meta, int which, int N) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= N) return;
    out[(u64)r * N + i] += bias[i];
}

// rmsnorm: y = x / sqrt(mean(x²) + eps) * w over each group of `group`
// columns. Grid (cols/group, rows); one block per (group, row). Out may
// be a: every thread reads its elements before the barrier in block_sum
// and then writes only the elements it read.
extern "C" __global__ void rmsnorm(float* out, const float* a, const float* w, const int* meta, int which, int cols,
                                   int group, float eps) {
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    u64 base = (u64)r * cols + (u64)blockIdx.x * group;
    const float* x = a + base;
    float* y = out + base;
    float ss = 0.f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss);
    float inv = 1.f / sqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) y[i] = x[i] * inv * w[i];
}

// rope rotates x [rows, nheads*hd] in place: the first 2*half dims of each
// head, pairs (2i, 2i+1) (interleaved) or (i, i+half) (neox), by angle
// pos * invfreq[i]. Grid (1, rows).
extern "C" __global__ void rope(float* x, const float* invfreq, const int* meta, const int* pos, int nheads, int hd,
                                int half, int neox) {
    int r = blockIdx.y;
    if (r >= meta[0]) return;
    float p = (float)pos[r];
    float* xr = x + (u64)r * nheads * hd;
    for (int t = threadIdx.x; t < nheads * half; t += blockDim.x) {
        int h = t / half, i = t - h * half;
        float s, c;
        sincosf(p * invfreq[i], &s, &c);
        int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float* v = xr + h * hd;
        float x0 = v[ia], x1 = v[ib];
        v[ia] = x0 * c - x1 * s;
        v[ib] = x0 * s + x1 * c;
    }
}

// store_kv copies row r of k and v [rows, d] into the caches [slots, cap, d]
// at (slot[r], pos[r] % cap). Grid (ceil(d/block), rows).
extern "C" __global__ void store_kv(float* kc, float* vc, const float* k, const float* v, const int* meta,
                                    const int* pos, const int* slots, int d, int cap) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= d) return;
    u64 at = ((u64)slots[r] * cap + pos[r] % cap) * d + i;
    kc[at] = k[(u64)r * d + i];
    vc[at] = v[(u64)r * d + i];
}

// The most head dims attention handles: each lane holds MAXD/32 of them.
#define MAXD 512

// attention: out[r, h] = softmax(scale * q[r, h] · K) · V over the row's
// slot, positions [first, pos] (first = pos-window+1 with a window, else
// 0), with an optional soft-cap of the scores. One block per (head, row);
// each warp runs an online softmax over every nw-th position (lane l holds
// dims l, l+32, ...), then the warps' partial results are merged through
// shared memory: nw*hd accumulators, nw maxima, nw sums. Grid (nheads,
// rows). The decode path: few rows, each reading its own positions.
extern "C" __global__ void attention(float* out, const float* q, const float* kc, const float* vc, const int* meta,
                                     const int* pos, const int* slots, int nheads, int nkv, int hd, int cap,
                                     float scale, float softcap, int window) {
    extern __shared__ float sm[];
    int h = blockIdx.x, r = blockIdx.y;
    if (r >= meta[0]) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int p = pos[r], first = window > 0 ? max(0, p - window + 1) : 0;
    int kvdim = nkv * hd;
    u64 base = (u64)slots[r] * cap * kvdim + (u64)(h / (nheads / nkv)) * hd;
    const float* qh = q + (u64)r * nheads * hd + (u64)h * hd;

    float qv[MAXD / 32], acc[MAXD / 32];
#pragma unroll
    for (int k = 0; k < MAXD / 32; k++) {
        int d = lane + 32 * k;
        qv[k] = d < hd ? qh[d] : 0.f;
        acc[k] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int j = first + warp; j <= p; j += nw) {
        u64 at = base + (u64)(j % cap) * kvdim;
        const float* kj = kc + at;
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < MAXD / 32; k++) {
            int d = lane + 32 * k;
            if (d < hd) s += qv[k] * kj[d];
        }
        s = warp_sum(s) * scale;
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        const float* vj = vc + at;
#pragma unroll
        for (int k = 0; k < MAXD / 32; k++) {
            int d = lane + 32 * k;
            if (d < hd) acc[k] = acc[k] * corr + e * vj[d];
        }
        m = mn;
    }

    float* sacc = sm;               // [nw, hd]
    float* sm_m = sm + nw * hd;     // [nw]
    float* sm_l = sm_m + nw;        // [nw]
#pragma unroll
    for (int k = 0; k < MAXD / 32; k++) {
        int d = lane + 32 * k;
        if (d < hd) sacc[warp * hd + d] = acc[k];
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    // Position p is always visible, so at least one warp has a finite max;
    // a warp that saw no position has m = -inf and weighs exp(-inf) = 0.
    float M = NEG_INF;
    for (int w = 0; w < nw; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.f;
    for (int w = 0; w < nw; w++) L += sm_l[w] * expf(sm_m[w] - M);
    float* o = out + (u64)r * nheads * hd + (u64)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.f;
        for (int w = 0; w < nw; w++) v += sacc[w * hd + d] * expf(sm_m[w] - M);
        o[d] = v / L;
    }
}

// attention_tiled is the prefill path: one block per (kv head, AT_ROWS
// consecutive rows). Rows of one slot form a segment whose query vectors
// (rows × the kv head's nheads/nkv query heads) share every tile of AT_KT
// keys and values loaded into shared memory, so the cache is read once
// per segment rather than once per query. Each of the AT_WARPS warps
// runs an online softmax for QPW query vectors: lane l scores key l of
// the tile, then owns dims l, l+32, ... of the output. Needs hd % 4 == 0
// and hd <= 32*HD4. Shared memory: keys [AT_KT][hd+4] (the pad keeps
// 16-byte rows on distinct banks), values [AT_KT][hd], scaled queries
// [AT_WARPS*QPW][hd], probabilities [AT_WARPS][AT_KT].
#define AT_ROWS 8
#define AT_KT 32
#define AT_WARPS 8

template <int HD4, int QPW>
__device__ void attention_tiled(float* out, const float* q, const float* kc, const float* vc, const int* meta,
                                const int* pos, const int* slots, int nheads, int nkv, int hd, int cap, float scale,
                                float softcap, int window) {
    extern __shared__ __align__(16) float smt[];
    int rows = meta[0], g = blockIdx.x;
    int rbeg = blockIdx.y * AT_ROWS;
    if (rbeg >= rows) return;
    int rend = min(rows, rbeg + AT_ROWS);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hdp = hd + 4, G = nheads / nkv, kvdim = nkv * hd;
    float* Ks = smt;
    float* Vs = Ks + AT_KT * hdp;
    float* Qs = Vs + AT_KT * hd;
    float* Ps = Qs + AT_WARPS * QPW * hd;

    for (int s0 = rbeg; s0 < rend;) {
        int slot = slots[s0], s1 = s0 + 1;
        while (s1 < rend && slots[s1] == slot) s1++;
        int kmin = 0x7fffffff, kmax = -1;
        for (int r = s0; r < s1; r++) {
            int p = pos[r];
            kmin = min(kmin, window > 0 ? max(0, p - window + 1) : 0);
            kmax = max(kmax, p);
        }
        u64 base = (u64)slot * cap * kvdim + (u64)g * hd;
        int nvec = (s1 - s0) * G;
        for (int v0 = 0; v0 < nvec; v0 += AT_WARPS * QPW) {
            __syncthreads(); // the previous pass is done with Qs
            for (int t = threadIdx.x; t < AT_WARPS * QPW * hd; t += blockDim.x) {
                int vi = t / hd, d = t - vi * hd, v = v0 + vi;
                float x = 0.f;
                if (v < nvec) {
                    int r = s0 + v / G, h = g * G + v % G;
                    x = q[(u64)r * nheads * hd + (u64)h * hd + d] * scale;
                }
                Qs[t] = x;
            }
            float m[QPW], l[QPW], acc[QPW][HD4];
            int last[QPW], first[QPW];
#pragma unroll
            for (int i = 0; i < QPW; i++) {
                m[i] = NEG_INF;
                l[i] = 0.f;
#pragma unroll
                for (int c = 0; c < HD4; c++) acc[i][c] = 0.f;
                int v = v0 + warp * QPW + i;
                last[i] = -1;
                first[i] = 0;
                if (v < nvec) {
                    int p = pos[s0 + v / G];
                    last[i] = p;
                    first[i] = window > 0 ? max(0, p - window + 1) : 0;
                }
            }
            for (int k0 = kmin; k0 <= kmax; k0 += AT_KT) {
                __syncthreads(); // every warp is done with the last tile
                int n4 = hd >> 2;
                for (int t = threadIdx.x; t < AT_KT * n4; t += blockDim.x) {
                    int kk = t / n4, d = (t - kk * n4) * 4, kp = k0 + kk;
                    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
                    if (kp <= kmax) {
                        u64 at = base + (u64)(kp % cap) * kvdim + d;
                        kv = *(const float4*)(kc + at);
                        vv = *(const float4*)(vc + at);
                    }
                    *(float4*)(Ks + kk * hdp + d) = kv;
                    *(float4*)(Vs + kk * hd + d) = vv;
                }
                __syncthreads();
#pragma unroll
                for (int i = 0; i < QPW; i++) {
                    if (last[i] < k0 || first[i] > k0 + AT_KT - 1) continue; // no visible key in this tile
                    const float* qv = Qs + (warp * QPW + i) * hd;
                    const float* kr = Ks + lane * hdp;
                    float s = 0.f;
                    for (int d = 0; d < hd; d += 4) {
                        float4 a = *(const float4*)(qv + d), b = *(const float4*)(kr + d);
                        s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                    }
                    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                    int kp = k0 + lane;
                    bool ok = kp >= first[i] && kp <= last[i];
                    float mn = fmaxf(m[i], warp_max(ok ? s : NEG_INF));
                    float corr = expf(m[i] - mn), e = ok ? expf(s - mn) : 0.f;
                    l[i] = l[i] * corr + warp_sum(e);
                    m[i] = mn;
                    Ps[warp * AT_KT + lane] = e;
                    __syncwarp();
#pragma unroll
                    for (int c = 0; c < HD4; c++) acc[i][c] *= corr;
                    for (int kk = 0; kk < AT_KT; kk++) {
                        float pk = Ps[warp * AT_KT + kk];
#pragma unroll
                        for (int c = 0; c < HD4; c++) {
                            int d = lane + 32 * c;
                            if (d < hd) acc[i][c] += pk * Vs[kk * hd + d];
                        }
                    }
                    __syncwarp();
                }
            }
#pragma unroll
            for (int i = 0; i < QPW; i++) {
                int v = v0 + warp * QPW + i;
                if (v >= nvec) continue;
                int r = s0 + v / G, h = g * G + v % G;
                float* o = out + (u64)r * nheads * hd + (u64)h * hd;
#pragma unroll
                for (int c = 0; c < HD4; c++) {
                    int d = lane + 32 * c;
                    if (d < hd) o[d] = acc[i][c] / l[i];
                }
            }
        }
        s0 = s1;
    }
}

#define ATTN_TILED(name, HD4, QPW)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * AT_WARPS)                                                 \
        name(float* out, const float* q, const float* kc, const float* vc, const int* meta, const int* pos,     \
             const int* slots, int nheads, int nkv, int hd, int cap, float scale, float softcap, int window) {  \
        attention_tiled<HD4, QPW>(out, q, kc, vc, meta, pos, slots, nheads, nkv, hd, cap, scale, softcap, window); \
    }
ATTN_TILED(attention_tiled_64, 2, 4)
ATTN_TILED(attention_tiled_128, 4, 2)

// Elementwise ops over [meta[which], cols]. Grid (ceil(cols/block), rows).
extern "C" __global__ void add(float* out, const float* a, const float* b, const int* meta, int which, int cols) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    out[at] = a[at] + b[at];
}

// glu: out = act(a) * b, act 0 = SiLU, 1 = GELU (tanh approximation).
extern "C" __global__ void glu(float* out, const float* a, const float* b, const int* meta, int which, int cols,
                               int act) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    float x = a[at], g;
    if (act == 1)
        g = 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    else
        g = x / (1.f + expf(-x));
    out[at] = g * b[at];
}

extern "C" __global__ void softcap(float* out, const float* a, const int* meta, int which, int cols, float cap) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    out[at] = cap * tanhf(a[at] / cap);
}

// gather: out[s] = a[selected[s]] for s < meta[1]. Grid (ceil(cols/block), rows).
extern "C" __global__ void gather(float* out, const float* a, const int* meta, const int* selected, int cols) {
    int s = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= meta[1] || i >= cols) return;
    out[(u64)s * cols + i] = a[(u64)selected[s] * cols + i];
}
