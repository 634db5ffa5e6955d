#include "core/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/atomic_file.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

static_assert(sizeof(void*) == 8, "loraplex needs a 64-bit platform");

bool HostIsLittleEndian() {
  const uint16_t probe = 1;
  uint8_t first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

struct DtypeRow {
  SafetensorsDtype dtype;
  absl::string_view name;
  size_t size;
  torch::ScalarType scalar_type;
};

constexpr DtypeRow kDtypes[] = {
    {SafetensorsDtype::kF64, "F64", 8, torch::kFloat64},
    {SafetensorsDtype::kF32, "F32", 4, torch::kFloat32},
    {SafetensorsDtype::kF16, "F16", 2, torch::kFloat16},
    {SafetensorsDtype::kBF16, "BF16", 2, torch::kBFloat16},
    {SafetensorsDtype::kI64, "I64", 8, torch::kInt64},
    {SafetensorsDtype::kI32, "I32", 4, torch::kInt32},
    {SafetensorsDtype::kI16, "I16", 2, torch::kInt16},
    {SafetensorsDtype::kI8, "I8", 1, torch::kInt8},
    {SafetensorsDtype::kU8, "U8", 1, torch::kUInt8},
    {SafetensorsDtype::kBool, "BOOL", 1, torch::kBool},
};

const DtypeRow& RowOf(SafetensorsDtype dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.dtype == dtype) return row;
  }
  return kDtypes[0];  // Unreachable: every enumerator has a row.
}

std::string ErrnoText() { return std::strerror(errno); }

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", ErrnoText()));
}

// Reads a JSON array of non-negative integers.
absl::StatusOr<std::vector<uint64_t>> ReadUnsignedArray(
    const nlohmann::json& value, const std::string& where) {
  if (!value.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be an array of non-negative integers"));
  }
  std::vector<uint64_t> out;
  for (const nlohmann::json& item : value) {
    if (!item.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " must hold non-negative integers, got ", DescribeJson(item)));
    }
    out.push_back(item.get<uint64_t>());
  }
  return out;
}

absl::StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& name,
                                                 const nlohmann::json& entry,
                                                 uint64_t data_size,
                                                 const std::string& where) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": entry must be a JSON object"));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing field \"", field, "\""));
    }
  }
  SafetensorsTensorInfo info;
  info.name = name;
  if (!entry["dtype"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": dtype must be a string"));
  }
  auto dtype = ParseSafetensorsDtype(entry["dtype"].get<std::string>());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", dtype.status().message()));
  }
  info.dtype = *dtype;

  LORAPLEX_ASSIGN_OR_RETURN(
      std::vector<uint64_t> shape,
      ReadUnsignedArray(entry["shape"], absl::StrCat(where, ": shape")));
  uint64_t numel = 1;
  for (uint64_t dim : shape) {
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape overflows"));
    }
    numel *= dim;
    info.shape.push_back(static_cast<int64_t>(dim));
  }

  LORAPLEX_ASSIGN_OR_RETURN(
      std::vector<uint64_t> offsets,
      ReadUnsignedArray(entry["data_offsets"],
                        absl::StrCat(where, ": data_offsets")));
  if (offsets.size() != 2 || offsets[0] > offsets[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data_offsets must be [begin, end] with begin <= end, got ",
        DescribeJson(entry["data_offsets"])));
  }
  info.begin = offsets[0];
  info.end = offsets[1];
  if (info.end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets [", info.begin, ", ", info.end,
                     ") lie outside the data buffer of ", data_size, " bytes"));
  }
  const uint64_t itemsize = SafetensorsDtypeSize(info.dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / itemsize ||
      numel * itemsize != info.end - info.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": byte length ", info.end - info.begin, " does not match ",
        numel, " elements of ", SafetensorsDtypeName(info.dtype)));
  }
  return info;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(
    const nlohmann::json& value, const std::string& label) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": __metadata__ must be an object of strings"));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": __metadata__[\"", key, "\"] must be a string"));
    }
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  return RowOf(dtype).name;
}

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) {
  return RowOf(dtype).size;
}

torch::ScalarType ToScalarType(SafetensorsDtype dtype) {
  return RowOf(dtype).scalar_type;
}

absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (row.name == name) return row.dtype;
  }
  std::vector<absl::string_view> known;
  for (const DtypeRow& row : kDtypes) known.push_back(row.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", name,
                   "\" (supported: ", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<SafetensorsDtype> FromScalarType(torch::ScalarType type) {
  for (const DtypeRow& row : kDtypes) {
    if (row.scalar_type == type) return row.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor dtype ", c10::toString(type),
                   " cannot be stored in safetensors"));
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view json, uint64_t data_size, const std::string& label) {
  if (json.empty() || json.front() != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": header is not a JSON object"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      nlohmann::json root,
      ParseUntrustedJson(json, label,
                         {/*max_depth=*/8,
                          /*reject_duplicate_top_level_keys=*/true}));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": header is not a JSON object"));
  }

  SafetensorsHeader header;
  for (const auto& [name, entry] : root.items()) {
    if (name == kSafetensorsMetadataKey) {
      LORAPLEX_ASSIGN_OR_RETURN(header.metadata, ParseMetadata(entry, label));
      continue;
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        SafetensorsTensorInfo info,
        ParseEntry(name, entry, data_size,
                   absl::StrCat(label, ": tensor \"", name, "\"")));
    header.tensors.push_back(std::move(info));
  }

  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& info : header.tensors) {
    if (info.end > info.begin) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": tensors \"", by_offset[i - 1]->name, "\" and \"",
          by_offset[i]->name, "\" overlap in the data buffer"));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return header;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  if (!HostIsLittleEndian()) {
    return absl::UnimplementedError("safetensors needs a little-endian host");
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return IoError("cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status status = IoError("cannot stat", path);
    ::close(fd);
    return status;
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", file_size,
                     " bytes, too short for the 8-byte header length"));
  }
  // MAP_PRIVATE: an accidental in-place write to a loaded tensor changes a
  // private copy of the page, never the file. Under strict overcommit a
  // writable mapping of a large file can be refused; then the file is mapped
  // read-only and every load copies.
  bool writable = true;
  void* mapping =
      ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED && errno == ENOMEM) {
    writable = false;
    mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  if (mapping == MAP_FAILED) return IoError("cannot mmap", path);

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;
  file->writable_ = writable;

  const auto* bytes = static_cast<const uint8_t*>(mapping);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", header_size, " exceeds the limit of ",
        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_size > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size,
                     " is larger than the rest of the file (", file_size - 8,
                     " bytes); the file is truncated or corrupt"));
  }
  absl::string_view json(reinterpret_cast<const char*>(bytes + 8), header_size);
  const uint64_t data_size = file_size - 8 - header_size;
  LORAPLEX_ASSIGN_OR_RETURN(file->header_,
                            ParseSafetensorsHeader(json, data_size, path));
  file->data_ = bytes + 8 + header_size;
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const SafetensorsTensorInfo* SafetensorsFile::Find(
    absl::string_view name) const {
  auto it =
      std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                       [](const SafetensorsTensorInfo& a, absl::string_view b) {
                         return a.name < b;
                       });
  if (it == header_.tensors.end() || it->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Load(
    absl::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(path_, ": no tensor named \"", name, "\""));
  }
  const auto options = torch::TensorOptions().dtype(ToScalarType(info->dtype));
  if (info->end == info->begin) return torch::empty(info->shape, options);
  const uint8_t* ptr = data_ + info->begin;
  const size_t itemsize = SafetensorsDtypeSize(info->dtype);
  if (!writable_ || reinterpret_cast<uintptr_t>(ptr) % itemsize != 0) {
    torch::Tensor copy = torch::empty(info->shape, options);
    std::memcpy(copy.data_ptr(), ptr, info->end - info->begin);
    return copy;
  }
  // The deleter holds a reference so the mapping outlives the tensor.
  std::shared_ptr<const SafetensorsFile> self = shared_from_this();
  return torch::from_blob(
      const_cast<uint8_t*>(ptr), info->shape, [self](void*) {}, options);
}

namespace {

// A file's layout: its header (the 8-byte length, the JSON, padding) and
// its tensors on the CPU in the order their data follows.
struct SafetensorsLayout {
  std::string header;
  std::vector<torch::Tensor> tensors;
};

absl::StatusOr<SafetensorsLayout> LayOutOrThrow(
    const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> sorted;
  std::set<std::string> names;
  for (const NamedTensor& named : tensors) {
    if (named.name == kSafetensorsMetadataKey || named.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor name \"", named.name, "\""));
    }
    if (!names.insert(named.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", named.name, "\" given twice"));
    }
    if (!named.tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", named.name, "\" is undefined"));
    }
    sorted.emplace_back(named.name,
                        named.tensor.detach().to(torch::kCPU).contiguous());
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : sorted) {
    auto dtype = FromScalarType(tensor.scalar_type());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": ", dtype.status().message()));
    }
    const uint64_t bytes = tensor.numel() * SafetensorsDtypeSize(*dtype);
    header[name] = {{"dtype", std::string(SafetensorsDtypeName(*dtype))},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty())
    header[std::string(kSafetensorsMetadataKey)] = metadata;
  std::string json = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t header_size = json.size();

  SafetensorsLayout layout;
  layout.header.assign(reinterpret_cast<const char*>(&header_size), 8);
  layout.header += json;
  for (auto& [name, tensor] : sorted) {
    layout.tensors.push_back(std::move(tensor));
  }
  return layout;
}

size_t DataBytes(const torch::Tensor& tensor) {
  return tensor.numel() * tensor.element_size();
}

// LayOutOrThrow with the library's exceptions as errors about `what`.
absl::StatusOr<SafetensorsLayout> LayOut(
    const std::string& what, const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // Exceptions can only come from preparing the header and the tensors,
  // before any file exists (and a file's writer cleans up regardless).
  try {
    return LayOutOrThrow(tensors, metadata);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor names and metadata must be valid UTF-8: ", e.what()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        what,
        ": cannot copy tensors to the CPU: ", e.what_without_backtrace()));
  }
}

}  // namespace

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  LORAPLEX_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                            LayOut(path, tensors, metadata));
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file,
                            AtomicFileWriter::Create(path));
  LORAPLEX_RETURN_IF_ERROR(
      file->Append(layout.header.data(), layout.header.size()));
  for (const torch::Tensor& tensor : layout.tensors) {
    LORAPLEX_RETURN_IF_ERROR(
        file->Append(tensor.data_ptr(), DataBytes(tensor)));
  }
  return file->Commit();
}

absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  LORAPLEX_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                            LayOut("safetensors", tensors, metadata));
  std::string bytes = std::move(layout.header);
  for (const torch::Tensor& tensor : layout.tensors) {
    bytes.append(static_cast<const char*>(tensor.data_ptr()),
                 DataBytes(tensor));
  }
  return bytes;
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::OpenDirectory(
    const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path single = root / "model.safetensors";
  const fs::path index = root / "model.safetensors.index.json";
  SafetensorsCheckpoint checkpoint;

  auto add_file = [&](const fs::path& file) -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(auto opened,
                              SafetensorsFile::Open(file.string()));
    const size_t slot = checkpoint.files_.size();
    for (const auto& info : opened->tensors()) {
      auto [it, inserted] = checkpoint.owner_.emplace(info.name, slot);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", info.name, "\" is stored in both ",
            checkpoint.files_[it->second]->path(), " and ", file.string()));
      }
    }
    checkpoint.files_.push_back(std::move(opened));
    return absl::OkStatus();
  };

  if (fs::exists(index)) {
    LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json json,
                              ReadUntrustedJsonFile(index.string()));
    if (!json.is_object() || !json.contains("weight_map") ||
        !json["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index.string(), ": missing the \"weight_map\" object"));
    }
    std::map<std::string, std::set<std::string>> by_shard;
    for (const auto& [name, shard] : json["weight_map"].items()) {
      if (!shard.is_string() || fs::path(shard.get<std::string>()).filename() !=
                                    fs::path(shard.get<std::string>())) {
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": weight_map[\"", name,
                         "\"] must be a file name in the same directory"));
      }
      by_shard[shard.get<std::string>()].insert(name);
    }
    for (const auto& [shard, expected] : by_shard) {
      LORAPLEX_RETURN_IF_ERROR(add_file(root / shard));
      const auto& file = *checkpoint.files_.back();
      for (const std::string& name : expected) {
        if (file.Find(name) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(index.string(), ": tensor \"", name,
                           "\" is mapped to ", shard, " but is not in it"));
        }
      }
    }
    return checkpoint;
  }
  if (fs::exists(single)) {
    LORAPLEX_RETURN_IF_ERROR(add_file(single));
    return checkpoint;
  }
  return absl::NotFoundError(absl::StrCat(
      dir, ": no model.safetensors or model.safetensors.index.json"));
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, unused] : owner_) out.push_back(name);
  return out;
}

const SafetensorsTensorInfo* SafetensorsCheckpoint::Find(
    absl::string_view name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) return nullptr;
  return files_[it->second]->Find(name);
}

absl::StatusOr<torch::Tensor> SafetensorsCheckpoint::Load(
    absl::string_view name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint has no tensor named \"", name, "\""));
  }
  return files_[it->second]->Load(name);
}

}  // namespace loraplex
