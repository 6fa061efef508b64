// Token draws on the device: each selected row's next token by the
// Gumbel-max trick, argmax_i logits[i]/T + g_i (the argmax of the logits
// when T is 0), so that a decode step copies one int per row to the host
// instead of the logits. The noise is package sample's counter-based
// Gumbel noise, a pure function of (seed, step, token); the arithmetic is
// sample.SampleGumbel's: the division and the addition rounded to float32,
// the logarithms in double, ties to the lowest id, NaN and -Inf never
// drawn. One launch: a block takes the best of one vocabulary chunk, the
// last block of a row the best of the row's chunks. A row with a top-k
// draws as sample.SampleTopK: a block ranks its chunk's best k (runs of 64
// sorted by its warps, then merged pairwise), the last block of each group
// of DRAW_GROUP chunks merges the group's lists, and the last block of the
// row merges the groups' into the row's best k, then computes their
// probabilities, top-p and min-p in SampleTopK's order and arithmetic, and
// draws among those kept.

#define GUMBEL_GAMMA 0x9e3779b97f4a7c15ULL
#define DRAW_THREADS 256

// mix64 is SplitMix64's output function.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// better orders (score, id) candidates: higher score, then lower id; an id
// of -1 is no candidate.
__device__ __forceinline__ bool better(float s, int id, float bs, int bid) {
    if (id < 0) return false;
    if (bid < 0) return true;
    return s > bs || (s == bs && id < bid);
}

// block_best reduces every thread's candidate to thread 0's.
__device__ void block_best(float* s, int* id) {
    __shared__ float ss[DRAW_THREADS / 32];
    __shared__ int si[DRAW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        float os = __shfl_down_sync(0xffffffffu, *s, o);
        int oi = __shfl_down_sync(0xffffffffu, *id, o);
        if (better(os, oi, *s, *id)) { *s = os; *id = oi; }
    }
    int w = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) { ss[w] = *s; si[w] = *id; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < DRAW_THREADS / 32; k++)
            if (better(ss[k], si[k], *s, *id)) { *s = ss[k]; *id = si[k]; }
    }
}

#define DRAW_TOPK 64  // backend.MaxTopK; also the length of the ranked lists below
#define DRAW_LISTS 32 // lists a block merges at once (16 KiB); a chunk is at most DRAW_LISTS * DRAW_TOPK tokens
#define DRAW_GROUP 8  // chunks whose lists the last of them merges, before the row's last block merges the groups'

// cand_key orders finite logits as SampleTopK ranks them, the larger first
// and then the lower id, as one unsigned key (0 is no candidate). -0 and
// +0 rank as equals.
__device__ __forceinline__ u64 cand_key(float v, int id) {
    u32 b = __float_as_uint(v == 0.f ? 0.f : v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(0xffffffffu - (u32)id);
}
__device__ __forceinline__ int key_id(u64 k) { return (int)(0xffffffffu - (u32)k); }

// shfl_xor64 is __shfl_xor_sync of a 64-bit key.
__device__ __forceinline__ u64 shfl_xor64(u64 v, int m) {
    u32 lo = __shfl_xor_sync(0xffffffffu, (u32)v, m), hi = __shfl_xor_sync(0xffffffffu, (u32)(v >> 32), m);
    return ((u64)hi << 32) | lo;
}

// warp_sort64 sorts a warp's run of DRAW_TOPK keys, x0 at index lane and
// x1 at lane + 32, largest first: a bitonic network, the pairs 32 apart
// within a lane and the others across lanes by shuffles.
__device__ __forceinline__ void warp_sort64(u64& x0, u64& x1) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= DRAW_TOPK; size <<= 1) {
#pragma unroll
        for (int j = size >> 1; j > 0; j >>= 1) {
            if (j == 32) { // the last stage: index lane against lane + 32
                u64 hi = x0 > x1 ? x0 : x1, lo = x0 > x1 ? x1 : x0;
                x0 = hi, x1 = lo;
                continue;
            }
            // Runs of size alternate in direction to form the next stage's
            // bitonic runs; the last stage sorts the whole run largest
            // first. The lower index of a pair keeps the larger key in a
            // descending run.
            bool low = (lane & j) == 0;
            bool d0 = (lane & size) == 0 || size == DRAW_TOPK, d1 = ((lane + 32) & size) == 0 || size == DRAW_TOPK;
            u64 p0 = shfl_xor64(x0, j), p1 = shfl_xor64(x1, j);
            bool g0 = x0 > p0, g1 = x1 > p1;
            x0 = (low == d0) == g0 ? x0 : p0;
            x1 = (low == d1) == g1 ? x1 : p1;
        }
    }
}

// key_at is token i's candidate key in logits l, 0 past hi or where the
// logit is NaN or -Inf.
__device__ __forceinline__ u64 key_at(const float* l, int i, int hi) {
    if (i >= hi) return 0;
    float v = l[i];
    return v > NEG_INF ? cand_key(v, i) : 0;
}

// merge_round merges lists 2q and 2q+1 of src (L ranked lists of k keys
// at a stride of DRAW_TOPK, 0 past their candidates) into list q of dst,
// keeping the best k, and copies an odd last list; it returns the lists
// left. A key's rank in the merge is its index plus the keys of the other
// list above it (keys are distinct but for the 0s, which are not placed).
__device__ int merge_round(const u64* src, int L, u64* dst, int k) {
    int pairs = L / 2, left = (L + 1) / 2;
    for (int i = threadIdx.x; i < left * DRAW_TOPK; i += DRAW_THREADS) dst[i] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < pairs * 2 * DRAW_TOPK; e += DRAW_THREADS) {
        int q = e / (2 * DRAW_TOPK), side = (e / DRAW_TOPK) & 1, i = e % DRAW_TOPK;
        const u64* a = src + (2 * q + side) * DRAW_TOPK;
        const u64* b = src + (2 * q + 1 - side) * DRAW_TOPK;
        u64 key = i < k ? a[i] : 0;
        if (key == 0) continue;
        int above = 0; // keys of b above key: a binary search of the ranked list
#pragma unroll
        for (int step = DRAW_TOPK / 2; step > 0; step >>= 1)
            if (b[above + step - 1] > key) above += step;
        above += b[above] > key;
        if (i + above < k) dst[q * DRAW_TOPK + i + above] = key;
    }
    if (L & 1)
        for (int i = threadIdx.x; i < k; i += DRAW_THREADS) dst[pairs * DRAW_TOPK + i] = src[(L - 1) * DRAW_TOPK + i];
    __syncthreads();
    return left;
}

// reduce_lists merges L (at most DRAW_LISTS) ranked lists of k keys in
// buf (DRAW_LISTS lists) into one, through spare (half as many), and
// returns where it is.
__device__ u64* reduce_lists(u64* buf, int L, u64* spare, int k) {
    u64 *src = buf, *dst = spare;
    while (L > 1) {
        L = merge_round(src, L, dst, k);
        u64* t = src;
        src = dst, dst = t;
    }
    return src;
}

// exp_neg is package sample's expNeg, every operation rounded as Go
// rounds it (no fused multiply-adds): e^x for x in [-104, 0] as float32.
__device__ float exp_neg(double x) {
    const double log2e = __longlong_as_double(0x3ff71547652b82feLL), ln2 = __longlong_as_double(0x3fe62e42fefa39efLL);
    long long k = (long long)__dsub_rn(__dmul_rn(x, log2e), 0.5);
    double r = __dsub_rn(x, __dmul_rn((double)k, ln2));
    double q = __dmul_rn(r, 1.0 / 40320);
    q = __dmul_rn(r, __dadd_rn(1.0 / 5040, q));
    q = __dmul_rn(r, __dadd_rn(1.0 / 720, q));
    q = __dmul_rn(r, __dadd_rn(1.0 / 120, q));
    q = __dmul_rn(r, __dadd_rn(1.0 / 24, q));
    q = __dmul_rn(r, __dadd_rn(1.0 / 6, q));
    q = __dmul_rn(r, __dadd_rn(1.0 / 2, q));
    q = __dmul_rn(r, __dadd_rn(1.0, q));
    return __double2float_rn(__dmul_rn(__dadd_rn(1.0, q), __longlong_as_double((k + 1023) << 52)));
}

// prob_of is package sample's prob: e^((v - mx)/T) with 1/T as invT.
__device__ __forceinline__ float prob_of(float v, float mx, double invT) {
    if (v == mx) return 1.f;
    double e = __dmul_rn(__dsub_rn((double)v, (double)mx), invT);
    if (!(e >= -104.0)) return 0.f;
    return exp_neg(e);
}

// gumbel_score is SampleGumbel's score of logit v, token i, under the step
// key skey.
__device__ __forceinline__ float gumbel_score(float v, int i, float t, u64 skey) {
    u64 h = mix64(skey + (u64)(i + 1) * GUMBEL_GAMMA);
    double u = ((double)(h >> 11) + 0.5) * 0x1p-53;
    return __fadd_rn(__fdiv_rn(v, t), (float)(-log(-log(u))));
}

// topk_chunk writes the best k candidates of logits l's chunk [lo, hi)
// (at most DRAW_LISTS * DRAW_TOPK tokens) to dst, ranked, 0 past the
// finite ones: runs of DRAW_TOPK sorted by the warps, then merged.
__device__ void topk_chunk(u64* buf, u64* spare, const float* l, int lo, int hi, int k, u64* dst) {
    int L = (hi - lo + DRAW_TOPK - 1) / DRAW_TOPK, lane = threadIdx.x & 31;
    for (int run = threadIdx.x >> 5; run < L; run += DRAW_THREADS / 32) {
        int at = lo + run * DRAW_TOPK + lane;
        u64 x0 = key_at(l, at, hi), x1 = key_at(l, at + 32, hi);
        warp_sort64(x0, x1);
        buf[run * DRAW_TOPK + lane] = x0;
        buf[run * DRAW_TOPK + lane + 32] = x1;
    }
    __syncthreads();
    const u64* best = reduce_lists(buf, L, spare, k);
    for (int i = threadIdx.x; i < k; i += DRAW_THREADS) dst[i] = best[i];
}

// topk_merge leaves in pair[0, k) the best k of n ranked lists of k keys
// (list j at cb + j·stride·DRAW_TOPK), ranked: DRAW_LISTS lists at a time
// merged into one, then with the best so far (pair's first list; the
// batch's best is its second).
__device__ void topk_merge(u64* buf, u64* spare, u64* pair, const u64* cb, int n, int stride, int k) {
    for (int i = threadIdx.x; i < 2 * DRAW_TOPK; i += DRAW_THREADS) pair[i] = 0; // both lists: 0 past k
    for (int s = 0; s < n; s += DRAW_LISTS) {
        int L = min(DRAW_LISTS, n - s);
        for (int i = threadIdx.x; i < L * DRAW_TOPK; i += DRAW_THREADS) {
            int c = i / DRAW_TOPK, j = i % DRAW_TOPK;
            buf[i] = j < k ? __ldcg(cb + ((u64)(s + c) * stride) * DRAW_TOPK + j) : 0;
        }
        __syncthreads();
        const u64* best = reduce_lists(buf, L, spare, k);
        for (int i = threadIdx.x; i < k; i += DRAW_THREADS) pair[DRAW_TOPK + i] = best[i];
        __syncthreads();
        merge_round(pair, 2, buf, k);
        for (int i = threadIdx.x; i < k; i += DRAW_THREADS) pair[i] = buf[i];
        __syncthreads();
    }
}

// topk_draw is SampleTopK's steps 2-5 on the ranked keys[0, k) of logits
// row l: thread 0's candidate (id -1: none) in best, id.
__device__ void topk_draw(const u64* keys, const float* l, int k, float t, float topp, float minp, u64 skey, float* best,
                          int* id) {
    __shared__ float prob[DRAW_TOPK], score[DRAW_TOPK];
    __shared__ int ids[DRAW_TOPK], keep;
    int i = threadIdx.x;
    if (i < k) {
        u64 key = keys[i];
        ids[i] = key ? key_id(key) : -1;
        if (key) {
            float v = l[key_id(key)];
            prob[i] = prob_of(v, l[key_id(keys[0])], __ddiv_rn(1.0, (double)t));
            score[i] = gumbel_score(v, key_id(key), t, skey);
        }
    }
    __syncthreads();
    if (i == 0) {
        // The sums in rank order, as SampleTopK adds them.
        int n = 0;
        double total = 0.0;
        while (n < k && ids[n] >= 0) total = __dadd_rn(total, (double)prob[n++]);
        keep = n;
        if (topp < 1.f) {
            double target = __dmul_rn((double)topp, total), acc = 0.0;
            for (int j = 0; j < n; j++)
                if ((acc = __dadd_rn(acc, (double)prob[j])) >= target) {
                    keep = j + 1;
                    break;
                }
        }
    }
    __syncthreads();
    *best = NEG_INF;
    *id = -1;
    if (i < keep && prob[i] != 0.f && prob[i] >= minp) {
        *best = score[i];
        *id = ids[i];
    }
    block_best(best, id);
}

// draw: block (c, r) takes the best candidate of logits row r ([selected
// rows, vocab]) within chunk c ([c*chunk, (c+1)*chunk)) into
// part[r*chunks + c] (float score, int id); temp, seed and step are row
// r's draw. A row with a top-k (topk[r] > 0 and temp[r] > 0) instead
// keeps the chunk's best topk[r] logits in cands[(r*chunks + c)*DRAW_TOPK]
// (chunk must be at most DRAW_LISTS * DRAW_TOPK); the last of a group's
// blocks (counted in groups[r*ngroups + g]) merges the group's lists into
// its first chunk's. The last of row r's blocks to finish (counted in
// done[r], chunks or a top-k row's groups; left at 0 again) takes the best
// of the row's chunks, in chunk order (a top-k row: SampleTopK's draw
// among the groups' candidates), into out[r] (-1 when every logit was NaN or -Inf),
// and where host is set (page-locked host memory mapped for the device)
// into host[2r + step & 1] as well, so that no copy need follow: two
// steps in flight keep their draws apart. It also readies
// meta for the step after a decode batch's (backend.Pipeliner's
// IssueNext): row r is fed its draw (token 0 where there was none; the
// host reports that step's error), one position further, with its draw's
// step one further. Every other run stages meta and the steps from the
// host again, so for them these writes are dead.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void draw(float2* part, u64* cands, const float* logits,
        const float* temp, const int* topk, const float* topp, const float* minp, const u64* seed, u64* step,
        const int* meta, int vocab, int chunk, int* out, unsigned* done, unsigned* groups, int* tokens, int* pos, int* host) {
    __shared__ u64 buf[DRAW_LISTS * DRAW_TOPK], spare[DRAW_LISTS / 2 * DRAW_TOPK], pair[2 * DRAW_TOPK];
    int r = blockIdx.y;
    if (r >= meta[1]) return;
    const float* l = logits + (u64)r * vocab;
    float t = temp[r];
    int k = t > 0.0f ? topk[r] : 0;
    u64 stp = step[r];
    u64 skey = mix64(mix64(seed[r] + GUMBEL_GAMMA) + (stp + 1) * GUMBEL_GAMMA);
    int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab), chunks = gridDim.x;
    int ngroups = (chunks + DRAW_GROUP - 1) / DRAW_GROUP;
    u64* cb = cands + (u64)r * chunks * DRAW_TOPK;
    if (k > 0) {
        topk_chunk(buf, spare, l, lo, hi, k, cb + (u64)blockIdx.x * DRAW_TOPK);
        __threadfence(); // this thread's candidates are visible before the count says so
        __syncthreads();
        // The last of a group's chunks to finish (counted in groups, left
        // at 0 again) merges the group's lists into the group's first
        // list; the row then counts groups, not chunks.
        int g = blockIdx.x / DRAW_GROUP, g0 = g * DRAW_GROUP, n = min(DRAW_GROUP, chunks - g0);
        __shared__ bool glast;
        if (threadIdx.x == 0) glast = atomicAdd(&groups[(u64)r * ngroups + g], 1u) == (unsigned)n - 1;
        __syncthreads();
        if (!glast) return;
        __threadfence();
        if (n > 1) {
            for (int i = threadIdx.x; i < n * DRAW_TOPK; i += DRAW_THREADS)
                buf[i] = i % DRAW_TOPK < k ? __ldcg(cb + (u64)g0 * DRAW_TOPK + i) : 0;
            __syncthreads();
            const u64* best = reduce_lists(buf, n, spare, k);
            for (int i = threadIdx.x; i < k; i += DRAW_THREADS) cb[(u64)g0 * DRAW_TOPK + i] = best[i];
            __threadfence();
        }
        if (threadIdx.x == 0) groups[(u64)r * ngroups + g] = 0;
        __syncthreads();
    } else {
        float best = NEG_INF;
        int id = -1;
        for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
            float v = l[i];
            if (!(v > NEG_INF)) continue;
            float s = t > 0.0f ? gumbel_score(v, i, t, skey) : v;
            if (better(s, i, best, id)) { best = s; id = i; }
        }
        block_best(&best, &id);
        if (threadIdx.x == 0) {
            part[(u64)r * chunks + blockIdx.x] = make_float2(best, __int_as_float(id));
            __threadfence(); // the partial is visible before the count says so
        }
    }
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(&done[r], 1u) == (unsigned)(k > 0 ? ngroups : chunks) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float best = NEG_INF;
    int id = -1;
    if (k > 0) {
        topk_merge(buf, spare, pair, cb, ngroups, DRAW_GROUP, k);
        topk_draw(pair, l, k, t, topp[r], minp[r], skey, &best, &id);
    } else {
        for (int c = threadIdx.x; c < chunks; c += DRAW_THREADS) {
            float2 p = __ldcg(&part[(u64)r * chunks + c]);
            int pid = __float_as_int(p.y);
            if (better(p.x, pid, best, id)) { best = p.x; id = pid; }
        }
        block_best(&best, &id);
    }
    if (threadIdx.x == 0) {
        out[r] = id;
        if (host) host[2 * r + (int)(stp & 1)] = id;
        tokens[r] = max(id, 0);
        pos[r] += 1;
        step[r] += 1;
        done[r] = 0;
    }
}
