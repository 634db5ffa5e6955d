#include "server/store/job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

std::unique_ptr<JobStore> OpenStore(const std::string& path) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

DatasetRecord MakeDataset(const std::string& id, const std::string& tenant) {
  DatasetRecord dataset;
  dataset.id = id;
  dataset.tenant = tenant;
  dataset.display_name = "Dataset " + id;
  dataset.size_bytes = 123456789012;
  dataset.num_examples = 4242;
  dataset.sha256 = std::string(64, 'a');
  dataset.create_time_ms = 1700000000123;
  return dataset;
}

JobRecord MakeJob(const std::string& id, const std::string& tenant,
                  JobStatus status = JobStatus::kQueued) {
  JobRecord job;
  job.id = id;
  job.tenant = tenant;
  job.status = status;
  job.base_model = "llama-tiny";
  job.spec = {{"lora", {{"rank", 8}, {"alpha", 16.0}}},
              {"training", {{"max_steps", 10}}}};
  return job;
}

// A job with every field away from its default.
JobRecord MakeFullJob(const std::string& id, const std::string& tenant) {
  JobRecord job = MakeJob(id, tenant, JobStatus::kFailed);
  job.display_name = "Full \"job\" \xE2\x9C\x93";
  job.training_dataset_id = "train-1";
  job.validation_dataset_id = "valid-1";
  job.initial_adapter_id = "adapter-0";
  job.spec = {{"lora",
               {{"rank", 16},
                {"alpha", 0.1},
                {"target_modules", {"q_proj", "v_proj"}}}},
              {"optimizer", {{"kind", "muon"}, {"lr", 2e-4}}},
              {"schedule", {{"warmup", 0}, {"cosine", true}}},
              {"training", {{"seed", 18446744073709551615ULL}}}};
  job.slot = 3;
  job.total_steps = 1000;
  job.metrics.step = 517;
  job.metrics.loss = 1.0 / 3.0;
  job.metrics.lr = 1.25e-5;
  job.metrics.grad_norm = 0.7071067811865476;
  job.metrics.tokens_per_second = 12345.678;
  job.metrics.tokens = 9876543210;
  job.metrics.skipped_steps = 2;
  job.metrics.validation_loss = 0.1 + 0.2;
  job.metrics.expert_tokens = {7, 0, 41};
  job.error_code = "RESOURCE_EXHAUSTED";
  job.error_message = "out of memory at step 517";
  job.adapter_id = "adapter-7";
  job.create_time_ms = 1700000000001;
  job.start_time_ms = 1700000000002;
  job.end_time_ms = 1700000000003;
  return job;
}

JobEventRecord StatusEvent(JobStatus status, const std::string& message) {
  JobEventRecord event;
  event.status = status;
  event.message = message;
  event.time_ms = 1700000000500;
  return event;
}

JobEventRecord MetricsEvent(int64_t step, double loss) {
  JobEventRecord event;
  event.metrics.step = step;
  event.metrics.loss = loss;
  event.metrics.tokens = step * 100;
  event.time_ms = 1700000000600 + step;
  return event;
}

AdapterRecord MakeAdapter(const std::string& id, const std::string& tenant) {
  AdapterRecord adapter;
  adapter.id = id;
  adapter.tenant = tenant;
  adapter.display_name = "Adapter " + id;
  adapter.job_id = "job-1";
  adapter.base_model = "llama-tiny";
  adapter.lora = {{"rank", 4}, {"alpha", 8.0}, {"dropout", 0.05}};
  adapter.create_time_ms = 1700000000777;
  return adapter;
}

// Equal, or both NaN (NaN != NaN).
bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

void ExpectSameMetrics(const JobMetricsRecord& a, const JobMetricsRecord& b) {
  EXPECT_EQ(std::tie(a.step, a.tokens, a.skipped_steps),
            std::tie(b.step, b.tokens, b.skipped_steps));
  const std::pair<double, double> doubles[] = {
      {a.loss, b.loss},
      {a.lr, b.lr},
      {a.grad_norm, b.grad_norm},
      {a.tokens_per_second, b.tokens_per_second},
      {a.validation_loss.value_or(-1.0), b.validation_loss.value_or(-1.0)}};
  for (const auto& [x, y] : doubles) {
    EXPECT_TRUE(SameDouble(x, y)) << x << " vs " << y;
  }
  EXPECT_EQ(a.validation_loss.has_value(), b.validation_loss.has_value());
  EXPECT_EQ(a.expert_tokens, b.expert_tokens);
}

// The fields other than doubles (NaN != NaN), for one EXPECT_EQ.
auto ExactFields(const JobRecord& j) {
  return std::tie(j.id, j.tenant, j.display_name, j.base_model,
                  j.training_dataset_id, j.validation_dataset_id,
                  j.initial_adapter_id, j.spec, j.status, j.slot, j.total_steps,
                  j.error_code, j.error_message, j.adapter_id, j.create_time_ms,
                  j.start_time_ms, j.end_time_ms);
}
auto ExactFields(const JobEventRecord& e) {
  return std::tie(e.job_id, e.sequence, e.time_ms, e.status, e.message,
                  e.error_code, e.error_message);
}
auto ExactFields(const DatasetRecord& d) {
  return std::tie(d.id, d.tenant, d.display_name, d.size_bytes, d.num_examples,
                  d.sha256, d.create_time_ms);
}
auto ExactFields(const AdapterRecord& a) {
  return std::tie(a.id, a.tenant, a.display_name, a.job_id, a.base_model,
                  a.lora, a.create_time_ms);
}

template <typename Record>
void ExpectSame(const Record& a, const Record& b) {
  EXPECT_EQ(ExactFields(a), ExactFields(b));
  if constexpr (std::is_same_v<Record, JobRecord> ||
                std::is_same_v<Record, JobEventRecord>) {
    ExpectSameMetrics(a.metrics, b.metrics);
  }
}

template <typename Record>
std::vector<std::string> Ids(const std::vector<Record>& records) {
  std::vector<std::string> ids;
  for (const Record& record : records) ids.push_back(record.id);
  return ids;
}

std::vector<int64_t> Sequences(const std::vector<JobEventRecord>& events) {
  std::vector<int64_t> sequences;
  for (const JobEventRecord& event : events) {
    sequences.push_back(event.sequence);
  }
  return sequences;
}

// The ids on each page of a listing, following its tokens to the end.
template <typename Record, typename List>
std::vector<std::vector<std::string>> PageIds(List list) {
  std::vector<std::vector<std::string>> pages;
  std::string token;
  do {
    absl::StatusOr<Page<Record>> page = list(token);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) break;
    pages.push_back(Ids(page->items));
    token = page->next_page_token;
  } while (!token.empty());
  return pages;
}

// The value of a call that must succeed (a default one after a failure).
template <typename T>
T ValueOf(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : T();
}

void ExpectCode(const absl::Status& status, absl::StatusCode code,
                const std::string& substring) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
}

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = FreshTestDir() + "/loraplex.db";
    store_ = OpenStore(path_);
    ASSERT_NE(store_, nullptr);
  }

  void Reopen() {
    store_.reset();
    store_ = OpenStore(path_);
    ASSERT_NE(store_, nullptr);
  }

  std::string path_;
  std::unique_ptr<JobStore> store_;
};

TEST(JobStatusTest, NamesAndTerminalStates) {
  std::vector<std::string> names;
  for (JobStatus status : kAllJobStatuses) {
    names.emplace_back(JobStatusName(status));
  }
  EXPECT_THAT(names, ElementsAre("VALIDATING", "QUEUED", "RUNNING", "SUCCEEDED",
                                 "FAILED", "CANCELLED", "PAUSED"));
  std::vector<JobStatus> terminal;
  for (JobStatus status : kAllJobStatuses) {
    if (IsTerminal(status)) terminal.push_back(status);
  }
  EXPECT_THAT(terminal, ElementsAre(JobStatus::kSucceeded, JobStatus::kFailed,
                                    JobStatus::kCancelled));
}

TEST_F(JobStoreTest, JobRoundTripsEveryField) {
  const JobRecord job = MakeFullJob("job-full", "tenant-a");
  ASSERT_TRUE(store_->InsertJob(job, {}).ok());
  ExpectSame(ValueOf(store_->GetJob("tenant-a", "job-full")), job);

  // UpdateJob replaces every column, including clearing validation_loss.
  JobRecord changed = MakeJob("job-full", "tenant-a", JobStatus::kPaused);
  changed.metrics.loss = 2.5;
  ASSERT_TRUE(store_->UpdateJob(changed, {}).ok());
  const JobRecord stored = ValueOf(store_->GetJob("tenant-a", "job-full"));
  ExpectSame(stored, changed);
  EXPECT_FALSE(stored.metrics.validation_loss.has_value());
}

TEST_F(JobStoreTest, NonFiniteMetricsRoundTrip) {
  // SQLite would store a bound NaN as NULL.
  JobRecord job = MakeJob("job-nan", "t");
  job.metrics.loss = std::numeric_limits<double>::quiet_NaN();
  job.metrics.grad_norm = std::numeric_limits<double>::infinity();
  job.metrics.lr = -std::numeric_limits<double>::infinity();
  job.metrics.validation_loss = std::numeric_limits<double>::quiet_NaN();
  JobEventRecord event = MetricsEvent(1, std::nan(""));
  ASSERT_TRUE(store_->InsertJob(job, {event}).ok());

  ExpectSame(ValueOf(store_->GetJob("t", "job-nan")), job);
  const std::vector<JobEventRecord> events =
      ValueOf(store_->ListJobEvents("job-nan", 0, 10));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(std::isnan(events[0].metrics.loss));
}

TEST_F(JobStoreTest, ReopenKeepsEverything) {
  const DatasetRecord dataset = MakeDataset("data-1", "tenant-a");
  JobRecord with_validation = MakeFullJob("job-1", "tenant-a");
  JobRecord without_validation = MakeJob("job-2", "tenant-b");
  without_validation.metrics.loss = 0.5;
  const AdapterRecord adapter = MakeAdapter("adapter-1", "tenant-a");
  JobEventRecord failed = StatusEvent(JobStatus::kFailed, "stopped");
  failed.error_code = "INTERNAL";
  failed.error_message = "boom";
  JobEventRecord metrics = MetricsEvent(3, 1.5);
  metrics.metrics.validation_loss = 1.25;

  ASSERT_TRUE(store_->InsertDataset(dataset).ok());
  const std::vector<JobEventRecord> inserted =
      ValueOf(store_->InsertJob(with_validation, {metrics, failed}));
  ASSERT_TRUE(store_->InsertJob(without_validation, {}).ok());
  ASSERT_TRUE(store_->InsertAdapter(adapter).ok());
  EXPECT_TRUE(std::filesystem::exists(path_ + "-wal"));  // journal_mode=WAL

  Reopen();

  ExpectSame(ValueOf(store_->GetDataset("tenant-a", "data-1")), dataset);
  ExpectSame(ValueOf(store_->GetJob("tenant-a", "job-1")), with_validation);
  ExpectSame(ValueOf(store_->GetJob("tenant-b", "job-2")), without_validation);
  ExpectSame(ValueOf(store_->GetAdapter("tenant-a", "adapter-1")), adapter);
  const std::vector<JobEventRecord> events =
      ValueOf(store_->ListJobEvents("job-1", 0, 10));
  ASSERT_EQ(events.size(), 2u);
  ExpectSame(events[0], inserted[0]);
  ExpectSame(events[1], inserted[1]);
  EXPECT_EQ(events[0].metrics.validation_loss, 1.25);
  EXPECT_EQ(events[1].status, JobStatus::kFailed);
}

TEST_F(JobStoreTest, OtherTenantsRecordsAreNotFound) {
  ASSERT_TRUE(store_->InsertDataset(MakeDataset("data-a", "a")).ok());
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-a", "a"), {}).ok());
  ASSERT_TRUE(store_->InsertAdapter(MakeAdapter("adapter-a", "a")).ok());
  ASSERT_TRUE(store_->InsertDataset(MakeDataset("data-b", "b")).ok());

  ExpectCode(store_->GetDataset("b", "data-a").status(),
             absl::StatusCode::kNotFound, "dataset \"data-a\" not found");
  ExpectCode(store_->GetJob("b", "job-a").status(), absl::StatusCode::kNotFound,
             "job \"job-a\" not found");
  ExpectCode(store_->GetAdapter("b", "adapter-a").status(),
             absl::StatusCode::kNotFound, "adapter \"adapter-a\" not found");
  ExpectCode(store_->DeleteDataset("b", "data-a"), absl::StatusCode::kNotFound,
             "dataset \"data-a\" not found");
  ExpectCode(store_->GetJob("a", "job-missing").status(),
             absl::StatusCode::kNotFound, "job \"job-missing\" not found");

  EXPECT_TRUE(store_->GetDataset("a", "data-a").ok());
  // The server's own lookups name no tenant.
  EXPECT_EQ(ValueOf(store_->GetJob("", "job-a")).tenant, "a");

  EXPECT_THAT(Ids(ValueOf(store_->ListDatasets("b", 10, "")).items),
              ElementsAre("data-b"));
  EXPECT_THAT(ValueOf(store_->ListJobs("b", {}, 10, "")).items, IsEmpty());
  EXPECT_THAT(ValueOf(store_->ListAdapters("b", 10, "")).items, IsEmpty());
}

TEST_F(JobStoreTest, ListingsPageInCreationOrder) {
  // Ids out of alphabetical order: the listing must follow insertion.
  const std::vector<std::string> ids = {"g", "c", "e", "a", "f", "b", "d"};
  for (const std::string& id : ids) {
    ASSERT_TRUE(store_->InsertDataset(MakeDataset("data-" + id, "t")).ok());
    ASSERT_TRUE(store_->InsertJob(MakeJob("job-" + id, "t"), {}).ok());
    ASSERT_TRUE(store_->InsertAdapter(MakeAdapter("adapter-" + id, "t")).ok());
    // Another tenant's rows in between must not show up.
    ASSERT_TRUE(store_->InsertDataset(MakeDataset("other-" + id, "u")).ok());
  }

  EXPECT_THAT(PageIds<DatasetRecord>([&](const std::string& token) {
                return store_->ListDatasets("t", 3, token);
              }),
              ElementsAre(ElementsAre("data-g", "data-c", "data-e"),
                          ElementsAre("data-a", "data-f", "data-b"),
                          ElementsAre("data-d")));
  EXPECT_THAT(PageIds<JobRecord>([&](const std::string& token) {
                return store_->ListJobs("t", {}, 4, token);
              }),
              ElementsAre(ElementsAre("job-g", "job-c", "job-e", "job-a"),
                          ElementsAre("job-f", "job-b", "job-d")));
  // A last page that is exactly full has no token after it.
  EXPECT_THAT(PageIds<AdapterRecord>([&](const std::string& token) {
                return store_->ListAdapters("t", 7, token);
              }),
              ElementsAre(::testing::SizeIs(7)));

  // A deleted row does not disturb a token that points at it.
  const std::string token =
      ValueOf(store_->ListDatasets("t", 2, "")).next_page_token;
  ASSERT_TRUE(store_->DeleteDataset("t", "data-c").ok());
  EXPECT_THAT(Ids(ValueOf(store_->ListDatasets("t", 2, token)).items),
              ElementsAre("data-e", "data-a"));
}

TEST_F(JobStoreTest, ForeignOrBrokenPageTokensAreInvalid) {
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    ASSERT_TRUE(store_->InsertDataset(MakeDataset("data-" + n, "t")).ok());
    ASSERT_TRUE(store_->InsertJob(MakeJob("job-" + n, "t"), {}).ok());
    ASSERT_TRUE(store_->InsertAdapter(MakeAdapter("adapter-" + n, "t")).ok());
  }
  const std::string datasets_token =
      ValueOf(store_->ListDatasets("t", 1, "")).next_page_token;
  const std::string adapters_token =
      ValueOf(store_->ListAdapters("t", 1, "")).next_page_token;
  const std::string queued_token =
      ValueOf(store_->ListJobs("t", {JobStatus::kQueued}, 1, ""))
          .next_page_token;
  ASSERT_FALSE(datasets_token.empty());
  ASSERT_FALSE(adapters_token.empty());
  ASSERT_FALSE(queued_token.empty());

  auto expect_invalid = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), StartsWith("page_token "));
  };
  expect_invalid(store_->ListJobs("t", {}, 1, datasets_token).status());
  expect_invalid(store_->ListAdapters("t", 1, datasets_token).status());
  expect_invalid(store_->ListDatasets("t", 1, adapters_token).status());
  expect_invalid(store_->ListDatasets("u", 1, datasets_token).status());
  expect_invalid(store_->ListJobs("t", {}, 1, queued_token).status());
  expect_invalid(
      store_->ListJobs("t", {JobStatus::kRunning}, 1, queued_token).status());
  expect_invalid(store_->ListDatasets("t", 1, "not a token!").status());
  expect_invalid(store_->ListDatasets("t", 1, "bm9uc2Vuc2U").status());
  expect_invalid(
      store_->ListDatasets("t", 1, datasets_token.substr(1)).status());

  // The same filter in another order or repeated is the same listing.
  const std::string queued_running_token =
      ValueOf(store_->ListJobs(
                  "t",
                  {JobStatus::kQueued, JobStatus::kRunning, JobStatus::kQueued},
                  1, ""))
          .next_page_token;
  EXPECT_TRUE(store_
                  ->ListJobs("t", {JobStatus::kRunning, JobStatus::kQueued}, 1,
                             queued_running_token)
                  .ok());

  ExpectCode(store_->ListDatasets("t", 0, "").status(),
             absl::StatusCode::kInvalidArgument, "page_size");
  ExpectCode(store_->ListAdapters("t", 1001, "").status(),
             absl::StatusCode::kInvalidArgument, "page_size");
  EXPECT_TRUE(store_->ListJobs("t", {}, 1000, "").ok());
}

TEST_F(JobStoreTest, StatusFilterAndJobsWithStatus) {
  for (const JobRecord& job : {MakeJob("a1", "a", JobStatus::kQueued),
                               MakeJob("b1", "b", JobStatus::kRunning),
                               MakeJob("a2", "a", JobStatus::kSucceeded),
                               MakeJob("b2", "b", JobStatus::kQueued),
                               MakeJob("a3", "a", JobStatus::kQueued)}) {
    ASSERT_TRUE(store_->InsertJob(job, {}).ok());
  }
  // A later update does not move a job in creation order.
  ASSERT_TRUE(
      store_->UpdateJob(MakeJob("a1", "a", JobStatus::kRunning), {}).ok());

  EXPECT_THAT(Ids(ValueOf(store_->JobsWithStatus(
                  {JobStatus::kQueued, JobStatus::kRunning}))),
              ElementsAre("a1", "b1", "b2", "a3"));
  EXPECT_THAT(Ids(ValueOf(store_->JobsWithStatus({JobStatus::kQueued}))),
              ElementsAre("b2", "a3"));
  EXPECT_THAT(ValueOf(store_->JobsWithStatus({})), IsEmpty());

  EXPECT_THAT(
      Ids(ValueOf(store_->ListJobs("a", {JobStatus::kQueued}, 10, "")).items),
      ElementsAre("a3"));
  EXPECT_THAT(PageIds<JobRecord>([&](const std::string& token) {
                return store_->ListJobs(
                    "a", {JobStatus::kRunning, JobStatus::kSucceeded}, 1,
                    token);
              }),
              ElementsAre(ElementsAre("a1"), ElementsAre("a2")));
  EXPECT_THAT(Ids(ValueOf(store_->ListJobs("a", {}, 10, "")).items),
              ElementsAre("a1", "a2", "a3"));
}

TEST_F(JobStoreTest, EventSequencesContinueAcrossUpdates) {
  JobRecord job = MakeJob("job-1", "t");
  std::vector<JobEventRecord> stored = ValueOf(
      store_->InsertJob(job, {StatusEvent(JobStatus::kQueued, "queued")}));
  EXPECT_THAT(Sequences(stored), ElementsAre(1));
  EXPECT_EQ(stored[0].job_id, "job-1");
  ASSERT_TRUE(
      store_->InsertJob(MakeJob("job-2", "t"), {MetricsEvent(1, 1.0)}).ok());

  job.status = JobStatus::kRunning;
  stored = ValueOf(store_->UpdateJob(
      job, {StatusEvent(JobStatus::kRunning, "slot 0"), MetricsEvent(1, 2.0)}));
  EXPECT_THAT(Sequences(stored), ElementsAre(2, 3));
  EXPECT_EQ(stored[1].job_id, "job-1");
  EXPECT_THAT(ValueOf(store_->UpdateJob(job, {})), IsEmpty());
  stored = ValueOf(
      store_->UpdateJob(job, {MetricsEvent(2, 1.9), MetricsEvent(3, 1.8)}));
  EXPECT_THAT(Sequences(stored), ElementsAre(4, 5));

  const std::vector<JobEventRecord> events =
      ValueOf(store_->ListJobEvents("job-1", 0, 100));
  EXPECT_THAT(Sequences(events), ElementsAre(1, 2, 3, 4, 5));
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].status, JobStatus::kQueued);
  EXPECT_EQ(events[3].metrics.loss, 1.9);
  EXPECT_THAT(Sequences(ValueOf(store_->ListJobEvents("job-1", 1, 2))),
              ElementsAre(2, 3));
  EXPECT_THAT(ValueOf(store_->ListJobEvents("job-1", 5, 10)), IsEmpty());
  EXPECT_THAT(Sequences(ValueOf(store_->ListJobEvents("job-2", 0, 10))),
              ElementsAre(1));
  ExpectCode(store_->ListJobEvents("job-1", 0, 0).status(),
             absl::StatusCode::kInvalidArgument, "limit");
}

TEST_F(JobStoreTest, UpdatesOfMissingJobsChangeNothing) {
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-1", "t"), {}).ok());
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-2", "t"), {}).ok());
  ExpectCode(
      store_->UpdateJob(MakeJob("job-9", "t"), {MetricsEvent(1, 1.0)}).status(),
      absl::StatusCode::kNotFound, "job \"job-9\" not found");

  std::vector<JobStore::JobUpdate> updates(3);
  updates[0] = {MakeJob("job-1", "t", JobStatus::kRunning),
                {MetricsEvent(1, 1.0)}};
  updates[1] = {MakeJob("job-missing", "t", JobStatus::kRunning),
                {MetricsEvent(1, 1.0)}};
  updates[2] = {MakeJob("job-2", "t", JobStatus::kRunning),
                {MetricsEvent(1, 1.0)}};
  ExpectCode(store_->UpdateJobs(updates).status(), absl::StatusCode::kNotFound,
             "job \"job-missing\" not found");
  for (const std::string id : {"job-1", "job-2"}) {
    EXPECT_EQ(ValueOf(store_->GetJob("t", id)).status, JobStatus::kQueued);
    EXPECT_THAT(ValueOf(store_->ListJobEvents(id, 0, 10)), IsEmpty()) << id;
  }
  EXPECT_EQ(store_->GetJob("", "job-missing").status().code(),
            absl::StatusCode::kNotFound);

  updates.erase(updates.begin() + 1);
  updates.push_back({MakeJob("job-1", "t", JobStatus::kRunning),
                     {MetricsEvent(2, 0.9), MetricsEvent(3, 0.8)}});
  const std::vector<std::vector<JobEventRecord>> stored =
      ValueOf(store_->UpdateJobs(updates));
  ASSERT_EQ(stored.size(), 3u);
  EXPECT_THAT(Sequences(stored[0]), ElementsAre(1));
  EXPECT_THAT(Sequences(stored[1]), ElementsAre(1));
  EXPECT_THAT(Sequences(stored[2]), ElementsAre(2, 3));
  EXPECT_EQ(stored[1][0].job_id, "job-2");
  EXPECT_EQ(ValueOf(store_->GetJob("t", "job-2")).status, JobStatus::kRunning);
}

TEST_F(JobStoreTest, RepeatedIdsAlreadyExist) {
  ASSERT_TRUE(store_->InsertDataset(MakeDataset("data-1", "a")).ok());
  ExpectCode(store_->InsertDataset(MakeDataset("data-1", "b")),
             absl::StatusCode::kAlreadyExists, "dataset \"data-1\"");

  ASSERT_TRUE(
      store_->InsertJob(MakeJob("job-1", "a"), {MetricsEvent(1, 1.0)}).ok());
  ExpectCode(
      store_->InsertJob(MakeJob("job-1", "a"), {MetricsEvent(2, 1.0)}).status(),
      absl::StatusCode::kAlreadyExists, "job \"job-1\"");
  // The failed insert appended nothing to the existing job's log.
  EXPECT_THAT(Sequences(ValueOf(store_->ListJobEvents("job-1", 0, 10))),
              ElementsAre(1));

  ASSERT_TRUE(store_->InsertAdapter(MakeAdapter("adapter-1", "a")).ok());
  ExpectCode(store_->InsertAdapter(MakeAdapter("adapter-1", "a")),
             absl::StatusCode::kAlreadyExists, "adapter \"adapter-1\"");
}

TEST_F(JobStoreTest, DatasetsInUseCannotBeDeleted) {
  for (const std::string id : {"train", "valid", "done", "paused"}) {
    ASSERT_TRUE(store_->InsertDataset(MakeDataset(id, "t")).ok());
  }
  JobRecord training = MakeJob("job-train", "t", JobStatus::kRunning);
  training.training_dataset_id = "train";
  JobRecord validating = MakeJob("job-valid", "t", JobStatus::kQueued);
  validating.training_dataset_id = "done";
  validating.validation_dataset_id = "valid";
  JobRecord finished = MakeJob("job-done", "t", JobStatus::kSucceeded);
  finished.training_dataset_id = "done";
  JobRecord paused = MakeJob("job-paused", "t", JobStatus::kPaused);
  paused.training_dataset_id = "paused";
  for (const JobRecord& job : {training, validating, finished, paused}) {
    ASSERT_TRUE(store_->InsertJob(job, {}).ok());
  }

  ExpectCode(store_->DeleteDataset("t", "train"),
             absl::StatusCode::kFailedPrecondition, "job \"job-train\"");
  ExpectCode(store_->DeleteDataset("t", "valid"),
             absl::StatusCode::kFailedPrecondition, "job \"job-valid\"");
  ExpectCode(store_->DeleteDataset("t", "paused"),
             absl::StatusCode::kFailedPrecondition, "job \"job-paused\"");
  ExpectCode(store_->DeleteDataset("t", "done"),
             absl::StatusCode::kFailedPrecondition, "job \"job-valid\"");
  EXPECT_TRUE(store_->GetDataset("t", "train").ok());

  training.status = JobStatus::kFailed;
  ASSERT_TRUE(store_->UpdateJob(training, {}).ok());
  validating.status = JobStatus::kCancelled;
  ASSERT_TRUE(store_->UpdateJob(validating, {}).ok());
  EXPECT_TRUE(store_->DeleteDataset("t", "train").ok());
  EXPECT_TRUE(store_->DeleteDataset("t", "valid").ok());
  EXPECT_TRUE(store_->DeleteDataset("t", "done").ok());
  ExpectCode(store_->GetDataset("t", "train").status(),
             absl::StatusCode::kNotFound, "dataset \"train\" not found");
  ExpectCode(store_->DeleteDataset("t", "train"), absl::StatusCode::kNotFound,
             "dataset \"train\" not found");
}

TEST_F(JobStoreTest, NewerSchemaVersionIsRefused) {
  store_.reset();
  // Closing the last connection checkpoints the WAL into the main file.
  ASSERT_FALSE(std::filesystem::exists(path_ + "-wal"));
  {
    // The SQLite file format keeps user_version at byte 60, big-endian.
    std::fstream file(path_, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.is_open());
    file.seekp(60);
    const char version[4] = {0, 0, 0, 5};  // The current one is 4.
    file.write(version, sizeof(version));
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path_);
  ExpectCode(store.status(), absl::StatusCode::kFailedPrecondition,
             "newer loraplex");
}

// A database of schema version 1 (before request ids) gains the requests
// table on open and keeps its rows.
TEST_F(JobStoreTest, VersionOneDatabaseIsUpgraded) {
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-1", "t"), {}).ok());
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE requests; PRAGMA user_version = 1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Reopen();
  EXPECT_TRUE(store_->GetJob("t", "job-1").ok());
  const RequestKey key{"t", "CreateJob", "r"};
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-2", "t"), {}, &key).ok());
  EXPECT_EQ(ValueOf(store_->FindRequest(key, absl::ToUnixMillis(absl::Now()))),
            "job-2");
}

// A database of schema version 2 (before sessions were stored) gains the
// sessions, tinker_names and results tables on open.
TEST_F(JobStoreTest, VersionTwoDatabaseIsUpgraded) {
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-1", "t"), {}).ok());
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP TABLE sessions; DROP TABLE tinker_names; "
                         "DROP TABLE results; PRAGMA user_version = 2;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Reopen();
  EXPECT_TRUE(store_->GetJob("t", "job-1").ok());
  EXPECT_THAT(ValueOf(store_->ListSessions()), IsEmpty());
  SessionRecord session;
  session.id = "session-1";
  session.tenant = "t";
  EXPECT_TRUE(store_->PutSession(session).ok());
}

// A database of schema version 3 (before router statistics) gains the
// expert_tokens columns of jobs and job_events on open; its rows read back
// with none, and new metrics keep theirs.
TEST_F(JobStoreTest, VersionThreeDatabaseGainsExpertTokens) {
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-1", "t"), {}).ok());
  store_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE jobs DROP COLUMN expert_tokens; "
                         "ALTER TABLE job_events DROP COLUMN expert_tokens; "
                         "PRAGMA user_version = 3;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Reopen();
  JobRecord job = ValueOf(store_->GetJob("t", "job-1"));
  EXPECT_THAT(job.metrics.expert_tokens, IsEmpty());
  job.metrics.expert_tokens = {3, 0, 12, 5};
  JobEventRecord event;
  event.job_id = "job-1";
  event.metrics = job.metrics;
  ASSERT_TRUE(store_->UpdateJob(job, {event}).ok());
  EXPECT_THAT(ValueOf(store_->GetJob("t", "job-1")).metrics.expert_tokens,
              ::testing::ElementsAre(3, 0, 12, 5));
  const std::vector<JobEventRecord> events =
      ValueOf(store_->ListJobEvents("job-1", 0, 10));
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back().metrics.expert_tokens,
              ::testing::ElementsAre(3, 0, 12, 5));
}

// A session's record is inserted, then each change replaces it (its
// identity and spec stay as first stored); every field reads back.
TEST_F(JobStoreTest, SessionsRoundTripAndUpdateInPlace) {
  SessionRecord session;
  session.id = "session-1";
  session.tenant = "alice";
  session.display_name = "run 1";
  session.spec = {{"lora", {{"rank", 8}}}, {"seed", 5}};
  session.state = SessionState::kOpening;
  session.reason = "opening";
  session.create_time_ms = 1700000000000;
  session.last_activity_ms = 1700000000000;
  ASSERT_TRUE(store_->PutSession(session).ok());
  SessionRecord other = session;
  other.id = "session-2";
  other.tenant = "bob";
  ASSERT_TRUE(store_->PutSession(other).ok());

  session.state = SessionState::kClosed;
  session.reason = "closed by the client";
  session.steps = 7;
  session.slot = 2;
  session.next_seq_id = 15;
  session.idle_state = "state-1";
  session.last_activity_ms = 1700000001000;
  ASSERT_TRUE(store_->PutSession(session).ok());
  Reopen();
  const std::vector<SessionRecord> stored = ValueOf(store_->ListSessions());
  ASSERT_EQ(stored.size(), 2u);
  const SessionRecord& first = stored[0];
  EXPECT_EQ(first.id, "session-1");
  EXPECT_EQ(first.tenant, "alice");
  EXPECT_EQ(first.display_name, "run 1");
  EXPECT_EQ(first.spec, session.spec);
  EXPECT_EQ(first.state, SessionState::kClosed);
  EXPECT_EQ(first.reason, "closed by the client");
  EXPECT_EQ(first.steps, 7);
  EXPECT_EQ(first.slot, 2);
  EXPECT_EQ(first.next_seq_id, 15);
  EXPECT_EQ(first.idle_state, "state-1");
  EXPECT_EQ(first.create_time_ms, 1700000000000);
  EXPECT_EQ(first.last_activity_ms, 1700000001000);
  EXPECT_EQ(stored[1].id, "session-2");
  EXPECT_EQ(stored[1].state, SessionState::kOpening);
}

TEST_F(JobStoreTest, SessionStateNamesRoundTrip) {
  for (SessionState state : {SessionState::kOpening, SessionState::kOpen,
                             SessionState::kClosing, SessionState::kClosed}) {
    EXPECT_EQ(SessionStateFromName(SessionStateName(state)), state);
  }
  EXPECT_FALSE(SessionStateFromName("open").has_value());
}

TEST_F(JobStoreTest, TinkerNamesAndResultsSurviveAReopen) {
  ASSERT_TRUE(store_
                  ->PutTinkerName({"tinker-1", "session", "alice",
                                   nlohmann::json::object()})
                  .ok());
  ASSERT_TRUE(store_
                  ->PutTinkerName({"tinker-1:train:0",
                                   "model",
                                   "alice",
                                   {{"native_id", "session-9"}}})
                  .ok());
  ASSERT_TRUE(store_->PutTinkerName({"gone", "sampler", "bob", {}}).ok());
  ASSERT_TRUE(store_->DeleteTinkerName("gone").ok());
  // Binary bodies (a protobuf answer) keep every byte.
  const std::string body("\x00\xff\x10proto", 8);
  ASSERT_TRUE(store_
                  ->PutResult({"alice", 41, 0, "", body,
                               "application/x-protobuf", 1000})
                  .ok());
  ASSERT_TRUE(
      store_->PutResult({"alice", 42, 5, "no such model", "", "", 2000}).ok());
  ASSERT_TRUE(store_->PutResult({"bob", 1, 0, "", "{}", "json", 500}).ok());
  Reopen();
  const std::vector<TinkerNameRecord> names =
      ValueOf(store_->ListTinkerNames());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].name, "tinker-1");
  EXPECT_EQ(names[1].kind, "model");
  EXPECT_EQ(names[1].value["native_id"], "session-9");
  std::vector<StoredResultRecord> results = ValueOf(store_->ListResults(1000));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].seq, 41);
  EXPECT_EQ(results[0].body, body);
  EXPECT_EQ(results[0].content_type, "application/x-protobuf");
  EXPECT_EQ(results[1].code, 5);
  EXPECT_EQ(results[1].message, "no such model");
  ASSERT_TRUE(store_->DeleteResultsBefore(1500).ok());
  results = ValueOf(store_->ListResults(0));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].seq, 42);
}

// A request id is recorded with what it created, in the same transaction:
// a repeat stores nothing; ids are per tenant and method and expire.
TEST_F(JobStoreTest, RequestIdsAreRecordedWithWhatTheyCreated) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  const RequestKey key{"t", "CreateJob", "r1"};
  ExpectCode(store_->FindRequest(key, now).status(),
             absl::StatusCode::kNotFound, "request");
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-1", "t"), {}, &key).ok());
  EXPECT_EQ(ValueOf(store_->FindRequest(key, now)), "job-1");
  // A second job with the same key is refused whole.
  ExpectCode(store_->InsertJob(MakeJob("job-2", "t"), {}, &key).status(),
             absl::StatusCode::kAlreadyExists, "request_id \"r1\"");
  ExpectCode(store_->GetJob("t", "job-2").status(), absl::StatusCode::kNotFound,
             "job");
  // Other tenants and methods have their own ids.
  const RequestKey other_tenant{"u", "CreateJob", "r1"};
  const RequestKey other_method{"t", "UploadDataset", "r1"};
  ASSERT_TRUE(store_->InsertJob(MakeJob("job-3", "u"), {}, &other_tenant).ok());
  ASSERT_TRUE(
      store_->InsertDataset(MakeDataset("data-1", "t"), &other_method).ok());
  EXPECT_EQ(ValueOf(store_->FindRequest(other_method, now)), "data-1");
  ExpectCode(store_->InsertDataset(MakeDataset("data-2", "t"), &other_method),
             absl::StatusCode::kAlreadyExists, "already recorded");
  ExpectCode(store_->GetDataset("t", "data-2").status(),
             absl::StatusCode::kNotFound, "dataset");
  // Kept kRequestIdKeepMs, then forgotten.
  EXPECT_TRUE(store_->FindRequest(key, now + kRequestIdKeepMs - 60000).ok());
  ExpectCode(store_->FindRequest(key, now + kRequestIdKeepMs + 60000).status(),
             absl::StatusCode::kNotFound, "request");
  // Deleting what a request created forgets the request.
  ASSERT_TRUE(store_->DeleteDataset("t", "data-1").ok());
  ExpectCode(store_->FindRequest(other_method, now).status(),
             absl::StatusCode::kNotFound, "request");
  Reopen();
  EXPECT_EQ(ValueOf(store_->FindRequest(key, now)), "job-1");
}

TEST_F(JobStoreTest, DeleteJobAndAdapterRefuseWhatIsInUse) {
  ASSERT_TRUE(store_->InsertAdapter(MakeAdapter("adapter-1", "t")).ok());
  JobRecord job = MakeJob("job-1", "t", JobStatus::kRunning);
  job.initial_adapter_id = "adapter-1";
  const RequestKey key{"t", "CreateJob", "r"};
  ASSERT_TRUE(
      store_->InsertJob(job, {StatusEvent(JobStatus::kQueued, "q")}, &key)
          .ok());
  ExpectCode(store_->DeleteJob("t", "job-1"),
             absl::StatusCode::kFailedPrecondition, "is RUNNING; cancel it");
  ExpectCode(store_->DeleteAdapter("t", "adapter-1"),
             absl::StatusCode::kFailedPrecondition,
             "starting point of job \"job-1\" (RUNNING)");
  ExpectCode(store_->DeleteJob("u", "job-1"), absl::StatusCode::kNotFound,
             "job");
  ExpectCode(store_->DeleteAdapter("u", "adapter-1"),
             absl::StatusCode::kNotFound, "adapter");
  job.status = JobStatus::kCancelled;
  ASSERT_TRUE(store_->UpdateJob(job, {}).ok());
  ASSERT_TRUE(store_->DeleteAdapter("t", "adapter-1").ok());
  ASSERT_TRUE(store_->DeleteJob("t", "job-1").ok());
  ExpectCode(store_->GetJob("t", "job-1").status(), absl::StatusCode::kNotFound,
             "job");
  EXPECT_TRUE(ValueOf(store_->ListJobEvents("job-1", 0, 10)).empty());
  ExpectCode(store_->FindRequest(key, absl::ToUnixMillis(absl::Now())).status(),
             absl::StatusCode::kNotFound, "request");
  EXPECT_TRUE(ValueOf(store_->AllIds(JobStore::Table::kAdapters)).empty());
}

TEST_F(JobStoreTest, UnusableFilesAreErrors) {
  const std::string dir = FreshTestDir("files");
  {
    std::ofstream garbage(dir + "/garbage.db");
    garbage << std::string(4096, 'x');
  }
  EXPECT_FALSE(JobStore::Open(dir + "/garbage.db").ok());
  EXPECT_FALSE(JobStore::Open(dir + "/missing-dir/loraplex.db").ok());
}

TEST_F(JobStoreTest, ConcurrentCallsSucceed) {
  constexpr int kThreads = 4;
  constexpr int kJobsPerThread = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string tenant = "tenant-" + std::to_string(t);
      for (int i = 0; i < kJobsPerThread; ++i) {
        const std::string id = tenant + "-job-" + std::to_string(i);
        JobRecord job = MakeJob(id, tenant);
        if (!store_->InsertJob(job, {MetricsEvent(1, 1.0)}).ok()) ++failures;
        job.status = JobStatus::kRunning;
        if (!store_->UpdateJob(job, {MetricsEvent(2, 0.5)}).ok()) ++failures;
        if (!store_->GetJob(tenant, id).ok()) ++failures;
        if (!store_->ListJobs(tenant, {}, 10, "").ok()) ++failures;
        if (!store_->JobsWithStatus({JobStatus::kRunning}).ok()) ++failures;
        if (!store_->InsertDataset(MakeDataset(id, tenant)).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);

  const std::vector<JobRecord> running =
      ValueOf(store_->JobsWithStatus({JobStatus::kRunning}));
  EXPECT_EQ(running.size(), static_cast<size_t>(kThreads * kJobsPerThread));
  for (const JobRecord& job : running) {
    EXPECT_THAT(Sequences(ValueOf(store_->ListJobEvents(job.id, 0, 10))),
                ElementsAre(1, 2))
        << job.id;
  }
}

}  // namespace
}  // namespace loraplex
