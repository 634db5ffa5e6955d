// The one place for calls whose spelling differs between LibTorch releases.
//
// loraplex builds against Debian's LibTorch 1.13 (CPU) and LibTorch 2.x (CPU
// or CUDA). Any API that changed between them is wrapped here so the rest of
// the code base stays version-agnostic.
#ifndef LORAPLEX_CORE_RUNTIME_TORCH_COMPAT_H_
#define LORAPLEX_CORE_RUNTIME_TORCH_COMPAT_H_

#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex {

// True when the LibTorch we compiled against is 2.0 or newer.
inline constexpr bool kTorchIs2OrNewer = TORCH_VERSION_MAJOR >= 2;

// softmax(q kᵀ / sqrt(d) + mask) v over the last two dims of [B, H, T, D]
// tensors. `additive_mask` broadcasts to [B, H, Tq, Tk] and holds 0 for
// visible keys and -inf for hidden ones; undefined, the attention is causal
// (query i sees keys 0..i, Tq == Tk), which lets a GPU use its flash
// kernels. `scale` multiplies the logits q·k; unset, 1/sqrt(head_dim).
torch::Tensor ScaledDotProductAttention(
    const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& additive_mask,
    std::optional<double> scale = std::nullopt);

// The key under which torch::optim::Optimizer keeps a parameter's state:
// LibTorch 1.13 uses the TensorImpl address printed as a string, 2.x the
// address itself.
using OptimizerStateMap = std::remove_reference_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>;
using OptimizerStateKey = OptimizerStateMap::key_type;
OptimizerStateKey OptimizerStateKeyOf(const torch::Tensor& param);

// The state `optimizer` keeps for `param` as its concrete type, or nullptr
// when it has none yet.
template <typename State>
State* FindOptimizerState(torch::optim::Optimizer& optimizer,
                          const torch::Tensor& param) {
  auto it = optimizer.state().find(OptimizerStateKeyOf(param));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<State*>(it->second.get());
}

// The widest vector instructions LibTorch's CPU kernels dispatch to
// ("AVX512", "AVX2", "DEFAULT"); empty on LibTorch 1.13, which cannot say.
std::string CpuCapability();

// A CPU random generator seeded with `seed` (for seeded init and dropout).
torch::Generator MakeCpuGenerator(uint64_t seed);

// Counts the bytes LibTorch allocates on the CPU while it is alive. The
// first counter installs, for the rest of the process, a CPU allocator that
// delegates to LibTorch's. For tests that check how much memory a
// computation allocates; one at a time per process.
class CpuAllocationCounter {
 public:
  CpuAllocationCounter();
  ~CpuAllocationCounter();
  CpuAllocationCounter(const CpuAllocationCounter&) = delete;
  CpuAllocationCounter& operator=(const CpuAllocationCounter&) = delete;

  int64_t bytes() const { return bytes_.load(); }
  int64_t allocations() const { return allocations_.load(); }
  void Reset() {
    bytes_ = 0;
    allocations_ = 0;
  }

 private:
  class CountingAllocator;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> allocations_{0};
};

// One operator, kernel or copy recorded by ProfileCall.
struct ProfiledEvent {
  std::string name;
  // A GPU kernel, copy or memset; otherwise an operator run by a CPU thread
  // (which, on a GPU, launches the kernels).
  bool on_device = false;
  // The CPU thread or the GPU stream it ran on.
  uint64_t lane = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// Runs `fn` once under LibTorch's profiler (Kineto): the CPU operators, and
// with `cuda` also the CUDA kernels and copies, in the order they started.
// Writes a Chrome trace (chrome://tracing, Perfetto) to `trace_path` unless
// it is empty. FAILED_PRECONDITION on LibTorch 1.13 or when the profiler
// cannot start, INTERNAL when the trace cannot be written; `fn`'s
// exceptions pass through.
absl::StatusOr<std::vector<ProfiledEvent>> ProfileCall(
    const std::function<void()>& fn, bool cuda, const std::string& trace_path);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_TORCH_COMPAT_H_
