// The one contract between the Python harness and every phase's kernel.
//
// Each kernels/pNN_<slug>.cu exports the two C functions declared at the bottom. The binding in
// flashcore_nb validates tensors in Python, fills a FlashParams and calls them, so the harness never
// branches on the phase. Nothing here (or in any kernel) includes torch: `nvcc -c` alone compiles a
// phase on a machine with no GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

enum FlashDtype : int { kFloat16 = 0, kBFloat16 = 1 };

struct FlashParams {
  // q: (B, H, Sq, D)   k, v: (B, H, Sk, D)   o: (B, H, Sq, D); the last dimension is contiguous.
  const void* q;
  const void* k;
  const void* v;
  void* o;
  // Strides in elements for the batch, head and row dimensions of each tensor.
  int64_t q_strides[3];
  int64_t k_strides[3];
  int64_t v_strides[3];
  int64_t o_strides[3];
  int batch, heads, seqlen_q, seqlen_k, head_dim;
  float scale;   // softmax scale, usually 1/sqrt(D)
  int causal;    // top-left aligned, as in PyTorch SDPA: query row i sees keys 0..i
  int dtype;     // FlashDtype
};

// Shared memory one CTA needs for these parameters (static + dynamic), so the binding can refuse a
// configuration this GPU cannot hold before anything is launched.
extern "C" size_t flashcore_smem_bytes(const FlashParams* params);

// Launches the phase's kernel on `stream`; returns the launch's error code (cudaSuccess when queued).
extern "C" cudaError_t flashcore_forward(const FlashParams* params, cudaStream_t stream);

typedef cudaError_t (*flashcore_forward_fn)(const FlashParams*, cudaStream_t);
