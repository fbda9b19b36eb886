// Phase 10 — split-KV: small problems spread over the whole GPU, the keys of each query tile split
// across a cluster of CTAs that combine their partial results through distributed shared memory.
//
// What changed vs phase 7, and why. At the mission shape (1x8x512x64) phase 7's 128-row query tiles
// make 32 CTAs for 132 SMs. Its key-split path reaches 128 by cutting query tiles to 32 rows and
// splitting each tile's keys among the warps of one CTA, so every CTA still streams all of its head's
// keys. Here the keys of one query tile are split across `splits` CTAs (flash-decoding's idea), so
// the grid has query tiles x heads x splits CTAs, chosen to fill one wave:
//   - each CTA runs phase 7's register-resident loop (mma.sync, ldmatrix from swizzled tiles,
//     cp.async ring, exp2 with the scale folded) over its slice of the key tiles, 16 rows per warp;
//   - the `splits` CTAs of a query tile are one thread-block cluster (sm_90). CTA r combines rows
//     [r R, (r + 1) R) of the tile (R = BLOCK_M / splits): every CTA sends it the un-normalised O,
//     row maxima and row sums of those rows with remote stores into its shared memory ("inbox");
//     after a cluster barrier it combines them locally, O = sum_i 2^(m_i - m) O_i / sum_i
//     2^(m_i - m) l_i, and writes them. No workspace in global memory, no second kernel, no
//     counter to reset, and no CTA waits on a remote load. A CTA may be written to only once it
//     has started: each arrives (relaxed) at the cluster barrier first thing, and waits on it
//     before its first send (compute-sanitizer's racecheck flags the sends otherwise).
// Without clusters (before sm_90) every query tile keeps all its keys (splits = 1): correct
// everywhere, and the split only where the hardware combines.
// The softmax rescales exactly (no lazy slack): a CTA sees few key tiles, so it would rarely pay.
// Causal: each query tile's visible keys (up to its last row) are split evenly, so the CTAs of a
// cluster finish together; a warp whose rows see none of a tile skips it.
//
// Switches: BLOCK_M (query rows per CTA, 16 per warp; BLOCK_M_D128 at D = 128), BLOCK_N, STAGES,
// MAX_SPLITS (the largest cluster the heuristic picks; at most 8, the portable size), SPLITS (-1:
// chosen from the SM count; N > 0: exactly N where clusters exist), WAVE_CTAS_PER_SM (the grid the
// split may grow to, per SM), WIDE_STORES (1: O leaves in 16-byte stores, a quad's words transposed
// first where a lane holds two columns; 0: 4-byte stores, phase 7's epilogue). Defaults are the
// H100's; flashcore_nb/phases.py overrides them for other GPUs.
//
// Measured, in results/nvidia-h100-80gb-hbm3/: p10_splitkv.json; each switch changed in turn,
// experiments/p10_splitkv_ablations.json; chapter 10.
//
// Knowingly does not support: GPUs before sm_80; head dims other than 64 and 128; inputs not
// aligned to 16 bytes.
#include <algorithm>
#include <cmath>

#include "common/async_copy.cuh"
#include "common/cluster.cuh"
#include "common/dispatch.cuh"
#include "common/fragment_store.cuh"
#include "common/launch.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"
#include "common/swizzled_tile.cuh"
#include "common/warp_reduce.cuh"

#ifndef BLOCK_M
#define BLOCK_M 64
#endif
#ifndef BLOCK_M_D128
#define BLOCK_M_D128 64
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef MAX_SPLITS
#define MAX_SPLITS 2
#endif
#ifndef SPLITS
#define SPLITS -1
#endif
#ifndef WAVE_CTAS_PER_SM
#define WAVE_CTAS_PER_SM 1
#endif
#ifndef WIDE_STORES
#define WIDE_STORES 1
#endif

static_assert(MAX_SPLITS >= 1 && MAX_SPLITS <= 8, "MAX_SPLITS: 1..8 CTAs per cluster (the portable limit)");
static_assert(SPLITS == -1 || (SPLITS >= 1 && SPLITS <= MAX_SPLITS && BLOCK_M % SPLITS == 0 && BLOCK_M_D128 % SPLITS == 0),
              "SPLITS: -1 (automatic) or 1..MAX_SPLITS, dividing BLOCK_M and BLOCK_M_D128 (each CTA combines an equal share of rows)");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES: 2..4 (a copy runs STAGES - 1 tiles ahead)");
static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 128, "BLOCK_N: a multiple of 16, at most 128");

constexpr int kWarpRows = 16;   // query rows per warp: one m16 tile

template <int kHeadDim>
struct Tiles {
  static constexpr int kBlockM = kHeadDim == 128 ? BLOCK_M_D128 : BLOCK_M;
  static constexpr int kWarps = kBlockM / kWarpRows;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockM % kWarpRows == 0 && kWarps >= 1 && kWarps <= 16, "BLOCK_M: 16..256 rows, 16 per warp");
};

template <typename T, int kHeadDim>
struct SharedStorage {
  static constexpr int kBlockM = Tiles<kHeadDim>::kBlockM;
  // Inbox rows padded by 8 floats: a quad's float2 stores of 8 rows then cover all 32 banks.
  static constexpr int kInboxPitch = kHeadDim + 8;
  T q_tile[kBlockM * kHeadDim];
  T k_tile[STAGES][BLOCK_N * kHeadDim];
  T v_tile[STAGES][BLOCK_N * kHeadDim];
  // What the cluster's CTAs send this one: for each split i, the un-normalised O, row maxima (log2
  // units, scale folded in; -inf: no visible key) and row sums of the rows this CTA combines, at
  // rows i * (kBlockM / splits) + r. Apart from the tiles, so a CTA may send while others still compute.
  struct {
    float o[kBlockM][kInboxPitch];
    float row_max[kBlockM];
    float row_sum[kBlockM];
  } inbox;
};

template <typename T, int kHeadDim, bool kClustered>
__global__ void __launch_bounds__(Tiles<kHeadDim>::kThreads) attention_splitkv_kernel(const FlashParams params) {
  constexpr int kBlockM = Tiles<kHeadDim>::kBlockM, kThreads = Tiles<kHeadDim>::kThreads;
  constexpr int kDTiles = kHeadDim / 8, kKeyTiles = BLOCK_N / 8, kFetchAhead = STAGES - 1;
  using Smem = SharedStorage<T, kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;   // this lane's row in an 8-row group, and its column pair
  const int seqlen_q = params.seqlen_q, seqlen_k = params.seqlen_k;
  const bool causal = params.causal;

  // The query tile and this CTA's slice of its key tiles. A cluster is the `splits` consecutive CTAs
  // of one query tile. Causal: the last query tiles, whose rows see the most keys, come first.
  int splits = 1;
#if __CUDA_ARCH__ >= 900
  if constexpr (kClustered) {
    splits = static_cast<int>(cluster_size());
    cluster_arrive_relaxed();   // this CTA has started: the others may send to it once they see all have
  }
#endif
  const int split = blockIdx.x % splits, item = blockIdx.x / splits;
  const int q_blocks = (seqlen_q + kBlockM - 1) / kBlockM, heads_total = params.batch * params.heads;
  const int q_block = causal ? q_blocks - 1 - item / heads_total : item % q_blocks;
  const int head_index = causal ? item % heads_total : item / q_blocks;
  const int head = head_index % params.heads, batch = head_index / params.heads;
  const int q_start = q_block * kBlockM;
  const int kv_end = causal ? min(seqlen_k, q_start + kBlockM) : seqlen_k;   // top-left causal
  const int num_tiles = (kv_end + BLOCK_N - 1) / BLOCK_N;
  const int tile_begin = split * num_tiles / splits, tile_end = (split + 1) * num_tiles / splits;

  const T* q_rows = row_ptr(static_cast<const T*>(params.q), params.q_strides, batch, head, 0);
  const T* k_rows = row_ptr(static_cast<const T*>(params.k), params.k_strides, batch, head, 0);
  const T* v_rows = row_ptr(static_cast<const T*>(params.v), params.v_strides, batch, head, 0);
  const auto fetch = [&](int tile) {   // K and V of key tile `tile` into its ring buffer
    if (tile >= tile_end) return;
    const int buffer = (tile - tile_begin) % STAGES;
    copy_tile_async<BLOCK_N, kHeadDim, kThreads>(smem.k_tile[buffer], k_rows, params.k_strides[2],
                                                 tile * BLOCK_N, seqlen_k);
    copy_tile_async<BLOCK_N, kHeadDim, kThreads>(smem.v_tile[buffer], v_rows, params.v_strides[2],
                                                 tile * BLOCK_N, seqlen_k);
  };
  if (tile_begin < tile_end)
    copy_tile_async<kBlockM, kHeadDim, kThreads>(smem.q_tile, q_rows, params.q_strides[2], q_start, seqlen_q);
  for (int ahead = 0; ahead < kFetchAhead; ++ahead) {   // Q travels with the first tile's group
    fetch(tile_begin + ahead);
    cp_async_commit();
  }

  const int first_row = q_start + warp * kWarpRows, last_row = first_row + kWarpRows - 1;
  const FragmentRow<kHeadDim, T> q_row(warp * kWarpRows + lane % 16, lane / 16);
  // K (B operand of Q·Kᵀ): matrices {keys 0-7, 8-15} x {d 0-7, 8-15}; V (B of P·V, transposed):
  // {keys 0-7, 8-15} x {d 0-7, 8-15} in the other order.
  const FragmentRow<kHeadDim, T> k_row(lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
  const FragmentRow<kHeadDim, T> v_row(lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
  const float score_scale = params.scale * 1.4426950408889634f;   // exp(x) = 2^(x log2 e)
  uint32_t q_frag[kHeadDim / 16][4];
  float o_acc[kDTiles][4] = {};   // O rows g and g + 8, two columns per 8-wide D tile
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};   // sum: this lane's columns

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    cp_async_wait<kFetchAhead - 1>();   // this thread's copies of the tile have landed
    __syncthreads();                     // ... every thread's, and the buffer refilled next is free
    fetch(tile + kFetchAhead);
    cp_async_commit();
    if (tile == tile_begin) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
        ldmatrix_x4(q_frag[kk], smem_address(smem.q_tile) + q_row.at(0, kk));
    }
    const int key0 = tile * BLOCK_N;
    if (causal && key0 > last_row) continue;   // warp-uniform: no row of this warp sees the tile
    const int buffer = (tile - tile_begin) % STAGES;

    // S = Q·Kᵀ: one x4 ldmatrix gives the B fragments of two 8-key tiles.
    float s[kKeyTiles][4] = {};
    const uint32_t k_tile = smem_address(smem.k_tile[buffer]);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + k_row.at(np * 16, kk));
        mma_16816<T>(s[2 * np], q_frag[kk], {b[0], b[1]});
        mma_16816<T>(s[2 * np + 1], q_frag[kk], {b[2], b[3]});
      }
    if (key0 + BLOCK_N > seqlen_k || (causal && key0 + BLOCK_N - 1 > first_row)) {
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + j * 8 + 2 * t + (e & 1), query = first_row + g + (e >> 1) * 8;
          if (key >= seqlen_k || (causal && key > query)) s[j][e] = -INFINITY;
        }
    }

    // Online softmax for rows g (h = 0) and g + 8 (h = 1): S -> P in place, O rescaled when a
    // row's maximum moved.
    float correction[2];
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      const float new_max = fmaxf(row_max[h], quad_max(tile_max) * score_scale);
      const float base = new_max == -INFINITY ? 0.f : new_max;   // a row with no visible key so far
      moved |= new_max != row_max[h];
      correction[h] = fast_exp2(row_max[h] - base);
      row_max[h] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[j][e] = fast_exp2(s[j][e] * score_scale - base);
          sum += s[j][e];
        }
      row_sum[h] = row_sum[h] * correction[h] + sum;
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int d = 0; d < kDTiles; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[d][e] *= correction[e / 2];
    }

    // O += P·V: two neighbouring 8-key S tiles are one 16-key A fragment.
    const uint32_t v_tile = smem_address(smem.v_tile[buffer]);
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + v_row.at(kk * 16, dp));
        mma_16816<T>(o_acc[2 * dp], a, {b[0], b[1]});
        mma_16816<T>(o_acc[2 * dp + 1], a, {b[2], b[3]});
      }
    }
  }

  if constexpr (!kClustered) {
    // The whole key range was this CTA's: normalise and write the rows that exist (common/fragment_store.cuh).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv_sum = 1.f / quad_sum(row_sum[h]);   // every lane joins the shuffle
      const int query = first_row + g + h * 8;
      T* o = query < seqlen_q ? row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, query) : nullptr;
      store_fragment_row<WIDE_STORES, kDTiles>(o, t, [&](int d) {
        return pack2<T>(o_acc[d][2 * h] * inv_sum, o_acc[d][2 * h + 1] * inv_sum);
      });
    }
  } else {
#if __CUDA_ARCH__ >= 900
    // Send each row's partial state to the CTA that combines it: CTA r combines rows
    // [r R, (r + 1) R) of the tile, R = kBlockM / splits. Remote stores do not wait for an answer.
    const int rows_per_rank = kBlockM / splits;
    cluster_wait();   // every CTA of the cluster has started (long ago, by now): its inbox exists
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * kWarpRows + g + h * 8;
      const uint32_t rank = row / rows_per_rank, slot = split * rows_per_rank + row % rows_per_rank;
      const uint32_t to = cluster_map(&smem.inbox.o[slot][2 * t], rank);
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) cluster_store_float2(to + d * 8 * sizeof(float), o_acc[d][2 * h], o_acc[d][2 * h + 1]);
      const float sum = quad_sum(row_sum[h]);
      if (t == 0) {
        cluster_store_float(cluster_map(&smem.inbox.row_max[slot], rank), row_max[h]);
        cluster_store_float(cluster_map(&smem.inbox.row_sum[slot], rank), sum);
      }
    }
    cluster_arrive();
    cluster_wait();   // every CTA's sends have landed; none is sent after this, so any CTA may exit

    // Combine this CTA's rows from its inbox, eight columns per thread and step:
    // O = sum_i 2^(m_i - m) O_i / sum_i 2^(m_i - m) l_i, with m the largest m_i.
    const int row0 = static_cast<int>(cluster_rank()) * rows_per_rank;
    constexpr int kChunks = kHeadDim / 8;
    for (int index = threadIdx.x; index < rows_per_rank * kChunks; index += kThreads) {
      const int local = index / kChunks, col = index % kChunks * 8;
      float max_all = -INFINITY;
      for (int i = 0; i < splits; ++i) max_all = fmaxf(max_all, smem.inbox.row_max[i * rows_per_rank + local]);
      const float base = max_all == -INFINITY ? 0.f : max_all;
      float sum_all = 0.f, acc[8] = {};
      for (int i = 0; i < splits; ++i) {
        const int slot = i * rows_per_rank + local;
        const float w = fast_exp2(smem.inbox.row_max[slot] - base);   // 0 for a split that saw no key of the row
        sum_all += w * smem.inbox.row_sum[slot];
        const float4 lo = *reinterpret_cast<const float4*>(&smem.inbox.o[slot][col]);
        const float4 hi = *reinterpret_cast<const float4*>(&smem.inbox.o[slot][col + 4]);
        acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
        acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
      }
      const int query = q_start + row0 + local;
      if (query < seqlen_q) {
        const float inv_sum = 1.f / sum_all;
        T* o = row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, query) + col;
        uint32_t words[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) words[c] = pack2<T>(acc[2 * c] * inv_sum, acc[2 * c + 1] * inv_sum);
        if (WIDE_STORES) {
          *reinterpret_cast<uint4*>(o) = make_uint4(words[0], words[1], words[2], words[3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) *reinterpret_cast<uint32_t*>(o + 2 * c) = words[c];
        }
      }
    }
#endif
  }
}

// How many CTAs split each query tile's keys: as many as keep the grid within one wave
// (WAVE_CTAS_PER_SM per SM) and give every CTA at least one key tile; 1 without clusters.
template <int kHeadDim>
static cudaError_t choose_splits(const FlashParams& p, long long items, int* splits) {
  *splits = 1;
  int device = 0, sms = 0;
  bool clusters = false;
  cudaError_t err;
  if ((err = cudaGetDevice(&device)) != cudaSuccess || (err = device_has_clusters(device, &clusters)) != cudaSuccess)
    return err;
  if (!clusters) return cudaSuccess;
  if (SPLITS > 0) {
    *splits = SPLITS;
    return cudaSuccess;
  }
  if ((err = device_sm_count(device, &sms)) != cudaSuccess) return err;
  constexpr int kBlockM = Tiles<kHeadDim>::kBlockM;
  const int longest = p.causal ? std::min(p.seqlen_k, (p.seqlen_q + kBlockM - 1) / kBlockM * kBlockM) : p.seqlen_k;
  const int key_tiles = (longest + BLOCK_N - 1) / BLOCK_N;
  const long long wave = static_cast<long long>(sms) * WAVE_CTAS_PER_SM;
  while (*splits * 2 <= MAX_SPLITS && kBlockM % (*splits * 2) == 0 && items * *splits * 2 <= wave &&
         *splits * 2 <= key_tiles)
    *splits *= 2;
  return cudaSuccess;
}

template <typename T, int kHeadDim>
cudaError_t launch(cudaStream_t stream, const FlashParams& p) {
  using Cfg = Tiles<kHeadDim>;
  constexpr size_t kSmem = sizeof(SharedStorage<T, kHeadDim>);
  const long long items = static_cast<long long>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.heads * p.batch;
  int splits = 1;
  const cudaError_t err = choose_splits<kHeadDim>(p, items, &splits);
  if (err != cudaSuccess) return err;
  if (items * splits > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(items * splits));
  if (splits == 1)
    return launch_kernel<attention_splitkv_kernel<T, kHeadDim, false>>(grid, Cfg::kThreads, kSmem, stream, p);
  return launch_clustered<attention_splitkv_kernel<T, kHeadDim, true>>(grid, splits, Cfg::kThreads, kSmem, stream, p);
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? sizeof(SharedStorage<__half, 128>) : sizeof(SharedStorage<__half, 64>);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  return dispatch_dtype_head_dim(*params, [&](auto element, auto head_dim) {
    return launch<decltype(element), decltype(head_dim)::value>(stream, *params);
  });
}
