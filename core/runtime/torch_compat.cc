#include "core/runtime/torch_compat.h"

#include <ATen/ATen.h>

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

}  // namespace loraplex
