#include "core/model/projection.h"

namespace loraplex {
namespace {

struct ProjectionRow {
  absl::string_view name;
  absl::string_view module;
};

constexpr ProjectionRow kProjectionRows[kNumProjectionIds] = {
    {"q_proj", "self_attn.q_proj"},     {"k_proj", "self_attn.k_proj"},
    {"v_proj", "self_attn.v_proj"},     {"o_proj", "self_attn.o_proj"},
    {"gate_proj", "mlp.gate_proj"},     {"up_proj", "mlp.up_proj"},
    {"down_proj", "mlp.down_proj"},     {"lm_head", "lm_head"},
    {"qkv_proj", "self_attn.qkv_proj"}, {"gate_up_proj", "mlp.gate_up_proj"},
    {"experts.gate_up_proj", "mlp.experts.gate_up_proj"},
    {"experts.down_proj", "mlp.experts.down_proj"},
};

int ProjectionOrder(Projection projection) {
  for (size_t i = 0; i < kLoraTargets.size(); ++i) {
    if (kLoraTargets[i] == projection) return static_cast<int>(i);
  }
  return static_cast<int>(kLoraTargets.size());
}

}  // namespace

absl::string_view ProjectionName(Projection projection) {
  return kProjectionRows[static_cast<int>(projection)].name;
}

bool ProjectionLess(Projection a, Projection b) {
  return ProjectionOrder(a) < ProjectionOrder(b);
}

absl::string_view ProjectionModule(Projection projection) {
  return kProjectionRows[static_cast<int>(projection)].module;
}

}  // namespace loraplex
