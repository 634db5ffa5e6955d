// A job's spec as stored JSON: every field written, defaults for absent
// parts, and errors that name the field (including unknown top-level keys).
#include "server/jobs/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "core/optim/config_json.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

std::string Error(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

JobSpec NonDefaultSpec() {
  JobSpec spec;
  spec.lora.rank = 32;
  spec.lora.use_rslora = true;
  spec.lora.targets = {Projection::kQ, Projection::kUp};
  spec.optimizer.family = OptimizerFamily::kMuon;
  spec.optimizer.lr = 2e-4;
  spec.optimizer.coefficient_set = NsCoefficientSet::kCustom;
  spec.optimizer.custom_coefficients = {{3.0, -3.2, 1.2}};
  spec.schedule.kind = LrScheduleKind::kLinear;
  spec.schedule.min_lr = 1e-5;
  spec.schedule.total_steps = 300;
  spec.schedule_spans_job = false;
  spec.training.batch_size = 16;
  spec.training.seed = 99;
  spec.training.eval_interval = 25;
  return spec;
}

TEST(JobSpecJsonTest, RoundTrips) {
  const JobSpec spec = NonDefaultSpec();
  const nlohmann::json json = JobSpecToJson(spec);
  for (const char* key :
       {"lora", "optimizer", "schedule", "schedule_spans_job", "training"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  absl::StatusOr<JobSpec> again = JobSpecFromJson(json);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), json);
  EXPECT_FALSE(again->schedule_spans_job);
  EXPECT_EQ(again->optimizer.custom_coefficients.size(), 1u);
}

TEST(JobSpecJsonTest, AbsentPartsTakeDefaults) {
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(nlohmann::json::object());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(JobSpecToJson(*spec), JobSpecToJson(JobSpec()));
  EXPECT_TRUE(spec->schedule_spans_job);
}

TEST(JobSpecJsonTest, ErrorsNameTheField) {
  EXPECT_THAT(Error(JobSpecFromJson({{"lora", nlohmann::json::object()},
                                     {"optimiser", nlohmann::json::object()}})
                        .status()),
              HasSubstr("optimiser is not a known field"));
  EXPECT_THAT(Error(JobSpecFromJson(nlohmann::json::array()).status()),
              HasSubstr("job spec must be a JSON object"));
  EXPECT_THAT(Error(JobSpecFromJson({{"lora", 3}}).status()),
              HasSubstr("lora must be a JSON object"));
  EXPECT_THAT(Error(JobSpecFromJson({{"lora", {{"rank", 0}}}}).status()),
              HasSubstr("lora.rank must be in [1, 256], got 0"));
  EXPECT_THAT(Error(JobSpecFromJson({{"optimizer", {{"lr", -1}}}}).status()),
              HasSubstr("optimizer.lr must be a finite number >= 0"));
  EXPECT_THAT(
      Error(JobSpecFromJson({{"training", {{"batch_size", 0}}}}).status()),
      HasSubstr("training.batch_size must be in [1, 4096], got 0"));
  EXPECT_THAT(Error(JobSpecFromJson({{"schedule_spans_job", 1}}).status()),
              HasSubstr("schedule_spans_job must be true or false"));
  EXPECT_THAT(
      Error(JobSpecFromJson({{"schedule", {{"min_lr", 1e-3}}}}).status()),
      HasSubstr("schedule.min_lr must be <= optimizer.lr (0.0001), got "
                "0.001"));
  // min_lr equal to the peak is allowed.
  EXPECT_TRUE(JobSpecFromJson({{"optimizer", {{"lr", 1e-3}}},
                               {"schedule", {{"min_lr", 1e-3}}}})
                  .ok());
}

}  // namespace
}  // namespace loraplex
