// DistContext and PlanBuckets within one process (world size 1, argument
// checks). The multi-process behaviour is in multi_process_test.cc.
#include "core/dist/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

DistContext Alone() {
  absl::StatusOr<DistContext> dist =
      DistContext::Create(DistEnv(), torch::kCPU);
  EXPECT_TRUE(dist.ok()) << dist.status();
  return std::move(dist).value();
}

TEST(PlanBucketsTest, PacksInOrderPerDtype) {
  std::vector<torch::Tensor> tensors = {
      torch::zeros({10}),                  // 40 bytes
      torch::zeros({5}, torch::kDouble),   // 40 bytes
      torch::zeros({10}),                  // 40 bytes
      torch::zeros({30}),                  // 120 bytes: its own bucket
      torch::zeros({0}),                   // empty: left out
      torch::zeros({2}),                   // 8 bytes
      torch::zeros({4}, torch::kDouble)};  // 32 bytes
  absl::StatusOr<std::vector<std::vector<size_t>>> plan =
      PlanBuckets(tensors, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre(ElementsAre(0, 2), ElementsAre(3),
                                 ElementsAre(5), ElementsAre(1, 6)));
}

TEST(PlanBucketsTest, RejectsBadInput) {
  std::vector<torch::Tensor> tensors = {torch::zeros({1})};
  absl::StatusOr<std::vector<std::vector<size_t>>> plan =
      PlanBuckets(tensors, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("bucket_bytes must be >= 1, got 0"));
  tensors.push_back(torch::Tensor());
  plan = PlanBuckets(tensors, 10);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("tensors[1] is undefined"));
}

TEST(DistContextTest, WorldOfOneIsANoOp) {
  DistContext dist = Alone();
  EXPECT_EQ(dist.rank(), 0);
  EXPECT_EQ(dist.world_size(), 1);
  EXPECT_TRUE(dist.is_root());
  EXPECT_TRUE(dist.Barrier().ok());
  std::string plan = "plan";
  EXPECT_TRUE(dist.Broadcast(&plan, 0).ok());
  EXPECT_EQ(plan, "plan");
  std::vector<torch::Tensor> grads = {torch::arange(6, torch::kFloat)};
  EXPECT_TRUE(dist.AllReduceMean(grads, 16).ok());
  EXPECT_TRUE(torch::equal(grads[0], torch::arange(6, torch::kFloat)));
  std::vector<torch::Tensor> params = {torch::ones({2, 2})};
  EXPECT_TRUE(dist.BroadcastFromOwners(params, {0}).ok());
  EXPECT_EQ(dist.counters().collectives, 0);
  EXPECT_EQ(dist.counters().all_reduce_bytes, 0);
}

TEST(DistContextTest, RejectsBadArguments) {
  DistContext dist = Alone();
  std::vector<torch::Tensor> ints = {torch::zeros({3}, torch::kLong)};
  absl::Status status = dist.AllReduceMean(ints, 1024);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensors[0] must be floating point"));

  std::vector<torch::Tensor> params = {torch::ones({2}), torch::ones({3})};
  status = dist.BroadcastFromOwners(params, {0});
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("owner has 1 entries for 2 params"));
  status = dist.BroadcastFromOwners(params, {0, 1});
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("owner[1] must be in [0, 1), got 1"));

  std::string plan;
  status = dist.Broadcast(&plan, 1);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("root must be in [0, 1), got 1"));
  EXPECT_EQ(dist.Broadcast(nullptr, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DistContextTest, CudaWithoutNcclIsAPreconditionFailure) {
  if (C10dCollectives::NcclAvailable()) GTEST_SKIP() << "built with NCCL";
  DistEnv env;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = 1;
  absl::StatusOr<DistContext> dist =
      DistContext::Create(env, torch::Device(torch::kCUDA, 0));
  ASSERT_FALSE(dist.ok());
  EXPECT_EQ(dist.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(dist.status().message()),
              HasSubstr("LORAPLEX_WITH_NCCL"));
}

}  // namespace
}  // namespace loraplex
