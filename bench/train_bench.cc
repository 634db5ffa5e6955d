// Training-engine speed on this machine, measured side by side in one run
// on the `small` preset model (rank-16 LoRA on all seven projections,
// AdamW):
//
//  P1. One co-batched step of N slots vs the same work as N single-slot
//      steps, with 1 and with 8 sequences of 128 tokens per slot and with
//      1 sequence of 32 tokens, for each token budget (micro-batch size).
//  P2. Achieved FLOP/s of the co-batched step (base forward, base
//      input-gradient backward, LoRA forward and backward, LM head on the
//      target tokens) as a fraction of the peak fp32 GEMM FLOP/s measured
//      in the same process.
//  P1k. The co-batched step with the grouped LoRA kernel vs the per-slot
//      reference kernel (multi_lora.h), at the default token budget.
//  P3. Muon's, Lion's and SOAP's share of a co-batched step: N slots of
//      the family (1 sequence of 128 tokens each), the whole step vs its
//      optimizer part alone (all slots' steps in one StepSlotOptimizers
//      call).
//  P5. Latency of attaching and retiring a slot (storage reused).
//
// Ratios are printed last. The program re-executes itself with
// OMP_WAIT_POLICY=passive unless the variable is set (see
// ReexecWithPassiveOpenMpWait); set it to "active" to measure the default.
//
//   build/bin/loraplex-bench-train [--threads N] [--rounds R] [--slots N]
//                                  [--budgets 256,512,1024,0] [--p1-only]
//                                  [--profile DIR]
//
// --profile DIR also runs one co-batched step of each P1 shape, at the
// first budget, under LibTorch's profiler: operators by self time, and a
// Chrome trace in DIR.
#include <torch/torch.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "adapters/slot_pool.h"
#include "bench/profile_step.h"
#include "bench/slot_requests.h"
#include "bench/timing.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/runtime/blas_info.h"
#include "core/runtime/device.h"
#include "core/train/co_batch_step.h"

namespace loraplex {
namespace {

constexpr int64_t kRank = 16;

struct Comparison {
  std::string label;
  double ratio;
};

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  using namespace loraplex;
  ReexecWithPassiveOpenMpWait(argv);
  CLI::App app{"Measure the multi-LoRA training step on this machine."};
  int threads = 0;
  int rounds = 5;
  int slots = 8;
  std::vector<int64_t> budgets = {1024, 2048, 0};
  bool p1_only = false;
  std::string profile_dir;
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  app.add_option("--rounds", rounds, "Timed rounds per contender")
      ->capture_default_str();
  app.add_option("--slots", slots, "Slots trained together (N)")
      ->capture_default_str();
  app.add_option("--budgets", budgets,
                 "Token budgets per micro-batch to compare (0 = no limit)")
      ->delimiter(',');
  app.add_flag("--p1-only", p1_only,
               "Measure P1 and P2 only (bench/peft_compare.py uses this)");
  app.add_option("--profile", profile_dir,
                 "Profile one co-batched step per shape; traces go here");
  CLI11_PARSE(app, argc, argv);
  const int used = ConfigureThreads(threads).value_or(1);

  const std::string dir =
      (std::filesystem::temp_directory_path() / "loraplex-bench-train/small")
          .string();
  if (auto status = WritePresetModel("small", 0, dir); !status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  auto model = LlamaModel::Load(dir, {});
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  double peak = GemmGflops(1024, 10);
  std::cout << std::fixed << std::setprecision(3);
  std::cout << "threads " << used << ", slots " << slots << ", rank " << kRank
            << " on all 7 projections, AdamW, small model\n";
  const BlasInfo blas = InspectBlas();
  std::cout << "LibTorch " << TORCH_VERSION << ", BLAS " << DescribeBlas(blas)
            << "\n";
  const std::string warning = BlasPerformanceWarning(blas, DetectCpuFeatures());
  if (!warning.empty()) std::cout << "WARNING: " << warning << "\n";
  std::cout << "peak fp32 GEMM (1024^3): " << peak << " GFLOP/s\n";
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::cout << "OMP_WAIT_POLICY: " << (wait_policy ? wait_policy : "unset")
            << "\n";

  std::vector<Comparison> results;
  std::vector<std::string> profiles;  // SUMMARY lines of --profile.
  // {sequences per slot, tokens per sequence}.
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {1, 128}, {8, 128}, {1, 32}};
  for (const auto& [per_slot, seq_len] : cases) {
    auto pool =
        BenchPool(config, {.capacity = slots}, slots, kRank, per_slot, seq_len);
    if (pool == nullptr) return 1;
    std::vector<TrainingSlot*> all = pool->ActiveSlots();
    for (int64_t budget : budgets) {
      CoBatchOptions options;
      options.token_budget = budget;
      auto co_batched = [&] {
        if (!TrainCoBatchStep(**model, all, options).ok()) std::abort();
      };
      auto one_by_one = [&] {
        for (TrainingSlot* slot : all) {
          if (!TrainCoBatchStep(**model, {slot}, options).ok()) std::abort();
        }
      };
      const auto [together, apart] =
          TimeSideBySide(co_batched, one_by_one, rounds);
      const double gflops =
          TrainStepFlops(config, slots * per_slot, seq_len, kRank) / together /
          1e9;
      std::ostringstream label;
      label << slots << " slots x " << per_slot << " x " << seq_len
            << " tokens, budget "
            << (budget == 0 ? std::string("none") : std::to_string(budget));
      std::cout << label.str() << ": co-batched " << together * 1e3 << " ms, "
                << slots << " single-slot steps " << apart * 1e3 << " ms, "
                << gflops << " GFLOP/s\n";
      results.push_back({"P1 " + label.str() + ": single-slot / co-batched",
                         apart / together});
      results.push_back(
          {"P2 " + label.str() + ": step GFLOP/s / peak GEMM", gflops / peak});
      if (!profile_dir.empty() && budget == budgets.front()) {
        const std::string profile =
            ProfileStep(co_batched, torch::kCPU, profile_dir,
                        std::to_string(slots) + "x" + std::to_string(per_slot) +
                            "x" + std::to_string(seq_len));
        profiles.push_back(profile);
      }
    }
  }

  // P1k: grouped vs per-slot LoRA kernel.
  for (const auto& [per_slot, seq_len] : cases) {
    if (p1_only) break;
    auto pool =
        BenchPool(config, {.capacity = slots}, slots, kRank, per_slot, seq_len);
    if (pool == nullptr) return 1;
    std::vector<TrainingSlot*> all = pool->ActiveSlots();
    CoBatchOptions grouped;
    CoBatchOptions reference;
    reference.lora_kernel = LoraKernel::kPerSlot;
    const auto [grouped_time, reference_time] = TimeSideBySide(
        [&] {
          if (!TrainCoBatchStep(**model, all, grouped).ok()) std::abort();
        },
        [&] {
          if (!TrainCoBatchStep(**model, all, reference).ok()) std::abort();
        },
        rounds);
    std::ostringstream label;
    label << slots << " slots x " << per_slot << " x " << seq_len << " tokens";
    std::cout << label.str() << ", budget " << grouped.token_budget
              << ": grouped LoRA kernel " << grouped_time * 1e3
              << " ms, per-slot kernel " << reference_time * 1e3 << " ms\n";
    results.push_back({"P1k " + label.str() + ": per-slot / grouped kernel",
                       reference_time / grouped_time});
  }

  // P3: the optimizer's share of a step, Muon's, Lion's and SOAP's (its
  // defaults).
  for (OptimizerFamily family : {OptimizerFamily::kMuon, OptimizerFamily::kLion,
                                 OptimizerFamily::kSoap}) {
    if (p1_only) break;
    auto pool =
        BenchPool(config, {.capacity = slots}, slots, kRank, 1, 128, family);
    if (pool == nullptr) return 1;
    std::vector<TrainingSlot*> all = pool->ActiveSlots();
    std::vector<SlotOptimizer*> optimizers;
    for (TrainingSlot* slot : all) optimizers.push_back(&*slot->optimizer);
    CoBatchOptions options;
    const std::function<void()> attach_grads = GradientAttacher(all);
    const auto [step, optimizer] = TimeSideBySide(
        [&] {
          if (!TrainCoBatchStep(**model, all, options).ok()) std::abort();
        },
        [&] {
          attach_grads();
          StepSlotOptimizers(optimizers);
        },
        rounds);
    const std::string name(OptimizerFamilyName(family));
    std::cout << slots << " " << name << " slots x 1 x 128 tokens: step "
              << step * 1e3 << " ms, of which the " << name << " step "
              << optimizer * 1e3 << " ms\n";
    results.push_back({"P3 " + name + "'s share of a step, " +
                           std::to_string(slots) +
                           " slots x 1 x 128 tokens (goal <= 0.1)",
                       optimizer / step});
  }

  // P5: attach + retire, storage reused after the first attach.
  SlotPool pool(config, {.capacity = 1});
  auto data = RandomSequences(1, 128, config.vocab_size);
  std::vector<double> attach_times;
  std::vector<double> retire_times;
  for (int i = 0; i < (p1_only ? 1 : 50); ++i) {
    auto start = BenchClock::now();
    auto slot = pool.Attach(BenchSlotRequest(i, kRank, 1, 128, data));
    attach_times.push_back(SecondsSince(start));
    if (!slot.ok()) return 1;
    start = BenchClock::now();
    if (!pool.Retire(*slot).ok()) return 1;
    retire_times.push_back(SecondsSince(start));
  }
  std::cout << "attach (rank " << kRank << ", all targets, AdamW) median "
            << Median(attach_times) * 1e3 << " ms, retire median "
            << Median(retire_times) * 1e3 << " ms\n";

  // The peak is measured again after the steps, and the higher figure
  // kept, so a slow start of the machine does not flatter P2.
  const double peak_after = GemmGflops(1024, 10);
  std::cout << "peak fp32 GEMM after the steps: " << peak_after << " GFLOP/s\n";
  if (peak_after > peak) {
    for (Comparison& c : results) {
      if (c.label.rfind("P2", 0) == 0) c.ratio *= peak / peak_after;
    }
    peak = peak_after;
  }
  std::cout << "\nRatios (measured side by side above):\n";
  for (const Comparison& c : results) {
    std::cout << "  " << std::left << std::setw(70) << c.label << std::right
              << std::setw(7) << c.ratio << "\n";
  }
  std::cout << "  " << std::left << std::setw(70)
            << "P5 attach + retire latency (ms)" << std::right << std::setw(7)
            << (Median(attach_times) + Median(retire_times)) * 1e3 << "\n";
  for (const std::string& line : profiles) std::cout << line << "\n";
  return 0;
}
