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
#include "core/train/co_batch_step.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {
namespace {

constexpr char kOptimizerStateFile[] = "optimizer.pt";
constexpr char kGradientsFile[] = "gradients.pt";

}  // namespace

namespace {

// The collective part of SessionStateFiles (every rank of a data-parallel
// run makes the same calls): the optimizer state in the one-process format,
// and with `gradients` the accumulated gradients summed over the ranks.
absl::Status GatherState(const TrainingSlot& slot, bool gradients,
                         DataParallelSlots* data_parallel, const StepSync* sync,
                         torch::serialize::OutputArchive& optimizer,
                         std::vector<torch::Tensor>& grads) {
  try {
    if (data_parallel != nullptr) {
      LORAPLEX_RETURN_IF_ERROR(
          data_parallel->SaveOptimizerState(slot, optimizer));
    } else {
      slot.optimizer->Save(optimizer);
    }
    if (!gradients) return absl::OkStatus();
    if (sync != nullptr && sync->world_size > 1) {
      LORAPLEX_ASSIGN_OR_RETURN(grads, SumAccumulatedGradients(slot, *sync));
    } else {
      for (const torch::Tensor& param : slot.weights.parameters()) {
        grads.push_back(param.grad());
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> SessionStateFiles(
    const TrainingSlot& slot, nlohmann::json meta, bool gradients,
    DataParallelSlots* data_parallel, const StepSync* sync) {
  // First what every rank does alike, so that a failure of this rank's
  // own part later leaves no rank waiting.
  torch::serialize::OutputArchive archive;
  std::vector<torch::Tensor> grads;
  if (absl::Status gathered =
          GatherState(slot, gradients, data_parallel, sync, archive, grads);
      !gathered.ok()) {
    if (data_parallel == nullptr) return gathered;
    return absl::AbortedError(absl::StrCat(
        "gathering the session's state over the ranks failed (the ranks "
        "now differ): ",
        gathered.message()));
  }
  LORAPLEX_ASSIGN_OR_RETURN(PeftAdapterFiles adapter,
                            EncodePeftAdapter(slot.weights, ""));
  std::map<std::string, std::string> files;
  files[kPeftWeightsFile] = std::move(adapter.weights);
  files[kPeftConfigFile] = std::move(adapter.config);
  std::ostringstream bytes;
  archive.save_to(bytes);
  files[kOptimizerStateFile] = bytes.str();
  if (!meta.is_object()) return absl::InternalError("bad session state meta");
  meta["steps"] = slot.counters.steps;
  files[kSessionStateFile] = meta.dump(2) + "\n";
  torch::serialize::OutputArchive grad_archive;
  int64_t count = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    grad_archive.write(absl::StrCat("grad.", i), grads[i]);
    ++count;
  }
  if (count > 0) {
    std::ostringstream grad_bytes;
    grad_archive.save_to(grad_bytes);
    files[kGradientsFile] = grad_bytes.str();
  }
  return files;
}

absl::StatusOr<SavedSessionState> ReadSessionState(const std::string& dir,
                                                   const ModelConfig& model,
                                                   bool with_optimizer,
                                                   bool checkpoint) {
  SavedSessionState state;
  LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter, LoadPeftAdapter(dir, model));
  state.adapter = std::make_shared<const PeftAdapter>(std::move(adapter));
  LORAPLEX_ASSIGN_OR_RETURN(state.meta,
                            ReadFile(dir + "/" + kSessionStateFile));
  if (with_optimizer) {
    LORAPLEX_ASSIGN_OR_RETURN(state.optimizer,
                              ReadFile(dir + "/" + kOptimizerStateFile));
  }
  if (checkpoint && std::filesystem::exists(dir + "/" + kGradientsFile)) {
    LORAPLEX_ASSIGN_OR_RETURN(state.gradients,
                              ReadFile(dir + "/" + kGradientsFile));
  }
  return state;
}

absl::Status CheckStateFits(const SavedSessionState& state,
                            const TrainingSlot& slot) {
  if (state.adapter != nullptr && LoraConfigToJson(state.adapter->config) !=
                                      LoraConfigToJson(slot.weights.config())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state's LoRA config ",
                     LoraConfigToJson(state.adapter->config).dump(),
                     " is not the session's ",
                     LoraConfigToJson(slot.weights.config()).dump()));
  }
  return absl::OkStatus();
}

absl::Status LoadSessionState(const SavedSessionState& state,
                              bool with_optimizer, TrainingSlot& slot,
                              DataParallelSlots* data_parallel) {
  LORAPLEX_RETURN_IF_ERROR(CheckStateFits(state, slot));
  const nlohmann::json meta = nlohmann::json::parse(state.meta, nullptr, false);
  if (!meta.is_object() || !meta.contains("steps") ||
      !meta["steps"].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kSessionStateFile, " of the state has no step count"));
  }
  if (with_optimizer) {
    if (state.optimizer.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state has no ", kOptimizerStateFile));
    }
    std::istringstream in(state.optimizer);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    // Checked whole (family, children, shapes) before it copies.
    LORAPLEX_RETURN_IF_ERROR(
        data_parallel != nullptr
            ? data_parallel->LoadOptimizerState(slot, archive)
            : slot.optimizer->Load(archive));
    slot.counters.steps = meta["steps"].get<int64_t>();
  }
  if (state.adapter != nullptr) {
    LORAPLEX_RETURN_IF_ERROR(CopyPeftAdapter(*state.adapter, slot.weights));
  }
  for (torch::Tensor param : slot.weights.parameters()) {
    param.mutable_grad() = torch::Tensor();
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionCounters> LoadSessionCheckpoint(
    const SavedSessionState& state, TrainingSlot& slot,
    DataParallelSlots* data_parallel) {
  const nlohmann::json meta = nlohmann::json::parse(state.meta, nullptr, false);
  SessionCounters counters;
  if (!meta.is_object() ||
      !meta.value("calls", nlohmann::json()).is_number_integer() ||
      !meta.value("seq_id", nlohmann::json()).is_number_integer()) {
    return absl::DataLossError(
        absl::StrCat(kSessionStateFile, " has no calls and seq_id counters"));
  }
  counters.calls = meta["calls"].get<int64_t>();
  counters.seq_id = meta["seq_id"].get<int64_t>();
  // Gradients are read and checked before the state changes anything.
  std::vector<std::pair<size_t, torch::Tensor>> grads;
  const std::vector<torch::Tensor> params = slot.weights.parameters();
  if (!state.gradients.empty()) {
    std::istringstream in(state.gradients);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor grad;
      if (!archive.try_read(absl::StrCat("grad.", i), grad)) continue;
      if (!grad.sizes().equals(params[i].sizes())) {
        return absl::DataLossError(absl::StrCat(kGradientsFile, ": gradient ",
                                                i, " has the wrong shape"));
      }
      grads.emplace_back(i, grad.to(params[i].options()));
    }
  }
  LORAPLEX_RETURN_IF_ERROR(
      LoadSessionState(state, /*with_optimizer=*/true, slot, data_parallel));
  for (auto& [i, grad] : grads) params[i].mutable_grad() = grad;
  return counters;
}

}  // namespace loraplex
