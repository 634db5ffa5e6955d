// Training sessions' forward/backward calls and optimizer steps run data
// parallel over real ranks (Gloo over 127.0.0.1, 2 and 3 processes), over
// a whole base and over a base sharded across the same ranks, equal to one
// process in fp64 (docs/DESIGN.md §6, §12, §18): each datum of a call runs on
// one rank, every rank gets every call's complete outputs, StepAccumulated
// sums the ranks' partial gradients, clips on the whole gradient, and the
// owners step and broadcast. Each rank compares itself after every call and
// every step with the same sequence run on its own (the whole base, no
// sync). Each test re-executes this binary once per rank with that rank's
// launch variables and a scenario name; such a process runs the scenario
// and exits (kRanAsWorker).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/data_parallel_slots.h"
#include "core/common/status_macros.h"
#include "core/dist/base_sharding.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/tokenizer/tokenizer.h"
#include "core/train/co_batch_step.h"
#include "core/train/loss_fn.h"
#include "tests/common/rank_launcher.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

constexpr char kScenarioVar[] = "LORAPLEX_SESSION_CALLS_TEST_SCENARIO";
constexpr int64_t kBucketBytes = 16 << 10;
// Rows regrouped over the ranks and partial sums added in another order
// change fp64 results by ~1e-13; a datum run twice, lost or misplaced
// changes them by far more than this.
constexpr double kBound = kFp64IdentityBound;

absl::Status Expect(bool condition, const std::string& what) {
  if (condition) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("check failed: ", what));
}

// ------------------------------------------------------------------ data

LossFnSpec Loss(const char* name) { return *LossFnSpecOf(name, {}); }

// Datums of `lengths` (k targets per position) for `loss`: random tokens;
// cross_entropy weights of both signs with every third one zero (and datum
// `zero_datum` weighted zero throughout); the RL losses' sampler logprobs
// near the tiny model's (so ratios fall on both sides of ppo's clip bounds)
// and advantages of both signs.
std::vector<Datum> MakeData(const LossFnSpec& loss,
                            const std::vector<int>& lengths, uint32_t seed,
                            int64_t k = 1, int zero_datum = -1) {
  std::mt19937 rng(seed);
  const int64_t vocab = ByteTokenizer::kVocabSize;  // tiny's.
  auto uniform = [&] { return static_cast<double>(rng() % 1000) / 1000.0; };
  std::vector<Datum> data;
  for (size_t d = 0; d < lengths.size(); ++d) {
    Datum datum;
    datum.targets_per_position = k;
    for (int i = 0; i < lengths[d]; ++i) {
      datum.input_ids.push_back(static_cast<int64_t>(rng() % vocab));
      for (int64_t j = 0; j < k; ++j) {
        datum.target_tokens.push_back(static_cast<int64_t>(rng() % vocab));
        if (LossFnTakesWeights(loss.fn)) {
          const bool zero = static_cast<int>(d) == zero_datum || i % 3 == 2;
          datum.weights.push_back(zero ? 0.0 : uniform() - 0.3);
        }
      }
      if (LossFnTakesSamplerInputs(loss.fn)) {
        datum.sampler_logprobs.push_back(-5.5 + 0.6 * (uniform() - 0.5));
        datum.advantages.push_back(1.0 - 2.0 * uniform());
      }
    }
    data.push_back(std::move(datum));
  }
  return data;
}

// ----------------------------------------------------------- the two runs

enum SessionIndex { kBaseAlone = -1, kAdamWSession = 0, kMuonSession = 1 };

// One run of the sequence: a pool holding (optionally) a job and the two
// sessions' slots, on a model, data parallel or alone.
struct Run {
  const LlamaModel* model = nullptr;
  std::unique_ptr<SlotPool> pool;
  StepSync sync;
  CoBatchOptions options;  // options.sync nullptr: one process.
  int job = -1;
  int sessions[2] = {-1, -1};

  TrainingSlot& session(int s) { return pool->slot(sessions[s]); }
};

SlotAttachRequest SessionRequest(const std::string& id, OptimizerFamily family,
                                 int64_t rank, std::vector<Projection> targets,
                                 uint64_t seed) {
  SlotAttachRequest request;  // As SessionSlots::Open builds it.
  request.job_id = "session:" + id;
  request.lora.rank = rank;
  request.lora.alpha = 2.0 * static_cast<double>(rank);
  request.lora.targets = std::move(targets);
  request.optimizer.family = family;
  request.training.seed = seed;
  request.session = true;
  return request;
}

// The same attaches in the same order on every rank (and alone), so the
// claims deal the same owners everywhere. `dp` nullptr: one process.
absl::StatusOr<std::unique_ptr<Run>> MakeRun(const LlamaModel& model,
                                             DataParallelSlots* dp,
                                             int64_t token_budget,
                                             bool with_job) {
  auto run = std::make_unique<Run>();
  run->model = &model;
  run->pool = std::make_unique<SlotPool>(
      model.config(), SlotPoolOptions{.capacity = 3,
                                      .device = model.device(),
                                      .dtype = model.dtype(),
                                      .claims = dp});
  run->options.token_budget = token_budget;
  run->options.loss_chunk_tokens = 7;
  if (dp != nullptr) {
    run->sync = dp->Sync(*run->pool);
    run->options.sync = &run->sync;
  }
  if (with_job) {
    SlotAttachRequest job =
        TrainRequest("job", OptimizerFamily::kAdamW, 4,
                     {Projection::kQ, Projection::kK, Projection::kDown},
                     Sequences(ReversalJsonl(12, 3), 16), 1);
    job.lora.dropout = 0.1;
    LORAPLEX_ASSIGN_OR_RETURN(run->job, run->pool->Attach(job));
  }
  SlotAttachRequest adamw = SessionRequest(
      "adamw", OptimizerFamily::kAdamW, 4,
      {Projection::kQ, Projection::kK, Projection::kV, Projection::kO,
       Projection::kGate, Projection::kUp, Projection::kDown},
      11);
  adamw.lora.dropout = 0.1;  // Masks by the call's row, whichever rank.
  LORAPLEX_ASSIGN_OR_RETURN(run->sessions[kAdamWSession],
                            run->pool->Attach(adamw));
  LORAPLEX_ASSIGN_OR_RETURN(
      run->sessions[kMuonSession],
      run->pool->Attach(SessionRequest(
          "muon", OptimizerFamily::kMuon, 8,
          {Projection::kQ, Projection::kV, Projection::kO, Projection::kLmHead},
          12)));
  // B is zero after PEFT's init: nonzero B makes the adapters change the
  // logprobs and gives A gradients from the first call.
  RandomizeB(run->session(kAdamWSession).weights, 21, 0.05);
  RandomizeB(run->session(kMuonSession).weights, 22, 0.05);
  return run;
}

struct CallSpec {
  int session = kBaseAlone;  // SessionIndex.
  const std::vector<Datum>* data = nullptr;
  LossFnSpec loss;
  bool backward = true;
  uint64_t dropout_seed = 0;
};

absl::StatusOr<CoBatchResult> RunPass(Run& run, bool with_job,
                                      const std::vector<CallSpec>& specs) {
  std::vector<ForwardBackwardCall> calls;
  for (const CallSpec& spec : specs) {
    ForwardBackwardCall call;  // As SessionSlots::PassOf builds it.
    call.adapter = spec.session == kBaseAlone
                       ? nullptr
                       : &run.session(spec.session).weights;
    call.data = spec.data;
    call.loss = spec.loss;
    call.backward = spec.backward;
    call.dropout_seed = spec.dropout_seed;
    calls.push_back(call);
  }
  std::vector<TrainingSlot*> slots;
  if (with_job) slots = run.pool->ActiveSlots();
  return RunCoBatchPass(*run.model, slots, calls, run.options);
}

// This rank's run and its one-process reference (the whole base), step
// by step.
struct Runs {
  DistContext* dist;
  std::unique_ptr<Run> parallel;
  std::unique_ptr<Run> alone;
};

absl::StatusOr<Runs> MakeRuns(DistContext& dist, DataParallelSlots& dp,
                              const LlamaModel& model, const LlamaModel& whole,
                              int64_t token_budget, bool with_job) {
  Runs runs{&dist, nullptr, nullptr};
  LORAPLEX_ASSIGN_OR_RETURN(runs.parallel,
                            MakeRun(model, &dp, token_budget, with_job));
  LORAPLEX_ASSIGN_OR_RETURN(runs.alone,
                            MakeRun(whole, nullptr, token_budget, with_job));
  return runs;
}

// A call's outputs against one process's. Catches: a datum's logprobs
// placed at another datum (other lengths and values); a datum this rank
// did not run left empty or zero (outputs not gathered from its rank); a
// datum run on two ranks and both counted (loss); a rank's share of the
// input tokens reported as the call's.
absl::Status ExpectSameOutput(const ForwardBackwardOutput& got,
                              const ForwardBackwardOutput& want,
                              const std::string& what) {
  LORAPLEX_RETURN_IF_ERROR(Expect(
      got.tokens == want.tokens && got.logprobs.size() == want.logprobs.size(),
      absl::StrCat(what, ": ", got.tokens, " tokens, ", got.logprobs.size(),
                   " datums' logprobs vs ", want.tokens, ", ",
                   want.logprobs.size())));
  for (size_t d = 0; d < want.logprobs.size(); ++d) {
    const std::vector<double>& g = got.logprobs[d];
    const std::vector<double>& w = want.logprobs[d];
    LORAPLEX_RETURN_IF_ERROR(
        Expect(g.size() == w.size(),
               absl::StrCat(what, ": datum ", d, " has ", g.size(),
                            " logprobs vs ", w.size())));
    double diff = 0.0;
    for (size_t i = 0; i < w.size(); ++i) {
      diff = std::max(diff, std::abs(g[i] - w[i]));
    }
    LORAPLEX_RETURN_IF_ERROR(Expect(
        diff <= kBound,
        absl::StrCat(what, ": datum ", d, "'s logprobs differ by ", diff)));
  }
  return Expect(std::abs(got.loss - want.loss) <=
                    kBound * std::max(1.0, std::abs(want.loss)),
                absl::StrCat(what, ": loss ", got.loss, " vs ", want.loss));
}

// A pass on both runs; every call's outputs and the job's step compared.
absl::Status Pass(Runs& runs, bool with_job, const std::vector<CallSpec>& specs,
                  const std::string& what) {
  absl::StatusOr<CoBatchResult> got = RunPass(*runs.parallel, with_job, specs);
  if (!got.ok()) {
    return absl::Status(
        got.status().code(),
        absl::StrCat(what, " on the ranks: ", got.status().message()));
  }
  LORAPLEX_ASSIGN_OR_RETURN(CoBatchResult want,
                            RunPass(*runs.alone, with_job, specs));
  LORAPLEX_RETURN_IF_ERROR(Expect(
      got->calls.size() == specs.size() && want.calls.size() == specs.size() &&
          got->slots.size() == want.slots.size(),
      absl::StrCat(what, ": ", got->calls.size(), " call outputs for ",
                   specs.size(), " calls, ", got->slots.size(), " slots'")));
  for (size_t c = 0; c < specs.size(); ++c) {
    LORAPLEX_RETURN_IF_ERROR(ExpectSameOutput(got->calls[c], want.calls[c],
                                              absl::StrCat(what, " call ", c)));
  }
  // The job's rows take the first turns: a call's rows shifted onto the
  // job's turns, or the job's loss normalised by this rank's share only,
  // change its loss and grad norm.
  for (size_t i = 0; i < want.slots.size(); ++i) {
    const SlotStepMetrics& g = got->slots[i];
    const SlotStepMetrics& w = want.slots[i];
    LORAPLEX_RETURN_IF_ERROR(
        Expect(g.skipped == w.skipped &&
                   std::abs(g.loss - w.loss) <= kBound * std::abs(w.loss) &&
                   std::abs(g.grad_norm - w.grad_norm) <= kBound * w.grad_norm,
               absl::StrCat(what, ": the job's loss ", g.loss, " vs ", w.loss,
                            ", grad norm ", g.grad_norm, " vs ", w.grad_norm)));
  }
  return absl::OkStatus();
}

std::vector<torch::Tensor> Grads(const LoraWeights& weights) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : weights.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().detach().clone()
                                       : torch::zeros_like(p));
  }
  return grads;
}

// Collective. The ranks' accumulated gradients of a session add up to one
// process's: a datum run on two ranks (counted twice), gradients summed
// over the ranks at each pass (then every rank holds the whole, and the
// sum is world-size times it) or a datum's gradient lost all fail it.
// With `partial`, no rank holds the whole gradient either (each ran only
// its share of the rows).
absl::Status ExpectGradsAddUp(Runs& runs, int session, bool partial,
                              const std::string& what) {
  const std::vector<torch::Tensor> local =
      Grads(runs.parallel->session(session).weights);
  std::vector<torch::Tensor> summed;
  for (const torch::Tensor& g : local) summed.push_back(g.clone());
  LORAPLEX_RETURN_IF_ERROR(runs.dist->AllReduceSum(summed, kBucketBytes));
  const std::vector<torch::Tensor> want =
      Grads(runs.alone->session(session).weights);
  const double diff = MaxRelativeDiff(summed, want);
  LORAPLEX_RETURN_IF_ERROR(Expect(
      diff <= kBound, absl::StrCat(what, ": the ranks' gradients add up to ",
                                   diff, " off one process's")));
  if (!partial) return absl::OkStatus();
  return Expect(MaxRelativeDiff(local, want) > 1e-3,
                absl::StrCat(what, ": rank ", runs.dist->rank(),
                             " holds the whole gradient"));
}

// StepAccumulated on both runs; returns one process's metrics. Compared:
// whether it skipped and why, the gradient norm (a norm of this rank's
// partial gradient, or of a sum that counted a rank twice, is off) and,
// per parameter, the weights after it (an owner stepping on its partial
// gradient, clipping on a partial norm, a parameter no owner stepped or
// broadcast).
absl::StatusOr<SlotStepMetrics> Step(Runs& runs, int session,
                                     const OptimizerConfig& config, double clip,
                                     const std::string& what) {
  TrainingSlot& parallel = runs.parallel->session(session);
  TrainingSlot& alone = runs.alone->session(session);
  const std::vector<torch::Tensor> before = Snapshot(parallel.weights);
  absl::StatusOr<SlotStepMetrics> got =
      StepAccumulated(parallel, config, clip, runs.parallel->options.sync);
  if (!got.ok()) {
    return absl::Status(
        got.status().code(),
        absl::StrCat(what, " on the ranks: ", got.status().message()));
  }
  LORAPLEX_ASSIGN_OR_RETURN(SlotStepMetrics want,
                            StepAccumulated(alone, config, clip));
  LORAPLEX_RETURN_IF_ERROR(Expect(
      got->skipped == want.skipped && got->skip_reason == want.skip_reason &&
          std::abs(got->grad_norm - want.grad_norm) <= kBound * want.grad_norm,
      absl::StrCat(what, ": skipped ", got->skipped, " (", got->skip_reason,
                   "), grad norm ", got->grad_norm, " vs ", want.skipped, " (",
                   want.skip_reason, "), ", want.grad_norm)));
  const std::vector<torch::Tensor> after = Snapshot(parallel.weights);
  const std::vector<torch::Tensor> expected = Snapshot(alone.weights);
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff = MaxRelativeDiff(after[i], expected[i]);
    LORAPLEX_RETURN_IF_ERROR(Expect(
        diff <= kBound, absl::StrCat(what, ": parameter ", i, " differs by ",
                                     diff, " of its largest element")));
    // A skipped step leaves every weight as it was, bit for bit.
    LORAPLEX_RETURN_IF_ERROR(Expect(
        !want.skipped || torch::equal(after[i], before[i]),
        absl::StrCat(what, ": parameter ", i, " moved in a skipped step")));
  }
  // A step drops the gradients (summed or not): left over, they would be
  // added again at the next step, and a step without calls would not skip.
  for (const torch::Tensor& p : parallel.weights.parameters()) {
    LORAPLEX_RETURN_IF_ERROR(Expect(
        !p.grad().defined(), absl::StrCat(what, ": a gradient is left")));
  }
  LORAPLEX_RETURN_IF_ERROR(Expect(
      parallel.counters.steps == alone.counters.steps &&
          parallel.counters.skipped_steps == alone.counters.skipped_steps,
      absl::StrCat(what, ": counted ", parallel.counters.steps, " steps (",
                   parallel.counters.skipped_steps, " skipped) vs ",
                   alone.counters.steps, " (", alone.counters.skipped_steps,
                   ")")));
  return want;
}

// Collective: every rank has rank 0's `value`.
absl::Status ExpectSameOnEveryRank(DistContext& dist, const std::string& value,
                                   const std::string& what) {
  std::string root = value;
  LORAPLEX_RETURN_IF_ERROR(dist.Broadcast(&root, 0));
  return Expect(root == value,
                absl::StrCat(what, ": rank ", dist.rank(), " has \"", value,
                             "\", rank 0 \"", root, "\""));
}

// A session's optimizer holds only the parameters this rank owns (one
// owner's state, not every rank's), and every parameter has an owner.
absl::Status ExpectOwnedOnly(Runs& runs, DataParallelSlots& dp, int session) {
  const TrainingSlot& slot = runs.parallel->session(session);
  const std::vector<int> owners = dp.owners(runs.parallel->sessions[session]);
  const size_t owned = static_cast<size_t>(
      std::count(owners.begin(), owners.end(), runs.dist->rank()));
  return Expect(
      owners.size() == slot.weights.parameters().size() &&
          slot.optimizer->parameters().size() == owned,
      absl::StrCat("session ", session, ": ", owners.size(), " owners, ",
                   slot.optimizer->parameters().size(),
                   " parameters in its optimizer, ", owned, " owned"));
}

OptimizerConfig AdamW(double lr, double beta1, double weight_decay) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kAdamW;
  config.lr = lr;
  config.beta1 = beta1;
  config.beta2 = 0.95;
  config.weight_decay = weight_decay;
  return config;
}

OptimizerConfig Muon(double lr) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kMuon;
  config.lr = lr;
  config.weight_decay = 0.01;
  return config;
}

// -------------------------------------------------------------- scenarios

// Two sessions (AdamW with dropout, Muon with an LM-head target) driven by
// forward_backward calls that accumulate, forward-only calls, ppo,
// importance_sampling and cispo calls and steps with clipping, four
// passes co-batched with a job's step. Calls of 5, 4, 2 and 1 datums (5
// and 1 are no multiple of 2 or 3 ranks; with one datum, other ranks have
// no row of the call) of different lengths.
absl::Status CallsScenario(DistContext& dist, const LlamaModel& model,
                           const LlamaModel& whole) {
  DataParallelSlots dp(&dist, kBucketBytes);
  LORAPLEX_ASSIGN_OR_RETURN(
      Runs runs, MakeRuns(dist, dp, model, whole, 48, /*with_job=*/true));
  LORAPLEX_RETURN_IF_ERROR(ExpectOwnedOnly(runs, dp, kAdamWSession));
  LORAPLEX_RETURN_IF_ERROR(ExpectOwnedOnly(runs, dp, kMuonSession));

  const LossFnSpec ce = Loss("cross_entropy");
  const LossFnSpec ppo = Loss("ppo");
  const LossFnSpec is = Loss("importance_sampling");
  const LossFnSpec cispo = Loss("cispo");
  // Datum 2 weighted zero throughout: its logprobs are still returned.
  const std::vector<Datum> ce5 = MakeData(ce, {7, 12, 3, 15, 9}, 31, /*k=*/1,
                                          /*zero_datum=*/2);
  const std::vector<Datum> ppo5 = MakeData(ppo, {10, 4, 13, 6, 8}, 32);
  const std::vector<Datum> ce1 = MakeData(ce, {11}, 33);
  const std::vector<Datum> is5 = MakeData(is, {5, 9, 14, 3, 8}, 34);
  const std::vector<Datum> is4 = MakeData(is, {6, 13, 2, 9}, 35);
  const std::vector<Datum> top2 = MakeData(ce, {8, 5}, 36, /*k=*/2);
  const std::vector<Datum> ce5_forward = MakeData(ce, {4, 10, 7, 12, 6}, 37);
  const std::vector<Datum> ppo1 = MakeData(ppo, {9}, 38);
  const std::vector<Datum> cispo3 = MakeData(cispo, {11, 5, 8}, 39);

  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/true,
                                {{kAdamWSession, &ce5, ce, true, 101},
                                 {kMuonSession, &ppo5, ppo, true, 102}},
                                "pass 1"));
  // The AdamW session's gradients accumulate over passes 1 to 3.
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce1, ce, true, 103},
                                 {kMuonSession, &is5, is, false, 104}},
                                "pass 2"));
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/true,
                                {{kAdamWSession, &is4, is, true, 105},
                                 {kMuonSession, &top2, ce, true, 106}},
                                "pass 3"));
  LORAPLEX_RETURN_IF_ERROR(
      ExpectGradsAddUp(runs, kAdamWSession, /*partial=*/true, "adamw, pass 3"));
  LORAPLEX_RETURN_IF_ERROR(
      ExpectGradsAddUp(runs, kMuonSession, /*partial=*/true, "muon, pass 3"));
  constexpr double kClip = 0.05;
  LORAPLEX_ASSIGN_OR_RETURN(
      SlotStepMetrics first,
      Step(runs, kAdamWSession, AdamW(1e-2, 0.9, 0.01), kClip, "adamw step 1"));
  // The norm before clipping is above the bound: the step clips.
  LORAPLEX_RETURN_IF_ERROR(
      Expect(!first.skipped && first.grad_norm > kClip,
             absl::StrCat("adamw step 1 clips: grad norm ", first.grad_norm)));
  LORAPLEX_RETURN_IF_ERROR(
      Step(runs, kMuonSession, Muon(0.02), 0.0, "muon step 1").status());

  // The Muon session's one datum runs on one rank: the others have no
  // gradient of it, yet step (its owners) on the sum.
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce5_forward, ce, false, 107},
                                 {kMuonSession, &ppo1, ppo, true, 108}},
                                "pass 4"));
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/true,
                                {{kAdamWSession, &cispo3, cispo, true, 109},
                                 {kBaseAlone, &ce1, ce, false, 110}},
                                "pass 5"));
  LORAPLEX_RETURN_IF_ERROR(ExpectGradsAddUp(
      runs, kAdamWSession, /*partial=*/false, "adamw, pass 5"));
  LORAPLEX_RETURN_IF_ERROR(
      ExpectGradsAddUp(runs, kMuonSession, /*partial=*/false, "muon, pass 5"));
  LORAPLEX_RETURN_IF_ERROR(
      Step(runs, kAdamWSession, AdamW(5e-3, 0.8, 0.1), 1.0, "adamw step 2")
          .status());
  LORAPLEX_ASSIGN_OR_RETURN(
      SlotStepMetrics muon,
      Step(runs, kMuonSession, Muon(0.01), 0.5, "muon step 2"));
  LORAPLEX_RETURN_IF_ERROR(
      Expect(!muon.skipped, "muon step 2 steps on one rank's gradients"));
  // The stepped weights go on: another call on them equals one process.
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/true,
                                {{kAdamWSession, &ppo5, ppo, false, 111},
                                 {kMuonSession, &ce5, ce, false, 112}},
                                "pass 6"));
  // The job trained in passes 1, 3, 5 and 6 beside the calls.
  const double diff = MaxRelativeDiff(
      Snapshot(runs.parallel->pool->slot(runs.parallel->job).weights),
      Snapshot(runs.alone->pool->slot(runs.alone->job).weights));
  return Expect(diff <= kBound,
                absl::StrCat("the job differs from one process by ", diff));
}

// A step with no gradient on any rank since the last one is skipped on
// every rank, for the same reason, and changes no weight: right after
// attach, after a pass of forward-only calls alone, and after a step. One
// datum's gradient on one rank is enough for every rank to step.
absl::Status SkipScenario(DistContext& dist, const LlamaModel& model,
                          const LlamaModel& whole) {
  DataParallelSlots dp(&dist, kBucketBytes);
  LORAPLEX_ASSIGN_OR_RETURN(
      Runs runs, MakeRuns(dist, dp, model, whole, 48, /*with_job=*/false));
  const LossFnSpec ce = Loss("cross_entropy");
  const LossFnSpec ppo = Loss("ppo");
  const std::vector<Datum> ce5 = MakeData(ce, {7, 12, 3, 15, 9}, 41);
  const std::vector<Datum> ppo5 = MakeData(ppo, {10, 4, 13, 6, 8}, 42);
  const std::vector<Datum> ppo1 = MakeData(ppo, {9}, 43);
  const std::string kNoGradients = "no gradients since the last step";
  auto skipped = [&](int session, const OptimizerConfig& config,
                     const std::string& what) -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(SlotStepMetrics metrics,
                              Step(runs, session, config, 1.0, what));
    LORAPLEX_RETURN_IF_ERROR(
        Expect(metrics.skipped && metrics.skip_reason == kNoGradients,
               absl::StrCat(what, " is skipped: ", metrics.skip_reason)));
    // What this rank reported, not only one process's.
    return ExpectSameOnEveryRank(
        dist,
        absl::StrCat(runs.parallel->session(session).counters.skipped_steps,
                     " skipped"),
        what);
  };
  LORAPLEX_RETURN_IF_ERROR(
      skipped(kAdamWSession, AdamW(1e-2, 0.9, 0.0), "a step before any call"));
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce5, ce, true, 201},
                                 {kMuonSession, &ppo5, ppo, false, 202}},
                                "pass 1"));
  LORAPLEX_RETURN_IF_ERROR(
      Step(runs, kAdamWSession, AdamW(1e-2, 0.9, 0.0), 1.0, "adamw step")
          .status());
  // A forward-only call leaves no gradient on any rank.
  LORAPLEX_RETURN_IF_ERROR(
      skipped(kMuonSession, Muon(0.02), "a step after forward-only calls"));
  LORAPLEX_RETURN_IF_ERROR(skipped(kAdamWSession, AdamW(1e-2, 0.9, 0.0),
                                   "a step right after a step"));
  // One datum alone in its pass: the other ranks run no row at all.
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kMuonSession, &ppo1, ppo, true, 203}},
                                "pass 2"));
  LORAPLEX_ASSIGN_OR_RETURN(
      SlotStepMetrics metrics,
      Step(runs, kMuonSession, Muon(0.02), 1.0, "muon step"));
  LORAPLEX_RETURN_IF_ERROR(
      Expect(!metrics.skipped, "one rank's gradients step every rank"));
  return skipped(kMuonSession, Muon(0.02), "a step after the muon step");
}

// Passes of forward-only calls alone (no autograd) with one row per
// micro-batch (token_budget 16, rows of 9 to 16 tokens), so the ranks run
// different numbers of micro-batches (7 rows: 4 and 3 on 2 ranks, 3, 2, 2
// on 3; then 1 row: one rank runs it, the others none). Over a sharded
// base the ranks that run fewer pad their gathers: a missing pad hangs a
// rank until the collective timeout, or pairs one pass's gathers with the
// next's. Outputs equal one process; nothing gains a gradient; a
// forward_backward call and a step afterwards still agree.
absl::Status ForwardOnlyScenario(DistContext& dist, const LlamaModel& model,
                                 const LlamaModel& whole) {
  DataParallelSlots dp(&dist, kBucketBytes);
  LORAPLEX_ASSIGN_OR_RETURN(
      Runs runs, MakeRuns(dist, dp, model, whole, 16, /*with_job=*/false));
  const LossFnSpec ce = Loss("cross_entropy");
  const LossFnSpec ppo = Loss("ppo");
  const std::vector<Datum> ce5 = MakeData(ce, {9, 16, 12, 10, 14}, 51);
  const std::vector<Datum> ppo1 = MakeData(ppo, {13}, 52);
  const std::vector<Datum> base1 = MakeData(ce, {11}, 53);
  const std::vector<torch::Tensor> adamw_before =
      Snapshot(runs.parallel->session(kAdamWSession).weights);
  const std::vector<torch::Tensor> muon_before =
      Snapshot(runs.parallel->session(kMuonSession).weights);
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce5, ce, false, 301},
                                 {kMuonSession, &ppo1, ppo, false, 302},
                                 {kBaseAlone, &base1, ce, false, 303}},
                                "pass 1"));
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kMuonSession, &ppo1, ppo, false, 304}},
                                "pass 2"));
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce5, ce, false, 305}},
                                "pass 3"));
  for (int session : {kAdamWSession, kMuonSession}) {
    const std::vector<torch::Tensor>& before =
        session == kAdamWSession ? adamw_before : muon_before;
    const std::vector<torch::Tensor> params =
        runs.parallel->session(session).weights.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      LORAPLEX_RETURN_IF_ERROR(Expect(
          !params[i].grad().defined() && torch::equal(params[i], before[i]),
          absl::StrCat("session ", session, " parameter ", i,
                       " gained a gradient or moved in forward-only passes")));
    }
  }
  if (const ShardedBase* base = model.sharded_base(); base != nullptr) {
    // Every rank gathered as many layers, whatever rows it ran.
    LORAPLEX_RETURN_IF_ERROR(
        ExpectSameOnEveryRank(dist, absl::StrCat(base->gathers(), " gathers"),
                              "gathers after forward-only passes"));
  }
  LORAPLEX_RETURN_IF_ERROR(Pass(runs, /*with_job=*/false,
                                {{kAdamWSession, &ce5, ce, true, 306},
                                 {kMuonSession, &ppo1, ppo, false, 307}},
                                "pass 4"));
  return Step(runs, kAdamWSession, AdamW(1e-2, 0.9, 0.01), 1.0, "adamw step")
      .status();
}

// "<scenario>/<whole|sharded>".
absl::Status RunWorker(const std::string& name) {
  const size_t slash = name.find('/');
  const std::string scenario = name.substr(0, slash);
  const bool sharded =
      slash != std::string::npos && name.substr(slash + 1) == "sharded";
  LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
  LORAPLEX_ASSIGN_OR_RETURN(DistContext dist,
                            DistContext::Create(env, torch::kCPU));
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/loraplex-session-calls-", getpid(), "/tiny");
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", 7, dir));
  // The reference: the whole base in this process alone.
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> whole,
                            LlamaModel::Load(dir, {.dtype = torch::kFloat64}));
  std::unique_ptr<LlamaModel> sharded_model;
  if (sharded) {
    LORAPLEX_ASSIGN_OR_RETURN(
        sharded_model,
        LlamaModel::Load(dir, {.dtype = torch::kFloat64,
                               .shard_base = BaseShardingOver(dist)}));
  }
  const LlamaModel& model = sharded ? *sharded_model : *whole;
  if (scenario == "calls") {
    LORAPLEX_RETURN_IF_ERROR(CallsScenario(dist, model, *whole));
  } else if (scenario == "skip") {
    LORAPLEX_RETURN_IF_ERROR(SkipScenario(dist, model, *whole));
  } else if (scenario == "forward_only") {
    LORAPLEX_RETURN_IF_ERROR(ForwardOnlyScenario(dist, model, *whole));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown scenario '", name, "'"));
  }
  // Rank 0 hosts the store: nobody leaves before everyone is done with it.
  return dist.Barrier();
}

[[maybe_unused]] const bool kRanAsWorker =
    RunAsRankWorker(kScenarioVar, RunWorker);

// Every rank's exit code (-1: killed after the deadline). Each rank runs
// every call and step twice (on the ranks, then alone), so one rank may
// reach a collective well after another on a loaded machine; a missing
// gather pad still fails within the timeout rather than the kill deadline.
std::vector<int> RunRanks(const std::string& scenario, int world_size) {
  return LaunchRanks({.scenario_var = kScenarioVar,
                      .scenario = scenario,
                      .world_size = world_size,
                      .ranks = {},  // All of them.
                      .timeout_seconds = 90})
      .exit_codes;
}

TEST(SessionCallsRanksTest, CallsAndStepsEqualOneProcessTwoRanks) {
  EXPECT_THAT(RunRanks("calls/whole", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest, CallsAndStepsEqualOneProcessThreeRanks) {
  EXPECT_THAT(RunRanks("calls/whole", 3), testing::Each(0));
}
TEST(SessionCallsRanksTest, CallsAndStepsOverShardedBaseTwoRanks) {
  EXPECT_THAT(RunRanks("calls/sharded", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest, CallsAndStepsOverShardedBaseThreeRanks) {
  EXPECT_THAT(RunRanks("calls/sharded", 3), testing::Each(0));
}
TEST(SessionCallsRanksTest, StepWithoutGradientsSkipsOnEveryRankTwoRanks) {
  EXPECT_THAT(RunRanks("skip/whole", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest, StepWithoutGradientsSkipsOnEveryRankThreeRanks) {
  EXPECT_THAT(RunRanks("skip/whole", 3), testing::Each(0));
}
TEST(SessionCallsRanksTest, StepWithoutGradientsSkipsOverShardedBaseTwoRanks) {
  EXPECT_THAT(RunRanks("skip/sharded", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest,
     StepWithoutGradientsSkipsOverShardedBaseThreeRanks) {
  EXPECT_THAT(RunRanks("skip/sharded", 3), testing::Each(0));
}
TEST(SessionCallsRanksTest, ForwardOnlyPassesEqualOneProcessTwoRanks) {
  EXPECT_THAT(RunRanks("forward_only/whole", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest, ForwardOnlyPassesEqualOneProcessThreeRanks) {
  EXPECT_THAT(RunRanks("forward_only/whole", 3), testing::Each(0));
}
// Ranks running different numbers of micro-batches pad their gathers.
TEST(SessionCallsRanksTest, ForwardOnlyPassesOverShardedBaseTwoRanks) {
  EXPECT_THAT(RunRanks("forward_only/sharded", 2), testing::Each(0));
}
TEST(SessionCallsRanksTest, ForwardOnlyPassesOverShardedBaseThreeRanks) {
  EXPECT_THAT(RunRanks("forward_only/sharded", 3), testing::Each(0));
}

}  // namespace
}  // namespace loraplex
