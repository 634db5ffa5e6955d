// MXFP4 dequantization of gpt-oss checkpoints' expert weights.
//
// A released gpt-oss checkpoint stores each expert projection as
// `<name>_blocks` (uint8 [*prefix, G, 16]: 32 FP4 e2m1 values per row of 16
// bytes, the low nibble first) and `<name>_scales` (uint8 [*prefix, G]: one
// e8m0 exponent per block of 32, bias 127). DequantizeMxfp4 turns the pair
// into the dense tensor transformers' convert_moe_packed_tensors (5.24)
// builds, same shape and same bits:
//
//   LORAPLEX_RETURN_IF_ERROR(CheckMxfp4Shapes(blocks, scales));
//   torch::Tensor w = DequantizeMxfp4(blocks, scales, torch::kBFloat16);
//   // blocks [E, R, G, 16] -> w [E, G * 32, R].
#ifndef LORAPLEX_CORE_MODEL_MXFP4_H_
#define LORAPLEX_CORE_MODEL_MXFP4_H_

#include <torch/types.h>

#include <cstdint>

#include "absl/status/status.h"

namespace loraplex {

// Bytes per MXFP4 block: 32 four-bit values.
inline constexpr int64_t kMxfp4BlockBytes = 16;

// OK when `blocks` is uint8 [*prefix, G, 16] with at least two prefix
// dimensions (transformers transposes the first two of the output) and
// `scales` uint8 [*prefix, G]; otherwise INVALID_ARGUMENT naming both
// shapes and dtypes.
absl::Status CheckMxfp4Shapes(const torch::Tensor& blocks,
                              const torch::Tensor& scales);

// The dense weights of `blocks` and `scales` (checked as above; a bad pair
// throws c10::Error with CheckMxfp4Shapes' message), in `dtype` (a floating
// type; transformers' default is bfloat16) on blocks' device, laid out as
// transformers returns it: the values as [*prefix, G * 32] with dimensions 1
// and 2 swapped, contiguous ([P0, G * 32, P1] for the usual [P0, P1, G, 16]
// blocks). Each value is ldexp(FP4 value, scale - 127) in `dtype`
// (torch::ldexp, as transformers): exact in bfloat16 and float32, ±inf
// past their range (zeros stay zeros, even at scale 255). Works in chunks
// of rows, so the temporaries stay a few tens of MiB beside the result
// whatever its size.
torch::Tensor DequantizeMxfp4(const torch::Tensor& blocks,
                              const torch::Tensor& scales,
                              torch::ScalarType dtype = torch::kBFloat16);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MXFP4_H_
