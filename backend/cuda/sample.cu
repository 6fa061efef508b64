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
#define FOLD_SLOTS 64 // the folded draws' slots (fold_draw, below)
#define FOLD_STRIDE 16 // u64 a slot: 128 bytes

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

// group_merge merges the ranked lists of k keys of a group's n chunks
// (list j at cb + (g0 + j)·DRAW_TOPK) into the group's first list.
__device__ __forceinline__ void group_merge(u64* buf, u64* spare, u64* cb, int g0, int n, int k) {
    for (int i = threadIdx.x; i < n * DRAW_TOPK; i += DRAW_THREADS)
        buf[i] = i % DRAW_TOPK < k ? __ldcg(cb + (u64)g0 * DRAW_TOPK + i) : 0;
    __syncthreads();
    const u64* best = reduce_lists(buf, n, spare, k);
    for (int i = threadIdx.x; i < k; i += DRAW_THREADS) cb[(u64)g0 * DRAW_TOPK + i] = best[i];
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

// Top-p and min-p without a top-k, as sample.SampleNucleus: before draw,
// nucleus_max finds each such row's largest logit and nucleus_pass, three
// times, one digit of top-p's cut (radix selection on rank_key's bits from
// the top: 11, 11 and 10 bits), summing the tokens' integer masses
// ⌊p·2⁴⁰⌋ (exact, so in any order) by digit among those whose keys share
// the digits found so far; draw then takes the Gumbel-max of the tokens
// above the cut, the first n ties at the cut by id, and min-p. Rows of
// other kinds return at once.

#define NUC_BUCKETS 2048 // the widest digit's (11 bits)
#define NUC_SHIFT 40     // the masses' binary point (sample.massShift)

// nucleus is a row's state between the launches (nucleusBytes in Go).
struct nucleus {
    float mx;        // the largest finite logit (-Inf: none)
    unsigned prefix; // the cut's key digits found so far; after the last pass, its key
    unsigned all;    // every tie at the cut is kept (1 also where there is no cut)
    unsigned pad;
    u64 left;        // what is left of the target
    u64 n;           // ties at the cut kept, the first by id
};

// nucleus_row says whether a row draws as SampleNucleus (a temperature,
// no top-k, a top-p or a min-p); cut, whether it has a top-p.
__device__ __forceinline__ bool nucleus_row(float t, int k, float topp, float minp, bool* cut) {
    *cut = topp > 0.f && topp < 1.f;
    return t > 0.f && k == 0 && (*cut || minp > 0.f);
}

// rank_key is sample.rankKey: finite logits ordered, -0 and +0 as one.
__device__ __forceinline__ unsigned rank_key(float v) {
    unsigned b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// key_logit is sample.keyLogit, rank_key's inverse.
__device__ __forceinline__ float key_logit(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// mass_of is sample.massOf: ⌊p·2⁴⁰⌋.
__device__ __forceinline__ u64 mass_of(float p) {
    return (u64)__dmul_rn((double)p, (double)(1ULL << NUC_SHIFT));
}

// nucleus_target is sample.nucleusTarget: ⌈topP·total⌉ exactly.
__device__ u64 nucleus_target(float topp, u64 total) {
    unsigned b = __float_as_uint(topp);
    int e = (b >> 23) & 0xff;
    u64 m = b & 0x7fffffu;
    if (e == 0) e = 1;
    else m |= 1u << 23;
    int s = 150 - e;
    u64 lo = m * total, hi = __umul64hi(m, total), q;
    bool rem;
    if (s >= 128) return (hi | lo) ? 1 : 0;
    if (s >= 64) {
        int r = s - 64;
        q = r ? hi >> r : hi;
        rem = lo != 0 || (r && (hi & ((1ULL << r) - 1)) != 0);
    } else {
        q = (hi << (64 - s)) | (lo >> s);
        rem = (lo & ((1ULL << s) - 1)) != 0;
    }
    return q + (rem ? 1 : 0);
}

// block_max reduces every thread's value to the block's largest, returned
// to every thread.
__device__ float block_max(float v) {
    __shared__ float sm[DRAW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
    __syncthreads();
    v = sm[0];
    for (int w = 1; w < DRAW_THREADS / 32; w++) v = fmaxf(v, sm[w]);
    return v;
}

// nucleus_max: block (c, r) of a nucleus row takes the largest finite
// logit of its chunk into part[r*chunks + c].x; the row's last block (done
// counts them) the row's, into st[r], readying it for the passes.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void nucleus_max(float2* part, const float* logits,
        const float* temp, const int* topk, const float* topp, const float* minp, const int* meta, int vocab, int chunk,
        unsigned* done, nucleus* st) {
    int r = blockIdx.y;
    bool cut;
    if (r >= meta[1] || !nucleus_row(temp[r], topk[r], topp[r], minp[r], &cut)) return;
    const float* l = logits + (u64)r * vocab;
    int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab), chunks = gridDim.x;
    float mx = NEG_INF;
    for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
        float v = l[i];
        if (v > mx) mx = v; // NaN never compares greater
    }
    mx = block_max(mx);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        part[(u64)r * chunks + blockIdx.x].x = mx;
        __threadfence();
        last = atomicAdd(&done[r], 1u) == (unsigned)chunks - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    mx = NEG_INF;
    for (int c = threadIdx.x; c < chunks; c += DRAW_THREADS) mx = fmaxf(mx, __ldcg(&part[(u64)r * chunks + c].x));
    mx = block_max(mx);
    if (threadIdx.x == 0) {
        nucleus s = {mx, 0u, cut ? 0u : 1u, 0u, 0ULL, 0ULL};
        st[r] = s;
        done[r] = 0;
    }
}

// scan_down returns, for each thread, the sum of x over the threads
// before it (an exclusive prefix sum in thread order), and in *total the
// block's.
__device__ u64 scan_down(u64 x, u64* total) {
    __shared__ u64 ws[DRAW_THREADS / 32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 inc = x;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) ws[w] = inc;
    __syncthreads();
    u64 before = 0, all = 0;
    for (int k = 0; k < DRAW_THREADS / 32; k++) {
        if (k < w) before += ws[k];
        all += ws[k];
    }
    *total = all;
    return before + inc - x;
}

// slots_max is the largest logit in the folded draws' slots (fold_draw:
// the output product's twin took every logit of the row into them), -Inf
// where none is finite, returned to every thread of the block.
__device__ float slots_max(const u64* slots) {
    float v = NEG_INF;
    if (threadIdx.x < FOLD_SLOTS) {
        u64 k = __ldcg(&slots[threadIdx.x * FOLD_STRIDE]);
        if (k != 0) v = key_logit((unsigned)(k >> 32));
    }
    return block_max(v);
}

// nucleus_pass finds digit `level` of a nucleus row's cut: block (c, r)
// sums the masses of its chunk's tokens whose keys share the digits found
// so far by their next digit into hist[r] (NUC_BUCKETS a row, 0 between
// launches); the row's last block finds the digit where the masses from
// the largest down reach what is left of the target (at level 0, the
// target itself, ⌈topP·total⌉), and after the last digit how many of the
// cut's ties to keep. With slots (level 0 of a one-row step whose output
// product folded the row's largest logit into them, outFoldedNucleus)
// it stands for nucleus_max too: the blocks read the largest logit from
// the slots, and the row's last block (block 0 for a row without a cut)
// readies st[0] as nucleus_max would and clears the slots.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void nucleus_pass(const float* logits, const float* temp,
        const int* topk, const float* topp, const float* minp, const int* meta, int vocab, int chunk, unsigned* done,
        nucleus* st, u64* hist, int level, u64* slots) {
    __shared__ u64 h[NUC_BUCKETS];
    int r = blockIdx.y;
    bool cut;
    if (r >= meta[1] || !nucleus_row(temp[r], topk[r], topp[r], minp[r], &cut)) return;
    if (!cut) {
        if (slots && blockIdx.x == 0) {
            float mx = slots_max(slots);
            __syncthreads();
            if (threadIdx.x < FOLD_SLOTS) slots[threadIdx.x * FOLD_STRIDE] = 0;
            if (threadIdx.x == 0) st[r] = nucleus{mx, 0u, 1u, 0u, 0ULL, 0ULL};
        }
        return;
    }
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0, bits = level == 2 ? 10 : 11;
    const unsigned mask = (1u << bits) - 1;
    const float* l = logits + (u64)r * vocab;
    float mx = slots ? slots_max(slots) : __ldcg(&st[r].mx);
    unsigned prefix = level == 0 ? 0u : __ldcg(&st[r].prefix);
    double invT = __ddiv_rn(1.0, (double)temp[r]);
    for (int i = threadIdx.x; i < NUC_BUCKETS; i += DRAW_THREADS) h[i] = 0;
    __syncthreads();
    int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab), chunks = gridDim.x;
    for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
        float v = l[i];
        if (!(v > NEG_INF)) continue;
        unsigned k = rank_key(v);
        if (level > 0 && (k >> (shift + bits)) != prefix) continue;
        u64 q = mass_of(prob_of(v, mx, invT));
        if (q) atomicAdd(&h[(k >> shift) & mask], q);
    }
    __syncthreads();
    u64* gh = hist + (u64)r * NUC_BUCKETS;
    for (int i = threadIdx.x; i < NUC_BUCKETS; i += DRAW_THREADS)
        if (h[i]) atomicAdd(&gh[i], h[i]);
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(&done[r], 1u) == (unsigned)chunks - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (slots) {
        // Every block has read the slots.
        if (threadIdx.x < FOLD_SLOTS) slots[threadIdx.x * FOLD_STRIDE] = 0;
        if (threadIdx.x == 0) st[r] = nucleus{mx, 0u, 0u, 0u, 0ULL, 0ULL};
        __syncthreads();
    }
    // Thread j holds the 8 buckets [NUC_BUCKETS - 8(j+1), NUC_BUCKETS - 8j):
    // thread 0 the largest digits.
    const int per = NUC_BUCKETS / DRAW_THREADS;
    u64 mine[NUC_BUCKETS / DRAW_THREADS], sum = 0;
    int top = NUC_BUCKETS - per * threadIdx.x - 1;
    for (int j = 0; j < per; j++) {
        mine[j] = __ldcg(&gh[top - j]);
        gh[top - j] = 0;
        sum += mine[j];
    }
    u64 total, above = scan_down(sum, &total);
    __shared__ u64 left;
    if (threadIdx.x == 0) left = level == 0 ? nucleus_target(topp[r], total) : __ldcg(&st[r].left);
    __syncthreads();
    u64 want = left;
    if (above < want && want <= above + sum) {
        // This thread's buckets hold the digit: the masses from its top
        // down reach what is left.
        u64 acc = above;
        int j = 0;
        while (acc + mine[j] < want) acc += mine[j++];
        unsigned digit = top - j;
        u64 rest = want - acc;
        nucleus* s = &st[r];
        unsigned key = (prefix << bits) | digit;
        s->prefix = key;
        s->left = rest;
        if (level == 2) {
            // One key: its tokens share one logit and so one mass.
            u64 q = mass_of(prob_of(key_logit(key), mx, invT));
            u64 n = (rest + q - 1) / q;
            s->n = n;
            s->all = n >= mine[j] / q ? 1u : 0u;
        }
    }
    if (threadIdx.x == 0) done[r] = 0;
}

// nucleus_ties adds to each thread's candidate (best, id) the first n
// tokens of logits row l (by id) whose key is key, those of a nucleus
// row's cut when not all of them are kept, under min-p. Every thread of the
// block calls it.
__device__ void nucleus_ties(const float* l, int vocab, const nucleus& s, float t, float minp, u64 skey, float* best,
                             int* id) {
    __shared__ unsigned wc[DRAW_THREADS / 32];
    float p = prob_of(key_logit(s.prefix), s.mx, __ddiv_rn(1.0, (double)t));
    if (p == 0.f || p < minp) return;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 seen = 0;
    for (int base = 0; base < vocab && seen < s.n; base += DRAW_THREADS) {
        int i = base + threadIdx.x;
        float v = i < vocab ? l[i] : NEG_INF;
        bool tie = v > NEG_INF && rank_key(v) == s.prefix;
        unsigned b = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) wc[w] = __popc(b);
        __syncthreads();
        unsigned before = __popc(b & ((1u << lane) - 1)), all = 0;
        for (int k = 0; k < DRAW_THREADS / 32; k++) {
            if (k < w) before += wc[k];
            all += wc[k];
        }
        if (tie && seen + before < s.n) {
            float sc = gumbel_score(v, i, t, skey);
            if (better(sc, i, *best, *id)) { *best = sc; *id = i; }
        }
        seen += all;
        __syncthreads();
    }
}

#define PEN_WINDOW 256 // backend.MaxWindow: a row's window tokens, a ring from wnext
#define MAX_BIAS 512   // backend.MaxBias: a row's biased tokens
#define SAVED (MAX_BIAS + PEN_WINDOW + 1) // adjust's saved logits a row (cuda's savedEntries)

// adjust: block r changes row r's logits as sample.Draw.Sample does:
// first the logit bias (blen[r] pairs of token and value at
// bias[r*MAX_BIAS], distinct tokens), then the penalties, once per
// distinct token of its window (the wlen[r] tokens at win[r*PEN_WINDOW];
// wsize[r] 0: none): the repeat penalty divides a positive logit and
// multiplies another, then the presence penalty and the frequency penalty
// times the token's count are subtracted, every operation rounded on its
// own. Each logit it changes it first saves, with its token, in saved
// (int2 [rows, SAVED]: bias j at j, the window's place j at MAX_BIAS + j,
// token -1 where a place repeats an earlier token, and the window's length
// at MAX_BIAS + PEN_WINDOW), for logprob_end to find a drawn token's raw
// logit.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void adjust(float* logits, const int* meta, const float* rep,
        const float* pres, const float* freq, const int* wsize, const int* wlen, const int* win, const int* blen,
        const int2* bias, int vocab, int2* saved) {
    int r = blockIdx.x;
    if (r >= meta[1]) return;
    float* l = logits + (u64)r * vocab;
    const int2* b = bias + (u64)r * MAX_BIAS;
    int2* sv = saved + (u64)r * SAVED;
    for (int j = threadIdx.x; j < blen[r]; j += DRAW_THREADS) {
        int2 e = b[j];
        float x = l[e.x];
        sv[j] = make_int2(e.x, __float_as_int(x));
        l[e.x] = __fadd_rn(x, __int_as_float(e.y));
    }
    if (wsize[r] <= 0) return;
    __syncthreads(); // the biased logits, before the penalties read them
    int n = wlen[r];
    const int* w = win + (u64)r * PEN_WINDOW;
    if (threadIdx.x == 0) sv[MAX_BIAS + PEN_WINDOW] = make_int2(n, 0);
    for (int j = threadIdx.x; j < n; j += DRAW_THREADS) {
        int t = w[j], count = 0;
        bool first = true;
        for (int k = 0; k < n; k++)
            if (w[k] == t) {
                count++;
                first = first && k >= j;
            }
        if (!first) { // the token's first place penalises it
            sv[MAX_BIAS + j] = make_int2(-1, 0);
            continue;
        }
        float x = l[t];
        sv[MAX_BIAS + j] = make_int2(t, __float_as_int(x));
        x = x > 0.f ? __fdiv_rn(x, rep[r]) : __fmul_rn(x, rep[r]);
        l[t] = __fsub_rn(x, __fadd_rn(pres[r], __fmul_rn((float)count, freq[r])));
    }
}

// Log-probabilities (backend.LogprobSampler): before the other draw
// launches change a row's logits, logprob takes each row that asks for
// them (lpn[r] >= 0 top tokens) through its raw logits: block (c, r) the
// largest logit of chunk c, its chunk's Σ e^(v - max) in double (each term
// rounded to float32, as package sample's prob) and the chunk's best
// lpn[r] keys (topk_chunk); the last block of each group of DRAW_GROUP
// chunks merges the group's (the sums scaled to the group's largest
// logit, the lists by reduce_lists), as draw merges a top-k row's, and the
// row's last block the groups': the row's log-sum-exp and its best lpn[r]
// tokens, into the row's record. After the draw, logprob_end adds the
// drawn token's raw logit, from the logits or, where adjust changed it,
// from what adjust saved. A row's record is rec[2r + (its draw's step &
// 1)] (page-locked host memory mapped for the device where the driver
// gives it, as draw's host is: two steps in flight keep theirs apart).
// The host turns the record into log-probabilities (sample.TokenLogProbs'
// arithmetic; the sum's order differs, so they agree to ~1e-7, not bit
// for bit).

#define TOP_LP 20 // backend.MaxTopLogprobs

// lp_rec is a row's log-probabilities' record (cuda's lpRec, 192 bytes).
struct lp_rec {
    double lse;  // log Σ e^v over the raw logits
    float drawn; // the drawn token's raw logit (logprob_end)
    int pad0;
    int n; // tokens in ids and vals
    int pad1;
    int ids[TOP_LP];
    float vals[TOP_LP]; // their raw logits
    u64 pad2;
};

// block_sum reduces every thread's value to the block's sum, returned to
// every thread.
__device__ double block_sum(double v) {
    __shared__ double sm[DRAW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
    __syncthreads();
    v = sm[0];
    for (int w = 1; w < DRAW_THREADS / 32; w++) v += sm[w];
    return v;
}

// lse_merge merges n (largest logit, Σ e^(v - largest)) pairs, each stride
// apart from p, into one, scaled to their largest; thread 0's is the
// answer. A pair of no finite logit is (-Inf, 0); +Inf stays +Inf.
__device__ __forceinline__ double2 lse_merge(const double2* p, int n, int stride) {
    float m = NEG_INF;
    for (int c = threadIdx.x; c < n; c += DRAW_THREADS) m = fmaxf(m, (float)__ldcg(&p[(u64)c * stride].x));
    m = block_max(m);
    double s = 0.0;
    if (m > NEG_INF && m < -NEG_INF)
        for (int c = threadIdx.x; c < n; c += DRAW_THREADS) {
            double2 q = __ldcg(&p[(u64)c * stride]);
            if (q.y > 0.0) s += q.y * exp(q.x - (double)m);
        }
    else if (m == -NEG_INF)
        s = 1.0;
    s = block_sum(s);
    return make_double2((double)m, s);
}

extern "C" __global__ __launch_bounds__(DRAW_THREADS) void logprob(const float* logits, const int* meta, const int* lpn,
        const u64* step, int vocab, int chunk, double2* part, u64* cands, unsigned* done, unsigned* groups, lp_rec* rec) {
    __shared__ u64 buf[DRAW_LISTS * DRAW_TOPK], spare[DRAW_LISTS / 2 * DRAW_TOPK], pair[2 * DRAW_TOPK];
    __shared__ bool last;
    int r = blockIdx.y;
    if (r >= meta[1]) return;
    int n = lpn[r];
    if (n < 0) return;
    const float* l = logits + (u64)r * vocab;
    int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab), chunks = gridDim.x;
    int ngroups = (chunks + DRAW_GROUP - 1) / DRAW_GROUP;
    u64* cb = cands + (u64)r * chunks * DRAW_TOPK;
    double2* pr = part + (u64)r * chunks;
    float mx = NEG_INF;
    for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) mx = fmaxf(mx, l[i]); // NaN left out
    mx = block_max(mx);
    double sum = 0.0;
    if (mx > NEG_INF)
        for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) sum += (double)prob_of(l[i], mx, 1.0);
    sum = block_sum(sum);
    if (n > 0) topk_chunk(buf, spare, l, lo, hi, n, cb + (u64)blockIdx.x * DRAW_TOPK);
    if (threadIdx.x == 0) pr[blockIdx.x] = make_double2((double)mx, sum);
    __threadfence(); // the chunk's sum and keys are visible before the count says so
    __syncthreads();
    // The last of a group's chunks to finish (counted in groups, left at 0
    // again) merges the group's sums and lists into its first chunk's.
    int g = blockIdx.x / DRAW_GROUP, g0 = g * DRAW_GROUP, ng = min(DRAW_GROUP, chunks - g0);
    if (threadIdx.x == 0) last = atomicAdd(&groups[(u64)r * ngroups + g], 1u) == (unsigned)ng - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (ng > 1) {
        double2 gs = lse_merge(pr + g0, ng, 1);
        if (n > 0) group_merge(buf, spare, cb, g0, ng, n);
        if (threadIdx.x == 0) pr[g0] = gs;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        groups[(u64)r * ngroups + g] = 0;
        last = atomicAdd(&done[r], 1u) == (unsigned)ngroups - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double2 rs = lse_merge(pr, ngroups, DRAW_GROUP);
    if (n > 0) topk_merge(buf, spare, pair, cb, ngroups, DRAW_GROUP, n);
    lp_rec* o = rec + 2 * r + (int)(step[r] & 1);
    for (int i = threadIdx.x; i < n; i += DRAW_THREADS) {
        u64 key = pair[i];
        o->ids[i] = key ? key_id(key) : -1;
        o->vals[i] = key ? l[key_id(key)] : 0.f;
    }
    if (threadIdx.x == 0) {
        int k = 0;
        while (k < n && pair[k]) k++;
        o->n = k;
        float m = (float)rs.x;
        o->lse = m > NEG_INF && m < -NEG_INF ? rs.x + log(rs.y) : rs.x;
        done[r] = 0;
    }
}

// logprob_end: block r (one warp) of a row that asks for log-probabilities
// writes its drawn token's (ids[r]) raw logit into the row's record (the
// draw has advanced step[r]): the logit itself, or where adjust changed
// it, the value adjust saved (a biased token's before its bias, else a
// penalised one's before its penalty).
extern "C" __global__ __launch_bounds__(32) void logprob_end(const float* logits, const int* meta, const int* lpn,
        const int* ids, const int* blen, const int* wsize, const int2* saved, const u64* step, lp_rec* rec, int vocab) {
    int r = blockIdx.x;
    if (r >= meta[1] || lpn[r] < 0) return;
    int id = ids[r];
    float raw = NEG_INF;
    if (id >= 0) {
        raw = logits[(u64)r * vocab + id];
        const int2* sv = saved + (u64)r * SAVED;
        float vb = 0.f, vw = 0.f;
        bool inb = false, inw = false;
        for (int j = threadIdx.x; j < blen[r]; j += 32)
            if (sv[j].x == id) vb = __int_as_float(sv[j].y), inb = true;
        if (wsize[r] > 0)
            for (int j = threadIdx.x, nw = sv[MAX_BIAS + PEN_WINDOW].x; j < nw; j += 32)
                if (sv[MAX_BIAS + j].x == id) vw = __int_as_float(sv[MAX_BIAS + j].y), inw = true;
        // One lane at most finds the token among the biases (distinct
        // tokens), one among the window's saved places; the bias's value
        // is the raw one where both hold it (the penalty saw the biased
        // logit).
        unsigned b = __ballot_sync(0xffffffffu, inb), w = __ballot_sync(0xffffffffu, inw);
        vb = __shfl_sync(0xffffffffu, vb, b ? __ffs(b) - 1 : 0);
        vw = __shfl_sync(0xffffffffu, vw, w ? __ffs(w) - 1 : 0);
        if (b) raw = vb;
        else if (w) raw = vw;
    }
    if (threadIdx.x == 0) rec[2 * r + (int)((step[r] - 1) & 1)].drawn = raw;
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
// host again, so for them these writes are dead. A nucleus row (top-p or
// min-p without a top-k) follows nucleus_max and nucleus_pass: its blocks
// take only the tokens above the cut in st[r] (and its ties when all are
// kept) and not below min-p; the last block adds the ties kept otherwise.
// A row with a penalty window (wsize[r] > 0) gains its draw in the window
// (win, a ring of wsize[r] from wnext[r], wlen[r] long), as its history
// gains the token fed next.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void draw(float2* part, u64* cands, const float* logits,
        const float* temp, const int* topk, const float* topp, const float* minp, const u64* seed, u64* step,
        const int* meta, int vocab, int chunk, int* out, unsigned* done, unsigned* groups, int* tokens, int* pos, int* host,
        const nucleus* st, const int* wsize, int* wlen, int* wnext, int* win) {
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
            group_merge(buf, spare, cb, g0, n, k);
            __threadfence();
        }
        if (threadIdx.x == 0) groups[(u64)r * ngroups + g] = 0;
        __syncthreads();
    } else {
        float best = NEG_INF, mx = 0.f, mp = minp[r];
        int id = -1;
        bool cut, nuc = nucleus_row(t, topk[r], topp[r], mp, &cut), all = true;
        unsigned key = 0;
        double invT = 0.0;
        if (nuc) {
            mx = __ldcg(&st[r].mx), key = __ldcg(&st[r].prefix), all = __ldcg(&st[r].all) != 0;
            invT = __ddiv_rn(1.0, (double)t);
        }
        for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
            float v = l[i];
            if (!(v > NEG_INF)) continue;
            if (nuc) {
                if (cut) {
                    unsigned kk = rank_key(v);
                    if (kk < key || (kk == key && !all)) continue;
                }
                float p = prob_of(v, mx, invT);
                if (p == 0.f || p < mp) continue;
            }
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
        bool cut;
        if (nucleus_row(t, topk[r], topp[r], minp[r], &cut) && cut) {
            nucleus s = st[r];
            if (!s.all) nucleus_ties(l, vocab, s, t, minp[r], skey, &best, &id);
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
        if (int ws = wsize[r]; ws > 0) {
            int at = wnext[r];
            win[(u64)r * PEN_WINDOW + at] = max(id, 0);
            wnext[r] = (at + 1) % ws;
            wlen[r] = min(wlen[r] + 1, ws);
        }
    }
}

// The draw folded into the output product: a one-row decode step whose
// row draws greedily (temperature 0, no bias or penalty) needs no draw
// launch over the logits. The output product's twin (matvec1d_*) takes
// each logit as it stores it into one of FOLD_SLOTS slots by an atomic
// maximum of its cand_key, so that a larger key is a better candidate in
// draw's order (higher logit, then lower id) and 0 is none. Tokens spread
// over the slots by id, each slot in its own 128-byte line, so that the
// atomics of neighbouring rows go to different lines. draw_fold then
// takes the best slot, leaves every slot at 0 again, and ends the step as
// draw does. A one-row top-p or min-p step (outFoldedNucleus) launches the
// same twin: the best slot's logit is then the row's largest, which the
// first nucleus_pass reads instead of nucleus_max's. (Tempered rows are
// not folded: their Gumbel noise, two logarithms in double a row on the
// one lane that stores it, made the product slower than the draw launch
// it saves; docs/performance.md.)

// fold_draw is the epilogue of the output product's twin: token j.
struct fold_draw {
    static constexpr bool on = true;
    u64* slots;
    __device__ __forceinline__ void took(float v, int j) const {
        if (!(v > NEG_INF)) return; // NaN and -Inf are never drawn
        atomicMax((unsigned long long*)&slots[(j & (FOLD_SLOTS - 1)) * FOLD_STRIDE], (unsigned long long)cand_key(v, j));
    }
};

// The twins of matvec.cu's one-row MATVEC kernels of the output product
// (logits.go's logitsTwins): their arguments and then the slots.
#define MATVEC1D(name, T, B)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                                  \
        name(float* out, float* resid, const void* x, const float2* ds, const u8* w, long long rowBytes,         \
             long long dOff, const float* bias, const int* meta, int which, int K, int N, int rpb, u64* slots) { \
        PDL_DEFER_(TRIGGER_MV, (mv_defers<T, 1>()));                                                             \
        matvec<T, 1, B>(out, resid, x, ds, w, rowBytes, dOff, bias, meta, which, K, N, rpb, fold_draw{slots});   \
    }
MATVEC1D(matvec1d_f32, W_F32, MV_BATCH1)
MATVEC1D(matvec1d_f16, W_F16, MV_BATCH1)
MATVEC1D(matvec1d_bf16, W_BF16, MV_BATCH1)
MATVEC1D(matvec1d_q8_0, W_Q8_0, MV1Q_BATCH)
MATVEC1D(matvec1d_q4_0, W_Q4_0, MV1Q_BATCH)

// draw_fold ends a folded draw (one selected row): the best of the slots
// is the row's token, stored where draw stores it, and the step advanced
// as draw advances it. One warp; it waits for the output product.
extern "C" __global__ __launch_bounds__(32) void draw_fold(u64* slots, const int* meta, int* out, int* host,
                                                           int* tokens, int* pos, u64* step) {
    PDL_(false);
    if (meta[1] < 1) return;
    u64 best = 0;
    for (int i = threadIdx.x; i < FOLD_SLOTS; i += 32) {
        u64* p = slots + (u64)i * FOLD_STRIDE;
        best = max(best, *p);
        *p = 0;
    }
    for (int o = 16; o > 0; o >>= 1) best = max(best, shfl_xor64(best, o));
    if (threadIdx.x == 0) {
        int id = best == 0 ? -1 : key_id(best);
        u64 stp = step[0];
        out[0] = id;
        if (host) host[(int)(stp & 1)] = id;
        tokens[0] = max(id, 0);
        pos[0] += 1;
        step[0] = stp + 1;
    }
}
