#include "server/jobs/session_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/common/status_macros.h"
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
  {
    absl::MutexLock lock(&mu_);
    sessions_[id] = std::move(session);
  }
  command.done = [this, id, tenant,
                  done = std::move(done)](absl::StatusOr<int> slot) {
    absl::StatusOr<SessionInfo> answer;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (slot.ok() && it != sessions_.end()) {
        it->second->info.open = true;
        it->second->info.slot = *slot;
        answer = it->second->info;
      } else {
        if (it != sessions_.end()) sessions_.erase(it);
        answer = slot.ok() ? absl::UnavailableError("the server is stopping")
                           : slot.status();
      }
    }
    if (!answer.ok()) scheduler_->ReleaseSessionSlot(tenant);
    done(std::move(answer));
  };
  absl::MutexLock dispatch(&dispatch_mu_);
  trainer_->OpenSession(std::move(command));
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
  op.done = [this, id, seq_id,
             kind = request.kind](absl::StatusOr<SessionOpResult> r) {
    if (!r.ok()) {
      Finish(id, seq_id, r.status());
      return;
    }
    SessionResult result;
    result.seq_id = seq_id;
    result.kind = kind;
    result.result = *std::move(r);
    Finish(id, seq_id, std::move(result));
  };
  return op;
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
    absl::StatusOr<Session*> found = Find(tenant, id);
    if (stop_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (!found.ok()) {
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
    absl::StatusOr<Session*> found = Find(tenant, id);
    if (stop_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (!found.ok()) {
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
    if (!expired.empty()) {
      mu_.Unlock();
      for (Retriever& r : expired) r.done(std::optional<SessionResult>());
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
