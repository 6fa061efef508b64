// weft's CUDA kernels, compiled at run time by NVRTC (no headers: every
// helper used here is a compiler builtin) as one program: this file, then
// matvec.cu, attention.cu, matvec_k.cu, mmq.cu and sample.cu (nvrtc.go's
// kernelSource). The Go side (plan.go) chooses the launch
// shapes and the argument order, which must match the signatures.
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
// Q4_1 and Q5_1 on the device (convert.go's q8Affine): int8 levels (0..31)
// like Q8_0's, and per block of 32 an f16 scale d and min m next to each
// other (a u32: d low, m high), x = d·q + m.
#define W_Q8_A 5
// The K-quants (matvec_k.cu, whose header describes their device layout).
#define W_Q4_K 10
#define W_Q5_K 11
#define W_Q6_K 12
// Q2_K, its levels as nibbles in Q4_K's order (kquant.go's repackQ2K), its
// 16 scale bytes (4-bit scale, 4-bit min a 16 elements) the header, d and
// dmin a u32 after the headers.
#define W_Q2_K 13
// IQ4_XS, its 4-bit codebook indices in Q4_K's order (kquant.go's
// repackIQ4XS), the header d (f16) and the 8 scales ls - 32 as int8.
#define W_IQ4_XS 14

// k_type: T is a K-quant (super-blocks of 256, matvec_k.cu).
template <int T>
__device__ __forceinline__ constexpr bool k_type() {
    return T >= W_Q4_K && T <= W_IQ4_XS;
}

// int8_act: T's products take int8 activations (quantize_q8's records).
template <int T>
__device__ __forceinline__ constexpr bool int8_act() {
    return T == W_Q8_0 || T == W_Q4_0 || T == W_Q8_A;
}

// scale_words: u16 words of scales a block of 32 (Q8_A: d and m).
template <int T>
__device__ __forceinline__ constexpr int scale_words() {
    return T == W_Q8_A ? 2 : 1;
}

// WEFT_EXACT (1: WEFT_CUDA_EXACT=1, nvrtc.go) compiles the kernels to the
// CPU backend's exact contract (backend/cpu/exact.go): every sum that is
// rounded is taken in float64 (acc_t) over terms exact in float64 and
// rounded to float32 once, where it is stored; norms, RoPE (from float64
// inverse frequencies, freq_t), the GLU's activation, the soft-caps and
// the attention's softmax in float64. The result then does not depend on
// the order of the sums (lanes, warps, splits), and agrees with the CPU's
// exact level bit for bit but for values within a few float64 ulps of a
// float32 rounding boundary. Without it (0) the kernels sum in float32.
#ifndef WEFT_EXACT
#define WEFT_EXACT 0
#endif
#if WEFT_EXACT
typedef double acc_t;
typedef double freq_t;
#else
typedef float acc_t;
typedef float freq_t;
#endif

// K_A32 (1 but under WEFT_EXACT; plan.go's kA32): the K-quant products
// (matvec_k.cu) read the int8 activations every other quantized product
// reads, quantize_q8's records (a scale d and d·Σq a block of 32, as
// llama.cpp's CUDA products read q8_1), so that the norms, the attention
// and the GLU quantize for them as for Q4_0 and the gate and up products
// fuse with the GLU. 0: ggml's Q8_K records (a scale a 256, level sums a
// 16), those of the CPU backend's K-quant products, which its exact
// contract needs (WEFT_CUDA_KACT=q8k keeps them for comparisons).
#if WEFT_EXACT
#undef K_A32
#define K_A32 0
#elif !defined(K_A32)
#define K_A32 1
#endif

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

// Key/value cache elements: float32, or IEEE half (u16) for an f16 cache,
// rounded to nearest even as they are stored. The kernels that touch a
// cache are templates on its element type with a float32 entry point and
// an f16 one (name_h).
__device__ __forceinline__ float cld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float cld(const u16* p, u64 i) { return h2f(p[i]); }
__device__ __forceinline__ void cst(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void cst(u16* p, u64 i, float v) { p[i] = f2h(v); }
// cld4 loads elements i..i+3 (i a multiple of 4).
__device__ __forceinline__ float4 cld4(const float* p, u64 i) { return *(const float4*)(p + i); }
__device__ __forceinline__ float4 cld4(const u16* p, u64 i) {
    uint2 u = *(const uint2*)(p + i);
    return make_float4(h2f((u16)(u.x & 0xffff)), h2f((u16)(u.x >> 16)), h2f((u16)(u.y & 0xffff)), h2f((u16)(u.y >> 16)));
}

// pdl opens every kernel (through PDL, below; the products that defer it
// call it through pdl_late once their first weight loads are issued,
// matvec.cu's MV_EARLY): launched with programmatic
// stream serialization (as graph replays are, on sm_90 and newer) a kernel
// may start before the one before it has finished; it waits here until
// that one's writes are visible, then (trigger) lets the next kernel start
// launching in turn. Without the trigger the next kernel's blocks are
// placed only as this kernel's blocks leave.
//
// With first set the kernel lets the next one launch before it waits (the
// _first twins of the norms and rope_store, plan.go's triggerFirst): the
// next kernel's own wait still waits for this one to finish, so this only
// moves where its blocks are placed.
__device__ __forceinline__ void pdl(bool trigger, bool first = false) {
#if __CUDA_ARCH__ >= 900
    if (trigger && first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (trigger && !first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Kernel classes whose blocks do not trigger the next launch early, for
// comparisons (WEFT_CUDA_LATE=all,glu,mv,attn defines WEFT_LATE_*; nvrtc.go):
// TRIGGER_GLU for the GLU kernels, TRIGGER_MV for the other products
// (K-quants included), PDL_ATTN for the decode attention, PDL for the
// rest.
#ifndef WEFT_LATE_ALL
#define WEFT_LATE_ALL 0
#endif
#ifndef WEFT_LATE_GLU
#define WEFT_LATE_GLU 0
#endif
#ifndef WEFT_LATE_MV
#define WEFT_LATE_MV 0
#endif
#ifndef WEFT_LATE_ATTN
#define WEFT_LATE_ATTN 0
#endif
#define PDL PDL_(!WEFT_LATE_ALL)
#define PDL_GLU PDL_(TRIGGER_GLU)
#define PDL_MV PDL_(TRIGGER_MV)
#define PDL_ATTN PDL_(!(WEFT_LATE_ALL || WEFT_LATE_ATTN))
#define PDL_AT(first) PDL_FIRST_(!WEFT_LATE_ALL, first)
#define TRIGGER_MV (!(WEFT_LATE_ALL || WEFT_LATE_MV))
#define TRIGGER_GLU (!(WEFT_LATE_ALL || WEFT_LATE_GLU))

// Block tracing, a measuring aid (WEFT_CUDA_TRACE=1 compiles the module
// with WEFT_TRACE; trace.go): thread 0 of every block writes one record of
// four words to weft_trace: the launch's %gridid, the %globaltimer
// reading before the dependency wait, the one after it, and the
// multiprocessor (top 8 bits) with the reading when thread 0 leaves the
// kernel. Without WEFT_TRACE, PDL_ is pdl and nothing else.
#ifdef WEFT_TRACE
__device__ u64* weft_trace;
__device__ unsigned weft_trace_cap, weft_trace_n;
__device__ __forceinline__ u64 gtime() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Thread 0's release time and record, kept where a kernel that waits
// later (pdl_late) finds them.
__shared__ u64 weft_t0_s;
__shared__ u64* weft_rec_s;
// trace_waited writes thread 0's record once it has waited.
__device__ __forceinline__ void trace_waited() {
    if (threadIdx.x + threadIdx.y + threadIdx.z != 0 || weft_trace == nullptr) return;
    unsigned i = atomicAdd(&weft_trace_n, 1u);
    if (i >= weft_trace_cap) return;
    u64 grid;
    unsigned sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    u64* rec = weft_trace + 4ull * i;
    rec[0] = grid;
    rec[1] = weft_t0_s;
    rec[2] = gtime();
    rec[3] = (u64)sm << 56;
    weft_rec_s = rec;
}
struct pdl_scope {
    __device__ __forceinline__ pdl_scope(bool trigger, bool defer = false, bool first = false) {
        if (threadIdx.x + threadIdx.y + threadIdx.z == 0) {
            weft_t0_s = gtime();
            weft_rec_s = nullptr;
        }
        if (defer) return;
        pdl(trigger, first);
        trace_waited();
    }
    __device__ __forceinline__ ~pdl_scope() {
        if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && weft_rec_s) weft_rec_s[3] |= gtime() & ((1ull << 56) - 1);
    }
};
#define PDL_(trigger) pdl_scope pdl_scope_(trigger)
#define PDL_DEFER_(trigger, defer) pdl_scope pdl_scope_(trigger, defer)
#define PDL_FIRST_(trigger, first) pdl_scope pdl_scope_(trigger, false, first)
__device__ __forceinline__ void pdl_late(bool trigger) {
    pdl(trigger);
    trace_waited();
}
// PHASE(i): thread 0 of block (0, 0) records %globaltimer as phase i of
// its kernel in weft_phase (the decode attention's, trace.go).
__device__ u64 weft_phase[8];
#define PHASE(i)                                                                          \
    if (threadIdx.x + threadIdx.y + threadIdx.z + blockIdx.x + blockIdx.y + blockIdx.z == 0) \
        weft_phase[i] = gtime();
#else
#define PDL_(trigger) pdl(trigger)
#define PDL_DEFER_(trigger, defer) \
    if (!(defer)) pdl(trigger)
#define PDL_FIRST_(trigger, first) pdl(trigger, first)
__device__ __forceinline__ void pdl_late(bool trigger) { pdl(trigger); }
#define PHASE(i)
#endif

// smem_addr is p's address in the shared window, as ldmatrix and cp.async
// take it.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// cp_async16 copies 16 bytes from global to shared memory, or writes 16
// zeros when ok is false (src is then not read). Before sm_80, whose
// kernels (mmq, attention_split) take other paths, it compiles to a plain
// load and store so that the source still compiles there.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool ok) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
#else
    uint4 v = ok ? *(const uint4*)src : make_uint4(0, 0, 0, 0);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
#endif
}

// cp_async4 is cp_async16 for 4 bytes.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool ok) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
#else
    u32 v = ok ? *(const u32*)src : 0u;
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(dst), "r"(v));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

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
    // package quant's float32(d·q) + m, without contraction
    if (T == W_Q8_A) return __fadd_rn(__fmul_rn(h2f(d[2 * (i >> 5)]), (float)(signed char)row[i]), h2f(d[2 * (i >> 5) + 1]));
    int j = i & 31;
    u8 q = row[(i >> 5) * 16 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return h2f(d[i >> 5]) * (float)(v - 8);
}

// nib_lo / nib_hi are the low / high nibbles of the 4 bytes of v as 4
// int8 values n - 8: (n + 0x78) ^ 0x80 per byte, with no carry between
// bytes.
__device__ __forceinline__ u32 nib_lo(u32 v) { return ((v & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u; }
__device__ __forceinline__ u32 nib_hi(u32 v) { return (((v >> 4) & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#if WEFT_EXACT
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_max(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif

// acc_exp, acc_tanh and acc_max are expf, tanhf and fmaxf on float and
// their float64 forms on double (WEFT_EXACT's acc_t).
__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ float acc_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float acc_max(float a, float b) { return fmaxf(a, b); }
#if WEFT_EXACT
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ double acc_tanh(double x) { return tanh(x); }
__device__ __forceinline__ double acc_max(double a, double b) { return fmax(a, b); }
#endif

// block_sum returns the sum of v over the block to every thread. It
// contains barriers, so every thread of the block must call it.
template <typename F>
__device__ F block_sum(F v) {
    __shared__ F part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? part[lane] : (F)0;
    return warp_sum(v);
}

// sq is x² as an acc_t: exact in float64.
__device__ __forceinline__ acc_t sq(float x) { return (acc_t)x * (acc_t)x; }

// norm_inv is 1/sqrt(ss/n + eps): in float64 under WEFT_EXACT.
__device__ __forceinline__ acc_t norm_inv(acc_t ss, int n, float eps) {
#if WEFT_EXACT
    return 1.0 / sqrt(ss / (double)n + (double)eps);
#else
    return 1.f / sqrtf(ss / (float)n + eps);
#endif
}

// norm_apply is x·inv·w, rounded once to float32 under WEFT_EXACT.
__device__ __forceinline__ float norm_apply(float x, acc_t inv, float w) { return (float)((acc_t)x * inv * (acc_t)w); }

// repack turns n staged blocks of BLOCK bytes (a header of HEAD bytes: an
// f16 scale, or for Q8_A an f16 scale and min; then LEVELS bytes of
// levels) into the device layout: every block's levels in turn, 16-byte
// aligned, and from dOff its header as a u16 or u32 word. One thread per
// block. Q8_0 and Q4_0 blocks are GGUF's (34 and 18 bytes); Q8_A's are
// staged by convert.go's storeQ8A (36: d, m, 32 int8 levels).
template <int BLOCK, int HEAD, int LEVELS>
__device__ __forceinline__ void repack(u8* dst, const u8* src, long long n, long long dOff) {
    PDL;
    u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= (u64)n) return;
    const u8* s = src + b * BLOCK;
    if constexpr (HEAD == 2)
        ((u16*)(dst + dOff))[b] = (u16)(s[0] | (s[1] << 8));
    else
        ((u32*)(dst + dOff))[b] = s[0] | (s[1] << 8) | (s[2] << 16) | ((u32)s[3] << 24);
    u32 w[LEVELS / 4];
#pragma unroll
    for (int k = 0; k < LEVELS / 4; k++)
        w[k] = s[HEAD + 4 * k] | (s[HEAD + 1 + 4 * k] << 8) | (s[HEAD + 2 + 4 * k] << 16) | ((u32)s[HEAD + 3 + 4 * k] << 24);
    uint4* q = (uint4*)(dst + b * LEVELS);
#pragma unroll
    for (int k = 0; k < LEVELS / 16; k++) q[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
}

extern "C" __global__ void repack_q8_0(u8* dst, const u8* src, long long n, long long dOff) { repack<34, 2, 32>(dst, src, n, dOff); }
extern "C" __global__ void repack_q4_0(u8* dst, const u8* src, long long n, long long dOff) { repack<18, 2, 16>(dst, src, n, dOff); }
extern "C" __global__ void repack_q8_a(u8* dst, const u8* src, long long n, long long dOff) { repack<36, 4, 32>(dst, src, n, dOff); }

// embed: out[r, i] = deq(W[token[r]], i) * scale. Grid (ceil(cols/block), rows).
template <int T>
__device__ void embed(float* out, const u8* w, long long rowBytes, long long dOff, const int* meta, const int* tokens,
                      int cols, float scale) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= cols) return;
    u64 t = (u64)tokens[r];
    out[(u64)r * cols + i] = deq<T>(w + t * rowBytes, (const u16*)(w + dOff) + t * (cols >> 5) * scale_words<T>(), i) * scale;
}

#define EMBED(name, T)                                                                                    \
    extern "C" __global__ void name(float* out, const u8* w, long long rowBytes, long long dOff,         \
                                    const int* meta, const int* tokens, int cols, float scale) { PDL;         \
        embed<T>(out, w, rowBytes, dOff, meta, tokens, cols, scale);                                      \
    }
EMBED(embed_f32, W_F32)
EMBED(embed_f16, W_F16)
EMBED(embed_bf16, W_BF16)
EMBED(embed_q8_0, W_Q8_0)
EMBED(embed_q4_0, W_Q4_0)
EMBED(embed_q8_a, W_Q8_A)

// q8_level is lane's element of a block of 32 quantized to int8 the way
// the CPU backend (and ggml on x86) does it: d = max|x|/127, q =
// round-half-even(x * (127/max|x|)). Every lane of the warp calls it.
__device__ __forceinline__ int q8_level(float x, float* d) {
    float amax = warp_max(fabsf(x));
    *d = amax / 127.f;
    float id = amax != 0.f ? 127.f / amax : 0.f;
    return (int)rintf(__fmul_rn(x, id));
}

// q8_store quantizes lane's element v of a block of 32 and stores the
// level at *q and, from lane 0, the block's (d, d*Σq) at *ds. Every lane
// of the warp calls it.
__device__ __forceinline__ void q8_store(float v, signed char* q, float2* ds, int lane) {
    float d;
    int l = q8_level(v, &d);
    *q = (signed char)l;
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) *ds = make_float2(d, d * (float)l);
}

// quantize_q8 quantizes activation rows a [rows, K] (K a multiple of 32)
// in blocks of 32 for the dp4a kernels: qa [rows, K] int8 with x ≈ d*q,
// and ds [rows, K/32] holding (d, d*Σq). One warp per block; grid
// (ceil(K/32/warps), rows).
extern "C" __global__ void quantize_q8(signed char* qa, float2* ds, const float* a, const int* meta, int which, int K) {
    PDL;
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
    PDL;
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (b >= (K >> 5)) return;
    u64 at = (u64)r * K + b * 32 + lane;
    float d;
    int q = q8_level(a[at], &d);
    out[at] = f2h(d * (float)q);
}

// rmsnorm: y = x / sqrt(mean(x²) + eps) * w over each group of `group`
// columns. Grid (cols/group, rows); one block per (group, row). Out may
// be a: every thread reads its elements before the barrier in block_sum
// and then writes only the elements it read.
extern "C" __global__ void rmsnorm(float* out, const float* a, const float* w, const int* meta, int which, int cols,
                                   int group, float eps) {
    PDL;
    int r = blockIdx.y;
    if (r >= meta[which]) return;
    u64 base = (u64)r * cols + (u64)blockIdx.x * group;
    const float* x = a + base;
    float* y = out + base;
    acc_t ss = 0.f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += sq(x[i]);
    ss = block_sum(ss);
    acc_t inv = norm_inv(ss, group, eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) y[i] = norm_apply(x[i], inv, w[i]);
}

// norm_q8_chunk scales lane's 4 elements x (chunk c of the row: elements
// 4c..4c+3) by inv and the norm weights w into y, and quantizes them as
// quantize_q8 does: a block of 32 is the chunks of 8 consecutive lanes,
// so its max and level sum take 3 shuffles, and a warp quantizes 4 blocks
// at once. The levels and scales are those of q8_level (max, d, 127/max
// and the rounding are the same operations on the same values). Every
// lane of the warp calls it; live is false for chunks past the row (whole
// groups of 8 lanes, the row being a multiple of 32).
__device__ __forceinline__ void norm_q8_chunk(float4 x, float4 w, acc_t inv, int c, bool live, float* y,
                                              signed char* qa, float2* ds, int lane) {
    float4 v = make_float4(norm_apply(x.x, inv, w.x), norm_apply(x.y, inv, w.y), norm_apply(x.z, inv, w.z),
                           norm_apply(x.w, inv, w.w));
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    int q0 = (int)rintf(__fmul_rn(v.x, id)), q1 = (int)rintf(__fmul_rn(v.y, id));
    int q2 = (int)rintf(__fmul_rn(v.z, id)), q3 = (int)rintf(__fmul_rn(v.w, id));
    if (live) {
        ((float4*)y)[c] = v;
        ((char4*)qa)[c] = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
    }
    int sum = q0 + q1 + q2 + q3;
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (live && (lane & 7) == 0) ds[c >> 3] = make_float2(d, d * (float)sum);
}

// rmsnorm_q8 is rmsnorm over whole rows (group = cols, a multiple of 32)
// that also quantizes its output as quantize_q8 does, for the product
// that reads it next. Thread t of T takes the 16-byte chunks t, t+T, ...;
// the first NORM_HELD of them stay in registers between the sum and the
// scaling, and their norm weights are loaded before the wait for the
// kernel before (they do not depend on it). T is a multiple of 32, so a
// warp's chunks are 128 consecutive elements: 4 blocks of 32
// (norm_q8_chunk). Grid (1, rows).
//
// With EMB (embed_norm_q8_*) the row is first made as embed<T> makes it:
// token r's embedding row of tab, scaled, stored into a as it is read, so
// that a decode step's embedding and first norm are one launch.
#define NORM_HELD 2
template <int T, bool EMB, bool FIRST = false>
__device__ __forceinline__ void norm_q8_row(float* out, float* a, const float* w, const int* meta, int which, int cols,
                                            float eps, signed char* qa, float2* ds, const u8* tab, long long rowBytes,
                                            long long dOff, const int* tokens, float scale) {
    int lane = threadIdx.x & 31, nt = blockDim.x, nc = cols >> 2;
    const float4* w4 = (const float4*)w;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 wv[NORM_HELD], xv[NORM_HELD];
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * nt;
        wv[t] = c < nc ? w4[c] : zero;
    }
    PDL_AT(FIRST);
    int r = blockIdx.y;
    float4* x = (float4*)(a + (u64)r * cols);
    const u8* row = nullptr;
    const u16* d = nullptr;
    if constexpr (EMB) {
        if (r >= meta[which]) return; // the token of a row past the batch may be anything
        u64 tk = (u64)tokens[r];
        row = tab + tk * rowBytes;
        d = (const u16*)(tab + dOff) + tk * (cols >> 5) * scale_words<T>();
    }
    auto at = [&](int c) -> float4 {
        if constexpr (EMB) {
            int i = 4 * c;
            float4 v = make_float4(deq<T>(row, d, i) * scale, deq<T>(row, d, i + 1) * scale, deq<T>(row, d, i + 2) * scale,
                                   deq<T>(row, d, i + 3) * scale);
            x[c] = v;
            return v;
        } else {
            return x[c];
        }
    };
    // Without EMB the row is loaded before the row count is known (rows
    // past the batch are allocated), so the two loads overlap.
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * nt;
        xv[t] = c < nc ? at(c) : zero;
    }
    if constexpr (!EMB)
        if (r >= meta[which]) return;
    acc_t ss = 0.f;
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) ss += sq(xv[t].x) + sq(xv[t].y) + sq(xv[t].z) + sq(xv[t].w);
    for (int c = threadIdx.x + NORM_HELD * nt; c < nc; c += nt) {
        float4 v = at(c);
        ss += sq(v.x) + sq(v.y) + sq(v.z) + sq(v.w);
    }
    ss = block_sum(ss);
    acc_t inv = norm_inv(ss, cols, eps);
    float* y = out + (u64)r * cols;
    signed char* q = qa + (u64)r * cols;
    float2* dq = ds + (u64)r * (cols >> 5);
    // A warp goes on while any of its lanes has a chunk (c - lane is the
    // warp's first), so that every lane takes part in the shuffles. The
    // chunks past the held ones are read again (with EMB, this thread's
    // own stores).
#pragma unroll
    for (int t = 0; t < NORM_HELD; t++) {
        int c = threadIdx.x + t * nt;
        if (c - lane >= nc) break;
        norm_q8_chunk(xv[t], wv[t], inv, c, c < nc, y, q, dq, lane);
    }
    for (int c = threadIdx.x + NORM_HELD * nt; c - lane < nc; c += nt) {
        bool live = c < nc;
        norm_q8_chunk(live ? x[c] : zero, live ? w4[c] : zero, inv, c, live, y, q, dq, lane);
    }
}

// rmsnorm_q8_first lets the next launch start before it waits (pdl's
// first).
#define RMSNORM_Q8(name, FIRST)                                                                                    \
    extern "C" __global__ void name(float* out, const float* a, const float* w, const int* meta, int which, int cols, \
                                    int group, float eps, signed char* qa, float2* ds) {                            \
        norm_q8_row<0, false, FIRST>(out, (float*)a, w, meta, which, cols, eps, qa, ds, nullptr, 0, 0, nullptr, 1.f); \
    }
RMSNORM_Q8(rmsnorm_q8, false)
RMSNORM_Q8(rmsnorm_q8_first, true)

// embed_norm_q8_*: embed_* into x, then rmsnorm_q8 of x (plan: fuseEmbedNorm).
#define EMBED_NORM_Q8(name, T)                                                                                     \
    extern "C" __global__ void name(float* x, const u8* tab, long long rowBytes, long long dOff, const int* tokens, \
                                    float scale, float* out, const float* w, const int* meta, int which, int cols,  \
                                    int group, float eps, signed char* qa, float2* ds) {                            \
        norm_q8_row<T, true>(out, x, w, meta, which, cols, eps, qa, ds, tab, rowBytes, dOff, tokens, scale);      \
    }
EMBED_NORM_Q8(embed_norm_q8_f32, W_F32)
EMBED_NORM_Q8(embed_norm_q8_f16, W_F16)
EMBED_NORM_Q8(embed_norm_q8_bf16, W_BF16)
EMBED_NORM_Q8(embed_norm_q8_q8_0, W_Q8_0)
EMBED_NORM_Q8(embed_norm_q8_q4_0, W_Q4_0)
EMBED_NORM_Q8(embed_norm_q8_q8_a, W_Q8_A)

// rope rotates x [rows, nheads*hd] in place: the first 2*half dims of each
// head, pairs (2i, 2i+1) (interleaved) or (i, i+half) (neox), by angle
// pos * invfreq[i]. Grid (1, rows).
// rope_angle sets the cosine c and sine s of the angle p·f (p the
// position): in float32, or under WEFT_EXACT the float32 roundings of the
// float64 ones (as the CPU backend's tables).
__device__ __forceinline__ void rope_angle(freq_t p, freq_t f, float* s, float* c) {
#if WEFT_EXACT
    double sd, cd;
    sincos(p * f, &sd, &cd);
    *s = (float)sd;
    *c = (float)cd;
#else
    sincosf(p * f, s, c);
#endif
}

// rope_rot rotates (x0, x1) by the angle of cosine c and sine s: under
// WEFT_EXACT each result is the float64 expression rounded once (its
// products are exact, so contraction cannot change it).
__device__ __forceinline__ void rope_rot(float x0, float x1, float c, float s, float* y0, float* y1) {
    *y0 = (float)((acc_t)x0 * (acc_t)c - (acc_t)x1 * (acc_t)s);
    *y1 = (float)((acc_t)x0 * (acc_t)s + (acc_t)x1 * (acc_t)c);
}

extern "C" __global__ void rope(float* x, const freq_t* invfreq, const int* meta, const int* pos, int nheads, int hd,
                                int half, int neox) {
    PDL;
    int r = blockIdx.y;
    if (r >= meta[0]) return;
    freq_t p = (freq_t)pos[r];
    float* xr = x + (u64)r * nheads * hd;
    for (int t = threadIdx.x; t < nheads * half; t += blockDim.x) {
        int h = t / half, i = t - h * half;
        float s, c;
        rope_angle(p, invfreq[i], &s, &c);
        int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float* v = xr + h * hd;
        float x0 = v[ia], x1 = v[ib], y0, y1;
        rope_rot(x0, x1, c, s, &y0, &y1);
        v[ia] = y0;
        v[ib] = y1;
    }
}

// rope_store is rope of q [rows, nq*hd] and of k [rows, nkv*hd] by one
// table, then store_kv of k and v: the three ops of a layer's attention
// input in one launch. One block per (head, row), q heads first; a k
// head's block also stores that head's rotated keys and its values. Grid
// (nq+nkv, rows). Thread t takes pair t (elements t and t+half, or 2t and
// 2t+1) and, in a k head's block, element t of the values and of the keys
// past the rotated ones. meta, pos and slots are written by the host
// before the graph starts and the table is constant, so they are read and
// the first angles taken before the dependency wait; after it, one round
// trip loads what the thread writes. Heads wider than the block loop for
// the rest.
// rope_pair_store rotates the pair (x0, x1) of elements ia and ib by the
// angle of cosine c and sine s into x and, where kd is set, the cache.
template <typename C>
__device__ __forceinline__ void rope_pair_store(float* x, C* kd, int ia, int ib, float x0, float x1, float c, float s) {
    float y0, y1;
    rope_rot(x0, x1, c, s, &y0, &y1);
    x[ia] = y0;
    x[ib] = y1;
    if (kd) {
        cst(kd, ia, y0);
        cst(kd, ib, y1);
    }
}

template <typename C, bool FIRST>
__device__ __forceinline__ void rope_store_t(float* q, float* k, const float* v, C* kc, C* vc, const freq_t* invfreq,
                                             const int* meta, const int* pos, const int* slots, int nq, int nkv,
                                             int hd, int half, int neox, int cap) {
    int h = blockIdx.x, r = blockIdx.y, t = threadIdx.x, T = blockDim.x;
    int n = meta[0], pr = pos[r], slot = slots[r]; // one round trip for the three (pos and slots hold MaxRows)
    freq_t p = (freq_t)pr;
    float s0 = 0.f, c0 = 1.f;
    if (t < half) rope_angle(p, invfreq[t], &s0, &c0);
    PDL_AT(FIRST);
    if (r >= n) return;
    int kvdim = nkv * hd;
    bool isk = h >= nq;
    float* x = !isk ? q + (u64)r * nq * hd + h * hd : k + (u64)r * kvdim + (h - nq) * hd;
    const float* vs = v + (u64)r * kvdim + (isk ? h - nq : 0) * hd;
    u64 at = ((u64)slot * cap + pr % cap) * kvdim + (u64)(isk ? h - nq : 0) * hd;
    C* kd = kc + at;
    C* vd = vc + at;
    bool pair = t < half, elem = isk && t < hd, tail = elem && t >= 2 * half;
    int ia = neox ? t : 2 * t, ib = neox ? t + half : 2 * t + 1;
    float x0 = 0.f, x1 = 0.f, ve = 0.f, xe = 0.f;
    if (pair) {
        x0 = x[ia];
        x1 = x[ib];
    }
    if (elem) ve = vs[t];
    if (tail) xe = x[t];
    if (pair) rope_pair_store(x, isk ? kd : nullptr, ia, ib, x0, x1, c0, s0);
    if (elem) cst(vd, t, ve);
    if (tail) cst(kd, t, xe);
    for (int i = t + T; i < half; i += T) {
        float s, c;
        rope_angle(p, invfreq[i], &s, &c);
        int ja = neox ? i : 2 * i, jb = neox ? i + half : 2 * i + 1;
        rope_pair_store(x, isk ? kd : nullptr, ja, jb, x[ja], x[jb], c, s);
    }
    if (isk)
        for (int i = t + T; i < hd; i += T) {
            cst(vd, i, vs[i]);
            if (i >= 2 * half) cst(kd, i, x[i]);
        }
}

#define ROPE_STORE(name, C, FIRST)                                                                            \
    extern "C" __global__ void name(float* q, float* k, const float* v, C* kc, C* vc, const freq_t* invfreq,    \
                                    const int* meta, const int* pos, const int* slots, int nq, int nkv, int hd, \
                                    int half, int neox, int cap) {                                              \
        rope_store_t<C, FIRST>(q, k, v, kc, vc, invfreq, meta, pos, slots, nq, nkv, hd, half, neox, cap);       \
    }
ROPE_STORE(rope_store, float, false)
ROPE_STORE(rope_store_h, u16, false)
// The _first twins let the next launch start before they wait.
ROPE_STORE(rope_store_first, float, true)
ROPE_STORE(rope_store_first_h, u16, true)

// store_kv copies row r of k and v [rows, d] into the caches [slots, cap, d]
// at (slot[r], pos[r] % cap). Grid (ceil(d/block), rows).
template <typename C>
__device__ __forceinline__ void store_kv_t(C* kc, C* vc, const float* k, const float* v, const int* meta,
                                           const int* pos, const int* slots, int d, int cap) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[0] || i >= d) return;
    u64 at = ((u64)slots[r] * cap + pos[r] % cap) * d + i;
    cst(kc, at, k[(u64)r * d + i]);
    cst(vc, at, v[(u64)r * d + i]);
}

#define STORE_KV(name, C)                                                                                       \
    extern "C" __global__ void name(C* kc, C* vc, const float* k, const float* v, const int* meta, const int* pos, \
                                    const int* slots, int d, int cap) {                                           \
        store_kv_t<C>(kc, vc, k, v, meta, pos, slots, d, cap);                                                    \
    }
STORE_KV(store_kv, float)
STORE_KV(store_kv_h, u16)

// Elementwise ops over [meta[which], cols]. Grid (ceil(cols/block), rows).
extern "C" __global__ void add(float* out, const float* a, const float* b, const int* meta, int which, int cols) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    out[at] = a[at] + b[at];
}

// glu: out = act(a) * b, act 0 = SiLU, 1 = GELU (tanh approximation).
// Under WEFT_EXACT in float64, rounded once.
__device__ __forceinline__ float glu_value(float x, float y, int act) {
#if WEFT_EXACT
    double v = x, g;
    if (act == 1)
        g = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    else
        g = v / (1 + exp(-v));
    return (float)(g * (double)y);
#else
    float g;
    if (act == 1)
        g = 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    else
        g = x / (1.f + expf(-x));
    return g * y;
#endif
}

extern "C" __global__ void glu(float* out, const float* a, const float* b, const int* meta, int which, int cols,
                               int act) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    out[at] = glu_value(a[at], b[at], act);
}

// glu_q8 is glu that also quantizes its output as quantize_q8 does (cols a
// multiple of 32, so each warp covers whole blocks).
extern "C" __global__ void glu_q8(float* out, const float* a, const float* b, const int* meta, int which, int cols,
                                  int act, signed char* qa, float2* ds) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
    float v = glu_value(a[at], b[at], act);
    out[at] = v;
    q8_store(v, qa + at, ds + (at >> 5), threadIdx.x & 31);
}

extern "C" __global__ void softcap(float* out, const float* a, const int* meta, int which, int cols, float cap) {
    PDL;
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= meta[which] || i >= cols) return;
    u64 at = (u64)r * cols + i;
#if WEFT_EXACT
    out[at] = (float)((double)cap * tanh((double)a[at] / (double)cap));
#else
    out[at] = cap * tanhf(a[at] / cap);
#endif
}

// gather: out[s] = a[selected[s]] for s < meta[1]. Grid (ceil(cols/block), rows).
extern "C" __global__ void gather(float* out, const float* a, const int* meta, const int* selected, int cols) {
    PDL;
    int s = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= meta[1] || i >= cols) return;
    out[(u64)s * cols + i] = a[(u64)selected[s] * cols + i];
}
