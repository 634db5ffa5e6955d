#include "client/display_format.h"

#include <google/protobuf/util/json_util.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace loraplex {
namespace {

// "RUNNING" from "JOB_STATUS_RUNNING" and prefix "JOB_STATUS_".
std::string WithoutPrefix(const std::string& name, absl::string_view prefix) {
  if (absl::StartsWith(name, prefix)) return name.substr(prefix.size());
  return name;
}

std::string YesNo(bool value) { return value ? "yes" : "no"; }

}  // namespace

std::string JobStatusName(v1::JobStatus status) {
  return WithoutPrefix(v1::JobStatus_Name(status), "JOB_STATUS_");
}

std::string OptimizerFamilyName(v1::OptimizerFamily family) {
  if (family == v1::OPTIMIZER_FAMILY_UNSPECIFIED) return "adamw";
  return absl::AsciiStrToLower(
      WithoutPrefix(v1::OptimizerFamily_Name(family), "OPTIMIZER_FAMILY_"));
}

std::string SlotStateName(v1::SlotState state) {
  return WithoutPrefix(v1::SlotState_Name(state), "SLOT_STATE_");
}

bool IsTerminalJobStatus(v1::JobStatus status) {
  return status == v1::JOB_STATUS_SUCCEEDED ||
         status == v1::JOB_STATUS_FAILED || status == v1::JOB_STATUS_CANCELLED;
}

bool IsUnsuccessfulJobStatus(v1::JobStatus status) {
  return status == v1::JOB_STATUS_FAILED || status == v1::JOB_STATUS_CANCELLED;
}

std::string FormatTimestamp(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixSeconds(time.seconds()),
                          absl::LocalTimeZone());
}

double TimestampSeconds(const google::protobuf::Timestamp& time) {
  return static_cast<double>(time.seconds()) +
         static_cast<double>(time.nanos()) * 1e-9;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  for (const char* unit : {"KiB", "MiB", "GiB", "TiB"}) {
    value /= 1024;
    if (value < 1024 || absl::string_view(unit) == "TiB") {
      return absl::StrFormat("%.1f %s", value, unit);
    }
  }
  return absl::StrCat(bytes, " B");
}

std::string FormatNumber(double value) { return absl::StrFormat("%g", value); }

std::string DescribeLora(const v1::LoraConfig& lora) {
  std::string text =
      absl::StrCat("rank ", lora.rank(), ", alpha ", FormatNumber(lora.alpha()),
                   ", dropout ", FormatNumber(lora.dropout()));
  if (lora.use_rslora()) text += ", rslora";
  absl::StrAppend(&text, ", targets ",
                  lora.target_modules().empty()
                      ? std::string("all")
                      : absl::StrJoin(lora.target_modules(), ","));
  return text;
}

std::string DescribeOptimizer(const v1::OptimizerConfig& optimizer) {
  std::string text =
      absl::StrCat(OptimizerFamilyName(optimizer.family()), ", lr ",
                   FormatNumber(optimizer.lr()), ", weight decay ",
                   FormatNumber(optimizer.weight_decay()));
  std::vector<std::string> betas;
  for (double beta : optimizer.betas()) betas.push_back(FormatNumber(beta));
  absl::StrAppend(&text, ", betas ", absl::StrJoin(betas, ","), ", eps ",
                  FormatNumber(optimizer.eps()));
  if (optimizer.family() == v1::OPTIMIZER_FAMILY_MUON) {
    absl::StrAppend(
        &text, ", momentum ", FormatNumber(optimizer.momentum()), ", nesterov ",
        YesNo(optimizer.nesterov()), ", ns_steps ", optimizer.ns_steps(),
        ", coefficients ",
        absl::AsciiStrToLower(WithoutPrefix(
            v1::NsCoefficientSet_Name(optimizer.coefficient_set()),
            "NS_COEFFICIENT_SET_")),
        ", scale ",
        absl::AsciiStrToLower(
            WithoutPrefix(v1::MuonScaleMode_Name(optimizer.scale_mode()),
                          "MUON_SCALE_MODE_")),
        ", extra scale ", FormatNumber(optimizer.extra_scale_factor()),
        ", weight decay mode ",
        absl::AsciiStrToLower(WithoutPrefix(
            v1::MuonWeightDecayMode_Name(optimizer.weight_decay_mode()),
            "MUON_WEIGHT_DECAY_MODE_")),
        ", ns precision ",
        absl::AsciiStrToLower(WithoutPrefix(
            v1::NsPrecision_Name(optimizer.ns_precision()), "NS_PRECISION_")),
        ", scalar optimizer ",
        absl::AsciiStrToLower(WithoutPrefix(
            v1::ScalarOptimizer_Name(optimizer.scalar_optimizer()),
            "SCALAR_OPTIMIZER_")));
  }
  if (optimizer.family() == v1::OPTIMIZER_FAMILY_SOAP) {
    std::vector<std::string> soap_betas;
    for (double beta : optimizer.soap_betas()) {
      soap_betas.push_back(FormatNumber(beta));
    }
    absl::StrAppend(
        &text, ", soap betas ", absl::StrJoin(soap_betas, ","),
        ", shampoo beta ", FormatNumber(optimizer.shampoo_beta()),
        ", precondition frequency ", optimizer.precondition_frequency(),
        ", max precond dim ", optimizer.max_precond_dim(),
        ", power iter steps ", optimizer.power_iter_steps(), ", eigh ",
        YesNo(optimizer.use_eigh()), ", max update rms ",
        FormatNumber(optimizer.max_update_rms()), ", scalar optimizer ",
        absl::AsciiStrToLower(WithoutPrefix(
            v1::ScalarOptimizer_Name(optimizer.scalar_optimizer()),
            "SCALAR_OPTIMIZER_")));
  }
  const bool matrix_family = optimizer.family() == v1::OPTIMIZER_FAMILY_MUON ||
                             optimizer.family() == v1::OPTIMIZER_FAMILY_SOAP;
  const bool lion = optimizer.family() == v1::OPTIMIZER_FAMILY_LION ||
                    (matrix_family &&
                     optimizer.scalar_optimizer() == v1::SCALAR_OPTIMIZER_LION);
  if (lion) {
    std::vector<std::string> lion_betas;
    for (double beta : optimizer.lion_betas()) {
      lion_betas.push_back(FormatNumber(beta));
    }
    absl::StrAppend(&text, ", lion betas ", absl::StrJoin(lion_betas, ","));
  }
  return text;
}

std::string DescribeSchedule(const v1::LrSchedule& schedule) {
  std::string text = absl::StrCat(
      absl::AsciiStrToLower(WithoutPrefix(
          v1::LrScheduleKind_Name(schedule.kind()), "LR_SCHEDULE_KIND_")),
      ", warmup ", schedule.warmup_steps(), " steps from ",
      FormatNumber(schedule.init_lr()), ", min lr ",
      FormatNumber(schedule.min_lr()), ", total ", schedule.total_steps(),
      " steps");
  if (schedule.kind() == v1::LR_SCHEDULE_KIND_WSD) {
    absl::StrAppend(&text, ", decay fraction ",
                    FormatNumber(schedule.decay_fraction()));
  }
  return text;
}

std::string DescribeTraining(const v1::TrainingConfig& training) {
  return absl::StrCat(
      "batch ", training.batch_size(), ", seq_len ", training.seq_len(),
      ", pack ", YesNo(training.pack()), ", max_steps ", training.max_steps(),
      ", epochs ", training.epochs(), ", grad_clip ",
      FormatNumber(training.grad_clip()), ", seed ", training.seed(),
      ", eval_interval ", training.eval_interval(), ", checkpoint_interval ",
      training.checkpoint_interval());
}

std::string DescribeMetrics(const v1::JobMetrics& metrics) {
  std::string text;
  if (metrics.step() > 0) {
    text = absl::StrFormat(
        "loss %.4f  lr %.2e  grad_norm %.3g  %.0f tok/s  tokens %d",
        metrics.loss(), metrics.lr(), metrics.grad_norm(),
        metrics.tokens_per_second(), metrics.tokens());
  }
  if (metrics.skipped_steps() > 0) {
    absl::StrAppend(&text, "  skipped steps ", metrics.skipped_steps());
  }
  if (metrics.has_validation_loss()) {
    absl::StrAppend(
        &text, absl::StrFormat("  val_loss %.4f", metrics.validation_loss()));
  }
  return text;
}

std::string MessageToJson(const google::protobuf::Message& message,
                          bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::StrCat("{\"error\": \"cannot print ", message.GetTypeName(),
                        " as JSON\"}");
  }
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

}  // namespace loraplex
