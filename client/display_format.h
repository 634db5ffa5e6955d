// How the CLI shows API messages to people: short enum names ("RUNNING",
// "adamw"), local timestamps, byte sizes, one-line config summaries, and
// JSON for --json output.
#ifndef LORAPLEX_CLIENT_DISPLAY_FORMAT_H_
#define LORAPLEX_CLIENT_DISPLAY_FORMAT_H_

#include <cstdint>
#include <string>

#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "loraplex/v1/adapters.pb.h"
#include "loraplex/v1/jobs.pb.h"

namespace loraplex {

// "RUNNING" for JOB_STATUS_RUNNING.
std::string JobStatusName(v1::JobStatus status);
// "adamw", "adam", "muon" (UNSPECIFIED is AdamW, the server's default).
std::string OptimizerFamilyName(v1::OptimizerFamily family);
// "FREE", "ATTACHED".
std::string SlotStateName(v1::SlotState state);

// SUCCEEDED, FAILED or CANCELLED: the job will not change again.
bool IsTerminalJobStatus(v1::JobStatus status);
// FAILED or CANCELLED.
bool IsUnsuccessfulJobStatus(v1::JobStatus status);

// "2024-05-01 12:03:04" in the local time zone; "-" when unset.
std::string FormatTimestamp(const google::protobuf::Timestamp& time);
// Seconds since the Unix epoch, for rate estimates.
double TimestampSeconds(const google::protobuf::Timestamp& time);

// "512 B", "3.2 KiB", "1.5 MiB", "2.0 GiB".
std::string FormatBytes(int64_t bytes);
// Shortest round-trip form: 0.002, 1e-08, 16.
std::string FormatNumber(double value);

// One-line summaries of a job's effective configuration.
std::string DescribeLora(const v1::LoraConfig& lora);
std::string DescribeOptimizer(const v1::OptimizerConfig& optimizer);
std::string DescribeSchedule(const v1::LrSchedule& schedule);
std::string DescribeTraining(const v1::TrainingConfig& training);
// "loss 2.3451  lr 2.00e-03  ..." of one metrics message (without the
// step); only the validation loss for step 0 (an evaluation).
std::string DescribeMetrics(const v1::JobMetrics& metrics);

// The message as proto3 JSON (every field printed, lowerCamelCase names);
// `multiline` indents it, otherwise it is one line.
std::string MessageToJson(const google::protobuf::Message& message,
                          bool multiline);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_DISPLAY_FORMAT_H_
