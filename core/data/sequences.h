// Training sequences of at most seq_len tokens, cut from a Dataset.
//
//   SequenceOptions options;
//   options.seq_len = 1024;
//   LORAPLEX_ASSIGN_OR_RETURN(SequenceSet set,
//                             BuildSequences(dataset, options));
//
// Without packing every example is its own sequence, truncated to seq_len
// (its tail is lost, and counted). With packing, examples (truncated the
// same way) are placed in order into sequences of up to seq_len tokens, a
// new sequence starting where the next example would not fit, so little
// compute is spent on padding. A packed sequence records its examples'
// lengths: each example attends only to itself and its positions restart
// at 0 (LlamaModel's ForwardOptions::segment_ids), so its loss and
// gradients are those of the example trained alone, as with padding-free
// packing in TRL or torchtune.
#ifndef LORAPLEX_CORE_DATA_SEQUENCES_H_
#define LORAPLEX_CORE_DATA_SEQUENCES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"

namespace loraplex {

// Same layout as Example; the first token of each example is never a
// target (loss_mask 0).
struct Sequence {
  std::vector<int64_t> input_ids;
  std::vector<uint8_t> loss_mask;
  // Lengths of the examples packed into it, in order, summing to its
  // length; empty for one example.
  std::vector<int64_t> segments = {};
};

struct SequenceOptions {
  int64_t seq_len = 512;  // Tokens per sequence; at least 2.
  bool pack = false;      // Place several examples in a sequence.
};

struct SequenceSet {
  std::vector<Sequence> sequences;
  // Examples longer than seq_len, cut.
  int64_t truncated_examples = 0;
  // Examples left with no target token after truncation, not used.
  int64_t dropped_examples = 0;
  int64_t num_target_tokens = 0;  // Sum of every sequence's loss_mask.
};

// Each example truncated to seq_len; examples without any target dropped
// (counted); with pack, the rest placed in order into sequences of up to
// seq_len tokens.
// INVALID_ARGUMENT if seq_len < 2, if an example's loss_mask and input_ids
// differ in length, or if no sequence is left.
absl::StatusOr<SequenceSet> BuildSequences(const Dataset& dataset,
                                           const SequenceOptions& options);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DATA_SEQUENCES_H_
