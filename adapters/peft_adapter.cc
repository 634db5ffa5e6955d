#include "adapters/peft_adapter.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adapters/peft_config.h"
#include "core/common/atomic_file.h"
#include "core/common/enum_names.h"
#include "core/common/json_fields.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/runtime/float_dtype.h"
#include "core/safetensors/safetensors.h"

namespace loraplex {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A module's PEFT name: as a text model names it, or under `layout` of a
// multimodal wrapper.
std::string ModuleName(const WrappedTextModel::Layout* layout, int layer,
                       Projection projection) {
  const std::string name = PeftModuleName(layer, projection);
  return layout == nullptr ? name : WrappedName(*layout, name);
}

// PEFT wraps each targeted parameter of a module in turn, in the module's
// parameter order, so with both of the experts' parameters targeted
// gate_up_proj's wrapper is inside down_proj's: its tensors are named
// mlp.experts.base_layer.lora_A..., down_proj's mlp.experts.lora_A...
std::string TensorName(const WrappedTextModel::Layout* layout, int layer,
                       Projection projection, bool lora_a,
                       bool both_experts = false) {
  std::string module = ModuleName(layout, layer, projection);
  if (IsExpertProjection(projection)) {
    module = module.substr(0, module.rfind('.'));  // The experts' module.
    if (projection == Projection::kExpertGateUp && both_experts) {
      module += ".base_layer";
    }
  }
  return absl::StrCat("base_model.model.", module,
                      lora_a ? ".lora_A.weight" : ".lora_B.weight");
}

bool TargetsBothExperts(const LoraConfig& config) {
  return config.Targets(Projection::kExpertGateUp) &&
         config.Targets(Projection::kExpertDown);
}

// The layout an adapter's tensors use: the one naming its first module
// (the first layout when none does, for the error messages).
const WrappedTextModel::Layout* AdapterLayout(const WrappedTextModel* wrapped,
                                              const SafetensorsFile& file,
                                              int layer, Projection first) {
  if (wrapped == nullptr) return nullptr;
  for (const WrappedTextModel::Layout& layout : wrapped->layouts) {
    if (file.Find(TensorName(&layout, layer, first, true)) != nullptr) {
      return &layout;
    }
  }
  return &wrapped->layouts.front();
}

// Why a tensor of the adapter is refused when it adapts another tower of a
// multimodal model, or "" when it does not.
std::string OtherTowerProblem(const WrappedTextModel* wrapped,
                              const ModelConfig& model,
                              const std::string& name) {
  if (wrapped == nullptr) return "";
  for (absl::string_view prefix : wrapped->other_prefixes) {
    if (absl::StartsWith(name, absl::StrCat("base_model.model.", prefix))) {
      return absl::StrCat(
          "tensor ", name,
          " adapts a vision tower or projector module: only "
          "the text model of model_type ",
          model.model_type,
          " is trained here (target the text model's modules only)");
    }
  }
  return "";
}

}  // namespace

std::string PeftTensorName(int layer, Projection projection, bool lora_a) {
  return TensorName(nullptr, layer, projection, lora_a);
}

std::string PeftTensorName(const ModelConfig& model, int layer,
                           Projection projection, bool lora_a,
                           bool both_experts) {
  const WrappedTextModel* wrapped = WrappedTextModelOf(model);
  return TensorName(wrapped == nullptr ? nullptr : &wrapped->layouts.front(),
                    layer, projection, lora_a, both_experts);
}

namespace {

// Expert e's (A, B) of module `m` as one linear layer per expert's
// projection: gate_proj and up_proj share A and split B's rows (gate then
// up), down_proj is the expert's own.
void AppendPerExpertTensors(const LoraModule& m,
                            std::vector<NamedTensor>& tensors) {
  const torch::Tensor a = m.ExpertA().detach().to(torch::kCPU);
  const torch::Tensor b = m.ExpertB().detach().to(torch::kCPU);
  const int64_t out = b.size(1);
  for (int64_t e = 0; e < m.experts; ++e) {
    const std::string prefix = absl::StrCat("base_model.model.model.layers.",
                                            m.layer, ".mlp.experts.", e, ".");
    auto add = [&](const char* projection, const torch::Tensor& b_part) {
      tensors.push_back({absl::StrCat(prefix, projection, ".lora_A.weight"),
                         a[e].contiguous()});
      tensors.push_back({absl::StrCat(prefix, projection, ".lora_B.weight"),
                         b_part.contiguous()});
    };
    if (m.projection == Projection::kExpertDown) {
      add("down_proj", b[e]);
    } else {
      add("gate_proj", b[e].narrow(0, 0, out / 2));
      add("up_proj", b[e].narrow(0, out / 2, out / 2));
    }
  }
}

}  // namespace

absl::StatusOr<PeftAdapterFiles> EncodePeftAdapter(
    const LoraWeights& weights, const std::string& base_model_name_or_path,
    PeftExpertLayout layout) {
  if (!weights.bound()) {
    return absl::FailedPreconditionError("no adapter to export");
  }
  const ModelConfig& model = weights.model_config();
  const bool per_expert = layout == PeftExpertLayout::kPerExpert;
  if (per_expert && (!HasSparseLayers(model) ||
                     model.moe.activation != ExpertActivation::kSiluHalves ||
                     WrappedTextModelOf(model) != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the per-expert adapter layout is for mixture-of-experts bases whose "
        "experts' gate_up output is gate then up (qwen3_moe); model_type ",
        model.model_type, " exports its experts stacked only"));
  }
  const bool both_experts = TargetsBothExperts(weights.config());
  std::vector<NamedTensor> tensors;
  for (const LoraModule& m : weights.modules()) {
    if (per_expert && IsExpertProjection(m.projection)) {
      AppendPerExpertTensors(m, tensors);
      continue;
    }
    tensors.push_back(
        {PeftTensorName(model, m.layer, m.projection, true, both_experts),
         m.a.detach().to(torch::kCPU).contiguous()});
    tensors.push_back(
        {PeftTensorName(model, m.layer, m.projection, false, both_experts),
         m.b.detach().to(torch::kCPU).contiguous()});
  }
  PeftAdapterFiles files;
  LORAPLEX_ASSIGN_OR_RETURN(files.weights,
                            EncodeSafetensors(tensors, {{"format", "pt"}}));

  const LoraConfig& lora = weights.config();
  nlohmann::json targets = nlohmann::json::array();
  nlohmann::json parameters = nlohmann::json::array();
  const WrappedTextModel* wrapped = WrappedTextModelOf(model);
  for (Projection p : lora.targets) {
    if (IsExpertProjection(p) && per_expert) {
      for (const char* name :
           p == Projection::kExpertDown
               ? std::vector<const char*>{"down_proj"}
               : std::vector<const char*>{"gate_proj", "up_proj"}) {
        if (std::find(targets.begin(), targets.end(), name) == targets.end()) {
          targets.push_back(name);
        }
      }
      continue;
    }
    if (IsExpertProjection(p)) {
      parameters.push_back(std::string(ProjectionModule(p)));
      continue;
    }
    if (wrapped == nullptr || p == Projection::kLmHead) {
      targets.push_back(std::string(ProjectionName(p)));
      continue;
    }
    // The other towers have modules of the same names (SigLIP's q_proj):
    // the text model's are named by their paths, so that PEFT adapts
    // nothing else.
    for (int layer = 0; layer < model.num_hidden_layers; ++layer) {
      targets.push_back(ModuleName(&wrapped->layouts.front(), layer, p));
    }
  }
  nlohmann::json alpha = lora.alpha;
  if (lora.alpha == std::floor(lora.alpha) && std::abs(lora.alpha) < 1e15) {
    alpha = static_cast<int64_t>(lora.alpha);  // As PEFT writes it.
  }
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model_name_or_path},
      {"r", lora.rank},
      {"lora_alpha", alpha},
      {"lora_dropout", lora.dropout},
      {"target_modules", targets},
      // PEFT writes null when no parameter is targeted.
      {"target_parameters",
       parameters.empty() ? nlohmann::json(nullptr) : parameters},
      {"bias", "none"},
      {"use_rslora", lora.use_rslora},
      {"use_dora", false},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"revision", nullptr},
  };
  files.config = config.dump(2) + "\n";
  return files;
}

absl::Status ExportPeftAdapter(const LoraWeights& weights,
                               const std::string& base_model_name_or_path,
                               const std::string& dir,
                               PeftExpertLayout layout) {
  LORAPLEX_ASSIGN_OR_RETURN(
      PeftAdapterFiles files,
      EncodePeftAdapter(weights, base_model_name_or_path, layout));
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(dir, "/", kPeftWeightsFile), files.weights));
  return WriteFileAtomically(absl::StrCat(dir, "/", kPeftConfigFile),
                             files.config);
}

absl::StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir,
                                            const ModelConfig& model) {
  const std::string config_path = absl::StrCat(dir, "/", kPeftConfigFile);
  const std::string weights_path = absl::StrCat(dir, "/", kPeftWeightsFile);
  PeftAdapter adapter;
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json json,
                            ReadUntrustedJsonFile(config_path));
  const WrappedTextModel* wrapped = WrappedTextModelOf(model);
  LORAPLEX_ASSIGN_OR_RETURN(adapter.config,
                            ParsePeftConfig(json, model, config_path,
                                            &adapter.base_model_name_or_path));
  if (!std::filesystem::exists(weights_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": no ", kPeftWeightsFile,
                     std::filesystem::exists(dir + "/adapter_model.bin")
                         ? " (adapter_model.bin is not supported; save with "
                           "safe_serialization)"
                         : ""));
  }
  LORAPLEX_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));

  std::vector<std::string> problems;
  std::set<std::string> expected;
  const int64_t r = adapter.config.rank;
  const Projection first = adapter.config.targets.empty()
                               ? Projection::kQ
                               : adapter.config.targets.front();
  const WrappedTextModel::Layout* layout = AdapterLayout(
      wrapped, *file, first == Projection::kLmHead ? kLmHeadLayer : 0, first);
  const bool both_experts = TargetsBothExperts(adapter.config);
  auto load_module = [&](int layer, Projection p) -> absl::Status {
    const auto [out, in] = ProjectionShape(model, p);
    // The experts' A and B nest one per expert (LoraModule).
    const int64_t rows =
        r * (IsExpertProjection(p) ? model.moe.num_experts : 1);
    PeftModuleTensors module{layer, p, {}, {}};
    for (bool lora_a : {true, false}) {
      const std::string name =
          TensorName(layout, layer, p, lora_a, both_experts);
      expected.insert(name);
      const std::vector<int64_t> shape = lora_a
                                             ? std::vector<int64_t>{rows, in}
                                             : std::vector<int64_t>{out, rows};
      const SafetensorsTensorInfo* info = file->Find(name);
      if (info == nullptr) {
        problems.push_back(absl::StrCat("missing tensor ", name));
        continue;
      }
      if (info->shape != shape) {
        problems.push_back(absl::StrCat(
            name, " has shape ", ShapeText(info->shape), ", expected ",
            ShapeText(shape), " for rank ", r, " on this base model"));
        continue;
      }
      LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor tensor, file->Load(name));
      if (!torch::isFloatingType(tensor.scalar_type())) {
        problems.push_back(
            absl::StrCat(name, " is not a floating-point tensor"));
        continue;
      }
      // Such an adapter would train nothing (every step skipped as
      // non-finite) and sample garbage.
      if (!torch::isfinite(tensor).all().item<bool>()) {
        problems.push_back(absl::StrCat(name, " holds NaN or infinite values"));
        continue;
      }
      // An fp64 slot's checkpoint keeps its fp64 weights: it resumes
      // exactly.
      (lora_a ? module.a : module.b) =
          tensor.to(Fp32OrFp64(tensor.scalar_type())).clone();
    }
    adapter.modules.push_back(std::move(module));
    return absl::OkStatus();
  };
  for (int layer = 0; layer < model.num_hidden_layers; ++layer) {
    const std::vector<Projection> present = LayerProjections(model, layer);
    for (Projection p : adapter.config.targets) {
      if (std::find(present.begin(), present.end(), p) != present.end()) {
        LORAPLEX_RETURN_IF_ERROR(load_module(layer, p));
      }
    }
  }
  if (adapter.config.TargetsLmHead()) {
    LORAPLEX_RETURN_IF_ERROR(load_module(kLmHeadLayer, Projection::kLmHead));
    // PEFT saves a copy of the LM head's base weight beside its LoRA
    // (save_embedding_layers="auto" does when lm_head is a target). The
    // base is frozen, so the copy is the base's own weight: checked for
    // shape and otherwise not read.
    const std::string base_copy =
        absl::StrCat("base_model.model.",
                     ModuleName(layout, kLmHeadLayer, Projection::kLmHead),
                     ".base_layer.weight");
    if (const SafetensorsTensorInfo* info = file->Find(base_copy)) {
      expected.insert(base_copy);
      const std::vector<int64_t> shape = {model.vocab_size, model.hidden_size};
      if (info->shape != shape) {
        problems.push_back(absl::StrCat(
            base_copy, " has shape ", ShapeText(info->shape), ", expected ",
            ShapeText(shape),
            " (an LM head of another vocabulary than this base model's)"));
      }
    }
  }
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    if (expected.count(info.name) > 0) continue;
    if (std::string other = OtherTowerProblem(wrapped, model, info.name);
        !other.empty()) {
      problems.push_back(std::move(other));
    } else {
      problems.push_back(absl::StrCat(
          "unexpected tensor ", info.name,
          " (a module, layer or setting this base model and config do not "
          "have)"));
    }
  }
  if (!problems.empty()) {
    const size_t shown = std::min<size_t>(problems.size(), 10);
    std::string message = absl::StrCat(
        weights_path, ": ", problems.size(), " problem(s):\n  ",
        absl::StrJoin(problems.begin(), problems.begin() + shown, "\n  "));
    if (shown < problems.size()) {
      absl::StrAppend(&message, "\n  ... and ", problems.size() - shown,
                      " more");
    }
    return absl::InvalidArgumentError(message);
  }
  return adapter;
}

absl::Status CopyPeftAdapter(const PeftAdapter& adapter, LoraWeights& weights) {
  if (!weights.bound() || weights.modules().size() != adapter.modules.size() ||
      weights.config().rank != adapter.config.rank) {
    return absl::FailedPreconditionError(
        "the weights are not bound to the adapter's config");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < adapter.modules.size(); ++i) {
    const LoraModule& m = weights.modules()[i];
    const PeftModuleTensors& source = adapter.modules[i];
    if (m.layer != source.layer || m.projection != source.projection ||
        m.a.sizes() != source.a.sizes() || m.b.sizes() != source.b.sizes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the weights are not bound to the adapter's config (at ",
          PeftTensorName(source.layer, source.projection, true), ")"));
    }
    torch::Tensor a = m.a;
    torch::Tensor b = m.b;
    a.copy_(source.a);
    b.copy_(source.b);
  }
  return absl::OkStatus();
}

}  // namespace loraplex
