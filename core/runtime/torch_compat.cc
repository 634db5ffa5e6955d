#include "core/runtime/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Version.h>
#include <c10/core/CPUAllocator.h>

#include <cmath>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loraplex {

torch::Tensor ScaledDotProductAttention(const torch::Tensor& query,
                                        const torch::Tensor& key,
                                        const torch::Tensor& value,
                                        const torch::Tensor& additive_mask,
                                        std::optional<double> scale) {
  const bool causal = !additive_mask.defined();
  // An undefined tensor would still count as a mask: pass none.
  const c10::optional<at::Tensor> mask =
      causal ? c10::nullopt : c10::optional<at::Tensor>(additive_mask);
#if TORCH_VERSION_MAJOR >= 2
  const c10::optional<double> logit_scale =
      scale.has_value() ? c10::optional<double>(*scale) : c10::nullopt;
  return at::scaled_dot_product_attention(query, key, value, mask,
                                          /*dropout_p=*/0.0, causal,
                                          logit_scale);
#else
  // LibTorch 1.13 ships the fused kernel under a private name that also
  // returns the (unrequested) attention weights, and takes no scale: the
  // queries carry it instead (the kernel divides by sqrt(head_dim)).
  const torch::Tensor scaled =
      scale.has_value()
          ? query * (*scale * std::sqrt(static_cast<double>(query.size(-1))))
          : query;
  return std::get<0>(at::_scaled_dot_product_attention(
      scaled, key, value, mask, /*dropout_p=*/0.0,
      /*need_attn_weights=*/false, causal));
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

std::string CpuCapability() {
#if TORCH_VERSION_MAJOR >= 2
  return at::get_cpu_capability();
#else
  return "";
#endif
}

torch::Generator MakeCpuGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

// Delegates to the allocator it replaced and counts while a counter is
// active. Installed once and never freed: storages remember the allocator
// that made them (e.g. for resize_), so it must outlive every tensor.
// LibTorch 2.3 made allocate() non-const and added copy_data(); both
// spellings are defined, without `override`, so whichever the base class
// declares is overridden.
class CpuAllocationCounter::CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  static CountingAllocator& Installed() {
    static CountingAllocator* const instance = [] {
      auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(allocator, /*priority=*/255);
      return allocator;
    }();
    return *instance;
  }

  c10::DataPtr allocate(size_t n) const { return Count(n); }
  c10::DataPtr allocate(size_t n) { return Count(n); }
  c10::DeleterFnPtr raw_deleter() const override {
    return inner_->raw_deleter();
  }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  std::atomic<CpuAllocationCounter*> active{nullptr};

 private:
  c10::DataPtr Count(size_t n) const {
    if (CpuAllocationCounter* counter = active.load()) {
      counter->bytes_ += static_cast<int64_t>(n);
      ++counter->allocations_;
    }
    return inner_->allocate(n);  // Freed by the inner allocator's deleter.
  }

  c10::Allocator* inner_;
};

CpuAllocationCounter::CpuAllocationCounter() {
  CountingAllocator::Installed().active = this;
}

CpuAllocationCounter::~CpuAllocationCounter() {
  CountingAllocator::Installed().active = nullptr;
}

absl::StatusOr<std::vector<ProfiledEvent>> ProfileCall(
    const std::function<void()>& fn, bool cuda, const std::string& trace_path) {
#if TORCH_VERSION_MAJOR >= 2
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(
      torch::profiler::impl::ProfilerState::KINETO,
      /*report_input_shapes=*/true);
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  try {
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LibTorch's profiler did not start: ", e.what_without_backtrace()));
  }
  try {
    fn();
  } catch (...) {
    profiler::disableProfiler();
    throw;
  }
  const std::unique_ptr<profiler::ProfilerResult> result =
      profiler::disableProfiler();
  if (result == nullptr) {
    return absl::FailedPreconditionError(
        "LibTorch's profiler recorded nothing");
  }
  std::vector<ProfiledEvent> events;
  for (const profiler::KinetoEvent& e : result->events()) {
    if (e.isHiddenEvent() || e.endNs() < e.startNs()) continue;
    ProfiledEvent event;
    event.name = e.name();
    event.on_device = e.deviceType() != c10::DeviceType::CPU;
    event.lane = event.on_device ? static_cast<uint64_t>(e.deviceResourceId())
                                 : e.startThreadId();
    event.start_ns = static_cast<int64_t>(e.startNs());
    event.end_ns = static_cast<int64_t>(e.endNs());
    events.push_back(std::move(event));
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const ProfiledEvent& a, const ProfiledEvent& b) {
                     return a.start_ns < b.start_ns;
                   });
  if (!trace_path.empty()) {
    std::string why = "nothing was written";
    std::error_code error;
    std::filesystem::remove(trace_path, error);  // So an old one cannot pass.
    try {
      result->save(trace_path);
    } catch (const c10::Error& e) {
      why = e.what_without_backtrace();
    }
    if (!std::filesystem::exists(trace_path, error)) {
      return absl::InternalError(
          absl::StrCat("writing the trace to ", trace_path, " failed: ", why));
    }
  }
  return events;
#else
  (void)fn;
  (void)cuda;
  (void)trace_path;
  return absl::FailedPreconditionError("profiling needs LibTorch 2.x");
#endif
}

}  // namespace loraplex
