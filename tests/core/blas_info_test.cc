#include "core/runtime/blas_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// PyPI's LibTorch has MKL linked in; with Debian's, deploy/setup.sh installs
// OpenBLAS and selects it. This checks, in a real process, that LibTorch's
// GEMMs run on one of the two.
TEST(BlasInfoTest, LibTorchRunsOnAnOptimizedBlas) {
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
  const BlasInfo blas = InspectBlas();
  if (blas.libtorch_blas == "mkl") {
    EXPECT_FALSE(blas.mkl_version.empty());
    EXPECT_THAT(DescribeBlas(blas), StartsWith("MKL "));
    EXPECT_EQ(BlasPerformanceWarning(blas, DetectCpuFeatures()), "");
    return;
  }
  bool openblas = false;
  for (const std::string& library : blas.libraries) {
    openblas |= library.find("openblas") != std::string::npos;
  }
  EXPECT_TRUE(openblas) << "LibTorch's BLAS: " << blas.libtorch_blas
                        << "; loaded BLAS libraries: "
                        << ::testing::PrintToString(blas.libraries);
  EXPECT_FALSE(blas.openblas_core.empty());
}

// On Debian's LibTorch, .ci/run reruns the numerics tests under other
// OPENBLAS_CORETYPE values: this checks those runs really use the kernels
// they name. MKL ignores the variable.
TEST(BlasInfoTest, KernelsAreTheOnesOpenBlasCoretypeNames) {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (coretype == nullptr || *coretype == '\0') {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is not set";
  }
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
  if (InspectBlas().libtorch_blas == "mkl") {
    GTEST_SKIP() << "LibTorch runs on MKL, which OPENBLAS_CORETYPE does not "
                    "select";
  }
  EXPECT_TRUE(absl::EqualsIgnoreCase(InspectBlas().openblas_core, coretype))
      << "OPENBLAS_CORETYPE=" << coretype << " but OpenBLAS runs "
      << InspectBlas().openblas_core << " kernels";
}

// deploy/numerics_matrix.sh reruns the numerics tests with
// ATEN_CPU_CAPABILITY set: this checks LibTorch's kernels are the ones it
// names.
TEST(BlasInfoTest, CpuKernelsAreTheOnesAtenCpuCapabilityNames) {
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  if (capability == nullptr || *capability == '\0') {
    GTEST_SKIP() << "ATEN_CPU_CAPABILITY is not set";
  }
  if (CpuCapability().empty()) {
    GTEST_SKIP() << "this LibTorch does not report its CPU capability";
  }
  EXPECT_TRUE(absl::EqualsIgnoreCase(CpuCapability(), capability))
      << "ATEN_CPU_CAPABILITY=" << capability << " but LibTorch runs "
      << CpuCapability() << " kernels";
}

TEST(BlasInfoTest, DescribesEachKind) {
  BlasInfo mkl;
  mkl.libtorch_blas = "mkl";
  mkl.mkl_version = "2024.2";
  mkl.libraries = {"/venv/nvidia/cublas/lib/libcublas.so.13"};
  EXPECT_EQ(DescribeBlas(mkl), "MKL 2024.2 (built into LibTorch)");
  BlasInfo openblas;
  openblas.libtorch_blas = "open";
  openblas.openblas_core = "Haswell";
  openblas.libraries = {"/usr/lib/libopenblasp-r0.3.21.so"};
  EXPECT_EQ(DescribeBlas(openblas),
            "OpenBLAS, Haswell kernels (/usr/lib/libopenblasp-r0.3.21.so)");
  BlasInfo reference;
  reference.libtorch_blas = "generic";
  EXPECT_EQ(DescribeBlas(reference), "generic");
  EXPECT_EQ(DescribeBlas(BlasInfo{}), "unknown");
}

// MKL linked into LibTorch is fast whatever shared BLAS (cuBLAS) is mapped.
TEST(BlasInfoTest, NoWarningWithMkl) {
  BlasInfo blas;
  blas.libtorch_blas = "mkl";
  blas.libraries = {"/venv/nvidia/cublas/lib/libcublas.so.13"};
  EXPECT_EQ(BlasPerformanceWarning(blas, {true, true}), "");
}

TEST(BlasInfoTest, WarnsAboutReferenceBlas) {
  BlasInfo blas;
  blas.libraries = {"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"};
  EXPECT_THAT(BlasPerformanceWarning(blas, {}),
              HasSubstr("install libopenblas0-pthread"));
}

TEST(BlasInfoTest, WarnsAboutGenericKernelsOnModernCpus) {
  BlasInfo blas;
  blas.libraries = {"/usr/lib/x86_64-linux-gnu/libopenblasp-r0.3.21.so"};
  blas.openblas_core = "Prescott";
  EXPECT_THAT(BlasPerformanceWarning(blas, {true, true}),
              HasSubstr("OPENBLAS_CORETYPE=SkylakeX"));
  EXPECT_THAT(BlasPerformanceWarning(blas, {true, false}),
              HasSubstr("OPENBLAS_CORETYPE=Haswell"));
  EXPECT_EQ(BlasPerformanceWarning(blas, {false, false}), "");
  blas.openblas_core = "SkylakeX";
  EXPECT_EQ(BlasPerformanceWarning(blas, {true, true}), "");
}

}  // namespace
}  // namespace loraplex
