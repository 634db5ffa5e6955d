// Base-model speed on this machine, measured side by side in one run:
// the BLAS actually loaded, peak fp32 GEMM throughput, the built-in tiny
// model's load + first forward time, and the `small` model's forward
// throughput as a fraction of that GEMM peak.
//
//   build/bin/loraplex-bench-model [--threads N]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <string>

#include "bench/timing.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/runtime/blas_info.h"
#include "core/runtime/device.h"

int main(int argc, char** argv) {
  CLI::App app{"Measure base-model speed on this machine."};
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  CLI11_PARSE(app, argc, argv);
  const int used = loraplex::ConfigureThreads(threads).value_or(1);

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "loraplex-bench-model";
  for (const char* preset : {"tiny", "small"}) {
    auto status =
        loraplex::WritePresetModel(preset, 0, (dir / preset).string());
    if (!status.ok()) {
      std::cerr << status << "\n";
      return 1;
    }
  }

  torch::NoGradGuard no_grad;
  const double peak = loraplex::GemmGflops(1024, 5);

  auto start = loraplex::BenchClock::now();
  auto tiny = loraplex::LlamaModel::Load((dir / "tiny").string(), {});
  if (!tiny.ok()) {
    std::cerr << tiny.status() << "\n";
    return 1;
  }
  auto logits = (*tiny)->Forward(torch::randint(0, 256, {1, 32}),
                                 torch::full({1}, 32, torch::kInt64));
  const double tiny_seconds = loraplex::SecondsSince(start);

  std::cout << std::fixed << std::setprecision(3);
  std::cout << "threads                     " << used << "\n";
  const loraplex::BlasInfo blas = loraplex::InspectBlas();
  std::cout << "BLAS                        " << loraplex::DescribeBlas(blas)
            << "\n";
  const std::string warning =
      loraplex::BlasPerformanceWarning(blas, loraplex::DetectCpuFeatures());
  if (!warning.empty()) std::cout << "WARNING: " << warning << "\n";
  std::cout << "peak fp32 GEMM (1024^3)     " << peak << " GFLOP/s\n";
  std::cout << "tiny: load + first forward  " << tiny_seconds * 1e3 << " ms\n";

  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    loraplex::ModelLoadOptions options;
    options.dtype = dtype;
    auto small = loraplex::LlamaModel::Load((dir / "small").string(), options);
    if (!small.ok()) {
      std::cerr << small.status() << "\n";
      return 1;
    }
    const int64_t batch = 4, seq = 128;
    torch::Tensor ids = torch::randint(0, 256, {batch, seq});
    torch::Tensor lengths = torch::full({batch}, seq, torch::kInt64);
    (void)(*small)->Forward(ids, lengths);  // Warm-up.
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      auto t = loraplex::BenchClock::now();
      (void)(*small)->Forward(ids, lengths);
      best = std::min(best, loraplex::SecondsSince(t));
    }
    const double gflops =
        loraplex::ForwardFlops((*small)->config(), batch * seq, seq) / best /
        1e9;
    std::cout << "small " << c10::toString(dtype) << " forward " << batch << "x"
              << seq << "  " << batch * seq / best << " tokens/s, " << gflops
              << " GFLOP/s = " << gflops / peak << " of peak GEMM\n";
  }
  return logits.ok() ? 0 : 1;
}
