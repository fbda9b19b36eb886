// Phase 4 — FP32 P: the probabilities enter P·V at fp32 precision. The controlled experiment.
//
// The original project believed its 32x32 kernel's error (book/intro.md) came from rounding P to
// fp16 and tried to keep P in fp32. Phase 3 is already correct with fp16 P, so this phase exists to
// test that hypothesis properly, one variable at a time:
//   P_FP32 = 1 (default)  P reaches the tensor cores at fp32 precision. The WMMA A operand must be
//                         fp16, so P is stored as an unevaluated sum of two halves, hi = fp16(p)
//                         and lo = fp16(p - hi) (about 22 significant bits), and P·V runs twice:
//                         O += hi·V + lo·V. Same 4 bytes per element as an fp32 buffer.
//                         (Storing fp32 P and converting it to one fp16 buffer before the MMA, as
//                         the original planned, would still feed fp16 P to the product.)
//   P_FP32 = 0            P rounded to fp16 once: phase 3's numerics, in this file.
//   PADDING_BUG = 1       TEACHING VARIANT, WRONG ON PURPOSE: reproduces the original's zero-padding
//                         loop (see teaching_zero_pad_with_wrong_stride). Never use its output.
//
// The shared-memory budget: the second P plane costs kBlockM * kPitch<kBlockN> * 2 bytes; at
// D = 128 the total passes 48 KB, which static __shared__ arrays cannot exceed. Everything lives in
// one dynamic buffer, sized by sizeof(SharedStorage) — the number the binding checks against the
// device's opt-in limit (flashcore_smem_bytes) and the chapter draws — with the opt-in attribute set
// before launch.
//
// Everything else is phase 3 unchanged (32x32 tiles, 4 warps, padded rows, register prefetch).
//
// Measured, in results/nvidia-h100-80gb-hbm3/: the error and time of both P_FP32 settings,
// experiments/p04_precision.json; this file's default, p04_fp32p.json; chapter 4.
//
// Knowingly does not support: bf16 (WMMA bf16 needs sm_80; phase 7 adds it); head dims other
// than 64 and 128; inputs not aligned to 16 bytes.
#include <cfloat>

#include <mma.h>

#include "common/launch.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/warp_reduce.cuh"

using namespace nvcuda;

#ifndef P_FP32
#define P_FP32 1
#endif
#ifndef PADDING_BUG
#define PADDING_BUG 0
#endif
static_assert(P_FP32 == 0 || P_FP32 == 1, "P_FP32 is 0 (fp16 P) or 1 (P as hi + lo halves)");
static_assert(PADDING_BUG == 0 || PADDING_BUG == 1, "PADDING_BUG is 0 or 1 (the teaching variant)");
constexpr int kPPlanes = P_FP32 ? 2 : 1;   // P = plane 0 (+ plane 1)

constexpr int kBlockM = 32;   // query rows per CTA
constexpr int kBlockN = 32;   // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWmma = 16;     // m = n = k of one WMMA operation
static_assert(kThreads == kBlockM * 4, "the softmax gives each query row a quad of 4 threads");

// Every row is padded by 16 bytes (8 halves, 4 floats). Unpadded, a row of 64 halves is 128 bytes,
// so the 16 rows a WMMA load touches — and the 8 rows a softmax warp reads — all start in the same
// shared-memory bank and serialise. The padding is used by *every* access through one pitch
// constant; the original project's bug was padding loops written with one stride over a layout
// that used another.
template <int kCols, typename T> constexpr int kPitch = kCols + 16 / sizeof(T);

template <int kHeadDim>
struct SharedStorage {
  __half q_tile[kBlockM][kPitch<kHeadDim, __half>];
  __half k_tile[kBlockN][kPitch<kHeadDim, __half>];
  __half v_tile[kBlockN][kPitch<kHeadDim, __half>];
  float scores[kBlockM][kPitch<kBlockN, float>];    // S for the current tile (unscaled)
  __half probs[kPPlanes][kBlockM][kPitch<kBlockN, __half>];  // P = exp(scale*S - m) = hi (+ lo)
  float out[kBlockM][kPitch<kHeadDim, float>];      // O accumulator, unnormalised, across KV tiles
};

// A tile of kRows rows travels global -> registers -> shared memory in two steps, so that the
// global loads of the *next* K/V tile can be in flight while this tile is being computed on.
// Each thread moves kChunks 16-byte chunks; rows past `seqlen` are zero-filled (never left stale:
// 0 * NaN would poison P·V).
template <int kRows, int kHeadDim>
struct TileChunks {
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kChunks = kRows * kChunksPerRow / kThreads;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "tile chunks must split evenly over the threads");
  uint4 chunk[kChunks];

  __device__ void fetch(const __half* base, int64_t row_stride, int first, int seqlen) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int index = threadIdx.x + i * kThreads;
      const int row = index / kChunksPerRow, col = (index % kChunksPerRow) * 8;
      chunk[i] = first + row < seqlen ? *reinterpret_cast<const uint4*>(base + (first + row) * row_stride + col)
                                      : make_uint4(0, 0, 0, 0);
    }
  }

  __device__ void store(__half (*tile)[kPitch<kHeadDim, __half>]) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int index = threadIdx.x + i * kThreads;
      *reinterpret_cast<uint4*>(&tile[index / kChunksPerRow][(index % kChunksPerRow) * 8]) = chunk[i];
    }
  }
};

// S = Q · Kᵀ: warp w computes the 16x16 tile at (w / 2, w % 2).
template <int kHeadDim>
__device__ void compute_scores(SharedStorage<kHeadDim>& smem, int warp) {
  const int tile_m = (warp / 2) * kWmma, tile_n = (warp % 2) * kWmma;
  wmma::fragment<wmma::matrix_a, kWmma, kWmma, kWmma, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, kWmma, kWmma, kWmma, __half, wmma::col_major> b;  // Kᵀ: K row-major
  wmma::fragment<wmma::accumulator, kWmma, kWmma, kWmma, float> acc;
  wmma::fill_fragment(acc, 0.f);
#pragma unroll
  for (int kk = 0; kk < kHeadDim; kk += kWmma) {
    wmma::load_matrix_sync(a, &smem.q_tile[tile_m][kk], kPitch<kHeadDim, __half>);
    wmma::load_matrix_sync(b, &smem.k_tile[tile_n][kk], kPitch<kHeadDim, __half>);
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(&smem.scores[tile_m][tile_n], acc, kPitch<kBlockN, float>, wmma::mem_row_major);
}

// O += P · V for the output tiles this warp owns: rows 16 * (w / 2), column tiles (w % 2) + 2i.
// With two P planes this is O += hi·V + lo·V: the fp32 accumulator adds the small lo products
// to the large hi products, so P's low bits survive.
template <int kHeadDim>
__device__ void accumulate_pv(SharedStorage<kHeadDim>& smem, int warp) {
  const int tile_m = (warp / 2) * kWmma;
  wmma::fragment<wmma::matrix_a, kWmma, kWmma, kWmma, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, kWmma, kWmma, kWmma, __half, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, kWmma, kWmma, kWmma, float> acc;
#pragma unroll
  for (int tile_n = (warp % 2) * kWmma; tile_n < kHeadDim; tile_n += 2 * kWmma) {
    wmma::load_matrix_sync(acc, &smem.out[tile_m][tile_n], kPitch<kHeadDim, float>, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < kBlockN; kk += kWmma) {
      wmma::load_matrix_sync(b, &smem.v_tile[kk][tile_n], kPitch<kHeadDim, __half>);
#pragma unroll
      for (int plane = 0; plane < kPPlanes; ++plane) {
        wmma::load_matrix_sync(a, &smem.probs[plane][tile_m][kk], kPitch<kBlockN, __half>);
        wmma::mma_sync(acc, a, b, acc);
      }
    }
    wmma::store_matrix_sync(&smem.out[tile_m][tile_n], acc, kPitch<kHeadDim, float>, wmma::mem_row_major);
  }
}

#if PADDING_BUG
// TEACHING VARIANT — the original project's bug, reproduced on purpose; the output is wrong.
// Its tiles were stored with a padded row pitch, but the loop meant to zero the padding past the
// last real row started at the *unpadded* end of the data (rows * D) and ran to the end of the
// padded buffer. With pitch 72 and 32 full rows it zeroes from flat index 2048, i.e. the second
// half of row 28 and all of rows 29-31: real query and value rows, in every tile. (The original
// also had no barrier before this loop, so it raced with the loads too; the barrier here makes the
// damage deterministic so the CPU simulation in chapter 4 can reproduce it exactly.)
template <int kRows, int kHeadDim>
__device__ void teaching_zero_pad_with_wrong_stride(__half (*tile)[kPitch<kHeadDim, __half>], int valid_rows) {
  __syncthreads();  // every thread's chunks are stored
  __half* flat = &tile[0][0];
  for (int i = min(valid_rows, kRows) * kHeadDim + threadIdx.x; i < kRows * kPitch<kHeadDim, __half>; i += kThreads)
    flat[i] = __float2half(0.f);
}
#endif

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_fp32p_kernel(const FlashParams params) {
  // Dynamic shared memory: at D = 128 the storage is 51.5 KB, past the 48 KB static limit.
  extern __shared__ __align__(128) unsigned char smem_raw[];
  SharedStorage<kHeadDim>& smem = *reinterpret_cast<SharedStorage<kHeadDim>*>(smem_raw);
  const int warp = threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z, q_start = blockIdx.x * kBlockM;
  // Softmax / epilogue mapping: a quad of 4 consecutive lanes per query row, each owning a quarter
  // of the row's columns.
  const int my_row = threadIdx.x / 4, quarter = threadIdx.x % 4;
  const int query = q_start + my_row;

  const __half* q = row_ptr(static_cast<const __half*>(params.q), params.q_strides, batch, head, 0);
  const __half* k = row_ptr(static_cast<const __half*>(params.k), params.k_strides, batch, head, 0);
  const __half* v = row_ptr(static_cast<const __half*>(params.v), params.v_strides, batch, head, 0);

  // Prologue: Q tile, zeroed O accumulator, first K/V tile in flight.
  TileChunks<kBlockM, kHeadDim> q_chunks;
  q_chunks.fetch(q, params.q_strides[2], q_start, params.seqlen_q);
  q_chunks.store(smem.q_tile);
#if PADDING_BUG
  teaching_zero_pad_with_wrong_stride<kBlockM, kHeadDim>(smem.q_tile, params.seqlen_q - q_start);
#endif
  TileChunks<kBlockN, kHeadDim> k_next, v_next;
  k_next.fetch(k, params.k_strides[2], 0, params.seqlen_k);
  v_next.fetch(v, params.v_strides[2], 0, params.seqlen_k);
  for (int i = threadIdx.x; i < kBlockM * kHeadDim; i += kThreads) smem.out[i / kHeadDim][i % kHeadDim] = 0.f;
  float row_max = -FLT_MAX, row_sum = 0.f;  // identical in the 4 threads of a row's quad

  // Top-left causal: the last query row of this tile sees keys 0..q_start + kBlockM - 1.
  const int kv_end = params.causal ? min(params.seqlen_k, q_start + kBlockM) : params.seqlen_k;
  for (int kv_start = 0; kv_start < kv_end; kv_start += kBlockN) {
    k_next.store(smem.k_tile);
    v_next.store(smem.v_tile);
#if PADDING_BUG
    teaching_zero_pad_with_wrong_stride<kBlockN, kHeadDim>(smem.v_tile, params.seqlen_k - kv_start);
#endif
    __syncthreads();  // Q, K, V tiles (and the zeroed O) are in place
    if (kv_start + kBlockN < kv_end) {  // next tile's loads overlap this tile's math
      k_next.fetch(k, params.k_strides[2], kv_start + kBlockN, params.seqlen_k);
      v_next.fetch(v, params.v_strides[2], kv_start + kBlockN, params.seqlen_k);
    }

    compute_scores(smem, warp);
    __syncthreads();  // S complete

    // Online softmax for row my_row over this tile's 32 keys (8 per thread).
    constexpr int kColsPerThread = kBlockN / 4;
    float s[kColsPerThread];
    float tile_max = -FLT_MAX;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      const int key = kv_start + quarter * kColsPerThread + c;
      const bool visible = key < params.seqlen_k && (!params.causal || key <= query);
      s[c] = visible ? smem.scores[my_row][quarter * kColsPerThread + c] * params.scale : -FLT_MAX;
      tile_max = fmaxf(tile_max, s[c]);
    }
    const float new_max = fmaxf(row_max, quad_max(tile_max));
    float tile_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      const float p = s[c] == -FLT_MAX ? 0.f : expf(s[c] - new_max);
      const __half hi = __float2half_rn(p);
      smem.probs[0][my_row][quarter * kColsPerThread + c] = hi;
      if (kPPlanes == 2) smem.probs[1][my_row][quarter * kColsPerThread + c] = __float2half_rn(p - __half2float(hi));
      tile_sum += p;
    }
    const float correction = expf(row_max - new_max);
    row_sum = row_sum * correction + quad_sum(tile_sum);
    row_max = new_max;
    for (int c = quarter * (kHeadDim / 4); c < (quarter + 1) * (kHeadDim / 4); ++c) smem.out[my_row][c] *= correction;
    __syncthreads();  // P written, O rescaled

    accumulate_pv(smem, warp);
    __syncthreads();  // O updated; tiles may be overwritten
  }

  // Epilogue: normalise and write the rows that exist.
  if (query < params.seqlen_q) {
    __half* o = row_ptr(static_cast<__half*>(params.o), params.o_strides, batch, head, query);
    const float inv_sum = 1.f / row_sum;
    for (int c = quarter * (kHeadDim / 4); c < (quarter + 1) * (kHeadDim / 4); ++c)
      o[c] = __float2half_rn(smem.out[my_row][c] * inv_sum);
  }
}

// Past 48 KB of dynamic shared memory a kernel must opt in: launch_kernel does, once per device.
template <int kHeadDim>
cudaError_t launch(dim3 grid, cudaStream_t stream, const FlashParams& p) {
  return launch_kernel<attention_fp32p_kernel<kHeadDim>>(grid, kThreads, sizeof(SharedStorage<kHeadDim>), stream, p);
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? sizeof(SharedStorage<128>) : sizeof(SharedStorage<64>);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  const FlashParams& p = *params;
  if (p.dtype != kFloat16) return cudaErrorInvalidValue;
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads, p.batch);
  if (p.head_dim == 64) return launch<64>(grid, stream, p);
  if (p.head_dim == 128) return launch<128>(grid, stream, p);
  return cudaErrorInvalidValue;
}
