// Phase 5 — bigger tiles, chosen at compile time: BLOCK_M x BLOCK_N (default 64x64), NUM_WARPS
// (default 8), and the score buffer reused for the probabilities.
//
// What changed vs phase 4, and why:
//   - P is fp16 again. Chapter 4's experiment (experiments/p04_precision.json) showed fp32 P
//     changes the error by less than the fp16 output rounding, and it costs shared memory and a
//     second P·V.
//   - Tile sizes and warp count are -D defines (the chapter's widget and `flashcore_nb sweep`
//     rebuild with other values); the static_asserts below name every invalid combination.
//     A 64x64 tile does 4x the work of a 32x32 one per K/V tile loaded, and each K/V tile is
//     shared by twice as many query rows: half the K/V traffic per query.
//   - Work is split over the warps by a loop (warp w takes WMMA tiles w, w + NUM_WARPS, ...), so any
//     warp count that passes the asserts covers every S and O tile exactly once.
//   - P overwrites S in place, in the same bytes: row r of P (fp16) lies inside row r of S (fp32).
//     Only the threads of row r read S row r, and they are lanes of one warp, so one __syncwarp
//     between "everyone has read their S" and "write P" is the barrier that separates the two
//     lives of the buffer (temporal separation). A `union` of __shared__ arrays would say the
//     same thing to the compiler with no barrier, and nothing that checks the order.
//
// Everything is in one dynamic shared-memory buffer sized by sizeof(SharedStorage): 64x64 at
// D = 64 needs 61 KB, past the 48 KB static limit; 128x128 at D = 128 needs more than any GPU has,
// and the binding says so before launch.
//
// Measured, in results/nvidia-h100-80gb-hbm3/: this file's defaults, p05_tile64.json; every tile
// configuration, experiments/p05_tile64_sweep.json; chapter 5.
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

#ifndef BLOCK_M
#define BLOCK_M 64
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif

constexpr int kBlockM = BLOCK_M;   // query rows per CTA
constexpr int kBlockN = BLOCK_N;   // keys per tile
constexpr int kWarps = NUM_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kWmma = 16;          // m = n = k of one WMMA operation
static_assert(kBlockM % kWmma == 0 && kBlockN % kWmma == 0 && kBlockM > 0 && kBlockN > 0,
              "BLOCK_M and BLOCK_N must be positive multiples of 16, the WMMA tile");
static_assert(kWarps >= 1 && kThreads <= 1024, "NUM_WARPS must be 1..32 (at most 1024 threads per block)");
static_assert(kThreads % kBlockM == 0,
              "NUM_WARPS * 32 must be a multiple of BLOCK_M: the softmax gives every query row the same "
              "number of threads (at least one)");
// The threads of one row are consecutive lanes of one warp, so row reductions are shuffles.
constexpr int kThreadsPerRow = kThreads / kBlockM;
static_assert(kThreadsPerRow <= 32 && (kThreadsPerRow & (kThreadsPerRow - 1)) == 0,
              "NUM_WARPS * 32 / BLOCK_M (threads per query row) must be a power of two no larger than 32");
static_assert(kBlockN % kThreadsPerRow == 0, "BLOCK_N must split evenly over the threads of a row");

// Every row is padded by 16 bytes against bank conflicts (phase 3); one pitch for every access.
template <int kCols, typename T> constexpr int kPitch = kCols + 16 / sizeof(T);
// P (fp16) is written over S (fp32) with S's row pitch in bytes, i.e. twice as many halves.
constexpr int kProbsPitch = 2 * kPitch<kBlockN, float>;

template <int kHeadDim>
struct SharedStorage {
  __half q_tile[kBlockM][kPitch<kHeadDim, __half>];
  __half k_tile[kBlockN][kPitch<kHeadDim, __half>];
  __half v_tile[kBlockN][kPitch<kHeadDim, __half>];
  float scores[kBlockM][kPitch<kBlockN, float>];  // S for the current tile, then P (fp16) in place
  float out[kBlockM][kPitch<kHeadDim, float>];    // O accumulator, unnormalised, across KV tiles

  __device__ __half* probs() { return reinterpret_cast<__half*>(&scores[0][0]); }
};

// A tile of kRows rows travels global -> registers -> shared memory in two steps, so that the
// global loads of the *next* K/V tile are in flight while this tile is being computed on. Rows
// past `seqlen` are zero-filled (never left stale: 0 * NaN would poison P·V).
template <int kRows, int kHeadDim>
struct TileChunks {
  static constexpr int kChunksPerRow = kHeadDim / 8;   // 16-byte chunks
  static constexpr int kTotal = kRows * kChunksPerRow;
  static constexpr int kChunks = (kTotal + kThreads - 1) / kThreads;
  uint4 chunk[kChunks];

  __device__ void fetch(const __half* base, int64_t row_stride, int first, int seqlen) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int index = threadIdx.x + i * kThreads;
      const int row = index / kChunksPerRow, col = (index % kChunksPerRow) * 8;
      const bool load = index < kTotal && first + row < seqlen;
      chunk[i] = load ? *reinterpret_cast<const uint4*>(base + (first + row) * row_stride + col) : make_uint4(0, 0, 0, 0);
    }
  }

  __device__ void store(__half (*tile)[kPitch<kHeadDim, __half>]) const {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int index = threadIdx.x + i * kThreads;
      if (index < kTotal) *reinterpret_cast<uint4*>(&tile[index / kChunksPerRow][(index % kChunksPerRow) * 8]) = chunk[i];
    }
  }
};

// S = Q · Kᵀ: warp w computes the 16x16 tiles w, w + kWarps, ... of the kBlockM x kBlockN score tile.
template <int kHeadDim>
__device__ void compute_scores(SharedStorage<kHeadDim>& smem, int warp) {
  constexpr int kTilesN = kBlockN / kWmma, kTiles = (kBlockM / kWmma) * kTilesN;
  wmma::fragment<wmma::matrix_a, kWmma, kWmma, kWmma, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, kWmma, kWmma, kWmma, __half, wmma::col_major> b;  // Kᵀ: K row-major
  wmma::fragment<wmma::accumulator, kWmma, kWmma, kWmma, float> acc;
  for (int tile = warp; tile < kTiles; tile += kWarps) {
    const int tile_m = (tile / kTilesN) * kWmma, tile_n = (tile % kTilesN) * kWmma;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < kHeadDim; kk += kWmma) {
      wmma::load_matrix_sync(a, &smem.q_tile[tile_m][kk], kPitch<kHeadDim, __half>);
      wmma::load_matrix_sync(b, &smem.k_tile[tile_n][kk], kPitch<kHeadDim, __half>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&smem.scores[tile_m][tile_n], acc, kPitch<kBlockN, float>, wmma::mem_row_major);
  }
}

// O += P · V: warp w owns the 16x16 output tiles w, w + kWarps, ... of the kBlockM x D output.
template <int kHeadDim>
__device__ void accumulate_pv(SharedStorage<kHeadDim>& smem, int warp) {
  constexpr int kTilesN = kHeadDim / kWmma, kTiles = (kBlockM / kWmma) * kTilesN;
  wmma::fragment<wmma::matrix_a, kWmma, kWmma, kWmma, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, kWmma, kWmma, kWmma, __half, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, kWmma, kWmma, kWmma, float> acc;
  const __half* probs = smem.probs();
  for (int tile = warp; tile < kTiles; tile += kWarps) {
    const int tile_m = (tile / kTilesN) * kWmma, tile_n = (tile % kTilesN) * kWmma;
    wmma::load_matrix_sync(acc, &smem.out[tile_m][tile_n], kPitch<kHeadDim, float>, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < kBlockN; kk += kWmma) {
      wmma::load_matrix_sync(a, probs + tile_m * kProbsPitch + kk, kProbsPitch);
      wmma::load_matrix_sync(b, &smem.v_tile[kk][tile_n], kPitch<kHeadDim, __half>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&smem.out[tile_m][tile_n], acc, kPitch<kHeadDim, float>, wmma::mem_row_major);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_tiled_kernel(const FlashParams params) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  SharedStorage<kHeadDim>& smem = *reinterpret_cast<SharedStorage<kHeadDim>*>(smem_raw);
  const int warp = threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z, q_start = blockIdx.x * kBlockM;
  // Softmax / epilogue mapping: kThreadsPerRow consecutive lanes per query row, each owning a
  // contiguous slice of the row's keys and of its output columns.
  const int my_row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int query = q_start + my_row;
  constexpr int kColsPerThread = kBlockN / kThreadsPerRow;
  constexpr int kOutColsPerThread = kHeadDim / kThreadsPerRow;

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
  for (int c = part * kOutColsPerThread; c < (part + 1) * kOutColsPerThread; ++c) smem.out[my_row][c] = 0.f;
  float row_max = -FLT_MAX, row_sum = 0.f;  // identical in the threads of a row

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

    // Online softmax for row my_row over this thread's kColsPerThread keys of the tile.
    float s[kColsPerThread];
    float tile_max = -FLT_MAX;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      const int col = part * kColsPerThread + c, key = kv_start + col;
      const bool visible = key < params.seqlen_k && (!params.causal || key <= query);
      s[c] = visible ? smem.scores[my_row][col] * params.scale : -FLT_MAX;
      tile_max = fmaxf(tile_max, s[c]);
    }
    const float new_max = fmaxf(row_max, allreduce_max<kThreadsPerRow>(tile_max));
    __syncwarp();  // the whole row's S is in registers: its bytes may now hold P
    __half* p_row = smem.probs() + my_row * kProbsPitch;
    float tile_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      const float p = s[c] == -FLT_MAX ? 0.f : expf(s[c] - new_max);
      p_row[part * kColsPerThread + c] = __float2half_rn(p);
      tile_sum += p;
    }
    const float correction = expf(row_max - new_max);
    row_sum = row_sum * correction + allreduce_sum<kThreadsPerRow>(tile_sum);
    row_max = new_max;
    for (int c = part * kOutColsPerThread; c < (part + 1) * kOutColsPerThread; ++c) smem.out[my_row][c] *= correction;
    __syncthreads();  // P written, O rescaled

    accumulate_pv(smem, warp);
    __syncthreads();  // O updated; tiles (and S/P) may be overwritten
  }

  // Epilogue: normalise and write the rows that exist.
  if (query < params.seqlen_q) {
    __half* o = row_ptr(static_cast<__half*>(params.o), params.o_strides, batch, head, query);
    const float inv_sum = 1.f / row_sum;
    for (int c = part * kOutColsPerThread; c < (part + 1) * kOutColsPerThread; ++c)
      o[c] = __float2half_rn(smem.out[my_row][c] * inv_sum);
  }
}

// Past 48 KB of dynamic shared memory a kernel must opt in: launch_kernel does, once per device.
template <int kHeadDim>
cudaError_t launch(dim3 grid, cudaStream_t stream, const FlashParams& p) {
  return launch_kernel<attention_tiled_kernel<kHeadDim>>(grid, kThreads, sizeof(SharedStorage<kHeadDim>), stream, p);
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
