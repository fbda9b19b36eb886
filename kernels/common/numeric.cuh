// Element-type helpers: every phase computes in fp32 and reads/writes fp16 or bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Pointer to row `row` of head (b, h) in a (B, H, S, D) tensor with the given element strides.
template <typename T>
__device__ __forceinline__ T* row_ptr(T* base, const int64_t* strides, int b, int h, int row) {
  return base + b * strides[0] + h * strides[1] + row * strides[2];
}
