// Training sessions through a restart of the real server: after SIGTERM a
// session carries on exactly where it was, the gradients accumulated since
// its last step included; after SIGKILL at random points it carries on
// from its newest checkpoint, which holds every optimizer step the client
// was answered, and no operation is applied twice. Each run is compared
// bit for bit with one that was never interrupted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/service_fixture.h"
#include "tests/server/session_requests.h"

namespace loraplex {
namespace {

constexpr int kRounds = 6;  // forward_backward + optim_step each.

// Round r's call: seq_ids 2r+1 (forward_backward) and 2r+2 (optim_step)
// in an uninterrupted run.
v1::ForwardBackwardRequest RoundData(const std::string& session, int64_t seq_id,
                                     int round) {
  v1::ForwardBackwardRequest request;
  request.set_session(session);
  request.set_seq_id(seq_id);
  request.set_loss_fn("cross_entropy");
  *request.add_data() = TextDatum(absl::StrCat("round ", round, ": abc"));
  *request.add_data() = TextDatum("a restart loses nothing");
  return request;
}

// The weights' fingerprint: a forward-only loss on fixed data.
double Probe(LoraplexClient& client, const std::string& session,
             int64_t seq_id) {
  v1::ForwardBackwardRequest request = CrossEntropy(session, seq_id);
  request.set_forward_only(true);
  auto result = client.ForwardBackward(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->forward_backward().loss() : -1.0;
}

struct SessionRun {
  std::vector<double> losses;  // Per round, from the first one run.
  double probe = 0.0;
};

// Runs rounds [first, kRounds) from seq_id `seq`, then the probe.
SessionRun Continue(LoraplexClient& client, const std::string& session,
                    int first, int64_t seq) {
  SessionRun run;
  for (int round = first; round < kRounds; ++round) {
    auto fb = client.ForwardBackward(RoundData(session, seq++, round));
    EXPECT_TRUE(fb.ok()) << fb.status();
    run.losses.push_back(fb.ok() ? fb->forward_backward().loss() : -1.0);
    auto step = client.OptimStep(Step(session, seq++, 1e-2));
    EXPECT_TRUE(step.ok()) << step.status();
  }
  run.probe = Probe(client, session, seq);
  return run;
}

std::string OpenSession(LoraplexClient& client) {
  auto session =
      client.CreateSession(SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, 5));
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? session->name() : "";
}

class ServiceSessionRestartTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = FreshTestDir("reference");
    auto server = StartServer(dir, 2);
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    const std::string session = OpenSession(*client);
    reference_ = new SessionRun(Continue(*client, session, 0, 1));
    EXPECT_TRUE(server->Stop().ok()) << server->Log();
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }

  // The reference's losses from round `first` on.
  static std::vector<double> ReferenceFrom(int first) {
    return std::vector<double>(reference_->losses.begin() + first,
                               reference_->losses.end());
  }

  static SessionRun* reference_;
};

SessionRun* ServiceSessionRestartTest::reference_ = nullptr;

TEST_F(ServiceSessionRestartTest,
       ASessionCarriesOnAfterSigtermWithItsGradients) {
  ASSERT_NE(reference_, nullptr);
  const std::string dir = FreshTestDir("sigterm");
  std::string session;
  {
    auto server = StartServer(dir, 2);
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    session = OpenSession(*client);
    int64_t seq = 1;
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(
          client->ForwardBackward(RoundData(session, seq++, round)).ok());
      ASSERT_TRUE(client->OptimStep(Step(session, seq++, 1e-2)).ok());
    }
    // Round 3's gradients are accumulated, not yet stepped on.
    auto fb = client->ForwardBackward(RoundData(session, seq++, 3));
    ASSERT_TRUE(fb.ok()) << fb.status();
    EXPECT_EQ(fb->forward_backward().loss(), reference_->losses[3]);
    ASSERT_TRUE(server->Stop().ok()) << server->Log();
  }
  auto server = StartServer(dir, 2);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto info = client->GetSession(session);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::SESSION_STATE_OPEN);
  EXPECT_EQ(info->steps(), 3);
  EXPECT_EQ(info->next_seq_id(), 8);
  // The step uses the gradients from before the restart.
  ASSERT_TRUE(client->OptimStep(Step(session, 8, 1e-2)).ok());
  const SessionRun rest = Continue(*client, session, 4, 9);
  EXPECT_EQ(rest.losses, ReferenceFrom(4));
  EXPECT_EQ(rest.probe, reference_->probe);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// Kill points: LORAPLEX_KILL_POINTS (default 3), each after a random round,
// right after its optim_step or right after the next forward_backward
// (whose gradients the crash then loses: the client sends it again with
// the next seq_id).
TEST_F(ServiceSessionRestartTest, AKilledSessionCarriesOnFromItsCheckpoint) {
  ASSERT_NE(reference_, nullptr);
  const char* env = std::getenv("LORAPLEX_KILL_POINTS");
  const int points = env != nullptr ? std::atoi(env) : 3;
  std::mt19937 rng(std::random_device{}());
  for (int point = 0; point < points; ++point) {
    const int rounds = 1 + static_cast<int>(rng() % (kRounds - 2));
    const bool after_forward = rng() % 2 == 1;
    SCOPED_TRACE(absl::StrCat("killed after ", rounds, " rounds",
                              after_forward ? " and a forward_backward" : ""));
    const std::string dir = FreshTestDir(absl::StrCat("sigkill-", point));
    std::string session;
    int64_t last_seq = 0;
    {
      auto server = StartServer(dir, 2);
      ASSERT_NE(server, nullptr);
      auto client = ClientFor(*server);
      session = OpenSession(*client);
      for (int round = 0; round < rounds; ++round) {
        ASSERT_TRUE(
            client->ForwardBackward(RoundData(session, ++last_seq, round))
                .ok());
        ASSERT_TRUE(client->OptimStep(Step(session, ++last_seq, 1e-2)).ok());
      }
      if (after_forward) {
        ASSERT_TRUE(
            client->ForwardBackward(RoundData(session, ++last_seq, rounds))
                .ok());
      }
      server->Kill();
    }
    auto server = StartServer(dir, 2);
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto info = client->GetSession(session);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->state(), v1::SESSION_STATE_OPEN);
    // Every step the client was answered, and the seq_ids it used.
    EXPECT_EQ(info->steps(), rounds);
    EXPECT_EQ(info->next_seq_id(), last_seq + 1);
    // The last operation again: not applied a second time.
    if (after_forward) {
      auto again =
          client->ForwardBackward(RoundData(session, last_seq, rounds));
      EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
          << again.status();
    } else {
      auto again = client->OptimStep(Step(session, last_seq, 1e-2));
      EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
          << again.status();
    }
    auto unchanged = client->GetSession(session);
    ASSERT_TRUE(unchanged.ok()) << unchanged.status();
    EXPECT_EQ(unchanged->steps(), rounds);
    const SessionRun rest = Continue(*client, session, rounds, last_seq + 1);
    EXPECT_EQ(rest.losses, ReferenceFrom(rounds));
    EXPECT_EQ(rest.probe, reference_->probe);
    EXPECT_TRUE(server->Stop().ok()) << server->Log();
  }
}

// A closed session is not opened again by a restart, and says why it
// closed.
TEST_F(ServiceSessionRestartTest, AClosedSessionStaysClosed) {
  const std::string dir = FreshTestDir("closed");
  std::string session;
  {
    auto server = StartServer(dir, 2);
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    session = OpenSession(*client);
    ASSERT_TRUE(client->ForwardBackward(RoundData(session, 1, 0)).ok());
    ASSERT_TRUE(client->CloseSession(session).ok());
    server->Kill();
  }
  auto server = StartServer(dir, 2);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto info = client->GetSession(session);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::SESSION_STATE_CLOSED);
  auto refused = client->ForwardBackward(RoundData(session, 2, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  // Its slot is free: two new sessions open in the two slots.
  EXPECT_FALSE(OpenSession(*client).empty());
  EXPECT_FALSE(OpenSession(*client).empty());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
