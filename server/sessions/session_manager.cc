#include "server/sessions/session_manager.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"
#include "server/common/clock.h"
#include "server/jobs/resource_id.h"

namespace loraplex {
namespace {

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session \"", id, "\" not found"));
}

// The session's optimizer config with this step's hyperparameters.
absl::StatusOr<OptimizerConfig> StepConfig(const OptimizerConfig& session,
                                           const OptimStepParams& step) {
  OptimizerConfig config = session;
  if (step.lr) config.lr = *step.lr;
  if (step.beta1) config.beta1 = *step.beta1;
  if (step.beta2) config.beta2 = *step.beta2;
  if (step.eps) config.eps = *step.eps;
  if (step.weight_decay) config.weight_decay = *step.weight_decay;
  if (step.momentum) config.momentum = *step.momentum;
  if (step.lion_beta1) config.lion_beta1 = *step.lion_beta1;
  if (step.lion_beta2) config.lion_beta2 = *step.lion_beta2;
  if (step.soap_beta1) config.soap_beta1 = *step.soap_beta1;
  if (step.soap_beta2) config.soap_beta2 = *step.soap_beta2;
  if (step.shampoo_beta) config.shampoo_beta = *step.shampoo_beta;
  if (step.precondition_frequency) {
    config.precondition_frequency = *step.precondition_frequency;
  }
  if (step.power_iter_steps) config.power_iter_steps = *step.power_iter_steps;
  if (step.use_eigh) config.use_eigh = *step.use_eigh;
  if (step.max_update_rms) config.max_update_rms = *step.max_update_rms;
  if (step.max_precond_dim &&
      *step.max_precond_dim != session.max_precond_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_precond_dim must be the session's, ", session.max_precond_dim,
        " (it shapes the optimizer state), got ", *step.max_precond_dim));
  }
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  if (!(step.grad_clip >= 0) || step.grad_clip > 1e30) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_clip_norm must be a finite number >= 0, got ", step.grad_clip));
  }
  return config;
}

// The saved state's description, if `tenant` owns it.
absl::StatusOr<nlohmann::json> ReadStateMeta(const std::string& dir,
                                             const std::string& tenant,
                                             const std::string& state_id) {
  const absl::Status missing = absl::NotFoundError(
      absl::StrCat("session state \"", state_id, "\" not found"));
  absl::StatusOr<std::string> text =
      ReadFile(absl::StrCat(dir, "/", kSessionStateFile));
  if (!text.ok()) return missing;
  nlohmann::json meta = nlohmann::json::parse(*text, nullptr, false);
  if (!meta.is_object() || meta.value("tenant", "") != tenant) return missing;
  return meta;
}

}  // namespace

SessionManager::SessionManager(JobScheduler* scheduler, JobTrainer* trainer,
                               JobStore* store,
                               const SessionManagerOptions& options)
    : scheduler_(scheduler),
      trainer_(trainer),
      store_(store),
      options_(options),
      results_(ResultHubOptions{options.results_kept}),
      timer_([this] { RunTimer(); }) {}

SessionManager::~SessionManager() {
  Stop();
  timer_.join();
}

void SessionManager::Stop() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> refused;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, session] : sessions_) {
      refused.emplace_back(id, DropWaiting(*session));
    }
  }
  timer_wake_.SignalAll();
  const absl::Status gone =
      absl::UnavailableError("the server is shutting down");
  for (const auto& [id, seq_ids] : refused) FinishAll(id, seq_ids, gone);
  results_.Stop();  // The RetrieveResult calls waiting.
}

void SessionManager::Drain() {
  absl::Notification drained;
  store_writer_.Post([&drained] { drained.Notify(); });
  drained.WaitForNotification();
}

std::vector<int64_t> SessionManager::DropWaiting(Session& session) {
  std::vector<int64_t> seq_ids;
  for (const auto& [seq, request] : session.waiting) seq_ids.push_back(seq);
  session.waiting.clear();
  return seq_ids;
}

void SessionManager::FinishAll(const std::string& session_id,
                               const std::vector<int64_t>& seq_ids,
                               const absl::Status& status) {
  for (int64_t seq : seq_ids) results_.Put({session_id, seq}, status);
}

void SessionManager::AwaitResult(const std::string& session_id, int64_t seq_id,
                                 ResultCallback done) {
  results_.Wait({session_id, seq_id}, std::nullopt,
                [done = std::move(done)](ResultHub<Outcome>::Answer answer) {
                  if (!answer.ok()) {
                    done(answer.status());
                  } else {
                    done(**std::move(answer));  // No deadline: never empty.
                  }
                });
}

absl::StatusOr<SessionManager::Session*> SessionManager::Find(
    const std::string& tenant, const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->info.tenant != tenant) {
    return NotFound(id);
  }
  return it->second.get();
}

absl::StatusOr<SessionManager::Session*> SessionManager::FindLive(
    const std::string& tenant, const std::string& id) {
  if (stop_) return absl::UnavailableError("the server is shutting down");
  return Find(tenant, id);
}

absl::StatusOr<const SessionManager::Session*> SessionManager::Find(
    const std::string& tenant, const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->info.tenant != tenant) {
    return NotFound(id);
  }
  return it->second.get();
}

void SessionManager::Create(const std::string& tenant, SessionSpec spec,
                            InfoCallback done) {
  absl::Status reserved = scheduler_->ReserveSessionSlot(tenant);
  if (!reserved.ok()) {
    done(reserved);
    return;
  }
  auto session = std::make_unique<Session>();
  SessionInfo& info = session->info;
  info.id = NewResourceId("session");
  info.tenant = tenant;
  info.spec = std::move(spec);
  info.create_time_ms = NowMillis();
  info.last_activity_ms = info.create_time_ms;
  if (absl::Status set = SetState(info, SessionState::kOpening, "opening");
      !set.ok()) {
    scheduler_->ReleaseSessionSlot(tenant);
    done(set);
    return;
  }
  const std::string id = info.id;
  {
    absl::MutexLock lock(&mu_);
    Persist(session->info);
    sessions_[id] = std::move(session);
  }
  OpenInTrainer(
      id, /*restore_dir=*/"",
      [this, id, done = std::move(done)](absl::StatusOr<int64_t> steps) {
        absl::Status answer = NotFound(id);
        {
          absl::MutexLock lock(&mu_);
          auto it = sessions_.find(id);
          if (it != sessions_.end()) {
            SessionInfo& info = it->second->info;
            if (!steps.ok()) {
              answer = SetState(
                  info, SessionState::kClosed,
                  absl::StrCat("not opened: ", steps.status().message()));
              if (answer.ok()) {
                Persist(info, [done, error = steps.status()] { done(error); });
                sessions_.erase(it);
                return;
              }
            } else {
              answer = SetState(info, SessionState::kOpen, "open");
              if (answer.ok()) {
                info.steps = *steps;
                info.last_activity_ms = NowMillis();
                Persist(info, [this, done, info] {
                  StampActivity(info.id);
                  done(info);
                });
                timer_wake_.SignalAll();  // Its idle deadline.
                return;
              }
            }
          }
        }
        done(answer);
      });
}

void SessionManager::OpenInTrainer(
    const std::string& id, const std::string& restore_dir,
    std::function<void(absl::StatusOr<int64_t>)> opened) {
  SessionOpenCommand command;
  std::string from_state;
  bool with_optimizer = false;
  {
    absl::MutexLock lock(&mu_);
    const SessionInfo& info = sessions_.at(id)->info;
    command.session_id = id;
    command.tenant = info.tenant;
    command.lora = info.spec.lora;
    command.optimizer = info.spec.optimizer;
    command.seed = info.spec.seed;
    command.restore_dir = restore_dir;
    command.preferred_slot = info.slot_before_restart;
    // A checkpoint already holds what the state put in.
    if (restore_dir.empty()) from_state = info.spec.from_state;
    with_optimizer = info.spec.with_optimizer;
  }
  const std::string tenant = command.tenant;
  command.done = [this, id, tenant, from_state, with_optimizer,
                  opened =
                      std::move(opened)](absl::StatusOr<int> slot) mutable {
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (slot.ok() && it != sessions_.end()) {
        it->second->info.slot = *slot;
      } else if (slot.ok()) {
        slot = absl::UnavailableError("the server is stopping");
      }
    }
    if (!slot.ok()) {
      scheduler_->ReleaseSessionSlot(tenant);
      opened(slot.status());
      return;
    }
    if (from_state.empty()) {
      opened(int64_t{0});
      return;
    }
    // The saved state goes in before the session's first operation: the
    // caller learns its id only from the answer.
    SessionOp load;
    load.kind = SessionOp::Kind::kLoadState;
    load.session_id = id;
    load.dir = options_.states_dir + "/" + from_state;
    load.with_optimizer = with_optimizer;
    load.done = [this, id, tenant, opened = std::move(opened)](
                    absl::StatusOr<SessionOpResult> loaded) mutable {
      if (loaded.ok()) {
        opened(loaded->steps);
        return;
      }
      // Not opened after all: the slot is freed again.
      SessionOp close;
      close.kind = SessionOp::Kind::kClose;
      close.session_id = id;
      close.done = [this, tenant, error = loaded.status(),
                    opened = std::move(opened)](
                       absl::StatusOr<SessionOpResult>) mutable {
        scheduler_->ReleaseSessionSlot(tenant);
        opened(error);
      };
      trainer_->RunSessionOp(std::move(close));
    };
    trainer_->RunSessionOp(std::move(load));
  };
  absl::MutexLock dispatch(&dispatch_mu_);
  trainer_->OpenSession(std::move(command));
}

absl::StatusOr<SessionSpec> SessionManager::StateSpec(
    const std::string& tenant, const std::string& state_id) const {
  LORAPLEX_ASSIGN_OR_RETURN(
      nlohmann::json meta,
      ReadStateMeta(options_.states_dir + "/" + state_id, tenant, state_id));
  SessionSpec spec;
  absl::StatusOr<LoraConfig> lora =
      LoraConfigFromJson(meta.value("lora", nlohmann::json()));
  absl::StatusOr<OptimizerConfig> optimizer =
      OptimizerConfigFromJson(meta.value("optimizer", nlohmann::json()));
  if (!lora.ok() || !optimizer.ok() || !meta.contains("seed") ||
      !meta["seed"].is_number_unsigned()) {
    return absl::InternalError(absl::StrCat(
        "session state \"", state_id, "\" has an unreadable description"));
  }
  spec.lora = *lora;
  spec.optimizer = *optimizer;
  spec.seed = meta["seed"].get<uint64_t>();
  spec.from_state = state_id;
  return spec;
}

absl::StatusOr<SessionInfo> SessionManager::Get(const std::string& tenant,
                                                const std::string& id) const {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(const Session* session, Find(tenant, id));
  return session->info;
}

std::vector<SessionInfo> SessionManager::List(const std::string& tenant) const {
  std::vector<SessionInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    if (session->info.tenant == tenant && session->info.open()) {
      out.push_back(session->info);
    }
  }
  for (const auto& [id, session] : sessions_) {
    if (session->info.tenant == tenant && !session->info.open()) {
      out.push_back(session->info);
    }
  }
  return out;
}

SessionOp SessionManager::OpOf(const Session& session, int64_t seq_id,
                               const SessionRequest& request) {
  SessionOp op;
  op.kind = request.kind;
  op.session_id = session.info.id;
  op.seq_id = seq_id;
  op.data = request.data;
  op.loss = request.loss;
  if (request.kind == SessionOp::Kind::kOptimStep) {
    // Validated in Submit.
    op.step = *StepConfig(session.info.spec.optimizer, request.step);
    op.grad_clip = request.step.grad_clip;
  }
  const std::string id = session.info.id;
  if (request.kind == SessionOp::Kind::kSaveWeights) {
    const std::string adapter_id = NewResourceId("adapter");
    op.dir = scheduler_->AdapterDir(adapter_id);
    AdapterRecord record;
    record.id = adapter_id;
    record.tenant = session.info.tenant;
    record.display_name = request.display_name;
    record.base_model = options_.base_model;
    record.lora = LoraConfigToJson(session.info.spec.lora);
    op.done = [this, id, seq_id, record](absl::StatusOr<SessionOpResult> r) {
      if (!r.ok()) {
        Finish(id, seq_id, r.status());
        return;
      }
      AdapterRecord stored = record;
      stored.create_time_ms = NowMillis();
      absl::Status inserted = store_->InsertAdapter(stored);
      if (!inserted.ok()) {
        Finish(id, seq_id, inserted);
        return;
      }
      SessionResult result;
      result.seq_id = seq_id;
      result.kind = SessionOp::Kind::kSaveWeights;
      result.result = *std::move(r);
      result.adapter_id = record.id;
      Finish(id, seq_id, std::move(result));
    };
    return op;
  }
  std::string state_id;
  if (request.kind == SessionOp::Kind::kSaveState) {
    state_id = NewResourceId("state");
    op.dir = options_.states_dir + "/" + state_id;
    nlohmann::json meta;
    meta["tenant"] = session.info.tenant;
    meta["display_name"] = request.display_name;
    meta["session"] = session.info.id;
    meta["lora"] = LoraConfigToJson(session.info.spec.lora);
    meta["optimizer"] = OptimizerConfigToJson(session.info.spec.optimizer);
    meta["seed"] = session.info.spec.seed;
    meta["create_time_ms"] = NowMillis();
    op.state_meta = meta.dump();
  }
  if (request.kind == SessionOp::Kind::kLoadState) {
    op.dir = options_.states_dir + "/" + request.state;
    op.with_optimizer = request.with_optimizer;
  }
  op.done = [this, id, seq_id, kind = request.kind,
             state_id](absl::StatusOr<SessionOpResult> r) {
    if (!r.ok()) {
      Finish(id, seq_id, r.status());
      return;
    }
    SessionResult result;
    result.seq_id = seq_id;
    result.kind = kind;
    result.result = *std::move(r);
    result.state_id = state_id;
    Finish(id, seq_id, std::move(result));
  };
  return op;
}

absl::Status SessionManager::CheckStateFits(
    const Session& session, const SessionRequest& request) const {
  LORAPLEX_ASSIGN_OR_RETURN(SessionSpec state,
                            StateSpec(session.info.tenant, request.state));
  if (LoraConfigToJson(state.lora) !=
      LoraConfigToJson(session.info.spec.lora)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: its LoRA config ", LoraConfigToJson(state.lora).dump(),
        " is not the session's ",
        LoraConfigToJson(session.info.spec.lora).dump()));
  }
  if (request.with_optimizer &&
      state.optimizer.family != session.info.spec.optimizer.family) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: its optimizer is ", OptimizerFamilyName(state.optimizer.family),
        ", the session's ",
        OptimizerFamilyName(session.info.spec.optimizer.family),
        " (load it without the optimizer, or into a session of its family)"));
  }
  return absl::OkStatus();
}

void SessionManager::TakeReady(Session& session, std::vector<Ready>& ready) {
  for (;;) {
    auto it = session.waiting.find(session.info.next_seq_id);
    if (it == session.waiting.end()) return;
    const int64_t seq = it->first;
    Ready next;
    next.session_id = session.info.id;
    next.seq_id = seq;
    next.op = OpOf(session, seq, it->second);
    session.running.insert(seq);
    session.waiting.erase(it);
    ++session.info.next_seq_id;
    ready.push_back(std::move(next));
  }
}

void SessionManager::Send(std::vector<Ready> ready) {
  for (Ready& r : ready) trainer_->RunSessionOp(std::move(r.op));
}

void SessionManager::Submit(const std::string& tenant, const std::string& id,
                            int64_t seq_id, SessionRequest request,
                            ResultCallback done) {
  absl::MutexLock dispatch(&dispatch_mu_);
  std::vector<Ready> ready;
  absl::Status refused;
  std::optional<Outcome> stored;
  bool accepted = false;  // New, or a repeat of one not finished.
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> found = FindLive(tenant, id);
    if (!found.ok()) {
      refused = found.status();
    } else {
      Session& session = **found;
      session.info.last_activity_ms = NowMillis();
      const int64_t next = session.info.next_seq_id;
      if (seq_id < 1) {
        refused = absl::InvalidArgumentError(
            absl::StrCat("seq_id must be >= 1, got ", seq_id));
      } else if (session.waiting.count(seq_id) > 0) {
        refused = absl::AlreadyExistsError(absl::StrCat(
            "seq_id ", seq_id, " is already waiting for its turn (seq_id ",
            next, " comes first)"));
      } else if (seq_id < next) {
        // A repeat: the first one's result, kept or when it ends.
        Outcome kept = absl::UnknownError("");
        switch (results_.Find({id, seq_id}, &kept)) {
          case ResultHub<Outcome>::State::kFinished:
            stored = std::move(kept);
            break;
          case ResultHub<Outcome>::State::kPending:
            accepted = true;
            break;
          case ResultHub<Outcome>::State::kUnknown:
            refused = NoLongerKept(session.info, seq_id);
        }
      } else if (!session.info.idle_state.empty()) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "session \"", id, "\" was closed after ",
            options_.idle_timeout.count() / 1000.0,
            " s without a call; its state was saved as \"session_states/",
            session.info.idle_state,
            "\": CreateSession with from_state (and with_optimizer) "
            "continues from it"));
      } else if (session.info.state == SessionState::kOpening) {
        refused = absl::UnavailableError(absl::StrCat(
            "session \"", id, "\" is being opened (", session.info.reason,
            "): send the call again in a moment"));
      } else if (session.info.state == SessionState::kClosing) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "session \"", id, "\" is closing (", session.info.reason, ")"));
      } else if (session.info.state != SessionState::kOpen) {
        refused = absl::FailedPreconditionError(
            absl::StrCat("session \"", id, "\" is closed"));
      } else if (seq_id >= next + options_.max_ahead) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "seq_id ", seq_id, " is too far ahead: the session applies ", next,
            " next and takes at most ", options_.max_ahead, " ahead of it"));
      } else {
        if (request.kind == SessionOp::Kind::kOptimStep) {
          refused =
              StepConfig(session.info.spec.optimizer, request.step).status();
        }
        if (request.kind == SessionOp::Kind::kLoadState) {
          refused = CheckStateFits(session, request);
        }
        if (refused.ok()) {
          session.waiting[seq_id] = std::move(request);
          results_.Expect({id, seq_id});
          accepted = true;
          TakeReady(session, ready);
        }
      }
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  if (stored) {
    done(*std::move(stored));
    return;
  }
  if (accepted) AwaitResult(id, seq_id, std::move(done));
  Send(std::move(ready));
}

absl::Status SessionManager::NoLongerKept(const SessionInfo& info,
                                          int64_t seq_id) const {
  if (seq_id < info.restored_seq_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "seq_id ", seq_id,
        " was applied before the server restarted; results are not kept "
        "across a restart (the session continues at seq_id ",
        info.restored_seq_id, ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the result of seq_id ", seq_id, " is no longer kept (the last ",
      options_.results_kept, " are)"));
}

void SessionManager::Finish(const std::string& session_id, int64_t seq_id,
                            Outcome outcome) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    Session& session = *it->second;
    SessionInfo& info = session.info;
    // Abandoned by a shutdown: not applied, sent again after the restart.
    if (!absl::IsUnavailable(outcome.status()) &&
        seq_id > info.finished_seq_id) {
      // Operations may finish out of order (a step waits for its
      // checkpoint): the newest one says how many steps there are.
      if (outcome.ok()) info.steps = outcome->result.steps;
      info.finished_seq_id = seq_id;
    }
    info.last_activity_ms = NowMillis();
    session.running.erase(seq_id);
    // Answered once the store knows how far the session got.
    Persist(session.info,
            [this, session_id, seq_id, outcome = std::move(outcome)]() mutable {
              StampActivity(session_id);
              results_.Put({session_id, seq_id}, std::move(outcome));
            });
  }
}

void SessionManager::Retrieve(
    const std::string& tenant, const std::string& id, int64_t seq_id,
    std::chrono::milliseconds wait,
    std::function<void(absl::StatusOr<std::optional<SessionResult>>)> done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> found = FindLive(tenant, id);
    if (!found.ok()) {
      refused = found.status();
    } else if (results_.Find({id, seq_id}) ==
               ResultHub<Outcome>::State::kUnknown) {
      if (seq_id >= 1 && seq_id < (*found)->info.next_seq_id) {
        refused = NoLongerKept((*found)->info, seq_id);
      } else {
        refused = absl::NotFoundError(absl::StrCat(
            "session \"", id, "\" has no operation with seq_id ", seq_id));
      }
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  results_.Wait({id, seq_id}, std::min(wait, options_.max_wait),
                [done = std::move(done)](ResultHub<Outcome>::Answer answer) {
                  if (!answer.ok()) return done(answer.status());
                  if (!answer->has_value())
                    return done(std::optional<SessionResult>());
                  if (!(*answer)->ok()) return done((*answer)->status());
                  done(std::optional<SessionResult>(***std::move(answer)));
                });
}

void SessionManager::RunTimer() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> next;
    // Sessions idle past the timeout are saved and closed.
    std::vector<std::string> idle;
    if (options_.idle_timeout.count() > 0) {
      const int64_t now_ms = NowMillis();
      const int64_t timeout_ms = options_.idle_timeout.count();
      for (auto& [id, session] : sessions_) {
        const bool closed = session->info.state == SessionState::kClosed;
        if (session->info.state != SessionState::kOpen ||
            !session->running.empty() || !session->waiting.empty()) {
          // Opening, closing or busy: looked at again in a while.
          if (!closed) {
            const auto at =
                now + std::min<std::chrono::milliseconds>(
                          options_.idle_timeout, std::chrono::seconds(1));
            if (!next || at < *next) next = at;
          }
          continue;
        }
        const int64_t left =
            session->info.last_activity_ms + timeout_ms - now_ms;
        if (left <= 0) {
          idle.push_back(id);
        } else {
          const auto at = now + std::chrono::milliseconds(left);
          if (!next || at < *next) next = at;
        }
      }
    }
    if (!idle.empty()) {
      mu_.Unlock();
      for (const std::string& id : idle) CloseIdle(id);
      mu_.Lock();
      continue;
    }
    if (next) {
      timer_wake_.WaitWithTimeout(
          &mu_, absl::FromChrono(*next - std::chrono::steady_clock::now()));
    } else {
      timer_wake_.Wait(&mu_);
    }
  }
}

void SessionManager::StampActivity(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end() && it->second->info.open()) {
    it->second->info.last_activity_ms = NowMillis();
  }
}

void SessionManager::CloseIdle(const std::string& id) {
  absl::MutexLock dispatch(&dispatch_mu_);
  SessionOp save;
  std::string tenant;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (stop_ || it == sessions_.end()) return;
    Session& session = *it->second;
    if (session.info.state != SessionState::kOpen || !session.running.empty() ||
        !session.waiting.empty()) {
      return;  // Busy again, or closed meanwhile.
    }
    if (!SetState(session.info, SessionState::kClosing, "idle: being saved")
             .ok()) {
      return;
    }
    Persist(session.info);
    tenant = session.info.tenant;
    SessionRequest request;
    request.kind = SessionOp::Kind::kSaveState;
    request.display_name = "saved when idle";
    save = OpOf(session, 0, request);
  }
  const std::string state_dir = save.dir;
  const std::string state_id = state_dir.substr(state_dir.rfind('/') + 1);
  // OpOf's answer would store a result; this save is the manager's own.
  save.done = [this, id, tenant,
               state_id](absl::StatusOr<SessionOpResult> saved) {
    if (!saved.ok()) {
      // Kept open (and tried again after another timeout): nothing of it
      // may be lost.
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it != sessions_.end()) {
        SessionInfo& info = it->second->info;
        if (SetState(info, SessionState::kOpen,
                     absl::StrCat("open (saving it when idle failed: ",
                                  saved.status().message(), ")"))
                .ok()) {
          info.last_activity_ms = NowMillis();
          Persist(info);
        }
      }
      return;
    }
    SessionOp close;
    close.kind = SessionOp::Kind::kClose;
    close.session_id = id;
    close.done = [this, id, tenant,
                  state_id](absl::StatusOr<SessionOpResult> r) {
      // Free before the session is seen closed (as Close does).
      if (r.ok()) scheduler_->ReleaseSessionSlot(tenant);
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) return;
      SessionInfo& info = it->second->info;
      if (!r.ok()) {
        if (SetState(info, SessionState::kOpen, "open").ok()) Persist(info);
        return;
      }
      if (!SetState(info, SessionState::kClosed,
                    absl::StrCat("closed after ",
                                 options_.idle_timeout.count() / 1000.0,
                                 " s without a call; its state was saved as "
                                 "session_states/",
                                 state_id))
               .ok()) {
        return;
      }
      info.slot = -1;
      info.steps = r->steps;
      info.idle_state = state_id;
      Persist(info);
    };
    trainer_->RunSessionOp(std::move(close));
  };
  trainer_->RunSessionOp(std::move(save));
}

void SessionManager::Close(const std::string& tenant, const std::string& id,
                           InfoCallback done) {
  absl::MutexLock dispatch(&dispatch_mu_);
  std::vector<int64_t> refused_waiting;
  std::optional<absl::StatusOr<SessionInfo>> answer_now;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> found = Find(tenant, id);
    if (!found.ok()) {
      answer_now = found.status();
    } else if ((*found)->info.state == SessionState::kClosing) {
      answer_now = absl::FailedPreconditionError(
          absl::StrCat("session \"", id, "\" is already closing"));
    } else if ((*found)->info.state == SessionState::kOpening) {
      answer_now = absl::UnavailableError(
          absl::StrCat("session \"", id, "\" is being opened (",
                       (*found)->info.reason, "): close it again in a moment"));
    } else if (!(*found)->info.open()) {
      answer_now = (*found)->info;  // Closed already: nothing to do.
    } else {
      Session& session = **found;
      if (absl::Status set =
              SetState(session.info, SessionState::kClosing, "closing");
          !set.ok()) {
        answer_now = set;
      } else {
        Persist(session.info);
        refused_waiting = DropWaiting(session);
      }
    }
  }
  if (answer_now) {
    done(*std::move(answer_now));
    return;
  }
  const absl::Status closing = absl::FailedPreconditionError(
      absl::StrCat("session \"", id, "\" was closed before its turn"));
  FinishAll(id, refused_waiting, closing);
  SessionOp op;
  op.kind = SessionOp::Kind::kClose;
  op.session_id = id;
  op.done = [this, id, tenant,
             done = std::move(done)](absl::StatusOr<SessionOpResult> r) {
    // The trainer freed the slot: it is free again before the session is
    // seen closed, so a CreateSession after the answer finds it.
    if (r.ok()) scheduler_->ReleaseSessionSlot(tenant);
    absl::StatusOr<SessionInfo> answer;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) {
        answer = NotFound(id);
      } else if (r.ok()) {
        SessionInfo& info = it->second->info;
        absl::Status set =
            SetState(info, SessionState::kClosed, "closed by the client");
        if (!set.ok()) {
          answer = set;
        } else {
          info.slot = -1;
          info.steps = r->steps;
          info.last_activity_ms = NowMillis();
          // Answered once the store says it is closed.
          Persist(info, [done, info] { done(info); });
          return;
        }
      } else if (absl::Status set =
                     SetState(it->second->info, SessionState::kOpen, "open");
                 !set.ok()) {
        answer = set;
      } else {
        Persist(it->second->info);
        answer = r.status();
      }
    }
    done(std::move(answer));
  };
  trainer_->RunSessionOp(std::move(op));
}

}  // namespace loraplex
