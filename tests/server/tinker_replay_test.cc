// The Tinker SDK's requests, recorded, replayed against the real server:
// a protocol regression shows here even where PyPI (and so the SDK) is out
// of reach. tests/fixtures/tinker/sdk_trace.jsonl is what
// tests/tinker/sdk_supervised_test.py --trace wrote with tinker==0.38.0:
// every request the SDK sent in its supervised loop, sampling, restore and
// short RL loops (importance sampling with AdamW, PPO with Muon),
// with the server's answer.
//
// Ids the server makes up (sessions, futures) differ from run to run: the
// replay learns each recorded id's live value from the answers and puts it
// into the later requests (model ids, sampler ids and tinker:// paths are
// made of them). Polls that were answered "try_again" are not replayed;
// one that got the result is repeated until it gets it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "tests/common/free_port.h"
#include "tests/common/server_process.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tinker/tinker_public.pb.h"

namespace loraplex {
namespace {

struct Exchange {
  std::string method, path, content_type, accept, body;
  int status = 0;
  std::string response_type, response;
};

std::vector<Exchange> LoadTrace() {
  std::ifstream in(std::string(LORAPLEX_SOURCE_DIR) +
                   "/tests/fixtures/tinker/sdk_trace.jsonl");
  std::vector<Exchange> trace;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    Exchange e;
    e.method = record["method"];
    e.path = record["path"];
    e.content_type = record["content_type"];
    e.accept = record["accept"];
    EXPECT_TRUE(
        absl::Base64Unescape(record["body"].get<std::string>(), &e.body));
    e.status = record["status"];
    e.response_type = record["response_type"];
    EXPECT_TRUE(absl::Base64Unescape(record["response"].get<std::string>(),
                                     &e.response));
    trace.push_back(std::move(e));
  }
  return trace;
}

std::set<std::string> Keys(const nlohmann::json& object) {
  std::set<std::string> keys;
  if (object.is_object()) {
    for (const auto& item : object.items()) keys.insert(item.key());
  }
  return keys;
}

class Replay {
 public:
  explicit Replay(int port) : client_("127.0.0.1", port) {
    client_.set_read_timeout(60);
  }

  std::string Live(std::string text) const {
    for (const auto& [recorded, live] : ids_) {
      text = absl::StrReplaceAll(text, {{recorded, live}});
    }
    return text;
  }

  // Sends `e`'s request (its ids made live); the answer.
  httplib::Result Send(const Exchange& e) {
    std::string body = e.body;
    if (e.content_type == "application/x-protobuf") {
      tinker_public::ForwardBackwardRequest request;
      EXPECT_TRUE(request.ParseFromString(body));
      request.set_model_id(Live(request.model_id()));
      body = request.SerializeAsString();
    } else {
      body = Live(body);
    }
    httplib::Headers headers = {{"X-API-Key", "tml-replay"}};
    if (!e.accept.empty()) headers.emplace("Accept", e.accept);
    const std::string path = Live(e.path);
    if (e.method == "GET") return client_.Get(path.c_str(), headers);
    return client_.Post(
        path.c_str(), headers, body,
        e.content_type.empty() ? "application/json" : e.content_type.c_str());
  }

  // Learns the live values of the ids in a recorded JSON answer.
  void Learn(const nlohmann::json& recorded, const nlohmann::json& live) {
    for (const char* key : {"session_id", "request_id"}) {
      if (recorded.contains(key) && recorded[key].is_string()) {
        ASSERT_TRUE(live.contains(key)) << live.dump();
        ids_[recorded[key].get<std::string>()] = live[key].get<std::string>();
      }
    }
  }

 private:
  httplib::Client client_;
  std::map<std::string, std::string> ids_;
};

void ExpectSameForwardBackward(const std::string& recorded_bytes,
                               const std::string& live_bytes,
                               std::vector<double>& losses) {
  tinker_public::ForwardBackwardOutput recorded, live;
  ASSERT_TRUE(recorded.ParseFromString(recorded_bytes));
  ASSERT_TRUE(live.ParseFromString(live_bytes));
  EXPECT_EQ(live.loss_fn_output_type(), recorded.loss_fn_output_type());
  ASSERT_EQ(live.loss_fn_outputs_size(), recorded.loss_fn_outputs_size());
  for (int i = 0; i < live.loss_fn_outputs_size(); ++i) {
    const tinker_public::ArrayRecord& a = live.loss_fn_outputs(i);
    const tinker_public::ArrayRecord& b = recorded.loss_fn_outputs(i);
    EXPECT_EQ(a.num_datums(), b.num_datums());
    ASSERT_EQ(a.fields().size(), b.fields().size());
    for (const auto& [name, field] : b.fields()) {
      ASSERT_EQ(a.fields().count(name), 1u) << name;
      EXPECT_EQ(a.fields().at(name).offsets(), field.offsets()) << name;
      EXPECT_EQ(a.fields().at(name).dtype(), field.dtype()) << name;
    }
  }
  ASSERT_EQ(live.metrics().size(), recorded.metrics().size());
  for (const auto& [key, value] : recorded.metrics()) {
    ASSERT_EQ(live.metrics().count(key), 1u) << key;
  }
  if (losses.empty()) {
    // The first pass, before any step: the same weights, so the same loss
    // up to the rounding of another CPU.
    EXPECT_NEAR(live.metrics().at("loss:sum"),
                recorded.metrics().at("loss:sum"),
                1e-4 * recorded.metrics().at("loss:sum"));
  }
  losses.push_back(live.metrics().at("loss:sum"));
}

void ExpectSameSample(const std::string& recorded_bytes,
                      const std::string& live_bytes) {
  tinker_public::SampleResponse recorded, live;
  ASSERT_TRUE(recorded.ParseFromString(recorded_bytes));
  ASSERT_TRUE(live.ParseFromString(live_bytes));
  ASSERT_EQ(live.sequences_size(), recorded.sequences_size());
  for (int i = 0; i < live.sequences_size(); ++i) {
    EXPECT_EQ(live.sequences(i).stop_reason(),
              recorded.sequences(i).stop_reason());
    EXPECT_EQ(live.sequences(i).tokens().size(),
              recorded.sequences(i).tokens().size());
    EXPECT_EQ(live.sequences(i).logprobs().size(),
              recorded.sequences(i).logprobs().size());
  }
  EXPECT_EQ(live.prompt_logprobs().size(), recorded.prompt_logprobs().size());
}

TEST(TinkerReplayTest, TheRecordedSdkSessionReplaysAgainstTheServer) {
  const std::vector<Exchange> trace = LoadTrace();
  ASSERT_GT(trace.size(), 40u);
  const int port = FreePort();
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("state");
  options.model_dir = TinyModelDir();  // The recording's model, too.
  options.extra_args = {"--model-name",  "loraplex-tiny",
                        "--threads",     "1",
                        "--http-listen", absl::StrCat("127.0.0.1:", port)};
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();

  Replay replay(port);
  // Which call made each future (by its recorded id).
  std::map<std::string, std::string> future_origin;
  std::vector<double> losses;
  std::set<std::string> paths;
  int samples = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Exchange& e = trace[i];
    SCOPED_TRACE(absl::StrCat("exchange ", i, ": ", e.method, " ", e.path));
    const bool json_answer = e.response_type == "application/json";
    const nlohmann::json recorded =
        json_answer ? nlohmann::json::parse(e.response) : nlohmann::json();
    std::string recorded_future;
    if (e.path == "/api/v1/retrieve_future") {
      if (recorded.is_object() && recorded.value("type", "") == "try_again") {
        continue;
      }
      recorded_future = nlohmann::json::parse(e.body)["request_id"];
    }
    httplib::Result result = replay.Send(e);
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    // A poll may find the result not ready yet: ask again.
    for (int poll = 0; poll < 20 && !recorded_future.empty(); ++poll) {
      const bool again =
          result->status == 200 &&
          result->get_header_value("Content-Type") == "application/json" &&
          nlohmann::json::parse(result->body).value("type", "") == "try_again";
      if (!again) break;
      result = replay.Send(e);
      ASSERT_TRUE(result);
    }
    paths.insert(e.path);
    ASSERT_EQ(result->status, e.status) << result->body;
    ASSERT_EQ(result->get_header_value("Content-Type"), e.response_type)
        << result->body;
    if (json_answer) {
      const nlohmann::json live = nlohmann::json::parse(result->body);
      EXPECT_EQ(Keys(live), Keys(recorded)) << live.dump();
      replay.Learn(recorded, live);
      if (recorded.contains("request_id") && recorded_future.empty()) {
        future_origin[recorded["request_id"]] = e.path;
      }
      if (live.contains("error")) {
        EXPECT_EQ(live["error"], recorded["error"]);
      }
      continue;
    }
    ASSERT_FALSE(recorded_future.empty());
    const std::string& origin = future_origin[recorded_future];
    if (origin == "/api/v1/forward_backward") {
      ExpectSameForwardBackward(e.response, result->body, losses);
    } else if (origin == "/api/v1/asample") {
      ExpectSameSample(e.response, result->body);
      ++samples;
    } else {
      ADD_FAILURE() << "a protobuf answer to " << origin;
    }
  }
  // Every call of the loop was replayed, and the replay trained.
  for (const char* path :
       {"/api/v1/client/config", "/api/v1/create_session",
        "/api/v1/create_model", "/api/v1/get_info", "/api/v1/forward_backward",
        "/api/v1/optim_step", "/api/v1/save_weights",
        "/api/v1/save_weights_for_sampler", "/api/v1/load_weights",
        "/api/v1/create_sampling_session", "/api/v1/asample",
        "/api/v1/retrieve_future"}) {
    EXPECT_EQ(paths.count(path), 1u) << path;
  }
  ASSERT_GE(losses.size(), 8u);
  EXPECT_LT(losses[7], 0.5 * losses[0]);
  EXPECT_GE(samples, 3);
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

}  // namespace
}  // namespace loraplex
