// The step plan rank 0 sends the other ranks survives its encoding field
// for field, garbage is refused, and the model fingerprint tells models
// apart.
#include "server/trainer/step_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/model/model_presets.h"
#include "core/model/sharded_base.h"
#include "core/optim/config_json.h"
#include "server/trainer/rank_setup.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

StepPlan SamplePlan() {
  StepPlan plan;
  plan.checkpoint = true;
  plan.active[0] = {"job-a", 12, DataCursorState{5, 1, 3}};
  plan.active[3] = {"job-b", 0, std::nullopt};  // Evaluation only.
  StepPlan::Entry attach;
  attach.kind = StepPlan::Entry::Kind::kAttach;
  attach.job_id = "job-c";
  attach.request.job_id = "job-c";
  attach.request.lora.rank = 12;
  attach.request.lora.alpha = 0.1 + 0.2;  // Not exact in decimal.
  attach.request.lora.dropout = 0.05;
  attach.request.lora.targets = {Projection::kQ, Projection::kDown};
  attach.request.optimizer.family = OptimizerFamily::kMuon;
  attach.request.optimizer.lr = 3e-2 / 7;
  attach.request.schedule.kind = LrScheduleKind::kWsd;
  attach.request.schedule.total_steps = 77;
  attach.request.schedule.warmup_steps = 5;
  attach.request.training.batch_size = 3;
  attach.request.training.seq_len = 16;
  attach.request.training.seed = 0x7eedfacecafebeefull;
  attach.request.training.checkpoint_interval = 9;
  attach.request.preferred_slot = 2;
  auto data = std::make_shared<SequenceSet>();
  data->sequences = {{{1, 2, 3, 40000}, {0, 1, 1, 1}},
                     {{7}, {1}},
                     {{9, 8, 7, 6, 5}, {0, 0, 1, 0, 1}}};
  data->truncated_examples = 4;
  data->dropped_examples = 1;
  data->num_target_tokens = 7;
  attach.request.data = data;
  CheckpointInfo restore;
  restore.job_id = "job-c";
  restore.slot = 2;
  restore.total_steps = 77;
  restore.counters = {30, 2, 1234};
  restore.tokens = 5678;
  restore.cursor = {99, 1, 4};
  attach.restore = restore;
  attach.training_state = std::string("\0\x01state\xff", 8);
  plan.entries.push_back(attach);
  StepPlan::Entry evaluate;  // No data: evaluation only.
  evaluate.kind = StepPlan::Entry::Kind::kAttach;
  evaluate.job_id = "job-d";
  plan.entries.push_back(evaluate);
  StepPlan::Entry retire;
  retire.kind = StepPlan::Entry::Kind::kRetire;
  retire.job_id = "job-a";
  plan.entries.push_back(retire);
  StepPlan::Entry pause;
  pause.kind = StepPlan::Entry::Kind::kPause;
  pause.job_id = "job-b";
  plan.entries.push_back(pause);
  return plan;
}

TEST(StepPlanTest, EveryFieldSurvivesTheEncoding) {
  const StepPlan sent = SamplePlan();
  absl::StatusOr<StepPlan> got = DecodeStepPlan(EncodeStepPlan(sent));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->stop);
  EXPECT_TRUE(got->checkpoint);
  ASSERT_EQ(got->active.size(), 2u);
  EXPECT_EQ(got->active.at(0).job_id, "job-a");
  EXPECT_EQ(got->active.at(0).step, 12);
  ASSERT_TRUE(got->active.at(0).cursor.has_value());
  EXPECT_EQ(got->active.at(0).cursor->seed, 5u);
  EXPECT_EQ(got->active.at(0).cursor->epoch, 1);
  EXPECT_EQ(got->active.at(0).cursor->position, 3);
  EXPECT_EQ(got->active.at(3).job_id, "job-b");
  EXPECT_FALSE(got->active.at(3).cursor.has_value());
  ASSERT_EQ(got->entries.size(), 4u);

  const StepPlan::Entry& attach = got->entries[0];
  const SlotAttachRequest& request = attach.request;
  const SlotAttachRequest& expected = sent.entries[0].request;
  EXPECT_EQ(attach.kind, StepPlan::Entry::Kind::kAttach);
  EXPECT_EQ(attach.job_id, "job-c");
  EXPECT_EQ(request.job_id, "job-c");
  EXPECT_EQ(request.lora.rank, 12);
  EXPECT_EQ(request.lora.alpha, expected.lora.alpha);  // Bit for bit.
  EXPECT_EQ(request.lora.dropout, 0.05);
  EXPECT_EQ(request.lora.targets, expected.lora.targets);
  EXPECT_EQ(request.optimizer.family, OptimizerFamily::kMuon);
  EXPECT_EQ(request.optimizer.lr, expected.optimizer.lr);
  EXPECT_EQ(OptimizerConfigToJson(request.optimizer),
            OptimizerConfigToJson(expected.optimizer));
  EXPECT_EQ(request.schedule.kind, LrScheduleKind::kWsd);
  EXPECT_EQ(request.schedule.total_steps, 77);
  EXPECT_EQ(request.schedule.warmup_steps, 5);
  EXPECT_EQ(request.training.batch_size, 3);
  EXPECT_EQ(request.training.seq_len, 16);
  EXPECT_EQ(request.training.seed, 0x7eedfacecafebeefull);
  EXPECT_EQ(request.training.checkpoint_interval, 9);
  EXPECT_EQ(request.preferred_slot, 2);
  EXPECT_EQ(request.initial_weights, nullptr);
  ASSERT_NE(request.data, nullptr);
  ASSERT_EQ(request.data->sequences.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(request.data->sequences[i].input_ids,
              expected.data->sequences[i].input_ids);
    EXPECT_EQ(request.data->sequences[i].loss_mask,
              expected.data->sequences[i].loss_mask);
  }
  EXPECT_EQ(request.data->truncated_examples, 4);
  EXPECT_EQ(request.data->dropped_examples, 1);
  EXPECT_EQ(request.data->num_target_tokens, 7);
  ASSERT_TRUE(attach.restore.has_value());
  EXPECT_EQ(attach.restore->step(), 30);
  EXPECT_EQ(attach.restore->counters.skipped_steps, 2);
  EXPECT_EQ(attach.restore->counters.target_tokens, 1234);
  EXPECT_EQ(attach.restore->tokens, 5678);
  EXPECT_EQ(attach.restore->total_steps, 77);
  EXPECT_EQ(attach.restore->cursor.seed, 99u);
  EXPECT_EQ(attach.restore->cursor.epoch, 1);
  EXPECT_EQ(attach.restore->cursor.position, 4);
  EXPECT_EQ(attach.training_state, sent.entries[0].training_state);

  EXPECT_EQ(got->entries[1].request.data, nullptr);
  EXPECT_FALSE(got->entries[1].restore.has_value());
  EXPECT_EQ(got->entries[2].kind, StepPlan::Entry::Kind::kRetire);
  EXPECT_EQ(got->entries[2].job_id, "job-a");
  EXPECT_EQ(got->entries[3].kind, StepPlan::Entry::Kind::kPause);
  EXPECT_EQ(got->entries[3].job_id, "job-b");

  StepPlan stop;
  stop.stop = true;
  absl::StatusOr<StepPlan> stopped = DecodeStepPlan(EncodeStepPlan(stop));
  ASSERT_TRUE(stopped.ok());
  EXPECT_TRUE(stopped->stop);
  EXPECT_TRUE(stopped->entries.empty());
}

// A session's open (with the checkpoint it continues from) and a round of
// its operations, as the other ranks apply them.
TEST(StepPlanTest, SessionsSurviveTheEncoding) {
  StepPlan sent;
  StepPlan::Entry open;
  open.kind = StepPlan::Entry::Kind::kOpenSession;
  open.job_id = "session-1";
  open.request.lora.rank = 4;
  open.request.lora.alpha = 0.1 + 0.2;
  open.request.optimizer.family = OptimizerFamily::kAdamW;
  open.request.optimizer.lr = 1e-3 / 3;
  open.request.training.seed = 0xfeedfacecafebeefull;
  open.request.preferred_slot = 3;
  SavedSessionState restored;
  restored.optimizer = std::string("\0opt\xff", 5);
  restored.meta = R"({"steps": 7, "calls": 3, "seq_id": 9})";
  restored.gradients = "rank 0's alone";
  open.session_state = restored;
  sent.entries.push_back(open);

  StepPlan::SessionStep call;
  call.slot = 3;
  call.op.kind = SessionOp::Kind::kForwardBackward;
  call.op.session_id = "session-1";
  call.op.seq_id = 10;
  Datum weighted;
  weighted.input_ids = {1, 2, 3};
  weighted.target_tokens = {2, 3, 4, 5, 6, 7};
  weighted.targets_per_position = 2;
  weighted.weights = {1.0, 0.0, 0.5, 1.0 / 3, -2.0, 1e-300};
  Datum rl;
  rl.input_ids = {9};
  rl.target_tokens = {8};
  rl.sampler_logprobs = {-0.1 / 3};
  rl.advantages = {2.0 / 7};
  call.op.data = std::make_shared<const std::vector<Datum>>(
      std::vector<Datum>{weighted, rl});
  call.op.loss = LossFnSpec{LossFn::kPpo, 0.8, 1.2 + 1e-9, 0.0};
  call.op.done = [](absl::StatusOr<SessionOpResult>) {};
  sent.sessions.push_back(call);
  StepPlan::SessionStep step;
  step.slot = 3;
  step.op.kind = SessionOp::Kind::kOptimStep;
  step.op.session_id = "session-1";
  step.op.seq_id = 11;
  step.op.step.family = OptimizerFamily::kAdamW;
  step.op.step.lr = 2e-4 / 3;
  step.op.grad_clip = 0.7;
  sent.sessions.push_back(step);
  StepPlan::SessionStep load;
  load.slot = 3;
  load.op.kind = SessionOp::Kind::kLoadState;
  load.op.session_id = "session-1";
  load.op.with_optimizer = true;
  load.state = restored;
  sent.sessions.push_back(load);

  absl::StatusOr<StepPlan> got = DecodeStepPlan(EncodeStepPlan(sent));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->entries.size(), 1u);
  const StepPlan::Entry& opened = got->entries[0];
  EXPECT_EQ(opened.kind, StepPlan::Entry::Kind::kOpenSession);
  EXPECT_EQ(opened.job_id, "session-1");
  EXPECT_TRUE(opened.request.session);
  EXPECT_EQ(opened.request.lora.alpha, open.request.lora.alpha);
  EXPECT_EQ(opened.request.optimizer.lr, open.request.optimizer.lr);
  EXPECT_EQ(opened.request.training.seed, 0xfeedfacecafebeefull);
  EXPECT_EQ(opened.request.preferred_slot, 3);
  ASSERT_TRUE(opened.session_state.has_value());
  EXPECT_EQ(opened.session_state->optimizer, restored.optimizer);
  EXPECT_EQ(opened.session_state->meta, restored.meta);
  // The adapter and gradients stay with rank 0.
  EXPECT_EQ(opened.session_state->adapter, nullptr);
  EXPECT_TRUE(opened.session_state->gradients.empty());

  ASSERT_EQ(got->sessions.size(), 3u);
  const SessionOp& got_call = got->sessions[0].op;
  EXPECT_EQ(got->sessions[0].slot, 3);
  EXPECT_EQ(got_call.kind, SessionOp::Kind::kForwardBackward);
  EXPECT_EQ(got_call.session_id, "session-1");
  EXPECT_EQ(got_call.seq_id, 10);
  EXPECT_EQ(got_call.loss, call.op.loss);  // Bit for bit.
  EXPECT_FALSE(got_call.done);
  ASSERT_NE(got_call.data, nullptr);
  ASSERT_EQ(got_call.data->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Datum& a = (*got_call.data)[i];
    const Datum& b = (*call.op.data)[i];
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(a.target_tokens, b.target_tokens);
    EXPECT_EQ(a.targets_per_position, b.targets_per_position);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.sampler_logprobs, b.sampler_logprobs);
    EXPECT_EQ(a.advantages, b.advantages);
  }
  const SessionOp& got_step = got->sessions[1].op;
  EXPECT_EQ(got_step.kind, SessionOp::Kind::kOptimStep);
  EXPECT_EQ(got_step.seq_id, 11);
  EXPECT_EQ(got_step.step.lr, step.op.step.lr);
  EXPECT_EQ(got_step.grad_clip, 0.7);
  EXPECT_EQ(got_step.data, nullptr);
  const StepPlan::SessionStep& got_load = got->sessions[2];
  EXPECT_EQ(got_load.op.kind, SessionOp::Kind::kLoadState);
  EXPECT_TRUE(got_load.op.with_optimizer);
  ASSERT_TRUE(got_load.state.has_value());
  EXPECT_EQ(got_load.state->optimizer, restored.optimizer);
}

TEST(StepPlanTest, WhatIsNotAPlanIsRefused) {
  const std::string bytes = EncodeStepPlan(SamplePlan());
  for (const std::string& bad : {std::string(), std::string("not cbor at all"),
                                 bytes.substr(0, bytes.size() / 2)}) {
    absl::StatusOr<StepPlan> plan = DecodeStepPlan(bad);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("not a step plan"));
  }
}

TEST(StepPlanTest, NumbersOfTheWrongKindAreRefused) {
  StepPlan plan;
  plan.active[1] = {"job", 3, std::nullopt};
  const std::string bytes = EncodeStepPlan(plan);
  auto json = nlohmann::json::from_cbor(bytes);
  for (const nlohmann::json& slot :
       {nlohmann::json(1e300), nlohmann::json(1.5), nlohmann::json(1ull << 40),
        nlohmann::json("1")}) {
    json["active"][0]["slot"] = slot;
    const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(json);
    absl::StatusOr<StepPlan> decoded =
        DecodeStepPlan(std::string(cbor.begin(), cbor.end()));
    ASSERT_FALSE(decoded.ok()) << slot.dump();
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  }
  json["active"][0]["slot"] = 2;
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(json);
  absl::StatusOr<StepPlan> decoded =
      DecodeStepPlan(std::string(cbor.begin(), cbor.end()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->active.count(2), 1u);
}

TEST(RankSetupTest, FingerprintTellsModelsApart) {
  const std::string dir = FreshTestDir("models");
  ASSERT_TRUE(WritePresetModel("tiny", 0, dir + "/a").ok());
  ASSERT_TRUE(WritePresetModel("tiny", 0, dir + "/same").ok());
  ASSERT_TRUE(WritePresetModel("tiny", 1, dir + "/other").ok());
  auto load = [&](const std::string& name) {
    auto model = LlamaModel::Load(dir + "/" + name, {});
    EXPECT_TRUE(model.ok()) << model.status();
    return ModelFingerprint(**model);
  };
  const std::string a = load("a");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(load("same"), a);
  EXPECT_NE(load("other"), a);

  // Another fine-tune of the same base: only a projection differs.
  auto base = LlamaModel::Load(dir + "/a", {});
  ASSERT_TRUE(base.ok());
  ModelWeights tuned = (*base)->weights();
  LinearWeights& down =
      tuned.layers.back().projections[static_cast<int>(Projection::kDown)];
  down.weight = down.weight * 1.01;
  const LlamaModel fine_tune((*base)->config(), tuned, (*base)->dtype(),
                             (*base)->device());
  EXPECT_NE(ModelFingerprint(fine_tune), a);
}

// A sharded base's fingerprint (its layers gathered, here over one rank
// whose gather copies) is the whole base's; another checkpoint's differs.
TEST(RankSetupTest, ShardedFingerprintEqualsTheWholeBases) {
  const std::string dir = FreshTestDir("sharded-models");
  ASSERT_TRUE(WritePresetModel("tiny", 0, dir + "/a").ok());
  ASSERT_TRUE(WritePresetModel("tiny", 1, dir + "/other").ok());
  BaseSharding one_rank;
  one_rank.all_gather = [](const torch::Tensor& shard, torch::Tensor& full) {
    full.copy_(shard);
  };
  auto fingerprint = [&](const std::string& name) {
    auto model = LlamaModel::Load(dir + "/" + name, {.shard_base = one_rank});
    EXPECT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::string> sharded =
        ShardedModelFingerprint(**model, dir + "/" + name);
    EXPECT_TRUE(sharded.ok()) << sharded.status();
    return sharded.value_or("");
  };
  auto whole = LlamaModel::Load(dir + "/a", {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(fingerprint("a"), ModelFingerprint(**whole));
  EXPECT_NE(fingerprint("other"), ModelFingerprint(**whole));
}

}  // namespace
}  // namespace loraplex
