#include "core/runtime/torch_compat.h"

#include <ATen/ATen.h>

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

}  // namespace loraplex
