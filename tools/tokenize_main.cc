// loraplex-tokenize: shows what the server trains on. Tokenizes text with a
// model directory's tokenizer (tokenizer.json, tokenizer.model or the
// built-in byte tokenizer, picked as the server picks it), turns dataset
// lines into the ids and loss mask training sees, and decodes ids.
//
//   loraplex-tokenize --model DIR --text "Hello"        {"ids":[...]}
//   loraplex-tokenize --model DIR --input data.jsonl    one line per line
//   loraplex-tokenize --model DIR --decode 9906,1917    the text
#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/chat/chat_template.h"
#include "core/common/status_macros.h"
#include "core/data/dataset.h"
#include "core/tokenizer/load_tokenizer.h"

namespace {

using loraplex::Tokenizer;

absl::Status PrintText(const Tokenizer& tokenizer, const std::string& text) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tokenizer.Encode(text));
  std::cout << nlohmann::json({{"ids", ids}}).dump() << "\n";
  return absl::OkStatus();
}

// Every line as training sees it: {"ids": [...], "mask": [...]} per
// example (with "line" where a chat line became one per assistant turn), or
// the line's error.
absl::Status PrintDataset(const Tokenizer& tokenizer,
                          const loraplex::DatasetParseOptions& options,
                          const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  std::string line;
  int64_t number = 0;
  int64_t bad = 0;
  while (std::getline(in, line)) {
    ++number;
    absl::string_view text = line;
    if (number == 1) absl::ConsumePrefix(&text, "\xEF\xBB\xBF");  // BOM
    if (text.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    absl::StatusOr<std::vector<loraplex::Example>> parsed =
        loraplex::ParseJsonlLine(text, tokenizer, options);
    if (!parsed.ok()) {
      ++bad;
      std::cout << nlohmann::json(
                       {{"line", number}, {"error", parsed.status().message()}})
                       .dump()
                << "\n";
      continue;
    }
    // A line that became one example per assistant turn shows each, with
    // its line number.
    for (const loraplex::Example& example : *parsed) {
      std::vector<int> mask(example.loss_mask.begin(), example.loss_mask.end());
      nlohmann::json row = {{"ids", example.input_ids}, {"mask", mask}};
      if (parsed->size() > 1) row["line"] = number;
      std::cout << row.dump() << "\n";
    }
  }
  if (bad > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", bad, " of ", number, " lines are bad"));
  }
  return absl::OkStatus();
}

absl::Status PrintDecoded(const Tokenizer& tokenizer, const std::string& list) {
  std::vector<int64_t> ids;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(item, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--decode: \"", item, "\" is not an integer"));
    }
    ids.push_back(id);
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(ids));
  std::cout << text << "\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Tokenize text or dataset lines with a model's tokenizer, or decode "
      "ids."};
  std::string model_dir, text, input, decode;
  app.add_option("--model", model_dir, "Model directory")->required();
  auto* text_option = app.add_option("--text", text, "Text to tokenize");
  auto* input_option = app.add_option(
      "--input", input,
      "JSONL dataset: prints each line's ids and loss mask as training "
      "sees them");
  auto* decode_option =
      app.add_option("--decode", decode, "Comma-separated ids to decode");
  text_option->excludes(input_option)->excludes(decode_option);
  input_option->excludes(decode_option);
  CLI11_PARSE(app, argc, argv);
  if (text_option->count() + input_option->count() + decode_option->count() ==
      0) {
    std::cerr << "loraplex-tokenize: give --text, --input or --decode\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      loraplex::LoadTokenizer(model_dir);
  absl::Status status = tokenizer.status();
  // Chat lines as the server renders them: with the model's own template.
  absl::StatusOr<std::optional<loraplex::ChatTemplate>> chat =
      loraplex::LoadChatTemplate(model_dir);
  loraplex::DatasetParseOptions options;
  if (!chat.ok()) {
    options.chat_template_error = chat.status();
  } else if (chat->has_value()) {
    options.chat_template = &**chat;
  }
  if (status.ok()) {
    status = text_option->count() > 0 ? PrintText(**tokenizer, text)
             : input_option->count() > 0
                 ? PrintDataset(**tokenizer, options, input)
                 : PrintDecoded(**tokenizer, decode);
  }
  if (!status.ok()) {
    std::cerr << "loraplex-tokenize: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
