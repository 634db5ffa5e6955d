// Slot pool lifecycle: attach, capacity and rank limits, retire, and that
// neither touches the base model or other slots.
#include "adapters/slot_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/train/co_batch_step.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

const std::vector<Projection> kQv = {Projection::kQ, Projection::kV};

SlotAttachRequest Request(const std::string& job, int64_t rank) {
  return TrainRequest(job, OptimizerFamily::kAdamW, rank, kQv,
                      Sequences(ReversalJsonl(6, 1), 16), 1);
}

TEST(SlotPoolTest, AttachTakesTheLowestFreeSlotUntilFull) {
  SlotPool pool(TinyModel().config(), {.capacity = 2});
  EXPECT_EQ(pool.Attach(Request("a", 4)).value(), 0);
  EXPECT_EQ(pool.Attach(Request("b", 4)).value(), 1);
  auto full = pool.Attach(Request("c", 4));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()),
              HasSubstr("all 2 adapter slots are in use"));
  ASSERT_TRUE(pool.Retire(0).ok());
  EXPECT_EQ(pool.Attach(Request("c", 4)).value(), 0);
  EXPECT_EQ(pool.job_id(0), "c");
  EXPECT_EQ(pool.job_id(1), "b");
  EXPECT_EQ(pool.num_attached(), 2);
}

TEST(SlotPoolTest, BadRequestsAreRejectedWithTheField) {
  SlotPool pool(TinyModel().config(), {.capacity = 2, .max_rank = 16});
  auto too_large = pool.Attach(Request("a", 32));
  EXPECT_EQ(too_large.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_large.status().message()),
              HasSubstr("lora.rank must be at most this server's max_rank 16, "
                        "got 32"));
  SlotAttachRequest zero = Request("a", 4);
  zero.lora.rank = 0;
  EXPECT_THAT(std::string(pool.Attach(zero).status().message()),
              HasSubstr("lora.rank must be in [1, 256], got 0"));
  SlotAttachRequest bad_lr = Request("a", 4);
  bad_lr.optimizer.lr = -1;
  EXPECT_THAT(std::string(pool.Attach(bad_lr).status().message()),
              HasSubstr("optimizer.lr"));
  SlotAttachRequest bad_batch = Request("a", 4);
  bad_batch.training.batch_size = 0;
  EXPECT_THAT(std::string(pool.Attach(bad_batch).status().message()),
              HasSubstr("training.batch_size must be in [1, 4096], got 0"));
  EXPECT_EQ(pool.num_attached(), 0);
}

TEST(SlotPoolTest, BadTrainingDataIsRejected) {
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  auto attach = [&](Sequence sequence) {
    auto data = std::make_shared<SequenceSet>();
    data->sequences.push_back(Sequence{{256, 97, 98}, {0, 1, 1}});
    data->sequences.push_back(std::move(sequence));
    SlotAttachRequest request = Request("a", 4);
    request.data = data;
    auto slot = pool.Attach(request);
    EXPECT_EQ(slot.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(slot.status().message());
  };
  EXPECT_THAT(attach({{256, 300}, {0, 1}}),
              HasSubstr("training sequence 1 has token id 300 at position 1, "
                        "outside the vocabulary [0, 259)"));
  EXPECT_THAT(attach({{256, 97, 98}, {0, 1}}),
              HasSubstr("one loss_mask value per token"));
  EXPECT_THAT(attach({{256, 97}, {1, 0}}),
              HasSubstr("training sequence 1 has no target token"));
  EXPECT_EQ(pool.num_attached(), 0);
}

TEST(SlotPoolTest, RetireChecksTheSlot) {
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  EXPECT_EQ(pool.Retire(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.Retire(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Retire(-1).code(), absl::StatusCode::kInvalidArgument);
}

bool AllEqual(const std::vector<torch::Tensor>& a,
              const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(SlotPoolTest, AttachAndRetireLeaveOtherSlotsAndTheBaseAlone) {
  const LlamaModel& model = TinyModel();
  SlotPool pool(model.config(), {.capacity = 3});
  ASSERT_EQ(pool.Attach(Request("a", 8)).value(), 0);
  ASSERT_TRUE(TrainCoBatchStep(model, pool.ActiveSlots(), {}).ok());
  ASSERT_TRUE(TrainCoBatchStep(model, pool.ActiveSlots(), {}).ok());
  const std::vector<torch::Tensor> weights = Snapshot(pool.slot(0).weights);
  const std::vector<torch::Tensor> state =
      OptimizerStateTensors(*pool.slot(0).optimizer);
  const int64_t steps = pool.slot(0).counters.steps;
  std::vector<torch::Tensor> base;
  for (const LayerWeights& layer : model.weights().layers) {
    for (Projection p : LayerProjections(model.config())) {
      base.push_back(layer.at(p).weight.clone());
    }
  }
  for (int round = 0; round < 3; ++round) {
    SlotAttachRequest muon = Request("b", 16);
    muon.optimizer.family = OptimizerFamily::kMuon;
    ASSERT_EQ(pool.Attach(muon).value(), 1);
    ASSERT_EQ(pool.Attach(Request("c", 2)).value(), 2);
    ASSERT_TRUE(pool.Retire(1).ok());
    ASSERT_TRUE(pool.Retire(2).ok());
  }
  EXPECT_TRUE(AllEqual(Snapshot(pool.slot(0).weights), weights));
  EXPECT_TRUE(AllEqual(OptimizerStateTensors(*pool.slot(0).optimizer), state));
  EXPECT_EQ(pool.slot(0).counters.steps, steps);
  std::vector<torch::Tensor> base_after;
  for (const LayerWeights& layer : model.weights().layers) {
    for (Projection p : LayerProjections(model.config())) {
      base_after.push_back(layer.at(p).weight);
      EXPECT_FALSE(layer.at(p).weight.requires_grad());
    }
  }
  EXPECT_TRUE(AllEqual(base_after, base));
}

TEST(SlotPoolTest, SlotsMoveThroughTheLifecycle) {
  const LlamaModel& model = TinyModel();
  SlotPool pool(model.config(), {.capacity = 3});
  EXPECT_EQ(pool.state(0), SlotState::kFree);
  SlotAttachRequest train = Request("train", 4);
  train.training.max_steps = 2;
  ASSERT_EQ(pool.Attach(train).value(), 0);
  EXPECT_EQ(pool.state(0), SlotState::kTraining);
  ASSERT_TRUE(TrainCoBatchStep(model, pool.ActiveSlots(), {}).ok());
  EXPECT_EQ(pool.state(0), SlotState::kTraining);
  ASSERT_TRUE(TrainCoBatchStep(model, pool.ActiveSlots(), {}).ok());
  // Its last step trained: no more steps until it is retired.
  EXPECT_EQ(pool.state(0), SlotState::kTrained);
  EXPECT_TRUE(pool.ActiveSlotIds().empty());

  SlotAttachRequest eval;
  eval.job_id = "eval";
  ASSERT_EQ(pool.Attach(eval).value(), 1);
  EXPECT_EQ(pool.state(1), SlotState::kEvaluating);
  EXPECT_EQ(pool.SlotsIn(SlotState::kEvaluating), std::vector<int>{1});

  // Zeroing fails (an inference tensor cannot be written in place outside
  // inference mode): the slot is kRetiring, holds no job and takes no
  // attach, until a retire succeeds.
  torch::Tensor param = pool.slot(0).weights.parameters().front();
  {
    c10::InferenceMode inference;
    param.mutable_grad() = torch::zeros(param.sizes());
  }
  EXPECT_EQ(pool.Retire(0).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(pool.state(0), SlotState::kRetiring);
  EXPECT_EQ(pool.Attach(Request("next", 4)).value(), 2);  // Not slot 0.
  EXPECT_EQ(pool.Attach(Request("full", 4)).status().code(),
            absl::StatusCode::kResourceExhausted);
  param.mutable_grad() = torch::Tensor();
  ASSERT_TRUE(pool.Retire(0).ok());
  EXPECT_EQ(pool.state(0), SlotState::kFree);
  ASSERT_TRUE(pool.Retire(1).ok());
  EXPECT_EQ(pool.SlotsIn(SlotState::kFree), (std::vector<int>{0, 1}));
  EXPECT_EQ(SlotStateName(SlotState::kRetiring), "retiring");
}

TEST(SlotPoolTest, ImportedAdapterAttachesForEvaluation) {
  const LlamaModel& model = TinyModel();
  SlotPool pool(model.config(), {.capacity = 2});
  ASSERT_EQ(pool.Attach(Request("trained", 4)).value(), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(TrainCoBatchStep(model, pool.ActiveSlots(), {}).ok());
  }
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(pool.slot(0).weights, "tiny", dir).ok());
  auto adapter = LoadPeftAdapter(dir, model.config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  SlotAttachRequest eval;
  eval.job_id = "eval";
  eval.initial_weights =
      std::make_shared<const PeftAdapter>(std::move(adapter).value());
  ASSERT_EQ(pool.Attach(eval).value(), 1);
  EXPECT_EQ(pool.ActiveSlotIds(), std::vector<int>{0});  // Not training.
  EXPECT_TRUE(
      AllEqual(Snapshot(pool.slot(1).weights), Snapshot(pool.slot(0).weights)));
  auto data = Sequences(ReversalJsonl(4, 2), 16);
  EXPECT_EQ(
      EvalLoss(model, &pool.slot(1).weights, data->sequences, {}).value(),
      EvalLoss(model, &pool.slot(0).weights, data->sequences, {}).value());
}

}  // namespace
}  // namespace loraplex
