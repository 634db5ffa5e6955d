// Checkpoints of training slots on disk: everything a job's future depends
// on, written so that a crash at any moment leaves either a complete,
// verifiable checkpoint or none (README.md, "Checkpoints").
//
//   <job_dir>/step-00000120/
//     adapter_config.json          the LoRA weights as a PEFT adapter, so a
//     adapter_model.safetensors    checkpoint exports as it is
//     training_state.pt            optimizer children's state + LR schedule
//     checkpoint.json              step, counters, data cursor, slot, time,
//                                  metrics and the job's configuration
//     manifest.json                size and SHA-256 of every file above
//
// WriteCheckpointFiles writes the files into step-N.partial/ (each
// fsynced), writes the manifest last as the commit marker, renames the
// directory into place and fsyncs <job_dir>, as
// torch.distributed.checkpoint commits its metadata last. A directory
// without a manifest that verifies is never loaded.
//
// This header has no LibTorch: the files are bytes, made from a slot by
// EncodeCheckpoint (checkpoint.h) on the trainer thread and written here by
// any thread; the service reads and lists them.
//
//   LORAPLEX_RETURN_IF_ERROR(WriteCheckpointFiles(dir, contents, 3));
//   std::vector<std::string> rejected;
//   std::optional<CheckpointEntry> latest =
//       LatestValidCheckpoint(dir, &rejected);
//   LORAPLEX_ASSIGN_OR_RETURN(CheckpointInfo info,
//                             ReadCheckpointInfo(latest->dir));
#ifndef LORAPLEX_SERVER_CHECKPOINTS_CHECKPOINT_FILES_H_
#define LORAPLEX_SERVER_CHECKPOINTS_CHECKPOINT_FILES_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data/data_cursor.h"
#include "core/train/slot_counters.h"

namespace loraplex {

inline constexpr char kCheckpointManifestFile[] = "manifest.json";
inline constexpr char kCheckpointStateFile[] = "training_state.pt";
inline constexpr char kCheckpointInfoFile[] = "checkpoint.json";

// The metrics of the step a checkpoint was taken after.
struct CheckpointMetrics {
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  std::optional<double> validation_loss;
};

// checkpoint.json: what a checkpoint records beside its tensors.
struct CheckpointInfo {
  std::string job_id;
  int64_t time_ms = 0;  // When it was written (Unix milliseconds).
  int slot = -1;        // The slot it trained in.
  int64_t total_steps = 0;
  SlotCounters counters;  // counters.steps is the checkpoint's step.
  int64_t tokens = 0;     // All tokens trained on so far.
  DataCursorState cursor;
  std::optional<CheckpointMetrics> metrics;  // Unset at step 0.
  nlohmann::json job_spec;                   // The job's configuration.

  int64_t step() const { return counters.steps; }
};

nlohmann::json CheckpointInfoToJson(const CheckpointInfo& info);
absl::StatusOr<CheckpointInfo> CheckpointInfoFromJson(
    const nlohmann::json& json);

// A committed checkpoint directory (it has a manifest; not yet verified).
struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;
};

// <job_dir>/step-<step, 8 digits or more>.
std::string CheckpointDir(const std::string& job_dir, int64_t step);

// A checkpoint's files in memory, before they are written.
struct CheckpointContents {
  CheckpointInfo info;
  std::string adapter_config;   // adapter_config.json
  std::string adapter_weights;  // adapter_model.safetensors
  std::string training_state;   // training_state.pt

  int64_t size_bytes() const {
    return static_cast<int64_t>(adapter_config.size() + adapter_weights.size() +
                                training_state.size());
  }
};

// Writes `contents` as the checkpoint of contents.info.step() and then
// deletes all but the newest `keep_last` (>= 1) checkpoints (keeping the
// one of `keep_step` too) and any leftover partial directories. A
// checkpoint of that step that is already committed is kept as it is. On
// error nothing committed changes and the partial directory is removed.
absl::Status WriteCheckpointFiles(const std::string& job_dir,
                                  const CheckpointContents& contents,
                                  int keep_last, int64_t keep_step = -1);

// Committed checkpoints, oldest first; an unreadable or missing job_dir
// has none.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& job_dir);

// OK when the manifest parses and every file it lists (all of the above)
// has its size and SHA-256; else DATA_LOSS saying which file and why.
absl::Status VerifyCheckpoint(const std::string& dir);

// checkpoint.json of `dir` (not verified against the manifest).
absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& dir);

// The bytes of file `name` of the checkpoint in `dir`.
absl::StatusOr<std::string> ReadCheckpointFile(const std::string& dir,
                                               const std::string& name);

// Total bytes of the files in `dir`.
int64_t CheckpointSizeBytes(const std::string& dir);

// The newest checkpoint that verifies. Each newer step directory that does
// not (a damaged file, no manifest) is
// skipped and described in `rejected` ("step-00000120: adapter_model.
// safetensors has SHA-256 ..., the manifest says ...").
// Checkpoints after `max_step` are considered only when none up to it
// verifies.
std::optional<CheckpointEntry> LatestValidCheckpoint(
    const std::string& job_dir, std::vector<std::string>* rejected,
    int64_t max_step = INT64_MAX);

// The slot recorded by the newest checkpoint up to `max_step` whose
// checkpoint.json reads (not verified), or -1.
int CheckpointSlotHint(const std::string& job_dir, int64_t max_step);

// Deletes the job's checkpoint directories of steps after `step`: those of
// a run that was abandoned (by a crash) at an earlier checkpoint.
void RemoveCheckpointsAfter(const std::string& job_dir, int64_t step);

// A finished job's retention: keeps its newest `keep` checkpoints (0: none,
// and job_dir goes) and removes partial directories. Returns how many
// checkpoints it removed.
int KeepNewestCheckpoints(const std::string& job_dir, int keep);

// The pool's last complete checkpoint: job id -> step of every job that
// was checkpointed at that step boundary and still trains.
// <root>/pool.json, replaced atomically. A missing file is an empty pool.
absl::StatusOr<std::map<std::string, int64_t>> ReadPoolCheckpoint(
    const std::string& root);
absl::Status WritePoolCheckpoint(const std::string& root,
                                 const std::map<std::string, int64_t>& jobs);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_CHECKPOINTS_CHECKPOINT_FILES_H_
