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
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace loraplex {

// True when the LibTorch we compiled against is 2.0 or newer.
inline constexpr bool kTorchIs2OrNewer = TORCH_VERSION_MAJOR >= 2;

// softmax(q kᵀ / sqrt(d) + mask) v over the last two dims of [B, H, T, D]
// tensors. `additive_mask` broadcasts to [B, H, Tq, Tk] and holds 0 for
// visible keys and -inf for hidden ones; undefined, the attention is causal
// (query i sees keys 0..i, Tq == Tk), which lets a GPU use its flash
// kernels.
torch::Tensor ScaledDotProductAttention(const torch::Tensor& query,
                                        const torch::Tensor& key,
                                        const torch::Tensor& value,
                                        const torch::Tensor& additive_mask);

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

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_TORCH_COMPAT_H_
