#include "server/trainer/session_state_files.h"

#include <torch/torch.h>

#include <filesystem>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "adapters/peft_files.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {
namespace {

constexpr char kOptimizerStateFile[] = "optimizer.pt";
constexpr char kGradientsFile[] = "gradients.pt";

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> SessionStateFiles(
    const TrainingSlot& slot, nlohmann::json meta, bool gradients) {
  LORAPLEX_ASSIGN_OR_RETURN(PeftAdapterFiles adapter,
                            EncodePeftAdapter(slot.weights, ""));
  std::map<std::string, std::string> files;
  files[kPeftWeightsFile] = std::move(adapter.weights);
  files[kPeftConfigFile] = std::move(adapter.config);
  torch::serialize::OutputArchive archive;
  slot.optimizer->Save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  files[kOptimizerStateFile] = bytes.str();
  if (!meta.is_object()) return absl::InternalError("bad session state meta");
  meta["steps"] = slot.counters.steps;
  files[kSessionStateFile] = meta.dump(2) + "\n";
  if (gradients) {
    torch::serialize::OutputArchive grads;
    int64_t count = 0;
    const std::vector<torch::Tensor> params = slot.weights.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      grads.write(absl::StrCat("grad.", i), params[i].grad());
      ++count;
    }
    if (count > 0) {
      std::ostringstream grad_bytes;
      grads.save_to(grad_bytes);
      files[kGradientsFile] = grad_bytes.str();
    }
  }
  return files;
}

absl::Status LoadSessionState(const std::string& dir, bool with_optimizer,
                              TrainingSlot& slot) {
  LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter,
                            LoadPeftAdapter(dir, slot.weights.model_config()));
  if (LoraConfigToJson(adapter.config) !=
      LoraConfigToJson(slot.weights.config())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state's LoRA config ", LoraConfigToJson(adapter.config).dump(),
        " is not the session's ",
        LoraConfigToJson(slot.weights.config()).dump()));
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::string meta_text,
                            ReadFile(dir + "/" + kSessionStateFile));
  const nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, false);
  if (!meta.is_object() || !meta.contains("steps") ||
      !meta["steps"].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kSessionStateFile, " of the state has no step count"));
  }
  if (with_optimizer) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string bytes,
                              ReadFile(dir + "/" + kOptimizerStateFile));
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    // Checked whole (family, children, shapes) before it copies.
    LORAPLEX_RETURN_IF_ERROR(slot.optimizer->Load(archive));
    slot.counters.steps = meta["steps"].get<int64_t>();
  }
  LORAPLEX_RETURN_IF_ERROR(CopyPeftAdapter(adapter, slot.weights));
  for (torch::Tensor param : slot.weights.parameters()) {
    param.mutable_grad() = torch::Tensor();
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionCounters> LoadSessionCheckpoint(const std::string& dir,
                                                      TrainingSlot& slot) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string meta_text,
                            ReadFile(dir + "/" + kSessionStateFile));
  const nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, false);
  SessionCounters counters;
  if (!meta.is_object() ||
      !meta.value("calls", nlohmann::json()).is_number_integer() ||
      !meta.value("seq_id", nlohmann::json()).is_number_integer()) {
    return absl::DataLossError(absl::StrCat(
        dir, "/", kSessionStateFile, " has no calls and seq_id counters"));
  }
  counters.calls = meta["calls"].get<int64_t>();
  counters.seq_id = meta["seq_id"].get<int64_t>();
  // Gradients are read and checked before the state changes anything.
  std::vector<std::pair<size_t, torch::Tensor>> grads;
  const std::vector<torch::Tensor> params = slot.weights.parameters();
  if (std::filesystem::exists(dir + "/" + kGradientsFile)) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string bytes,
                              ReadFile(dir + "/" + kGradientsFile));
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor grad;
      if (!archive.try_read(absl::StrCat("grad.", i), grad)) continue;
      if (!grad.sizes().equals(params[i].sizes())) {
        return absl::DataLossError(absl::StrCat(dir, "/", kGradientsFile,
                                                ": gradient ", i,
                                                " has the wrong shape"));
      }
      grads.emplace_back(i, grad.to(params[i].options()));
    }
  }
  LORAPLEX_RETURN_IF_ERROR(
      LoadSessionState(dir, /*with_optimizer=*/true, slot));
  for (auto& [i, grad] : grads) params[i].mutable_grad() = grad;
  return counters;
}

}  // namespace loraplex
