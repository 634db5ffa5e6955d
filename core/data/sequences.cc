#include "core/data/sequences.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

// The first `length` tokens of `example`; its first token is context only
// because nothing precedes it.
Sequence Truncated(const Example& example, size_t length) {
  Sequence sequence;
  sequence.input_ids.assign(example.input_ids.begin(),
                            example.input_ids.begin() + length);
  sequence.loss_mask.assign(example.loss_mask.begin(),
                            example.loss_mask.begin() + length);
  if (!sequence.loss_mask.empty()) sequence.loss_mask[0] = 0;
  return sequence;
}

int64_t CountTargets(const Sequence& sequence) {
  int64_t count = 0;
  for (uint8_t target : sequence.loss_mask) count += target != 0 ? 1 : 0;
  return count;
}

// Each example truncated to seq_len, those with a target kept, in order.
std::vector<Sequence> Examples(const Dataset& dataset, size_t seq_len,
                               SequenceSet* set) {
  std::vector<Sequence> kept;
  for (const Example& example : dataset.examples) {
    size_t length = example.input_ids.size();
    if (length > seq_len) {
      ++set->truncated_examples;
      length = seq_len;
    }
    Sequence sequence = Truncated(example, length);
    const int64_t targets = CountTargets(sequence);
    if (targets == 0) {
      ++set->dropped_examples;
      continue;
    }
    set->num_target_tokens += targets;
    kept.push_back(std::move(sequence));
  }
  return kept;
}

// The examples in order, as many in a sequence as fit in seq_len tokens;
// a sequence of several records their lengths.
std::vector<Sequence> Packed(std::vector<Sequence> examples, size_t seq_len) {
  std::vector<Sequence> packed;
  for (Sequence& example : examples) {
    if (packed.empty() ||
        packed.back().input_ids.size() + example.input_ids.size() > seq_len) {
      packed.push_back(std::move(example));
      continue;
    }
    Sequence& last = packed.back();
    if (last.segments.empty()) {
      last.segments.push_back(static_cast<int64_t>(last.input_ids.size()));
    }
    last.segments.push_back(static_cast<int64_t>(example.input_ids.size()));
    last.input_ids.insert(last.input_ids.end(), example.input_ids.begin(),
                          example.input_ids.end());
    last.loss_mask.insert(last.loss_mask.end(), example.loss_mask.begin(),
                          example.loss_mask.end());
  }
  return packed;
}

}  // namespace

absl::StatusOr<SequenceSet> BuildSequences(const Dataset& dataset,
                                           const SequenceOptions& options) {
  if (options.seq_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be at least 2, got ", options.seq_len));
  }
  for (size_t i = 0; i < dataset.examples.size(); ++i) {
    const Example& example = dataset.examples[i];
    if (example.input_ids.size() != example.loss_mask.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "examples[", i, "] has ", example.input_ids.size(), " input_ids but ",
          example.loss_mask.size(), " loss_mask values"));
    }
  }
  const size_t seq_len = static_cast<size_t>(options.seq_len);
  SequenceSet set;
  set.sequences = Examples(dataset, seq_len, &set);
  if (options.pack) set.sequences = Packed(std::move(set.sequences), seq_len);
  if (set.sequences.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no training targets left after truncating to seq_len ",
                     options.seq_len));
  }
  return set;
}

}  // namespace loraplex
