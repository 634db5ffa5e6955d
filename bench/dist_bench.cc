// P6: communication of the data-parallel co-batched step, measured on every
// rank of one run (start it with deploy/launch_local.sh):
//
//   - parameter sync: bytes the owners broadcast per step ÷ the bytes of
//     every trainable parameter stepped (goal 1.0: each parameter leaves its
//     owner once);
//   - gradient all-reduce: bytes summed per step ÷ the same;
//   - time share of the step spent in collectives (rank 0, and the most of
//     any rank).
//
//   deploy/launch_local.sh 2 build/bin/loraplex-bench-dist [--preset small]
//       [--slots 4] [--steps 10] [--threads N]
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "adapters/data_parallel_slots.h"
#include "adapters/slot_pool.h"
#include "bench/timing.h"
#include "core/common/status_macros.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/runtime/device.h"
#include "core/train/co_batch_step.h"

namespace loraplex {
namespace {

absl::Status Run(const std::string& preset, int slots, int steps) {
  LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
  LORAPLEX_ASSIGN_OR_RETURN(DistContext dist,
                            DistContext::Create(env, torch::kCPU));
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("loraplex-bench-dist-" + std::to_string(getpid())))
                              .string();
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel(preset, 7, dir));
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                            LlamaModel::Load(dir, {}));
  std::filesystem::remove_all(dir);

  DataParallelSlots dp(&dist);
  SlotPool pool(model->config(), {.capacity = slots, .claims = &dp});
  torch::manual_seed(1);  // The same data on every rank.
  auto data = RandomSequences(64, 128, model->config().vocab_size);
  int64_t param_bytes = 0;
  for (int i = 0; i < slots; ++i) {
    SlotAttachRequest request;
    request.job_id = "bench-" + std::to_string(i);
    request.lora.rank = 16;
    request.lora.alpha = 32;
    request.optimizer.family =
        i % 2 == 0 ? OptimizerFamily::kAdamW : OptimizerFamily::kMuon;
    request.optimizer.lr = 1e-4;
    request.schedule.kind = LrScheduleKind::kConstant;
    request.training.batch_size = 4;
    request.training.seq_len = 128;
    request.training.max_steps = int64_t{1} << 30;
    request.training.seed = static_cast<uint64_t>(i);
    request.data = data;
    LORAPLEX_ASSIGN_OR_RETURN(int slot, pool.Attach(request));
    for (const torch::Tensor& p : pool.slot(slot).weights.parameters()) {
      param_bytes += p.numel() * p.element_size();
    }
  }

  // The collectives, timed.
  StepSync inner = dp.Sync(pool);
  double comm_seconds = 0;
  StepSync sync = inner;
  sync.sum = [&](std::vector<torch::Tensor>& tensors) {
    const auto start = BenchClock::now();
    absl::Status status = inner.sum(tensors);
    comm_seconds += SecondsSince(start);
    return status;
  };
  sync.after_step = [&](const std::vector<TrainingSlot*>& stepped) {
    const auto start = BenchClock::now();
    absl::Status status = inner.after_step(stepped);
    comm_seconds += SecondsSince(start);
    return status;
  };
  CoBatchOptions options;
  options.sync = &sync;
  auto step = [&]() -> absl::Status {
    return TrainCoBatchStep(*model, pool.ActiveSlots(), options).status();
  };
  LORAPLEX_RETURN_IF_ERROR(step());  // Warm-up.
  LORAPLEX_RETURN_IF_ERROR(dist.Barrier());
  dist.ResetCounters();
  comm_seconds = 0;
  const auto start = BenchClock::now();
  for (int i = 0; i < steps; ++i) LORAPLEX_RETURN_IF_ERROR(step());
  const double seconds = SecondsSince(start);
  const CollectiveCounters counters = dist.counters();

  // Rank 0 reports the sums and maxima over the ranks.
  std::vector<torch::Tensor> sums = {torch::tensor(
      {static_cast<double>(counters.broadcast_sent_bytes)}, torch::kDouble)};
  LORAPLEX_RETURN_IF_ERROR(dist.AllReduceSum(sums, 1 << 10));
  // The most of any rank: every rank sends its share, rank 0 reads all.
  std::string mine = std::to_string(comm_seconds / seconds);
  double most = comm_seconds / seconds;
  for (int root = 0; root < dist.world_size(); ++root) {
    std::string value = mine;
    LORAPLEX_RETURN_IF_ERROR(dist.Broadcast(&value, root));
    most = std::max(most, std::stod(value));
  }
  if (dist.is_root()) {
    const double per_step = static_cast<double>(steps);
    std::printf(
        "ranks %d, %d slots (AdamW/Muon, rank 16, all targets), "
        "model %s, %d steps of 4 x 128 tokens per slot\n",
        dist.world_size(), slots, preset.c_str(), steps);
    std::printf("trainable parameter bytes          %lld\n",
                static_cast<long long>(param_bytes));
    std::printf("param sync bytes / step (all ranks) %.0f\n",
                sums[0].item<double>() / per_step);
    std::printf("grad all-reduce bytes / step        %.0f\n",
                counters.all_reduce_bytes / per_step);
    std::printf("step time                           %.3f s\n",
                seconds / per_step);
    std::printf("\nP6 param sync / trainable bytes     %.3f   (goal 1.0)\n",
                sums[0].item<double>() / per_step / param_bytes);
    std::printf("P6 grad all-reduce / trainable bytes %.3f\n",
                counters.all_reduce_bytes / per_step / param_bytes);
    std::printf(
        "P6 communication share of a step    %.3f (rank 0), %.3f "
        "(most of any rank)\n",
        comm_seconds / seconds, most);
  }
  return dist.Barrier();
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  loraplex::ReexecWithPassiveOpenMpWait(argv);
  std::string preset = "small";
  int slots = 4;
  int steps = 10;
  int threads = 0;
  CLI::App app{
      "P6: bytes and time of the data-parallel step's collectives. Start "
      "it with deploy/launch_local.sh N."};
  app.add_option("--preset", preset, "tiny or small")->capture_default_str();
  app.add_option("--slots", slots)->check(CLI::Range(1, 64));
  app.add_option("--steps", steps)->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "LibTorch threads per rank (0: keep)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(threads);
  absl::Status status = loraplex::Run(preset, slots, steps);
  if (!status.ok()) {
    std::cerr << "loraplex-bench-dist: " << status << "\n";
    return 1;
  }
  return 0;
}
