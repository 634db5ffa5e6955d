// Shared pieces of the service tests: a real loraplex-server on a free
// loopback port, a real client for it, job requests, waiting for jobs, and
// the same job trained directly through the engine as the reference.
#ifndef LORAPLEX_TESTS_SERVER_GRPC_FIXTURE_H_
#define LORAPLEX_TESTS_SERVER_GRPC_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "adapters/slot_pool.h"
#include "client/client.h"
#include "core/model/llama_model.h"
#include "core/train/co_batch_step.h"
#include "server/grpc/proto_convert.h"
#include "tests/common/server_process.h"
#include "tests/common/test_dir.h"
#include "tests/common/train_fixture.h"

namespace loraplex {

inline std::string ReadFileForTest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

inline std::unique_ptr<ServerProcess> StartServer(
    const std::string& state_dir, int slots,
    std::vector<std::string> extra_args = {}) {
  ServerProcessOptions options;
  options.state_dir = state_dir;
  options.slots = slots;
  options.extra_args = std::move(extra_args);
  options.extra_args.push_back("--throughput-log-seconds=1");
  options.extra_args.push_back("--log-level=debug");
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// An exported adapter_config.json without base_model_name_or_path, which
// names each server's own base directory: what two servers that trained
// the same adapter from different state dirs agree on.
inline std::string AdapterConfigWithoutBase(const std::string& path) {
  nlohmann::json config = nlohmann::json::parse(ReadFileForTest(path));
  EXPECT_TRUE(config.contains("base_model_name_or_path")) << path;
  config.erase("base_model_name_or_path");
  return config.dump(2);
}

inline std::unique_ptr<LoraplexClient> ClientFor(
    const ServerProcess& server, const std::string& token = "") {
  ClientOptions options;
  options.address = server.address();
  options.token = token;
  auto client = LoraplexClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

inline v1::CreateJobRequest JobRequest(const std::string& dataset,
                                       v1::OptimizerFamily family, int64_t rank,
                                       int64_t steps, uint64_t seed) {
  v1::CreateJobRequest request;
  request.set_training_dataset(dataset);
  request.mutable_lora()->set_rank(rank);
  request.mutable_lora()->set_alpha(2.0 * static_cast<double>(rank));
  request.mutable_optimizer()->set_family(family);
  request.mutable_optimizer()->set_lr(
      family == v1::OPTIMIZER_FAMILY_MUON ? 2e-2 : 2e-3);
  request.mutable_schedule()->set_warmup_steps(2);
  request.mutable_training()->set_batch_size(4);
  request.mutable_training()->set_seq_len(32);
  request.mutable_training()->set_max_steps(steps);
  request.mutable_training()->set_seed(seed);
  return request;
}

// An AttachAdapterRequest that uploads a fresh rank-4 PEFT adapter for the
// model in `model_dir` with `job` (its initial weights: PEFT's init).
inline v1::AttachAdapterRequest AttachNewAdapter(const std::string& model_dir,
                                                 v1::CreateJobRequest job) {
  v1::AttachAdapterRequest attach;
  auto config = LoadModelConfig(model_dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return attach;
  LoraWeights weights(*config, torch::kCPU);
  LoraConfig lora;
  lora.rank = 4;
  EXPECT_TRUE(weights.Bind(lora).ok());
  weights.InitPeft(1);
  auto files = EncodePeftAdapter(weights, "tiny");
  EXPECT_TRUE(files.ok()) << files.status();
  if (!files.ok()) return attach;
  attach.mutable_files()->set_adapter_config_json(files->config);
  attach.mutable_files()->set_adapter_model_safetensors(files->weights);
  *attach.mutable_job() = std::move(job);
  return attach;
}

// Polls GetJob until the job is SUCCEEDED, FAILED or CANCELLED.
inline absl::StatusOr<v1::Job> WaitForJob(LoraplexClient& client,
                                          const std::string& name,
                                          int timeout_seconds = 180) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  for (;;) {
    absl::StatusOr<v1::Job> job = client.GetJob(name);
    if (!job.ok()) return job.status();
    const v1::JobStatus status = job->status();
    if (status == v1::JOB_STATUS_SUCCEEDED || status == v1::JOB_STATUS_FAILED ||
        status == v1::JOB_STATUS_CANCELLED) {
      return job;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " still ", v1::JobStatus_Name(status), " after ",
                       timeout_seconds, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Creates `request`'s job and waits for it: the job once SUCCEEDED, else an
// error with its status, its error and the server's log.
inline absl::StatusOr<v1::Job> TrainToSuccess(
    LoraplexClient& client, const v1::CreateJobRequest& request,
    const ServerProcess& server) {
  absl::StatusOr<v1::Job> job = client.CreateJob(request);
  if (!job.ok()) return job.status();
  absl::StatusOr<v1::Job> done = WaitForJob(client, job->name());
  if (!done.ok()) return done.status();
  if (done->status() != v1::JOB_STATUS_SUCCEEDED) {
    return absl::InternalError(absl::StrCat(
        done->name(), " ended ", v1::JobStatus_Name(done->status()), ": ",
        done->error().message(), "\n", server.Log()));
  }
  return done;
}

// Polls until `predicate(job)` holds.
template <typename Predicate>
absl::StatusOr<v1::Job> WaitUntil(LoraplexClient& client,
                                  const std::string& name, Predicate predicate,
                                  int timeout_seconds = 120) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  for (;;) {
    absl::StatusOr<v1::Job> job = client.GetJob(name);
    if (!job.ok() || predicate(*job)) return job;
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(name + ": condition never held");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Step -> loss of the job's last run (the metric events after its last
// RUNNING event), and that event's message.
struct RunLosses {
  std::map<int64_t, double> loss;
  std::string running_message;
};

inline RunLosses LastRun(LoraplexClient& client, const std::string& job) {
  RunLosses run;
  auto events = client.ListAllJobEvents(job);
  EXPECT_TRUE(events.ok()) << events.status();
  if (!events.ok()) return run;
  for (const v1::JobEvent& event : *events) {
    if (event.has_status_change() &&
        event.status_change().status() == v1::JOB_STATUS_RUNNING) {
      run.loss.clear();
      run.running_message = event.status_change().message();
    } else if (event.has_metrics() && event.metrics().step() > 0 &&
               !event.metrics().has_validation_loss()) {
      run.loss[event.metrics().step()] = event.metrics().loss();
    }
  }
  return run;
}

// The A and B matrices of an adapter, in module order.
inline std::vector<torch::Tensor> AdapterTensors(const PeftAdapter& adapter) {
  std::vector<torch::Tensor> tensors;
  for (const PeftModuleTensors& m : adapter.modules) {
    tensors.push_back(m.a);
    tensors.push_back(m.b);
  }
  return tensors;
}

// Jobs created on a one-slot server with checkpoints off that is killed at
// once, in `state`: every copy of that state dir starts the jobs (none has
// finished, none has a checkpoint) from step 0, attached together at one
// step boundary as a restart recovers them, so runs on copies are
// comparable. The requests' training dataset is set to one of `jsonl`.
struct StagedJobs {
  std::string dataset;
  std::vector<std::string> jobs;
};

inline StagedJobs StageJobs(const std::string& state, const std::string& jsonl,
                            std::vector<v1::CreateJobRequest> requests,
                            const std::string& threads_flag,
                            const std::vector<std::string>& more_flags = {}) {
  StagedJobs staged;
  std::vector<std::string> flags = {"--checkpoint-interval=0", threads_flag};
  flags.insert(flags.end(), more_flags.begin(), more_flags.end());
  auto server = StartServer(state, /*slots=*/1, flags);
  EXPECT_NE(server, nullptr);
  if (server == nullptr) return staged;
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(jsonl, "d");
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  if (!dataset.ok()) return staged;
  staged.dataset = dataset->name();
  for (v1::CreateJobRequest& request : requests) {
    request.set_training_dataset(staged.dataset);
    auto job = client->CreateJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) staged.jobs.push_back(job->name());
  }
  server->Kill();
  return staged;
}

// A copy of the state dir `from`, in a fresh test directory.
inline std::string CopyOfState(const std::string& from,
                               const std::string& name) {
  const std::string dir = FreshTestDir(name);
  std::filesystem::copy(from, dir, std::filesystem::copy_options::recursive);
  return dir;
}

// Adapters trained in fp64 (--dtype=float64) by two runs that group the
// same math differently: equal within kFp64IdentityBound, element by
// element relative to each tensor's largest value.
inline void ExpectFp64Identity(const std::vector<torch::Tensor>& actual,
                               const std::vector<torch::Tensor>& expected,
                               const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_FALSE(expected.empty()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].scalar_type(), torch::kFloat64) << what;
    ASSERT_EQ(expected[i].scalar_type(), torch::kFloat64) << what;
    EXPECT_LE(MaxRelativeDiff(actual[i], expected[i]), kFp64IdentityBound)
        << what << " tensor " << i;
  }
}

// Trains the job `job` describes (its effective configs) alone in a fresh
// slot pool of the engine in fp64, on the same data, and returns its
// weights: the reference for a server run with --dtype=float64.
inline std::vector<torch::Tensor> TrainDirectly(const std::string& model_dir,
                                                const std::string& jsonl,
                                                const v1::Job& job) {
  auto model = LlamaModel::Load(model_dir, {.dtype = torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto spec = JobSpecFromProto(job.lora(), job.optimizer(), job.schedule(),
                               job.training());
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  SlotPool pool((*model)->config(), {.capacity = 1, .dtype = torch::kFloat64});
  SlotAttachRequest request;
  request.job_id = job.name();
  request.lora = spec->lora;
  request.optimizer = spec->optimizer;
  request.schedule = spec->schedule;
  request.training = spec->training;
  request.data = Sequences(jsonl, spec->training.seq_len);
  auto slot = pool.Attach(request);
  EXPECT_TRUE(slot.ok()) << slot.status();
  if (!slot.ok()) return {};
  while (!pool.ActiveSlotIds().empty()) {
    auto step = TrainCoBatchStep(**model, pool.ActiveSlots(), {});
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return {};
  }
  std::vector<torch::Tensor> tensors;
  for (const LoraModule& m : pool.slot(*slot).weights.modules()) {
    tensors.push_back(m.a.detach().clone());
    tensors.push_back(m.b.detach().clone());
  }
  return tensors;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_GRPC_FIXTURE_H_
