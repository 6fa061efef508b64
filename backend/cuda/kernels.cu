// weft's CUDA kernels, compiled at run time by NVRTC (no headers: every
// helper used here is a compiler builtin). One kernel per plan op; the Go
// side (plan.go) chooses the launch shape and the argument order, which
// must match the signatures below.
//
// Activations are float32 [MaxRows, cols] row-major. Batch data lives in
// one device array "meta" of int32: meta[0] = rows, meta[1] = selected
// rows, then the tokens, positions, slots and selected row indices, each
// MaxRows long. Kernels read the row count from meta (argument "which": 0
// for every row, 1 for the selected rows) so a launch's arguments never
// change between batches; blocks past the count return at once, so a grid
// may cover MaxRows rows (for a replayed graph) or just the batch's.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned long long u64; // offsets: tensors may pass 2^31 elements

#define NEG_INF __int_as_float(0xff800000)

// Weight storage types; each has its own embed_ and matmul_ kernel.
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

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

// deq returns element i of a weight row in its stored type. Q8_0 blocks are
// 34 bytes (f16 scale, 32 int8), Q4_0 blocks 18 bytes (f16 scale, 16 bytes
// of nibbles: element j of the block is the low nibble of byte j for j < 16,
// the high nibble of byte j-16 otherwise, minus 8).
template <int T>
__device__ __forceinline__ float deq(const u8* __restrict__ row, int i) {
    if (T == W_F32) return ((const float*)row)[i];
    if (T == W_F16) return h2f(((const u16*)row)[i]);
    if (T == W_BF16) return bf2f(((const u16*)row)[i]);
    if (T == W_Q8_0) {
        const u8* b = row + (u64)(i >> 5) * 34;
        return h2f(*(const u16*)b) * (float)(signed char)b[2 + (i & 31)];
    }
    const u8* b = row + (u64)(i >> 5) * 18;
    int j = i & 31;
    u8 q = b[2 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return h2f(*(const u16*)b) * (float)(v - 8);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
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

// embed: out[r, i] = deq(W[token[r]], i) * scale. Grid (ceil(cols/block), rows).
template <int T>
__device__ void embed(float* out, const u8* w, const int* meta, const int* tokens, int cols, long long rowBytes, float scale) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= cols) return;
    out[(u64)r * cols + i] = deq<T>(w + (u64)tokens[r] * rowBytes, i) * scale;
}

#define EMBED(name, T)                                                                                      \
    extern "C" __global__ void name(float* out, const u8* w, const int* meta, const int* tokens, int cols, \
                                    long long rowBytes, float scale) {                                     \
        embed<T>(out, w, meta, tokens, cols, rowBytes, scale);                                              \
    }
EMBED(embed_f32, W_F32)
EMBED(embed_f16, W_F16)
EMBED(embed_bf16, W_BF16)
EMBED(embed_q8_0, W_Q8_0)
EMBED(embed_q4_0, W_Q4_0)

// matmul: out[r, j] = W[j] · a[r] (+ bias[j]) for r < meta[which]. One warp
// per output column j; the warp walks the rows four at a time so each
// weight element is decoded once per four rows. a: [rows, in], out: [rows,
// outc], W: outc rows of rowBytes. Grid ceil(outc / warps per block).
template <int T>
__device__ void matmul(float* out, const float* a, const u8* w, const float* bias, const int* meta, int which, int in,
                       int outc, long long rowBytes) {
    int j = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (j >= outc) return;
    int n = meta[which];
    const u8* row = w + (u64)j * rowBytes;
    float bj = bias ? bias[j] : 0.f;
    for (int r0 = 0; r0 < n; r0 += 4) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int m = min(4, n - r0);
        const float* ar = a + (u64)r0 * in;
        for (int i = lane; i < in; i += 32) {
            float x = deq<T>(row, i);
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (k < m) acc[k] += x * ar[(u64)k * in + i];
        }
#pragma unroll
        for (int k = 0; k < 4; k++) acc[k] = warp_sum(acc[k]);
        if (lane == 0)
            for (int k = 0; k < m; k++) out[(u64)(r0 + k) * outc + j] = acc[k] + bj;
    }
}

#define MATMUL(name, T)                                                                                 \
    extern "C" __global__ void name(float* out, const float* a, const u8* w, const float* bias,        \
                                    const int* meta, int which, int in, int outc, long long rowBytes) { \
        matmul<T>(out, a, w, bias, meta, which, in, outc, rowBytes);                                    \
    }
MATMUL(matmul_f32, W_F32)
MATMUL(matmul_f16, W_F16)
MATMUL(matmul_bf16, W_BF16)
MATMUL(matmul_q8_0, W_Q8_0)
MATMUL(matmul_q4_0, W_Q4_0)

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
// MaxRows).
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
