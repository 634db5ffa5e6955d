// The golden steps of NVIDIA Emerging-Optimizers' own optimizer classes
// (tests/fixtures/golden/emerging, made by
// tools/golden/make_emerging_optim_golden.py): the cases of cases.json and
// their tensors, loaded once.
//
//   const EmergingFixture& fixture = EmergingFixture::Get();
//   for (const nlohmann::json& c : fixture.cases()["lion"]) {
//     torch::Tensor grads = fixture.Tensor(c["name"], "grads");
//   }
#ifndef LORAPLEX_TESTS_COMMON_EMERGING_FIXTURE_H_
#define LORAPLEX_TESTS_COMMON_EMERGING_FIXTURE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/safetensors/safetensors.h"

namespace loraplex {

class EmergingFixture {
 public:
  static const EmergingFixture& Get() {
    static const EmergingFixture* const kFixture = new EmergingFixture();
    return *kFixture;
  }
  const nlohmann::json& cases() const { return cases_; }
  bool loaded() const { return file_ != nullptr && cases_.is_object(); }
  // `<name>.<field>` of the fixture file (a failed expectation if absent).
  torch::Tensor Tensor(const std::string& name,
                       const std::string& field) const {
    auto tensor = file_->Load(name + "." + field);
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    return tensor.ok() ? tensor->clone() : torch::Tensor();
  }

 private:
  EmergingFixture() {
    const std::string dir =
        std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/emerging";
    std::ifstream in(dir + "/cases.json");
    cases_ = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    auto file = SafetensorsFile::Open(dir + "/emerging_golden.safetensors");
    if (file.ok()) file_ = *file;
  }
  nlohmann::json cases_;
  std::shared_ptr<const SafetensorsFile> file_;
};

// max |a - b| over max(1, max |b|).
inline double EmergingDistance(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_EMERGING_FIXTURE_H_
