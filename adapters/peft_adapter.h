// LoRA adapters in the Hugging Face PEFT format (docs/DESIGN.md §7), which
// vLLM, SGLang and PEFT load: a directory with `adapter_config.json` and
// `adapter_model.safetensors` holding, for each adapted module,
// `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in]
// and `...lora_B.weight` [out, r] (`base_model.model.lm_head.lora_A.weight`
// for the LM head; vLLM does not load adapters that have one).
//
//   LORAPLEX_RETURN_IF_ERROR(ExportPeftAdapter(weights, "my-base", dir));
//   LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter,
//                             LoadPeftAdapter(dir, model.config()));
//   LORAPLEX_RETURN_IF_ERROR(weights.Bind(adapter.config).status());
//   LORAPLEX_RETURN_IF_ERROR(CopyPeftAdapter(adapter, weights));
#ifndef LORAPLEX_ADAPTERS_PEFT_ADAPTER_H_
#define LORAPLEX_ADAPTERS_PEFT_ADAPTER_H_

#include <torch/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/peft_files.h"
#include "core/lora/lora_config.h"
#include "core/lora/lora_weights.h"
#include "core/model/model_config.h"

namespace loraplex {

struct PeftModuleTensors {
  int layer = 0;
  Projection projection = Projection::kQ;
  torch::Tensor a;  // [r, in], fp32 (fp64 if stored so) on the CPU.
  torch::Tensor b;  // [out, r], as a.
};

// An adapter read from disk and checked against a base model.
struct PeftAdapter {
  LoraConfig config;
  std::string base_model_name_or_path;
  std::vector<PeftModuleTensors> modules;  // LoraWeights::modules() order.
};

// The safetensors key of a module's A (`lora_a` true) or B matrix; `layer`
// is kLmHeadLayer for the LM head.
std::string PeftTensorName(int layer, Projection projection, bool lora_a);
// The same for a base model of `model`'s family: under the text model's
// module path for a multimodal wrapper (model_family.h), as PEFT names it
// in transformers 5 ("base_model.model.model.language_model.layers...").
// The experts' stacked parameters are named as PEFT nests their wrappers:
// "...mlp.experts.lora_A.weight", and for gate_up_proj
// "...mlp.experts.base_layer.lora_A.weight" when the adapter also adapts
// down_proj (`both_experts`).
std::string PeftTensorName(const ModelConfig& model, int layer,
                           Projection projection, bool lora_a,
                           bool both_experts = false);

// The files of `weights` as a PEFT adapter, in memory, to be written
// later (by another thread): the weights, then the config.
struct PeftAdapterFiles {
  std::string weights;  // adapter_model.safetensors
  std::string config;   // adapter_config.json
};
// How an adapter of a mixture-of-experts base writes its experts' LoRA.
enum class PeftExpertLayout {
  // As PEFT on transformers 5 writes and loads it: target_parameters
  // mlp.experts.gate_up_proj / down_proj, one stacked A and B each
  // (vLLM loads this layout for gpt-oss, and for other models only with
  // --enable-mixed-moe-lora-format).
  kStacked,
  // One LoRA per expert's gate_proj, up_proj and down_proj
  // (mlp.experts.{e}.gate_proj.lora_A.weight [r, hidden], ...), as PEFT
  // on transformers 4.x wrote it and vLLM loads it for Qwen3-MoE: gate_proj
  // and up_proj each get a copy of the expert's A and their half of its
  // B, which is the same update exactly. Only for experts whose gate_up
  // output is gate then up (Qwen3-MoE), not interleaved (gpt-oss).
  kPerExpert,
};

absl::StatusOr<PeftAdapterFiles> EncodePeftAdapter(
    const LoraWeights& weights, const std::string& base_model_name_or_path,
    PeftExpertLayout layout = PeftExpertLayout::kStacked);

// Writes `weights` into `dir` (created if missing; files replaced
// atomically, config last).
absl::Status ExportPeftAdapter(
    const LoraWeights& weights, const std::string& base_model_name_or_path,
    const std::string& dir,
    PeftExpertLayout layout = PeftExpertLayout::kStacked);

// Reads and validates an adapter directory against `model`. Errors are
// INVALID_ARGUMENT naming the file and the problem: unsupported settings
// (DoRA, bias, rank/alpha patterns, modules_to_save, fan_in_fan_out, target
// modules other than the seven projections and lm_head), missing or
// unexpected tensors, shapes that do not match the base model.
absl::StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir,
                                            const ModelConfig& model);

// Copies the adapter's tensors into `weights`, which must be bound to
// adapter.config.
absl::Status CopyPeftAdapter(const PeftAdapter& adapter, LoraWeights& weights);

}  // namespace loraplex

#endif  // LORAPLEX_ADAPTERS_PEFT_ADAPTER_H_
