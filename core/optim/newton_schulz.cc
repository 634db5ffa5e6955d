#include "core/optim/newton_schulz.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/runtime/float_dtype.h"

namespace loraplex {
namespace {

// Frobenius norms below this are treated as this, so a zero update stays
// zero instead of becoming NaN.
constexpr double kNormFloor = 1e-7;

}  // namespace

NsCoefficients NsCoefficientsForStep(const NewtonSchulzOptions& options,
                                     int step) {
  const std::vector<NsCoefficients>& table =
      options.coefficient_set == NsCoefficientSet::kCustom
          ? options.custom_coefficients
          : BuiltinNsCoefficients(options.coefficient_set);
  TORCH_CHECK(!table.empty(), "Newton-Schulz coefficient list is empty");
  const size_t index = static_cast<size_t>(step);
  if (options.coefficient_set == NsCoefficientSet::kPolarExpress) {
    // Its tuples are tuned per iteration; past the end the last one (a fixed
    // point polish) repeats.
    return table[std::min(index, table.size() - 1)];
  }
  return table[index % table.size()];
}

namespace {

// The iteration on a batch of wide ([k, m, n], m <= n) fp32 (or fp64)
// matrices; the result has the batch's dtype.
torch::Tensor OrthogonalizeWide(const torch::Tensor& batch,
                                const NewtonSchulzOptions& options) {
  const torch::Tensor norms =
      at::linalg_vector_norm(batch, 2, at::IntArrayRef{1, 2},
                             /*keepdim=*/true)
          .clamp_min(kNormFloor);
  torch::Tensor matrix = (batch / norms).contiguous();
  if (options.precision == NsPrecision::kBf16) {
    matrix = matrix.to(torch::kBFloat16);
  }
  for (int step = 0; step < options.steps; ++step) {
    const NsCoefficients k = NsCoefficientsForStep(options, step);
    const torch::Tensor gram = at::bmm(matrix, matrix.transpose(1, 2));
    // a·X + (b·A + c·A²)·X as one product (a·I + b·A + c·A²)·X: the
    // identity term goes into the small Gram-sized matrix, so the step is
    // BLAS calls only. (An elementwise pass over the big matrix here runs on
    // LibTorch's OpenMP pool, which contends with OpenBLAS's own threads
    // when both use every core: measured 5x slower steps.)
    torch::Tensor poly =
        at::baddbmm(gram, gram, gram, /*beta=*/k.b, /*alpha=*/k.c);
    poly.diagonal(0, 1, 2).add_(k.a);
    matrix = at::bmm(poly, matrix);
  }
  return matrix.to(batch.scalar_type());
}

// How many bytes of matrices one CPU batch holds. With a separate BLAS
// (Debian's LibTorch on OpenBLAS): enough to amortise per-call overhead on
// small LoRA shapes, few enough that the batch stays in a core's L2 cache
// through all iterations (one 2 MiB batch of 16×2048 matrices ran 1.3x
// slower than 16 separate ones) and that its elementwise passes stay under
// LibTorch's parallel grain of 32768 elements, so they do not start OpenMP
// threads that contend with OpenBLAS's (3x slower with both on two cores).
// With MKL (PyPI's LibTorch), whose batched GEMM runs on LibTorch's own
// OpenMP threads, larger batches are faster: 64 matrices each of the shapes
// 16×512, 16×1408, 16×256, 8×64 and 16×2048 took 27.3 ms on one core and
// 15.2 ms on two in batches of up to 1 MiB, against 38.6 and 46.7 ms in
// batches of up to 128 KiB (512 KiB: 28.8 / 18.1; 2 MiB: 27.6 / 16.9). A
// single matrix larger than the cap still forms a batch of one.
constexpr int64_t kCpuBatchBytes = 32768 * sizeof(float);
constexpr int64_t kCpuBatchBytesMkl = int64_t{1} << 20;

}  // namespace

int64_t NewtonSchulzBatchSize(int64_t rows, int64_t cols,
                              const torch::Device& device) {
  if (!device.is_cpu()) return std::numeric_limits<int64_t>::max();
  static const int64_t cap =
      at::globalContext().hasMKL() ? kCpuBatchBytesMkl : kCpuBatchBytes;
  const int64_t matrix_bytes = std::max<int64_t>(1, rows * cols * 4);
  return std::max<int64_t>(1, cap / matrix_bytes);
}

torch::Tensor NewtonSchulz(const torch::Tensor& x,
                           const NewtonSchulzOptions& options) {
  const std::string error = NewtonSchulzOptionsError(options);
  TORCH_CHECK(error.empty(), "Newton-Schulz: ", error);
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3,
              "Newton-Schulz needs a matrix or a batch of matrices, got ",
              x.dim(), " dims");
  TORCH_CHECK(x.is_floating_point(), "Newton-Schulz needs a float tensor");
  at::NoGradGuard no_grad;

  torch::Tensor batch = x.dim() == 2 ? x.unsqueeze(0) : x;
  batch = batch.to(Fp32OrFp64(batch.scalar_type()));
  // Work on the wide form so X Xᵀ is the smaller Gram matrix.
  const bool transposed = batch.size(1) > batch.size(2);
  if (transposed) batch = batch.transpose(1, 2);

  const int64_t count = batch.size(0);
  const int64_t per_batch =
      NewtonSchulzBatchSize(batch.size(1), batch.size(2), batch.device());
  torch::Tensor result;
  if (per_batch >= count) {
    result = OrthogonalizeWide(batch, options);
  } else {
    result = torch::empty(batch.sizes(), batch.options());
    for (int64_t begin = 0; begin < count; begin += per_batch) {
      const int64_t size = std::min(per_batch, count - begin);
      result.narrow(0, begin, size)
          .copy_(OrthogonalizeWide(batch.narrow(0, begin, size), options));
    }
  }

  if (transposed) result = result.transpose(1, 2);
  if (x.dim() == 2) result = result.squeeze(0);
  return result.contiguous();
}

}  // namespace loraplex
