#include "client/job_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Parses `args` as the flags of a `create` command (or of the command
// `which` describes) into a request.
absl::StatusOr<v1::CreateJobRequest> Parse(std::vector<std::string> args,
                                           const JobFlagSet& which = {}) {
  CLI::App app("test");
  JobFlags flags;
  AddJobFlags(&app, &flags, which);
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed.
  app.parse(args);
  v1::CreateJobRequest request;
  absl::Status status = ApplyJobFlags(flags, &request);
  if (!status.ok()) return status;
  return request;
}

TEST(JobFlagsTest, NoFlagsLeaveEverythingUnset) {
  auto request = Parse({});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->ByteSizeLong(), 0u);
  EXPECT_FALSE(request->has_lora());
  EXPECT_FALSE(request->has_optimizer());
  EXPECT_FALSE(request->has_schedule());
  EXPECT_FALSE(request->has_training());
}

TEST(JobFlagsTest, SetsOnlyGivenFields) {
  auto request = Parse(
      {"--dataset", "d1", "--rank", "16", "--lr", "0.02", "--max-steps", "60"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->training_dataset(), "datasets/d1");
  EXPECT_TRUE(request->lora().has_rank());
  EXPECT_EQ(request->lora().rank(), 16);
  EXPECT_FALSE(request->lora().has_alpha());
  EXPECT_FALSE(request->lora().has_dropout());
  EXPECT_TRUE(request->optimizer().has_lr());
  EXPECT_DOUBLE_EQ(request->optimizer().lr(), 0.02);
  EXPECT_EQ(request->optimizer().family(), v1::OPTIMIZER_FAMILY_UNSPECIFIED);
  EXPECT_FALSE(request->optimizer().has_eps());
  EXPECT_FALSE(request->has_schedule());
  EXPECT_EQ(request->training().max_steps(), 60);
  EXPECT_FALSE(request->training().has_batch_size());
}

TEST(JobFlagsTest, ZeroValuesAreSentWhenGiven) {
  auto request =
      Parse({"--dropout", "0", "--seed", "0", "--weight-decay", "0"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->lora().has_dropout());
  EXPECT_TRUE(request->training().has_seed());
  EXPECT_TRUE(request->optimizer().has_weight_decay());
}

TEST(JobFlagsTest, EveryFlag) {
  auto request = Parse({"--dataset",
                        "datasets/d1",
                        "--validation-dataset",
                        "d2",
                        "--initial-adapter",
                        "a1",
                        "--name",
                        "run",
                        "--rank",
                        "4",
                        "--alpha",
                        "8",
                        "--dropout",
                        "0.1",
                        "--rslora",
                        "--targets",
                        "q_proj, v_proj",
                        "--optimizer",
                        "MUON",
                        "--lr",
                        "0.01",
                        "--weight-decay",
                        "0.1",
                        "--betas",
                        "0.8,0.95",
                        "--eps",
                        "1e-6",
                        "--momentum",
                        "0.9",
                        "--nesterov",
                        "--weight-decay-mode",
                        "l2",
                        "--ns-steps",
                        "3",
                        "--coefficient-set",
                        "polar_express",
                        "--scale-mode",
                        "unit_rms_norm",
                        "--extra-scale-factor",
                        "0.3",
                        "--ns-precision",
                        "bf16",
                        "--scalar-optimizer",
                        "lion",
                        "--lion-betas",
                        "0.85,0.97",
                        "--soap-betas",
                        "0.8,0.9",
                        "--shampoo-beta",
                        "0.85",
                        "--precondition-frequency",
                        "10",
                        "--max-precond-dim",
                        "512",
                        "--power-iter-steps",
                        "2",
                        "--use-eigh",
                        "--max-update-rms",
                        "1.5",
                        "--schedule",
                        "wsd",
                        "--warmup-steps",
                        "5",
                        "--init-lr",
                        "1e-5",
                        "--min-lr",
                        "1e-6",
                        "--total-steps",
                        "100",
                        "--decay-fraction",
                        "0.2",
                        "--batch-size",
                        "8",
                        "--seq-len",
                        "128",
                        "--pack",
                        "--max-steps",
                        "50",
                        "--epochs",
                        "2",
                        "--grad-clip",
                        "0.5",
                        "--seed",
                        "7",
                        "--eval-interval",
                        "10"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->training_dataset(), "datasets/d1");
  EXPECT_EQ(request->validation_dataset(), "datasets/d2");
  EXPECT_EQ(request->initial_adapter(), "adapters/a1");
  EXPECT_EQ(request->display_name(), "run");
  const v1::LoraConfig& lora = request->lora();
  EXPECT_EQ(lora.rank(), 4);
  EXPECT_DOUBLE_EQ(lora.alpha(), 8);
  EXPECT_DOUBLE_EQ(lora.dropout(), 0.1);
  EXPECT_TRUE(lora.use_rslora());
  EXPECT_THAT(lora.target_modules(), ElementsAre("q_proj", "v_proj"));
  const v1::OptimizerConfig& optimizer = request->optimizer();
  EXPECT_EQ(optimizer.family(), v1::OPTIMIZER_FAMILY_MUON);
  EXPECT_DOUBLE_EQ(optimizer.lr(), 0.01);
  EXPECT_DOUBLE_EQ(optimizer.weight_decay(), 0.1);
  EXPECT_THAT(optimizer.betas(), ElementsAre(0.8, 0.95));
  EXPECT_DOUBLE_EQ(optimizer.eps(), 1e-6);
  EXPECT_DOUBLE_EQ(optimizer.momentum(), 0.9);
  EXPECT_TRUE(optimizer.nesterov());
  EXPECT_EQ(optimizer.weight_decay_mode(), v1::MUON_WEIGHT_DECAY_MODE_L2);
  EXPECT_EQ(optimizer.ns_steps(), 3);
  EXPECT_EQ(optimizer.coefficient_set(), v1::NS_COEFFICIENT_SET_POLAR_EXPRESS);
  EXPECT_EQ(optimizer.scale_mode(), v1::MUON_SCALE_MODE_UNIT_RMS_NORM);
  EXPECT_DOUBLE_EQ(optimizer.extra_scale_factor(), 0.3);
  EXPECT_EQ(optimizer.ns_precision(), v1::NS_PRECISION_BF16);
  EXPECT_EQ(optimizer.scalar_optimizer(), v1::SCALAR_OPTIMIZER_LION);
  EXPECT_THAT(optimizer.lion_betas(), ElementsAre(0.85, 0.97));
  EXPECT_THAT(optimizer.soap_betas(), ElementsAre(0.8, 0.9));
  EXPECT_DOUBLE_EQ(optimizer.shampoo_beta(), 0.85);
  EXPECT_EQ(optimizer.precondition_frequency(), 10);
  EXPECT_EQ(optimizer.max_precond_dim(), 512);
  EXPECT_EQ(optimizer.power_iter_steps(), 2);
  EXPECT_TRUE(optimizer.use_eigh());
  EXPECT_DOUBLE_EQ(optimizer.max_update_rms(), 1.5);
  const v1::LrSchedule& schedule = request->schedule();
  EXPECT_EQ(schedule.kind(), v1::LR_SCHEDULE_KIND_WSD);
  EXPECT_EQ(schedule.warmup_steps(), 5);
  EXPECT_DOUBLE_EQ(schedule.init_lr(), 1e-5);
  EXPECT_DOUBLE_EQ(schedule.min_lr(), 1e-6);
  EXPECT_EQ(schedule.total_steps(), 100);
  EXPECT_DOUBLE_EQ(schedule.decay_fraction(), 0.2);
  const v1::TrainingConfig& training = request->training();
  EXPECT_EQ(training.batch_size(), 8);
  EXPECT_EQ(training.seq_len(), 128);
  EXPECT_TRUE(training.pack());
  EXPECT_EQ(training.max_steps(), 50);
  EXPECT_EQ(training.epochs(), 2);
  EXPECT_DOUBLE_EQ(training.grad_clip(), 0.5);
  EXPECT_EQ(training.seed(), 7u);
  EXPECT_EQ(training.eval_interval(), 10);
}

TEST(JobFlagsTest, CheckpointFlags) {
  auto request = Parse({"--initial-checkpoint", "j0/checkpoints/30",
                        "--checkpoint-interval", "25"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->initial_checkpoint(), "jobs/j0/checkpoints/30");
  EXPECT_EQ(request->initial_adapter(), "");
  EXPECT_TRUE(request->training().has_checkpoint_interval());
  EXPECT_EQ(request->training().checkpoint_interval(), 25);
  EXPECT_FALSE(request->training().has_eval_interval());

  // 0 (the server's interval) is sent when given.
  request = Parse({"--checkpoint-interval", "0"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->training().has_checkpoint_interval());
  EXPECT_EQ(request->initial_checkpoint(), "");
}

TEST(JobFlagsTest, InitialCheckpointMustBeACheckpointName) {
  for (const char* bad : {"j0", "jobs/j0", "adapters/a1", "j0/checkpoints/x"}) {
    auto request = Parse({"--initial-checkpoint", bad});
    ASSERT_FALSE(request.ok()) << bad;
    EXPECT_THAT(request.status().message(),
                HasSubstr("jobs/{id}/checkpoints/{step}"));
  }
}

TEST(JobFlagsTest, InitialAdapterAndInitialCheckpointAreExclusive) {
  auto request = Parse({"--initial-adapter", "a1", "--initial-checkpoint",
                        "jobs/j0/checkpoints/30"});
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(request.status().message(), HasSubstr("--initial-adapter"));
  EXPECT_THAT(request.status().message(), HasSubstr("--initial-checkpoint"));
}

TEST(JobFlagsTest, InitialCheckpointCanBeLeftOut) {
  JobFlagSet which;
  which.initial_checkpoint = false;
  EXPECT_THROW(Parse({"--initial-checkpoint", "jobs/j0/checkpoints/1"}, which),
               CLI::ParseError);
  EXPECT_TRUE(Parse({"--initial-adapter", "a1"}, which).ok());
}

TEST(JobFlagsTest, BadBetasNameTheFlag) {
  for (const char* flag : {"--betas", "--lion-betas", "--soap-betas"}) {
    for (const char* betas : {"0.9", "0.9,0.99,0.999", "a,b", ""}) {
      auto request = Parse({flag, betas});
      ASSERT_FALSE(request.ok()) << flag << " " << betas;
      EXPECT_THAT(request.status().message(),
                  HasSubstr(absl::StrCat(flag, " must be two")));
    }
  }
}

TEST(JobFlagsTest, LionFamily) {
  auto request = Parse({"--optimizer", "lion", "--lion-betas", "0.9,0.98"});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->optimizer().family(), v1::OPTIMIZER_FAMILY_LION);
  EXPECT_THAT(request->optimizer().lion_betas(), ElementsAre(0.9, 0.98));
  EXPECT_THAT(request->optimizer().betas(), ElementsAre());
}

// SOAP with a Lion scalar optimizer; SOAP knobs not given stay unset (the
// server's defaults).
TEST(JobFlagsTest, SoapFamily) {
  auto request = Parse({"--optimizer", "soap", "--soap-betas", "0.95,0.99",
                        "--shampoo-beta", "0.9", "--precondition-frequency",
                        "5", "--scalar-optimizer", "lion"});
  ASSERT_TRUE(request.ok()) << request.status();
  const v1::OptimizerConfig& optimizer = request->optimizer();
  EXPECT_EQ(optimizer.family(), v1::OPTIMIZER_FAMILY_SOAP);
  EXPECT_THAT(optimizer.soap_betas(), ElementsAre(0.95, 0.99));
  EXPECT_DOUBLE_EQ(optimizer.shampoo_beta(), 0.9);
  EXPECT_EQ(optimizer.precondition_frequency(), 5);
  EXPECT_EQ(optimizer.scalar_optimizer(), v1::SCALAR_OPTIMIZER_LION);
  EXPECT_FALSE(optimizer.has_max_precond_dim());
  EXPECT_FALSE(optimizer.has_power_iter_steps());
  EXPECT_FALSE(optimizer.has_use_eigh());
  EXPECT_FALSE(optimizer.has_max_update_rms());
  EXPECT_THAT(optimizer.betas(), ElementsAre());
}

TEST(JobFlagsTest, CustomCoefficientsAreTriplesAndImplyTheCustomSet) {
  auto request =
      Parse({"--custom-coefficients", "3.4445,-4.775,2.0315; 2,-1.5,0.5"});
  ASSERT_TRUE(request.ok()) << request.status();
  const v1::OptimizerConfig& optimizer = request->optimizer();
  EXPECT_EQ(optimizer.coefficient_set(), v1::NS_COEFFICIENT_SET_CUSTOM);
  ASSERT_EQ(optimizer.custom_coefficients_size(), 2);
  EXPECT_DOUBLE_EQ(optimizer.custom_coefficients(0).a(), 3.4445);
  EXPECT_DOUBLE_EQ(optimizer.custom_coefficients(0).b(), -4.775);
  EXPECT_DOUBLE_EQ(optimizer.custom_coefficients(0).c(), 2.0315);
  EXPECT_DOUBLE_EQ(optimizer.custom_coefficients(1).c(), 0.5);
  for (const char* bad : {"1,2", "1,2,3,4", "a,b,c", "1,2,3;x"}) {
    auto rejected = Parse({"--custom-coefficients", bad});
    ASSERT_FALSE(rejected.ok()) << bad;
    EXPECT_THAT(rejected.status().message(),
                HasSubstr("--custom-coefficients"));
  }
}

TEST(JobFlagsTest, BadDatasetNameIsRejected) {
  auto request = Parse({"--dataset", "jobs/x"});
  ASSERT_FALSE(request.ok());
  EXPECT_THAT(request.status().message(), HasSubstr("datasets/{id}"));
}

TEST(JobFlagsTest, UnknownEnumValueIsAParseError) {
  EXPECT_THROW(Parse({"--optimizer", "sgd"}), CLI::ValidationError);
  EXPECT_THROW(Parse({"--schedule", "step"}), CLI::ValidationError);
  EXPECT_THROW(Parse({"--scalar-optimizer", "adam"}), CLI::ValidationError);
}

TEST(ParseJobStatusTest, AcceptsShortAndFullNames) {
  EXPECT_EQ(ParseJobStatus("running").value(), v1::JOB_STATUS_RUNNING);
  EXPECT_EQ(ParseJobStatus("Queued").value(), v1::JOB_STATUS_QUEUED);
  EXPECT_EQ(ParseJobStatus("JOB_STATUS_FAILED").value(), v1::JOB_STATUS_FAILED);
  EXPECT_FALSE(ParseJobStatus("unspecified").ok());
  EXPECT_FALSE(ParseJobStatus("done").ok());
}

}  // namespace
}  // namespace loraplex
