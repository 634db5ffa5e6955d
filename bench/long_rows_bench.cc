// What activation checkpointing buys on long rows: for one row of each
// length, one training step (rank-16 LoRA on all seven projections, AdamW,
// cross-entropy on every token after the first; TrainCoBatchStep with one
// slot and no token budget, so the row is one micro-batch) with
// checkpointing off and with every decoder layer checkpointed, side by
// side: the peak memory the step allocates above what was live before it,
// the step's time, and the saved activations SavedActivationElements
// estimates for both. Then, computed from that estimate with no run, the
// longest row of the Llama-3-8B shape (bf16) that trains in `--memory-gb`
// GB (10^9 bytes) of GPU memory with checkpointing off and with every layer
// checkpointed (ActivationMemoryBytes, MaxRowTokens).
//
//   loraplex-bench-long-rows [--device cpu|cuda] [--shapes small]
//                            [--lengths 1024,2048,4096,8192,16384,32768]
//                            [--dtype auto] [--rounds 1] [--max-positions 0]
//                            [--memory-gb 80]
//
// Peak memory: on CUDA the caching allocator's max_memory_allocated; on the
// CPU a counting allocator in front of LibTorch's CPU allocator (tensors
// only; BLAS and oneDNN scratch buffers are not counted). Each peak is taken
// above the bytes live before the step, so the model's weights, the LoRA
// weights and their optimizer state are not counted.
//
// A preset (tiny, small) has its max_position_embeddings raised to the
// longest length (random weights have no position limit); a published
// shape (0.5b, 1.5b, 8b; the default on CUDA) keeps its own, and longer
// lengths are skipped. `--max-positions N` sets it for every shape. A step
// that runs out of memory is reported as OOM (other failures as failed,
// with the error below the row).
//
// On 2 CPU cores (AMD EPYC, fp32, `small`) the default lengths take about 7
// minutes, the 32768-token row 5 of them.
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#ifdef LORAPLEX_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/slot_pool.h"
#include "bench/model_shapes.h"
#include "bench/slot_requests.h"
#include "bench/timing.h"
#include "core/model/llama_model.h"
#include "core/model/model_config.h"
#include "core/runtime/device.h"
#include "core/train/co_batch_step.h"
#include "core/train/token_budget.h"

namespace loraplex {
namespace {

constexpr int64_t kRank = 16;
constexpr double kMiB = 1024.0 * 1024.0;

// Bytes live and their peak since the last ResetPeak.
class LiveBytes {
 public:
  void Add(int64_t bytes) {
    const int64_t now = current_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  void Release(int64_t bytes) { current_.fetch_sub(bytes); }
  void ResetPeak() { peak_.store(current_.load()); }
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// LibTorch's CPU allocator with every allocation counted in `live` until
// its tensor storage is freed.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator(c10::Allocator* inner, LiveBytes* live)
      : inner_(inner), live_(live) {}

  // LibTorch 2.3 dropped the const of Allocator::allocate; defining both
  // overrides it in every version.
  c10::DataPtr allocate(size_t bytes) { return Counted(bytes); }
  c10::DataPtr allocate(size_t bytes) const { return Counted(bytes); }

  // Pure virtual since LibTorch 2.3 (absent before).
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

 private:
  // What the deleter of a counted allocation needs.
  struct Allocation {
    c10::DataPtr inner;
    int64_t bytes;
    LiveBytes* live;
  };

  static void Free(void* context) {
    auto* allocation = static_cast<Allocation*>(context);
    allocation->live->Release(allocation->bytes);
    delete allocation;  // Frees the memory through the inner deleter.
  }

  c10::DataPtr Counted(size_t bytes) const {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    live_->Add(static_cast<int64_t>(bytes));
    return c10::DataPtr(
        data,
        new Allocation{std::move(inner), static_cast<int64_t>(bytes), live_},
        &Free, device);
  }

  c10::Allocator* inner_;
  LiveBytes* live_;
};

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The peak bytes a step allocates on `device` above those live when it
// starts: the CUDA caching allocator's statistics, or on the CPU those of
// `cpu_bytes` (counted by a CountingCpuAllocator).
class StepPeakMemory {
 public:
  StepPeakMemory(const torch::Device& device, LiveBytes* cpu_bytes)
      : device_(device), cpu_bytes_(cpu_bytes) {}

  void Start() {
    Synchronize(device_);
    if (device_.is_cuda()) {
#ifdef LORAPLEX_TORCH_HAS_CUDA
      namespace allocator = c10::cuda::CUDACachingAllocator;
      allocator::resetPeakStats(device_.index());
      start_ = allocator::getDeviceStats(device_.index())
                   .allocated_bytes[0]  // StatType::AGGREGATE
                   .current;
#endif
      return;
    }
    cpu_bytes_->ResetPeak();
    start_ = cpu_bytes_->current();
  }

  int64_t PeakAboveStart() const {
    Synchronize(device_);
    int64_t peak = 0;
    if (device_.is_cuda()) {
#ifdef LORAPLEX_TORCH_HAS_CUDA
      peak = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index())
                 .allocated_bytes[0]
                 .peak;
#endif
    } else {
      peak = cpu_bytes_->peak();
    }
    return peak - start_;
  }

 private:
  torch::Device device_;
  LiveBytes* cpu_bytes_;
  int64_t start_ = 0;
};

// Hands the CUDA caching allocator's unused blocks back after an OOM, so
// the next step starts from the same free memory.
void ReleaseCachedMemory(const torch::Device& device) {
#ifdef LORAPLEX_TORCH_HAS_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

// One step's measurements; nullopt peak: the step failed (`failure`).
struct StepMeasurement {
  std::optional<int64_t> peak_bytes;
  double seconds = 0;
  std::string failure;
};

CoBatchOptions LongRowOptions(CheckpointMode mode, torch::ScalarType dtype) {
  CoBatchOptions options;
  options.token_budget = 0;  // The row is one micro-batch.
  options.checkpointing.mode = mode;
  options.checkpointing.every = 1;
  options.checkpointing.element_bytes =
      static_cast<int64_t>(c10::elementSize(dtype));
  return options;
}

StepMeasurement MeasureStep(const LlamaModel& model, TrainingSlot* slot,
                            const CoBatchOptions& options,
                            const torch::Device& device,
                            StepPeakMemory& memory) {
  StepMeasurement measurement;
  memory.Start();
  const auto start = BenchClock::now();
  absl::StatusOr<std::vector<SlotStepMetrics>> metrics =
      TrainCoBatchStep(model, {slot}, options);
  Synchronize(device);
  measurement.seconds = SecondsSince(start);
  if (!metrics.ok()) {
    measurement.failure = std::string(metrics.status().message());
    ReleaseCachedMemory(device);
    return measurement;
  }
  measurement.peak_bytes = memory.PeakAboveStart();
  return measurement;
}

// Allocates the slot's AdamW state (a step on random gradients, which are
// dropped after), so that no measured step counts it.
void AllocateOptimizerState(TrainingSlot* slot) {
  GradientAttacher({slot})();
  slot->optimizer->Step();
  for (torch::Tensor param : slot->weights.parameters()) {
    param.mutable_grad() = torch::Tensor();
  }
}

std::string Cell(double value, int precision, int width) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(precision) << std::setw(width)
      << value;
  return out.str();
}

std::string Cell(const std::string& text, int width) {
  std::ostringstream out;
  out << std::setw(width) << text;
  return out.str();
}

// The table of one shape: one row per length.
bool MeasureShape(const std::string& shape, int64_t max_positions,
                  const std::vector<int64_t>& lengths, torch::ScalarType dtype,
                  const torch::Device& device, int rounds,
                  StepPeakMemory& memory) {
  absl::StatusOr<ModelConfig> config = ShapeConfig(shape);
  if (!config.ok()) {
    std::cerr << shape << ": " << config.status() << "\n";
    return false;
  }
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (max_positions > 0) {
    config->max_position_embeddings = max_positions;
  } else if (!IsPublishedShape(shape)) {
    config->max_position_embeddings =
        std::max(config->max_position_embeddings, longest);
  }
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  std::unique_ptr<LlamaModel> model = RandomModel(*config, dtype, device);
  std::cout << "\n"
            << shape << " (" << config->num_hidden_layers << " layers, hidden "
            << config->hidden_size << ", max_position_embeddings "
            << config->max_position_embeddings << ") on " << device.str()
            << ", " << c10::toString(dtype) << ", rank " << kRank
            << " LoRA on all 7 projections; peak = bytes allocated above "
            << "those live before the step, estimate = "
            << "SavedActivationElements x " << element_bytes << " bytes\n";
  const int w = 11;
  std::cout << Cell("tokens", 7) << Cell("peak off", w) << Cell("peak on", w)
            << Cell("on/off", 7) << Cell("est. off", w) << Cell("est. on", w)
            << Cell("time off", w) << Cell("time on", w) << Cell("on/off", 7)
            << "\n"
            << Cell("", 7) << Cell("MiB", w) << Cell("MiB", w) << Cell("", 7)
            << Cell("MiB", w) << Cell("MiB", w) << Cell("s", w) << Cell("s", w)
            << Cell("", 7) << "\n";
  const CoBatchOptions off = LongRowOptions(CheckpointMode::kOff, dtype);
  const CoBatchOptions every = LongRowOptions(CheckpointMode::kEvery, dtype);
  bool warmed_up = false;
  for (int64_t length : lengths) {
    if (length > config->max_position_embeddings) {
      std::cout << Cell(std::to_string(length), 7)
                << "  skipped: exceeds max_position_embeddings\n";
      continue;
    }
    auto pool =
        BenchPool(*config, {.capacity = 1, .device = device, .dtype = dtype}, 1,
                  kRank, 1, length);
    if (pool == nullptr) {
      std::cerr << shape << ": attaching a slot of " << length
                << "-token rows failed\n";
      return false;
    }
    TrainingSlot* slot = pool->ActiveSlots().front();
    AllocateOptimizerState(slot);
    if (!warmed_up) {  // Kernels, thread pools, allocator caches.
      MeasureStep(*model, slot, off, device, memory);
      MeasureStep(*model, slot, every, device, memory);
      warmed_up = true;
    }
    std::optional<int64_t> peak_off = 0;
    std::optional<int64_t> peak_on = 0;
    std::vector<double> times_off;
    std::vector<double> times_on;
    std::string failure;
    for (int round = 0; round < rounds; ++round) {
      for (bool checkpointed : {false, true}) {
        std::optional<int64_t>& peak = checkpointed ? peak_on : peak_off;
        if (!peak.has_value()) continue;  // Failed before: OOM again.
        const StepMeasurement step = MeasureStep(
            *model, slot, checkpointed ? every : off, device, memory);
        if (!step.peak_bytes.has_value()) {
          peak.reset();
          failure = step.failure;
          continue;
        }
        peak = std::max(*peak, *step.peak_bytes);
        (checkpointed ? times_on : times_off).push_back(step.seconds);
      }
    }
    const double estimate_off = static_cast<double>(
        SavedActivationElements(*config, length, 0) * element_bytes);
    const double estimate_on = static_cast<double>(
        SavedActivationElements(*config, length, 1) * element_bytes);
    const bool out_of_memory =
        failure.find("out of memory") != std::string::npos;
    auto peak_cell = [&](const std::optional<int64_t>& peak) {
      if (peak.has_value()) return Cell(*peak / kMiB, 1, w);
      return Cell(out_of_memory ? "OOM" : "failed", w);
    };
    auto time_cell = [&](const std::vector<double>& times) {
      return times.empty() ? Cell("-", w) : Cell(Median(times), 2, w);
    };
    std::cout << Cell(std::to_string(length), 7) << peak_cell(peak_off)
              << peak_cell(peak_on)
              << (peak_off && peak_on && *peak_off > 0
                      ? Cell(static_cast<double>(*peak_on) / *peak_off, 2, 7)
                      : Cell("-", 7))
              << Cell(estimate_off / kMiB, 1, w)
              << Cell(estimate_on / kMiB, 1, w) << time_cell(times_off)
              << time_cell(times_on)
              << (!times_off.empty() && !times_on.empty()
                      ? Cell(Median(times_on) / Median(times_off), 2, 7)
                      : Cell("-", 7))
              << "\n";
    if (!failure.empty()) std::cout << "         (" << failure << ")\n";
  }
  return true;
}

// The longest Llama-3-8B rows that train in `memory_gb` GB, from the
// estimate alone.
bool PrintComputedLongestRows(double memory_gb) {
  absl::StatusOr<ModelConfig> config = ShapeConfig("8b");
  if (!config.ok()) {
    std::cerr << "8b: " << config.status() << "\n";
    return false;
  }
  const int64_t element_bytes = 2;  // bf16
  const int64_t memory_bytes = static_cast<int64_t>(memory_gb * 1e9);
  CheckpointPolicy policy;
  policy.activation_bytes =
      ActivationMemoryBytes(*config, memory_bytes, element_bytes);
  policy.element_bytes = element_bytes;
  policy.mode = CheckpointMode::kOff;
  const int64_t longest_off = MaxRowTokens(policy, *config);
  policy.mode = CheckpointMode::kEvery;
  policy.every = 1;
  const int64_t longest_on = MaxRowTokens(policy, *config);
  std::cout << std::fixed << std::setprecision(1)
            << "\nComputed from the estimate, not measured: the Llama-3-8B "
            << "shape (hidden " << config->hidden_size << ", intermediate "
            << config->intermediate_size << ", " << config->num_hidden_layers
            << " layers, " << config->num_attention_heads << " heads, "
            << config->num_key_value_heads << " kv heads, head_dim "
            << config->head_dim << ", vocab " << config->vocab_size
            << ", bf16) in " << memory_gb << " GB: weights "
            << BaseParameterCount(*config) * element_bytes / 1e9
            << " GB, activations may take " << policy.activation_bytes / 1e9
            << " GB (ActivationMemoryBytes: three quarters of what the weights "
            << "leave)\n"
            << "  saved activations per token: "
            << SavedActivationElements(*config, 1, 0) * element_bytes / kMiB
            << " MiB checkpointing off, "
            << SavedActivationElements(*config, 1, 1) * element_bytes / kMiB
            << " MiB every layer checkpointed\n"
            << "  longest row (MaxRowTokens): " << longest_off
            << " tokens checkpointing off, " << longest_on
            << " tokens every layer checkpointed\n";
  return true;
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  using namespace loraplex;
  ReexecWithPassiveOpenMpWait(argv);
  CLI::App app{
      "Peak memory and time of one long row, checkpointing off "
      "and on."};
  std::string device_flag = "cpu";
  std::vector<std::string> shapes;
  std::vector<int64_t> lengths = {1024, 2048, 4096, 8192, 16384, 32768};
  std::string dtype_flag = "auto";
  int rounds = 1;
  int64_t max_positions = 0;
  double memory_gb = 80;
  int threads = 0;
  app.add_option("--device", device_flag, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--shapes", shapes,
                 "Presets (tiny, small) or 0.5b, 1.5b, 8b (default: small on "
                 "the CPU, 0.5b,1.5b,8b on CUDA)")
      ->delimiter(',');
  app.add_option("--lengths", lengths, "Tokens of the row")->delimiter(',');
  app.add_option("--dtype", dtype_flag,
                 "Base dtype: auto (float32 on the CPU, bfloat16 on CUDA), "
                 "bfloat16 or float32")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Timed steps per length and mode")
      ->capture_default_str();
  app.add_option("--max-positions", max_positions,
                 "max_position_embeddings of every shape (0: the longest "
                 "length for a preset, the published one otherwise)")
      ->capture_default_str();
  app.add_option("--memory-gb", memory_gb,
                 "GPU memory of the computed Llama-3-8B longest rows")
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  CLI11_PARSE(app, argc, argv);
  if (lengths.empty() || rounds < 1) {
    std::cerr << "--lengths must name a length and --rounds be >= 1\n";
    return 2;
  }
  ConfigureThreads(threads).IgnoreError();
  absl::StatusOr<torch::Device> device = ParseDevice(device_flag);
  if (!device.ok()) {
    std::cerr << device.status() << "\n";
    return 2;
  }
  if (shapes.empty()) {
    shapes = device->is_cuda() ? std::vector<std::string>{"0.5b", "1.5b", "8b"}
                               : std::vector<std::string>{"small"};
  }
  const torch::ScalarType dtype =
      dtype_flag == "bfloat16" || (dtype_flag == "auto" && device->is_cuda())
          ? torch::kBFloat16
          : torch::kFloat32;
  // Registered with LibTorch for the whole process, and storages freed at
  // exit still call into it: deliberately never deleted.
  auto* cpu_bytes = new LiveBytes();
  c10::SetCPUAllocator(
      new CountingCpuAllocator(c10::GetCPUAllocator(), cpu_bytes),
      /*priority=*/100);
  torch::manual_seed(0);
  StepPeakMemory memory(*device, cpu_bytes);
  for (const std::string& shape : shapes) {
    if (!MeasureShape(shape, max_positions, lengths, dtype, *device, rounds,
                      memory)) {
      return 1;
    }
  }
  return PrintComputedLongestRows(memory_gb) ? 0 : 1;
}
