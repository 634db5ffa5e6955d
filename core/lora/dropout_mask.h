// LoRA dropout masks computed on the device the activations are on, the
// same bits on every device: each element's keep/drop is a pure function of
// its row's seed and its position, evaluated with exact integer tensor ops
// (no device random generator, whose streams differ between CPU and CUDA).
#ifndef LORAPLEX_CORE_LORA_DROPOUT_MASK_H_
#define LORAPLEX_CORE_LORA_DROPOUT_MASK_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace loraplex {

// A [rows, seq, width] float32 mask on `device` of 0 (dropped) and 1 / keep
// (kept): element (r, t, c) is kept when H(row_seeds[r], t * width + c) <
// keep * 2^32, where, in 32-bit unsigned arithmetic,
//   H(seed, i) = Mix(Mix(i ^ low32(seed)) ^ high32(seed)),
//   Mix(x) = two rounds of x = ((x >> 16) ^ x) * 0x45d9f3b, then
//            (x >> 16) ^ x. A position's bit
// does not depend on `seq`, so a row's mask is the same however much
// padding its batch gives it.
torch::Tensor ScaledDropoutMask(const std::vector<uint64_t>& row_seeds,
                                int64_t seq, int64_t width, double keep,
                                const torch::Device& device);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_LORA_DROPOUT_MASK_H_
