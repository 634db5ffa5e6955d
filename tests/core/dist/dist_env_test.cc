#include "core/dist/dist_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace loraplex {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<DistEnv> Parse(std::map<std::string, std::string> vars) {
  return ParseDistEnv(EnvLookupFromMap(std::move(vars)));
}

std::map<std::string, std::string> TwoRanks() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

void ExpectInvalid(std::map<std::string, std::string> vars,
                   const std::string& message) {
  absl::StatusOr<DistEnv> env = Parse(vars);
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(env.status().message()), HasSubstr(message));
}

TEST(DistEnvTest, NothingSetIsOneProcess) {
  absl::StatusOr<DistEnv> env = Parse({});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_FALSE(env->distributed());
  EXPECT_EQ(env->timeout, std::chrono::seconds(300));
}

TEST(DistEnvTest, ParsesTorchrunVariables) {
  auto vars = TwoRanks();
  vars["LORAPLEX_DIST_TIMEOUT_SECONDS"] = "7";
  vars["GLOO_SOCKET_IFNAME"] = "eth1";
  absl::StatusOr<DistEnv> env = Parse(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->timeout, std::chrono::seconds(7));
  EXPECT_EQ(env->gloo_socket_ifname, "eth1");
  EXPECT_TRUE(env->distributed());
}

TEST(DistEnvTest, LocalRankDefaultsToRank) {
  auto vars = TwoRanks();
  vars.erase("LOCAL_RANK");
  absl::StatusOr<DistEnv> env = Parse(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 1);
}

TEST(DistEnvTest, WorldOfOneNeedsNoAddress) {
  absl::StatusOr<DistEnv> env = Parse({{"WORLD_SIZE", "1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->world_size, 1);
  EXPECT_EQ(env->rank, 0);
}

TEST(DistEnvTest, RankOutOfRange) {
  auto vars = TwoRanks();
  vars["RANK"] = "3";
  ExpectInvalid(vars, "RANK must be in [0, WORLD_SIZE), got 3");
  vars["RANK"] = "-1";
  ExpectInvalid(vars, "RANK must be in [0, WORLD_SIZE), got -1");
}

TEST(DistEnvTest, LocalRankOutOfRange) {
  auto vars = TwoRanks();
  vars["LOCAL_RANK"] = "2";
  ExpectInvalid(vars, "LOCAL_RANK must be in [0, WORLD_SIZE), got 2");
}

TEST(DistEnvTest, NotAnInteger) {
  auto vars = TwoRanks();
  vars["WORLD_SIZE"] = "two";
  ExpectInvalid(vars, "WORLD_SIZE must be an integer, got 'two'");
  vars = TwoRanks();
  vars["MASTER_PORT"] = "80x";
  ExpectInvalid(vars, "MASTER_PORT must be an integer, got '80x'");
}

TEST(DistEnvTest, BadWorldSize) {
  auto vars = TwoRanks();
  vars["WORLD_SIZE"] = "0";
  ExpectInvalid(vars, "WORLD_SIZE must be in [1, 65536], got 0");
}

TEST(DistEnvTest, MissingVariablesAreNamed) {
  auto vars = TwoRanks();
  vars.erase("RANK");
  ExpectInvalid(vars, "RANK is required when WORLD_SIZE is 2");
  vars = TwoRanks();
  vars.erase("MASTER_ADDR");
  ExpectInvalid(vars, "MASTER_ADDR is required when WORLD_SIZE is 2");
  vars = TwoRanks();
  vars.erase("MASTER_PORT");
  ExpectInvalid(vars, "MASTER_PORT is required when WORLD_SIZE is 2");
  vars = TwoRanks();
  vars.erase("WORLD_SIZE");
  ExpectInvalid(vars, "WORLD_SIZE is required");
}

TEST(DistEnvTest, PortRange) {
  auto vars = TwoRanks();
  vars["MASTER_PORT"] = "65536";
  ExpectInvalid(vars, "MASTER_PORT must be in [1, 65535], got 65536");
  vars["MASTER_PORT"] = "0";
  ExpectInvalid(vars, "MASTER_PORT must be in [1, 65535], got 0");
}

TEST(DistEnvTest, TimeoutRange) {
  auto vars = TwoRanks();
  vars["LORAPLEX_DIST_TIMEOUT_SECONDS"] = "0";
  ExpectInvalid(vars, "LORAPLEX_DIST_TIMEOUT_SECONDS must be in [1, ");
  absl::StatusOr<DistEnv> env =
      Parse({{"LORAPLEX_DIST_TIMEOUT_SECONDS", "abc"}});
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("LORAPLEX_DIST_TIMEOUT_SECONDS must be an integer"));
}

}  // namespace
}  // namespace loraplex
