// P8: decode throughput of co-batched multi-LoRA sampling. The requests of
// 1, 4 and 16 adapters (2 requests each: a 16-token prompt, 32 greedy
// tokens) decode together in one batch, against the same requests decoded
// one adapter at a time; printed as tokens/s and the ratio, measured side
// by side in alternating rounds (goal on CPU: >= 1.5x). Re-executes itself
// with OMP_WAIT_POLICY=passive unless the variable is set, as the server.
//
//   build/bin/loraplex-bench-sample [--threads N] [--preset small] [--rounds 3]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/lora/lora_weights.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/runtime/device.h"
#include "core/sample/batch_generator.h"

namespace loraplex {
namespace {

constexpr int kRequestsPerAdapter = 2;
constexpr int64_t kPromptTokens = 16;
constexpr int64_t kNewTokens = 32;

std::vector<SampleRequest> RequestsFor(
    const std::vector<std::unique_ptr<LoraWeights>>& adapters, int first,
    int count, int64_t vocab) {
  std::vector<SampleRequest> requests;
  for (int a = first; a < first + count; ++a) {
    for (int r = 0; r < kRequestsPerAdapter; ++r) {
      SampleRequest request;
      request.adapter = adapters[a].get();
      torch::Tensor ids =
          torch::randint(3, vocab, {kPromptTokens},
                         torch::TensorOptions().dtype(torch::kInt64));
      request.prompt.assign(ids.data_ptr<int64_t>(),
                            ids.data_ptr<int64_t>() + kPromptTokens);
      request.params.temperature = 0;
      request.params.max_tokens = kNewTokens;
      requests.push_back(std::move(request));
    }
  }
  return requests;
}

void Generate(const LlamaModel& model, std::vector<SampleRequest> requests) {
  auto results = BatchGenerator::Generate(model, std::move(requests), nullptr);
  if (!results.ok()) {
    std::cerr << results.status() << "\n";
    std::exit(1);
  }
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  using namespace loraplex;
  // As the server runs (see ReexecWithPassiveOpenMpWait).
  ReexecWithPassiveOpenMpWait(argv);
  CLI::App app{"P8: co-batched multi-LoRA decode vs one adapter at a time."};
  int threads = 0;
  std::string preset = "small";
  int rounds = 3;
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  app.add_option("--preset", preset, "Base model preset")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Alternating rounds")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const int used = ConfigureThreads(threads).value_or(1);
  torch::manual_seed(0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "loraplex-bench-sample" / preset;
  if (auto status = WritePresetModel(preset, 0, dir.string()); !status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  auto model = LlamaModel::Load(dir.string(), {});
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  std::vector<std::unique_ptr<LoraWeights>> adapters;
  for (int a = 0; a < 16; ++a) {
    auto weights = std::make_unique<LoraWeights>(config, torch::kCPU);
    LoraConfig lora;
    lora.rank = 16;
    lora.alpha = 32;
    if (!weights->Bind(lora).ok()) return 1;
    weights->InitPeft(a);
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : weights->parameters()) p.normal_(0, 0.02);
    adapters.push_back(std::move(weights));
  }
  torch::NoGradGuard no_grad;
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "preset " << preset << ", threads " << used << ", "
            << kRequestsPerAdapter << " requests per adapter, " << kPromptTokens
            << "-token prompts, " << kNewTokens
            << " new tokens, rank 16, all seven projections\n";
  std::cout << "adapters  co-batched tok/s  one-at-a-time tok/s  ratio\n";
  for (int count : {1, 4, 16}) {
    const auto together = RequestsFor(adapters, 0, count, config.vocab_size);
    auto [batched, serial] = TimeSideBySide(
        [&] { Generate(**model, together); },
        [&] {
          for (int a = 0; a < count; ++a) {
            Generate(**model, RequestsFor(adapters, a, 1, config.vocab_size));
          }
        },
        rounds);
    const double tokens =
        static_cast<double>(count * kRequestsPerAdapter * kNewTokens);
    std::cout << std::setw(8) << count << "  " << std::setw(16)
              << tokens / batched << "  " << std::setw(19) << tokens / serial
              << "  " << std::setw(5) << serial / batched << "x\n";
  }
  return 0;
}
