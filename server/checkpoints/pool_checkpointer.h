// The trainer's checkpoint policy and files (docs/DESIGN.md §7): where each
// job's checkpoints go, when the pool is due one, which checkpoint a job
// resumes from, and the pool's last complete checkpoint group.
//
// Checkpoints are pool-consistent: when a step completes a multiple of any
// job's interval, every training slot is checkpointed at that same step
// boundary and the group is recorded in <root>/pool.json. A job requeued
// by a restart resumes from its step in that group, not from a newer
// checkpoint of a group the crash cut short, so jobs resumed together
// train in the same co-batches as before and replay bit-exactly.
//
// The trainer never waits for the disk: Write() queues a checkpoint's
// files (encoded in memory on the trainer thread) for the checkpointer's
// writer thread, which writes, fsyncs and hashes them in the order they
// were queued and then calls the write's `done`. RecordGroup() and Forget()
// are queued behind the writes before them, so pool.json names a
// checkpoint only once it is committed, and a crash at any moment leaves
// the previous group complete. The queue is bounded in bytes: Write()
// blocks while it is full. What reads a job's checkpoints (its slot hint,
// resume point, dropping abandoned ones) first waits for that job's queued
// work, so it never sees a checkpoint half written.
//
//   PoolCheckpointer checkpoints(
//       {.root = dir, .interval = 50, .enabled = true});
//   checkpoints.LoadGroup();                       // rank 0, at start
//   auto resume = checkpoints.FindResumePoint(job_id, recovering, &why);
//   checkpoints.Write(std::move(contents), [](absl::Status written) {...});
//   ... every slot queued: checkpoints.RecordGroup(held, queued_steps) ...
//   checkpoints.Flush();                           // all of it on disk
//
// Called from the trainer thread; `done` runs on the writer thread.
#ifndef LORAPLEX_SERVER_CHECKPOINTS_POOL_CHECKPOINTER_H_
#define LORAPLEX_SERVER_CHECKPOINTS_POOL_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/checkpoints/checkpoint_files.h"

namespace loraplex {

struct PoolCheckpointerOptions {
  // Checkpoints go to <root>/<job id>/; empty: none are taken.
  std::string root;
  // Steps between checkpoints of jobs whose config leaves it at 0; 0: only
  // on pause, retire and stop.
  int64_t interval = 0;
  // Checkpoints kept per job (the newest).
  int keep = 3;
  // base_model_name_or_path written into the checkpoints' adapter configs.
  std::string base_model_name;
  // Whether checkpoints are taken: on rank 0, when `root` is set; on the
  // other ranks (which write nothing, their root is unused), when rank 0
  // takes them: they take part in gathering the optimizer state.
  bool enabled = false;
  // Bytes of checkpoint files queued for the writer before Write() waits
  // (one checkpoint is always taken, however large).
  int64_t max_queued_bytes = int64_t{1} << 30;
};

class PoolCheckpointer {
 public:
  explicit PoolCheckpointer(PoolCheckpointerOptions options);
  ~PoolCheckpointer();  // Stop().
  PoolCheckpointer(const PoolCheckpointer&) = delete;
  PoolCheckpointer& operator=(const PoolCheckpointer&) = delete;

  bool enabled() const { return options_.enabled; }
  // Reads pool.json; a damaged one is ignored (each job then resumes from
  // its newest valid checkpoint). Before the first Write().
  void LoadGroup();

  std::string JobDir(const std::string& job_id) const;
  // The checkpoint directory of the job at `step`.
  std::string StepDir(const std::string& job_id, int64_t step) const;
  // A job's checkpoint interval: its own, else the default.
  int64_t IntervalFor(int64_t job_interval) const {
    return job_interval > 0 ? job_interval : options_.interval;
  }

  // The slot the job's checkpoint to resume was taken in, or -1.
  int SlotHint(const std::string& job_id, bool recovering);
  struct ResumePoint {
    std::string dir;
    CheckpointInfo info;
    std::string training_state;  // training_state.pt's bytes.
  };
  // The checkpoint to resume the job from: the newest that verifies (after
  // a crash, up to its step in the pool's group); none when it has none.
  // The newer ones that do not verify are described in `rejected`.
  absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(
      const std::string& job_id, bool recovering,
      std::vector<std::string>* rejected);
  // Deletes the job's checkpoints after `step`: a run a crash abandoned.
  void DropAfter(const std::string& job_id, int64_t step);

  // Queues the checkpoint (WriteCheckpointFiles, pruning old ones but never
  // the one of the job's step in the pool's group); `done` gets the outcome
  // on the writer thread once it is committed or has failed. It must not
  // call the checkpointer.
  void Write(CheckpointContents contents,
             std::function<void(absl::Status)> done);
  // Queues a directory of files (an adapter export, `files` as name ->
  // bytes) for `dir`: written into <dir>.staged, then published in one
  // rename (PublishDirectory). `done` as for Write(). Counted as the job's
  // work.
  void WriteDirectory(const std::string& job_id, std::string dir,
                      std::map<std::string, std::string> files,
                      std::function<void(absl::Status)> done);
  // Runs `work` on the writer thread after everything queued before it
  // (at once, on this thread, when there is no writer). Never waits for
  // room. `work` must not call Flush().
  void Post(std::function<void()> work);
  // Waits until everything queued so far is done.
  void Flush();
  // Writes everything queued, then ends the writer; what is queued later
  // runs on the caller's thread.
  void Stop();
  // Waits until the job's queued work is done (on the writer thread: the
  // work queued before the running task, which is done).
  void WaitForJob(const std::string& job_id);

  // The job left the pool: it is no longer part of the group.
  void Forget(const std::string& job_id);
  // A new complete group at this step boundary: the entries of the jobs in
  // `held` (every job in a slot now) are replaced by those of `queued` (job
  // -> step of the checkpoints queued for it) that were written; others
  // (recovered jobs waiting for a slot) keep theirs. `done` (if any) runs
  // on the writer thread once pool.json is written (or failed to be).
  void RecordGroup(std::vector<std::string> held,
                   std::map<std::string, int64_t> queued,
                   std::function<void()> done = nullptr);

 private:
  struct Task {
    std::string job_id;  // Empty: the pool's.
    int64_t bytes = 0;
    std::function<void()> run;
  };

  void Queue(Task task);
  void WriterLoop();
  void RunWrite(const CheckpointContents& contents,
                const std::function<void(absl::Status)>& done);
  void RunRecordGroup(const std::vector<std::string>& held,
                      const std::map<std::string, int64_t>& queued);
  // The newest step the job may resume from.
  int64_t ResumeCap(const std::string& job_id, bool recovering) const;
  // Writes pool.json (writer thread).
  void SaveGroup() ABSL_LOCKS_EXCLUDED(mu_);

  const PoolCheckpointerOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  // The jobs of the pool's last complete checkpoint and their steps, as
  // pool.json has them (changed by the writer).
  std::map<std::string, int64_t> group_ ABSL_GUARDED_BY(mu_);
  // Checkpoints committed since the last RecordGroup: job -> step.
  std::map<std::string, int64_t> written_ ABSL_GUARDED_BY(mu_);
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Tasks queued or running, in all and per job.
  int64_t unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> unfinished_by_job_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
  std::thread::id writer_id_;  // Set once, before any task is queued.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_CHECKPOINTS_POOL_CHECKPOINTER_H_
