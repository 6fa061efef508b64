// Attention: the decode kernel (a block per head and row) and the tiled
// prefill kernel. Compiled after kernels.cu, whose helpers they use.

// The most head dims attention handles: each lane holds MAXD/32 of them.
#define MAXD 512

// attention: out[r, h] = softmax(scale * q[r, h] · K) · V over the row's
// slot, positions [first, pos] (first = pos-window+1 with a window, else
// 0), with an optional soft-cap of the scores. One block per (head, row);
// each warp runs an online softmax over every nw-th position (lane l holds
// dims l, l+32, ...), then the warps' partial results are merged through
// shared memory: nw*hd accumulators, nw maxima, nw sums. Grid (nheads,
// rows). The decode path: few rows, each reading its own positions. With
// qa set it also quantizes its output as quantize_q8 does.
template <typename C>
__device__ __forceinline__ void attention_t(float* out, const float* q, const C* kc, const C* vc, const int* meta,
                                            const int* pos, const int* slots, int nheads, int nkv, int hd, int cap,
                                            float scale, float softcap, int window, signed char* qa, float2* ds) {
    PDL;
#if WEFT_EXACT
    extern __shared__ __align__(16) float sm[];
#else
    extern __shared__ float sm[];
#endif
    int h = blockIdx.x, r = blockIdx.y;
    if (r >= meta[0]) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int p = pos[r], first = window > 0 ? max(0, p - window + 1) : 0;
    int kvdim = nkv * hd;
    u64 base = (u64)slots[r] * cap * kvdim + (u64)(h / (nheads / nkv)) * hd;
    const float* qh = q + (u64)r * nheads * hd + (u64)h * hd;

    // Under WEFT_EXACT (acc_t double) the scores, the softmax and the
    // weighted values are float64 throughout: the products q·k and e·v
    // are exact or nearly, the sums' order does not show in the result.
    float qv[MAXD / 32];
    acc_t acc[MAXD / 32];
#pragma unroll
    for (int k = 0; k < MAXD / 32; k++) {
        int d = lane + 32 * k;
        qv[k] = d < hd ? qh[d] : 0.f;
        acc[k] = 0.f;
    }
    acc_t m = NEG_INF, l = 0.f;
    for (int j = first + warp; j <= p; j += nw) {
        u64 at = base + (u64)(j % cap) * kvdim;
        acc_t s = 0.f;
#pragma unroll
        for (int k = 0; k < MAXD / 32; k++) {
            int d = lane + 32 * k;
            if (d < hd) s += (acc_t)qv[k] * cld(kc, at + d);
        }
        s = warp_sum(s) * scale;
        if (softcap > 0.f) s = softcap * acc_tanh(s / softcap);
        acc_t mn = acc_max(m, s), corr = acc_exp(m - mn), e = acc_exp(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int k = 0; k < MAXD / 32; k++) {
            int d = lane + 32 * k;
            if (d < hd) acc[k] = acc[k] * corr + e * cld(vc, at + d);
        }
        m = mn;
    }

    acc_t* sacc = (acc_t*)sm;       // [nw, hd]
    acc_t* sm_m = sacc + nw * hd;   // [nw]
    acc_t* sm_l = sm_m + nw;        // [nw]
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
    acc_t M = NEG_INF;
    for (int w = 0; w < nw; w++) M = acc_max(M, sm_m[w]);
    acc_t L = 0.f;
    for (int w = 0; w < nw; w++) L += sm_l[w] * acc_exp(sm_m[w] - M);
    u64 ob = (u64)r * nheads * hd + (u64)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        acc_t va = 0.f;
        for (int w = 0; w < nw; w++) va += sacc[w * hd + d] * acc_exp(sm_m[w] - M);
        va /= L;
        float v = (float)va;
        out[ob + d] = v;
        // With qa set (hd a multiple of 32), each warp's 32 dims are one
        // block of the quantized output.
        if (qa) q8_store(v, qa + ob + d, ds + ((ob + d) >> 5), lane);
    }
}

#define ATTENTION(name, C)                                                                                      \
    extern "C" __global__ void name(float* out, const float* q, const C* kc, const C* vc, const int* meta,          \
                                    const int* pos, const int* slots, int nheads, int nkv, int hd, int cap,         \
                                    float scale, float softcap, int window, signed char* qa, float2* ds) {          \
        attention_t<C>(out, q, kc, vc, meta, pos, slots, nheads, nkv, hd, cap, scale, softcap, window, qa, ds);    \
    }
ATTENTION(attention, float)
ATTENTION(attention_h, u16)

// attention_split is decode attention split over positions (flash-
// decoding), so that a long context is read by many blocks at once and
// each key and value of a kv head is read once for all its query heads.
// Grid (nkv·S, rows), AS_WARPS warps a block. A row of n visible
// positions uses ns = min(S, ceil(n / keys)) runs of whole tiles of kt ≤
// 32 keys (blocks s >= ns return at once, so a short context costs what
// its length needs whatever the plan's S). Block (kvh, s) loads its run a
// tile at a time into shared memory (keys [kt][hd+4], values [kt][hd];
// by cp.async for float caches from sm_80, the queries' loads overlapping
// the first tile's copies)
// and runs an online softmax for each query head of kvh (warp w takes
// heads w, w+AS_WARPS, ...; lane j scores key j of the tile, then owns
// dims j, j+32, ... of the output). Each head's partial result (acc[hd],
// max, sum) goes to part [rows, nheads, S, hd+2]; the last of the ns
// blocks of (r, kvh) to finish (count, reset by it for the next launch)
// merges the partials in order s = 0, 1, ..., so the sum does not depend
// on which block finished last, and writes out (and, with qa set, the
// int8 rows as quantize_q8 would). A row of one run skips the partials
// and the count: its block writes out itself. Needs hd % 4 == 0, hd <= 32·ND,
// nheads/nkv <= AS_WARPS·HPW and S <= AS_MAXS. HPW (query heads a warp)
// and ND (dims a lane) are template arguments: the general kernel takes
// 4 and 8, and the launches of common shapes take a kernel compiled for
// theirs (attention_split_gHdN: a quarter of its code or less, with no
// dead heads or dims in its loops).
#define AS_WARPS 4
#define AS_MAXS 64 // the most splits: the merge keeps a weight per split in shared memory

// as_copy copies keys k0 <= key < k1 of the tile at position t0 (keys
// and values, hd floats each from the kv head at base) into Ks [kt][hdp]
// and Vs [kt][hd] by cp.async, threads tid of nthr (the block's, or a
// group's) taking 16-byte pieces in turn. as_load does the same with
// plain loads (f16 caches, whose halves are converted, and cp.async's
// absence before sm_80).
template <typename C>
__device__ __forceinline__ void as_copy(float* Ks, float* Vs, const C* kc, const C* vc, u64 base, int t0, int k0, int k1,
                                        int hd, int hdp, int kvdim, int cap, int tid, int nthr) {
#if __CUDA_ARCH__ >= 800
    int hd4 = hd >> 2;
    for (int i = k0 * hd4 + tid; i < k1 * hd4; i += nthr) {
        int key = i / hd4, c = (i - key * hd4) << 2;
        u64 at = base + (u64)((t0 + key) % cap) * kvdim + c;
        cp_async16(smem_addr(&Ks[key * hdp + c]), kc + at, true);
        cp_async16(smem_addr(&Vs[key * hd + c]), vc + at, true);
    }
#endif
}
template <typename C>
__device__ __forceinline__ void as_load(float* Ks, float* Vs, const C* kc, const C* vc, u64 base, int t0, int nt, int hd,
                                        int hdp, int kvdim, int cap, int tid, int nthr) {
    int hd4 = hd >> 2;
    for (int i = tid; i < nt * hd4; i += nthr) {
        int key = i / hd4, c = (i - key * hd4) << 2;
        u64 at = base + (u64)((t0 + key) % cap) * kvdim + c;
        *(float4*)&Ks[key * hdp + c] = cld4(kc, at);
        *(float4*)&Vs[key * hd + c] = cld4(vc, at);
    }
}

// as_merge: the last block of a row's runs (r, kvh) merges their partials
// (part [rows, nheads, S, hd+2]: acc[hd], max, sum) in order s = 0, 1, ...,
// so the sum does not depend on which block finished last, and writes
// out (and with qa set, the int8 rows as quantize_q8 would). Warp w <
// nwarps takes heads w, w+nwarps, ...; wts is its [AS_MAXS] of shared
// memory.
__device__ __forceinline__ void as_merge(float* out, const float* part, signed char* qa, float2* ds, float* wts, int r,
                                         int nheads, int kvh, int G, int S, int ns, int hd, int warp, int lane,
                                         int nwarps) {
    for (int g = warp; g < G; g += nwarps) {
        const float* pp = part + ((u64)r * nheads + (u64)kvh * G + g) * S * (hd + 2);
        // Every run holds a visible position, so every partial has a
        // finite max. Lane i takes partials i, i+32, ...; the sums over
        // lanes run in a fixed order.
        float mi[AS_MAXS / 32], li[AS_MAXS / 32], M = NEG_INF, L = 0.f;
#pragma unroll
        for (int t = 0; t < AS_MAXS / 32; t++) {
            int i = lane + 32 * t;
            mi[t] = i < ns ? __ldcg(pp + i * (hd + 2) + hd) : NEG_INF;
            li[t] = i < ns ? __ldcg(pp + i * (hd + 2) + hd + 1) : 0.f;
            M = fmaxf(M, mi[t]);
        }
        M = warp_max(M);
#pragma unroll
        for (int t = 0; t < AS_MAXS / 32; t++) {
            int i = lane + 32 * t;
            if (i < ns) {
                float w = expf(mi[t] - M);
                wts[i] = w;
                L += li[t] * w;
            }
        }
        L = warp_sum(L);
        __syncwarp();
        u64 ob = ((u64)r * nheads + (u64)kvh * G + g) * hd;
        for (int d0 = 0; d0 < hd; d0 += 32) {
            int d = d0 + lane;
            float v = 0.f;
            if (d < hd) {
#pragma unroll 8
                for (int i = 0; i < ns; i++) v += __ldcg(pp + i * (hd + 2) + d) * wts[i];
                v /= L;
                out[ob + d] = v;
            }
            // With qa set (hd a multiple of 32), the warp's 32 dims are one
            // block of the quantized output.
            if (qa) q8_store(v, qa + ob + d, ds + ((ob + d) >> 5), lane);
        }
        __syncwarp();
    }
}

// as_last says whether this block is the last of the ns runs of (r, kvh)
// to finish (count, which it resets for the next launch), once its
// partials are written; every thread of the block gets the answer.
__device__ __forceinline__ bool as_last(int* count, int r, int nkv, int kvh, int ns) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* c = count + (u64)r * nkv + kvh;
        last = atomicAdd(c, 1) == ns - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// as_run sets [j0, j1), block s's run of a row at position p, and ns,
// the row's runs, and says whether block s has one: a row of n visible
// positions uses ns = min(S, ceil(n / keys)) runs of whole tiles of kt,
// but one run while n is at most AS_ONE_RUN·keys: the merge after several
// runs costs more than the tiles their block would loop over (tg128 with
// runs of 128 against 32 positions: 8B Q4_0 +1.9 %, 1B +0.7 %), while a
// deep row needs its many blocks (runs of 128 at 2,048 positions: -2 to
// -3 %).
#ifndef AS_ONE_RUN // WEFT_CUDA_DEFINES may set it, for comparisons
#define AS_ONE_RUN 4
#endif
__device__ __forceinline__ bool as_run(int p, int window, int S, int keys, int kt, int s, int& j0, int& j1, int& ns) {
    int first = window > 0 ? max(0, p - window + 1) : 0, n = p - first + 1;
    ns = n <= AS_ONE_RUN * keys ? 1 : min(S, (n + keys - 1) / keys);
    int chunk = ((n + ns - 1) / ns + kt - 1) / kt * kt;
    ns = (n + chunk - 1) / chunk;
    j0 = first + s * chunk, j1 = min(p + 1, j0 + chunk);
    return s < ns;
}

// as_early: in a batch of one row (decode) every key and value of the
// first tile but the row's own position was stored by an earlier step, so
// their copies start before the dependency wait, while the launches
// before this one still run (the first tile's loop copies the rest).
// Returns the keys copied (float caches by cp.async only).
template <typename C, bool ASYNC>
__device__ __forceinline__ int as_early(float* Ks, float* Vs, const C* kc, const C* vc, u64 base, int nrows, int p, int j0,
                                        int j1, int kt, int hd, int hdp, int kvdim, int cap, int tid, int nthr) {
    int early = 0;
#if __CUDA_ARCH__ >= 800
    if constexpr (ASYNC && sizeof(C) == 4) {
        if (nrows == 1) {
            early = max(0, min(min(kt, j1 - j0), p - j0));
            as_copy(Ks, Vs, kc, vc, base, j0, 0, early, hd, hdp, kvdim, cap, tid, nthr);
        }
    }
#endif
    return early;
}

template <typename C, bool ASYNC, int HPW, int ND>
__device__ __forceinline__ void attention_split_t(
    float* out, const float* q, const C* kc, const C* vc, const int* meta, const int* pos, const int* slots,
    int nheads, int nkv, int hd, int cap, float scale, float softcap, int window, signed char* qa, float2* ds,
    float* part, int* count, int S, int kt, int keys) {
    PHASE(0);
    extern __shared__ __align__(16) float sms[];
    int r = blockIdx.y;
    // The host writes meta, pos and slots before the graph starts, and no
    // kernel writes them: they are read before the dependency wait.
    int nrows = meta[0], p = pos[r], slot = slots[r]; // one round trip for the three
    if (r >= nrows) return;
    int kvh = blockIdx.x / S, s = blockIdx.x % S;
    int G = nheads / nkv, hdp = hd + 4, kvdim = nkv * hd;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    float* Ks = sms;           // [kt][hdp]
    float* Vs = Ks + kt * hdp; // [kt][hd]
    float* Qs = Vs + kt * hd;  // [G][hd]
    float* Ws = Qs + G * hd;   // [AS_WARPS][AS_MAXS]: merge weights
    int j0, j1, ns;
    if (!as_run(p, window, S, keys, kt, s, j0, j1, ns)) return;
    u64 base = (u64)slot * cap * kvdim + (u64)kvh * hd;
    const float* qb = q + ((u64)r * nheads + (u64)kvh * G) * hd;
    int early = as_early<C, ASYNC>(Ks, Vs, kc, vc, base, nrows, p, j0, j1, kt, hd, hdp, kvdim, cap, threadIdx.x, blockDim.x);
    PDL_ATTN;
    PHASE(1);

    float m[HPW], l[HPW], acc[HPW][ND];
#pragma unroll
    for (int g = 0; g < HPW; g++) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < ND; k++) acc[g][k] = 0.f;
    }
    for (int t0 = j0; t0 < j1; t0 += kt) {
        int nt = min(kt, j1 - t0);
        __syncthreads(); // the previous tile is consumed
        // Float caches (sm_80 and newer): the tile's keys and values are
        // copied into shared memory by cp.async, every copy of the thread
        // in flight at once, and the first tile's copies overlap the
        // queries' loads.
        bool copied = false;
#if __CUDA_ARCH__ >= 800
        if constexpr (ASYNC && sizeof(C) == 4) {
            as_copy(Ks, Vs, kc, vc, base, t0, t0 == j0 ? early : 0, nt, hd, hdp, kvdim, cap, threadIdx.x, blockDim.x);
            cp_async_commit();
            copied = true;
        }
#endif
        if (t0 == j0)
            for (int i = tid; i < G * hd; i += blockDim.x) Qs[i] = qb[i];
        if (copied) {
            cp_async_wait<0>();
        } else {
            as_load(Ks, Vs, kc, vc, base, t0, nt, hd, hdp, kvdim, cap, threadIdx.x, blockDim.x);
        }
        __syncthreads();
        if (t0 == j0) PHASE(2);
#pragma unroll
        for (int gi = 0; gi < HPW; gi++) {
            int g = warp + gi * AS_WARPS;
            if (g >= G) break;
            float sc = NEG_INF;
            if (lane < nt) {
                const float* qg = Qs + g * hd;
                const float* kj = Ks + lane * hdp;
                float d = 0.f;
                // Unrolled so that the shared-memory loads of 4 steps fly
                // at once (the sum's order is the loop's).
#pragma unroll 4
                for (int c = 0; c < hd; c += 4) {
                    float4 a = *(const float4*)(qg + c), b = *(const float4*)(kj + c);
                    d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
                sc = d * scale;
                if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
            }
            float mn = fmaxf(m[gi], warp_max(sc)), corr = expf(m[gi] - mn);
            float e = lane < nt ? expf(sc - mn) : 0.f;
            l[gi] = l[gi] * corr + warp_sum(e);
            m[gi] = mn;
            if (t0 == j0 && gi == 0) PHASE(3);
#pragma unroll
            for (int k = 0; k < ND; k++) acc[gi][k] *= corr;
#pragma unroll 4
            for (int j = 0; j < nt; j++) {
                float ej = __shfl_sync(0xffffffffu, e, j);
                const float* vj = Vs + j * hd;
#pragma unroll
                for (int k = 0; k < ND; k++) {
                    int d = lane + 32 * k;
                    if (d < hd) acc[gi][k] += ej * vj[d];
                }
            }
        }
    }

    PHASE(4);
    // A row that one block covers needs no merge: its output is acc / l,
    // what the merge of one partial computes.
    if (ns == 1) {
#pragma unroll
        for (int gi = 0; gi < HPW; gi++) {
            int g = warp + gi * AS_WARPS;
            if (g >= G) break;
            u64 ob = ((u64)r * nheads + (u64)kvh * G + g) * hd;
#pragma unroll
            for (int k = 0; k < ND; k++) {
                int d = lane + 32 * k;
                if (32 * k >= hd) break;
                float v = 0.f;
                if (d < hd) {
                    v = acc[gi][k] / l[gi];
                    out[ob + d] = v;
                }
                if (qa) q8_store(v, qa + ob + d, ds + ((ob + d) >> 5), lane);
            }
        }
        PHASE(5);
        return;
    }

    // This block's partials, then the merge by the last block of (r, kvh).
#pragma unroll
    for (int gi = 0; gi < HPW; gi++) {
        int g = warp + gi * AS_WARPS;
        if (g >= G) break;
        float* pp = part + (((u64)r * nheads + (u64)kvh * G + g) * S + s) * (hd + 2);
#pragma unroll
        for (int k = 0; k < ND; k++) {
            int d = lane + 32 * k;
            if (d < hd) pp[d] = acc[gi][k];
        }
        if (lane == 0) {
            pp[hd] = m[gi];
            pp[hd + 1] = l[gi];
        }
    }
    if (as_last(count, r, nkv, kvh, ns)) as_merge(out, part, qa, ds, Ws + warp * AS_MAXS, r, nheads, kvh, G, S, ns, hd, warp, lane, AS_WARPS);
}

// attention_split_w_t is attention_split_t for heads of exactly 32·DQ·ND
// dims and up to AW_HEADS query heads a kv head, with DQ warps a query
// head: warp w takes head g = w / DQ and its W = 32·ND dims [W·dq, W·dq +
// W), dq = w % DQ. The scores' dot products split the same way: each warp
// sums its W dims of the tile's keys (lane j: key j) into shared memory,
// and every warp of the head adds the DQ partial sums in the order dq =
// 0, 1, ..., so all of them hold the same scores and run the same online
// softmax; each then accumulates its own W dims of P·V (lane l: dims l,
// l+32, ...), ND blocks of the quantized output. With ND = 1 the chain a
// warp runs is a DQ-th of
// attention_split_gHdN's (whose lane holds a whole 128-dim dot product
// and DQ output dims), and a block of 4·DQ warps gives each scheduler DQ
// warps to hide each other's latencies: at short contexts the attention
// is a chain of dependent instructions in warps that run alone on their
// scheduler (ncu: ~10 cycles an instruction, 8B shape). Geometry, copies,
// partials and merge as attention_split_t; grid (nkv·S, rows).
//
// NG > 1 gives the block NG such groups of 4·DQ warps, each with its own
// tiles, queries and scores in shared memory and its own barrier (named
// barrier 1 + group): group γ takes tiles γ, γ + NG, ... of the block's
// run, so NG tiles are computed at once rather than one after the other,
// and the groups' online softmaxes are merged in shared memory in group
// order (a fixed order) before the block writes its output or its
// partial. A run is then best NG tiles or a multiple (planmm.go's keys).
// (A minimum of 1,024 threads a multiprocessor in the launch bounds, 64
// registers a thread, made NVRTC 11.8 spill 36-56 bytes in every w
// kernel, where unbounded they take 50-57 registers and none.)
#define AW_HEADS 4
// aw_sync is the barrier of a group of warps: the block's with one group,
// else named barrier 1 + grp over the group's gt threads.
template <int NG>
__device__ __forceinline__ void aw_sync(int grp, int gt) {
    if constexpr (NG == 1) {
        __syncthreads();
    } else {
        asm volatile("bar.sync %0, %1;" ::"r"(1 + grp), "r"(gt) : "memory");
    }
}
template <typename C, bool ASYNC, int DQ, int ND, int NG>
__device__ __forceinline__ void attention_split_w_t(
    float* out, const float* q, const C* kc, const C* vc, const int* meta, const int* pos, const int* slots,
    int nheads, int nkv, int cap, float scale, float softcap, int window, signed char* qa, float2* ds, float* part,
    int* count, int S, int kt, int keys, int db) {
    constexpr int W = 32 * ND, HD = DQ * W, HDP = HD + 4, GW = AW_HEADS * DQ;
    PHASE(0);
    extern __shared__ __align__(16) float sms[];
    int r = blockIdx.y;
    int nrows = meta[0], p = pos[r], slot = slots[r];
    if (r >= nrows) return;
    int kvh = blockIdx.x / S, s = blockIdx.x % S;
    int G = nheads / nkv, kvdim = nkv * HD;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // A group's threads, gt = 32·GW, taken from blockDim: as a constant
    // the copies' loops unrolled, to 103 registers (NVRTC 11.8).
    int grp = NG == 1 ? 0 : warp / GW, lw = NG == 1 ? warp : warp % GW, gt = blockDim.x / NG, gtid = tid - grp * gt;
    int g = lw / DQ, dq = lw % DQ;
    bool live = g < G; // warp-uniform
    // A group's shared memory: with db set (float caches copied by
    // cp.async), two tiles' room, the next tile copied while the group
    // computes the current one; then its queries, partial scores and
    // weights. The merge weights follow the NG groups.
    int tb = kt * (HDP + HD);                                  // a tile's floats, from one buffer's Ks to the next's
    int gsz = (1 + db) * tb + AW_HEADS * HD + 2 * GW * 32;     // a group's floats
    float* Ks = sms + grp * gsz;         // [kt][HDP], then the second tile's with db
    float* Vs = Ks + kt * HDP;           // [kt][HD], likewise
    float* Qs = Ks + (1 + db) * tb;      // [AW_HEADS][HD], after the tiles
    float* Ps = Qs + AW_HEADS * HD;      // [AW_HEADS][DQ][32]: partial scores
    float* Es = Ps + GW * 32;            // [AW_HEADS·DQ][32]: each warp's weights of the tile's keys
    float* Ws = sms + NG * gsz;          // [AW_HEADS][AS_MAXS]: merge weights
    int j0, j1, ns;
    if (!as_run(p, window, S, keys, kt, s, j0, j1, ns)) return;
    int f0 = j0 + grp * kt, step = NG * kt; // the group's first tile and its stride
    u64 base = (u64)slot * cap * kvdim + (u64)kvh * HD;
    const float* qb = q + ((u64)r * nheads + (u64)kvh * G) * HD;
    int early = as_early<C, ASYNC>(Ks, Vs, kc, vc, base, nrows, p, f0, j1, kt, HD, HDP, kvdim, cap, gtid, gt);
    PDL_ATTN;
    PHASE(1);

    float m = NEG_INF, l = 0.f, acc[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) acc[k] = 0.f;
    for (int t0 = f0, b = 0; t0 < j1; t0 += step, b ^= db) {
        int nt = min(kt, j1 - t0);
        aw_sync<NG>(grp, gt); // the previous tile and its partial scores are consumed
        float *Kt = Ks + b * tb, *Vt = Vs + b * tb; // this tile's buffer
        bool copied = false;
#if __CUDA_ARCH__ >= 800
        if constexpr (ASYNC && sizeof(C) == 4) {
            if (t0 == f0 || !db) { // with db the tiles after the first were copied during the one before
                as_copy(Kt, Vt, kc, vc, base, t0, t0 == f0 ? early : 0, nt, HD, HDP, kvdim, cap, gtid, gt);
                if (t0 == f0)
                    for (int i = gtid; i < G * (HD / 4); i += gt) cp_async16(smem_addr(&Qs[i << 2]), qb + (i << 2), true);
                cp_async_commit();
            }
            if (db && t0 + step < j1) { // the next tile, into the other buffer (consumed before this iteration's barrier)
                as_copy(Ks + (b ^ 1) * tb, Vs + (b ^ 1) * tb, kc, vc, base, t0 + step, 0, min(kt, j1 - t0 - step), HD, HDP, kvdim,
                        cap, gtid, gt);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            copied = true;
        }
#endif
        if (!copied) {
            as_load(Kt, Vt, kc, vc, base, t0, nt, HD, HDP, kvdim, cap, gtid, gt);
            if (t0 == f0)
                for (int i = gtid; i < G * (HD / 4); i += gt) ((float4*)Qs)[i] = ((const float4*)qb)[i];
        }
        aw_sync<NG>(grp, gt);
        if (t0 == j0) PHASE(2);
        if (live) {
            float d = 0.f;
            if (lane < nt) {
                const float* qg = Qs + g * HD + W * dq;
                const float* kj = Kt + lane * HDP + W * dq;
#pragma unroll
                for (int c = 0; c < W; c += 4) {
                    float4 a = *(const float4*)(qg + c), b = *(const float4*)(kj + c);
                    d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
            }
            Ps[(g * DQ + dq) * 32 + lane] = d;
        }
        aw_sync<NG>(grp, gt);
        if (live) {
            float sc = NEG_INF;
            if (lane < nt) {
                float d = 0.f;
#pragma unroll
                for (int k = 0; k < DQ; k++) d += Ps[(g * DQ + k) * 32 + lane];
                sc = d * scale;
                if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);
            }
            float mn = fmaxf(m, warp_max(sc)), corr = expf(m - mn);
            float e = lane < nt ? expf(sc - mn) : 0.f;
            l = l * corr + warp_sum(e);
            m = mn;
            if (t0 == j0 && warp == 0) PHASE(3);
#pragma unroll
            for (int k = 0; k < ND; k++) acc[k] *= corr;
            // The weights go through the warp's own shared memory, read
            // four keys at a time, rather than a shuffle a key: P·V's
            // shared memory traffic is then what attention_split_gHdN's is
            // (the values), plus a 4·ND-th.
            float* ew = Es + lw * 32;
            ew[lane] = e;
            __syncwarp();
            const float* vd = Vt + W * dq + lane;
            int j = 0;
#pragma unroll 2
            for (; j + 4 <= nt; j += 4) {
                float4 e4 = *(const float4*)(ew + j);
#pragma unroll
                for (int k = 0; k < ND; k++) {
                    acc[k] += e4.x * vd[j * HD + 32 * k];
                    acc[k] += e4.y * vd[(j + 1) * HD + 32 * k];
                    acc[k] += e4.z * vd[(j + 2) * HD + 32 * k];
                    acc[k] += e4.w * vd[(j + 3) * HD + 32 * k];
                }
            }
            for (; j < nt; j++) {
#pragma unroll
                for (int k = 0; k < ND; k++) acc[k] += ew[j] * vd[j * HD + 32 * k];
            }
            __syncwarp(); // ew is rewritten at the next tile
        }
    }

    if constexpr (NG > 1) {
        // Group 0 merges the groups' softmaxes in group order: each group
        // leaves its (acc[HD], max, sum) a head at the start of its own
        // tiles' room. A group without a tile left max -inf and adds 0
        // (group 0 always has one: a run is never empty).
        __syncthreads(); // every group is done with its tiles
        float* st = Ks + g * (HD + 2);
        if (live) {
#pragma unroll
            for (int k = 0; k < ND; k++) st[W * dq + 32 * k + lane] = acc[k];
            if (dq == 0 && lane == 0) {
                st[HD] = m;
                st[HD + 1] = l;
            }
        }
        __syncthreads();
        if (grp == 0 && live) {
            float M = m;
#pragma unroll
            for (int y = 1; y < NG; y++) M = fmaxf(M, st[y * gsz + HD]);
            float c0 = expf(m - M);
            l *= c0;
#pragma unroll
            for (int k = 0; k < ND; k++) acc[k] *= c0;
#pragma unroll
            for (int y = 1; y < NG; y++) {
                const float* o = st + y * gsz;
                float c = expf(o[HD] - M);
                l += o[HD + 1] * c;
#pragma unroll
                for (int k = 0; k < ND; k++) acc[k] += o[W * dq + 32 * k + lane] * c;
            }
            m = M;
        }
        live = live && grp == 0;
    }

    PHASE(4);
    u64 hb = (u64)r * nheads + (u64)kvh * G + g; // the warp's query head
    if (ns == 1) {
        if (live) {
#pragma unroll
            for (int k = 0; k < ND; k++) {
                u64 o = hb * HD + W * dq + 32 * k + lane;
                float v = acc[k] / l;
                out[o] = v;
                if (qa) q8_store(v, qa + o, ds + (o >> 5), lane);
            }
        }
        PHASE(5);
        return;
    }
    if (live) {
        float* pp = part + (hb * S + s) * (HD + 2);
#pragma unroll
        for (int k = 0; k < ND; k++) pp[W * dq + 32 * k + lane] = acc[k];
        if (dq == 0 && lane == 0) {
            pp[HD] = m;
            pp[HD + 1] = l;
        }
    }
    if (as_last(count, r, nkv, kvh, ns) && warp < AW_HEADS)
        as_merge(out, part, qa, ds, Ws + warp * AS_MAXS, r, nheads, kvh, G, S, ns, HD, warp, lane, AW_HEADS);
}

#define ATTENTION_SPLIT_W(name, C, ASYNC, DQ, ND, NG)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * AW_HEADS * DQ * NG) name(                                    \
        float* out, const float* q, const C* kc, const C* vc, const int* meta, const int* pos, const int* slots,   \
        int nheads, int nkv, int hd, int cap, float scale, float softcap, int window, signed char* qa, float2* ds,  \
        float* part, int* count, int S, int kt, int keys, int db) {                                                 \
        attention_split_w_t<C, ASYNC, DQ, ND, NG>(out, q, kc, vc, meta, pos, slots, nheads, nkv, cap, scale, softcap, \
                                                  window, qa, ds, part, count, S, kt, keys, db);                    \
    }
// Heads of 64 dims (Llama 3.2 1B) with up to 4 query heads a kv head
// (planmm.go's splitWarpKernels): w2. Heads of 128 dims (Llama 3 8B)
// while the batch's rows are at short positions (planmm.go's
// splitShallow128): w2x2, 2 warps of 64 dims a head and 8 a block; deeper
// they run attention_split_g1d4. DQ = 4 (w4) was faster from an empty
// cache (tg128 +4 % on 8B Q4_0) but 9-10 % slower 2,048 positions deep,
// where its 16-warp blocks' extra softmaxes and barriers run for every 32
// keys, and capping its splits did not save it.
ATTENTION_SPLIT_W(attention_split_w2, float, true, 2, 1, 1)
ATTENTION_SPLIT_W(attention_split_w2_h, u16, false, 2, 1, 1)
ATTENTION_SPLIT_W(attention_split_w2x2, float, true, 2, 2, 1)
ATTENTION_SPLIT_W(attention_split_w2x2_h, u16, false, 2, 2, 1)
// Groups of warps a block (NG = 2, 4) for rows below the plan's deepAt
// (planmm.go's splitGroups), float caches.
ATTENTION_SPLIT_W(attention_split_w2g2, float, true, 2, 1, 2)
ATTENTION_SPLIT_W(attention_split_w2g4, float, true, 2, 1, 4)
ATTENTION_SPLIT_W(attention_split_w2x2g2, float, true, 2, 2, 2)
ATTENTION_SPLIT_W(attention_split_w2x2g4, float, true, 2, 2, 4)

#define ATTENTION_SPLIT(name, C, ASYNC, HPW, ND)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * AS_WARPS) name(                                              \
        float* out, const float* q, const C* kc, const C* vc, const int* meta, const int* pos, const int* slots,   \
        int nheads, int nkv, int hd, int cap, float scale, float softcap, int window, signed char* qa, float2* ds,  \
        float* part, int* count, int S, int kt, int keys) {                                                         \
        attention_split_t<C, ASYNC, HPW, ND>(out, q, kc, vc, meta, pos, slots, nheads, nkv, hd, cap, scale, softcap,  \
                                             window, qa, ds, part, count, S, kt, keys);                             \
    }
ATTENTION_SPLIT(attention_split, float, true, 4, 8)
ATTENTION_SPLIT(attention_split_h, u16, false, 4, 8)
// The float kernel without cp.async (WEFT_CUDA_ATTN_SYNC=1, for comparisons).
ATTENTION_SPLIT(attention_split_sync, float, false, 4, 8)
// Common shapes (planmm.go's splitKernels): up to 4 or 8 query heads a kv
// head, head sizes up to 64 or 128.
ATTENTION_SPLIT(attention_split_g1d2, float, true, 1, 2)
ATTENTION_SPLIT(attention_split_g1d4, float, true, 1, 4)
ATTENTION_SPLIT(attention_split_g2d2, float, true, 2, 2)
ATTENTION_SPLIT(attention_split_g2d4, float, true, 2, 4)
ATTENTION_SPLIT(attention_split_g1d2_h, u16, false, 1, 2)
ATTENTION_SPLIT(attention_split_g1d4_h, u16, false, 1, 4)
ATTENTION_SPLIT(attention_split_g2d2_h, u16, false, 2, 2)
ATTENTION_SPLIT(attention_split_g2d4_h, u16, false, 2, 4)

// attention_tiled is the prefill path: one block per (kv head, AT_ROWS
// consecutive rows). Rows of one slot form a segment whose query vectors
// (rows × the kv head's nheads/nkv query heads) share every tile of AT_KT
// keys and values loaded into shared memory, so the cache is read once
// per segment rather than once per query. Each of the AT_WARPS warps
// runs an online softmax for QPW query vectors: lane l scores key l of
// the tile, then owns dims l, l+32, ... of the output. Needs hd % 4 == 0
// and hd <= 32*HD4. Shared memory: keys [AT_KT][hd+4] (the pad keeps
// 16-byte rows on distinct banks), values [AT_KT][hd], scaled queries
// [AT_WARPS*QPW][hd], probabilities [AT_WARPS*QPW][AT_KT]. A warp reads
// each key and value row of a tile once for its QPW queries.
#define AT_ROWS 8
#define AT_KT 32
#define AT_WARPS 8

template <int HD4, int QPW, typename C>
__device__ void attention_tiled(float* out, const float* q, const C* kc, const C* vc, const int* meta,
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
                        kv = cld4(kc, at);
                        vv = cld4(vc, at);
                    }
                    *(float4*)(Ks + kk * hdp + d) = kv;
                    *(float4*)(Vs + kk * hd + d) = vv;
                }
                __syncthreads();
                // Scores: lane j's key row is read once for the warp's
                // QPW queries (each sums in the same order as alone).
                float sc[QPW];
#pragma unroll
                for (int i = 0; i < QPW; i++) sc[i] = 0.f;
                const float* kr = Ks + lane * hdp;
                const float* qw = Qs + warp * QPW * hd;
                for (int d = 0; d < hd; d += 4) {
                    float4 b = *(const float4*)(kr + d);
#pragma unroll
                    for (int i = 0; i < QPW; i++) {
                        float4 a = *(const float4*)(qw + i * hd + d);
                        sc[i] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                    }
                }
                float* pw = Ps + warp * QPW * AT_KT;
#pragma unroll
                for (int i = 0; i < QPW; i++) {
                    // A query with no visible key in this tile keeps its
                    // state (and weighs the tile's values by 0).
                    if (last[i] < k0 || first[i] > k0 + AT_KT - 1) {
                        pw[i * AT_KT + lane] = 0.f;
                        continue;
                    }
                    float s = sc[i];
                    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                    int kp = k0 + lane;
                    bool ok = kp >= first[i] && kp <= last[i];
                    float mn = fmaxf(m[i], warp_max(ok ? s : NEG_INF));
                    float corr = expf(m[i] - mn), e = ok ? expf(s - mn) : 0.f;
                    l[i] = l[i] * corr + warp_sum(e);
                    m[i] = mn;
                    pw[i * AT_KT + lane] = e;
#pragma unroll
                    for (int c = 0; c < HD4; c++) acc[i][c] *= corr;
                }
                __syncwarp();
                // Values: each row of the tile is read once for the QPW
                // queries.
                for (int kk = 0; kk < AT_KT; kk++) {
                    float vv[HD4];
#pragma unroll
                    for (int c = 0; c < HD4; c++) {
                        int d = lane + 32 * c;
                        vv[c] = d < hd ? Vs[kk * hd + d] : 0.f;
                    }
#pragma unroll
                    for (int i = 0; i < QPW; i++) {
                        float pk = pw[i * AT_KT + kk];
#pragma unroll
                        for (int c = 0; c < HD4; c++) acc[i][c] += pk * vv[c];
                    }
                }
                __syncwarp();
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

#define ATTN_TILED(name, HD4, QPW, C)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * AT_WARPS)                                                 \
        name(float* out, const float* q, const C* kc, const C* vc, const int* meta, const int* pos,             \
             const int* slots, int nheads, int nkv, int hd, int cap, float scale, float softcap, int window) { PDL;  \
        attention_tiled<HD4, QPW, C>(out, q, kc, vc, meta, pos, slots, nheads, nkv, hd, cap, scale, softcap, window); \
    }
ATTN_TILED(attention_tiled_64, 2, 4, float)
ATTN_TILED(attention_tiled_128, 4, 2, float)
ATTN_TILED(attention_tiled_64_h, 2, 4, u16)
ATTN_TILED(attention_tiled_128_h, 4, 2, u16)
