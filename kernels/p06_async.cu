// Phase 6 — the cp.async pipeline: K and V tiles copied global -> shared memory in the background,
// STAGES tiles in flight (1, 2 or 3), on phase 5's tiling.
//
// What changed vs phase 5, and why. Phase 5 staged the next K/V tile in registers: the loads
// were early, but the data passed through the threads that also do the math, and the registers
// holding it (16 per thread at 64x64) were a large part of the register budget. Here:
//   - every Q, K and V tile travels global -> shared memory by 16-byte cp.async (sm_80+): no
//     registers, no extra instructions per element, and rows past the sequence are zero-filled by
//     the copy itself (src-size 0) instead of by a separate padding loop;
//   - K and V have STAGES buffers each. Before tile t's math the CTA issues the copy of tile
//     t + STAGES - 1, commits it as one group, and waits until only STAGES - 1 groups are still in
//     flight, i.e. tile t has landed; a barrier then makes every thread's copies visible. With
//     STAGES = 1 nothing overlaps (copy, wait, compute); with 2 the next tile's copy runs under this
//     tile's math; with 3 two copies are in flight;
//   - defaults (BLOCK_M = 32, BLOCK_N = 128, NUM_WARPS = 8, STAGES = 2) come from measuring every
//     combination on the H100 (results/nvidia-h100-80gb-hbm3/experiments/p06_async_sweep.json,
//     chapter 6): 32-row tiles give the mission shape one CTA per SM, and
//     there the second stage pays; with many CTAs per SM a stage can cost a resident CTA instead.
//     The defines and their static_asserts are phase 5's plus STAGES.
// The stage a copy fills was last read by the previous tile, whose loop iteration ended with a
// __syncthreads, so no copy can land under a warp still reading it.
//
// PLANTED_BUG = 1 is a TEACHING VARIANT, WRONG ON PURPOSE, for the sanitizer section of chapter 6:
// the V copy computes its destination with the original project's row pitch (D + 16 halves)
// while the buffer is laid out with D + 8. Rows drift further each step, run into the next stage
// and, from the last stage, past the end of the block's shared memory. It is only ever run as a
// separate process under compute-sanitizer (its report: experiments/p06_sanitizer.json).
//
// Measured, in results/nvidia-h100-80gb-hbm3/: p06_async.json and chapter 6.
//
// Knowingly does not support: GPUs before sm_80 (no cp.async); bf16 (phase 7); head dims other
// than 64 and 128; inputs not aligned to 16 bytes.
#include <cfloat>

#include <mma.h>

#include "common/async_copy.cuh"
#include "common/launch.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/warp_reduce.cuh"

using namespace nvcuda;

#ifndef BLOCK_M
#define BLOCK_M 32
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef PLANTED_BUG
#define PLANTED_BUG 0
#endif

constexpr int kBlockM = BLOCK_M;   // query rows per CTA
constexpr int kBlockN = BLOCK_N;   // keys per tile
constexpr int kWarps = NUM_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = STAGES;    // K/V tiles in shared memory at once
constexpr int kWmma = 16;          // m = n = k of one WMMA operation
static_assert(kStages >= 1 && kStages <= 4, "STAGES must be 1..4 (1: no overlap; 2: double buffering)");
static_assert(PLANTED_BUG == 0 || PLANTED_BUG == 1, "PLANTED_BUG is 0 or 1 (the teaching variant)");
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
using Tile = __half[kPitch<kHeadDim, __half>];   // one padded row; a tile is Tile<D>[rows]

template <int kHeadDim>
struct SharedStorage {
  __half q_tile[kBlockM][kPitch<kHeadDim, __half>];
  float scores[kBlockM][kPitch<kBlockN, float>];  // S for the current tile, then P (fp16) in place
  float out[kBlockM][kPitch<kHeadDim, float>];    // O accumulator, unnormalised, across KV tiles
  __half k_tile[kStages][kBlockN][kPitch<kHeadDim, __half>];
  __half v_tile[kStages][kBlockN][kPitch<kHeadDim, __half>];   // last: see PLANTED_BUG

  __device__ __half* probs() { return reinterpret_cast<__half*>(&scores[0][0]); }
};

// Issue the cp.async copies of a tile of kRows rows starting at row `first`; rows past `seqlen`
// are zero-filled by the copy (never left stale: 0 * NaN would poison P·V). `row_pitch` is the
// destination's row pitch in halves — the tile's own, except in the planted bug.
template <int kRows, int kHeadDim>
__device__ void copy_tile_async(Tile<kHeadDim>* tile, const __half* base, int64_t row_stride, int first, int seqlen,
                                int row_pitch = kPitch<kHeadDim, __half>) {
  constexpr int kChunksPerRow = kHeadDim / 8;   // 16-byte chunks
  __half* dst = &tile[0][0];
  for (int index = threadIdx.x; index < kRows * kChunksPerRow; index += kThreads) {
    const int row = index / kChunksPerRow, col = (index % kChunksPerRow) * 8;
    const bool inside = first + row < seqlen;
    cp_async_16(dst + row * row_pitch + col, inside ? base + (first + row) * row_stride + col : base, inside);
  }
}

// S = Q · Kᵀ: warp w computes the 16x16 tiles w, w + kWarps, ... of the kBlockM x kBlockN score tile.
template <int kHeadDim>
__device__ void compute_scores(SharedStorage<kHeadDim>& smem, const Tile<kHeadDim>* k_tile, int warp) {
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
      wmma::load_matrix_sync(b, &k_tile[tile_n][kk], kPitch<kHeadDim, __half>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&smem.scores[tile_m][tile_n], acc, kPitch<kBlockN, float>, wmma::mem_row_major);
  }
}

// O += P · V: warp w owns the 16x16 output tiles w, w + kWarps, ... of the kBlockM x D output.
template <int kHeadDim>
__device__ void accumulate_pv(SharedStorage<kHeadDim>& smem, const Tile<kHeadDim>* v_tile, int warp) {
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
      wmma::load_matrix_sync(b, &v_tile[kk][tile_n], kPitch<kHeadDim, __half>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&smem.out[tile_m][tile_n], acc, kPitch<kHeadDim, float>, wmma::mem_row_major);
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_async_kernel(const FlashParams params) {
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

#if PLANTED_BUG
  constexpr int kVCopyPitch = kHeadDim + 16;   // the original's padded pitch, not this buffer's
#else
  constexpr int kVCopyPitch = kPitch<kHeadDim, __half>;
#endif
  // Top-left causal: the last query row of this tile sees keys 0..q_start + kBlockM - 1.
  const int kv_end = params.causal ? min(params.seqlen_k, q_start + kBlockM) : params.seqlen_k;
  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;
  const int64_t k_stride = params.k_strides[2], v_stride = params.v_strides[2];
  const int seqlen_k = params.seqlen_k;
  const auto issue_kv_copy = [&](int tile) {
    if (tile < num_tiles) {
      const int stage = tile % kStages;
      copy_tile_async<kBlockN, kHeadDim>(smem.k_tile[stage], k, k_stride, tile * kBlockN, seqlen_k);
      copy_tile_async<kBlockN, kHeadDim>(smem.v_tile[stage], v, v_stride, tile * kBlockN, seqlen_k, kVCopyPitch);
    }
    cp_async_commit();  // an empty group when there is no tile keeps the counting uniform
  };

  // Prologue: Q joins the first group; tiles 0 .. STAGES-2 go in flight; O is zeroed meanwhile.
  copy_tile_async<kBlockM, kHeadDim>(smem.q_tile, q, params.q_strides[2], q_start, params.seqlen_q);
  for (int tile = 0; tile < kStages - 1; ++tile) issue_kv_copy(tile);
  for (int c = part * kOutColsPerThread; c < (part + 1) * kOutColsPerThread; ++c) smem.out[my_row][c] = 0.f;
  float row_max = -FLT_MAX, row_sum = 0.f;  // identical in the threads of a row

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int kv_start = tile * kBlockN;
    issue_kv_copy(tile + kStages - 1);   // into the stage tile - 1 used; it ended with a barrier
    cp_async_wait<kStages - 1>();        // this thread's copies of tile `tile` (and Q) have landed
    __syncthreads();                     // ... and everyone else's; the zeroed O too
    const Tile<kHeadDim>* k_tile = smem.k_tile[tile % kStages];
    const Tile<kHeadDim>* v_tile = smem.v_tile[tile % kStages];

    compute_scores(smem, k_tile, warp);
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

    accumulate_pv(smem, v_tile, warp);
    __syncthreads();  // O updated; this stage (and S/P) may be overwritten
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
  return launch_kernel<attention_async_kernel<kHeadDim>>(grid, kThreads, sizeof(SharedStorage<kHeadDim>), stream, p);
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
