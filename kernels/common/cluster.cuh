// Thread-block clusters (sm_90): CTAs launched together on one GPC, which can read each other's
// shared memory ("distributed shared memory") and wait for each other at a hardware barrier
// (PTX ISA, "barrier.cluster", "mapa", "ld.shared::cluster"). The host half launches a kernel
// with a cluster shape chosen at run time.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/shared_memory.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// How many CTAs its cluster has.
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t size;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(size));
  return size;
}

// Arrive at the cluster barrier; release: this thread's earlier memory accesses (shared memory of
// any CTA of the cluster included) happen before whatever the others do after their wait.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }

// Arrive without ordering memory: only says "this CTA is running". A CTA's shared memory may be
// written by others only after it has started, so a kernel arrives like this first, and waits before
// its first remote access.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// Wait until every thread of every CTA of the cluster has arrived; acquire: their accesses before
// arriving are visible after this.
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// The shared::cluster address of `pointer`'s counterpart in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t cluster_map(const void* pointer, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(pointer)), "r"(rank));
  return remote;
}

// Stores to a shared::cluster address, in this CTA's shared memory or another's. They do not wait
// for the remote CTA: a cluster barrier (cluster_arrive's release) orders them before the readers.
__device__ __forceinline__ void cluster_store_float2(uint32_t address, float x, float y) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1,%2};\n" ::"r"(address), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ void cluster_store_float(uint32_t address, float x) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(address), "f"(x) : "memory");
}
#endif

struct ClusterLaunchKey;

// Whether `device` launches clusters (sm_90 and newer), looked up once per device.
static inline cudaError_t device_has_clusters(int device, bool* has) {
  int value = 0;
  const cudaError_t err = cached_per_device<ClusterLaunchKey>(device, &value, [&](int* v) {
    int supported = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device);
    *v = supported ? 2 : 1;   // the cache keeps positive values only
    return e;
  });
  *has = value == 2;
  return err;
}

// Launches kKernel(params) as clusters of `cluster_x` CTAs along x (grid.x a multiple of it), with
// dynamic shared memory opted in once per device like launch_kernel.
template <auto kKernel>
static cudaError_t launch_clustered(dim3 grid, int cluster_x, int threads, size_t smem_bytes, cudaStream_t stream,
                                   const FlashParams& params) {
  if (cluster_x <= 1) return launch_kernel<kKernel>(grid, threads, smem_bytes, stream, params);
  if (grid.x > static_cast<unsigned>(INT_MAX) || grid.x % cluster_x != 0) return cudaErrorInvalidConfiguration;
  if (smem_bytes > 0) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = allow_dynamic_smem<kKernel>(device, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster_x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kKernel, params);
}
