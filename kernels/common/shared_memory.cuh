// Shared memory as PTX instructions see it: the 32-bit address they take, and (sm_90) the fence that
// lets the async proxy (wgmma, TMA) see what ordinary stores wrote.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

// The 32-bit shared-memory address that ldmatrix, cp.async, mbarrier and TMA instructions take.
__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Makes this thread's earlier writes to shared memory (stores, completed cp.async copies) visible to
// the async proxy, which wgmma and TMA stores read through; a barrier must still follow for the
// other threads' writes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif
