// TMA, Hopper's tensor memory accelerator (PTX ISA, "cp.async.bulk.tensor"): one thread asks for a
// whole box of a tensor, and the copy engine moves it between global and shared memory on its own,
// filling rows outside the tensor with zeros on the way in and dropping them on the way out. The box
// is described once, on the host, by a CUtensorMap; loads complete on an mbarrier (mbarrier.cuh),
// stores in bulk groups the issuing thread waits for.
//
// The host half gets the driver's cuTensorMapEncodeTiled through the runtime's entry-point query, so
// nothing links libcuda: the kernels' shared libraries keep depending on the CUDA runtime alone.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "common/params.cuh"
#include "common/shared_memory.cuh"

// --- host: the tensor map -------------------------------------------------------------------------

// The driver's cuTensorMapEncodeTiled (12.0 ABI), looked up once; `error` says why it is missing.
struct TensorMapEncoder {
  PFN_cuTensorMapEncodeTiled_v12000 encode;
  cudaError_t error;
};

// `static` for the reason given in launch.cuh: each build keeps its own cache.
static TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault,
                                                       &found);
#else
    cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
    if (err == cudaSuccess && (found != cudaDriverEntryPointSuccess || function == nullptr))
      err = cudaErrorSymbolNotFound;
    return TensorMapEncoder{reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function), err};
  }();
  return encoder;
}

// Describes, in `map`, boxes of `box` elements of a fp16 or bf16 tensor at `base` whose `dims` and
// `byte_strides` (of dimensions 1..kRank-1; dimension 0 is contiguous) are given innermost first, as
// TMA counts them: a (B, H, S, D) tensor is {D, S, H, B}. Elements outside `dims` load as zeros and
// are not stored. `swizzle_128b` lays each box row of 128 bytes out in shared memory with its 16-byte
// chunks XORed by (row % 8), the layout wgmma's 128B-swizzle descriptors read (common/wgmma.cuh); it
// needs box[0] * 2 <= 128 and a 1024-byte aligned shared-memory box. The driver also requires `base`
// and every stride to be multiples of 16 bytes and each box side to be at most 256; it refuses
// anything else, and so does this function, with cudaErrorInvalidValue.
// The map is read by the copy engine from kernel-parameter, constant or global memory: pass it to the
// kernel as a `const __grid_constant__ CUtensorMap` parameter.
template <int kRank>
static cudaError_t make_tensor_map(CUtensorMap* map, FlashDtype dtype, const void* base, const uint64_t (&dims)[kRank],
                                   const uint64_t (&byte_strides)[kRank - 1], const uint32_t (&box)[kRank],
                                   bool swizzle_128b) {
  static_assert(kRank >= 2 && kRank <= 5, "TMA tensors have 2 to 5 dimensions here");
  const TensorMapEncoder encoder = tensor_map_encoder();
  if (encoder.error != cudaSuccess) return encoder.error;
  cuuint32_t element_strides[kRank];
  for (int i = 0; i < kRank; ++i) element_strides[i] = 1;
  const CUresult result = encoder.encode(
      map, dtype == kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, kRank,
      const_cast<void*>(base), dims, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// --- device: the copies (sm_90 and later; see mbarrier.cuh for why elsewhere they are absent) ------

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// Copies the box of `map` whose first element is at `coords` (elements, innermost first) into shared
// memory at `dst`, and completes its bytes on the mbarrier `bar`: mbarrier_arrive_expect_tx with the
// bytes of every copy of the phase comes first. One thread issues it.
template <int kRank>
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, const int (&coords)[kRank]) {
  static_assert(kRank >= 2 && kRank <= 4, "tma_load: 2D, 3D or 4D boxes");
  const uint32_t to = smem_address(dst), barrier = smem_address(bar);
  const uint64_t from = reinterpret_cast<uint64_t>(map);
  if constexpr (kRank == 2) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(to), "l"(from), "r"(barrier), "r"(coords[0]), "r"(coords[1])
                 : "memory");
  } else if constexpr (kRank == 3) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(to), "l"(from), "r"(barrier), "r"(coords[0]),
                 "r"(coords[1]), "r"(coords[2])
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(to), "l"(from), "r"(barrier), "r"(coords[0]),
                 "r"(coords[1]), "r"(coords[2]), "r"(coords[3])
                 : "memory");
  }
}

// Copies the box at `src` in shared memory to `map` at `coords`; elements outside the tensor are not
// written. Whoever wrote `src` calls fence_proxy_async (shared_memory.cuh), then a barrier, before one
// thread issues the store; tma_store_commit and tma_store_wait follow.
template <int kRank>
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, const int (&coords)[kRank]) {
  static_assert(kRank >= 2 && kRank <= 4, "tma_store: 2D, 3D or 4D boxes");
  const uint32_t from = smem_address(src);
  const uint64_t to = reinterpret_cast<uint64_t>(map);
  if constexpr (kRank == 2) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(to), "r"(from),
                 "r"(coords[0]), "r"(coords[1])
                 : "memory");
  } else if constexpr (kRank == 3) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(to),
                 "r"(from), "r"(coords[0]), "r"(coords[1]), "r"(coords[2])
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(to),
                 "r"(from), "r"(coords[0]), "r"(coords[1]), "r"(coords[2]), "r"(coords[3])
                 : "memory");
  }
}

// Closes the group of TMA stores this thread issued since the last commit.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed store groups are still reading shared
// memory: at 0 their boxes may be overwritten, and the CTA may exit.
template <int kPending>
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

#endif
