#include "server/grpc/job_service.h"

#include <atomic>
#include <deque>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "core/common/status_macros.h"
#include "server/edges/checkpoint_access.h"
#include "server/grpc/checkpoint_listing.h"
#include "server/grpc/job_creation.h"
#include "server/grpc/proto_convert.h"
#include "server/grpc/request_ids.h"

namespace loraplex {
namespace {

// Streams a job's stored events after a sequence number, then new ones as
// the hub announces them, and finishes after the job's terminal event. The
// hub's announcement only posts a read to the work queue: the store is never
// read under the hub's (and the scheduler's) lock.
class WatchReactor : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(const ServiceContext* context, JobEventHub* hub,
               std::string job_id, int64_t after_sequence)
      : context_(context),
        hub_(hub),
        job_id_(std::move(job_id)),
        last_sequence_(after_sequence) {
    token_ = hub_->Subscribe(job_id_, [this] { Wake(); });
    absl::MutexLock lock(&mu_);
    NextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(
          grpc::Status(grpc::StatusCode::CANCELLED, "the stream was closed"));
      return;
    }
    NextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED,
                              "the client cancelled the watch"));
  }

  void OnDone() override {
    hub_->Unsubscribe(token_);  // No Wake() runs or starts after this.
    {
      // A read posted by a Wake() still uses this reactor.
      absl::MutexLock lock(&mu_);
      while (reads_in_flight_ != 0) idle_.Wait(&mu_);
    }
    delete this;
  }

 private:
  // The hub's listener: runs under the hub's lock, so it takes no lock and
  // reads nothing. One posted read catches up with everything stored by
  // the time it runs.
  void Wake() {
    if (read_posted_.exchange(true)) return;
    ++reads_in_flight_;
    context_->work->Post([this] {
      absl::MutexLock lock(&mu_);
      read_posted_ = false;
      NextLocked();
      --reads_in_flight_;
      // Under the lock: once it is released OnDone may delete the reactor.
      idle_.SignalAll();
    });
  }

  void NextLocked() {
    if (writing_ || finished_) return;
    if (pending_.empty()) {
      absl::StatusOr<std::vector<JobEventRecord>> events =
          context_->store->ListJobEvents(job_id_, last_sequence_, 256);
      if (!events.ok()) {
        FinishLocked(ToGrpcStatus(events.status()));
        return;
      }
      pending_.assign(events->begin(), events->end());
    }
    if (!pending_.empty()) {
      const JobEventRecord& event = pending_.front();
      last_sequence_ = event.sequence;
      terminal_sent_ = terminal_sent_ ||
                       (event.status.has_value() && IsTerminal(*event.status));
      message_.Clear();
      JobEventToProto(event, &message_);
      pending_.pop_front();
      writing_ = true;
      StartWrite(&message_);
      return;
    }
    if (terminal_sent_) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    // Caught up: a watch that starts after the terminal event has nothing
    // more to wait for.
    absl::StatusOr<JobRecord> job = context_->store->GetJob("", job_id_);
    if (!job.ok()) {
      FinishLocked(ToGrpcStatus(job.status()));
      return;
    }
    if (!IsTerminal(job->status)) return;  // The hub wakes us for more.
    // The terminal update may have been stored since the read above: send
    // whatever it added before finishing.
    absl::StatusOr<std::vector<JobEventRecord>> rest =
        context_->store->ListJobEvents(job_id_, last_sequence_, 256);
    if (rest.ok() && !rest->empty()) {
      pending_.assign(rest->begin(), rest->end());
      NextLocked();
      return;
    }
    FinishLocked(ToGrpcStatus(rest.status()));
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  const ServiceContext* context_;
  JobEventHub* hub_;
  const std::string job_id_;
  int64_t token_ = 0;
  absl::Mutex mu_;
  int64_t last_sequence_ ABSL_GUARDED_BY(mu_);
  std::deque<JobEventRecord> pending_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent message_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_sent_ ABSL_GUARDED_BY(mu_) = false;
  // A Wake() posted a read that has not started; reads posted and not yet
  // finished (OnDone waits for none).
  std::atomic<bool> read_posted_{false};
  std::atomic<int> reads_in_flight_{0};
  absl::CondVar idle_;
};

// Runs `create` on a worker and finishes the call with the job it made.
template <typename Create>
void CreateOnWorker(WorkQueue* work, grpc::ServerUnaryReactor* reactor,
                    v1::Job* response, Create create) {
  work->Post([reactor, response, create = std::move(create)]() mutable {
    absl::Status status;
    try {
      absl::StatusOr<JobRecord> job = create();
      status = job.ok() ? JobToProto(*job, response) : job.status();
    } catch (const std::exception& error) {
      status = absl::InternalError(ExceptionMessage(error));
    }
    reactor->Finish(ToGrpcStatus(status));
  });
}

// The caller's tenant and the id of the job a request names ("jobs/{id}"
// in field `name`).
struct JobRef {
  std::string tenant;
  std::string id;
};

absl::StatusOr<JobRef> NamedJob(const ServiceContext& context,
                                grpc::CallbackServerContext* call,
                                const std::string& name) {
  JobRef job;
  LORAPLEX_ASSIGN_OR_RETURN(job.tenant, Authenticate(context, call));
  LORAPLEX_ASSIGN_OR_RETURN(job.id, ParseResourceName(name, "jobs", "name"));
  return job;
}

constexpr absl::string_view kEventTokenPrefix = "events-after-";

absl::Status CheckAfterSequence(int64_t after_sequence) {
  if (after_sequence >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("after_sequence must be >= 0, got ", after_sequence));
}

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::CreateJob(
    grpc::CallbackServerContext* call, const v1::CreateJobRequest* request,
    v1::Job* response) {
  // A repeat of an earlier request answers with the job that one created.
  absl::StatusOr<std::optional<JobRecord>> earlier =
      [&]() -> absl::StatusOr<std::optional<JobRecord>> {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::optional<RequestKey> key,
        RequestKeyOf(tenant, "CreateJob", request->request_id(), "request_id"));
    return EarlierJobOf(*context_, key);
  }();
  if (!earlier.ok() || earlier->has_value()) {
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    absl::Status status = earlier.status();
    if (status.ok()) status = JobToProto(**earlier, response);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  if (!request->initial_checkpoint().empty()) {
    return CreateJobFromCheckpoint(call, request, response);
  }
  absl::StatusOr<PendingJob> pending = [&]() -> absl::StatusOr<PendingJob> {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    return ValidateCreateJob(*context_, tenant, *request);
  }();
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  if (!pending.ok()) {
    reactor->Finish(ToGrpcStatus(pending.status()));
    return reactor;
  }
  CreateOnWorker(context_->work, reactor, response,
                 [this, pending = *std::move(pending)]() mutable {
                   return SubmitJob(*context_, std::move(pending));
                 });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CreateJobFromCheckpoint(
    grpc::CallbackServerContext* call, const v1::CreateJobRequest* request,
    v1::Job* response) {
  std::string tenant;
  std::string dir;
  absl::Status status = [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(tenant, Authenticate(*context_, call));
    if (!request->initial_adapter().empty()) {
      return absl::InvalidArgumentError(
          "initial_checkpoint: set either initial_adapter or "
          "initial_checkpoint, not both");
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        dir, FindCheckpoint(*context_, tenant, request->initial_checkpoint(),
                            "initial_checkpoint"));
    return absl::OkStatus();
  }();
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  // Verifying the checkpoint reads every file: a worker does it.
  CreateOnWorker(context_->work, reactor, response,
                 [this, request, tenant, dir] {
                   return loraplex::CreateJobFromCheckpoint(*context_, tenant,
                                                            *request, dir);
                 });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::PauseJob(
    grpc::CallbackServerContext* call, const v1::PauseJobRequest* request,
    v1::Job* response) {
  absl::StatusOr<JobRef> job = NamedJob(*context_, call, request->name());
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  if (!job.ok()) {
    reactor->Finish(ToGrpcStatus(job.status()));
    return reactor;
  }
  // Answered once the trainer has checkpointed and retired the job.
  context_->scheduler->Pause(
      job->tenant, job->id, [reactor, response](absl::StatusOr<JobRecord> job) {
        absl::Status status =
            job.ok() ? JobToProto(*job, response) : job.status();
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ResumeJob(
    grpc::CallbackServerContext* call, const v1::ResumeJobRequest* request,
    v1::Job* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    LORAPLEX_ASSIGN_OR_RETURN(JobRecord job,
                              context_->scheduler->Resume(ref.tenant, ref.id));
    return JobToProto(job, response);
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListCheckpoints(
    grpc::CallbackServerContext* call,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    return ListJobCheckpoints(*context_, ref.tenant, ref.id, response);
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(
    grpc::CallbackServerContext* call, const v1::DeleteJobRequest* request,
    v1::DeleteJobResponse* /*response*/) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    if (context_->scheduler->Holds(ref.id)) {
      LORAPLEX_ASSIGN_OR_RETURN(JobRecord job,
                                context_->store->GetJob(ref.tenant, ref.id));
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", ref.id, "\" is ", JobStatusName(job.status),
          IsTerminal(job.status) ? " and still leaving its slot; try again"
                                 : "; cancel it (or let it finish) before "
                                   "deleting it"));
    }
    LORAPLEX_RETURN_IF_ERROR(context_->store->DeleteJob(ref.tenant, ref.id));
    // The record is gone (durably) first: a restart finds no job whose
    // files are half removed.
    std::error_code ignored;
    std::filesystem::remove_all(context_->scheduler->CheckpointDir(ref.id),
                                ignored);
    context_->logger->Info("job ", ref.id, " (tenant ", ref.tenant,
                           "): deleted");
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(
    grpc::CallbackServerContext* call, const v1::GetJobRequest* request,
    v1::Job* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    LORAPLEX_ASSIGN_OR_RETURN(JobRecord job,
                              context_->store->GetJob(ref.tenant, ref.id));
    return JobToProto(job, response);
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(
    grpc::CallbackServerContext* call, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(int page_size, PageSize(request->page_size()));
    std::vector<JobStatus> statuses;
    for (int i = 0; i < request->statuses_size(); ++i) {
      std::optional<JobStatus> status =
          JobStatusFromProto(request->statuses(i));
      if (!status) {
        return absl::InvalidArgumentError(
            absl::StrCat("statuses[", i,
                         "] must be a job status other than "
                         "JOB_STATUS_UNSPECIFIED, got ",
                         request->statuses(i)));
      }
      statuses.push_back(*status);
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        Page<JobRecord> page,
        context_->store->ListJobs(tenant, statuses, page_size,
                                  request->page_token()));
    for (const JobRecord& job : page.items) {
      LORAPLEX_RETURN_IF_ERROR(JobToProto(job, response->add_jobs()));
    }
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(
    grpc::CallbackServerContext* call, const v1::CancelJobRequest* request,
    v1::Job* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    LORAPLEX_ASSIGN_OR_RETURN(
        JobRecord job, context_->scheduler->Cancel(ref.tenant, ref.id,
                                                   "cancelled by CancelJob"));
    return JobToProto(job, response);
  });
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* call, const v1::WatchJobRequest* request) {
  std::string id;
  absl::Status status = [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef job,
                              NamedJob(*context_, call, request->name()));
    id = job.id;
    LORAPLEX_RETURN_IF_ERROR(CheckAfterSequence(request->after_sequence()));
    return context_->store->GetJob(job.tenant, id).status();
  }();
  if (!status.ok()) {
    // A reactor that only reports the error.
    class Failed : public grpc::ServerWriteReactor<v1::JobEvent> {
     public:
      explicit Failed(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    return new Failed(ToGrpcStatus(status));
  }
  return new WatchReactor(context_, hub_, std::move(id),
                          request->after_sequence());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobEvents(
    grpc::CallbackServerContext* call, const v1::ListJobEventsRequest* request,
    v1::ListJobEventsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(JobRef ref,
                              NamedJob(*context_, call, request->name()));
    LORAPLEX_ASSIGN_OR_RETURN(int page_size, PageSize(request->page_size()));
    LORAPLEX_RETURN_IF_ERROR(CheckAfterSequence(request->after_sequence()));
    LORAPLEX_RETURN_IF_ERROR(
        context_->store->GetJob(ref.tenant, ref.id).status());
    int64_t after = request->after_sequence();
    if (!request->page_token().empty()) {
      absl::string_view token = request->page_token();
      if (!absl::ConsumePrefix(&token, kEventTokenPrefix) ||
          !absl::SimpleAtoi(token, &after) || after < 0) {
        return absl::InvalidArgumentError(
            "page_token is not a token from ListJobEvents");
      }
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        std::vector<JobEventRecord> events,
        context_->store->ListJobEvents(ref.id, after, page_size + 1));
    const bool more = static_cast<int>(events.size()) > page_size;
    if (more) events.resize(page_size);
    for (const JobEventRecord& event : events) {
      JobEventToProto(event, response->add_events());
    }
    if (more) {
      response->set_next_page_token(
          absl::StrCat(kEventTokenPrefix, events.back().sequence));
    }
    return absl::OkStatus();
  });
}

}  // namespace loraplex
