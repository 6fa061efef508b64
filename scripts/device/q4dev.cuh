// q4dev.cuh: the device helpers the standalone device benchmarks share
// (mvbench.cu, layerbench.cu): Q4_0 dot products over int8 activations,
// read-only weight loads, programmatic dependent launch, acquire loads,
// and the mbarrier / bulk-copy (TMA) primitives. Compiled with nvcc on the
// device (sm_90a); included by path from the benchmarks' folder.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(u16 h) { float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ int dp4a(int a, int b, int c) { int d; asm("{ dp4a.s32.s32 %0, %1, %2, %3; }" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }
__device__ __forceinline__ u32 nib_lo(u32 v) { return ((v & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u; }
__device__ __forceinline__ u32 nib_hi(u32 v) { return (((v >> 4) & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u; }
__device__ __forceinline__ float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
__device__ __forceinline__ float warp_max(float v) { for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }
// ldw loads 16 bytes of weights, read-only and not kept in L1.
__device__ __forceinline__ uint4 ldw(const u8* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// q4dot is a Q4_0 chunk's 32 nibbles (16 bytes, low nibbles first) against
// 32 int8 activations.
__device__ __forceinline__ int q4dot(uint4 q, const int4* x) {
    int4 x0 = x[0], x1 = x[1];
    int dot = dp4a((int)nib_lo(q.x), x0.x, 0);
    dot = dp4a((int)nib_lo(q.y), x0.y, dot);
    dot = dp4a((int)nib_lo(q.z), x0.z, dot);
    dot = dp4a((int)nib_lo(q.w), x0.w, dot);
    dot = dp4a((int)nib_hi(q.x), x1.x, dot);
    dot = dp4a((int)nib_hi(q.y), x1.y, dot);
    dot = dp4a((int)nib_hi(q.z), x1.z, dot);
    dot = dp4a((int)nib_hi(q.w), x1.w, dot);
    return dot;
}

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(n)); }
__device__ __forceinline__ void mbar_expect(u64* b, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }" ::"r"(smem_addr(b)), "r"(parity)
        : "memory");
}
