// The Tinker HTTP API's edges through the real server: keys and tenants,
// bad bodies, and what one tenant may not see of another's. (The SDK's own
// use of it is tests/tinker/sdk_supervised_test.py and tinker_replay_test.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "nlohmann/json.hpp"
#include "tests/common/free_port.h"
#include "tests/common/server_process.h"
#include "tests/common/test_dir.h"
#include "tests/common/tls_files.h"
#include "tests/server/tinker_requests.h"
#include "tinker/tinker_public.pb.h"

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
    state_ = state;
    StartOn(state);
  }

  // Starts the server on `state` (a new port), and a client of it.
  void StartOn(const std::string& state) {
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

  // The protobuf answer of a forward_backward future, polled like Result.
  tinker_public::ForwardBackwardOutput ProtoResult(
      const std::string& key, const std::string& request_id) {
    tinker_public::ForwardBackwardOutput out;
    for (int i = 0; i < 10; ++i) {
      httplib::Result result =
          client_->Post("/api/v1/retrieve_future", {{"X-API-Key", key}},
                        nlohmann::json{{"request_id", request_id}}.dump(),
                        "application/json");
      EXPECT_TRUE(result && result->status == 200);
      if (!result) break;
      if (result->get_header_value("Content-Type") == "application/json") {
        const nlohmann::json answer = nlohmann::json::parse(result->body);
        if (answer.value("type", "") == "try_again") continue;
        ADD_FAILURE() << answer.dump();
        break;
      }
      EXPECT_TRUE(out.ParseFromString(result->body));
      break;
    }
    return out;
  }

  // A model of `session`; its id, or empty with the failure in `error`.
  std::string CreateModel(httplib::Client& client, const std::string& session,
                          int model_seq_id, std::string* error = nullptr) {
    const nlohmann::json body = {{"session_id", session},
                                 {"model_seq_id", model_seq_id},
                                 {"base_model", BaseModel()},
                                 {"lora_config", {{"rank", 2}, {"seed", 3}}}};
    httplib::Result posted =
        client.Post("/api/v1/create_model", {{"X-API-Key", kAliceKey}},
                    body.dump(), "application/json");
    EXPECT_TRUE(posted && posted->status == 200);
    if (!posted) return "";
    const std::string request_id =
        nlohmann::json::parse(posted->body)["request_id"];
    for (int i = 0; i < 10; ++i) {
      httplib::Result result =
          client.Post("/api/v1/retrieve_future", {{"X-API-Key", kAliceKey}},
                      nlohmann::json{{"request_id", request_id}}.dump(),
                      "application/json");
      EXPECT_TRUE(result && result->status == 200);
      if (!result) return "";
      const nlohmann::json answer = nlohmann::json::parse(result->body);
      if (answer.value("type", "") == "try_again") continue;
      if (answer.contains("model_id")) return answer["model_id"];
      if (error != nullptr) *error = answer.value("error", answer.dump());
      return "";
    }
    return "";
  }

  // Next-token prediction over a fixed text on `model` (seq_id `seq`);
  // forward_only: the loss, no gradients. Returns the request id.
  std::string ForwardBackward(const std::string& model, int seq,
                              bool forward_only) {
    const std::vector<int32_t> input = {5, 17, 33, 9, 41, 12};
    const std::vector<int64_t> targets = {17, 33, 9, 41, 12, 7};
    const tinker_public::ForwardBackwardRequest request =
        TinkerCrossEntropyRequest(model, seq, input, targets, forward_only);
    auto [status, answer] =
        Post("/api/v1/forward_backward", kAliceKey, request.SerializeAsString(),
             "application/x-protobuf");
    EXPECT_EQ(status, 200) << answer.dump();
    return answer.value("request_id", "");
  }

  // One training step on `model`: a forward_backward and an optim_step,
  // seq_ids `seq` and `seq` + 1 (`seq` moves past them).
  void TrainStep(const std::string& model, int& seq) {
    ProtoResult(kAliceKey, ForwardBackward(model, seq++, false));
    auto [status, future] =
        Post("/api/v1/optim_step", kAliceKey,
             nlohmann::json{{"model_id", model},
                            {"seq_id", seq++},
                            {"adam_params", {{"learning_rate", 5e-2}}}}
                 .dump());
    ASSERT_EQ(status, 200) << future.dump();
    EXPECT_FALSE(Result(kAliceKey, future["request_id"]).contains("error"));
  }

  double Loss(const std::string& model, int seq) {
    return ProtoResult(kAliceKey, ForwardBackward(model, seq, true))
        .metrics()
        .at("loss:sum");
  }

  std::string BaseModel() {
    httplib::Result caps = client_->Get("/api/v1/get_server_capabilities",
                                        {{"X-API-Key", kAliceKey}});
    EXPECT_TRUE(caps && caps->status == 200);
    return nlohmann::json::parse(
        caps->body)["supported_models"][0]["model_name"];
  }

  std::string state_;
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

// Saved states are not overwritten unless asked; load_weights into an open
// model takes the saved weights; unload_model frees the slot; models
// created at once share the free slots and the rest are refused.
TEST_F(TinkerHttpTest, ModelsSaveLoadUnloadAndShareTheSlots) {
  auto [created, session] = Post("/api/v1/create_session", kAliceKey, "{}");
  ASSERT_EQ(created, 200);
  const std::string session_id = session["session_id"];
  const std::string a = CreateModel(*client_, session_id, 0);
  ASSERT_FALSE(a.empty());
  int seq = 1;
  for (int step = 0; step < 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(TrainStep(a, seq));
  }

  const nlohmann::json save = {{"model_id", a}, {"path", "s1"}};
  auto save_as = [&](nlohmann::json body) {
    body["seq_id"] = seq;
    return Post("/api/v1/save_weights", kAliceKey, body.dump());
  };
  auto [saved_status, saved] = save_as(save);
  ASSERT_EQ(saved_status, 200) << saved.dump();
  ++seq;
  const nlohmann::json first = Result(kAliceKey, saved["request_id"]);
  const std::string path = first.value("path", "");
  EXPECT_EQ(path, absl::StrCat("tinker://", a, "/weights/s1"));
  auto [again, again_answer] = save_as(save);
  EXPECT_EQ(again, 400);
  EXPECT_THAT(again_answer.value("error", ""),
              HasSubstr("exists; set overwrite to replace it"));
  nlohmann::json overwrite = save;
  overwrite["overwrite"] = true;
  auto [replaced, replaced_answer] = save_as(overwrite);
  ASSERT_EQ(replaced, 200) << replaced_answer.dump();
  ++seq;
  EXPECT_EQ(Result(kAliceKey, replaced_answer["request_id"]).value("path", ""),
            path);
  const double trained = Loss(a, seq++);

  // A fresh model has other weights; loaded, the saved ones.
  const std::string b = CreateModel(*client_, session_id, 1);
  ASSERT_FALSE(b.empty());
  const double fresh = Loss(b, 1);
  EXPECT_GT(std::abs(fresh - trained), 1e-3 * std::abs(trained));
  auto [loaded, load_answer] = Post(
      "/api/v1/load_weights", kAliceKey,
      nlohmann::json{{"model_id", b}, {"seq_id", 2}, {"path", path}}.dump());
  ASSERT_EQ(loaded, 200) << load_answer.dump();
  EXPECT_EQ(Result(kAliceKey, load_answer["request_id"]).value("path", ""),
            path);
  EXPECT_EQ(Loss(b, 3), trained);

  // Unloaded, the model is gone and its slot free.
  auto [unloaded, unload_answer] = Post("/api/v1/unload_model", kAliceKey,
                                        nlohmann::json{{"model_id", b}}.dump());
  ASSERT_EQ(unloaded, 200) << unload_answer.dump();
  EXPECT_EQ(
      Result(kAliceKey, unload_answer["request_id"]).value("model_id", ""), b);
  EXPECT_EQ(Post("/api/v1/get_info", kAliceKey,
                 nlohmann::json{{"model_id", b}}.dump())
                .first,
            404);

  // Four models at once with three slots free: three open, one is refused.
  std::vector<std::string> models(4), errors(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port_);
      client.set_read_timeout(60);
      models[i] = CreateModel(client, session_id, 2 + i, &errors[i]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  int opened = 0;
  for (int i = 0; i < 4; ++i) {
    if (!models[i].empty()) {
      ++opened;
      EXPECT_EQ(models[i], absl::StrCat(session_id, ":train:", 2 + i));
    } else {
      EXPECT_THAT(errors[i], HasSubstr("slot")) << i;
    }
  }
  EXPECT_EQ(opened, 3);
  EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
}

// A client retrying through a crash (SIGKILL) carries on: its session,
// model, sampler and tinker:// paths resolve, the futures that had
// finished answer as before, and the model has its trained weights.
TEST_F(TinkerHttpTest, NamesFuturesAndModelsSurviveAKill) {
  auto [created, session] = Post("/api/v1/create_session", kAliceKey, "{}");
  ASSERT_EQ(created, 200);
  const std::string session_id = session["session_id"];
  const std::string a = CreateModel(*client_, session_id, 0);
  ASSERT_FALSE(a.empty());
  int seq = 1;
  ASSERT_NO_FATAL_FAILURE(TrainStep(a, seq));
  auto [saved, save] =
      Post("/api/v1/save_weights", kAliceKey,
           nlohmann::json{{"model_id", a}, {"seq_id", seq++}, {"path", "s1"}}
               .dump());
  ASSERT_EQ(saved, 200) << save.dump();
  const std::string save_request = save["request_id"];
  const nlohmann::json save_answer = Result(kAliceKey, save_request);
  const std::string path = save_answer.value("path", "");
  ASSERT_FALSE(path.empty()) << save_answer.dump();
  auto [for_sampler, sampler_save] =
      Post("/api/v1/save_weights_for_sampler", kAliceKey,
           nlohmann::json{{"model_id", a}, {"seq_id", seq++}, {"path", "w1"}}
               .dump());
  ASSERT_EQ(for_sampler, 200) << sampler_save.dump();
  const std::string sampler_path =
      Result(kAliceKey, sampler_save["request_id"]).value("path", "");
  ASSERT_FALSE(sampler_path.empty());
  auto [sampling, sampler] = Post("/api/v1/create_sampling_session", kAliceKey,
                                  nlohmann::json{{"session_id", session_id},
                                                 {"sampling_session_seq_id", 0},
                                                 {"model_path", sampler_path}}
                                      .dump());
  ASSERT_EQ(sampling, 200) << sampler.dump();
  const std::string sampler_id = sampler["sampling_session_id"];
  const double trained = Loss(a, seq++);

  server_->Kill();
  StartOn(state_);
  // The finished future answers as it did.
  EXPECT_EQ(Result(kAliceKey, save_request), save_answer);
  // Bob's key does not reach Alice's results.
  EXPECT_EQ(Post("/api/v1/retrieve_future", kBobKey,
                 nlohmann::json{{"request_id", save_request}}.dump())
                .first,
            404);
  EXPECT_EQ(Post("/api/v1/session_heartbeat", kAliceKey,
                 nlohmann::json{{"session_id", session_id}}.dump())
                .first,
            200);
  EXPECT_EQ(Post("/api/v1/get_info", kAliceKey,
                 nlohmann::json{{"model_id", a}}.dump())
                .first,
            200);
  httplib::Result got = client_->Get(("/api/v1/samplers/" + sampler_id).c_str(),
                                     {{"X-API-Key", kAliceKey}});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200) << got->body;
  // The model continues with its weights and its next seq_id.
  EXPECT_EQ(Loss(a, seq++), trained);
  // The saved state's path loads into a new model.
  const std::string b = CreateModel(*client_, session_id, 1);
  ASSERT_FALSE(b.empty());
  auto [loaded, load] = Post(
      "/api/v1/load_weights", kAliceKey,
      nlohmann::json{{"model_id", b}, {"seq_id", 1}, {"path", path}}.dump());
  ASSERT_EQ(loaded, 200) << load.dump();
  EXPECT_EQ(Result(kAliceKey, load["request_id"]).value("path", ""), path);
  EXPECT_EQ(Loss(b, 2), trained);
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

// Futures and back-pressure with short limits: retrieve_future answers
// try_again when its result is not ready in --tinker-poll-seconds, more
// samples in flight than --tinker-max-samples are refused with 429, and a
// poll open at shutdown is answered (the server is shutting down).
TEST(TinkerFuturesTest, PollsTryAgainSamplesBackOffAndShutdownAnswers) {
  const int port = FreePort();
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("state");
  options.extra_args = {
      "--http-listen",         absl::StrCat("127.0.0.1:", port),
      "--tinker-poll-seconds", "3",
      "--tinker-max-samples",  "1"};
  auto started = ServerProcess::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<ServerProcess> server = *std::move(started);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  auto post = [&](httplib::Client& via, const std::string& path,
                  const nlohmann::json& body) {
    httplib::Result result =
        via.Post(path.c_str(), {{"X-API-Key", "tml-local"}}, body.dump(),
                 "application/json");
    return result ? std::make_pair(
                        result->status,
                        nlohmann::json::parse(result->body, nullptr, false))
                  : std::make_pair(0, nlohmann::json());
  };
  httplib::Result caps = client.Get("/api/v1/get_server_capabilities");
  ASSERT_TRUE(caps);
  const std::string base =
      nlohmann::json::parse(caps->body)["supported_models"][0]["model_name"];
  const std::string session =
      post(client, "/api/v1/create_session", nlohmann::json::object())
          .second["session_id"];
  auto [model_status, model_future] = post(client, "/api/v1/create_model",
                                           {{"session_id", session},
                                            {"model_seq_id", 0},
                                            {"base_model", base},
                                            {"lora_config", {{"rank", 2}}}});
  ASSERT_EQ(model_status, 200);
  std::string model_id;
  for (int i = 0; i < 10 && model_id.empty(); ++i) {
    model_id = post(client, "/api/v1/retrieve_future",
                    {{"request_id", model_future["request_id"]}})
                   .second.value("model_id", "");
  }
  ASSERT_FALSE(model_id.empty());

  // seq_id 2 waits for a seq_id 1 that never comes.
  auto [step_status, waiting] =
      post(client, "/api/v1/optim_step",
           {{"model_id", model_id},
            {"seq_id", 2},
            {"adam_params", {{"learning_rate", 1e-3}}}});
  ASSERT_EQ(step_status, 200) << waiting.dump();
  const nlohmann::json poll = {{"request_id", waiting["request_id"]}};
  auto [poll_status, again] = post(client, "/api/v1/retrieve_future", poll);
  EXPECT_EQ(poll_status, 200);
  EXPECT_EQ(again.value("type", ""), "try_again") << again.dump();

  // One sample in flight at a time: a burst of long ones meets 429.
  const std::string sampler = post(client, "/api/v1/create_sampling_session",
                                   {{"session_id", session},
                                    {"sampling_session_seq_id", 0},
                                    {"base_model", base}})
                                  .second.value("sampling_session_id", "");
  ASSERT_FALSE(sampler.empty());
  int accepted = 0, refused = 0;
  for (int i = 0; i < 4; ++i) {
    auto [status, answer] = post(
        client, "/api/v1/asample",
        {{"sampling_session_id", sampler},
         {"num_samples", 4},
         {"prompt",
          {{"chunks", {{{"type", "encoded_text"}, {"tokens", {5, 17, 33}}}}}}},
         {"sampling_params",
          {{"max_tokens", 1500}, {"stop", nlohmann::json::array()}}}});
    if (status == 200) ++accepted;
    if (status == 429) {
      ++refused;
      EXPECT_THAT(answer.value("error", ""),
                  HasSubstr("samples queued or running"));
    }
  }
  EXPECT_GE(accepted, 1);
  EXPECT_GE(refused, 1);

  // Polling the waiting step while the server stops.
  std::string last;
  absl::Notification polling_started;
  std::thread poller([&] {
    httplib::Client polling("127.0.0.1", port);
    polling.set_read_timeout(60);
    polling_started.Notify();
    for (;;) {
      auto [status, answer] = post(polling, "/api/v1/retrieve_future", poll);
      last = absl::StrCat(status, " ", answer.dump());
      if (status != 200 || answer.value("type", "") != "try_again") break;
    }
  });
  // A poll waits up to 3 s (--tinker-poll-seconds): 1.5 s after the
  // poller starts, in the middle of that wait, its poll is waiting at the
  // server even when a loaded machine was slow to send it.
  polling_started.WaitForNotification();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
  poller.join();
  EXPECT_THAT(last, HasSubstr("shutting down"));
}

// With --tls-cert/--tls-key the HTTP listener speaks HTTPS with the same
// certificate as gRPC; plain HTTP gets no answer.
TEST(TinkerHttpsTest, TheListenerServesTlsWithTheServersCertificate) {
  const std::string state = FreshTestDir("state");
  const absl::Status certificate = MakeLoopbackCertificate(state);
  ASSERT_TRUE(certificate.ok()) << certificate;
  const int port = FreePort();
  ServerProcessOptions options;
  options.state_dir = state;
  options.extra_args = {"--tls-cert",    state + "/cert.pem",
                        "--tls-key",     state + "/key.pem",
                        "--http-listen", absl::StrCat("127.0.0.1:", port)};
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();

  httplib::SSLClient tls("127.0.0.1", port);
  tls.set_ca_cert_path((state + "/cert.pem").c_str());
  tls.enable_server_certificate_verification(true);
  httplib::Result caps = tls.Get("/api/v1/get_server_capabilities");
  ASSERT_TRUE(caps) << httplib::to_string(caps.error());
  EXPECT_EQ(caps->status, 200);
  EXPECT_THAT(caps->body, HasSubstr("supported_models"));

  // A client that does not trust the certificate is refused, and so is
  // plain HTTP.
  httplib::SSLClient untrusting("127.0.0.1", port);
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_ca_cert_path((state + "/key.pem").c_str());
  EXPECT_FALSE(untrusting.Get("/api/v1/get_server_capabilities"));
  httplib::Client plain("127.0.0.1", port);
  plain.set_read_timeout(5);
  httplib::Result refused = plain.Get("/api/v1/get_server_capabilities");
  EXPECT_TRUE(!refused || refused->status != 200);
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

}  // namespace
}  // namespace loraplex
