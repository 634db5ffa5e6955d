// The trainer's part of client-driven training sessions (docs/DESIGN.md §12): a
// session holds a slot (SlotState::kSession) with its adapter and
// optimizer; its operations wait in order in the trainer, and each
// iteration takes every session's next forward/backward call into the
// co-batched pass beside the jobs' step, after applying the steps, saves
// and closes queued before it.
#include <torch/torch.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "adapters/peft_files.h"
#include "core/common/read_file.h"
#include "core/common/split_mix.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/trainer/trainer.h"

namespace loraplex {
namespace {

constexpr char kOptimizerStateFile[] = "optimizer.pt";

// A session's state as files: its adapter (PEFT), its optimizer state and
// `meta` with its step count.
absl::StatusOr<std::map<std::string, std::string>> SessionStateFiles(
    const TrainingSlot& slot, const std::string& meta) {
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
  nlohmann::json json = nlohmann::json::parse(meta, nullptr, false);
  if (!json.is_object()) return absl::InternalError("bad session state meta");
  json["steps"] = slot.counters.steps;
  files[kSessionStateFile] = json.dump(2) + "\n";
  return files;
}

// Loads the state SessionStateFiles wrote into `dir` into the session's
// slot: checked whole before anything changes.
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

}  // namespace

void Trainer::OpenSession(SessionOpenCommand command) {
  std::vector<TrainerCommand> entry;
  entry.push_back(OpenSessionJob{std::move(command)});
  Enqueue(std::move(entry));
}

void Trainer::RunSessionOp(SessionOp op) {
  std::vector<TrainerCommand> entry;
  entry.push_back(SessionWork{std::move(op)});
  Enqueue(std::move(entry));
}

int Trainer::SessionSlotOf(const std::string& session_id) const {
  for (int i = 0; i < pool_.capacity(); ++i) {
    if (sessions_[i] && sessions_[i]->session_id == session_id) return i;
  }
  return -1;
}

bool Trainer::SessionWorkPending() const {
  for (const auto& session : sessions_) {
    if (session && !session->ops.empty()) return true;
  }
  return false;
}

void Trainer::Apply(OpenSessionJob& open) {
  SessionOpenCommand& command = open.command;
  auto done = std::exchange(command.done, nullptr);
  if (ranks_.distributed()) {
    done(absl::FailedPreconditionError(
        "training sessions do not run data parallel yet"));
    return;
  }
  if (SessionSlotOf(command.session_id) >= 0) {
    done(absl::AlreadyExistsError(
        absl::StrCat("session \"", command.session_id, "\" is open")));
    return;
  }
  SlotAttachRequest request;
  request.job_id = "session:" + command.session_id;
  request.lora = command.lora;
  request.optimizer = command.optimizer;
  request.training.seed = command.seed;
  request.session = true;
  absl::StatusOr<int> slot =
      CatchTorch("opening the session", [&] { return pool_.Attach(request); });
  if (slot.ok()) {
    auto session = std::make_unique<SlotSession>();
    session->session_id = command.session_id;
    session->tenant = command.tenant;
    session->family =
        std::string(OptimizerFamilyName(command.optimizer.family));
    session->seed = command.seed;
    sessions_[*slot] = std::move(session);
    PublishSlots();  // ListSlots shows the session once it is answered.
  }
  done(slot);
}

void Trainer::Apply(SessionWork& work) {
  const int slot = SessionSlotOf(work.op.session_id);
  if (slot < 0) {
    std::exchange(work.op.done, nullptr)(absl::NotFoundError(absl::StrCat(
        "session \"", work.op.session_id, "\" is not open in a slot")));
    return;
  }
  sessions_[slot]->ops.push_back(std::move(work.op));
}

std::vector<Trainer::PassCall> Trainer::TakeSessionCalls() {
  std::vector<PassCall> calls;
  for (int slot = 0; slot < pool_.capacity(); ++slot) {
    while (sessions_[slot] && !sessions_[slot]->ops.empty()) {
      SlotSession& session = *sessions_[slot];
      SessionOp op = std::move(session.ops.front());
      session.ops.pop_front();
      if (op.kind == SessionOp::Kind::kForwardBackward ||
          op.kind == SessionOp::Kind::kForward) {
        // Dropout masks of the session's n-th call: a function of its seed
        // and n alone.
        const uint64_t seed = SplitMix64(
            session.seed ^ SplitMix64(static_cast<uint64_t>(session.calls++)));
        calls.push_back(PassCall{slot, std::move(op), seed});
        break;  // What follows waits for this call's pass.
      }
      ApplySessionOp(slot, std::move(op));
    }
  }
  return calls;
}

void Trainer::ApplySessionOp(int slot, SessionOp op) {
  auto done = std::exchange(op.done, nullptr);
  TrainingSlot& training = pool_.slot(slot);
  SlotSession& session = *sessions_[slot];
  switch (op.kind) {
    case SessionOp::Kind::kOptimStep: {
      absl::StatusOr<SlotStepMetrics> step = CatchTorch("optimizer step", [&] {
        return StepAccumulated(training, op.step, op.grad_clip);
      });
      if (!step.ok()) {
        done(step.status());
        return;
      }
      SessionOpResult result;
      result.step = *step;
      result.steps = training.counters.steps;
      done(result);
      return;
    }
    case SessionOp::Kind::kSaveWeights:
    case SessionOp::Kind::kSaveState: {
      absl::StatusOr<std::map<std::string, std::string>> files = CatchTorch(
          "saving",
          [&]() -> absl::StatusOr<std::map<std::string, std::string>> {
            if (op.kind == SessionOp::Kind::kSaveState) {
              return SessionStateFiles(training, op.state_meta);
            }
            LORAPLEX_ASSIGN_OR_RETURN(
                PeftAdapterFiles adapter,
                EncodePeftAdapter(training.weights, options_.base_model_name));
            return std::map<std::string, std::string>{
                {kPeftWeightsFile, std::move(adapter.weights)},
                {kPeftConfigFile, std::move(adapter.config)}};
          });
      if (!files.ok()) {
        done(files.status());
        return;
      }
      SessionOpResult result;
      result.steps = training.counters.steps;
      // Answered once the files are on disk (the writer thread).
      checkpoints_.WriteDirectory(
          "session:" + session.session_id, op.dir, *std::move(files),
          [done = std::move(done), result](absl::Status written) {
            if (written.ok()) {
              done(result);
            } else {
              done(written);
            }
          });
      return;
    }
    case SessionOp::Kind::kLoadState: {
      absl::Status loaded = CatchTorch("loading the state", [&] {
        return LoadSessionState(op.dir, op.with_optimizer, training);
      });
      if (!loaded.ok()) {
        done(loaded);
        return;
      }
      SessionOpResult result;
      result.steps = training.counters.steps;
      done(result);
      return;
    }
    case SessionOp::Kind::kClose: {
      SessionOpResult result;
      result.steps = training.counters.steps;
      for (SessionOp& later : session.ops) {
        std::exchange(later.done, nullptr)(absl::FailedPreconditionError(
            absl::StrCat("session \"", session.session_id, "\" was closed")));
      }
      // Zeroed (moments, momentum, step counters, weights) and freed; a
      // failed zeroing leaves the slot kRetiring, retried every iteration.
      CatchTorch("close", [&] { return pool_.Retire(slot); }).IgnoreError();
      checkpoints_.Forget("session:" + session.session_id);
      sessions_[slot].reset();
      retiring_ = static_cast<int>(pool_.SlotsIn(SlotState::kRetiring).size());
      PublishSlots();
      done(result);
      return;
    }
    case SessionOp::Kind::kForwardBackward:
    case SessionOp::Kind::kForward:
      break;
  }
  done(absl::InternalError("a forward/backward call outside a pass"));
}

std::vector<ForwardBackwardCall> Trainer::PassCallsOf(
    std::vector<PassCall>& calls) {
  std::vector<ForwardBackwardCall> pass;
  for (PassCall& call : calls) {
    ForwardBackwardCall c;
    c.adapter = &pool_.slot(call.slot).weights;
    c.data = call.op.data.get();
    c.loss = call.op.loss;
    c.backward = call.op.kind == SessionOp::Kind::kForwardBackward;
    c.dropout_seed = call.dropout_seed;
    pass.push_back(c);
  }
  return pass;
}

void Trainer::AnswerCalls(
    std::vector<PassCall>& calls,
    absl::StatusOr<std::vector<ForwardBackwardOutput>> outputs) {
  for (size_t i = 0; i < calls.size(); ++i) {
    auto done = std::exchange(calls[i].op.done, nullptr);
    if (!done) continue;
    if (!outputs.ok()) {
      done(outputs.status());
      continue;
    }
    SessionOpResult result;
    result.forward_backward = std::move((*outputs)[i]);
    result.steps = pool_.slot(calls[i].slot).counters.steps;
    done(std::move(result));
  }
}

void Trainer::AbandonSessions(const absl::Status& status) {
  for (auto& session : sessions_) {
    if (!session) continue;
    for (SessionOp& op : session->ops) {
      if (op.done) std::exchange(op.done, nullptr)(status);
    }
    session->ops.clear();
  }
}

}  // namespace loraplex
