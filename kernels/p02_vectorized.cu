// Phase 2 — vectorized loads, warp-shuffle reductions, several query rows per CTA.
//
// What changed vs phase 1, and why. Phase 1 gave every query row its own CTA, so every row re-read
// all of K and V, two bytes per load, with the 32 lanes of a warp reading 32 different K rows
// (uncoalesced); and each chunk of 128 keys cost 19 CTA-wide barriers for two shared-memory tree
// reductions (nine each, plus one). Here:
//   - a CTA owns kWarps query rows, one warp per row, and the warps share each K/V tile: the K/V
//     traffic per row drops by kWarps;
//   - the CTA copies a tile of kTileN = 32 keys into shared memory with 16-byte loads (8 halves per
//     thread, consecutive threads on consecutive 16-byte chunks: fully coalesced);
//   - lane j of a warp scores key j of the tile, so the max and the sum are warp reductions with
//     __shfl_xor_sync (5 steps, no shared memory, no barrier);
//   - for P·V, lane l owns output columns l*kColsPerLane..; p_j is broadcast with __shfl_sync.
// The kernel's only CTA barriers are the two __syncthreads in the key loop: two per tile of 32 keys,
// shared by the CTA's kWarps rows (the tile must be loaded before use and used before reload; each
// warp stages its own Q row behind a __syncwarp).
//
// Measured: results/nvidia-h100-80gb-hbm3/p02_vectorized.json and chapter 2.
//
// Knowingly does not support: head dims other than 64 and 128; inputs not aligned to 16 bytes
// (the binding refuses them with a message).
#include <cfloat>

#include "common/dispatch.cuh"
#include "common/launch.cuh"
#include "common/warp_reduce.cuh"

#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif

constexpr int kWarps = NUM_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = 32;  // keys per tile: one per lane
static_assert(kWarps >= 1 && kWarps <= 32, "NUM_WARPS must be in [1, 32]: one query row per warp, "
                                           "at most 1024 threads per CTA");

// A K/V row in shared memory is padded by 8 halves (16 bytes): lanes reading 16-byte chunks of 8
// consecutive rows then hit 8 different bank groups instead of one.
template <int kHeadDim> constexpr int kRowPitch = kHeadDim + 8;

template <typename T, int kHeadDim>
struct SharedStorage {
  T k_tile[kTileN][kRowPitch<kHeadDim>];
  T v_tile[kTileN][kRowPitch<kHeadDim>];
  float q_rows[kWarps][kHeadDim];  // each warp's query row, pre-scaled, in fp32 (read as broadcasts)
};

// Copy rows [first, first + kTileN) of a (S, D) matrix into a padded tile with 16-byte loads;
// rows past `seqlen` are zero-filled so that 0 * p never meets uninitialised memory.
template <typename T, int kHeadDim>
__device__ void load_tile(T (*tile)[kRowPitch<kHeadDim>], const T* base, int64_t row_stride, int first,
                          int seqlen) {
  constexpr int kChunksPerRow = kHeadDim * sizeof(T) / 16;
  for (int chunk = threadIdx.x; chunk < kTileN * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * (16 / sizeof(T));
    uint4 value = make_uint4(0, 0, 0, 0);
    if (first + row < seqlen) value = *reinterpret_cast<const uint4*>(base + (first + row) * row_stride + col);
    *reinterpret_cast<uint4*>(&tile[row][col]) = value;
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_rows_kernel(const FlashParams params) {
  constexpr int kColsPerLane = kHeadDim / 32;  // output columns owned by each lane
  constexpr int kVec = 16 / sizeof(T);         // elements per 16-byte load
  __shared__ __align__(16) SharedStorage<T, kHeadDim> smem;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int row = blockIdx.x * kWarps + warp;
  const bool row_valid = row < params.seqlen_q;
  const int q_row = row_valid ? row : params.seqlen_q - 1;  // idle warps still reach every barrier

  const T* q = row_ptr(static_cast<const T*>(params.q), params.q_strides, batch, head, q_row);
  const T* k = row_ptr(static_cast<const T*>(params.k), params.k_strides, batch, head, 0);
  const T* v = row_ptr(static_cast<const T*>(params.v), params.v_strides, batch, head, 0);

  // Keys this row may see (top-left causal, as SDPA) and keys this CTA must load.
  const int kv_end = params.causal ? min(params.seqlen_k, q_row + 1) : params.seqlen_k;
  const int last_row = min(params.seqlen_q, (blockIdx.x + 1) * kWarps) - 1;
  const int cta_kv_end = params.causal ? min(params.seqlen_k, last_row + 1) : params.seqlen_k;

  for (int d = lane; d < kHeadDim; d += 32) smem.q_rows[warp][d] = to_float(q[d]) * params.scale;
  __syncwarp();

  float row_max = -FLT_MAX, row_sum = 0.f;
  float acc[kColsPerLane] = {};

  for (int tile_start = 0; tile_start < cta_kv_end; tile_start += kTileN) {
    load_tile<T, kHeadDim>(smem.k_tile, k, params.k_strides[2], tile_start, params.seqlen_k);
    load_tile<T, kHeadDim>(smem.v_tile, v, params.v_strides[2], tile_start, params.seqlen_k);
    __syncthreads();

    const int key = tile_start + lane;
    float score = -FLT_MAX;
    if (key < kv_end) {
      score = 0.f;
#pragma unroll
      for (int d = 0; d < kHeadDim; d += kVec) {
        const uint4 packed = *reinterpret_cast<const uint4*>(&smem.k_tile[lane][d]);
        const T* k8 = reinterpret_cast<const T*>(&packed);
#pragma unroll
        for (int i = 0; i < kVec; ++i) score += smem.q_rows[warp][d + i] * to_float(k8[i]);
      }
    }
    const float new_max = fmaxf(row_max, allreduce_max<32>(score));
    const float prob = key < kv_end ? expf(score - new_max) : 0.f;
    const float correction = expf(row_max - new_max);
    row_sum = row_sum * correction + allreduce_sum<32>(prob);
    row_max = new_max;

#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) acc[c] *= correction;
    const int tile_len = min(kTileN, kv_end - tile_start);  // may be <= 0 for a causal row: no-op
    for (int j = 0; j < tile_len; ++j) {
      const float p = __shfl_sync(0xffffffffu, prob, j);
#pragma unroll
      for (int c = 0; c < kColsPerLane; ++c) acc[c] += p * to_float(smem.v_tile[j][lane * kColsPerLane + c]);
    }
    __syncthreads();  // the tiles are overwritten by the next iteration
  }

  if (row_valid) {
    T* o = row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, row);
    const float inv_sum = 1.f / row_sum;
#pragma unroll
    for (int c = 0; c < kColsPerLane; ++c) o[lane * kColsPerLane + c] = from_float<T>(acc[c] * inv_sum);
  }
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? sizeof(SharedStorage<__half, 128>) : sizeof(SharedStorage<__half, 64>);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  const FlashParams& p = *params;
  const dim3 grid((p.seqlen_q + kWarps - 1) / kWarps, p.heads, p.batch);
  return dispatch_dtype_head_dim(p, [&](auto element, auto head_dim) {
    using T = decltype(element);
    return launch_kernel<attention_rows_kernel<T, decltype(head_dim)::value>>(grid, kThreads, 0, stream, p);
  });
}
