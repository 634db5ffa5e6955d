// LoraplexClient against an in-process fake server.
#include "client/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/job_progress.h"
#include "core/common/sha256.h"
#include "tests/client/fake_loraplex_server.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<LoraplexClient> Connect(const std::string& token = "") {
    ClientOptions options;
    options.address = server_.address();
    options.token = token;
    options.timeout = absl::Seconds(10);
    auto client = LoraplexClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(client).value();
  }

  FakeLoraplexServer server_;
};

TEST_F(ClientTest, ConnectChecksOptions) {
  ClientOptions options;
  options.address = "";
  EXPECT_EQ(LoraplexClient::Connect(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.address = "127.0.0.1:1";
  options.tls_ca_file = "/nonexistent/ca.pem";
  auto client = LoraplexClient::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("tls_ca_file"));
  options.tls_ca_file.clear();
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(LoraplexClient::Connect(options).status().message(),
              HasSubstr("timeout"));
}

TEST_F(ClientTest, EmptyTlsCaFileIsInvalid) {
  const std::string ca = FreshTestDir() + "/empty.pem";
  std::ofstream(ca).close();
  ClientOptions options;
  options.address = "127.0.0.1:1";
  options.tls_ca_file = ca;
  auto client = LoraplexClient::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("tls_ca_file"));
  EXPECT_THAT(client.status().message(), HasSubstr("empty"));
}

TEST_F(ClientTest, SendsBearerTokenOnEveryCall) {
  server_.state().required_token = "s3cret";
  server_.state().info.set_version("9.9.9");
  auto client = Connect("s3cret");
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), "9.9.9");
  ASSERT_TRUE(client->ListSlots().ok());
  ASSERT_TRUE(client->PauseJob("jobs/j1").ok());
  ASSERT_TRUE(client->ResumeJob("jobs/j1").ok());
  ASSERT_TRUE(client->ListCheckpoints("jobs/j1").ok());
  EXPECT_EQ(server_.state().authorizations.size(), 5u);
  EXPECT_THAT(server_.state().authorizations,
              Each(std::string("Bearer s3cret")));
}

TEST_F(ClientTest, KeepsTheServersCodeAndMessage) {
  server_.state().required_token = "s3cret";
  auto info = Connect("wrong")->GetServerInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(info.status().message(), "missing or wrong bearer token");
  server_.state().required_token.clear();
  EXPECT_EQ(Connect()->GetJob("jobs/none").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, UnreachableServerIsUnavailable) {
  ClientOptions options;
  options.address = "127.0.0.1:1";
  options.timeout = absl::Seconds(5);
  auto client = LoraplexClient::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->GetServerInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, UploadSendsHeaderThenMebibyteChunks) {
  std::string contents(kUploadChunkBytes * 2 + 100, 'x');
  for (size_t i = 0; i < contents.size(); i += 97) contents[i] = '\n';
  auto dataset = Connect()->UploadDatasetContents(contents, "big");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->name(), "datasets/d1");
  EXPECT_TRUE(server_.state().upload_saw_header_first);
  EXPECT_EQ(server_.state().upload_display_name, "big");
  EXPECT_THAT(server_.state().upload_chunk_sizes,
              ElementsAre(kUploadChunkBytes, kUploadChunkBytes, 100u));
  EXPECT_EQ(server_.state().upload_bytes, contents);
}

TEST_F(ClientTest, CreateJobRetriesTransientErrorsWithOneRequestId) {
  ClientOptions options;
  options.address = server_.address();
  options.retry_backoff = absl::Milliseconds(1);
  auto client = LoraplexClient::Connect(options);
  ASSERT_TRUE(client.ok());
  server_.state().create_failures = 2;
  ASSERT_TRUE((*client)->CreateJob(v1::CreateJobRequest()).ok());
  const auto& created = server_.state().created_jobs;
  ASSERT_EQ(created.size(), 3u);
  EXPECT_EQ(created[0].request_id().size(), 32u);
  EXPECT_EQ(created[1].request_id(), created[0].request_id());
  EXPECT_EQ(created[2].request_id(), created[0].request_id());

  // The caller's own id is kept; a new call gets a new id.
  v1::CreateJobRequest mine;
  mine.set_request_id("my-id");
  ASSERT_TRUE((*client)->CreateJob(mine).ok());
  ASSERT_TRUE((*client)->CreateJob(v1::CreateJobRequest()).ok());
  ASSERT_EQ(created.size(), 5u);
  EXPECT_EQ(created[3].request_id(), "my-id");
  EXPECT_NE(created[4].request_id(), created[0].request_id());

  // Given up after `attempts`; other errors are not retried.
  server_.state().create_failures = 5;
  EXPECT_EQ((*client)->CreateJob(v1::CreateJobRequest()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(created.size(), 8u);
  server_.state().create_failures = 1;
  server_.state().create_failure_code = grpc::StatusCode::INVALID_ARGUMENT;
  EXPECT_EQ((*client)->CreateJob(v1::CreateJobRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(created.size(), 9u);
}

TEST_F(ClientTest, UploadRetriesWholeWithSizeDigestAndOneRequestId) {
  ClientOptions options;
  options.address = server_.address();
  options.retry_backoff = absl::Milliseconds(1);
  auto client = LoraplexClient::Connect(options);
  ASSERT_TRUE(client.ok());
  const std::string path = FreshTestDir() + "/train.jsonl";
  const std::string contents(kUploadChunkBytes + 7, 'b');
  std::ofstream(path, std::ios::binary) << contents;
  server_.state().upload_failures = 1;
  ASSERT_TRUE((*client)->UploadDatasetFile(path, "f").ok());
  const auto& headers = server_.state().upload_headers;
  ASSERT_EQ(headers.size(), 2u);
  for (const v1::UploadDatasetHeader& header : headers) {
    EXPECT_EQ(header.total_bytes(), static_cast<int64_t>(contents.size()));
    EXPECT_EQ(header.sha256(), Sha256Hex(contents));
    EXPECT_EQ(header.request_id(), headers[0].request_id());
  }
  EXPECT_FALSE(headers[0].request_id().empty());
  // The second try sent the whole file again.
  EXPECT_EQ(server_.state().upload_bytes, contents);
}

TEST_F(ClientTest, UploadStreamsAFile) {
  const std::string path = FreshTestDir() + "/train.jsonl";
  std::string contents(kUploadChunkBytes + 5, 'a');
  std::ofstream(path, std::ios::binary) << contents;
  auto dataset = Connect()->UploadDatasetFile(path, "file");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_THAT(server_.state().upload_chunk_sizes,
              ElementsAre(kUploadChunkBytes, 5u));
  EXPECT_EQ(server_.state().upload_bytes, contents);
}

TEST_F(ClientTest, UploadOfAMissingFileIsNotFound) {
  auto dataset = Connect()->UploadDatasetFile("/nonexistent/x.jsonl", "x");
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("/nonexistent/x.jsonl"));
}

TEST_F(ClientTest, ListAllFollowsPageTokens) {
  for (int i = 0; i < 5; ++i) {
    server_.state().datasets.emplace_back().set_name("datasets/d" +
                                                     std::to_string(i));
    server_.state().jobs.emplace_back().set_name("jobs/j" + std::to_string(i));
    server_.state().adapters.emplace_back().set_name("adapters/a" +
                                                     std::to_string(i));
  }
  auto client = Connect();
  auto datasets = client->ListAllDatasets();
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  ASSERT_EQ(datasets->size(), 5u);
  EXPECT_EQ((*datasets)[4].name(), "datasets/d4");
  auto jobs = client->ListAllJobs({v1::JOB_STATUS_RUNNING});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 5u);
  ASSERT_EQ(server_.state().list_jobs_requests.size(), 3u);  // 2 + 2 + 1.
  EXPECT_THAT(server_.state().list_jobs_requests[1].statuses(),
              ElementsAre(v1::JOB_STATUS_RUNNING));
  auto adapters = client->ListAllAdapters();
  ASSERT_TRUE(adapters.ok()) << adapters.status();
  EXPECT_EQ(adapters->size(), 5u);
}

TEST_F(ClientTest, ListAllFailsWhenThePageTokenDoesNotAdvance) {
  for (int i = 0; i < 5; ++i) {
    server_.state().datasets.emplace_back().set_name("datasets/d" +
                                                     std::to_string(i));
    server_.state().jobs.emplace_back().set_name("jobs/j" + std::to_string(i));
    server_.state().adapters.emplace_back().set_name("adapters/a" +
                                                     std::to_string(i));
  }
  server_.state().events = FakeJobEvents(3, v1::JOB_STATUS_SUCCEEDED);
  server_.state().stuck_page_token = "2";
  auto client = Connect();
  const absl::Status statuses[] = {client->ListAllDatasets().status(),
                                   client->ListAllJobs().status(),
                                   client->ListAllJobEvents("jobs/j1").status(),
                                   client->ListAllAdapters().status()};
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_THAT(status.message(), HasSubstr("next_page_token"));
  }
  // The first page plus the one that repeated its token.
  EXPECT_EQ(server_.state().list_jobs_requests.size(), 2u);
}

TEST_F(ClientTest, AttachWithFilesUsesTheTransferTimeout) {
  server_.state().attach_delay = std::chrono::milliseconds(1500);
  ClientOptions options;
  options.address = server_.address();
  options.timeout = absl::Seconds(1);
  options.transfer_timeout = absl::Seconds(30);
  auto client = LoraplexClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::AttachAdapterRequest with_files;
  with_files.mutable_files()->set_adapter_config_json("{}");
  auto attached = (*client)->AttachAdapter(with_files);
  EXPECT_TRUE(attached.ok()) << attached.status();
  v1::AttachAdapterRequest stored;
  stored.set_adapter("adapters/a1");
  EXPECT_EQ((*client)->AttachAdapter(stored).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, WatchJobEndsWhenCancelledFromAnotherThread) {
  server_.state().job.set_name("jobs/j1");
  server_.state().events = {FakeJobEvents(1, v1::JOB_STATUS_SUCCEEDED)[0]};
  server_.state().hold_watch_open = true;
  auto client = Connect();
  WatchCancellation cancellation;
  int seen = 0;
  // Cancels once the event arrived (the watch then waits on the open
  // stream), not after a fixed time a loaded machine may overrun.
  absl::Notification event_seen;
  std::thread canceller([&] {
    event_seen.WaitForNotificationWithTimeout(absl::Seconds(60));
    cancellation.Cancel();
  });
  absl::Status status = client->WatchJob(
      "jobs/j1", 0,
      [&](const v1::JobEvent&) {
        ++seen;
        if (!event_seen.HasBeenNotified()) event_seen.Notify();
        return true;
      },
      &cancellation);
  canceller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(seen, 1);
  // A watch started after Cancel() ends at once.
  status = client->WatchJob(
      "jobs/j1", 0, [](const v1::JobEvent&) { return true; }, &cancellation);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(server_.state().watch_after_sequences.size(), 1u);
}

TEST_F(ClientTest, WatchJobStreamsUntilTheEnd) {
  server_.state().job.set_name("jobs/j1");
  server_.state().events = FakeJobEvents(5, v1::JOB_STATUS_SUCCEEDED);
  std::vector<int64_t> sequences;
  absl::Status status =
      Connect()->WatchJob("jobs/j1", 2, [&](const v1::JobEvent& event) {
        sequences.push_back(event.sequence());
        return true;
      });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(sequences, ElementsAre(3, 4, 5, 6, 7, 8));
  EXPECT_THAT(server_.state().watch_after_sequences, ElementsAre(2));
}

TEST_F(ClientTest, WatchJobStopsWhenTheCallbackSaysSo) {
  server_.state().job.set_name("jobs/j1");
  server_.state().events = FakeJobEvents(50, v1::JOB_STATUS_SUCCEEDED);
  server_.state().event_delay = std::chrono::milliseconds(5);
  int seen = 0;
  absl::Status status = Connect()->WatchJob(
      "jobs/j1", 0, [&](const v1::JobEvent&) { return ++seen < 3; });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(seen, 3);
}

TEST_F(ClientTest, WatchOfAnUnknownJobFails) {
  server_.state().job.set_name("jobs/j1");
  absl::Status status = Connect()->WatchJob(
      "jobs/other", 0, [](const v1::JobEvent&) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ListAllJobEventsPages) {
  server_.state().events = FakeJobEvents(4, v1::JOB_STATUS_SUCCEEDED);
  auto events = Connect()->ListAllJobEvents("jobs/j1", 1);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 6u);
  EXPECT_EQ(events->front().sequence(), 2);
}

v1::ExportAdapterChunk Chunk(const std::string& name, int64_t size,
                             const std::string& data) {
  v1::ExportAdapterChunk chunk;
  chunk.set_file_name(name);
  chunk.set_file_size(size);
  chunk.set_data(data);
  return chunk;
}

TEST_F(ClientTest, ExportWritesEveryFile) {
  server_.state().export_chunks = {Chunk("adapter_config.json", 2, "{}"),
                                   Chunk("adapter_model.safetensors", 6, "abc"),
                                   Chunk("", 0, "def")};
  const std::string out_dir = FreshTestDir() + "/nested/out";
  v1::ExportAdapterRequest request;
  request.set_job("jobs/j1");
  auto files = Connect()->ExportAdapter(request, out_dir);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].file_name, "adapter_config.json");
  EXPECT_EQ((*files)[1].size_bytes, 6);
  EXPECT_EQ(ReadFile(out_dir + "/adapter_config.json"), "{}");
  EXPECT_EQ(ReadFile(out_dir + "/adapter_model.safetensors"), "abcdef");
  EXPECT_EQ(server_.state().export_requests.at(0).job(), "jobs/j1");
  // Nothing but the two files (no temporaries left behind).
  int entries = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator(out_dir)) {
    ++entries;
  }
  EXPECT_EQ(entries, 2);
}

TEST_F(ClientTest, ExportRejectsUnsafeFileNames) {
  const std::vector<std::string> names = {"../evil", "a/b", "..", "x..y"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    server_.state().export_chunks = {Chunk(name, 1, "x")};
    const std::string out_dir = FreshTestDir(std::to_string(i));
    v1::ExportAdapterRequest request;
    request.set_adapter("adapters/a1");
    auto files = Connect()->ExportAdapter(request, out_dir + "/out");
    ASSERT_FALSE(files.ok()) << name;
    EXPECT_THAT(files.status().message(), HasSubstr("file_name")) << name;
    EXPECT_FALSE(std::filesystem::exists(out_dir + "/evil"));
    // The directory the failed export created is gone again.
    EXPECT_FALSE(std::filesystem::exists(out_dir + "/out")) << name;
  }
}

TEST_F(ClientTest, ExportRejectsSizeMismatchAndDuplicates) {
  const std::string out_dir = FreshTestDir();
  v1::ExportAdapterRequest request;
  request.set_adapter("adapters/a1");
  auto client = Connect();

  server_.state().export_chunks = {Chunk("a.json", 10, "short")};
  auto files = client->ExportAdapter(request, out_dir + "/short");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("announced 10 bytes"));
  EXPECT_FALSE(std::filesystem::exists(out_dir + "/short/a.json"));

  server_.state().export_chunks = {Chunk("a.json", 1, "toolong")};
  EXPECT_FALSE(client->ExportAdapter(request, out_dir + "/long").ok());

  server_.state().export_chunks = {Chunk("a.json", 1, "x"),
                                   Chunk("a.json", 1, "y")};
  files = client->ExportAdapter(request, out_dir + "/twice");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("twice"));

  server_.state().export_chunks = {Chunk("", 0, "data")};
  files = client->ExportAdapter(request, out_dir + "/nameless");
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("no file_name"));
}

TEST_F(ClientTest, FailedExportLeavesTheOldFilesAlone) {
  const std::string out_dir = FreshTestDir();
  std::ofstream(out_dir + "/adapter_config.json") << "old";
  std::ofstream(out_dir + "/keep.txt") << "mine";
  // The first file is complete, the second is short.
  server_.state().export_chunks = {
      Chunk("adapter_config.json", 3, "new"),
      Chunk("adapter_model.safetensors", 10, "short")};
  v1::ExportAdapterRequest request;
  request.set_adapter("adapters/a1");
  auto files = Connect()->ExportAdapter(request, out_dir);
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("announced 10 bytes"));
  EXPECT_EQ(ReadFile(out_dir + "/adapter_config.json"), "old");
  EXPECT_FALSE(std::filesystem::exists(out_dir + "/adapter_model.safetensors"));
  int entries = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator(out_dir)) {
    ++entries;
  }
  EXPECT_EQ(entries, 2);  // No temporaries left behind.
}

TEST_F(ClientTest, FailedExportRemovesTheDirectoryItCreated) {
  server_.state().export_job_status =
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job is queued");
  const std::string parent = FreshTestDir();
  v1::ExportAdapterRequest request;
  request.set_job("jobs/j1");
  auto files = Connect()->ExportAdapter(request, parent + "/out");
  ASSERT_FALSE(files.ok());
  EXPECT_FALSE(std::filesystem::exists(parent + "/out"));
  EXPECT_TRUE(std::filesystem::exists(parent));
}

TEST_F(ClientTest, ExportPassesTheServersError) {
  server_.state().export_job_status =
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job is queued");
  v1::ExportAdapterRequest request;
  request.set_job("jobs/j1");
  auto files = Connect()->ExportAdapter(request, FreshTestDir());
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(files.status().message(), "job is queued");
}

TEST_F(ClientTest, ExportFromACheckpointSendsTheCheckpoint) {
  server_.state().export_chunks = {Chunk("adapter_config.json", 2, "{}")};
  const std::string out_dir = FreshTestDir() + "/out";
  v1::ExportAdapterRequest request;
  request.set_checkpoint("jobs/j1/checkpoints/40");
  auto files = Connect()->ExportAdapter(request, out_dir);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(ReadFile(out_dir + "/adapter_config.json"), "{}");
  ASSERT_EQ(server_.state().export_requests.size(), 1u);
  EXPECT_EQ(server_.state().export_requests[0].checkpoint(),
            "jobs/j1/checkpoints/40");
  EXPECT_FALSE(server_.state().export_requests[0].has_job());
}

TEST_F(ClientTest, PauseAndResumeSendTheNameAndReturnTheJob) {
  server_.state().job.set_name("jobs/j1");
  auto client = Connect();
  absl::StatusOr<v1::Job> paused = client->PauseJob("jobs/j1");
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->name(), "jobs/j1");
  EXPECT_EQ(paused->status(), v1::JOB_STATUS_PAUSED);
  absl::StatusOr<v1::Job> resumed = client->ResumeJob("jobs/j1");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->status(), v1::JOB_STATUS_QUEUED);
  EXPECT_THAT(server_.state().paused_jobs, ElementsAre("jobs/j1"));
  EXPECT_THAT(server_.state().resumed_jobs, ElementsAre("jobs/j1"));
}

TEST_F(ClientTest, PauseAndResumeKeepTheServersError) {
  server_.state().pause_status = grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION, "jobs/j1 is SUCCEEDED");
  server_.state().resume_status = grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION, "jobs/j1 is not paused");
  auto client = Connect();
  absl::StatusOr<v1::Job> paused = client->PauseJob("jobs/j1");
  EXPECT_EQ(paused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(paused.status().message(), "jobs/j1 is SUCCEEDED");
  absl::StatusOr<v1::Job> resumed = client->ResumeJob("jobs/j1");
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(resumed.status().message(), "jobs/j1 is not paused");
}

TEST_F(ClientTest, ListCheckpointsReturnsThemInOrder) {
  for (int step : {10, 20}) {
    v1::Checkpoint& checkpoint = server_.state().checkpoints.emplace_back();
    checkpoint.set_name("jobs/j1/checkpoints/" + std::to_string(step));
    checkpoint.set_step(step);
    checkpoint.set_size_bytes(1000 * step);
  }
  auto client = Connect();
  auto checkpoints = client->ListCheckpoints("jobs/j1");
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->checkpoints_size(), 2);
  EXPECT_EQ(checkpoints->checkpoints(1).name(), "jobs/j1/checkpoints/20");
  EXPECT_EQ(checkpoints->checkpoints(1).size_bytes(), 20000);
  EXPECT_THAT(server_.state().list_checkpoints_names, ElementsAre("jobs/j1"));

  server_.state().list_checkpoints_status =
      grpc::Status(grpc::StatusCode::NOT_FOUND, "jobs/j2 not found");
  EXPECT_EQ(client->ListCheckpoints("jobs/j2").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, CreateJobPassesTheCheckpointFields) {
  v1::CreateJobRequest request;
  request.set_training_dataset("datasets/d1");
  request.set_initial_checkpoint("jobs/j0/checkpoints/30");
  request.mutable_training()->set_checkpoint_interval(25);
  ASSERT_TRUE(Connect()->CreateJob(request).ok());
  ASSERT_EQ(server_.state().created_jobs.size(), 1u);
  EXPECT_EQ(server_.state().created_jobs[0].initial_checkpoint(),
            "jobs/j0/checkpoints/30");
  EXPECT_EQ(server_.state().created_jobs[0].training().checkpoint_interval(),
            25);
}

TEST_F(ClientTest, WatchWithProgressReportsLossesAndFinalJob) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_SUCCEEDED);
  server_.state().job.set_total_steps(5);
  server_.state().events = FakeJobEvents(5, v1::JOB_STATUS_SUCCEEDED);
  auto client = Connect();
  std::ostringstream out;
  JobProgressOptions options;
  options.interactive = false;
  auto results =
      WatchJobsWithProgress(*client, {{"jobs/j1", "j1"}}, options, out);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 1u);
  EXPECT_EQ((*results)[0].job.status(), v1::JOB_STATUS_SUCCEEDED);
  EXPECT_DOUBLE_EQ((*results)[0].first_loss.value(), 2.9);
  EXPECT_DOUBLE_EQ((*results)[0].last_loss.value(), 2.5);
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("j1  QUEUED\n"));
  EXPECT_THAT(text, HasSubstr("j1  RUNNING\n"));
  EXPECT_THAT(text, HasSubstr("j1  step 5/5 (100%)  loss 2.5000"));
  EXPECT_THAT(text, HasSubstr("j1  SUCCEEDED\n"));
  EXPECT_THAT(text, Not(HasSubstr("\r")));
}

TEST_F(ClientTest, InteractiveProgressRedrawsInPlace) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_FAILED);
  server_.state().job.set_total_steps(3);
  server_.state().events = FakeJobEvents(3, v1::JOB_STATUS_FAILED);
  std::ostringstream out;
  JobProgressOptions options;
  options.interactive = true;
  options.width = 100;
  auto results =
      WatchJobsWithProgress(*Connect(), {{"jobs/j1", "j1"}}, options, out);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].job.status(), v1::JOB_STATUS_FAILED);
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("\r"));
  EXPECT_THAT(text, HasSubstr("j1  FAILED (INTERNAL: loss went NaN)"));
  EXPECT_THAT(text, HasSubstr("3/3 100%"));
  EXPECT_EQ(text.back(), '\n');
}

TEST_F(ClientTest, WatchWithProgressResumesABrokenStream) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_SUCCEEDED);
  // The stream ends early (no final event) the first time; the job then
  // reads as finished.
  std::vector<v1::JobEvent> events = FakeJobEvents(3, v1::JOB_STATUS_SUCCEEDED);
  events.pop_back();
  server_.state().events = events;
  std::ostringstream out;
  JobProgressOptions options;
  auto results =
      WatchJobsWithProgress(*Connect(), {{"jobs/j1", ""}}, options, out);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].job.status(), v1::JOB_STATUS_SUCCEEDED);
}

TEST_F(ClientTest, WatchWithProgressFailsForAnUnknownJob) {
  server_.state().job.set_name("jobs/j1");
  std::ostringstream out;
  auto results = WatchJobsWithProgress(*Connect(), {{"jobs/missing", ""}},
                                       JobProgressOptions(), out);
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, OneFailedWatchEndsTheOthersBlockedOnTheirStreams) {
  // jobs/j1 sends one event and then nothing (its stream stays open);
  // jobs/missing fails once the watch of j1 is waiting.
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_RUNNING);
  server_.state().events = {FakeJobEvents(1, v1::JOB_STATUS_SUCCEEDED)[0]};
  server_.state().hold_watch_open = true;
  server_.state().not_found_delay = std::chrono::milliseconds(500);
  std::ostringstream out;
  const auto start = std::chrono::steady_clock::now();
  auto results =
      WatchJobsWithProgress(*Connect(), {{"jobs/j1", ""}, {"jobs/missing", ""}},
                            JobProgressOptions(), out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace loraplex
