// The chat fixture's tokenizer (tests/fixtures/golden/chat_templates) laid
// into a model directory as a downloaded instruct model has it: its
// tokenizer.json, and tokenizer_config.json with one of the fixture
// templates as chat_template.
#ifndef LORAPLEX_TESTS_SERVER_CHAT_MODEL_DIR_H_
#define LORAPLEX_TESTS_SERVER_CHAT_MODEL_DIR_H_

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/golden_files.h"

namespace loraplex {

// tests/fixtures/golden/chat_templates/`relative`.
inline std::string ChatFixture(const std::string& relative) {
  return GoldenPath("chat_templates/" + relative);
}

// Writes the fixture tokenizer (1015 tokens: the model needs at least as
// many embedding rows) and templates/`template_name`.jinja into `dir`.
inline void WriteChatTokenizer(const std::string& dir,
                               const std::string& template_name) {
  std::filesystem::copy_file(ChatFixture("tokenizer/tokenizer.json"),
                             dir + "/tokenizer.json");
  std::ifstream in(ChatFixture("tokenizer/tokenizer_config.json"));
  nlohmann::json tokenizer_config = nlohmann::json::parse(in);
  std::ifstream source(ChatFixture("templates/" + template_name + ".jinja"));
  tokenizer_config["chat_template"] =
      std::string(std::istreambuf_iterator<char>(source), {});
  std::ofstream(dir + "/tokenizer_config.json") << tokenizer_config.dump(2);
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_CHAT_MODEL_DIR_H_
