// Who holds each slot of the trainer's pool (trainer.h), beyond the slot
// itself: a job or a training session, never both. One handle per slot,
// so the trainer never asks two tables and never finds them disagreeing.
// Trainer thread only.
//
//   SlotOwners owners(capacity);
//   owners.Hold(slot, SlotJob{...});
//   if (SlotJob* job = owners.job(slot)) ...
//   owners.Release(slot);
#ifndef LORAPLEX_SERVER_TRAINER_SLOT_OWNERS_H_
#define LORAPLEX_SERVER_TRAINER_SLOT_OWNERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/data/sequences.h"
#include "server/checkpoints/checkpoint_files.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

// What the trainer remembers about the job in a slot.
struct SlotJob {
  std::string job_id;
  std::string tenant;
  std::string family;
  std::shared_ptr<const SequenceSet> validation;
  std::string final_adapter_dir;
  int64_t eval_interval = 0;
  int64_t checkpoint_interval = 0;
  nlohmann::json job_spec;
  std::optional<CheckpointMetrics> last_metrics;
  int64_t tokens = 0;
  double tokens_per_second = 0.0;
  std::optional<double> validation_loss;
  // Test only (--test-faults=hold:...): not stepped until a command
  // naming the job (pause, retire, export) is applied.
  bool held = false;
};

// What the trainer remembers about the training session in a slot
// (commands/open_session_job.h, session_slots.h).
struct SlotSession {
  std::string session_id;
  std::string tenant;
  std::string family;
  uint64_t seed = 0;
  int64_t calls = 0;   // Forward/backward calls so far (dropout seeds).
  int64_t seq_id = 0;  // The last of the client's operations applied.
  int64_t checkpointed_seq_id = -1;  // Of the newest checkpoint queued.
  // The seq_id of a checkpoint whose write failed (the writer's thread
  // sets it): taken again at the next chance.
  std::shared_ptr<std::atomic<int64_t>> failed_seq_id =
      std::make_shared<std::atomic<int64_t>>(-1);
  std::deque<SessionOp> ops;  // Waiting, in the session's order.
};

class SlotOwners {
 public:
  explicit SlotOwners(int capacity) : owners_(capacity) {}

  int capacity() const { return static_cast<int>(owners_.size()); }
  // The slot's owner of that kind; null when it has none of it.
  SlotJob* job(int slot) { return std::get_if<SlotJob>(&owners_[slot]); }
  const SlotJob* job(int slot) const {
    return std::get_if<SlotJob>(&owners_[slot]);
  }
  SlotSession* session(int slot) {
    return std::get_if<SlotSession>(&owners_[slot]);
  }
  const SlotSession* session(int slot) const {
    return std::get_if<SlotSession>(&owners_[slot]);
  }
  // The slot now held by `owner` (whoever held it before is forgotten).
  void Hold(int slot, SlotJob owner) { owners_[slot] = std::move(owner); }
  void Hold(int slot, SlotSession owner) { owners_[slot] = std::move(owner); }
  void Release(int slot) { owners_[slot] = std::monostate(); }
  // The slot the job or session holds, or -1.
  int SlotOfJob(const std::string& job_id) const;
  int SlotOfSession(const std::string& session_id) const;
  // The slots jobs hold, and those sessions hold, in slot order.
  std::vector<int> JobSlots() const;
  std::vector<int> SessionSlots() const;

 private:
  std::vector<std::variant<std::monostate, SlotJob, SlotSession>> owners_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SLOT_OWNERS_H_
