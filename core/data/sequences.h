// Training sequences of at most seq_len tokens, cut from a Dataset.
//
//   SequenceOptions options;
//   options.seq_len = 1024;
//   LORAPLEX_ASSIGN_OR_RETURN(SequenceSet set,
//                             BuildSequences(dataset, options));
//
// Without packing every example is its own sequence, truncated to seq_len
// (its tail is lost). With packing, examples are concatenated in order and
// the stream is cut into pieces of seq_len tokens, so no compute is spent on
// padding; attention then crosses example boundaries (a token can attend to
// the end of the previous example, separated by its EOS/BOS), which is the
// usual trade-off of packed training.
//
// Packed pieces overlap by one token: each piece after the first starts with
// the last token of the previous piece, as context only. Position 0 of a
// sequence can never be a target (nothing precedes it), so without the
// overlap the target at every cut would be lost; with it, every target of
// the stream is trained exactly once.
#ifndef LORAPLEX_CORE_DATA_SEQUENCES_H_
#define LORAPLEX_CORE_DATA_SEQUENCES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"

namespace loraplex {

// Same layout as Example; loss_mask[0] is always 0.
struct Sequence {
  std::vector<int64_t> input_ids;
  std::vector<uint8_t> loss_mask;
};

struct SequenceOptions {
  int64_t seq_len = 512;  // Tokens per sequence; at least 2.
  bool pack = false;      // Concatenate examples and cut (see above).
};

struct SequenceSet {
  std::vector<Sequence> sequences;
  // Examples longer than seq_len, cut (pack=false only).
  int64_t truncated_examples = 0;
  // Examples left with no target token after truncation, not used
  // (pack=false only).
  int64_t dropped_examples = 0;
  int64_t num_target_tokens = 0;  // Sum of every sequence's loss_mask.
};

// pack=false: each example truncated to seq_len; sequences without any
// target dropped (counted). pack=true: examples concatenated in order and cut
// into pieces of seq_len overlapping by one token (the last piece shorter);
// pieces without targets dropped.
// INVALID_ARGUMENT if seq_len < 2, if an example's loss_mask and input_ids
// differ in length, or if no sequence is left.
absl::StatusOr<SequenceSet> BuildSequences(const Dataset& dataset,
                                           const SequenceOptions& options);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DATA_SEQUENCES_H_
