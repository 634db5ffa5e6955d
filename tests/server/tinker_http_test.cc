// The Tinker HTTP API's edges through the real server: keys and tenants,
// bad bodies, and what one tenant may not see of another's. (The SDK's own
// use of it is tests/tinker/sdk_supervised_test.py and tinker_replay_test.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/common/free_port.h"
#include "tests/common/server_process.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceKey[] = "tml-alice-0123456789";
constexpr char kBobKey[] = "tml-bob-0123456789ab";

class TinkerHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string state = FreshTestDir("state");
    std::ofstream(state + "/tokens")
        << "alice " << kAliceKey << "\nbob " << kBobKey << "\n";
    port_ = FreePort();
    ServerProcessOptions options;
    options.state_dir = state;
    options.extra_args = {"--tokens-file", state + "/tokens",
                          "--threads",     "1",
                          "--http-listen", absl::StrCat("127.0.0.1:", port_)};
    auto server = ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60);
  }

  // POSTs `body` as `key`; the status and the parsed JSON answer.
  std::pair<int, nlohmann::json> Post(const std::string& path,
                                      const std::string& key,
                                      const std::string& body,
                                      const char* type = "application/json") {
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("X-API-Key", key);
    httplib::Result result = client_->Post(path.c_str(), headers, body, type);
    EXPECT_TRUE(result) << path;
    if (!result) return {0, nlohmann::json()};
    return {result->status, nlohmann::json::parse(result->body, nullptr,
                                                  /*allow_exceptions=*/false)};
  }

  // The future's answer, polled until it is not "try_again".
  nlohmann::json Result(const std::string& key, const std::string& request_id) {
    for (int i = 0; i < 10; ++i) {
      auto [status, answer] =
          Post("/api/v1/retrieve_future", key,
               nlohmann::json{{"request_id", request_id}}.dump());
      EXPECT_EQ(status, 200) << answer.dump();
      if (answer.value("type", "") != "try_again") return answer;
    }
    ADD_FAILURE() << "no result for " << request_id;
    return nlohmann::json();
  }

  std::string BaseModel() {
    httplib::Result caps = client_->Get("/api/v1/get_server_capabilities",
                                        {{"X-API-Key", kAliceKey}});
    EXPECT_TRUE(caps && caps->status == 200);
    return nlohmann::json::parse(
        caps->body)["supported_models"][0]["model_name"];
  }

  int port_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(TinkerHttpTest, KeysAreTheTokensFilesAndTenantsStayApart) {
  auto [no_key, no_key_answer] = Post("/api/v1/create_session", "", "{}");
  EXPECT_EQ(no_key, 401);
  EXPECT_THAT(no_key_answer["error"].get<std::string>(),
              HasSubstr("X-API-Key"));
  EXPECT_EQ(
      Post("/api/v1/create_session", "tml-unknown-key-000000", "{}").first,
      401);

  auto [created, session] = Post("/api/v1/create_session", kAliceKey, "{}");
  ASSERT_EQ(created, 200) << session.dump();
  const std::string session_id = session["session_id"];
  auto [model_status, future] = Post(
      "/api/v1/create_model", kAliceKey,
      nlohmann::json{{"session_id", session_id},
                     {"model_seq_id", 0},
                     {"base_model", BaseModel()},
                     {"lora_config", {{"rank", 2}, {"train_unembed", false}}}}
          .dump());
  ASSERT_EQ(model_status, 200) << future.dump();
  const nlohmann::json model = Result(kAliceKey, future["request_id"]);
  ASSERT_TRUE(model.contains("model_id")) << model.dump();
  const std::string model_id = model["model_id"];
  EXPECT_EQ(model_id, session_id + ":train:0");

  // Alice sees her model; bob sees neither it, nor her session, nor her
  // futures.
  const std::string info = nlohmann::json{{"model_id", model_id}}.dump();
  auto [alice_info, alice_answer] = Post("/api/v1/get_info", kAliceKey, info);
  EXPECT_EQ(alice_info, 200);
  EXPECT_EQ(alice_answer["lora_rank"], 2);
  EXPECT_EQ(Post("/api/v1/get_info", kBobKey, info).first, 404);
  EXPECT_EQ(Post("/api/v1/retrieve_future", kBobKey,
                 nlohmann::json{{"request_id", future["request_id"]}}.dump())
                .first,
            404);
  EXPECT_EQ(Post("/api/v1/session_heartbeat", kBobKey,
                 nlohmann::json{{"session_id", session_id}}.dump())
                .first,
            404);
  EXPECT_EQ(Post("/api/v1/optim_step", kBobKey,
                 nlohmann::json{{"model_id", model_id},
                                {"seq_id", 1},
                                {"adam_params", {{"learning_rate", 1e-3}}}}
                     .dump())
                .first,
            404);
  // A second model with the same model_seq_id is refused.
  auto [again, again_answer] =
      Post("/api/v1/create_model", kAliceKey,
           nlohmann::json{{"session_id", session_id},
                          {"model_seq_id", 0},
                          {"base_model", BaseModel()},
                          {"lora_config", {{"rank", 2}}}}
               .dump());
  EXPECT_EQ(again, 400);
  EXPECT_THAT(again_answer["error"].get<std::string>(),
              HasSubstr("already a model"));

  // Finishing the session closes its models and refuses it afterwards.
  EXPECT_EQ(Post(absl::StrCat("/api/v1/sessions/", session_id, "/finish"),
                 kAliceKey, R"({"reason":{"type":"success"}})")
                .first,
            200);
  EXPECT_EQ(Post("/api/v1/get_info", kAliceKey, info).first, 404);
  EXPECT_EQ(Post("/api/v1/session_heartbeat", kAliceKey,
                 nlohmann::json{{"session_id", session_id}}.dump())
                .first,
            404);
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

TEST_F(TinkerHttpTest, BadBodiesAreClearErrors) {
  auto [created, session] = Post("/api/v1/create_session", kAliceKey, "{}");
  ASSERT_EQ(created, 200);
  const std::string session_id = session["session_id"];
  struct Case {
    const char* path;
    std::string body;
    const char* type;
    int status;
    const char* message;
  };
  const Case cases[] = {
      {"/api/v1/create_session", "not json", "application/json", 400,
       "request body"},
      {"/api/v1/create_model",
       nlohmann::json{
           {"session_id", session_id}, {"model_seq_id", 0}, {"base_model", 7}}
           .dump(),
       "application/json", 400, "wrong type"},
      {"/api/v1/create_model",
       nlohmann::json{{"session_id", session_id},
                      {"model_seq_id", 0},
                      {"base_model", "some/other-model"}}
           .dump(),
       "application/json", 400, "base_model"},
      {"/api/v1/create_model",
       nlohmann::json{{"session_id", session_id},
                      {"model_seq_id", 0},
                      {"base_model", BaseModel()},
                      {"lora_config", {{"rank", "eight"}}}}
           .dump(),
       "application/json", 400, "lora_config.rank"},
      {"/api/v1/create_model",
       nlohmann::json{{"session_id", "tinker-nope"},
                      {"model_seq_id", 0},
                      {"base_model", BaseModel()},
                      {"lora_config", {{"rank", 2}}}}
           .dump(),
       "application/json", 404, "no session"},
      {"/api/v1/forward_backward", R"({"model_id":"x","seq_id":1})",
       "application/json", 400, "protobuf"},
      {"/api/v1/forward_backward", "\xff\xff\xff", "application/x-protobuf",
       400, "tinker_public.ForwardBackwardRequest"},
      {"/api/v1/retrieve_future", R"({"request_id":"req-none"})",
       "application/json", 404, "no request"},
      {"/api/v1/asample",
       nlohmann::json{{"sampling_session_id", "none"}, {"num_samples", 1}}
           .dump(),
       "application/json", 404, "no sampler"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.path, " ", c.body));
    auto [status, answer] = Post(c.path, kAliceKey, c.body, c.type);
    EXPECT_EQ(status, c.status) << answer.dump();
    ASSERT_TRUE(answer.contains("error")) << answer.dump();
    EXPECT_THAT(answer["error"].get<std::string>(), HasSubstr(c.message));
  }
  // The server is unharmed.
  EXPECT_EQ(Post("/api/v1/create_session", kAliceKey, "{}").first, 200);
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

TEST_F(TinkerHttpTest, MetricsNeedAKey) {
  EXPECT_EQ(client_->Get("/metrics")->status, 401);
  httplib::Result bearer = client_->Get(
      "/metrics", {{"Authorization", absl::StrCat("Bearer ", kBobKey)}});
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200);
  EXPECT_THAT(bearer->body, HasSubstr("loraplex_slots{state=\"free\"} 4"));
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

}  // namespace
}  // namespace loraplex
