#include "core/optim/newton_schulz.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"
#include "core/runtime/float_dtype.h"

namespace loraplex {
namespace {

// Frobenius norms below this are treated as this, so a zero update stays
// zero instead of becoming NaN.
constexpr double kNormFloor = 1e-7;

}  // namespace

const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set) {
  static const auto* const kSimple =
      new std::vector<NsCoefficients>{{3.4445, -4.7750, 2.0315}};
  static const auto* const kQuintic =
      new std::vector<NsCoefficients>{{4.0848, -6.8946, 2.9270},
                                      {3.9505, -6.3029, 2.6377},
                                      {3.7418, -5.5913, 2.3037},
                                      {2.8769, -3.1427, 1.2046},
                                      {2.8366, -3.0525, 1.2012}};
  static const auto* const kPolarExpress = new std::vector<NsCoefficients>{
      {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184},
      {3.9096, -2.8234, 0.5250},   {3.2856, -2.4153, 0.4853},
      {2.2779, -1.6198, 0.3985},   {1.8726, -1.2307, 0.3585},
      {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
  static const auto* const kAol =
      new std::vector<NsCoefficients>{{4.0098, -7.0585, 2.4635},
                                      {3.4585, -5.5479, 2.5959},
                                      {2.7573, -3.2939, 1.4254},
                                      {2.7215, -3.0494, 1.3169}};
  static const auto* const kNone = new std::vector<NsCoefficients>{};
  switch (set) {
    case NsCoefficientSet::kSimple:
      return *kSimple;
    case NsCoefficientSet::kQuintic:
      return *kQuintic;
    case NsCoefficientSet::kPolarExpress:
      return *kPolarExpress;
    case NsCoefficientSet::kAol:
      return *kAol;
    case NsCoefficientSet::kCustom:
      break;
  }
  return *kNone;
}

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

absl::string_view NsCoefficientSetName(NsCoefficientSet set) {
  switch (set) {
    case NsCoefficientSet::kSimple:
      return "simple";
    case NsCoefficientSet::kQuintic:
      return "quintic";
    case NsCoefficientSet::kPolarExpress:
      return "polar_express";
    case NsCoefficientSet::kAol:
      return "aol";
    case NsCoefficientSet::kCustom:
      return "custom";
  }
  return "unknown";
}

std::optional<NsCoefficientSet> ParseNsCoefficientSet(absl::string_view name) {
  return ParseEnumName(name, kAllNsCoefficientSets, &NsCoefficientSetName);
}

absl::string_view NsPrecisionName(NsPrecision precision) {
  return precision == NsPrecision::kBf16 ? "bf16" : "fp32";
}

std::optional<NsPrecision> ParseNsPrecision(absl::string_view name) {
  return ParseEnumName(name, kAllNsPrecisions, &NsPrecisionName);
}

std::string NewtonSchulzOptionsError(const NewtonSchulzOptions& options) {
  if (options.steps < 1) {
    return absl::StrCat("ns_steps must be >= 1, got ", options.steps);
  }
  if (options.coefficient_set == NsCoefficientSet::kCustom) {
    if (options.custom_coefficients.empty()) {
      return "coefficient_set is custom but custom_coefficients is empty";
    }
    for (size_t i = 0; i < options.custom_coefficients.size(); ++i) {
      const NsCoefficients& t = options.custom_coefficients[i];
      if (!std::isfinite(t.a) || !std::isfinite(t.b) || !std::isfinite(t.c)) {
        return absl::StrCat("custom_coefficients[", i, "] is not finite");
      }
    }
  }
  return "";
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

// How many matrices one CPU batch holds: enough to amortise per-call
// overhead on small LoRA shapes, few enough that the batch stays in a core's
// L2 cache through all iterations (one 2 MiB batch of 16×2048 matrices ran
// 1.3x slower than 16 separate ones) and that its elementwise passes stay
// under LibTorch's parallel grain of 32768 elements, so they do not start
// OpenMP threads that contend with OpenBLAS's (3x slower with both on two
// cores). A single matrix larger than that still forms a batch of one.
constexpr int64_t kCpuBatchBytes = 32768 * sizeof(float);

}  // namespace

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
  int64_t per_batch = count;
  if (batch.is_cpu()) {
    const int64_t matrix_bytes =
        std::max<int64_t>(1, batch.size(1) * batch.size(2) * 4);
    per_batch = std::max<int64_t>(1, kCpuBatchBytes / matrix_bytes);
  }
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
