#include "server/trainer/slot_owners.h"

namespace loraplex {

int SlotOwners::SlotOfJob(const std::string& job_id) const {
  for (int slot = 0; slot < capacity(); ++slot) {
    const SlotJob* owner = job(slot);
    if (owner != nullptr && owner->job_id == job_id) return slot;
  }
  return -1;
}

int SlotOwners::SlotOfSession(const std::string& session_id) const {
  for (int slot = 0; slot < capacity(); ++slot) {
    const SlotSession* owner = session(slot);
    if (owner != nullptr && owner->session_id == session_id) return slot;
  }
  return -1;
}

std::vector<int> SlotOwners::JobSlots() const {
  std::vector<int> slots;
  for (int slot = 0; slot < capacity(); ++slot) {
    if (job(slot) != nullptr) slots.push_back(slot);
  }
  return slots;
}

std::vector<int> SlotOwners::SessionSlots() const {
  std::vector<int> slots;
  for (int slot = 0; slot < capacity(); ++slot) {
    if (session(slot) != nullptr) slots.push_back(slot);
  }
  return slots;
}

}  // namespace loraplex
