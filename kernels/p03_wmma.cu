// Phase 3 — the first tensor-core kernel: 32x32 tiles, WMMA 16x16x16, FP16 P, correct.
//
// What changed vs phase 2, and why. Phase 2 still scores one key per lane with scalar FMAs. Here a
// CTA of 4 warps owns kBlockM = 32 query rows and walks the keys in tiles of kBlockN = 32, and both
// matrix products run on tensor cores through nvcuda::wmma (16x16x16 fp16 -> fp32):
//   S (32x32, fp32, smem)  = Q (32xD) · Kᵀ (Dx32)     warp w computes the 16x16 tile (w/2, w%2)
//   online softmax per row in fp32, P written as fp16  4 threads per row, quad shuffles
//   O (32xD, fp32, smem)  += P (32x32) · V (32xD)     warp w owns rows 16*(w/2), cols (w%2)+2i
// The output accumulator lives in shared memory in a layout *we* chose (row-major), so the
// per-row rescale by exp(m_old - m_new) is a plain loop; WMMA fragments are only ever loaded from
// and stored to that buffer, never indexed (their element order is unspecified).
// Two more things it needs to beat phase 2 (the first correct version, without them, was slower
// than phase 2 at the mission shape):
//   - every shared-memory row padded by 16 bytes: unpadded 128-byte rows put the 16 rows of a WMMA
//     load in one bank; the padded D = 128 tiles need 49 KB, so the kernel uses dynamic shared
//     memory with the opt-in attribute;
//   - the next K/V tile's global loads are issued into registers before this tile's math and
//     stored to shared memory after it, so their latency overlaps the two matrix products.
//
// The original project's 32x32 kernel never became correct (its errors: book/intro.md). Its bug
// classes, and how this file avoids them:
//   - padding loops that used a padded row stride over an unpadded layout (overwriting real Q/V
//     rows) with no barrier: tiles here are padded by 16 bytes per row, and every access (stores,
//     WMMA leading dimensions, the softmax) goes through the one pitch kPitch; no loop writes the
//     padding, rows past the sequence end are zero-filled by the load itself, and every phase of
//     the loop is separated by __syncthreads;
//   - store_matrix_sync overwriting the output accumulator each KV tile: O is loaded into the
//     accumulator fragment, P·V is added, and the sum stored back;
//   - atomics on partial sums / a warp grid covering half the output: each O element belongs to
//     exactly one warp's fragment, no atomics;
//   - fragment elements indexed as if row-major: never done.
//
// Measured: the three steps, each recorded on the H100 before the next was made, in
// results/nvidia-h100-80gb-hbm3/: history/p03_wmma-c5a4155.json (correct, unpadded),
// history/p03_wmma-a0240e8.json (+ padded rows) and p03_wmma.json (+ register prefetch: this
// file); chapter 3 compares them.
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
  __half probs[kBlockM][kPitch<kBlockN, __half>];   // P = exp(scale*S - m), the A operand of P·V
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
      wmma::load_matrix_sync(a, &smem.probs[tile_m][kk], kPitch<kBlockN, __half>);
      wmma::load_matrix_sync(b, &smem.v_tile[kk][tile_n], kPitch<kHeadDim, __half>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&smem.out[tile_m][tile_n], acc, kPitch<kHeadDim, float>, wmma::mem_row_major);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_wmma_kernel(const FlashParams params) {
  // Dynamic shared memory: with padding, the D = 128 tiles need 49 KB, past the 48 KB static limit.
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
      smem.probs[my_row][quarter * kColsPerThread + c] = __float2half_rn(p);
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
  return launch_kernel<attention_wmma_kernel<kHeadDim>>(grid, kThreads, sizeof(SharedStorage<kHeadDim>), stream, p);
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
