// Dataset uploads store exactly what the client sent, or nothing: a
// cancelled upload is never stored, and a stream cut short by a malformed
// message or carrying other bytes than its header declares is refused.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/common/sha256.h"
#include "loraplex/v1/datasets.grpc.pb.h"
#include "tests/server/raw_grpc_call.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

class ServiceUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = FreshTestDir("state");
    server_ = StartServer(state_, 1);
    ASSERT_NE(server_, nullptr);
    client_ = ClientFor(*server_);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::DatasetService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
    }
  }

  // The datasets stored, once the server has answered everything (a
  // cancelled upload is taken back when its call ends).
  size_t StoredDatasets() {
    auto datasets = client_->ListAllDatasets();
    EXPECT_TRUE(datasets.ok()) << datasets.status();
    return datasets.ok() ? datasets->size() : 0;
  }

  // Uploads `chunks` after a header with `total_bytes` (when >= 0) and
  // `sha256`, through the raw stub.
  grpc::Status RawUpload(const std::vector<std::string>& chunks,
                         int64_t total_bytes, const std::string& sha256) {
    grpc::ClientContext context;
    v1::Dataset dataset;
    auto writer = stub_->UploadDataset(&context, &dataset);
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_display_name("raw");
    if (total_bytes >= 0) header.mutable_header()->set_total_bytes(total_bytes);
    header.mutable_header()->set_sha256(sha256);
    bool open = writer->Write(header);
    for (const std::string& chunk : chunks) {
      if (!open) break;
      v1::UploadDatasetRequest part;
      part.set_chunk(chunk);
      open = writer->Write(part);
    }
    if (open) writer->WritesDone();
    return writer->Finish();
  }

  // Uploads `messages`, each sent as it is (bytes that need not be a
  // message), through the generic stub.
  grpc::Status GenericUpload(const std::vector<std::string>& messages) {
    return RawStreamingCall(
        channel_, "/loraplex.v1.DatasetService/UploadDataset", messages);
  }

  const std::string& server_state() const { return state_; }

  std::string state_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<LoraplexClient> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DatasetService::Stub> stub_;
};

TEST_F(ServiceUploadTest, CancelledUploadsAreNeverStored) {
  const std::string lines = ReversalJsonl(50, 1);
  constexpr int kUploads = 100;
  for (int i = 0; i < kUploads; ++i) {
    grpc::ClientContext context;
    v1::Dataset dataset;
    auto writer = stub_->UploadDataset(&context, &dataset);
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_display_name("cancelled");
    // Every other upload declares exactly the bytes it sends: then only
    // the cancel itself can keep it from being stored.
    if (i % 2 == 1) {
      header.mutable_header()->set_total_bytes(
          static_cast<int64_t>(3 * lines.size()));
    }
    ASSERT_TRUE(writer->Write(header));
    for (int chunk = 0; chunk < 3; ++chunk) {
      v1::UploadDatasetRequest part;
      part.set_chunk(lines);
      ASSERT_TRUE(writer->Write(part));
    }
    context.TryCancel();
    EXPECT_FALSE(writer->Finish().ok()) << i;
  }
  // Generous: the server may still be handling the last cancels on a
  // loaded machine.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (StoredDatasets() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(StoredDatasets(), 0u) << server_->Log();
  // Complete uploads are stored as before.
  auto stored = client_->UploadDatasetContents(lines, "whole");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->num_examples(), 50);
  EXPECT_EQ(stored->sha256(), Sha256Hex(lines));
}

// A malformed message mid-upload fails it and nothing is stored, whether
// or not the header declares the size (gRPC reports a message it cannot
// parse as the end of the stream: without a declared size the lines before
// it were once stored).
TEST_F(ServiceUploadTest, MalformedMessageMidUploadFailsTheUpload) {
  const std::string first = ReversalJsonl(10, 1);
  const std::string second = ReversalJsonl(10, 2);
  for (const bool declared : {true, false}) {
    SCOPED_TRACE(declared ? "size and digest declared" : "nothing declared");
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_display_name("malformed");
    if (declared) {
      header.mutable_header()->set_total_bytes(
          static_cast<int64_t>(first.size() + second.size()));
      header.mutable_header()->set_sha256(Sha256Hex(first + second));
    }
    v1::UploadDatasetRequest part;
    part.set_chunk(first);
    v1::UploadDatasetRequest rest;
    rest.set_chunk(second);
    // Header, 10 lines, 5 bytes that are no message, 10 more lines.
    grpc::Status status = GenericUpload(
        {header.SerializeAsString(), part.SerializeAsString(),
         std::string("\xff\xff\xff\xff\xff", 5), rest.SerializeAsString()});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("the upload stream could not be parsed: its "
                          "message 3 is no UploadDatasetRequest"));
    EXPECT_THAT(status.error_message(), HasSubstr("nothing was stored"));
    EXPECT_EQ(StoredDatasets(), 0u);
  }
  // A header whose display_name is not UTF-8 is no message either.
  grpc::Status status =
      GenericUpload({std::string("\x0a\x04\x0a\x02\xc3\x28", 6)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("its message 1 is no"));
  // Well-formed uploads through the same raw path are stored.
  v1::UploadDatasetRequest header;
  header.mutable_header()->set_display_name("whole");
  v1::UploadDatasetRequest part;
  part.set_chunk(first);
  status =
      GenericUpload({header.SerializeAsString(), part.SerializeAsString()});
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(StoredDatasets(), 1u);
}

TEST_F(ServiceUploadTest, DeclaredSizeAndDigestAreChecked) {
  const std::string lines = ReversalJsonl(8, 1);
  const std::string digest = Sha256Hex(lines);
  const int64_t size = static_cast<int64_t>(lines.size());
  struct Case {
    std::vector<std::string> chunks;
    int64_t total_bytes;
    std::string sha256;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{lines}, size + 1, digest, "declared " + std::to_string(size + 1)},
      {{lines, "x"}, size, "", "chunk: more bytes than header.total_bytes"},
      {{lines}, size, Sha256Hex("other"), "header.sha256: the bytes"},
      {{lines}, -1, "ABC", "header.sha256 must be 64 lowercase hex digits"},
      {{lines},
       int64_t{1} << 40,
       "",
       "header.total_bytes: the dataset (1099511627776 bytes) exceeds the "
       "upload limit of "},
  };
  for (const Case& c : cases) {
    grpc::Status status = RawUpload(c.chunks, c.total_bytes, c.sha256);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.error << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.error));
  }
  EXPECT_EQ(StoredDatasets(), 0u);
  // Matching declarations, and none at all, are stored.
  EXPECT_TRUE(RawUpload({lines}, size, digest).ok());
  EXPECT_TRUE(RawUpload({lines}, -1, "").ok());
  EXPECT_EQ(StoredDatasets(), 2u);
}

// A request_id makes CreateJob, AttachAdapter and UploadDataset safe to
// retry: a repeat answers with what the first created, also after a
// restart, and creates nothing.
TEST_F(ServiceUploadTest, RepeatedRequestIdsCreateOnce) {
  const std::string lines = ReversalJsonl(8, 1);
  auto upload = [&] {
    grpc::ClientContext context;
    v1::Dataset dataset;
    auto writer = stub_->UploadDataset(&context, &dataset);
    v1::UploadDatasetRequest header;
    header.mutable_header()->set_request_id("upload-1");
    EXPECT_TRUE(writer->Write(header));
    v1::UploadDatasetRequest part;
    part.set_chunk(lines);
    EXPECT_TRUE(writer->Write(part));
    writer->WritesDone();
    EXPECT_TRUE(writer->Finish().ok());
    return dataset.name();
  };
  const std::string dataset = upload();
  EXPECT_EQ(upload(), dataset);
  EXPECT_EQ(StoredDatasets(), 1u);

  v1::CreateJobRequest request =
      JobRequest(dataset, v1::OPTIMIZER_FAMILY_ADAMW, 4, 2, 1);
  request.set_request_id("create-1");
  auto first = client_->CreateJob(request);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = client_->CreateJob(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), first->name());

  // A client whose deadline passed before the answer: its retry with the
  // same id finds the job the first try created, or creates it once.
  request.set_request_id("create-2");
  ClientOptions hasty;
  hasty.address = server_->address();
  hasty.timeout = absl::Milliseconds(1);
  hasty.attempts = 1;
  auto impatient = LoraplexClient::Connect(hasty);
  ASSERT_TRUE(impatient.ok());
  (*impatient)->CreateJob(request).status().IgnoreError();
  auto retried = client_->CreateJob(request);
  ASSERT_TRUE(retried.ok()) << retried.status();

  v1::AttachAdapterRequest attach = AttachNewAdapter(
      server_state() + "/models/tiny",
      JobRequest(dataset, v1::OPTIMIZER_FAMILY_ADAMW, 4, 2, 3));
  attach.set_request_id("attach-1");
  auto attached = client_->AttachAdapter(attach);
  ASSERT_TRUE(attached.ok()) << attached.status();
  auto reattached = client_->AttachAdapter(attach);
  ASSERT_TRUE(reattached.ok()) << reattached.status();
  EXPECT_EQ(reattached->adapter().name(), attached->adapter().name());
  EXPECT_EQ(reattached->job().name(), attached->job().name());

  auto jobs = client_->ListAllJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 3u);
  // The two created jobs may already have finished and stored their own
  // adapters; uploads are the adapters without a job.
  auto adapters = client_->ListAllAdapters();
  ASSERT_TRUE(adapters.ok());
  EXPECT_EQ(std::count_if(adapters->begin(), adapters->end(),
                          [](const v1::Adapter& a) { return a.job().empty(); }),
            1);

  // Recorded durably: the same after a restart.
  ASSERT_TRUE(server_->Stop().ok()) << server_->Log();
  server_ = StartServer(server_state(), 1);
  ASSERT_NE(server_, nullptr);
  client_ = ClientFor(*server_);
  request.set_request_id("create-1");
  auto after_restart = client_->CreateJob(request);
  ASSERT_TRUE(after_restart.ok()) << after_restart.status();
  EXPECT_EQ(after_restart->name(), first->name());

  request.set_request_id("has space");
  absl::Status bad = client_->CreateJob(request).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("request_id must be at most 128"));
}

// Two AttachAdapter calls with one request_id and an upload, both past the
// request_id lookup before either has queued its job (--test-faults=meet
// holds each there until both have come): one job, one stored upload, and
// both answers name them.
TEST(ServiceRepeatRaceTest, RepeatsSideBySideAnswerTheFirstsAdapterAndJob) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1, {"--test-faults=meet:count=2"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(8, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  v1::AttachAdapterRequest attach = AttachNewAdapter(
      state + "/models/tiny",
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 2, 3));
  attach.set_request_id("attach-race");
  absl::StatusOr<v1::AttachAdapterResponse> answers[2];
  std::thread second([&] { answers[1] = client->AttachAdapter(attach); });
  answers[0] = client->AttachAdapter(attach);
  second.join();
  ASSERT_TRUE(answers[0].ok()) << answers[0].status();
  ASSERT_TRUE(answers[1].ok()) << answers[1].status();
  EXPECT_EQ(answers[0]->job().name(), answers[1]->job().name());
  EXPECT_EQ(answers[0]->adapter().name(), answers[1]->adapter().name());

  auto jobs = client->ListAllJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
  // Once the job has ended (storing its own adapter), nothing is written.
  auto done = WaitForJob(*client, answers[0]->job().name());
  ASSERT_TRUE(done.ok()) << done.status();
  auto adapters = client->ListAllAdapters();
  ASSERT_TRUE(adapters.ok());
  std::vector<std::string> uploads;
  for (const v1::Adapter& adapter : *adapters) {
    if (adapter.job().empty()) uploads.push_back(adapter.name());
  }
  EXPECT_THAT(uploads, ::testing::ElementsAre(answers[0]->adapter().name()));
  // The withdrawn upload left no files: one adapter directory per record.
  size_t dirs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(state + "/adapters")) {
    dirs += entry.is_directory();
  }
  EXPECT_EQ(dirs, adapters->size());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
