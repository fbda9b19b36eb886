// mbarrier (sm_90): a barrier object in shared memory that counts arrivals and, for TMA, bytes (PTX ISA,
// "Parallel Synchronization and Communication Instructions: mbarrier"). A phase completes when every
// expected arrival has happened and every expected byte has landed; the barrier then starts the next
// phase, and a waiter names the phase it waits for by its parity (0, 1, 0, ...). A producer/consumer
// pipeline keeps two per buffer: "full" (the TMA copies landed) and "empty" (the consumers are done).
//
// Declared only where they compile (sm_90 and later, and the host pass): on an older arch a kernel that
// uses one fails to compile at the call, while merely including this header costs nothing.
#pragma once

#include <cstdint>

#include "common/shared_memory.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// Sets up the barrier at `bar` (8 bytes of shared memory, 8-byte aligned) for `arrivals` arrivals per
// phase. One thread does it; fence_mbarrier_init and a CTA barrier follow before anyone uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// Makes this thread's mbarrier_inits visible to the async proxy (TMA completes its bytes on the barrier)
// and to the other CTAs of a cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives once, with release semantics: this thread's earlier writes are visible to whoever waits for
// the phase (a consumer telling the producer that a buffer is free).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Arrives once and adds `bytes` to the bytes this phase waits for: the producer's call before it issues
// the TMA copies that fill a buffer (their sizes summed).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// True once the phase of parity `phase` has completed, with acquire semantics: the arrivals' writes and
// the bytes TMA delivered are visible. The instruction suspends the thread for a while before giving
// up, so a loop on it does not spin.
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred complete;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
      "selp.u32 %0, 1, 0, complete;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(phase)
      : "memory");
  return done != 0;
}

// Waits until the phase of parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  while (!mbarrier_try_wait(bar, phase)) {
  }
}

// Ends the barrier's life so that its 8 bytes may hold something else; nothing may still wait on it or
// arrive at it.
__device__ __forceinline__ void mbarrier_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

#endif
