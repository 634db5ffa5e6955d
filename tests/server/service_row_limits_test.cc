// Rows longer than the server's activation memory holds, even with its
// activation checkpointing (--activation-memory-mb, --activation-
// checkpointing), are refused where they enter, with the limit in the
// message: CreateJob's training rows (packed or not), and a session's
// forward_backward over gRPC and over the Tinker HTTP API. A row that fits
// is never refused and trains; forward-only work is not bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/model_config.h"
#include "core/train/token_budget.h"
#include "nlohmann/json.hpp"
#include "tests/common/free_port.h"
#include "tests/server/service_fixture.h"
#include "tests/server/tinker_requests.h"
#include "tinker/tinker_public.pb.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "tml-alice-0123456789";
// --activation-memory-mb: small enough that the tiny model's longest
// trainable row is far below its 2048 positions.
constexpr int64_t kActivationMiB = 1;

// The longest row a server with --activation-memory-mb=kActivationMiB
// and `mode` trains for the model in `model_dir` (the built-in tiny
// model computes in its checkpoint's fp32: 4 bytes an element).
int64_t RowLimit(const std::string& model_dir, CheckpointMode mode) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return 0;
  CheckpointPolicy policy;
  policy.mode = mode;
  policy.activation_bytes = kActivationMiB << 20;
  policy.element_bytes = 4;
  return MaxRowTokens(policy, *config);
}

// One {"text"} line of `bytes` bytes: BOS, the bytes and EOS make
// bytes + 2 tokens.
std::string TextLine(int64_t bytes, char c = 'z') {
  return absl::StrCat("{\"text\": \"", std::string(bytes, c), "\"}\n");
}

// A cross_entropy datum of `tokens` input tokens (bytes), each position
// predicting the next byte.
v1::Datum DatumOf(int64_t tokens) {
  v1::Datum datum;
  for (int64_t i = 0; i < tokens; ++i) {
    datum.add_input_ids('a' + i % 26);
    datum.add_target_tokens('a' + (i + 1) % 26);
    datum.add_weights(1.0f);
  }
  return datum;
}

v1::ForwardBackwardRequest ForwardBackwardOf(const std::string& session,
                                             int64_t seq_id, int64_t tokens,
                                             bool forward_only = false) {
  v1::ForwardBackwardRequest request;
  request.set_session(session);
  request.set_seq_id(seq_id);
  request.set_loss_fn("cross_entropy");
  request.set_forward_only(forward_only);
  *request.add_data() = DatumOf(tokens);
  return request;
}

// The refusal CreateJob answers for a training row of `longest` tokens.
std::string JobRowRefusal(int64_t longest, int64_t seq_len, int64_t limit,
                          bool packed) {
  return absl::StrCat("training_dataset: its longest ", packed ? "packed " : "",
                      "row has ", longest, " tokens (training.seq_len ",
                      seq_len, "); a row this server trains may have at most ",
                      limit,
                      " (its activation memory holds no more, with the "
                      "server's activation checkpointing): set "
                      "training.seq_len to at most ",
                      limit);
}

// The refusal forward_backward answers for data[0] of `tokens` tokens.
std::string DatumRowRefusal(int64_t tokens, int64_t limit) {
  return absl::StrCat("data[0].model_input has ", tokens,
                      " tokens; a row this server trains may have at most ",
                      limit,
                      " (its activation memory holds no more, with the "
                      "server's activation checkpointing)");
}

v1::CreateJobRequest ShortJob(const std::string& dataset, int64_t seq_len) {
  v1::CreateJobRequest request =
      JobRequest(dataset, v1::OPTIMIZER_FAMILY_ADAMW, 4, /*steps=*/2, 1);
  request.mutable_schedule()->set_warmup_steps(0);
  request.mutable_training()->set_batch_size(1);
  request.mutable_training()->set_seq_len(seq_len);
  return request;
}

class ServiceRowLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = FreshTestDir("state");
    std::ofstream(state_ + "/tokens") << "alice " << kAliceToken << "\n";
    http_port_ = FreePort();
    ASSERT_GT(http_port_, 0);
    server_ =
        StartServer(state_, 2,
                    {"--tokens-file", state_ + "/tokens",
                     "--activation-memory-mb", absl::StrCat(kActivationMiB),
                     "--http-listen", absl::StrCat("127.0.0.1:", http_port_)});
    ASSERT_NE(server_, nullptr);
    alice_ = ClientFor(*server_, kAliceToken);
    limit_ = RowLimit(state_ + "/models/tiny", CheckpointMode::kAuto);
    // Far below the model's 2048 positions, so that the activation memory
    // and not the positions bounds the rows below.
    ASSERT_GT(limit_, 16);
    ASSERT_LT(limit_ * 2, 2048);
    EXPECT_THAT(server_->Log(),
                HasSubstr(absl::StrCat("activation checkpointing: auto; "
                                       "activation memory 1 MiB per "
                                       "micro-batch (--activation-memory-mb): "
                                       "rows of up to ",
                                       limit_, " tokens train")));
  }

  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(alice_->GetServerInfo().ok());
      EXPECT_TRUE(server_->Stop().ok()) << server_->Log();
    }
  }

  std::string Upload(const std::string& jsonl) {
    auto dataset = alice_->UploadDatasetContents(jsonl, "d");
    EXPECT_TRUE(dataset.ok()) << dataset.status();
    return dataset.ok() ? dataset->name() : "";
  }

  std::string OpenSession() {
    v1::CreateSessionRequest request;
    request.mutable_lora()->set_rank(4);
    request.mutable_lora()->set_alpha(8);
    request.mutable_optimizer()->set_family(v1::OPTIMIZER_FAMILY_ADAMW);
    request.mutable_optimizer()->set_lr(1e-3);
    request.set_seed(3);
    auto session = alice_->CreateSession(request);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? session->name() : "";
  }

  std::string state_;
  int http_port_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<LoraplexClient> alice_;
  int64_t limit_ = 0;  // The server's longest trainable row.
};

// A row longer than the limit is refused at CreateJob with its length and
// the limit, and nothing is stored; at seq_len == limit the same example
// (truncated to the limit) is accepted and the job trains to its end.
TEST_F(ServiceRowLimitsTest, CreateJobRefusesRowsPastTheLimitOnly) {
  const std::string dataset = Upload(TextLine(limit_ + 64));
  const int64_t seq_len = limit_ + 32;
  const absl::Status refused =
      alice_->CreateJob(ShortJob(dataset, seq_len)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(JobRowRefusal(seq_len, seq_len, limit_, false)));
  auto jobs = alice_->ListAllJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());

  auto trained = TrainToSuccess(*alice_, ShortJob(dataset, limit_), *server_);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->metrics().step(), 2);
}

// With pack, short examples that each fit make a packed row past the
// limit: refused, naming the packed row. Unpacked, the same examples train.
TEST_F(ServiceRowLimitsTest, CreateJobRefusesPackedRowsPastTheLimit) {
  constexpr int64_t kExampleTokens = 20;
  // A multiple of the example's tokens past the limit: the first packed
  // row holds exactly seq_len tokens.
  const int64_t seq_len = kExampleTokens * (limit_ / kExampleTokens + 2);
  std::string jsonl;
  for (int64_t i = 0; i <= seq_len / kExampleTokens; ++i) {
    jsonl += TextLine(kExampleTokens - 2, static_cast<char>('a' + i % 26));
  }
  const std::string dataset = Upload(jsonl);
  v1::CreateJobRequest packed = ShortJob(dataset, seq_len);
  packed.mutable_training()->set_pack(true);
  const absl::Status refused = alice_->CreateJob(packed).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(JobRowRefusal(seq_len, seq_len, limit_, true)));
  auto jobs = alice_->ListAllJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());

  v1::CreateJobRequest unpacked = ShortJob(dataset, seq_len);
  unpacked.mutable_training()->set_max_steps(1);
  auto trained = TrainToSuccess(*alice_, unpacked, *server_);
  ASSERT_TRUE(trained.ok()) << trained.status();
}

// A session's forward_backward of limit + 1 tokens is refused naming the
// datum and the limit (and takes no seq_id); limit tokens train; a forward
// alone of limit + 1 tokens keeps no activations and is answered.
TEST_F(ServiceRowLimitsTest, SessionForwardBackwardRefusesRowsPastTheLimit) {
  const std::string session = OpenSession();
  ASSERT_FALSE(session.empty());
  const absl::Status refused =
      alice_->ForwardBackward(ForwardBackwardOf(session, 1, limit_ + 1))
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(DatumRowRefusal(limit_ + 1, limit_)));
  EXPECT_EQ(alice_->GetSession(session)->next_seq_id(), 1);

  auto fits = alice_->ForwardBackward(ForwardBackwardOf(session, 1, limit_));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->forward_backward().outputs(0).logprobs_size(), limit_);
  EXPECT_EQ(fits->forward_backward().tokens(), limit_);

  auto forward = alice_->ForwardBackward(
      ForwardBackwardOf(session, 2, limit_ + 1, /*forward_only=*/true));
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ(forward->forward_backward().outputs(0).logprobs_size(), limit_ + 1);
}

// The Tinker API's forward_backward goes through the same check: HTTP 400
// with the same message, at once (no future); a row that fits is accepted.
TEST_F(ServiceRowLimitsTest, TinkerForwardBackwardRefusesRowsPastTheLimit) {
  httplib::Client http("127.0.0.1", http_port_);
  http.set_read_timeout(60);
  const httplib::Headers key = {{"X-API-Key", kAliceToken}};
  auto post_json = [&](const std::string& path, const nlohmann::json& body) {
    httplib::Result result =
        http.Post(path.c_str(), key, body.dump(), "application/json");
    EXPECT_TRUE(result) << path;
    return result;
  };
  // The answer of `request_id`, polled past "try_again".
  auto future = [&](const std::string& request_id) {
    auto try_again = [](const httplib::Result& result) {
      return result && result->status == 200 &&
             result->get_header_value("Content-Type") == "application/json" &&
             nlohmann::json::parse(result->body).value("type", "") ==
                 "try_again";
    };
    httplib::Result result =
        post_json("/api/v1/retrieve_future", {{"request_id", request_id}});
    for (int i = 0; i < 20 && try_again(result); ++i) {
      result =
          post_json("/api/v1/retrieve_future", {{"request_id", request_id}});
    }
    EXPECT_FALSE(try_again(result)) << "no answer for " << request_id;
    return result;
  };

  httplib::Result session =
      post_json("/api/v1/create_session", nlohmann::json::object());
  ASSERT_TRUE(session && session->status == 200)
      << (session ? session->body : "no answer");
  httplib::Result caps = http.Get("/api/v1/get_server_capabilities", key);
  ASSERT_TRUE(caps && caps->status == 200);
  const nlohmann::json create_model = {
      {"session_id", nlohmann::json::parse(session->body)["session_id"]},
      {"model_seq_id", 0},
      {"base_model",
       nlohmann::json::parse(caps->body)["supported_models"][0]["model_name"]},
      {"lora_config", {{"rank", 2}, {"seed", 3}}}};
  httplib::Result created = post_json("/api/v1/create_model", create_model);
  ASSERT_TRUE(created && created->status == 200);
  httplib::Result model =
      future(nlohmann::json::parse(created->body)["request_id"]);
  ASSERT_TRUE(model && model->status == 200);
  const nlohmann::json model_answer = nlohmann::json::parse(model->body);
  ASSERT_TRUE(model_answer.contains("model_id")) << model->body;
  const std::string model_id = model_answer["model_id"];

  auto forward_backward = [&](int64_t seq_id, int64_t tokens) {
    std::vector<int32_t> input;
    std::vector<int64_t> targets;
    for (int64_t i = 0; i < tokens; ++i) {
      input.push_back(static_cast<int32_t>('a' + i % 26));
      targets.push_back('a' + (i + 1) % 26);
    }
    const tinker_public::ForwardBackwardRequest request =
        TinkerCrossEntropyRequest(model_id, seq_id, input, targets);
    httplib::Result result =
        http.Post("/api/v1/forward_backward", key, request.SerializeAsString(),
                  "application/x-protobuf");
    EXPECT_TRUE(result);
    return result;
  };

  httplib::Result refused = forward_backward(1, limit_ + 1);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const nlohmann::json error =
      nlohmann::json::parse(refused->body, nullptr, false);
  ASSERT_TRUE(error.contains("error")) << refused->body;
  EXPECT_THAT(error["error"].get<std::string>(),
              HasSubstr(DatumRowRefusal(limit_ + 1, limit_)));

  httplib::Result accepted = forward_backward(1, limit_);
  ASSERT_TRUE(accepted && accepted->status == 200) << accepted->body;
  httplib::Result done =
      future(nlohmann::json::parse(accepted->body)["request_id"]);
  ASSERT_TRUE(done && done->status == 200);
  tinker_public::ForwardBackwardOutput output;
  ASSERT_TRUE(output.ParseFromString(done->body)) << done->body;
  EXPECT_GT(output.metrics().at("loss:sum"), 0.0);
}

// Without checkpointing every layer keeps its activations: the limit is
// the smaller unchecked one, and a row between the two limits is refused
// there but trains on the server that checkpoints (auto).
TEST_F(ServiceRowLimitsTest, WithoutCheckpointingTheLimitIsSmaller) {
  const std::string off_state = FreshTestDir("off");
  auto off =
      StartServer(off_state, 1,
                  {"--activation-memory-mb", absl::StrCat(kActivationMiB),
                   "--activation-checkpointing", "off"});
  ASSERT_NE(off, nullptr);
  const int64_t off_limit =
      RowLimit(off_state + "/models/tiny", CheckpointMode::kOff);
  ASSERT_GT(off_limit, 16);
  ASSERT_LT(off_limit + 8, limit_);
  EXPECT_THAT(off->Log(), HasSubstr(absl::StrCat("rows of up to ", off_limit,
                                                 " tokens train")));
  auto off_client = ClientFor(*off);
  const int64_t seq_len = (off_limit + limit_) / 2;
  const std::string jsonl = TextLine(limit_ + 64);

  auto off_dataset = off_client->UploadDatasetContents(jsonl, "d");
  ASSERT_TRUE(off_dataset.ok()) << off_dataset.status();
  const absl::Status refused =
      off_client->CreateJob(ShortJob(off_dataset->name(), seq_len)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(JobRowRefusal(seq_len, seq_len, off_limit, false)));
  EXPECT_TRUE(off_client->ListAllJobs()->empty());
  EXPECT_TRUE(off->Stop().ok()) << off->Log();

  v1::CreateJobRequest fits = ShortJob(Upload(jsonl), seq_len);
  fits.mutable_training()->set_max_steps(1);
  auto trained = TrainToSuccess(*alice_, fits, *server_);
  ASSERT_TRUE(trained.ok()) << trained.status();
}

TEST(ServiceRowLimitsFlagsTest, BadActivationCheckpointingIsRefused) {
  const std::string state = FreshTestDir("state");
  const std::string command =
      std::string(LORAPLEX_BIN_DIR) +
      "/loraplex-server --listen 127.0.0.1:0 --threads 1 --state-dir " + state +
      " --activation-checkpointing every:0 > " + state + "/out 2> " + state +
      "/err";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string log = ReadFileForTest(state + "/out") +
                          ReadFileForTest(state + "/err") +
                          ReadFileForTest(state + "/server.log");
  EXPECT_THAT(log, HasSubstr("activation checkpointing must be off, auto, all "
                             "or every:K with K >= 1, got \"every:0\""));
}

}  // namespace
}  // namespace loraplex
