#include "adapters/peft_adapter.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// Settings PEFT supports that an adapter here cannot express: each must be
// absent or hold its neutral value.
absl::Status CheckNeutral(const nlohmann::json& config, const char* key,
                          const std::string& label) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null() || *it == false ||
      ((it->is_object() || it->is_array()) && it->empty())) {
    return absl::OkStatus();
  }
  if (std::string(key) == "bias" && *it == "none") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": ", key, " = ", DescribeJson(*it),
                   " is not supported (only plain LoRA adapters are)"));
}

// PEFT's matching rule for target_modules and exclude_modules entries: a
// module is named when its full name equals the entry or ends with "." +
// the entry ("q_proj", "self_attn.q_proj", "model.layers.0.self_attn.q_proj").
bool PeftEntryNames(absl::string_view module, absl::string_view entry) {
  return module == entry ||
         (module.size() > entry.size() && absl::EndsWith(module, entry) &&
          module[module.size() - entry.size() - 1] == '.');
}

std::string PeftModuleName(int layer, Projection projection) {
  if (projection == Projection::kLmHead) return "lm_head";
  return absl::StrCat("model.layers.", layer, ".",
                      ProjectionModule(projection));
}

// The (layer, projection) modules a list of entries names; `key` is the
// field read. Each entry must name at least one of them.
absl::StatusOr<std::set<std::pair<Projection, int>>> NamedModules(
    const nlohmann::json& entries, const char* key, int num_layers,
    const std::string& label) {
  std::set<std::pair<Projection, int>> named;
  for (const nlohmann::json& entry : entries) {
    bool any = false;
    if (entry.is_string()) {
      const std::string& text = entry.get_ref<const std::string&>();
      for (Projection p : kAllProjections) {
        for (int layer = 0; layer < num_layers; ++layer) {
          if (PeftEntryNames(PeftModuleName(layer, p), text)) {
            named.insert({p, layer});
            any = true;
          }
        }
      }
      if (PeftEntryNames(PeftModuleName(kLmHeadLayer, Projection::kLmHead),
                         text)) {
        named.insert({Projection::kLmHead, kLmHeadLayer});
        any = true;
      }
    }
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", key, " names an unsupported module ",
          DescribeJson(entry),
          "; supported: ", EnumNameList(kAllProjections, &ProjectionName),
          " of layers 0-", num_layers - 1,
          ", by name, suffix (\"mlp.up_proj\") or full path "
          "(\"model.layers.0.mlp.up_proj\"), and lm_head"));
    }
  }
  return named;
}

// target_modules minus exclude_modules, as projections that cover every
// layer. An adapter on some layers only cannot be held by a slot, so it is
// refused rather than imported as something else.
absl::StatusOr<std::vector<Projection>> ParsePeftTargets(
    const nlohmann::json& json, int num_layers, const std::string& label) {
  auto targets = json.find("target_modules");
  if (targets != json.end() && *targets == "all-linear") {
    return std::vector<Projection>(kAllProjections.begin(),
                                   kAllProjections.end());
  }
  if (targets == json.end() || !targets->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": target_modules ",
        targets != json.end() && targets->is_string()
            ? "as a regular expression is not supported; list the modules"
            : "must be a list of module names"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      auto named, NamedModules(*targets, "target_modules", num_layers, label));
  if (auto exclude = json.find("exclude_modules");
      exclude != json.end() && !exclude->is_null()) {
    if (!exclude->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label,
                       ": exclude_modules must be a list of module names (a "
                       "regular expression is not supported)"));
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        auto excluded,
        NamedModules(*exclude, "exclude_modules", num_layers, label));
    for (const auto& module : excluded) named.erase(module);
  }
  std::vector<Projection> projections;
  for (Projection p : kAllProjections) {
    std::vector<int> layers;
    for (int layer = 0; layer < num_layers; ++layer) {
      if (named.count({p, layer}) > 0) layers.push_back(layer);
    }
    if (layers.empty()) continue;
    if (static_cast<int>(layers.size()) != num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": target_modules covers ", ProjectionName(p), " on ",
          layers.size(), " of the base model's ", num_layers, " layers (",
          absl::StrJoin(layers, ", "),
          "); adapters on some layers only are not supported: cover every "
          "layer"));
    }
    projections.push_back(p);
  }
  if (named.count({Projection::kLmHead, kLmHeadLayer}) > 0) {
    projections.push_back(Projection::kLmHead);
  }
  return projections;
}

absl::StatusOr<LoraConfig> ParsePeftConfig(const nlohmann::json& json,
                                           int num_layers,
                                           const std::string& label,
                                           std::string* base_model) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not an object"));
  }
  // PEFT writes many more keys; only these are read (no RejectUnknown).
  JsonFields fields(json, label + ": ");
  auto peft_type = json.find("peft_type");
  if (peft_type == json.end() || *peft_type != "LORA") {
    return fields.Invalid(
        "peft_type",
        absl::StrCat("must be \"LORA\", got ", peft_type == json.end()
                                                   ? std::string("nothing")
                                                   : DescribeJson(*peft_type)));
  }
  auto task = json.find("task_type");
  if (task != json.end() && !task->is_null() && *task != "CAUSAL_LM") {
    return fields.Invalid(
        "task_type",
        absl::StrCat("must be \"CAUSAL_LM\", got ", DescribeJson(*task)));
  }
  for (const char* key :
       {"bias", "use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
        "modules_to_save", "layers_to_transform", "layers_pattern", "lora_bias",
        "trainable_token_indices", "layer_replication",
        "alora_invocation_tokens", "target_parameters"}) {
    LORAPLEX_RETURN_IF_ERROR(CheckNeutral(json, key, label));
  }
  // Initialisations that rewrite the base weights (PiSSA, OLoRA, CorDA,
  // LoftQ) give adapters that only fit the rewritten base.
  if (auto init = json.find("init_lora_weights");
      init != json.end() && !init->is_boolean() && *init != "gaussian" &&
      *init != "eva") {
    return fields.Invalid(
        "init_lora_weights",
        absl::StrCat("= ", DescribeJson(*init),
                     " is not supported (it changes the base "
                     "weights the adapter was trained against)"));
  }
  LoraConfig config;
  config.rank = 0;  // Required: an absent "r" fails the range check below.
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("r", &config.rank));
  if (config.rank < 1 || config.rank > kMaxLoraRank) {
    const nlohmann::json* r = fields.Raw("r");
    return fields.Invalid(
        "r",
        absl::StrCat("must be an integer in [1, ", kMaxLoraRank, "], got ",
                     r == nullptr ? std::string("nothing") : DescribeJson(*r)));
  }
  config.alpha = 8.0;  // PEFT's default.
  LORAPLEX_RETURN_IF_ERROR(fields.Number("lora_alpha", &config.alpha));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("lora_dropout", &config.dropout));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("use_rslora", &config.use_rslora));
  LORAPLEX_ASSIGN_OR_RETURN(config.targets,
                            ParsePeftTargets(json, num_layers, label));
  if (absl::Status s = ValidateLoraConfig(config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", s.message()));
  }
  if (auto base = json.find("base_model_name_or_path");
      base != json.end() && base->is_string()) {
    *base_model = base->get<std::string>();
  }
  return config;
}

}  // namespace

std::string PeftTensorName(int layer, Projection projection, bool lora_a) {
  return absl::StrCat("base_model.model.", PeftModuleName(layer, projection),
                      lora_a ? ".lora_A.weight" : ".lora_B.weight");
}

absl::StatusOr<PeftAdapterFiles> EncodePeftAdapter(
    const LoraWeights& weights, const std::string& base_model_name_or_path) {
  if (!weights.bound()) {
    return absl::FailedPreconditionError("no adapter to export");
  }
  std::vector<NamedTensor> tensors;
  for (const LoraModule& m : weights.modules()) {
    tensors.push_back({PeftTensorName(m.layer, m.projection, true),
                       m.a.detach().to(torch::kCPU).contiguous()});
    tensors.push_back({PeftTensorName(m.layer, m.projection, false),
                       m.b.detach().to(torch::kCPU).contiguous()});
  }
  PeftAdapterFiles files;
  LORAPLEX_ASSIGN_OR_RETURN(files.weights,
                            EncodeSafetensors(tensors, {{"format", "pt"}}));

  const LoraConfig& lora = weights.config();
  nlohmann::json targets = nlohmann::json::array();
  for (Projection p : lora.targets) {
    targets.push_back(std::string(ProjectionName(p)));
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
                               const std::string& dir) {
  LORAPLEX_ASSIGN_OR_RETURN(
      PeftAdapterFiles files,
      EncodePeftAdapter(weights, base_model_name_or_path));
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
  LORAPLEX_ASSIGN_OR_RETURN(
      adapter.config,
      ParsePeftConfig(json, model.num_hidden_layers, config_path,
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
  auto load_module = [&](int layer, Projection p) -> absl::Status {
    const auto [out, in] = ProjectionShape(model, p);
    PeftModuleTensors module{layer, p, {}, {}};
    for (bool lora_a : {true, false}) {
      const std::string name = PeftTensorName(layer, p, lora_a);
      expected.insert(name);
      const std::vector<int64_t> shape =
          lora_a ? std::vector<int64_t>{r, in} : std::vector<int64_t>{out, r};
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
    for (Projection p : adapter.config.targets) {
      if (p != Projection::kLmHead) {
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
    const std::string base_copy = "base_model.model.lm_head.base_layer.weight";
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
    if (expected.count(info.name) == 0) {
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
