// The gRPC edge conversions: config messages to a validated JobSpec (only
// the fields a client set, core defaults otherwise, errors naming the
// field), the effective config back to messages, stored records to
// messages, and resource names.
#include "server/grpc/proto_convert.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/optim/config_json.h"

namespace loraplex {
namespace {

namespace pb = google::protobuf;
using ::testing::HasSubstr;

struct ConfigProtos {
  v1::LoraConfig lora;
  v1::OptimizerConfig optimizer;
  v1::LrSchedule schedule;
  v1::TrainingConfig training;

  absl::StatusOr<JobSpec> ToSpec() const {
    return JobSpecFromProto(lora, optimizer, schedule, training);
  }
};

std::string Error(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

// Every field of `message` is set: optional scalars present, enums not
// *_UNSPECIFIED, repeated fields non-empty.
void ExpectEveryFieldSet(const pb::Message& message) {
  const pb::Descriptor& type = *message.GetDescriptor();
  const pb::Reflection& r = *message.GetReflection();
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor* field = type.field(i);
    if (field->is_repeated()) {
      EXPECT_GT(r.FieldSize(message, field), 0) << field->full_name();
    } else {
      EXPECT_TRUE(r.HasField(message, field)) << field->full_name();
    }
  }
}

// A config unlike the defaults in every field, each value distinct.
ConfigProtos FullySetProtos() {
  ConfigProtos p;
  p.lora.set_rank(16);
  p.lora.set_alpha(24.0);
  p.lora.set_dropout(0.05);
  p.lora.set_use_rslora(true);
  p.lora.add_target_modules("v_proj");
  p.lora.add_target_modules("q_proj");

  p.optimizer.set_family(v1::OPTIMIZER_FAMILY_MUON);
  p.optimizer.set_lr(3e-4);
  p.optimizer.set_weight_decay(0.01);
  p.optimizer.add_betas(0.8);
  p.optimizer.add_betas(0.95);
  p.optimizer.set_eps(1e-7);
  p.optimizer.set_momentum(0.9);
  p.optimizer.set_nesterov(true);
  p.optimizer.set_weight_decay_mode(v1::MUON_WEIGHT_DECAY_MODE_INDEPENDENT);
  p.optimizer.set_ns_steps(7);
  p.optimizer.set_coefficient_set(v1::NS_COEFFICIENT_SET_CUSTOM);
  v1::NsCoefficients* first = p.optimizer.add_custom_coefficients();
  first->set_a(3.4);
  first->set_b(-4.7);
  first->set_c(2.0);
  v1::NsCoefficients* second = p.optimizer.add_custom_coefficients();
  second->set_a(3.1);
  second->set_b(-4.3);
  second->set_c(1.9);
  p.optimizer.set_ns_precision(v1::NS_PRECISION_BF16);
  p.optimizer.set_scale_mode(v1::MUON_SCALE_MODE_UNIT_RMS_NORM);
  p.optimizer.set_extra_scale_factor(0.3);
  p.optimizer.set_scalar_optimizer(v1::SCALAR_OPTIMIZER_LION);
  p.optimizer.add_lion_betas(0.85);
  p.optimizer.add_lion_betas(0.97);
  p.optimizer.add_soap_betas(0.8);
  p.optimizer.add_soap_betas(0.9);
  p.optimizer.set_shampoo_beta(0.85);
  p.optimizer.set_precondition_frequency(10);
  p.optimizer.set_max_precond_dim(512);
  p.optimizer.set_power_iter_steps(3);
  p.optimizer.set_use_eigh(true);
  p.optimizer.set_max_update_rms(1.5);

  p.schedule.set_kind(v1::LR_SCHEDULE_KIND_WSD);
  p.schedule.set_init_lr(1e-6);
  p.schedule.set_min_lr(2e-5);
  p.schedule.set_warmup_steps(50);
  p.schedule.set_total_steps(500);
  p.schedule.set_decay_fraction(0.25);

  p.training.set_batch_size(8);
  p.training.set_seq_len(1024);
  p.training.set_pack(true);
  p.training.set_max_steps(600);
  p.training.set_epochs(3);
  p.training.set_grad_clip(0.5);
  p.training.set_seed(1234);
  p.training.set_eval_interval(100);
  p.training.set_checkpoint_interval(50);
  return p;
}

TEST(JobSpecFromProtoTest, EmptyMessagesGiveTheCoreDefaults) {
  absl::StatusOr<JobSpec> spec = ConfigProtos().ToSpec();
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(LoraConfigToJson(spec->lora), LoraConfigToJson(LoraConfig()));
  EXPECT_EQ(OptimizerConfigToJson(spec->optimizer),
            OptimizerConfigToJson(OptimizerConfig()));
  // total_steps spans the job: it is filled in once the data is known.
  LrScheduleConfig expected_schedule;
  expected_schedule.total_steps = spec->schedule.total_steps;
  EXPECT_EQ(LrScheduleConfigToJson(spec->schedule),
            LrScheduleConfigToJson(expected_schedule));
  EXPECT_EQ(TrainingConfigToJson(spec->training),
            TrainingConfigToJson(TrainingConfig()));
  EXPECT_TRUE(spec->schedule_spans_job);
  EXPECT_EQ(spec->optimizer.family, OptimizerFamily::kAdamW);
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 1e-4);
  EXPECT_DOUBLE_EQ(spec->optimizer.extra_scale_factor, 0.2);
  EXPECT_EQ(spec->training.batch_size, 4);
  EXPECT_EQ(spec->lora.targets.size(), kAllProjections.size());
}

TEST(JobSpecFromProtoTest, EveryKnobArrives) {
  const ConfigProtos p = FullySetProtos();
  // A new proto field fails here until this test sets it.
  ExpectEveryFieldSet(p.lora);
  ExpectEveryFieldSet(p.optimizer);
  ExpectEveryFieldSet(p.schedule);
  ExpectEveryFieldSet(p.training);
  absl::StatusOr<JobSpec> spec = p.ToSpec();
  ASSERT_TRUE(spec.ok()) << spec.status();

  EXPECT_EQ(LoraConfigToJson(spec->lora),
            (nlohmann::json{{"rank", 16},
                            {"alpha", 24.0},
                            {"dropout", 0.05},
                            {"use_rslora", true},
                            {"target_modules", {"q_proj", "v_proj"}}}));

  const OptimizerConfig& o = spec->optimizer;
  EXPECT_EQ(o.family, OptimizerFamily::kMuon);
  EXPECT_DOUBLE_EQ(o.lr, 3e-4);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(o.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.beta2, 0.95);
  EXPECT_DOUBLE_EQ(o.eps, 1e-7);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  EXPECT_TRUE(o.nesterov);
  EXPECT_EQ(o.weight_decay_mode, MuonWeightDecayMode::kIndependent);
  EXPECT_EQ(o.ns_steps, 7);
  EXPECT_EQ(o.coefficient_set, NsCoefficientSet::kCustom);
  ASSERT_EQ(o.custom_coefficients.size(), 2u);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[0].a, 3.4);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[0].b, -4.7);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[0].c, 2.0);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[1].a, 3.1);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[1].b, -4.3);
  EXPECT_DOUBLE_EQ(o.custom_coefficients[1].c, 1.9);
  EXPECT_EQ(o.ns_precision, NsPrecision::kBf16);
  EXPECT_EQ(o.scale_mode, MuonScaleMode::kUnitRmsNorm);
  EXPECT_DOUBLE_EQ(o.extra_scale_factor, 0.3);
  EXPECT_EQ(o.scalar_optimizer, ScalarOptimizer::kLion);
  EXPECT_DOUBLE_EQ(o.lion_beta1, 0.85);
  EXPECT_DOUBLE_EQ(o.lion_beta2, 0.97);
  EXPECT_DOUBLE_EQ(o.soap_beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.soap_beta2, 0.9);
  EXPECT_DOUBLE_EQ(o.shampoo_beta, 0.85);
  EXPECT_EQ(o.precondition_frequency, 10);
  EXPECT_EQ(o.max_precond_dim, 512);
  EXPECT_EQ(o.power_iter_steps, 3);
  EXPECT_TRUE(o.use_eigh);
  EXPECT_DOUBLE_EQ(o.max_update_rms, 1.5);

  EXPECT_EQ(LrScheduleConfigToJson(spec->schedule),
            (nlohmann::json{{"kind", "wsd"},
                            {"init_lr", 1e-6},
                            {"min_lr", 2e-5},
                            {"warmup_steps", 50},
                            {"total_steps", 500},
                            {"decay_fraction", 0.25}}));
  EXPECT_FALSE(spec->schedule_spans_job);
  EXPECT_EQ(TrainingConfigToJson(spec->training),
            (nlohmann::json{{"batch_size", 8},
                            {"seq_len", 1024},
                            {"pack", true},
                            {"max_steps", 600},
                            {"epochs", 3},
                            {"grad_clip", 0.5},
                            {"seed", 1234},
                            {"eval_interval", 100},
                            {"checkpoint_interval", 50}}));
}

// Each non-zero value of each config enum is accepted, reaches a distinct
// native value and comes back as itself.
TEST(JobSpecFromProtoTest, EveryEnumValueMaps) {
  ConfigProtos base;
  // Lets NS_COEFFICIENT_SET_CUSTOM validate.
  *base.optimizer.add_custom_coefficients() =
      FullySetProtos().optimizer.custom_coefficients(0);
  int checked = 0;
  for (pb::Message* part : {static_cast<pb::Message*>(&base.optimizer),
                            static_cast<pb::Message*>(&base.schedule)}) {
    const pb::Descriptor& type = *part->GetDescriptor();
    for (int i = 0; i < type.field_count(); ++i) {
      const pb::FieldDescriptor* field = type.field(i);
      if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_ENUM) continue;
      const pb::EnumDescriptor& values = *field->enum_type();
      std::set<std::string> native_names;
      for (int v = 0; v < values.value_count(); ++v) {
        const int number = values.value(v)->number();
        if (number == 0) continue;
        SCOPED_TRACE(values.value(v)->name());
        part->GetReflection()->SetEnumValue(part, field, number);
        absl::StatusOr<JobSpec> spec = base.ToSpec();
        part->GetReflection()->SetEnumValue(part, field, 0);
        ASSERT_TRUE(spec.ok()) << spec.status();
        const nlohmann::json native =
            part == &base.optimizer ? OptimizerConfigToJson(spec->optimizer)
                                    : LrScheduleConfigToJson(spec->schedule);
        native_names.insert(native.at(field->name()).get<std::string>());

        ConfigProtos back;
        JobSpecToProto(*spec, &back.lora, &back.optimizer, &back.schedule,
                       &back.training);
        const pb::Message& back_part =
            part == &base.optimizer
                ? static_cast<const pb::Message&>(back.optimizer)
                : back.schedule;
        EXPECT_EQ(back_part.GetReflection()->GetEnumValue(back_part, field),
                  number);
        ++checked;
      }
      EXPECT_EQ(native_names.size(),
                static_cast<size_t>(values.value_count() - 1))
          << field->full_name();
    }
  }
  // family 5, weight_decay_mode 3, coefficient_set 5, ns_precision 2,
  // scale_mode 3, scalar_optimizer 2, kind 4.
  EXPECT_EQ(checked, 24);
}

TEST(JobSpecFromProtoTest, BadValuesNameTheField) {
  struct Case {
    std::function<void(ConfigProtos&)> mutate;
    std::string error;
  };
  const std::vector<Case> cases = {
      {[](ConfigProtos& p) { p.lora.set_rank(0); },
       "lora.rank must be in [1, 256], got 0"},
      {[](ConfigProtos& p) { p.lora.add_target_modules("embed_tokens"); },
       "lora.target_modules names an unsupported module \"embed_tokens\""},
      {[](ConfigProtos& p) { p.optimizer.set_lr(-1); },
       "optimizer.lr must be a finite number >= 0, got -1"},
      {[](ConfigProtos& p) { p.optimizer.add_betas(0.9); },
       "optimizer.betas must be a list of 2 numbers"},
      {[](ConfigProtos& p) { p.optimizer.set_lr(0); },
       "optimizer.lr must be > 0 (0 would train nothing), got 0"},
      {[](ConfigProtos& p) {
         p.optimizer.add_betas(1.0);
         p.optimizer.add_betas(0.999);
       },
       "optimizer.betas[0] must be in [0, 1), got 1"},
      {[](ConfigProtos& p) {
         p.optimizer.set_coefficient_set(v1::NS_COEFFICIENT_SET_CUSTOM);
       },
       "optimizer.coefficient_set is custom but custom_coefficients is "
       "empty"},
      {[](ConfigProtos& p) { p.schedule.set_min_lr(1e-3); },
       "schedule.min_lr must be <= optimizer.lr (0.0001), got 0.001"},
      {[](ConfigProtos& p) { p.schedule.set_total_steps(-5); },
       "schedule.total_steps must be >= 1, got -5"},
      {[](ConfigProtos& p) { p.training.set_batch_size(0); },
       "training.batch_size must be in [1, 4096], got 0"},
      {[](ConfigProtos& p) {
         p.training.set_seed(std::numeric_limits<uint64_t>::max());
       },
       "training.seed must be <= 9223372036854775807, got "
       "18446744073709551615"},
      {[](ConfigProtos& p) {
         p.optimizer.set_family(static_cast<v1::OptimizerFamily>(9));
       },
       "optimizer.family must be one of OPTIMIZER_FAMILY_ADAMW, "
       "OPTIMIZER_FAMILY_ADAM, OPTIMIZER_FAMILY_MUON, OPTIMIZER_FAMILY_LION, "
       "OPTIMIZER_FAMILY_SOAP; got 9"},
      {[](ConfigProtos& p) { p.optimizer.add_lion_betas(0.9); },
       "optimizer.lion_betas must be a list of 2 numbers"},
      {[](ConfigProtos& p) { p.optimizer.add_soap_betas(0.9); },
       "optimizer.soap_betas must be a list of 2 numbers"},
      {[](ConfigProtos& p) {
         p.optimizer.add_soap_betas(0.9);
         p.optimizer.add_soap_betas(1.0);
       },
       "optimizer.soap_betas[1] must be in [0, 1), got 1"},
      {[](ConfigProtos& p) { p.optimizer.set_shampoo_beta(-0.1); },
       "optimizer.shampoo_beta must be in [0, 1), got -0.1"},
      {[](ConfigProtos& p) { p.optimizer.set_precondition_frequency(0); },
       "optimizer.precondition_frequency must be >= 1, got 0"},
      {[](ConfigProtos& p) { p.optimizer.set_max_precond_dim(-1); },
       "optimizer.max_precond_dim must be >= 0 (0: no limit), got -1"},
      {[](ConfigProtos& p) { p.optimizer.set_power_iter_steps(101); },
       "optimizer.power_iter_steps must be in [1, 100], got 101"},
      {[](ConfigProtos& p) { p.optimizer.set_max_update_rms(-1); },
       "optimizer.max_update_rms must be a finite number >= 0"},
      {[](ConfigProtos& p) {
         p.schedule.set_kind(static_cast<v1::LrScheduleKind>(-2));
       },
       "schedule.kind must be one of LR_SCHEDULE_KIND_CONSTANT"},
      {[](ConfigProtos& p) {
         p.optimizer.set_ns_precision(static_cast<v1::NsPrecision>(7));
       },
       "optimizer.ns_precision must be one of"},
  };
  for (const Case& c : cases) {
    ConfigProtos p;
    c.mutate(p);
    EXPECT_THAT(Error(p.ToSpec().status()), HasSubstr(c.error));
  }
}

TEST(JobSpecFromProtoTest, LargestSeedIsAccepted) {
  ConfigProtos p;
  p.training.set_seed(std::numeric_limits<int64_t>::max());
  absl::StatusOr<JobSpec> spec = p.ToSpec();
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training.seed,
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

TEST(JobSpecFromProtoTest, UnsetOrZeroTotalStepsSpansTheJob) {
  ConfigProtos p;
  absl::StatusOr<JobSpec> unset = p.ToSpec();
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_TRUE(unset->schedule_spans_job);

  // A warmup longer than any fixed stand-in is accepted here; it is checked
  // against the job's real step count once the data is known.
  p.schedule.set_total_steps(0);
  p.schedule.set_warmup_steps(5000);
  absl::StatusOr<JobSpec> zero = p.ToSpec();
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(zero->schedule_spans_job);
  EXPECT_EQ(zero->schedule.warmup_steps, 5000);
  p.schedule.clear_warmup_steps();

  p.schedule.set_total_steps(250);
  absl::StatusOr<JobSpec> fixed = p.ToSpec();
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_FALSE(fixed->schedule_spans_job);
  EXPECT_EQ(fixed->schedule.total_steps, 250);
}

TEST(JobSpecToProtoTest, SetsEveryFieldAndRoundTrips) {
  absl::StatusOr<JobSpec> spec = FullySetProtos().ToSpec();
  ASSERT_TRUE(spec.ok()) << spec.status();
  ConfigProtos p;
  JobSpecToProto(*spec, &p.lora, &p.optimizer, &p.schedule, &p.training);
  ExpectEveryFieldSet(p.lora);
  ExpectEveryFieldSet(p.optimizer);
  ExpectEveryFieldSet(p.schedule);
  ExpectEveryFieldSet(p.training);
  absl::StatusOr<JobSpec> again = p.ToSpec();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*spec));
}

TEST(JobSpecToProtoTest, DefaultsAreExplicit) {
  ConfigProtos p;
  JobSpecToProto(JobSpec(), &p.lora, &p.optimizer, &p.schedule, &p.training);
  EXPECT_EQ(p.optimizer.family(), v1::OPTIMIZER_FAMILY_ADAMW);
  EXPECT_EQ(p.optimizer.coefficient_set(), v1::NS_COEFFICIENT_SET_QUINTIC);
  EXPECT_EQ(p.schedule.kind(), v1::LR_SCHEDULE_KIND_COSINE);
  EXPECT_EQ(p.optimizer.custom_coefficients_size(), 0);
  EXPECT_EQ(p.optimizer.betas_size(), 2);
  EXPECT_EQ(p.lora.target_modules_size(),
            static_cast<int>(kAllProjections.size()));
  EXPECT_EQ(p.lora.target_modules(0), "q_proj");
  EXPECT_TRUE(p.schedule.has_total_steps());
  EXPECT_EQ(p.schedule.total_steps(), LrScheduleConfig().total_steps);
}

// The other direction: a native value the proto cannot name would leave
// the field UNSPECIFIED.
TEST(JobSpecToProtoTest, EveryNativeEnumValueHasAProtoValue) {
  JobSpec spec;
  auto to_proto = [&spec] {
    ConfigProtos p;
    JobSpecToProto(spec, &p.lora, &p.optimizer, &p.schedule, &p.training);
    return p;
  };
  for (OptimizerFamily v : kAllOptimizerFamilies) {
    spec.optimizer.family = v;
    EXPECT_NE(to_proto().optimizer.family(), v1::OPTIMIZER_FAMILY_UNSPECIFIED);
  }
  for (MuonWeightDecayMode v : kAllMuonWeightDecayModes) {
    spec.optimizer.weight_decay_mode = v;
    EXPECT_NE(to_proto().optimizer.weight_decay_mode(),
              v1::MUON_WEIGHT_DECAY_MODE_UNSPECIFIED);
  }
  for (NsCoefficientSet v : kAllNsCoefficientSets) {
    spec.optimizer.coefficient_set = v;
    EXPECT_NE(to_proto().optimizer.coefficient_set(),
              v1::NS_COEFFICIENT_SET_UNSPECIFIED);
  }
  for (NsPrecision v : kAllNsPrecisions) {
    spec.optimizer.ns_precision = v;
    EXPECT_NE(to_proto().optimizer.ns_precision(),
              v1::NS_PRECISION_UNSPECIFIED);
  }
  for (MuonScaleMode v : kAllMuonScaleModes) {
    spec.optimizer.scale_mode = v;
    EXPECT_NE(to_proto().optimizer.scale_mode(),
              v1::MUON_SCALE_MODE_UNSPECIFIED);
  }
  for (LrScheduleKind v : kAllLrScheduleKinds) {
    spec.schedule.kind = v;
    EXPECT_NE(to_proto().schedule.kind(), v1::LR_SCHEDULE_KIND_UNSPECIFIED);
  }
}

TEST(LoraConfigProtoTest, RoundTrips) {
  v1::LoraConfig proto;
  proto.set_rank(4);
  proto.add_target_modules("down_proj");
  proto.add_target_modules("k_proj");
  absl::StatusOr<LoraConfig> config = LoraConfigFromProto(proto);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 4);
  v1::LoraConfig back;
  LoraConfigToProto(*config, &back);
  EXPECT_EQ(back.rank(), 4);
  EXPECT_DOUBLE_EQ(back.alpha(), 16.0);
  ASSERT_EQ(back.target_modules_size(), 2);
  EXPECT_EQ(back.target_modules(0), "k_proj");
  EXPECT_EQ(back.target_modules(1), "down_proj");
  proto.set_dropout(1.0);
  EXPECT_THAT(Error(LoraConfigFromProto(proto).status()),
              HasSubstr("lora.dropout must be in [0, 1), got 1"));
}

TEST(JobStatusProtoTest, EveryValueMaps) {
  const pb::EnumDescriptor& type = *v1::JobStatus_descriptor();
  std::set<JobStatus> seen;
  for (int i = 0; i < type.value_count(); ++i) {
    const auto value = static_cast<v1::JobStatus>(type.value(i)->number());
    std::optional<JobStatus> native = JobStatusFromProto(value);
    if (value == v1::JOB_STATUS_UNSPECIFIED) {
      EXPECT_FALSE(native.has_value());
      continue;
    }
    ASSERT_TRUE(native.has_value()) << type.value(i)->name();
    EXPECT_EQ(JobStatusToProto(*native), value);
    EXPECT_EQ(absl::StrCat("JOB_STATUS_", JobStatusName(*native)),
              type.value(i)->name());
    seen.insert(*native);
  }
  EXPECT_EQ(seen.size(), kAllJobStatuses.size());
  EXPECT_FALSE(JobStatusFromProto(static_cast<v1::JobStatus>(99)).has_value());
}

TEST(TimestampTest, FromMillis) {
  google::protobuf::Timestamp timestamp;
  TimestampFromMillis(1500, &timestamp);
  EXPECT_EQ(timestamp.seconds(), 1);
  EXPECT_EQ(timestamp.nanos(), 500000000);
  TimestampFromMillis(-1, &timestamp);
  EXPECT_EQ(timestamp.seconds(), -1);
  EXPECT_EQ(timestamp.nanos(), 999000000);
  TimestampFromMillis(0, &timestamp);
  EXPECT_EQ(timestamp.seconds(), 0);
  EXPECT_EQ(timestamp.nanos(), 0);
}

TEST(ResourceNameTest, CheckpointNamesFormatAndParse) {
  EXPECT_EQ(CheckpointResourceName("job-a1", 120),
            "jobs/job-a1/checkpoints/120");
  auto parsed =
      ParseCheckpointName("jobs/job-a1/checkpoints/120", "checkpoint");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->job_id, "job-a1");
  EXPECT_EQ(parsed->step, 120);
  EXPECT_EQ(ParseCheckpointName("jobs/j/checkpoints/0", "c")->step, 0);
  EXPECT_EQ(Error(ParseCheckpointName("", "initial_checkpoint").status()),
            "initial_checkpoint is required");
  for (const char* bad :
       {"jobs/job-a1", "jobs/job-a1/checkpoints/", "jobs/job-a1/checkpoints/-1",
        "jobs/job-a1/checkpoints/1x", "jobs/job-a1/steps/1",
        "jobs//checkpoints/1", "jobs/A/checkpoints/1", "job-a1/checkpoints/1",
        "jobs/job-a1/checkpoints/1/x",
        "jobs/job-a1/checkpoints/1234567890123456789012"}) {
    EXPECT_THAT(Error(ParseCheckpointName(bad, "checkpoint").status()),
                HasSubstr("checkpoint must be a name like "
                          "\"jobs/{id}/checkpoints/{step}\", got"))
        << bad;
  }
}

TEST(ResourceNameTest, FormatsAndParses) {
  EXPECT_EQ(FormatResourceName("jobs", "abc"), "jobs/abc");
  const std::string longest(64, 'a');
  for (const std::string& id :
       {std::string("abc-123"), std::string("0"), longest}) {
    absl::StatusOr<std::string> parsed = ParseResourceName(
        FormatResourceName("datasets", id), "datasets", "training_dataset");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, id);
  }
  EXPECT_EQ(
      Error(ParseResourceName("foo", "datasets", "training_dataset").status()),
      "training_dataset must be a name like \"datasets/{id}\", got "
      "\"foo\"");
  EXPECT_EQ(
      Error(ParseResourceName("", "datasets", "training_dataset").status()),
      "training_dataset is required");
  for (const std::string& bad :
       {std::string("datasets/"), std::string("datasets/ABC"),
        std::string("jobs/abc"), std::string("datasets/a/b"),
        std::string("datasets/a_b"), std::string("datasetsx/abc"),
        std::string("/abc"), "datasets/" + longest + "a"}) {
    EXPECT_THAT(
        Error(
            ParseResourceName(bad, "datasets", "validation_dataset").status()),
        HasSubstr("validation_dataset must be a name like \"datasets/{id}\""))
        << bad;
  }
  EXPECT_THAT(
      Error(ParseResourceName(std::string("jobs/\n\0", 7), "jobs", "name")
                .status()),
      HasSubstr("got \"jobs/\\n\\x00\""));
}

TEST(RecordProtoTest, Dataset) {
  DatasetRecord record{.id = "ds1",
                       .tenant = "t",
                       .display_name = "chat",
                       .size_bytes = 2048,
                       .num_examples = 10,
                       .sha256 = "ab12",
                       .create_time_ms = 1700000000123};
  v1::Dataset dataset;
  DatasetToProto(record, &dataset);
  EXPECT_EQ(dataset.name(), "datasets/ds1");
  EXPECT_EQ(dataset.display_name(), "chat");
  EXPECT_EQ(dataset.size_bytes(), 2048);
  EXPECT_EQ(dataset.num_examples(), 10);
  EXPECT_EQ(dataset.sha256(), "ab12");
  EXPECT_EQ(dataset.create_time().seconds(), 1700000000);
  EXPECT_EQ(dataset.create_time().nanos(), 123000000);
}

JobRecord FinishedJobRecord(const JobSpec& spec) {
  JobRecord record;
  record.id = "job-1";
  record.display_name = "run";
  record.base_model = "tiny-llama";
  record.training_dataset_id = "ds1";
  record.validation_dataset_id = "ds2";
  record.initial_adapter_id = "ad0";
  record.spec = JobSpecToJson(spec);
  record.status = JobStatus::kFailed;
  record.slot = -1;
  record.total_steps = 500;
  record.metrics = {.step = 42,
                    .loss = 1.5,
                    .lr = 2e-4,
                    .grad_norm = 0.7,
                    .tokens_per_second = 900.0,
                    .tokens = 12345,
                    .skipped_steps = 1,
                    .validation_loss = 1.75,
                    .expert_tokens = {5, 0, 9}};
  record.error_code = "INTERNAL";
  record.error_message = "out of memory";
  record.adapter_id = "ad1";
  record.create_time_ms = 1000;
  record.start_time_ms = 2000;
  record.end_time_ms = 3500;
  return record;
}

TEST(RecordProtoTest, JobWithEverything) {
  absl::StatusOr<JobSpec> spec = FullySetProtos().ToSpec();
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::Job job;
  ASSERT_TRUE(JobToProto(FinishedJobRecord(*spec), &job).ok());
  EXPECT_EQ(job.name(), "jobs/job-1");
  EXPECT_EQ(job.display_name(), "run");
  EXPECT_EQ(job.base_model(), "tiny-llama");
  EXPECT_EQ(job.training_dataset(), "datasets/ds1");
  EXPECT_EQ(job.validation_dataset(), "datasets/ds2");
  EXPECT_EQ(job.initial_adapter(), "adapters/ad0");
  EXPECT_EQ(job.status(), v1::JOB_STATUS_FAILED);
  EXPECT_EQ(job.slot(), -1);
  EXPECT_EQ(job.total_steps(), 500);
  ASSERT_TRUE(job.has_metrics());
  EXPECT_EQ(job.metrics().step(), 42);
  EXPECT_DOUBLE_EQ(job.metrics().loss(), 1.5);
  EXPECT_DOUBLE_EQ(job.metrics().lr(), 2e-4);
  EXPECT_DOUBLE_EQ(job.metrics().grad_norm(), 0.7);
  EXPECT_DOUBLE_EQ(job.metrics().tokens_per_second(), 900.0);
  EXPECT_EQ(job.metrics().tokens(), 12345);
  EXPECT_EQ(job.metrics().skipped_steps(), 1);
  ASSERT_TRUE(job.metrics().has_validation_loss());
  EXPECT_DOUBLE_EQ(job.metrics().validation_loss(), 1.75);
  EXPECT_THAT(job.metrics().expert_tokens(), ::testing::ElementsAre(5, 0, 9));
  ASSERT_TRUE(job.has_error());
  EXPECT_EQ(job.error().code(), "INTERNAL");
  EXPECT_EQ(job.error().message(), "out of memory");
  EXPECT_EQ(job.adapter(), "adapters/ad1");
  EXPECT_EQ(job.create_time().seconds(), 1);
  EXPECT_EQ(job.start_time().seconds(), 2);
  EXPECT_EQ(job.end_time().seconds(), 3);
  EXPECT_EQ(job.end_time().nanos(), 500000000);
  ExpectEveryFieldSet(job.optimizer());
  absl::StatusOr<JobSpec> again = JobSpecFromProto(
      job.lora(), job.optimizer(), job.schedule(), job.training());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*spec));
}

TEST(RecordProtoTest, QueuedJobLeavesUnsetPartsEmpty) {
  JobRecord record;
  record.id = "q";
  record.training_dataset_id = "ds1";
  record.status = JobStatus::kQueued;
  record.slot = 3;  // Stale: only a running job has a slot.
  record.create_time_ms = 1000;
  // The stored form may omit schedule_spans_job and any part.
  record.spec = {{"lora", {{"rank", 4}}}};
  v1::Job job;
  ASSERT_TRUE(JobToProto(record, &job).ok());
  EXPECT_EQ(job.status(), v1::JOB_STATUS_QUEUED);
  EXPECT_EQ(job.slot(), -1);
  EXPECT_FALSE(job.has_metrics());
  EXPECT_FALSE(job.has_error());
  EXPECT_TRUE(job.adapter().empty());
  EXPECT_TRUE(job.validation_dataset().empty());
  EXPECT_TRUE(job.initial_adapter().empty());
  EXPECT_TRUE(job.has_create_time());
  EXPECT_FALSE(job.has_start_time());
  EXPECT_FALSE(job.has_end_time());
  EXPECT_EQ(job.lora().rank(), 4);
  EXPECT_EQ(job.optimizer().family(), v1::OPTIMIZER_FAMILY_ADAMW);

  record.status = JobStatus::kRunning;
  ASSERT_TRUE(JobToProto(record, &job).ok());
  EXPECT_EQ(job.slot(), 3);
}

TEST(RecordProtoTest, JobWithInvalidStoredSpecIsInternal) {
  JobRecord record;
  record.id = "bad";
  record.spec = {{"lora", {{"rank", 0}}}};
  v1::Job job;
  absl::Status status = JobToProto(record, &job);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("job bad has an invalid stored spec: lora.rank"));
}

TEST(RecordProtoTest, JobEvents) {
  JobEventRecord change;
  change.job_id = "j";
  change.sequence = 7;
  change.time_ms = 4000;
  change.status = JobStatus::kFailed;
  change.message = "step failed";
  change.error_code = "INTERNAL";
  change.error_message = "nan";
  v1::JobEvent event;
  JobEventToProto(change, &event);
  EXPECT_EQ(event.sequence(), 7);
  EXPECT_EQ(event.time().seconds(), 4);
  ASSERT_EQ(event.kind_case(), v1::JobEvent::kStatusChange);
  EXPECT_EQ(event.status_change().status(), v1::JOB_STATUS_FAILED);
  EXPECT_EQ(event.status_change().message(), "step failed");
  EXPECT_EQ(event.status_change().error().code(), "INTERNAL");
  EXPECT_EQ(event.status_change().error().message(), "nan");

  change.status = JobStatus::kRunning;
  change.error_code.clear();
  change.error_message.clear();
  JobEventToProto(change, &event);
  EXPECT_FALSE(event.status_change().has_error());

  JobEventRecord step;
  step.job_id = "j";
  step.sequence = 8;
  step.time_ms = 5000;
  step.metrics.step = 3;
  step.metrics.loss = 2.5;
  JobEventToProto(step, &event);
  EXPECT_EQ(event.sequence(), 8);
  ASSERT_EQ(event.kind_case(), v1::JobEvent::kMetrics);
  EXPECT_EQ(event.metrics().step(), 3);
  EXPECT_DOUBLE_EQ(event.metrics().loss(), 2.5);
  EXPECT_FALSE(event.metrics().has_validation_loss());
}

TEST(RecordProtoTest, Adapter) {
  AdapterRecord record{.id = "ad1",
                       .tenant = "t",
                       .display_name = "mine",
                       .job_id = "job-1",
                       .base_model = "tiny-llama",
                       .lora = {{"rank", 32}, {"target_modules", {"q_proj"}}},
                       .create_time_ms = 9000};
  v1::Adapter adapter;
  ASSERT_TRUE(AdapterToProto(record, &adapter).ok());
  EXPECT_EQ(adapter.name(), "adapters/ad1");
  EXPECT_EQ(adapter.display_name(), "mine");
  EXPECT_EQ(adapter.job(), "jobs/job-1");
  EXPECT_EQ(adapter.base_model(), "tiny-llama");
  EXPECT_EQ(adapter.lora().rank(), 32);
  EXPECT_TRUE(adapter.lora().has_alpha());
  ASSERT_EQ(adapter.lora().target_modules_size(), 1);
  EXPECT_EQ(adapter.create_time().seconds(), 9);

  record.job_id.clear();
  ASSERT_TRUE(AdapterToProto(record, &adapter).ok());
  EXPECT_TRUE(adapter.job().empty());

  record.lora = {{"rank", "big"}};
  EXPECT_EQ(AdapterToProto(record, &adapter).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace loraplex
