// The seeded batch order: permutations per epoch, batches across epoch
// boundaries, and restoring from a saved state.
#include "core/data/data_cursor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

DataCursor MakeCursor(int64_t num_sequences, uint64_t seed, int64_t epoch = 0,
                      int64_t position = 0) {
  DataCursorState state;
  state.seed = seed;
  state.epoch = epoch;
  state.position = position;
  absl::StatusOr<DataCursor> cursor = DataCursor::Create(num_sequences, state);
  EXPECT_TRUE(cursor.ok()) << cursor.status();
  return *std::move(cursor);
}

std::vector<int64_t> Concat(const std::vector<int64_t>& a,
                            const std::vector<int64_t>& b) {
  std::vector<int64_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(DataCursorTest, EveryEpochIsAPermutation) {
  for (int64_t n : {1, 2, 7, 100, 1000}) {
    DataCursor cursor = MakeCursor(n, 5);
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      std::vector<int64_t> order = cursor.EpochOrder(epoch);
      std::sort(order.begin(), order.end());
      EXPECT_EQ(order, identity) << "n=" << n << " epoch=" << epoch;
    }
  }
}

// Pinned by an independent implementation of the same algorithm (SplitMix64
// seeding, std::mt19937_64, rejection-sampled bounded draws, Fisher-Yates),
// so a checkpoint resumes with the same order on any toolchain.
TEST(DataCursorTest, OrderIsFixedAcrossToolchains) {
  EXPECT_THAT(MakeCursor(10, 42).EpochOrder(0),
              ElementsAre(2, 0, 4, 7, 8, 3, 5, 1, 9, 6));
  EXPECT_THAT(MakeCursor(10, 42).EpochOrder(1),
              ElementsAre(2, 8, 7, 3, 6, 4, 0, 9, 5, 1));
  EXPECT_THAT(MakeCursor(10, 0).EpochOrder(0),
              ElementsAre(6, 1, 2, 4, 7, 5, 3, 0, 9, 8));
  EXPECT_THAT(
      MakeCursor(12, std::numeric_limits<uint64_t>::max()).EpochOrder(3),
      ElementsAre(1, 11, 5, 0, 7, 8, 6, 3, 2, 10, 9, 4));
}

TEST(DataCursorTest, EpochsAndSeedsGiveDifferentOrders) {
  DataCursor cursor = MakeCursor(50, 7);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    orders.push_back(cursor.EpochOrder(epoch));
  }
  for (size_t a = 0; a < orders.size(); ++a) {
    for (size_t b = a + 1; b < orders.size(); ++b) {
      EXPECT_NE(orders[a], orders[b]) << "epochs " << a << " and " << b;
    }
  }
  EXPECT_NE(MakeCursor(50, 8).EpochOrder(0), orders[0]);
  EXPECT_EQ(MakeCursor(50, 7).EpochOrder(0), orders[0]);
  EXPECT_EQ(MakeCursor(50, 7).EpochOrder(5), orders[5]);
}

TEST(DataCursorTest, BatchesWalkTheEpochOrderAndCrossIntoTheNext) {
  DataCursor cursor = MakeCursor(5, 3);
  const std::vector<int64_t> first = cursor.EpochOrder(0);
  const std::vector<int64_t> second = cursor.EpochOrder(1);
  EXPECT_THAT(cursor.NextBatch(3), ElementsAre(first[0], first[1], first[2]));
  EXPECT_EQ(cursor.epoch(), 0);
  EXPECT_EQ(cursor.position(), 3);
  EXPECT_THAT(cursor.NextBatch(3), ElementsAre(first[3], first[4], second[0]));
  EXPECT_EQ(cursor.epoch(), 1);
  EXPECT_EQ(cursor.position(), 1);
  EXPECT_THAT(cursor.NextBatch(4),
              ElementsAre(second[1], second[2], second[3], second[4]));
  // Ending exactly at the epoch's end moves on to the next epoch.
  EXPECT_EQ(cursor.epoch(), 2);
  EXPECT_EQ(cursor.position(), 0);
  EXPECT_EQ(cursor.num_sequences(), 5);
}

TEST(DataCursorTest, BatchLargerThanTheDatasetSpansEpochs) {
  DataCursor cursor = MakeCursor(2, 11);
  std::vector<int64_t> expected =
      Concat(Concat(cursor.EpochOrder(0), cursor.EpochOrder(1)),
             {cursor.EpochOrder(2)[0]});
  EXPECT_THAT(cursor.NextBatch(5), ElementsAreArray(expected));
  EXPECT_EQ(cursor.epoch(), 2);
  EXPECT_EQ(cursor.position(), 1);
}

TEST(DataCursorTest, BatchSizeBelowOneTakesOneSequence) {
  DataCursor cursor = MakeCursor(4, 2);
  EXPECT_THAT(cursor.NextBatch(0), ElementsAre(cursor.EpochOrder(0)[0]));
  EXPECT_THAT(cursor.NextBatch(-3), ElementsAre(cursor.EpochOrder(0)[1]));
  EXPECT_EQ(cursor.position(), 2);
}

TEST(DataCursorTest, StartsFromTheGivenEpochAndPosition) {
  DataCursor cursor = MakeCursor(6, 9, /*epoch=*/3, /*position=*/4);
  const std::vector<int64_t> order = cursor.EpochOrder(3);
  EXPECT_THAT(cursor.NextBatch(3),
              ElementsAre(order[4], order[5], cursor.EpochOrder(4)[0]));
}

TEST(DataCursorTest, RestoringFromStateContinuesIdentically) {
  DataCursor original = MakeCursor(13, 77);
  for (int step = 0; step < 7; ++step) original.NextBatch(4);
  const DataCursorState saved = original.state();
  EXPECT_EQ(saved.seed, 77u);
  EXPECT_EQ(saved.epoch, 2);  // 28 sequences taken: 2 epochs and 2.
  EXPECT_EQ(saved.position, 2);

  absl::StatusOr<DataCursor> restored = DataCursor::Create(13, saved);
  ASSERT_TRUE(restored.ok()) << restored.status();
  absl::StatusOr<DataCursorState> reloaded =
      DataCursorStateFromJson(DataCursorStateToJson(saved));
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  absl::StatusOr<DataCursor> from_json = DataCursor::Create(13, *reloaded);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  for (int step = 0; step < 20; ++step) {
    const std::vector<int64_t> expected = original.NextBatch(5);
    EXPECT_EQ(restored->NextBatch(5), expected) << "step " << step;
    EXPECT_EQ(from_json->NextBatch(5), expected) << "step " << step;
  }
  EXPECT_EQ(restored->epoch(), original.epoch());
  EXPECT_EQ(restored->position(), original.position());
}

TEST(DataCursorTest, CreateRejectsBadStates) {
  DataCursorState state;
  absl::StatusOr<DataCursor> cursor = DataCursor::Create(0, state);
  EXPECT_EQ(cursor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cursor.status().message(),
            "the cursor needs at least 1 sequence, got 0");

  state.position = 4;
  cursor = DataCursor::Create(4, state);
  EXPECT_EQ(cursor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cursor.status().message(),
            "cursor.position must be in [0, 4) for 4 sequences, got 4");
  state.position = -1;
  EXPECT_FALSE(DataCursor::Create(4, state).ok());

  state.position = 0;
  state.epoch = -1;
  cursor = DataCursor::Create(4, state);
  EXPECT_EQ(cursor.status().message(), "cursor.epoch must be >= 0, got -1");
}

TEST(DataCursorStateJsonTest, RoundTrips) {
  DataCursorState state;
  state.seed = std::numeric_limits<uint64_t>::max();
  state.epoch = 12345678901LL;
  state.position = 17;
  const nlohmann::json json = DataCursorStateToJson(state);
  EXPECT_EQ(json, nlohmann::json::parse(
                      R"({"seed": 18446744073709551615, "epoch": 12345678901,)"
                      R"( "position": 17})"));
  // Through text too, as a checkpoint stores it.
  absl::StatusOr<DataCursorState> back =
      DataCursorStateFromJson(nlohmann::json::parse(json.dump()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seed, state.seed);
  EXPECT_EQ(back->epoch, state.epoch);
  EXPECT_EQ(back->position, state.position);
}

TEST(DataCursorStateJsonTest, RejectsBadFields) {
  auto error = [](const char* text) {
    return std::string(DataCursorStateFromJson(nlohmann::json::parse(text))
                           .status()
                           .message());
  };
  EXPECT_EQ(error("[1, 2, 3]"),
            "cursor must be a JSON object, got a JSON array");
  EXPECT_EQ(error(R"({"seed": 1, "epoch": 0})"), "cursor.position is missing");
  EXPECT_EQ(error(R"({"seed": 1, "epoch": 0, "position": 0, "step": 3})"),
            "cursor.step is not a known field (known: epoch, position, seed)");
  EXPECT_EQ(error(R"({"seed": -1, "epoch": 0, "position": 0})"),
            "cursor.seed must be an integer in [0, 2^64), got -1");
  EXPECT_EQ(error(R"({"seed": "42", "epoch": 0, "position": 0})"),
            "cursor.seed must be an integer in [0, 2^64), got \"42\"");
  EXPECT_EQ(error(R"({"seed": 1, "epoch": -2, "position": 0})"),
            "cursor.epoch must be a non-negative integer, got -2");
  EXPECT_EQ(error(R"({"seed": 1, "epoch": 1.5, "position": 0})"),
            "cursor.epoch must be a non-negative integer, got 1.5");
  EXPECT_EQ(error(R"({"seed": 1, "epoch": 0, "position": null})"),
            "cursor.position must be a non-negative integer, got null");
  EXPECT_EQ(
      error(R"({"seed": 1, "epoch": 9223372036854775808, "position": 0})"),
      "cursor.epoch must be a non-negative integer, got 9223372036854775808");
  EXPECT_EQ(
      DataCursorStateFromJson(nlohmann::json::parse("{}")).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loraplex
