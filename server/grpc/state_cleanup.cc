#include "server/grpc/state_cleanup.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/checkpoints/checkpoint_files.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<absl::flat_hash_set<std::string>> IdsOf(JobStore& store,
                                                       JobStore::Table table) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<std::string> ids, store.AllIds(table));
  return absl::flat_hash_set<std::string>(ids.begin(), ids.end());
}

// The entries of `dir` (none when it is missing).
std::vector<fs::path> Entries(const fs::path& dir) {
  std::vector<fs::path> paths;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    paths.push_back(entry.path());
  }
  return paths;
}

bool Remove(const fs::path& path) {
  std::error_code error;
  return fs::remove_all(path, error) > 0 && !error;
}

}  // namespace

absl::StatusOr<StateCleanup> CleanUpState(const std::string& state_dir,
                                          JobStore& store,
                                          int keep_finished_checkpoints) {
  StateCleanup removed;
  const fs::path root(state_dir);
  for (const fs::path& path : Entries(root / "tmp")) {
    removed.orphans += Remove(path);
  }

  LORAPLEX_ASSIGN_OR_RETURN(auto datasets,
                            IdsOf(store, JobStore::Table::kDatasets));
  for (const fs::path& path : Entries(root / "datasets")) {
    const std::string name = path.filename().string();
    const bool temporary = absl::StrContains(name, ".tmp.");
    // The dataset's file, and its upload's chat line defaults.
    bool unrecorded = false;
    for (absl::string_view suffix : {".jsonl", ".chat.json"}) {
      if (absl::EndsWith(name, suffix)) {
        unrecorded =
            !datasets.contains(name.substr(0, name.size() - suffix.size()));
      }
    }
    if (temporary || unrecorded) removed.orphans += Remove(path);
  }

  LORAPLEX_ASSIGN_OR_RETURN(auto adapters,
                            IdsOf(store, JobStore::Table::kAdapters));
  for (const fs::path& path : Entries(root / "adapters")) {
    const std::string name = path.filename().string();
    if (absl::EndsWith(name, ".staged") || absl::StrContains(name, ".tmp.") ||
        !adapters.contains(name)) {
      removed.orphans += Remove(path);
    }
  }

  LORAPLEX_ASSIGN_OR_RETURN(auto jobs, IdsOf(store, JobStore::Table::kJobs));
  std::vector<JobStatus> terminal;
  for (JobStatus status : kAllJobStatuses) {
    if (IsTerminal(status)) terminal.push_back(status);
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<JobRecord> finished_jobs,
                            store.JobsWithStatus(terminal));
  absl::flat_hash_set<std::string> finished;
  for (const JobRecord& job : finished_jobs) finished.insert(job.id);
  for (const fs::path& path : Entries(root / "checkpoints")) {
    std::error_code error;
    if (!fs::is_directory(path, error)) continue;  // pool.json and the like.
    const std::string id = path.filename().string();
    if (!jobs.contains(id)) {
      removed.orphans += Remove(path);
      continue;
    }
    if (finished.contains(id)) {
      removed.finished_checkpoints +=
          KeepNewestCheckpoints(path.string(), keep_finished_checkpoints);
    }
  }
  return removed;
}

}  // namespace loraplex
