// Warp specialisation: warpgroups of one CTA in different roles (a producer issuing TMA copies,
// consumers computing) wait for each other on named barriers and move registers from one role to the
// other with setmaxnreg (PTX ISA, "bar, barrier" and "setmaxnreg").
#pragma once

#include <cstdint>

// Named barriers: 16 per CTA, of which id 0 is __syncthreads'; roles use 1..15. `threads` counts every
// thread that will arrive (a multiple of 32: whole warps, every lane executing the same instruction).

// Waits at barrier `id` until `threads` threads have arrived (this one included); orders their memory
// like __syncthreads does for the whole CTA.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting: a producer tells the consumers that sync on it to go on.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_SPECIFIC__) || \
    defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
// Register reallocation (sm_90a and the later arch-specific targets). A CTA starts with the register
// count ptxas gave the kernel for every thread; a warpgroup that needs few (the producer) lowers its
// count to kRegisters, returning the rest to the CTA's pool, and one that needs many (a consumer)
// raises its count, waiting until the pool holds enough. Every warp of the warpgroup executes the same
// call. kRegisters: 24..256, a multiple of 8.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
#endif
