// Every primitive of kernels/common/{mbarrier,tma,warp_specialize}.cuh used once, on real data where
// an sm_90 GPU is present. tests/test_kernels_compile.py builds it for sm_90a into an executable linked
// without libcuda, compiles it for sm_80 (the primitives are absent there, so the kernel body is
// compiled out), and runs it: "ok" on an H100, "no CUDA device" where there is none.
//
// X and Y are (B, H, S, D) = (2, 2, 128, 64) fp16 tensors, Y zeroed. Warpgroup 0 (the producer) gives
// its registers back and has TMA copy three 64x64 boxes of X into shared memory, through a 2D, a 3D
// and a 4D view of X; the 4D box hangs 32 rows past the end of its head, which TMA fills with zeros.
// Warpgroup 1 (the consumer) takes registers, waits for the boxes, checks the zeros, negates the first
// box in shared memory, tells the producer it is done with them (the "empty" barrier of a pipeline),
// and stores all three to the same places in Y with TMA (which drops the rows outside Y). The host then
// expects Y = -X, X and X on the three boxes' rows inside the tensor, and 0 everywhere else.
#include <cstdio>
#include <vector>

#include <cuda_fp16.h>

#include "common/mbarrier.cuh"
#include "common/tma.cuh"
#include "common/warp_specialize.cuh"

constexpr int kB = 2, kH = 2, kS = 128, kD = 64;
constexpr int kBox = 64;   // rows per box; a row is kD halves = 128 bytes

struct __align__(1024) SharedStorage {
  __half box[3][kBox * kD];   // 128B-swizzled: each box 1024-byte aligned
  uint64_t full;              // completes when the three boxes have landed
  uint64_t consumed;          // completes when the consumer is done with them
};

__global__ void __launch_bounds__(256, 2)
    primitives_kernel(const __grid_constant__ CUtensorMap x_2d, const __grid_constant__ CUtensorMap x_3d,
                      const __grid_constant__ CUtensorMap x_4d, const __grid_constant__ CUtensorMap y_2d,
                      const __grid_constant__ CUtensorMap y_3d, const __grid_constant__ CUtensorMap y_4d,
                      int* failures) {
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr uint32_t kBoxBytes = kBox * kD * sizeof(__half);
  constexpr int kZeroFilledRows = 32;   // the 4D box's rows past the end of its head
  // ptxas starts every thread at 128 registers (65536 / (256 threads x 2 CTAs)): the producer gives
  // 88 each back, the consumer takes them.
  constexpr int kProducerRegisters = 40, kConsumerRegisters = 216;
  constexpr uint32_t kIssued = 1;    // named barrier: the producer has issued its copies
  constexpr uint32_t kNegated = 2;   // named barrier: the consumer has negated box 0
  __shared__ SharedStorage smem;
  if (threadIdx.x == 0) {
    if (smem_address(smem.box) % 1024 != 0) atomicOr(failures, 1);
    mbarrier_init(&smem.full, 1);
    mbarrier_init(&smem.consumed, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {   // producer
    setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(&smem.full, 3 * kBoxBytes);
      tma_load(smem.box[0], &x_2d, &smem.full, {0, 0});         // rows 0-63 of head (b 0, h 0)
      tma_load(smem.box[1], &x_3d, &smem.full, {0, 64, 1});      // rows 64-127 of head b·H + h = 1
      tma_load(smem.box[2], &x_4d, &smem.full, {0, 96, 0, 1});   // rows 96-159 of head (b 1, h 0)
    }
    named_barrier_arrive(kIssued, 256);
    if (threadIdx.x == 0) {   // where a pipeline's producer would wait before refilling the boxes
      mbarrier_wait(&smem.consumed, 0);
      mbarrier_inval(&smem.consumed);
    }
    return;
  }

  // consumer
  setmaxnreg_inc<kConsumerRegisters>();
  named_barrier_sync(kIssued, 256);
  mbarrier_wait(&smem.full, 0);
  const int lane = threadIdx.x - 128;
  // Swizzling permutes the 16-byte chunks inside a 128-byte row, so box rows stay whole rows.
  const uint4* zero_rows = reinterpret_cast<const uint4*>(smem.box[2] + (kBox - kZeroFilledRows) * kD);
  for (int i = lane; i < kZeroFilledRows * kD * 2 / 16; i += 128) {
    const uint4 chunk = zero_rows[i];
    if (chunk.x | chunk.y | chunk.z | chunk.w) atomicOr(failures, 2);
  }
  uint32_t* negate = reinterpret_cast<uint32_t*>(smem.box[0]);
  for (int i = lane; i < kBox * kD / 2; i += 128) negate[i] ^= 0x80008000u;
  fence_proxy_async();   // the TMA store reads what these threads wrote
  named_barrier_sync(kNegated, 128);
  if (lane == 0) {
    tma_store(&y_2d, smem.box[0], {0, 0});
    tma_store(&y_3d, smem.box[1], {0, 64, 1});
    tma_store(&y_4d, smem.box[2], {0, 96, 0, 1});
    tma_store_commit();
    tma_store_wait<0>();   // the boxes have been read: they are free
    mbarrier_arrive(&smem.consumed);
    mbarrier_inval(&smem.full);
  }
#endif
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                             \
      std::printf("FAILED: %s: %s\n", #call, cudaGetErrorName(err_));                      \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// The three views of one (B, H, S, D) tensor, boxes of 64 rows x D, 128B-swizzled.
static cudaError_t make_views(__half* tensor, CUtensorMap (&maps)[3]) {
  const uint64_t row = kD * sizeof(__half);
  cudaError_t err = make_tensor_map<2>(&maps[0], kFloat16, tensor, {kD, kB * kH * kS}, {row}, {kD, kBox}, true);
  if (err == cudaSuccess)
    err = make_tensor_map<3>(&maps[1], kFloat16, tensor, {kD, kS, kB * kH}, {row, row * kS}, {kD, kBox, 1}, true);
  if (err == cudaSuccess)
    err = make_tensor_map<4>(&maps[2], kFloat16, tensor, {kD, kS, kH, kB}, {row, row * kS, row * kS * kH},
                             {kD, kBox, 1, 1}, true);
  return err;
}

int main() {
  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s)\n", cudaGetErrorName(found));
    return 0;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("not an sm_90 GPU (%s, sm_%d%d): nothing run\n", prop.name, prop.major, prop.minor);
    return 0;
  }

  constexpr int kElements = kB * kH * kS * kD;
  std::vector<__half> x(kElements), y(kElements);
  for (int i = 0; i < kElements; ++i) x[i] = __float2half(static_cast<float>(i % 1999 + 1));   // exact in fp16
  __half *x_dev, *y_dev;
  int* failures_dev;
  CHECK(cudaMalloc(&x_dev, kElements * sizeof(__half)));
  CHECK(cudaMalloc(&y_dev, kElements * sizeof(__half)));
  CHECK(cudaMalloc(&failures_dev, sizeof(int)));
  CHECK(cudaMemcpy(x_dev, x.data(), kElements * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y_dev, 0, kElements * sizeof(__half)));
  CHECK(cudaMemset(failures_dev, 0, sizeof(int)));

  CUtensorMap x_maps[3], y_maps[3];
  CHECK(make_views(x_dev, x_maps));
  CHECK(make_views(y_dev, y_maps));
  primitives_kernel<<<1, 256>>>(x_maps[0], x_maps[1], x_maps[2], y_maps[0], y_maps[1], y_maps[2], failures_dev);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  int failures = 0;
  CHECK(cudaMemcpy(&failures, failures_dev, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(y.data(), y_dev, kElements * sizeof(__half), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kH; ++h)
      for (int s = 0; s < kS; ++s)
        for (int d = 0; d < kD; ++d) {
          const int i = ((b * kH + h) * kS + s) * kD + d;
          const float value = __half2float(x[i]);
          float expected = 0.f;
          if (b == 0 && h == 0 && s < 64) expected = -value;   // box 0, negated
          if (b == 0 && h == 1 && s >= 64) expected = value;   // box 1
          if (b == 1 && h == 0 && s >= 96) expected = value;   // box 2, its rows inside the tensor
          wrong += __half2float(y[i]) != expected;
        }
  if (failures != 0 || wrong != 0) {
    std::printf("FAILED: device checks 0x%x (1: misaligned boxes, 2: rows not zero-filled), %d wrong elements of Y\n",
                failures, wrong);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
