// An in-process stand-in for loraplex-server for client and CLI tests: it
// answers every loraplex.v1 RPC from canned data set by the test and
// records what it received.
//
//   FakeLoraplexServer server;
//   server.state().job.set_name("jobs/j1");
//   ClientOptions options;
//   options.address = server.address();
//   auto client = LoraplexClient::Connect(options);
//   EXPECT_EQ(server.state().created_jobs.size(), 1);
#ifndef LORAPLEX_TESTS_CLIENT_FAKE_LORAPLEX_SERVER_H_
#define LORAPLEX_TESTS_CLIENT_FAKE_LORAPLEX_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loraplex/v1/adapters.grpc.pb.h"
#include "loraplex/v1/datasets.grpc.pb.h"
#include "loraplex/v1/jobs.grpc.pb.h"
#include "loraplex/v1/server.grpc.pb.h"

namespace loraplex {

// Canned answers and recorded requests. Lock `mu` when the server may be
// serving.
struct FakeServerState {
  std::mutex mu;
  // When set, calls without "authorization: Bearer <token>" fail
  // UNAUTHENTICATED.
  std::string required_token;
  // Metadata "authorization" of each call, in order.
  std::vector<std::string> authorizations;

  v1::ServerInfo info;
  // Upload: sizes of each message after the header, the header's display
  // name, and all bytes.
  std::vector<size_t> upload_chunk_sizes;
  std::string upload_display_name;
  std::string upload_bytes;
  bool upload_saw_header_first = false;
  // Every upload's header; the first `upload_failures` uploads are then
  // answered UNAVAILABLE (each upload starts the bytes afresh).
  std::vector<v1::UploadDatasetHeader> upload_headers;
  int upload_failures = 0;
  // Items of the List RPCs, served `page_size` at a time (tokens are the
  // next index).
  std::vector<v1::Dataset> datasets;
  std::vector<v1::Job> jobs;
  std::vector<v1::Adapter> adapters;
  int page_size = 2;
  // When set, every List answer carries it as next_page_token (a server
  // that pages forever).
  std::string stuck_page_token;
  std::vector<v1::ListJobsRequest> list_jobs_requests;

  // GetJob / CreateJob / CancelJob answer with `job`.
  v1::Job job;
  std::vector<v1::CreateJobRequest> created_jobs;
  // The first `create_failures` CreateJob calls fail with this code.
  int create_failures = 0;
  grpc::StatusCode create_failure_code = grpc::StatusCode::UNAVAILABLE;
  std::vector<std::string> deleted_datasets;
  // PauseJob answers with `job` in `pause_outcome` (PAUSED, or the status
  // of a job that finished first), ResumeJob with `job` QUEUED, unless
  // their status is set; the names they were sent are recorded.
  std::vector<std::string> paused_jobs;
  std::vector<std::string> resumed_jobs;
  v1::JobStatus pause_outcome = v1::JOB_STATUS_PAUSED;
  grpc::Status pause_status = grpc::Status::OK;
  grpc::Status resume_status = grpc::Status::OK;
  // ListCheckpoints answers with these unless `list_checkpoints_status` is
  // set; the names it was sent are recorded.
  std::vector<v1::Checkpoint> checkpoints;
  std::vector<std::string> list_checkpoints_names;
  grpc::Status list_checkpoints_status = grpc::Status::OK;
  // WatchJob sends these (after the requested sequence), `event_delay`
  // apart.
  std::vector<v1::JobEvent> events;
  std::chrono::milliseconds event_delay{0};
  std::vector<int64_t> watch_after_sequences;
  // When > 0, a watch ends (OK) after this many events, like a broken
  // stream.
  int max_events_per_watch = 0;
  // After its events, a watch stays open until the client cancels it.
  bool hold_watch_open = false;
  // GetJob and WatchJob of an unknown job wait this long before NOT_FOUND.
  std::chrono::milliseconds not_found_delay{0};
  // ExportAdapter sends these chunks; its requests are recorded.
  std::vector<v1::ExportAdapterChunk> export_chunks;
  std::vector<v1::ExportAdapterRequest> export_requests;
  // When not OK, ExportAdapter of a job fails with it.
  grpc::Status export_job_status = grpc::Status::OK;
  // When not OK, ExportAdapter of a checkpoint fails with it.
  grpc::Status export_checkpoint_status = grpc::Status::OK;
  std::vector<v1::AttachAdapterRequest> attach_requests;
  // AttachAdapter waits this long before answering.
  std::chrono::milliseconds attach_delay{0};
};

class FakeLoraplexServer {
 public:
  FakeLoraplexServer()
      : server_service_(&state_),
        dataset_service_(&state_),
        job_service_(&state_),
        adapter_service_(&state_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&server_service_);
    builder.RegisterService(&dataset_service_);
    builder.RegisterService(&job_service_);
    builder.RegisterService(&adapter_service_);
    server_ = builder.BuildAndStart();
  }
  // Calls still open after a moment (e.g. a held watch) are cancelled.
  ~FakeLoraplexServer() {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeServerState& state() { return state_; }

 private:
  // Records the authorization metadata; the error when a token is
  // required and missing.
  static grpc::Status CheckAuth(FakeServerState* state,
                                grpc::ServerContext* context) {
    std::lock_guard<std::mutex> lock(state->mu);
    std::string authorization;
    auto it = context->client_metadata().find("authorization");
    if (it != context->client_metadata().end()) {
      authorization = std::string(it->second.data(), it->second.size());
    }
    state->authorizations.push_back(authorization);
    if (!state->required_token.empty() &&
        authorization != "Bearer " + state->required_token) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong bearer token");
    }
    return grpc::Status::OK;
  }

  // One page of `items` from `token` (the start index).
  template <typename Item, typename Items>
  static std::string Page(const std::vector<Item>& items, int page_size,
                          const std::string& token, Items* out) {
    size_t start = token.empty() ? 0 : std::stoul(token);
    size_t end = std::min(items.size(), start + static_cast<size_t>(page_size));
    for (size_t i = start; i < end; ++i) *out->Add() = items[i];
    return end < items.size() ? std::to_string(end) : "";
  }

  // The next_page_token to answer with: `next`, or the stuck token.
  static std::string NextToken(const FakeServerState& state, std::string next) {
    return state.stuck_page_token.empty() ? next : state.stuck_page_token;
  }

  // NOT_FOUND for `name`, after the configured delay.
  static grpc::Status JobNotFound(FakeServerState* state,
                                  const std::string& name) {
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      delay = state->not_found_delay;
    }
    std::this_thread::sleep_for(delay);
    return grpc::Status(grpc::StatusCode::NOT_FOUND, name + " not found");
  }

  class ServerServiceImpl : public v1::ServerService::Service {
   public:
    explicit ServerServiceImpl(FakeServerState* state) : state_(state) {}
    grpc::Status GetServerInfo(grpc::ServerContext* context,
                               const v1::GetServerInfoRequest*,
                               v1::ServerInfo* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      *response = state_->info;
      return grpc::Status::OK;
    }

   private:
    FakeServerState* state_;
  };

  class DatasetServiceImpl : public v1::DatasetService::Service {
   public:
    explicit DatasetServiceImpl(FakeServerState* state) : state_(state) {}
    grpc::Status UploadDataset(
        grpc::ServerContext* context,
        grpc::ServerReader<v1::UploadDatasetRequest>* reader,
        v1::Dataset* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      v1::UploadDatasetRequest part;
      bool first = true;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->upload_chunk_sizes.clear();
      state_->upload_bytes.clear();
      while (reader->Read(&part)) {
        if (first) {
          state_->upload_saw_header_first = part.has_header();
          state_->upload_display_name = part.header().display_name();
          state_->upload_headers.push_back(part.header());
          first = false;
          continue;
        }
        state_->upload_chunk_sizes.push_back(part.chunk().size());
        state_->upload_bytes += part.chunk();
      }
      if (state_->upload_failures > 0) {
        --state_->upload_failures;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "try again");
      }
      response->set_name("datasets/d1");
      response->set_display_name(state_->upload_display_name);
      response->set_size_bytes(
          static_cast<int64_t>(state_->upload_bytes.size()));
      response->set_num_examples(3);
      return grpc::Status::OK;
    }
    grpc::Status GetDataset(grpc::ServerContext* context,
                            const v1::GetDatasetRequest* request,
                            v1::Dataset* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      for (const v1::Dataset& dataset : state_->datasets) {
        if (dataset.name() == request->name()) {
          *response = dataset;
          return grpc::Status::OK;
        }
      }
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          request->name() + " not found");
    }
    grpc::Status ListDatasets(grpc::ServerContext* context,
                              const v1::ListDatasetsRequest* request,
                              v1::ListDatasetsResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      response->set_next_page_token(NextToken(
          *state_, Page(state_->datasets, state_->page_size,
                        request->page_token(), response->mutable_datasets())));
      return grpc::Status::OK;
    }
    grpc::Status DeleteDataset(grpc::ServerContext* context,
                               const v1::DeleteDatasetRequest* request,
                               v1::DeleteDatasetResponse*) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->deleted_datasets.push_back(request->name());
      return grpc::Status::OK;
    }

   private:
    FakeServerState* state_;
  };

  class JobServiceImpl : public v1::JobService::Service {
   public:
    explicit JobServiceImpl(FakeServerState* state) : state_(state) {}
    grpc::Status CreateJob(grpc::ServerContext* context,
                           const v1::CreateJobRequest* request,
                           v1::Job* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->created_jobs.push_back(*request);
      if (state_->create_failures > 0) {
        --state_->create_failures;
        return grpc::Status(state_->create_failure_code, "injected");
      }
      *response = state_->job;
      return grpc::Status::OK;
    }
    grpc::Status GetJob(grpc::ServerContext* context,
                        const v1::GetJobRequest* request,
                        v1::Job* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        if (request->name() == state_->job.name()) {
          *response = state_->job;
          return grpc::Status::OK;
        }
      }
      return JobNotFound(state_, request->name());
      return grpc::Status::OK;
    }
    grpc::Status ListJobs(grpc::ServerContext* context,
                          const v1::ListJobsRequest* request,
                          v1::ListJobsResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->list_jobs_requests.push_back(*request);
      response->set_next_page_token(NextToken(
          *state_, Page(state_->jobs, state_->page_size, request->page_token(),
                        response->mutable_jobs())));
      return grpc::Status::OK;
    }
    grpc::Status CancelJob(grpc::ServerContext* context,
                           const v1::CancelJobRequest*,
                           v1::Job* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      *response = state_->job;
      response->set_status(v1::JOB_STATUS_CANCELLED);
      return grpc::Status::OK;
    }
    grpc::Status PauseJob(grpc::ServerContext* context,
                          const v1::PauseJobRequest* request,
                          v1::Job* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->paused_jobs.push_back(request->name());
      if (!state_->pause_status.ok()) return state_->pause_status;
      *response = state_->job;
      response->set_status(state_->pause_outcome);
      return grpc::Status::OK;
    }
    grpc::Status ResumeJob(grpc::ServerContext* context,
                           const v1::ResumeJobRequest* request,
                           v1::Job* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->resumed_jobs.push_back(request->name());
      if (!state_->resume_status.ok()) return state_->resume_status;
      *response = state_->job;
      response->set_status(v1::JOB_STATUS_QUEUED);
      return grpc::Status::OK;
    }
    grpc::Status ListCheckpoints(
        grpc::ServerContext* context, const v1::ListCheckpointsRequest* request,
        v1::ListCheckpointsResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->list_checkpoints_names.push_back(request->name());
      if (!state_->list_checkpoints_status.ok()) {
        return state_->list_checkpoints_status;
      }
      for (const v1::Checkpoint& checkpoint : state_->checkpoints) {
        *response->add_checkpoints() = checkpoint;
      }
      return grpc::Status::OK;
    }
    grpc::Status WatchJob(grpc::ServerContext* context,
                          const v1::WatchJobRequest* request,
                          grpc::ServerWriter<v1::JobEvent>* writer) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::vector<v1::JobEvent> events;
      std::chrono::milliseconds delay;
      int max_events = 0;
      bool hold_open = false;
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        if (request->name() == state_->job.name()) {
          state_->watch_after_sequences.push_back(request->after_sequence());
          events = state_->events;
          delay = state_->event_delay;
          max_events = state_->max_events_per_watch;
          hold_open = state_->hold_watch_open;
        } else {
          events.clear();
          max_events = -1;  // Unknown job.
        }
      }
      if (max_events < 0) return JobNotFound(state_, request->name());
      int sent = 0;
      for (const v1::JobEvent& event : events) {
        if (event.sequence() <= request->after_sequence()) continue;
        if (max_events > 0 && sent == max_events) return grpc::Status::OK;
        if (context->IsCancelled()) return grpc::Status::CANCELLED;
        std::this_thread::sleep_for(delay);
        if (!writer->Write(event)) return grpc::Status::CANCELLED;
        ++sent;
      }
      while (hold_open && !context->IsCancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return grpc::Status::OK;
    }
    grpc::Status ListJobEvents(grpc::ServerContext* context,
                               const v1::ListJobEventsRequest* request,
                               v1::ListJobEventsResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      std::vector<v1::JobEvent> after;
      for (const v1::JobEvent& event : state_->events) {
        if (event.sequence() > request->after_sequence())
          after.push_back(event);
      }
      response->set_next_page_token(NextToken(
          *state_, Page(after, state_->page_size, request->page_token(),
                        response->mutable_events())));
      return grpc::Status::OK;
    }

   private:
    FakeServerState* state_;
  };

  class AdapterServiceImpl : public v1::AdapterService::Service {
   public:
    explicit AdapterServiceImpl(FakeServerState* state) : state_(state) {}
    grpc::Status AttachAdapter(grpc::ServerContext* context,
                               const v1::AttachAdapterRequest* request,
                               v1::AttachAdapterResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::chrono::milliseconds delay;
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        delay = state_->attach_delay;
      }
      std::this_thread::sleep_for(delay);
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->attach_requests.push_back(*request);
      response->mutable_adapter()->set_name("adapters/a1");
      *response->mutable_job() = state_->job;
      return grpc::Status::OK;
    }
    grpc::Status RetireAdapter(grpc::ServerContext* context,
                               const v1::RetireAdapterRequest* request,
                               v1::RetireAdapterResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      response->mutable_job()->set_name(request->job());
      response->mutable_job()->set_status(v1::JOB_STATUS_CANCELLED);
      return grpc::Status::OK;
    }
    grpc::Status ExportAdapter(
        grpc::ServerContext* context, const v1::ExportAdapterRequest* request,
        grpc::ServerWriter<v1::ExportAdapterChunk>* writer) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::vector<v1::ExportAdapterChunk> chunks;
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->export_requests.push_back(*request);
        if (request->has_job() && !state_->export_job_status.ok()) {
          return state_->export_job_status;
        }
        if (request->has_checkpoint() &&
            !state_->export_checkpoint_status.ok()) {
          return state_->export_checkpoint_status;
        }
        chunks = state_->export_chunks;
      }
      for (const v1::ExportAdapterChunk& chunk : chunks) {
        if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      }
      return grpc::Status::OK;
    }
    grpc::Status GetAdapter(grpc::ServerContext* context,
                            const v1::GetAdapterRequest* request,
                            v1::Adapter* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      response->set_name(request->name());
      return grpc::Status::OK;
    }
    grpc::Status ListAdapters(grpc::ServerContext* context,
                              const v1::ListAdaptersRequest* request,
                              v1::ListAdaptersResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      std::lock_guard<std::mutex> lock(state_->mu);
      response->set_next_page_token(NextToken(
          *state_, Page(state_->adapters, state_->page_size,
                        request->page_token(), response->mutable_adapters())));
      return grpc::Status::OK;
    }
    grpc::Status ListSlots(grpc::ServerContext* context,
                           const v1::ListSlotsRequest*,
                           v1::ListSlotsResponse* response) override {
      grpc::Status auth = CheckAuth(state_, context);
      if (!auth.ok()) return auth;
      v1::Slot* slot = response->add_slots();
      slot->set_index(0);
      slot->set_state(v1::SLOT_STATE_FREE);
      return grpc::Status::OK;
    }

   private:
    FakeServerState* state_;
  };

  FakeServerState state_;
  ServerServiceImpl server_service_;
  DatasetServiceImpl dataset_service_;
  JobServiceImpl job_service_;
  AdapterServiceImpl adapter_service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Events of a job that queues, runs `steps` steps (loss falling from 3)
// and ends with `final_status`; event times one second apart.
inline std::vector<v1::JobEvent> FakeJobEvents(int steps,
                                               v1::JobStatus final_status) {
  std::vector<v1::JobEvent> events;
  auto add = [&events]() -> v1::JobEvent& {
    v1::JobEvent& event = events.emplace_back();
    event.set_sequence(static_cast<int64_t>(events.size()));
    event.mutable_time()->set_seconds(1700000000 +
                                      static_cast<int64_t>(events.size()));
    return event;
  };
  add().mutable_status_change()->set_status(v1::JOB_STATUS_QUEUED);
  add().mutable_status_change()->set_status(v1::JOB_STATUS_RUNNING);
  for (int step = 1; step <= steps; ++step) {
    v1::JobMetrics* metrics = add().mutable_metrics();
    metrics->set_step(step);
    metrics->set_loss(3.0 - 0.1 * step);
    metrics->set_lr(1e-3);
    metrics->set_tokens_per_second(1000);
  }
  v1::JobStatusChange* last = add().mutable_status_change();
  last->set_status(final_status);
  if (final_status == v1::JOB_STATUS_FAILED) {
    last->mutable_error()->set_code("INTERNAL");
    last->mutable_error()->set_message("loss went NaN");
  }
  return events;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_CLIENT_FAKE_LORAPLEX_SERVER_H_
