// The one Python binding for every phase. It knows nothing about tensors, so this file needs no torch
// headers and compiles in seconds. Calls go through the launcher (csrc/launcher.cpp), which takes the
// address forward_address() returns; smem_bytes() takes raw pointers, strides and sizes.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/params.cuh"

namespace {

FlashParams make_params(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
                        const std::vector<int64_t>& strides, const std::vector<int>& sizes,
                        float scale, bool causal, int dtype) {
  if (strides.size() != 12 || sizes.size() != 5)
    throw std::invalid_argument("expected 12 strides (q, k, v, o x batch, head, row) and 5 sizes");
  FlashParams p{};
  p.q = reinterpret_cast<const void*>(q);
  p.k = reinterpret_cast<const void*>(k);
  p.v = reinterpret_cast<const void*>(v);
  p.o = reinterpret_cast<void*>(o);
  int64_t* targets[4] = {p.q_strides, p.k_strides, p.v_strides, p.o_strides};
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 3; ++d) targets[t][d] = strides[t * 3 + d];
  p.batch = sizes[0];
  p.heads = sizes[1];
  p.seqlen_q = sizes[2];
  p.seqlen_k = sizes[3];
  p.head_dim = sizes[4];
  p.scale = scale;
  p.causal = causal ? 1 : 0;
  p.dtype = dtype;
  return p;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def(
      "smem_bytes",
      [](std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
         const std::vector<int64_t>& strides, const std::vector<int>& sizes, float scale,
         bool causal, int dtype) {
        const FlashParams p = make_params(q, k, v, o, strides, sizes, scale, causal, dtype);
        return flashcore_smem_bytes(&p);
      },
      "Shared memory (bytes) one CTA needs for these parameters.");
  m.def(
      "forward_address", [] { return reinterpret_cast<std::uintptr_t>(&flashcore_forward); },
      "Address of flashcore_forward, for the launcher (csrc/launcher.cpp).");
}
