// One warpgroup's share of FlashAttention on wgmma (phases 8 and 9): 64 query rows, Q held as A
// fragments, the scores S and the output O in wgmma accumulators, and the online softmax between them.
//
// Layouts (common/wgmma.cuh): tiles in shared memory are 64-column blocks of 128-byte rows, 128B-swizzled,
// `rows` rows per block. Warp w of the warpgroup owns rows 16w..16w+15; lane (g = lane / 4, t = lane % 4)
// holds rows g and g + 8 of its warp, columns 8c + 2t and 8c + 2t + 1 of each 64-column accumulator.
// The kernel decides when to issue, wait and refill; this struct only holds the registers and the math.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fragment_store.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/shared_memory.cuh"
#include "common/warp_reduce.cuh"
#include "common/wgmma.cuh"

// kRescaleSlack, kSumRoundedP, kExactExp: the accuracy experiment's switches (flashcore_nb/accuracy.py).
// A row's maximum moves only when a tile's exceeds it by more than 2^kRescaleSlack (0: always exact); the
// row sums add P as rounded to 16 bits (the values P·V multiplies) rather than in fp32; exp2 in double
// precision instead of MUFU.EX2's approximation (a slow diagnostic).
// kTensorCoreSums (phase 9's SPECULATE): the row sums are P·ones, issued with each P·V (issue_values' `ones`)
// and rescaled with O, not adds in the softmax: they then sum P exactly as P·V multiplies it (rounded to 16
// bits). That matters once a row's largest P is not 1 (softmax<true>), as 16 bits round it: summed in fp32
// before the rounding, that weight would count differently in O and in its sum, up to twice SDPA's error.
// kSpeculationSlack: softmax<true> keeps a row's running maximum while a tile's rises above it by at most this
// much (log2 units): P is then at most 2^8, well inside fp16's and bf16's range.
constexpr float kSpeculationSlack = 8.f;

template <typename T, int kHeadDim, int kBlockN, int kRescaleSlack = 0, bool kSumRoundedP = false,
          bool kExactExp = false, bool kTensorCoreSums = false, bool kWideWgmma = false>
struct WarpgroupAttention {
  using Element = T;
  static constexpr int kKSteps = kHeadDim / 16;    // k16 slices of Q·Kᵀ
  static constexpr int kKeyBlocks = kBlockN / 64;  // 64-key wgmmas per slice of Q·Kᵀ
  static constexpr int kPSteps = kBlockN / 16;     // k16 slices of P·V
  static constexpr int kDBlocks = kHeadDim / 64;   // 64-column wgmmas per slice of P·V

  uint32_t q_frag[kKSteps][4];   // this warp's 16 rows of Q
  float o_acc[kDBlocks][32];
  float s[kKeyBlocks][32];       // S of the newest tile, then its P in place
  uint32_t p_frag[kPSteps][4];   // P of the tile waiting for its P·V, as A fragments
  float row_max[2], row_sum[2];  // rows g and g + 8, log2 units; the sum is this lane's part
  float sum_acc[4];              // kTensorCoreSums: P·ones, a 64x8 accumulator; row g's sum in [0], g + 8's in [2]
  bool risen;                    // softmax<true>: a row's maximum rose more than kSpeculationSlack

  // The accumulators as one wgmma's (kWideWgmma): 64-column blocks side by side are the layout of one 64xN.
  __device__ __forceinline__ float (&scores())[kBlockN / 2] { return reinterpret_cast<float(&)[kBlockN / 2]>(s); }
  __device__ __forceinline__ float (&output())[kHeadDim / 2] { return reinterpret_cast<float(&)[kHeadDim / 2]>(o_acc); }

  // K's k16 slice kk, keys from 64j on, in a K tile at `k_base` (64-column boxes of kBlockN rows).
  static __device__ __forceinline__ uint64_t key_descriptor(uint32_t k_base, int kk, int j) {
    return smem_descriptor_128b(k_base + (kk / 4) * kBlockN * 128 + j * 64 * 128 + (kk % 4) * 32, 16);
  }
  // Before S's wgmmas: the accumulators stay put across them.
  __device__ __forceinline__ void begin_scores() {
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) fence_accumulators(s[j]);
    wgmma_fence();
  }

  // O = 0 and no row seen yet: the start of a query tile.
  __device__ __forceinline__ void reset() {
    reset_maxima();
    reset_output();
  }
  // The two halves of reset, for a kernel (phase 9) that starts a tile's softmax while the previous tile's
  // last P·V still runs into O and its row sums (P·ones: kTensorCoreSums; reset_output clears the fp32 ones).
  __device__ __forceinline__ void reset_maxima() {
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[h] = -INFINITY;
  }
  __device__ __forceinline__ void reset_output() {
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j)
#pragma unroll
      for (int i = 0; i < 32; ++i) o_acc[j][i] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) row_sum[h] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) sum_acc[i] = 0.f;
  }

  // This warp's rows of Q from a swizzled tile of `rows` rows in which the warpgroup's rows start at
  // `group_first_row` (the warp's 16 are group_first_row + 16 * warp ...).
  __device__ __forceinline__ void load_q(const unsigned char* q_tile, int rows, int group_first_row, int warp,
                                         int lane) {
    const int row = group_first_row + warp * 16 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
      ldmatrix_x4(q_frag[kk], smem_address(q_tile + swizzled_offset(rows, row, kk * 16 + lane / 16 * 8)));
  }

  // S = Q·Kᵀ for the K tile at shared address `k_base`: for each k16 slice of D, one wgmma per 64 keys
  // (kWideWgmma: one for all kBlockN keys).
  __device__ __forceinline__ void issue_scores(uint32_t k_base) {
    begin_scores();
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      if constexpr (kWideWgmma) {
        wgmma_rs<T, kBlockN, 0>(scores(), q_frag[kk], key_descriptor(k_base, kk, 0), kk > 0);
      } else {
#pragma unroll
        for (int j = 0; j < kKeyBlocks; ++j) wgmma_rs<T, 64, 0>(s[j], q_frag[kk], key_descriptor(k_base, kk, j), kk > 0);
      }
    }
    wgmma_commit();
  }

  // The same with Q read from shared memory too (phase 9's Q_IN_SHARED; q_frag unused): Q's tile as TMA wrote it,
  // `q_rows` rows per 64-column box, this warpgroup's 64 rows from `q_base`. K-major A and B.
  __device__ __forceinline__ void issue_scores_shared_q(uint32_t q_base, int q_rows, uint32_t k_base) {
    begin_scores();
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const uint64_t q_descriptor = smem_descriptor_128b(q_base + (kk / 4) * q_rows * 128 + (kk % 4) * 32, 16);
      if constexpr (kWideWgmma) {
        wgmma_ss<T, kBlockN>(scores(), q_descriptor, key_descriptor(k_base, kk, 0), kk > 0);
      } else {
#pragma unroll
        for (int j = 0; j < kKeyBlocks; ++j) wgmma_ss<T, 64>(s[j], q_descriptor, key_descriptor(k_base, kk, j), kk > 0);
      }
    }
    wgmma_commit();
  }

  // O += P·V for the V tile at shared address `v_base`: for each k16 slice of the keys, one wgmma per
  // 64 columns of D (kWideWgmma: one for all D columns); kWithSums: and the row sums += P·ones in the same group,
  // `ones` the descriptor of a 16x8 (K-major) block of ones in shared memory.
  template <bool kWithSums = kTensorCoreSums>
  __device__ __forceinline__ void issue_values(uint32_t v_base, uint64_t ones = 0) {
    static_assert(kTensorCoreSums || !kWithSums, "the row sums are P·ones only with kTensorCoreSums");
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j) fence_accumulators(o_acc[j]);
    if constexpr (kWithSums) fence_accumulators(sum_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      if constexpr (kWideWgmma) {
        wgmma_rs<T, kHeadDim, 1>(output(), p_frag[kk], smem_descriptor_128b(v_base + kk * 16 * 128, kBlockN * 128), 1);
      } else {
#pragma unroll
        for (int j = 0; j < kDBlocks; ++j) {
          const uint32_t address = v_base + j * kBlockN * 128 + kk * 16 * 128;
          wgmma_rs<T, 64, 1>(o_acc[j], p_frag[kk], smem_descriptor_128b(address, kBlockN * 128), 1);
        }
      }
      if constexpr (kWithSums) wgmma_rs<T, 8, 0>(sum_acc, p_frag[kk], ones, 1);
    }
    wgmma_commit();
  }

  // kTensorCoreSums: the row sums += P·ones as a group of their own (issue_values<false> then left them out), so
  // that a kernel can issue these narrow wgmmas later than P·V.
  __device__ __forceinline__ void issue_row_sums(uint64_t ones) {
    static_assert(kTensorCoreSums, "the row sums are P·ones only with kTensorCoreSums");
    fence_accumulators(sum_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) wgmma_rs<T, 8, 0>(sum_acc, p_frag[kk], ones, 1);
    wgmma_commit();
  }

  // After the wait that saw them done: every later read of the accumulators stays below it.
  __device__ __forceinline__ void scores_landed() {
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) fence_accumulators(s[j]);
  }
  __device__ __forceinline__ void output_landed() {
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j) fence_accumulators(o_acc[j]);
    if constexpr (kTensorCoreSums) fence_accumulators(sum_acc);
  }

  // Online softmax of the tile in s, whose first key is `first_key`: masks (only on a tile that reaches
  // past the keys or, causal, across the diagonal of the warpgroup's rows from `group_row`; this lane's
  // rows are `warp_row` and warp_row + 8), the new row maxima, P = exp2(S · score_scale - max) in place.
  // `correction` gets the factor O must be multiplied by (per row), once O's running P·V is done.
  // kSpeculate (phase 9's SPECULATE; every row's running maximum finite): P against the running maxima at once,
  // the tile's maximum found beside the exponentials rather than before them, only to check the guess; the
  // maxima stay, `correction` is 1, and `risen` says whether one of this lane's rows rose by more than
  // kSpeculationSlack (its P is then wrong: the caller computes the tile again).
  template <bool kSpeculate = false>
  __device__ __forceinline__ void softmax(int first_key, const FlashParams& params, int group_row, int warp_row,
                                          int t, float score_scale, float (&correction)[2]) {
    const auto exp2_ = [](float x) { return kExactExp ? static_cast<float>(exp2(static_cast<double>(x))) : fast_exp2(x); };
    if (first_key + kBlockN > params.seqlen_k || (params.causal && first_key + kBlockN - 1 > group_row)) {
#pragma unroll
      for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int key = first_key + j * 64 + i / 4 * 8 + 2 * t + i % 2;
          if (key >= params.seqlen_k || (params.causal && key > warp_row + i % 4 / 2 * 8)) s[j][i] = -INFINITY;
        }
    }
    if constexpr (kSpeculate) {
      static_assert(kTensorCoreSums, "softmax<true> leaves the row sums to P·ones");
      risen = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float old_max = row_max[h];
        // the maximum first in the source, in four chains: ptxas then reads each score for it before the
        // exponential overwrites it, rather than keeping copies of the scores
        float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
          for (int c = 0; c < 8; ++c) m[c % 4] = fmaxf(m[c % 4], fmaxf(s[j][4 * c + 2 * h], s[j][4 * c + 2 * h + 1]));
#pragma unroll
        for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
          for (int c = 0; c < 8; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[j][4 * c + 2 * h + e];
              x = exp2_(x * score_scale - old_max);
            }
        const float tile_max = quad_max(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]))) * score_scale;
        risen |= tile_max > old_max + kSpeculationSlack;
        correction[h] = 1.f;
      }
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {   // rows g (h = 0) and g + 8 (h = 1): a row's values are in one quad
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
        for (int c = 0; c < 8; ++c) tile_max = fmaxf(tile_max, fmaxf(s[j][4 * c + 2 * h], s[j][4 * c + 2 * h + 1]));
      tile_max = quad_max(tile_max) * score_scale;
      const float old_max = row_max[h];
      const float new_max = tile_max > old_max + static_cast<float>(kRescaleSlack) ? tile_max : old_max;
      const float base = new_max == -INFINITY ? 0.f : new_max;   // a row with no visible key so far
      correction[h] = exp2_(old_max - base);
      row_max[h] = new_max;
      if constexpr (!kTensorCoreSums) row_sum[h] *= correction[h];
#pragma unroll
      for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
        for (int c = 0; c < 8; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[j][4 * c + 2 * h + e];
            x = exp2_(x * score_scale - base);
            if constexpr (!kTensorCoreSums) row_sum[h] += kSumRoundedP ? to_float(from_float<T>(x)) : x;
          }
    }
  }

  __device__ __forceinline__ void rescale_output(const float (&correction)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (correction[h] == 1.f) continue;   // the usual case once the maxima settle
      if constexpr (kTensorCoreSums) {
        sum_acc[2 * h] *= correction[h];
        sum_acc[2 * h + 1] *= correction[h];
      }
#pragma unroll
      for (int j = 0; j < kDBlocks; ++j)
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          o_acc[j][4 * c + 2 * h] *= correction[h];
          o_acc[j][4 * c + 2 * h + 1] *= correction[h];
        }
    }
  }

  // P in A-fragment order: k16 slice kk is 8-key chunks 2kk and 2kk + 1 of the S accumulators.
  __device__ __forceinline__ void pack_probabilities() {
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const float* lo = &s[kk / 4][(kk % 4) * 8];
      p_frag[kk][0] = pack2<T>(lo[0], lo[1]);
      p_frag[kk][1] = pack2<T>(lo[2], lo[3]);
      p_frag[kk][2] = pack2<T>(lo[4], lo[5]);
      p_frag[kk][3] = pack2<T>(lo[6], lo[7]);
    }
  }

  // Epilogue: the quad's row sums, normalise, write this lane's rows of (batch, head) that exist, 16 bytes per
  // store after a quad transpose (kWideStores) or 4 (common/fragment_store.cuh).
  template <bool kWideStores = true>
  __device__ __forceinline__ void store_output(const FlashParams& params, int batch, int head, int warp_row, int t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // (quad_sum: every lane joins the shuffle)
      const float inv_sum = 1.f / (kTensorCoreSums ? sum_acc[2 * h] : quad_sum(row_sum[h]));
      const int row = warp_row + h * 8;
      T* o = row < params.seqlen_q ? row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, row) : nullptr;
      store_fragment_row<kWideStores, kDBlocks * 8>(o, t, [&](int c) {
        return pack2<T>(o_acc[c / 8][4 * (c % 8) + 2 * h] * inv_sum, o_acc[c / 8][4 * (c % 8) + 2 * h + 1] * inv_sum);
      });
    }
  }
};
