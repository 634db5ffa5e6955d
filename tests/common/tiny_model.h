// The built-in tiny base model, written and loaded once per test process.
#ifndef LORAPLEX_TESTS_COMMON_TINY_MODEL_H_
#define LORAPLEX_TESTS_COMMON_TINY_MODEL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/model/llama_model.h"
#include "core/model/model_presets.h"

namespace loraplex {

// Directory of the tiny model's checkpoint (written on first use).
inline const std::string& TinyModelDir() {
  static const std::string dir = [] {
    const std::string path =
        (std::filesystem::path(::testing::TempDir()) /
         ("loraplex-" + std::to_string(::getpid())) / "tiny-model")
            .string();
    auto status = WritePresetModel("tiny", /*seed=*/7, path);
    if (!status.ok()) ADD_FAILURE() << status;
    return path;
  }();
  return dir;
}

inline const LlamaModel& TinyModel() {
  static const std::unique_ptr<LlamaModel> model = [] {
    auto loaded = LlamaModel::Load(TinyModelDir(), {});
    if (!loaded.ok()) ADD_FAILURE() << loaded.status();
    return std::move(loaded).value();
  }();
  return *model;
}

// The same checkpoint computed in fp64 (LoRA slots over it train in fp64,
// SlotPoolOptions::dtype): the equivalence tests check their identities
// there, far below fp32 rounding, so their bounds hold on every CPU.
inline const LlamaModel& TinyModel64() {
  static const std::unique_ptr<LlamaModel> model = [] {
    auto loaded = LlamaModel::Load(TinyModelDir(), {.dtype = torch::kFloat64});
    if (!loaded.ok()) ADD_FAILURE() << loaded.status();
    return std::move(loaded).value();
  }();
  return *model;
}

// The same checkpoint on `device` in `dtype` (loaded once per pair), for the
// tests that also run on a GPU.
inline const LlamaModel& TinyModelOn(torch::Device device,
                                     torch::ScalarType dtype) {
  static std::map<std::pair<std::string, torch::ScalarType>,
                  std::unique_ptr<LlamaModel>>
      models;
  std::unique_ptr<LlamaModel>& model = models[{device.str(), dtype}];
  if (model == nullptr) {
    auto loaded =
        LlamaModel::Load(TinyModelDir(), {.device = device, .dtype = dtype});
    if (!loaded.ok()) ADD_FAILURE() << loaded.status();
    model = std::move(loaded).value();
  }
  return *model;
}

// The GPU the *OnCuda tests run on.
inline torch::Device CudaDevice() { return torch::Device(torch::kCUDA, 0); }

// Path of a committed fixture under tests/fixtures/.
inline std::string FixturePath(const std::string& relative) {
  return std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/" + relative;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_TINY_MODEL_H_
