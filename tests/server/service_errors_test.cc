// Bad requests get the right status code and a message naming the field;
// the server keeps serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <vector>

#include "core/model/model_presets.h"
#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAliceToken[] = "alice-token-0123456789";
constexpr char kBobToken[] = "bob-token-0123456789ab";

class ServiceErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = FreshTestDir("state");
    std::ofstream(state_ + "/tokens")
        << "alice " << kAliceToken << "\nbob " << kBobToken << "\n";
    server_ = StartServer(state_, 2,
                          {"--tokens-file", state_ + "/tokens",
                           "--max-dataset-mb", "1", "--max-rank", "32"});
    ASSERT_NE(server_, nullptr);
    alice_ = ClientFor(*server_, kAliceToken);
    bob_ = ClientFor(*server_, kBobToken);
    auto dataset = alice_->UploadDatasetContents(ReversalJsonl(16, 1), "d");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = dataset->name();
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    // Still serving after everything the test sent.
    EXPECT_TRUE(alice_->GetServerInfo().ok());
    EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
  }

  // CreateJob with one change to a valid request.
  absl::Status Create(const std::function<void(v1::CreateJobRequest&)>& edit) {
    v1::CreateJobRequest request =
        JobRequest(dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 0);
    edit(request);
    return alice_->CreateJob(request).status();
  }

  std::string state_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<LoraplexClient> alice_;
  std::unique_ptr<LoraplexClient> bob_;
  std::string dataset_;
};

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& text) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST_F(ServiceErrorsTest, EachInvalidCreateJobFieldIsNamed) {
  using R = v1::CreateJobRequest;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  ExpectError(Create([](R& r) { r.mutable_lora()->set_rank(0); }), kInvalid,
              "lora.rank must be in [1, 256], got 0");
  ExpectError(Create([](R& r) { r.mutable_lora()->set_rank(64); }), kInvalid,
              "lora.rank must be at most 32");
  ExpectError(Create([](R& r) { r.mutable_lora()->set_dropout(1.5); }),
              kInvalid, "lora.dropout");
  ExpectError(Create([](R& r) {
                r.mutable_lora()->add_target_modules("embed_tokens");
              }),
              kInvalid, "lora.target_modules");
  ExpectError(Create([](R& r) { r.mutable_optimizer()->set_lr(-1); }), kInvalid,
              "optimizer.lr");
  ExpectError(Create([](R& r) { r.mutable_optimizer()->set_lr(0); }), kInvalid,
              "optimizer.lr must be > 0 (0 would train nothing), got 0");
  ExpectError(Create([](R& r) { r.mutable_optimizer()->add_betas(0.9); }),
              kInvalid, "optimizer.betas");
  ExpectError(Create([](R& r) {
                r.mutable_optimizer()->add_betas(0.9);
                r.mutable_optimizer()->add_betas(1.5);
              }),
              kInvalid, "optimizer.betas[1] must be in [0, 1), got 1.5");
  ExpectError(Create([](R& r) { r.mutable_optimizer()->set_momentum(1.0); }),
              kInvalid, "optimizer.momentum");
  ExpectError(Create([](R& r) { r.mutable_optimizer()->set_ns_steps(0); }),
              kInvalid, "optimizer.ns_steps");
  ExpectError(
      Create([](R& r) {
        r.mutable_optimizer()->set_family(static_cast<v1::OptimizerFamily>(42));
      }),
      kInvalid, "optimizer.family");
  ExpectError(Create([](R& r) { r.mutable_schedule()->set_min_lr(1.0); }),
              kInvalid, "schedule.min_lr");
  ExpectError(Create([](R& r) { r.mutable_schedule()->set_warmup_steps(-1); }),
              kInvalid, "schedule.warmup_steps");
  ExpectError(Create([](R& r) { r.mutable_training()->set_batch_size(0); }),
              kInvalid, "training.batch_size must be in [1, 4096], got 0");
  ExpectError(Create([](R& r) { r.mutable_training()->set_seq_len(1); }),
              kInvalid, "training.seq_len");
  ExpectError(Create([](R& r) { r.mutable_training()->set_grad_clip(-1); }),
              kInvalid, "training.grad_clip");
  ExpectError(Create([](R& r) { r.mutable_training()->set_epochs(0); }),
              kInvalid, "training.epochs");
  ExpectError(
      Create([](R& r) { r.mutable_training()->set_checkpoint_interval(-1); }),
      kInvalid, "training.checkpoint_interval must be in [0, ");
  ExpectError(
      Create([](R& r) { r.mutable_training()->set_checkpoint_interval(3); }),
      kInvalid,
      "training.checkpoint_interval must be 0 or at least 10 on this server "
      "(--min-checkpoint-interval), got 3");
  ExpectError(Create([](R& r) { r.clear_training_dataset(); }), kInvalid,
              "training_dataset is required");
  ExpectError(Create([](R& r) { r.set_training_dataset("my-data"); }), kInvalid,
              "training_dataset must be a name like");
  ExpectError(
      Create([](R& r) { r.set_training_dataset("datasets/ds-missing"); }),
      absl::StatusCode::kNotFound, "training_dataset");
  ExpectError(Create([](R& r) { r.set_base_model("llama-70b"); }), kInvalid,
              "base_model");
  // A huge value is not echoed whole: the error still fits in a reply.
  const absl::Status huge =
      Create([](R& r) { r.set_base_model(std::string(20000, 'm')); });
  ExpectError(huge, kInvalid, "...\" (20000 bytes)");
  EXPECT_LT(huge.message().size(), 400u);
  ExpectError(Create([](R& r) { r.mutable_training()->set_seq_len(4096); }),
              kInvalid,
              "training.seq_len must be at most the base model's "
              "max_position_embeddings (2048), got 4096");
  ExpectError(Create([](R& r) { r.set_display_name(std::string(300, 'x')); }),
              kInvalid, "display_name must be at most 256 bytes");
  ExpectError(
      Create([](R& r) { r.set_initial_adapter("adapters/adapter-none"); }),
      absl::StatusCode::kNotFound, "initial_adapter");
  // Without schedule.total_steps the schedule spans the job's 5 steps.
  ExpectError(
      Create([](R& r) { r.mutable_schedule()->set_warmup_steps(10); }),
      kInvalid,
      "schedule.warmup_steps must be in [0, total_steps = 5], got 10 (the "
      "job trains 5 steps)");
  // A sequence length that leaves no target in any example.
  ExpectError(Create([](R& r) { r.mutable_training()->set_seq_len(2); }),
              kInvalid, "training_dataset");

  v1::ListJobsRequest list;
  list.set_page_size(5000);
  ExpectError(alice_->ListJobs(list).status(), kInvalid,
              "page_size must be in [0, 1000]");
  list.set_page_size(0);
  list.set_page_token("not-a-token");
  ExpectError(alice_->ListJobs(list).status(), kInvalid, "page_token");
  // Nothing was created by the bad requests.
  auto jobs = alice_->ListAllJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
}

// One tenant's data can never fail another tenant's running job: a job
// whose sequences could exceed the model's positions is refused when it is
// created, and nothing of it reaches the co-batched step.
TEST_F(ServiceErrorsTest, SequencesPastTheModelsPositionsAreRefusedAtCreate) {
  v1::CreateJobRequest request =
      JobRequest(dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 4, 20, 1);
  auto alice_job = alice_->CreateJob(request);
  ASSERT_TRUE(alice_job.ok()) << alice_job.status();
  auto long_text = bob_->UploadDatasetContents(
      "{\"text\": \"" + std::string(3000, 'z') + "\"}\n", "long");
  ASSERT_TRUE(long_text.ok()) << long_text.status();
  v1::CreateJobRequest bobs =
      JobRequest(long_text->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 2);
  bobs.mutable_training()->set_seq_len(4096);
  ExpectError(bob_->CreateJob(bobs).status(),
              absl::StatusCode::kInvalidArgument,
              "training.seq_len must be at most the base model's "
              "max_position_embeddings (2048), got 4096");
  auto done = WaitForJob(*alice_, alice_job->name());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << done->error().message();
  auto bob_jobs = bob_->ListAllJobs();
  ASSERT_TRUE(bob_jobs.ok());
  EXPECT_TRUE(bob_jobs->empty());
}

TEST_F(ServiceErrorsTest, BadAdapterUploadsNameTheFilesNotTheStatePath) {
  auto config = LoadModelConfig(state_ + "/models/tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  LoraWeights weights(*config, torch::kCPU);
  LoraConfig lora;
  lora.rank = 4;
  ASSERT_TRUE(weights.Bind(lora).ok());
  weights.InitPeft(1);
  {
    torch::NoGradGuard no_grad;
    weights.parameters()[0].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  auto files = EncodePeftAdapter(weights, "tiny");
  ASSERT_TRUE(files.ok()) << files.status();
  v1::AttachAdapterRequest attach;
  attach.mutable_files()->set_adapter_config_json(files->config);
  attach.mutable_files()->set_adapter_model_safetensors(files->weights);
  attach.mutable_job()->set_training_dataset(dataset_);
  absl::Status status = alice_->AttachAdapter(attach).status();
  ExpectError(status, absl::StatusCode::kInvalidArgument,
              "lora_A.weight holds NaN or infinite values");
  EXPECT_THAT(std::string(status.message()),
              Not(HasSubstr(std::filesystem::absolute(state_).string())));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr(".staged")));

  attach.mutable_files()->set_adapter_config_json("{\"r\": 4");
  status = alice_->AttachAdapter(attach).status();
  ExpectError(status, absl::StatusCode::kInvalidArgument,
              "files: adapter_config.json");
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr(".staged")));
  // Nothing was stored.
  auto adapters = alice_->ListAllAdapters();
  ASSERT_TRUE(adapters.ok());
  EXPECT_TRUE(adapters->empty());
}

TEST_F(ServiceErrorsTest, BadDatasetsAreRejectedWithLineNumbers) {
  const std::string bad =
      "{\"text\": \"fine\"}\n{\"prompt\": 3}\nnot json\n{\"text\": \"ok\"}\n";
  absl::Status status = alice_->UploadDatasetContents(bad, "bad").status();
  ExpectError(status, absl::StatusCode::kInvalidArgument, "line 2");
  EXPECT_THAT(std::string(status.message()), HasSubstr("line 3"));

  const std::string big = ReversalJsonl(40000, 1);  // Over 1 MiB.
  ASSERT_GT(big.size(), size_t{1} << 20);
  ExpectError(alice_->UploadDatasetContents(big, "big").status(),
              absl::StatusCode::kInvalidArgument,
              "exceeds the upload limit of 1048576 bytes");
  // Only the valid upload from SetUp is stored.
  auto datasets = alice_->ListAllDatasets();
  ASSERT_TRUE(datasets.ok());
  EXPECT_EQ(datasets->size(), 1u);
}

TEST_F(ServiceErrorsTest, TokensAndTenantsAreEnforced) {
  ClientOptions anonymous;
  anonymous.address = server_->address();
  auto nobody = LoraplexClient::Connect(anonymous);
  ASSERT_TRUE(nobody.ok());
  ExpectError((*nobody)->GetServerInfo().status(),
              absl::StatusCode::kUnauthenticated, "requires a token");
  anonymous.token = "wrong-token-0123456789";
  auto wrong = LoraplexClient::Connect(anonymous);
  ExpectError((*wrong)->ListAllJobs().status(),
              absl::StatusCode::kUnauthenticated, "unknown token");

  auto job = alice_->CreateJob(
      JobRequest(dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  ExpectError(bob_->GetJob(job->name()).status(), absl::StatusCode::kNotFound,
              "not found");
  ExpectError(bob_->CancelJob(job->name()).status(),
              absl::StatusCode::kNotFound, "not found");
  ExpectError(bob_->GetDataset(dataset_).status(), absl::StatusCode::kNotFound,
              "not found");
  ExpectError(bob_->DeleteDataset(dataset_), absl::StatusCode::kNotFound,
              "not found");
  ExpectError(
      bob_->CreateJob(JobRequest(dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 0))
          .status(),
      absl::StatusCode::kNotFound, "training_dataset");
  auto finished = WaitForJob(*alice_, job->name());
  ASSERT_TRUE(finished.ok());
  ASSERT_EQ(finished->status(), v1::JOB_STATUS_SUCCEEDED);
  v1::ExportAdapterRequest request;
  request.set_adapter(finished->adapter());
  ExpectError(bob_->ExportAdapter(request, FreshTestDir("bob")).status(),
              absl::StatusCode::kNotFound, "not found");
  EXPECT_TRUE(bob_->ListAllJobs()->empty());
  EXPECT_TRUE(bob_->ListAllDatasets()->empty());
  EXPECT_TRUE(bob_->ListAllAdapters()->empty());
  EXPECT_EQ(alice_->ListAllJobs()->size(), 1u);

  ExpectError(alice_->GetJob("jobs/job-unknown").status(),
              absl::StatusCode::kNotFound, "not found");
  ExpectError(alice_->CancelJob(job->name()).status(),
              absl::StatusCode::kFailedPrecondition, "already finished");
  auto info = bob_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tenant(), "bob");
}

TEST(ServiceFlagsTest, RemoteListenWithoutTokensIsRefused) {
  const std::string state = FreshTestDir("state");
  const std::string command = std::string(LORAPLEX_BIN_DIR) +
                              "/loraplex-server --listen 0.0.0.0:0 "
                              "--state-dir " +
                              state + " 2> " + state + "/err";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(ReadFileForTest(state + "/err"),
              HasSubstr("not a loopback address"));
}

TEST(ServiceFlagsTest, RemoteHttpListenWithoutTokensIsRefused) {
  const std::string state = FreshTestDir("state");
  const std::string command = std::string(LORAPLEX_BIN_DIR) +
                              "/loraplex-server --listen 127.0.0.1:0 "
                              "--http-listen 0.0.0.0:0 --state-dir " +
                              state + " 2> " + state + "/err";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(ReadFileForTest(state + "/err"),
              HasSubstr("--http-listen 0.0.0.0:0 is not a loopback address"));
}

// A TLS key that cannot be read is refused at start, not served as empty
// credentials.
TEST(ServiceFlagsTest, UnreadableTlsFilesAreRefused) {
  const std::string state = FreshTestDir("state");
  const std::string command =
      std::string(LORAPLEX_BIN_DIR) +
      "/loraplex-server --listen 127.0.0.1:0 --tls-key " + state +
      "/missing.key --tls-cert " + state + "/missing.pem --state-dir " + state +
      " 2> " + state + "/err";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_THAT(ReadFileForTest(state + "/err"),
              HasSubstr(state + "/missing.key: cannot be read"));
}

// A tokenizer that can produce ids past the embedding would fail jobs in the
// middle of training; the server refuses it at start with both sizes.
TEST(ServiceFlagsTest, TokenizerLargerThanTheEmbeddingIsRefused) {
  const std::string state = FreshTestDir("state");
  const std::string model = state + "/model";
  ASSERT_TRUE(WritePresetModel("tiny", /*seed=*/1, model).ok());
  const std::string fixture = std::string(LORAPLEX_SOURCE_DIR) +
                              "/tests/fixtures/golden/tokenizers/llama3_like";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(fixture + "/" + file, model + "/" + file);
  }
  const std::string command = std::string(LORAPLEX_BIN_DIR) +
                              "/loraplex-server --state-dir " + state +
                              " --model " + model + " 2> " + state + "/err";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string log = ReadFileForTest(state + "/err") +
                          (std::filesystem::exists(state + "/server.log")
                               ? ReadFileForTest(state + "/server.log")
                               : std::string());
  EXPECT_THAT(log, HasSubstr("the tokenizer has 1511 tokens but the model's "
                             "embedding only 259 rows"));
}

TEST_F(ServiceErrorsTest, AnotherTenantsCheckpointsAreNotFound) {
  auto job = alice_->CreateJob(
      JobRequest(dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 4, 1000000, 0));
  ASSERT_TRUE(job.ok());
  auto paused = alice_->PauseJob(job->name());
  ASSERT_TRUE(paused.ok()) << paused.status();
  const std::string checkpoint =
      absl::StrCat(job->name(), "/checkpoints/", paused->metrics().step());
  v1::ExportAdapterRequest export_request;
  export_request.set_checkpoint(checkpoint);
  EXPECT_TRUE(alice_->ExportAdapter(export_request, FreshTestDir("a")).ok());
  EXPECT_EQ(alice_->ListCheckpoints(job->name())->checkpoints_size(), 1);

  EXPECT_EQ(bob_->ListCheckpoints(job->name()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(bob_->ResumeJob(job->name()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(bob_->PauseJob(job->name()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      bob_->ExportAdapter(export_request, FreshTestDir("b")).status().code(),
      absl::StatusCode::kNotFound);
  v1::CreateJobRequest from =
      JobRequest("", v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 0);
  auto bob_dataset = bob_->UploadDatasetContents(ReversalJsonl(8, 2), "b");
  ASSERT_TRUE(bob_dataset.ok());
  from.set_training_dataset(bob_dataset->name());
  from.set_initial_checkpoint(checkpoint);
  auto stolen = bob_->CreateJob(from);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(stolen.status().message(), HasSubstr("initial_checkpoint"));
  EXPECT_EQ(alice_->ResumeJob(job->name())->status(), v1::JOB_STATUS_QUEUED);
  ASSERT_TRUE(alice_->CancelJob(job->name()).ok());
}

}  // namespace
}  // namespace loraplex
