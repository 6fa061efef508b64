// Token draws on the device: each selected row's next token by the
// Gumbel-max trick, argmax_i logits[i]/T + g_i (the argmax of the logits
// when T is 0), so that a decode step copies one int per row to the host
// instead of the logits. The noise is package sample's counter-based
// Gumbel noise, a pure function of (seed, step, token); the arithmetic is
// sample.SampleGumbel's: the division and the addition rounded to float32,
// the logarithms in double, ties to the lowest id, NaN and -Inf never
// drawn. One launch: a block takes the best of one vocabulary chunk, the
// last block of a row the best of the row's chunks.

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

// draw: block (c, r) takes the best candidate of logits row r ([selected
// rows, vocab]) within chunk c ([c*chunk, (c+1)*chunk)) into
// part[r*chunks + c] (float score, int id); temp, seed and step are row
// r's draw. The last of row r's blocks to finish (counted in done[r],
// which it leaves at 0 again) takes the best of the row's chunks, in chunk
// order, into out[r] (-1 when every logit was NaN or -Inf), and where host
// is set (page-locked host memory mapped for the device) into
// host[2r + step & 1] as well, so that no copy need follow: two steps in
// flight keep their draws apart. It also readies
// meta for the step after a decode batch's (backend.Pipeliner's
// IssueNext): row r is fed its draw (token 0 where there was none; the
// host reports that step's error), one position further, with its draw's
// step one further. Every other run stages meta and the steps from the
// host again, so for them these writes are dead.
extern "C" __global__ __launch_bounds__(DRAW_THREADS) void draw(float2* part, const float* logits,
        const float* temp, const u64* seed, u64* step, const int* meta, int vocab, int chunk,
        int* out, unsigned* done, int* tokens, int* pos, int* host) {
    int r = blockIdx.y;
    if (r >= meta[1]) return;
    const float* l = logits + (u64)r * vocab;
    float t = temp[r];
    u64 stp = step[r];
    u64 skey = mix64(mix64(seed[r] + GUMBEL_GAMMA) + (stp + 1) * GUMBEL_GAMMA);
    int lo = blockIdx.x * chunk, hi = min(lo + chunk, vocab);
    float best = NEG_INF;
    int id = -1;
    for (int i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
        float v = l[i];
        if (!(v > NEG_INF)) continue;
        float s = v;
        if (t > 0.0f) {
            u64 h = mix64(skey + (u64)(i + 1) * GUMBEL_GAMMA);
            double u = ((double)(h >> 11) + 0.5) * 0x1p-53;
            s = __fadd_rn(__fdiv_rn(v, t), (float)(-log(-log(u))));
        }
        if (better(s, i, best, id)) { best = s; id = i; }
    }
    block_best(&best, &id);
    int chunks = gridDim.x;
    __shared__ bool last;
    if (threadIdx.x == 0) {
        part[(u64)r * chunks + blockIdx.x] = make_float2(best, __int_as_float(id));
        __threadfence(); // the partial is visible before the count says so
        last = atomicAdd(&done[r], 1u) == (unsigned)chunks - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = NEG_INF;
    id = -1;
    for (int c = threadIdx.x; c < chunks; c += DRAW_THREADS) {
        float2 p = __ldcg(&part[(u64)r * chunks + c]);
        int pid = __float_as_int(p.y);
        if (better(p.x, pid, best, id)) { best = p.x; id = pid; }
    }
    block_best(&best, &id);
    if (threadIdx.x == 0) {
        out[r] = id;
        if (host) host[2 * r + (int)(stp & 1)] = id;
        tokens[r] = max(id, 0);
        pos[r] += 1;
        step[r] += 1;
        done[r] = 0;
    }
}
