// End to end through the real binaries: upload, train several adapters
// together, watch, export, and compare with the engine run directly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <map>

#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// SOAP preconditions only the rank side of each LoRA matrix: the long
// side's factor stays rank-deficient for many steps, and its eigenbasis on
// the null space is decided by rounding alone, so co-batched and solo runs
// would part there by whole steps (CoBatchStepTest explains).
void PreconditionRankSideOnly(v1::CreateJobRequest& request) {
  if (request.optimizer().family() == v1::OPTIMIZER_FAMILY_SOAP) {
    request.mutable_optimizer()->set_max_precond_dim(
        static_cast<int32_t>(request.lora().rank()));
  }
}

TEST(ServiceEndToEndTest, JobsTrainTogetherAndExportTheEngineWeights) {
  const std::string state = FreshTestDir("state");
  // In fp64, so the server's co-batched results and the engine's solo ones
  // agree far below fp32 rounding.
  auto server = StartServer(state, /*slots=*/5,
                            {"--dtype=float64", "--model-name=acme/tiny-base"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);

  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->base_model().name(), "acme/tiny-base");
  EXPECT_EQ(info->slot_capacity(), 5);
  EXPECT_EQ(info->tenant(), "default");

  const std::string jsonl = ReversalJsonl(40, 7);
  auto dataset = client->UploadDatasetContents(jsonl, "reversal");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 40);
  EXPECT_EQ(dataset->size_bytes(), static_cast<int64_t>(jsonl.size()));

  const std::vector<std::pair<v1::OptimizerFamily, int64_t>> kinds = {
      {v1::OPTIMIZER_FAMILY_ADAMW, 8},
      {v1::OPTIMIZER_FAMILY_MUON, 16},
      {v1::OPTIMIZER_FAMILY_ADAM, 4},
      {v1::OPTIMIZER_FAMILY_LION, 4},
      {v1::OPTIMIZER_FAMILY_SOAP, 4}};
  std::vector<v1::Job> jobs;
  for (size_t i = 0; i < kinds.size(); ++i) {
    v1::CreateJobRequest request = JobRequest(dataset->name(), kinds[i].first,
                                              kinds[i].second, 25, 100 + i);
    PreconditionRankSideOnly(request);
    auto job = client->CreateJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->status(), v1::JOB_STATUS_QUEUED);
    EXPECT_EQ(job->total_steps(), 25);
    EXPECT_EQ(job->lora().rank(), kinds[i].second);
    jobs.push_back(*job);
  }

  // Watch the first job's whole event stream.
  std::vector<v1::JobEvent> events;
  ASSERT_TRUE(client
                  ->WatchJob(jobs[0].name(), 0,
                             [&](const v1::JobEvent& event) {
                               events.push_back(event);
                               return true;
                             })
                  .ok());
  ASSERT_FALSE(events.empty());
  std::vector<v1::JobStatus> statuses;
  int64_t metric_events = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1));
    if (events[i].has_status_change()) {
      statuses.push_back(events[i].status_change().status());
    } else {
      ++metric_events;
      EXPECT_EQ(events[i].metrics().step(), metric_events);
    }
  }
  EXPECT_EQ(metric_events, 25);
  EXPECT_EQ(statuses, (std::vector<v1::JobStatus>{
                          v1::JOB_STATUS_VALIDATING, v1::JOB_STATUS_QUEUED,
                          v1::JOB_STATUS_RUNNING, v1::JOB_STATUS_SUCCEEDED}));

  // Resuming the watch after sequence k gives exactly the rest.
  std::vector<v1::JobEvent> resumed;
  ASSERT_TRUE(client
                  ->WatchJob(jobs[0].name(), 10,
                             [&](const v1::JobEvent& event) {
                               resumed.push_back(event);
                               return true;
                             })
                  .ok());
  ASSERT_EQ(resumed.size(), events.size() - 10);
  EXPECT_EQ(resumed.front().sequence(), 11);

  const std::string model_dir = state + "/models/tiny";
  auto model_config = LoadModelConfig(model_dir);
  ASSERT_TRUE(model_config.ok());
  for (const v1::Job& created : jobs) {
    auto job = WaitForJob(*client, created.name());
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->status(), v1::JOB_STATUS_SUCCEEDED)
        << job->error().message() << "\n"
        << server->Log();
    EXPECT_EQ(job->metrics().step(), 25);
    EXPECT_GT(job->metrics().tokens(), 0);
    EXPECT_FALSE(job->adapter().empty());

    const std::string out = FreshTestDir(created.name().substr(5));
    v1::ExportAdapterRequest request;
    request.set_job(job->name());
    auto files = client->ExportAdapter(request, out);
    ASSERT_TRUE(files.ok()) << files.status();
    ASSERT_EQ(files->size(), 2u);
    auto exported = LoadPeftAdapter(out, *model_config);
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->config.rank, job->lora().rank());
    EXPECT_EQ(exported->base_model_name_or_path, "acme/tiny-base");

    const std::vector<torch::Tensor> expected =
        TrainDirectly(model_dir, jsonl, *job);
    ASSERT_FALSE(expected.empty());
    // Co-batched with other slots, a slot's result equals its solo run up
    // to rounding of the regrouped rows.
    ExpectFp64Identity(AdapterTensors(*exported), expected, job->name());
  }

  auto listed = client->ListAllJobs({v1::JOB_STATUS_SUCCEEDED});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 5u);
  auto adapters = client->ListAllAdapters();
  ASSERT_TRUE(adapters.ok());
  EXPECT_EQ(adapters->size(), 5u);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("SUCCEEDED"));
  EXPECT_THAT(server->Log(), HasSubstr("throughput:"));
}

// The server on the GPU (--device=cuda): jobs of every optimizer family
// train together there, are checkpointed, and export what each
// trains alone on the CPU (fp64, as the devices' kernels round
// differently).
TEST(ServiceEndToEndTest, JobsTrainOnCudaAndExportTheEngineWeights) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string state = FreshTestDir("state");
  auto server = StartServer(
      state, /*slots=*/3,
      {"--device=cuda", "--dtype=float64", "--checkpoint-interval=5"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->runtime().cuda_devices_size(), 1);

  const std::string jsonl = ReversalJsonl(40, 8);
  auto dataset = client->UploadDatasetContents(jsonl, "reversal");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<v1::Job> jobs;
  int seed = 200;
  for (auto [family, rank] :
       std::vector<std::pair<v1::OptimizerFamily, int64_t>>{
           {v1::OPTIMIZER_FAMILY_ADAMW, 8},
           {v1::OPTIMIZER_FAMILY_MUON, 16},
           {v1::OPTIMIZER_FAMILY_ADAM, 4},
           {v1::OPTIMIZER_FAMILY_LION, 4},
           {v1::OPTIMIZER_FAMILY_SOAP, 4}}) {
    v1::CreateJobRequest request =
        JobRequest(dataset->name(), family, rank, 12, seed++);
    request.mutable_lora()->set_dropout(0.1);
    PreconditionRankSideOnly(request);
    auto job = client->CreateJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.push_back(*job);
  }
  const std::string model_dir = state + "/models/tiny";
  auto model_config = LoadModelConfig(model_dir);
  ASSERT_TRUE(model_config.ok()) << model_config.status();
  for (const v1::Job& created : jobs) {
    auto job = WaitForJob(*client, created.name());
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->status(), v1::JOB_STATUS_SUCCEEDED)
        << job->error().message() << "\n"
        << server->Log();
    const std::string out = FreshTestDir(created.name().substr(5));
    v1::ExportAdapterRequest request;
    request.set_job(job->name());
    ASSERT_TRUE(client->ExportAdapter(request, out).ok());
    auto exported = LoadPeftAdapter(out, *model_config);
    ASSERT_TRUE(exported.ok()) << exported.status();
    ExpectFp64Identity(AdapterTensors(*exported),
                       TrainDirectly(model_dir, jsonl, *job), job->name());
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("on cuda"));
}

TEST(ServiceEndToEndTest, ExportsARunningJobAndContinuesFromAnAdapter) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/2);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  const std::string jsonl = ReversalJsonl(40, 3);
  auto dataset = client->UploadDatasetContents(jsonl, "reversal");
  ASSERT_TRUE(dataset.ok()) << dataset.status();

  auto long_job = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 8, 100000, 1));
  ASSERT_TRUE(long_job.ok()) << long_job.status();
  auto running = WaitUntil(*client, long_job->name(), [](const v1::Job& job) {
    return job.metrics().step() >= 3;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  v1::ExportAdapterRequest export_request;
  export_request.set_job(long_job->name());
  const std::string snapshot = FreshTestDir("snapshot");
  auto files = client->ExportAdapter(export_request, snapshot);
  ASSERT_TRUE(files.ok()) << files.status();
  auto model_config = LoadModelConfig(state + "/models/tiny");
  ASSERT_TRUE(model_config.ok());
  auto snapshot_adapter = LoadPeftAdapter(snapshot, *model_config);
  ASSERT_TRUE(snapshot_adapter.ok()) << snapshot_adapter.status();
  // With neither --model-name nor a _name_or_path in config.json, exports
  // point at the base's directory, which PEFT and vLLM load from.
  EXPECT_EQ(snapshot_adapter->base_model_name_or_path,
            std::filesystem::absolute(state + "/models/tiny")
                .lexically_normal()
                .string());
  ASSERT_TRUE(client->CancelJob(long_job->name()).ok());

  // Upload the snapshot as an adapter and evaluate it; then continue
  // training it in a new job.
  v1::AttachAdapterRequest attach;
  attach.mutable_files()->set_adapter_config_json(
      ReadFileForTest(snapshot + "/adapter_config.json"));
  attach.mutable_files()->set_adapter_model_safetensors(
      ReadFileForTest(snapshot + "/adapter_model.safetensors"));
  attach.mutable_job()->set_validation_dataset(dataset->name());
  attach.mutable_job()->mutable_training()->set_seq_len(32);
  auto evaluation = client->AttachAdapter(attach);
  ASSERT_TRUE(evaluation.ok()) << evaluation.status();
  EXPECT_EQ(evaluation->adapter().lora().rank(), 8);
  auto evaluated = WaitForJob(*client, evaluation->job().name());
  ASSERT_TRUE(evaluated.ok());
  ASSERT_EQ(evaluated->status(), v1::JOB_STATUS_SUCCEEDED)
      << evaluated->error().message();
  ASSERT_TRUE(evaluated->metrics().has_validation_loss());
  EXPECT_GT(evaluated->metrics().validation_loss(), 0.0);

  v1::AttachAdapterRequest resume;
  resume.set_adapter(evaluation->adapter().name());
  *resume.mutable_job() =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_MUON, 8, 5, 2);
  resume.mutable_job()->mutable_lora()->set_rank(4);  // The adapter's wins.
  auto continued = client->AttachAdapter(resume);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_EQ(continued->job().lora().rank(), 8);
  EXPECT_EQ(continued->job().initial_adapter(), evaluation->adapter().name());
  auto finished = WaitForJob(*client, continued->job().name());
  ASSERT_TRUE(finished.ok());
  EXPECT_EQ(finished->status(), v1::JOB_STATUS_SUCCEEDED)
      << finished->error().message();
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
