#include "server/sessions/session_manager.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
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
      timer_([this] { RunTimer(); }) {}

SessionManager::~SessionManager() {
  Stop();
  timer_.join();
}

void SessionManager::Stop() {
  std::vector<std::function<void()>> answers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    const absl::Status gone =
        absl::UnavailableError("the server is shutting down");
    for (auto& [id, session] : sessions_) {
      for (auto& [seq, entry] : session->waiting) {
        answers.push_back(
            [done = std::move(entry.second), gone] { done(gone); });
      }
      session->waiting.clear();
      for (auto& [seq, retrievers] : session->retrievers) {
        for (Retriever& r : retrievers) {
          answers.push_back([done = std::move(r.done), gone] { done(gone); });
        }
      }
      session->retrievers.clear();
    }
  }
  timer_wake_.SignalAll();
  for (auto& answer : answers) answer();
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
  SessionOpenCommand command;
  command.session_id = info.id;
  command.tenant = tenant;
  command.lora = info.spec.lora;
  command.optimizer = info.spec.optimizer;
  command.seed = info.spec.seed;
  const std::string id = info.id;
  const std::string from_state = info.spec.from_state;
  const bool with_optimizer = info.spec.with_optimizer;
  {
    absl::MutexLock lock(&mu_);
    sessions_[id] = std::move(session);
  }
  timer_wake_.SignalAll();  // Its idle deadline.
  command.done = [this, id, tenant, from_state, with_optimizer,
                  done = std::move(done)](absl::StatusOr<int> slot) mutable {
    absl::StatusOr<SessionInfo> answer;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (slot.ok() && it != sessions_.end()) {
        // From a state: open (to calls and to the idle timer) once loaded.
        it->second->info.open = from_state.empty();
        it->second->opened = true;
        it->second->info.slot = *slot;
        answer = it->second->info;
      } else {
        if (it != sessions_.end()) sessions_.erase(it);
        answer = slot.ok() ? absl::UnavailableError("the server is stopping")
                           : slot.status();
      }
    }
    if (!answer.ok()) {
      scheduler_->ReleaseSessionSlot(tenant);
      done(std::move(answer));
      return;
    }
    if (from_state.empty()) {
      done(std::move(answer));
      return;
    }
    // The saved state goes in before the session's first operation: the
    // caller learns its id only from this answer.
    SessionOp load;
    load.kind = SessionOp::Kind::kLoadState;
    load.session_id = id;
    load.dir = options_.states_dir + "/" + from_state;
    load.with_optimizer = with_optimizer;
    load.done = [this, id, tenant, done = std::move(done)](
                    absl::StatusOr<SessionOpResult> loaded) mutable {
      if (loaded.ok()) {
        absl::StatusOr<SessionInfo> info;
        {
          absl::MutexLock lock(&mu_);
          auto it = sessions_.find(id);
          if (it == sessions_.end()) {
            info = NotFound(id);
          } else {
            it->second->info.open = true;
            it->second->info.steps = loaded->steps;
            it->second->info.last_activity_ms = NowMillis();
            info = it->second->info;
          }
        }
        timer_wake_.SignalAll();  // Its idle deadline.
        done(std::move(info));
        return;
      }
      // Not opened after all: the slot is freed again.
      SessionOp close;
      close.kind = SessionOp::Kind::kClose;
      close.session_id = id;
      close.done = [this, id, tenant, error = loaded.status(),
                    done = std::move(done)](absl::StatusOr<SessionOpResult>) {
        {
          absl::MutexLock lock(&mu_);
          sessions_.erase(id);
        }
        scheduler_->ReleaseSessionSlot(tenant);
        done(error);
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
    if (session->info.tenant == tenant && session->info.open) {
      out.push_back(session->info);
    }
  }
  for (const auto& [id, session] : sessions_) {
    if (session->info.tenant == tenant && !session->info.open) {
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
    next.op = OpOf(session, seq, it->second.first);
    session.running[seq].push_back(std::move(it->second.second));
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
      } else if (auto result = session.results.find(seq_id);
                 result != session.results.end()) {
        stored = result->second;  // A repeat: the first one's result.
      } else if (auto running = session.running.find(seq_id);
                 running != session.running.end()) {
        running->second.push_back(std::move(done));
        return;
      } else if (session.waiting.count(seq_id) > 0) {
        refused = absl::AlreadyExistsError(absl::StrCat(
            "seq_id ", seq_id, " is already waiting for its turn (seq_id ",
            next, " comes first)"));
      } else if (seq_id < next) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "the result of seq_id ", seq_id, " is no longer kept (the last ",
            options_.results_kept, " are)"));
      } else if (!session.info.idle_state.empty()) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "session \"", id, "\" was closed after ",
            options_.idle_timeout.count() / 1000.0,
            " s without a call; its state was saved as \"session_states/",
            session.info.idle_state,
            "\": CreateSession with from_state (and with_optimizer) "
            "continues from it"));
      } else if (!session.info.open || session.closing) {
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
          session.waiting[seq_id] = {std::move(request), std::move(done)};
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
  Send(std::move(ready));
}

void SessionManager::Finish(const std::string& session_id, int64_t seq_id,
                            Outcome outcome) {
  std::vector<ResultCallback> callers;
  std::vector<Retriever> retrievers;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    Session& session = *it->second;
    if (outcome.ok()) session.info.steps = outcome->result.steps;
    session.info.last_activity_ms = NowMillis();
    if (auto running = session.running.find(seq_id);
        running != session.running.end()) {
      callers = std::move(running->second);
      session.running.erase(running);
    }
    if (auto waiting = session.retrievers.find(seq_id);
        waiting != session.retrievers.end()) {
      retrievers = std::move(waiting->second);
      session.retrievers.erase(waiting);
    }
    session.results[seq_id] = outcome;
    while (static_cast<int64_t>(session.results.size()) >
           options_.results_kept) {
      session.results.erase(session.results.begin());
    }
  }
  for (ResultCallback& caller : callers) caller(outcome);
  for (Retriever& r : retrievers) {
    if (outcome.ok()) {
      r.done(std::optional<SessionResult>(*outcome));
    } else {
      r.done(outcome.status());
    }
  }
}

void SessionManager::Retrieve(
    const std::string& tenant, const std::string& id, int64_t seq_id,
    std::chrono::milliseconds wait,
    std::function<void(absl::StatusOr<std::optional<SessionResult>>)> done) {
  std::optional<Outcome> stored;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> found = FindLive(tenant, id);
    if (!found.ok()) {
      refused = found.status();
    } else {
      Session& session = **found;
      if (auto result = session.results.find(seq_id);
          result != session.results.end()) {
        stored = result->second;
      } else if (session.running.count(seq_id) > 0 ||
                 session.waiting.count(seq_id) > 0) {
        const auto capped = std::min(wait, options_.max_wait);
        session.retrievers[seq_id].push_back(
            {std::move(done), std::chrono::steady_clock::now() + capped});
        timer_wake_.SignalAll();
        return;
      } else if (seq_id >= 1 && seq_id < session.info.next_seq_id) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "the result of seq_id ", seq_id, " is no longer kept (the last ",
            options_.results_kept, " are)"));
      } else {
        refused = absl::NotFoundError(absl::StrCat(
            "session \"", id, "\" has no operation with seq_id ", seq_id));
      }
    }
  }
  if (!refused.ok()) {
    done(refused);
  } else if (stored->ok()) {
    done(std::optional<SessionResult>(**stored));
  } else {
    done(stored->status());
  }
}

void SessionManager::RunTimer() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<Retriever> expired;
    std::optional<std::chrono::steady_clock::time_point> next;
    for (auto& [id, session] : sessions_) {
      for (auto it = session->retrievers.begin();
           it != session->retrievers.end();) {
        std::vector<Retriever>& list = it->second;
        for (auto r = list.begin(); r != list.end();) {
          if (r->deadline <= now) {
            expired.push_back(std::move(*r));
            r = list.erase(r);
          } else {
            if (!next || r->deadline < *next) next = r->deadline;
            ++r;
          }
        }
        it = list.empty() ? session->retrievers.erase(it) : std::next(it);
      }
    }
    // Sessions idle past the timeout are saved and closed.
    std::vector<std::string> idle;
    if (options_.idle_timeout.count() > 0) {
      const int64_t now_ms = NowMillis();
      const int64_t timeout_ms = options_.idle_timeout.count();
      for (auto& [id, session] : sessions_) {
        const bool closed = !session->info.open && session->opened;
        if (!session->info.open || session->closing ||
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
    if (!expired.empty() || !idle.empty()) {
      mu_.Unlock();
      for (Retriever& r : expired) r.done(std::optional<SessionResult>());
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

void SessionManager::CloseIdle(const std::string& id) {
  absl::MutexLock dispatch(&dispatch_mu_);
  SessionOp save;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (stop_ || it == sessions_.end()) return;
    Session& session = *it->second;
    if (!session.info.open || session.closing || !session.running.empty() ||
        !session.waiting.empty()) {
      return;  // Busy again, or closed meanwhile.
    }
    session.closing = true;
    SessionRequest request;
    request.kind = SessionOp::Kind::kSaveState;
    request.display_name = "saved when idle";
    save = OpOf(session, 0, request);
  }
  const std::string state_dir = save.dir;
  const std::string state_id = state_dir.substr(state_dir.rfind('/') + 1);
  // OpOf's answer would store a result; this save is the manager's own.
  save.done = [this, id, state_id](absl::StatusOr<SessionOpResult> saved) {
    if (!saved.ok()) {
      // Kept open (and tried again after another timeout): nothing of it
      // may be lost.
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it != sessions_.end()) {
        it->second->closing = false;
        it->second->info.last_activity_ms = NowMillis();
      }
      return;
    }
    SessionOp close;
    close.kind = SessionOp::Kind::kClose;
    close.session_id = id;
    close.done = [this, id, state_id](absl::StatusOr<SessionOpResult> r) {
      std::string tenant;
      {
        absl::MutexLock lock(&mu_);
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return;
        Session& session = *it->second;
        session.closing = false;
        if (!r.ok()) return;
        session.info.open = false;
        session.info.slot = -1;
        session.info.steps = r->steps;
        session.info.idle_state = state_id;
        tenant = session.info.tenant;
      }
      scheduler_->ReleaseSessionSlot(tenant);
    };
    trainer_->RunSessionOp(std::move(close));
  };
  trainer_->RunSessionOp(std::move(save));
}

void SessionManager::Close(const std::string& tenant, const std::string& id,
                           InfoCallback done) {
  absl::MutexLock dispatch(&dispatch_mu_);
  std::vector<ResultCallback> refused_waiting;
  std::optional<absl::StatusOr<SessionInfo>> answer_now;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> found = Find(tenant, id);
    if (!found.ok()) {
      answer_now = found.status();
    } else if ((*found)->closing) {
      answer_now = absl::FailedPreconditionError(
          absl::StrCat("session \"", id, "\" is already closing"));
    } else if (!(*found)->info.open) {
      answer_now = (*found)->info;  // Closed already: nothing to do.
    } else {
      Session& session = **found;
      session.closing = true;
      for (auto& [seq, entry] : session.waiting) {
        refused_waiting.push_back(std::move(entry.second));
      }
      session.waiting.clear();
    }
  }
  if (answer_now) {
    done(*std::move(answer_now));
    return;
  }
  const absl::Status closing = absl::FailedPreconditionError(
      absl::StrCat("session \"", id, "\" was closed before its turn"));
  for (ResultCallback& caller : refused_waiting) caller(closing);
  SessionOp op;
  op.kind = SessionOp::Kind::kClose;
  op.session_id = id;
  op.done = [this, id, tenant,
             done = std::move(done)](absl::StatusOr<SessionOpResult> r) {
    absl::StatusOr<SessionInfo> answer;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) {
        answer = NotFound(id);
      } else if (r.ok()) {
        Session& session = *it->second;
        session.info.open = false;
        session.closing = false;
        session.info.slot = -1;
        session.info.steps = r->steps;
        session.info.last_activity_ms = NowMillis();
        answer = session.info;
        release = true;
      } else {
        it->second->closing = false;
        answer = r.status();
      }
    }
    if (release) scheduler_->ReleaseSessionSlot(tenant);
    done(std::move(answer));
  };
  trainer_->RunSessionOp(std::move(op));
}

}  // namespace loraplex
