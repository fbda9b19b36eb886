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

#define FC_WGMMA_D8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),        \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FC_WGMMA_M64N64K16_RS(TYPE)                                                                    \
  asm volatile(                                                                                       \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %38, 0;\n"                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE "\n"                                \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"                                \
      "{%32, %33, %34, %35}, %36, accumulate, 1, 1, %37;\n}\n"                                        \
      : FC_WGMMA_D8(0), FC_WGMMA_D8(8), FC_WGMMA_D8(16), FC_WGMMA_D8(24)                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "n"(kTransposeB), "r"(accumulate))

// D (64x64) = A (64x16, registers) · B (16x64, shared memory) + (accumulate ? D : 0), fp32 accumulate.
// kTransposeB = 0: B's rows in shared memory are its columns (K-major: Kᵀ from K's rows);
// kTransposeB = 1: they are its rows (MN-major: V as stored).
template <typename T, int kTransposeB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b_descriptor,
                                                int accumulate) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 only");
  if constexpr (std::is_same_v<T, __half>) {
    FC_WGMMA_M64N64K16_RS("f16");
  } else {
    FC_WGMMA_M64N64K16_RS("bf16");
  }
}
#undef FC_WGMMA_M64N64K16_RS
#undef FC_WGMMA_D8

#define FC_WGMMA_M64N8K16_RS(TYPE)                                                                     \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %9, 0;\n"                          \
               "wgmma.mma_async.sync.aligned.m64n8k16.f32." TYPE "." TYPE                               \
               " {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, accumulate, 1, 1, 0;\n}\n"                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor), "r"(1))

// D (64x8) += A (64x16, registers) · B (16x8, shared memory, K-major), fp32 accumulate.
template <typename T>
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], const uint32_t (&a)[4], uint64_t b_descriptor) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 only");
  if constexpr (std::is_same_v<T, __half>) {
    FC_WGMMA_M64N8K16_RS("f16");
  } else {
    FC_WGMMA_M64N8K16_RS("bf16");
  }
}
#undef FC_WGMMA_M64N8K16_RS
