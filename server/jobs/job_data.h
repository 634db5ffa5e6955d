// Turns a job's stored datasets into the sequences it trains and evaluates
// on, and counts its steps.
//
//   DatasetLoader datasets(state_dir + "/datasets", tokenizer.get());
//   LORAPLEX_ASSIGN_OR_RETURN(JobData data,
//                             PrepareJobData(datasets, record, &spec));
//
// Datasets are immutable once stored, so parsed ones are kept in a small
// cache: several jobs over one upload parse it once.
#ifndef LORAPLEX_SERVER_JOBS_JOB_DATA_H_
#define LORAPLEX_SERVER_JOBS_JOB_DATA_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/data/dataset.h"
#include "core/data/sequences.h"
#include "core/tokenizer/tokenizer.h"
#include "server/jobs/job_spec.h"
#include "server/store/records.h"

namespace loraplex {

class DatasetLoader {
 public:
  // `tokenizer` must outlive the loader. `options` are those every dataset
  // is parsed with (vocab_size: the base model's embedding rows).
  DatasetLoader(std::string dir, const Tokenizer* tokenizer,
                size_t cache_entries = 4, DatasetParseOptions options = {});

  // Where the dataset's JSONL file is stored.
  std::string PathOf(const std::string& id) const;
  // Where its upload's chat line defaults are stored (ChatLineDefaultsToJson),
  // for an upload that set any; no file: none.
  std::string ChatDefaultsPathOf(const std::string& id) const;
  // Thread-safe.
  absl::StatusOr<std::shared_ptr<const Dataset>> Load(const std::string& id);
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const DatasetParseOptions& parse_options() const { return options_; }

 private:
  std::string dir_;
  const Tokenizer* tokenizer_;
  size_t cache_entries_;
  DatasetParseOptions options_;
  absl::Mutex mu_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const Dataset>>> cache_
      ABSL_GUARDED_BY(mu_);
};

struct JobData {
  // Null for an evaluation-only job.
  std::shared_ptr<const SequenceSet> training;
  // Null when the job has no validation dataset.
  std::shared_ptr<const SequenceSet> validation;
  int64_t total_steps = 0;  // 0 for an evaluation-only job.
  // Facts about the data the user should see in the job's events, e.g.
  // that chat lines use the built-in format.
  std::vector<std::string> notes;
};

// Builds the job's sequences with its seq_len and packing, counts its steps
// and, when spec->schedule_spans_job, sets spec->schedule.total_steps to
// them. Errors (e.g. no sequence left with a target) are INVALID_ARGUMENT
// starting with the request field: "training_dataset: ...".
absl::StatusOr<JobData> PrepareJobData(DatasetLoader& datasets,
                                       const JobRecord& job, JobSpec* spec);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_DATA_H_
