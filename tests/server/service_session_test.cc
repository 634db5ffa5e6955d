// Training sessions through the real server and client: operations apply
// once each and in seq_id order whatever order they arrive in, results are
// kept for repeats and RetrieveResult, saved weights sample like any
// adapter, sessions hold slots beside jobs (and release them on close),
// bad requests get clear errors naming the field, and a small RL loop
// (sample from the policy, reward a synthetic task, an importance_sampling
// or ppo update) raises the mean reward with AdamW and with Muon.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors/safetensors.h"
#include "tests/server/service_fixture.h"
#include "tests/server/session_requests.h"

namespace loraplex {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789";
constexpr char kBobToken[] = "bob-token-0123456789ab";

class ServiceSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = FreshTestDir("state");
    std::ofstream(state_ + "/tokens")
        << "alice " << kAliceToken << "\nbob " << kBobToken << "\n";
    server_ = StartServer(state_, 3, {"--tokens-file", state_ + "/tokens"});
    ASSERT_NE(server_, nullptr);
    alice_ = ClientFor(*server_, kAliceToken);
    bob_ = ClientFor(*server_, kBobToken);
  }

  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
    }
  }

  std::string Open(LoraplexClient& client, v1::OptimizerFamily family,
                   double lr = 1e-2, uint64_t seed = 5) {
    auto session = client.CreateSession(SessionRequest(family, lr, seed));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? session->name() : "";
  }

  std::string state_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<LoraplexClient> alice_;
  std::unique_ptr<LoraplexClient> bob_;
};

// Gradients accumulate until the step, and the loss falls over steps; a
// repeated seq_id answers the first result and is not applied again: a
// session that repeats every call ends exactly where one that does not.
TEST_F(ServiceSessionTest, CallsApplyOnceAndTheLossFalls) {
  const std::string once = Open(*alice_, v1::OPTIMIZER_FAMILY_ADAMW);
  const std::string twice = Open(*alice_, v1::OPTIMIZER_FAMILY_ADAMW);
  auto slots = alice_->ListSlots();
  ASSERT_TRUE(slots.ok());
  int session_slots = 0;
  for (const v1::Slot& slot : slots->slots()) {
    session_slots += absl::StartsWith(slot.session(), "sessions/");
  }
  EXPECT_EQ(session_slots, 2);

  std::vector<double> losses;
  std::vector<double> repeated_losses;
  int64_t seq = 0;
  for (int step = 0; step < 8; ++step) {
    ++seq;
    auto fb = alice_->ForwardBackward(CrossEntropy(once, seq));
    ASSERT_TRUE(fb.ok()) << fb.status();
    ASSERT_EQ(fb->seq_id(), seq);
    ASSERT_EQ(fb->forward_backward().outputs_size(), 2);
    EXPECT_EQ(fb->forward_backward().outputs(0).logprobs_size(), 11);
    EXPECT_EQ(fb->forward_backward().metrics().at("loss:sum"),
              fb->forward_backward().loss());
    losses.push_back(fb->forward_backward().loss());
    // The sum, not the mean: 11 + 8 target tokens of about log(259) each.
    if (step == 0) {
      EXPECT_GT(fb->forward_backward().loss(), 19 * 4.0);
    }

    auto first = alice_->ForwardBackward(CrossEntropy(twice, seq));
    auto again = alice_->ForwardBackward(CrossEntropy(twice, seq));
    ASSERT_TRUE(first.ok() && again.ok());
    EXPECT_EQ(again->forward_backward().loss(),
              first->forward_backward().loss());
    repeated_losses.push_back(first->forward_backward().loss());

    ++seq;
    auto stepped = alice_->OptimStep(Step(once, seq, 1e-2));
    auto stepped_twice = alice_->OptimStep(Step(twice, seq, 1e-2));
    auto repeat = alice_->OptimStep(Step(twice, seq, 1e-2));
    ASSERT_TRUE(stepped.ok() && stepped_twice.ok() && repeat.ok());
    EXPECT_FALSE(stepped->optim_step().skipped());
    EXPECT_EQ(stepped->optim_step().steps(), step + 1);
    EXPECT_EQ(repeat->optim_step().steps(), step + 1);
    EXPECT_EQ(stepped_twice->optim_step().grad_norm(),
              stepped->optim_step().grad_norm());
  }
  EXPECT_EQ(repeated_losses, losses);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  auto info = alice_->GetSession(twice);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->steps(), 8);
  EXPECT_EQ(info->next_seq_id(), seq + 1);

  // Forward only: the outputs, no gradients (the next step has none).
  v1::ForwardBackwardRequest forward = CrossEntropy(once, ++seq);
  forward.set_forward_only(true);
  auto outputs = alice_->ForwardBackward(forward);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_LT(outputs->forward_backward().loss(), losses.back());
  auto nothing = alice_->OptimStep(Step(once, ++seq, 1e-2));
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->optim_step().skipped());
  EXPECT_EQ(nothing->optim_step().skip_reason(),
            "no gradients since the last step");

  // The results stay retrievable by seq_id.
  v1::RetrieveResultRequest retrieve;
  retrieve.set_session(once);
  retrieve.set_seq_id(1);
  auto kept = alice_->RetrieveResult(retrieve);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->done());
  EXPECT_EQ(kept->result().forward_backward().loss(), losses.front());
  retrieve.set_seq_id(seq + 5);
  EXPECT_EQ(alice_->RetrieveResult(retrieve).status().code(),
            absl::StatusCode::kNotFound);
}

// A Lion session: the family is reported, per-call Lion betas step, and a
// bad one is refused naming the field with nothing applied.
TEST_F(ServiceSessionTest, LionSessionStepsWithPerCallBetas) {
  const std::string session = Open(*alice_, v1::OPTIMIZER_FAMILY_LION, 1e-3);
  auto info = alice_->GetSession(session);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->family(), v1::OPTIMIZER_FAMILY_LION);
  std::vector<double> losses;
  for (int64_t seq = 1; seq <= 6; seq += 2) {
    auto fb = alice_->ForwardBackward(CrossEntropy(session, seq));
    ASSERT_TRUE(fb.ok()) << fb.status();
    losses.push_back(fb->forward_backward().loss());
    v1::OptimStepRequest step = Step(session, seq + 1, 1e-3);
    step.set_lion_beta1(0.8);
    step.set_lion_beta2(0.95);
    if (seq == 3) {
      v1::OptimStepRequest bad = step;
      bad.set_lion_beta2(1.5);
      const auto refused = alice_->OptimStep(bad);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(refused.status().message()),
                  HasSubstr("lion_betas[1] must be in [0, 1), got 1.5"));
    }
    auto stepped = alice_->OptimStep(step);
    ASSERT_TRUE(stepped.ok()) << stepped.status();
    EXPECT_FALSE(stepped->optim_step().skipped());
    EXPECT_EQ(stepped->optim_step().steps(), (seq + 1) / 2);
  }
  EXPECT_LT(losses.back(), losses.front());
}

// A SOAP session: the family is reported (also by ListSlots), every
// per-call SOAP hyperparameter steps, and a bad one or another
// max_precond_dim (it shapes the state) is refused naming the field.
TEST_F(ServiceSessionTest, SoapSessionStepsWithPerCallHyperparameters) {
  const std::string session = Open(*alice_, v1::OPTIMIZER_FAMILY_SOAP, 1e-2);
  auto info = alice_->GetSession(session);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->family(), v1::OPTIMIZER_FAMILY_SOAP);
  auto slots = alice_->ListSlots();
  ASSERT_TRUE(slots.ok()) << slots.status();
  int soap_slots = 0;
  for (const v1::Slot& slot : slots->slots()) {
    if (slot.session() == session) {
      EXPECT_EQ(slot.family(), v1::OPTIMIZER_FAMILY_SOAP);
      ++soap_slots;
    }
  }
  EXPECT_EQ(soap_slots, 1);
  std::vector<double> losses;
  for (int64_t seq = 1; seq <= 6; seq += 2) {
    auto fb = alice_->ForwardBackward(CrossEntropy(session, seq));
    ASSERT_TRUE(fb.ok()) << fb.status();
    losses.push_back(fb->forward_backward().loss());
    v1::OptimStepRequest step = Step(session, seq + 1, 1e-2);
    step.set_soap_beta1(0.85);
    step.set_soap_beta2(0.9);
    step.set_shampoo_beta(0.9);
    step.set_precondition_frequency(2);
    step.set_power_iter_steps(2);
    step.set_use_eigh(seq == 5);
    step.set_max_update_rms(5.0);
    step.set_max_precond_dim(1024);  // The session's: accepted.
    if (seq == 3) {
      v1::OptimStepRequest bad = step;
      bad.set_soap_beta2(1.5);
      auto refused = alice_->OptimStep(bad);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(refused.status().message()),
                  HasSubstr("soap_betas[1] must be in [0, 1), got 1.5"));
      bad = step;
      bad.set_max_precond_dim(64);
      refused = alice_->OptimStep(bad);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(refused.status().message()),
                  HasSubstr("max_precond_dim must be the session's, 1024"));
    }
    auto stepped = alice_->OptimStep(step);
    ASSERT_TRUE(stepped.ok()) << stepped.status();
    EXPECT_FALSE(stepped->optim_step().skipped());
    EXPECT_EQ(stepped->optim_step().steps(), (seq + 1) / 2);
  }
  EXPECT_LT(losses.back(), losses.front());
}

// Operations that arrive ahead of their turn wait for the ones before
// them: a step sent before its forward/backward still steps on its
// gradients; RetrieveResult on one still waiting answers "not yet".
TEST_F(ServiceSessionTest, OperationsApplyInSeqIdOrder) {
  const std::string session = Open(*alice_, v1::OPTIMIZER_FAMILY_MUON, 2e-2);
  std::future<absl::StatusOr<v1::SessionResult>> step =
      std::async(std::launch::async,
                 [&] { return alice_->OptimStep(Step(session, 2, 2e-2)); });
  v1::RetrieveResultRequest retrieve;
  retrieve.set_session(session);
  retrieve.set_seq_id(2);
  retrieve.set_timeout_ms(300);
  // Seq 2 waits for seq 1 however long this takes.
  for (;;) {
    auto info = alice_->GetSession(session);
    ASSERT_TRUE(info.ok());
    auto pending = alice_->RetrieveResult(retrieve);
    if (pending.ok()) {
      EXPECT_FALSE(pending->done());
      break;
    }
    ASSERT_EQ(pending.status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(alice_->GetSession(session)->next_seq_id(), 1);
  auto fb = alice_->ForwardBackward(CrossEntropy(session, 1));
  ASSERT_TRUE(fb.ok()) << fb.status();
  auto stepped = step.get();
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_FALSE(stepped->optim_step().skipped());
  EXPECT_GT(stepped->optim_step().grad_norm(), 0.0);
  EXPECT_EQ(stepped->optim_step().steps(), 1);
  retrieve.set_timeout_ms(0);
  auto done = alice_->RetrieveResult(retrieve);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done());
  EXPECT_EQ(done->result().optim_step().grad_norm(),
            stepped->optim_step().grad_norm());
}

TEST_F(ServiceSessionTest, BadRequestsAreRefusedWithTheField) {
  const std::string session = Open(*alice_, v1::OPTIMIZER_FAMILY_ADAMW);
  auto expect = [](const absl::Status& status, absl::StatusCode code,
                   const std::string& message) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  };
  v1::ForwardBackwardRequest bad = CrossEntropy(session, 1);
  bad.set_loss_fn("mse");
  expect(alice_->ForwardBackward(bad).status(),
         absl::StatusCode::kInvalidArgument, "loss_fn: unknown loss \"mse\"");
  bad = CrossEntropy(session, 1);
  bad.mutable_data(1)->set_target_tokens(3, 259);
  expect(alice_->ForwardBackward(bad).status(),
         absl::StatusCode::kInvalidArgument,
         "data[1].loss_fn_inputs.target_tokens[3] = 259 is outside the "
         "vocabulary [0, 259)");
  bad = CrossEntropy(session, 1);
  bad.mutable_data(0)->add_weights(1.0f);
  expect(alice_->ForwardBackward(bad).status(),
         absl::StatusCode::kInvalidArgument,
         "data[0].loss_fn_inputs.weights: 12 values for 11 (too many)");
  bad = CrossEntropy(session, 1);
  bad.set_loss_fn("ppo");
  expect(alice_->ForwardBackward(bad).status(),
         absl::StatusCode::kInvalidArgument,
         "data[0].loss_fn_inputs.weights is not an input of loss_fn \"ppo\"");
  bad = CrossEntropy(session, 1);
  bad.set_loss_fn("dro");
  expect(alice_->ForwardBackward(bad).status(),
         absl::StatusCode::kInvalidArgument, "loss_fn_config.beta is required");
  expect(alice_->ForwardBackward(CrossEntropy(session, 0)).status(),
         absl::StatusCode::kInvalidArgument, "seq_id must be >= 1, got 0");
  expect(alice_->ForwardBackward(CrossEntropy(session, 65)).status(),
         absl::StatusCode::kFailedPrecondition,
         "seq_id 65 is too far ahead: the session applies 1 next");
  v1::OptimStepRequest bad_step = Step(session, 1, 1e-2);
  bad_step.set_beta2(1.5);
  expect(alice_->OptimStep(bad_step).status(),
         absl::StatusCode::kInvalidArgument, "optimizer.betas[1]");
  bad_step = Step(session, 1, 1e-2);
  bad_step.set_grad_clip_norm(-1);
  expect(alice_->OptimStep(bad_step).status(),
         absl::StatusCode::kInvalidArgument, "grad_clip_norm");
  // None of these took seq_id 1.
  EXPECT_EQ(alice_->GetSession(session)->next_seq_id(), 1);

  // Another tenant's session is not found; a bad name is refused.
  expect(bob_->ForwardBackward(CrossEntropy(session, 1)).status(),
         absl::StatusCode::kNotFound, "not found");
  expect(bob_->GetSession(session).status(), absl::StatusCode::kNotFound,
         "not found");
  expect(alice_->GetSession("jobs/x").status(),
         absl::StatusCode::kInvalidArgument, "session must be a name like");
  v1::CreateSessionRequest too_big =
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 1);
  too_big.mutable_lora()->set_rank(0);
  expect(alice_->CreateSession(too_big).status(),
         absl::StatusCode::kInvalidArgument, "lora.rank");
  v1::CreateSessionRequest other_base =
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 1);
  other_base.set_base_model(std::string(20000, 'x'));
  auto refused = alice_->CreateSession(other_base);
  expect(refused.status(), absl::StatusCode::kInvalidArgument,
         "base_model: this server trains on");
  EXPECT_LT(refused.status().message().size(), 200u);
}

// Sessions hold slots beside jobs: with every slot taken a new session is
// refused, and a closed session's slot goes to the next one. A closed
// session takes no more work; the weights it saved sample and export (with
// LoRA on the LM head, under PEFT's names).
TEST_F(ServiceSessionTest, SlotsSavedWeightsAndClose) {
  v1::CreateSessionRequest with_head =
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 5e-2, 5);
  for (const char* module : {"q_proj", "v_proj", "lm_head"}) {
    with_head.mutable_lora()->add_target_modules(module);
  }
  auto opened = alice_->CreateSession(with_head);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_THAT(opened->lora().target_modules(),
              ::testing::ElementsAre("q_proj", "v_proj", "lm_head"));
  const std::string a = opened->name();
  const std::string b = Open(*bob_, v1::OPTIMIZER_FAMILY_ADAM);
  auto dataset = alice_->UploadDatasetContents(ReversalJsonl(8, 1), "d");
  ASSERT_TRUE(dataset.ok());
  auto job = alice_->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 1000000, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitUntil(*alice_, job->name(), [](const v1::Job& j) {
                return j.status() == v1::JOB_STATUS_RUNNING;
              }).ok());
  auto full =
      bob_->CreateSession(SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 1));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()),
              HasSubstr("adapter slots are in use by jobs and sessions"));

  // Sessions train beside the running job.
  for (int64_t seq = 1; seq <= 6; seq += 2) {
    ASSERT_TRUE(alice_->ForwardBackward(CrossEntropy(a, seq)).ok());
    ASSERT_TRUE(alice_->OptimStep(Step(a, seq + 1, 5e-2)).ok());
  }
  v1::SaveWeightsForSamplerRequest save;
  save.set_session(a);
  save.set_seq_id(7);
  save.set_display_name("after three steps");
  auto saved = alice_->SaveWeightsForSampler(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->saved_weights().steps(), 3);
  const std::string adapter = saved->saved_weights().adapter();
  auto stored = alice_->GetAdapter(adapter);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->display_name(), "after three steps");
  EXPECT_EQ(bob_->GetAdapter(adapter).status().code(),
            absl::StatusCode::kNotFound);

  // The saved adapter is frozen: later steps do not change what it
  // samples; its greedy tokens follow the session's training text.
  v1::SampleRequest sample;
  for (int64_t id : Bytes("hel")) sample.mutable_tokens()->add_ids(id);
  sample.set_max_tokens(4);
  sample.set_temperature(0);
  sample.set_adapter(adapter);
  auto before = alice_->Sample(sample);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(alice_->ForwardBackward(CrossEntropy(a, 8)).ok());
  ASSERT_TRUE(alice_->OptimStep(Step(a, 9, 5e-1)).ok());
  auto after = alice_->Sample(sample);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->samples(0).text(), before->samples(0).text());
  const std::string dir = FreshTestDir("export");
  v1::ExportAdapterRequest export_request;
  export_request.set_adapter(adapter);
  ASSERT_TRUE(alice_->ExportAdapter(export_request, dir).ok());
  {
    std::ifstream config_file(dir + "/adapter_config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config["target_modules"],
              nlohmann::json({"q_proj", "v_proj", "lm_head"}));
    auto weights = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
    ASSERT_TRUE(weights.ok()) << weights.status();
    const SafetensorsTensorInfo* head_b =
        (*weights)->Find("base_model.model.lm_head.lora_B.weight");
    ASSERT_NE(head_b, nullptr);
    EXPECT_EQ(head_b->shape, (std::vector<int64_t>{259, 8}));
    // Trained: PEFT's B starts at zero.
    EXPECT_GT((*weights)
                  ->Load("base_model.model.lm_head.lora_B.weight")
                  ->abs()
                  .max()
                  .item<double>(),
              0.0);
  }

  // Close: the slot goes to the next session; the closed one takes no
  // more work but answers for what it did.
  const int slot = alice_->GetSession(a)->slot();
  auto closed = alice_->CloseSession(a);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->state(), v1::SESSION_STATE_CLOSED);
  EXPECT_EQ(closed->steps(), 4);
  auto refused = alice_->ForwardBackward(CrossEntropy(a, 10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("closed"));
  auto repeat = alice_->OptimStep(Step(a, 9, 5e-1));
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_EQ(repeat->optim_step().steps(), 4);
  auto next =
      bob_->CreateSession(SessionRequest(v1::OPTIMIZER_FAMILY_MUON, 1e-2, 1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->slot(), slot);
  auto listed = alice_->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->sessions_size(), 1);
  EXPECT_EQ(listed->sessions(0).state(), v1::SESSION_STATE_CLOSED);
  // The job trained on throughout.
  EXPECT_EQ(alice_->GetJob(job->name())->status(), v1::JOB_STATUS_RUNNING);
  ASSERT_TRUE(alice_->CancelJob(job->name()).ok());
  ASSERT_TRUE(bob_->CloseSession(b).ok());
}

// SaveState keeps weights, optimizer state and steps on disk: a new
// session from it (with the optimizer) continues exactly as the original
// does, also after a restart; without the optimizer it starts from the
// weights with fresh moments; LoadState replaces an open session's. States
// are their tenant's, and must fit the session they load into.
TEST_F(ServiceSessionTest, SavedStatesResumeExactly) {
  const std::string original = Open(*alice_, v1::OPTIMIZER_FAMILY_MUON, 2e-2);
  int64_t seq = 0;
  auto train = [&](LoraplexClient& client, const std::string& session,
                   int64_t& at, int steps) {
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      auto fb = client.ForwardBackward(CrossEntropy(session, ++at));
      EXPECT_TRUE(fb.ok()) << fb.status();
      if (!fb.ok()) return losses;
      losses.push_back(fb->forward_backward().loss());
      EXPECT_TRUE(client.OptimStep(Step(session, ++at, 2e-2)).ok());
    }
    return losses;
  };
  train(*alice_, original, seq, 3);
  v1::SaveStateRequest save;
  save.set_session(original);
  save.set_seq_id(++seq);
  auto saved = alice_->SaveState(save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->saved_state().steps(), 3);
  const std::string state = saved->saved_state().state();
  EXPECT_TRUE(absl::StartsWith(state, "session_states/")) << state;
  const std::vector<double> reference = train(*alice_, original, seq, 3);
  ASSERT_TRUE(alice_->CloseSession(original).ok());

  // Only alice's; and from_state takes the state's config.
  v1::CreateSessionRequest from;
  from.set_from_state(state);
  from.set_with_optimizer(true);
  EXPECT_EQ(bob_->CreateSession(from).status().code(),
            absl::StatusCode::kNotFound);
  v1::CreateSessionRequest both = from;
  both.mutable_lora()->set_rank(4);
  EXPECT_EQ(alice_->CreateSession(both).status().code(),
            absl::StatusCode::kInvalidArgument);

  // After a restart, a session from the state continues exactly.
  ASSERT_TRUE(server_->Stop().ok());
  server_ = StartServer(state_, 3, {"--tokens-file", state_ + "/tokens"});
  ASSERT_NE(server_, nullptr);
  alice_ = ClientFor(*server_, kAliceToken);
  auto resumed = alice_->CreateSession(from);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->steps(), 3);
  EXPECT_EQ(resumed->family(), v1::OPTIMIZER_FAMILY_MUON);
  int64_t resumed_seq = 0;
  EXPECT_EQ(train(*alice_, resumed->name(), resumed_seq, 3), reference);

  // Without the optimizer: the same weights (the first loss), fresh
  // moments (the next differs).
  from.set_with_optimizer(false);
  auto fresh = alice_->CreateSession(from);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->steps(), 0);
  int64_t fresh_seq = 0;
  const std::vector<double> fresh_losses =
      train(*alice_, fresh->name(), fresh_seq, 2);
  ASSERT_EQ(fresh_losses.size(), 2u);
  EXPECT_EQ(fresh_losses[0], reference[0]);
  EXPECT_NE(fresh_losses[1], reference[1]);

  // LoadState into the open session puts the saved weights back; a state
  // of another LoRA shape, or another optimizer family with the
  // optimizer, does not fit.
  v1::LoadStateRequest load;
  load.set_session(fresh->name());
  load.set_seq_id(++fresh_seq);
  load.set_state(state);
  load.set_with_optimizer(true);
  auto loaded = alice_->LoadState(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->loaded_state().steps(), 3);
  EXPECT_EQ(train(*alice_, fresh->name(), fresh_seq, 3), reference);
  v1::CreateSessionRequest small =
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 1);
  small.mutable_lora()->set_rank(4);
  auto other = alice_->CreateSession(small);
  ASSERT_TRUE(other.ok()) << other.status();
  load.set_session(other->name());
  load.set_seq_id(1);
  auto refused = alice_->LoadState(load);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("state: its LoRA config"));
}

// A session without a call for --session-idle-seconds is saved and
// closed: its slot is free again, a late call says where its state is,
// and a session from that state continues where it stopped.
TEST(ServiceSessionIdleTest, IdleSessionsAreSavedAndTheirSlotFreed) {
  auto server =
      StartServer(FreshTestDir("idle"), 1, {"--session-idle-seconds=3"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto session = client->CreateSession(
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 3));
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string name = session->name();
  ASSERT_TRUE(client->ForwardBackward(CrossEntropy(name, 1)).ok());
  ASSERT_TRUE(client->OptimStep(Step(name, 2, 1e-2)).ok());
  auto before = client->ForwardBackward(CrossEntropy(name, 3));
  ASSERT_TRUE(before.ok());
  // Waits for the idle close (1 s after the last call; 60 s at most).
  absl::StatusOr<v1::Session> closed;
  for (int i = 0; i < 600; ++i) {
    closed = client->GetSession(name);
    ASSERT_TRUE(closed.ok()) << closed.status();
    // Saving it shows as CLOSING, never as CLOSED before its state is
    // saved.
    ASSERT_THAT(closed->state(),
                AnyOf(v1::SESSION_STATE_OPEN, v1::SESSION_STATE_CLOSING,
                      v1::SESSION_STATE_CLOSED));
    if (closed->state() == v1::SESSION_STATE_CLOSED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(closed->state(), v1::SESSION_STATE_CLOSED);
  EXPECT_EQ(closed->steps(), 1);
  const std::string state = closed->idle_state();
  ASSERT_TRUE(absl::StartsWith(state, "session_states/")) << state;
  auto late = client->OptimStep(Step(name, 4, 1e-2));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("its state was saved as \"" + state + "\""));
  // The one slot is free for a new session, from the saved state: the
  // gradients of call 3 were not saved (a state holds weights and the
  // optimizer), so it repeats call 3 and gets the same loss.
  v1::CreateSessionRequest from;
  from.set_from_state(state);
  from.set_with_optimizer(true);
  auto resumed = client->CreateSession(from);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->steps(), 1);
  auto again = client->ForwardBackward(CrossEntropy(resumed->name(), 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->forward_backward().loss(),
            before->forward_backward().loss());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// One iteration of the RL loop for one session: save the policy, sample
// `n` one-token answers to `prompt`, reward the digits, and update with
// `loss_fn` on group-centred advantages. Returns the mean reward.
double RlIteration(LoraplexClient& client, const std::string& session,
                   int64_t& seq, const std::string& loss_fn, int iteration) {
  const std::vector<int64_t> prompt = Bytes("Answer with a digit: ");
  v1::SaveWeightsForSamplerRequest save;
  save.set_session(session);
  save.set_seq_id(++seq);
  auto saved = client.SaveWeightsForSampler(save);
  EXPECT_TRUE(saved.ok()) << saved.status();
  if (!saved.ok()) return 0;
  v1::SampleRequest sample;
  for (int64_t id : prompt) sample.mutable_tokens()->add_ids(id);
  sample.set_adapter(saved->saved_weights().adapter());
  sample.set_n(16);
  sample.set_max_tokens(1);
  sample.set_temperature(1);
  sample.set_ignore_eos(true);
  sample.set_seed(1000 + iteration);
  auto samples = client.Sample(sample);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (!samples.ok()) return 0;
  std::vector<double> rewards;
  for (const v1::Sample& s : samples->samples()) {
    const int64_t token = s.tokens(0);
    rewards.push_back(token >= '0' && token <= '9' ? 1.0 : 0.0);
  }
  double mean = 0;
  for (double r : rewards) mean += r;
  mean /= static_cast<double>(rewards.size());
  v1::ForwardBackwardRequest update;
  update.set_session(session);
  update.set_seq_id(++seq);
  update.set_loss_fn(loss_fn);
  for (int i = 0; i < samples->samples_size(); ++i) {
    const v1::Sample& s = samples->samples(i);
    v1::Datum* datum = update.add_data();
    for (size_t t = 0; t < prompt.size(); ++t) {
      datum->add_input_ids(prompt[t]);
      const bool last = t + 1 == prompt.size();
      datum->add_target_tokens(last ? s.tokens(0) : prompt[t + 1]);
      // Only the answer is scored: the prompt's tokens have advantage 0.
      datum->add_logprobs(last ? static_cast<float>(s.logprobs(0)) : 0.0f);
      datum->add_advantages(
          last ? static_cast<float>((rewards[i] - mean) / 16.0) : 0.0f);
    }
  }
  auto fb = client.ForwardBackward(update);
  EXPECT_TRUE(fb.ok()) << fb.status();
  v1::OptimStepRequest step;
  step.set_session(session);
  step.set_seq_id(++seq);
  auto stepped = client.OptimStep(step);
  EXPECT_TRUE(stepped.ok()) << stepped.status();
  return mean;
}

// The RL loop end to end, two sessions driven at once (co-batched with
// each other): importance_sampling with AdamW, ppo with Muon. Digits are
// 10 of the 259 byte-tokenizer ids, so the untrained policy answers one
// about 4% of the time; the mean reward must rise clearly.
TEST_F(ServiceSessionTest, RlLoopRaisesTheRewardWithAdamWAndMuon) {
  constexpr int kIterations = 30;
  struct Run {
    std::string name;
    std::string loss_fn;
    std::vector<double> rewards;
  };
  std::vector<Run> runs = {
      {Open(*alice_, v1::OPTIMIZER_FAMILY_ADAMW, 2e-2, 11),
       "importance_sampling",
       {}},
      {Open(*alice_, v1::OPTIMIZER_FAMILY_MUON, 5e-2, 12), "ppo", {}}};
  std::vector<std::thread> threads;
  for (Run& run : runs) {
    threads.emplace_back([&run, this] {
      auto client = ClientFor(*server_, kAliceToken);
      int64_t seq = 0;
      for (int i = 0; i < kIterations; ++i) {
        run.rewards.push_back(
            RlIteration(*client, run.name, seq, run.loss_fn, i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Run& run : runs) {
    ASSERT_EQ(run.rewards.size(), static_cast<size_t>(kIterations));
    // The untrained policy's reward (its first 16 samples), and the mean
    // over the last 5 iterations (80 samples): about 0.05 and 0.8-0.9 over
    // sampling seeds.
    double last = 0;
    for (int i = kIterations - 5; i < kIterations; ++i) {
      last += run.rewards[i] / 5;
    }
    RecordProperty(run.loss_fn + "_first_reward", absl::StrCat(run.rewards[0]));
    RecordProperty(run.loss_fn + "_last_reward", absl::StrCat(last));
    EXPECT_LT(run.rewards[0], 0.25) << run.loss_fn;
    EXPECT_GT(last, 0.6) << run.loss_fn;
  }
}

// No session call waits for a checkpoint being written: while the checkpoint
// writer holds a job's checkpoint, a session opens, runs forward_backward
// and steps, and every answer comes before that checkpoint is on disk.
TEST(ServiceSessionCheckpointTest, CallsAnswerWhileACheckpointIsBeingWritten) {
  const std::string state = FreshTestDir("slow-checkpoint");
  auto server = StartServer(state, 2,
                            {"--checkpoint-interval=1",
                             "--test-faults=slow_checkpoint:ms=30000,times=1"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(20, 3), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto job = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 40, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string held = "holding a checkpoint write";
  for (int i = 0; i < 1200 && !absl::StrContains(server->Log(), held); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(absl::StrContains(server->Log(), held)) << server->Log();

  auto session = client->CreateSession(
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 5));
  ASSERT_TRUE(session.ok()) << session.status();
  auto fb = client->ForwardBackward(CrossEntropy(session->name(), 1));
  ASSERT_TRUE(fb.ok()) << fb.status();
  EXPECT_GT(fb->forward_backward().loss(), 0.0);
  auto stepped = client->OptimStep(Step(session->name(), 2, 1e-2));
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_EQ(stepped->optim_step().steps(), 1);
  // The held write is still under way: the job has no checkpoint yet.
  const std::filesystem::path job_dir =
      std::filesystem::path(state) / "checkpoints" / job->name().substr(5);
  std::error_code error;
  EXPECT_TRUE(!std::filesystem::exists(job_dir, error) ||
              std::filesystem::is_empty(job_dir, error))
      << job_dir;
  server->Kill();
}

}  // namespace
}  // namespace loraplex
