#include "core/model/projection.h"

namespace loraplex {
namespace {

struct ProjectionRow {
  absl::string_view name;
  absl::string_view module;
};

constexpr ProjectionRow kProjectionRows[kNumProjections + 1] = {
    {"q_proj", "self_attn.q_proj"}, {"k_proj", "self_attn.k_proj"},
    {"v_proj", "self_attn.v_proj"}, {"o_proj", "self_attn.o_proj"},
    {"gate_proj", "mlp.gate_proj"}, {"up_proj", "mlp.up_proj"},
    {"down_proj", "mlp.down_proj"}, {"lm_head", "lm_head"},
};

}  // namespace

absl::string_view ProjectionName(Projection projection) {
  return kProjectionRows[static_cast<int>(projection)].name;
}

absl::string_view ProjectionModule(Projection projection) {
  return kProjectionRows[static_cast<int>(projection)].module;
}

}  // namespace loraplex
