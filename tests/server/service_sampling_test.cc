// Sample and StreamSample through the real server and client: greedy tokens
// and stop strings equal transformers' on a committed fixture model with a
// tokenizer.json, streamed tokens equal the final answer, sampling from a
// finished job, its stored adapter and its checkpoint gives the same
// tokens, a running job answers with its current step, seeded samples are
// the same alone and beside other requests, and bad requests get clear
// errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/sample/batch_generator.h"
#include "tests/common/golden_files.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

std::vector<int64_t> TokensOf(const v1::Sample& sample) {
  return std::vector<int64_t>(sample.tokens().begin(), sample.tokens().end());
}

v1::SampleRequest TokenRequest(const std::vector<int64_t>& prompt,
                               int64_t max_tokens) {
  v1::SampleRequest request;
  for (int64_t id : prompt) request.mutable_tokens()->add_ids(id);
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  return request;
}

TEST(ServiceSamplingTest, GreedyAndStopStringsEqualTransformers) {
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("sampling_state");
  options.model_dir = GoldenPath("sampling/stop_strings");
  options.slots = 1;
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ClientFor(**server);
  const nlohmann::json golden = nlohmann::json::parse(
      ReadGoldenText(GoldenPath("sampling/stop_strings.json")));
  const auto prompt = golden["prompt"].get<std::vector<int64_t>>();
  const auto continuation = golden["continuation"].get<std::vector<int64_t>>();
  const std::string text = golden["text"];

  // The text prompt is tokenized as transformers does (no BOS here).
  v1::SampleRequest by_text;
  by_text.set_text(golden["prompt_text"].get<std::string>());
  by_text.set_max_tokens(static_cast<int64_t>(continuation.size()));
  by_text.set_temperature(0);
  by_text.set_ignore_eos(true);  // transformers ran without an EOS.
  auto response = client->Sample(by_text);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(std::vector<int64_t>(response->prompt_tokens().begin(),
                                 response->prompt_tokens().end()),
            prompt);
  ASSERT_EQ(response->samples_size(), 1);
  EXPECT_EQ(TokensOf(response->samples(0)), continuation);
  EXPECT_EQ(response->samples(0).text(), text);
  EXPECT_EQ(response->samples(0).stop_reason(), v1::STOP_REASON_LENGTH);
  EXPECT_EQ(response->samples(0).logprobs_size(),
            static_cast<int>(continuation.size()));

  for (const auto& stop_case : golden["cases"]) {
    v1::SampleRequest request = TokenRequest(prompt, continuation.size());
    request.set_ignore_eos(true);
    for (const auto& stop : stop_case["stop"]) {
      request.add_stop(stop.get<std::string>());
    }
    const size_t expected = stop_case["tokens"];
    std::vector<int64_t> streamed;
    std::string streamed_text;
    auto streamed_response =
        client->StreamSample(request, [&](const v1::SampledToken& token) {
          EXPECT_EQ(token.sample(), 0);
          streamed.push_back(token.token());
          streamed_text += token.text();
          return true;
        });
    ASSERT_TRUE(streamed_response.ok()) << streamed_response.status();
    const v1::Sample& sample = streamed_response->samples(0);
    const std::string what = stop_case["stop"].dump();
    EXPECT_EQ(TokensOf(sample),
              std::vector<int64_t>(continuation.begin(),
                                   continuation.begin() + expected))
        << what;
    EXPECT_EQ(streamed, TokensOf(sample)) << what;
    // The stream never shows text the stop string later takes back.
    EXPECT_EQ(sample.text().compare(0, streamed_text.size(), streamed_text), 0)
        << what << ": streamed \"" << streamed_text << "\", final \""
        << sample.text() << "\"";
    if (expected < continuation.size()) {
      EXPECT_EQ(sample.stop_reason(), v1::STOP_REASON_STOP_STRING) << what;
      EXPECT_LT(sample.text().size(), text.size()) << what;
      EXPECT_EQ(text.compare(0, sample.text().size(), sample.text()), 0);
    }
  }

  // A client that stops reading cancels its sample; the server goes on.
  int seen = 0;
  v1::SampleRequest long_request = TokenRequest(prompt, 100);
  long_request.set_ignore_eos(true);
  auto cancelled = client->StreamSample(
      long_request, [&](const v1::SampledToken&) { return ++seen < 2; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  auto after = client->Sample(TokenRequest(prompt, 3));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->samples(0).tokens_size(), 3);

  // Bad requests name the field.
  v1::SampleRequest too_many = TokenRequest(prompt, 4);
  too_many.set_n(17);
  auto refused = client->Sample(too_many);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("n must be in [1, 16]"),
            std::string::npos)
      << refused.status();
  v1::SampleRequest bad_id = TokenRequest({5, 100000}, 4);
  refused = client->Sample(bad_id);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tokens.ids[1]"), std::string::npos)
      << refused.status();
  v1::SampleRequest too_long = TokenRequest(prompt, 4000);
  refused = client->Sample(too_long);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("the model's 128 positions"),
            std::string::npos)
      << refused.status();
  v1::SampleRequest no_prompt;
  refused = client->Sample(no_prompt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("prompt is required"),
            std::string::npos);
  v1::SampleRequest chat;
  chat.mutable_messages()->add_messages()->set_content("hi");
  refused = client->Sample(chat);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.status();
  v1::SampleRequest missing = TokenRequest(prompt, 4);
  missing.set_adapter("adapters/nope");
  refused = client->Sample(missing);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound)
      << refused.status();
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

TEST(ServiceSamplingTest, JobAdapterAndCheckpointWeightsAgree) {
  const std::string state = FreshTestDir("sampling_jobs");
  auto server = StartServer(state, 2);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(64, 5), "words");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  v1::CreateJobRequest request = JobRequest(
      dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, /*rank=*/4, /*steps=*/20,
      /*seed=*/3);
  request.mutable_optimizer()->set_lr(3e-2);
  request.mutable_training()->set_checkpoint_interval(10);
  auto job = client->CreateJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = WaitForJob(*client, job->name());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED) << done->DebugString();

  const std::vector<int64_t> prompt = {257, 104, 101, 108, 108, 111, 61};
  v1::SampleRequest base = TokenRequest(prompt, 12);
  base.set_ignore_eos(true);
  v1::SampleRequest from_job = base;
  from_job.set_job(job->name());
  v1::SampleRequest from_adapter = base;
  from_adapter.set_adapter(done->adapter());
  auto checkpoints = client->ListCheckpoints(job->name());
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_GT(checkpoints->checkpoints_size(), 0);
  const v1::Checkpoint& last =
      checkpoints->checkpoints(checkpoints->checkpoints_size() - 1);
  ASSERT_GE(last.step(), 10);
  v1::SampleRequest from_checkpoint = base;
  from_checkpoint.set_checkpoint(last.name());

  auto base_response = client->Sample(base);
  auto job_response = client->Sample(from_job);
  auto adapter_response = client->Sample(from_adapter);
  auto checkpoint_response = client->Sample(from_checkpoint);
  ASSERT_TRUE(base_response.ok()) << base_response.status();
  ASSERT_TRUE(job_response.ok()) << job_response.status();
  ASSERT_TRUE(adapter_response.ok()) << adapter_response.status();
  ASSERT_TRUE(checkpoint_response.ok()) << checkpoint_response.status();
  EXPECT_EQ(checkpoint_response->weights_step(), last.step());
  const v1::Sample& trained = adapter_response->samples(0);
  EXPECT_EQ(TokensOf(job_response->samples(0)), TokensOf(trained));
  for (int t = 0; t < trained.logprobs_size(); ++t) {
    EXPECT_EQ(job_response->samples(0).logprobs(t), trained.logprobs(t));
  }
  // The adapter changed the model.
  EXPECT_NE(base_response->samples(0).logprobs(0), trained.logprobs(0));
  // The checkpoint's weights, sampled in process by the engine from its
  // exported PEFT files over the server's base model, give the same answer.
  const std::string exported = FreshTestDir("checkpoint_adapter");
  v1::ExportAdapterRequest export_request;
  export_request.set_checkpoint(last.name());
  ASSERT_TRUE(client->ExportAdapter(export_request, exported).ok());
  auto model = LlamaModel::Load(state + "/models/tiny", {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto adapter = LoadPeftAdapter(exported, (*model)->config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  LoraWeights weights((*model)->config(), torch::kCPU);
  ASSERT_TRUE(weights.Bind(adapter->config).ok());
  ASSERT_TRUE(CopyPeftAdapter(*adapter, weights).ok());
  SampleRequest engine_request;
  engine_request.prompt = prompt;
  engine_request.adapter = &weights;
  engine_request.params.temperature = 0;
  engine_request.params.max_tokens = 12;
  auto engine = BatchGenerator::Generate(**model, {engine_request}, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const GeneratedSample& expected = (*engine)[0].samples[0];
  EXPECT_EQ(TokensOf(checkpoint_response->samples(0)), expected.tokens);
  for (size_t t = 0; t < expected.logprobs.size(); ++t) {
    EXPECT_NEAR(checkpoint_response->samples(0).logprobs(t),
                expected.logprobs[t], 1e-5);
  }

  // A running job is sampled at a step boundary it has reached.
  v1::CreateJobRequest long_request = request;
  long_request.mutable_training()->set_max_steps(100000);
  long_request.mutable_training()->set_checkpoint_interval(0);
  auto running = client->CreateJob(long_request);
  ASSERT_TRUE(running.ok()) << running.status();
  auto stepped = WaitUntil(*client, running->name(), [](const v1::Job& j) {
    return j.status() == v1::JOB_STATUS_RUNNING && j.metrics().step() >= 2;
  });
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  v1::SampleRequest from_running = base;
  from_running.set_job(running->name());
  auto running_response = client->Sample(from_running);
  ASSERT_TRUE(running_response.ok()) << running_response.status();
  EXPECT_GE(running_response->weights_step(), 2);
  EXPECT_EQ(running_response->samples(0).tokens_size(), 12);

  // Seeded samples: the same alone and beside other requests.
  v1::SampleRequest seeded = from_adapter;
  seeded.set_temperature(1.0);
  seeded.set_seed(77);
  seeded.set_n(3);
  auto alone = client->Sample(seeded);
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::vector<absl::StatusOr<v1::SampleResponse>> together(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::SampleRequest r = i % 2 == 0 ? seeded : from_running;
      if (i == 3) r.set_seed(5);
      together[i] = client->Sample(r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i : {0, 2}) {
    ASSERT_TRUE(together[i].ok()) << together[i].status();
    ASSERT_EQ(together[i]->samples_size(), 3);
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(TokensOf(together[i]->samples(s)), TokensOf(alone->samples(s)))
          << i << " " << s;
    }
  }
  EXPECT_TRUE(together[1].ok()) << together[1].status();
  EXPECT_TRUE(together[3].ok()) << together[3].status();
  EXPECT_TRUE(client->CancelJob(running->name()).ok());

  // A job another tenant cannot see is not found.
  v1::SampleRequest unknown_job = base;
  unknown_job.set_job("jobs/nope");
  EXPECT_EQ(client->Sample(unknown_job).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
