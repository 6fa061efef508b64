// mvbench: one-row Q4_0 matrix-vector products at Llama shapes, as a
// chain of launches over distinct weights (more bytes than L2 holds) in a
// CUDA graph with programmatic dependent launch, to compare kernel designs
// before they go into the engine. Build and run on the device:
//   nvcc -O3 -arch=sm_90a -o mvbench mvbench.cu && ./mvbench [tma]
// Reports each variant's time a launch and GB/s over the weight bytes:
// the engine's design with nothing, an L2 bulk prefetch or a register
// preload before the dependency wait, alone and after a norm-like kernel,
// and the same products in one persistent launch with grid barriers;
// with "tma", also the shared-memory streaming design (bulk copies into
// P stages of up to S bytes), which was slower in every shape.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#include "q4dev.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)



// mv_layout is a block's share of a one-row product: lanes a row (lpr),
// warps a row (wpr), this lane's first chunk (sub) and stride (nsub).
struct mv_layout {
    int warp, lane, lpr, wpr, sub, nsub, nc;
    u64 rowBytes, dOff;
    __device__ mv_layout(int K, int N, int rpb) {
        warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        lpr = rpb > 4 ? 128 / rpb : 32, wpr = rpb >= 4 ? 1 : 4 / rpb;
        sub = (warp % wpr) * lpr + (lane & (lpr - 1)), nsub = wpr * lpr;
        nc = K >> 5, rowBytes = K / 2, dOff = (u64)N * rowBytes;
    }
    __device__ int row(int g, int rpb) const { return g * rpb + (warp / wpr) * (32 / lpr) + lane / lpr; }
};

// mv_group computes group g (rpb rows) of a one-row Q4_0 product, B
// chunks of a lane in flight; with pre, q and dw already hold the first B.
template <int B>
__device__ __forceinline__ void mv_group(const mv_layout& L, float* out, const signed char* qa, const float* da, const u8* w,
                                         int N, int rpb, int g, float* part, uint4 (&q)[B], float (&dw)[B], bool pre) {
    int j = L.row(g, rpb);
    bool live = j < N;
    const u8* row = w + (u64)(live ? j : 0) * L.rowBytes;
    const u16* d = (const u16*)(w + L.dOff) + (u64)(live ? j : 0) * L.nc;
    float acc = 0.f;
    if (live)
        for (int c0 = L.sub; c0 < L.nc; c0 += B * L.nsub) {
            if (!pre) {
#pragma unroll
                for (int u = 0; u < B; u++) {
                    int c = c0 + u * L.nsub;
                    if (c < L.nc) { q[u] = ldw(row + (u64)c * 16); dw[u] = h2f(d[c]); }
                }
            }
            pre = false;
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = c0 + u * L.nsub;
                if (c < L.nc) acc += dw[u] * da[c] * (float)q4dot(q[u], (const int4*)(qa + c * 32));
            }
        }
    for (int o = L.lpr >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (L.wpr > 1) {
        if (L.lane == 0) part[L.warp] = acc;
        __syncthreads();
        if (L.lane == 0 && L.warp % L.wpr == 0) { float s = 0; for (int x = 0; x < L.wpr; x++) s += part[L.warp + x]; acc = s; }
        __syncthreads();
    }
    if (live && (L.lane & (L.lpr - 1)) == 0 && L.warp % L.wpr == 0) out[j] = acc;
}

// ---- variant "reg": the engine's kernel (warp or half warp a row, B loads in flight a lane) ----
// PF 0: nothing before the dependency wait; 1: the block's first group of
// rows prefetched into L2 by one bulk prefetch; 2: each lane's first B
// chunks loaded into registers.
template <int B, int PF>
__global__ void __launch_bounds__(128) mv_reg(float* out, const signed char* qa, const float* da, const u8* w, int K, int N, int rpb) {
    mv_layout L(K, N, rpb);
    int groups = (N + rpb - 1) / rpb;
    __shared__ float part[4];
    uint4 q[B];
    float dw[B];
    int g = blockIdx.x;
    if (PF == 1 && threadIdx.x == 0 && g < groups) {
        int r0 = g * rpb, n = min(rpb, N - r0);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + (u64)r0 * L.rowBytes), "r"((u32)(n * L.rowBytes)) : "memory");
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + L.dOff + (u64)r0 * L.nc * 2), "r"((u32)(n * L.nc * 2)) : "memory");
    }
    bool pre = false;
    if (PF == 2 && g < groups) {
        int j = L.row(g, rpb);
        if (j < N) {
            const u8* row = w + (u64)j * L.rowBytes;
            const u16* d = (const u16*)(w + L.dOff) + (u64)j * L.nc;
#pragma unroll
            for (int u = 0; u < B; u++) {
                int c = L.sub + u * L.nsub;
                if (c < L.nc) { q[u] = ldw(row + (u64)c * 16); dw[u] = h2f(d[c]); }
            }
            pre = true;
        }
    }
    pdl_wait();
    pdl_launch();
    for (; g < groups; g += gridDim.x) {
        mv_group<B>(L, out, qa, da, w, N, rpb, g, part, q, dw, pre);
        pre = false;
    }
}

// mv_persist is mv_reg<4, 0>'s work for nops products in one launch:
// blocks stay resident and meet at a grid barrier (an atomic counter)
// between products, in place of the kernel boundary. With PF, each block
// bulk-prefetches its first rows of the next product into L2 before it
// waits at the barrier. The grid must be co-resident (the host sizes it
// by the occupancy calculator).

template <int PF>
__global__ void __launch_bounds__(128) mv_persist(float* out, const signed char* qa, const float* da, u8* const* ws, int nops,
                                                  int K, int N, int rpb, unsigned* bar) {
    mv_layout L(K, N, rpb);
    int groups = (N + rpb - 1) / rpb;
    __shared__ float part[4];
    uint4 q[4];
    float dw[4];
    pdl_wait();
    for (int op = 0; op < nops; op++) {
        const u8* w = ws[op];
        if (PF && threadIdx.x == 0 && (int)blockIdx.x < groups) {
            int r0 = blockIdx.x * rpb, n = min(rpb, N - r0);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + (u64)r0 * L.rowBytes), "r"((u32)(n * L.rowBytes)) : "memory");
        }
        if (op > 0) {
            // Bounded, so that a grid that is not co-resident fails the
            // check instead of hanging the device.
            if (threadIdx.x == 0)
                for (int spin = 0; ld_acquire(bar) < (unsigned)op * gridDim.x && spin < (1 << 22); spin++) {
                }
            __syncthreads();
        }
        for (int g = blockIdx.x; g < groups; g += gridDim.x) mv_group<4>(L, out, qa, da, w, N, rpb, g, part, q, dw, false);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(bar, 1u);
        }
    }
}

// glu_dot: lane's share of gate row j and up row H + j of w against the
// activations, B chunks of each in flight, summed over the warp.
template <int B>
__device__ __forceinline__ void glu_dot(float& a0, float& a1, const u8* w, int j, int H, int nc, u64 rowBytes, u64 dOff,
                                        const signed char* qa, const float* da, int lane) {
    const u8* rg = w + (u64)j * rowBytes;
    const u8* ru = w + (u64)(H + j) * rowBytes;
    const u16* dg = (const u16*)(w + dOff) + (u64)j * nc;
    const u16* du = (const u16*)(w + dOff) + (u64)(H + j) * nc;
    a0 = 0.f, a1 = 0.f;
    for (int c0 = lane; c0 < nc; c0 += B * 32) {
        uint4 q0[B], q1[B];
        float d0[B], d1[B];
#pragma unroll
        for (int u = 0; u < B; u++) {
            int c = c0 + u * 32;
            if (c < nc) { q0[u] = ldw(rg + (u64)c * 16); q1[u] = ldw(ru + (u64)c * 16); d0[u] = h2f(dg[c]); d1[u] = h2f(du[c]); }
        }
#pragma unroll
        for (int u = 0; u < B; u++) {
            int c = c0 + u * 32;
            if (c < nc) {
                a0 += d0[u] * da[c] * (float)q4dot(q0[u], (const int4*)(qa + c * 32));
                a1 += d1[u] * da[c] * (float)q4dot(q1[u], (const int4*)(qa + c * 32));
            }
        }
    }
    a0 = warp_sum(a0);
    a1 = warp_sum(a1);
}

// mv_glu mimics the engine's GLU kernel on a gate+up shape (rows [0, H)
// of w are the gate rows, [H, 2H) the up rows): a warp a row of each, B
// chunks of both in flight a lane, blocks of 4 warps over groups of R
// rows (4 a pass); with EPI, the group's R results go through shared
// memory and warp 0 writes them (as the engine quantizes a block of 32),
// else each warp writes its own. out[j] = silu(gate_j · x) * (up_j · x).
template <int B, int R, bool EPI>
__global__ void __launch_bounds__(128) mv_glu(float* out, const signed char* qa, const float* da, const u8* w, int K, int N) {
    int H = N / 2, nc = K >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 rowBytes = K / 2, dOff = (u64)N * rowBytes;
    __shared__ float res[R];
    pdl_wait();
    pdl_launch();
    for (int g = blockIdx.x; g < H / R; g += gridDim.x) {
        for (int lr0 = 0; lr0 < R; lr0 += 4) {
            int j = g * R + lr0 + warp;
            float a0, a1;
            glu_dot<B>(a0, a1, w, j, H, nc, rowBytes, dOff, qa, da, lane);
            float v = a0 / (1.f + __expf(-a0)) * a1;
            if (lane == 0) {
                if (EPI) res[lr0 + warp] = v;
                else out[j] = v;
            }
        }
        if (EPI) {
            __syncthreads();
            if (warp == 0 && lane < R) out[g * R + lane] = res[lane];
            __syncthreads();
        }
    }
}

// mv_gluq is mv_glu<B, 4, false> that also quantizes its output in
// blocks of 32 as the engine must for the down product: a block of 32
// rows is 8 groups of 4, computed by whichever blocks take them; after
// writing a group, the block counts it (cnt[qb], after a fence), and the
// block that counts a quant block's eighth group quantizes it from the
// written floats and resets its count. The count's result is read only
// after the next group's products, so the atomic's round trip overlaps
// them.
template <int B>
__global__ void __launch_bounds__(128) mv_gluq(float* out, const signed char* qa, const float* da, const u8* w, int K, int N,
                                               unsigned* cnt, signed char* qo, float2* dso) {
    int H = N / 2, nc = K >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 rowBytes = K / 2, dOff = (u64)N * rowBytes;
    pdl_wait();
    pdl_launch();
    int pendQ = -1;
    unsigned pendOld = 0;
    auto finish = [&]() {
        if (warp != 0 || pendQ < 0) return;
        unsigned old = __shfl_sync(0xffffffffu, pendOld, 0);
        if (old != 7) return;
        __threadfence();
        float v = __ldcg(out + pendQ * 32 + lane);
        float amax = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        int q = (int)rintf(v * id), sum = q;
        qo[pendQ * 32 + lane] = (signed char)q;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) { dso[pendQ] = make_float2(d, d * (float)sum); cnt[pendQ] = 0; }
    };
    for (int g = blockIdx.x; g < H / 4; g += gridDim.x) {
        int j = g * 4 + warp;
        float a0, a1;
        glu_dot<B>(a0, a1, w, j, H, nc, rowBytes, dOff, qa, da, lane);
        if (lane == 0) {
            out[j] = a0 / (1.f + __expf(-a0)) * a1;
            __threadfence();
        }
        finish(); // the previous group's quant block, if this block completed it
        __syncthreads();
        pendQ = -1;
        if (warp == 0) {
            pendQ = g >> 3;
            if (lane == 0) pendOld = atomicAdd(cnt + pendQ, 1u);
        }
    }
    finish();
}

// tiny stands for a norm: one block reads a row of K floats, sums its
// squares and writes the row scaled, as int8 levels with a scale a 32.
// With pw set, its threads first prefetch pbytes from pw into L2 (the
// next product's weight: it does not depend on the kernel before).
__global__ void __launch_bounds__(1024) tiny(signed char* qa, float* da, const float* x, const float* nw, int K,
                                             const u8* pw, u64 pbytes) {
    __shared__ float part[32];
    float wv[16];
    int n = 0;
    for (u64 o = (u64)threadIdx.x << 16; pw && o < pbytes; o += 1024ull << 16) {
        u32 len = (u32)min(pbytes - o, (u64)1 << 16);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pw + o), "r"(len) : "memory");
    }
    for (int i = threadIdx.x; i < K && n < 16; i += 1024) wv[n++] = nw[i];
    pdl_wait();
    pdl_launch();
    float s = 0.f;
    for (int i = threadIdx.x; i < K; i += 1024) s += x[i] * x[i];
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    s = warp_sum(part[threadIdx.x & 31]);
    float r = rsqrtf(s / K + 1e-5f);
    n = 0;
    for (int i = threadIdx.x; i < K; i += 1024) {
        float v = x[i] * r * wv[n++];
        float m = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float dd = m / 127.f;
        qa[i] = (signed char)__float2int_rn(dd > 0 ? v / dd : 0.f);
        if ((threadIdx.x & 31) == 0) da[i >> 5] = dd;
    }
}

// ---- variant "tma": rows streamed into shared memory by bulk copies, P stages of up to S bytes ----

// Block b takes rows [b*N/G, (b+1)*N/G); a stage holds R whole rows (quants, then their scales).
template <int P, int T>
__global__ void __launch_bounds__(T) mv_tma(float* out, const signed char* qa, const float* da, const u8* w, int K, int N, int S) {
    extern __shared__ __align__(128) u8 sm[];
    __shared__ u64 bar[P];
    __shared__ float part[T / 32][64];
    int nc = K >> 5;
    u32 rowBytes = K / 2, sBytes = K / 16; // quants and scales of a row
    u64 dOff = (u64)N * rowBytes;
    int R = max(1, (int)(S / (rowBytes + sBytes)));
    R = min(R, 64);
    int r0 = (int)((u64)blockIdx.x * N / gridDim.x), r1 = (int)((u64)(blockIdx.x + 1) * N / gridDim.x);
    int nst = (r1 - r0 + R - 1) / R;
    u32 stageBytes = R * (rowBytes + sBytes);
    stageBytes = (stageBytes + 127) & ~127u;
    signed char* xs = (signed char*)(sm + P * stageBytes);
    float* xd = (float*)(xs + K);
    if (threadIdx.x == 0) {
        for (int p = 0; p < P; p++) mbar_init(&bar[p], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int s) {
        int p = s % P, a = r0 + s * R, n = min(R, r1 - a);
        u8* dst = sm + p * stageBytes;
        mbar_expect(&bar[p], n * (rowBytes + sBytes));
        bulk_copy(dst, w + (u64)a * rowBytes, n * rowBytes, &bar[p]);
        bulk_copy(dst + R * rowBytes, w + dOff + (u64)a * sBytes, n * sBytes, &bar[p]);
    };
    if (threadIdx.x == 0)
        for (int s = 0; s < min(P, nst); s++) issue(s);
    pdl_wait();
    pdl_launch();
    for (int i = threadIdx.x; i < K / 16; i += T) ((int4*)xs)[i] = ((const int4*)qa)[i];
    for (int i = threadIdx.x; i < nc; i += T) xd[i] = da[i];
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int s = 0; s < nst; s++) {
        int p = s % P, a = r0 + s * R, n = min(R, r1 - a);
        mbar_wait(&bar[p], (s / P) & 1);
        const u8* st = sm + p * stageBytes;
        const u16* sd = (const u16*)(st + R * rowBytes);
        // work items: (row, chunk), nc chunks a row (nc % 32 == 0), warp-uniform rows.
        int items = n * nc;
        float acc = 0.f;
        int cur = -1;
        for (int i = threadIdx.x; i < items; i += T) {
            int r = i / nc, c = i - r * nc;
            if (r != cur) {
                if (cur >= 0) { acc = warp_sum(acc); if (lane == 0) part[warp][cur] = acc; }
                // rows this warp skips get zero
                for (int x = cur + 1; x < r; x++) if (lane == 0) part[warp][x] = 0.f;
                cur = r;
                acc = 0.f;
            }
            uint4 q = *(const uint4*)(st + (u64)r * rowBytes + c * 16);
            acc += h2f(sd[r * nc + c]) * xd[c] * (float)q4dot(q, (const int4*)(xs + c * 32));
        }
        if (cur >= 0) { acc = warp_sum(acc); if (lane == 0) part[warp][cur] = acc; }
        for (int x = cur + 1; x < n; x++) if (lane == 0) part[warp][x] = 0.f;
        __syncthreads();
        if (threadIdx.x == 0 && s + P < nst) issue(s + P);
        for (int r = threadIdx.x; r < n; r += T) {
            float v = 0.f;
            for (int x = 0; x < T / 32; x++) v += part[x][r];
            out[a + r] = v;
        }
        __syncthreads();
    }
}

// reference on the host
static float h2f_host(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023, f;
    if (e == 0) { float v = m / 1024.f / 16384.f; return s ? -v : v; }
    f = (s << 31) | ((e + 112) << 23) | (m << 13);
    float v; memcpy(&v, &f, 4); return v;
}

struct Shape { const char* name; int N, K, copies; };

int main(int argc, char** argv) {
    bool withTMA = argc > 1 && strcmp(argv[1], "tma") == 0;
    int dev = 0, sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Shape shapes[] = {
        {"1B qkv 3072x2048", 3072, 2048, 64}, {"1B o 2048x2048", 2048, 2048, 64}, {"1B gate+up 16384x2048", 16384, 2048, 16},
        {"1B down 2048x8192", 2048, 8192, 32}, {"1B out 128256x2048", 128256, 2048, 2},
        {"8B qkv 6144x4096", 6144, 4096, 16}, {"8B o 4096x4096", 4096, 4096, 16}, {"8B gate+up 28672x4096", 28672, 4096, 4},
        {"8B down 4096x14336", 4096, 14336, 8}, {"8B out 128256x4096", 128256, 4096, 1},
    };
    srand(1);
    printf("%-24s %-16s %9s %8s %9s\n", "shape", "variant", "us/launch", "GB/s", "maxrel");
    for (auto& sh : shapes) {
        int N = sh.N, K = sh.K, C = sh.copies;
        u64 rowBytes = K / 2, bytes = (u64)N * (rowBytes + K / 16);
        std::vector<u8> hw(bytes);
        for (u64 i = 0; i < (u64)N * rowBytes; i++) hw[i] = rand() & 255;
        for (u64 i = 0; i < (u64)N * K / 32; i++) { u16 h = 0x2000 | (rand() & 0x3ff); memcpy(&hw[N * rowBytes + 2 * i], &h, 2); }
        std::vector<signed char> hq(K);
        std::vector<float> hd(K / 32);
        for (auto& v : hq) v = (signed char)((rand() % 255) - 127);
        for (auto& v : hd) v = 0.01f * (1 + rand() % 100);
        std::vector<double> ref(N);
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int c = 0; c < K / 32; c++) {
                int dot = 0;
                for (int e = 0; e < 32; e++) {
                    u8 b = hw[j * rowBytes + c * 16 + (e & 15)];
                    int n = e < 16 ? (b & 15) : (b >> 4);
                    dot += (n - 8) * hq[c * 32 + e];
                }
                u16 h; memcpy(&h, &hw[N * rowBytes + 2 * ((u64)j * (K / 32) + c)], 2);
                s += (double)h2f_host(h) * hd[c] * dot;
            }
            ref[j] = s;
        }
        std::vector<u8*> ws(C);
        for (int i = 0; i < C; i++) { CK(cudaMalloc(&ws[i], bytes)); CK(cudaMemcpy(ws[i], hw.data(), bytes, cudaMemcpyHostToDevice)); }
        signed char* qa; float *da, *out;
        CK(cudaMalloc(&qa, K)); CK(cudaMalloc(&da, K / 8)); CK(cudaMalloc(&out, 4 * N));
        CK(cudaMemcpy(qa, hq.data(), K, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(da, hd.data(), K / 8, cudaMemcpyHostToDevice));
        cudaStream_t st; CK(cudaStreamCreate(&st));
        const int reps = 64; // launches a graph
        signed char* qa2; float *da2, *xf, *nw;
        CK(cudaMalloc(&qa2, K)); CK(cudaMalloc(&da2, K / 8)); CK(cudaMalloc(&xf, 4 * K)); CK(cudaMalloc(&nw, 4 * K));
        {
            std::vector<float> hx(K);
            for (auto& v : hx) v = (rand() % 1000) / 500.f - 1.f;
            CK(cudaMemcpy(xf, hx.data(), 4 * K, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(nw, hx.data(), 4 * K, cudaMemcpyHostToDevice));
        }
        std::vector<double>* cmpRef = &ref;
        int cmpN = N;
        // run times a graph of reps launches (per launches a call of launch) and reports per call.
        auto run = [&](const char* name, auto launch, int per, int ops = 1) {
            CK(cudaMemset(out, 0xff, 4 * N));
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < reps / per; i++) launch(ws[i % C]);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
            std::vector<float> got(cmpN);
            CK(cudaMemcpy(got.data(), out, 4 * cmpN, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (int j = 0; j < cmpN; j++) { num += (got[j] - (*cmpRef)[j]) * (got[j] - (*cmpRef)[j]); den += (*cmpRef)[j] * (*cmpRef)[j]; }
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            std::vector<float> ts;
            for (int r = 0; r < 15; r++) {
                cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
                float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
            }
            std::sort(ts.begin(), ts.end());
            double us = ts[ts.size() / 2] * 1e3 / (reps / per) / ops;
            printf("%-24s %-16s %9.2f %8.0f %9.2g\n", sh.name, name, us, bytes / us / 1e3, sqrt(num / den));
            cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
        };
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        auto cfg = [&](int grid, int block, size_t smem) {
            cudaLaunchConfig_t c = {};
            c.gridDim = grid; c.blockDim = block; c.dynamicSmemBytes = smem; c.stream = st; c.attrs = at; c.numAttrs = 1;
            return c;
        };
        // the engine's choice of rows a block
        int chunks = K / 32, rpb = (chunks <= 64 && N / 8 >= 2 * sms) ? 8 : N / 4 >= 2 * sms ? 4 : N / 2 >= 2 * sms ? 2 : 1;
        int grid = std::min((N + rpb - 1) / rpb, 4 * sms);
        auto prod = [&](int pf, u8* w) {
            auto c = cfg(grid, 128, 0);
            auto k = pf == 0 ? mv_reg<4, 0> : pf == 1 ? mv_reg<4, 1> : mv_reg<4, 2>;
            CK(cudaLaunchKernelEx(&c, k, out, (const signed char*)qa, (const float*)da, (const u8*)w, K, N, rpb));
        };
        auto tin = [&](const u8* pw) {
            auto c = cfg(1, 1024, 0);
            CK(cudaLaunchKernelEx(&c, tiny, qa2, da2, (const float*)xf, (const float*)nw, K, pw, pw ? bytes : (u64)0));
        };
        for (int pf = 0; pf < 3; pf++) {
            char nm[64];
            snprintf(nm, sizeof nm, "reg4 pf%d", pf);
            run(nm, [&](u8* w) { prod(pf, w); }, 1);
        }
        if (strstr(sh.name, "gate+up")) {
            std::vector<double> gref(N / 2);
            for (int j = 0; j < N / 2; j++) gref[j] = ref[j] / (1 + exp(-ref[j])) * ref[N / 2 + j];
            cmpRef = &gref;
            cmpN = N / 2;
            auto glu = [&](const char* nm, auto k, int groups) {
                run(nm, [&](u8* w) {
                    auto c = cfg(std::min(groups, 4 * sms), 128, 0);
                    CK(cudaLaunchKernelEx(&c, k, out, (const signed char*)qa, (const float*)da, (const u8*)w, K, N));
                }, 1);
            };
            glu("glu R32 B4 epi", mv_glu<4, 32, true>, N / 2 / 32);
            glu("glu R32 B4", mv_glu<4, 32, false>, N / 2 / 32);
            glu("glu R32 B2 epi", mv_glu<2, 32, true>, N / 2 / 32);
            glu("glu R16 B4 epi", mv_glu<4, 16, true>, N / 2 / 16);
            glu("glu R4 B4", mv_glu<4, 4, false>, N / 2 / 4);
            glu("glu R4 B2", mv_glu<2, 4, false>, N / 2 / 4);
            {
                unsigned* cnt;
                signed char* qo;
                float2* dso;
                CK(cudaMalloc(&cnt, N / 64 * 4)); CK(cudaMemset(cnt, 0, N / 64 * 4));
                CK(cudaMalloc(&qo, N / 2)); CK(cudaMalloc(&dso, N / 64 * 8));
                for (int b : {2, 4}) {
                    auto k = b == 2 ? mv_gluq<2> : mv_gluq<4>;
                    run(b == 2 ? "gluq B2" : "gluq B4", [&](u8* w) {
                        auto c = cfg(4 * sms, 128, 0);
                        CK(cudaLaunchKernelEx(&c, k, out, (const signed char*)qa, (const float*)da, (const u8*)w, K, N, cnt, qo, dso));
                    }, 1);
                }
                // the levels against the floats: every count back at zero, |d*q - v| <= d/2
                std::vector<float> hv(N / 2), hd(N / 32);
                std::vector<signed char> hq(N / 2);
                std::vector<unsigned> hc(N / 64);
                CK(cudaMemcpy(hv.data(), out, 2 * N, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hq.data(), qo, N / 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hd.data(), dso, N / 64 * 8, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hc.data(), cnt, N / 64 * 4, cudaMemcpyDeviceToHost));
                int bad = 0;
                for (int i = 0; i < N / 2; i++) if (fabs(hd[2 * (i / 32)] * hq[i] - hv[i]) > 0.51 * hd[2 * (i / 32)] + 1e-6) bad++;
                for (auto c : hc) if (c != 0) bad++;
                printf("%-24s gluq check: %d bad\n", sh.name, bad);
                cudaFree(cnt); cudaFree(qo); cudaFree(dso);
            }
            cmpRef = &ref;
            cmpN = N;
        }
        run("reg2", [&](u8* w) {
            auto c = cfg(grid, 128, 0);
            CK(cudaLaunchKernelEx(&c, mv_reg<2, 0>, out, (const signed char*)qa, (const float*)da, (const u8*)w, K, N, rpb));
        }, 1);
        run("reg4 L2-hot", [&](u8*) { prod(0, ws[0]); }, 1);
        run("tiny alone", [&](u8*) { tin(nullptr); }, 1);
        for (int pf = 0; pf < 3; pf++) {
            char nm[64];
            snprintf(nm, sizeof nm, "tiny+reg4 pf%d", pf);
            run(nm, [&](u8* w) { tin(nullptr); prod(pf, w); }, 2);
        }
        // The tiny kernel prefetching the whole next weight into L2; and
        // three tiny kernels (a window like decode attention's) with the
        // prefetch in the first.
        run("tinyPF+reg4", [&](u8* w) { tin(w); prod(0, w); }, 2);
        run("3tiny+reg4", [&](u8* w) { tin(nullptr); tin(nullptr); tin(nullptr); prod(0, w); }, 4);
        run("3tinyPF+reg4", [&](u8* w) { tin(w); tin(nullptr); tin(nullptr); prod(0, w); }, 4);
        // The same 64 products in one launch with grid barriers between
        // them, sized to stay co-resident.
        {
            std::vector<u8*> hp(reps);
            for (int i = 0; i < reps; i++) hp[i] = ws[i % C];
            u8** dp;
            unsigned* bar;
            CK(cudaMalloc(&dp, reps * sizeof(u8*)));
            CK(cudaMalloc(&bar, 4));
            CK(cudaMemcpy(dp, hp.data(), reps * sizeof(u8*), cudaMemcpyHostToDevice));
            for (int pf = 0; pf < 2; pf++) {
                auto k = pf ? mv_persist<1> : mv_persist<0>;
                int per_sm = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 128, 0));
                int pgrid = std::min(grid, per_sm * sms);
                char nm[64];
                snprintf(nm, sizeof nm, "persist pf%d g%d", pf, pgrid);
                run(nm, [&](u8*) {
                    CK(cudaMemsetAsync(bar, 0, 4, st));
                    auto c = cfg(pgrid, 128, 0);
                    CK(cudaLaunchKernelEx(&c, k, out, (const signed char*)qa, (const float*)da, (u8* const*)dp, reps, K, N, rpb, bar));
                }, reps, reps);
            }
            cudaFree(dp);
            cudaFree(bar);
        }
        if (withTMA)
        for (int S : {8192, 16384, 32768}) {
            for (int bps : {1, 2}) {
                auto go = [&](auto kern, int P, int T) {
                    u64 R = std::max<u64>(1, std::min<u64>(64, S / (rowBytes + K / 16)));
                    u64 stage = (R * (rowBytes + K / 16) + 127) & ~127ull;
                    size_t smem = P * stage + K + K / 8;
                    if (smem > 220 * 1024 / bps) return;
                    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                    int grid = std::min(bps * sms, N);
                    char nm[64];
                    snprintf(nm, sizeof nm, "tma S%dK P%d T%d b%d", S / 1024, P, T, bps);
                    run(nm, [&](u8* w) { auto c = cfg(grid, T, smem); CK(cudaLaunchKernelEx(&c, kern, out, (const signed char*)qa, (const float*)da, (const u8*)w, K, N, S)); }, 1);
                };
                go(mv_tma<4, 256>, 4, 256);
                go(mv_tma<2, 256>, 2, 256);
                go(mv_tma<4, 512>, 4, 512);
            }
        }
        for (auto p : ws) cudaFree(p);
        cudaFree(qa); cudaFree(da); cudaFree(qa2); cudaFree(da2); cudaFree(xf); cudaFree(nw); cudaFree(out); cudaStreamDestroy(st);
    }
    return 0;
}
