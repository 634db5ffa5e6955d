// config.json text for the model-config tests: parse a JSON object as one,
// or get the INVALID_ARGUMENT it is refused with.
//
//   auto config = ParseConfigJson({{"model_type", "llama"}, ...});
//   EXPECT_THAT(ConfigJsonError(raw), HasSubstr("vocab_size"));
#ifndef LORAPLEX_TESTS_COMMON_CONFIG_JSON_H_
#define LORAPLEX_TESTS_COMMON_CONFIG_JSON_H_

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/model/model_config.h"

namespace loraplex {

inline absl::StatusOr<ModelConfig> ParseConfigJson(
    const nlohmann::json& config) {
  return ParseModelConfig(config.dump(), "config.json");
}

// The message of the INVALID_ARGUMENT `config` must be refused with.
inline std::string ConfigJsonError(const nlohmann::json& config) {
  auto parsed = ParseConfigJson(config);
  EXPECT_FALSE(parsed.ok()) << config.dump();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_CONFIG_JSON_H_
