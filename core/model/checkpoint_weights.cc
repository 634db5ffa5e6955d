#include "core/model/checkpoint_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/model/model_family.h"
#include "core/model/mxfp4.h"

namespace loraplex {
namespace {

std::string LayerPrefix(int64_t layer) {
  return absl::StrCat("model.layers.", layer, ".");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Tensors some exporters write that carry no weights of ours: RoPE
// tables, a tied LM head's copy, a multimodal model's other towers.
bool IsIgnorable(const std::string& name, const ModelConfig& config,
                 const std::string& lm_head_name) {
  if (absl::EndsWith(name, "rotary_emb.inv_freq")) return true;
  if (const WrappedTextModel* wrapped = WrappedTextModelOf(config)) {
    for (absl::string_view prefix : wrapped->other_prefixes) {
      if (absl::StartsWith(name, prefix)) return true;
    }
  }
  return config.tie_word_embeddings && name == lm_head_name;
}

// How the checkpoint names a text-model tensor: as is, or under the
// layout of a multimodal wrapper whose embeddings the checkpoint holds
// (the first layout when none matches, for the error messages).
std::function<std::string(const std::string&)> CheckpointNames(
    const ModelConfig& config, const SafetensorsCheckpoint& checkpoint) {
  const WrappedTextModel* wrapped = WrappedTextModelOf(config);
  if (wrapped == nullptr) {
    return [](const std::string& name) { return name; };
  }
  WrappedTextModel::Layout layout = wrapped->layouts.front();
  for (const WrappedTextModel::Layout& candidate : wrapped->layouts) {
    if (checkpoint.Find(WrappedName(candidate, "model.embed_tokens.weight"))) {
      layout = candidate;
      break;
    }
  }
  return
      [layout](const std::string& name) { return WrappedName(layout, name); };
}

}  // namespace

// The experts' stacked weight `spec` ([experts, out, in]) of layer `layer`
// as `checkpoint` stores it: under its own name (transposed when the family
// stores [in, out]), in MXFP4 (`<name>_blocks` [experts, out, in / 32, 16]
// and `<name>_scales` [experts, out, in / 32], released gpt-oss
// checkpoints: dequantized into `dtype` as transformers does, which gives
// the [in, out] layout), or as one linear layer per expert.
CheckpointWeights::StoredTensor CheckpointWeights::StoredExperts(
    const ModelConfig& config, const SafetensorsCheckpoint& checkpoint,
    int64_t layer, Projection projection, const TensorSpec& spec,
    torch::ScalarType dtype) {
  const int64_t experts = spec.shape[0];
  const int64_t out = spec.shape[1];
  const int64_t in = spec.shape[2];
  if (config.moe.experts_transposed &&
      checkpoint.Find(spec.name + "_blocks") != nullptr) {
    const int64_t groups = in / (2 * kMxfp4BlockBytes);
    if (in % (2 * kMxfp4BlockBytes) != 0) {
      StoredTensor stored{{}, nullptr};
      stored.problem = absl::StrCat(
          spec.name, "_blocks is MXFP4, whose blocks hold 32 values, but the ",
          "config makes its rows ", in, " wide, not a multiple of 32");
      return stored;
    }
    StoredTensor stored{
        {{spec.name + "_blocks", {experts, out, groups, kMxfp4BlockBytes}},
         {spec.name + "_scales", {experts, out, groups}}},
        [dtype](std::vector<torch::Tensor> parts) {
          return DequantizeMxfp4(parts[0], parts[1], dtype).transpose(1, 2);
        }};
    stored.mxfp4 = true;
    return stored;
  }
  if (checkpoint.Find(spec.name) != nullptr || config.moe.experts_transposed) {
    if (!config.moe.experts_transposed) return {{spec}, nullptr};
    return {{{spec.name, {experts, in, out}}},
            [](std::vector<torch::Tensor> parts) {
              return parts[0].transpose(1, 2);
            }};
  }
  const std::string prefix = absl::StrCat(LayerPrefix(layer), "mlp.experts.");
  const bool gate_up = projection == Projection::kExpertGateUp;
  if (checkpoint.Find(absl::StrCat(
          prefix, "0.", gate_up ? "gate_proj" : "down_proj", ".weight")) ==
      nullptr) {
    return {{spec}, nullptr};  // Reported missing under its own name.
  }
  StoredTensor stored;
  for (int64_t e = 0; e < experts; ++e) {
    if (gate_up) {
      for (const char* half : {"gate_proj", "up_proj"}) {
        stored.parts.push_back(
            {absl::StrCat(prefix, e, ".", half, ".weight"), {out / 2, in}});
      }
    } else {
      stored.parts.push_back(
          {absl::StrCat(prefix, e, ".down_proj.weight"), {out, in}});
    }
  }
  stored.assemble = [gate_up](std::vector<torch::Tensor> parts) {
    if (!gate_up) return torch::stack(parts);
    std::vector<torch::Tensor> experts;
    for (size_t i = 0; i < parts.size(); i += 2) {
      experts.push_back(torch::cat({parts[i], parts[i + 1]}));
    }
    return torch::stack(experts);
  };
  return stored;
}

absl::StatusOr<CheckpointWeights> CheckpointWeights::Open(
    const std::string& dir, const ModelConfig& config,
    torch::ScalarType dtype) {
  LORAPLEX_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint,
                            SafetensorsCheckpoint::OpenDirectory(dir));
  const auto stored_name = CheckpointNames(config, checkpoint);
  std::map<std::string, StoredTensor> stored;
  std::vector<std::string> order;  // ModelTensorSpecs' order, for messages.
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    stored[spec.name] = {{{stored_name(spec.name), spec.shape}}, nullptr};
    order.push_back(spec.name);
  }
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!LayerIsSparse(config, layer)) continue;
    for (Projection p : {Projection::kExpertGateUp, Projection::kExpertDown}) {
      StoredTensor& tensor = stored[ProjectionWeightName(layer, p)];
      tensor =
          StoredExperts(config, checkpoint, layer, p, tensor.parts[0], dtype);
    }
  }
  std::vector<std::string> missing, misshapen, unexpected, bad_dtype;
  std::set<std::string> expected;
  std::vector<std::string> unreadable;
  for (const std::string& name : order) {
    if (!stored[name].problem.empty()) {
      unreadable.push_back(stored[name].problem);
      expected.insert(name + "_blocks");
      expected.insert(name + "_scales");
    }
    const bool mxfp4 = stored[name].mxfp4;
    for (const TensorSpec& spec : stored[name].parts) {
      expected.insert(spec.name);
      const SafetensorsTensorInfo* info = checkpoint.Find(spec.name);
      if (info == nullptr) {
        missing.push_back(spec.name);
      } else if (info->shape != spec.shape) {
        misshapen.push_back(absl::StrCat(spec.name, " is ",
                                         ShapeText(info->shape), ", expected ",
                                         ShapeText(spec.shape)));
      } else if (mxfp4 ? ToScalarType(info->dtype) != torch::kUInt8
                       : !torch::isFloatingType(ToScalarType(info->dtype))) {
        bad_dtype.push_back(absl::StrCat(
            spec.name, " is ", SafetensorsDtypeName(info->dtype),
            mxfp4 ? ", MXFP4 needs U8" : ", expected floating point"));
      }
    }
  }
  for (const std::string& name : checkpoint.names()) {
    if (!expected.count(name) &&
        !IsIgnorable(name, config, stored_name("lm_head.weight"))) {
      unexpected.push_back(name);
    }
  }
  std::vector<std::string> problems = unreadable;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(
        missing.size(), " missing tensor(s): ", absl::StrJoin(missing, ", ")));
  }
  if (!misshapen.empty()) {
    problems.push_back(absl::StrCat(
        misshapen.size(),
        " tensor(s) with the wrong shape: ", absl::StrJoin(misshapen, ", ")));
  }
  if (!bad_dtype.empty()) {
    problems.push_back(absl::StrCat(
        bad_dtype.size(),
        " tensor(s) of the wrong dtype: ", absl::StrJoin(bad_dtype, ", ")));
  }
  if (!unexpected.empty()) {
    problems.push_back(absl::StrCat(
        unexpected.size(),
        " unexpected tensor(s): ", absl::StrJoin(unexpected, ", ")));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": checkpoint does not match config.json (",
                     config.model_type, ", ", config.num_hidden_layers,
                     " layers): ", absl::StrJoin(problems, "; ")));
  }
  CheckpointWeights weights(std::move(checkpoint), dtype);
  weights.stored_ = std::move(stored);
  return weights;
}

absl::StatusOr<torch::Tensor> CheckpointWeights::Load(
    const std::string& name, torch::Device device) const {
  const StoredTensor& tensor = stored_.at(name);
  std::vector<torch::Tensor> parts;
  for (const TensorSpec& part : tensor.parts) {
    LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor loaded,
                              checkpoint_.Load(part.name));
    parts.push_back(tensor.mxfp4 ? loaded.to(device)
                                 : loaded.to(device, dtype_));
  }
  torch::Tensor whole =
      tensor.assemble ? tensor.assemble(std::move(parts)) : std::move(parts[0]);
  return whole.set_requires_grad(false);
}

bool CheckpointWeights::RangeReadable(const std::string& name) const {
  return !stored_.at(name).mxfp4;
}

torch::Tensor CheckpointWeights::Meta(const std::string& name) const {
  const StoredTensor& tensor = stored_.at(name);
  std::vector<torch::Tensor> parts;
  for (const TensorSpec& part : tensor.parts) {
    parts.push_back(torch::empty(
        part.shape, torch::TensorOptions().dtype(dtype_).device(torch::kMeta)));
  }
  return tensor.assemble ? tensor.assemble(std::move(parts))
                         : std::move(parts[0]);
}

absl::StatusOr<torch::Tensor> CheckpointWeights::LoadRange(
    const std::string& name, int64_t begin, int64_t count,
    torch::Device device) const {
  torch::Tensor out = torch::empty(
      {count}, torch::TensorOptions().dtype(dtype_).device(device));
  // The parts' elements follow one another in the tensor's memory order:
  // each is read where it overlaps [begin, begin + count).
  int64_t first = 0;
  for (const TensorSpec& part : stored_.at(name).parts) {
    int64_t numel = 1;
    for (int64_t d : part.shape) numel *= d;
    const int64_t lo = std::max(begin, first);
    const int64_t hi = std::min(begin + count, first + numel);
    if (lo < hi) {
      LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor stored,
                                checkpoint_.Load(part.name));
      // A view of the mapping: only the pages of this range are read.
      out.narrow(0, lo - begin, hi - lo)
          .copy_(stored.reshape({-1}).narrow(0, lo - first, hi - lo));
    }
    first += numel;
  }
  return out;
}

}  // namespace loraplex
