// Which sequences each training step uses, reproducibly and resumably.
//
// Every epoch visits the sequences in its own seeded permutation; batches are
// taken in order from it, and a batch that runs past the end of an epoch
// continues with the next epoch's permutation. The whole position is a small
// DataCursorState, saved with a checkpoint and restored to continue exactly
// the same batch sequence.
//
//   LORAPLEX_ASSIGN_OR_RETURN(DataCursor cursor,
//                             DataCursor::Create(set.sequences.size(), {}));
//   std::vector<int64_t> batch = cursor.NextBatch(8);
//   nlohmann::json saved = DataCursorStateToJson(cursor.state());
//
// The permutation is the same on every compiler and standard library: it is
// a Fisher-Yates shuffle driven by std::mt19937_64 (whose output the C++
// standard fixes) with a bounded draw defined here, never std::shuffle or
// std::uniform_int_distribution, whose algorithms are left to the library.
#ifndef LORAPLEX_CORE_DATA_DATA_CURSOR_H_
#define LORAPLEX_CORE_DATA_DATA_CURSOR_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex {

struct DataCursorState {
  uint64_t seed = 0;
  int64_t epoch = 0;     // Epochs completed.
  int64_t position = 0;  // Next index into this epoch's permutation.
};

class DataCursor {
 public:
  // INVALID_ARGUMENT unless num_sequences >= 1, epoch >= 0 and
  // 0 <= position < num_sequences.
  static absl::StatusOr<DataCursor> Create(int64_t num_sequences,
                                           const DataCursorState& state);

  // The next `batch_size` sequence indices, advancing the cursor. A
  // batch_size below 1 is treated as 1. A batch larger than what is left of
  // the epoch continues into the next one, so it can hold an index twice
  // when batch_size > num_sequences.
  std::vector<int64_t> NextBatch(int64_t batch_size);

  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  int64_t num_sequences() const { return num_sequences_; }
  DataCursorState state() const;

  // Indices of epoch `epoch`'s order: a permutation of [0, num_sequences)
  // that depends only on the seed and `epoch`.
  std::vector<int64_t> EpochOrder(int64_t epoch) const;

 private:
  DataCursor(int64_t num_sequences, const DataCursorState& state);

  int64_t num_sequences_;
  uint64_t seed_;
  int64_t epoch_;
  int64_t position_;
  std::vector<int64_t> order_;  // EpochOrder(epoch_), kept to avoid redoing.
};

// {"seed": <unsigned>, "epoch": <int>, "position": <int>}.
nlohmann::json DataCursorStateToJson(const DataCursorState& state);
// Requires all three fields and no others; errors name the field
// ("cursor.epoch must be a non-negative integer, got -1").
absl::StatusOr<DataCursorState> DataCursorStateFromJson(
    const nlohmann::json& json);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DATA_DATA_CURSOR_H_
