// Reductions across lanes of a warp, with the result in every lane that took part. Every lane of the
// warp must call them (the shuffles name the full mask).
#pragma once

// Over the 4 lanes of a quad, the lanes that share a row in an mma.sync / wgmma accumulator (lanes
// 4g..4g+3 hold row g's columns): partners at distance 1, then 2.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Over each group of kLanes consecutive lanes (a power of two, at most 32), the farthest partner
// first: kLanes / 2, ..., 1. Phase 2 reduces a whole warp (32 lanes), phases 5 and 6 the lanes of a
// query row. (The order fixes the rounding of a sum, so it is not the quad's.)
template <int kLanes>
__device__ __forceinline__ float allreduce_max(float x) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "kLanes: a power of two, at most 32");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <int kLanes>
__device__ __forceinline__ float allreduce_sum(float x) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "kLanes: a power of two, at most 32");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
