#include "core/lora/lora_weights.h"

#include <torch/torch.h>

#include <cmath>

#include "core/common/status_macros.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

// A trainable [rows, cols] leaf that shares the first rows*cols elements of
// `flat`.
torch::Tensor LeafView(const torch::Tensor& flat, int64_t rows, int64_t cols) {
  torch::Tensor leaf = flat.narrow(0, 0, rows * cols).view({rows, cols});
  return leaf.detach().requires_grad_(true);
}

}  // namespace

LoraWeights::LoraWeights(const ModelConfig& model, torch::Device device)
    : model_(model),
      device_(device),
      module_index_(model.num_hidden_layers * kNumProjections, -1),
      storage_(model.num_hidden_layers * kNumProjections) {}

absl::StatusOr<int> LoraWeights::Bind(const LoraConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ValidateLoraConfig(config));
  Unbind();
  const auto fp32 =
      torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  const int64_t r = config.rank;
  int allocated = 0;
  for (int layer = 0; layer < model_.num_hidden_layers; ++layer) {
    for (Projection p : config.targets) {
      const auto [out, in] = ProjectionShape(model_, p);
      const int index = layer * kNumProjections + static_cast<int>(p);
      Storage& storage = storage_[index];
      if (!storage.a.defined() || storage.a.numel() < r * in) {
        storage.a = torch::empty({r * in}, fp32);
        storage.b = torch::empty({out * r}, fp32);
        ++allocated;
      }
      module_index_[index] = static_cast<int>(modules_.size());
      modules_.push_back(
          {layer, p, LeafView(storage.a, r, in), LeafView(storage.b, out, r)});
    }
  }
  config_ = config;
  scale_ = LoraScale(config);
  return allocated;
}

void LoraWeights::Unbind() {
  modules_.clear();
  std::fill(module_index_.begin(), module_index_.end(), -1);
  config_.reset();
  scale_ = 0.0;
}

void LoraWeights::InitPeft(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::Generator generator = MakeCpuGenerator(seed);
  for (LoraModule& m : modules_) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(m.a.size(1)));
    torch::Tensor a = torch::empty(m.a.sizes(), torch::kFloat32);
    a.uniform_(-bound, bound, generator);
    m.a.copy_(a);
    m.b.zero_();
  }
}

void LoraWeights::Zero() {
  torch::NoGradGuard no_grad;
  for (LoraModule& m : modules_) {
    for (torch::Tensor* t : {&m.a, &m.b}) {
      t->zero_();
      if (t->grad().defined()) t->mutable_grad().zero_();
    }
  }
}

const LoraModule* LoraWeights::Find(int layer, Projection projection) const {
  const int index =
      module_index_[layer * kNumProjections + static_cast<int>(projection)];
  return index < 0 ? nullptr : &modules_[index];
}

std::vector<torch::Tensor> LoraWeights::parameters() const {
  std::vector<torch::Tensor> params;
  params.reserve(2 * modules_.size());
  for (const LoraModule& m : modules_) {
    params.push_back(m.a);
    params.push_back(m.b);
  }
  return params;
}

}  // namespace loraplex
