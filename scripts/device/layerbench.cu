// layerbench: a whole decode step's layers (Q4_0 weights, one row) at
// Llama-3.2-1B's and Llama-3-8B's shapes, run two ways from the same tile
// code, to learn whether one persistent launch beats the engine's chain
// of launches before the engine is built around it (backend/cuda/NOTES.md,
// "A persistent decode kernel"):
//
//   chain    one kernel an op (norm, q/k/v, rope+attention, o, norm,
//            gate/up+GLU, down), a block a tile, in a CUDA graph with
//            programmatic dependent launch: each block issues its first
//            weight loads, then waits for the kernel before (as the
//            engine's kernels do);
//   persist  one launch for all layers: every block stays resident and
//            takes tiles in a fixed order (tile g of the step goes to
//            block g mod grid); a tile issues its first weight loads,
//            then waits only for the tiles it reads (a counter a layer
//            and op in global memory: the attention of a kv head waits
//            for the q/k/v tiles of that head alone), then computes and
//            counts itself done.
//
// Two more persistent forms: "ticket" hands the tiles out in the same
// order by an atomic count (a block that is done early takes the next
// tile, as the hardware does for the chain's blocks), and "stream" also
// copies every block's upcoming tiles' weights into a ring in shared
// memory by TMA, as far ahead as the ring holds, whatever they wait for.
//
// Each has a variant that folds the norm into its consumers (every q/k/v
// and GLU tile normalises the residual row itself into shared memory),
// and "persist nodeps" runs the persistent schedule without waiting (its
// results are wrong; its time is what the tiles cost with no dependency
// at all). Every variant must end with the residual row bit-identical to
// the chain's (same tile code, same summation orders).
//
// Build and run on the device:
//   nvcc -O3 -arch=sm_90a -o layerbench layerbench.cu && ./layerbench [pos]
// The device code also compiles under NVRTC (host code is guarded), for
// checking registers without a GPU.
#ifndef __CUDACC_RTC__
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#endif

#include "q4dev.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)
#define MAXK 16384   // the widest product input (the 8B down: 14,336)
#define MAXKEYS 1024 // positions an attention tile scores
#ifndef PERSIST_MINB
#define PERSIST_MINB 3 // blocks a multiprocessor the persistent kernel is compiled for
#endif



// A layer's weights: Q4_0 matrices as [rows][K/2] quant bytes followed by
// [rows][K/32] f16 scales; norm weights; the layer's key/value cache
// [kv heads][cap][head dim].
struct Layer {
    const u8 *qkv, *o, *gu, *down;
    const float *an, *fn;
    float *kc, *vc;
};

enum { OP_NORM1, OP_QKV, OP_ATTN, OP_O, OP_NORM2, OP_GLU, OP_DOWN, NOPS };
// Counter slots a layer: one an op (tiles done), then one a kv head (q/k/v
// tiles of that head done).
#define CSLOTS 32

struct Params {
    int D, H, KVH, HD, F, L, pos, cap, fold, wait; // wait: 0 none, 1 counters, 2 PDL
    const Layer* layers;
    float* x;                    // the residual row [D]
    signed char* qa; float* da;  // a norm's output [D]
    float* qkv;                  // [D + 2·KVH·HD]
    signed char* qo; float* dao; // the attention's output [D]
    signed char* qh; float* dah; // the GLU's output [F]
    unsigned* cnt;               // [L][CSLOTS]
    int* err;
};

__device__ __forceinline__ int tiles_of(const Params& p, int op) {
    switch (op) {
    case OP_NORM1: case OP_NORM2: return p.fold ? 0 : 1;
    case OP_QKV: return (p.D + 2 * p.KVH * p.HD) / 8;
    case OP_ATTN: return p.KVH;
    case OP_O: case OP_DOWN: return p.D / 8;
    default: return p.F / 32;
    }
}

struct Smem {
    signed char qa[MAXK];
    float da[MAXK / 32];
    float red[WARPS];
    float s[4 * MAXKEYS]; // attention: scores of up to 4 heads; GLU: outputs
    float qh[4 * 128 + 2 * 128];
};

// wait_for spins (one thread) until a counter reaches need, bounded so that
// a schedule that cannot finish reports an error instead of hanging.
__device__ __forceinline__ void wait_for(const Params& p, const unsigned* c, unsigned need) {
    if (threadIdx.x == 0) {
        int spins = 0;
        while (ld_acquire(c) < need)
            if (++spins > (1 << 24)) { atomicExch(p.err, 1); break; }
    }
    __syncthreads();
}
__device__ __forceinline__ void signal(unsigned* c) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(c, 1u);
    }
}

// dep waits for what tile t of op in layer l reads.
__device__ __forceinline__ void dep(const Params& p, int l, int op, int t) {
    if (p.wait == 2) { pdl_wait(); pdl_launch(); return; }
    if (p.wait == 0) return;
    const unsigned* c = p.cnt + l * CSLOTS;
    const unsigned* prev = p.cnt + (l - 1) * CSLOTS;
    switch (op) {
    case OP_NORM1: if (l > 0) wait_for(p, prev + OP_DOWN, p.D / 8); break;
    case OP_QKV:
        if (!p.fold) wait_for(p, c + OP_NORM1, 1);
        else if (l > 0) wait_for(p, prev + OP_DOWN, p.D / 8);
        break;
    case OP_ATTN: wait_for(p, c + 8 + t, (p.H / p.KVH + 2) * p.HD / 8); break;
    case OP_O: wait_for(p, c + OP_ATTN, p.KVH); break;
    case OP_NORM2: wait_for(p, c + OP_O, p.D / 8); break;
    case OP_GLU:
        if (!p.fold) wait_for(p, c + OP_NORM2, 1);
        else wait_for(p, c + OP_O, p.D / 8);
        break;
    case OP_DOWN: wait_for(p, c + OP_GLU, p.F / 32); break;
    }
}
__device__ __forceinline__ void done(const Params& p, int l, int op, int t) {
    if (p.wait != 1) return;
    unsigned* c = p.cnt + l * CSLOTS;
    if (op == OP_QKV) {
        int row = t * 8, G = p.H / p.KVH, kvd = p.KVH * p.HD;
        int h = row < p.D ? row / (G * p.HD) : row < p.D + kvd ? (row - p.D) / p.HD : (row - p.D - kvd) / p.HD;
        signal(c + 8 + h);
    } else
        signal(c + op);
}

// norm_q8 writes the row x·g/rms(x) as int8 levels and a scale a 32 (to
// shared or global memory; the same code and order either way).
__device__ void norm_q8(const float* x, const float* g, int K, signed char* qo, float* dq, float* red) {
    float s = 0.f;
    for (int i = threadIdx.x; i < K; i += THREADS) { float v = __ldcg(x + i); s += v * v; }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < WARPS; w++) t += red[w];
    float r = rsqrtf(t / K + 1e-5f);
    for (int i = threadIdx.x; i < K; i += THREADS) {
        float v = __ldcg(x + i) * r * g[i];
        float m = warp_max(fabsf(v));
        float d = m / 127.f;
        qo[i] = (signed char)__float2int_rn(d > 0.f ? v / d : 0.f);
        if ((threadIdx.x & 31) == 0) dq[i >> 5] = d;
    }
    __syncthreads();
}

// stage copies a product's int8 input (written by other blocks of this
// launch, so through L2) into shared memory.
__device__ void stage(Smem& sm, const signed char* qa, const float* da, int K) {
    for (int i = threadIdx.x; i < K / 16; i += THREADS) ((int4*)sm.qa)[i] = __ldcg((const int4*)qa + i);
    for (int i = threadIdx.x; i < K / 32; i += THREADS) sm.da[i] = __ldcg(da + i);
    __syncthreads();
}

// item_dots sums each of a warp's RPW rows of K = 1024·CPL columns, a
// lane taking the chunks lane, lane+32, ...: item f is row f / CPL, chunk
// lane + 32·(f % CPL), and load(q, d, f0) fills items f0..f0+3's weights
// and scales, 4 loads in flight a lane; early: the caller loaded the first
// batch (before a dependency wait).
template <int RPW, int CPL, class Load>
__device__ __forceinline__ void item_dots(float (&acc)[RPW], const Smem& sm, uint4 (&q)[4], float (&d)[4], bool early, Load load) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < RPW; i++) acc[i] = 0.f;
#pragma unroll
    for (int b = 0; b < RPW * CPL; b += 4) {
        if (b > 0 || !early) load(q, d, b);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int f = b + u;
            if (f < RPW * CPL) {
                int c = lane + 32 * (f % CPL);
                acc[f / CPL] += d[u] * sm.da[c] * (float)q4dot(q[u], (const int4*)(sm.qa + c * 32));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) acc[i] = warp_sum(acc[i]);
}

// A product tile's items from global memory, its first batch loaded early.
template <int RPW, int CPL>
struct Items {
    uint4 q[4];
    float d[4];
    template <class RowOf>
    __device__ __forceinline__ void load(const u8* w, int N, RowOf rowOf, int f0) {
        const int nc = CPL * 32, lane = threadIdx.x & 31;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int f = f0 + u;
            if (f < RPW * CPL) {
                int row = rowOf(f / CPL), c = lane + 32 * (f % CPL);
                q[u] = ldw(w + (u64)row * (nc * 16) + (u64)c * 16);
                d[u] = h2f(*(const u16*)(w + (u64)N * nc * 16 + ((u64)row * nc + c) * 2));
            }
        }
    }
    template <class RowOf>
    __device__ __forceinline__ void dots(float (&acc)[RPW], const Smem& sm, const u8* w, int N, RowOf rowOf) {
        item_dots<RPW, CPL>(acc, sm, q, d, true, [&](uint4(&)[4], float(&)[4], int f0) { load(w, N, rowOf, f0); });
    }
};

// One row a warp, 8 rows a tile; out[row] = (resid ? out[row] : 0) + dot.
template <int CPL>
__device__ void rows_tile(const Params& p, Smem& sm, int l, int op, int t, const u8* w, int N, const signed char* qa,
                          const float* da, float* out, bool resid, bool foldNorm, const float* g) {
    int row = t * 8 + (threadIdx.x >> 5);
    auto rowOf = [row](int) { return row; };
    Items<1, CPL> it;
    it.load(w, N, rowOf, 0);
    dep(p, l, op, t);
    if (foldNorm) norm_q8(p.x, g, CPL * 1024, sm.qa, sm.da, sm.red);
    else stage(sm, qa, da, CPL * 1024);
    float acc[1];
    it.dots(acc, sm, w, N, rowOf);
    if ((threadIdx.x & 31) == 0) out[row] = (resid ? __ldcg(out + row) : 0.f) + acc[0];
    done(p, l, op, t);
}

// glu_out writes GLU tile t's 32 outputs, silu(gate)·up from each warp's
// sums (its 4 gate rows, then its 4 up rows), as one block of int8 levels
// and its scale.
__device__ void glu_out(const Params& p, Smem& sm, int t, const float (&acc)[8]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0)
        for (int i = 0; i < 4; i++) sm.s[warp * 4 + i] = acc[i] / (1.f + __expf(-acc[i])) * acc[4 + i];
    __syncthreads();
    if (warp == 0) {
        float v = sm.s[lane], m = warp_max(fabsf(v)), d = m / 127.f;
        p.qh[t * 32 + lane] = (signed char)__float2int_rn(d > 0.f ? v / d : 0.f);
        if (lane == 0) p.dah[t] = d;
    }
}

// A GLU tile: 32 outputs, 4 a warp (their gate rows, then their up rows),
// silu(gate)·up quantized as one block of 32.
template <int CPL>
__device__ void glu_tile(const Params& p, Smem& sm, int l, int t) {
    const Layer& L = p.layers[l];
    int j0 = t * 32 + (threadIdx.x >> 5) * 4, F = p.F;
    auto rowOf = [j0, F](int i) { return i < 4 ? j0 + i : F + j0 + i - 4; };
    Items<8, CPL> it;
    it.load(L.gu, 2 * F, rowOf, 0);
    dep(p, l, OP_GLU, t);
    if (p.fold) norm_q8(p.x, L.fn, CPL * 1024, sm.qa, sm.da, sm.red);
    else stage(sm, p.qa, p.da, CPL * 1024);
    float acc[8];
    it.dots(acc, sm, L.gu, 2 * F, rowOf);
    glu_out(p, sm, t, acc);
    done(p, l, OP_GLU, t);
}

// An attention tile: kv head h's query heads at position pos. RoPE on the
// queries and the new key, the new key and value into the cache, scores
// over pos+1 keys, softmax, P·V, the output quantized a 32.
__device__ void attn_tile(const Params& p, Smem& sm, int l, int h) {
    const Layer& L = p.layers[l];
    int G = p.H / p.KVH, HD = p.HD, pos = p.pos, n = pos + 1, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    dep(p, l, OP_ATTN, h);
    float* Q = sm.qh;      // [G][HD]
    float* Kn = Q + G * HD; // [HD]
    float* Vn = Kn + HD;    // [HD]
    const float* src = p.qkv;
    int kvd = p.KVH * HD;
    for (int i = tid; i < G * HD; i += THREADS) Q[i] = __ldcg(src + h * G * HD + i);
    for (int i = tid; i < HD; i += THREADS) { Kn[i] = __ldcg(src + p.D + h * HD + i); Vn[i] = __ldcg(src + p.D + kvd + h * HD + i); }
    __syncthreads();
    // RoPE (pairs 2i, 2i+1) on each query head and the key.
    for (int i = tid; i < (G + 1) * (HD / 2); i += THREADS) {
        int v = i / (HD / 2), k = i % (HD / 2);
        float* b = v < G ? Q + v * HD : Kn;
        float th = pos * powf(500000.f, -2.f * k / HD), sn, cs;
        sincosf(th, &sn, &cs);
        float a = b[2 * k], c = b[2 * k + 1];
        b[2 * k] = a * cs - c * sn;
        b[2 * k + 1] = a * sn + c * cs;
    }
    __syncthreads();
    u64 base = (u64)h * p.cap * HD;
    for (int i = tid; i < HD; i += THREADS) { L.kc[base + (u64)pos * HD + i] = Kn[i]; L.vc[base + (u64)pos * HD + i] = Vn[i]; }
    float scale = rsqrtf((float)HD);
    for (int i = tid; i < G * n; i += THREADS) {
        int g = i / n, j = i % n;
        const float* k = j == pos ? Kn : L.kc + base + (u64)j * HD;
        const float* q = Q + g * HD;
        float d = 0.f;
        for (int e = 0; e < HD; e += 4) {
            float4 a = *(const float4*)(q + e), b = *(const float4*)(k + e);
            d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        sm.s[g * MAXKEYS + j] = d * scale;
    }
    __syncthreads();
    if (warp < G) {
        float m = -__int_as_float(0x7f800000);
        for (int j = lane; j < n; j += 32) m = fmaxf(m, sm.s[warp * MAXKEYS + j]);
        m = warp_max(m);
        float s = 0.f;
        for (int j = lane; j < n; j += 32) { float e = __expf(sm.s[warp * MAXKEYS + j] - m); sm.s[warp * MAXKEYS + j] = e; s += e; }
        s = warp_sum(s);
        if (lane == 0) sm.red[warp] = 1.f / s;
    }
    __syncthreads();
    for (int i = tid; i < G * HD; i += THREADS) {
        int g = i / HD, e = i % HD;
        float o = 0.f;
        for (int j = 0; j < n; j++) o += sm.s[g * MAXKEYS + j] * (j == pos ? Vn[e] : L.vc[base + (u64)j * HD + e]);
        Q[i] = o * sm.red[g];
    }
    __syncthreads();
    for (int b = warp; b < G * HD / 32; b += WARPS) {
        float v = Q[b * 32 + lane], m = warp_max(fabsf(v)), d = m / 127.f;
        int o = h * G * HD + b * 32 + lane;
        p.qo[o] = (signed char)__float2int_rn(d > 0.f ? v / d : 0.f);
        if (lane == 0) p.dao[o >> 5] = d;
    }
    done(p, l, OP_ATTN, h);
}

template <int CD, int CF>
__device__ void run_tile(const Params& p, Smem& sm, int l, int op, int t) {
    const Layer& L = p.layers[l];
    switch (op) {
    case OP_NORM1: case OP_NORM2:
        dep(p, l, op, t);
        norm_q8(p.x, op == OP_NORM1 ? L.an : L.fn, p.D, p.qa, p.da, sm.red);
        done(p, l, op, t);
        break;
    case OP_QKV:
        rows_tile<CD>(p, sm, l, op, t, L.qkv, p.D + 2 * p.KVH * p.HD, p.qa, p.da, p.qkv, false, p.fold, L.an);
        break;
    case OP_ATTN: attn_tile(p, sm, l, t); break;
    case OP_O: rows_tile<CD>(p, sm, l, op, t, L.o, p.D, p.qo, p.dao, p.x, true, false, nullptr); break;
    case OP_GLU: glu_tile<CD>(p, sm, l, t); break;
    case OP_DOWN: rows_tile<CF>(p, sm, l, op, t, L.down, p.D, p.qh, p.dah, p.x, true, false, nullptr); break;
    }
    __syncthreads(); // shared memory is reused by the next tile
}

// The chain: one launch an op and layer, a block a tile.
template <int CD, int CF>
__global__ void __launch_bounds__(THREADS) chain_op(Params p, int l, int op) {
    __shared__ Smem sm;
    run_tile<CD, CF>(p, sm, l, op, blockIdx.x);
}

// The persistent schedule: tile g of the step (ops in order, layers in
// order) goes to block g mod grid; each block runs its tiles in order, so
// every tile a block waits for is earlier in every block's list and the
// co-resident grid cannot deadlock.
template <int CD, int CF>
__global__ void __launch_bounds__(THREADS, PERSIST_MINB) persist(Params p) {
    __shared__ Smem sm;
    int grid = gridDim.x, g0 = 0;
    for (int l = 0; l < p.L; l++)
        for (int op = 0; op < NOPS; op++) {
            int n = tiles_of(p, op);
            for (int t = ((int)blockIdx.x - g0 % grid + grid) % grid; t < n; t += grid) run_tile<CD, CF>(p, sm, l, op, t);
            g0 += n;
        }
}

// ---- variant "stream": the persistent schedule with every block's
// upcoming tiles' weights streamed into a ring in shared memory by bulk
// copies (TMA), as far ahead as the ring holds, whatever the tiles wait
// for; the tiles then read their weights from shared memory. One thread
// produces (tops the ring up at the start of every tile); tiles use the
// ring in order, so the k-th weighted tile of a block has slot k mod
// NSLOT and that slot's barrier parity (k / NSLOT) & 1.
#define NSLOT 16

// A block's walk over its tiles in the persistent order.
struct Cursor {
    int l = -1, op = 0, t = 0, g0 = 0, n = 0;
    __device__ bool next(const Params& p, int grid, int blk) {
        if (l >= 0) {
            t += grid;
            if (t < n) return true;
            g0 += n, op++;
        } else
            l = 0, op = 0, g0 = 0;
        for (;;) {
            if (op == NOPS) op = 0, l++;
            if (l >= p.L) return false;
            n = tiles_of(p, op);
            t = (blk - g0 % grid + grid) % grid;
            if (t < n) return true;
            g0 += n, op++;
        }
    }
};
__device__ __forceinline__ bool weighted(int op) { return op == OP_QKV || op == OP_O || op == OP_GLU || op == OP_DOWN; }
// A tile's weights in the ring: R rows' quants, then their scales (the
// GLU: its 32 gate rows so, then its 32 up rows).
__device__ __forceinline__ u32 tile_bytes(const Params& p, int op) {
    return op == OP_GLU ? 64u * p.D * 9 / 16 : op == OP_DOWN ? 8u * p.F * 9 / 16 : 8u * p.D * 9 / 16;
}
__device__ __forceinline__ void copy_rows(u8* dst, const u8* w, int N, int K, int r0, int R, u64* bar) {
    bulk_copy(dst, w + (u64)r0 * K / 2, (u32)R * K / 2, bar);
    bulk_copy(dst + (u64)R * K / 2, w + (u64)N * K / 2 + (u64)r0 * K / 16, (u32)R * K / 16, bar);
}
__device__ void tile_copies(const Params& p, int l, int op, int t, u8* dst, u64* bar) {
    const Layer& L = p.layers[l];
    mbar_expect(bar, tile_bytes(p, op));
    switch (op) {
    case OP_QKV: copy_rows(dst, L.qkv, p.D + 2 * p.KVH * p.HD, p.D, 8 * t, 8, bar); break;
    case OP_O: copy_rows(dst, L.o, p.D, p.D, 8 * t, 8, bar); break;
    case OP_DOWN: copy_rows(dst, L.down, p.D, p.F, 8 * t, 8, bar); break;
    case OP_GLU:
        copy_rows(dst, L.gu, 2 * p.F, p.D, 32 * t, 32, bar);
        copy_rows(dst + 32u * p.D * 9 / 16, L.gu, 2 * p.F, p.D, p.F + 32 * t, 32, bar);
        break;
    }
}

struct Ring {
    u64 bar[NSLOT];
    u32 off[NSLOT];
    int produced, consumed; // weighted tiles, by thread 0
    u32 head;               // the next free byte
};

// produce (thread 0) issues copies for the block's next tiles while the
// ring has a free slot and room.
__device__ void produce(const Params& p, Ring& rg, u8* ring, u32 cap, Cursor& pc, bool& more, int grid) {
    while (more) {
        if (!weighted(pc.op)) { more = pc.next(p, grid, blockIdx.x); continue; }
        if (rg.produced - rg.consumed == NSLOT) return;
        u32 b = tile_bytes(p, pc.op), at;
        if (rg.produced == rg.consumed) at = 0;
        else {
            u32 tail = rg.off[rg.consumed % NSLOT];
            if (rg.head > tail) at = rg.head + b <= cap ? rg.head : b <= tail ? 0 : ~0u;
            else at = rg.head + b <= tail && rg.head != tail ? rg.head : ~0u;
        }
        if (at == ~0u) return;
        int s = rg.produced % NSLOT;
        rg.off[s] = at;
        tile_copies(p, pc.l, pc.op, pc.t, ring + at, &rg.bar[s]);
        rg.head = at + b;
        rg.produced++;
        more = pc.next(p, grid, blockIdx.x);
    }
}

// Items from the ring: row i's chunk c at base + i·K/2 + 16c, its scale at
// base + R·K/2 + 2(i·K/32 + c), R rows a half (the GLU has two halves).
template <int RPW, int CPL>
__device__ __forceinline__ void sdots(float (&acc)[RPW], const Smem& sm, const u8* base, int R, int (&lrow)[RPW], int (&half)[RPW]) {
    const int K = CPL * 1024, lane = threadIdx.x & 31;
    const u32 hb = (u32)R * K * 9 / 16;
    uint4 q[4];
    float d[4];
    item_dots<RPW, CPL>(acc, sm, q, d, false, [&](uint4 (&qq)[4], float (&dd)[4], int f0) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int f = f0 + u;
            if (f < RPW * CPL) {
                int i = f / CPL, c = lane + 32 * (f % CPL);
                const u8* hbase = base + half[i] * hb;
                qq[u] = *(const uint4*)(hbase + (u32)lrow[i] * K / 2 + c * 16);
                dd[u] = h2f(*(const u16*)(hbase + (u32)R * K / 2 + ((u32)lrow[i] * (K / 32) + c) * 2));
            }
        }
    });
}

template <int CD, int CF>
__device__ void stream_tile(const Params& p, Smem& sm, Ring& rg, u8* ring, u32 cap, Cursor& pc, bool& more, int grid, int l, int op, int t) {
    const Layer& L = p.layers[l];
    if (threadIdx.x == 0) produce(p, rg, ring, cap, pc, more, grid);
    if (!weighted(op)) {
        if (op == OP_ATTN) attn_tile(p, sm, l, t);
        else {
            dep(p, l, op, t);
            norm_q8(p.x, op == OP_NORM1 ? L.an : L.fn, p.D, p.qa, p.da, sm.red);
            done(p, l, op, t);
        }
        __syncthreads();
        return;
    }
    dep(p, l, op, t);
    __syncthreads(); // publishes rg.off (dep may not wait at all)
    int k = rg.consumed, s = k % NSLOT, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u8* base = ring + rg.off[s];
    bool fold = p.fold && (op == OP_QKV || op == OP_GLU);
    const float* g = op == OP_QKV ? L.an : L.fn;
    if (fold) norm_q8(p.x, g, p.D, sm.qa, sm.da, sm.red);
    else if (op == OP_O) stage(sm, p.qo, p.dao, p.D);
    else if (op == OP_DOWN) stage(sm, p.qh, p.dah, p.F);
    else stage(sm, p.qa, p.da, p.D);
    mbar_wait(&rg.bar[s], (k / NSLOT) & 1);
    if (op == OP_GLU) {
        float acc[8];
        int lrow[8], half[8];
#pragma unroll
        for (int i = 0; i < 8; i++) lrow[i] = warp * 4 + (i & 3), half[i] = i >> 2;
        sdots<8, CD>(acc, sm, base, 32, lrow, half);
        glu_out(p, sm, t, acc);
    } else {
        float acc[1];
        int lrow[1] = {warp}, half[1] = {0};
        if (op == OP_DOWN) sdots<1, CF>(acc, sm, base, 8, lrow, half);
        else sdots<1, CD>(acc, sm, base, 8, lrow, half);
        int row = t * 8 + warp;
        float* out = op == OP_QKV ? p.qkv : p.x;
        if (lane == 0) out[row] = (op == OP_QKV ? 0.f : __ldcg(out + row)) + acc[0];
    }
    done(p, l, op, t); // its __syncthreads: every read of the slot is done
    if (threadIdx.x == 0) rg.consumed++;
    __syncthreads();
}

template <int CD, int CF>
__global__ void __launch_bounds__(THREADS, 1) stream(Params p, u32 cap) {
    __shared__ Smem sm;
    __shared__ Ring rg;
    extern __shared__ __align__(128) u8 ring[];
    int grid = gridDim.x;
    if (threadIdx.x == 0) {
        for (int i = 0; i < NSLOT; i++) mbar_init(&rg.bar[i], 1);
        rg.produced = rg.consumed = 0, rg.head = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    Cursor pc, cc;
    bool more = pc.next(p, grid, blockIdx.x);
    while (cc.next(p, grid, blockIdx.x)) stream_tile<CD, CF>(p, sm, rg, ring, cap, pc, more, grid, cc.l, cc.op, cc.t);
}

// The persistent grid with tiles handed out in the same global order by a
// ticket (an atomic count) rather than fixed by block index, so a block
// that finishes early takes the next tile, as the hardware's block
// scheduler does for the chain. Tickets come in order, so a tile waits
// only for tiles already handed to running blocks. A block asks for its
// next ticket before it runs the current tile, to hide the atomic.
template <int CD, int CF>
__global__ void __launch_bounds__(THREADS, PERSIST_MINB) persist_dyn(Params p) {
    __shared__ Smem sm;
    __shared__ int next;
    unsigned* ticket = p.cnt + p.L * CSLOTS;
    int perLayer = 0;
    for (int op = 0; op < NOPS; op++) perLayer += tiles_of(p, op);
    int total = perLayer * p.L;
    if (threadIdx.x == 0) next = (int)atomicAdd(ticket, 1u);
    __syncthreads();
    for (;;) {
        int g = next;
        if (g >= total) break;
        int nx = 0;
        if (threadIdx.x == 0) nx = (int)atomicAdd(ticket, 1u);
        int l = g / perLayer, r = g % perLayer, op = 0;
        while (r >= tiles_of(p, op)) r -= tiles_of(p, op), op++;
        run_tile<CD, CF>(p, sm, l, op, r);
        if (threadIdx.x == 0) next = nx;
        __syncthreads();
    }
}

#ifndef __CUDACC_RTC__
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

struct Shape { const char* name; int D, H, KVH, HD, F, L; };

template <int CD, int CF>
static void bench(const Shape& sh, int pos, double gbs) {
    int D = sh.D, KVH = sh.KVH, HD = sh.HD, F = sh.F, L = sh.L, cap = pos + 1, Nq = D + 2 * KVH * HD;
    srand(1);
    auto q4 = [&](int N, int K) {
        size_t qb = (size_t)N * K / 2, bytes = qb + (size_t)N * K / 16;
        std::vector<u8> h(bytes);
        u64 z = 0x9e3779b97f4a7c15ull * (u64)(N + 7 * K + rand());
        for (size_t i = 0; i + 8 <= qb; i += 8) { z ^= z << 13; z ^= z >> 7; z ^= z << 17; memcpy(&h[i], &z, 8); }
        for (size_t i = 0; i < (size_t)N * K / 32; i++) { z ^= z << 13; z ^= z >> 7; z ^= z << 17; u16 v = 0x1c00 | (z & 0x3ff); memcpy(&h[qb + 2 * i], &v, 2); }
        u8* d; CK(cudaMalloc(&d, bytes)); CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
        return std::make_pair(d, bytes);
    };
    auto floats = [&](size_t n, float lo, float hi) {
        std::vector<float> h(n);
        for (auto& v : h) v = lo + (hi - lo) * (rand() / (float)RAND_MAX);
        float* d; CK(cudaMalloc(&d, 4 * n)); CK(cudaMemcpy(d, h.data(), 4 * n, cudaMemcpyHostToDevice));
        return d;
    };
    std::vector<Layer> hl(L);
    double wbytes = 0;
    for (auto& y : hl) {
        auto a = q4(Nq, D), b = q4(D, D), c = q4(2 * F, D), e = q4(D, F);
        y.qkv = a.first, y.o = b.first, y.gu = c.first, y.down = e.first;
        wbytes += a.second + b.second + c.second + e.second;
        y.an = floats(D, 0.9f, 1.1f), y.fn = floats(D, 0.9f, 1.1f);
        y.kc = floats((size_t)KVH * cap * HD, -1.f, 1.f), y.vc = floats((size_t)KVH * cap * HD, -1.f, 1.f);
    }
    Params p = {};
    p.D = D, p.H = sh.H, p.KVH = KVH, p.HD = HD, p.F = F, p.L = L, p.pos = pos, p.cap = cap;
    Layer* dl; CK(cudaMalloc(&dl, L * sizeof(Layer))); CK(cudaMemcpy(dl, hl.data(), L * sizeof(Layer), cudaMemcpyHostToDevice));
    p.layers = dl;
    float* x0 = floats(D, -1.f, 1.f);
    CK(cudaMalloc(&p.x, 4 * D)); CK(cudaMalloc(&p.qa, D)); CK(cudaMalloc(&p.da, D / 8)); CK(cudaMalloc(&p.qkv, 4 * Nq));
    CK(cudaMalloc(&p.qo, D)); CK(cudaMalloc(&p.dao, D / 8)); CK(cudaMalloc(&p.qh, F)); CK(cudaMalloc(&p.dah, F / 8));
    CK(cudaMalloc(&p.cnt, 4 * (L + 1) * CSLOTS)); CK(cudaMalloc(&p.err, 4)); CK(cudaMemset(p.err, 0, 4));
    cudaStream_t st; CK(cudaStreamCreate(&st));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist<CD, CF>, THREADS, 0));
    double floor_us = wbytes / (gbs * 1e3);
    printf("\n%s, position %d: %d layers, %.1f MB of weights, floor %.1f us a step (%.2f a layer) at %.0f GB/s; %d blocks a multiprocessor\n",
           sh.name, pos, L, wbytes / 1e6, floor_us, floor_us / L, gbs, occ);
    printf("%-26s %10s %10s %8s %s\n", "variant", "us/step", "us/layer", "floor%", "result");
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    std::vector<float> ref;
    u32 streamCap = 0;
    auto run = [&](const char* name, bool persistent, int fold, int wait, int grid) {
        p.fold = fold, p.wait = wait;
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CK(cudaMemcpyAsync(p.x, x0, 4 * D, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemsetAsync(p.cnt, 0, 4 * (L + 1) * CSLOTS, st));
        if (persistent && grid >= 1000000) {
            cudaLaunchConfig_t c = {};
            c.gridDim = grid - 1000000, c.blockDim = THREADS, c.stream = st;
            CK(cudaLaunchKernelEx(&c, persist_dyn<CD, CF>, p));
        } else if (persistent && grid < 0) {
            cudaLaunchConfig_t c = {};
            c.gridDim = -grid, c.blockDim = THREADS, c.stream = st, c.dynamicSmemBytes = streamCap;
            CK(cudaLaunchKernelEx(&c, stream<CD, CF>, p, streamCap));
        } else if (persistent) {
            cudaLaunchConfig_t c = {};
            c.gridDim = grid, c.blockDim = THREADS, c.stream = st;
            CK(cudaLaunchKernelEx(&c, persist<CD, CF>, p));
        } else {
            auto tiles = [&](int op) {
                switch (op) {
                case OP_NORM1: case OP_NORM2: return fold ? 0 : 1;
                case OP_QKV: return Nq / 8;
                case OP_ATTN: return KVH;
                case OP_O: case OP_DOWN: return D / 8;
                default: return F / 32;
                }
            };
            for (int l = 0; l < L; l++)
                for (int op = 0; op < NOPS; op++) {
                    if (tiles(op) == 0) continue;
                    cudaLaunchConfig_t c = {};
                    c.gridDim = tiles(op), c.blockDim = THREADS, c.stream = st, c.attrs = at, c.numAttrs = 1;
                    CK(cudaLaunchKernelEx(&c, chain_op<CD, CF>, p, l, op));
                }
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
        std::vector<float> got(D);
        CK(cudaMemcpy(got.data(), p.x, 4 * D, cudaMemcpyDeviceToHost));
        int err; CK(cudaMemcpy(&err, p.err, 4, cudaMemcpyDeviceToHost)); CK(cudaMemset(p.err, 0, 4));
        const char* res = "reference";
        if (ref.empty()) ref = got;
        else res = memcmp(got.data(), ref.data(), 4 * D) == 0 ? "identical" : "DIFFERS";
        int nan = 0;
        for (float v : got) nan += std::isnan(v) || std::isinf(v);
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        std::vector<float> ts;
        for (int r = 0; r < 21; r++) {
            cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
        }
        std::sort(ts.begin(), ts.end());
        double us = ts[ts.size() / 2] * 1e3;
        printf("%-26s %10.1f %10.2f %7.1f%% %s%s%s (spread %.1f-%.1f)\n", name, us, us / L, 100 * floor_us / us, res,
               err ? " SPIN-BOUND" : "", nan ? " NAN" : "", ts.front() * 1e3, ts.back() * 1e3);
        cudaEventDestroy(e0); cudaEventDestroy(e1);
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    };
    run("chain", false, 0, 2, 0);
    run("chain, norms folded", false, 1, 2, 0);
    for (int per : {1, 2, 3, 4, 6, 8}) {
        if (per > occ) break;
        char nm[64];
        snprintf(nm, sizeof nm, "persist %d/SM", per);
        run(nm, true, 0, 1, per * sms);
        snprintf(nm, sizeof nm, "persist %d/SM, folded", per);
        run(nm, true, 1, 1, per * sms);
    }
    run("persist max/SM nodeps", true, 0, 0, occ * sms);
    for (int per : {2, 3}) {
        if (per > occ) break;
        char nm[64];
        snprintf(nm, sizeof nm, "ticket %d/SM", per);
        run(nm, true, 0, 1, 1000000 + per * sms);
        snprintf(nm, sizeof nm, "ticket %d/SM, folded", per);
        run(nm, true, 1, 1, 1000000 + per * sms);
    }
    {
        int maxdyn = 0;
        CK(cudaDeviceGetAttribute(&maxdyn, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, stream<CD, CF>));
        u32 cap = (u32)(maxdyn - fa.sharedSizeBytes) & ~127u;
        CK(cudaFuncSetAttribute(stream<CD, CF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
        for (u32 c : {cap, cap / 2}) {
            if ((u64)64 * D * 9 / 16 > c || (u64)8 * F * 9 / 16 > c) continue; // a GLU or down tile must fit the ring
            for (int fold = 0; fold < 2; fold++) {
                char nm[64];
                snprintf(nm, sizeof nm, "stream ring %uK%s", c / 1024, fold ? ", folded" : "");
                streamCap = c;
                run(nm, true, fold, 1, -sms);
            }
        }
        streamCap = cap;
        run("stream nodeps", true, 0, 0, -sms);
    }
    for (auto& y : hl) { cudaFree((void*)y.qkv); cudaFree((void*)y.o); cudaFree((void*)y.gu); cudaFree((void*)y.down);
        cudaFree((void*)y.an); cudaFree((void*)y.fn); cudaFree(y.kc); cudaFree(y.vc); }
    cudaFree(dl); cudaFree(x0); cudaFree(p.x); cudaFree(p.qa); cudaFree(p.da); cudaFree(p.qkv); cudaFree(p.qo); cudaFree(p.dao);
    cudaFree(p.qh); cudaFree(p.dah); cudaFree(p.cnt); cudaFree(p.err);
    cudaStreamDestroy(st);
}

int main(int argc, char** argv) {
    int pos = argc > 1 ? atoi(argv[1]) : 64;
    if (pos < 0 || pos >= MAXKEYS) { printf("position must be in [0, %d)\n", MAXKEYS); return 1; }
    // Copy bandwidth (read + write) of 1 GiB, median of 11, for the floor.
    size_t n = 1ull << 30;
    void *a, *b; CK(cudaMalloc(&a, n)); CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    std::vector<float> ts;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int r = 0; r < 11; r++) {
        cudaEventRecord(e0); CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice)); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    double gbs = 2.0 * n / (ts[5] * 1e-3) / 1e9;
    printf("copy bandwidth %.0f GB/s\n", gbs);
    cudaFree(a); cudaFree(b);
    bench<2, 8>({"1B (Llama-3.2-1B) Q4_0", 2048, 32, 8, 64, 8192, 16}, pos, gbs);
    bench<4, 14>({"8B (Llama-3-8B) Q4_0", 4096, 32, 8, 128, 14336, 32}, pos, gbs);
    return 0;
}
#endif
