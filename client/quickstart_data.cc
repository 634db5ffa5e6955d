#include "client/quickstart_data.h"

#include <algorithm>
#include <cstdint>

#include "core/common/split_mix.h"
#include "nlohmann/json.hpp"

namespace loraplex {
namespace {

// Fixed so the dataset never changes between releases.
constexpr uint64_t kQuickstartSeed = 0x6c6f7261706c6578ULL;  // "loraplex".
constexpr int kMinWordLength = 3;
constexpr int kMaxWordLength = 8;

// A pronounceable lowercase word (consonant-vowel pairs) for example
// `index`, derived from its own hash so each example stands alone.
std::string WordForExample(int index) {
  static constexpr char kConsonants[] = "bcdfghjklmnprstvwz";
  static constexpr char kVowels[] = "aeiou";
  uint64_t state = SplitMix64(kQuickstartSeed + static_cast<uint64_t>(index));
  auto next = [&state](uint64_t bound) {
    state = SplitMix64(state);
    return static_cast<size_t>(state % bound);
  };
  const int length =
      kMinWordLength +
      static_cast<int>(next(kMaxWordLength - kMinWordLength + 1));
  std::string word;
  for (int i = 0; i < length; ++i) {
    word += (i % 2 == 0) ? kConsonants[next(sizeof(kConsonants) - 1)]
                         : kVowels[next(sizeof(kVowels) - 1)];
  }
  return word;
}

}  // namespace

std::vector<QuickstartExample> QuickstartExamples(int count) {
  std::vector<QuickstartExample> examples;
  for (int i = 0; i < std::max(count, 0); ++i) {
    const std::string word = WordForExample(i);
    examples.push_back(
        {"reverse: " + word + "\n", std::string(word.rbegin(), word.rend())});
  }
  return examples;
}

std::string QuickstartDatasetJsonl(int count) {
  std::string jsonl;
  for (const QuickstartExample& example : QuickstartExamples(count)) {
    nlohmann::json line = {{"prompt", example.prompt},
                           {"completion", example.completion}};
    jsonl += line.dump();
    jsonl += '\n';
  }
  return jsonl;
}

}  // namespace loraplex
