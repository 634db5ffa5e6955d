// The logits fixtures of tools/golden (make_model_golden.py,
// make_peft_golden.py): golden.safetensors with the batch's input_ids,
// lengths and the reference logits, and their comparison over the valid
// (unpadded) positions.
//
//   GoldenLogits golden = ReadGoldenLogits(GoldenPath("qwen3_tied"));
//   EXPECT_LE(MaxValidDiff(logits, golden.logits.at("logits"),
//                          golden.lengths), 1e-4);
#ifndef LORAPLEX_TESTS_COMMON_GOLDEN_LOGITS_H_
#define LORAPLEX_TESTS_COMMON_GOLDEN_LOGITS_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "core/safetensors/safetensors.h"

namespace loraplex {

struct GoldenLogits {
  torch::Tensor input_ids;  // int64 [rows, seq], right-padded.
  torch::Tensor lengths;    // int64 [rows].
  // Every tensor named logits*: "logits", and "logits_bf16" where made.
  std::map<std::string, torch::Tensor> logits;
};

// `dir`/golden.safetensors.
inline GoldenLogits ReadGoldenLogits(const std::string& dir) {
  GoldenLogits golden;
  auto file = SafetensorsFile::Open(dir + "/golden.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return golden;
  golden.input_ids = (*file)->Load("input_ids").value().clone();
  golden.lengths = (*file)->Load("lengths").value().clone();
  for (const auto& info : (*file)->tensors()) {
    if (info.name.rfind("logits", 0) == 0) {
      golden.logits[info.name] = (*file)->Load(info.name).value().clone();
    }
  }
  return golden;
}

// Max |a - b| over the valid positions of row `row` (lengths[row] of
// them), in fp64; NaN when either holds a NaN there, so that every bound
// on it fails.
inline double RowDiff(const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& lengths, int64_t row) {
  const int64_t len = lengths[row].item<int64_t>();
  return (a[row].narrow(0, 0, len).to(torch::kFloat64) -
          b[row].narrow(0, 0, len).to(torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

// RowDiff's worst over every row; NaN when some row's is.
inline double MaxValidDiff(const torch::Tensor& a, const torch::Tensor& b,
                           const torch::Tensor& lengths) {
  double worst = 0;
  for (int64_t row = 0; row < lengths.size(0); ++row) {
    const double diff = RowDiff(a, b, lengths, row);
    if (std::isnan(diff)) return std::numeric_limits<double>::quiet_NaN();
    worst = std::max(worst, diff);
  }
  return worst;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_GOLDEN_LOGITS_H_
