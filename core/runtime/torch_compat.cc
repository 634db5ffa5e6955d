#include "core/runtime/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>

#include <sstream>
#include <string>

namespace loraplex {

torch::Tensor ScaledDotProductAttention(const torch::Tensor& query,
                                        const torch::Tensor& key,
                                        const torch::Tensor& value,
                                        const torch::Tensor& additive_mask) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(query, key, value, additive_mask,
                                          /*dropout_p=*/0.0,
                                          /*is_causal=*/false);
#else
  // LibTorch 1.13 ships the fused kernel under a private name that also
  // returns the (unrequested) attention weights.
  return std::get<0>(at::_scaled_dot_product_attention(
      query, key, value, additive_mask, /*dropout_p=*/0.0,
      /*need_attn_weights=*/false, /*is_causal=*/false));
#endif
}

namespace {

// Overload resolution on the key type picks the one this LibTorch uses.
[[maybe_unused]] std::string StateKeyFromImpl(c10::TensorImpl* impl,
                                              std::string* /*tag*/) {
  std::ostringstream out;  // The format LibTorch 1.13 itself uses.
  out << impl;
  return out.str();
}

[[maybe_unused]] void* StateKeyFromImpl(c10::TensorImpl* impl, void** /*tag*/) {
  return impl;
}

}  // namespace

OptimizerStateKey OptimizerStateKeyOf(const torch::Tensor& param) {
  return StateKeyFromImpl(param.unsafeGetTensorImpl(),
                          static_cast<OptimizerStateKey*>(nullptr));
}

torch::Generator MakeCpuGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define LORAPLEX_ALLOCATE_CONST
#else
#define LORAPLEX_ALLOCATE_CONST const
#endif

class CpuAllocationCounter::CountingAllocator : public c10::Allocator {
 public:
  CountingAllocator(c10::Allocator* inner, std::atomic<int64_t>* bytes,
                    std::atomic<int64_t>* allocations)
      : inner_(inner), bytes_(bytes), allocations_(allocations) {}

  c10::DataPtr allocate(size_t n) LORAPLEX_ALLOCATE_CONST override {
    *bytes_ += static_cast<int64_t>(n);
    ++*allocations_;
    return inner_->allocate(n);  // Freed by the inner allocator's deleter.
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return inner_->raw_deleter();
  }
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
#endif

  c10::Allocator* inner() const { return inner_; }

 private:
  c10::Allocator* inner_;
  std::atomic<int64_t>* bytes_;
  std::atomic<int64_t>* allocations_;
};
#undef LORAPLEX_ALLOCATE_CONST

CpuAllocationCounter::CpuAllocationCounter()
    : allocator_(std::make_unique<CountingAllocator>(c10::GetCPUAllocator(),
                                                     &bytes_, &allocations_)) {
  // Priority 255 wins over every registered allocator.
  c10::SetCPUAllocator(allocator_.get(), /*priority=*/255);
}

CpuAllocationCounter::~CpuAllocationCounter() {
  c10::SetCPUAllocator(allocator_->inner(), /*priority=*/255);
}

}  // namespace loraplex
