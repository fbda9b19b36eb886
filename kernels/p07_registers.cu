// Phase 7 — the register-resident kernel: mma.sync m16n8k16, ldmatrix, XOR-swizzled shared memory,
// S and P never leave registers. The FlashAttention-2 structure, plus a key-split path for
// problems too small to fill the GPU.
//
// What changed vs phase 6, and why. Phases 3-6 pass every tile through shared memory three times:
// WMMA writes S out, the softmax reads it and writes P, P·V reads P and read-modify-writes O, with
// four barriers per tile; at 4x16x2048 that left the tensor cores mostly idle (its share of the
// matmul peak: results/nvidia-h100-80gb-hbm3/p06_async.json against experiments/peaks.json). Here
// each warp owns WARP_ROWS query rows and keeps everything about them in registers:
//   - Q: loaded once into A-operand fragments (ldmatrix), or re-read per tile for wide heads;
//   - S = Q·Kᵀ: mma.sync accumulators whose layout PTX documents (common/mma.cuh), so the softmax
//     knows which row and column every value is: rows g and g+8, two columns per 8-key tile, the
//     row's other values in the 3 neighbouring lanes (quad shuffles for max and sum);
//   - P: the S accumulators converted to 16-bit pairs are, as they stand, the A operand of P·V;
//   - O: mma.sync accumulators, rescaled in place by exp2(m_old - m_new) per row.
// Shared memory holds only Q, K and V. Rows of D halves are stored with their 16-byte chunks
// XOR-swizzled by (row % 8), so the 8 rows an ldmatrix reads at one column land in 8 different
// bank groups, with no padding (common/swizzled_tile.cuh).
// The pipeline: with STAGES >= 2, tile t+STAGES-1 is copied into the buffer tile t-1 used, right
// after the one barrier per tile; with STAGES = 1 (FlashAttention-2's schedule), K and V have one
// buffer each: V(t) is copied during Q·Kᵀ(t), and K(t+1) during P·V(t).
// Persistent CTAs: the grid holds only as many CTAs as fit on the GPU at once, and each loops over
// query tiles. The copies run ahead across query tiles, so the next one's Q, K and V arrive while
// this one finishes.
// The softmax moves a row's running maximum only when a tile's exceeds it by more than 2^8, so
// after the first tiles O is almost never rescaled (exact: O and the row sum share the stale base).
// Causal: tiles entirely left of the diagonal skip the masking code, a warp whose rows see none of
// a tile skips it, tiles right of the diagonal are never loaded, and the longest rows start first.
// Small problems: when the large-tile grid would fill less than SMALL_PROBLEM_FILL percent of the
// GPU's SMs, a second configuration runs with KV_SPLIT warps per row group, each taking its own slice of every key tile; their
// partial softmax states are merged through shared memory at the end.
//
// Ablation switches (1 by default; 0 turns one technique off, results unchanged): SWIZZLE,
// SEPARATE_MASKED_TILES, FOLD_LOG2E, LAZY_RESCALE, PERSISTENT. OVERLAP_SOFTMAX (0 by default) is a
// measured dead end kept as one. The accuracy experiment's switches (flashcore_nb/accuracy.py) change
// the rounding, not the technique: RESCALE_SLACK (8; 0 keeps every row's maximum exact),
// SUM_ROUNDED_P and EXACT_EXP (0 by default). Q_IN_REGS_MAX_D, WARP_ROWS, BLOCK_N, STAGES and
// SMALL_PROBLEM_CTAS (0: never take the key-split path) are the others. Defaults are the H100's;
// flashcore_nb/phases.py overrides them for other GPUs.
//
// Measured, in results/nvidia-h100-80gb-hbm3/: p07_registers.json; each switch off in turn,
// experiments/p07_registers_ablations.json; the profile, experiments/p07_registers_profile.json;
// chapter 7.
//
// Knowingly does not support: GPUs before sm_80 (cp.async, bf16 mma); head dims other than 64
// and 128; inputs not aligned to 16 bytes.
#include <algorithm>
#include <cmath>

#include "common/async_copy.cuh"
#include "common/launch.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/swizzled_tile.cuh"
#include "common/warp_reduce.cuh"

// The configuration for problems that fill the GPU (BLOCK_M and STAGES for D = 64; D = 128 has its own).
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef WARP_ROWS
#define WARP_ROWS 32
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef BLOCK_M_D128
#define BLOCK_M_D128 128
#endif
#ifndef STAGES_D128
#define STAGES_D128 1
#endif
// The key-split configuration for small problems (16 rows per warp).
#ifndef SPLIT_BLOCK_M
#define SPLIT_BLOCK_M 32
#endif
#ifndef SPLIT_BLOCK_N
#define SPLIT_BLOCK_N 128
#endif
#ifndef SPLIT_STAGES
#define SPLIT_STAGES 2
#endif
#ifndef KV_SPLIT
#define KV_SPLIT 4
#endif
// Take the key-split path when the large-tile grid has fewer CTAs than this; -1: SMALL_PROBLEM_FILL
// percent of the GPU's SM count (a grid that fills more leaves too few idle SMs to repay the split).
#ifndef SMALL_PROBLEM_CTAS
#define SMALL_PROBLEM_CTAS -1
#endif
#ifndef SMALL_PROBLEM_FILL
#define SMALL_PROBLEM_FILL 50
#endif
#ifndef Q_IN_REGS_MAX_D
#define Q_IN_REGS_MAX_D 64
#endif
#ifndef SEPARATE_MASKED_TILES
#define SEPARATE_MASKED_TILES 1
#endif
#ifndef FOLD_LOG2E
#define FOLD_LOG2E 1
#endif
// Rescale O and the row sums only when some row's maximum grew by more than 2^RESCALE_SLACK (in
// exp's units); 0: every tile, with exact maxima.
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 1
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8
#endif
// Add P to the row sums as rounded to 16 bits, the very values P·V multiplies, rather than in fp32.
#ifndef SUM_ROUNDED_P
#define SUM_ROUNDED_P 0
#endif
// exp in double precision instead of MUFU.EX2's approximation: a slow diagnostic that measures what
// the approximation costs in accuracy.
#ifndef EXACT_EXP
#define EXACT_EXP 0
#endif
// As many CTAs as fit on the GPU at once, each looping over query tiles and copying the next tile's
// Q, K and V while it finishes the current one; 0: one CTA per query tile.
#ifndef PERSISTENT
#define PERSISTENT 1
#endif
// The persistent grid's size: -1, as many CTAs as fit at once; N > 0, at most N (the tests use a few,
// so that every CTA crosses many query tiles on small problems).
#ifndef PERSISTENT_CTAS
#define PERSISTENT_CTAS -1
#endif
// Software-pipeline each warp: issue tile t+1's Q·Kᵀ mma next to tile t's softmax, so the tensor
// cores and the FP32/SFU pipes could work at once. Needs STAGES >= 3, and registers for two tiles
// of scores: with 64-key tiles that spills, with 32-key ones it measured no faster (chapter 7).
#ifndef OVERLAP_SOFTMAX
#define OVERLAP_SOFTMAX 0
#endif

template <int kBlockM_, int kBlockN_, int kWarpRows_, int kStages_, int kKvSplit_, bool kOverlap_>
struct Tiles {
  static constexpr int kBlockM = kBlockM_;      // query rows per CTA
  static constexpr int kBlockN = kBlockN_;      // keys per shared-memory tile
  static constexpr int kWarpRows = kWarpRows_;  // query rows per warp: every K/V fragment serves this many
  static constexpr int kStages = kStages_;      // K/V buffers
  static constexpr int kKvSplit = kKvSplit_;    // warps sharing a row group, each on its own key slice
  static constexpr bool kOverlap = kOverlap_;   // Q·Kᵀ of tile t+1 issued alongside the softmax of tile t
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kRowWarps = kBlockM / kWarpRows;
  static constexpr int kWarps = kRowWarps * kKvSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSliceN = kBlockN / kKvSplit;   // keys of a tile one warp multiplies
  // How many key tiles ahead of the one being computed the copies run. With the overlap, tile t-1
  // is still being read (P·V) while tile t+1 is (Q·Kᵀ), so one buffer fewer is free to fill.
  static constexpr int kFetchAhead = kStages == 1 ? 1 : kOverlap ? kStages - 2 : kStages - 1;
  // Q tiles in flight: the next query tile's Q travels with its first K/V tile, up to kFetchAhead
  // tiles before this one's last Q·Kᵀ. With one stage it is copied after that Q·Kᵀ.
  static constexpr int kQBuffers = kStages == 1 ? 1 : kFetchAhead + 1;
  static_assert(kWarpRows == 16 || kWarpRows == 32, "WARP_ROWS is 16 or 32 query rows per warp");
  static_assert(kBlockM % kWarpRows == 0, "BLOCK_M must be a multiple of WARP_ROWS");
  static_assert(kWarps >= 1 && kWarps <= 16, "a CTA has 1..16 warps (BLOCK_M / WARP_ROWS x KV_SPLIT)");
  static_assert(kBlockN % kKvSplit == 0 && kSliceN % 16 == 0,
                "each warp's key slice (BLOCK_N / KV_SPLIT) must be a multiple of 16 (the mma k-step of P·V)");
  static_assert(kStages >= 1 && kStages <= 4, "STAGES must be 1..4");
  static_assert(!kOverlap || (kStages >= 3 && kKvSplit == 1),
                "OVERLAP_SOFTMAX needs STAGES >= 3 (tiles t-1, t and t+1 are in use at once) and no key split");
};

template <int kHeadDim>
using LargeTiles = Tiles<kHeadDim == 128 ? BLOCK_M_D128 : BLOCK_M, BLOCK_N, WARP_ROWS,
                         kHeadDim == 128 ? STAGES_D128 : STAGES, 1, OVERLAP_SOFTMAX != 0>;
using SplitTiles = Tiles<SPLIT_BLOCK_M, SPLIT_BLOCK_N, 16, SPLIT_STAGES, KV_SPLIT, false>;

template <typename T, int kHeadDim, typename Cfg>
struct SharedStorage {
  // Per warp of a key-split CTA other than the first: its O accumulators, row maxima and row sums,
  // lane-major (value i of lane l at [i * 32 + l]).
  static constexpr int kMergeValues = Cfg::kMTiles * (kHeadDim / 8) * 4 + Cfg::kMTiles * 4;
  static constexpr int kMergeFloats = (Cfg::kKvSplit - 1) * Cfg::kRowWarps * kMergeValues * 32;
  T q_tile[Cfg::kQBuffers][Cfg::kBlockM * kHeadDim];
  union {
    struct {
      T k_tile[Cfg::kStages][Cfg::kBlockN * kHeadDim];
      T v_tile[Cfg::kStages][Cfg::kBlockN * kHeadDim];
    } kv;
    float merge[kMergeFloats > 0 ? kMergeFloats : 1];   // after the last tile
  };
  static_assert(kMergeFloats * sizeof(float) <= sizeof(kv), "the key-split merge must fit in the K/V buffers");
};

// exp of a score already multiplied by score_scale and shifted by the row maximum.
__device__ __forceinline__ float softmax_exp(float x) {
  if (EXACT_EXP) return static_cast<float>(FOLD_LOG2E ? exp2(static_cast<double>(x)) : exp(static_cast<double>(x)));
  return FOLD_LOG2E ? fast_exp2(x) : __expf(x);
}

// One query tile of one head: which rows, and how many key tiles it needs.
template <int kBlockM, int kBlockN>
struct WorkItem {
  int index, batch, head, q_start, kv_end, num_tiles;
  __device__ __forceinline__ WorkItem(const FlashParams& p, int index_) : index(index_) {
    const int q_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM, heads_total = p.batch * p.heads;
    const int q_block = p.causal ? q_blocks - 1 - index / heads_total : index % q_blocks;
    const int head_index = p.causal ? index % heads_total : index / q_blocks;
    head = head_index % p.heads;
    batch = head_index / p.heads;
    q_start = q_block * kBlockM;
    // Top-left causal: the tile's last query row sees keys 0..q_start + kBlockM - 1.
    kv_end = p.causal ? min(p.seqlen_k, q_start + kBlockM) : p.seqlen_k;
    num_tiles = (kv_end + kBlockN - 1) / kBlockN;
  }
};

template <typename T, int kHeadDim, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attention_registers_kernel(const FlashParams params) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  constexpr int kMTiles = Cfg::kMTiles, kSliceN = Cfg::kSliceN, kWarpRows = Cfg::kWarpRows;
  constexpr int kDTiles = kHeadDim / 8, kKeyTiles = kSliceN / 8;
  using Smem = SharedStorage<T, kHeadDim, Cfg>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;   // this lane's row in an 8-row group, and its column pair
  const int row_warp = warp % Cfg::kRowWarps, split = warp / Cfg::kRowWarps;
  const int warp_row = row_warp * kWarpRows;   // this warp's first row in the tile
  const int slice = split * kSliceN;           // this warp's first key in every tile

  // Query tiles ("items") are dealt to the CTAs in rounds, alternately in order and in reverse, so
  // each CTA's total stays even when the items differ in length. Causal: the last query tiles see
  // the most keys, so they come first.
  const auto item_of = [&](int round) {
    const int ctas = gridDim.x, cta = blockIdx.x;
    return round * ctas + (round % 2 ? ctas - 1 - cta : cta);
  };
  const auto head_rows = [&](const void* base, const int64_t* strides, const WorkItem<kBlockM, kBlockN>& item) {
    return row_ptr(static_cast<const T*>(base), strides, item.batch, item.head, 0);
  };
  const int seqlen_k = params.seqlen_k;
  const bool causal = params.causal;
  const int64_t k_stride = params.k_strides[2], v_stride = params.v_strides[2];
  const int num_items = (params.seqlen_q + kBlockM - 1) / kBlockM * params.batch * params.heads;

  // The fetch cursor: the next (query tile, key tile) whose K — and V, with STAGES >= 2 — to copy,
  // running Cfg::kFetchAhead key tiles ahead of the computation and across query tiles, so the first
  // tiles of the next query tile arrive while this one finishes. A query tile's Q travels with its
  // first K tile, into its own buffer.
  int fetch_round = 0, fetch_tile = 0;
  WorkItem<kBlockM, kBlockN> fetch(params, item_of(0));
  const auto fetch_next = [&](int buffer) {
    if (fetch.index >= num_items) return;
    if (fetch_tile == 0)
      copy_tile_async<kBlockM, kHeadDim, kThreads>(smem.q_tile[fetch_round % Cfg::kQBuffers],
                                                   head_rows(params.q, params.q_strides, fetch), params.q_strides[2],
                                                   fetch.q_start, params.seqlen_q);
    copy_tile_async<kBlockN, kHeadDim, kThreads>(smem.kv.k_tile[buffer], head_rows(params.k, params.k_strides, fetch),
                                                 k_stride, fetch_tile * kBlockN, seqlen_k);
    if (kStages > 1)
      copy_tile_async<kBlockN, kHeadDim, kThreads>(smem.kv.v_tile[buffer], head_rows(params.v, params.v_strides, fetch),
                                                   v_stride, fetch_tile * kBlockN, seqlen_k);
    if (++fetch_tile == fetch.num_tiles) {
      fetch_tile = 0;
      fetch = WorkItem<kBlockM, kBlockN>(params, item_of(++fetch_round));
    }
  };
  for (int stage = 0; stage < Cfg::kFetchAhead; ++stage) {
    fetch_next(stage);
    cp_async_commit();
  }

  // Q as A fragments, loaded once per query tile — or, for wide heads where registers are short,
  // re-read from shared memory (ldmatrix) for every key tile.
  constexpr bool kQInRegs = kHeadDim <= Q_IN_REGS_MAX_D;
  uint32_t q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kHeadDim / 16 : 1][4];
  const FragmentRow<kHeadDim, T> q_row(warp_row + lane % 16, lane / 16);
  // K (B operand of Q·Kᵀ): matrices {keys 0-7, 8-15} x {d 0-7, 8-15}; V (B of P·V, transposed):
  // {keys 0-7, 8-15} x {d 0-7, 8-15} in the other order.
  const FragmentRow<kHeadDim, T> k_row(slice + lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
  const FragmentRow<kHeadDim, T> v_row(slice + lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
  const float score_scale = FOLD_LOG2E ? params.scale * 1.4426950408889634f : params.scale;
  // With LAZY_RESCALE, a row's running maximum may trail its true one by up to this much (in exp's
  // units): scores then exponentiate to at most 2^8 (e^8 without FOLD_LOG2E) by default, far inside
  // fp16's range.
  constexpr float kRescaleSlack = LAZY_RESCALE ? RESCALE_SLACK : 0.f;
  int step = 0;   // key tiles this CTA has computed: selects the K/V buffer

  for (int round = 0;; ++round) {
    const WorkItem<kBlockM, kBlockN> work(params, item_of(round));
    if (work.index >= num_items) break;
    const uint32_t q_tile = smem_address(smem.q_tile[round % Cfg::kQBuffers]);
    const auto q_fragment = [&](uint32_t(&a)[4], int mt, int kk) { ldmatrix_x4(a, q_tile + q_row.at(mt * 16, kk)); };
    float o_acc[kMTiles][kDTiles][4] = {};  // O rows g and g+8 of each m-tile, two columns per 8-wide D tile
    float row_max[kMTiles][2], row_sum[kMTiles][2];   // max in exp's units (log2 with FOLD_LOG2E); sum: this lane's part
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      row_max[mt][0] = row_max[mt][1] = -INFINITY;
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    const int first_row = work.q_start + warp_row, last_row = first_row + kWarpRows - 1;
    using Scores = float[kMTiles][kKeyTiles][4];   // S, then P, for this warp's rows and key slice

    // Wait for key tile `position` (counted over the CTA's whole run), then copy the one
    // kFetchAhead further into the buffer every warp is now done with. Not for STAGES = 1.
    const auto tile_landed = [&](int position) {
      cp_async_wait<Cfg::kFetchAhead - 1>();   // this thread's copies of that tile have landed
      __syncthreads();                          // ... every thread's, and the buffer to refill is free
      fetch_next((position + Cfg::kFetchAhead) % kStages);
      cp_async_commit();
    };
    const auto load_q = [&] {
      if (kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < kHeadDim / 16; ++kk) q_fragment(q_frag[mt][kk], mt, kk);
      }
    };
    // Warp-uniform: a slice past the keys, or right of every row's diagonal, contributes nothing.
    const auto active = [&](int tile) {
      const int key0 = tile * kBlockN + slice;
      return key0 < work.kv_end && !(causal && key0 > last_row);
    };

    // S = Q·Kᵀ for this warp's rows and key slice: one x4 ldmatrix gives the B fragments of two
    // 8-key tiles, used by every m-tile of the warp.
    const auto scores = [&](Scores& s, int position) {
      const uint32_t k_tile = smem_address(smem.kv.k_tile[position % kStages]);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t q_slice[kQInRegs ? 1 : kMTiles][4];
        if (!kQInRegs) {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) q_fragment(q_slice[kQInRegs ? 0 : mt], mt, kk);
        }
#pragma unroll
        for (int np = 0; np < kKeyTiles / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_tile + k_row.at(np * 16, kk));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            const uint32_t(&a)[4] = kQInRegs ? q_frag[kQInRegs ? mt : 0][kQInRegs ? kk : 0] : q_slice[kQInRegs ? 0 : mt];
            mma_16816<T>(s[mt][2 * np], a, {b[0], b[1]});
            mma_16816<T>(s[mt][2 * np + 1], a, {b[2], b[3]});
          }
        }
      }
    };

    // Mask only the slices that reach past the sequence or across the diagonal (warp-uniform test).
    const auto mask = [&](Scores& s, int tile) {
      const int key0 = tile * kBlockN + slice;
      if (SEPARATE_MASKED_TILES && key0 + kSliceN <= seqlen_k && !(causal && key0 + kSliceN - 1 > first_row)) return;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + j * 8 + 2 * t + (e & 1);
            const int query = first_row + mt * 16 + g + (e >> 1) * 8;
            if (key >= seqlen_k || (causal && key > query)) s[mt][j][e] = -INFINITY;
          }
    };

    // Online softmax for rows g (h = 0) and g + 8 (h = 1) of each m-tile, S -> P in place. A row's
    // running maximum moves only when the tile's exceeds it by more than the slack, so most tiles
    // leave it, and O, alone; `correction` is what O's rows must be multiplied by, and the return
    // value says whether any row of the warp needs it (warp-uniform).
    float correction[kMTiles][2];
    const auto softmax = [&](Scores& s) {
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float partial[kKeyTiles];   // pairwise trees: short dependency chains
#pragma unroll
          for (int j = 0; j < kKeyTiles; ++j) partial[j] = fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]);
#pragma unroll
          for (int width = kKeyTiles / 2; width >= 1; width /= 2)
#pragma unroll
            for (int j = 0; j < width; ++j) partial[j] = fmaxf(partial[j], partial[j + width]);
          const float tile_max = quad_max(partial[0]) * score_scale;
          const float old_max = row_max[mt][h];
          const float new_max = tile_max > old_max + kRescaleSlack ? tile_max : old_max;
          const float base = new_max == -INFINITY ? 0.f : new_max;   // a row with no visible key so far
          moved |= new_max != old_max;
          correction[mt][h] = softmax_exp(old_max - base);
          row_max[mt][h] = new_max;
#pragma unroll
          for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) s[mt][j][e] = softmax_exp(s[mt][j][e] * score_scale - base);
            // rounded as pack2 will round them for P·V
            partial[j] = SUM_ROUNDED_P ? to_float(from_float<T>(s[mt][j][2 * h])) + to_float(from_float<T>(s[mt][j][2 * h + 1]))
                                       : s[mt][j][2 * h] + s[mt][j][2 * h + 1];
          }
#pragma unroll
          for (int width = kKeyTiles / 2; width >= 1; width /= 2)
#pragma unroll
            for (int j = 0; j < width; ++j) partial[j] += partial[j + width];
          row_sum[mt][h] = row_sum[mt][h] * correction[mt][h] + partial[0];
        }
      return __any_sync(0xffffffffu, moved);
    };
    const auto rescale_o = [&] {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
#pragma unroll
          for (int e = 0; e < 4; ++e) o_acc[mt][d][e] *= correction[mt][e / 2];
    };

    // O += P·V: two neighbouring 8-key S tiles are one 16-key A fragment; V's B fragments come
    // transposed from its row-major tile, two 8-wide D tiles per x4 ldmatrix.
    const auto accumulate = [&](const Scores& p, int position) {
      const uint32_t v_tile = smem_address(smem.kv.v_tile[position % kStages]);
#pragma unroll
      for (int kk = 0; kk < kSliceN / 16; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          a[mt][0] = pack2<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
          a[mt][1] = pack2<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
          a[mt][2] = pack2<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_tile + v_row.at(kk * 16, dp));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(o_acc[mt][2 * dp], a[mt], {b[0], b[1]});
            mma_16816<T>(o_acc[mt][2 * dp + 1], a[mt], {b[2], b[3]});
          }
        }
      }
    };

    if constexpr (Cfg::kOverlap) {
      // Tile t's softmax runs while tile t+1's Q·Kᵀ is in flight: the two are independent, in one
      // basic block, and the compiler interleaves their instructions. Every warp computes every
      // tile's scores (no causal skip), so the block has no branch.
      Scores s, s_next;
      tile_landed(step);
      load_q();
      scores(s, step);
      for (int tile = 0; tile < work.num_tiles; ++tile, ++step) {
        mask(s, tile);
        bool moved;
        if (tile + 1 < work.num_tiles) {
          tile_landed(step + 1);
          scores(s_next, step + 1);
          moved = softmax(s);
        } else {
          moved = softmax(s);
        }
        if (!LAZY_RESCALE || moved) rescale_o();
        accumulate(s, step);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] = s_next[mt][j][e];
      }
    } else {
      for (int tile = 0; tile < work.num_tiles; ++tile, ++step) {
        if constexpr (kStages == 1) {
          cp_async_wait<0>();   // K(t) (and Q) have landed
          __syncthreads();      // ... for every thread, and every warp is done with V(t-1)
          copy_tile_async<kBlockN, kHeadDim, kThreads>(smem.kv.v_tile[0], head_rows(params.v, params.v_strides, work),
                                                       v_stride, tile * kBlockN, seqlen_k);
          cp_async_commit();
        } else {
          tile_landed(step);
        }
        if (tile == 0) load_q();
        const bool is_active = active(tile);
        Scores s;
        if (is_active) {
          scores(s, step);
          mask(s, tile);
          if (softmax(s) || !LAZY_RESCALE) rescale_o();
        }
        if constexpr (kStages == 1) {
          cp_async_wait<0>();   // V(t) has landed
          __syncthreads();      // ... for every thread, and every warp is done with K(t) (and this Q)
          fetch_next(0);
          cp_async_commit();
        }
        if (is_active) accumulate(s, step);
      }
    }

    if constexpr (Cfg::kKvSplit > 1) {
      // Merge the row group's key slices into the first split's warp: O = Σ 2^(m_i - m) O_i and
      // likewise the sums, with m the largest m_i. Same lane, same register layout: no index math.
      // The host gives this configuration one query tile per CTA, so no copy for a next one is in
      // flight into the K/V buffers the merge reuses.
      constexpr int kValues = Smem::kMergeValues;
      __syncthreads();   // every warp is done with K and V: their buffers become the merge area
      float* mine = smem.merge + ((split - 1) * Cfg::kRowWarps + row_warp) * kValues * 32 + lane;
      if (split > 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int d = 0; d < kDTiles; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) mine[((mt * kDTiles + d) * 4 + e) * 32] = o_acc[mt][d][e];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            mine[(kMTiles * kDTiles * 4 + mt * 4 + h) * 32] = row_max[mt][h];
            mine[(kMTiles * kDTiles * 4 + mt * 4 + 2 + h) * 32] = row_sum[mt][h];
          }
        }
      }
      __syncthreads();
      if (split > 0) return;
#pragma unroll
      for (int other = 1; other < Cfg::kKvSplit; ++other) {
        const float* theirs = smem.merge + ((other - 1) * Cfg::kRowWarps + row_warp) * kValues * 32 + lane;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float their_max = theirs[(kMTiles * kDTiles * 4 + mt * 4 + h) * 32];
            const float their_sum = theirs[(kMTiles * kDTiles * 4 + mt * 4 + 2 + h) * 32];
            const float new_max = fmaxf(row_max[mt][h], their_max);
            const float base = new_max == -INFINITY ? 0.f : new_max;
            const float mine_scale = softmax_exp(row_max[mt][h] - base), their_scale = softmax_exp(their_max - base);
            row_sum[mt][h] = row_sum[mt][h] * mine_scale + their_sum * their_scale;
            row_max[mt][h] = new_max;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d)
#pragma unroll
              for (int e = 2 * h; e < 2 * h + 2; ++e)
                o_acc[mt][d][e] = o_acc[mt][d][e] * mine_scale + theirs[((mt * kDTiles + d) * 4 + e) * 32] * their_scale;
          }
      }
    }

    // Epilogue: the quad's row sums, normalise, write the rows that exist (two columns per store).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv_sum = 1.f / quad_sum(row_sum[mt][h]);   // every lane joins the shuffle
        const int query = first_row + mt * 16 + g + h * 8;
        if (query >= params.seqlen_q) continue;
        T* o = row_ptr(static_cast<T*>(params.o), params.o_strides, work.batch, work.head, query);
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
          *reinterpret_cast<uint32_t*>(o + d * 8 + 2 * t) =
              pack2<T>(o_acc[mt][d][2 * h] * inv_sum, o_acc[mt][d][2 * h + 1] * inv_sum);
      }
  }
}

// The key-split path when the large-tile grid would leave SMs idle.
static bool use_split_tiles(const FlashParams& p) {
  if (KV_SPLIT == 1) return false;
  int threshold = SMALL_PROBLEM_CTAS, device = 0, sms = 0;
  if (threshold < 0) {
    if (cudaGetDevice(&device) != cudaSuccess || device_sm_count(device, &sms) != cudaSuccess) return false;
    threshold = sms * SMALL_PROBLEM_FILL / 100;
  }
  const int block_m = p.head_dim == 128 ? BLOCK_M_D128 : BLOCK_M;
  const long long ctas = static_cast<long long>((p.seqlen_q + block_m - 1) / block_m) * p.heads * p.batch;
  return ctas < threshold;
}

template <typename T, int kHeadDim, typename Cfg>
cudaError_t launch(cudaStream_t stream, const FlashParams& p) {
  constexpr size_t kSmem = sizeof(SharedStorage<T, kHeadDim, Cfg>);
  constexpr auto kernel = attention_registers_kernel<T, kHeadDim, Cfg>;
  const long long items = static_cast<long long>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.heads * p.batch;
  if (items > 0x7fffffff) return cudaErrorInvalidConfiguration;
  long long ctas = items;
  // Persistent: no more CTAs than are resident at once. The key-split configuration keeps one query
  // tile per CTA (its merge reuses the K/V buffers), and is only chosen when that fits anyway.
  if (PERSISTENT && Cfg::kKvSplit == 1) {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t err;
    if ((err = cudaGetDevice(&device)) != cudaSuccess || (err = device_sm_count(device, &sms)) != cudaSuccess ||
        (err = resident_ctas_per_sm<kernel>(device, Cfg::kThreads, kSmem, &per_sm)) != cudaSuccess)
      return err;
    const long long resident = PERSISTENT_CTAS > 0 ? PERSISTENT_CTAS : per_sm * static_cast<long long>(sms);
    ctas = std::min(items, resident);
  }
  return launch_kernel<kernel>(dim3(static_cast<unsigned>(ctas)), Cfg::kThreads, kSmem, stream, p);
}

template <int kHeadDim>
cudaError_t dispatch(cudaStream_t stream, const FlashParams& p) {
  const bool split = use_split_tiles(p), bf16 = p.dtype == kBFloat16;
  using Large = LargeTiles<kHeadDim>;
  if (bf16) return split ? launch<__nv_bfloat16, kHeadDim, SplitTiles>(stream, p) : launch<__nv_bfloat16, kHeadDim, Large>(stream, p);
  return split ? launch<__half, kHeadDim, SplitTiles>(stream, p) : launch<__half, kHeadDim, Large>(stream, p);
}

template <int kHeadDim>
size_t smem_bytes(const FlashParams& p) {
  return use_split_tiles(p) ? sizeof(SharedStorage<__half, kHeadDim, SplitTiles>)
                            : sizeof(SharedStorage<__half, kHeadDim, LargeTiles<kHeadDim>>);
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? smem_bytes<128>(*params) : smem_bytes<64>(*params);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  if (params->head_dim == 64) return dispatch<64>(stream, *params);
  if (params->head_dim == 128) return dispatch<128>(stream, *params);
  return cudaErrorInvalidValue;
}
