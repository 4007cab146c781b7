#pragma once

// Hopper warpgroup MMA (wgmma) for the attention kernels: shared-memory operand descriptors,
// the fence / commit / wait protocol, and the two shapes MLA decode uses. Built only for sm_90a
// (KVPOOL_WGMMA, set by cuda.cmake where the architectures name 90a); elsewhere the wrappers
// trap, and the host side never launches a kernel that calls them.
//
// Operand layouts (PTX ISA, "Shared Memory Matrix Layout"), all with the 128-byte swizzle the
// copy engine writes: rows of 128 bytes (64 16-bit values), the 16-byte pieces of row r stored
// at piece index (i ^ (r % 8)), 8-row atoms of 1024 bytes, every atom 1024-byte aligned.
//  - K-major (A and B of S = Q K^T, A of O = P V): a row per M or N index, K along the row. The
//    descriptor's stride byte offset (SBO) is the distance between 8-row groups (1024 here); a
//    k-step of 16 values advances the start address by 32 bytes inside the row.
//  - MN-major (B of O = P V, "transposed"): a row per K index (token), N (value dims) along the
//    row. The leading byte offset (LBO) is the distance between 64-column slabs, SBO between
//    8-row (8-token) groups.

#include <cstdint>

namespace kvpool::kernels::detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVPOOL_WGMMA_DEVICE 1
#else
#define KVPOOL_WGMMA_DEVICE 0
#endif

// Descriptor of a 128-byte-swizzled operand starting at shared address `addr`.
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t{(addr & 0x3ffffu) >> 4} | uint64_t{(lbo & 0x3ffffu) >> 4} << 16 |
         uint64_t{(sbo & 0x3ffffu) >> 4} << 32 | uint64_t{1} << 62;
}

__device__ __forceinline__ void WgmmaFence() {
#if KVPOOL_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if KVPOOL_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if KVPOOL_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Moves this warpgroup's register budget (per thread; a multiple of 8, 24-256): producers give
// theirs up, consumers take it. Every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegAlloc() {
#if KVPOOL_WGMMA_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegDealloc() {
#if KVPOOL_WGMMA_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma's
// issue or its wait (the asm statements name no registers).
template <int kN>
__device__ __forceinline__ void WgmmaFenceOperands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define KVPOOL_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define KVPOOL_F16(d, i) \
  KVPOOL_F4(d, i), KVPOOL_F4(d, i + 4), KVPOOL_F4(d, i + 8), KVPOOL_F4(d, i + 12)
#define KVPOOL_F64(d, i) \
  KVPOOL_F16(d, i), KVPOOL_F16(d, i + 16), KVPOOL_F16(d, i + 32), KVPOOL_F16(d, i + 48)

// d[64 x 32] (+)= A[64 x 16] B[16 x 32]: both operands K-major in shared memory.
template <bool kBf16>
__device__ __forceinline__ void WgmmaM64N32K16(float (&d)[16], uint64_t a, uint64_t b,
                                               int accumulate) {
#if KVPOOL_WGMMA_DEVICE
#define KVPOOL_WGMMA_N32(T)                                                                       \
  asm volatile(                                                                                   \
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"                                              \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, " \
      "1, 0, 0;\n}\n"                                                                             \
      : KVPOOL_F16(d, 0)                                                                          \
      : "l"(a), "l"(b), "r"(accumulate))
  if constexpr (kBf16) {
    KVPOOL_WGMMA_N32("bf16");
  } else {
    KVPOOL_WGMMA_N32("f16");
  }
#undef KVPOOL_WGMMA_N32
#else
  __trap();
#endif
}

// d[64 x 256] += A[64 x 16] B[16 x 256]: A K-major, B MN-major ("transposed") in shared memory.
template <bool kBf16>
__device__ __forceinline__ void WgmmaM64N256K16TransB(float (&d)[128], uint64_t a, uint64_t b) {
#if KVPOOL_WGMMA_DEVICE
#define KVPOOL_WGMMA_N256(T)                                                                   \
  asm volatile(                                                                                \
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T                                   \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "               \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "       \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "       \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "       \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "       \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "       \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
      "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "   \
      "%125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                     \
      : KVPOOL_F64(d, 0), KVPOOL_F64(d, 64)                                                    \
      : "l"(a), "l"(b), "r"(1))
  if constexpr (kBf16) {
    KVPOOL_WGMMA_N256("bf16");
  } else {
    KVPOOL_WGMMA_N256("f16");
  }
#undef KVPOOL_WGMMA_N256
#else
  __trap();
#endif
}

#undef KVPOOL_F64
#undef KVPOOL_F16
#undef KVPOOL_F4

}  // namespace kvpool::kernels::detail
