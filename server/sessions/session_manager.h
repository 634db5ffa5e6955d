// Training sessions between the API and the trainer (docs/DESIGN.md §12): who
// owns which session, each session's operations in seq_id order, the
// results kept for repeated seq_ids and RetrieveResult, and the slot each
// open session reserves with the scheduler. No LibTorch here.
//
//   SessionManager sessions(&scheduler, &trainer, &store, options);
//   sessions.Create(tenant, spec, [](absl::StatusOr<SessionInfo> s) {...});
//   sessions.Submit(tenant, id, seq_id, std::move(request),
//                   [](absl::StatusOr<SessionResult> r) {...});
//
// A session's operations reach the trainer in seq_id order: one that
// arrives ahead of its turn waits (at most max_ahead), a repeated seq_id
// gets the first one's result (stored or, while it runs, when it ends).
// Results are kept, waited for and long-polled in a ResultHub
// (server/results/result_hub.h), keyed by (session id, seq_id).
// Callbacks run on a trainer's thread, a timer thread or the caller's;
// they must return quickly.
//
// Each session's lifecycle (SessionState: opening, open, closing, closed,
// with the reason) and its progress (steps, the next seq_id) are written to
// the store before a caller hears of them, off the trainer's thread. The
// trainer checkpoints an open session's state every few optimizer steps and
// at shutdown (TrainerOptions::session_checkpoint_interval); Restore(), at
// start-up, opens every session that was open again from its newest
// checkpoint, so a client carries on through a restart: after SIGTERM
// nothing is lost, after a crash what the session did since its newest
// checkpoint (the gradients of forward_backward calls since then, and any
// optimizer steps between checkpoints), while operations already applied
// are never applied twice. Thread-safe.
#ifndef LORAPLEX_SERVER_SESSIONS_SESSION_MANAGER_H_
#define LORAPLEX_SERVER_SESSIONS_SESSION_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/lora/lora_config.h"
#include "core/optim/optimizer_config.h"
#include "core/train/loss_fn.h"
#include "server/common/logger.h"
#include "server/common/work_queue.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/job_trainer.h"
#include "server/results/result_hub.h"
#include "server/store/job_store.h"

namespace loraplex {

struct SessionSpec {
  std::string display_name;
  LoraConfig lora;  // Validated.
  OptimizerConfig optimizer;
  uint64_t seed = 0;
  // Start from this saved state (SessionManager::StateSpec gives its
  // config): its weights, with_optimizer its optimizer state and steps.
  std::string from_state;
  bool with_optimizer = false;
};

struct SessionInfo {
  std::string id;
  std::string tenant;
  SessionSpec spec;
  SessionState state = SessionState::kOpening;
  std::string reason;  // How it reached `state` (kClosed: how it ended).
  int slot = -1;
  int64_t steps = 0;
  int64_t next_seq_id = 1;  // The next operation taken for the trainer.
  // The newest operation that finished (not abandoned by a shutdown): a
  // restart continues after it (the store's next_seq_id).
  int64_t finished_seq_id = 0;
  // Operations before this one were applied before the last restart (their
  // results are not kept across it); 0: no restart.
  int64_t restored_seq_id = 0;
  int slot_before_restart = -1;  // Restore's preferred slot.
  int64_t create_time_ms = 0;
  int64_t last_activity_ms = 0;
  // Closed after idle_timeout without a call: the state saved then.
  std::string idle_state;

  bool open() const { return state == SessionState::kOpen; }
};

// This step's hyperparameters; unset ones are the session's.
struct OptimStepParams {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, momentum,
      lion_beta1, lion_beta2, soap_beta1, soap_beta2, shampoo_beta,
      max_update_rms;
  std::optional<int> precondition_frequency, power_iter_steps;
  std::optional<bool> use_eigh;
  // Refused unless the session's: it shapes the optimizer state.
  std::optional<int> max_precond_dim;
  double grad_clip = 0.0;
};

// One ordered operation, validated at the edge (kClose is CloseSession's).
struct SessionRequest {
  SessionOp::Kind kind = SessionOp::Kind::kForwardBackward;
  std::shared_ptr<const std::vector<Datum>> data;
  LossFnSpec loss;
  OptimStepParams step;
  std::string display_name;  // kSaveWeights, kSaveState.
  std::string state;         // kLoadState: the state's id.
  bool with_optimizer = false;
};

struct SessionResult {
  int64_t seq_id = 0;
  SessionOp::Kind kind = SessionOp::Kind::kForwardBackward;
  SessionOpResult result;
  std::string adapter_id;  // kSaveWeights.
  std::string state_id;    // kSaveState.
};

struct SessionManagerOptions {
  // Results kept per session for repeated seq_ids and RetrieveResult.
  int64_t results_kept = 256;
  // How far past the next seq_id an operation may arrive.
  int64_t max_ahead = 64;
  // Longest RetrieveResult wait.
  std::chrono::milliseconds max_wait{30000};
  // base_model_name_or_path of the adapters sessions save.
  std::string base_model;
  // Saved states go to <states_dir>/<state id>/.
  std::string states_dir;
  // An open session with no call for this long is saved (SaveState) and
  // closed, freeing its slot; 0: never.
  std::chrono::milliseconds idle_timeout{0};
  // Where the trainer writes session checkpoints
  // (TrainerOptions::session_checkpoint_root); Restore() continues from
  // them.
  std::string checkpoint_root;
  Logger* logger = nullptr;  // Store failures; null: not logged.
};

class SessionManager {
 public:
  using ResultCallback = std::function<void(absl::StatusOr<SessionResult>)>;
  using InfoCallback = std::function<void(absl::StatusOr<SessionInfo>)>;

  SessionManager(JobScheduler* scheduler, JobTrainer* trainer, JobStore* store,
                 const SessionManagerOptions& options);
  ~SessionManager();  // Stop()s.
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  // Opens again, from their newest checkpoints, the sessions the store
  // says were open when the server stopped, and closes (with the reason)
  // those caught opening or closing then. Slots are reserved with the
  // scheduler first, so call it before queued jobs take them (from
  // JobScheduler::Start's `first`). Waits until each is open or closed.
  absl::Status Restore();

  // Answers UNAVAILABLE every operation still waiting for its turn and
  // every RetrieveResult waiting, and refuses new ones, so that a server
  // shutting down has no call left waiting (those the trainer runs finish
  // as it does). Idempotent.
  void Stop();
  // Waits until every store write queued so far (and the answers behind
  // them) is done: after the trainer stops, before what those answers reach
  // (the Tinker API, gRPC reactors) goes.
  void Drain();

  // Opens a session for `tenant` in a free slot: RESOURCE_EXHAUSTED when
  // none is free within the tenant's quota, or the trainer's error.
  void Create(const std::string& tenant, SessionSpec spec, InfoCallback done);
  // The spec of a new session from `tenant`'s saved state `state_id`:
  // its LoRA and optimizer configs and seed. NOT_FOUND for another
  // tenant's state or an unknown one. Reads a small file.
  absl::StatusOr<SessionSpec> StateSpec(const std::string& tenant,
                                        const std::string& state_id) const;

  // NOT_FOUND for another tenant's session or an unknown one.
  absl::StatusOr<SessionInfo> Get(const std::string& tenant,
                                  const std::string& id) const;
  std::vector<SessionInfo> List(const std::string& tenant) const;
  // Applies `request` as operation `seq_id` of the session, in order.
  // INVALID_ARGUMENT for seq_id < 1 or a step whose hyperparameters do not
  // validate; FAILED_PRECONDITION for a closed session, a seq_id too far
  // ahead, or one whose result is no longer kept.
  void Submit(const std::string& tenant, const std::string& id, int64_t seq_id,
              SessionRequest request, ResultCallback done);
  // The result of operation `seq_id`, waiting at most `wait` (capped at
  // max_wait); std::nullopt when it has not finished by then. NOT_FOUND
  // when no operation `seq_id` was sent.
  void Retrieve(
      const std::string& tenant, const std::string& id, int64_t seq_id,
      std::chrono::milliseconds wait,
      std::function<void(absl::StatusOr<std::optional<SessionResult>>)> done);
  // Closes the session after the operations already applied or running;
  // the ones waiting for their turn are refused.
  void Close(const std::string& tenant, const std::string& id,
             InfoCallback done);

 private:
  using Outcome = absl::StatusOr<SessionResult>;
  struct Session {
    SessionInfo info;  // info.state is its lifecycle.
    // Arrived ahead of their turn, by seq_id (their callers wait in
    // results_).
    std::map<int64_t, SessionRequest> waiting;
    // Sent to the trainer, not finished.
    std::set<int64_t> running;
  };
  // An operation ready for the trainer, sent once mu_ is released.
  struct Ready {
    std::string session_id;
    int64_t seq_id = 0;
    SessionOp op;
  };

  absl::StatusOr<Session*> Find(const std::string& tenant,
                                const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Find, or UNAVAILABLE once stopped.
  absl::StatusOr<Session*> FindLive(const std::string& tenant,
                                    const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Session*> Find(const std::string& tenant,
                                      const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT unless the state `request` loads fits the session
  // (NOT_FOUND for another tenant's or an unknown one).
  absl::Status CheckStateFits(const Session& session,
                              const SessionRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the operations whose turn has come into `ready`.
  void TakeReady(Session& session, std::vector<Ready>& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionOp OpOf(const Session& session, int64_t seq_id,
                 const SessionRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `ready` to the trainer in order (dispatch_mu_ held, mu_ not).
  void Send(std::vector<Ready> ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dispatch_mu_);
  void Finish(const std::string& session_id, int64_t seq_id, Outcome outcome);
  // FAILED_PRECONDITION for a repeat of `seq_id` whose result is gone.
  absl::Status NoLongerKept(const SessionInfo& info, int64_t seq_id) const;
  // Takes the operations waiting for their turn out of `session`, for
  // FinishAll to refuse.
  std::vector<int64_t> DropWaiting(Session& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAll(const std::string& session_id,
                 const std::vector<int64_t>& seq_ids,
                 const absl::Status& status);
  // Has `done` called with the result of operation `seq_id` when it ends.
  void AwaitResult(const std::string& session_id, int64_t seq_id,
                   ResultCallback done);
  void RunTimer();
  // The session's last call is now: when its answer goes out (after the
  // store write), so a slow write does not count toward its idle time.
  void StampActivity(const std::string& id);
  // Saves and closes the session if it is still idle (timer thread).
  void CloseIdle(const std::string& id);
  // Moves the session to `state` for `reason` when its lifecycle allows
  // the change (session_lifecycle.h); Persist() writes it. A change the
  // table refuses is a bug: INTERNAL and logged, `info` left as it was,
  // and the caller stores nothing.
  absl::Status SetState(SessionInfo& info, SessionState state,
                        std::string reason) const;
  // Writes the session's record to the store on the store writer's thread,
  // then runs `then` (answers wait for the write). Called in the order the
  // changes happen, with mu_ held.
  void Persist(const SessionInfo& info, std::function<void()> then = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens session `id` (in sessions_, opening) in a slot the scheduler
  // reserved for it: from the session checkpoint `restore_dir` when set,
  // else a fresh adapter with its spec's from_state loaded. `opened` gets
  // the session's step count, or the error once the slot is released.
  void OpenInTrainer(const std::string& id, const std::string& restore_dir,
                     std::function<void(absl::StatusOr<int64_t>)> opened);
  // Opens the session `record` describes again (Restore).
  void RestoreOne(const SessionRecord& record, std::function<void()> restored);

  JobScheduler* scheduler_;
  JobTrainer* trainer_;
  JobStore* store_;
  SessionManagerOptions options_;
  // Operations' results by (session id, seq_id): the newest results_kept
  // of each session.
  ResultHub<Outcome> results_;

  // Held while operations are handed to the trainer, so that they reach it
  // in the order they were taken. Taken before mu_, never inside it.
  absl::Mutex dispatch_mu_;
  mutable absl::Mutex mu_;
  absl::CondVar timer_wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
  std::thread timer_;
  // The store writes, in order, off the trainer's thread. Last: it is
  // destroyed (and drained) first.
  WorkQueue store_writer_{1};
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_SESSIONS_SESSION_MANAGER_H_
