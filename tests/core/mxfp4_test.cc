// MXFP4 dequantization against transformers' convert_moe_packed_tensors
// (tests/fixtures/golden/rope_mxfp4, tools/golden/make_rope_mxfp4_golden.py).
#include "core/model/mxfp4.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "core/safetensors/safetensors.h"

namespace loraplex {
namespace {

std::shared_ptr<const SafetensorsFile> OpenFixture() {
  auto file = SafetensorsFile::Open(std::string(LORAPLEX_SOURCE_DIR) +
                                    "/tests/fixtures/golden/rope_mxfp4/"
                                    "mxfp4.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? *file : nullptr;
}

// The bits of a floating tensor as integers of its width, so that -0 and +0
// differ and NaN equals itself.
torch::Tensor Bits(const torch::Tensor& t) {
  switch (t.element_size()) {
    case 2:
      return t.contiguous().view(torch::kInt16);
    case 4:
      return t.contiguous().view(torch::kInt32);
  }
  return t.contiguous().view(torch::kInt64);
}

void ExpectSameBits(const torch::Tensor& got, const torch::Tensor& want) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type());
  ASSERT_EQ(got.sizes(), want.sizes());
  const torch::Tensor differ = Bits(got).ne(Bits(want));
  EXPECT_EQ(differ.sum().item<int64_t>(), 0)
      << "first differing index "
      << differ.flatten().nonzero().flatten()[0].item<int64_t>();
}

TEST(Mxfp4GoldenTest, MatchesTransformersBitForBit) {
  auto file = OpenFixture();
  ASSERT_NE(file, nullptr);
  const struct {
    const char* name;
    torch::ScalarType dtype;
  } cases[] = {{"experts.bf16", torch::kBFloat16},
               {"experts.f16", torch::kHalf},
               {"experts.f32", torch::kFloat32},
               {"rank5.bf16", torch::kBFloat16},
               {"scale255.bf16", torch::kBFloat16}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string name = c.name;
    const std::string prefix = name.substr(0, name.find('.'));
    const torch::Tensor blocks = file->Load(prefix + ".blocks").value();
    const torch::Tensor scales = file->Load(prefix + ".scales").value();
    ASSERT_TRUE(CheckMxfp4Shapes(blocks, scales).ok());
    ExpectSameBits(DequantizeMxfp4(blocks, scales, c.dtype),
                   file->Load(name).value());
  }
  // bfloat16 unless told otherwise, as transformers.
  EXPECT_EQ(DequantizeMxfp4(file->Load("rank5.blocks").value(),
                            file->Load("rank5.scales").value())
                .scalar_type(),
            torch::kBFloat16);
}

TEST(Mxfp4Test, ChunkedResultEqualsOnePassOverLargeTensor) {
  // 2 x 40000 x 8 rows: several chunks per leading index, the last short.
  torch::manual_seed(7);
  const torch::Tensor blocks =
      torch::randint(0, 256, {2, 40000, 8, 16}, torch::kUInt8);
  const torch::Tensor scales =
      torch::randint(100, 150, {2, 40000, 8}, torch::kUInt8);
  const torch::Tensor lut =
      torch::tensor({0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0,
                     -1.5, -2.0, -3.0, -4.0, -6.0},
                    torch::kFloat32);
  const torch::Tensor low =
      lut.index({torch::bitwise_and(blocks, 15).to(torch::kLong)});
  const torch::Tensor high =
      lut.index({torch::bitwise_right_shift(blocks, 4).to(torch::kLong)});
  const torch::Tensor values =
      torch::stack({low, high}, -1).reshape({2, 40000, 8, 32});
  const torch::Tensor powers =
      torch::pow(2.0, scales.to(torch::kFloat64) - 127).to(torch::kFloat32);
  const torch::Tensor want = (values * powers.unsqueeze(-1))
                                 .reshape({2, 40000, 256})
                                 .transpose(1, 2)
                                 .contiguous()
                                 .to(torch::kBFloat16);
  const torch::Tensor got = DequantizeMxfp4(blocks, scales, torch::kBFloat16);
  EXPECT_TRUE(got.is_contiguous());
  ExpectSameBits(got, want);
}

TEST(Mxfp4Test, RefusesMismatchedShapesNamingThem) {
  const torch::Tensor blocks = torch::zeros({3, 5, 4, 16}, torch::kUInt8);
  const struct {
    torch::Tensor blocks;
    torch::Tensor scales;
    const char* message;
  } cases[] = {
      {blocks, torch::zeros({3, 5, 3}, torch::kUInt8),
       "MXFP4 blocks (Byte [3, 5, 4, 16]) and scales (Byte [3, 5, 3]): "
       "scales must have blocks' shape without its last dimension"},
      {torch::zeros({3, 5, 4, 8}, torch::kUInt8),
       torch::zeros({3, 5, 4}, torch::kUInt8),
       "blocks' last dimension must be 16 bytes"},
      {torch::zeros({5, 4, 16}, torch::kUInt8),
       torch::zeros({5, 4}, torch::kUInt8), "at least two prefix dimensions"},
      {blocks, torch::zeros({3, 5, 4}, torch::kInt32),
       "scales (Int [3, 5, 4]): both must be uint8"},
  };
  for (const auto& c : cases) {
    const absl::Status status = CheckMxfp4Shapes(c.blocks, c.scales);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
    EXPECT_THROW(DequantizeMxfp4(c.blocks, c.scales), c10::Error);
  }
}

}  // namespace
}  // namespace loraplex
