// Prometheus text-format details of /metrics (the values themselves are
// checked through the real server by tests/tinker/sdk_supervised_test.py).
#include "server/http/metrics.h"

#include <gtest/gtest.h>

namespace loraplex {
namespace {

TEST(MetricsTest, LabelValuesAreEscapedAsTheTextFormatRequires) {
  EXPECT_EQ(PrometheusLabel("alice"), "alice");
  EXPECT_EQ(PrometheusLabel("a\"b"), "a\\\"b");
  EXPECT_EQ(PrometheusLabel("a\\b"), "a\\\\b");
  EXPECT_EQ(PrometheusLabel("a\nb"), "a\\nb");
}

}  // namespace
}  // namespace loraplex
