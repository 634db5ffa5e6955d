// The Tinker API's bodies to and from loraplex's requests: each field as
// the tinker==0.38.0 SDK writes or reads it (proto/response_conv.py,
// request_conv.py and types/ of the SDK).
#include "server/tinker/tinker_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "server/grpc/sampling_service.h"
#include "server/sessions/session_requests.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

tinker_public::Tensor Dense(tinker_public::DType dtype, std::string bytes,
                            std::vector<int64_t> shape) {
  tinker_public::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.set_dense(std::move(bytes));
  for (int64_t dim : shape) tensor.add_shape(dim);
  return tensor;
}

// What the SDK sends for next-token prediction over `tokens`, the input in
// two chunks.
tinker_public::ForwardBackwardRequest CrossEntropyRequest() {
  tinker_public::ForwardBackwardRequest request;
  request.set_model_id("s:train:0");
  request.set_seq_id(3);
  request.set_loss_fn("cross_entropy");
  tinker_public::Datum* datum = request.add_data();
  datum->add_model_input()->mutable_encoded_text()->set_tokens(
      Bytes(std::vector<int32_t>{5, 17}));
  datum->add_model_input()->mutable_encoded_text()->set_tokens(
      Bytes(std::vector<int32_t>{33}));
  (*datum->mutable_loss_fn_inputs())["target_tokens"] = Dense(
      tinker_public::DTYPE_INT64, Bytes(std::vector<int64_t>{17, 33, 9}), {3});
  (*datum->mutable_loss_fn_inputs())["weights"] =
      Dense(tinker_public::DTYPE_FLOAT32,
            Bytes(std::vector<float>{1.0f, 0.5f, -2.0f}), {3});
  return request;
}

TEST(TinkerConvertTest, ForwardBackwardBodyBecomesTheNativeRequest) {
  absl::StatusOr<ForwardBackwardInput> native =
      TinkerForwardBackwardInput(CrossEntropyRequest());
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ(native->loss_fn, "cross_entropy");
  EXPECT_FALSE(native->forward_only);
  ASSERT_EQ(native->data.size(), 1u);
  const Datum& datum = native->data[0];
  EXPECT_THAT(datum.input_ids, ElementsAre(5, 17, 33));
  EXPECT_THAT(datum.target_tokens, ElementsAre(17, 33, 9));
  EXPECT_EQ(datum.targets_per_position, 1);
  // Negative weights pass: custom losses on the client send -dC/dlogp.
  EXPECT_THAT(datum.weights, ElementsAre(1.0f, 0.5f, -2.0f));
  EXPECT_THAT(TargetsPerPosition(native->data), ElementsAre(1));
}

// Values reach the native datum as float32, as through the gRPC API.
TEST(TinkerConvertTest, DatumValuesAreFloat32) {
  tinker_public::ForwardBackwardRequest request = CrossEntropyRequest();
  (*request.mutable_data(0)->mutable_loss_fn_inputs())["weights"] =
      Dense(tinker_public::DTYPE_INT64,
            Bytes(std::vector<int64_t>{16777217, 1, 2}), {3});
  absl::StatusOr<ForwardBackwardInput> native =
      TinkerForwardBackwardInput(request);
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_THAT(native->data[0].weights, ElementsAre(16777216.0, 1.0, 2.0));
}

// Everything a datum holds, to compare two conversions.
std::vector<std::vector<double>> DatumValues(const Datum& datum) {
  return {std::vector<double>(datum.input_ids.begin(), datum.input_ids.end()),
          std::vector<double>(datum.target_tokens.begin(),
                              datum.target_tokens.end()),
          {static_cast<double>(datum.targets_per_position)},
          datum.weights,
          datum.sampler_logprobs,
          datum.advantages};
}

// The cookbook (0.6.1) sends provenance spans with every RL datum; no loss
// served here reads them, so the datum converts as it would without.
TEST(TinkerConvertTest, ProvenanceSpansAreAcceptedAndChangeNothing) {
  tinker_public::ForwardBackwardRequest request = CrossEntropyRequest();
  request.set_loss_fn("importance_sampling");
  tinker_public::Datum* datum = request.mutable_data(0);
  datum->mutable_loss_fn_inputs()->erase("weights");
  for (const char* name : {"logprobs", "advantages"}) {
    (*datum->mutable_loss_fn_inputs())[name] =
        Dense(tinker_public::DTYPE_FLOAT32,
              Bytes(std::vector<float>{0.0f, -1.5f, -0.25f}), {3});
  }
  absl::StatusOr<ForwardBackwardInput> plain =
      TinkerForwardBackwardInput(request);
  ASSERT_TRUE(plain.ok()) << plain.status();

  tinker_public::PromptProvenanceSpan* prompt =
      datum->add_model_input_spans()->mutable_prompt_tokens();
  prompt->set_sequence_id("seq-1");
  prompt->set_length(2);
  tinker_public::SampledProvenanceSpan* sampled =
      datum->add_model_input_spans()->mutable_sampled_tokens();
  sampled->set_sequence_id("seq-1");
  sampled->set_length(1);
  *datum->add_loss_fn_input_spans() = datum->model_input_spans(0);
  *datum->add_loss_fn_input_spans() = datum->model_input_spans(1);
  absl::StatusOr<ForwardBackwardInput> with_spans =
      TinkerForwardBackwardInput(request);
  ASSERT_TRUE(with_spans.ok()) << with_spans.status();
  EXPECT_EQ(with_spans->loss_fn, plain->loss_fn);
  EXPECT_EQ(with_spans->loss_fn_config, plain->loss_fn_config);
  EXPECT_EQ(with_spans->forward_only, plain->forward_only);
  ASSERT_EQ(with_spans->data.size(), plain->data.size());
  EXPECT_EQ(DatumValues(with_spans->data[0]), DatumValues(plain->data[0]));
  EXPECT_THAT(with_spans->data[0].advantages, ElementsAre(0.0f, -1.5f, -0.25f));
}

TEST(TinkerConvertTest, TheV2LossConfigWinsAndTextIsRefused) {
  tinker_public::ForwardBackwardRequest request = CrossEntropyRequest();
  request.set_loss_fn("ppo");
  (*request.mutable_loss_fn_config())["clip_low_threshold"] = 0.5;
  (*request.mutable_loss_fn_config())["clip_high_threshold"] = 1.5;
  (*request.mutable_loss_fn_config_v2())["clip_low_threshold"].set_number(0.7);
  absl::StatusOr<ForwardBackwardInput> native =
      TinkerForwardBackwardInput(request);
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_DOUBLE_EQ(native->loss_fn_config.at("clip_low_threshold"), 0.7);
  EXPECT_DOUBLE_EQ(native->loss_fn_config.at("clip_high_threshold"), 1.5);

  (*request.mutable_loss_fn_config_v2())["mode"].set_text("fast");
  absl::Status refused = TinkerForwardBackwardInput(request).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("loss_fn_config.mode"));
}

TEST(TinkerConvertTest, SparseTopKTargetsAreExpanded) {
  // [N=2, K=3] weights as CSR: row 0 has (0, 0.75) and (2, 0.25), row 1
  // has (1, 1.0).
  tinker_public::ForwardBackwardRequest request = CrossEntropyRequest();
  tinker_public::Datum* datum = request.mutable_data(0);
  datum->mutable_model_input()->RemoveLast();
  (*datum->mutable_loss_fn_inputs())["target_tokens"] =
      Dense(tinker_public::DTYPE_INT64,
            Bytes(std::vector<int64_t>{17, 18, 19, 33, 34, 35}), {2, 3});
  tinker_public::Tensor& weights =
      (*datum->mutable_loss_fn_inputs())["weights"];
  weights.Clear();
  weights.set_dtype(tinker_public::DTYPE_FLOAT32);
  weights.add_shape(2);
  weights.add_shape(3);
  weights.mutable_sparse_csr()->set_values(
      Bytes(std::vector<float>{0.75f, 0.25f, 1.0f}));
  weights.mutable_sparse_csr()->set_crow_indices(
      Bytes(std::vector<int64_t>{0, 2, 3}));
  weights.mutable_sparse_csr()->set_col_indices(
      Bytes(std::vector<int64_t>{0, 2, 1}));
  absl::StatusOr<ForwardBackwardInput> native =
      TinkerForwardBackwardInput(request);
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ(native->data[0].targets_per_position, 3);
  EXPECT_THAT(native->data[0].weights,
              ElementsAre(0.75f, 0.0f, 0.25f, 0.0f, 1.0f, 0.0f));
  EXPECT_THAT(TargetsPerPosition(native->data), ElementsAre(3));

  weights.mutable_sparse_csr()->set_col_indices(
      Bytes(std::vector<int64_t>{0, 3, 1}));
  absl::Status refused = TinkerForwardBackwardInput(request).status();
  EXPECT_THAT(refused.message(),
              HasSubstr("data[0].loss_fn_inputs.weights: column index 3"));
}

TEST(TinkerConvertTest, MalformedDatumsNameTheirField) {
  struct Case {
    const char* what;
    void (*spoil)(tinker_public::Datum*);
    const char* message;
  };
  const Case cases[] = {
      {"an image chunk",
       [](tinker_public::Datum* d) {
         d->mutable_model_input(1)->mutable_image()->set_data("png");
       },
       "data[0].model_input[1]: only encoded_text"},
      {"tokens not a multiple of 4 bytes",
       [](tinker_public::Datum* d) {
         d->mutable_model_input(0)->mutable_encoded_text()->set_tokens("abcde");
       },
       "data[0].model_input[0] has 5 bytes"},
      {"a shape that does not match the values",
       [](tinker_public::Datum* d) {
         (*d->mutable_loss_fn_inputs())["weights"].set_shape(0, 4);
       },
       "data[0].loss_fn_inputs.weights has 3 values; its shape says 4"},
      {"three dimensions",
       [](tinker_public::Datum* d) {
         tinker_public::Tensor& w = (*d->mutable_loss_fn_inputs())["weights"];
         w.add_shape(1);
         w.add_shape(1);
       },
       "must have shape [N] or [N, K]"},
      {"fractional target tokens",
       [](tinker_public::Datum* d) {
         (*d->mutable_loss_fn_inputs())["target_tokens"] =
             Dense(tinker_public::DTYPE_FLOAT32,
                   Bytes(std::vector<float>{1.5f, 2.0f, 3.0f}), {3});
       },
       "target_tokens must hold integers"},
      {"an unknown input",
       [](tinker_public::Datum* d) {
         (*d->mutable_loss_fn_inputs())["mask"] =
             Dense(tinker_public::DTYPE_FLOAT32,
                   Bytes(std::vector<float>{1.0f}), {1});
       },
       "loss_fn_inputs.mask is not supported"},
      {"no targets",
       [](tinker_public::Datum* d) {
         d->mutable_loss_fn_inputs()->erase("target_tokens");
       },
       "target_tokens is required"},
      {"a bfloat16 tensor",
       [](tinker_public::Datum* d) {
         (*d->mutable_loss_fn_inputs())["weights"].set_dtype(
             tinker_public::DTYPE_BFLOAT16);
       },
       "dtype DTYPE_BFLOAT16 is not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    tinker_public::ForwardBackwardRequest request = CrossEntropyRequest();
    c.spoil(request.mutable_data(0));
    absl::Status status = TinkerForwardBackwardInput(request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

// A converted body is checked as the gRPC API's requests are: its loss,
// its datums against the model's limits, their count.
TEST(TinkerConvertTest, NativeRequestsAreCheckedAgainstTheLimits) {
  DatumLimits limits;
  limits.vocab_size = 64;
  limits.max_positions = 16;
  absl::StatusOr<ForwardBackwardInput> input =
      TinkerForwardBackwardInput(CrossEntropyRequest());
  ASSERT_TRUE(input.ok()) << input.status();

  absl::StatusOr<SessionRequest> request =
      ForwardBackwardRequestOf(*input, limits, /*max_datums=*/1);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->kind, SessionOp::Kind::kForwardBackward);
  EXPECT_EQ(request->loss.fn, LossFn::kCrossEntropy);
  ASSERT_EQ(request->data->size(), 1u);
  EXPECT_THAT((*request->data)[0].input_ids, ElementsAre(5, 17, 33));

  ForwardBackwardInput forward = *input;
  forward.forward_only = true;
  EXPECT_EQ(ForwardBackwardRequestOf(forward, limits, 1)->kind,
            SessionOp::Kind::kForward);

  ForwardBackwardInput two = *input;
  two.data.push_back(two.data[0]);
  EXPECT_THAT(ForwardBackwardRequestOf(two, limits, 1).status().message(),
              HasSubstr("data has 2 datums; this server takes at most 1"));
  ForwardBackwardInput empty = *input;
  empty.data.clear();
  EXPECT_THAT(ForwardBackwardRequestOf(empty, limits, 1).status().message(),
              HasSubstr("data must have at least one datum"));

  ForwardBackwardInput unknown = *input;
  unknown.loss_fn = "hinge";
  EXPECT_THAT(ForwardBackwardRequestOf(unknown, limits, 1).status().message(),
              HasSubstr("loss_fn"));

  limits.vocab_size = 20;  // Token 33 is outside it.
  absl::Status refused = ForwardBackwardRequestOf(*input, limits, 1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("data[0]."));
}

// Reads an output as the SDK's deserialize_forward_backward_output does:
// per record, per datum, the float32 values between its byte offsets and
// the shape [elements / prod(trailing), *trailing].
struct ReadDatum {
  std::vector<float> values;
  std::vector<int64_t> shape;
};
std::vector<ReadDatum> ReadLikeTheSdk(
    const tinker_public::ForwardBackwardOutput& out) {
  std::vector<ReadDatum> datums;
  for (const tinker_public::ArrayRecord& record : out.loss_fn_outputs()) {
    const tinker_public::BatchedTensor& field = record.fields().at("logprobs");
    EXPECT_EQ(field.dtype(), tinker_public::DTYPE_FLOAT32);
    const std::vector<int64_t> offsets = Values<int64_t>(field.offsets());
    const std::vector<float> data = Values<float>(field.data());
    EXPECT_EQ(static_cast<int64_t>(offsets.size()), record.num_datums() + 1);
    int64_t trailing = 1;
    for (int64_t dim : field.trailing_shape()) trailing *= dim;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      ReadDatum datum;
      datum.values.assign(data.begin() + offsets[i] / 4,
                          data.begin() + offsets[i + 1] / 4);
      datum.shape = {static_cast<int64_t>(datum.values.size()) / trailing};
      datum.shape.insert(datum.shape.end(), field.trailing_shape().begin(),
                         field.trailing_shape().end());
      datums.push_back(datum);
    }
  }
  return datums;
}

TEST(TinkerConvertTest, OutputsAreArrayRecordsShapedLikeTheTargets) {
  ForwardBackwardOutput output;
  output.logprobs = {{-0.5, -1.25}, {-2.0, -3.0, -4.0, -5.0}, {-0.125}};
  output.loss = 7.5;
  tinker_public::ForwardBackwardOutput out;
  // The second datum has K = 2 targets per position.
  TinkerForwardBackwardOutput(output, {1, 2, 1}, &out);
  EXPECT_EQ(out.loss_fn_output_type(), "ArrayRecord");
  ASSERT_EQ(out.metrics().size(), 1u);
  EXPECT_DOUBLE_EQ(out.metrics().at("loss:sum"), 7.5);
  // A record shares its trailing shape: one per run of equal K.
  EXPECT_EQ(out.loss_fn_outputs_size(), 3);
  std::vector<ReadDatum> datums = ReadLikeTheSdk(out);
  ASSERT_EQ(datums.size(), 3u);
  EXPECT_THAT(datums[0].values, ElementsAre(-0.5f, -1.25f));
  EXPECT_THAT(datums[0].shape, ElementsAre(2));
  EXPECT_THAT(datums[1].values, ElementsAre(-2.0f, -3.0f, -4.0f, -5.0f));
  EXPECT_THAT(datums[1].shape, ElementsAre(2, 2));
  EXPECT_THAT(datums[2].values, ElementsAre(-0.125f));
  EXPECT_THAT(datums[2].shape, ElementsAre(1));

  tinker_public::ForwardBackwardOutput same_k;
  TinkerForwardBackwardOutput(output, {1, 1, 1}, &same_k);
  EXPECT_EQ(same_k.loss_fn_outputs_size(), 1);
  EXPECT_EQ(same_k.loss_fn_outputs(0).num_datums(), 3);
}

TEST(TinkerConvertTest, LoraConfigSwitchesChooseTheTargets) {
  uint64_t seed = 99;
  absl::StatusOr<LoraConfig> all =
      TinkerLoraConfig(nlohmann::json{{"rank", 8}}, &seed);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->rank, 8);
  EXPECT_DOUBLE_EQ(all->alpha, kTinkerLoraAlpha);
  EXPECT_EQ(all->targets.size(), kAllProjections.size() + 1);
  EXPECT_TRUE(all->TargetsLmHead());
  EXPECT_EQ(seed, 99u);  // Unchanged without a seed.

  absl::StatusOr<LoraConfig> attn =
      TinkerLoraConfig(nlohmann::json{{"rank", 4},
                                      {"seed", 12},
                                      {"train_mlp", false},
                                      {"train_unembed", false}},
                       &seed);
  ASSERT_TRUE(attn.ok()) << attn.status();
  EXPECT_THAT(attn->targets, ElementsAre(Projection::kQ, Projection::kK,
                                         Projection::kV, Projection::kO));
  EXPECT_EQ(seed, 12u);

  absl::StatusOr<LoraConfig> mlp = TinkerLoraConfig(
      nlohmann::json{{"rank", 4}, {"train_attn", false}}, &seed);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_THAT(mlp->targets,
              ElementsAre(Projection::kGate, Projection::kUp, Projection::kDown,
                          Projection::kLmHead));

  EXPECT_THAT(TinkerLoraConfig(nlohmann::json{{"train_attn", false}}, &seed)
                  .status()
                  .message(),
              HasSubstr("lora_config.rank is required"));
  EXPECT_THAT(TinkerLoraConfig(nlohmann::json{{"rank", 4},
                                              {"train_attn", false},
                                              {"train_mlp", false},
                                              {"train_unembed", false}},
                               &seed)
                  .status()
                  .message(),
              HasSubstr("nothing would train"));
  EXPECT_THAT(
      TinkerLoraConfig(nlohmann::json{{"rank", "8"}}, &seed).status().message(),
      HasSubstr("lora_config.rank"));
}

TEST(TinkerConvertTest, OptimizerFamiliesAndSteps) {
  absl::StatusOr<OptimizerConfig> absent = TinkerOptimizerConfig(nullptr);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->family, OptimizerFamily::kAdamW);
  const nlohmann::json dimuon = {{"type", "dimuon"}, {"version", 1}};
  EXPECT_EQ(TinkerOptimizerConfig(&dimuon)->family, OptimizerFamily::kMuon);
  const nlohmann::json sgd = {{"type", "sgd"}};
  EXPECT_THAT(TinkerOptimizerConfig(&sgd).status().message(),
              HasSubstr("optimizer_config.type"));
  const nlohmann::json lion = {{"type", "lion"}};
  EXPECT_EQ(TinkerOptimizerConfig(&lion)->family, OptimizerFamily::kLion);
  const nlohmann::json muon_lion = {{"type", "muon"},
                                    {"scalar_optimizer", "lion"}};
  EXPECT_EQ(TinkerOptimizerConfig(&muon_lion)->scalar_optimizer,
            ScalarOptimizer::kLion);
  EXPECT_EQ(TinkerOptimizerConfig(&dimuon)->scalar_optimizer,
            ScalarOptimizer::kAdamW);
  const nlohmann::json bad_scalar = {{"type", "muon"},
                                     {"scalar_optimizer", "sgd"}};
  EXPECT_THAT(TinkerOptimizerConfig(&bad_scalar).status().message(),
              HasSubstr("optimizer_config.scalar_optimizer must be"));
  // SOAP with its knobs; its eps is its own, not Tinker's Adam's.
  const nlohmann::json soap = {
      {"type", "soap"},         {"scalar_optimizer", "lion"},
      {"shampoo_beta", 0.9},    {"precondition_frequency", 10},
      {"max_precond_dim", 256}, {"power_iter_steps", 2},
      {"use_eigh", true},       {"max_update_rms", 1.5}};
  absl::StatusOr<OptimizerConfig> soap_config = TinkerOptimizerConfig(&soap);
  ASSERT_TRUE(soap_config.ok()) << soap_config.status();
  EXPECT_EQ(soap_config->family, OptimizerFamily::kSoap);
  EXPECT_EQ(soap_config->scalar_optimizer, ScalarOptimizer::kLion);
  EXPECT_DOUBLE_EQ(soap_config->shampoo_beta, 0.9);
  EXPECT_EQ(soap_config->precondition_frequency, 10);
  EXPECT_EQ(soap_config->max_precond_dim, 256);
  EXPECT_EQ(soap_config->power_iter_steps, 2);
  EXPECT_TRUE(soap_config->use_eigh);
  EXPECT_DOUBLE_EQ(soap_config->max_update_rms, 1.5);
  EXPECT_DOUBLE_EQ(soap_config->eps, 1e-8);
  const nlohmann::json soap_defaults = {{"type", "soap"}};
  absl::StatusOr<OptimizerConfig> soap_default =
      TinkerOptimizerConfig(&soap_defaults);
  ASSERT_TRUE(soap_default.ok()) << soap_default.status();
  EXPECT_EQ(soap_default->scalar_optimizer, ScalarOptimizer::kAdamW);
  EXPECT_EQ(soap_default->max_precond_dim, OptimizerConfig().max_precond_dim);
  const nlohmann::json bad_frequency = {{"type", "soap"},
                                        {"precondition_frequency", 0}};
  EXPECT_THAT(TinkerOptimizerConfig(&bad_frequency).status().message(),
              HasSubstr("precondition_frequency must be >= 1, got 0"));
  const nlohmann::json bad_eigh = {{"type", "soap"}, {"use_eigh", "yes"}};
  EXPECT_THAT(TinkerOptimizerConfig(&bad_eigh).status().message(),
              HasSubstr("optimizer_config.use_eigh"));

  // The SDK always sends every Adam field; absent ones take its defaults.
  absl::StatusOr<OptimStepParams> adam = TinkerOptimStep(
      nlohmann::json{
          {"adam_params", {{"learning_rate", 0.003}, {"grad_clip_norm", 1.5}}}},
      OptimizerFamily::kAdamW);
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_DOUBLE_EQ(*adam->lr, 0.003);
  EXPECT_DOUBLE_EQ(*adam->beta1, 0.9);
  EXPECT_DOUBLE_EQ(*adam->beta2, 0.95);
  EXPECT_DOUBLE_EQ(*adam->eps, 1e-12);
  EXPECT_DOUBLE_EQ(*adam->weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(adam->grad_clip, 1.5);
  EXPECT_FALSE(adam->momentum.has_value());
  EXPECT_FALSE(adam->soap_beta1.has_value());

  // A SOAP session takes the SDK's Adam betas as SOAP's and keeps its eps.
  absl::StatusOr<OptimStepParams> adam_on_soap = TinkerOptimStep(
      nlohmann::json{
          {"adam_params",
           {{"learning_rate", 0.001}, {"beta1", 0.8}, {"eps", 1e-12}}}},
      OptimizerFamily::kSoap);
  ASSERT_TRUE(adam_on_soap.ok()) << adam_on_soap.status();
  EXPECT_DOUBLE_EQ(*adam_on_soap->soap_beta1, 0.8);
  EXPECT_DOUBLE_EQ(*adam_on_soap->soap_beta2, 0.95);
  EXPECT_FALSE(adam_on_soap->eps.has_value());
  EXPECT_DOUBLE_EQ(*adam_on_soap->lr, 0.001);

  absl::StatusOr<OptimStepParams> muon = TinkerOptimStep(
      nlohmann::json{
          {"optimizer_params",
           {{"type", "dimuon"}, {"learning_rate", 0.02}, {"beta1", 0.8}}}},
      OptimizerFamily::kAdamW);
  ASSERT_TRUE(muon.ok()) << muon.status();
  EXPECT_DOUBLE_EQ(*muon->lr, 0.02);
  EXPECT_DOUBLE_EQ(*muon->momentum, 0.8);
  EXPECT_FALSE(muon->beta2.has_value());

  // Lion's own defaults; its betas are not Adam's.
  absl::StatusOr<OptimStepParams> lion_step = TinkerOptimStep(
      nlohmann::json{
          {"optimizer_params",
           {{"type", "lion"}, {"learning_rate", 3e-5}, {"beta2", 0.98}}}},
      OptimizerFamily::kAdamW);
  ASSERT_TRUE(lion_step.ok()) << lion_step.status();
  EXPECT_DOUBLE_EQ(*lion_step->lr, 3e-5);
  EXPECT_DOUBLE_EQ(*lion_step->lion_beta1, 0.9);
  EXPECT_DOUBLE_EQ(*lion_step->lion_beta2, 0.98);
  EXPECT_DOUBLE_EQ(*lion_step->weight_decay, 0.0);
  EXPECT_FALSE(lion_step->beta1.has_value());
  EXPECT_FALSE(lion_step->momentum.has_value());

  // SOAP's own defaults; shampoo_beta is the session's unless sent.
  absl::StatusOr<OptimStepParams> soap_step = TinkerOptimStep(
      nlohmann::json{
          {"optimizer_params",
           {{"type", "soap"}, {"learning_rate", 3e-4}, {"beta1", 0.85}}}},
      OptimizerFamily::kAdamW);
  ASSERT_TRUE(soap_step.ok()) << soap_step.status();
  EXPECT_DOUBLE_EQ(*soap_step->lr, 3e-4);
  EXPECT_DOUBLE_EQ(*soap_step->soap_beta1, 0.85);
  EXPECT_DOUBLE_EQ(*soap_step->soap_beta2, 0.95);
  EXPECT_DOUBLE_EQ(*soap_step->eps, 1e-8);
  EXPECT_DOUBLE_EQ(*soap_step->weight_decay, 0.0);
  EXPECT_FALSE(soap_step->shampoo_beta.has_value());
  EXPECT_FALSE(soap_step->beta1.has_value());
  EXPECT_FALSE(soap_step->lion_beta1.has_value());
  soap_step = TinkerOptimStep(
      nlohmann::json{
          {"optimizer_params",
           {{"type", "soap"}, {"shampoo_beta", 0.8}, {"grad_clip_norm", 2.0}}}},
      OptimizerFamily::kAdamW);
  ASSERT_TRUE(soap_step.ok()) << soap_step.status();
  EXPECT_DOUBLE_EQ(*soap_step->shampoo_beta, 0.8);
  EXPECT_DOUBLE_EQ(soap_step->grad_clip, 2.0);
  EXPECT_THAT(
      TinkerOptimStep(nlohmann::json{{"optimizer_params", {{"type", "sgd"}}}},
                      OptimizerFamily::kAdamW)
          .status()
          .message(),
      HasSubstr("\"lion\" or \"soap\""));

  EXPECT_THAT(TinkerOptimStep(nlohmann::json{{"model_id", "m"}},
                              OptimizerFamily::kAdamW)
                  .status()
                  .message(),
              HasSubstr("adam_params or optimizer_params"));
  EXPECT_THAT(
      TinkerOptimStep(nlohmann::json{{"adam_params", {{"beta1", "high"}}}},
                      OptimizerFamily::kAdamW)
          .status()
          .message(),
      HasSubstr("adam_params.beta1"));
}

nlohmann::json SampleBody(nlohmann::json params) {
  return {{"num_samples", 2},
          {"prompt",
           {{"chunks",
             {{{"type", "encoded_text"}, {"tokens", {5, 17}}},
              {{"type", "encoded_text"}, {"tokens", {33}}}}}}},
          {"sampling_params", params},
          {"sampling_session_id", "s:sample:0"},
          {"seq_id", 0},
          {"prompt_logprobs", true},
          {"type", "sample"}};
}

TEST(TinkerConvertTest, SampleRequestsAndTheirStops) {
  absl::StatusOr<SamplingRequest> plain =
      TinkerSamplingRequest(SampleBody({{"max_tokens", 7},
                                        {"seed", 4},
                                        {"temperature", 0.5},
                                        {"top_k", -1},
                                        {"top_p", 0.9}}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->prompt, SamplePrompt::kTokens);
  EXPECT_THAT(plain->tokens, ElementsAre(5, 17, 33));
  EXPECT_EQ(plain->weights_kind, SampleWeights::kBaseModel);
  EXPECT_EQ(plain->n, 2);
  EXPECT_EQ(plain->max_tokens, 7);
  EXPECT_EQ(plain->seed, 4u);
  EXPECT_DOUBLE_EQ(plain->temperature, 0.5);
  EXPECT_DOUBLE_EQ(plain->top_p, 0.9);
  EXPECT_EQ(plain->top_k, 0);  // -1: off.
  EXPECT_TRUE(plain->prompt_logprobs);
  // No stop given: EOS stops.
  EXPECT_FALSE(plain->ignore_eos);
  EXPECT_TRUE(plain->stop.empty());
  EXPECT_TRUE(plain->stop_token_ids.empty());

  absl::StatusOr<SamplingRequest> none =
      TinkerSamplingRequest(SampleBody({{"stop", nlohmann::json::array()}}));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->ignore_eos);  // []: not even EOS.
  EXPECT_FALSE(none->seed.has_value());
  EXPECT_EQ(none->max_tokens, 256);  // The default.

  absl::StatusOr<SamplingRequest> text =
      TinkerSamplingRequest(SampleBody({{"stop", "\n\nUser:"}}));
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(text->stop, ElementsAre("\n\nUser:"));
  EXPECT_FALSE(text->ignore_eos);

  absl::StatusOr<SamplingRequest> ids =
      TinkerSamplingRequest(SampleBody({{"stop", {128009, 128001}}}));
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(ids->stop_token_ids, ElementsAre(128009, 128001));

  EXPECT_THAT(TinkerSamplingRequest(SampleBody({{"stop", {"a", 5}}}))
                  .status()
                  .message(),
              HasSubstr("not both"));
  EXPECT_THAT(
      TinkerSamplingRequest(SampleBody({{"top_k", 0}})).status().message(),
      HasSubstr("sampling_params.top_k"));
  nlohmann::json topk = SampleBody(nlohmann::json::object());
  topk["topk_sample_logprobs"] = 5;
  EXPECT_THAT(TinkerSamplingRequest(topk).status().message(),
              HasSubstr("topk_sample_logprobs"));
  nlohmann::json image = SampleBody(nlohmann::json::object());
  image["prompt"]["chunks"][1] = {{"type", "image"}, {"data", "x"}};
  EXPECT_THAT(TinkerSamplingRequest(image).status().message(),
              HasSubstr("prompt.chunks[1]"));
}

// The same request through either edge is the same native request, so the
// same checks (SampleCommandOf) apply to both.
TEST(TinkerConvertTest, BothEdgesParseSamplingAlike) {
  absl::StatusOr<SamplingRequest> tinker =
      TinkerSamplingRequest(SampleBody({{"max_tokens", 7},
                                        {"seed", 4},
                                        {"temperature", 0.5},
                                        {"top_k", 3},
                                        {"top_p", 0.0},
                                        {"stop", {"a", "b"}}}));
  ASSERT_TRUE(tinker.ok()) << tinker.status();
  v1::SampleRequest proto;
  for (int64_t id : {5, 17, 33}) proto.mutable_tokens()->add_ids(id);
  proto.set_n(2);
  proto.set_max_tokens(7);
  proto.set_seed(4);
  proto.set_temperature(0.5);
  proto.set_top_k(3);
  proto.add_stop("a");
  proto.add_stop("b");
  proto.set_prompt_logprobs(true);
  const SamplingRequest& from_tinker = *tinker;
  const SamplingRequest from_grpc = SamplingRequestOf(proto);
  for (const SamplingRequest* native : {&from_tinker, &from_grpc}) {
    EXPECT_EQ(native->prompt, SamplePrompt::kTokens);
    EXPECT_THAT(native->tokens, ElementsAre(5, 17, 33));
    EXPECT_EQ(native->n, 2);
    EXPECT_EQ(native->max_tokens, 7);
    EXPECT_EQ(native->seed, 4u);
    EXPECT_DOUBLE_EQ(native->temperature, 0.5);
    EXPECT_DOUBLE_EQ(native->top_p, 1.0);  // 0: off on both.
    EXPECT_EQ(native->top_k, 3);
    EXPECT_THAT(native->stop, ElementsAre("a", "b"));
    EXPECT_TRUE(native->stop_token_ids.empty());
    EXPECT_FALSE(native->ignore_eos);
    EXPECT_TRUE(native->prompt_logprobs);
  }

  // The proto's zeros are its defaults; its oneofs the prompt and weights.
  v1::SampleRequest defaults;
  defaults.set_text("hi");
  defaults.set_checkpoint("jobs/j/checkpoints/3");
  const SamplingRequest native = SamplingRequestOf(defaults);
  EXPECT_EQ(native.prompt, SamplePrompt::kText);
  EXPECT_EQ(native.text, "hi");
  EXPECT_EQ(native.weights_kind, SampleWeights::kCheckpoint);
  EXPECT_EQ(native.weights, "jobs/j/checkpoints/3");
  EXPECT_EQ(native.n, 1);
  EXPECT_EQ(native.max_tokens, 256);
  EXPECT_DOUBLE_EQ(native.temperature, 1.0);
  EXPECT_FALSE(native.seed.has_value());
}

TEST(TinkerConvertTest, SampleResponsesAsTheSdkReadsThem) {
  SampleResult native;
  GeneratedSample& stopped = native.samples.emplace_back();
  stopped.tokens = {9, 2};
  stopped.logprobs = {-0.25, -1.5};
  stopped.stop_reason = StopReason::kStopToken;
  GeneratedSample& cut = native.samples.emplace_back();
  cut.tokens = {11};
  cut.logprobs = {-3.0};
  cut.stop_reason = StopReason::kLength;
  native.prompt_logprobs = {-2.0, -4.0};

  tinker_public::SampleResponse out;
  TinkerSampleResponse(native, /*prompt_logprobs=*/true, &out);
  ASSERT_EQ(out.sequences_size(), 2);
  EXPECT_EQ(out.sequences(0).stop_reason(), tinker_public::STOP_REASON_STOP);
  EXPECT_THAT(Values<int32_t>(out.sequences(0).tokens()), ElementsAre(9, 2));
  EXPECT_THAT(Values<float>(out.sequences(0).logprobs()),
              ElementsAre(-0.25f, -1.5f));
  EXPECT_EQ(out.sequences(1).stop_reason(), tinker_public::STOP_REASON_LENGTH);
  // One per prompt token, the first NaN (the SDK's None).
  std::vector<float> prompt = Values<float>(out.prompt_logprobs());
  ASSERT_EQ(prompt.size(), 3u);
  EXPECT_TRUE(std::isnan(prompt[0]));
  EXPECT_EQ(prompt[1], -2.0f);
  EXPECT_EQ(prompt[2], -4.0f);

  tinker_public::SampleResponse without;
  TinkerSampleResponse(native, /*prompt_logprobs=*/false, &without);
  EXPECT_FALSE(without.has_prompt_logprobs());
}

}  // namespace
}  // namespace loraplex
