#include "server/checkpoints/pool_checkpointer.h"

#include <exception>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"

namespace loraplex {
namespace {

// The files' code reports errors as Status; an exception (out of memory,
// a JSON dump) still must not end the writer thread.
template <typename Fn>
absl::Status CatchExceptions(absl::string_view what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(what, ": ", error.what()));
  }
}

// Writes `files` into <dir>.staged and publishes it as `dir`.
absl::Status WriteStagedDirectory(
    const std::string& dir, const std::map<std::string, std::string>& files) {
  namespace fs = std::filesystem;
  const std::string staged = dir + ".staged";
  std::error_code error;
  fs::remove_all(staged, error);
  fs::create_directories(staged, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", staged, ": ", error.message()));
  }
  for (const auto& [name, bytes] : files) {
    LORAPLEX_RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(staged, "/", name), bytes));
  }
  return PublishDirectory(staged, dir);
}

}  // namespace

PoolCheckpointer::PoolCheckpointer(PoolCheckpointerOptions options)
    : options_(std::move(options)) {
  // Ranks other than 0 write nothing (their root is unused).
  if (options_.root.empty()) return;
  writer_ = std::thread([this] { WriterLoop(); });
  writer_id_ = writer_.get_id();
}

PoolCheckpointer::~PoolCheckpointer() { Stop(); }

void PoolCheckpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  changed_.SignalAll();
  if (writer_.joinable()) writer_.join();
}

void PoolCheckpointer::LoadGroup() {
  if (options_.root.empty()) return;
  std::map<std::string, int64_t> group =
      ReadPoolCheckpoint(options_.root)
          .value_or(std::map<std::string, int64_t>{});
  absl::MutexLock lock(&mu_);
  group_ = std::move(group);
}

std::string PoolCheckpointer::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.root, "/", job_id);
}

std::string PoolCheckpointer::StepDir(const std::string& job_id,
                                      int64_t step) const {
  return CheckpointDir(JobDir(job_id), step);
}

int64_t PoolCheckpointer::ResumeCap(const std::string& job_id,
                                    bool recovering) const {
  absl::MutexLock lock(&mu_);
  auto pooled = group_.find(job_id);
  return recovering && pooled != group_.end() ? pooled->second : INT64_MAX;
}

int PoolCheckpointer::SlotHint(const std::string& job_id, bool recovering) {
  if (!enabled()) return -1;
  WaitForJob(job_id);
  return CheckpointSlotHint(JobDir(job_id), ResumeCap(job_id, recovering));
}

absl::StatusOr<std::optional<PoolCheckpointer::ResumePoint>>
PoolCheckpointer::FindResumePoint(const std::string& job_id, bool recovering,
                                  std::vector<std::string>* rejected) {
  if (!enabled()) return std::nullopt;
  WaitForJob(job_id);
  const std::optional<CheckpointEntry> latest = LatestValidCheckpoint(
      JobDir(job_id), rejected, ResumeCap(job_id, recovering));
  if (!latest) return std::nullopt;
  ResumePoint point;
  point.dir = latest->dir;
  LORAPLEX_ASSIGN_OR_RETURN(point.info, ReadCheckpointInfo(latest->dir));
  if (point.info.job_id != job_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", latest->dir, " belongs to job ", point.info.job_id));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      point.training_state,
      ReadCheckpointFile(latest->dir, kCheckpointStateFile));
  return point;
}

void PoolCheckpointer::DropAfter(const std::string& job_id, int64_t step) {
  if (!enabled()) return;
  WaitForJob(job_id);
  RemoveCheckpointsAfter(JobDir(job_id), step);
}

void PoolCheckpointer::Write(CheckpointContents contents,
                             std::function<void(absl::Status)> done) {
  Task task;
  task.job_id = contents.info.job_id;
  task.bytes = contents.size_bytes();
  task.run = [this, contents = std::move(contents), done = std::move(done)] {
    RunWrite(contents, done);
  };
  Queue(std::move(task));
}

void PoolCheckpointer::WriteDirectory(const std::string& job_id,
                                      std::string dir,
                                      std::map<std::string, std::string> files,
                                      std::function<void(absl::Status)> done) {
  Task task;
  task.job_id = job_id;
  for (const auto& [name, bytes] : files) task.bytes += bytes.size();
  task.run = [dir = std::move(dir), files = std::move(files),
              done = std::move(done)] {
    const absl::Status status = CatchExceptions(
        "export", [&] { return WriteStagedDirectory(dir, files); });
    if (done) done(status);
  };
  Queue(std::move(task));
}

void PoolCheckpointer::Post(std::function<void()> work) {
  Task task;
  task.run = std::move(work);
  Queue(std::move(task));
}

void PoolCheckpointer::Forget(const std::string& job_id) {
  Task task;
  task.job_id = job_id;
  task.run = [this, job_id] {
    bool was_pooled = false;
    {
      absl::MutexLock lock(&mu_);
      was_pooled = group_.erase(job_id) > 0;
    }
    if (was_pooled) SaveGroup();
  };
  Queue(std::move(task));
}

void PoolCheckpointer::RecordGroup(std::vector<std::string> held,
                                   std::map<std::string, int64_t> queued,
                                   std::function<void()> done) {
  Task task;
  task.run = [this, held = std::move(held), queued = std::move(queued),
              done = std::move(done)] {
    RunRecordGroup(held, queued);
    if (done) done();
  };
  Queue(std::move(task));
}

void PoolCheckpointer::Queue(Task task) {
  {
    absl::ReleasableMutexLock lock(&mu_);
    // No writer (no root: nothing is written, only the group changes), or
    // it has stopped: the task runs here.
    if (writer_id_ == std::thread::id() || stop_) {
      lock.Release();
      task.run();
      return;
    }
    // Bounded: waits for room, but a checkpoint larger than the bound
    // alone is taken once the queue is empty, and tasks of no bytes always.
    auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queued_bytes_ == 0 || task.bytes == 0 ||
             queued_bytes_ + task.bytes <= options_.max_queued_bytes;
    };
    while (!room()) changed_.Wait(&mu_);
    queued_bytes_ += task.bytes;
    ++unfinished_;
    if (!task.job_id.empty()) ++unfinished_by_job_[task.job_id];
    queue_.push_back(std::move(task));
  }
  changed_.SignalAll();
}

void PoolCheckpointer::WriterLoop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) changed_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping, everything written.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Tasks report their errors; an exception (out of memory in a `done`)
    // must not end the process from this thread.
    CatchExceptions("writer task", [&] {
      task.run();
      return absl::OkStatus();
    }).IgnoreError();
    {
      absl::MutexLock lock(&mu_);
      queued_bytes_ -= task.bytes;
      --unfinished_;
      if (!task.job_id.empty() && --unfinished_by_job_[task.job_id] == 0) {
        unfinished_by_job_.erase(task.job_id);
      }
    }
    changed_.SignalAll();
  }
}

void PoolCheckpointer::Flush() {
  absl::MutexLock lock(&mu_);
  while (unfinished_ > 0) changed_.Wait(&mu_);
}

void PoolCheckpointer::WaitForJob(const std::string& job_id) {
  // On the writer thread (in a Post()ed task) everything queued before the
  // task is done, and what was queued after it must not be waited for.
  if (std::this_thread::get_id() == writer_id_) return;
  absl::MutexLock lock(&mu_);
  while (unfinished_by_job_.count(job_id) > 0) changed_.Wait(&mu_);
}

void PoolCheckpointer::RunWrite(const CheckpointContents& contents,
                                const std::function<void(absl::Status)>& done) {
  const std::string& job_id = contents.info.job_id;
  TestSlowCheckpoint();
  int64_t keep_step = -1;
  {
    absl::MutexLock lock(&mu_);
    auto pooled = group_.find(job_id);
    if (pooled != group_.end()) keep_step = pooled->second;
  }
  const absl::Status status = CatchExceptions("checkpoint", [&] {
    return WriteCheckpointFiles(JobDir(job_id), contents, options_.keep,
                                keep_step);
  });
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    written_[job_id] = contents.info.step();
  }
  if (done) done(status);
}

void PoolCheckpointer::RunRecordGroup(
    const std::vector<std::string>& held,
    const std::map<std::string, int64_t>& queued) {
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& job_id : held) group_.erase(job_id);
    for (const auto& [job_id, step] : queued) {
      auto written = written_.find(job_id);
      if (written != written_.end() && written->second == step) {
        group_[job_id] = step;
      }
    }
    written_.clear();
  }
  SaveGroup();
}

void PoolCheckpointer::SaveGroup() {
  if (options_.root.empty()) return;
  std::map<std::string, int64_t> group;
  {
    absl::MutexLock lock(&mu_);
    group = group_;
  }
  // On failure the previous group stays on disk: still consistent, older.
  CatchExceptions("pool checkpoint", [&] {
    return WritePoolCheckpoint(options_.root, group);
  }).IgnoreError();
}

}  // namespace loraplex
