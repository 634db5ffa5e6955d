// Reading and writing scalar fields of LibTorch archives with checks, so a
// corrupt or foreign archive is a c10::Error naming the field rather than an
// invalid value (an enum out of range, a negative count).
#ifndef LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_
#define LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_

#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace loraplex {

// A scalar field of type int64_t, double or bool.
template <typename T>
T ReadArchiveScalar(torch::serialize::InputArchive& archive,
                    const std::string& key) {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                std::is_same_v<T, bool>);
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value), "archive has no field ", key);
  const bool right_type = std::is_same_v<T, bool>     ? value.isBool()
                          : std::is_same_v<T, double> ? value.isDouble()
                                                      : value.isInt();
  TORCH_CHECK(right_type, "archive field ", key, " has the wrong type");
  return value.to<T>();
}

// Enums are stored as their position in `all` (a kAll* list).
template <typename Enum, size_t N>
void WriteArchiveEnum(torch::serialize::OutputArchive& archive,
                      const std::string& key, Enum value,
                      const std::array<Enum, N>& all) {
  for (size_t i = 0; i < N; ++i) {
    if (all[i] == value) {
      archive.write(key, c10::IValue(static_cast<int64_t>(i)));
      return;
    }
  }
  TORCH_CHECK(false, "enum value for ", key, " is not in its list");
}

template <typename Enum, size_t N>
Enum ReadArchiveEnum(torch::serialize::InputArchive& archive,
                     const std::string& key, const std::array<Enum, N>& all) {
  const int64_t index = ReadArchiveScalar<int64_t>(archive, key);
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(N), "archive field ",
              key, " has invalid value ", index);
  return all[static_cast<size_t>(index)];
}

// Loads `optimizer`'s state and options with LibTorch's serialize, which in
// LibTorch 2.x also takes each group's options from the archive: when an
// archived group's options fail `error_of` (empty: valid), every group keeps
// its previous options and this throws a c10::Error naming `name` and the
// group.
template <typename State, typename Options>
void LoadOptimizerKeepingValidOptions(torch::optim::Optimizer& optimizer,
                                      torch::serialize::InputArchive& archive,
                                      std::string (*error_of)(const Options&),
                                      const char* name) {
  std::vector<torch::optim::OptimizerParamGroup>& groups =
      optimizer.param_groups();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> previous;
  for (auto& group : groups) previous.push_back(group.options().clone());
  torch::optim::serialize<State, Options>(archive, optimizer);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string error =
        error_of(static_cast<const Options&>(groups[g].options()));
    if (!error.empty()) {
      for (size_t i = 0; i < groups.size(); ++i) {
        groups[i].set_options(std::move(previous[i]));
      }
      TORCH_CHECK(false, name, " archive: param group ", g, ": ", error);
    }
  }
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_
