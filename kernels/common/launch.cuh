// Host-side launch helpers shared by every phase's launcher: facts about a device, looked up once,
// and a kernel launch that opts in to its dynamic shared memory once per device.
//
// Everything here is `static`, on purpose. Each -D build of a phase is its own shared library, and
// several are loaded into one process. A cache kept in a template with external linkage, keyed on a
// kernel whose mangled name is the same in two builds, becomes one STB_GNU_UNIQUE object for the whole
// process: the second build finds it filled by the first and skips its own cudaFuncSetAttribute.
// An unnamed namespace does not prevent that under nvcc: its front end renames the namespace after
// the source file's name, which every build of one file shares, and templates in it keep external
// linkage. `static` gives every build its own caches (tests/test_kernels_compile.py checks the symbols).
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>

#include <cuda_runtime.h>

#include "common/params.cuh"

constexpr int kMaxDevices = 64;   // devices with a larger ordinal are asked on every call

// One positive int per device, per Key. Zero-initialised: 0 means not looked up yet.
template <typename Key>
static std::atomic<int> per_device_cache[kMaxDevices];

// The value for `device` under Key: from the cache, or from `look_up(int* value)` the first time.
// Each lookup costs microseconds, as much as a whole kernel at the mission shape, so launchers ask
// once per device. Two threads may both look up the first time; they store the same value.
template <typename Key, typename LookUp>
static cudaError_t cached_per_device(int device, int* value, LookUp look_up) {
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && (*value = per_device_cache<Key>[device].load(std::memory_order_acquire)) > 0) return cudaSuccess;
  const cudaError_t err = look_up(value);
  if (err == cudaSuccess && cacheable && *value > 0)
    per_device_cache<Key>[device].store(*value, std::memory_order_release);
  return err;
}

struct SmCountKey;
struct SmemOptinKey;
template <auto kKernel> struct SmemAllowedKey;
template <auto kKernel> struct CtasPerSmKey;

// The device's streaming multiprocessors.
static inline cudaError_t device_sm_count(int device, int* count) {
  return cached_per_device<SmCountKey>(device, count, [&](int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrMultiProcessorCount, device);
  });
}

// The most shared memory one CTA may use on the device, after opting in past 48 KB.
static inline cudaError_t device_smem_optin_bytes(int device, int* bytes) {
  return cached_per_device<SmemOptinKey>(device, bytes, [&](int* value) {
    return cudaDeviceGetAttribute(value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  });
}

// Allows kKernel `bytes` of dynamic shared memory on `device` (needed past 48 KB), once per device;
// every phase's kernel has one size, so the first call's is the kernel's.
// More than the device can give is refused here with cudaErrorInvalidConfiguration, the error CUDA
// documents for a launch asking for more shared memory than the device has; the binding has already
// checked the limit with a message (flashcore_smem_bytes), so this only guards direct callers.
template <auto kKernel>
static cudaError_t allow_dynamic_smem(int device, size_t bytes) {
  int allowed = 0;
  return cached_per_device<SmemAllowedKey<kKernel>>(device, &allowed, [&](int* value) {
    int optin = 0;
    cudaError_t err = device_smem_optin_bytes(device, &optin);
    if (err != cudaSuccess) return err;
    if (bytes > static_cast<size_t>(optin)) return cudaErrorInvalidConfiguration;
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    *value = 1;
    return err;
  });
}

// How many CTAs of kKernel (`threads` threads, `smem_bytes` of dynamic shared memory) one SM of
// `device` holds at once, at least 1. The shared-memory opt-in comes first: the occupancy
// calculator counts only what the kernel is allowed.
template <auto kKernel>
static cudaError_t resident_ctas_per_sm(int device, int threads, size_t smem_bytes, int* ctas) {
  return cached_per_device<CtasPerSmKey<kKernel>>(device, ctas, [&](int* value) {
    int count = 0;
    cudaError_t err = allow_dynamic_smem<kKernel>(device, smem_bytes);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kKernel, threads, smem_bytes);
    *value = count > 0 ? count : 1;
    return err;
  });
}

// Launches kKernel(params) on `stream` and returns the launch's error. A grid past CUDA's limits is
// refused first with the error the launch itself would give; dynamic shared memory is opted in to
// once per device.
template <auto kKernel>
static cudaError_t launch_kernel(dim3 grid, int threads, size_t smem_bytes, cudaStream_t stream,
                                 const FlashParams& params) {
  if (grid.x > static_cast<unsigned>(INT_MAX) || grid.y > 65535 || grid.z > 65535) return cudaErrorInvalidConfiguration;
  if (smem_bytes > 0) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = allow_dynamic_smem<kKernel>(device, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  kKernel<<<grid, threads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}
