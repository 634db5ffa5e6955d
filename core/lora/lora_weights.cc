#include "core/lora/lora_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/runtime/float_dtype.h"
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

LoraWeights::LoraWeights(const ModelConfig& model, torch::Device device,
                         torch::ScalarType dtype)
    : model_(model),
      device_(device),
      dtype_(Fp32OrFp64(dtype)),
      module_index_(model.num_hidden_layers * kNumProjectionIds + 1, -1),
      storage_(model.num_hidden_layers * kNumProjectionIds + 1) {}

absl::StatusOr<int> LoraWeights::Bind(const LoraConfig& requested) {
  LORAPLEX_RETURN_IF_ERROR(ValidateLoraConfig(requested));
  LoraConfig config = requested;
  LORAPLEX_ASSIGN_OR_RETURN(
      config.targets,
      FitLoraTargets(model_, requested.targets, requested.dropout));
  const auto options = torch::TensorOptions().dtype(dtype_).device(device_);
  // Built aside and committed at the end, so a failed allocation leaves
  // the previous binding intact.
  std::vector<Storage> storage = storage_;
  std::vector<LoraModule> modules;
  std::vector<int> module_index(module_index_.size(), -1);
  int allocated = 0;
  auto add_module = [&](int layer, Projection p, int index) {
    const auto [out, in] = ProjectionShape(model_, p);
    // The experts' A and B nest one [r, in] and [out, r] per expert.
    const int64_t experts = IsExpertProjection(p) ? model_.moe.num_experts : 1;
    const int64_t r = config.rank * experts;
    Storage& block = storage[index];
    if (!block.a.defined() || block.a.numel() < r * in) {
      block.a = torch::empty({r * in}, options);
      block.b = torch::empty({out * r}, options);
      ++allocated;
    }
    module_index[index] = static_cast<int>(modules.size());
    modules.push_back({layer, p, LeafView(block.a, r, in),
                       LeafView(block.b, out, r), experts});
  };
  try {
    for (int layer = 0; layer < model_.num_hidden_layers; ++layer) {
      const std::vector<Projection> present = LayerProjections(model_, layer);
      for (Projection p : config.targets) {
        if (std::find(present.begin(), present.end(), p) == present.end()) {
          continue;  // The LM head, or another kind of layer's MLP.
        }
        add_module(layer, p, layer * kNumProjectionIds + static_cast<int>(p));
      }
    }
    if (config.TargetsLmHead()) {
      add_module(kLmHeadLayer, Projection::kLmHead, LmHeadIndex());
    }
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate LoRA weights of rank ", config.rank,
                     " on ", device_.str(), ": ", e.what_without_backtrace()));
  }
  storage_ = std::move(storage);
  modules_ = std::move(modules);
  module_index_ = std::move(module_index);
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
    // Drawn in fp32 whatever the dtype, so an fp64 slot starts from the
    // same values as an fp32 one.
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
  if (layer < 0 || layer >= model_.num_hidden_layers ||
      projection == Projection::kLmHead) {
    return nullptr;
  }
  const int index =
      module_index_[layer * kNumProjectionIds + static_cast<int>(projection)];
  return index < 0 ? nullptr : &modules_[index];
}

const LoraModule* LoraWeights::lm_head() const {
  const int index = module_index_[LmHeadIndex()];
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

std::vector<ParamLayout> LoraWeights::parameter_layouts() const {
  std::vector<ParamLayout> layouts;
  layouts.reserve(2 * modules_.size());
  for (const LoraModule& m : modules_) {
    if (m.experts > 1) {
      layouts.push_back({ExpertStacking::kRows, m.experts});
      layouts.push_back({ExpertStacking::kColumns, m.experts});
    } else {
      layouts.push_back({});
      layouts.push_back({});
    }
  }
  return layouts;
}

}  // namespace loraplex
