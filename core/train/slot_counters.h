// A training slot's step counters (training_slot.h), apart from the slot
// so that code without LibTorch (checkpoint files, reports) can hold them.
#ifndef LORAPLEX_CORE_TRAIN_SLOT_COUNTERS_H_
#define LORAPLEX_CORE_TRAIN_SLOT_COUNTERS_H_

#include <cstdint>

namespace loraplex {

struct SlotCounters {
  int64_t steps = 0;          // Batches trained on, skipped ones included.
  int64_t skipped_steps = 0;  // Steps whose loss or grad norm was not finite.
  int64_t target_tokens = 0;  // Target tokens in the batches trained on.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_SLOT_COUNTERS_H_
