// SessionManager's lifecycle record in the store and its restart path
// (session_manager.h): each state change and each operation's progress is
// written to the store off the trainer's thread before anyone hears of it,
// and Restore() opens the sessions that were open again from their newest
// checkpoints.
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "core/common/read_file.h"
#include "core/optim/config_json.h"
#include "server/checkpoints/session_checkpoints.h"
#include "server/common/clock.h"
#include "server/sessions/session_lifecycle.h"
#include "server/sessions/session_manager.h"

namespace loraplex {
namespace {

SessionRecord RecordOf(const SessionInfo& info) {
  SessionRecord record;
  record.id = info.id;
  record.tenant = info.tenant;
  record.display_name = info.spec.display_name;
  record.spec = {{"lora", LoraConfigToJson(info.spec.lora)},
                 {"optimizer", OptimizerConfigToJson(info.spec.optimizer)},
                 {"seed", info.spec.seed},
                 {"from_state", info.spec.from_state},
                 {"with_optimizer", info.spec.with_optimizer}};
  record.state = info.state;
  record.reason = info.reason;
  record.steps = info.steps;
  record.slot = info.slot;
  // Not next_seq_id: operations taken for the trainer but not finished may
  // not have been applied, and are sent again after a restart.
  record.next_seq_id = info.finished_seq_id + 1;
  record.idle_state = info.idle_state;
  record.create_time_ms = info.create_time_ms;
  record.last_activity_ms = info.last_activity_ms;
  return record;
}

absl::StatusOr<SessionInfo> InfoOf(const SessionRecord& record) {
  SessionInfo info;
  info.id = record.id;
  info.tenant = record.tenant;
  info.spec.display_name = record.display_name;
  absl::StatusOr<LoraConfig> lora =
      LoraConfigFromJson(record.spec.value("lora", nlohmann::json()));
  absl::StatusOr<OptimizerConfig> optimizer =
      OptimizerConfigFromJson(record.spec.value("optimizer", nlohmann::json()));
  const nlohmann::json seed = record.spec.value("seed", nlohmann::json());
  if (!lora.ok() || !optimizer.ok() || !seed.is_number_unsigned()) {
    return absl::DataLossError("its stored configuration does not read");
  }
  info.spec.lora = *lora;
  info.spec.optimizer = *optimizer;
  info.spec.seed = seed.get<uint64_t>();
  info.spec.from_state = record.spec.value("from_state", "");
  info.spec.with_optimizer = record.spec.value("with_optimizer", false);
  info.state = record.state;
  info.reason = record.reason;
  info.steps = record.steps;
  info.slot_before_restart = record.slot;
  info.next_seq_id = record.next_seq_id;
  info.finished_seq_id = record.next_seq_id - 1;
  info.idle_state = record.idle_state;
  info.create_time_ms = record.create_time_ms;
  info.last_activity_ms = record.last_activity_ms;
  return info;
}

// The step count a session checkpoint records (session_state.json).
int64_t CheckpointSteps(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/" + kSessionStateFile);
  if (!text.ok()) return 0;
  const nlohmann::json meta = nlohmann::json::parse(*text, nullptr, false);
  return meta.is_object() ? meta.value("steps", int64_t{0}) : 0;
}

}  // namespace

absl::Status SessionManager::SetState(SessionInfo& info, SessionState state,
                                      std::string reason) const {
  if (!IsAllowedSessionStateChange(info.state, state)) {
    const absl::Status refused = absl::InternalError(
        absl::StrCat("session \"", info.id, "\" cannot go from ",
                     SessionStateName(info.state), " to ",
                     SessionStateName(state), " (", reason, ")"));
    if (options_.logger != nullptr) {
      options_.logger->Error(refused.message(), " (a bug: not stored)");
    }
    return refused;
  }
  info.state = state;
  info.reason = std::move(reason);
  return absl::OkStatus();
}

void SessionManager::Persist(const SessionInfo& info,
                             std::function<void()> then) {
  store_writer_.Post([this, record = RecordOf(info), then = std::move(then)] {
    absl::Status stored = store_->PutSession(record);
    if (!stored.ok() && options_.logger != nullptr) {
      options_.logger->Error("session ", record.id, ": storing its ",
                             SessionStateName(record.state),
                             " record failed (a restart may not continue it "
                             "as it is now): ",
                             stored.message());
    }
    if (then) then();
  });
}

absl::Status SessionManager::Restore() {
  absl::StatusOr<std::vector<SessionRecord>> records = store_->ListSessions();
  if (!records.ok()) return records.status();
  absl::BlockingCounter pending(static_cast<int>(records->size()));
  for (const SessionRecord& record : *records) {
    RestoreOne(record, [&pending] { pending.DecrementCount(); });
  }
  pending.Wait();
  return absl::OkStatus();
}

void SessionManager::RestoreOne(const SessionRecord& record,
                                std::function<void()> restored) {
  absl::StatusOr<SessionInfo> read = InfoOf(record);
  auto session = std::make_unique<Session>();
  SessionInfo& info = session->info;
  if (!read.ok()) {
    info.id = record.id;
    info.tenant = record.tenant;
    info.state = record.state;
    info.reason = record.reason;
    // A session closed before keeps the reason it closed for.
    if (record.state != SessionState::kClosed &&
        !SetState(info, SessionState::kClosed,
                  absl::StrCat("not restored after a restart: ",
                               read.status().message()))
             .ok()) {
      restored();
      return;
    }
  } else {
    info = *std::move(read);
  }
  const std::string id = info.id;
  if (info.state == SessionState::kOpening) {
    // An open the client never heard of.
    if (!SetState(info, SessionState::kClosed,
                  "the server stopped while it was opening")
             .ok()) {
      restored();
      return;
    }
    info.slot = -1;
  }
  // A close (or an idle save) the server stopped in the middle of was not
  // answered: the session opens again, and nothing of it is lost.
  if (info.state != SessionState::kOpen &&
      info.state != SessionState::kClosing) {
    if (!options_.checkpoint_root.empty()) {
      RemoveSessionCheckpoints(options_.checkpoint_root, id);
    }
    absl::MutexLock lock(&mu_);
    if (info.state != record.state || info.reason != record.reason) {
      Persist(info);
    }
    sessions_[id] = std::move(session);
    restored();
    return;
  }
  if (absl::Status reserved = scheduler_->ReserveSessionSlot(info.tenant);
      !reserved.ok()) {
    if (!SetState(
             info, SessionState::kClosed,
             absl::StrCat("not restored after a restart: ", reserved.message()))
             .ok()) {
      restored();
      return;
    }
    info.slot = -1;
    absl::MutexLock lock(&mu_);
    Persist(info);
    sessions_[id] = std::move(session);
    restored();
    return;
  }
  std::optional<SessionCheckpoint> checkpoint;
  if (!options_.checkpoint_root.empty()) {
    checkpoint = LatestSessionCheckpoint(options_.checkpoint_root, id);
  }
  // Operations the store saw applied keep their seq_ids used (a repeat is
  // never applied twice); the checkpoint may know of later ones.
  if (checkpoint) {
    info.next_seq_id = std::max(info.next_seq_id, checkpoint->seq_id + 1);
  }
  info.finished_seq_id = info.next_seq_id - 1;
  info.restored_seq_id = info.next_seq_id;
  info.idle_state.clear();
  if (!SetState(info, SessionState::kOpening, "being restored after a restart")
           .ok()) {
    scheduler_->ReleaseSessionSlot(info.tenant);
    restored();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    sessions_[id] = std::move(session);
  }
  const std::string from = checkpoint ? checkpoint->dir : "";
  OpenInTrainer(
      id, from,
      [this, id, from,
       restored = std::move(restored)](absl::StatusOr<int64_t> steps) {
        {
          absl::MutexLock lock(&mu_);
          auto it = sessions_.find(id);
          if (it != sessions_.end()) {
            SessionInfo& info = it->second->info;
            absl::Status set;
            if (steps.ok()) {
              set = SetState(info, SessionState::kOpen,
                             from.empty()
                                 ? "open (restored after a restart with no "
                                   "checkpoint: from its start)"
                                 : "open (restored after a restart from its "
                                   "newest checkpoint)");
              if (set.ok()) {
                info.steps = from.empty() ? *steps : CheckpointSteps(from);
                info.last_activity_ms = NowMillis();
              }
            } else {
              set = SetState(info, SessionState::kClosed,
                             absl::StrCat("not restored after a restart: ",
                                          steps.status().message()));
              if (set.ok()) info.slot = -1;
            }
            if (set.ok()) Persist(info);
            if (set.ok() && options_.logger != nullptr) {
              options_.logger->Info(
                  "session ", id, ": ", info.reason,
                  steps.ok() ? absl::StrCat(", at step ", info.steps) : "");
            }
          }
        }
        timer_wake_.SignalAll();
        restored();
      });
}

}  // namespace loraplex
