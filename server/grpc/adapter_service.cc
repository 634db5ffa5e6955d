#include "server/grpc/adapter_service.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adapters/peft_files.h"
#include "core/common/atomic_file.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/common/clock.h"
#include "server/edges/checkpoint_access.h"
#include "server/grpc/job_creation.h"
#include "server/grpc/proto_convert.h"
#include "server/grpc/request_ids.h"
#include "server/grpc/staged_adapter.h"
#include "server/jobs/resource_id.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

constexpr size_t kExportChunkBytes = size_t{1} << 20;

// Sends the files of an adapter directory, each in chunks. A temporary
// directory (a running job's snapshot) is removed when the call ends.
//
// For a running job the trainer writes the snapshot and Begin runs later,
// possibly after the call was cancelled and OnDone ran: the reactor then
// has two owners (gRPC until OnDone, the pending snapshot until Begin), and
// the last one to let go deletes it.
class ExportReactor : public grpc::ServerWriteReactor<v1::ExportAdapterChunk> {
 public:
  ExportReactor() = default;

  // One more owner, released by the Release() that follows Begin().
  void Retain() { ++owners_; }
  void Release() {
    if (--owners_ > 0) return;
    if (temporary_) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
    }
    delete this;
  }

  // Starts streaming `dir`, or finishes with `status` when it is an error.
  void Begin(const absl::Status& status, std::string dir, bool temporary) {
    absl::MutexLock lock(&mu_);
    dir_ = std::move(dir);
    temporary_ = temporary;
    if (finished_) return;  // Cancelled while the snapshot was written.
    if (!status.ok()) {
      FinishLocked(ToGrpcStatus(status));
      return;
    }
    for (const char* name : {kPeftConfigFile, kPeftWeightsFile}) {
      absl::StatusOr<std::string> read =
          ReadFile(absl::StrCat(dir_, "/", name));
      if (!read.ok()) {
        FinishLocked(
            ToGrpcStatus(absl::InternalError(read.status().message())));
        return;
      }
      const std::string contents = *std::move(read);
      size_t offset = 0;
      do {
        v1::ExportAdapterChunk chunk;
        if (offset == 0) {
          chunk.set_file_name(name);
          chunk.set_file_size(static_cast<int64_t>(contents.size()));
        }
        const size_t n = std::min(kExportChunkBytes, contents.size() - offset);
        chunk.set_data(contents.substr(offset, n));
        offset += n;
        chunks_.push_back(std::move(chunk));
      } while (offset < contents.size());
    }
    Next();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
      return;
    }
    Next();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(
        grpc::Status(grpc::StatusCode::CANCELLED, "the export was cancelled"));
  }

  void OnDone() override { Release(); }

 private:
  void Next() {
    if (finished_) return;
    if (next_ == chunks_.size()) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    StartWrite(&chunks_[next_++]);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  std::atomic<int> owners_{1};
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string dir_ ABSL_GUARDED_BY(mu_);
  bool temporary_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::ExportAdapterChunk> chunks_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// The adapter directory of a job that has just left its slot, once the
// scheduler has stored its end (waited for up to a minute); its error when
// it did not succeed.
absl::StatusOr<std::string> FinishedJobAdapterDir(const ServiceContext& context,
                                                  const std::string& job_id) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  for (;;) {
    LORAPLEX_ASSIGN_OR_RETURN(JobRecord job, context.store->GetJob("", job_id));
    if (job.status == JobStatus::kSucceeded && !job.adapter_id.empty()) {
      return context.scheduler->AdapterDir(job.adapter_id);
    }
    if (job.status != JobStatus::kRunning || absl::Now() > deadline) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job_id, "\" is ", JobStatusName(job.status),
          ": only a running training job or a succeeded one has an adapter "
          "to export"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace

grpc::ServerUnaryReactor* AdapterServiceImpl::AttachAdapter(
    grpc::CallbackServerContext* call, const v1::AttachAdapterRequest* request,
    v1::AttachAdapterResponse* response) {
  absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
  absl::Status status = tenant.status();
  if (status.ok()) {
    status = CheckDisplayName(request->display_name(), "display_name");
  }
  if (status.ok() &&
      request->source_case() == v1::AttachAdapterRequest::SOURCE_NOT_SET) {
    status = absl::InvalidArgumentError(
        "source is required: set adapter (a stored adapter's name) or files "
        "(a PEFT adapter to upload)");
  }
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  // Storing an upload reads and checks its tensors: a worker does it.
  context_->work->Post([this, reactor, request, response, tenant = *tenant] {
    absl::Status status;
    try {
      status = Attach(tenant, *request, response);
    } catch (const std::exception& error) {
      status = absl::InternalError(ExceptionMessage(error));
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

absl::Status AdapterServiceImpl::Attach(const std::string& tenant,
                                        const v1::AttachAdapterRequest& request,
                                        v1::AttachAdapterResponse* response) {
  LORAPLEX_ASSIGN_OR_RETURN(
      std::optional<RequestKey> key,
      !request.request_id().empty()
          ? RequestKeyOf(tenant, "AttachAdapter", request.request_id(),
                         "request_id")
          : RequestKeyOf(tenant, "AttachAdapter", request.job().request_id(),
                         "job.request_id"));
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<JobRecord> earlier,
                            EarlierJobOf(*context_, key));
  if (earlier) {
    // A repeat: the adapter and job the first request created.
    LORAPLEX_ASSIGN_OR_RETURN(
        AdapterRecord first,
        context_->store->GetAdapter(tenant, earlier->initial_adapter_id));
    LORAPLEX_RETURN_IF_ERROR(
        AdapterToProto(first, response->mutable_adapter()));
    return JobToProto(*earlier, response->mutable_job());
  }
  std::unique_ptr<StagedAdapter> upload;
  AdapterRecord adapter;
  if (request.has_files()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        upload,
        StagedAdapter::Create(*context_, tenant, request.display_name(),
                              request.files().adapter_config_json(),
                              request.files().adapter_model_safetensors()));
    adapter = upload->record();
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string id,
        ParseResourceName(request.adapter(), "adapters", "adapter"));
    LORAPLEX_ASSIGN_OR_RETURN(adapter, context_->store->GetAdapter(tenant, id));
  }
  // The job is checked before an upload is stored, so a bad job request
  // leaves nothing behind.
  absl::StatusOr<PendingJob> pending =
      ValidateCreateJob(*context_, tenant, request.job(), &adapter);
  if (!pending.ok()) {
    return absl::Status(pending.status().code(),
                        absl::StrCat("job.", pending.status().message()));
  }
  pending->request = key;
  // An upload is stored only for a job that is queued.
  LORAPLEX_ASSIGN_OR_RETURN(
      JobRecord job, SubmitJob(*context_, *std::move(pending), upload.get()));
  if (job.initial_adapter_id != adapter.id) {
    // A repeat that ran alongside the first: the first's adapter answers.
    LORAPLEX_ASSIGN_OR_RETURN(
        adapter, context_->store->GetAdapter(tenant, job.initial_adapter_id));
  }
  LORAPLEX_RETURN_IF_ERROR(
      AdapterToProto(adapter, response->mutable_adapter()));
  return JobToProto(job, response->mutable_job());
}

grpc::ServerUnaryReactor* AdapterServiceImpl::RetireAdapter(
    grpc::CallbackServerContext* call, const v1::RetireAdapterRequest* request,
    v1::RetireAdapterResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(std::string id,
                              ParseResourceName(request->job(), "jobs", "job"));
    LORAPLEX_ASSIGN_OR_RETURN(JobRecord stored,
                              context_->store->GetJob(tenant, id));
    if (stored.status != JobStatus::kRunning) {
      return absl::FailedPreconditionError(
          absl::StrCat("job \"", id, "\" is ", JobStatusName(stored.status),
                       ", not in a slot (CancelJob stops a queued job)"));
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        JobRecord job,
        context_->scheduler->Cancel(tenant, id, "retired by RetireAdapter"));
    return JobToProto(job, response->mutable_job());
  });
}

grpc::ServerWriteReactor<v1::ExportAdapterChunk>*
AdapterServiceImpl::ExportAdapter(grpc::CallbackServerContext* call,
                                  const v1::ExportAdapterRequest* request) {
  auto* reactor = new ExportReactor();
  std::string dir;
  std::string running_job_id;  // Set when the export is a running snapshot.
  bool checkpoint = false;
  absl::Status status = [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    if (request->has_checkpoint()) {
      LORAPLEX_ASSIGN_OR_RETURN(
          dir, FindCheckpoint(*context_, tenant, request->checkpoint(),
                              "checkpoint"));
      checkpoint = true;
      return absl::OkStatus();
    }
    if (request->has_adapter()) {
      LORAPLEX_ASSIGN_OR_RETURN(
          dir,
          FindStoredAdapter(*context_, tenant, request->adapter(), "adapter"));
      return absl::OkStatus();
    }
    if (!request->has_job()) {
      return absl::InvalidArgumentError(
          "source is required: set job, adapter or checkpoint");
    }
    LORAPLEX_ASSIGN_OR_RETURN(JobWeights weights,
                              FindJobWeights(*context_, tenant, request->job(),
                                             "an adapter to export"));
    if (!weights.running_job_id.empty()) {
      // A running job: the trainer writes a snapshot between two steps.
      dir = absl::StrCat(context_->state_dir, "/tmp/", NewResourceId("export"));
      running_job_id = weights.running_job_id;
    } else {
      dir = weights.dir;
    }
    return absl::OkStatus();
  }();
  if (!status.ok() || running_job_id.empty()) {
    reactor->Retain();
    context_->work->Post([reactor, status, dir, checkpoint] {
      // A checkpoint is exported only when all of it verifies.
      reactor->Begin(status.ok() && checkpoint
                         ? CheckCheckpoint(dir, "checkpoint")
                         : status,
                     dir, /*temporary=*/false);
      reactor->Release();
    });
    return reactor;
  }
  reactor->Retain();
  WorkQueue* work = context_->work;
  const ServiceContext* context = context_;
  // Reading the files is left to a worker, not the trainer thread.
  context_->scheduler->ExportRunning(
      running_job_id, dir,
      [reactor, dir, work, context, running_job_id](absl::Status exported) {
        work->Post([reactor, dir, exported, context, running_job_id] {
          if (absl::IsNotFound(exported)) {
            // The job left its slot between the lookup and the trainer's
            // turn: once its end is stored, its trained adapter (or why
            // there is none) answers.
            absl::StatusOr<std::string> final_dir =
                FinishedJobAdapterDir(*context, running_job_id);
            reactor->Begin(final_dir.status(),
                           final_dir.ok() ? *final_dir : dir,
                           /*temporary=*/!final_dir.ok());
          } else {
            reactor->Begin(exported, dir, /*temporary=*/true);
          }
          reactor->Release();
        });
      });
  return reactor;
}

grpc::ServerUnaryReactor* AdapterServiceImpl::DeleteAdapter(
    grpc::CallbackServerContext* call, const v1::DeleteAdapterRequest* request,
    v1::DeleteAdapterResponse* /*response*/) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string id, ParseResourceName(request->name(), "adapters", "name"));
    LORAPLEX_RETURN_IF_ERROR(context_->store->DeleteAdapter(tenant, id));
    std::error_code ignored;
    std::filesystem::remove_all(context_->scheduler->AdapterDir(id), ignored);
    context_->logger->Info("adapter ", id, " (tenant ", tenant, "): deleted");
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdapterServiceImpl::GetAdapter(
    grpc::CallbackServerContext* call, const v1::GetAdapterRequest* request,
    v1::Adapter* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string id, ParseResourceName(request->name(), "adapters", "name"));
    LORAPLEX_ASSIGN_OR_RETURN(AdapterRecord adapter,
                              context_->store->GetAdapter(tenant, id));
    return AdapterToProto(adapter, response);
  });
}

grpc::ServerUnaryReactor* AdapterServiceImpl::ListAdapters(
    grpc::CallbackServerContext* call, const v1::ListAdaptersRequest* request,
    v1::ListAdaptersResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(int page_size, PageSize(request->page_size()));
    LORAPLEX_ASSIGN_OR_RETURN(Page<AdapterRecord> page,
                              context_->store->ListAdapters(
                                  tenant, page_size, request->page_token()));
    for (const AdapterRecord& adapter : page.items) {
      LORAPLEX_RETURN_IF_ERROR(
          AdapterToProto(adapter, response->add_adapters()));
    }
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdapterServiceImpl::ListSlots(
    grpc::CallbackServerContext* call, const v1::ListSlotsRequest* /*request*/,
    v1::ListSlotsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    const std::vector<SlotInfo> slots = context_->scheduler->Slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      const SlotInfo& info = slots[i];
      v1::Slot* slot = response->add_slots();
      slot->set_index(static_cast<int>(i));
      slot->set_state(info.attached ? v1::SLOT_STATE_ATTACHED
                                    : v1::SLOT_STATE_FREE);
      // Another tenant's slot shows only that it is taken.
      if (!info.attached || info.tenant != tenant) continue;
      if (info.session_id.empty()) {
        slot->set_job(FormatResourceName(kJobs, info.job_id));
      } else {
        slot->set_session(FormatResourceName(kSessions, info.session_id));
      }
      slot->set_rank(info.rank);
      v1::OptimizerFamily family = v1::OPTIMIZER_FAMILY_UNSPECIFIED;
      if (v1::OptimizerFamily_Parse(
              absl::StrCat("OPTIMIZER_FAMILY_",
                           absl::AsciiStrToUpper(info.family)),
              &family)) {
        slot->set_family(family);
      }
      slot->set_step(info.step);
      slot->set_total_steps(info.total_steps);
      slot->set_lr(info.lr);
    }
    return absl::OkStatus();
  });
}

}  // namespace loraplex
