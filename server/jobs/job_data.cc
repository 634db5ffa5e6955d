#include "server/jobs/job_data.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

absl::Status Prefixed(absl::string_view field, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(field, ": ", status.message()));
}

}  // namespace

DatasetLoader::DatasetLoader(std::string dir, const Tokenizer* tokenizer,
                             size_t cache_entries, DatasetParseOptions options)
    : dir_(std::move(dir)),
      tokenizer_(tokenizer),
      cache_entries_(cache_entries),
      options_(options) {}

std::string DatasetLoader::PathOf(const std::string& id) const {
  return absl::StrCat(dir_, "/", id, ".jsonl");
}

std::string DatasetLoader::ChatDefaultsPathOf(const std::string& id) const {
  return absl::StrCat(dir_, "/", id, ".chat.json");
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetLoader::Load(
    const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first != id) continue;
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front().second;
    }
  }
  // Parsed outside the lock: a large file takes a while and other datasets
  // need not wait for it.
  DatasetParseOptions options = options_;
  const std::string defaults_path = ChatDefaultsPathOf(id);
  std::error_code error;
  if (std::filesystem::exists(defaults_path, error)) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string text, ReadFile(defaults_path));
    absl::StatusOr<ChatLineDefaults> defaults = ChatLineDefaultsFromJson(text);
    if (!defaults.ok()) {
      return absl::Status(
          defaults.status().code(),
          absl::StrCat(defaults_path, ": ", defaults.status().message()));
    }
    options.chat_defaults = *std::move(defaults);
  }
  LORAPLEX_ASSIGN_OR_RETURN(Dataset dataset,
                            LoadJsonlDataset(PathOf(id), *tokenizer_, options));
  auto shared = std::make_shared<const Dataset>(std::move(dataset));
  absl::MutexLock lock(&mu_);
  cache_.emplace_front(id, shared);
  while (cache_.size() > cache_entries_) cache_.pop_back();
  return shared;
}

absl::StatusOr<JobData> PrepareJobData(DatasetLoader& datasets,
                                       const JobRecord& job, JobSpec* spec) {
  const SequenceOptions options{spec->training.seq_len, spec->training.pack};
  JobData data;
  auto build = [&](const std::string& id, absl::string_view field)
      -> absl::StatusOr<std::shared_ptr<const SequenceSet>> {
    absl::StatusOr<std::shared_ptr<const Dataset>> dataset = datasets.Load(id);
    if (!dataset.ok()) return Prefixed(field, dataset.status());
    if (const int64_t n = (*dataset)->num_builtin_chat_lines; n > 0) {
      data.notes.push_back(absl::StrCat(
          field, ": the base model has no chat template, so its ", n,
          " chat line", n == 1 ? " uses" : "s use",
          " loraplex's built-in format (\"<|role|>\\n\" + content + EOS "
          "per message)"));
    }
    if (const int64_t n = (*dataset)->num_per_turn_lines; n > 0) {
      data.notes.push_back(absl::StrCat(
          field, ": ", n, " of its ", (*dataset)->num_lines, " lines became ",
          "one example per trained assistant turn (the chat template renders ",
          "earlier turns differently once later ones follow), ",
          (*dataset)->examples.size(), " examples in all"));
    }
    absl::StatusOr<SequenceSet> sequences = BuildSequences(**dataset, options);
    if (!sequences.ok()) return Prefixed(field, sequences.status());
    return std::make_shared<const SequenceSet>(*std::move(sequences));
  };
  if (!job.training_dataset_id.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        data.training, build(job.training_dataset_id, "training_dataset"));
    data.total_steps = TotalSteps(
        spec->training, static_cast<int64_t>(data.training->sequences.size()));
    if (spec->schedule_spans_job) {
      spec->schedule.total_steps = std::max<int64_t>(1, data.total_steps);
      absl::Status schedule = ValidateLrScheduleConfig(spec->schedule);
      if (!schedule.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(schedule.message(), " (the job trains ",
                         data.total_steps, " steps)"));
      }
    }
  }
  if (!job.validation_dataset_id.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(data.validation, build(job.validation_dataset_id,
                                                     "validation_dataset"));
  }
  return data;
}

}  // namespace loraplex
