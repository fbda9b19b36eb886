// Phase 7 — the register-resident kernel: mma.sync m16n8k16, ldmatrix, XOR-swizzled shared memory,
// S and P never leave registers. The FlashAttention-2 structure.
//
// What changed vs phase 6, and why. Phases 3-6 pass every tile through shared memory three times:
// WMMA writes S out, the softmax reads it and writes P, P·V reads P and read-modify-writes O, with
// four barriers per tile; at 4x16x2048 that ran at 8% of the matmul peak. Here each warp owns 16
// query rows and keeps everything about them in registers:
//   - Q: loaded once into A-operand fragments (ldmatrix);
//   - S = Q·Kᵀ: mma.sync accumulators whose layout PTX documents (common/mma.cuh), so the softmax
//     knows which row and column every value is: rows g and g+8, two columns per 8-key tile, the
//     row's other values in the 3 neighbouring lanes (quad shuffles for max and sum);
//   - P: the S accumulators converted to 16-bit pairs are, as they stand, the A operand of P·V;
//   - O: mma.sync accumulators, rescaled in place by exp2(m_old - m_new) per row.
// Shared memory holds only Q, K and V: K/V arrive by cp.async in STAGES buffers as in phase 6.
// Rows of D halves are stored with their 16-byte chunks XOR-swizzled by (row % 8), so the 8 rows an
// ldmatrix reads at one column land in 8 different bank groups, with no padding.
// The softmax works in base 2: log2(e) is folded into the scale, exp2 is one MUFU instruction.
// Causal: tiles entirely left of the diagonal skip the masking code; tiles right of it are not loaded.
//
// Knowingly does not support: GPUs before sm_80 (cp.async, bf16 mma); head dims other than 64
// and 128; inputs not aligned to 16 bytes.
#include <cmath>

#include "common/async_copy.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/params.cuh"

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
#ifndef Q_IN_REGS_MAX_D
#define Q_IN_REGS_MAX_D 64
#endif

constexpr int kBlockM = BLOCK_M;          // query rows per CTA
constexpr int kBlockN = BLOCK_N;          // keys per tile
constexpr int kStages = STAGES;
constexpr int kWarpRows = WARP_ROWS;      // query rows per warp: every K/V fragment serves this many
constexpr int kMTiles = kWarpRows / 16;   // 16-row mma tiles per warp
constexpr int kWarps = kBlockM / kWarpRows;
constexpr int kThreads = kWarps * 32;
static_assert(kWarpRows == 16 || kWarpRows == 32, "WARP_ROWS is 16 or 32 query rows per warp");
static_assert(kBlockM % kWarpRows == 0 && kWarps >= 1 && kWarps <= 16,
              "BLOCK_M must be a multiple of WARP_ROWS, with 1..16 warps");
static_assert(kBlockN % 16 == 0 && kBlockN >= 16, "BLOCK_N must be a positive multiple of 16 (the mma k-step of P·V)");
static_assert(kStages >= 1 && kStages <= 4, "STAGES must be 1..4");

// Element offset of (row, 16-byte chunk) in a tile of rows of kHeadDim elements, chunks XOR-swizzled
// by the row's low three bits. Needs at least 8 chunks per row (kHeadDim >= 64).
template <int kHeadDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  static_assert(kHeadDim % 64 == 0, "the swizzle permutes 8 chunks of 16 bytes per row");
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

template <typename T, int kHeadDim>
struct SharedStorage {
  T q_tile[kBlockM * kHeadDim];
  T k_tile[kStages][kBlockN * kHeadDim];
  T v_tile[kStages][kBlockN * kHeadDim];
};

// cp.async a tile of kRows rows starting at row `first` into its swizzled buffer; rows past `seqlen`
// are zero-filled.
template <int kRows, int kHeadDim, typename T>
__device__ void copy_tile_async(T* tile, const T* base, int64_t row_stride, int first, int seqlen) {
  constexpr int kChunksPerRow = kHeadDim * sizeof(T) / 16;
  for (int index = threadIdx.x; index < kRows * kChunksPerRow; index += kThreads) {
    const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
    const bool inside = first + row < seqlen;
    cp_async_16(tile + swizzled<kHeadDim>(row, chunk), inside ? base + (first + row) * row_stride + chunk * 8 : base,
                inside);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_registers_kernel(const FlashParams params) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  SharedStorage<T, kHeadDim>& smem = *reinterpret_cast<SharedStorage<T, kHeadDim>*>(smem_raw);
  constexpr int kDTiles = kHeadDim / 8, kKeyTiles = kBlockN / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;   // this lane's row in an 8-row group, and its column pair
  const int head = blockIdx.y, batch = blockIdx.z, q_start = blockIdx.x * kBlockM;
  const int warp_row = warp * kWarpRows;  // this warp's first row in the tile

  const T* q = row_ptr(static_cast<const T*>(params.q), params.q_strides, batch, head, 0);
  const T* k = row_ptr(static_cast<const T*>(params.k), params.k_strides, batch, head, 0);
  const T* v = row_ptr(static_cast<const T*>(params.v), params.v_strides, batch, head, 0);
  const int64_t k_stride = params.k_strides[2], v_stride = params.v_strides[2];
  const int seqlen_k = params.seqlen_k;

  // Top-left causal: the last query row of this tile sees keys 0..q_start + kBlockM - 1.
  const int kv_end = params.causal ? min(seqlen_k, q_start + kBlockM) : seqlen_k;
  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;
  const auto issue_kv_copy = [&](int tile) {
    if (tile < num_tiles) {
      copy_tile_async<kBlockN, kHeadDim>(smem.k_tile[tile % kStages], k, k_stride, tile * kBlockN, seqlen_k);
      copy_tile_async<kBlockN, kHeadDim>(smem.v_tile[tile % kStages], v, v_stride, tile * kBlockN, seqlen_k);
    }
    cp_async_commit();
  };
  copy_tile_async<kBlockM, kHeadDim>(smem.q_tile, q, params.q_strides[2], q_start, params.seqlen_q);
  for (int tile = 0; tile < kStages - 1; ++tile) issue_kv_copy(tile);

  // Q as A fragments, loaded once — or, for wide heads where registers are short, re-read from
  // shared memory (ldmatrix) for every tile.
  constexpr bool kQInRegs = kHeadDim <= Q_IN_REGS_MAX_D;
  uint32_t q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kHeadDim / 16 : 1][4];
  const auto q_fragment = [&](uint32_t (&a)[4], int mt, int kk) {
    ldmatrix_x4(a, smem.q_tile + swizzled<kHeadDim>(warp_row + mt * 16 + lane % 16, kk * 2 + lane / 16));
  };
  float o_acc[kMTiles][kDTiles][4] = {};  // O rows g and g+8 of each m-tile, two columns per 8-wide D tile
  float row_max[kMTiles][2], row_sum[kMTiles][2];   // max in log2 units; sum: this lane's part
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = params.scale * 1.4426950408889634f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int kv_start = tile * kBlockN;
    issue_kv_copy(tile + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    if (kQInRegs && tile == 0) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) q_fragment(q_frag[mt][kk], mt, kk);
    }
    const T* k_tile = smem.k_tile[tile % kStages];
    const T* v_tile = smem.v_tile[tile % kStages];

    // S = Q·Kᵀ for this warp's rows: one x4 ldmatrix gives the B fragments of two 8-key tiles,
    // used by every m-tile of the warp.
    float s[kMTiles][kKeyTiles][4] = {};
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
        ldmatrix_x4(b, k_tile + swizzled<kHeadDim>(np * 16 + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const uint32_t(&a)[4] = kQInRegs ? q_frag[kQInRegs ? mt : 0][kQInRegs ? kk : 0] : q_slice[kQInRegs ? 0 : mt];
          mma_16816<T>(s[mt][2 * np], a, {b[0], b[1]});
          mma_16816<T>(s[mt][2 * np + 1], a, {b[2], b[3]});
        }
      }
    }

    // Mask only the tiles that reach past the sequence or across the diagonal (warp-uniform test).
    const bool needs_mask = kv_start + kBlockN > seqlen_k || (params.causal && kv_start + kBlockN - 1 > q_start);
    if (needs_mask) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kv_start + j * 8 + 2 * t + (e & 1);
            const int query = q_start + warp_row + mt * 16 + g + (e >> 1) * 8;
            if (key >= seqlen_k || (params.causal && key > query)) s[mt][j][e] = -INFINITY;
          }
        }
    }

    // Online softmax, base 2, for rows g (h = 0) and g + 8 (h = 1) of each m-tile.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
        const float new_max = fmaxf(row_max[mt][h], quad_max(tile_max) * scale_log2);
        const float base = new_max == -INFINITY ? 0.f : new_max;   // a row with no visible key so far
        const float correction = fast_exp2(row_max[mt][h] - base);
        float tile_sum = 0.f;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            s[mt][j][e] = fast_exp2(s[mt][j][e] * scale_log2 - base);
            tile_sum += s[mt][j][e];
          }
        }
        row_sum[mt][h] = row_sum[mt][h] * correction + tile_sum;
        row_max[mt][h] = new_max;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          o_acc[mt][d][2 * h] *= correction;
          o_acc[mt][d][2 * h + 1] *= correction;
        }
      }

    // O += P·V: two neighbouring 8-key S tiles are one 16-key A fragment; V's B fragments come
    // transposed from its row-major tile, two 8-wide D tiles per x4 ldmatrix.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + swizzled<kHeadDim>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8, dp * 2 + lane / 16));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(o_acc[mt][2 * dp], a[mt], {b[0], b[1]});
          mma_16816<T>(o_acc[mt][2 * dp + 1], a[mt], {b[2], b[3]});
        }
      }
    }
    __syncthreads();  // this stage may be overwritten
  }

  // Epilogue: the quad's row sums, normalise, write the rows that exist (two columns per store).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv_sum = 1.f / quad_sum(row_sum[mt][h]);   // every lane joins the shuffle
      const int query = q_start + warp_row + mt * 16 + g + h * 8;
      if (query >= params.seqlen_q) continue;
      T* o = row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, query);
#pragma unroll
      for (int d = 0; d < kDTiles; ++d)
        *reinterpret_cast<uint32_t*>(o + d * 8 + 2 * t) =
            pack2<T>(o_acc[mt][d][2 * h] * inv_sum, o_acc[mt][d][2 * h + 1] * inv_sum);
    }
}

template <typename T, int kHeadDim>
cudaError_t launch(dim3 grid, cudaStream_t stream, const FlashParams& p) {
  constexpr size_t kSmem = sizeof(SharedStorage<T, kHeadDim>);
  cudaError_t err = cudaFuncSetAttribute(attention_registers_kernel<T, kHeadDim>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  attention_registers_kernel<T, kHeadDim><<<grid, kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? sizeof(SharedStorage<__half, 128>) : sizeof(SharedStorage<__half, 64>);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  const FlashParams& p = *params;
  if (p.heads > 65535 || p.batch > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads, p.batch);
  const bool bf16 = p.dtype == kBFloat16;
  if (p.head_dim == 64) return bf16 ? launch<__nv_bfloat16, 64>(grid, stream, p) : launch<__half, 64>(grid, stream, p);
  if (p.head_dim == 128) return bf16 ? launch<__nv_bfloat16, 128>(grid, stream, p) : launch<__half, 128>(grid, stream, p);
  return cudaErrorInvalidValue;
}
