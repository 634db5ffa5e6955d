// The `loraplex` binary: usage errors, exit codes, hints, and its requests
// and output against an in-process fake server.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/client/fake_loraplex_server.h"
#include "tests/common/cli_process.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An address nothing listens on: a port the kernel just handed out and
// that was closed again.
std::string ClosedAddress() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
}

void ExpectUsageError(const std::vector<std::string>& args,
                      const std::string& message) {
  const CliResult result = RunCli(args);
  EXPECT_EQ(result.exit_code, 2) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr("loraplex: error: ")) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr(message)) << result.Describe();
  EXPECT_EQ(result.out, "") << result.Describe();
}

TEST(CliUsageTest, HelpListsCommandsAndExitCodes) {
  const CliResult result = RunCli({"--help"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  for (const char* text :
       {"info", "datasets", "jobs", "adapters", "slots", "quickstart",
        "--server", "--token", "--tls-ca", "--json", "LORAPLEX_SERVER",
        "LORAPLEX_TOKEN", "Exit codes", "3  a waited-for"}) {
    EXPECT_THAT(result.out, HasSubstr(text));
  }
  const CliResult jobs_help = RunCli({"jobs", "create", "--help"});
  EXPECT_EQ(jobs_help.exit_code, 0) << jobs_help.Describe();
  EXPECT_THAT(jobs_help.out, HasSubstr("--optimizer"));
  EXPECT_THAT(jobs_help.out, HasSubstr("--ns-precision"));
}

TEST(CliUsageTest, UsageErrorsExitTwo) {
  ExpectUsageError({}, "subcommand is required");
  ExpectUsageError({"frobnicate"}, "");
  ExpectUsageError({"jobs"}, "subcommand is required");
  ExpectUsageError({"jobs", "create"}, "--dataset");
  ExpectUsageError({"jobs", "create", "--dataset", "d", "--optimizer", "sgd"},
                   "--optimizer");
  ExpectUsageError({"jobs", "create", "--dataset", "d", "--rank", "eight"},
                   "--rank");
  ExpectUsageError({"jobs", "create", "--dataset", "d", "--betas", "0.9"},
                   "--betas");
  ExpectUsageError({"jobs", "create", "--dataset", "jobs/x"}, "datasets/{id}");
  ExpectUsageError({"jobs", "get"}, "ID");
  ExpectUsageError({"jobs", "get", "datasets/x"}, "jobs/{id}");
  ExpectUsageError({"jobs", "list", "--status", "bogus"}, "--status");
  ExpectUsageError({"datasets", "upload", "/nonexistent/train.jsonl"},
                   "/nonexistent/train.jsonl");
  ExpectUsageError({"adapters", "export", "j1"}, "--out");
  ExpectUsageError({"adapters", "attach", "/tmp"}, "--evaluate");
  ExpectUsageError({"--timeout", "-1", "info"}, "--timeout");
  ExpectUsageError({"quickstart", "--steps", "0"}, "--steps");
  ExpectUsageError({"info", "extra"}, "extra");
}

TEST(CliUsageTest, TimeoutMustBeFiniteAndPositive) {
  for (const char* timeout : {"nan", "inf", "-1", "0"}) {
    const CliResult result =
        RunCli({"--server", "127.0.0.1:1", "--timeout", timeout, "info"});
    EXPECT_EQ(result.exit_code, 2) << timeout << "\n" << result.Describe();
    EXPECT_THAT(result.err, HasSubstr("--timeout")) << timeout;
  }
}

TEST(CliConnectionTest, UnreachableServerExitsOneWithHint) {
  const std::string address = ClosedAddress();
  const CliResult result = RunCli({"--server", address, "info"});
  EXPECT_EQ(result.exit_code, 1) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr("loraplex: error: UNAVAILABLE: "));
  EXPECT_THAT(result.err,
              HasSubstr("cannot reach loraplex-server at " + address +
                        " (is it running? start it with: loraplex-server)"));
}

TEST(CliConnectionTest, ServerAddressFromTheEnvironment) {
  const std::string address = ClosedAddress();
  CliRunOptions options;
  options.env = {{"LORAPLEX_SERVER", address}};
  const CliResult result = RunCli({"jobs", "list"}, options);
  EXPECT_EQ(result.exit_code, 1) << result.Describe();
  EXPECT_THAT(result.err,
              HasSubstr("cannot reach loraplex-server at " + address));
}

class CliFakeServerTest : public ::testing::Test {
 protected:
  CliResult Run(std::vector<std::string> args,
                const CliRunOptions& options = {}) {
    args.insert(args.begin(), {"--server", server_.address()});
    return RunCli(args, options);
  }

  FakeLoraplexServer server_;
};

TEST_F(CliFakeServerTest, InfoAsTextAndJson) {
  server_.state().info.set_version("0.1.0");
  server_.state().info.mutable_base_model()->set_name("tiny");
  server_.state().info.set_slot_capacity(4);
  const CliResult text = Run({"info"});
  EXPECT_EQ(text.exit_code, 0) << text.Describe();
  EXPECT_THAT(text.out, HasSubstr("Version:"));
  EXPECT_THAT(text.out, HasSubstr("tiny"));

  // --json after the subcommand works too.
  const CliResult json = Run({"info", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  const auto parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["version"], "0.1.0");
  EXPECT_EQ(parsed["slotCapacity"], 4);
}

TEST_F(CliFakeServerTest, TokenHintOnUnauthenticated) {
  server_.state().required_token = "s3cret";
  const CliResult denied = Run({"info"});
  EXPECT_EQ(denied.exit_code, 1) << denied.Describe();
  EXPECT_THAT(denied.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(denied.err, HasSubstr("--token"));
  EXPECT_THAT(denied.err, HasSubstr("LORAPLEX_TOKEN"));

  EXPECT_EQ(Run({"--token", "s3cret", "info"}).exit_code, 0);
  CliRunOptions options;
  options.env = {{"LORAPLEX_TOKEN", "s3cret"}};
  EXPECT_EQ(Run({"info"}, options).exit_code, 0);
}

TEST_F(CliFakeServerTest, JobsCreateSendsOnlyGivenFlags) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_QUEUED);
  const CliResult result =
      Run({"jobs", "create", "--dataset", "d1", "--rank", "16", "--optimizer",
           "muon", "--max-steps", "5", "--name", "demo"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("Created jobs/j1 (QUEUED)"));
  ASSERT_EQ(server_.state().created_jobs.size(), 1u);
  const v1::CreateJobRequest& request = server_.state().created_jobs[0];
  EXPECT_EQ(request.training_dataset(), "datasets/d1");
  EXPECT_EQ(request.display_name(), "demo");
  EXPECT_EQ(request.lora().rank(), 16);
  EXPECT_FALSE(request.lora().has_alpha());
  EXPECT_EQ(request.optimizer().family(), v1::OPTIMIZER_FAMILY_MUON);
  EXPECT_FALSE(request.optimizer().has_lr());
  EXPECT_FALSE(request.has_schedule());
  EXPECT_EQ(request.training().max_steps(), 5);
  EXPECT_FALSE(request.training().has_seq_len());
}

TEST_F(CliFakeServerTest, JobsCreateWaitFollowsTheJob) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_SUCCEEDED);
  server_.state().job.set_total_steps(4);
  server_.state().job.set_adapter("adapters/a1");
  server_.state().events = FakeJobEvents(4, v1::JOB_STATUS_SUCCEEDED);
  const CliResult result = Run({"jobs", "create", "--dataset", "d1", "--wait"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("j1  RUNNING"));
  EXPECT_THAT(result.out, HasSubstr("step 4/4 (100%)"));
  EXPECT_THAT(result.out,
              HasSubstr("jobs/j1 SUCCEEDED, loss 2.9000 -> 2.6000"));
  EXPECT_THAT(result.out, HasSubstr("adapters/a1"));
  EXPECT_THAT(result.out, Not(HasSubstr("\r")));  // Not a terminal.
}

TEST_F(CliFakeServerTest, WatchExitsThreeForFailedAndCancelledJobs) {
  server_.state().job.set_name("jobs/j1");
  for (v1::JobStatus status :
       {v1::JOB_STATUS_FAILED, v1::JOB_STATUS_CANCELLED}) {
    server_.state().job.set_status(status);
    server_.state().events = FakeJobEvents(2, status);
    const CliResult result = Run({"jobs", "watch", "j1"});
    EXPECT_EQ(result.exit_code, 3) << result.Describe();
  }
  const CliResult failed = Run({"jobs", "watch", "jobs/j1"});
  EXPECT_THAT(failed.out, HasSubstr("CANCELLED"));
}

TEST_F(CliFakeServerTest, WatchJsonPrintsOneEventPerLine) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_FAILED);
  server_.state().events = FakeJobEvents(2, v1::JOB_STATUS_FAILED);
  const CliResult result = Run({"--json", "jobs", "watch", "j1"});
  EXPECT_EQ(result.exit_code, 3) << result.Describe();
  std::vector<std::string> lines;
  std::istringstream in(result.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), server_.state().events.size()) << result.out;
  EXPECT_EQ(nlohmann::json::parse(lines[2])["metrics"]["step"], "1");
  EXPECT_EQ(nlohmann::json::parse(lines.back())["statusChange"]["status"],
            "JOB_STATUS_FAILED");
}

TEST_F(CliFakeServerTest, WatchJsonResumesAStreamThatEndsEarly) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_RUNNING);
  server_.state().events = FakeJobEvents(4, v1::JOB_STATUS_SUCCEEDED);
  server_.state().max_events_per_watch = 3;
  const CliResult result = Run({"--json", "jobs", "watch", "j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  std::vector<std::string> lines;
  std::istringstream in(result.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << result.out;
  EXPECT_EQ(nlohmann::json::parse(lines.back())["statusChange"]["status"],
            "JOB_STATUS_SUCCEEDED");
  EXPECT_THAT(server_.state().watch_after_sequences,
              ::testing::ElementsAre(0, 3, 6));
}

TEST_F(CliFakeServerTest, WatchIntoAClosedPipeExitsOne) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_RUNNING);
  server_.state().events = FakeJobEvents(20, v1::JOB_STATUS_SUCCEEDED);
  server_.state().event_delay = std::chrono::milliseconds(50);
  const std::string command =
      "bash -c '\"$0\" --server \"$1\" --json jobs watch j1 | head -c 1 "
      ">/dev/null; exit \"${PIPESTATUS[0]}\"' " +
      std::string(LORAPLEX_BIN_DIR) + "/loraplex " + server_.address();
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

TEST_F(CliFakeServerTest, WatchOfAMissingJobExitsOne) {
  server_.state().job.set_name("jobs/j1");
  const CliResult result = Run({"jobs", "watch", "nope"});
  EXPECT_EQ(result.exit_code, 1) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr("NOT_FOUND"));
}

TEST_F(CliFakeServerTest, ListsPrintTables) {
  for (int i = 0; i < 3; ++i) {
    v1::Job& job = server_.state().jobs.emplace_back();
    job.set_name("jobs/j" + std::to_string(i));
    job.set_status(v1::JOB_STATUS_RUNNING);
    job.mutable_lora()->set_rank(8);
  }
  const CliResult result = Run({"jobs", "list", "--status", "running,queued"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("JOB"));
  EXPECT_THAT(result.out, HasSubstr("j2"));
  ASSERT_FALSE(server_.state().list_jobs_requests.empty());
  EXPECT_EQ(server_.state().list_jobs_requests[0].statuses_size(), 2);

  const CliResult json = Run({"jobs", "list", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  EXPECT_EQ(nlohmann::json::parse(json.out)["jobs"].size(), 3u);

  const CliResult slots = Run({"slots"});
  EXPECT_EQ(slots.exit_code, 0) << slots.Describe();
  EXPECT_THAT(slots.out, HasSubstr("FREE"));
}

TEST_F(CliFakeServerTest, DatasetsUploadAndRemove) {
  const std::string path = FreshTestDir() + "/train.jsonl";
  std::ofstream(path) << "{\"text\": \"hello\"}\n";
  const CliResult upload = Run({"datasets", "upload", path});
  EXPECT_EQ(upload.exit_code, 0) << upload.Describe();
  EXPECT_THAT(upload.out, HasSubstr("Uploaded datasets/d1"));
  EXPECT_EQ(server_.state().upload_display_name, "train.jsonl");
  EXPECT_EQ(server_.state().upload_bytes, "{\"text\": \"hello\"}\n");

  const CliResult remove = Run({"datasets", "rm", "d1"});
  EXPECT_EQ(remove.exit_code, 0) << remove.Describe();
  EXPECT_THAT(server_.state().deleted_datasets,
              ::testing::ElementsAre("datasets/d1"));
}

TEST_F(CliFakeServerTest, ExportTriesJobThenAdapter) {
  v1::ExportAdapterChunk chunk;
  chunk.set_file_name("adapter_config.json");
  chunk.set_file_size(2);
  chunk.set_data("{}");
  server_.state().export_chunks = {chunk};
  server_.state().export_job_status =
      grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
  const std::string out_dir = FreshTestDir() + "/out";
  const CliResult result = Run({"adapters", "export", "x1", "--out", out_dir});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  ASSERT_EQ(server_.state().export_requests.size(), 2u);
  EXPECT_EQ(server_.state().export_requests[0].job(), "jobs/x1");
  EXPECT_EQ(server_.state().export_requests[1].adapter(), "adapters/x1");
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/adapter_config.json"));

  // A job name is only tried as a job.
  const CliResult job =
      Run({"adapters", "export", "jobs/x1", "--out", out_dir});
  EXPECT_EQ(job.exit_code, 1) << job.Describe();
  EXPECT_THAT(job.err, HasSubstr("NOT_FOUND: no such job"));
}

TEST_F(CliFakeServerTest, ExportJsonOfANonUtf8PathIsValidJson) {
  v1::ExportAdapterChunk chunk;
  chunk.set_file_name("adapter_config.json");
  chunk.set_file_size(2);
  chunk.set_data("{}");
  server_.state().export_chunks = {chunk};
  const std::string out_dir = FreshTestDir() + "/out-\xff";
  const CliResult result =
      Run({"--json", "adapters", "export", "jobs/x1", "--out", out_dir});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  const nlohmann::json summary = nlohmann::json::parse(result.out);
  EXPECT_THAT(summary["outDir"].get<std::string>(),
              HasSubstr("out-\xef\xbf\xbd"));
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/adapter_config.json"));
}

TEST_F(CliFakeServerTest, QuickstartExitsOneWhenAnExportFails) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_SUCCEEDED);
  server_.state().job.set_total_steps(2);
  server_.state().events = FakeJobEvents(2, v1::JOB_STATUS_SUCCEEDED);
  server_.state().export_job_status =
      grpc::Status(grpc::StatusCode::INTERNAL, "disk full");
  const CliResult result =
      Run({"quickstart", "--dir", FreshTestDir(), "--steps", "2"});
  EXPECT_EQ(result.exit_code, 1) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr("disk full"));
}

TEST_F(CliFakeServerTest, AttachUploadsThePeftDirectory) {
  server_.state().job.set_name("jobs/j9");
  const std::string dir = FreshTestDir() + "/my-adapter";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << "{\"r\": 8}";
  std::ofstream(dir + "/adapter_model.safetensors") << "weights";
  const CliResult result = Run({"adapters", "attach", dir, "--evaluate", "d2"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("Attached adapters/a1 to jobs/j9"));
  ASSERT_EQ(server_.state().attach_requests.size(), 1u);
  const v1::AttachAdapterRequest& request = server_.state().attach_requests[0];
  EXPECT_EQ(request.files().adapter_config_json(), "{\"r\": 8}");
  EXPECT_EQ(request.files().adapter_model_safetensors(), "weights");
  EXPECT_EQ(request.display_name(), "my-adapter");
  EXPECT_EQ(request.job().validation_dataset(), "datasets/d2");
  EXPECT_EQ(request.job().training_dataset(), "");
}

}  // namespace
}  // namespace loraplex
