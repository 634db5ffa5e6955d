// The trainer's part for training sessions (session_slots.h).
#include "server/trainer/session_slots.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "adapters/peft_files.h"
#include "core/common/split_mix.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/checkpoints/session_checkpoints.h"
#include "server/trainer/session_state_files.h"

namespace loraplex {
namespace {

PoolCheckpointerOptions WriterOptions(const SessionSlotsOptions& options) {
  PoolCheckpointerOptions writer;
  writer.root = options.checkpoint_root;
  writer.enabled = !writer.root.empty();
  return writer;
}

}  // namespace

SessionSlots::SessionSlots(SlotPool& pool, SlotOwners& owners,
                           SessionSlotsOptions options,
                           std::function<void()> slots_changed)
    : pool_(pool),
      owners_(owners),
      options_(std::move(options)),
      slots_changed_(std::move(slots_changed)),
      writer_(WriterOptions(options_)) {}

void SessionSlots::Open(SessionOpenCommand& command) {
  auto done = std::exchange(command.done, nullptr);
  if (owners_.SlotOfSession(command.session_id) >= 0) {
    done(absl::AlreadyExistsError(
        absl::StrCat("session \"", command.session_id, "\" is open")));
    return;
  }
  SlotAttachRequest request;
  request.job_id = "session:" + command.session_id;
  request.lora = command.lora;
  request.optimizer = command.optimizer;
  request.training.seed = command.seed;
  request.preferred_slot = command.preferred_slot;
  request.session = true;
  absl::StatusOr<int> slot =
      CatchTorch("opening the session", [&] { return pool_.Attach(request); });
  if (!slot.ok()) {
    done(slot);
    return;
  }
  SlotSession session;
  session.session_id = command.session_id;
  session.tenant = command.tenant;
  session.family = std::string(OptimizerFamilyName(command.optimizer.family));
  session.seed = command.seed;
  if (!command.restore_dir.empty()) {
    absl::StatusOr<SessionCounters> restored =
        CatchTorch("restoring the session", [&] {
          return LoadSessionCheckpoint(command.restore_dir, pool_.slot(*slot));
        });
    if (!restored.ok()) {
      CatchTorch("close", [&] { return pool_.Retire(*slot); }).IgnoreError();
      slots_changed_();
      done(absl::Status(restored.status().code(),
                        absl::StrCat("restoring from ", command.restore_dir,
                                     ": ", restored.status().message())));
      return;
    }
    session.calls = restored->calls;
    session.seq_id = restored->seq_id;
    session.checkpointed_seq_id = restored->seq_id;
  }
  owners_.Hold(*slot, std::move(session));
  slots_changed_();  // ListSlots shows the session once it is answered.
  done(slot);
}

void SessionSlots::Queue(SessionOp op) {
  const int slot = owners_.SlotOfSession(op.session_id);
  if (slot < 0) {
    std::exchange(op.done, nullptr)(absl::NotFoundError(
        absl::StrCat("session \"", op.session_id, "\" is not open in a slot")));
    return;
  }
  owners_.session(slot)->ops.push_back(std::move(op));
}

bool SessionSlots::pending() const {
  for (int slot : owners_.SessionSlots()) {
    if (!owners_.session(slot)->ops.empty()) return true;
  }
  return false;
}

std::vector<SessionCall> SessionSlots::TakeCalls() {
  std::vector<SessionCall> calls;
  for (int slot = 0; slot < pool_.capacity(); ++slot) {
    while (owners_.session(slot) && !owners_.session(slot)->ops.empty()) {
      SlotSession& session = *owners_.session(slot);
      SessionOp op = std::move(session.ops.front());
      session.ops.pop_front();
      if (op.kind == SessionOp::Kind::kForwardBackward ||
          op.kind == SessionOp::Kind::kForward) {
        // Dropout masks of the session's n-th call: a function of its seed
        // and n alone.
        const uint64_t seed = SplitMix64(
            session.seed ^ SplitMix64(static_cast<uint64_t>(session.calls++)));
        if (op.seq_id > 0) session.seq_id = op.seq_id;
        calls.push_back(SessionCall{slot, std::move(op), seed});
        break;  // What follows waits for this call's pass.
      }
      Apply(slot, std::move(op));
    }
  }
  return calls;
}

void SessionSlots::Apply(int slot, SessionOp op) {
  auto done = std::exchange(op.done, nullptr);
  TrainingSlot& training = pool_.slot(slot);
  SlotSession& session = *owners_.session(slot);
  if (op.seq_id > 0) session.seq_id = op.seq_id;
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
      const int64_t interval = options_.checkpoint_interval;
      if (interval > 0 && training.counters.steps % interval == 0) {
        // Answered once the step's checkpoint is on disk (the writer's
        // thread): a step the client heard of survives a crash.
        Checkpoint(slot, /*gradients=*/false,
                   [done = std::move(done), result] { done(result); });
        return;
      }
      done(result);
      return;
    }
    case SessionOp::Kind::kSaveWeights:
    case SessionOp::Kind::kSaveState: {
      absl::StatusOr<std::map<std::string, std::string>> files = CatchTorch(
          "saving",
          [&]() -> absl::StatusOr<std::map<std::string, std::string>> {
            if (op.kind == SessionOp::Kind::kSaveState) {
              return SessionStateFiles(
                  training,
                  nlohmann::json::parse(op.state_meta, nullptr, false),
                  /*gradients=*/false);
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
      // Answered once the files are on disk (the sessions' writer thread).
      writer_.WriteDirectory(
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
      // A restart continues from what was loaded.
      Checkpoint(slot, /*gradients=*/false, nullptr);
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
      writer_.Forget("session:" + session.session_id);
      if (!options_.checkpoint_root.empty()) {
        // After the checkpoints queued before: a closed session has none.
        writer_.Post(
            [root = options_.checkpoint_root, id = session.session_id] {
              RemoveSessionCheckpoints(root, id);
            });
      }
      owners_.Release(slot);
      slots_changed_();
      done(result);
      return;
    }
    case SessionOp::Kind::kForwardBackward:
    case SessionOp::Kind::kForward:
      break;
  }
  done(absl::InternalError("a forward/backward call outside a pass"));
}

std::vector<ForwardBackwardCall> SessionSlots::PassOf(
    std::vector<SessionCall>& calls) {
  std::vector<ForwardBackwardCall> pass;
  for (SessionCall& call : calls) {
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

void SessionSlots::Answer(
    std::vector<SessionCall>& calls,
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

void SessionSlots::Checkpoint(int slot, bool gradients,
                              std::function<void()> then) {
  const std::string& root = options_.checkpoint_root;
  SlotSession& session = *owners_.session(slot);
  // None are taken, or nothing happened since the last one (and its
  // directory's name is taken).
  if (root.empty() || (session.checkpointed_seq_id == session.seq_id &&
                       session.failed_seq_id->load() != session.seq_id)) {
    if (then) writer_.Post(std::move(then));  // After the last one.
    return;
  }
  nlohmann::json meta;
  meta["session"] = session.session_id;
  meta["tenant"] = session.tenant;
  meta["calls"] = session.calls;
  meta["seq_id"] = session.seq_id;
  absl::StatusOr<std::map<std::string, std::string>> files = CatchTorch(
      "checkpointing the session",
      [&] { return SessionStateFiles(pool_.slot(slot), meta, gradients); });
  const int64_t seq_id = session.seq_id;
  if (!files.ok()) {
    if (options_.on_checkpoint) {
      options_.on_checkpoint(session.session_id, seq_id, files.status());
    }
    if (then) then();
    return;
  }
  session.checkpointed_seq_id = seq_id;
  writer_.WriteDirectory("session:" + session.session_id,
                         SessionCheckpointDir(root, session.session_id, seq_id),
                         *std::move(files),
                         [this, root, id = session.session_id, seq_id,
                          failed = session.failed_seq_id,
                          then = std::move(then)](absl::Status written) {
                           if (written.ok()) {
                             RemoveSessionCheckpointsBefore(root, id, seq_id);
                           } else {
                             failed->store(seq_id);
                           }
                           if (options_.on_checkpoint) {
                             options_.on_checkpoint(id, seq_id, written);
                           }
                           if (then) then();
                         });
}

void SessionSlots::CheckpointAll() {
  for (int slot : owners_.SessionSlots()) {
    Checkpoint(slot, /*gradients=*/true, nullptr);
  }
}

void SessionSlots::Abandon(const absl::Status& status) {
  for (int slot : owners_.SessionSlots()) {
    SlotSession* session = owners_.session(slot);
    for (SessionOp& op : session->ops) {
      if (op.done) std::exchange(op.done, nullptr)(status);
    }
    session->ops.clear();
  }
}

}  // namespace loraplex
