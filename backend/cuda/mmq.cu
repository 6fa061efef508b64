// Prefill products by Q8_0 and Q4_0 weights on the int8 tensor cores
// ("mmq"). Compiled after kernels.cu, whose helpers (u8, h2f, pdl, ...)
// they use.
//
// out[r, j] = Σ_b dw[j, b] · da[r, b] · Σ_{i<32} w[j, 32b+i] · q[r, 32b+i]
// (+ bias[j]) for r < meta[which], j < N: the sum ggml and the CPU backend
// compute, int32 dot products per block of 32 scaled into float. q and da
// are the int8 activations of quantize_q8 (or a fused producer), qa [rows,
// K] and ds [rows, K/32] (d, d·Σq); w is a weight in the repacked layout of
// kernels.cu, Q4_0 nibbles unpacked to int8 (n - 8) as they are read. With
// resid set, resid[r, j] += the result too (a fused residual add).
//
// A block computes tiles of MQ_W weight rows by MQ_WARPS_T·8·NT activation
// rows; its 8 warps (4 along the weight rows, 2 along the activations)
// each own 32 weight rows by 8·NT activation rows. K goes in stages of
// two blocks of 32 (64 bytes of Q8_0 quants a row, 32 of Q4_0), ST stages
// in flight through cp.async. Every mma.m16n8k32 covers exactly one quant
// block, so its int32 result is scaled by that block's dw·da at once:
// acc = fma(float(sum), dw·da, acc), block after block, the CPU backend's
// operations in its order, so the two agree to the last bit or nearly.
// Shared rows are 16-byte chunks XOR-swizzled by row so that ldmatrix
// reads 8 rows of one chunk from 8 different bank groups.
#define MQ_W 128
#define MQ_WARPS_W 4
#define MQ_WARPS_T 2
#define MQ_THREADS (32 * MQ_WARPS_W * MQ_WARPS_T)

// ldsm4 is ldmatrix of four 8x8 tiles (sm_75 and newer; mmq runs from
// sm_80, and compiles to nothing before sm_75).
__device__ __forceinline__ void ldsm4(u32 (&r)[4], u32 addr) {
#if __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// mma_s8 is c = a·b for a 16x32 int8 tile a (row-major) and a 32x8 tile b
// (column-major), c 16x8 int32.
__device__ __forceinline__ void mma_s8(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    c[0] = c[1] = c[2] = c[3] = 0;
#endif
}

// mmq computes the tiles of one launch; NT is the mma columns (8
// activation rows each) of a warp (BT = 16·NT activation rows a tile, at
// least 64), ST the stages in flight.
template <int T, int NT, int ST>
__device__ __forceinline__ void mmq(float* out, float* resid, const signed char* qa, const float2* ds, const u8* w,
                                    long long rowBytes, long long dOff, const float* bias, int M, int K, int N) {
    constexpr int BT = MQ_WARPS_T * NT * 8;   // activation rows a tile
    constexpr int WB = T == W_Q4_0 ? 32 : 64; // weight bytes a row a stage
    constexpr int WU = MQ_W * WB / 16 / MQ_THREADS; // weight chunks a thread a stage
    constexpr int AU = BT * 4 / MQ_THREADS;         // activation chunks a thread a stage
    static_assert(WU >= 1 && AU >= 1, "mmq tile too small for its threads");
    __shared__ __align__(16) u8 sw[ST][MQ_W * WB];
    __shared__ __align__(16) signed char sa[ST][BT * 64];
    __shared__ float swd[ST][2][MQ_W];             // weight scales [block][row]
    __shared__ __align__(16) float sad[ST][2][BT]; // activation scales d [block][row]

    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    int wr0 = (warp % MQ_WARPS_W) * 32, wt0 = (warp / MQ_WARPS_W) * NT * 8;
    int nb = K >> 5, nkt = (nb + 1) >> 1;
    int ntW = (N + MQ_W - 1) / MQ_W, ntT = (M + BT - 1) / BT;
    const u16* wd = (const u16*)(w + dOff);

    // What this thread copies each stage, fixed for the kernel: weight
    // chunks (Q8_0: rows tid/4 + 64u, chunk tid%4; Q4_0: row tid/2, chunk
    // tid%2), activation chunks (rows tid/4 + 64u, chunk tid%4), one
    // activation scale (threads below 2·BT: row tid%BT, block tid/BT) and
    // one weight scale (row tid/2, block tid%2). A chunk's block within
    // the stage is wc or ac; the last stage of an odd block count has
    // only block 0.
    int wrow = T == W_Q4_0 ? tid >> 1 : tid >> 2, wcc = T == W_Q4_0 ? tid & 1 : tid & 3;
    int wc = T == W_Q4_0 ? wcc : wcc >> 1;
    u32 wdst = smem_addr(&sw[0][wrow * WB + ((T == W_Q4_0 ? wcc ^ ((wrow >> 2) & 1) : wcc ^ ((wrow >> 1) & 3)) << 4)]);
    int arow = tid >> 2, acc4 = tid & 3, ac = acc4 >> 1;
    u32 adst = smem_addr(&sa[0][arow * 64 + ((acc4 ^ ((arow >> 1) & 3)) << 4)]);
    int drow = tid % BT, dkb = tid / BT;
    u32 ddst = smem_addr(&sad[0][dkb][drow]);
    int srow = tid >> 1, skb = tid & 1;
    // Per-lane ldmatrix offsets within a stage: weight rows of m-tile i
    // (Q8_0: chunk 2·kb + lane/16; Q4_0: chunk lane/16), activation rows
    // of n-tile pair jp (chunk 2·kb + lane/8%2).
    u32 sw0 = smem_addr(&sw[0][0]), sa0 = smem_addr(&sa[0][0]);
    u32 woff[2][2], aoff[NT / 2][2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = wr0 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kb = 0; kb < 2; kb++) {
            if constexpr (T == W_Q4_0)
                woff[i][kb] = row * 32 + (((lane >> 4) ^ ((row >> 2) & 1)) << 4);
            else
                woff[i][kb] = row * 64 + (((2 * kb + (lane >> 4)) ^ ((row >> 1) & 3)) << 4);
        }
    }
#pragma unroll
    for (int jp = 0; jp < NT / 2; jp++) {
        int t = wt0 + jp * 16 + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
        for (int kb = 0; kb < 2; kb++) aoff[jp][kb] = t * 64 + (((2 * kb + ((lane >> 3) & 1)) ^ ((t >> 1) & 3)) << 4);
    }

    for (int tile = blockIdx.x; tile < ntW * ntT; tile += gridDim.x) {
        int n0 = (tile / ntT) * MQ_W, m0 = (tile % ntT) * BT;
        const u8* wsrc[WU];
        bool wok[WU];
#pragma unroll
        for (int u = 0; u < WU; u++) {
            int j = n0 + wrow + u * (MQ_THREADS * 16 / WB);
            wok[u] = j < N;
            wsrc[u] = w + (u64)(wok[u] ? j : 0) * rowBytes + wcc * 16;
        }
        const signed char* asrc[AU];
        bool aok[AU];
#pragma unroll
        for (int u = 0; u < AU; u++) {
            int r = m0 + arow + u * (MQ_THREADS / 4);
            aok[u] = r < M;
            asrc[u] = qa + (u64)(aok[u] ? r : 0) * K + acc4 * 16;
        }
        bool dok = tid < 2 * BT && m0 + drow < M;
        const float* dsrc = (const float*)(ds + (u64)(dok ? m0 + drow : 0) * nb + dkb);
        bool sok = n0 + srow < N;
        const u16* ssrc = wd + (u64)(sok ? n0 + srow : 0) * nb + skb;

        // load issues stage kt's copies into buffer s (zeros past N, M, K).
        auto load = [&](int kt, int s) {
#pragma unroll
            for (int u = 0; u < WU; u++)
                cp_async16(wdst + s * (MQ_W * WB) + u * (MQ_THREADS * 16 / WB) * WB, wsrc[u] + kt * WB,
                           wok[u] && 2 * kt + wc < nb);
#pragma unroll
            for (int u = 0; u < AU; u++)
                cp_async16(adst + s * (BT * 64) + u * (MQ_THREADS / 4) * 64, asrc[u] + kt * 64, aok[u] && 2 * kt + ac < nb);
            if (tid < 2 * BT) cp_async4(ddst + s * (2 * BT * 4), dsrc + 4 * kt, dok && 2 * kt + dkb < nb);
        };
        auto wscale = [&](int kt) -> u16 { return sok && 2 * kt + skb < nb ? ssrc[2 * kt] : (u16)0; };

        acc_t acc[2][NT][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

#pragma unroll
        for (int s = 0; s < ST - 1; s++) {
            if (s < nkt) {
                load(s, s);
                swd[s][skb][srow] = h2f(wscale(s));
            }
            cp_async_commit();
        }

        int s = 0, sn = ST - 1;
        for (int kt = 0; kt < nkt; kt++) {
            cp_async_wait<ST - 2>();
            __syncthreads();
            int nx = kt + ST - 1;
            u16 wsn = 0;
            if (nx < nkt) {
                load(nx, sn);
                wsn = wscale(nx);
            }
            cp_async_commit();

            u32 wbase = sw0 + s * (MQ_W * WB), abase = sa0 + s * (BT * 64);
            u32 x4[2][4]; // Q4_0: both blocks' packed quants of the warp's two m-tiles
            if constexpr (T == W_Q4_0) {
#pragma unroll
                for (int i = 0; i < 2; i++) ldsm4(x4[i], wbase + woff[i][0]);
            }
#pragma unroll
            for (int kb = 0; kb < 2; kb++) {
                u32 a[2][4];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if constexpr (T == W_Q4_0) {
                        a[i][0] = nib_lo(x4[i][2 * kb]);
                        a[i][1] = nib_lo(x4[i][2 * kb + 1]);
                        a[i][2] = nib_hi(x4[i][2 * kb]);
                        a[i][3] = nib_hi(x4[i][2 * kb + 1]);
                    } else {
                        ldsm4(a[i], wbase + woff[i][kb]);
                    }
                }
                u32 b[NT][2];
#pragma unroll
                for (int jp = 0; jp < NT / 2; jp++) {
                    u32 r[4];
                    ldsm4(r, abase + aoff[jp][kb]);
                    b[2 * jp][0] = r[0];
                    b[2 * jp][1] = r[1];
                    b[2 * jp + 1][0] = r[2];
                    b[2 * jp + 1][1] = r[3];
                }
                float dw[2][2];
                float2 da[NT];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    dw[i][0] = swd[s][kb][wr0 + i * 16 + g];
                    dw[i][1] = swd[s][kb][wr0 + i * 16 + g + 8];
                }
#pragma unroll
                for (int j = 0; j < NT; j++) da[j] = *(const float2*)&sad[s][kb][wt0 + j * 8 + tig * 2];
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        int c[4];
                        mma_s8(c, a[i], b[j][0], b[j][1]);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float sc = dw[i][e >> 1] * (e & 1 ? da[j].y : da[j].x);
#if WEFT_EXACT
                            acc[i][j][e] += (double)c[e] * (double)sc; // exact product
#else
                            acc[i][j][e] = fmaf((float)c[e], sc, acc[i][j][e]);
#endif
                        }
                    }
            }
            if (nx < nkt) swd[sn][skb][srow] = h2f(wsn);
            s = s == ST - 1 ? 0 : s + 1;
            sn = sn == ST - 1 ? 0 : sn + 1;
        }
        cp_async_wait<0>();
        __syncthreads();

#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int j = n0 + wr0 + i * 16 + g + h * 8;
                if (j >= N) continue;
                float bj = bias ? bias[j] : 0.f;
#pragma unroll
                for (int jt = 0; jt < NT; jt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int r = m0 + wt0 + jt * 8 + tig * 2 + e;
                        if (r >= M) continue;
                        u64 at = (u64)r * N + j;
                        float v = (float)acc[i][jt][h * 2 + e] + bj;
                        out[at] = v;
                        if (resid) resid[at] += v;
                    }
            }
    }
}

// Launch: MQ_THREADS threads, a grid of any size (blocks loop over the
// tiles). Tiles of 64 activation rows, 2 blocks a multiprocessor (one
// under WEFT_EXACT, whose float64 accumulators need twice the registers).
#if WEFT_EXACT
#define MQ_MINB 1
#else
#define MQ_MINB 2
#endif
#define MMQ(name, T)                                                                                                   \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS, MQ_MINB)                                                  \
        name(float* out, float* resid, const signed char* qa, const float2* ds, const u8* w, long long rowBytes,      \
             long long dOff, const float* bias, const int* meta, int which, int K, int N) {                           \
        PDL;                                                                                                         \
        mmq<T, 4, 3>(out, resid, qa, ds, w, rowBytes, dOff, bias, meta[which], K, N);                                  \
    }
MMQ(mmq_q8_0, W_Q8_0)
MMQ(mmq_q4_0, W_Q4_0)
