// /metrics of the real server while a job trains: training pass times,
// checkpoint times and failures, calls by transport, method and code, and
// when the job last stepped.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/common/free_port.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// The value of the sample `series` (name and labels, as printed), if the
// scrape has it.
std::optional<double> Sample(const std::string& text,
                             const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0.0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return std::nullopt;
}

class ServiceMetricsTest : public ::testing::Test {
 protected:
  void Start(const std::string& state) {
    port_ = FreePort();
    server_ = StartServer(state, 1,
                          {"--checkpoint-interval=2", "--http-listen",
                           absl::StrCat("127.0.0.1:", port_)});
    ASSERT_NE(server_, nullptr);
    client_ = ClientFor(*server_);
  }

  std::string Scrape() {
    httplib::Client http("127.0.0.1", port_);
    httplib::Result result = http.Get("/metrics");
    EXPECT_TRUE(result && result->status == 200);
    return result ? result->body : "";
  }

  // A job that trains until cancelled, once it has made `steps` steps.
  v1::Job RunningJob(int64_t steps) {
    auto dataset = client_->UploadDatasetContents(ReversalJsonl(10, 1), "d");
    EXPECT_TRUE(dataset.ok()) << dataset.status();
    auto job = client_->CreateJob(
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 2, 1000000, 1));
    EXPECT_TRUE(job.ok()) << job.status();
    auto running = WaitUntil(*client_, job->name(), [&](const v1::Job& job) {
      return job.metrics().step() >= steps;
    });
    EXPECT_TRUE(running.ok()) << running.status();
    return *running;
  }

  int port_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<LoraplexClient> client_;
};

TEST_F(ServiceMetricsTest, StepsCheckpointsAndCallsAreCounted) {
  Start(FreshTestDir("state"));
  const std::string before = Scrape();
  EXPECT_EQ(Sample(before, "loraplex_train_step_seconds_count"), 0.0);
  EXPECT_EQ(Sample(before, "loraplex_checkpoint_seconds_count"), 0.0);
  EXPECT_THAT(before, HasSubstr("# TYPE loraplex_train_step_seconds summary"));
  EXPECT_EQ(client_->GetJob("jobs/none").status().code(),
            absl::StatusCode::kNotFound);

  const double created = absl::ToUnixMillis(absl::Now()) / 1e3;
  const v1::Job job = RunningJob(5);
  const std::string text = Scrape();
  const double scraped = absl::ToUnixMillis(absl::Now()) / 1e3;

  EXPECT_GE(Sample(text, "loraplex_train_step_seconds_count").value_or(0), 5);
  EXPECT_GT(Sample(text, "loraplex_train_step_seconds_sum").value_or(0), 0);
  EXPECT_GT(Sample(text, "loraplex_train_step_last_seconds").value_or(0), 0);
  // Every second step checkpoints the pool: steps 2 and 4 at least.
  EXPECT_GE(Sample(text, "loraplex_checkpoint_seconds_count").value_or(0), 2);
  EXPECT_GT(Sample(text, "loraplex_checkpoint_seconds_sum").value_or(0), 0);
  EXPECT_GT(Sample(text, "loraplex_checkpoint_last_seconds").value_or(0), 0);
  EXPECT_EQ(Sample(text, "loraplex_checkpoint_failures_total"), 0.0);

  EXPECT_EQ(Sample(text,
                   "loraplex_requests_total{transport=\"grpc\",method=\"/"
                   "loraplex.v1.JobService/GetJob\",code=\"NOT_FOUND\"}"),
            1.0);
  EXPECT_EQ(Sample(text,
                   "loraplex_requests_total{transport=\"grpc\",method=\"/"
                   "loraplex.v1.JobService/CreateJob\",code=\"OK\"}"),
            1.0);
  EXPECT_EQ(Sample(text,
                   "loraplex_requests_total{transport=\"http\",method=\"/"
                   "metrics\",code=\"200\"}"),
            1.0);  // The scrape before; this one is counted once answered.

  const std::string job_id = job.name().substr(job.name().find('/') + 1);
  const std::optional<double> stepped = Sample(
      text, absl::StrCat("loraplex_job_last_step_timestamp_seconds{tenant="
                         "\"default\",job=\"",
                         job_id, "\"}"));
  ASSERT_TRUE(stepped.has_value()) << text;
  EXPECT_GE(*stepped, created - 1.0);
  EXPECT_LE(*stepped, scraped + 1.0);

  // Ids in HTTP paths are folded into {id}. A request is counted once its
  // answer is written, which the client may see first: scrape until it is.
  httplib::Client http("127.0.0.1", port_);
  ASSERT_TRUE(http.Get("/api/v1/samplers/tinker-x1:sample:0"));
  const std::string folded =
      "loraplex_requests_total{transport=\"http\",method=\"/"
      "api/v1/samplers/{id}\",code=\"";
  std::string after = Scrape();
  for (int tries = 0; tries < 500 && !absl::StrContains(after, folded);
       ++tries) {
    absl::SleepFor(absl::Milliseconds(20));
    after = Scrape();
  }
  EXPECT_THAT(after, HasSubstr(folded));

  ASSERT_TRUE(client_->CancelJob(job.name()).ok());
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

TEST_F(ServiceMetricsTest, CheckpointFailuresAreCounted) {
  const std::string state = FreshTestDir("state");
  std::ofstream(state + "/checkpoints") << "not a directory";
  Start(state);
  const v1::Job job = RunningJob(5);
  const std::string text = Scrape();
  EXPECT_GE(Sample(text, "loraplex_checkpoint_failures_total").value_or(0), 2)
      << text;
  EXPECT_EQ(Sample(text, "loraplex_checkpoint_seconds_count"), 0.0);
  ASSERT_TRUE(client_->CancelJob(job.name()).ok());
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

}  // namespace
}  // namespace loraplex
