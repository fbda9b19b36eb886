// Writing one row of an accumulator held in the tensor-core fragment layout (common/mma.cuh's C layout, and
// wgmma's per warp): lane t of a quad holds columns 8c + 2t and 8c + 2t + 1 of every 8-column chunk c.
#pragma once

#include <cstdint>

// The row at `row` (nullptr: past the end; that lane only joins the shuffles), kChunks chunks, word(c) this
// lane's two columns of chunk c packed into 32 bits. Every lane of the warp calls it with the same kChunks.
// kWide: the quad transposes its words 4 chunks at a time, in two rounds of shuffles (partners 1 apart, then
// 2), and each lane stores one whole chunk, 16 bytes: a warp's store covers 64 contiguous bytes of each of its
// 8 rows, whole 32-byte sectors, with a quarter of the store instructions (rows must be 16-byte aligned).
// Otherwise two columns per store, 4 bytes: half a sector per row, and four times the instructions.
template <bool kWide, int kChunks, typename T, typename Word>
__device__ __forceinline__ void store_fragment_row(T* row, int t, Word word) {
  if constexpr (kWide) {
    static_assert(kChunks % 4 == 0, "a quad stores 4 chunks at a time");
    const bool odd = t & 1, high = t & 2;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      uint32_t w[4] = {word(4 * k), word(4 * k + 1), word(4 * k + 2), word(4 * k + 3)};
      // round 1, partner t ^ 1: even lanes give their odd chunks' words and take the partner's even ones
      uint32_t r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
      uint32_t r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
      if (odd) { w[0] = r0; w[2] = r1; } else { w[1] = r0; w[3] = r1; }
      // round 2, partner t ^ 2: the same for pairs of chunks
      r0 = __shfl_xor_sync(0xffffffffu, high ? w[0] : w[2], 2);
      r1 = __shfl_xor_sync(0xffffffffu, high ? w[1] : w[3], 2);
      if (high) { w[0] = r0; w[1] = r1; } else { w[2] = r0; w[3] = r1; }
      // w now holds chunk 4k + t: lanes 0..3's words in column order
      if (row) *reinterpret_cast<uint4*>(row + (4 * k + t) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else if (row) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) *reinterpret_cast<uint32_t*>(row + c * 8 + 2 * t) = word(c);
  }
}
