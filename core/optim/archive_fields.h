// Reading and writing scalar fields of LibTorch archives with checks, so a
// corrupt or foreign archive is a c10::Error naming the field rather than an
// invalid value (an enum out of range, a negative count).
#ifndef LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_
#define LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loraplex {

inline int64_t ReadArchiveInt(torch::serialize::InputArchive& archive,
                              const std::string& key) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value), "archive has no field ", key);
  TORCH_CHECK(value.isInt(), "archive field ", key, " is not an integer");
  return value.toInt();
}

inline double ReadArchiveDouble(torch::serialize::InputArchive& archive,
                                const std::string& key) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value), "archive has no field ", key);
  TORCH_CHECK(value.isDouble(), "archive field ", key, " is not a number");
  return value.toDouble();
}

inline bool ReadArchiveBool(torch::serialize::InputArchive& archive,
                            const std::string& key) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value), "archive has no field ", key);
  TORCH_CHECK(value.isBool(), "archive field ", key, " is not a bool");
  return value.toBool();
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
  const int64_t index = ReadArchiveInt(archive, key);
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(N), "archive field ",
              key, " has invalid value ", index);
  return all[static_cast<size_t>(index)];
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_ARCHIVE_FIELDS_H_
