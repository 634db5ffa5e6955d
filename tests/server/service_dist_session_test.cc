// Training sessions on the real loraplex-server run data parallel: over 2
// and 3 processes, and over 2 with the base sharded across them, a session
// driven over gRPC (cross_entropy, importance_sampling and ppo calls,
// forward-only calls, optimizer steps with clipping, a saved state loaded
// back, weights saved for the sampler), co-batched beside a job, gives
// every call's loss and logprobs, every step and the saved weights of one
// process (fp64). Stopped (SIGTERM, with gradients accumulated) and killed
// (SIGKILL), sharded ranks carry the session on as one process does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/model_config.h"
#include "tests/server/rank_servers.h"
#include "tests/server/service_fixture.h"
#include "tests/server/session_requests.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// What a run of the session script shows of it.
struct SessionTrace {
  std::vector<double> losses;                 // Every call's, in order.
  std::vector<std::vector<double>> logprobs;  // Every call's, datums joined.
  std::vector<double> grad_norms;             // Every optimizer step's.
  std::vector<int64_t> steps;
  std::vector<torch::Tensor> weights;  // Saved for the sampler at the end.
};

// An RL datum over `text`: its sampler's logprobs and advantages vary per
// token, so a datum's values that land at another datum's place show.
v1::Datum RlDatum(const std::string& text, double advantage) {
  v1::Datum datum = TextDatum(text);
  datum.clear_weights();
  for (int i = 0; i < datum.input_ids_size(); ++i) {
    datum.add_logprobs(static_cast<float>(-0.5 - 0.1 * i));
    datum.add_advantages(static_cast<float>(advantage * (i % 3 == 0 ? -1 : 1)));
  }
  return datum;
}

v1::ForwardBackwardRequest Call(const std::string& session, int64_t seq_id,
                                const std::string& loss,
                                const std::vector<v1::Datum>& data,
                                bool forward_only = false) {
  v1::ForwardBackwardRequest request;
  request.set_session(session);
  request.set_seq_id(seq_id);
  request.set_loss_fn(loss);
  request.set_forward_only(forward_only);
  for (const v1::Datum& datum : data) *request.add_data() = datum;
  return request;
}

class SessionScript {
 public:
  SessionScript(LoraplexClient& client, std::string session)
      : client_(client), session_(std::move(session)) {}

  void Forward(const std::string& loss, const std::vector<v1::Datum>& data,
               bool forward_only = false) {
    auto result = client_.ForwardBackward(
        Call(session_, ++seq_, loss, data, forward_only));
    ASSERT_TRUE(result.ok()) << result.status();
    trace_.losses.push_back(result->forward_backward().loss());
    std::vector<double> joined;
    for (const v1::DatumOutput& output : result->forward_backward().outputs()) {
      joined.insert(joined.end(), output.logprobs().begin(),
                    output.logprobs().end());
    }
    trace_.logprobs.push_back(std::move(joined));
  }
  void Step(double lr, double clip) {
    v1::OptimStepRequest request = loraplex::Step(session_, ++seq_, lr);
    request.set_grad_clip_norm(clip);
    auto result = client_.OptimStep(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_FALSE(result->optim_step().skipped())
        << result->optim_step().skip_reason();
    trace_.grad_norms.push_back(result->optim_step().grad_norm());
    trace_.steps.push_back(result->optim_step().steps());
  }
  std::string SaveState() {
    v1::SaveStateRequest request;
    request.set_session(session_);
    request.set_seq_id(++seq_);
    auto result = client_.SaveState(request);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->saved_state().state() : "";
  }
  void LoadState(const std::string& state) {
    v1::LoadStateRequest request;
    request.set_session(session_);
    request.set_seq_id(++seq_);
    request.set_state(state);
    request.set_with_optimizer(true);
    auto result = client_.LoadState(request);
    ASSERT_TRUE(result.ok()) << result.status();
    trace_.steps.push_back(result->loaded_state().steps());
  }
  void SaveWeights(const std::string& model_dir) {
    v1::SaveWeightsForSamplerRequest request;
    request.set_session(session_);
    request.set_seq_id(++seq_);
    auto saved = client_.SaveWeightsForSampler(request);
    ASSERT_TRUE(saved.ok()) << saved.status();
    v1::ExportAdapterRequest export_request;
    export_request.set_adapter(saved->saved_weights().adapter());
    const std::string dir = FreshTestDir("saved");
    ASSERT_TRUE(client_.ExportAdapter(export_request, dir).ok());
    auto config = LoadModelConfig(model_dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto adapter = LoadPeftAdapter(dir, *config);
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    trace_.weights = AdapterTensors(*adapter);
  }

  SessionTrace& trace() { return trace_; }

 private:
  LoraplexClient& client_;
  std::string session_;
  int64_t seq_ = 0;
  SessionTrace trace_;
};

// The whole script, beside a job that trains meanwhile (its rows and the
// calls' share the ranks' turns).
SessionTrace RunScript(LoraplexClient& client, const std::string& state) {
  auto dataset = client.UploadDatasetContents(ReversalJsonl(24, 3), "d");
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  if (!dataset.ok()) return {};
  auto job = client.CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 12, 41));
  EXPECT_TRUE(job.ok()) << job.status();
  v1::CreateSessionRequest create =
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 0xfeedfacecafef00dull);
  create.mutable_lora()->set_dropout(0.1);  // Masks per row, on any rank.
  auto session = client.CreateSession(create);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  SessionScript script(client, session->name());
  // Three datums of different lengths: no world size divides the rows
  // evenly, and a one-datum call leaves ranks without rows.
  script.Forward("cross_entropy",
                 {TextDatum("a"), TextDatum("data parallel sessions"),
                  TextDatum("three")});
  script.Forward("importance_sampling", {RlDatum("one datum only", 0.7)});
  script.Forward("cross_entropy", {TextDatum("probe"), TextDatum("forward")},
                 /*forward_only=*/true);
  script.Step(1e-2, /*clip=*/0.05);  // Clipped: the summed gradient's norm.
  script.Forward(
      "ppo", {RlDatum("p", 1.0), RlDatum("pp", -0.5), RlDatum("ppo loss", 0.25),
              RlDatum("four", 2.0), RlDatum("and five", -1.5)});
  script.Step(2e-2, 0.0);
  script.Forward("cross_entropy", {TextDatum("probe"), TextDatum("forward")},
                 /*forward_only=*/true);
  const std::string saved = script.SaveState();
  script.Forward("cross_entropy", {TextDatum("moved on"), TextDatum("then")});
  script.Step(1e-2, 0.0);
  script.LoadState(saved);  // Back to the state after the second step.
  script.Forward("cross_entropy", {TextDatum("probe"), TextDatum("forward")},
                 /*forward_only=*/true);
  script.Forward("cross_entropy", {TextDatum("after the load")});
  script.Step(1e-2, 0.0);  // With the loaded optimizer state.
  script.SaveWeights(state + "/models/tiny");
  EXPECT_TRUE(client.CloseSession(session->name()).ok());
  if (job.ok()) {
    auto done = WaitForJob(client, job->name());
    EXPECT_TRUE(done.ok()) << done.status();
    if (done.ok()) EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED);
  }
  return script.trace();
}

// fp64 everywhere: rows regrouped over the ranks, logprobs and gradients
// summed, agree far below 1e-10.
void ExpectLikeOneProcess(const SessionTrace& got, const SessionTrace& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-10) << "call " << i;
    ASSERT_EQ(got.logprobs[i].size(), want.logprobs[i].size()) << "call " << i;
    for (size_t t = 0; t < want.logprobs[i].size(); ++t) {
      EXPECT_NEAR(got.logprobs[i][t], want.logprobs[i][t], 1e-10)
          << "call " << i << " token " << t;
    }
  }
  ASSERT_EQ(got.grad_norms.size(), want.grad_norms.size());
  for (size_t i = 0; i < want.grad_norms.size(); ++i) {
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i],
                1e-10 * std::max(1.0, want.grad_norms[i]))
        << "step " << i;
  }
  EXPECT_EQ(got.steps, want.steps);
  ExpectFp64Identity(got.weights, want.weights, "saved weights");
}

v1::ForwardBackwardRequest RoundCallFor(const std::string& session,
                                        int64_t seq_id) {
  return Call(session, seq_id, "cross_entropy",
              {TextDatum("still trains"), TextDatum("x")});
}

std::vector<std::string> SessionFlags() {
  return {"--threads=1", "--dtype=float64", "--checkpoint-interval=0"};
}

class ServiceDistSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string state = FreshTestDir("one-process");
    auto server = StartServer(state, 2, SessionFlags());
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    reference_ = new SessionTrace(RunScript(*client, state));
    EXPECT_TRUE(server->Stop().ok()) << server->Log();
    // The script's calls, steps and loads all answered.
    ASSERT_EQ(reference_->losses.size(), 8u);
    ASSERT_EQ(reference_->grad_norms.size(), 4u);
    // The probe after the load sees the weights of the second step again
    // (the third step had moved them).
    EXPECT_EQ(reference_->logprobs[6], reference_->logprobs[4]);
    EXPECT_NE(reference_->logprobs[6], reference_->logprobs[2]);
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }

  static SessionTrace* reference_;
};

SessionTrace* ServiceDistSessionTest::reference_ = nullptr;

TEST_F(ServiceDistSessionTest, SessionOnTwoAndThreeRanksIsOneProcess) {
  ASSERT_NE(reference_, nullptr);
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    const std::string state = FreshTestDir(absl::StrCat(world, "-ranks"));
    Ranks ranks = StartRanks(state, world, 2, SessionFlags());
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    ExpectLikeOneProcess(RunScript(*client, state), *reference_);
    EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
    for (auto& follower : ranks.followers) {
      EXPECT_EQ(follower->Wait(30), 0) << follower->Log();
    }
  }
}

TEST_F(ServiceDistSessionTest, SessionOnAShardedBaseIsOneProcess) {
  ASSERT_NE(reference_, nullptr);
  const std::string state = FreshTestDir("sharded");
  std::vector<std::string> flags = SessionFlags();
  flags.push_back("--shard-base");
  // Small micro-batches, so the ranks run different numbers of them.
  flags.push_back("--token-budget=24");
  Ranks ranks = StartRanks(state, 2, 2, flags);
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  ExpectLikeOneProcess(RunScript(*client, state), *reference_);
  EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

// A saved state whose adapter was changed on disk (another lora_alpha than
// its session_state.json says) loaded on two ranks: rank 0 refuses it
// before the plan (INVALID_ARGUMENT naming both configs), no rank loads it,
// and the session and the ranks go on.
TEST(ServiceDistSessionLoadTest, AStateThatDoesNotFitIsRefusedOnEveryRank) {
  const std::string state = FreshTestDir("misfit");
  Ranks ranks = StartRanks(state, 2, 2, SessionFlags());
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  auto session = client->CreateSession(
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 4));
  ASSERT_TRUE(session.ok()) << session.status();
  SessionScript script(*client, session->name());
  const std::string saved = script.SaveState();  // seq_id 1
  ASSERT_FALSE(saved.empty());
  const std::string config_path =
      absl::StrCat(state, "/", saved, "/adapter_config.json");
  nlohmann::json config = nlohmann::json::parse(ReadFileForTest(config_path));
  config["lora_alpha"] = config["lora_alpha"].get<double>() * 2;
  std::ofstream(config_path) << config.dump();
  v1::LoadStateRequest load;
  load.set_session(session->name());
  load.set_seq_id(2);
  load.set_state(saved);
  load.set_with_optimizer(true);
  auto loaded = client->LoadState(load);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument)
      << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("is not the session's"));
  auto fb = client->ForwardBackward(RoundCallFor(session->name(), 3));
  ASSERT_TRUE(fb.ok()) << fb.status();
  auto step = client->OptimStep(Step(session->name(), 4, 1e-2));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->optim_step().steps(), 1);
  EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

// The rounds of the restart test: forward_backward then optim_step.
constexpr int kRounds = 5;

v1::ForwardBackwardRequest RoundCall(const std::string& session, int64_t seq_id,
                                     int round) {
  return Call(session, seq_id, "cross_entropy",
              {TextDatum(absl::StrCat("round ", round)),
               TextDatum("ranks carry it on"), TextDatum("x")});
}

// The probe: a forward-only loss on fixed data (the weights' fingerprint).
double Probe(LoraplexClient& client, const std::string& session,
             int64_t seq_id) {
  auto result = client.ForwardBackward(
      Call(session, seq_id, "cross_entropy", {TextDatum("probe")}, true));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->forward_backward().loss() : -1.0;
}

// Rank 0 stopped with SIGTERM while a forward_backward's gradients wait
// for their step (every rank's part goes into the checkpoint), then killed
// with SIGKILL after an answered step: each time the restarted sharded
// ranks carry the session on, to the losses and weights of a run never
// interrupted.
TEST_F(ServiceDistSessionTest, ShardedRanksStoppedAndKilledCarryTheSessionOn) {
  std::vector<double> want;
  double want_probe = 0.0;
  {
    auto server = StartServer(FreshTestDir("uninterrupted"), 2, SessionFlags());
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto session = client->CreateSession(
        SessionRequest(v1::OPTIMIZER_FAMILY_MUON, 2e-2, 11));
    ASSERT_TRUE(session.ok()) << session.status();
    int64_t seq = 0;
    for (int round = 0; round < kRounds; ++round) {
      auto fb =
          client->ForwardBackward(RoundCall(session->name(), ++seq, round));
      ASSERT_TRUE(fb.ok()) << fb.status();
      want.push_back(fb->forward_backward().loss());
      ASSERT_TRUE(client->OptimStep(Step(session->name(), ++seq, 2e-2)).ok());
    }
    want_probe = Probe(*client, session->name(), ++seq);
    EXPECT_TRUE(server->Stop().ok()) << server->Log();
  }
  const std::string state = FreshTestDir("interrupted");
  std::vector<std::string> flags = SessionFlags();
  flags.push_back("--shard-base");
  std::string session;
  std::vector<double> got;
  {
    Ranks ranks = StartRanks(state, 2, 2, flags, /*timeout_seconds=*/20);
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    auto created = client->CreateSession(
        SessionRequest(v1::OPTIMIZER_FAMILY_MUON, 2e-2, 11));
    ASSERT_TRUE(created.ok()) << created.status();
    session = created->name();
    for (int round = 0; round < 2; ++round) {
      auto fb =
          client->ForwardBackward(RoundCall(session, 2 * round + 1, round));
      ASSERT_TRUE(fb.ok()) << fb.status();
      got.push_back(fb->forward_backward().loss());
      ASSERT_TRUE(client->OptimStep(Step(session, 2 * round + 2, 2e-2)).ok());
    }
    auto fb = client->ForwardBackward(RoundCall(session, 5, 2));
    ASSERT_TRUE(fb.ok()) << fb.status();
    got.push_back(fb->forward_backward().loss());
    EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
    EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
  }
  {
    Ranks ranks = StartRanks(state, 2, 2, flags, /*timeout_seconds=*/20);
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    auto info = client->GetSession(session);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->state(), v1::SESSION_STATE_OPEN);
    EXPECT_EQ(info->steps(), 2);
    EXPECT_EQ(info->next_seq_id(), 6);
    // The step uses round 2's gradients from before the stop.
    ASSERT_TRUE(client->OptimStep(Step(session, 6, 2e-2)).ok());
    auto fb = client->ForwardBackward(RoundCall(session, 7, 3));
    ASSERT_TRUE(fb.ok()) << fb.status();
    got.push_back(fb->forward_backward().loss());
    ASSERT_TRUE(client->OptimStep(Step(session, 8, 2e-2)).ok());
    ranks.server->Kill();
    EXPECT_NE(ranks.follower().Wait(60), 0) << ranks.follower().Log();
  }
  Ranks ranks = StartRanks(state, 2, 2, flags);
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  auto info = client->GetSession(session);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::SESSION_STATE_OPEN);
  EXPECT_EQ(info->steps(), 4);  // Every step the client was answered.
  auto fb = client->ForwardBackward(RoundCall(session, 9, 4));
  ASSERT_TRUE(fb.ok()) << fb.status();
  got.push_back(fb->forward_backward().loss());
  ASSERT_TRUE(client->OptimStep(Step(session, 10, 2e-2)).ok());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-10) << "round " << i;
  }
  EXPECT_NEAR(Probe(*client, session, 11), want_probe, 1e-10);
  EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

}  // namespace
}  // namespace loraplex
