// Prometheus text-format details of /metrics (the values themselves are
// checked through the real server by tests/tinker/sdk_supervised_test.py).
#include "server/http/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "server/common/request_counters.h"

namespace loraplex {
namespace {

TEST(MetricsTest, LabelValuesAreEscapedAsTheTextFormatRequires) {
  EXPECT_EQ(PrometheusLabel("alice"), "alice");
  EXPECT_EQ(PrometheusLabel("a\"b"), "a\\\"b");
  EXPECT_EQ(PrometheusLabel("a\\b"), "a\\\\b");
  EXPECT_EQ(PrometheusLabel("a\nb"), "a\\nb");
}

TEST(MetricsTest, ValuesKeepAllTheirDigits) {
  EXPECT_EQ(PrometheusValue(1796320123.456), "1796320123.456");
  EXPECT_EQ(PrometheusValue(123456789012.0), "123456789012");
  EXPECT_EQ(PrometheusValue(0.1), "0.1");
  EXPECT_EQ(PrometheusValue(0.0), "0");
  EXPECT_EQ(PrometheusValue(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(PrometheusValue(std::nan("")), "NaN");
  EXPECT_EQ(PrometheusValue(HUGE_VAL), "+Inf");
  EXPECT_EQ(PrometheusValue(-HUGE_VAL), "-Inf");
}

TEST(MetricsTest, HttpRoutesFoldIdsIntoOneLabelValue) {
  EXPECT_EQ(HttpRoute("/api/v1/create_model"), "/api/v1/create_model");
  EXPECT_EQ(HttpRoute("/api/v1/sessions/tinker-4x8/finish"),
            "/api/v1/sessions/{id}/finish");
  EXPECT_EQ(HttpRoute("/api/v1/samplers/tinker-x1:sample:0"),
            "/api/v1/samplers/{id}");
  EXPECT_EQ(HttpRoute("/api/v1/training_runs/Run7"),
            "/api/v1/training_runs/{id}");
  EXPECT_EQ(HttpRoute("/metrics"), "/metrics");
  EXPECT_EQ(HttpRoute(""), "/");
  EXPECT_EQ(HttpRoute("//api//v1/"), "/api/v1");
}

TEST(MetricsTest, RequestCountsAreKeptPerTransportMethodAndCode) {
  RequestCounters counters;
  counters.Count("grpc", "/loraplex.v1.JobService/GetJob", "OK");
  counters.Count("http", "/metrics", "200");
  counters.Count("grpc", "/loraplex.v1.JobService/GetJob", "NOT_FOUND");
  counters.Count("grpc", "/loraplex.v1.JobService/GetJob", "OK");
  std::vector<std::string> seen;
  for (const RequestCount& c : counters.Snapshot()) {
    seen.push_back(c.transport + " " + c.method + " " + c.code + " " +
                   std::to_string(c.count));
  }
  EXPECT_THAT(seen, ::testing::ElementsAre(
                        "grpc /loraplex.v1.JobService/GetJob NOT_FOUND 1",
                        "grpc /loraplex.v1.JobService/GetJob OK 2",
                        "http /metrics 200 1"));
}

}  // namespace
}  // namespace loraplex
