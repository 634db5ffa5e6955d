#include "core/runtime/blas_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "absl/strings/match.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// deploy/setup.sh installs OpenBLAS and selects it; this checks that the
// selection reaches LibTorch in a real process.
TEST(BlasInfoTest, LibTorchRunsOnOpenBlas) {
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
  const BlasInfo blas = InspectBlas();
  bool openblas = false;
  for (const std::string& library : blas.libraries) {
    openblas |= library.find("openblas") != std::string::npos;
  }
  EXPECT_TRUE(openblas) << "loaded BLAS libraries: "
                        << ::testing::PrintToString(blas.libraries);
  EXPECT_FALSE(blas.openblas_core.empty());
}

// .ci/run reruns the numerics tests under other OPENBLAS_CORETYPE values:
// this checks those runs really use the kernels they name.
TEST(BlasInfoTest, KernelsAreTheOnesOpenBlasCoretypeNames) {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (coretype == nullptr || *coretype == '\0') {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is not set";
  }
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
  EXPECT_TRUE(absl::EqualsIgnoreCase(InspectBlas().openblas_core, coretype))
      << "OPENBLAS_CORETYPE=" << coretype << " but OpenBLAS runs "
      << InspectBlas().openblas_core << " kernels";
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
