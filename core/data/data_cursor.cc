#include "core/data/data_cursor.h"

#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/split_mix.h"

namespace loraplex {
namespace {

// Uniform in [0, bound) for bound >= 1: draws below 2^64 mod bound are
// rejected so every residue is equally likely.
uint64_t UniformBelow(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t draw = generator();
    if (draw >= threshold) return draw % bound;
  }
}

absl::Status FieldError(absl::string_view field, absl::string_view expected,
                        const nlohmann::json& value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "cursor.", field, " must be ", expected, ", got ", DescribeJson(value)));
}

}  // namespace

DataCursor::DataCursor(int64_t num_sequences, const DataCursorState& state)
    : num_sequences_(num_sequences),
      seed_(state.seed),
      epoch_(state.epoch),
      position_(state.position),
      order_(EpochOrder(state.epoch)) {}

absl::StatusOr<DataCursor> DataCursor::Create(int64_t num_sequences,
                                              const DataCursorState& state) {
  if (num_sequences < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cursor needs at least 1 sequence, got ", num_sequences));
  }
  if (state.epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor.epoch must be >= 0, got ", state.epoch));
  }
  if (state.position < 0 || state.position >= num_sequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor.position must be in [0, ", num_sequences, ") for ",
                     num_sequences, " sequences, got ", state.position));
  }
  return DataCursor(num_sequences, state);
}

std::vector<int64_t> DataCursor::EpochOrder(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(num_sequences_));
  for (int64_t i = 0; i < num_sequences_; ++i) order[i] = i;
  std::mt19937_64 generator(
      SplitMix64(SplitMix64(seed_) ^ static_cast<uint64_t>(epoch)));
  for (int64_t i = num_sequences_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(
        UniformBelow(generator, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<int64_t> DataCursor::NextBatch(int64_t batch_size) {
  if (batch_size < 1) batch_size = 1;
  std::vector<int64_t> batch;
  batch.reserve(static_cast<size_t>(batch_size));
  for (int64_t k = 0; k < batch_size; ++k) {
    batch.push_back(order_[position_]);
    if (++position_ == num_sequences_) {
      ++epoch_;
      position_ = 0;
      order_ = EpochOrder(epoch_);
    }
  }
  return batch;
}

DataCursorState DataCursor::state() const {
  DataCursorState state;
  state.seed = seed_;
  state.epoch = epoch_;
  state.position = position_;
  return state;
}

nlohmann::json DataCursorStateToJson(const DataCursorState& state) {
  return nlohmann::json{{"seed", state.seed},
                        {"epoch", state.epoch},
                        {"position", state.position}};
}

absl::StatusOr<DataCursorState> DataCursorStateFromJson(
    const nlohmann::json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor must be a JSON object, got ", DescribeJson(json)));
  }
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() != "seed" && it.key() != "epoch" && it.key() != "position") {
      return absl::InvalidArgumentError(
          absl::StrCat("cursor.", it.key(),
                       " is not a known field (known: epoch, position, seed)"));
    }
  }
  for (const char* field : {"seed", "epoch", "position"}) {
    if (!json.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cursor.", field, " is missing"));
    }
  }
  DataCursorState state;
  const nlohmann::json& seed = json["seed"];
  if (!seed.is_number_integer() ||
      (!seed.is_number_unsigned() && seed.get<int64_t>() < 0)) {
    return FieldError("seed", "an integer in [0, 2^64)", seed);
  }
  state.seed = seed.get<uint64_t>();
  for (auto [field, out] :
       {std::pair<const char*, int64_t*>{"epoch", &state.epoch},
        std::pair<const char*, int64_t*>{"position", &state.position}}) {
    const nlohmann::json& value = json[field];
    const bool fits =
        value.is_number_integer() &&
        (value.is_number_unsigned()
             ? value.get<uint64_t>() <=
                   static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             : value.get<int64_t>() >= 0);
    if (!fits) return FieldError(field, "a non-negative integer", value);
    *out = value.get<int64_t>();
  }
  return state;
}

}  // namespace loraplex
