#include "server/checkpoints/checkpoint_files.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "adapters/peft_files.h"
#include "core/common/atomic_file.h"
#include "core/common/read_file.h"
#include "core/common/sha256.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestFormat[] = "loraplex.checkpoint";
constexpr int kManifestVersion = 1;
constexpr char kStepPrefix[] = "step-";
constexpr char kPartialSuffix[] = ".partial";

// The files of a checkpoint besides the manifest, all required.
const std::vector<std::string>& CheckpointFiles() {
  static const auto* files =
      new std::vector<std::string>{kPeftConfigFile, kPeftWeightsFile,
                                   kCheckpointStateFile, kCheckpointInfoFile};
  return *files;
}

// The step of a committed checkpoint directory name ("step-00000120").
std::optional<int64_t> StepOfName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix)) return std::nullopt;
  int64_t step = 0;
  if (name.empty() || !absl::SimpleAtoi(name, &step) || step < 0) {
    return std::nullopt;
  }
  return step;
}

// Every step-N directory, oldest first, with or without a manifest.
std::vector<CheckpointEntry> StepDirs(const std::string& job_dir) {
  std::vector<CheckpointEntry> entries;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(job_dir, error)) {
    const std::optional<int64_t> step =
        StepOfName(entry.path().filename().string());
    if (step && entry.is_directory(error)) {
      entries.push_back({*step, entry.path().string()});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) {
              return a.step < b.step;
            });
  return entries;
}

absl::Status WriteFiles(const std::string& dir,
                        const CheckpointContents& contents) {
  const CheckpointInfo& info = contents.info;
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(dir, "/", kPeftWeightsFile), contents.adapter_weights));
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(dir, "/", kPeftConfigFile), contents.adapter_config));
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(dir, "/", kCheckpointStateFile), contents.training_state));
  LORAPLEX_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(dir, "/", kCheckpointInfoFile),
                          CheckpointInfoToJson(info).dump(2)));
  // The manifest hashes what is on disk, read back.
  nlohmann::json files = nlohmann::json::object();
  for (const std::string& name : CheckpointFiles()) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string bytes,
                              ReadFile(absl::StrCat(dir, "/", name)));
    files[name] = {{"size", bytes.size()}, {"sha256", Sha256Hex(bytes)}};
  }
  const nlohmann::json manifest = {{"format", kManifestFormat},
                                   {"version", kManifestVersion},
                                   {"job_id", info.job_id},
                                   {"step", info.step()},
                                   {"files", std::move(files)}};
  return WriteFileAtomically(absl::StrCat(dir, "/", kCheckpointManifestFile),
                             manifest.dump(2));
}

// Removes a checkpoint directory: renamed to a partial one first, so a
// crash part way never leaves a step directory with files missing.
void RemoveCheckpointDir(const std::string& dir) {
  std::error_code error;
  const std::string doomed = dir + kPartialSuffix;
  fs::remove_all(doomed, error);
  fs::rename(dir, doomed, error);
  fs::remove_all(error ? dir : doomed, error);
}

// Deletes all but the newest `keep_last` checkpoints (never the one of
// step `keep_step`) and every partial directory. Errors are ignored: the
// next write tries again.
void Prune(const std::string& job_dir, int keep_last, int64_t keep_step) {
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(job_dir, error)) {
    if (absl::EndsWith(entry.path().filename().string(), kPartialSuffix)) {
      fs::remove_all(entry.path(), error);
    }
  }
  std::vector<CheckpointEntry> all = ListCheckpoints(job_dir);
  const int excess = static_cast<int>(all.size()) - std::max(keep_last, 1);
  for (int i = 0; i < excess; ++i) {
    if (all[i].step != keep_step) RemoveCheckpointDir(all[i].dir);
  }
}

// VerifyCheckpoint's work; nlohmann throws for fields of the wrong type.
absl::Status VerifyFiles(const std::string& dir) {
  absl::StatusOr<std::string> text =
      ReadFile(absl::StrCat(dir, "/", kCheckpointManifestFile));
  if (!text.ok()) {
    return absl::DataLossError(
        absl::StrCat("no readable ", kCheckpointManifestFile));
  }
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() ||
      manifest.value("format", "") != kManifestFormat ||
      !manifest.contains("files") || !manifest["files"].is_object()) {
    return absl::DataLossError(
        absl::StrCat(kCheckpointManifestFile, " is not a checkpoint manifest"));
  }
  if (manifest.value("version", 0) != kManifestVersion) {
    return absl::DataLossError(
        absl::StrCat(kCheckpointManifestFile, " has unsupported version ",
                     manifest.value("version", 0),
                     " (this server reads version ", kManifestVersion, ")"));
  }
  const nlohmann::json& files = manifest["files"];
  for (const std::string& name : CheckpointFiles()) {
    if (!files.contains(name) || !files[name].is_object()) {
      return absl::DataLossError(
          absl::StrCat(kCheckpointManifestFile, " does not list ", name));
    }
    const nlohmann::json& expected = files[name];
    absl::StatusOr<std::string> bytes = ReadFile(absl::StrCat(dir, "/", name));
    if (!bytes.ok()) {
      return absl::DataLossError(absl::StrCat(name, " is missing"));
    }
    const int64_t size = expected.value("size", int64_t{-1});
    if (static_cast<int64_t>(bytes->size()) != size) {
      return absl::DataLossError(absl::StrCat(
          name, " has ", bytes->size(), " bytes, the manifest says ", size));
    }
    const std::string digest = Sha256Hex(*bytes);
    const std::string listed = expected.value("sha256", "");
    if (digest != listed) {
      return absl::DataLossError(absl::StrCat(name, " has SHA-256 ", digest,
                                              ", the manifest says ", listed));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// JSON has no NaN or infinity: a metric that was not finite (a skipped
// step's loss) is written as null and read back as NaN.
double MetricFromJson(const nlohmann::json& json) {
  return json.is_null() ? std::numeric_limits<double>::quiet_NaN()
                        : json.get<double>();
}

}  // namespace

nlohmann::json CheckpointInfoToJson(const CheckpointInfo& info) {
  nlohmann::json json = {{"job_id", info.job_id},
                         {"time_ms", info.time_ms},
                         {"slot", info.slot},
                         {"total_steps", info.total_steps},
                         {"steps", info.counters.steps},
                         {"skipped_steps", info.counters.skipped_steps},
                         {"target_tokens", info.counters.target_tokens},
                         {"tokens", info.tokens},
                         {"cursor", DataCursorStateToJson(info.cursor)},
                         {"job_spec", info.job_spec}};
  if (info.metrics) {
    json["metrics"] = {{"loss", info.metrics->loss},
                       {"lr", info.metrics->lr},
                       {"grad_norm", info.metrics->grad_norm}};
    if (info.metrics->validation_loss) {
      json["metrics"]["validation_loss"] = *info.metrics->validation_loss;
    }
  }
  return json;
}

absl::StatusOr<CheckpointInfo> CheckpointInfoFromJson(
    const nlohmann::json& json) {
  CheckpointInfo info;
  try {
    info.job_id = json.at("job_id").get<std::string>();
    info.time_ms = json.at("time_ms").get<int64_t>();
    info.slot = json.at("slot").get<int>();
    info.total_steps = json.at("total_steps").get<int64_t>();
    info.counters.steps = json.at("steps").get<int64_t>();
    info.counters.skipped_steps = json.at("skipped_steps").get<int64_t>();
    info.counters.target_tokens = json.at("target_tokens").get<int64_t>();
    info.tokens = json.at("tokens").get<int64_t>();
    info.job_spec = json.at("job_spec");
    absl::StatusOr<DataCursorState> cursor =
        DataCursorStateFromJson(json.at("cursor"));
    if (!cursor.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCheckpointInfoFile, ": ", cursor.status().message()));
    }
    info.cursor = *cursor;
    if (json.contains("metrics")) {
      const nlohmann::json& metrics = json.at("metrics");
      CheckpointMetrics m;
      m.loss = MetricFromJson(metrics.at("loss"));
      m.lr = MetricFromJson(metrics.at("lr"));
      m.grad_norm = MetricFromJson(metrics.at("grad_norm"));
      if (metrics.contains("validation_loss")) {
        m.validation_loss = MetricFromJson(metrics.at("validation_loss"));
      }
      info.metrics = m;
    }
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCheckpointInfoFile, ": ", error.what()));
  }
  if (info.counters.steps < 0 || info.counters.steps > info.total_steps ||
      info.counters.skipped_steps < 0 ||
      info.counters.skipped_steps > info.counters.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCheckpointInfoFile, ": inconsistent step counters"));
  }
  return info;
}

std::string CheckpointDir(const std::string& job_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08" PRId64, kStepPrefix, step);
  return absl::StrCat(job_dir, "/", name);
}

absl::Status WriteCheckpointFiles(const std::string& job_dir,
                                  const CheckpointContents& contents,
                                  int keep_last, int64_t keep_step) {
  const CheckpointInfo& info = contents.info;
  const std::string dir = CheckpointDir(job_dir, info.step());
  std::error_code error;
  if (fs::exists(absl::StrCat(dir, "/", kCheckpointManifestFile), error)) {
    return absl::OkStatus();  // Same step, same state: already on disk.
  }
  const std::string partial = dir + kPartialSuffix;
  fs::remove_all(partial, error);
  const bool new_job_dir = !fs::exists(job_dir, error);
  fs::create_directories(partial, error);
  if (error) {
    return absl::InternalError(absl::StrCat(
        "cannot create checkpoint directory ", partial, ": ", error.message()));
  }
  if (new_job_dir) {
    // Its entry (and the root's, if new too) must survive a power loss.
    const fs::path parent = fs::path(job_dir).parent_path();
    FsyncDirectory(parent.parent_path().string()).IgnoreError();
    FsyncDirectory(parent.string()).IgnoreError();
  }
  absl::Status status = WriteFiles(partial, contents);
  if (status.ok()) status = PublishDirectory(partial, dir);
  if (!status.ok()) {
    fs::remove_all(partial, error);
    return absl::Status(status.code(), absl::StrCat("writing checkpoint ", dir,
                                                    ": ", status.message()));
  }
  Prune(job_dir, keep_last, keep_step);
  return absl::OkStatus();
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& job_dir) {
  std::vector<CheckpointEntry> entries = StepDirs(job_dir);
  std::error_code error;
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [&](const CheckpointEntry& entry) {
                                 return !fs::exists(
                                     absl::StrCat(entry.dir, "/",
                                                  kCheckpointManifestFile),
                                     error);
                               }),
                entries.end());
  return entries;
}

absl::Status VerifyCheckpoint(const std::string& dir) {
  try {
    return VerifyFiles(dir);
  } catch (const nlohmann::json::exception& error) {
    return absl::DataLossError(
        absl::StrCat(kCheckpointManifestFile, " is damaged: ", error.what()));
  }
}

absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& dir) {
  LORAPLEX_ASSIGN_OR_RETURN(
      std::string text, ReadFile(absl::StrCat(dir, "/", kCheckpointInfoFile)));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCheckpointInfoFile, " is not a JSON object"));
  }
  return CheckpointInfoFromJson(json);
}

absl::StatusOr<std::string> ReadCheckpointFile(const std::string& dir,
                                               const std::string& name) {
  return ReadFile(absl::StrCat(dir, "/", name));
}

int64_t CheckpointSizeBytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const uintmax_t size = entry.file_size(error);
    if (!error) total += static_cast<int64_t>(size);
  }
  return total;
}

std::optional<CheckpointEntry> LatestValidCheckpoint(
    const std::string& job_dir, std::vector<std::string>* rejected,
    int64_t max_step) {
  // Directories without a manifest are looked at too, to be reported: the
  // writer never leaves one, so someone or something else did.
  std::vector<CheckpointEntry> all = StepDirs(job_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step > max_step) continue;
    absl::Status status = VerifyCheckpoint(it->dir);
    if (status.ok()) return *it;
    if (rejected != nullptr) {
      rejected->push_back(absl::StrCat(fs::path(it->dir).filename().string(),
                                       ": ", status.message()));
    }
  }
  // Better a newer checkpoint than none at all.
  if (max_step != INT64_MAX) {
    return LatestValidCheckpoint(job_dir, rejected, INT64_MAX);
  }
  return std::nullopt;
}

absl::StatusOr<std::map<std::string, int64_t>> ReadPoolCheckpoint(
    const std::string& root) {
  const std::string path = absl::StrCat(root, "/pool.json");
  std::error_code error;
  if (!fs::exists(path, error)) return std::map<std::string, int64_t>{};
  LORAPLEX_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  std::map<std::string, int64_t> jobs;
  if (!json.is_object() || !json.contains("jobs") ||
      !json["jobs"].is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is damaged"));
  }
  for (const auto& [job, step] : json["jobs"].items()) {
    if (!step.is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path, " is damaged"));
    }
    jobs[job] = step.get<int64_t>();
  }
  return jobs;
}

absl::Status WritePoolCheckpoint(const std::string& root,
                                 const std::map<std::string, int64_t>& jobs) {
  std::error_code error;
  fs::create_directories(root, error);
  const nlohmann::json json = {{"jobs", jobs}};
  return WriteFileAtomically(absl::StrCat(root, "/pool.json"), json.dump(2));
}

int CheckpointSlotHint(const std::string& job_dir, int64_t max_step) {
  std::vector<CheckpointEntry> all = ListCheckpoints(job_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step > max_step) continue;
    absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(it->dir);
    if (info.ok()) return info->slot;
  }
  return -1;
}

void RemoveCheckpointsAfter(const std::string& job_dir, int64_t step) {
  for (const CheckpointEntry& entry : StepDirs(job_dir)) {
    if (entry.step > step) RemoveCheckpointDir(entry.dir);
  }
}

int KeepNewestCheckpoints(const std::string& job_dir, int keep) {
  const int before = static_cast<int>(ListCheckpoints(job_dir).size());
  if (keep <= 0) {
    std::error_code error;
    fs::remove_all(job_dir, error);
    return before;
  }
  Prune(job_dir, keep, /*keep_step=*/-1);
  return before - static_cast<int>(ListCheckpoints(job_dir).size());
}

}  // namespace loraplex
