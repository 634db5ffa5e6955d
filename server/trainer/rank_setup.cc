#include "server/trainer/rank_setup.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/sha256.h"
#include "core/common/status_macros.h"
#include "core/model/checkpoint_weights.h"
#include "core/model/sharded_base.h"

namespace loraplex {
namespace {

constexpr int64_t kSamplesPerTensor = 1024;

void AddSample(const torch::Tensor& tensor, Sha256& digest) {
  const torch::Tensor flat = tensor.detach().flatten();
  const int64_t n = flat.numel();
  if (n == 0) return;
  const torch::Tensor index =
      torch::linspace(0, static_cast<double>(n - 1),
                      std::min(n, kSamplesPerTensor),
                      torch::TensorOptions().dtype(torch::kDouble))
          .to(torch::kLong)
          .to(flat.device());
  const torch::Tensor sample =
      flat.index_select(0, index).to(torch::kFloat).cpu().contiguous();
  digest.Update(absl::string_view(static_cast<const char*>(sample.data_ptr()),
                                  sample.numel() * sizeof(float)));
}

void AddLayer(const ModelConfig& config, const LayerWeights& layer,
              Sha256& digest) {
  for (const torch::Tensor* norm :
       {&layer.input_norm, &layer.post_attention_norm,
        &layer.pre_feedforward_norm, &layer.post_feedforward_norm,
        &layer.q_norm, &layer.k_norm}) {
    if (norm->defined()) AddSample(*norm, digest);
  }
  for (Projection p : LayerProjections(config)) {
    const LinearWeights& projection = layer.at(p);
    AddSample(projection.weight, digest);
    if (projection.bias.defined()) AddSample(projection.bias, digest);
  }
}

// How many elements of each tensor of a gathered layer are compared with
// the rank's own checkpoint.
constexpr int64_t kCheckedPerTensor = 64;

}  // namespace

std::string ModelFingerprint(const LlamaModel& model) {
  torch::NoGradGuard no_grad;
  Sha256 digest;
  digest.Update(ModelConfigToJson(model.config()));
  digest.Update(c10::toString(model.dtype()));  // The compute dtype.
  const ModelWeights& weights = model.weights();
  AddSample(weights.embed_tokens, digest);
  for (const LayerWeights& layer : weights.layers) {
    AddLayer(model.config(), layer, digest);
  }
  AddSample(weights.final_norm, digest);
  AddSample(weights.lm_head, digest);
  return digest.HexDigest();
}

absl::StatusOr<std::string> ShardedModelFingerprint(const LlamaModel& model,
                                                    const std::string& dir) {
  ShardedBase* base = model.sharded_base();
  if (base == nullptr) return ModelFingerprint(model);
  // A local failure is kept until every layer has been gathered: the other
  // ranks gather them all.
  absl::StatusOr<CheckpointWeights> checkpoint =
      CheckpointWeights::Open(dir, model.config(), model.dtype());
  absl::Status problem = checkpoint.status();
  torch::NoGradGuard no_grad;
  Sha256 digest;
  digest.Update(ModelConfigToJson(model.config()));
  digest.Update(c10::toString(model.dtype()));
  const ModelWeights& weights = model.weights();
  AddSample(weights.embed_tokens, digest);
  {
    ShardedBase::AllRanks all_ranks(*base);
    for (int64_t layer = 0; layer < base->num_layers(); ++layer) {
      const LayerWeights* gathered = nullptr;
      try {
        gathered = &base->Gather(layer);
      } catch (const std::exception& e) {  // On every rank.
        return absl::UnavailableError(
            absl::StrCat("gathering the sharded base failed: ", e.what()));
      }
      if (!problem.ok()) continue;
      try {
        AddLayer(model.config(), *gathered, digest);
        problem = base->CheckGathered(layer, *checkpoint, kCheckedPerTensor);
      } catch (const std::exception& e) {
        problem = absl::InternalError(e.what());
      }
    }
  }
  if (problem.code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the base's layers as the ranks hold them differ from this rank's "
        "--model (",
        problem.message(), "): start every rank with the same --model"));
  }
  if (!problem.ok()) {
    return absl::Status(
        problem.code(),
        absl::StrCat("cannot check the gathered layers against this rank's "
                     "--model ",
                     dir, ": ", problem.message()));
  }
  AddSample(weights.final_norm, digest);
  AddSample(weights.lm_head, digest);
  return digest.HexDigest();
}

absl::Status AgreeOnShardLayout(DistContext& dist, const LlamaModel& model) {
  const ShardedBase* base = model.sharded_base();
  if (base == nullptr) return absl::OkStatus();
  Sha256 digest;
  digest.Update(ModelConfigToJson(model.config()));
  digest.Update(c10::toString(model.dtype()));
  for (int64_t layer = 0; layer < base->num_layers(); ++layer) {
    digest.Update(absl::StrCat(base->shard(layer).numel(), ";"));
  }
  const std::string mine = digest.HexDigest();
  std::string root = mine;
  LORAPLEX_RETURN_IF_ERROR(dist.Broadcast(&root, 0));
  const bool differs = root != mine;
  LORAPLEX_ASSIGN_OR_RETURN(int differing, dist.CountRanks(differs));
  if (differs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", dist.rank(),
        " loaded another base model than rank 0 (its "
        "config, dtype or layers differ): start every rank with the same "
        "--model and --dtype"));
  }
  if (differing > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        differing, " rank(s) loaded another base model than rank 0 (see ",
        "their logs): start every rank with the same --model and --dtype"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> AgreeOnShardBase(DistContext& dist, bool shard_base) {
  int64_t value = shard_base ? 1 : 0;
  LORAPLEX_RETURN_IF_ERROR(dist.BroadcastValue(&value, 0));
  return value != 0;
}

absl::Status AgreeAllOk(DistContext& dist, const absl::Status& mine,
                        const std::string& what) {
  LORAPLEX_ASSIGN_OR_RETURN(int failed, dist.CountRanks(!mine.ok()));
  if (!mine.ok()) return mine;
  if (failed > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(failed, " rank(s) failed to ", what, " (see their logs)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RankSetup> AgreeOnSetup(DistContext& dist,
                                       const RankSetup& mine) {
  std::string bytes = nlohmann::json{
      {"model", mine.model},
      {"slots", mine.slots},
      {"max_rank", mine.max_rank},
      {"token_budget", mine.token_budget},
      {"checkpoints",
       mine.checkpoints}}.dump();
  LORAPLEX_RETURN_IF_ERROR(dist.Broadcast(&bytes, 0));
  RankSetup setup;
  try {
    const nlohmann::json json = nlohmann::json::parse(bytes);
    setup.model = json.at("model").get<std::string>();
    setup.slots = json.at("slots").get<int>();
    setup.max_rank = json.at("max_rank").get<int64_t>();
    setup.token_budget = json.at("token_budget").get<int64_t>();
    setup.checkpoints = json.at("checkpoints").get<bool>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank 0 sent an unreadable setup: ", e.what()));
  }
  const bool differs = setup.model != mine.model;
  LORAPLEX_ASSIGN_OR_RETURN(int differing, dist.CountRanks(differs));
  if (differs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", dist.rank(), " loaded another base model than rank 0 ",
        "(fingerprint ", mine.model.substr(0, 16), ", rank 0's ",
        setup.model.substr(0, 16),
        "): start every rank with the same --model"));
  }
  if (differing > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        differing, " rank(s) loaded another base model than rank 0 (see ",
        "their logs): start every rank with the same --model"));
  }
  return setup;
}

}  // namespace loraplex
