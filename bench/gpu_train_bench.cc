// Training throughput of real model shapes on one device, random weights
// generated on the device (no files): tokens/s and model FLOP utilisation
// (the training step's matmul FLOPs, counted as loraplex-bench-train does,
// over the peak bf16 GEMM FLOP/s measured in the same process), for 1, 4, 16
// and 64 slots of rank-16 LoRA on all seven projections (AdamW), one
// sequence per slot of each length; and, side by side, a co-batched step of
// 16 slots against 16 single-slot steps. One summary line per shape last.
//
//   loraplex-bench-gpu [--device cuda] [--shapes 0.5b,1.5b,8b]
//                      [--slots 1,4,16,64] [--seq 512,2048] [--rounds 3]
//                      [--dtype bfloat16] [--token-budget N]
//                      [--short-shape 0.5b] [--short-slots 8,16,64]
//                      [--short-seq 128] [--profile DIR]
//
// Goal on one H200 for the 8B shape: >= 10k training tokens/s (>= 30% MFU),
// and 16 slots keep >= 90% of one slot's tokens/s.
//
// Then, on the `--short-shape` model, many slots of short rows (one
// sequence of `--short-seq` tokens each), side by side: P1 a co-batched step
// vs one single-slot step per slot (goal >= 3x at 16 slots), P1k the
// grouped LoRA kernel vs the per-slot one, and P3 Muon's share of the step
// and one StepSlotOptimizers call (Newton–Schulz batched across slots) vs
// each slot's own Step().
//
// `--profile DIR` also runs one step of 16 slots (each shape's first
// sequence length, and the short rows) and the 16 Muon slots' optimizer
// step under LibTorch's profiler: it prints
// the operators by CPU self time, the kernels by device time and how busy
// the device was, and writes each step's Chrome trace to DIR.
//
// `--device cpu --shapes tiny --short-shape tiny` runs the same code on the
// CPU in seconds (deploy/gpu_check.sh --cpu).
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "adapters/slot_pool.h"
#include "bench/model_shapes.h"
#include "bench/profile_step.h"
#include "bench/slot_requests.h"
#include "bench/timing.h"
#include "core/model/llama_model.h"
#include "core/model/model_config.h"
#include "core/model/model_presets.h"
#include "core/optim/slot_optimizer.h"
#include "core/runtime/device.h"
#include "core/runtime/runtime_info.h"
#include "core/train/co_batch_step.h"
#include "core/train/token_budget.h"

namespace loraplex {
namespace {

constexpr int64_t kRank = 16;

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Best-of-N n³ GEMM throughput in FLOP/s in `dtype` on `device`.
double PeakGemmFlops(int64_t n, torch::ScalarType dtype,
                     const torch::Device& device, int repeats) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  torch::Tensor a = torch::randn({n, n}, options);
  torch::Tensor b = torch::randn({n, n}, options);
  torch::Tensor c;
  for (int i = 0; i < 3; ++i) c = torch::mm(a, b);
  Synchronize(device);
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = BenchClock::now();
    c = torch::mm(a, b);
    Synchronize(device);
    best = std::min(best, SecondsSince(start));
  }
  return 2.0 * n * n * n / best;
}

struct Run {
  int slots = 0;
  int64_t seq = 0;
  double tokens_per_second = 0;
  double mfu = 0;
};

constexpr int kProfiledSlots = 16;

// The short-row comparisons (P1, P1k, P3) on `model`; appends their summary
// lines. With `profile_dir`, also profiles the co-batched step of 16 slots.
bool CompareShortRows(const LlamaModel& model, const std::string& shape,
                      const std::vector<int>& slot_counts, int64_t seq,
                      const CoBatchOptions& options, torch::ScalarType dtype,
                      const torch::Device& device, int rounds,
                      const std::string& profile_dir,
                      std::vector<std::string>& summaries) {
  std::cout << "\n"
            << shape << ", short rows (1 x " << seq << " tokens per slot):\n";
  std::ostringstream p1;
  std::ostringstream p1k;
  p1 << std::fixed << std::setprecision(2) << "SUMMARY P1 " << shape
     << " co-batched / one slot at a time, " << seq << "-token rows:";
  p1k << std::fixed << std::setprecision(2) << "SUMMARY P1k " << shape
      << " per-slot / grouped LoRA kernel, " << seq << "-token rows:";
  for (int slots : slot_counts) {
    auto pool = BenchPool(model.config(),
                          {.capacity = slots, .device = device, .dtype = dtype},
                          slots, kRank, 1, seq);
    if (pool == nullptr) return false;
    std::vector<TrainingSlot*> all = pool->ActiveSlots();
    CoBatchOptions per_slot_kernel = options;
    per_slot_kernel.lora_kernel = LoraKernel::kPerSlot;
    auto step = [&](const CoBatchOptions& o) {
      return [&, o] {
        if (!TrainCoBatchStep(model, all, o).ok()) std::abort();
        Synchronize(device);
      };
    };
    auto apart = [&] {
      for (TrainingSlot* slot : all) {
        if (!TrainCoBatchStep(model, {slot}, options).ok()) std::abort();
      }
      Synchronize(device);
    };
    const auto [together, separately] =
        TimeSideBySide(step(options), apart, rounds);
    const auto [grouped, per_slot] =
        TimeSideBySide(step(options), step(per_slot_kernel), rounds);
    std::cout << "  " << slots << " slots: co-batched " << together * 1e3
              << " ms, one at a time " << separately * 1e3
              << " ms; grouped kernel " << grouped * 1e3 << " ms, per-slot "
              << per_slot * 1e3 << " ms\n";
    p1 << " " << slots << " slots " << separately / together << "x;";
    p1k << " " << slots << " slots " << per_slot / grouped << "x;";
    if (!profile_dir.empty() && slots == kProfiledSlots) {
      const std::string profile =
          ProfileStep(step(options), device, profile_dir,
                      shape + "-short-" + std::to_string(slots) + "x" +
                          std::to_string(seq));
      summaries.push_back(profile);
    }
  }
  summaries.push_back(p1.str());
  summaries.push_back(p1k.str());

  // P3: 16 Muon slots.
  const int muon_slots = 16;
  auto pool =
      BenchPool(model.config(),
                {.capacity = muon_slots, .device = device, .dtype = dtype},
                muon_slots, kRank, 1, seq, OptimizerFamily::kMuon);
  if (pool == nullptr) return false;
  std::vector<TrainingSlot*> all = pool->ActiveSlots();
  std::vector<SlotOptimizer*> optimizers;
  for (TrainingSlot* slot : all) optimizers.push_back(&*slot->optimizer);
  const std::function<void()> attach_grads = GradientAttacher(all);
  const auto [step, batched] = TimeSideBySide(
      [&] {
        if (!TrainCoBatchStep(model, all, options).ok()) std::abort();
        Synchronize(device);
      },
      [&] {
        attach_grads();
        StepSlotOptimizers(optimizers);
        Synchronize(device);
      },
      rounds);
  const auto [batched_again, each] = TimeSideBySide(
      [&] {
        attach_grads();
        StepSlotOptimizers(optimizers);
        Synchronize(device);
      },
      [&] {
        attach_grads();
        for (SlotOptimizer* optimizer : optimizers) optimizer->Step();
        Synchronize(device);
      },
      rounds);
  std::cout << "  " << muon_slots << " Muon slots: step " << step * 1e3
            << " ms, all Muon steps batched " << batched * 1e3
            << " ms, slot by slot " << each * 1e3 << " ms\n";
  std::ostringstream p3;
  p3 << std::fixed << std::setprecision(2) << "SUMMARY P3 " << shape << " "
     << muon_slots << " Muon slots: Muon's share of the step " << batched / step
     << " (goal <= 0.10); batched / slot-by-slot speed-up "
     << each / batched_again << "x";
  summaries.push_back(p3.str());
  if (!profile_dir.empty()) {
    // The optimizer step alone (with the gradients it is given): where
    // Muon's share of the step goes.
    summaries.push_back(ProfileStep(
        [&] {
          attach_grads();
          StepSlotOptimizers(optimizers);
          Synchronize(device);
        },
        device, profile_dir,
        shape + "-muon-step-" + std::to_string(muon_slots) + "x" +
            std::to_string(seq)));
  }
  return true;
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  using namespace loraplex;
  ReexecWithPassiveOpenMpWait(argv);
  CLI::App app{"Training throughput and MFU of real model shapes."};
  std::string device_flag = "cuda";
  std::vector<std::string> shapes = {"0.5b", "1.5b", "8b"};
  std::vector<int> slot_counts = {1, 4, 16, 64};
  std::vector<int64_t> seqs = {512, 2048};
  int rounds = 3;
  std::string dtype_flag = "bfloat16";
  int64_t token_budget = -1;
  int threads = 0;
  std::string short_shape = "0.5b";
  std::vector<int> short_slots = {8, 16, 64};
  int64_t short_seq = 128;
  std::string profile_dir;
  app.add_option("--device", device_flag, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--shapes", shapes,
                 "0.5b, 1.5b, 8b, 30b-a3b (Qwen3-30B-A3B, MFU on active "
                 "parameters), or a preset (tiny, tiny-moe)")
      ->delimiter(',');
  app.add_option("--slots", slot_counts, "Slot counts")->delimiter(',');
  app.add_option("--seq", seqs, "Tokens per sequence")->delimiter(',');
  app.add_option("--rounds", rounds, "Timed steps per measurement")
      ->capture_default_str();
  app.add_option("--dtype", dtype_flag, "Base dtype: bfloat16 or float32")
      ->check(CLI::IsMember({"bfloat16", "float32"}))
      ->capture_default_str();
  app.add_option("--token-budget", token_budget,
                 "Tokens per micro-batch (default: the server's default for "
                 "the device)");
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  app.add_option("--short-shape", short_shape,
                 "Model of the short-row comparisons (none: skip them)")
      ->capture_default_str();
  app.add_option("--short-slots", short_slots,
                 "Slot counts of the short-row comparisons")
      ->delimiter(',');
  app.add_option("--short-seq", short_seq, "Tokens per short row")
      ->capture_default_str();
  app.add_option("--profile", profile_dir,
                 "Profile one step of 16 slots per shape; traces go here");
  CLI11_PARSE(app, argc, argv);
  ConfigureThreads(threads).IgnoreError();
  absl::StatusOr<torch::Device> device = ParseDevice(device_flag);
  if (!device.ok()) {
    std::cerr << device.status() << "\n";
    return 2;
  }
  const torch::ScalarType dtype =
      dtype_flag == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  torch::manual_seed(0);

  std::cout << std::fixed << std::setprecision(3);
  const double peak =
      PeakGemmFlops(device->is_cuda() ? 8192 : 512, dtype, *device, 10);
  std::cout << "device " << device->str() << ", base " << dtype_flag
            << ", peak " << dtype_flag << " GEMM " << peak / 1e12
            << " TFLOP/s; rank " << kRank << " on all 7 projections, AdamW\n";

  // The device's memory, for the server's default token budget.
  int64_t memory = 0;
  const int index = device->has_index() ? device->index() : 0;
  for (const CudaDeviceInfo& cuda : InspectRuntime().cuda_devices) {
    if (device->is_cuda() && cuda.index == index) {
      memory = cuda.total_memory_bytes;
    }
  }
  // --token-budget, or the server's default for the device.
  auto budget_for = [&](const ModelConfig& config) {
    return token_budget >= 0
               ? token_budget
               : DefaultTokenBudget(
                     config, device->is_cuda(), memory,
                     static_cast<int64_t>(c10::elementSize(dtype)));
  };
  std::vector<std::string> summaries;
  for (const std::string& shape : shapes) {
    absl::StatusOr<ModelConfig> config = ShapeConfig(shape);
    if (!config.ok()) {
      std::cerr << shape << ": " << config.status() << "\n";
      return 2;
    }
    std::unique_ptr<LlamaModel> model = RandomModel(*config, dtype, *device);
    CoBatchOptions options;
    options.token_budget = budget_for(*config);
    std::cout << "\n"
              << shape << ": " << BaseParameterCount(*config) / 1e6
              << "M parameters (" << ActiveParameterCount(*config) / 1e6
              << "M active per token), weights "
              << BaseParameterCount(*config) * torch::elementSize(dtype) / 1e9
              << " GB, token budget " << options.token_budget << "\n";
    std::vector<Run> runs;
    double one_slot = 0;
    double sixteen_slots = 0;
    for (int64_t seq : seqs) {
      for (int slots : slot_counts) {
        auto pool = BenchPool(
            *config, {.capacity = slots, .device = *device, .dtype = dtype},
            slots, kRank, 1, seq);
        if (pool == nullptr) return 1;
        std::vector<TrainingSlot*> all = pool->ActiveSlots();
        auto step = [&] {
          if (!TrainCoBatchStep(*model, all, options).ok()) std::abort();
          Synchronize(*device);
        };
        step();  // Warm-up: allocator, kernels, optimizer state.
        std::vector<double> times;
        for (int r = 0; r < rounds; ++r) {
          const auto start = BenchClock::now();
          step();
          times.push_back(SecondsSince(start));
        }
        const double time = Median(times);
        Run run;
        run.slots = slots;
        run.seq = seq;
        run.tokens_per_second = static_cast<double>(slots * seq) / time;
        run.mfu = TrainStepFlops(*config, slots, seq, kRank) / time / peak;
        runs.push_back(run);
        std::cout << "  " << slots << " slots x " << seq
                  << " tokens: " << time * 1e3 << " ms/step, "
                  << std::setprecision(0) << run.tokens_per_second
                  << " tokens/s, " << std::setprecision(3) << run.mfu * 100
                  << "% MFU\n";
        if (seq == seqs.front() && slots == 1) {
          one_slot = run.tokens_per_second;
        }
        if (seq == seqs.front() && slots == kProfiledSlots) {
          sixteen_slots = run.tokens_per_second;
          // Co-batched against one slot at a time, side by side.
          auto apart = [&] {
            for (TrainingSlot* slot : all) {
              if (!TrainCoBatchStep(*model, {slot}, options).ok()) {
                std::abort();
              }
            }
            Synchronize(*device);
          };
          const auto [together, separately] =
              TimeSideBySide(step, apart, rounds);
          std::cout << "  16 slots co-batched " << together * 1e3
                    << " ms, 16 single-slot steps " << separately * 1e3
                    << " ms: " << separately / together << "x\n";
        }
        if (!profile_dir.empty() && seq == seqs.front() &&
            slots == kProfiledSlots) {
          const std::string profile = ProfileStep(
              step, *device, profile_dir,
              shape + "-" + std::to_string(slots) + "x" + std::to_string(seq));
          summaries.push_back(profile);
        }
      }
    }
    const Run best = *std::max_element(
        runs.begin(), runs.end(), [](const Run& a, const Run& b) {
          return a.tokens_per_second < b.tokens_per_second;
        });
    std::ostringstream summary;
    summary << std::fixed << std::setprecision(0) << "SUMMARY " << shape
            << " on " << device->str() << ": best " << best.tokens_per_second
            << " tokens/s (" << best.slots << " slots x " << best.seq << "), "
            << std::setprecision(1) << best.mfu * 100 << "% MFU";
    if (one_slot > 0 && sixteen_slots > 0) {
      summary << std::setprecision(2) << "; 16 slots keep "
              << sixteen_slots / one_slot << " of 1 slot's tokens/s";
    }
    summaries.push_back(summary.str());
  }
  if (!short_shape.empty() && short_shape != "none") {
    absl::StatusOr<ModelConfig> config = ShapeConfig(short_shape);
    if (!config.ok()) {
      std::cerr << short_shape << ": " << config.status() << "\n";
      return 2;
    }
    std::unique_ptr<LlamaModel> model = RandomModel(*config, dtype, *device);
    CoBatchOptions options;
    options.token_budget = budget_for(*config);
    if (!CompareShortRows(*model, short_shape, short_slots, short_seq, options,
                          dtype, *device, rounds, profile_dir, summaries)) {
      return 1;
    }
  }
  std::cout << "\n";
  for (const std::string& line : summaries) std::cout << line << "\n";
  return 0;
}
