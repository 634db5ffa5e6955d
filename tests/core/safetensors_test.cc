#include "core/safetensors/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDir(); }

  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }

  // Writes a raw file: 8-byte length (default: header size), header, data.
  std::string WriteRaw(const std::string& name, const std::string& header,
                       const std::string& data,
                       std::optional<uint64_t> length = std::nullopt) const {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = length.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << data;
    return path;
  }

  // Expects Open(path) to fail with INVALID_ARGUMENT mentioning `needle`.
  void ExpectRejected(const std::string& path, const std::string& needle) {
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << "accepted " << path;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(needle));
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  const std::vector<torch::ScalarType> types = {
      torch::kFloat64, torch::kFloat32, torch::kFloat16, torch::kBFloat16,
      torch::kInt64,   torch::kInt32,   torch::kInt16,   torch::kInt8,
      torch::kUInt8,   torch::kBool};
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < types.size(); ++i) {
    torch::Tensor t = (torch::randn({3, 5}) * 50).to(types[i]);
    tensors.push_back({"t" + std::to_string(i), t});
  }
  tensors.push_back({"scalar", torch::tensor(3.5f)});
  tensors.push_back({"empty", torch::empty({0, 4})});
  tensors.push_back({"transposed", torch::arange(12.0).view({3, 4}).t()});
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->tensors().size(), tensors.size());
  for (const NamedTensor& expected : tensors) {
    auto loaded = (*file)->Load(expected.name);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->scalar_type(), expected.tensor.scalar_type())
        << expected.name;
    EXPECT_EQ(loaded->sizes(), expected.tensor.sizes()) << expected.name;
    EXPECT_TRUE(torch::equal(*loaded, expected.tensor)) << expected.name;
  }
}

TEST_F(SafetensorsTest, DtypeNamesFollowTheFormat) {
  for (const char* name :
       {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
    auto dtype = ParseSafetensorsDtype(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(SafetensorsDtypeName(*dtype), name);
    EXPECT_EQ(SafetensorsDtypeSize(*dtype),
              c10::elementSize(ToScalarType(*dtype)));
  }
}

TEST_F(SafetensorsTest, HeaderIsPaddedAndDataAligned) {
  const std::string path = Path("aligned.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", torch::ones({3})}}).ok());
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(SafetensorsTest, LoadsShareTheMappingAndWritesStayPrivate) {
  const std::string path = Path("shared.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::ones({64})}}).ok());
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    torch::Tensor a = (*file)->Load("w").value();
    torch::Tensor b = (*file)->Load("w").value();
    EXPECT_EQ(a.data_ptr(), b.data_ptr());  // Zero-copy views.
    a.mul_(7);                              // Copy-on-write page.
    EXPECT_EQ(b[0].item<float>(), 7.0f);
  }
  auto reopened = SafetensorsFile::Open(path);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->Load("w").value()[0].item<float>(), 1.0f);
}

TEST_F(SafetensorsTest, TensorOutlivesTheFileObject) {
  const std::string path = Path("outlive.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::full({16}, 2.0)}}).ok());
  torch::Tensor kept;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    kept = (*file)->Load("w").value();
  }
  EXPECT_EQ(kept.sum().item<float>(), 32.0f);
}

TEST_F(SafetensorsTest, UnalignedDataIsCopied) {
  // A 1-byte tensor first puts the float tensor at an odd offset.
  float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  auto file = SafetensorsFile::Open(WriteRaw("odd.safetensors", header, data));
  ASSERT_TRUE(file.ok()) << file.status();
  torch::Tensor f = (*file)->Load("f").value();
  EXPECT_EQ(f[0].item<float>(), 1.5f);
  EXPECT_EQ(f[1].item<float>(), -2.25f);
  EXPECT_EQ((*file)->Load("b").value()[0].item<uint8_t>(), 7);
}

TEST_F(SafetensorsTest, UnknownTensorIsNotFound) {
  const std::string path = Path("one.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", torch::ones({1})}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Load("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*file)->Find("b"), nullptr);
}

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthField) {
  const std::string path = Path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  ExpectRejected(path, "too short for the 8-byte header length");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  ExpectRejected(WriteRaw("long.safetensors", "{}", "", 4096),
                 "header length 4096 is larger than the rest of the file");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthAboveCap) {
  ExpectRejected(WriteRaw("cap.safetensors", "{}", "", 1ull << 40),
                 "exceeds the limit");
}

TEST_F(SafetensorsTest, RejectsNonJsonHeader) {
  ExpectRejected(WriteRaw("nonjson.safetensors", "{not json", ""),
                 "not valid JSON");
}

TEST_F(SafetensorsTest, RejectsNonObjectHeader) {
  ExpectRejected(WriteRaw("array.safetensors", "[1, 2]", ""),
                 "header is not a JSON object");
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  ExpectRejected(
      WriteRaw("dtype.safetensors",
               R"({"x":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})",
               std::string(1, '\0')),
      "tensor \"x\": unsupported dtype \"F7\"");
}

TEST_F(SafetensorsTest, RejectsMissingField) {
  ExpectRejected(
      WriteRaw("missing.safetensors", R"({"x":{"dtype":"F32","shape":[1]}})",
               std::string(4, '\0')),
      "tensor \"x\": missing field \"data_offsets\"");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutsideBuffer) {
  ExpectRejected(
      WriteRaw("range.safetensors",
               R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
               std::string(8, '\0')),
      "tensor \"x\": data_offsets [0, 16) lie outside the data buffer of 8 "
      "bytes");
}

TEST_F(SafetensorsTest, RejectsReversedOffsets) {
  ExpectRejected(
      WriteRaw("reversed.safetensors",
               R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
               std::string(8, '\0')),
      "begin <= end");
}

TEST_F(SafetensorsTest, RejectsWrongByteLength) {
  ExpectRejected(
      WriteRaw("length.safetensors",
               R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
               std::string(16, '\0')),
      "tensor \"x\": byte length 12 does not match 4 elements of F32");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  ExpectRejected(
      WriteRaw("overlap.safetensors",
               R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0')),
      "tensors \"a\" and \"b\" overlap");
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  ExpectRejected(
      WriteRaw("dup.safetensors",
               R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               std::string(8, '\0')),
      "key \"a\" appears more than once");
}

TEST_F(SafetensorsTest, RejectsNegativeShape) {
  ExpectRejected(
      WriteRaw("negative.safetensors",
               R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
               std::string(4, '\0')),
      "tensor \"a\": shape must hold non-negative integers");
}

TEST_F(SafetensorsTest, RejectsNonStringMetadata) {
  ExpectRejected(
      WriteRaw("meta.safetensors", R"({"__metadata__":{"k":1}})", ""),
      "__metadata__[\"k\"] must be a string");
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  // Nesting like this once crashed error reporting by stack exhaustion.
  const std::string nested =
      std::string(100000, '[') + std::string(100000, ']');
  ExpectRejected(WriteRaw("nested.safetensors",
                          R"({"x":{"dtype":"F32","shape":)" + nested +
                              R"(,"data_offsets":[0,4]}})",
                          std::string(4, '\0')),
                 "JSON nested deeper than 8 levels");
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  const std::string path = Path("truncated.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::ones({256})}}).ok());
  fs::resize_file(path, fs::file_size(path) - 100);
  ExpectRejected(path, "lie outside the data buffer");
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(Path("nope.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, WriterReplacesAtomicallyAndLeavesNoTemporaries) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"v", torch::zeros({4})}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"v", torch::ones({4})}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Load("v").value().sum().item<float>(), 4.0f);
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "model.safetensors");
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(SafetensorsTest, WriterRejectsBadInputWithoutTouchingTarget) {
  const std::string path = Path("keep.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"v", torch::ones({2})}}).ok());
  EXPECT_FALSE(
      WriteSafetensors(path, {{"a", torch::ones({1})}, {"a", torch::ones({1})}})
          .ok());
  EXPECT_FALSE(
      WriteSafetensors(path, {{"__metadata__", torch::ones({1})}}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("no/such/dir/x.safetensors"),
                                {{"v", torch::ones({1})}})
                   .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_NE((*file)->Find("v"), nullptr);
}

TEST_F(SafetensorsTest, WriterRejectsNonUtf8Names) {
  const absl::Status status = WriteSafetensors(
      Path("utf8.safetensors"), {{"bad\xff\xfename", torch::ones({1})}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("valid UTF-8"));
  EXPECT_FALSE(fs::exists(Path("utf8.safetensors")));
}

TEST_F(SafetensorsTest, ShardedCheckpointResolvesEveryName) {
  ASSERT_TRUE(
      WriteSafetensors(Path("s1.safetensors"), {{"a", torch::ones({2})}}).ok());
  ASSERT_TRUE(
      WriteSafetensors(Path("s2.safetensors"), {{"b", torch::full({3}, 2.0)}})
          .ok());
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  auto checkpoint = SafetensorsCheckpoint::OpenDirectory(dir_.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(checkpoint->Load("b").value().sum().item<float>(), 6.0f);
  EXPECT_EQ(checkpoint->Load("c").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, ShardedIndexNamingAbsentTensorIsRejected) {
  ASSERT_TRUE(
      WriteSafetensors(Path("s1.safetensors"), {{"a", torch::ones({2})}}).ok());
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})";
  auto checkpoint = SafetensorsCheckpoint::OpenDirectory(dir_.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(std::string(checkpoint.status().message()),
              HasSubstr("tensor \"z\" is mapped to s1.safetensors but is not"));
}

TEST_F(SafetensorsTest, ShardedIndexWithPathOutsideDirectoryIsRejected) {
  std::ofstream(Path("model.safetensors.index.json"))
      << R"({"weight_map":{"a":"../elsewhere.safetensors"}})";
  auto checkpoint = SafetensorsCheckpoint::OpenDirectory(dir_.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(std::string(checkpoint.status().message()),
              HasSubstr("must be a file name in the same directory"));
}

TEST_F(SafetensorsTest, EmptyDirectoryIsNotFound) {
  auto checkpoint = SafetensorsCheckpoint::OpenDirectory(dir_.string());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loraplex
