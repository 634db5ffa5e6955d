#include "core/data/sequences.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

// Tokens [begin, end) of `ids`/`mask`; the first token becomes context only
// because nothing in the sequence precedes it.
Sequence Slice(const std::vector<int64_t>& ids,
               const std::vector<uint8_t>& mask, size_t begin, size_t end) {
  Sequence sequence;
  sequence.input_ids.assign(ids.begin() + begin, ids.begin() + end);
  sequence.loss_mask.assign(mask.begin() + begin, mask.begin() + end);
  if (!sequence.loss_mask.empty()) sequence.loss_mask[0] = 0;
  return sequence;
}

int64_t CountTargets(const Sequence& sequence) {
  int64_t count = 0;
  for (uint8_t target : sequence.loss_mask) count += target != 0 ? 1 : 0;
  return count;
}

// Keeps `sequence` when it has a target; returns whether it did.
bool Keep(Sequence sequence, SequenceSet* set) {
  const int64_t targets = CountTargets(sequence);
  if (targets == 0) return false;
  set->num_target_tokens += targets;
  set->sequences.push_back(std::move(sequence));
  return true;
}

void BuildUnpacked(const Dataset& dataset, size_t seq_len, SequenceSet* set) {
  for (const Example& example : dataset.examples) {
    size_t length = example.input_ids.size();
    if (length > seq_len) {
      ++set->truncated_examples;
      length = seq_len;
    }
    if (!Keep(Slice(example.input_ids, example.loss_mask, 0, length), set)) {
      ++set->dropped_examples;
    }
  }
}

void BuildPacked(const Dataset& dataset, size_t seq_len, SequenceSet* set) {
  std::vector<int64_t> ids;
  std::vector<uint8_t> mask;
  ids.reserve(static_cast<size_t>(std::max<int64_t>(0, dataset.num_tokens)));
  mask.reserve(ids.capacity());
  for (const Example& example : dataset.examples) {
    ids.insert(ids.end(), example.input_ids.begin(), example.input_ids.end());
    mask.insert(mask.end(), example.loss_mask.begin(), example.loss_mask.end());
  }
  // A piece starts at the previous piece's last token, so a piece must add
  // at least one token beyond it.
  for (size_t begin = 0; begin + 1 < ids.size();) {
    const size_t end = std::min(ids.size(), begin + seq_len);
    Keep(Slice(ids, mask, begin, end), set);
    begin = end - 1;
  }
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
  if (options.pack) {
    BuildPacked(dataset, seq_len, &set);
  } else {
    BuildUnpacked(dataset, seq_len, &set);
  }
  if (set.sequences.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no training targets left after ",
                     options.pack ? "packing into" : "truncating to",
                     " seq_len ", options.seq_len));
  }
  return set;
}

}  // namespace loraplex
