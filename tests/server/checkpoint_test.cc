// Slot checkpoints on disk (server/trainer/checkpoint.h): a restored slot
// equals the saved one in every tensor and counter and trains on exactly as
// the uninterrupted slot; damaged checkpoints are rejected with a reason;
// failed writes leave the previous checkpoints alone. A slot on a
// mixture-of-experts base (experts adapted) resumes bit for bit too.
#include "server/trainer/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/cuda.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "adapters/peft_adapter.h"
#include "adapters/slot_pool.h"
#include "core/common/status_macros.h"
#include "core/model/model_presets.h"
#include "core/train/co_batch_step.h"
#include "tests/common/golden_files.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

// The slot's checkpoint with its training state, as the trainer writes it.
absl::Status WriteSlotCheckpoint(const std::string& job_dir,
                                 const TrainingSlot& slot,
                                 const CheckpointInfo& info,
                                 const std::string& base_model_name,
                                 int keep_last, int64_t keep_step = -1) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string state, SaveTrainingState(slot));
  return WriteCheckpoint(job_dir, slot, info, state, base_model_name, keep_last,
                         keep_step);
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr std::array<Projection, 7> kAllTargets = {
    Projection::kQ,    Projection::kK,  Projection::kV,   Projection::kO,
    Projection::kGate, Projection::kUp, Projection::kDown};

SlotAttachRequest Request(OptimizerFamily family, int64_t rank) {
  SlotAttachRequest request = TrainRequest(
      "job-a", family, rank,
      std::vector<Projection>(kAllTargets.begin(), kAllTargets.end()),
      Sequences(ReversalJsonl(10, 7), 16), 11);
  request.lora.dropout = 0.1;  // The dropout masks must replay too.
  request.optimizer.lr = family == OptimizerFamily::kMuon ? 2e-2 : 5e-3;
  return request;
}

void Train(SlotPool& pool, int steps, const LlamaModel& model = TinyModel()) {
  for (int i = 0; i < steps; ++i) {
    auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), {});
    ASSERT_TRUE(metrics.ok()) << metrics.status();
  }
}

// What the trainer records for the slot (see Trainer::CheckpointSlot).
CheckpointInfo InfoOf(const TrainingSlot& slot, int slot_index) {
  CheckpointInfo info;
  info.job_id = "job-a";
  info.time_ms = 1700000000123;
  info.slot = slot_index;
  info.total_steps = slot.total_steps;
  info.counters = slot.counters;
  info.tokens = 1234;
  info.cursor = slot.cursor->state();
  info.metrics = CheckpointMetrics{2.5, 1e-3, 0.75, 2.25};
  info.job_spec = {{"note", "the job's spec"}};
  return info;
}

// Writes a checkpoint of a job trained `steps` steps into `job_dir`.
void WriteAfter(const std::string& job_dir, const std::vector<int>& steps,
                int keep_last = 10) {
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(pool.Attach(Request(OptimizerFamily::kAdamW, 4)).ok());
  int done = 0;
  for (int step : steps) {
    Train(pool, step - done);
    done = step;
    ASSERT_TRUE(WriteSlotCheckpoint(job_dir, pool.slot(0),
                                    InfoOf(pool.slot(0), 0), "tiny", keep_last)
                    .ok());
  }
}

std::vector<int64_t> StateSteps(const SlotOptimizer& optimizer) {
  std::vector<int64_t> steps;
  for (const OptimizerChild& child : optimizer.children()) {
    for (const ParamStateRef& ref : child.states()) {
      steps.push_back(ref.step == nullptr ? -1 : *ref.step);
    }
  }
  return steps;
}

void ExpectAllEqual(const std::vector<torch::Tensor>& a,
                    const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
  }
}

class CheckpointRoundTripTest
    : public ::testing::TestWithParam<OptimizerFamily> {};

TEST_P(CheckpointRoundTripTest, RestoredSlotEqualsSavedAndTrainsOnIdentically) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  SlotPool original(TinyModel().config(), {.capacity = 2});
  // Slot 1, so the recorded slot is not just the default.
  ASSERT_TRUE(original.Attach(Request(OptimizerFamily::kAdam, 2)).ok());
  ASSERT_EQ(*original.Attach(Request(GetParam(), 8)), 1);
  ASSERT_TRUE(original.Retire(0).ok());
  Train(original, 5);
  const TrainingSlot& saved = original.slot(1);
  ASSERT_TRUE(
      WriteSlotCheckpoint(job_dir, saved, InfoOf(saved, 1), "tiny", 3).ok());
  const std::string dir = CheckpointDir(job_dir, 5);
  ASSERT_TRUE(VerifyCheckpoint(dir).ok());
  auto info = ReadCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(CheckpointInfoToJson(*info),
            CheckpointInfoToJson(InfoOf(saved, 1)));

  // A fresh pool whose slot never saw a gradient: its optimizer state is
  // created eagerly at attach, then overwritten by the checkpoint's.
  SlotPool restored(TinyModel().config(), {.capacity = 2});
  SlotAttachRequest request = Request(GetParam(), 8);
  auto adapter = LoadPeftAdapter(dir, TinyModel().config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  request.initial_weights = std::make_shared<const PeftAdapter>(*adapter);
  request.preferred_slot = info->slot;
  ASSERT_EQ(*restored.Attach(request), 1);
  TrainingSlot& slot = restored.slot(1);
  auto state = ReadCheckpointFile(dir, kCheckpointStateFile);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(RestoreCheckpoint(dir, *info, *state, slot).ok());

  ExpectAllEqual(Snapshot(slot.weights), Snapshot(saved.weights));
  ExpectAllEqual(OptimizerStateTensors(*slot.optimizer),
                 OptimizerStateTensors(*saved.optimizer));
  EXPECT_EQ(StateSteps(*slot.optimizer), StateSteps(*saved.optimizer));
  EXPECT_THAT(StateSteps(*slot.optimizer), ::testing::Each(5));
  EXPECT_EQ(slot.scheduler->completed_steps(), 5);
  EXPECT_EQ(slot.scheduler->lr(), saved.scheduler->lr());
  EXPECT_EQ(slot.optimizer->lr(), saved.optimizer->lr());
  EXPECT_EQ(DataCursorStateToJson(slot.cursor->state()),
            DataCursorStateToJson(saved.cursor->state()));
  EXPECT_EQ(slot.counters.steps, saved.counters.steps);
  EXPECT_EQ(slot.counters.skipped_steps, saved.counters.skipped_steps);
  EXPECT_EQ(slot.counters.target_tokens, saved.counters.target_tokens);

  // Both train on alone: bit-identical, dropout and data order included.
  Train(original, 15);
  Train(restored, 15);
  ExpectAllEqual(Snapshot(slot.weights), Snapshot(original.slot(1).weights));
  ExpectAllEqual(OptimizerStateTensors(*slot.optimizer),
                 OptimizerStateTensors(*original.slot(1).optimizer));
  EXPECT_TRUE(slot.done());
}

// A checkpoint of a slot on the GPU restores exactly into a fresh GPU slot
// and into a CPU slot, and both train on as the uninterrupted slot does
// (in fp64, as the two devices' kernels round differently).
TEST_P(CheckpointRoundTripTest, GpuCheckpointRestoresOnCudaAndOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LlamaModel& cuda_model = TinyModelOn(CudaDevice(), torch::kFloat64);
  const std::string job_dir = FreshTestDir("ckpt-cuda") + "/job-a";
  SlotPool original(
      cuda_model.config(),
      {.capacity = 1, .device = CudaDevice(), .dtype = torch::kFloat64});
  ASSERT_TRUE(original.Attach(Request(GetParam(), 8)).ok());
  Train(original, 5, cuda_model);
  const TrainingSlot& saved = original.slot(0);
  ASSERT_TRUE(
      WriteSlotCheckpoint(job_dir, saved, InfoOf(saved, 0), "tiny", 3).ok());
  const std::string dir = CheckpointDir(job_dir, 5);
  auto info = ReadCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  auto state = ReadCheckpointFile(dir, kCheckpointStateFile);
  ASSERT_TRUE(state.ok()) << state.status();
  auto adapter = LoadPeftAdapter(dir, cuda_model.config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();

  const std::vector<torch::Tensor> saved_weights =
      OnCpu(Snapshot(saved.weights));
  const std::vector<torch::Tensor> saved_state =
      OnCpu(OptimizerStateTensors(*saved.optimizer));
  const std::vector<int64_t> saved_steps = StateSteps(*saved.optimizer);
  // What each restored slot must end at.
  Train(original, 15, cuda_model);

  struct Target {
    const LlamaModel* model;
    torch::Device device;
  };
  for (const Target& target : {Target{&cuda_model, CudaDevice()},
                               Target{&TinyModel64(), torch::kCPU}}) {
    SCOPED_TRACE(target.device.str());
    SlotPool restored(
        target.model->config(),
        {.capacity = 1, .device = target.device, .dtype = torch::kFloat64});
    SlotAttachRequest request = Request(GetParam(), 8);
    request.initial_weights = std::make_shared<const PeftAdapter>(*adapter);
    ASSERT_EQ(*restored.Attach(request), 0);
    TrainingSlot& slot = restored.slot(0);
    ASSERT_TRUE(RestoreCheckpoint(dir, *info, *state, slot).ok());
    EXPECT_EQ(slot.weights.modules()[0].a.device(), target.device);
    ExpectAllEqual(OnCpu(Snapshot(slot.weights)), saved_weights);
    ExpectAllEqual(OnCpu(OptimizerStateTensors(*slot.optimizer)), saved_state);
    EXPECT_EQ(StateSteps(*slot.optimizer), saved_steps);
    EXPECT_EQ(slot.scheduler->completed_steps(), 5);

    Train(restored, 15, *target.model);
    EXPECT_TRUE(slot.done());
    EXPECT_LE(MaxRelativeDiff(OnCpu(Snapshot(slot.weights)),
                              OnCpu(Snapshot(original.slot(0).weights))),
              kFp64IdentityBound);
    EXPECT_LE(MaxRelativeDiff(
                  OnCpu(OptimizerStateTensors(*slot.optimizer)),
                  OnCpu(OptimizerStateTensors(*original.slot(0).optimizer))),
              kFp64IdentityBound);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CheckpointRoundTripTest,
                         ::testing::ValuesIn(kAllOptimizerFamilies));

// qwen3_moe's architecture (routed experts, a dense layer) with random
// weights at the byte tokenizer's vocabulary.
const LlamaModel& MoeModel() {
  static const LlamaModel* model = [] {
    auto config = LoadModelConfig(GoldenPath("qwen3_moe"));
    EXPECT_TRUE(config.ok()) << config.status();
    config->vocab_size = 320;
    const std::string dir = FreshTestDir("moe-model");
    EXPECT_TRUE(WriteRandomModel(*config, /*seed=*/5, dir).ok());
    auto loaded = LlamaModel::Load(dir, {});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded->release();
  }();
  return *model;
}

class MoeCheckpointRoundTripTest
    : public ::testing::TestWithParam<OptimizerFamily> {};

// A slot on a mixture-of-experts base whose default targets adapt attention,
// the experts' stacked parameters and the dense layer's MLP: its checkpoint
// restores every tensor (each expert's optimizer state included) and it
// trains on bit for bit as the uninterrupted slot.
TEST_P(MoeCheckpointRoundTripTest, RestoredSlotTrainsOnIdentically) {
  const LlamaModel& model = MoeModel();
  const std::string job_dir = FreshTestDir("ckpt-moe") + "/job-a";
  auto request = [&] {
    SlotAttachRequest r = Request(GetParam(), 4);
    r.lora.dropout = 0.0;  // The experts take none.
    return r;
  };
  SlotPool original(model.config(), {.capacity = 1});
  ASSERT_TRUE(original.Attach(request()).ok());
  const TrainingSlot& saved = original.slot(0);
  ASSERT_TRUE(saved.weights.Find(0, Projection::kExpertGateUp) != nullptr);
  Train(original, 5, model);
  ASSERT_TRUE(
      WriteSlotCheckpoint(job_dir, saved, InfoOf(saved, 0), "qwen3-moe", 3)
          .ok());
  const std::string dir = CheckpointDir(job_dir, 5);
  auto info = ReadCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  auto adapter = LoadPeftAdapter(dir, model.config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  auto state = ReadCheckpointFile(dir, kCheckpointStateFile);
  ASSERT_TRUE(state.ok()) << state.status();

  SlotPool restored(model.config(), {.capacity = 1});
  SlotAttachRequest resume = request();
  resume.initial_weights = std::make_shared<const PeftAdapter>(*adapter);
  ASSERT_TRUE(restored.Attach(resume).ok());
  TrainingSlot& slot = restored.slot(0);
  ASSERT_TRUE(RestoreCheckpoint(dir, *info, *state, slot).ok());
  ExpectAllEqual(Snapshot(slot.weights), Snapshot(saved.weights));
  ExpectAllEqual(OptimizerStateTensors(*slot.optimizer),
                 OptimizerStateTensors(*saved.optimizer));

  Train(original, 15, model);
  Train(restored, 15, model);
  ExpectAllEqual(Snapshot(slot.weights), Snapshot(original.slot(0).weights));
  ExpectAllEqual(OptimizerStateTensors(*slot.optimizer),
                 OptimizerStateTensors(*original.slot(0).optimizer));
  EXPECT_TRUE(slot.done());
}

INSTANTIATE_TEST_SUITE_P(Families, MoeCheckpointRoundTripTest,
                         ::testing::ValuesIn(kAllOptimizerFamilies));

TEST(CheckpointTest, ManifestHoldsSizeAndSha256OfEveryFile) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  WriteAfter(job_dir, {3});
  const std::string dir = CheckpointDir(job_dir, 3);
  EXPECT_EQ(fs::path(dir).filename(), "step-00000003");
  std::ifstream in(dir + "/manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["step"], 3);
  EXPECT_EQ(manifest["files"].size(), 4u);
  for (const char* name : {"adapter_config.json", "adapter_model.safetensors",
                           "training_state.pt", "checkpoint.json"}) {
    const std::string path = dir + "/" + name;
    // The digest as coreutils computes it.
    std::string command = "sha256sum '" + path + "'";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char digest[65] = {};
    ASSERT_EQ(fread(digest, 1, 64, pipe), 64u);
    pclose(pipe);
    EXPECT_EQ(manifest["files"][name]["sha256"], std::string(digest)) << name;
    EXPECT_EQ(manifest["files"][name]["size"], fs::file_size(path)) << name;
  }
  // And the PEFT part is an adapter as exports are.
  EXPECT_TRUE(LoadPeftAdapter(dir, TinyModel().config()).ok());
}

enum class Damage { kTruncate, kFlipByte, kNoManifest, kDeleteFile };

void Apply(Damage damage, const std::string& dir) {
  const std::string weights = dir + "/adapter_model.safetensors";
  switch (damage) {
    case Damage::kTruncate:
      fs::resize_file(weights, fs::file_size(weights) / 2);
      break;
    case Damage::kFlipByte: {
      std::fstream file(dir + "/training_state.pt",
                        std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(100);
      char byte = 0;
      file.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x10);
      file.seekp(100);
      file.write(&byte, 1);
      break;
    }
    case Damage::kNoManifest:
      fs::remove(dir + "/manifest.json");
      break;
    case Damage::kDeleteFile:
      fs::remove(dir + "/checkpoint.json");
      break;
  }
}

class CheckpointDamageTest
    : public ::testing::TestWithParam<std::pair<Damage, const char*>> {};

TEST_P(CheckpointDamageTest, DamagedCheckpointIsRejectedForThePreviousOne) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  WriteAfter(job_dir, {2, 4, 6});
  Apply(GetParam().first, CheckpointDir(job_dir, 6));
  EXPECT_FALSE(VerifyCheckpoint(CheckpointDir(job_dir, 6)).ok());
  std::vector<std::string> rejected;
  auto latest = LatestValidCheckpoint(job_dir, &rejected);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 4);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_THAT(rejected[0], HasSubstr("step-00000006: "));
  EXPECT_THAT(rejected[0], HasSubstr(GetParam().second));

  // Damage the next one too: back to step 2, both reported.
  Apply(Damage::kTruncate, CheckpointDir(job_dir, 4));
  rejected.clear();
  latest = LatestValidCheckpoint(job_dir, &rejected);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 2);
  EXPECT_EQ(rejected.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Damages, CheckpointDamageTest,
    ::testing::Values(
        std::make_pair(Damage::kTruncate, "adapter_model.safetensors has "),
        std::make_pair(Damage::kFlipByte, "training_state.pt has SHA-256 "),
        std::make_pair(Damage::kNoManifest, "no readable manifest.json"),
        std::make_pair(Damage::kDeleteFile, "checkpoint.json is missing")));

TEST(CheckpointTest, NoCheckpointsMeansNothingToResume) {
  std::vector<std::string> rejected;
  EXPECT_FALSE(
      LatestValidCheckpoint(FreshTestDir("none") + "/job-x", &rejected));
  EXPECT_TRUE(rejected.empty());
}

TEST(CheckpointTest, KeepsTheNewestAndRemovesPartialDirectories) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  fs::create_directories(job_dir + "/step-00000003.partial");
  WriteAfter(job_dir, {1, 2, 3, 4, 5}, /*keep_last=*/2);
  std::vector<int64_t> steps;
  for (const CheckpointEntry& entry : ListCheckpoints(job_dir)) {
    steps.push_back(entry.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(fs::exists(job_dir + "/step-00000003.partial"));
  EXPECT_EQ(
      std::distance(fs::directory_iterator(job_dir), fs::directory_iterator()),
      2);
}

TEST(CheckpointTest, PruningSparesTheStepThePoolResumesFrom) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(pool.Attach(Request(OptimizerFamily::kAdamW, 4)).ok());
  for (int step = 1; step <= 4; ++step) {
    Train(pool, 1);
    ASSERT_TRUE(WriteSlotCheckpoint(job_dir, pool.slot(0),
                                    InfoOf(pool.slot(0), 0), "tiny",
                                    /*keep_last=*/1, /*keep_step=*/2)
                    .ok());
  }
  std::vector<int64_t> steps;
  for (const CheckpointEntry& entry : ListCheckpoints(job_dir)) {
    steps.push_back(entry.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4}));
}

TEST(CheckpointTest, ResumePointIsCappedUnlessNothingBelowVerifies) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  WriteAfter(job_dir, {2, 4, 6});
  EXPECT_EQ(LatestValidCheckpoint(job_dir, nullptr, 5)->step, 4);
  EXPECT_EQ(LatestValidCheckpoint(job_dir, nullptr, 4)->step, 4);
  // Nothing up to step 1: a newer one beats starting over.
  EXPECT_EQ(LatestValidCheckpoint(job_dir, nullptr, 1)->step, 6);
  RemoveCheckpointsAfter(job_dir, 2);
  ASSERT_EQ(ListCheckpoints(job_dir).size(), 1u);
  EXPECT_EQ(ListCheckpoints(job_dir)[0].step, 2);
}

TEST(CheckpointTest, ManifestWithFieldsOfTheWrongTypeIsDataLoss) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  WriteAfter(job_dir, {2});
  const std::string path = CheckpointDir(job_dir, 2) + "/manifest.json";
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(path));
  manifest["files"]["checkpoint.json"]["size"] = "twelve";
  std::ofstream(path) << manifest.dump();
  absl::Status status = VerifyCheckpoint(CheckpointDir(job_dir, 2));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("manifest.json is damaged"));
}

TEST(CheckpointTest, PoolCheckpointRoundTrips) {
  const std::string root = FreshTestDir("root") + "/checkpoints";
  auto empty = ReadPoolCheckpoint(root);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  const std::map<std::string, int64_t> jobs = {{"job-a", 12}, {"job-b", 7}};
  ASSERT_TRUE(WritePoolCheckpoint(root, jobs).ok());
  EXPECT_EQ(*ReadPoolCheckpoint(root), jobs);
  std::ofstream(root + "/pool.json") << "{\"jobs\": {\"job-a\": \"x\"}}";
  EXPECT_EQ(ReadPoolCheckpoint(root).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointTest, UnwritableDirectoryFailsCleanly) {
  const std::string root = FreshTestDir("ckpt");
  std::ofstream(root + "/job-a") << "a file where the job's directory goes";
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(pool.Attach(Request(OptimizerFamily::kAdamW, 4)).ok());
  Train(pool, 1);
  absl::Status status = WriteSlotCheckpoint(root + "/job-a", pool.slot(0),
                                            InfoOf(pool.slot(0), 0), "tiny", 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cannot create checkpoint"));
}

// A full disk, as a process file-size limit: writes fail with EFBIG part
// way through a file.
TEST(CheckpointTest, DiskFullKeepsThePreviousCheckpoint) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(pool.Attach(Request(OptimizerFamily::kAdamW, 8)).ok());
  Train(pool, 2);
  ASSERT_TRUE(WriteSlotCheckpoint(job_dir, pool.slot(0),
                                  InfoOf(pool.slot(0), 0), "tiny", 3)
                  .ok());
  Train(pool, 2);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 16 * 1024;  // Less than the weights file.
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status status = WriteSlotCheckpoint(job_dir, pool.slot(0),
                                            InfoOf(pool.slot(0), 0), "tiny", 3);
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("writing checkpoint"));
  EXPECT_THAT(status.message(), HasSubstr("step-00000004"));
  // Only the step-2 checkpoint is there, complete; nothing partial.
  ASSERT_EQ(ListCheckpoints(job_dir).size(), 1u);
  EXPECT_EQ(ListCheckpoints(job_dir)[0].step, 2);
  EXPECT_TRUE(VerifyCheckpoint(CheckpointDir(job_dir, 2)).ok());
  EXPECT_EQ(
      std::distance(fs::directory_iterator(job_dir), fs::directory_iterator()),
      1);
  // With room again, the same step is written.
  EXPECT_TRUE(WriteSlotCheckpoint(job_dir, pool.slot(0),
                                  InfoOf(pool.slot(0), 0), "tiny", 3)
                  .ok());
  EXPECT_TRUE(VerifyCheckpoint(CheckpointDir(job_dir, 4)).ok());
}

TEST(CheckpointTest, RestoreRefusesACheckpointOfAnotherShapeOfJob) {
  const std::string job_dir = FreshTestDir("ckpt") + "/job-a";
  WriteAfter(job_dir, {3});
  const std::string dir = CheckpointDir(job_dir, 3);
  auto info = ReadCheckpointInfo(dir);
  ASSERT_TRUE(info.ok());
  auto adapter = LoadPeftAdapter(dir, TinyModel().config());
  ASSERT_TRUE(adapter.ok());

  // Another optimizer family: its state does not fit.
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  SlotAttachRequest muon = Request(OptimizerFamily::kMuon, 4);
  muon.initial_weights = std::make_shared<const PeftAdapter>(*adapter);
  ASSERT_TRUE(pool.Attach(muon).ok());
  auto state = ReadCheckpointFile(dir, kCheckpointStateFile);
  ASSERT_TRUE(state.ok()) << state.status();
  absl::Status status = RestoreCheckpoint(dir, *info, *state, pool.slot(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not fit the job"));
  ASSERT_TRUE(pool.Retire(0).ok());

  // Another length of run (its data or config changed).
  SlotAttachRequest longer = Request(OptimizerFamily::kAdamW, 4);
  longer.training.max_steps = 30;
  longer.initial_weights = std::make_shared<const PeftAdapter>(*adapter);
  ASSERT_TRUE(pool.Attach(longer).ok());
  status = RestoreCheckpoint(dir, *info, *state, pool.slot(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("run of 20 steps"));
}

TEST(CheckpointTest, InfoJsonKeepsMetricsThatWereNotFinite) {
  CheckpointInfo info;
  info.job_id = "job";
  info.total_steps = 10;
  info.counters.steps = 4;
  info.counters.skipped_steps = 1;
  info.metrics.emplace();
  info.metrics->loss = std::numeric_limits<double>::quiet_NaN();
  info.metrics->lr = 1e-3;
  info.metrics->grad_norm = std::numeric_limits<double>::infinity();
  // As written to and read from checkpoint.json.
  const nlohmann::json written =
      nlohmann::json::parse(CheckpointInfoToJson(info).dump());
  absl::StatusOr<CheckpointInfo> read = CheckpointInfoFromJson(written);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->metrics.has_value());
  EXPECT_TRUE(std::isnan(read->metrics->loss));
  EXPECT_EQ(read->metrics->lr, 1e-3);
  EXPECT_FALSE(std::isfinite(read->metrics->grad_norm));
}

TEST(CheckpointTest, InfoJsonRejectsInconsistentCounters) {
  CheckpointInfo info;
  info.total_steps = 10;
  info.counters.steps = 11;
  EXPECT_FALSE(CheckpointInfoFromJson(CheckpointInfoToJson(info)).ok());
  info.counters.steps = 4;
  info.counters.skipped_steps = 5;
  EXPECT_FALSE(CheckpointInfoFromJson(CheckpointInfoToJson(info)).ok());
  info.counters.skipped_steps = 1;
  EXPECT_TRUE(CheckpointInfoFromJson(CheckpointInfoToJson(info)).ok());
  EXPECT_FALSE(CheckpointInfoFromJson({{"job_id", "x"}}).ok());
}

}  // namespace
}  // namespace loraplex
