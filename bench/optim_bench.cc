// Optimizer speed on this machine, measured side by side in one run:
//
//  1. Newton–Schulz over 16 same-shape LoRA matrices: one batched (3-D)
//     call vs a loop of 16 per-matrix calls, for several LoRA shapes.
//  2. One Muon, Lion or SOAP step vs one AdamW step over the same slots'
//     LoRA parameters (all seven targets of every layer of a small model),
//     for 1 and 16 slots; SOAP with its default max_precond_dim (1024: the
//     small model's 512-wide sides are preconditioned, its 1408-wide ones
//     not), with the rank side only, and refreshed every 10 steps.
//  3. The Muon steps of 16 such slots: one StepSlotOptimizers call, whose
//     Newton–Schulz is batched across slots, vs each slot's own Step().
//
// Each comparison alternates the two contenders round by round and reports
// the ratio of their medians, so machine noise hits both alike.
//
//   build/bin/loraplex-bench-optim [--threads N] [--rounds R]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/optim/newton_schulz.h"
#include "core/optim/slot_optimizer.h"
#include "core/runtime/blas_info.h"
#include "core/runtime/device.h"

namespace {

using loraplex::TimeSideBySide;

void CompareNewtonSchulz(int64_t rows, int64_t cols, int rounds) {
  constexpr int kMatrices = 16;
  const torch::Tensor batch = torch::randn({kMatrices, rows, cols});
  loraplex::NewtonSchulzOptions options;  // quintic, 5 steps, fp32
  const auto [batched, loop] =
      TimeSideBySide([&] { loraplex::NewtonSchulz(batch, options); },
                     [&] {
                       for (int i = 0; i < kMatrices; ++i) {
                         loraplex::NewtonSchulz(batch[i], options);
                       }
                     },
                     rounds);
  std::cout << "  " << std::setw(5) << rows << " x " << std::setw(5) << cols
            << "   batched " << std::setw(8) << batched * 1e3 << " ms   loop "
            << std::setw(8) << loop * 1e3 << " ms   loop/batched "
            << std::setw(5) << loop / batched << "x\n";
}

// LoRA A (r x in) and B (out x r) for q, k, v, o, gate, up, down of each
// layer of a model with the given sizes.
std::vector<torch::Tensor> SlotLoraParameters(int64_t layers, int64_t hidden,
                                              int64_t kv, int64_t intermediate,
                                              int64_t rank) {
  const std::vector<std::pair<int64_t, int64_t>> targets = {
      {hidden, hidden},      {kv, hidden},           {kv, hidden},
      {hidden, hidden},      {intermediate, hidden}, {intermediate, hidden},
      {hidden, intermediate}};
  std::vector<torch::Tensor> params;
  for (int64_t l = 0; l < layers; ++l) {
    for (const auto& [out, in] : targets) {
      params.push_back((torch::randn({rank, in}) * 0.01).requires_grad_());
      params.push_back((torch::randn({out, rank}) * 0.01).requires_grad_());
    }
  }
  for (torch::Tensor& p : params) p.mutable_grad() = torch::randn_like(p);
  return params;
}

// Leaf copies of `params`, each with a copy of its gradient: the same step
// for a second optimizer.
std::vector<torch::Tensor> CopiesWithGrads(
    const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const torch::Tensor& p : params) {
    copies.push_back(p.detach().clone().requires_grad_());
    copies.back().mutable_grad() = p.grad().clone();
  }
  return copies;
}

// `slots` slots of `config` against as many AdamW slots, on the same
// parameters and gradients, stepped together as the trainer steps them.
// Each round times `steps` consecutive steps of both (a SOAP refresh every
// N steps is then counted once per N steps); times are per step.
void CompareWithAdamW(const std::string& name,
                      const loraplex::OptimizerConfig& config, int slots,
                      int rounds, int steps = 1) {
  loraplex::OptimizerConfig adamw_config;
  adamw_config.family = loraplex::OptimizerFamily::kAdamW;
  std::vector<loraplex::SlotOptimizer> family_slots, adamw_slots;
  int64_t numel = 0;
  size_t matrices = 0;
  for (int s = 0; s < slots; ++s) {
    // The built-in "small" model: 4 layers, hidden 512, GQA kv 256, MLP
    // 1408; rank 16 on all seven targets.
    std::vector<torch::Tensor> params =
        SlotLoraParameters(4, 512, 256, 1408, 16);
    const std::vector<torch::Tensor> copies = CopiesWithGrads(params);
    for (const torch::Tensor& p : params) numel += p.numel();
    matrices += params.size();
    auto built = loraplex::BuildSlotOptimizer(config, params);
    auto adamw = loraplex::BuildSlotOptimizer(adamw_config, copies);
    if (!built.ok() || !adamw.ok()) {
      std::cerr << "building the optimizers failed\n";
      std::exit(1);
    }
    family_slots.push_back(*std::move(built));
    adamw_slots.push_back(*std::move(adamw));
  }
  std::vector<loraplex::SlotOptimizer*> family_all, adamw_all;
  for (int s = 0; s < slots; ++s) {
    family_all.push_back(&family_slots[s]);
    adamw_all.push_back(&adamw_slots[s]);
  }
  auto [family_time, adamw_time] = TimeSideBySide(
      [&] {
        for (int i = 0; i < steps; ++i)
          loraplex::StepSlotOptimizers(family_all);
      },
      [&] {
        for (int i = 0; i < steps; ++i) loraplex::StepSlotOptimizers(adamw_all);
      },
      rounds);
  family_time /= steps;
  adamw_time /= steps;
  std::cout << "  " << slots << " slot(s), " << matrices << " LoRA matrices, "
            << numel << " parameters   " << name << " step "
            << family_time * 1e3 << " ms   adamw step " << adamw_time * 1e3
            << " ms   " << name << "/adamw " << family_time / adamw_time
            << "x\n";
}

struct LoraShape {
  const char* name;
  int64_t layers, hidden, kv, intermediate, rank;
};

void CompareCrossSlotMuon(const LoraShape& shape, int slots, int rounds) {
  loraplex::OptimizerConfig config;
  config.family = loraplex::OptimizerFamily::kMuon;
  std::vector<loraplex::SlotOptimizer> optimizers;
  for (int s = 0; s < slots; ++s) {
    auto built = loraplex::BuildSlotOptimizer(
        config, SlotLoraParameters(shape.layers, shape.hidden, shape.kv,
                                   shape.intermediate, shape.rank));
    if (!built.ok()) {
      std::cerr << "building the optimizers failed\n";
      std::exit(1);
    }
    optimizers.push_back(*std::move(built));
  }
  std::vector<loraplex::SlotOptimizer*> all;
  for (loraplex::SlotOptimizer& optimizer : optimizers) {
    all.push_back(&optimizer);
  }
  const auto [together, each] =
      TimeSideBySide([&] { loraplex::StepSlotOptimizers(all); },
                     [&] {
                       for (loraplex::SlotOptimizer* optimizer : all)
                         optimizer->Step();
                     },
                     rounds);
  std::cout << "  " << shape.name << ", " << slots << " slots   across slots "
            << together * 1e3 << " ms   slot by slot " << each * 1e3
            << " ms   slot-by-slot/across " << each / together << "x\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("loraplex optimizer benchmark");
  int threads = 0;
  int rounds = 15;
  app.add_option("--threads", threads, "Intra-op threads (0 = all cores)");
  app.add_option("--rounds", rounds, "Timed rounds per comparison")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const auto configured = loraplex::ConfigureThreads(threads);
  if (!configured.ok()) {
    std::cerr << configured.status() << "\n";
    return 2;
  }
  torch::manual_seed(0);
  const loraplex::BlasInfo blas = loraplex::InspectBlas();
  std::cout << std::fixed << std::setprecision(3)
            << "BLAS: " << loraplex::DescribeBlas(blas) << ", threads "
            << *configured << "\n\n";

  std::cout << "Newton-Schulz (quintic, 5 steps) over 16 same-shape matrices"
               " (goal: loop/batched >= 3x)\n";
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 64},
                                                {64, 8},
                                                {8, 176},
                                                {16, 512},
                                                {512, 16},
                                                {16, 2048},
                                                {64, 4096}}) {
    CompareNewtonSchulz(rows, cols, rounds);
  }
  std::cout << "\nOne optimizer step of 1 and 16 slots' LoRA parameters, "
               "each family beside AdamW\n";
  for (loraplex::OptimizerFamily family :
       {loraplex::OptimizerFamily::kMuon, loraplex::OptimizerFamily::kLion}) {
    loraplex::OptimizerConfig config;
    config.family = family;
    for (int slots : {1, 16}) {
      CompareWithAdamW(std::string(loraplex::OptimizerFamilyName(family)),
                       config, slots, rounds);
    }
  }
  // SOAP's eigenbasis refreshes (a QR per preconditioned side) dominate its
  // step, hence at most 3 rounds.
  loraplex::OptimizerConfig soap;
  soap.family = loraplex::OptimizerFamily::kSoap;
  loraplex::OptimizerConfig rank_side = soap;
  rank_side.max_precond_dim = 16;
  loraplex::OptimizerConfig every_tenth = soap;
  every_tenth.precondition_frequency = 10;
  for (const auto& [name, config] :
       std::vector<std::pair<std::string, loraplex::OptimizerConfig>>{
           {"soap", soap},
           {"soap (rank side only)", rank_side},
           {"soap (refresh every 10)", every_tenth}}) {
    for (int slots : {1, 16}) {
      CompareWithAdamW(name, config, slots, std::min(rounds, 3),
                       config.precondition_frequency);
    }
  }
  std::cout << "\nMuon steps of many slots, all seven targets (goal at 16 "
               "slots: slot-by-slot/across >= 3x)\n";
  const LoraShape shapes[] = {{"tiny model rank 8", 2, 64, 32, 176, 8},
                              {"small model rank 16", 4, 512, 256, 1408, 16}};
  for (const LoraShape& shape : shapes) {
    for (int slots : {4, 16, 64}) CompareCrossSlotMuon(shape, slots, rounds);
  }
  return 0;
}
