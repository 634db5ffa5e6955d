// Timing helpers shared by the benchmark programs: medians of alternating
// rounds (so machine noise hits both contenders alike), peak GEMM
// throughput, the matmul FLOPs of a base-model forward, and random
// training data.
#ifndef LORAPLEX_BENCH_TIMING_H_
#define LORAPLEX_BENCH_TIMING_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/data/sequences.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"

namespace loraplex {

using BenchClock = std::chrono::steady_clock;

inline double SecondsSince(BenchClock::time_point start) {
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Runs a and b alternately `rounds` times (after one warm-up each) and
// returns their median times in seconds.
inline std::pair<double, double> TimeSideBySide(const std::function<void()>& a,
                                                const std::function<void()>& b,
                                                int rounds) {
  a();
  b();
  std::vector<double> ta;
  std::vector<double> tb;
  for (int i = 0; i < rounds; ++i) {
    for (int which = 0; which < 2; ++which) {
      const auto start = BenchClock::now();
      (which == 0 ? a : b)();
      (which == 0 ? ta : tb).push_back(SecondsSince(start));
    }
  }
  return {Median(ta), Median(tb)};
}

// Best-of-N fp32 GEMM throughput in GFLOP/s for n x n x n, after a few
// warm-up products (the first ones run at a lower clock and with cold
// caches, which would understate the peak).
inline double GemmGflops(int64_t n, int repeats) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({n, n});
  torch::Tensor b = torch::randn({n, n});
  torch::Tensor c;
  for (int i = 0; i < 3; ++i) c = torch::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = BenchClock::now();
    c = torch::mm(a, b);
    best = std::min(best, SecondsSince(start));
  }
  return 2.0 * n * n * n / best / 1e9;
}

// Matmul FLOPs of one projection for one token: a mixture's experts run
// top_k times, and its router once (with the experts' gate_up).
inline double ProjectionFlops(const ModelConfig& c, Projection p) {
  const auto shape = ProjectionShape(c, p);
  double flops = 2.0 * shape[0] * shape[1];
  if (!IsExpertProjection(p)) return flops;
  flops *= static_cast<double>(c.moe.top_k);
  if (p == Projection::kExpertGateUp) {
    flops += 2.0 * c.hidden_size * c.moe.num_experts;
  }
  return flops;
}

// Matmul FLOPs of the layers' projections for one token, all layers (the
// active ones of a mixture of experts).
inline double ProjectionFlopsPerToken(const ModelConfig& c) {
  double flops = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (Projection p : LayerProjections(c, layer)) {
      flops += ProjectionFlops(c, p);
    }
  }
  return flops;
}

// Attention matmul FLOPs (scores and weighted values) for one token of a
// `seq`-long row, all layers.
inline double AttentionFlopsPerToken(const ModelConfig& c, int64_t seq) {
  return c.num_hidden_layers * 4.0 * c.num_attention_heads * c.head_dim *
         static_cast<double>(seq);
}

// Matmul FLOPs of one forward over `tokens` tokens of `seq` length rows.
inline double ForwardFlops(const ModelConfig& c, int64_t tokens, int64_t seq) {
  return (ProjectionFlopsPerToken(c) + AttentionFlopsPerToken(c, seq) +
          2.0 * c.hidden_size * c.vocab_size) *
         tokens;
}

// Matmul FLOPs of one training step over `rows` full sequences of
// `seq_len` tokens, rank-`rank` LoRA on every projection of every layer
// (a mixture's active experts only: MFU counted on active parameters).
inline double TrainStepFlops(const ModelConfig& c, int64_t rows,
                             int64_t seq_len, int64_t rank) {
  const double tokens = static_cast<double>(rows * seq_len);
  const double targets = static_cast<double>(rows * (seq_len - 1));
  const double head = 2.0 * c.hidden_size * c.vocab_size * targets;
  const double linear = ProjectionFlopsPerToken(c) * tokens;
  const double attention = AttentionFlopsPerToken(c, seq_len) * tokens;
  double lora_per_token = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (Projection p : LayerProjections(c, layer)) {
      const auto shape = ProjectionShape(c, p);
      lora_per_token += 2.0 * rank * (shape[0] + shape[1]) *
                        (IsExpertProjection(p) ? c.moe.top_k : 1);
    }
  }
  const double lora = lora_per_token * tokens;
  // Backward: input gradients of the frozen linears and LM head (as much
  // as their forward), twice the attention forward, and twice the LoRA
  // forward (gradients of A, B and their inputs).
  return (linear + attention + head + lora) +
         (linear + 2 * attention + head + 2 * lora);
}

// `count` sequences of `seq_len` uniform random tokens, every token but the
// first a target (from torch's global generator).
inline std::shared_ptr<const SequenceSet> RandomSequences(int64_t count,
                                                          int64_t seq_len,
                                                          int64_t vocab) {
  auto set = std::make_shared<SequenceSet>();
  for (int64_t i = 0; i < count; ++i) {
    torch::Tensor ids = torch::randint(0, vocab, {seq_len}, torch::kInt64);
    Sequence seq;
    seq.input_ids.assign(ids.data_ptr<int64_t>(),
                         ids.data_ptr<int64_t>() + seq_len);
    seq.loss_mask.assign(seq_len, 1);
    seq.loss_mask[0] = 0;
    set->num_target_tokens += seq_len - 1;
    set->sequences.push_back(std::move(seq));
  }
  return set;
}

}  // namespace loraplex

#endif  // LORAPLEX_BENCH_TIMING_H_
