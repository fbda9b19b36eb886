// Hopper's warpgroup MMA (sm_90a only) through inline PTX (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Instructions").
//
// One wgmma.mma_async is issued by all 128 threads of a warpgroup (4 consecutive warps) and computes
// a 64xN tile: warp w of the group owns rows 16w..16w+15, and inside a warp the layouts are those of
// mma.sync m16n8k16 (common/mma.cuh), repeated along N:
//   D (64xN, fp32), N/2 floats: d[4c + 0..1] = D[g][8c + 2t ..+1]   d[4c + 2..3] = D[g + 8][8c + 2t ..+1]
//   A (64x16 from registers), 4 x .b32: the mma.sync A fragment of the warp's 16 rows
// B always comes from shared memory, through a 64-bit descriptor. The instruction runs asynchronously:
// it is issued, committed as a group, and its registers may be touched only after a wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// Descriptor of an operand stored as 128-byte rows whose 16-byte chunks are XOR-swizzled by
// (row % 8): the "128B swizzle" layout, which the tile's base must start on a 1024-byte boundary for.
// Rows are N (B = Kᵀ, "K-major": the 64 elements of a row are 64 consecutive k) or K (B = V,
// "MN-major", read transposed). 8-row groups lie 1024 bytes apart (the stride field); `leading_bytes`
// is the distance between 64-column blocks along N, which only MN-major operands wider than 64 use.
__device__ __forceinline__ uint64_t smem_descriptor_128b(uint32_t address, uint32_t leading_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(1024 >> 4) << 32 | 1ull << 62;
}

// Byte offset of element (row, col) of a 16-bit tile of `rows` rows in that layout: 64-column blocks
// of 128-byte rows, each block `rows` x 128 bytes, the 16-byte chunks of row r XORed by (r % 8). It is
// also what TMA's 128B swizzle mode writes (common/tma.cuh), one box per 64 columns.
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int row, int col) {
  return (col / 64) * rows * 128 + row * 128 + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Orders this warpgroup's earlier register writes before the wgmma that follows (required whenever
// the accumulators or the A fragments were written by ordinary instructions).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of wgmma instructions issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler does not know an accumulator changes while a wgmma runs: this empty asm, placed
// after the wait, keeps every read of the registers below it.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulators of one wgmma (N / 2 floats), asm operands %0 ... %(N / 2 - 1); A, B and `accumulate` follow.
#define FC_WGMMA_D8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),        \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FC_WGMMA_D32(i) FC_WGMMA_D8(i), FC_WGMMA_D8(i + 8), FC_WGMMA_D8(i + 16), FC_WGMMA_D8(i + 24)
#define FC_WGMMA_ACC32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FC_WGMMA_ACC64 \
  FC_WGMMA_ACC32 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FC_WGMMA_ACC96 \
  FC_WGMMA_ACC64 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FC_WGMMA_ACC128 \
  FC_WGMMA_ACC96 \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// A from registers: TAIL names A's four registers, B's descriptor and kTransposeB; PRED is `accumulate`.
#define FC_WGMMA_RS(SHAPE, TYPE, ACC, TAIL, PRED, ...)                                               \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, " PRED ", 0;\n"                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE "\n{" ACC "},\n" TAIL ";\n}\n" \
               : __VA_ARGS__                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "n"(kTransposeB),  \
                 "r"(accumulate))
// A and B from shared memory, both K-major: TAIL names their descriptors.
#define FC_WGMMA_SS(SHAPE, TYPE, ACC, TAIL, PRED, ...)                                               \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, " PRED ", 0;\n"                \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE "\n{" ACC "},\n" TAIL ";\n}\n" \
               : __VA_ARGS__                                                                      \
               : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate))
// The asm's type is part of its string literal: each wgmma spelled for T = __half ("f16") and __nv_bfloat16.
#define FC_WGMMA_TYPED(WGMMA, SHAPE, ...)       \
  if constexpr (std::is_same_v<T, __half>) {    \
    WGMMA(SHAPE, "f16", __VA_ARGS__);           \
  } else {                                      \
    WGMMA(SHAPE, "bf16", __VA_ARGS__);          \
  }

// D (64xN) = A (64x16, registers) · B (16xN, shared memory) + (accumulate ? D : 0), fp32 accumulate, one
// instruction for N = 8, 64, 128, 192 or 256 (a wider wgmma reads A once for all N columns; N = 8 is phase 9's
// row sums, P·ones).
// kTransposeB = 0: B's rows in shared memory are its columns (K-major: Kᵀ from K's rows);
// kTransposeB = 1: they are its rows (MN-major: V as stored).
template <typename T, int N, int kTransposeB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_descriptor,
                                         int accumulate) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 only");
  static_assert(N == 8 || N == 64 || N == 128 || N == 192 || N == 256, "N = 8, 64, 128, 192 or 256");
  if constexpr (N == 8) {
    FC_WGMMA_TYPED(FC_WGMMA_RS, "m64n8k16", "%0, %1, %2, %3", "{%4, %5, %6, %7}, %8, accumulate, 1, 1, %9", "%10",
                   "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]))
  } else if constexpr (N == 64) {
    FC_WGMMA_TYPED(FC_WGMMA_RS, "m64n64k16", FC_WGMMA_ACC32, "{%32, %33, %34, %35}, %36, accumulate, 1, 1, %37",
                   "%38", FC_WGMMA_D32(0))
  } else if constexpr (N == 128) {
    FC_WGMMA_TYPED(FC_WGMMA_RS, "m64n128k16", FC_WGMMA_ACC64, "{%64, %65, %66, %67}, %68, accumulate, 1, 1, %69",
                   "%70", FC_WGMMA_D32(0), FC_WGMMA_D32(32))
  } else if constexpr (N == 192) {
    FC_WGMMA_TYPED(FC_WGMMA_RS, "m64n192k16", FC_WGMMA_ACC96, "{%96, %97, %98, %99}, %100, accumulate, 1, 1, %101",
                   "%102", FC_WGMMA_D32(0), FC_WGMMA_D32(32), FC_WGMMA_D32(64))
  } else {
    FC_WGMMA_TYPED(FC_WGMMA_RS, "m64n256k16", FC_WGMMA_ACC128,
                   "{%128, %129, %130, %131}, %132, accumulate, 1, 1, %133", "%134", FC_WGMMA_D32(0),
                   FC_WGMMA_D32(32), FC_WGMMA_D32(64), FC_WGMMA_D32(96))
  }
}

// D (64xN) = A (64x16) · B (16xN) + (accumulate ? D : 0), both from shared memory (K-major), fp32 accumulate.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a_descriptor, uint64_t b_descriptor,
                                         int accumulate) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 only");
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "N = 64, 128, 192 or 256");
  if constexpr (N == 64) {
    FC_WGMMA_TYPED(FC_WGMMA_SS, "m64n64k16", FC_WGMMA_ACC32, "%32, %33, accumulate, 1, 1, 0, 0", "%34",
                   FC_WGMMA_D32(0))
  } else if constexpr (N == 128) {
    FC_WGMMA_TYPED(FC_WGMMA_SS, "m64n128k16", FC_WGMMA_ACC64, "%64, %65, accumulate, 1, 1, 0, 0", "%66",
                   FC_WGMMA_D32(0), FC_WGMMA_D32(32))
  } else if constexpr (N == 192) {
    FC_WGMMA_TYPED(FC_WGMMA_SS, "m64n192k16", FC_WGMMA_ACC96, "%96, %97, accumulate, 1, 1, 0, 0", "%98",
                   FC_WGMMA_D32(0), FC_WGMMA_D32(32), FC_WGMMA_D32(64))
  } else {
    FC_WGMMA_TYPED(FC_WGMMA_SS, "m64n256k16", FC_WGMMA_ACC128, "%128, %129, accumulate, 1, 1, 0, 0", "%130",
                   FC_WGMMA_D32(0), FC_WGMMA_D32(32), FC_WGMMA_D32(64), FC_WGMMA_D32(96))
  }
}
#undef FC_WGMMA_TYPED
#undef FC_WGMMA_SS
#undef FC_WGMMA_RS
#undef FC_WGMMA_ACC128
#undef FC_WGMMA_ACC96
#undef FC_WGMMA_ACC64
#undef FC_WGMMA_ACC32
#undef FC_WGMMA_D32
#undef FC_WGMMA_D8
