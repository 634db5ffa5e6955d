// A frozen base sharded over real ranks (Gloo over 127.0.0.1, 2 and 3
// processes) trains co-batched slots, attached, retired and reused at
// different steps, as one process with the whole base does: every loss,
// gradient norm and LoRA weight within 1e-10 in fp64 (1e-3 in fp32). The
// ranks hold different numbers of rows and micro-batches (a slot with
// fewer rows than ranks, one row per micro-batch), so the gathers of a rank
// that runs fewer micro-batches, or none, are padded. Each test re-executes
// this binary once per rank with that rank's launch variables and a scenario
// name; such a process runs the scenario and exits (kRanAsWorker).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adapters/data_parallel_slots.h"
#include "core/common/status_macros.h"
#include "core/dist/base_sharding.h"
#include "core/dist/c10d_compat.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/checkpoint_weights.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/train/co_batch_step.h"
#include "tests/common/rank_launcher.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

constexpr char kScenarioVar[] = "LORAPLEX_SHARDED_TEST_SCENARIO";

absl::Status Expect(bool condition, const std::string& what) {
  if (condition) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("check failed: ", what));
}

using Weights = std::map<std::string, std::vector<torch::Tensor>>;
// Per step, the loss and gradient norm of every slot that trained.
using StepLog = std::vector<std::vector<std::pair<double, double>>>;

// Jobs attached and retired at set steps; returns every job's final
// weights by job id.
absl::StatusOr<Weights> TrainJobs(const LlamaModel& model,
                                  DataParallelSlots* dp, StepLog* log) {
  SlotPool pool(model.config(), {.capacity = 3,
                                 .device = model.device(),
                                 .dtype = model.dtype(),
                                 .claims = dp});
  StepSync sync;
  CoBatchOptions options;
  // One row per micro-batch: ranks with fewer rows run fewer micro-batches
  // (or none), and pad their gathers.
  options.token_budget = 16;
  if (dp != nullptr) {
    sync = dp->Sync(pool);
    options.sync = &sync;
  }
  // Every projection of a layer: of a mixture-of-experts model, attention's
  // and the experts' (LoRA per expert).
  const std::vector<Projection> all = LayerProjections(model.config(), 0);
  const bool moe = model.config().moe.num_experts > 0;
  const Projection down = all.back();
  auto data = Sequences(ReversalJsonl(12, 3), 16);
  std::vector<SlotAttachRequest> jobs = {
      TrainRequest("adamw", OptimizerFamily::kAdamW, 8, all, data, 1),
      TrainRequest("muon", OptimizerFamily::kMuon, 16,
                   {Projection::kQ, Projection::kV, down}, data, 2),
      TrainRequest("adam", OptimizerFamily::kAdam, 4, all, data, 3),
      TrainRequest("late", OptimizerFamily::kAdamW, 4, all, data, 4)};
  // PEFT has no dropout on expert parameters.
  if (!moe) jobs[0].lora.dropout = 0.1;
  jobs[1].training.batch_size = 5;
  jobs[2].training.batch_size = 2;  // Fewer rows than 3 ranks.
  Weights weights;
  auto snapshot = [&](int slot) {
    std::vector<torch::Tensor> copy;
    for (const torch::Tensor& p : pool.slot(slot).weights.parameters()) {
      copy.push_back(p.detach().clone());
    }
    weights[pool.job_id(slot)] = copy;
  };
  auto train = [&](int steps) -> absl::Status {
    for (int i = 0; i < steps; ++i) {
      LORAPLEX_ASSIGN_OR_RETURN(
          std::vector<SlotStepMetrics> metrics,
          TrainCoBatchStep(model, pool.ActiveSlots(), options));
      log->emplace_back();
      for (const SlotStepMetrics& m : metrics) {
        log->back().emplace_back(m.loss, m.grad_norm);
      }
    }
    return absl::OkStatus();
  };
  LORAPLEX_RETURN_IF_ERROR(pool.Attach(jobs[0]).status());
  LORAPLEX_RETURN_IF_ERROR(pool.Attach(jobs[1]).status());
  LORAPLEX_RETURN_IF_ERROR(train(2));
  LORAPLEX_RETURN_IF_ERROR(pool.Attach(jobs[2]).status());
  LORAPLEX_RETURN_IF_ERROR(train(2));
  snapshot(0);
  LORAPLEX_RETURN_IF_ERROR(pool.Retire(0));
  LORAPLEX_RETURN_IF_ERROR(train(1));
  LORAPLEX_ASSIGN_OR_RETURN(int late, pool.Attach(jobs[3]));
  LORAPLEX_RETURN_IF_ERROR(Expect(late == 0, "the late job reuses slot 0"));
  LORAPLEX_RETURN_IF_ERROR(train(2));
  snapshot(0);
  snapshot(1);
  // Two rows alone: with 3 ranks one has none.
  LORAPLEX_RETURN_IF_ERROR(pool.Retire(0));
  LORAPLEX_RETURN_IF_ERROR(pool.Retire(1));
  LORAPLEX_RETURN_IF_ERROR(train(2));
  snapshot(2);
  return weights;
}

absl::Status ShardedTrainScenario(DistContext& dist, torch::ScalarType dtype,
                                  double bound,
                                  torch::Device device = torch::kCPU,
                                  const std::string& preset = "tiny") {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/loraplex-sharded-ranks-", getpid(), "/", preset);
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel(preset, 7, dir));
  const BaseSharding sharding = BaseShardingOver(dist);
  LORAPLEX_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaModel> sharded,
      LlamaModel::Load(
          dir, {.device = device, .dtype = dtype, .shard_base = sharding}));
  LORAPLEX_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaModel> whole,
      LlamaModel::Load(dir, {.device = device, .dtype = dtype}));
  // Its shards: 1/N of the layers (tiny has 2 layers, so with the one
  // layer's buffer 2 ranks hold as much as the whole).
  const ShardedBase& base = *sharded->sharded_base();
  LORAPLEX_RETURN_IF_ERROR(Expect(
      base.ShardBytes() * dist.world_size() >= base.WholeLayerBytes() &&
          base.ShardBytes() * dist.world_size() <
              base.WholeLayerBytes() + 64 * dist.world_size(),
      absl::StrCat("a rank holds 1/", dist.world_size(), " of the layers: ",
                   base.ShardBytes(), " of ", base.WholeLayerBytes())));
  DataParallelSlots dp(&dist, /*bucket_bytes=*/16 << 10);
  dist.ResetCounters();
  StepLog parallel_log;
  LORAPLEX_ASSIGN_OR_RETURN(Weights parallel,
                            TrainJobs(*sharded, &dp, &parallel_log));
  LORAPLEX_RETURN_IF_ERROR(
      Expect(dist.counters().all_gather_bytes > 0, "the layers were gathered"));
  // Each gather but a step's first was started while the layer before it
  // ran.
  LORAPLEX_RETURN_IF_ERROR(
      Expect(base.gathers() - base.prefetched_gathers() ==
                 static_cast<int64_t>(parallel_log.size()),
             absl::StrCat(base.prefetched_gathers(), " of ", base.gathers(),
                          " gathers were prefetched over ", parallel_log.size(),
                          " steps")));
  // The reference: the whole base in this process alone.
  StepLog alone_log;
  LORAPLEX_ASSIGN_OR_RETURN(Weights alone,
                            TrainJobs(*whole, nullptr, &alone_log));
  LORAPLEX_RETURN_IF_ERROR(
      Expect(alone_log.size() == parallel_log.size(), "as many steps"));
  for (size_t step = 0; step < alone_log.size(); ++step) {
    for (size_t i = 0; i < alone_log[step].size(); ++i) {
      const auto [loss, norm] = alone_log[step][i];
      const auto [dp_loss, dp_norm] = parallel_log.at(step).at(i);
      LORAPLEX_RETURN_IF_ERROR(Expect(
          std::abs(dp_loss - loss) <= bound * std::abs(loss) &&
              std::abs(dp_norm - norm) <= bound * norm,
          absl::StrCat("step ", step, " slot ", i, ": loss ", dp_loss, " vs ",
                       loss, ", grad norm ", dp_norm, " vs ", norm)));
    }
  }
  for (const auto& [job, tensors] : alone) {
    const double diff = MaxRelativeDiff(parallel.at(job), tensors);
    LORAPLEX_RETURN_IF_ERROR(Expect(
        diff <= bound, absl::StrCat(job, " differs from the 1-process run by ",
                                    diff, " (max element)")));
  }
  std::fprintf(
      stderr, "[rank %d] frozen base bytes: %lld sharded, %lld whole\n",
      dist.rank(), static_cast<long long>(sharded->FrozenWeightBytes()),
      static_cast<long long>(whole->FrozenWeightBytes()));
  return absl::OkStatus();
}

// A row only one rank holds fails its forward before any gather (it is
// longer than the model's positions): that rank pads its gathers to the
// others', so every rank fails the step with the step's own error (no
// gather times out) and no slot changes.
absl::Status ShardedFailureScenario(DistContext& dist) {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/loraplex-sharded-fail-", getpid(), "/tiny");
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", 7, dir));
  const BaseSharding sharding = BaseShardingOver(dist);
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                            LlamaModel::Load(dir, {.dtype = torch::kFloat64,
                                                   .shard_base = sharding}));
  const int64_t too_long = model->config().max_position_embeddings + 8;
  auto data = std::make_shared<SequenceSet>();
  for (int64_t length : {too_long, int64_t{12}, int64_t{12}, int64_t{12}}) {
    Sequence sequence;
    sequence.input_ids.assign(length, 5);
    sequence.loss_mask.assign(length, 1);
    sequence.loss_mask[0] = 0;
    data->sequences.push_back(sequence);
  }
  SlotAttachRequest job = TrainRequest("job", OptimizerFamily::kAdamW, 4,
                                       {Projection::kQ}, data, 1);
  job.training.batch_size = 4;
  job.training.seq_len = too_long;
  DataParallelSlots dp(&dist, 16 << 10);
  SlotPool pool(model->config(),
                {.capacity = 1, .dtype = model->dtype(), .claims = &dp});
  LORAPLEX_RETURN_IF_ERROR(pool.Attach(job).status());
  StepSync sync = dp.Sync(pool);
  CoBatchOptions options;
  options.sync = &sync;
  options.token_budget = 16;
  std::vector<torch::Tensor> before;
  for (const torch::Tensor& p : pool.slot(0).weights.parameters()) {
    before.push_back(p.detach().clone());
  }
  absl::StatusOr<std::vector<SlotStepMetrics>> step =
      TrainCoBatchStep(*model, pool.ActiveSlots(), options);
  LORAPLEX_RETURN_IF_ERROR(Expect(!step.ok(), "the step fails"));
  const std::string message(step.status().message());
  const bool held_it = absl::StrContains(message, "max_position_embeddings");
  LORAPLEX_RETURN_IF_ERROR(
      Expect(held_it || absl::StrContains(message, "failed on another rank"),
             message));
  const std::vector<torch::Tensor> after = pool.slot(0).weights.parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    LORAPLEX_RETURN_IF_ERROR(
        Expect(torch::equal(before[i], after[i]), "weights unchanged"));
  }
  LORAPLEX_RETURN_IF_ERROR(
      Expect(pool.slot(0).counters.steps == 0, "no step counted"));
  // Exactly one rank held the long row.
  std::vector<torch::Tensor> held = {
      torch::tensor({held_it ? 1.0 : 0.0}, torch::kDouble)};
  LORAPLEX_RETURN_IF_ERROR(dist.AllReduceSum(held, 1 << 10));
  return Expect(held[0].item<double>() == 1.0, "one rank held the long row");
}

// Rank 0 alone runs a forward and a KV-cache decode (prompt, then one
// token at a time) in its Leading scope while the other ranks serve its
// gathers: equal bit for bit to the whole base's, each layer gathered once
// per forward.
absl::Status LeadingScenario(DistContext& dist) {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/loraplex-sharded-lead-", getpid(), "/tiny");
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", 7, dir));
  LORAPLEX_ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaModel> model,
      LlamaModel::Load(dir, {.dtype = torch::kFloat64,
                             .shard_base = BaseShardingOver(dist)}));
  ShardedBase& base = *model->sharded_base();
  const int64_t layers = base.num_layers();
  if (!dist.is_root()) {
    dist.ResetCounters();
    LORAPLEX_RETURN_IF_ERROR(base.ServeGathers());
    // One forward and a decode of the prompt plus 3 tokens.
    const int64_t gathers = dist.counters().collectives;
    return Expect(gathers == 2 * (5 * layers) + 1,
                  absl::StrCat("served ", gathers, " collectives"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> whole,
                            LlamaModel::Load(dir, {.dtype = torch::kFloat64}));
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{3, 9, 4, 7, 1}, {5, 2, 8, 0, 0}});
  const torch::Tensor lengths = torch::tensor({5, 3});
  LORAPLEX_RETURN_IF_ERROR(Expect(!model->Forward(ids, lengths).ok(),
                                  "a forward outside any scope is refused"));
  ShardedBase::Leading leading(base);
  LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor logits, model->Forward(ids, lengths));
  LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor expected,
                            whole->Forward(ids, lengths));
  LORAPLEX_RETURN_IF_ERROR(
      Expect(torch::equal(logits, expected), "the forward equals the whole's"));
  KvCache cache(model->config(), 1, 16, torch::kFloat64, torch::kCPU);
  KvCache whole_cache(model->config(), 1, 16, torch::kFloat64, torch::kCPU);
  torch::Tensor tokens = torch::tensor({{3, 9}});
  for (int step = 0; step < 4; ++step) {
    LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor hidden,
                              model->ForwardCached(tokens, {}, cache));
    LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor whole_hidden,
                              whole->ForwardCached(tokens, {}, whole_cache));
    LORAPLEX_RETURN_IF_ERROR(
        Expect(torch::equal(hidden, whole_hidden),
               absl::StrCat("decode step ", step, " equals the whole's")));
    tokens = torch::tensor({{4 + step}});
  }
  return leading.End();
}

// Every rank checks the layers the ranks gathered against its own
// checkpoint: the same checkpoint passes; when rank 0's differs from the
// others' (another seed), every rank finds a difference.
absl::Status CheckGatheredScenario(DistContext& dist) {
  const std::string root =
      absl::StrCat(::testing::TempDir(), "/loraplex-sharded-check-", getpid());
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", 7, root + "/same"));
  LORAPLEX_RETURN_IF_ERROR(
      WritePresetModel("tiny", dist.is_root() ? 8 : 7, root + "/other"));
  for (const bool same : {true, false}) {
    const std::string dir = root + (same ? "/same" : "/other");
    LORAPLEX_ASSIGN_OR_RETURN(
        std::unique_ptr<LlamaModel> model,
        LlamaModel::Load(dir, {.dtype = torch::kFloat32,
                               .shard_base = BaseShardingOver(dist)}));
    LORAPLEX_ASSIGN_OR_RETURN(
        CheckpointWeights checkpoint,
        CheckpointWeights::Open(dir, model->config(), torch::kFloat32));
    ShardedBase& base = *model->sharded_base();
    ShardedBase::AllRanks all(base);
    bool differs = false;
    for (int64_t layer = 0; layer < base.num_layers(); ++layer) {
      base.Gather(layer);
      const absl::Status checked = base.CheckGathered(layer, checkpoint, 64);
      if (!checked.ok()) {
        LORAPLEX_RETURN_IF_ERROR(
            Expect(checked.code() == absl::StatusCode::kFailedPrecondition &&
                       absl::StrContains(checked.message(), "model.layers."),
                   checked.ToString()));
        differs = true;
      }
    }
    LORAPLEX_RETURN_IF_ERROR(
        Expect(differs != same, same ? "the same checkpoint passes"
                                     : "another checkpoint is found"));
  }
  return absl::OkStatus();
}

absl::Status RunWorker(const std::string& scenario) {
  LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
  // On CUDA each rank has its own GPU and NCCL carries the collectives.
  const torch::Device device =
      scenario == "train_cuda"
          ? torch::Device(torch::kCUDA,
                          static_cast<torch::DeviceIndex>(env.local_rank))
          : torch::Device(torch::kCPU);
  LORAPLEX_ASSIGN_OR_RETURN(DistContext dist, DistContext::Create(env, device));
  if (scenario == "train_cuda") {
    LORAPLEX_RETURN_IF_ERROR(ShardedTrainScenario(dist, torch::kFloat64,
                                                  kFp64IdentityBound, device));
  } else if (scenario == "train_moe") {
    LORAPLEX_RETURN_IF_ERROR(ShardedTrainScenario(
        dist, torch::kFloat64, kFp64IdentityBound, device, "tiny-moe"));
  } else if (scenario == "train") {
    LORAPLEX_RETURN_IF_ERROR(
        ShardedTrainScenario(dist, torch::kFloat64, kFp64IdentityBound));
  } else if (scenario == "failure") {
    LORAPLEX_RETURN_IF_ERROR(ShardedFailureScenario(dist));
  } else if (scenario == "leading") {
    LORAPLEX_RETURN_IF_ERROR(LeadingScenario(dist));
  } else if (scenario == "check_gathered") {
    LORAPLEX_RETURN_IF_ERROR(CheckGatheredScenario(dist));
  } else if (scenario == "train_fp32") {
    LORAPLEX_RETURN_IF_ERROR(
        ShardedTrainScenario(dist, torch::kFloat32, kFp32SmokeBound));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown scenario '", scenario, "'"));
  }
  // Rank 0 hosts the store: nobody leaves before everyone is done with it.
  return dist.Barrier();
}

[[maybe_unused]] const bool kRanAsWorker =
    RunAsRankWorker(kScenarioVar, RunWorker);

// Every rank's exit code (-1: killed after the deadline). Each rank trains
// sharded, then alone for its reference, on a loaded 2-core machine: a
// generous collective timeout.
std::vector<int> RunRanks(const std::string& scenario, int world_size) {
  return LaunchRanks({.scenario_var = kScenarioVar,
                      .scenario = scenario,
                      .world_size = world_size,
                      .ranks = {},  // All of them.
                      .timeout_seconds = 150})
      .exit_codes;
}

TEST(ShardedBaseRanksTest, TrainingEqualsOneProcessTwoRanks) {
  EXPECT_THAT(RunRanks("train", 2), testing::Each(0));
}
TEST(ShardedBaseRanksTest, TrainingEqualsOneProcessThreeRanks) {
  EXPECT_THAT(RunRanks("train", 3), testing::Each(0));
}
// A mixture-of-experts base (tiny-moe: every layer's MLP 8 experts, LoRA
// on attention and every expert): its expert stacks shard like any tensor,
// and 3 ranks train as one process.
TEST(ShardedBaseRanksTest, MixtureOfExpertsTrainsAsOneProcessThreeRanks) {
  EXPECT_THAT(RunRanks("train_moe", 3), testing::Each(0));
}
TEST(ShardedBaseRanksTest, StepFailingOnOneRankFailsOnAllWithoutWaiting) {
  EXPECT_THAT(RunRanks("failure", 3), testing::Each(0));
}
TEST(ShardedBaseRanksTest, RankZeroAloneForwardsWhileOthersServeGathers) {
  EXPECT_THAT(RunRanks("leading", 3), testing::Each(0));
}
TEST(ShardedBaseRanksTest, GatheredLayersAreCheckedAgainstEachRanksCheckpoint) {
  EXPECT_THAT(RunRanks("check_gathered", 2), testing::Each(0));
}
// NCCL over two GPUs, one per rank (fp64, as the Gloo runs above).
TEST(ShardedBaseRanksTest, TrainingOnCudaWithNcclEqualsOneProcess) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices";
  }
  if (!C10dCollectives::NcclAvailable()) {
    GTEST_SKIP() << "built without NCCL (LORAPLEX_WITH_NCCL)";
  }
  EXPECT_THAT(RunRanks("train_cuda", 2), testing::Each(0));
}
TEST(ShardedBaseRanksTest, TrainingInFp32StaysNearOneProcess) {
  EXPECT_THAT(RunRanks("train_fp32", 2), testing::Each(0));
}

}  // namespace
}  // namespace loraplex
