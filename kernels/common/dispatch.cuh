// Runtime (dtype, head_dim) -> compile-time template arguments, shared by the launchers.
#pragma once

#include <type_traits>

#include "common/numeric.cuh"
#include "common/params.cuh"

// Calls launch(T{}, std::integral_constant<int, D>{}) for the element type and head dimension in
// `params`; anything else is refused with cudaErrorInvalidValue (the binding names the problem first).
template <typename Launch>
cudaError_t dispatch_dtype_head_dim(const FlashParams& params, Launch&& launch) {
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  if (params.dtype == kFloat16) {
    if (params.head_dim == 64) return launch(__half{}, D64{});
    if (params.head_dim == 128) return launch(__half{}, D128{});
  } else if (params.dtype == kBFloat16) {
    if (params.head_dim == 64) return launch(__nv_bfloat16{}, D64{});
    if (params.head_dim == 128) return launch(__nv_bfloat16{}, D128{});
  }
  return cudaErrorInvalidValue;
}
