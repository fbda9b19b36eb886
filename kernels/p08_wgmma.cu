// Phase 8 — Hopper's warpgroup MMA: wgmma.mma_async, reading K and V straight from shared memory.
//
// What changed vs phase 7, and why. Phase 7 is the FlashAttention-2 structure on mma.sync, and on an
// H100 its profile (results/nvidia-h100-80gb-hbm3/experiments/p07_registers_profile.json, chapter 7)
// put it at a latency ceiling: few warps per scheduler, the tensor pipe far from busy, the
// largest stall a fixed-latency wait on the HMMA instructions, and at D = 128 every mma waiting on
// its own ldmatrix. mma.sync is Ampere's instruction. Hopper's tensor cores are fed by
// wgmma: a warpgroup (4 warps, 128 threads) issues one instruction for a 64xN tile, the instruction
// reads its B operand from shared memory itself, and it runs asynchronously until waited for.
//   - S = Q·Kᵀ: Q is loaded once into A fragments (phase 7's ldmatrix code: a warp's share of a wgmma
//     A operand is an mma.sync A fragment); Kᵀ comes from shared memory through a 64-bit descriptor
//     (common/wgmma.cuh), 64 keys per instruction. No ldmatrix per mma, no B registers.
//   - P·V: the S accumulators, converted to 16-bit pairs, are the register A operand, as in phase 7;
//     V is read from shared memory as stored ("MN-major", transposed by the instruction).
//   - Shared memory keeps phase 7's XOR swizzle, cut into 64-column blocks: 128-byte rows with their
//     16-byte chunks XORed by (row % 8) is exactly the hardware's "128B swizzle" mode, so cp.async
//     writes tiles that wgmma reads without bank conflicts.
// A CTA holds WARPGROUPS x 64 query rows, 64 per warpgroup; all its threads copy K one tile ahead and
// V two tiles ahead with cp.async while the warpgroups compute. The softmax and the causal handling are
// phase 7's: exp2 with log2(e) folded into the scale, O rescaled only when a row's (exact) maximum moves,
// masks only on the tiles that need them, tiles right of the diagonal never loaded, longest rows first.
// Measured, in results/nvidia-h100-80gb-hbm3/: p08_wgmma.json, beside SDPA's backends in the same
// run, and phase 7's record; the switches below, experiments/p08_wgmma_ablations.json; chapter 8.
//
// Tile parameters: WARPGROUPS, BLOCK_N (keys per tile, a multiple of 64) and CTAS_PER_SM for D = 64;
// WARPGROUPS_D128, BLOCK_N_D128 and CTAS_PER_SM_D128 for D = 128. OVERLAP=1 issues each tile's Q·Kᵀ
// together with the previous tile's P·V, so that a warpgroup's softmax runs under its own P·V
// (FlashAttention-3's intra-warpgroup pipelining): a measured dead end here, kept as a switch.
// The accuracy experiment's switches (flashcore_nb/accuracy.py), phase 7's: RESCALE_SLACK (0: every
// row's maximum exact; 8: 2^8 of slack), SUM_ROUNDED_P and EXACT_EXP (0 by default).
//
// Knowingly does not support: any GPU but sm_90 (wgmma is Hopper's; Blackwell has tcgen05 instead);
// head dims other than 64 and 128; inputs not aligned to 16 bytes. Small problems (the mission shape)
// get no key-split path: phase 7 remains the faster kernel there.
#include "common/async_copy.cuh"
#include "common/launch.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/shared_memory.cuh"
#include "common/wgmma_attention.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "p08_wgmma needs wgmma: compile it for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

#ifndef WARPGROUPS
#define WARPGROUPS 2
#endif
#ifndef WARPGROUPS_D128
#define WARPGROUPS_D128 2
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 2
#endif
#ifndef BLOCK_N_D128
#define BLOCK_N_D128 128
#endif
#ifndef CTAS_PER_SM_D128
#define CTAS_PER_SM_D128 1
#endif
#ifndef OVERLAP
#define OVERLAP 0
#endif
// Move a row's maximum only when a tile's exceeds it by more than 2^RESCALE_SLACK (log2 units).
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 0
#endif
// Add P to the row sums as rounded to 16 bits, the very values P·V multiplies, rather than in fp32.
#ifndef SUM_ROUNDED_P
#define SUM_ROUNDED_P 0
#endif
// exp2 in double precision instead of MUFU.EX2's approximation: a slow diagnostic that measures what
// the approximation costs in accuracy.
#ifndef EXACT_EXP
#define EXACT_EXP 0
#endif

template <int kHeadDim>
struct Tiles {
  static constexpr int kWarpgroups = kHeadDim == 128 ? WARPGROUPS_D128 : WARPGROUPS;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = kHeadDim == 128 ? BLOCK_N_D128 : BLOCK_N;
  static constexpr int kCtasPerSm = kHeadDim == 128 ? CTAS_PER_SM_D128 : CTAS_PER_SM;
  // Shared memory: Q, then two K tiles, then two V tiles, each [kHeadDim / 64][rows][64].
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;
  static constexpr int kSmemBytes = kQBytes + 4 * kKvBytes + 1024;   // + room to align to 1024

  static_assert(kWarpgroups >= 1 && kWarpgroups <= 3, "WARPGROUPS(_D128) must be 1, 2 or 3 (64 query rows each)");
  static_assert(kBlockN % 64 == 0 && kBlockN >= 64 && kBlockN <= 256,
                "BLOCK_N must be 64, 128, 192 or 256: each wgmma covers 64 keys");
};

// Copies rows [first, first + kRows) of one head into a swizzled tile; rows at or past `end` are zeros.
template <typename T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void copy_tile(unsigned char* tile, const T* base, const int64_t* strides, int batch,
                                          int head, int first, int end) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int step = 0; step < (kChunks + kThreads - 1) / kThreads; ++step) {
    const int i = step * kThreads + threadIdx.x;
    if (kChunks % kThreads != 0 && i >= kChunks) break;
    const int row = i / kChunksPerRow, col = i % kChunksPerRow * 8;
    const bool inside = first + row < end;
    const T* source = row_ptr(base, strides, batch, head, inside ? first + row : first) + col;
    cp_async_16(tile + swizzled_offset(kRows, row, col), source, inside);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(Tiles<kHeadDim>::kThreads, Tiles<kHeadDim>::kCtasPerSm)
    attention_wgmma_kernel(const FlashParams params) {
  using Cfg = Tiles<kHeadDim>;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* const q_tile = smem;
  unsigned char* const k_tiles = smem + Cfg::kQBytes;    // two buffers each for K and V
  unsigned char* const v_tiles = k_tiles + 2 * Cfg::kKvBytes;

  // Read through a shuffle, the warpgroup index is visibly the same across a warp: without that,
  // ptxas treats branches on it as divergent and serialises the wgmmas inside them.
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int m_tiles = (params.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int m_tile = m_tiles - 1 - static_cast<int>(blockIdx.x);   // causal: the longest rows start first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int first_row = m_tile * Cfg::kBlockM;
  const int group_row = first_row + warpgroup * 64;                // this warpgroup's first query row
  const int warp_row = group_row + warp * 16 + g;                  // this lane's rows: warp_row and + 8
  const int key_end = params.causal ? min(params.seqlen_k, first_row + Cfg::kBlockM) : params.seqlen_k;
  const int key_tiles = (key_end + Cfg::kBlockN - 1) / Cfg::kBlockN;
  // Causal: this warpgroup's rows see only its first `my_tiles` key tiles; the CTA loads them all.
  const int my_tiles = params.causal ? min(key_tiles, (group_row + 64 + Cfg::kBlockN - 1) / Cfg::kBlockN) : key_tiles;

  const T* const q = static_cast<const T*>(params.q);
  const T* const k = static_cast<const T*>(params.k);
  const T* const v = static_cast<const T*>(params.v);
  auto copy_k = [&](int tile) {
    copy_tile<T, kHeadDim, Cfg::kBlockN, Cfg::kThreads>(k_tiles + tile % 2 * Cfg::kKvBytes, k, params.k_strides,
                                                        batch, head, tile * Cfg::kBlockN, params.seqlen_k);
  };
  auto copy_v = [&](int tile) {
    copy_tile<T, kHeadDim, Cfg::kBlockN, Cfg::kThreads>(v_tiles + tile % 2 * Cfg::kKvBytes, v, params.v_strides,
                                                        batch, head, tile * Cfg::kBlockN, params.seqlen_k);
  };

  copy_tile<T, kHeadDim, Cfg::kBlockM, Cfg::kThreads>(q_tile, q, params.q_strides, batch, head, first_row,
                                                      params.seqlen_q);
  copy_k(0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // This warpgroup's registers and math (common/wgmma_attention.cuh); Q stays in registers.
  WarpgroupAttention<T, kHeadDim, Cfg::kBlockN, RESCALE_SLACK, SUM_ROUNDED_P, EXACT_EXP> rows;
  rows.load_q(q_tile, Cfg::kBlockM, warpgroup * 64, warp, lane);
  rows.reset();
  const float score_scale = params.scale * 1.4426950408889634f;   // exp(x) = exp2(x · log2 e)
  const auto k_tile = [&](int tile) { return smem_address(k_tiles + tile % 2 * Cfg::kKvBytes); };
  const auto v_tile = [&](int tile) { return smem_address(v_tiles + tile % 2 * Cfg::kKvBytes); };
  const auto softmax = [&](int tile, float (&correction)[2]) {
    rows.softmax(tile * Cfg::kBlockN, params, group_row, warp_row, t, score_scale, correction);
  };

  // Step `step` computes S for tile `step` and P·V for tile step - 1, so that (OVERLAP) the softmax
  // of one tile runs on the CUDA cores while the tensor cores do the previous tile's P·V. K is copied
  // one tile ahead and V two: step `step` brings K(step + 1) into the buffer K(step - 1) left, and
  // V(step) into the one V(step - 2) left. Every thread takes the CTA's key_tiles + 1 steps through
  // the one barrier (an aligned barrier must be the same instruction for all), while a warpgroup
  // does only its own work in them (causal: fewer tiles for the upper rows). Each branch waits for
  // every wgmma it issues: ptxas then knows that none is in flight where the branches meet, and does
  // not serialise them.
  for (int step = 0; step <= key_tiles; ++step) {
    cp_async_wait<0>();   // K(step) and V(step - 1), copied during the previous step, have landed
    fence_proxy_async();
    __syncthreads();      // ... for every thread, and every warpgroup is done with the buffers refilled now
    if (step + 1 < key_tiles) copy_k(step + 1);
    if (step < key_tiles) copy_v(step);
    cp_async_commit();

    float correction[2];
    if (step == 0) {
      rows.issue_scores(k_tile(0));
      wgmma_wait<0>();
      rows.scores_landed();
      softmax(0, correction);   // O is still zero: no rescale
      rows.pack_probabilities();
    } else if (step < my_tiles) {
      rows.issue_scores(k_tile(step));
      if (OVERLAP) {
        rows.issue_values(v_tile(step - 1));
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      rows.scores_landed();
      softmax(step, correction);
      if (!OVERLAP) rows.issue_values(v_tile(step - 1));
      wgmma_wait<0>();
      rows.output_landed();
      rows.rescale_output(correction);
      rows.pack_probabilities();
    } else if (step == my_tiles) {
      rows.issue_values(v_tile(step - 1));
      wgmma_wait<0>();
      rows.output_landed();
    }
  }

  rows.store_output(params, batch, head, warp_row, t);
}

template <typename T, int kHeadDim>
cudaError_t launch(cudaStream_t stream, const FlashParams& p) {
  using Cfg = Tiles<kHeadDim>;
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.heads, p.batch);
  return launch_kernel<attention_wgmma_kernel<T, kHeadDim>>(grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p);
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? Tiles<128>::kSmemBytes : Tiles<64>::kSmemBytes;
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  const bool bf16 = params->dtype == kBFloat16;
  if (params->head_dim == 64) return bf16 ? launch<__nv_bfloat16, 64>(stream, *params) : launch<__half, 64>(stream, *params);
  if (params->head_dim == 128) return bf16 ? launch<__nv_bfloat16, 128>(stream, *params) : launch<__half, 128>(stream, *params);
  return cudaErrorInvalidValue;
}
