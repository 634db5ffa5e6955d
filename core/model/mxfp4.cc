#include "core/model/mxfp4.h"

#include <torch/torch.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

// Rows of 16 bytes dequantized at a time: 8 Mi values, so the index and
// value temporaries of one chunk stay within some tens of MiB.
constexpr int64_t kChunkRows = int64_t{1} << 18;

// FP4 e2m1 by nibble, as transformers' FP4_VALUES: sign in bit 3, then two
// exponent bits and one mantissa bit.
constexpr double kFp4Values[16] = {+0.0, +0.5, +1.0, +1.5, +2.0, +3.0,
                                   +4.0, +6.0, -0.0, -0.5, -1.0, -1.5,
                                   -2.0, -3.0, -4.0, -6.0};

std::string Describe(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream out;
  out << c10::toString(t.scalar_type()) << " " << t.sizes();
  return out.str();
}

// rows uint8 [n, 16], exponents int32 [n, 1] (scale - 127) into out [n, 32]:
// transformers' per-chunk steps, the low nibble to the even columns, the
// high one to the odd, then ldexp in place.
void DequantizeRows(const torch::Tensor& rows, const torch::Tensor& exponents,
                    const torch::Tensor& lut, torch::Tensor out) {
  using torch::indexing::None;
  using torch::indexing::Slice;
  out.index_put_({Slice(), Slice(0, None, 2)},
                 lut.index({torch::bitwise_and(rows, 0x0F).to(torch::kInt)}));
  out.index_put_(
      {Slice(), Slice(1, None, 2)},
      lut.index({torch::bitwise_right_shift(rows, 4).to(torch::kInt)}));
  torch::ldexp_out(out, out, exponents);
}

}  // namespace

absl::Status CheckMxfp4Shapes(const torch::Tensor& blocks,
                              const torch::Tensor& scales) {
  const auto fail = [&](const std::string& reason) {
    return absl::InvalidArgumentError(
        absl::StrCat("MXFP4 blocks (", Describe(blocks), ") and scales (",
                     Describe(scales), "): ", reason));
  };
  if (!blocks.defined() || !scales.defined()) {
    return fail("both must be defined");
  }
  if (blocks.scalar_type() != torch::kUInt8 ||
      scales.scalar_type() != torch::kUInt8) {
    return fail("both must be uint8");
  }
  if (blocks.dim() < 4) {
    return fail(
        "blocks must be [*prefix, G, 16] with at least two prefix "
        "dimensions");
  }
  if (blocks.size(-1) != kMxfp4BlockBytes) {
    return fail(absl::StrCat("blocks' last dimension must be ",
                             kMxfp4BlockBytes, " bytes (32 FP4 values)"));
  }
  if (scales.sizes() != blocks.sizes().slice(0, blocks.dim() - 1)) {
    return fail("scales must have blocks' shape without its last dimension");
  }
  if (scales.device() != blocks.device()) {
    return fail("both must be on one device");
  }
  return absl::OkStatus();
}

torch::Tensor DequantizeMxfp4(const torch::Tensor& blocks,
                              const torch::Tensor& scales,
                              torch::ScalarType dtype) {
  const absl::Status status = CheckMxfp4Shapes(blocks, scales);
  TORCH_CHECK(status.ok(), status.ToString());
  TORCH_CHECK(c10::isFloatingType(dtype),
              "MXFP4 dequantization needs a floating dtype, got ", dtype);
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(dtype).device(blocks.device());
  const torch::Tensor lut =
      torch::tensor(c10::ArrayRef<double>(kFp4Values), options);

  // The result, and the same memory seen as [*prefix, G * 32], the layout
  // the chunks are written in.
  std::vector<int64_t> shape(blocks.sizes().begin(), blocks.sizes().end() - 1);
  shape.back() *= 2 * kMxfp4BlockBytes;
  std::swap(shape[1], shape[2]);
  torch::Tensor out = torch::empty(shape, options);
  if (out.numel() == 0) return out;
  const torch::Tensor values = out.transpose(1, 2);

  // Chunks are runs of whole slices along the second prefix dimension, so
  // each lands in `values` as one narrow of one leading index.
  const int64_t leading = blocks.size(0);
  const int64_t slices = blocks.size(1);
  const int64_t rows_per_slice = scales[0][0].numel();
  const int64_t step = std::max<int64_t>(1, kChunkRows / rows_per_slice);
  for (int64_t i = 0; i < leading; ++i) {
    for (int64_t begin = 0; begin < slices; begin += step) {
      const int64_t count = std::min(step, slices - begin);
      const torch::Tensor rows =
          blocks[i].narrow(0, begin, count).reshape({-1, kMxfp4BlockBytes});
      const torch::Tensor exponents =
          scales[i].narrow(0, begin, count).to(torch::kInt).reshape({-1, 1}) -
          127;
      torch::Tensor chunk =
          torch::empty({rows.size(0), 2 * kMxfp4BlockBytes}, options);
      DequantizeRows(rows, exponents, lut, chunk);
      torch::Tensor target = values[i].narrow(0, begin, count);
      target.copy_(chunk.view(target.sizes()));
    }
  }
  return out;
}

}  // namespace loraplex
