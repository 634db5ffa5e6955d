// What sharding the frozen base (docs/DESIGN.md §18)
// saves per rank and what its gathers cost per training step, over 1, 2
// and 4 processes (Gloo over 127.0.0.1). Run it with no launcher:
//
//   build/bin/loraplex-bench-shard-base [--preset small] [--steps 6]
//       [--slots 2] [--threads 1] [--processes 1,2,4] [--dtype fp64]
//
// The program writes the preset once, then re-executes itself once per
// rank for each process count. Each rank loads the base whole, sharded
// with blocking gathers (one buffer) and sharded with the next layer's
// gather overlapping compute (BaseShardingOver: two buffers, as the server
// runs it), and measures for each the frozen bytes it holds
// (LlamaModel::FrozenWeightBytes) and the growth of its resident set
// across the load and after every frozen weight was read once (a whole
// fp32 base shares the checkpoint's file mapping, so its pages count only
// once touched, and as file pages). It then times co-batched
// data-parallel steps (the same data on every rank, a warm-up step left
// out) four ways in turns: those three and the whole base with every
// layer checkpointed (the recomputation a sharded base always pays, so
// that the gathers' own cost shows apart from it), with the time the
// gathers hold the step up. Each rank writes what it measured to a file;
// the parent prints the tables.
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adapters/data_parallel_slots.h"
#include "adapters/slot_pool.h"
#include "bench/timing.h"
#include "core/common/status_macros.h"
#include "core/dist/base_sharding.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/model/sharded_base.h"
#include "core/runtime/device.h"
#include "core/train/co_batch_step.h"
#include "tests/common/free_port.h"
#include "tests/common/rank_process.h"

namespace loraplex {
namespace {

// Set in a rank's environment: the run's folder (the checkpoint in
// model/, rank 0's report and any rank's error written there).
constexpr char kRunDirVar[] = "LORAPLEX_SHARD_BENCH_DIR";
// A rank's collectives give up after this long (unless the caller's
// environment sets LORAPLEX_DIST_TIMEOUT_SECONDS): a rank that dies never
// leaves the others waiting longer.
constexpr int kDefaultDistTimeoutSeconds = 120;

struct BenchOptions {
  std::string preset = "small";
  int steps = 6;
  int slots = 2;
  int batch = 4;
  int seq_len = 128;
  // LibTorch threads per rank. With two, a rank's step slowed 2-10x
  // whenever anything else ran on a 2-core machine; the comparison that
  // matters is within a row.
  int threads = 1;
  std::vector<int> processes = {1, 2, 4};
  // Compute dtype: "" the checkpoint's (fp32, so a whole base shares the
  // file's pages), or fp32, bf16, fp64 (converted: the whole base is
  // copied into each rank's own memory, as it is on an accelerator).
  std::string dtype;
};

std::optional<torch::ScalarType> ComputeDtype(const BenchOptions& options) {
  if (options.dtype == "bf16") return torch::kBFloat16;
  if (options.dtype == "fp64") return torch::kFloat64;
  if (options.dtype == "fp32") return torch::kFloat32;
  return std::nullopt;
}

int Cores() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// ---------------------------------------------------------------------------
// A rank.

// How a rank holds the base: whole, sharded with blocking gathers (one
// buffer), or sharded with the next gather overlapping compute (two).
enum class Base { kWhole, kSharded, kOverlapped };
constexpr const char* kBaseKeys[] = {"whole", "sharded", "overlap"};

// The ways a step runs, timed in turns. A sharded base always recomputes
// its layers in the backward; "ckpt" pays the same on the whole base.
struct StepKind {
  const char* key;
  Base base;
  bool checkpoint_every_layer;
};
constexpr StepKind kStepKinds[] = {{"whole", Base::kWhole, false},
                                   {"ckpt", Base::kWhole, true},
                                   {"sharded", Base::kSharded, false},
                                   {"overlap", Base::kOverlapped, false}};

// Resident set of this process in bytes: all of it, and its anonymous and
// file-backed parts (/proc/self/status).
struct Resident {
  double total = 0;
  double anon = 0;
  double file = 0;
};

Resident ReadResident() {
  Resident resident;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    const std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    double kib = 0;
    if (words.size() < 2 || !absl::SimpleAtod(words[1], &kib)) continue;
    if (words[0] == "VmRSS:") resident.total = kib * 1024;
    if (words[0] == "RssAnon:") resident.anon = kib * 1024;
    if (words[0] == "RssFile:") resident.file = kib * 1024;
  }
  return resident;
}

// Reads every element of every frozen tensor the model holds once, so
// that a base still lying in the file mapping is paged in. A sharded
// base's gather buffers stay untouched: after a gather, glibc also keeps
// Gloo's freed layer-sized temporary resident (1 or 2 layers from run to
// run; none with MALLOC_MMAP_THRESHOLD_=131072), which would blur the
// reading.
void ReadEveryFrozenWeight(const LlamaModel& model) {
  torch::NoGradGuard no_grad;
  const ModelWeights& w = model.weights();
  std::vector<torch::Tensor> tensors = {w.embed_tokens, w.final_norm,
                                        w.lm_head};
  for (LayerWeights layer : w.layers) {
    for (torch::Tensor* t : LayerTensorSlots(layer)) tensors.push_back(*t);
  }
  const ShardedBase* base = model.sharded_base();
  for (int64_t l = 0; base != nullptr && l < base->num_layers(); ++l) {
    tensors.push_back(base->shard(l));
  }
  for (const torch::Tensor& t : tensors) {
    // In place: a copy would grow the resident set it is meant to read.
    if (t.defined() && t.numel() > 0) (void)t.sum().item<double>();
  }
}

// What one rank measured, by StepKind::key (or kBaseKeys) and name.
using Measures = std::map<std::string, double>;
using RankMeasures = std::map<std::string, Measures>;

// Time and bytes of a sharded base's gathers, while they hold up the
// rank: a blocking gather, the start of an overlapped one and the wait
// for it.
struct GatherClock {
  double seconds = 0;
  double bytes = 0;  // Of the buffers filled.
};

// BaseShardingOver(dist), timed on `clock`; without the overlap when not
// `overlapped`.
BaseSharding TimedSharding(DistContext& dist, bool overlapped,
                           GatherClock* clock) {
  BaseSharding sharding = BaseShardingOver(dist);
  auto timed = [clock](auto&& run) {
    const auto start = BenchClock::now();
    run();
    clock->seconds += SecondsSince(start);
  };
  sharding.all_gather = [gather = sharding.all_gather, clock, timed](
                            const torch::Tensor& shard, torch::Tensor& full) {
    clock->bytes += static_cast<double>(full.nbytes());
    timed([&] { gather(shard, full); });
  };
  if (!overlapped) {
    sharding.start_all_gather = nullptr;
    return sharding;
  }
  sharding.start_all_gather = [start = sharding.start_all_gather, clock, timed](
                                  const torch::Tensor& shard,
                                  torch::Tensor& full) {
    clock->bytes += static_cast<double>(full.nbytes());
    std::function<void()> wait;
    timed([&] { wait = start(shard, full); });
    return std::function<void()>([wait, timed] { timed(wait); });
  };
  return sharding;
}

// The base loaded as `sharding` says (unset: whole), with the growth of
// the resident set across the load and after every weight was read once.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadMeasured(
    const std::string& model_dir, std::optional<BaseSharding> sharding,
    std::optional<torch::ScalarType> dtype, DistContext& dist, Measures& m) {
  // Freed memory goes back to the system first, so that the load's growth
  // is not served from it.
  malloc_trim(0);
  LORAPLEX_RETURN_IF_ERROR(dist.Barrier());
  const Resident before = ReadResident();
  ModelLoadOptions options;
  options.dtype = dtype;
  options.shard_base = std::move(sharding);
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                            LlamaModel::Load(model_dir, options));
  // What the loading freed is not the model's: without the trim, the
  // allocator keeps its temporaries resident (the second load's growth
  // would count them, the first's not).
  malloc_trim(0);
  const Resident loaded = ReadResident();
  ReadEveryFrozenWeight(*model);
  const Resident read = ReadResident();
  m["frozen_bytes"] = static_cast<double>(model->FrozenWeightBytes());
  m["rss_load"] = loaded.total - before.total;
  m["rss_read"] = read.total - before.total;
  m["rss_read_anon"] = read.anon - before.anon;
  m["rss_read_file"] = read.file - before.file;
  if (const ShardedBase* base = model->sharded_base(); base != nullptr) {
    m["whole_layer_bytes"] = static_cast<double>(base->WholeLayerBytes());
    m["layers"] = static_cast<double>(base->num_layers());
  }
  return model;
}

// One kind of step's slots training on `model`: its own pool of the same
// jobs with the same data, data parallel over `dist`.
class BenchTrainer {
 public:
  BenchTrainer(const BenchOptions& options, DistContext& dist,
               const LlamaModel& model, bool checkpoint_every_layer)
      : model_(model),
        dp_(&dist),
        pool_(model.config(), {.capacity = options.slots,
                               .dtype = model.dtype(),
                               .claims = &dp_}),
        options_(options) {
    if (checkpoint_every_layer) {
      step_options_.checkpointing.mode = CheckpointMode::kEvery;
      step_options_.checkpointing.every = 1;
    }
  }

  absl::Status Attach() {
    torch::manual_seed(1);  // The same data on every rank.
    auto data = RandomSequences(8 * options_.batch, options_.seq_len,
                                model_.config().vocab_size);
    for (int i = 0; i < options_.slots; ++i) {
      SlotAttachRequest request;
      request.job_id = absl::StrCat("bench-", i);
      request.lora.rank = 16;
      request.lora.alpha = 32;
      request.optimizer.family = OptimizerFamily::kAdamW;
      request.optimizer.lr = 1e-4;
      request.schedule.kind = LrScheduleKind::kConstant;
      request.training.batch_size = options_.batch;
      request.training.seq_len = options_.seq_len;
      request.training.max_steps = int64_t{1} << 30;
      request.training.seed = static_cast<uint64_t>(i);
      request.data = data;
      LORAPLEX_RETURN_IF_ERROR(pool_.Attach(request).status());
    }
    sync_ = dp_.Sync(pool_);
    step_options_.sync = &sync_;
    return absl::OkStatus();
  }

  // One step, timed.
  absl::Status Step() {
    const auto start = BenchClock::now();
    LORAPLEX_RETURN_IF_ERROR(
        TrainCoBatchStep(model_, pool_.ActiveSlots(), step_options_).status());
    seconds_.push_back(SecondsSince(start));
    return absl::OkStatus();
  }
  void ForgetTimes() { seconds_.clear(); }
  double MedianSeconds() const { return Median(seconds_); }

 private:
  const LlamaModel& model_;
  DataParallelSlots dp_;
  SlotPool pool_;  // After dp_, which its claims point at.
  const BenchOptions& options_;
  StepSync sync_;
  CoBatchOptions step_options_;
  std::vector<double> seconds_;
};

// Loads the base the three ways, then times the kinds of steps in turns
// (step i of each before step i + 1 of any), so that what else runs on
// the machine slows them alike.
absl::StatusOr<RankMeasures> MeasureRank(const BenchOptions& options,
                                         DistContext& dist,
                                         const std::string& model_dir) {
  RankMeasures m;
  const std::optional<torch::ScalarType> dtype = ComputeDtype(options);
  GatherClock clocks[3];  // By Base.
  std::unique_ptr<LlamaModel> models[3];
  // A first load pages in the code that loading and reading run, which
  // would otherwise count as the first measured load's file pages.
  LORAPLEX_RETURN_IF_ERROR(LoadMeasured(model_dir,
                                        TimedSharding(dist, true, &clocks[0]),
                                        dtype, dist, m["warm-up"])
                               .status());
  m.erase("warm-up");
  for (Base base : {Base::kWhole, Base::kSharded, Base::kOverlapped}) {
    const int b = static_cast<int>(base);
    std::optional<BaseSharding> sharding;
    if (base != Base::kWhole) {
      sharding = TimedSharding(dist, base == Base::kOverlapped, &clocks[b]);
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        models[b], LoadMeasured(model_dir, std::move(sharding), dtype, dist,
                                m[kBaseKeys[b]]));
  }
  std::vector<std::unique_ptr<BenchTrainer>> trainers;
  for (const StepKind& kind : kStepKinds) {
    trainers.push_back(std::make_unique<BenchTrainer>(
        options, dist, *models[static_cast<int>(kind.base)],
        kind.checkpoint_every_layer));
    LORAPLEX_RETURN_IF_ERROR(trainers.back()->Attach());
  }
  int64_t gathers[3] = {};
  int64_t prefetched[3] = {};
  for (int i = -1; i < options.steps; ++i) {  // -1: the warm-up.
    for (auto& trainer : trainers) LORAPLEX_RETURN_IF_ERROR(trainer->Step());
    if (i >= 0) continue;
    for (auto& trainer : trainers) trainer->ForgetTimes();
    for (int b = 0; b < 3; ++b) {
      clocks[b] = {};
      if (const ShardedBase* base = models[b]->sharded_base()) {
        gathers[b] = base->gathers();
        prefetched[b] = base->prefetched_gathers();
      }
    }
  }
  for (size_t k = 0; k < trainers.size(); ++k) {
    m[kStepKinds[k].key]["step_s"] = trainers[k]->MedianSeconds();
  }
  for (int b = 1; b < 3; ++b) {
    const ShardedBase& base = *models[b]->sharded_base();
    Measures& out = m[kBaseKeys[b]];
    out["gather_s"] = clocks[b].seconds / options.steps;
    out["gathered_bytes"] = clocks[b].bytes / options.steps;
    out["prefetched"] =
        static_cast<double>(base.prefetched_gathers() - prefetched[b]) /
        static_cast<double>(base.gathers() - gathers[b]);
  }
  return m;
}

absl::Status RunRank(const BenchOptions& options, const std::string& run_dir) {
  LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
  LORAPLEX_ASSIGN_OR_RETURN(DistContext dist,
                            DistContext::Create(env, torch::kCPU));
  LORAPLEX_ASSIGN_OR_RETURN(RankMeasures mine,
                            MeasureRank(options, dist, run_dir + "/model"));
  const std::string path =
      absl::StrCat(run_dir, "/report-", dist.world_size(), "-", dist.rank());
  std::ofstream out(path);
  out.precision(17);
  for (const auto& [kind, measures] : mine) {
    for (const auto& [key, value] : measures) {
      out << kind << ' ' << key << ' ' << value << '\n';
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  // Rank 0 hosts the store: nobody leaves before everyone is done with it.
  return dist.Barrier();
}

// ---------------------------------------------------------------------------
// The parent.

// One process count's reports: [kind][rank][key].
using Report = std::map<std::string, std::map<int, Measures>>;

absl::StatusOr<Report> ReadReports(const std::string& run_dir, int world_size) {
  Report report;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string path =
        absl::StrCat(run_dir, "/report-", world_size, "-", rank);
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("no report at ", path));
    std::string kind;
    std::string key;
    double value = 0;
    while (in >> kind >> key >> value) report[kind][rank][key] = value;
  }
  return report;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts `world_size` ranks of this program (argv as given) and waits for
// them. A rank that fails makes the others fail within the collective
// timeout; any still running after that are killed.
absl::Status RunRanks(char** argv, const std::string& run_dir, int world_size) {
  const int port = FreePort();
  if (port <= 0) return absl::UnavailableError("no free port on 127.0.0.1");
  // The caller's collective timeout, else ours (the ranks validate it).
  const char* timeout_set = std::getenv("LORAPLEX_DIST_TIMEOUT_SECONDS");
  const int timeout_seconds = timeout_set != nullptr
                                  ? std::atoi(timeout_set)
                                  : kDefaultDistTimeoutSeconds;
  const std::vector<std::string> inherited =
      InheritedEnvironment({"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                            "MASTER_PORT", kRunDirVar});
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> extra = {absl::StrCat(kRunDirVar, "=", run_dir)};
    if (timeout_set == nullptr) {
      extra.push_back(
          absl::StrCat("LORAPLEX_DIST_TIMEOUT_SECONDS=", timeout_seconds));
    }
    const pid_t pid = StartRank(argv, inherited, rank, world_size, port, extra);
    if (pid < 0) {
      for (pid_t started : pids) kill(started, SIGKILL);
      return absl::InternalError("fork failed");
    }
    pids.push_back(pid);
  }
  // Every rank's exit: its code, 128 + signal, or -1 still running.
  std::vector<int> exits(pids.size(), -1);
  std::optional<BenchClock::time_point> first_failure;
  size_t running = pids.size();
  while (running > 0) {
    for (size_t k = 0; k < pids.size(); ++k) {
      int status = 0;
      if (exits[k] != -1 || waitpid(pids[k], &status, WNOHANG) != pids[k]) {
        continue;
      }
      exits[k] =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      --running;
      if (exits[k] != 0 && !first_failure) first_failure = BenchClock::now();
    }
    if (running > 0 && first_failure &&
        SecondsSince(*first_failure) > timeout_seconds + 30) {
      for (size_t k = 0; k < pids.size(); ++k) {
        if (exits[k] != -1) continue;
        kill(pids[k], SIGKILL);
        waitpid(pids[k], nullptr, 0);
        exits[k] = 128 + SIGKILL;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string failures;
  for (int rank = 0; rank < world_size; ++rank) {
    if (exits[rank] == 0) continue;
    const std::string error =
        ReadFile(absl::StrCat(run_dir, "/error-", world_size, "-", rank));
    absl::StrAppend(&failures, "\n  rank ", rank, " of ", world_size,
                    " exited with ", exits[rank],
                    error.empty() ? "" : ": " + error);
  }
  if (!failures.empty()) return absl::InternalError(failures);
  return absl::OkStatus();
}

double Mib(double bytes) { return bytes / (1 << 20); }

// The 1-minute load average: other work on the machine shows in the times.
std::string LoadAverage() {
  std::string text = ReadFile("/proc/loadavg");
  return text.substr(0, text.find(' '));
}

// The most any rank measured of `key`.
double MostOfRanks(const Report& report, const std::string& kind,
                   const std::string& key) {
  double most = 0;
  for (const auto& [rank, measures] : report.at(kind)) {
    most = std::max(most, measures.at(key));
  }
  return most;
}

void PrintTables(const BenchOptions& options, const std::map<int, Report>& all,
                 const std::string& notes) {
  std::printf(
      "\nmodel %s%s%s; %d slots x %d rows x %d tokens per step (AdamW, "
      "LoRA rank 16), the same rows split over the ranks; median of %d "
      "steps after a warm-up; %d cores; %s\n",
      options.preset.c_str(), options.dtype.empty() ? "" : " in ",
      options.dtype.c_str(), options.slots, options.batch, options.seq_len,
      options.steps, Cores(), notes.c_str());
  std::printf(
      "\nFrozen base per rank (MiB, the most of any rank): FrozenWeightBytes "
      "whole, sharded with one gather buffer (blocking) and with two "
      "(overlap, as the server runs); ratio to whole, and expected = (whole - "
      "layers + layers/N + buffers x one layer) / whole.\nRSS: the resident "
      "set's growth across the load, and after every frozen weight was read "
      "once = anon + file pages; the gather buffers (in the bytes) are "
      "untouched until the first gather.\n\n");
  std::printf("%3s %3s | %7s | %7s %5s %5s | %7s %5s %5s | %-25s | %-25s\n",
              "N", "thr", "whole", "sharded", "ratio", "exp", "overlap",
              "ratio", "exp", "RSS whole: load, read",
              "RSS overlap: load, read");
  for (const auto& [n, report] : all) {
    const Measures& sharded = report.at("sharded").at(0);
    const double whole = MostOfRanks(report, "whole", "frozen_bytes");
    const double layers = sharded.at("whole_layer_bytes");
    auto expected = [&](int buffers) {
      return (whole - layers + layers / n +
              buffers * layers / sharded.at("layers")) /
             whole;
    };
    auto rss = [&](const std::string& kind) {
      auto most = [&](const char* key) {
        return Mib(MostOfRanks(report, kind, key));
      };
      char text[64];
      std::snprintf(text, sizeof(text), "%5.1f, %5.1f = %5.1f+%4.1f",
                    most("rss_load"), most("rss_read"), most("rss_read_anon"),
                    most("rss_read_file"));
      return std::string(text);
    };
    const double one = MostOfRanks(report, "sharded", "frozen_bytes");
    const double two = MostOfRanks(report, "overlap", "frozen_bytes");
    std::printf(
        "%3d %3d | %7.2f | %7.2f %5.3f %5.3f | %7.2f %5.3f %5.3f | %-25s | "
        "%-25s\n",
        n, options.threads, Mib(whole), Mib(one), one / whole, expected(1),
        Mib(two), two / whole, expected(2), rss("whole").c_str(),
        rss("overlap").c_str());
  }
  std::printf(
      "\nStep time (rank 0, seconds): whole; ckpt = whole with every layer "
      "recomputed in the backward, as a sharded base always is; sharded "
      "(blocking gathers); overlap. gathers: rank 0's time held up by "
      "gathers per step (blocking, overlap), the share of overlap's gathers "
      "prefetched, and the MiB its gathers filled per step.\n\n");
  std::printf("%3s %3s | %6s %6s %7s %7s | %8s %8s %8s | %7s %7s %5s %8s\n",
              "N", "thr", "whole", "ckpt", "sharded", "overlap", "sh/whole",
              "ov/whole", "ov/ckpt", "g block", "g over", "pref", "MiB/step");
  for (const auto& [n, report] : all) {
    auto at = [&](const char* kind, const char* key) {
      return report.at(kind).at(0).at(key);
    };
    const double whole = at("whole", "step_s");
    std::printf(
        "%3d %3d | %6.3f %6.3f %7.3f %7.3f | %8.3f %8.3f %8.3f | %7.3f %7.3f "
        "%5.2f %8.1f\n",
        n, options.threads, whole, at("ckpt", "step_s"),
        at("sharded", "step_s"), at("overlap", "step_s"),
        at("sharded", "step_s") / whole, at("overlap", "step_s") / whole,
        at("overlap", "step_s") / at("ckpt", "step_s"),
        at("sharded", "gather_s"), at("overlap", "gather_s"),
        at("overlap", "prefetched"), Mib(at("overlap", "gathered_bytes")));
  }
}

absl::Status RunAll(const BenchOptions& options, char** argv) {
  const std::string run_dir =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("loraplex-bench-shard-base-", getpid()))
          .string();
  LORAPLEX_RETURN_IF_ERROR(
      WritePresetModel(options.preset, 7, run_dir + "/model"));
  std::string notes = absl::StrCat(options.threads,
                                   " LibTorch thread(s) per rank; load "
                                   "average before ",
                                   LoadAverage());
  std::map<int, Report> all;
  absl::Status status;
  for (int n : options.processes) {
    if (n * options.threads > Cores()) {
      absl::StrAppend(&notes, "; N=", n, " runs ", n * options.threads,
                      " threads on ", Cores(),
                      " cores (oversubscribed: its times are pessimistic)");
    }
    std::fprintf(stderr, "running %d process(es)...\n", n);
    const auto start = BenchClock::now();
    status = RunRanks(argv, run_dir, n);
    if (!status.ok()) {
      status = absl::InternalError(
          absl::StrCat(n, " processes failed:", status.message()));
      break;
    }
    absl::StatusOr<Report> report = ReadReports(run_dir, n);
    if (!report.ok()) {
      status = report.status();
      break;
    }
    all[n] = *std::move(report);
    std::fprintf(stderr, "  done in %.1f s\n", SecondsSince(start));
  }
  std::filesystem::remove_all(run_dir);
  LORAPLEX_RETURN_IF_ERROR(status);
  absl::StrAppend(&notes, ", after ", LoadAverage());
  PrintTables(options, all, notes);
  return absl::OkStatus();
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  loraplex::ReexecWithPassiveOpenMpWait(argv);
  loraplex::BenchOptions options;
  CLI::App app{
      "Per-rank frozen base bytes and step time, whole and "
      "sharded, over 1, 2 and 4 processes (started by this program)."};
  app.add_option("--preset", options.preset, "tiny, small or tiny-moe")
      ->capture_default_str();
  app.add_option("--steps", options.steps, "timed steps after a warm-up")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--slots", options.slots)
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--batch", options.batch, "rows per slot and step")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--seq-len", options.seq_len)
      ->check(CLI::Range(2, 1 << 16))
      ->capture_default_str();
  app.add_option("--threads", options.threads, "LibTorch threads per rank")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--processes", options.processes,
                 "process counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--dtype", options.dtype,
                 "compute dtype (default: the checkpoint's, fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  CLI11_PARSE(app, argc, argv);

  if (const char* run_dir = std::getenv(loraplex::kRunDirVar)) {
    // A rank.
    const char* world = std::getenv("WORLD_SIZE");
    const int world_size = world == nullptr ? 1 : std::atoi(world);
    torch::set_num_threads(options.threads);
    absl::Status status = loraplex::RunRank(options, run_dir);
    if (!status.ok()) {
      const char* rank = std::getenv("RANK");
      std::ofstream(absl::StrCat(run_dir, "/error-", world_size, "-",
                                 rank == nullptr ? "0" : rank))
          << status.ToString();
      std::cerr << "[rank " << (rank == nullptr ? "0" : rank) << " of "
                << world_size << "] " << status << "\n";
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(status.ok() ? 0 : 1);
  }
  absl::Status status = loraplex::RunAll(options, argv);
  if (!status.ok()) {
    std::cerr << "loraplex-bench-shard-base: " << status << "\n";
    return 1;
  }
  return 0;
}
