// Access to the committed optimizer golden fixtures
// (tests/fixtures/golden/optim, made by tools/golden/make_optim_golden.py).
#ifndef LORAPLEX_TESTS_COMMON_OPTIM_FIXTURE_H_
#define LORAPLEX_TESTS_COMMON_OPTIM_FIXTURE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/optim/muon.h"
#include "core/safetensors/safetensors.h"

namespace loraplex {

class OptimFixture {
 public:
  static const OptimFixture& Get() {
    static const OptimFixture* const kFixture = new OptimFixture();
    return *kFixture;
  }

  // The case list "muon", "adam" or "newton_schulz" of cases.json.
  const nlohmann::json& Cases(const std::string& kind) const {
    return cases_.at(kind);
  }

  // True when both fixture files loaded and list cases of every kind.
  bool Complete() const {
    return file_ != nullptr && !cases_.at("muon").empty() &&
           !cases_.at("adam").empty() && !cases_.at("newton_schulz").empty();
  }

  // "<case>.<field>" as a fresh tensor.
  torch::Tensor Tensor(const std::string& case_name,
                       const std::string& field) const {
    if (file_ == nullptr) {
      ADD_FAILURE() << "optimizer fixture file did not load";
      return torch::Tensor();
    }
    auto tensor = file_->Load(case_name + "." + field);
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    return tensor.ok() ? tensor->clone() : torch::Tensor();
  }

 private:
  // A missing or broken fixture leaves every case list empty and the file
  // unset; FixtureIsComplete reports it as a test failure.
  OptimFixture() {
    const std::string dir =
        std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/optim";
    std::ifstream in(dir + "/cases.json");
    cases_ = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (cases_.is_discarded() || !cases_.is_object()) {
      cases_ = nlohmann::json::object();
    }
    for (const char* kind : {"muon", "adam", "newton_schulz"}) {
      if (!cases_.contains(kind)) cases_[kind] = nlohmann::json::array();
    }
    auto file = SafetensorsFile::Open(dir + "/optim_golden.safetensors");
    if (file.ok()) file_ = *file;
  }

  nlohmann::json cases_;
  std::shared_ptr<const SafetensorsFile> file_;
};

// A leaf parameter holding a copy of `value`.
inline torch::Tensor Leaf(const torch::Tensor& value) {
  return value.detach().clone().set_requires_grad(true);
}

// max|actual - expected| / max|expected|.
inline double MaxRelativeDiff(const torch::Tensor& actual,
                              const torch::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  const double diff = (actual - expected).abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

// Names of the cases of `kind`, for INSTANTIATE_TEST_SUITE_P.
inline std::vector<std::string> OptimCaseNames(const std::string& kind) {
  std::vector<std::string> names;
  for (const auto& c : OptimFixture::Get().Cases(kind)) {
    names.push_back(c.at("name").get<std::string>());
  }
  return names;
}

inline const nlohmann::json& OptimCase(const std::string& kind,
                                       const std::string& name) {
  for (const auto& c : OptimFixture::Get().Cases(kind)) {
    if (c.at("name") == name) return c;
  }
  ADD_FAILURE() << "no " << kind << " case " << name;
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return kEmpty;
}

// The Muon options of a "muon" fixture case.
inline MuonOptions MuonOptionsOfCase(const nlohmann::json& c) {
  MuonOptions options(c.at("lr").get<double>());
  options.momentum(c.at("momentum").get<double>())
      .nesterov(c.at("nesterov").get<bool>())
      .weight_decay(c.at("weight_decay").get<double>())
      .weight_decay_mode(*ParseMuonWeightDecayMode(
          c.at("weight_decay_mode").get<std::string>()))
      .coefficient_set(
          *ParseNsCoefficientSet(c.at("coefficient_set").get<std::string>()))
      .ns_steps(c.at("ns_steps").get<int64_t>())
      .scale_mode(*ParseMuonScaleMode(c.at("scale_mode").get<std::string>()))
      .extra_scale_factor(c.at("extra_scale_factor").get<double>());
  if (c.contains("custom_coefficients")) {
    std::vector<NsCoefficients> custom;
    for (const auto& t : c.at("custom_coefficients")) {
      custom.push_back(
          {t[0].get<double>(), t[1].get<double>(), t[2].get<double>()});
    }
    options.custom_coefficients(custom);
  }
  return options;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_OPTIM_FIXTURE_H_
