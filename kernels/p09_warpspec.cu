// Phase 9 — Hopper's producer/consumer kernel: TMA copies, warp specialisation, ping-pong.
//
// What changed vs phase 8, and why. Phase 8 computes with wgmma, but every thread of its CTA also
// copies (per-thread cp.async address arithmetic in the loop), and both warpgroups meet at one
// __syncthreads per key tile, so they run in lockstep: both do their softmax at the same time while
// the tensor cores wait. Here the CTA's warpgroups take roles:
//   - warpgroup 0 is the producer. One of its threads asks the copy engine (TMA, common/tma.cuh) for
//     whole tiles, described once on the host by a tensor map: Q once, then K and V tile by tile into
//     a ring of STAGES buffers. The copy engine writes the 128B-swizzled layout wgmma reads and fills
//     rows past the end of a head with zeros, so ragged lengths need no per-row code. The producer
//     keeps only 24 registers (setmaxnreg) and hands the rest to the consumers.
//   - warpgroups 1..CONSUMERS are consumers: 64 query rows each, phase 8's wgmma + online softmax,
//     with no copy code at all. They wait on mbarriers (common/mbarrier.cuh) for a buffer to be
//     full, and tell the producer when they are done with it (the "empty" barrier); no CTA-wide
//     barrier is left in the loop.
// Switches, one per step of chapter 9 (each changes the speed, never the result):
//   OVERLAP=1  each step issues tile t's Q·Kᵀ together with tile t-1's P·V, so a warpgroup's softmax
//              runs while its own P·V is in flight (FlashAttention-3's intra-warpgroup pipelining);
//   PINGPONG=1 (needs OVERLAP) the consumer warpgroups take turns, round robin, to issue their wgmmas
//              through one named barrier each, so one's softmax overlaps the others' GEMMs;
//   Q_IN_SHARED=1 Q·Kᵀ reads Q from shared memory, not registers (room for three consumers; D = 64,
//              and Q_IN_SHARED_D128 for D = 128);
//   PERSISTENT=1 one CTA per SM walks the work items (query tiles of a head; causal: the longest
//              first), so the producer loads the next item's Q and K while the consumers finish
//              this one, and no SM waits for a new CTA to start.
//   SNAKE=1    (with PERSISTENT, where no counter runs) the CTAs take rounds of items, one each, every other round
//              in reverse, so under a causal mask the CTA that took a round's shortest tile takes the next
//              round's longest;
//   CAUSAL_GROUP_MB=n  the causal work order takes the heads in groups, longest tiles first within a group,
//              so that a head's query tiles run close together in time and read its K and V from L2: a
//              group has at most half as many heads as there are CTAs (each head's tiles then run two or
//              more at a time) and at most as many as have their K and V in n MB (of the H100's 50 MB of
//              L2). n = 0: all heads in one group;
//   SPECULATE=1 (with OVERLAP) from a row's second key tile on, the softmax takes its exponentials against the
//              row's running maximum at once, instead of first waiting for the tile's maximum (a max over the
//              tile and two shuffles); the tile's maximum, found beside them, only checks the guess. Where a
//              row's maximum rose by more than 2^8 (WarpgroupAttention's kSpeculationSlack) the warp computes its
//              rows of the tile's scores again by mma.sync (K is still in its buffer) and takes the usual
//              softmax; otherwise the running maximum stays and P reaches 2^8 at most. The row sums are then
//              P·ones on the tensor cores, with each P·V (P as rounded to 16 bits in both: the only change to
//              the result, a rounding one);
//   SUMS_AFTER_TURN=1 (with SPECULATE; at D = 64 SUMS_IN_VALUES puts them in P·V instead) the row sums' P·ones,
//              eight narrow wgmmas (N = 8), are issued as a group of their own once the warpgroup has handed its turn
//              over (PINGPONG), not beside P·V inside the turn: a turn lasts as long as its wgmmas take to issue,
//              however little each computes, and the other warpgroups wait for it;
//   SUMS_IN_VALUES=1 (with SPECULATE and WIDE_WGMMA, D = 64) the row sums' P·ones are no wgmmas of their own: each
//              P·V wgmma is 8 columns wider (N = 72), the last 8 a block of ones (issue_values_and_sums), so a step
//              issues half the wgmmas into the tensor cores' queue and none of them 8 columns narrow. (At D = 128
//              V's two 64-column blocks already fill the descriptor's one stride, and the sums stay apart.)
//   WIDE_WGMMA=1 one wgmma per 16-wide slice of the reduction, as wide as the tile: N = BLOCK_N keys for Q·Kᵀ and
//              N = D columns for P·V, where phase 8 issues one per 64 (two per slice at 128 keys or D = 128). A
//              wider wgmma reads its A operand (Q or P) once for all N columns, and the step issues half the
//              instructions; the accumulators are laid out the same either way;
//   CARRY_OVER=1 (with OVERLAP) a work item's last P·V is not issued alone at the item's end but beside the next
//              item's first Q·Kᵀ, in its first step, and the item's O is written there, once that P·V has
//              landed: without it, each item starts with a Q·Kᵀ alone and ends with a P·V alone and its
//              epilogue, and a persistent CTA's consumers idle at every item boundary. Not for rows that end
//              before the item's last key tile (causal), whose buffers the producer needs back sooner. Off by
//              default: since the 16-byte stores of O it measures slower at every timing shape (chapter 9);
//   WIDE_STORES=1 O's epilogue stores 16 bytes per lane (a quad transposes its words first), whole 32-byte sectors
//              per warp and row, not 4 bytes per lane, half sectors (WarpgroupAttention::store_output);
//   DYNAMIC=1  (with PERSISTENT) a CTA's next work item is the next one no CTA has taken yet (a counter in
//              global memory its producer bumps, the item handed to the consumers beside Q), not the next
//              of a fixed round robin: CTAs whose items ran short take more, whatever the work order, so
//              head groups cost no balance (a round robin over groups gives some CTAs every long tile).
//              DYNAMIC=2: the counter under a causal mask only, where items differ in length; without one
//              the launch takes a build with no counter code at all (a template parameter, not a branch:
//              the counter's code costs its time even where a branch skips it, chapter 9);
//   SPLIT_KEYS=1 (with OVERLAP, not CARRY_OVER) a work item is 64 query rows, and the consumers split its key
//              tiles between them (consumer c takes tiles c, c + CONSUMERS, ...), each keeping its own O, row
//              maxima and sums; at the end the others leave theirs in shared memory and consumer 0 combines
//              them and writes O. For problems too small to fill the GPU: a warpgroup walks a third or half
//              of the keys in a row, and the item's chain of steps is that much shorter. The warpgroups share one
//              SM's tensor cores and schedulers, and at the mission shape it ties with one consumer (chapter 9);
//   CLUSTER_KEYS=n (with OVERLAP, not CARRY_OVER or the counter) the n CTAs of a thread-block cluster take the
//              same work item and split its key tiles (CTA r takes tiles r, r + n, ...; with SPLIT_KEYS its
//              consumers split those again). The others send their partial results into CTA 0's shared memory
//              (distributed shared memory: asynchronous stores whose bytes an mbarrier of CTA 0 counts), and CTA 0
//              combines them and writes O. For problems too small to fill the GPU: one item's keys on the tensor
//              cores and MUFUs of n SMs;
//   SEND_ASYNC=1 (with CLUSTER_KEYS) the sends are asynchronous stores (st.async) that count their bytes on CTA 0's
//              mbarrier as they land; SEND_ASYNC=0 sends by plain stores into CTA 0's shared memory, then arrives
//              there with release semantics, which waits for the stores to land (slower: chapter 9);
// TRACE=1 is the instrumented build (common/trace.cuh; off by default, and then the machine code is the
// uninstrumented kernel's): one thread of each warpgroup of CTA 0 stamps every copy issued, barrier wait,
// wgmma issued and waited for, softmax, epilogue and ping-pong turn, for chapter 9's measured timeline
// (python -m flashcore_nb trace). It is never timed.
// The softmax is phase 7's: exp2 with log2(e) folded into the scale, O rescaled only when a row's
// (exact) maximum moves, masks only on the tiles that need them, tiles right of the diagonal never
// loaded, the longest causal rows first.
//
// Tile parameters: CONSUMERS, BLOCK_N and STAGES for D = 64; CONSUMERS_D128, BLOCK_N_D128 and
// STAGES_D128 for D = 128. A CTA holds CONSUMERS x 64 query rows. The defaults are for large problems
// (chapter 9's ablation): two consumers with Q in registers, 128 query rows per CTA, at both head dims (three
// at D = 64 read Q from shared memory to fit their registers, a candidate of `attention`; at D = 128 three fit
// only on 64-key tiles). One consumer (64 rows per CTA, no ping-pong, no register split) doubles the CTAs of a
// problem too small to fill the GPU: another candidate.
//
// Knowingly does not support: any GPU but sm_90 (wgmma, setmaxnreg: sm_90a); head dims other than 64
// and 128; inputs not aligned to 16 bytes (TMA needs 16-byte aligned bases and strides).
#include <algorithm>
#include <atomic>

#include "common/cluster.cuh"
#include "common/dispatch.cuh"
#include "common/launch.cuh"
#include "common/mbarrier.cuh"
#include "common/params.cuh"
#include "common/shared_memory.cuh"
#include "common/tma.cuh"
#include "common/trace.cuh"
#include "common/warp_specialize.cuh"
#include "common/wgmma_attention.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "p09_warpspec needs wgmma and setmaxnreg: compile it for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef CONSUMERS_D128
#define CONSUMERS_D128 2
#endif
#ifndef BLOCK_N_D128
#define BLOCK_N_D128 128
#endif
#ifndef STAGES_D128
#define STAGES_D128 3
#endif
#ifndef WIDE_STORES
#define WIDE_STORES 1
#endif
#ifndef OVERLAP
#define OVERLAP 1
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#ifndef PERSISTENT
#define PERSISTENT 1
#endif
// Q_IN_SHARED=1: Q·Kᵀ reads Q from its shared-memory tile (both wgmma operands from shared memory), so a
// consumer keeps no Q fragments in registers: 16 (D = 64) or 32 (D = 128) registers fewer, the room three
// consumers of 160 registers need for 128-key tiles. Q's buffer is then released after the work item's last
// Q·Kᵀ instead of once Q is in registers. Off by default: two consumers read Q faster from registers, and three
// at D = 64 (a candidate of `attention`) need it on to fit (Q_IN_SHARED_D128 for D = 128).
#ifndef Q_IN_SHARED
#define Q_IN_SHARED 0
#endif
#ifndef Q_IN_SHARED_D128
#define Q_IN_SHARED_D128 0
#endif
#ifndef SNAKE
#define SNAKE 1
#endif
#ifndef CAUSAL_GROUP_MB
#define CAUSAL_GROUP_MB 32
#endif
#ifndef DYNAMIC
#define DYNAMIC 2
#endif
#ifndef SPLIT_KEYS
#define SPLIT_KEYS 0
#endif
#ifndef CLUSTER_KEYS
#define CLUSTER_KEYS 1
#endif
#ifndef SEND_ASYNC
#define SEND_ASYNC 1
#endif
#ifndef SPECULATE
#define SPECULATE 1
#endif
#ifndef SUMS_AFTER_TURN
#define SUMS_AFTER_TURN 1
#endif
#ifndef WIDE_WGMMA
#define WIDE_WGMMA 1
#endif
#ifndef CARRY_OVER
#define CARRY_OVER 0
#endif
#ifndef SUMS_IN_VALUES
#define SUMS_IN_VALUES 1
#endif
// Persistent CTAs: -1 for one per SM; a positive count makes a few CTAs walk many work items (tests).
#ifndef PERSISTENT_CTAS
#define PERSISTENT_CTAS -1
#endif

// SUMS_IN_VALUES (D = 64): O += P·V and the row sums += P·ones in one wgmma per k16 slice of the keys, N = 72: O's 64
// columns from V's tile and the sums' 8 from a block of ones. V is read transposed (MN-major), and an MN-major B wider
// than 64 takes its next 64 columns from the descriptor's leading offset away: that offset is made to reach the
// ones, wherever the slice of V lies. The 36 accumulators are O's 32 and the sums' 4, laid out as they are apart.
#define P09_VALUES_AND_SUMS(TYPE)                                                                                   \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %41, 0;\n"                                    \
               "wgmma.mma_async.sync.aligned.m64n72k16.f32." TYPE "." TYPE "\n{" FC_ACC "},\n"                    \
               "{%36, %37, %38, %39}, %40, accumulate, 1, 1, 1;\n}\n"                                               \
               : FC_OUT8(o, 0), FC_OUT8(o, 8), FC_OUT8(o, 16), FC_OUT8(o, 24), "+f"(sums[0]), "+f"(sums[1]),         \
                 "+f"(sums[2]), "+f"(sums[3])                                                                     \
               : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(descriptor), "r"(1))
#define FC_OUT8(a, i) "+f"(a[i]), "+f"(a[i + 1]), "+f"(a[i + 2]), "+f"(a[i + 3]), "+f"(a[i + 4]), "+f"(a[i + 5]), \
                      "+f"(a[i + 6]), "+f"(a[i + 7])
#define FC_ACC "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
               "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35"
template <typename Rows>
__device__ __forceinline__ void issue_values_and_sums(Rows& rows, uint32_t v_base, uint32_t ones_address) {
  using T = typename Rows::Element;
  float(&o)[32] = rows.o_acc[0];
  float(&sums)[4] = rows.sum_acc;
  fence_accumulators(o);
  fence_accumulators(sums);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Rows::kPSteps; ++kk) {
    const uint32_t slice = v_base + kk * 16 * 128;
    const uint64_t descriptor = smem_descriptor_128b(slice, ones_address - slice);
    const uint32_t(&p)[4] = rows.p_frag[kk];
    if constexpr (std::is_same_v<T, __half>) {
      P09_VALUES_AND_SUMS("f16");
    } else {
      P09_VALUES_AND_SUMS("bf16");
    }
  }
  wgmma_commit();
}
#undef FC_ACC
#undef FC_OUT8
#undef P09_VALUES_AND_SUMS

// SPECULATE's rare path: this warp's 16 rows of S = Q·Kᵀ again, by mma.sync, warp by warp (so the warps of a
// warpgroup need not agree to do it). Warp w's rows of a 64xN wgmma accumulator are the m16n8 tiles of
// mma.sync side by side: n-tile 8j + c is s[j][4c..4c+3]. Q's fragments come from registers, or (kQInShared)
// from Q's tile (`q_rows` rows, the warp's first at `q_first_row`); K's from its tile, as TMA wrote both.
template <bool kQInShared, typename Rows>
__device__ __forceinline__ void warp_scores(Rows& rows, const unsigned char* q_tile, int q_rows, int q_first_row,
                                            const unsigned char* k_tile, int lane) {
  constexpr int kBlockN = Rows::kKeyBlocks * 64;
#pragma unroll
  for (int j = 0; j < Rows::kKeyBlocks; ++j)
#pragma unroll
    for (int i = 0; i < 32; ++i) rows.s[j][i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Rows::kKSteps; ++kk) {
    uint32_t a[4];
    if constexpr (kQInShared) {
      ldmatrix_x4(a, smem_address(q_tile + swizzled_offset(q_rows, q_first_row + lane % 16, kk * 16 + lane / 16 * 8)));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = rows.q_frag[kk][i];
    }
#pragma unroll
    for (int pair = 0; pair < kBlockN / 16; ++pair) {   // 16 keys: two n-tiles
      uint32_t b[4];
      const int key = pair * 16 + lane / 16 * 8 + lane % 8;
      ldmatrix_x4(b, smem_address(k_tile + swizzled_offset(kBlockN, key, kk * 16 + lane / 8 % 2 * 8)));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int tile = 2 * pair + half;
        const uint32_t b_half[2] = {b[2 * half], b[2 * half + 1]};
        mma_16816<typename Rows::Element>(*reinterpret_cast<float(*)[4]>(&rows.s[tile / 8][4 * (tile % 8)]), a, b_half);
      }
    }
  }
}

// SPLIT_KEYS and CLUSTER_KEYS: warpgroups that took different key tiles of the same 64 rows combine their results
// before the epilogue. A thread holds the same rows and columns in every warpgroup (common/wgmma_attention.cuh), so
// thread i hands its partial result to thread i of the warpgroup that combines: kPartialFloats values, O's
// accumulators (un-normalised), then its rows' two maxima, then their two sums (P·ones with SPECULATE, otherwise
// this lane's share). A slot holds them 4 by 4, each thread's float4 j beside the other threads' float4 j, so that
// a warp's float4 accesses cover 512 contiguous bytes, every bank four times.
template <int kHeadDim>
constexpr int kPartialFloats = kHeadDim / 2 + 4;

__device__ __forceinline__ constexpr int partial_offset(int j, int thread) { return (j * 128 + thread) * 4; }

template <typename Rows>
__device__ __forceinline__ float& partial_sum(Rows& rows, int h) {
  return SPECULATE ? rows.sum_acc[2 * h] : rows.row_sum[h];
}

// Float4 j of this thread's partial result.
template <int kHeadDim, typename Rows>
__device__ __forceinline__ float4 partial_quad(Rows& rows, int j) {
  if (j < kHeadDim / 8) {
    const float* o = rows.output() + 4 * j;
    return make_float4(o[0], o[1], o[2], o[3]);
  }
  return make_float4(rows.row_max[0], rows.row_max[1], partial_sum(rows, 0), partial_sum(rows, 1));
}

template <int kHeadDim, typename Rows>
__device__ __forceinline__ void store_partial(Rows& rows, float* slot, int thread) {
#pragma unroll
  for (int j = 0; j < kPartialFloats<kHeadDim> / 4; ++j)
    *reinterpret_cast<float4*>(slot + partial_offset(j, thread)) = partial_quad<kHeadDim>(rows, j);
}

// CLUSTER_KEYS: arrives once at the mbarrier at shared::cluster address `bar` (this CTA's or another's), with
// release at cluster scope (this thread's earlier accesses come before whatever its waiters do next).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// CLUSTER_KEYS: the same into a slot of another CTA's shared memory, announced to that CTA's mbarrier `bar` (both
// shared::cluster addresses). SEND_ASYNC: by asynchronous stores that each count their bytes on `bar` once written,
// so the barrier's phase completes when the bytes have landed, and no fence waits for them. Otherwise by plain
// stores, then an arrival with release at cluster scope, which waits until every store has landed (about 0.8 us
// more per send in a diagnostic trace on the H100).
template <int kHeadDim, typename Rows>
__device__ __forceinline__ void send_partial(Rows& rows, uint32_t slot, uint32_t bar, int thread) {
#pragma unroll
  for (int j = 0; j < kPartialFloats<kHeadDim> / 4; ++j) {
    const float4 v = partial_quad<kHeadDim>(rows, j);
    const uint32_t address = slot + 4 * partial_offset(j, thread);
    if constexpr (SEND_ASYNC)
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
                   ::"r"(address), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar) : "memory");
    else
      asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n"
                   ::"r"(address), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
  }
  if constexpr (!SEND_ASYNC) mbarrier_arrive_cluster(bar);
}

// This thread's partial += the one in `slot`, both rescaled to the larger of the two maxima (a partial that saw no
// key has maximum -inf, sum 0 and O 0, and weighs nothing).
template <int kHeadDim, typename Rows>
__device__ __forceinline__ void merge_partial(Rows& rows, const float* slot, int thread) {
  const float4 theirs_stats = *reinterpret_cast<const float4*>(slot + partial_offset(kHeadDim / 8, thread));
  const float other_max[2] = {theirs_stats.x, theirs_stats.y}, other_sum[2] = {theirs_stats.z, theirs_stats.w};
  float mine[2], theirs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float new_max = fmaxf(rows.row_max[h], other_max[h]);
    const float base = new_max == -INFINITY ? 0.f : new_max;
    mine[h] = fast_exp2(rows.row_max[h] - base);
    theirs[h] = fast_exp2(other_max[h] - base);
    rows.row_max[h] = new_max;
    partial_sum(rows, h) = partial_sum(rows, h) * mine[h] + other_sum[h] * theirs[h];
  }
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    const float4 o = *reinterpret_cast<const float4*>(slot + partial_offset(j, thread));
    const float other[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = 4 * j + k, h = i % 4 / 2;   // accumulator element i is row g (h = 0) or g + 8 (h = 1)
      rows.output()[i] = rows.output()[i] * mine[h] + other[k] * theirs[h];
    }
  }
}

// Waits for the phase of parity `phase` of this CTA's mbarrier, with acquire at cluster scope: what other CTAs
// released with their arrivals, or wrote by st.async, is visible.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t phase) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred complete;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(phase)
        : "memory");
  }
}

// A share of `count` key tiles taken every `shares`th from `first`: how many of them fall to it.
__device__ __forceinline__ int share_of(int count, int first, int shares) {
  return max(0, (count - first + shares - 1) / shares);
}

template <int kHeadDim>
struct Tiles {
  static constexpr int kConsumers = kHeadDim == 128 ? CONSUMERS_D128 : CONSUMERS;
  static constexpr bool kQInShared = kHeadDim == 128 ? Q_IN_SHARED_D128 : Q_IN_SHARED;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // SPLIT_KEYS: the consumers share one 64-row Q tile and split its keys (with one consumer, nothing to split)
  static constexpr bool kSplitKeys = SPLIT_KEYS && kConsumers > 1;
  static constexpr int kBlockM = kSplitKeys ? 64 : 64 * kConsumers;
  // CLUSTER_KEYS: the CTAs of a cluster split an item's key tiles, and CTA 0 combines their results in its inbox:
  // a slot for each other CTA and each warpgroup that holds rows of O after the CTA's own combine (SPLIT_KEYS:
  // consumer 0), and two mbarriers (the slots are full; CTA 0 has read them, one in every other CTA).
  static constexpr int kClusterKeys = CLUSTER_KEYS;
  static constexpr int kHolders = kSplitKeys ? 1 : kConsumers;
  static constexpr int kInboxBytes =
      kClusterKeys > 1 ? (kClusterKeys - 1) * kHolders * 128 * kPartialFloats<kHeadDim> * 4 + 16 : 0;
  static constexpr int kBlockN = kHeadDim == 128 ? BLOCK_N_D128 : BLOCK_N;
  static constexpr int kStages = kHeadDim == 128 ? STAGES_D128 : STAGES;
  static constexpr bool kPingPong = PINGPONG && kConsumers > 1;   // one consumer has no one to take turns with
  // Registers per thread: every thread starts with 65536 / kThreads (rounded down to a multiple of 8,
  // ptxas's cap under __launch_bounds__(kThreads, 1)); the producer gives all but 24 back and the
  // consumers share what it freed. One consumer (256 threads) needs no split: ptxas may give every thread
  // the 255 a thread can have.
  static constexpr bool kSplitRegisters = kConsumers > 1;
  static constexpr int kStartRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      (kStartRegisters + (kStartRegisters - kProducerRegisters) / kConsumers) / 8 * 8 > 240
          ? 240
          : (kStartRegisters + (kStartRegisters - kProducerRegisters) / kConsumers) / 8 * 8;
  // Shared memory: Q, then the K ring, then the V ring, each tile [kHeadDim / 64][rows][64] with
  // 128-byte rows (TMA writes one box per 64 columns); the mbarriers after them.
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;
  static constexpr bool kSumsInValues = SPECULATE && SUMS_IN_VALUES && WIDE_WGMMA && kHeadDim == 64;
  // the ones of the row sums' P·ones: one swizzle atom, or (kSumsInValues) the 16 rows a k16 slice of V has
  static constexpr int kOnesBytes = kSumsInValues ? 16 * 128 : SPECULATE ? 1024 : 0;
  // SPLIT_KEYS: consumers 1.. leave their partial results here for consumer 0 (kPartialFloats per thread each)
  static constexpr int kPartialBytes = kSplitKeys ? (kConsumers - 1) * 128 * kPartialFloats<kHeadDim> * 4 : 0;
  static constexpr int kBarrierBytes = 8 * (3 + 3 * kStages);   // the barriers and the item
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + kOnesBytes + kPartialBytes + kInboxBytes +
                                    kBarrierBytes + 1024;   // + room to align

  static_assert(kConsumers >= 1 && kConsumers <= 3,
                "CONSUMERS(_D128) must be 1, 2 or 3 (64 query rows each)");
  static_assert(kBlockN % 64 == 0 && kBlockN >= 64 && kBlockN <= 256,
                "BLOCK_N must be 64, 128, 192 or 256: each wgmma covers 64 keys, a TMA box at most 256 rows");
  static_assert(kStages >= 2, "STAGES: the producer fills one buffer while the consumers read another");
  static_assert(DYNAMIC >= 0 && DYNAMIC <= 2, "DYNAMIC: 0 (never), 1 (always) or 2 (under a causal mask)");
  static_assert(!DYNAMIC || PERSISTENT, "DYNAMIC hands persistent CTAs their work items");
  static_assert(!SPLIT_KEYS || (OVERLAP && !CARRY_OVER),
                "SPLIT_KEYS splits the overlapped steps' key tiles, and an item's last P·V stays in the item");
  // A consumer's next key tile is kConsumers entries after its current one in the ring, which it releases only
  // after issuing the next one's Q·Kᵀ: the ring must hold both and the others' tiles between them.
  static_assert(!kSplitKeys || kStages >= kConsumers + 1, "SPLIT_KEYS needs STAGES(_D128) >= CONSUMERS(_D128) + 1");
  // Measured on the H100: three consumers splitting the keys with the speculative softmax missed the tolerance
  // (1.17x it at 1x8x512x128 in bf16, one seed of four; 0.49x without SPECULATE; two consumers 0.67x). Not
  // understood yet, so not built.
  static_assert(!kSplitKeys || kConsumers == 2 || !SPECULATE, "SPLIT_KEYS with SPECULATE: two consumers only");
  static_assert(CLUSTER_KEYS == 1 || CLUSTER_KEYS == 2 || CLUSTER_KEYS == 4, "CLUSTER_KEYS: 1, 2 or 4 CTAs");
  static_assert(CLUSTER_KEYS == 1 || (OVERLAP && !CARRY_OVER && DYNAMIC == 0),
                "CLUSTER_KEYS splits the overlapped steps' key tiles, keeps an item's last P·V in the item, and "
                "gives a cluster's CTAs the same items by a fixed round robin (DYNAMIC=0)");
  static_assert(!PINGPONG || OVERLAP, "PINGPONG alternates the warpgroups' GEMM bursts, which OVERLAP forms");
  static_assert(!SPECULATE || OVERLAP, "SPECULATE changes the overlapped step's softmax");
  static_assert(!CARRY_OVER || OVERLAP, "CARRY_OVER moves the overlapped steps' last P·V into the next item's first");
};

// The barriers of the copy ring, after the tiles in shared memory.
template <int kStages>
struct Barriers {
  uint64_t q_full;             // Q has landed
  uint64_t q_empty;            // every consumer warp has its rows of Q in registers
  uint64_t k_full[kStages];    // K tile in buffer s has landed
  uint64_t v_full[kStages];    // V tile in buffer s has landed
  uint64_t empty[kStages];     // every consumer warp is done with buffer s (K and V)
  int item;                    // kDynamic: the work item whose Q q_full announces (past the end: no more)
};

// The tensor maps of one call: (B, H, S, D) as TMA counts it, {D, S, H, B}, boxes of 64 columns.
struct TensorMaps {
  CUtensorMap q, k, v;
};

// One work item: a query tile of one head, and the key tiles its rows see.
struct WorkItem {
  int head, batch, first_row, key_tiles;
};

// The order of the work items: `m_tiles` query tiles per head; under a causal mask, heads taken in groups
// of `group_size` (CAUSAL_GROUP_MB; all heads when it is 0). Worked out once per CTA, not per item.
struct WorkOrder {
  int m_tiles, heads, group_size;
};

// The takers of work items, one per CTA or (CLUSTER_KEYS) per cluster, and this CTA's place among them.
__device__ __forceinline__ int item_places() { return gridDim.x / CLUSTER_KEYS; }
__device__ __forceinline__ int item_place() { return blockIdx.x / CLUSTER_KEYS; }

template <int kBlockM>
__device__ __forceinline__ WorkOrder work_order(const FlashParams& params) {
  const int m_tiles = (params.seqlen_q + kBlockM - 1) / kBlockM, heads = params.heads * params.batch;
  const long long kv_bytes = 4LL * params.seqlen_k * params.head_dim;   // one head's K and V, 2 bytes each
  const long long fit = CAUSAL_GROUP_MB * (1LL << 20) / kv_bytes;       // heads whose K and V fit the budget
  const long long size = min(min(static_cast<long long>(heads), item_places() / 2LL), fit);
  return {m_tiles, heads, CAUSAL_GROUP_MB == 0 || !params.causal ? heads : static_cast<int>(max(1LL, size))};
}

// Work item `index`. Causal: the last query tile of every head of a group first (the longest rows), then
// the tiles before them, so the shortest work fills the end of the group's schedule (the last group may
// hold fewer heads); otherwise a head's query tiles are neighbours in time and share its K and V in L2.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ WorkItem work_item(int index, const WorkOrder& order, const FlashParams& params) {
  int m_tile = index % order.m_tiles, head = index / order.m_tiles;
  if (params.causal) {
    const int group = index / (order.group_size * order.m_tiles), place = index % (order.group_size * order.m_tiles);
    const int group_heads = min(order.group_size, order.heads - group * order.group_size);
    m_tile = order.m_tiles - 1 - place / group_heads;
    head = group * order.group_size + place % group_heads;
  }
  const int first_row = m_tile * kBlockM;
  const int key_end = params.causal ? min(params.seqlen_k, first_row + kBlockM) : params.seqlen_k;
  return {head % params.heads, head / params.heads, first_row, (key_end + kBlockN - 1) / kBlockN};
}

// The work item this CTA takes in round `round` (rounds of item_places() items, in work_item's order): its own
// place in the round, or (SNAKE) every other round the place counted from the other end.
__device__ __forceinline__ int item_of_round(int round) {
  const int place = SNAKE && (round & 1) ? item_places() - 1 - item_place() : item_place();
  return round * item_places() + place;
}

// DYNAMIC: the work counters. Each launch takes the next of kCounterSlots slots in turn (launch()), so two
// launches count apart unless they run at once kCounterSlots launches apart. Its CTAs count the items taken
// in [0] and the CTAs done in [1]; the last CTA done sets both back to zero for the slot's next launch.
constexpr int kCounterSlots = 64;
__device__ unsigned int work_counters[kCounterSlots][2];
// The launches so far, for the next slot: at namespace scope and static, so each build (one per set of -D
// defines, several in one process) counts its own, as each has its own work_counters.
static std::atomic<unsigned> launches_started{0};

// DYNAMIC: this CTA has taken its last item (the counter ran past the end); the last CTA to get here resets
// the slot. Every CTA bumped [0] for the last time before it bumps [1], so after the last bump of [1]
// nobody touches the slot until the next launch that takes it.
__device__ __forceinline__ void finish_counting(unsigned int (&counter)[2]) {
  __threadfence();
  if (atomicAdd(&counter[1], 1u) == gridDim.x - 1) {
    atomicExch(&counter[0], 0u);
    atomicExch(&counter[1], 0u);
  }
}

// kDynamic: this build takes its work items from the counter (DYNAMIC; launch() picks the build).
template <typename T, int kHeadDim, bool kDynamic>
__global__ void __launch_bounds__(Tiles<kHeadDim>::kThreads, 1)
    attention_warpspec_kernel(const FlashParams params, const __grid_constant__ TensorMaps maps, int counter_slot) {
  using Cfg = Tiles<kHeadDim>;
  constexpr int kDBlocks = kHeadDim / 64;        // 64-column TMA boxes per tile
  constexpr int kStages = Cfg::kStages;
  constexpr int kConsumerWarps = 4 * Cfg::kConsumers;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* const q_tile = smem;
  unsigned char* const k_tiles = smem + Cfg::kQBytes;
  unsigned char* const v_tiles = k_tiles + kStages * Cfg::kKvBytes;
  unsigned char* const ones = v_tiles + kStages * Cfg::kKvBytes;   // SPECULATE: 16-bit ones, B of P·ones
  float* const partials = reinterpret_cast<float*>(ones + Cfg::kOnesBytes);   // SPLIT_KEYS: consumers 1.. leave O here
  float* const inbox = reinterpret_cast<float*>(ones + Cfg::kOnesBytes + Cfg::kPartialBytes);   // CLUSTER_KEYS
  uint64_t* const inbox_full =   // the inbox's two mbarriers end it
      reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(inbox) + Cfg::kInboxBytes) - 2;
  uint64_t* const inbox_empty = inbox_full + 1;
  Barriers<kStages>& bars = *reinterpret_cast<Barriers<kStages>*>(ones + Cfg::kOnesBytes + Cfg::kPartialBytes +
                                                                  Cfg::kInboxBytes);
  // CLUSTER_KEYS: this CTA's rank in its cluster, its share of each item's key tiles
  const int rank = blockIdx.x % Cfg::kClusterKeys;

  // Read through a shuffle, the warpgroup index is visibly the same across a warp: without that,
  // ptxas treats branches on it as divergent and serialises the wgmmas inside them.
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const WorkOrder order = work_order<Cfg::kBlockM>(params);
  const int work_items = order.m_tiles * order.heads;
  // The K/V ring is one sequence across this CTA's work items: the key tile `tile` of an item is the
  // ring's entry `ring_base + tile`, in buffer (entry % kStages), filled for the (entry / kStages)th time.
  const auto buffer = [](int entry) { return entry % kStages; };
  const auto parity = [](int entry) { return static_cast<uint32_t>(entry / kStages) & 1; };

  if (threadIdx.x == 0) {
    mbarrier_init(&bars.q_full, 1);
    mbarrier_init(&bars.q_empty, kConsumerWarps);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bars.k_full[s], 1);
      mbarrier_init(&bars.v_full[s], 1);
      mbarrier_init(&bars.empty[s], Cfg::kSplitKeys ? 4 : kConsumerWarps);   // SPLIT_KEYS: one warpgroup reads a tile
    }
    if constexpr (Cfg::kClusterKeys > 1) {   // CTA 0's arrival and the sends (their bytes, or their threads' arrivals)
      mbarrier_init(inbox_full, 1 + (SEND_ASYNC ? 0 : (Cfg::kClusterKeys - 1) * Cfg::kHolders * 128));
      mbarrier_init(inbox_empty, Cfg::kHolders * 128);
    }
    fence_mbarrier_init();
  }
  if constexpr (SPECULATE) {
    for (int i = threadIdx.x; i < Cfg::kOnesBytes / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(ones)[i] = pack2<T>(1.f, 1.f);
    fence_proxy_async();   // these writes come before the wgmmas that read them
  }
  __syncthreads();
  // CLUSTER_KEYS: "this CTA is running, its barriers set up"; a CTA waits for the others' arrival before it first
  // writes into their shared memory.
  if constexpr (Cfg::kClusterKeys > 1) cluster_arrive_relaxed();

  if (warpgroup == 0) {   // the producer
    if constexpr (Cfg::kSplitRegisters) setmaxnreg_dec<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0) {
      TraceRecorder trace(0, true);   // TRACE=1 only: the issuing thread records
      trace.begin();
      int ring_base = 0, items_done = 0;
      // Every CTA's first item is its own place in the first round; the counter (kDynamic) then counts the items taken.
      for (int index = item_place(); index < work_items; ++items_done) {
        const WorkItem item = work_item<Cfg::kBlockM, Cfg::kBlockN>(index, order, params);
        // Q's buffer is free once every consumer warp has its rows of the previous Q in registers.
        if (items_done > 0) {
          trace.stamp(kTraceEmptyWaitBegin, items_done);
          mbarrier_wait(&bars.q_empty, (items_done - 1) & 1);
          trace.stamp(kTraceEmptyWaitEnd, items_done);
        }
        trace.stamp(kTraceQIssue, items_done);
        if (kDynamic) bars.item = index;   // published by q_full's arrival (release), read after its wait
        mbarrier_arrive_expect_tx(&bars.q_full, Cfg::kQBytes);
#pragma unroll
        for (int c = 0; c < kDBlocks; ++c)
          tma_load<4>(q_tile + c * Cfg::kBlockM * 128, &maps.q, &bars.q_full, {c * 64, item.first_row, item.head, item.batch});
        // The next item, asked for now: the counter's answer takes a trip to L2, which this item's copies hide.
        const int next = kDynamic ? static_cast<int>(gridDim.x + atomicAdd(&work_counters[counter_slot][0], 1u))
                                 : item_of_round(items_done + 1);
        // CLUSTER_KEYS: this CTA's share of the item's key tiles, into consecutive entries of its ring
        const int cta_tiles = share_of(item.key_tiles, rank, Cfg::kClusterKeys);
        for (int tile = 0; tile < cta_tiles; ++tile) {
          const int entry = ring_base + tile, s = buffer(entry);
          const int first_key = (rank + tile * Cfg::kClusterKeys) * Cfg::kBlockN;
          // The buffer's previous entry must have been released by every consumer warp.
          if (entry >= kStages) {
            trace.stamp(kTraceEmptyWaitBegin, items_done, tile);
            mbarrier_wait(&bars.empty[s], parity(entry) ^ 1);
            trace.stamp(kTraceEmptyWaitEnd, items_done, tile);
          }
          trace.stamp(kTraceKVIssue, items_done, tile);
          mbarrier_arrive_expect_tx(&bars.k_full[s], Cfg::kKvBytes);
#pragma unroll
          for (int c = 0; c < kDBlocks; ++c)
            tma_load<4>(k_tiles + s * Cfg::kKvBytes + c * Cfg::kBlockN * 128, &maps.k, &bars.k_full[s],
                        {c * 64, first_key, item.head, item.batch});
          mbarrier_arrive_expect_tx(&bars.v_full[s], Cfg::kKvBytes);
#pragma unroll
          for (int c = 0; c < kDBlocks; ++c)
            tma_load<4>(v_tiles + s * Cfg::kKvBytes + c * Cfg::kBlockN * 128, &maps.v, &bars.v_full[s],
                        {c * 64, first_key, item.head, item.batch});
        }
        ring_base += cta_tiles;
        index = next;
      }
      if constexpr (kDynamic) {   // tell the consumers there is no next item, once they are done with Q
        mbarrier_wait(&bars.q_empty, (items_done - 1) & 1);
        bars.item = work_items;
        mbarrier_arrive(&bars.q_full);
        finish_counting(work_counters[counter_slot]);
      }
      trace.end();
    }
    return;   // the consumers wait for every copy it issued, so the CTA outlives them
  }

  // --- the consumers -------------------------------------------------------------------------------
  if constexpr (Cfg::kSplitRegisters) setmaxnreg_inc<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  // This warpgroup's rows in the item's Q tile: its own 64, or (SPLIT_KEYS) the item's only 64.
  const int q_offset = Cfg::kSplitKeys ? 0 : consumer * 64;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const float score_scale = params.scale * 1.4426950408889634f;   // exp(x) = exp2(x · log2 e)
  const uint64_t ones_descriptor = smem_descriptor_128b(smem_address(ones), 16);   // SPECULATE only

  // TRACE=1 only: lane 0 of warp 0 of each consumer warpgroup records.
  TraceRecorder trace(warpgroup, threadIdx.x % 128 == 0);
  trace.begin();

  // The current work item, as the lambdas below see it (items_done: how many this CTA finished before it;
  // key_tiles: how many of its key tiles this CTA takes (CLUSTER_KEYS: its share); my_tiles: how many of those
  // this warpgroup's rows see and it takes).
  int ring_base = 0, key_tiles = 0, my_tiles = 0, group_row = 0, warp_row = 0, items_done = 0;
  // its registers, math (SPECULATE: the row sums as P·ones)
  WarpgroupAttention<T, kHeadDim, Cfg::kBlockN, 0, false, false, SPECULATE, WIDE_WGMMA> rows;

  // A key tile: its ring entry, and (for the trace) its work item's number and its place in the item. A step
  // may work on tiles of two items (an item's last P·V is issued in the next one's first step), so the steps
  // name the tiles they wait for, issue and release this way.
  struct KeyTile {
    int entry, item, tile;
  };
  // This warpgroup's `step`th key tile of the item: every tile, or (SPLIT_KEYS) every kConsumers-th from its own.
  const auto tile_of = [&](int step) { return Cfg::kSplitKeys ? consumer + step * Cfg::kConsumers : step; };
  // The place of this CTA's tile `tile` among the item's (CLUSTER_KEYS: every kClusterKeys-th from its rank).
  const auto key_block = [&](int tile) { return rank + tile * Cfg::kClusterKeys; };
  const auto key_tile = [&](int step) { return KeyTile{ring_base + tile_of(step), items_done, tile_of(step)}; };
  // A consumer warp releases a buffer once its wgmmas have read it (waited for); the producer refills
  // it after all kConsumerWarps have (SPLIT_KEYS: the 4 warps of the warpgroup that took it). A tile a
  // warpgroup skips (causal) is waited for first, so that the release counts toward that entry's use of the
  // buffer and not an earlier one's.
  const auto release = [&](KeyTile at) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&bars.empty[buffer(at.entry)]);
    trace.stamp(kTraceRelease, at.item, at.tile);
  };
  const auto wait_keys = [&](KeyTile at) {
    trace.stamp(kTraceKWaitBegin, at.item, at.tile);
    mbarrier_wait(&bars.k_full[buffer(at.entry)], parity(at.entry));
    trace.stamp(kTraceKWaitEnd, at.item, at.tile);
  };
  const auto wait_values = [&](KeyTile at) {
    trace.stamp(kTraceVWaitBegin, at.item, at.tile);
    mbarrier_wait(&bars.v_full[buffer(at.entry)], parity(at.entry));
    trace.stamp(kTraceVWaitEnd, at.item, at.tile);
  };
  const auto skip = [&](KeyTile at) {
    wait_keys(at);
    wait_values(at);
    release(at);
  };
  // The struct's steps, each stamped in a TRACE=1 build.
  auto issue_scores = [&](KeyTile at) {
    trace.stamp(kTraceScoresIssue, at.item, at.tile);
    const uint32_t k_base = smem_address(k_tiles + buffer(at.entry) * Cfg::kKvBytes);
    if constexpr (Cfg::kQInShared)
      rows.issue_scores_shared_q(smem_address(q_tile) + q_offset * 128, Cfg::kBlockM, k_base);
    else
      rows.issue_scores(k_base);
  };
  // Q's buffer is free for the next item once every consumer warp is done reading it: right after
  // load_q, or (Q_IN_SHARED) once the item's last Q·Kᵀ of this warpgroup has landed.
  const auto release_q = [&]() {
    fence_proxy_async();   // these reads of Q come before the copy engine's next write there
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&bars.q_empty);
  };
  // SPECULATE: the row sums of the P that P·V takes are P·ones: in P·V's own wgmmas (SUMS_IN_VALUES, D = 64), beside
  // them or (SUMS_AFTER_TURN) in one more commit group, issued once the turn is handed over: the waits below then
  // leave that many more groups running.
  constexpr bool kSumsAfterTurn = SPECULATE && SUMS_AFTER_TURN && !Cfg::kSumsInValues;
  constexpr int kSumGroups = kSumsAfterTurn ? 1 : 0;
  auto issue_values = [&](KeyTile at) {
    trace.stamp(kTraceValuesIssue, at.item, at.tile);
    const uint32_t v_base = smem_address(v_tiles + buffer(at.entry) * Cfg::kKvBytes);
    if constexpr (Cfg::kSumsInValues)
      issue_values_and_sums(rows, v_base, smem_address(ones));
    else
      rows.template issue_values<SPECULATE && !kSumsAfterTurn>(v_base, ones_descriptor);
  };
  auto issue_row_sums = [&]() {
    if constexpr (kSumsAfterTurn) rows.issue_row_sums(ones_descriptor);
  };
  // After the wgmma_wait that covers them: the stamp is when the warpgroup saw them done.
  auto scores_landed = [&](KeyTile at) {
    rows.scores_landed();
    trace.stamp(kTraceScoresDone, at.item, at.tile);
  };
  // Q_IN_SHARED: the item's last Q·Kᵀ has landed, and (SPECULATE) will not be computed again.
  const auto scores_done_with_q = [&](int tile) {
    if (Cfg::kQInShared && tile == my_tiles - 1) release_q();
  };
  auto output_landed = [&](KeyTile at) {
    rows.output_landed();
    trace.stamp(kTraceValuesDone, at.item, at.tile);
  };
  auto softmax = [&](int step, float (&correction)[2], auto speculate) {
    const int tile = tile_of(step);
    trace.stamp(kTraceSoftmaxBegin, items_done, tile);
    rows.template softmax<decltype(speculate)::value>(key_block(tile) * Cfg::kBlockN, params, group_row, warp_row, t,
                                                      score_scale, correction);
    trace.stamp(kTraceSoftmaxEnd, items_done, tile);
  };
  // The epilogue: this warpgroup's rows of O of work item `done` (the CTA's `number`th), normalised and
  // written, once its last P·V has landed.
  const auto write_output = [&](const WorkItem& done, int number) {
    trace.stamp(kTraceEpilogueBegin, number);
    const int first_row = done.first_row + q_offset + warp * 16 + g;
    rows.template store_output<WIDE_STORES>(params, done.batch, done.head, first_row, t);
    trace.stamp(kTraceEpilogueEnd, number);
  };
  // SPLIT_KEYS: the item's end. Consumers 1.. leave their partial results in shared memory, and consumer 0
  // combines them into its own. Named barrier kPartialsReady: the partials are there; kPartialsRead: consumer 0
  // has them in registers, so the slots may take the next item's. (Every consumer waits at both, through one
  // bar.sync each: racecheck reads a mere arrival as no ordering of consumer 0's reads before the others' next
  // writes, and synccheck calls two bar.syncs of one barrier in the two sides of a branch divergent.)
  // CLUSTER_KEYS: then the warpgroups holding rows of O in the other CTAs send theirs into CTA 0's inbox, and CTA
  // 0's combine them. One thread of CTA 0 tells inbox_full how many bytes the sends bring; where the cluster has a
  // next item, CTA 0's holders then arrive at every other CTA's inbox_empty, so that its slot may take the next
  // item's. After the last item nobody arrives there, so a CTA may exit once it has sent.
  constexpr uint32_t kPartialsReady = 1 + 3, kPartialsRead = 2 + 3;   // after the ping-pong barriers 1..3
  constexpr bool kCombines = Cfg::kSplitKeys || Cfg::kClusterKeys > 1;
  const bool holder = !Cfg::kSplitKeys || consumer == 0;   // holds rows of O once the CTA has combined its own
  const auto combine_and_write = [&](const WorkItem& done, int number) {
    constexpr int kSlotFloats = kPartialFloats<kHeadDim> * 128;
    const int thread = threadIdx.x % 128;
    if constexpr (Cfg::kSplitKeys) {
      constexpr uint32_t kThreads = 128 * Cfg::kConsumers;
      if (consumer > 0) store_partial<kHeadDim>(rows, partials + (consumer - 1) * kSlotFloats, thread);
      named_barrier_sync(kPartialsReady, kThreads);
      if (consumer == 0)
        for (int c = 1; c < Cfg::kConsumers; ++c)
          merge_partial<kHeadDim>(rows, partials + (c - 1) * kSlotFloats, thread);
      named_barrier_sync(kPartialsRead, kThreads);
      if (!holder) return;
    }
    if constexpr (Cfg::kClusterKeys > 1) {
      // CTA `from`'s slot for this warpgroup's rows
      const auto slot = [&](int from) {
        return inbox + ((from - 1) * Cfg::kHolders + (Cfg::kSplitKeys ? 0 : consumer)) * kSlotFloats;
      };
      if (rank > 0) {
        if (number == 0)
          cluster_wait();   // every CTA of the cluster is running: CTA 0's shared memory may be written
        else
          mbarrier_wait_cluster(inbox_empty, (number - 1) & 1);   // CTA 0 has read the last item's
        send_partial<kHeadDim>(rows, cluster_map(slot(rank), 0), cluster_map(inbox_full, 0), thread);
        return;
      }
      if (threadIdx.x == 128) {   // consumer 0's first thread, which waited for the last item's sends itself
        if constexpr (SEND_ASYNC)
          mbarrier_arrive_expect_tx(inbox_full, (Cfg::kClusterKeys - 1) * Cfg::kHolders * kSlotFloats * 4);
        else
          mbarrier_arrive(inbox_full);
      }
      mbarrier_wait_cluster(inbox_full, number & 1);
      for (int from = 1; from < Cfg::kClusterKeys; ++from) merge_partial<kHeadDim>(rows, slot(from), thread);
      if (item_of_round(number + 1) < work_items)
        for (int from = 1; from < Cfg::kClusterKeys; ++from) mbarrier_arrive_cluster(cluster_map(inbox_empty, from));
    }
    write_output(done, number);
  };

  // Ping-pong: named barrier 1 + c is consumer c's turn to issue wgmmas; each hands the turn to the next
  // (round robin) after issuing. Consumer 0 takes the first turn, the last consumer hands one to it before
  // the first item. Every consumer takes key_tiles turns per item (issuing nothing in those past its own
  // tiles) and one more after the last item, and the last consumer hands over nothing in that one: every
  // turn handed over is taken. A barrier counts the 128 threads that wait on it and the 128 that arrive.
  constexpr uint32_t kTurnThreads = 256;
  constexpr int kLastConsumer = Cfg::kConsumers - 1;
  const int next_consumer = consumer == kLastConsumer ? 0 : consumer + 1;
  // (The turn after the last item is stamped as the last item's, tile -1.)
  const auto take_turn = [&](int number, int step) {
    if (Cfg::kPingPong) {
      trace.stamp(kTraceTurnWait, number, step);
      named_barrier_sync(1 + consumer, kTurnThreads);
      trace.stamp(kTraceTurnTaken, number, step);
    }
  };
  const auto hand_over_turn = [&](int number, int step) {
    if (Cfg::kPingPong) {
      named_barrier_arrive(1 + next_consumer, kTurnThreads);
      trace.stamp(kTraceTurnHanded, number, step);
    }
  };
  if (OVERLAP && Cfg::kPingPong && consumer == kLastConsumer) {
    named_barrier_arrive(1, kTurnThreads);
    trace.stamp(kTraceTurnHanded, 0);
  }

  // OVERLAP: the CTA's last work item, when the P·V of its last key tile waits for the next item's first
  // step (this warpgroup's rows see every key tile of it): that tile is the ring entry before the next item's.
  // (Kept as its index, and worked out again where needed: fewer registers held through the item.)
  int waiting = -1;
  const auto waiting_item = [&]() { return work_item<Cfg::kBlockM, Cfg::kBlockN>(waiting, order, params); };
  const auto waiting_tile = [&]() { return KeyTile{ring_base - 1, items_done - 1, waiting_item().key_tiles - 1}; };

  for (;; ++items_done) {
    // The item: kDynamic, the one the producer announces with Q (waited for here); otherwise this CTA's
    // place in the round, computed as the producer does.
    if constexpr (kDynamic) {
      trace.stamp(kTraceQWaitBegin, items_done);
      mbarrier_wait(&bars.q_full, items_done & 1);
      trace.stamp(kTraceQWaitEnd, items_done);
    }
    // (Lane 0 reads it, the lane that later releases Q to the producer, and shuffles it to the warp: seen to
    // be the same across the warp, as the warpgroup index is, the item keeps the branches on it uniform, and
    // ptxas neither splits the softmax into divergent copies nor serialises the wgmmas.)
    const int index = kDynamic ? __shfl_sync(0xffffffffu, lane == 0 ? bars.item : 0, 0) : item_of_round(items_done);
    if (index >= work_items) break;
    const WorkItem item = work_item<Cfg::kBlockM, Cfg::kBlockN>(index, order, params);
    key_tiles = share_of(item.key_tiles, rank, Cfg::kClusterKeys);
    group_row = item.first_row + q_offset;   // this warpgroup's first query row
    warp_row = group_row + warp * 16 + g;    // this lane's rows: warp_row and + 8
    // Causal: this warpgroup's rows see only the item's first `my_tiles` key tiles; the producer loads them all.
    my_tiles = params.causal ? min(item.key_tiles, (group_row + 64 + Cfg::kBlockN - 1) / Cfg::kBlockN) : item.key_tiles;
    // CLUSTER_KEYS: the CTA's share of them; SPLIT_KEYS: the warpgroup's share of that (none, where the item has
    // fewer tiles than takers)
    my_tiles = share_of(my_tiles, rank, Cfg::kClusterKeys);
    if (Cfg::kSplitKeys) my_tiles = share_of(my_tiles, consumer, Cfg::kConsumers);

    if constexpr (!kDynamic) {
      trace.stamp(kTraceQWaitBegin, items_done);
      mbarrier_wait(&bars.q_full, items_done & 1);
      trace.stamp(kTraceQWaitEnd, items_done);
    }
    if constexpr (!Cfg::kQInShared) {
      rows.load_q(q_tile, Cfg::kBlockM, q_offset, warp, lane);
      release_q();
    } else if (my_tiles == 0) {
      release_q();   // SPLIT_KEYS: no Q·Kᵀ of its own in this item
    }
    rows.reset_maxima();
    if (waiting < 0) rows.reset_output();   // otherwise O is still the last item's, until its last P·V lands

    if constexpr (OVERLAP) {
      // Step `step` issues S for tile `step` and P·V for tile step - 1 back to back, then does the
      // softmax of tile `step` while that P·V runs. Step 0 does the same with the last item's last P·V, and
      // writes that item's O: its tail overlaps this item's head. Each branch waits for every wgmma it
      // issues: ptxas then knows that none is in flight where the branches meet, and does not serialise them.
      // Every consumer takes as many steps (and ping-pong turns) as the item has key tiles per consumer, plus
      // (without CARRY_OVER) one for the last P·V.
      const int turns = Cfg::kSplitKeys ? (key_tiles + Cfg::kConsumers - 1) / Cfg::kConsumers : key_tiles;
      const int steps = CARRY_OVER ? turns : turns + 1;
      for (int step = 0; step < steps; ++step) {
        take_turn(items_done, step);
        if (step == 0 && waiting < 0 && my_tiles > 0) {   // the CTA's first item (or the last ended early): scores alone
          wait_keys(key_tile(0));
          issue_scores(key_tile(0));
          hand_over_turn(items_done, step);
          wgmma_wait<0>();
          scores_landed(key_tile(0));
          scores_done_with_q(0);
          float correction[2];
          softmax(0, correction, std::false_type{});   // O is still zero: no rescale
          rows.pack_probabilities();
        } else if (step == 0 && waiting >= 0) {   // this item's first scores beside the last item's last P·V
          const KeyTile last = waiting_tile();
          wait_keys(key_tile(0));
          issue_scores(key_tile(0));
          wait_values(last);
          issue_values(last);
          hand_over_turn(items_done, step);
          issue_row_sums();
          float correction[2];   // the first tile of its rows: no rescale
          if constexpr (SPECULATE) {   // the row sums are P·ones, beside O: the softmax runs while they land
            wgmma_wait<1 + kSumGroups>();
            scores_landed(key_tile(0));
            softmax(0, correction, std::false_type{});
            wgmma_wait<0>();
            output_landed(last);
          } else {   // the softmax adds the row sums, and they are the last item's until its O is written
            wgmma_wait<0>();
            scores_landed(key_tile(0));
            output_landed(last);
          }
          release(last);
          write_output(waiting_item(), items_done - 1);
          rows.reset_output();
          waiting = -1;
          if constexpr (!SPECULATE) softmax(0, correction, std::false_type{});
          rows.pack_probabilities();
          scores_done_with_q(0);
        } else if (step < my_tiles) {
          wait_keys(key_tile(step));
          issue_scores(key_tile(step));
          wait_values(key_tile(step - 1));
          issue_values(key_tile(step - 1));
          hand_over_turn(items_done, step);
          issue_row_sums();
          wgmma_wait<1 + kSumGroups>();   // the scores (committed first) have landed; P·V may still run
          scores_landed(key_tile(step));
          float correction[2];
          softmax(step, correction, std::bool_constant<SPECULATE>{});
          wgmma_wait<0>();
          output_landed(key_tile(step - 1));
          release(key_tile(step - 1));
          rows.rescale_output(correction);   // O now holds P·V up to tile step - 1
          rows.pack_probabilities();
          // SPECULATE, rarely: a row's maximum rose too far; this warp's rows of the tile again, the usual way.
          if (SPECULATE && __any_sync(0xffffffffu, rows.risen)) {
            warp_scores<Cfg::kQInShared>(rows, q_tile, Cfg::kBlockM, q_offset + warp * 16,
                                             k_tiles + buffer(key_tile(step).entry) * Cfg::kKvBytes, lane);
            rows.softmax(key_block(tile_of(step)) * Cfg::kBlockN, params, group_row, warp_row, t, score_scale,
                         correction);
            rows.rescale_output(correction);
            rows.pack_probabilities();
          }
          scores_done_with_q(step);
        } else if (step == my_tiles && step > 0) {   // the last P·V (CARRY_OVER: only of rows that end before the
          wait_values(key_tile(step - 1));          // item's last key tile)
          issue_values(key_tile(step - 1));
          hand_over_turn(items_done, step);
          issue_row_sums();
          wgmma_wait<0>();
          output_landed(key_tile(step - 1));
          release(key_tile(step - 1));
          if (!kCombines) write_output(item, items_done);
          if (!Cfg::kSplitKeys && step < key_tiles) skip(key_tile(step));
        } else {   // causal: a tile right of this warpgroup's diagonal (SPLIT_KEYS: a turn with no tile of its own)
          hand_over_turn(items_done, step);
          if (!Cfg::kSplitKeys && step < key_tiles) skip(key_tile(step));
        }
      }
      if constexpr (kCombines) combine_and_write(item, items_done);
      if (CARRY_OVER && my_tiles == key_tiles) waiting = index;
    } else {
      for (int tile = 0; tile < key_tiles; ++tile) {
        if (tile >= my_tiles) {
          skip(key_tile(tile));
          continue;
        }
        wait_keys(key_tile(tile));
        issue_scores(key_tile(tile));
        wgmma_wait<0>();
        scores_landed(key_tile(tile));
        scores_done_with_q(tile);
        float correction[2];
        softmax(tile, correction, std::false_type{});
        rows.rescale_output(correction);
        rows.pack_probabilities();
        wait_values(key_tile(tile));
        issue_values(key_tile(tile));
        wgmma_wait<0>();
        output_landed(key_tile(tile));
        release(key_tile(tile));
      }
      write_output(item, items_done);
    }
    ring_base += key_tiles;
  }

  if constexpr (OVERLAP) {   // the last item's last P·V, in the turn every consumer takes after the last item
    take_turn(items_done - 1, -1);
    if (waiting >= 0) {
      const KeyTile last = waiting_tile();
      wait_values(last);
      issue_values(last);
      if (consumer != kLastConsumer) hand_over_turn(items_done - 1, -1);
      issue_row_sums();
      wgmma_wait<0>();
      output_landed(last);
      release(last);
      write_output(waiting_item(), items_done - 1);
    } else if (consumer != kLastConsumer) {
      hand_over_turn(items_done - 1, -1);
    }
  }
  trace.end();
}

// A tensor map over one of q, k, v: boxes of 64 columns x `rows` rows of one head, 128B-swizzled;
// rows past the end of a head are zero-filled by the copy engine.
static cudaError_t make_map(CUtensorMap* map, const FlashParams& p, const void* base, const int64_t* strides,
                            int seqlen, int rows) {
  constexpr uint64_t kElement = 2;
  return make_tensor_map<4>(map, static_cast<FlashDtype>(p.dtype), base,
                            {static_cast<uint64_t>(p.head_dim), static_cast<uint64_t>(seqlen),
                             static_cast<uint64_t>(p.heads), static_cast<uint64_t>(p.batch)},
                            {strides[2] * kElement, strides[1] * kElement, strides[0] * kElement},
                            {64, static_cast<uint32_t>(rows), 1, 1}, true);
}

template <typename T, int kHeadDim, bool kDynamic>
cudaError_t launch(cudaStream_t stream, const FlashParams& p) {
  using Cfg = Tiles<kHeadDim>;
  constexpr auto kKernel = attention_warpspec_kernel<T, kHeadDim, kDynamic>;
  const long long work_items =
      static_cast<long long>((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.heads * p.batch;
  if (work_items > 0x7fffffff / Cfg::kClusterKeys) return cudaErrorInvalidConfiguration;
  TensorMaps maps;
  cudaError_t err = make_map(&maps.q, p, p.q, p.q_strides, p.seqlen_q, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_map(&maps.k, p, p.k, p.k_strides, p.seqlen_k, Cfg::kBlockN);
  if (err == cudaSuccess) err = make_map(&maps.v, p, p.v, p.v_strides, p.seqlen_k, Cfg::kBlockN);
  int device = 0, sms = 0;
  if (err == cudaSuccess) err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = allow_dynamic_smem<kKernel>(device, Cfg::kSmemBytes);
  if (err == cudaSuccess && PERSISTENT && PERSISTENT_CTAS <= 0) err = device_sm_count(device, &sms);
  if (err != cudaSuccess) return err;
  // Persistent: one CTA per SM (each holds a whole SM's shared memory), walking the work items; CLUSTER_KEYS:
  // one cluster of kClusterKeys CTAs per item.
  const long long sm_places = std::max(1, (PERSISTENT_CTAS > 0 ? PERSISTENT_CTAS : sms) / Cfg::kClusterKeys);
  const long long places = PERSISTENT ? std::min(work_items, sm_places) : work_items;
  const auto ctas = static_cast<unsigned>(places * Cfg::kClusterKeys);
  const int counter_slot =
      kDynamic ? static_cast<int>(launches_started.fetch_add(1, std::memory_order_relaxed) % kCounterSlots) : 0;
  if constexpr (Cfg::kClusterKeys == 1) {
    kKernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps, counter_slot);
    return cudaGetLastError();
  } else {   // a cluster shape is a launch attribute
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Cfg::kClusterKeys;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kKernel, p, maps, counter_slot);
  }
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? Tiles<128>::kSmemBytes : Tiles<64>::kSmemBytes;
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  return dispatch_dtype_head_dim(*params, [&](auto element, auto head_dim) {
    using T = decltype(element);
    constexpr int kHeadDim = decltype(head_dim)::value;
    // The build with the work counter: always (DYNAMIC=1), never (0), or under a causal mask (2, the only
    // setting that compiles both builds).
    return params->causal || DYNAMIC == 1 ? launch<T, kHeadDim, DYNAMIC != 0>(stream, *params)
                                          : launch<T, kHeadDim, DYNAMIC == 1>(stream, *params);
  });
}
