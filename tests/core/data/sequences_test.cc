// Cutting a dataset into training sequences: truncation, dropping and
// packing whole examples.
#include "core/data/sequences.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace loraplex {
namespace {

using ::testing::ElementsAre;

Dataset MakeDataset(const std::vector<Example>& examples) {
  Dataset dataset;
  dataset.examples = examples;
  for (const Example& example : examples) {
    dataset.num_tokens += static_cast<int64_t>(example.input_ids.size());
    for (uint8_t target : example.loss_mask)
      dataset.num_target_tokens += target;
  }
  return dataset;
}

SequenceOptions Options(int64_t seq_len, bool pack) {
  SequenceOptions options;
  options.seq_len = seq_len;
  options.pack = pack;
  return options;
}

TEST(SequencesTest, ShortExamplesAreKeptWhole) {
  Dataset dataset = MakeDataset({{{1, 2, 3}, {0, 1, 1}}, {{4, 5}, {0, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(3, false));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->sequences.size(), 2u);
  EXPECT_THAT(set->sequences[0].input_ids, ElementsAre(1, 2, 3));
  EXPECT_THAT(set->sequences[0].loss_mask, ElementsAre(0, 1, 1));
  EXPECT_THAT(set->sequences[1].input_ids, ElementsAre(4, 5));
  EXPECT_THAT(set->sequences[1].loss_mask, ElementsAre(0, 1));
  EXPECT_EQ(set->truncated_examples, 0);
  EXPECT_EQ(set->dropped_examples, 0);
  EXPECT_EQ(set->num_target_tokens, 3);
}

TEST(SequencesTest, LongExamplesAreTruncatedAndTargetlessOnesDropped) {
  Dataset dataset = MakeDataset({
      {{1, 2, 3, 4, 5, 6}, {0, 1, 0, 1, 1, 1}},  // Cut, keeps 1 target.
      {{7, 8, 9, 10, 11}, {0, 0, 0, 0, 1}},      // Cut, no target left.
      {{12, 13}, {0, 1}},                        // Whole.
  });
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(3, false));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->sequences.size(), 2u);
  EXPECT_THAT(set->sequences[0].input_ids, ElementsAre(1, 2, 3));
  EXPECT_THAT(set->sequences[0].loss_mask, ElementsAre(0, 1, 0));
  EXPECT_THAT(set->sequences[1].input_ids, ElementsAre(12, 13));
  EXPECT_EQ(set->truncated_examples, 2);
  EXPECT_EQ(set->dropped_examples, 1);
  EXPECT_EQ(set->num_target_tokens, 2);
}

TEST(SequencesTest, NothingLeftToTrainIsAnError) {
  Dataset dataset = MakeDataset({{{1, 2, 3, 4}, {0, 0, 0, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(3, false));
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set.status().message(),
            "no training targets left after truncating to seq_len 3");

  set = BuildSequences(Dataset(), Options(8, true));
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set.status().message(),
            "no training targets left after truncating to seq_len 8");
}

TEST(SequencesTest, RejectsBadOptionsAndInconsistentExamples) {
  Dataset dataset = MakeDataset({{{1, 2}, {0, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(1, false));
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set.status().message(), "seq_len must be at least 2, got 1");
  set = BuildSequences(dataset, Options(0, true));
  EXPECT_EQ(set.status().message(), "seq_len must be at least 2, got 0");

  dataset.examples.push_back({{1, 2, 3}, {0, 1}});
  set = BuildSequences(dataset, Options(4, false));
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set.status().message(),
            "examples[1] has 3 input_ids but 2 loss_mask values");
}

TEST(SequencesTest, PackingPlacesWholeExamplesInOrderAndRecordsTheirLengths) {
  Dataset dataset = MakeDataset({{{1, 2, 3}, {0, 1, 1}},
                                 {{4, 5, 6, 7}, {0, 1, 1, 1}},
                                 {{8, 9}, {0, 1}},
                                 {{10, 11, 12, 13, 14}, {0, 1, 1, 1, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(7, true));
  ASSERT_TRUE(set.ok()) << set.status();
  // 3 + 4 fill the first sequence; 2 + 5 the second; no example is cut.
  ASSERT_EQ(set->sequences.size(), 2u);
  EXPECT_THAT(set->sequences[0].input_ids, ElementsAre(1, 2, 3, 4, 5, 6, 7));
  // Each example's first token is context only: it starts its own
  // positions and sees nothing before it.
  EXPECT_THAT(set->sequences[0].loss_mask, ElementsAre(0, 1, 1, 0, 1, 1, 1));
  EXPECT_THAT(set->sequences[0].segments, ElementsAre(3, 4));
  EXPECT_THAT(set->sequences[1].input_ids,
              ElementsAre(8, 9, 10, 11, 12, 13, 14));
  EXPECT_THAT(set->sequences[1].segments, ElementsAre(2, 5));
  // Every target of every example is trained exactly once.
  EXPECT_EQ(set->num_target_tokens, dataset.num_target_tokens);
  EXPECT_EQ(set->truncated_examples, 0);
  EXPECT_EQ(set->dropped_examples, 0);
}

TEST(SequencesTest, PackingTruncatesAndDropsExamplesAsWithoutPacking) {
  Dataset dataset = MakeDataset({{{1, 2, 3, 4, 5}, {0, 1, 1, 1, 1}},
                                 {{6, 7, 8, 9}, {0, 0, 0, 1}},
                                 {{10, 11}, {0, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(3, true));
  ASSERT_TRUE(set.ok()) << set.status();
  // [1 2 3] cut from 5 tokens; [6 7 8] has no target left; [10 11] alone
  // (3 + 2 > 3).
  ASSERT_EQ(set->sequences.size(), 2u);
  EXPECT_THAT(set->sequences[0].input_ids, ElementsAre(1, 2, 3));
  EXPECT_TRUE(set->sequences[0].segments.empty());
  EXPECT_THAT(set->sequences[1].input_ids, ElementsAre(10, 11));
  EXPECT_EQ(set->truncated_examples, 2);
  EXPECT_EQ(set->dropped_examples, 1);
  EXPECT_EQ(set->num_target_tokens, 3);
}

TEST(SequencesTest, PackingClearsATargetAtTheStartOfEachExample) {
  // A first token is a target only in a malformed dataset, but no example
  // can train its first position.
  Dataset dataset = MakeDataset({{{1, 2, 3}, {1, 1, 1}}, {{4, 5}, {1, 1}}});
  absl::StatusOr<SequenceSet> set = BuildSequences(dataset, Options(8, true));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->sequences.size(), 1u);
  EXPECT_THAT(set->sequences[0].loss_mask, ElementsAre(0, 1, 1, 0, 1));
  EXPECT_THAT(set->sequences[0].segments, ElementsAre(3, 2));
  EXPECT_EQ(set->num_target_tokens, 3);
}

}  // namespace
}  // namespace loraplex
