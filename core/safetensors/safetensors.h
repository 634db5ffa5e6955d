// Reading and writing the safetensors format (docs/DESIGN.md §7).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
// describing every tensor (dtype, shape, [begin, end) offsets into the data
// buffer) plus an optional "__metadata__" string map, then the data buffer.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
//   LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor w, file->Load("lm_head.weight"));
//
// Every header is validated before any tensor is touched: a malformed file is
// reported as an absl::Status naming the file, the tensor and the problem, and
// never causes an out-of-bounds read. Loaded tensors share the file's memory
// mapping (copy-on-write) when the data is suitably aligned.
#ifndef LORAPLEX_CORE_SAFETENSORS_SAFETENSORS_H_
#define LORAPLEX_CORE_SAFETENSORS_SAFETENSORS_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// Largest header accepted; larger ones are treated as corrupt input.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Name of the reserved header entry that holds the string metadata map.
inline constexpr absl::string_view kSafetensorsMetadataKey = "__metadata__";

// Element types supported on disk. Names match the format's dtype strings.
enum class SafetensorsDtype {
  kF64,   // "F64", IEEE double.
  kF32,   // "F32", IEEE float.
  kF16,   // "F16", IEEE half.
  kBF16,  // "BF16", bfloat16.
  kI64,   // "I64", signed 64-bit integer.
  kI32,   // "I32", signed 32-bit integer.
  kI16,   // "I16", signed 16-bit integer.
  kI8,    // "I8", signed 8-bit integer.
  kU8,    // "U8", unsigned byte.
  kBool,  // "BOOL", one byte per element.
};

// The format's dtype string, e.g. "BF16".
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name);
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);
torch::ScalarType ToScalarType(SafetensorsDtype dtype);
absl::StatusOr<SafetensorsDtype> FromScalarType(torch::ScalarType type);

// One header entry, validated.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // Offset into the data buffer, inclusive.
  uint64_t end = 0;    // Offset into the data buffer, exclusive.
};

// A parsed and validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  // Sorted by name.
  std::map<std::string, std::string> metadata;
};

// Parses `json` and checks it against a data buffer of `data_size` bytes.
// `label` names the source (a path) in error messages.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view json, uint64_t data_size, const std::string& label);

// A memory-mapped, validated safetensors file.
class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(
      const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const {
    return header_.metadata;
  }
  const std::vector<SafetensorsTensorInfo>& tensors() const {
    return header_.tensors;
  }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // The named tensor on the CPU with its stored dtype. Shares the mapping
  // when aligned (the tensor keeps the file alive); otherwise a copy.
  absl::StatusOr<torch::Tensor> Load(absl::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  bool writable_ = true;           // False: mapped read-only, so loads copy.
  const uint8_t* data_ = nullptr;  // Start of the data buffer.
  SafetensorsHeader header_;
};

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

// Writes `tensors` (any device; copied to the CPU) to `path` atomically: a
// temporary file in the same directory is written, fsynced and renamed over
// `path`, then the directory is fsynced.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// The bytes of a safetensors file holding `tensors`, as WriteSafetensors
// writes it, for callers that write it later or elsewhere.
absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// A Hugging Face checkpoint directory: either one `model.safetensors` or a
// sharded set described by `model.safetensors.index.json` ("weight_map").
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<SafetensorsCheckpoint> OpenDirectory(
      const std::string& dir);

  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  const SafetensorsTensorInfo* Find(absl::string_view name) const;
  absl::StatusOr<torch::Tensor> Load(absl::string_view name) const;

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  // Tensor name -> index into files_.
  std::map<std::string, size_t, std::less<>> owner_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_SAFETENSORS_SAFETENSORS_H_
