// The fast call path: one torch-aware launcher, built once, for every phase.
//
// Each phase stays a torch-free extension exporting flashcore_forward (kernels/common/params.cuh).
// Python registers a loaded phase here by that function's address and gets back a small integer;
// the op flashcore::attention then launches that phase from C++: allocation through the caching
// allocator, the current stream, no Python in between.
// Being a real operator (with a Meta kernel for shapes) it also works under torch.compile and in
// CUDA graphs.
//
// flashcore_nb/binding.py validates every new input signature in Python, with the error messages the
// book shows; the checks here repeat the ones that keep a launch memory-safe, for the calls Python
// does not see (torch.compile traces straight to the op).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include "common/params.cuh"

namespace {

// Raises RuntimeError with a printf-formatted message. TORCH_CHECK with values streamed into its
// message crashed the process (SIGSEGV) when thrown from this library on the H100's torch 2.11, while
// TORCH_CHECK with one C string raised cleanly; so every message is formatted here first.
template <typename... Args>
[[noreturn]] void fail(const char* format, Args... args) {
  char message[256];
  std::snprintf(message, sizeof message, format, args...);
  TORCH_CHECK(false, static_cast<const char*>(message));
  std::abort();   // not reached: TORCH_CHECK(false, ...) throws
}

#define FLASHCORE_CHECK(cond, ...) \
  do {                             \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

struct PhaseEntry {
  flashcore_forward_fn forward;
  int64_t head_dims_mask;   // bit d/64 - 1 set for each supported head dim (64: bit 0, 128: bit 1)
  bool causal, cross_lengths, aligned_16b;
};

std::mutex registry_mutex;
std::vector<PhaseEntry> registry;   // only ever appended to: an index stays valid

PhaseEntry phase_entry(int64_t phase) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  FLASHCORE_CHECK(phase >= 0 && phase < static_cast<int64_t>(registry.size()), "unknown FlashCore phase handle %lld",
                  static_cast<long long>(phase));
  return registry[phase];
}

int64_t register_phase(int64_t forward, int64_t head_dims_mask, bool causal, bool cross_lengths, bool aligned_16b) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.push_back({reinterpret_cast<flashcore_forward_fn>(forward), head_dims_mask, causal, cross_lengths,
                      aligned_16b});
  return static_cast<int64_t>(registry.size()) - 1;
}

// Every row of a (batch, heads, seq_len, head_dim) tensor starts on a 16-byte boundary: the base and the strides.
bool rows_aligned_16b(const at::Tensor& t) {
  const int64_t elements = 16 / t.element_size();
  return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % elements == 0 &&
         t.stride(1) % elements == 0 && t.stride(2) % elements == 0;
}

void check_inputs(const PhaseEntry& entry, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    FLASHCORE_CHECK(t->is_cuda() && t->device() == q.device(), "q, k, v must be CUDA tensors on one device");
    FLASHCORE_CHECK(t->dim() == 4, "q, k, v must have rank 4 (batch, heads, seq_len, head_dim)");
    FLASHCORE_CHECK(t->scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
    FLASHCORE_CHECK(t->stride(3) == 1, "the last dimension of q, k, v must be contiguous (stride 1)");
    FLASHCORE_CHECK(!entry.aligned_16b || rows_aligned_16b(*t),
                    "q, k, v must be 16-byte aligned (data_ptr and batch/head/row strides)");
  }
  FLASHCORE_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "dtype must be float16 or bfloat16");
  FLASHCORE_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
  FLASHCORE_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
                    "q and k must agree on batch, heads and head_dim");
  FLASHCORE_CHECK(q.numel() > 0 && k.numel() > 0, "empty input");
  const int64_t d = q.size(3);
  FLASHCORE_CHECK(d % 64 == 0 && d / 64 <= 62 && ((entry.head_dims_mask >> (d / 64 - 1)) & 1),
                    "this phase does not support head_dim %lld", static_cast<long long>(d));
  FLASHCORE_CHECK(!causal || entry.causal, "this phase does not support causal=True");
  FLASHCORE_CHECK(entry.cross_lengths || q.size(2) == k.size(2), "this phase needs equal query and key lengths");
  FLASHCORE_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535 && q.size(2) <= INT32_MAX && k.size(2) <= INT32_MAX,
                    "batch and heads must each be <= 65535");
}

FlashParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, bool causal,
                        double scale) {
  FlashParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  const at::Tensor* tensors[4] = {&q, &k, &v, &o};
  int64_t* targets[4] = {p.q_strides, p.k_strides, p.v_strides, p.o_strides};
  for (int t = 0; t < 4; ++t)
    for (int dim = 0; dim < 3; ++dim) targets[t][dim] = tensors[t]->stride(dim);
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.seqlen_q = static_cast<int>(q.size(2));
  p.seqlen_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.scale = static_cast<float>(scale);
  p.causal = causal ? 1 : 0;
  p.dtype = q.scalar_type() == at::kBFloat16 ? kBFloat16 : kFloat16;
  return p;
}

void launch(const PhaseEntry& entry, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
            bool causal, double scale) {
  const c10::cuda::OptionalCUDAGuard guard(q.device());   // a device switch only when q is not on the current one
  const FlashParams params = make_params(q, k, v, out, causal, scale);
  const cudaError_t err = entry.forward(&params, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  // Too much shared memory for this GPU comes back as cudaErrorInvalidConfiguration (launch.cuh), not
  // a launch; Python's first-call validation names it (SharedMemoryError) before it gets here.
  FLASHCORE_CHECK(err == cudaSuccess, "kernel launch failed: %s: %s", cudaGetErrorName(err), cudaGetErrorString(err));
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                          int64_t phase) {
  const PhaseEntry entry = phase_entry(phase);
  check_inputs(entry, q, k, v, causal);
  at::Tensor out = at::empty(q.sizes(), q.options());   // contiguous, from the caching allocator
  launch(entry, q, k, v, out, causal, scale);
  return out;
}

void attention_out_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                        bool causal, double scale, int64_t phase) {
  const PhaseEntry entry = phase_entry(phase);
  check_inputs(entry, q, k, v, causal);
  FLASHCORE_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() && out.device() == q.device() &&
                        out.stride(3) == 1,
                    "out must match q's shape, dtype and device, with a contiguous last dimension");
  // O's rows too: p08-p10 store 16 bytes per lane, the others 4 (2-byte-aligned rows would fault either way)
  FLASHCORE_CHECK(!entry.aligned_16b || rows_aligned_16b(out),
                  "out must be 16-byte aligned (data_ptr and batch/head/row strides)");
  launch(entry, q, k, v, out, causal, scale);
}

at::Tensor attention_meta(const at::Tensor& q, const at::Tensor&, const at::Tensor&, bool, double, int64_t) {
  return at::empty(q.sizes(), q.options());
}

void attention_out_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                        int64_t) {}

// Forward only: an input that requires grad under grad mode is refused here, at the call, rather than
// returning an output whose backward fails later, far from the cause.
void refuse_grad(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  FLASHCORE_CHECK(!(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())),
              "FlashCore kernels are forward only (no backward): call them under torch.no_grad() or "
              "torch.inference_mode(), or detach the inputs");
}

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                              int64_t phase) {
  refuse_grad(q, k, v);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flashcore::attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                                               int64_t)>();
  const at::AutoDispatchBelowADInplaceOrView below;
  return op.call(q, k, v, causal, scale, phase);
}

void attention_out_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            bool causal, double scale, int64_t phase) {
  refuse_grad(q, k, v);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flashcore::attention_out", "")
                             .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         bool, double, int64_t)>();
  const at::AutoDispatchBelowADInplaceOrView below;
  op.call(q, k, v, out, causal, scale, phase);
}

}  // namespace

TORCH_LIBRARY(flashcore, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal, float scale, int phase) -> Tensor");
  m.def("attention_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, bool causal, float scale, int phase) -> ()");
}

TORCH_LIBRARY_IMPL(flashcore, CUDA, m) {
  m.impl("attention", &attention_cuda);
  m.impl("attention_out", &attention_out_cuda);
}

TORCH_LIBRARY_IMPL(flashcore, Meta, m) {
  m.impl("attention", &attention_meta);
  m.impl("attention_out", &attention_out_meta);
}

TORCH_LIBRARY_IMPL(flashcore, Autograd, m) {
  m.impl("attention", &attention_autograd);
  m.impl("attention_out", &attention_out_autograd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_phase", &register_phase,
        "Register a loaded phase by the address of its flashcore_forward and what it supports; "
        "returns the handle torch.ops.flashcore.attention takes.");
}
