// Phase 1 — the scalar baseline: one CTA per query row, online softmax, fp32 accumulation.
//
// What it is. The original FlashCore project's first kernel, rebuilt: each CTA of kThreads threads
// owns one query row. It walks the keys in chunks of kThreads; every thread scores one key with a
// scalar dot product, the CTA reduces the chunk's max and sum through shared memory, and the threads
// that own an output column fold the chunk's probabilities into their running output (online
// softmax: the running output and row sum are rescaled by exp(old_max - new_max) whenever the max
// grows). Nothing is materialised but one chunk of probabilities, so any sequence length works.
//
// Measured: the original's run (NVIDIA L4) is quoted in book/intro.md; this file's effect is in
// results/nvidia-h100-80gb-hbm3/p01_baseline.json and chapter 1.
//
// Why it is slow, on purpose. Each thread reads a whole K row (D halves, 2 bytes at a time, 128
// threads touching 128 different rows: uncoalesced), every key of the head is re-read by every
// query row (S x more traffic than the data), and each chunk of NUM_THREADS keys costs
// 2 (log2 NUM_THREADS + 2) + 1 CTA-wide barriers, 19 at the default 128: two tree reductions of
// nine each (one to publish the values, seven halvings, one before the scratch is reused) and one
// before the next chunk overwrites the probabilities. One more precedes the loop.
// Phase 2 attacks the loads and the reductions.
//
// Knowingly does not support: head dims other than 64 and 128.
#include <cfloat>

#include "common/dispatch.cuh"
#include "common/launch.cuh"

#ifndef NUM_THREADS
#define NUM_THREADS 128
#endif

constexpr int kThreads = NUM_THREADS;
static_assert(kThreads >= 128 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0,
              "NUM_THREADS must be a power of two in [128, 1024]: the tree reduction halves it, "
              "and every output column (D <= 128) needs a thread");

template <int kHeadDim>
struct SharedStorage {
  float q_row[kHeadDim];    // this CTA's query row, pre-multiplied by the softmax scale
  float probs[kThreads];    // exp(score - running max) for the current chunk of keys
  float reduce[kThreads];   // scratch for the CTA-wide max / sum
};

// Tree reduction over the CTA through shared memory; every thread gets the result.
template <bool kIsMax>
__device__ float block_reduce(float value, float* scratch) {
  const int tid = threadIdx.x;
  scratch[tid] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) {
      const float other = scratch[tid + stride];
      scratch[tid] = kIsMax ? fmaxf(scratch[tid], other) : scratch[tid] + other;
    }
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads) attention_row_kernel(const FlashParams params) {
  static_assert(kHeadDim <= kThreads, "one thread per output column");
  __shared__ SharedStorage<kHeadDim> smem;

  const int row = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x;
  const T* q = row_ptr(static_cast<const T*>(params.q), params.q_strides, batch, head, row);
  const T* k = row_ptr(static_cast<const T*>(params.k), params.k_strides, batch, head, 0);
  const T* v = row_ptr(static_cast<const T*>(params.v), params.v_strides, batch, head, 0);
  T* o = row_ptr(static_cast<T*>(params.o), params.o_strides, batch, head, row);
  const int64_t k_row_stride = params.k_strides[2], v_row_stride = params.v_strides[2];

  // Top-left causal alignment (as SDPA): row i attends to keys 0..i, so never to nothing.
  const int kv_end = params.causal ? min(params.seqlen_k, row + 1) : params.seqlen_k;

  if (tid < kHeadDim) smem.q_row[tid] = to_float(q[tid]) * params.scale;
  __syncthreads();

  float row_max = -FLT_MAX;  // running max of the scores seen so far
  float row_sum = 0.f;       // running sum of exp(score - row_max)
  float acc = 0.f;           // output column `tid`, unnormalised (threads tid < kHeadDim)

  for (int chunk = 0; chunk < kv_end; chunk += kThreads) {
    const int key = chunk + tid;
    float score = -FLT_MAX;
    if (key < kv_end) {
      const T* k_row = k + key * k_row_stride;
      score = 0.f;
      for (int d = 0; d < kHeadDim; ++d) score += smem.q_row[d] * to_float(k_row[d]);
    }
    const float new_max = fmaxf(row_max, block_reduce<true>(score, smem.reduce));
    const float prob = key < kv_end ? expf(score - new_max) : 0.f;
    smem.probs[tid] = prob;  // published by the barriers inside the reduction below
    const float correction = expf(row_max - new_max);
    row_sum = row_sum * correction + block_reduce<false>(prob, smem.reduce);
    row_max = new_max;

    if (tid < kHeadDim) {
      const int chunk_len = min(kThreads, kv_end - chunk);
      float pv = 0.f;
      for (int j = 0; j < chunk_len; ++j) pv += smem.probs[j] * to_float(v[(chunk + j) * v_row_stride + tid]);
      acc = acc * correction + pv;
    }
    __syncthreads();  // probs is overwritten by the next chunk
  }

  if (tid < kHeadDim) o[tid] = from_float<T>(acc / row_sum);
}

extern "C" size_t flashcore_smem_bytes(const FlashParams* params) {
  return params->head_dim == 128 ? sizeof(SharedStorage<128>) : sizeof(SharedStorage<64>);
}

extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream) {
  const FlashParams& p = *params;
  const dim3 grid(p.seqlen_q, p.heads, p.batch);
  return dispatch_dtype_head_dim(p, [&](auto element, auto head_dim) {
    using T = decltype(element);
    return launch_kernel<attention_row_kernel<T, decltype(head_dim)::value>>(grid, kThreads, 0, stream, p);
  });
}
