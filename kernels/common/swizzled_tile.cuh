// Tiles of D-element rows in shared memory with their 16-byte chunks XOR-swizzled by (row % 8): the 8
// rows one ldmatrix reads at one column land in 8 different bank groups, with no padding. Shared by
// the mma.sync phases (7 and 10): the address arithmetic for ldmatrix, and cp.async copies into them.
#pragma once

#include <cstdint>

#include "common/async_copy.cuh"

// 0 stores rows plainly (chapter 7's ablation measures what the swizzle buys).
#ifndef SWIZZLE
#define SWIZZLE 1
#endif

// Element offset of (row, 16-byte chunk) in a tile of rows of kHeadDim elements, chunks XOR-swizzled
// by the row's low three bits. Needs at least 8 chunks per row (kHeadDim >= 64).
template <int kHeadDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  static_assert(kHeadDim % 64 == 0, "the swizzle permutes 8 chunks of 16 bytes per row");
  return row * kHeadDim + ((SWIZZLE ? chunk ^ (row & 7) : chunk) << 3);
}

// Where one lane's ldmatrix row lies, in bytes from its tile: the lane reads row `row` (whose low
// three bits are the lane's own, every fragment row being lane % 8 plus a multiple of 8) at
// chunk 2c + `half`. As 2c ^ x with x = half ^ (row & 7), the swizzle costs one XOR per chunk pair,
// and moving the row by a multiple of 8 is a constant offset.
template <int kHeadDim, typename T>
struct FragmentRow {
  uint32_t row_bytes;
  uint32_t chunk_xor;
  __device__ __forceinline__ FragmentRow(int row, int half)
      : row_bytes(row * kHeadDim * sizeof(T)), chunk_xor(SWIZZLE ? half ^ (row & 7) : half) {}
  // Byte offset of this lane's row `rows_down` rows further, at chunk pair `pair` (compile-time constants).
  __device__ __forceinline__ uint32_t at(int rows_down, int pair) const {
    return row_bytes + rows_down * kHeadDim * sizeof(T) + (((2 * pair) ^ chunk_xor) << 4);
  }
};

// cp.async a tile of kRows rows starting at row `first` into its swizzled buffer; rows past `seqlen`
// are zero-filled. Each thread copies the same chunk of every kThreads / kChunksPerRow-th row: when
// that row step is a multiple of 8, the swizzle is the same on every pass, and both addresses
// advance by a constant.
template <int kRows, int kHeadDim, int kThreads, typename T>
__device__ __forceinline__ void copy_tile_async(T* tile, const T* base, int64_t row_stride, int first, int seqlen) {
  constexpr int kChunksPerRow = kHeadDim * sizeof(T) / 16, kChunks = kRows * kChunksPerRow;
  constexpr int kPasses = (kChunks + kThreads - 1) / kThreads, kRowStep = kThreads / kChunksPerRow;
  if constexpr (kThreads % (8 * kChunksPerRow) == 0) {
    const int row = threadIdx.x / kChunksPerRow, chunk = threadIdx.x % kChunksPerRow;
    const T* from = base + static_cast<int64_t>(first + row) * row_stride + chunk * 8;
    const int64_t from_step = kRowStep * row_stride;
    T* to = tile + swizzled<kHeadDim>(row, chunk);
    if (first + kRows <= seqlen) {   // every tile but a sequence's last: no row to test
#pragma unroll
      for (int i = 0; i < kPasses; ++i, from += from_step) {
        if (kChunks % kThreads != 0 && i * kThreads + static_cast<int>(threadIdx.x) >= kChunks) break;
        cp_async_16(to + i * kRowStep * kHeadDim, from, true);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPasses; ++i, from += from_step) {
        if (kChunks % kThreads != 0 && i * kThreads + static_cast<int>(threadIdx.x) >= kChunks) break;
        const bool inside = first + row + i * kRowStep < seqlen;
        cp_async_16(to + i * kRowStep * kHeadDim, inside ? from : base, inside);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int index = i * kThreads + threadIdx.x;
      if (kChunks % kThreads != 0 && index >= kChunks) break;
      const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
      const bool inside = first + row < seqlen;
      cp_async_16(tile + swizzled<kHeadDim>(row, chunk), inside ? base + (first + row) * row_stride + chunk * 8 : base,
                  inside);
    }
  }
}
