// loraplex-bench-tokenizer: encoding speed of a model directory's tokenizer
// on a JSONL corpus ({"text": ...} per line). Prints one line a run:
//   loraplex tokens_per_s=... bytes_per_s=... tokens=... seconds=...
// bench/tokenizer_vs_hf.sh runs it side by side with HF tokenizers.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tokenizer/load_tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Time a model's tokenizer on a JSONL corpus."};
  std::string model_dir, corpus_path;
  int passes = 5;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--corpus", corpus_path, "JSONL with \"text\" lines")
      ->required();
  app.add_option("--passes", passes, "Passes over the corpus per run")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto tokenizer = loraplex::LoadTokenizer(model_dir);
  if (!tokenizer.ok()) {
    std::cerr << "loraplex-bench-tokenizer: " << tokenizer.status() << "\n";
    return 1;
  }
  std::vector<std::string> texts;
  size_t bytes = 0;
  std::ifstream in(corpus_path);
  std::string line;
  while (std::getline(in, line)) {
    texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    bytes += texts.back().size();
  }
  if (texts.empty()) {
    std::cerr << "loraplex-bench-tokenizer: " << corpus_path << " is empty\n";
    return 1;
  }
  size_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < passes; ++pass) {
    for (const std::string& text : texts) {
      auto ids = (*tokenizer)->Encode(text);
      if (!ids.ok()) {
        std::cerr << "loraplex-bench-tokenizer: " << ids.status() << "\n";
        return 1;
      }
      tokens += ids->size();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "loraplex tokens_per_s=%.0f bytes_per_s=%.0f tokens=%zu "
      "seconds=%.3f\n",
      tokens / seconds, bytes * passes / seconds, tokens, seconds);
  return 0;
}
