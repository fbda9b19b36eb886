// cp.async (sm_80+): 16-byte copies from global to shared memory that bypass registers and run
// in the background, in groups the issuing thread can wait for (PTX ISA, "cp.async").
#pragma once

#include <cuda_runtime.h>

#include "common/shared_memory.cuh"

// Copy 16 bytes global -> shared, or write 16 zero bytes when `fill` is false (the src-size
// operand 0 reads nothing, so `src` only has to be a valid address, not a readable row).
// .cg caches in L2 only: K and V tiles are read once per CTA, L1 would not help.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool fill) {
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}

// Close the group of copies this thread issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most `kPending` of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier that follows their waits.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
