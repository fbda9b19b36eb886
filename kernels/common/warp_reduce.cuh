// Reductions over the 4 lanes of a quad, the lanes that share a row in an mma.sync / wgmma
// accumulator (lanes 4g..4g+3 hold row g's columns). Every lane of the warp must take part.
#pragma once

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
