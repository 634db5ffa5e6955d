// The `loraplex` commands for pausing, resuming and checkpoints (jobs
// pause|resume|checkpoints, jobs create --initial-checkpoint and
// --checkpoint-interval, adapters export --checkpoint): their requests,
// output and exit codes against an in-process fake server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/client/fake_loraplex_server.h"
#include "tests/common/cli_process.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

class CliCheckpointTest : public ::testing::Test {
 protected:
  CliResult Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", server_.address()});
    return RunCli(args);
  }

  // Runs `args`, expecting a usage error (exit 2, nothing on stdout) that
  // mentions `message`.
  void ExpectUsageError(const std::vector<std::string>& args,
                        const std::string& message) {
    const CliResult result = Run(args);
    EXPECT_EQ(result.exit_code, 2) << result.Describe();
    EXPECT_THAT(result.err, HasSubstr("loraplex: error: "))
        << result.Describe();
    EXPECT_THAT(result.err, HasSubstr(message)) << result.Describe();
    EXPECT_EQ(result.out, "") << result.Describe();
  }

  // Makes ExportAdapter send one small file.
  void SetExportFile() {
    v1::ExportAdapterChunk chunk;
    chunk.set_file_name("adapter_config.json");
    chunk.set_file_size(2);
    chunk.set_data("{}");
    server_.state().export_chunks = {chunk};
  }

  // Adds checkpoints of jobs/j1 at steps 0 (nothing trained) and 40.
  void AddCheckpoints() {
    v1::Checkpoint& first = server_.state().checkpoints.emplace_back();
    first.set_name("jobs/j1/checkpoints/0");
    first.mutable_create_time()->set_seconds(1700000000);
    first.set_size_bytes(512);
    v1::Checkpoint& second = server_.state().checkpoints.emplace_back();
    second.set_name("jobs/j1/checkpoints/40");
    second.set_step(40);
    second.mutable_create_time()->set_seconds(1700000100);
    second.mutable_metrics()->set_step(40);
    second.mutable_metrics()->set_loss(1.23456);
    second.mutable_metrics()->set_lr(2e-3);
    second.set_size_bytes(3 * 1024 * 1024 / 2);
  }

  FakeLoraplexServer server_;
};

TEST_F(CliCheckpointTest, HelpListsTheNewCommandsAndFlags) {
  const CliResult jobs = Run({"jobs", "--help"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.Describe();
  for (const char* text : {"pause", "resume", "checkpoints",
                           "jobs/ID/checkpoints/STEP or ID/checkpoints/STEP"}) {
    EXPECT_THAT(jobs.out, HasSubstr(text));
  }
  const CliResult create = Run({"jobs", "create", "--help"});
  EXPECT_EQ(create.exit_code, 0) << create.Describe();
  EXPECT_THAT(create.out, HasSubstr("--initial-checkpoint"));
  EXPECT_THAT(create.out, HasSubstr("--checkpoint-interval"));
  const CliResult export_help = Run({"adapters", "export", "--help"});
  EXPECT_EQ(export_help.exit_code, 0) << export_help.Describe();
  EXPECT_THAT(export_help.out, HasSubstr("--checkpoint"));
  EXPECT_THAT(export_help.out, HasSubstr("jobs/ID/checkpoints/STEP"));
  // A checkpoint is no starting point of an attached adapter.
  const CliResult attach = Run({"adapters", "attach", "--help"});
  EXPECT_EQ(attach.exit_code, 0) << attach.Describe();
  EXPECT_THAT(attach.out, Not(HasSubstr("--initial-checkpoint")));
}

TEST_F(CliCheckpointTest, UsageErrorsExitTwoWithoutARequest) {
  ExpectUsageError({"jobs", "pause"}, "ID");
  ExpectUsageError({"jobs", "resume"}, "ID");
  ExpectUsageError({"jobs", "checkpoints"}, "ID");
  ExpectUsageError({"jobs", "pause", "datasets/d1"}, "jobs/{id}");
  ExpectUsageError({"jobs", "resume", "jobs/"}, "jobs/{id}");
  ExpectUsageError({"jobs", "checkpoints", "adapters/a1"}, "jobs/{id}");
  ExpectUsageError(
      {"jobs", "create", "--dataset", "d1", "--initial-checkpoint", "jobs/j1"},
      "jobs/{id}/checkpoints/{step}");
  ExpectUsageError({"jobs", "create", "--dataset", "d1", "--initial-adapter",
                    "a1", "--initial-checkpoint", "jobs/j1/checkpoints/4"},
                   "exclusive");
  ExpectUsageError(
      {"jobs", "create", "--dataset", "d1", "--checkpoint-interval", "often"},
      "--checkpoint-interval");
  ExpectUsageError({"adapters", "attach", "/tmp", "--dataset", "d1",
                    "--initial-checkpoint", "jobs/j1/checkpoints/4"},
                   "--initial-checkpoint");
  const std::string out_dir = FreshTestDir() + "/out";
  ExpectUsageError({"adapters", "export", "--out", out_dir},
                   "exactly one source");
  ExpectUsageError({"adapters", "export", "j1", "--checkpoint",
                    "jobs/j1/checkpoints/4", "--out", out_dir},
                   "exactly one source");
  ExpectUsageError(
      {"adapters", "export", "--checkpoint", "jobs/j1", "--out", out_dir},
      "jobs/{id}/checkpoints/{step}");
  ExpectUsageError(
      {"adapters", "export", "--checkpoint", "jobs/j1/checkpoints/4"}, "--out");
  EXPECT_THAT(server_.state().paused_jobs, IsEmpty());
  EXPECT_THAT(server_.state().resumed_jobs, IsEmpty());
  EXPECT_THAT(server_.state().list_checkpoints_names, IsEmpty());
  EXPECT_THAT(server_.state().created_jobs, IsEmpty());
  EXPECT_THAT(server_.state().attach_requests, IsEmpty());
  EXPECT_THAT(server_.state().export_requests, IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(out_dir));
}

TEST_F(CliCheckpointTest, PauseSendsTheJobNameAndSaysHowToResume) {
  server_.state().job.set_name("jobs/j1");
  const CliResult bare = Run({"jobs", "pause", "j1"});
  EXPECT_EQ(bare.exit_code, 0) << bare.Describe();
  EXPECT_EQ(bare.out,
            "Paused jobs/j1 (PAUSED)\n"
            "Continue it with: loraplex jobs resume j1\n");
  const CliResult full = Run({"jobs", "pause", "jobs/j1"});
  EXPECT_EQ(full.exit_code, 0) << full.Describe();
  EXPECT_THAT(server_.state().paused_jobs, ElementsAre("jobs/j1", "jobs/j1"));

  const CliResult json = Run({"jobs", "pause", "j1", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  const nlohmann::json job = nlohmann::json::parse(json.out);
  EXPECT_EQ(job["name"], "jobs/j1");
  EXPECT_EQ(job["status"], "JOB_STATUS_PAUSED");
}

TEST_F(CliCheckpointTest, PauseOfAJobThatIsNotPausedSaysSo) {
  server_.state().job.set_name("jobs/j1");
  server_.state().pause_outcome = v1::JOB_STATUS_SUCCEEDED;
  const CliResult result = Run({"jobs", "pause", "j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_EQ(result.out,
            "jobs/j1 finished before the pause took effect (SUCCEEDED)\n");
  // Never "Paused" for a job that is not.
  server_.state().pause_outcome = v1::JOB_STATUS_RUNNING;
  const CliResult running = Run({"jobs", "pause", "j1"});
  EXPECT_EQ(running.exit_code, 0) << running.Describe();
  EXPECT_EQ(running.out, "jobs/j1 was not paused (RUNNING)\n");
}

TEST_F(CliCheckpointTest, ResumeSendsTheJobNameAndSaysHowToFollow) {
  server_.state().job.set_name("jobs/j1");
  const CliResult result = Run({"jobs", "resume", "jobs/j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_EQ(result.out,
            "Resumed jobs/j1 (QUEUED)\n"
            "Follow it with: loraplex jobs watch j1\n");
  EXPECT_THAT(server_.state().resumed_jobs, ElementsAre("jobs/j1"));

  const CliResult json = Run({"--json", "jobs", "resume", "j1"});
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  EXPECT_EQ(nlohmann::json::parse(json.out)["status"], "JOB_STATUS_QUEUED");
}

TEST_F(CliCheckpointTest, ServerErrorsExitOne) {
  server_.state().pause_status = grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION, "jobs/j1 is SUCCEEDED");
  server_.state().resume_status = grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION, "jobs/j1 is not paused");
  server_.state().list_checkpoints_status =
      grpc::Status(grpc::StatusCode::NOT_FOUND, "jobs/j9 not found");
  server_.state().export_checkpoint_status = grpc::Status(
      grpc::StatusCode::NOT_FOUND, "jobs/j1/checkpoints/4 not found");
  const std::string out_dir = FreshTestDir() + "/out";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"jobs", "pause", "j1"}, "FAILED_PRECONDITION: jobs/j1 is SUCCEEDED"},
      {{"jobs", "resume", "j1"}, "FAILED_PRECONDITION: jobs/j1 is not paused"},
      {{"jobs", "checkpoints", "j9"}, "NOT_FOUND: jobs/j9 not found"},
      {{"--json", "jobs", "checkpoints", "j9"}, "NOT_FOUND: jobs/j9 not found"},
      {{"adapters", "export", "--checkpoint", "jobs/j1/checkpoints/4", "--out",
        out_dir},
       "NOT_FOUND: jobs/j1/checkpoints/4 not found"}};
  for (const auto& [args, message] : cases) {
    const CliResult result = Run(args);
    EXPECT_EQ(result.exit_code, 1) << result.Describe();
    EXPECT_THAT(result.err, HasSubstr("loraplex: error: " + message))
        << result.Describe();
    EXPECT_EQ(result.out, "") << result.Describe();
  }
  // A checkpoint is tried once, never as a job or adapter.
  ASSERT_EQ(server_.state().export_requests.size(), 1u);
  EXPECT_EQ(server_.state().export_requests[0].checkpoint(),
            "jobs/j1/checkpoints/4");
  EXPECT_FALSE(std::filesystem::exists(out_dir));
}

TEST_F(CliCheckpointTest, CheckpointsPrintsATable) {
  AddCheckpoints();
  const CliResult result = Run({"jobs", "checkpoints", "j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(server_.state().list_checkpoints_names, ElementsAre("jobs/j1"));
  std::vector<std::string> lines;
  std::istringstream in(result.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << result.out;
  EXPECT_THAT(lines[0], ::testing::MatchesRegex(
                            "CHECKPOINT +STEP +CREATED +LOSS +LR +SIZE"));
  // Step 0 trained nothing: no loss or learning rate.
  EXPECT_THAT(lines[1], ::testing::MatchesRegex(
                            "jobs/j1/checkpoints/0 +0 +[-0-9]+ [:0-9]+ +- +- "
                            "+512 B"));
  EXPECT_THAT(lines[2], ::testing::MatchesRegex(
                            "jobs/j1/checkpoints/40 +40 +[-0-9]+ [:0-9]+ "
                            "+1.2346 +2.00e-03 +1.5 MiB"));
}

TEST_F(CliCheckpointTest, CheckpointsAsJson) {
  AddCheckpoints();
  const CliResult result = Run({"--json", "jobs", "checkpoints", "jobs/j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  const nlohmann::json parsed = nlohmann::json::parse(result.out);
  ASSERT_EQ(parsed["checkpoints"].size(), 2u);
  EXPECT_EQ(parsed["checkpoints"][1]["name"], "jobs/j1/checkpoints/40");
  EXPECT_EQ(parsed["checkpoints"][1]["step"], "40");  // int64 as a string.
  EXPECT_EQ(parsed["checkpoints"][1]["sizeBytes"], "1572864");
  EXPECT_DOUBLE_EQ(parsed["checkpoints"][1]["metrics"]["loss"].get<double>(),
                   1.23456);

  server_.state().checkpoints.clear();
  const CliResult empty = Run({"--json", "jobs", "checkpoints", "j1"});
  EXPECT_EQ(empty.exit_code, 0) << empty.Describe();
  EXPECT_EQ(nlohmann::json::parse(empty.out)["checkpoints"].size(), 0u);
}

TEST_F(CliCheckpointTest, ExportFromACheckpoint) {
  SetExportFile();
  const std::string out_dir = FreshTestDir() + "/out";
  // The job's bare ID works too.
  const CliResult result = Run({"adapters", "export", "--checkpoint",
                                "j1/checkpoints/40", "--out", out_dir});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("Exported jobs/j1/checkpoints/40 to " +
                                    out_dir + " (adapter_config.json; 2 B)"));
  ASSERT_EQ(server_.state().export_requests.size(), 1u);
  const v1::ExportAdapterRequest& request = server_.state().export_requests[0];
  EXPECT_EQ(request.source_case(), v1::ExportAdapterRequest::kCheckpoint);
  EXPECT_EQ(request.checkpoint(), "jobs/j1/checkpoints/40");
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/adapter_config.json"));

  const CliResult json =
      Run({"adapters", "export", "--checkpoint", "jobs/j1/checkpoints/40",
           "--out", out_dir, "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.Describe();
  const nlohmann::json summary = nlohmann::json::parse(json.out);
  EXPECT_EQ(summary["outDir"], out_dir);
  EXPECT_EQ(summary["files"][0]["fileName"], "adapter_config.json");
}

TEST_F(CliCheckpointTest, CreateSendsTheCheckpointFlags) {
  server_.state().job.set_name("jobs/j2");
  server_.state().job.set_status(v1::JOB_STATUS_QUEUED);
  const CliResult result =
      Run({"jobs", "create", "--dataset", "d1", "--initial-checkpoint",
           "j1/checkpoints/40", "--checkpoint-interval", "25"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  ASSERT_EQ(server_.state().created_jobs.size(), 1u);
  const v1::CreateJobRequest& request = server_.state().created_jobs[0];
  EXPECT_EQ(request.initial_checkpoint(), "jobs/j1/checkpoints/40");
  EXPECT_EQ(request.initial_adapter(), "");
  EXPECT_TRUE(request.training().has_checkpoint_interval());
  EXPECT_EQ(request.training().checkpoint_interval(), 25);

  // Without the flags, neither is sent.
  ASSERT_EQ(Run({"jobs", "create", "--dataset", "d1"}).exit_code, 0);
  ASSERT_EQ(server_.state().created_jobs.size(), 2u);
  EXPECT_EQ(server_.state().created_jobs[1].initial_checkpoint(), "");
  EXPECT_FALSE(server_.state().created_jobs[1].has_training());
}

TEST_F(CliCheckpointTest, GetShowsPausedAndTheCheckpointInterval) {
  server_.state().job.set_name("jobs/j1");
  server_.state().job.set_status(v1::JOB_STATUS_PAUSED);
  server_.state().job.mutable_training()->set_checkpoint_interval(50);
  const CliResult result = Run({"jobs", "get", "j1"});
  EXPECT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("PAUSED"));
  EXPECT_THAT(result.out, HasSubstr("checkpoint_interval 50"));
}

}  // namespace
}  // namespace loraplex
