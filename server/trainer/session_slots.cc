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

PoolCheckpointerOptions WriterOptions(const SessionSlotsOptions& options,
                                      bool leader) {
  PoolCheckpointerOptions writer;
  writer.root = options.checkpoint_root;
  writer.enabled = leader && !writer.root.empty();
  return writer;
}

}  // namespace

SessionSlots::SessionSlots(SlotPool& pool, SlotOwners& owners,
                           RankCoordinator& ranks, SessionSlotsOptions options,
                           std::function<void()> slots_changed)
    : pool_(pool),
      owners_(owners),
      ranks_(ranks),
      options_(std::move(options)),
      slots_changed_(std::move(slots_changed)),
      writer_(WriterOptions(options_, ranks.leader())) {}

void SessionSlots::Prepare(OpenSessionJob& open) {
  const std::string& dir = open.command.restore_dir;
  if (dir.empty()) return;
  absl::StatusOr<SavedSessionState> state =
      CatchTorch("reading the session's checkpoint", [&] {
        return ReadSessionState(dir, pool_.model_config(),
                                /*with_optimizer=*/true, /*checkpoint=*/true);
      });
  if (!state.ok()) {
    open.prepared = absl::Status(
        state.status().code(),
        absl::StrCat("restoring from ", dir, ": ", state.status().message()));
    return;
  }
  open.restore = *std::move(state);
}

void SessionSlots::Open(OpenSessionJob& open) {
  SessionOpenCommand& command = open.command;
  auto done = std::exchange(command.done, nullptr);
  if (!done) done = [](absl::StatusOr<int>) {};
  if (!open.prepared.ok()) {  // Rank 0 only: not in the plan.
    done(open.prepared);
    return;
  }
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
  SlotSession session;
  session.session_id = command.session_id;
  session.tenant = command.tenant;
  session.family = std::string(OptimizerFamilyName(command.optimizer.family));
  session.seed = command.seed;
  absl::Status opened = slot.status();
  if (slot.ok() && open.restore) {
    absl::StatusOr<SessionCounters> restored =
        CatchTorch("restoring the session", [&] {
          return LoadSessionCheckpoint(*open.restore, pool_.slot(*slot),
                                       ranks_.data_parallel());
        });
    if (restored.ok()) {
      session.calls = restored->calls;
      session.seq_id = restored->seq_id;
      session.checkpointed_seq_id = restored->seq_id;
    } else {
      opened = absl::Status(restored.status().code(),
                            absl::StrCat("restoring from ", command.restore_dir,
                                         ": ", restored.status().message()));
    }
  }
  // Where it failed on any rank, every rank frees the slot.
  opened = ranks_.AgreeOnOutcome(opened, "opening the session",
                                 /*diverged_if_not=*/false);
  if (opened.ok()) {
    // Rank 0's weights (fresh, or the checkpoint's) are every rank's.
    std::vector<torch::Tensor> params = pool_.slot(*slot).weights.parameters();
    opened = ranks_.BroadcastFromLeader(params);
    if (!opened.ok()) ranks_.Fail(opened);
  }
  if (!opened.ok()) {
    if (slot.ok()) {
      CatchTorch("close", [&] { return pool_.Retire(*slot); }).IgnoreError();
      slots_changed_();
    }
    done(opened);
    return;
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

std::vector<StepPlan::SessionStep> SessionSlots::TakeRound() {
  std::vector<StepPlan::SessionStep> round;
  for (int slot = 0; slot < pool_.capacity(); ++slot) {
    SlotSession* session = owners_.session(slot);
    while (session != nullptr && !session->ops.empty()) {
      StepPlan::SessionStep step;
      step.slot = slot;
      step.op = std::move(session->ops.front());
      session->ops.pop_front();
      const SessionOp::Kind kind = step.op.kind;
      if (kind == SessionOp::Kind::kLoadState) {
        // Read and checked here, so that where rank 0 alone could fail
        // (its files, the adapter's config) every rank skips the load.
        absl::StatusOr<SavedSessionState> state =
            CatchTorch("reading the state", [&] {
              return ReadSessionState(step.op.dir, pool_.model_config(),
                                      step.op.with_optimizer,
                                      /*checkpoint=*/false);
            });
        if (state.ok()) {
          step.prepared = CheckStateFits(*state, pool_.slot(slot));
          if (step.prepared.ok()) step.state = *std::move(state);
        } else {
          step.prepared = state.status();
        }
      }
      round.push_back(std::move(step));
      if (kind == SessionOp::Kind::kForwardBackward ||
          kind == SessionOp::Kind::kForward) {
        break;  // What follows waits for this call's pass.
      }
      if (kind == SessionOp::Kind::kClose) break;  // It answers the rest.
    }
  }
  return round;
}

std::vector<SessionCall> SessionSlots::ApplyRound(
    std::vector<StepPlan::SessionStep>& round) {
  std::vector<SessionCall> calls;
  for (StepPlan::SessionStep& step : round) {
    if (ranks_.Broken()) break;  // The rest is abandoned.
    if (!step.op.done) step.op.done = [](absl::StatusOr<SessionOpResult>) {};
    SlotSession* session = step.slot >= 0 && step.slot < pool_.capacity()
                               ? owners_.session(step.slot)
                               : nullptr;
    if (session == nullptr || session->session_id != step.op.session_id) {
      // Rank 0 took the round from its own sessions: another rank that
      // does not hold it has diverged.
      const absl::Status missing = absl::FailedPreconditionError(
          absl::StrCat("rank ", ranks_.rank(), " holds no session \"",
                       step.op.session_id, "\" in slot ", step.slot));
      ranks_.FailIfDistributed(missing);
      std::exchange(step.op.done, nullptr)(missing);
      continue;
    }
    if (step.op.kind == SessionOp::Kind::kForwardBackward ||
        step.op.kind == SessionOp::Kind::kForward) {
      // Dropout masks of the session's n-th call: a function of its seed
      // and n alone.
      const uint64_t seed = SplitMix64(
          session->seed ^ SplitMix64(static_cast<uint64_t>(session->calls++)));
      if (step.op.seq_id > 0) session->seq_id = step.op.seq_id;
      calls.push_back(
          SessionCall{step.slot, std::exchange(step.op, SessionOp{}), seed});
      continue;
    }
    Apply(step.slot, step);
  }
  AbandonRound(round, absl::UnavailableError("the trainer stopped"));
  return calls;
}

void SessionSlots::AbandonRound(std::vector<StepPlan::SessionStep>& round,
                                const absl::Status& status) {
  for (StepPlan::SessionStep& step : round) {
    if (step.op.done) std::exchange(step.op.done, nullptr)(status);
  }
  round.clear();
}

void SessionSlots::Apply(int slot, StepPlan::SessionStep& step) {
  SessionOp& op = step.op;
  auto done = std::exchange(op.done, nullptr);
  TrainingSlot& training = pool_.slot(slot);
  SlotSession& session = *owners_.session(slot);
  if (op.seq_id > 0) session.seq_id = op.seq_id;
  switch (op.kind) {
    case SessionOp::Kind::kOptimStep: {
      absl::StatusOr<SlotStepMetrics> step = CatchTorch("optimizer step", [&] {
        return StepAccumulated(training, op.step, op.grad_clip, sync_);
      });
      if (!step.ok()) {
        // Bad hyperparameters are refused alike on every rank before the
        // sum; anything else left this rank apart from the others (it
        // skipped a collective, or failed after the sum).
        const absl::StatusCode code = step.status().code();
        if (code != absl::StatusCode::kInvalidArgument &&
            code != absl::StatusCode::kFailedPrecondition) {
          ranks_.FailIfDistributed(step.status());
        }
        done(step.status());
        return;
      }
      SessionOpResult result;
      result.step = *step;
      result.steps = training.counters.steps;
      const int64_t interval = options_.checkpoint_interval;
      // Answered once the step's checkpoint, when one is due, is on disk
      // (the writer's thread): a step the client heard of survives a crash.
      Checkpoint(
          slot, /*gradients=*/false,
          [done = std::move(done), result] { done(result); },
          interval > 0 && training.counters.steps % interval == 0);
      return;
    }
    case SessionOp::Kind::kSaveWeights:
    case SessionOp::Kind::kSaveState: {
      if (!ranks_.leader() && op.kind == SessionOp::Kind::kSaveWeights) {
        return;  // Rank 0 encodes and writes the weights alone.
      }
      absl::StatusOr<std::map<std::string, std::string>> files = CatchTorch(
          "saving",
          [&]() -> absl::StatusOr<std::map<std::string, std::string>> {
            if (op.kind == SessionOp::Kind::kSaveState) {
              // Collective: every rank gathers the optimizer state.
              return SessionStateFiles(
                  training,
                  ranks_.leader()
                      ? nlohmann::json::parse(op.state_meta, nullptr, false)
                      : nlohmann::json::object(),
                  /*gradients=*/false, ranks_.data_parallel(), sync_);
            }
            LORAPLEX_ASSIGN_OR_RETURN(
                PeftAdapterFiles adapter,
                EncodePeftAdapter(training.weights, options_.base_model_name));
            return std::map<std::string, std::string>{
                {kPeftWeightsFile, std::move(adapter.weights)},
                {kPeftConfigFile, std::move(adapter.config)}};
          });
      if (files.status().code() == absl::StatusCode::kAborted) {
        ranks_.FailIfDistributed(files.status());
      }
      if (!ranks_.leader()) return;
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
      // Not read, or not the session's (rank 0 said so before the plan):
      // no rank loads it.
      if (!step.state) {
        done(step.prepared.ok()
                 ? absl::InternalError("rank 0 did not read the state")
                 : step.prepared);
        return;
      }
      absl::Status loaded = CatchTorch("loading the state", [&] {
        return LoadSessionState(*step.state, op.with_optimizer, training,
                                ranks_.data_parallel());
      });
      // The ranks that loaded it differ from those that did not.
      loaded = ranks_.AgreeOnOutcome(loaded, "loading the state",
                                     /*diverged_if_not=*/true);
      if (loaded.ok()) {
        std::vector<torch::Tensor> params = training.weights.parameters();
        loaded = ranks_.BroadcastFromLeader(params);
        if (!loaded.ok()) ranks_.Fail(loaded);
      }
      if (!loaded.ok()) {
        done(loaded);
        return;
      }
      // A restart continues from what was loaded.
      Checkpoint(slot, /*gradients=*/false, nullptr, /*wanted=*/true);
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
      if (ranks_.leader() && !options_.checkpoint_root.empty()) {
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
                              std::function<void()> then, bool wanted) {
  const std::string& root = options_.checkpoint_root;
  SlotSession& session = *owners_.session(slot);
  // Not wanted, none are taken, or nothing happened since the last one (and
  // its directory's name is taken). Rank 0 decides for every rank.
  bool due = wanted && ranks_.leader() && !root.empty() &&
             (session.checkpointed_seq_id != session.seq_id ||
              session.failed_seq_id->load() == session.seq_id);
  absl::StatusOr<bool> agreed = ranks_.LeaderSays(due);
  if (!agreed.ok()) {
    ranks_.Fail(agreed.status());
    due = false;
  } else {
    due = *agreed;
  }
  if (!due) {
    if (!then) return;
    if (wanted) {
      writer_.Post(std::move(then));  // After the last one.
    } else {
      then();
    }
    return;
  }
  nlohmann::json meta;
  meta["session"] = session.session_id;
  meta["tenant"] = session.tenant;
  meta["calls"] = session.calls;
  meta["seq_id"] = session.seq_id;
  // Collective: every rank gathers the optimizer state and sums the
  // gradients.
  absl::StatusOr<std::map<std::string, std::string>> files =
      CatchTorch("checkpointing the session", [&] {
        return SessionStateFiles(pool_.slot(slot), meta, gradients,
                                 ranks_.data_parallel(), sync_);
      });
  if (files.status().code() == absl::StatusCode::kAborted) {
    ranks_.FailIfDistributed(files.status());
  }
  if (!ranks_.leader()) return;
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
    Checkpoint(slot, /*gradients=*/true, nullptr, /*wanted=*/true);
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
