#include "server/tinker/tinker_convert.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_fields.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"

namespace loraplex {
namespace {

// Little-endian raw arrays (the only byte order of the SDK's machines and
// ours: x86-64 and aarch64).
template <typename T>
absl::StatusOr<std::vector<T>> RawArray(const std::string& bytes,
                                        absl::string_view field) {
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", bytes.size(), " bytes, not a multiple of ", sizeof(T)));
  }
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

// A tensor's values as doubles in row-major order, its shape checked to
// be [N] or [N, K].
struct DenseTensor {
  std::vector<double> values;
  int64_t rows = 0;
  int64_t columns = 1;
};

absl::StatusOr<std::vector<double>> TensorValues(const std::string& bytes,
                                                 tinker_public::DType dtype,
                                                 absl::string_view field) {
  std::vector<double> values;
  switch (dtype) {
    case tinker_public::DTYPE_FLOAT32: {
      LORAPLEX_ASSIGN_OR_RETURN(std::vector<float> floats,
                                RawArray<float>(bytes, field));
      values.assign(floats.begin(), floats.end());
      break;
    }
    case tinker_public::DTYPE_INT64: {
      LORAPLEX_ASSIGN_OR_RETURN(std::vector<int64_t> ints,
                                RawArray<int64_t>(bytes, field));
      values.reserve(ints.size());
      for (int64_t v : ints) values.push_back(static_cast<double>(v));
      break;
    }
    case tinker_public::DTYPE_INT32: {
      LORAPLEX_ASSIGN_OR_RETURN(std::vector<int32_t> ints,
                                RawArray<int32_t>(bytes, field));
      values.assign(ints.begin(), ints.end());
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dtype ", tinker_public::DType_Name(dtype),
                       " is not supported (float32, int64 or int32)"));
  }
  return values;
}

absl::StatusOr<DenseTensor> Dense(const tinker_public::Tensor& tensor,
                                  absl::string_view field) {
  DenseTensor dense;
  if (tensor.shape_size() == 0 || tensor.shape_size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must have shape [N] or [N, K], got ",
                     tensor.shape_size(), " dimensions"));
  }
  for (int64_t dim : tensor.shape()) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has a negative dimension ", dim));
    }
  }
  dense.rows = tensor.shape(0);
  dense.columns = tensor.shape_size() == 2 ? tensor.shape(1) : 1;
  const int64_t size = dense.rows * dense.columns;
  if (tensor.has_sparse_csr()) {
    const tinker_public::SparseCsr& csr = tensor.sparse_csr();
    LORAPLEX_ASSIGN_OR_RETURN(
        std::vector<double> values,
        TensorValues(csr.values(), tensor.dtype(), field));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::vector<int64_t> crow,
        RawArray<int64_t>(csr.crow_indices(),
                          absl::StrCat(field, ".crow_indices")));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::vector<int64_t> cols,
        RawArray<int64_t>(csr.col_indices(),
                          absl::StrCat(field, ".col_indices")));
    if (static_cast<int64_t>(crow.size()) != dense.rows + 1 ||
        cols.size() != values.size() || crow.front() != 0 ||
        crow.back() != static_cast<int64_t>(values.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": sparse CSR indices do not match its shape and values"));
    }
    dense.values.assign(size, 0.0);
    for (int64_t row = 0; row < dense.rows; ++row) {
      if (crow[row] > crow[row + 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": crow_indices must not decrease"));
      }
      for (int64_t i = crow[row]; i < crow[row + 1]; ++i) {
        if (cols[i] < 0 || cols[i] >= dense.columns) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": column index ", cols[i],
                           " is outside [0, ", dense.columns, ")"));
        }
        dense.values[row * dense.columns + cols[i]] = values[i];
      }
    }
    return dense;
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      dense.values, TensorValues(tensor.dense(), tensor.dtype(), field));
  if (static_cast<int64_t>(dense.values.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", dense.values.size(), " values; its shape says ", size));
  }
  return dense;
}

// Rounded to float32, the precision the SDK sends them in and the gRPC
// API carries them in: a datum trains the same through either.
std::vector<double> Float32Values(const std::vector<double>& values) {
  std::vector<double> rounded;
  rounded.reserve(values.size());
  for (double value : values) {
    rounded.push_back(static_cast<double>(static_cast<float>(value)));
  }
  return rounded;
}

absl::Status CheckInteger(double value, absl::string_view field) {
  if (!std::isfinite(value) || std::floor(value) != value) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must hold integers, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ForwardBackwardInput> TinkerForwardBackwardInput(
    const tinker_public::ForwardBackwardRequest& request) {
  ForwardBackwardInput native;
  native.loss_fn = request.loss_fn();
  native.forward_only = request.forward_only();
  native.loss_fn_config.insert(request.loss_fn_config().begin(),
                               request.loss_fn_config().end());
  for (const auto& [key, value] : request.loss_fn_config_v2()) {
    if (value.has_text()) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss_fn_config.", key, " must be a number, got text"));
    }
    native.loss_fn_config[key] = value.number();
  }
  native.data.reserve(request.data_size());
  for (int i = 0; i < request.data_size(); ++i) {
    const tinker_public::Datum& datum = request.data(i);
    const std::string prefix = absl::StrCat("data[", i, "].");
    Datum& out = native.data.emplace_back();
    for (int c = 0; c < datum.model_input_size(); ++c) {
      const tinker_public::Chunk& chunk = datum.model_input(c);
      if (!chunk.has_encoded_text()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "model_input[", c,
                         "]: only encoded_text chunks are supported (this "
                         "server trains text models)"));
      }
      LORAPLEX_ASSIGN_OR_RETURN(
          std::vector<int32_t> tokens,
          RawArray<int32_t>(chunk.encoded_text().tokens(),
                            absl::StrCat(prefix, "model_input[", c, "]")));
      out.input_ids.insert(out.input_ids.end(), tokens.begin(), tokens.end());
    }
    for (const auto& [name, tensor] : datum.loss_fn_inputs()) {
      const std::string field = absl::StrCat(prefix, "loss_fn_inputs.", name);
      LORAPLEX_ASSIGN_OR_RETURN(DenseTensor dense, Dense(tensor, field));
      if (name == "target_tokens") {
        for (double value : dense.values) {
          LORAPLEX_RETURN_IF_ERROR(CheckInteger(value, field));
          out.target_tokens.push_back(static_cast<int64_t>(value));
        }
        out.targets_per_position = dense.columns;
      } else if (name == "weights") {
        out.weights = Float32Values(dense.values);
      } else if (name == "logprobs") {
        out.sampler_logprobs = Float32Values(dense.values);
      } else if (name == "advantages") {
        out.advantages = Float32Values(dense.values);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(field,
                         " is not supported (target_tokens, weights, logprobs, "
                         "advantages)"));
      }
    }
    if (out.target_tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "loss_fn_inputs.target_tokens is required"));
    }
    // Provenance spans (model_input_spans, loss_fn_input_spans) only say
    // which sampled sequence each token came from, for the stable_reinforce
    // loss; the losses served here do not read them (cookbook 0.6.1 sends
    // them with every RL datum).
  }
  return native;
}

std::vector<int64_t> TargetsPerPosition(const std::vector<Datum>& data) {
  std::vector<int64_t> targets;
  targets.reserve(data.size());
  for (const Datum& datum : data) {
    targets.push_back(
        datum.targets_per_position == 0 ? 1 : datum.targets_per_position);
  }
  return targets;
}

void TinkerForwardBackwardOutput(const ForwardBackwardOutput& output,
                                 const std::vector<int64_t>& targets,
                                 tinker_public::ForwardBackwardOutput* out) {
  out->set_loss_fn_output_type("ArrayRecord");
  (*out->mutable_metrics())["loss:sum"] = output.loss;
  // One record per run of datums with the same K: a record's trailing
  // shape is shared by its datums.
  size_t i = 0;
  while (i < output.logprobs.size()) {
    const int64_t k = i < targets.size() ? targets[i] : 1;
    tinker_public::ArrayRecord* record = out->add_loss_fn_outputs();
    record->set_type_tag("ArrayRecord");
    tinker_public::BatchedTensor& field =
        (*record->mutable_fields())["logprobs"];
    field.set_dtype(tinker_public::DTYPE_FLOAT32);
    if (k > 1) field.add_trailing_shape(k);
    std::vector<float> data;
    std::vector<int64_t> offsets = {0};
    int64_t datums = 0;
    for (; i < output.logprobs.size() &&
           (i < targets.size() ? targets[i] : 1) == k;
         ++i) {
      data.insert(data.end(), output.logprobs[i].begin(),
                  output.logprobs[i].end());
      offsets.push_back(static_cast<int64_t>(data.size() * sizeof(float)));
      ++datums;
    }
    field.set_data(RawBytes(data));
    field.set_offsets(RawBytes(offsets));
    record->set_num_datums(datums);
  }
}

absl::StatusOr<LoraConfig> TinkerLoraConfig(const nlohmann::json& lora_config,
                                            uint64_t* seed) {
  if (!lora_config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora_config must be an object, got ", DescribeJson(lora_config)));
  }
  JsonFields fields(lora_config, "lora_config.");
  LoraConfig config;
  config.alpha = kTinkerLoraAlpha;
  int64_t rank = 0;
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("rank", &rank));
  if (fields.Raw("rank") == nullptr) {
    return absl::InvalidArgumentError("lora_config.rank is required");
  }
  config.rank = rank;
  bool attn = true, mlp = true, unembed = true;
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("train_attn", &attn));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("train_mlp", &mlp));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("train_unembed", &unembed));
  const nlohmann::json* raw_seed = fields.Raw("seed");
  if (raw_seed != nullptr && !raw_seed->is_null()) {
    int64_t value = 0;
    LORAPLEX_RETURN_IF_ERROR(fields.Integer("seed", &value));
    *seed = static_cast<uint64_t>(value);
  }
  config.targets.clear();
  for (Projection projection : kAllProjections) {
    const bool is_attn =
        projection == Projection::kQ || projection == Projection::kK ||
        projection == Projection::kV || projection == Projection::kO;
    if (is_attn ? attn : mlp) config.targets.push_back(projection);
  }
  if (unembed) config.targets.push_back(Projection::kLmHead);
  if (config.targets.empty()) {
    return absl::InvalidArgumentError(
        "lora_config: train_attn, train_mlp and train_unembed are all false; "
        "nothing would train");
  }
  LORAPLEX_RETURN_IF_ERROR(ValidateLoraConfig(config));
  return config;
}

absl::StatusOr<OptimizerConfig> TinkerOptimizerConfig(
    const nlohmann::json* optimizer_config) {
  OptimizerConfig config;
  if (optimizer_config == nullptr || optimizer_config->is_null()) {
    return config;
  }
  if (!optimizer_config->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer_config must be an object, got ",
                     DescribeJson(*optimizer_config)));
  }
  JsonFields fields(*optimizer_config, "optimizer_config.");
  std::string type = "adamw";
  LORAPLEX_RETURN_IF_ERROR(fields.String("type", &type));
  if (type == "adamw") {
    config.family = OptimizerFamily::kAdamW;
  } else if (type == "adam") {
    config.family = OptimizerFamily::kAdam;
  } else if (type == "dimuon" || type == "muon") {
    config.family = OptimizerFamily::kMuon;
  } else if (type == "lion") {
    config.family = OptimizerFamily::kLion;
  } else if (type == "soap") {
    config.family = OptimizerFamily::kSoap;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_config.type must be \"adamw\", \"adam\", \"muon\", "
        "\"dimuon\" (loraplex's Muon), \"lion\" or \"soap\", got ",
        DescribeJson(*fields.Raw("type"))));
  }
  std::string scalar = "adamw";
  LORAPLEX_RETURN_IF_ERROR(fields.String("scalar_optimizer", &scalar));
  const std::optional<ScalarOptimizer> parsed = ParseScalarOptimizer(scalar);
  if (!parsed.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_config.scalar_optimizer must be \"adamw\" or \"lion\", "
        "got ",
        DescribeJson(*fields.Raw("scalar_optimizer"))));
  }
  config.scalar_optimizer = *parsed;
  // SOAP's knobs that steps do not send (validated for every type).
  LORAPLEX_RETURN_IF_ERROR(ReadSoapKnobs(fields, &config));
  // Tinker's Adam defaults; every step sends its own. SOAP keeps its own
  // eps, as its steps' default.
  config.beta2 = 0.95;
  if (config.family != OptimizerFamily::kSoap) config.eps = 1e-12;
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  return config;
}

absl::StatusOr<OptimStepParams> TinkerOptimStep(const nlohmann::json& request,
                                                OptimizerFamily family) {
  OptimStepParams step;
  const bool adam = request.contains("adam_params");
  const nlohmann::json* params = adam ? &request["adam_params"]
                                      : (request.contains("optimizer_params")
                                             ? &request["optimizer_params"]
                                             : nullptr);
  if (params == nullptr) {
    return absl::InvalidArgumentError(
        "optim_step needs adam_params or optimizer_params");
  }
  const std::string name = adam ? "adam_params" : "optimizer_params";
  if (!params->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be an object, got ", DescribeJson(*params)));
  }
  JsonFields fields(*params, name + ".");
  double lr = 1e-4;
  LORAPLEX_RETURN_IF_ERROR(fields.Number("learning_rate", &lr));
  step.lr = lr;
  double clip = 0.0;
  LORAPLEX_RETURN_IF_ERROR(fields.Number("grad_clip_norm", &clip));
  step.grad_clip = clip > 0.0 ? clip : 0.0;
  if (adam) {
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-12, weight_decay = 0.0;
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta1", &beta1));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta2", &beta2));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("eps", &eps));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("weight_decay", &weight_decay));
    step.beta1 = beta1;
    step.beta2 = beta2;
    step.weight_decay = weight_decay;
    if (family == OptimizerFamily::kSoap) {
      step.soap_beta1 = beta1;
      step.soap_beta2 = beta2;
    } else {
      step.eps = eps;
    }
    return step;
  }
  std::string type;
  LORAPLEX_RETURN_IF_ERROR(fields.String("type", &type));
  if (type == "lion") {
    // Lion's own defaults (Emerging-Optimizers'); weight decay as Adam's.
    double beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta1", &beta1));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta2", &beta2));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("weight_decay", &weight_decay));
    step.lion_beta1 = beta1;
    step.lion_beta2 = beta2;
    step.weight_decay = weight_decay;
    return step;
  }
  if (type == "soap") {
    // SOAP's own defaults (Emerging-Optimizers'); weight decay as Adam's.
    // shampoo_beta, when absent, stays the session's.
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta1", &beta1));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("beta2", &beta2));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("eps", &eps));
    LORAPLEX_RETURN_IF_ERROR(fields.Number("weight_decay", &weight_decay));
    if (fields.Raw("shampoo_beta") != nullptr) {
      double shampoo_beta = 0.0;
      LORAPLEX_RETURN_IF_ERROR(fields.Number("shampoo_beta", &shampoo_beta));
      step.shampoo_beta = shampoo_beta;
    }
    step.soap_beta1 = beta1;
    step.soap_beta2 = beta2;
    step.eps = eps;
    step.weight_decay = weight_decay;
    return step;
  }
  if (type != "dimuon" && type != "muon") {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_params.type must be \"dimuon\", \"muon\", \"lion\" or "
        "\"soap\", got \"",
        type, "\""));
  }
  double beta1 = 0.9;
  LORAPLEX_RETURN_IF_ERROR(fields.Number("beta1", &beta1));
  step.momentum = beta1;
  return step;
}

absl::StatusOr<SamplingRequest> TinkerSamplingRequest(
    const nlohmann::json& request) {
  SamplingRequest native;
  JsonFields fields(request, "");
  int64_t num_samples = 1;
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("num_samples", &num_samples));
  if (num_samples < 1 || num_samples > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples must be at least 1, got ", num_samples));
  }
  native.n = num_samples;
  bool prompt_logprobs = false;
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("prompt_logprobs", &prompt_logprobs));
  native.prompt_logprobs = prompt_logprobs;
  int64_t topk_prompt = 0, topk_sample = 0, alt_tokens = 0;
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("topk_prompt_logprobs", &topk_prompt));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("topk_sample_logprobs", &topk_sample));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("prompt_alt_tokens_k", &alt_tokens));
  if (topk_prompt != 0 || topk_sample != 0 || alt_tokens != 0) {
    return absl::InvalidArgumentError(
        "topk_prompt_logprobs, topk_sample_logprobs and prompt_alt_tokens_k "
        "are not supported: leave them 0");
  }
  for (const char* unsupported :
       {"target_prompt_logprobs", "prompt_logprobs_last_n"}) {
    const nlohmann::json* raw = fields.Raw(unsupported);
    if (raw != nullptr && !raw->is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(unsupported, " is not supported"));
    }
  }

  const nlohmann::json* prompt = fields.Raw("prompt");
  if (prompt == nullptr || !prompt->is_object() ||
      !prompt->contains("chunks") || !(*prompt)["chunks"].is_array()) {
    return absl::InvalidArgumentError(
        "prompt must be an object with a list of chunks");
  }
  const nlohmann::json& chunks = (*prompt)["chunks"];
  for (size_t c = 0; c < chunks.size(); ++c) {
    const nlohmann::json& chunk = chunks[c];
    const std::string field = absl::StrCat("prompt.chunks[", c, "]");
    if (!chunk.is_object() || chunk.value("type", "") != "encoded_text" ||
        !chunk.contains("tokens") || !chunk["tokens"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be an encoded_text chunk with a token list"));
    }
    for (const nlohmann::json& token : chunk["tokens"]) {
      if (!token.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".tokens must hold integers, got ", DescribeJson(token)));
      }
      native.tokens.push_back(token.get<int64_t>());
    }
  }

  // No token at all is no prompt.
  if (!native.tokens.empty()) native.prompt = SamplePrompt::kTokens;

  const nlohmann::json* raw_params = fields.Raw("sampling_params");
  if (raw_params == nullptr || !raw_params->is_object()) {
    return absl::InvalidArgumentError("sampling_params must be an object");
  }
  JsonFields params(*raw_params, "sampling_params.");
  const nlohmann::json* max_tokens = params.Raw("max_tokens");
  if (max_tokens != nullptr && !max_tokens->is_null()) {
    int64_t value = 0;
    LORAPLEX_RETURN_IF_ERROR(params.Integer("max_tokens", &value));
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling_params.max_tokens must be at least 1, got ", value));
    }
    native.max_tokens = value;
  }
  const nlohmann::json* seed = params.Raw("seed");
  if (seed != nullptr && !seed->is_null()) {
    int64_t value = 0;
    LORAPLEX_RETURN_IF_ERROR(params.Integer("seed", &value));
    native.seed = static_cast<uint64_t>(value);
  }
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = -1;
  LORAPLEX_RETURN_IF_ERROR(params.Number("temperature", &temperature));
  LORAPLEX_RETURN_IF_ERROR(params.Number("top_p", &top_p));
  LORAPLEX_RETURN_IF_ERROR(params.Integer("top_k", &top_k));
  native.temperature = temperature;
  // 0 reads as 1 (off), as the gRPC API reads it.
  native.top_p = top_p == 0.0 ? 1.0 : top_p;
  if (top_k < -1 || top_k == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling_params.top_k must be -1 (off) or at least 1, got ", top_k));
  }
  native.top_k = top_k == -1 ? 0 : top_k;
  const nlohmann::json* stop = params.Raw("stop");
  if (stop != nullptr && !stop->is_null()) {
    // Given stops add to EOS; only [] turns every stop off, EOS too.
    if (stop->is_string()) {
      native.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->empty()) native.ignore_eos = true;
      for (const nlohmann::json& value : *stop) {
        if (value.is_string()) {
          native.stop.push_back(value.get<std::string>());
        } else if (value.is_number_integer()) {
          native.stop_token_ids.push_back(value.get<int64_t>());
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "sampling_params.stop must hold strings or token ids, got ",
              DescribeJson(value)));
        }
      }
      if (!native.stop.empty() && !native.stop_token_ids.empty()) {
        return absl::InvalidArgumentError(
            "sampling_params.stop must hold strings or token ids, not both");
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.stop must be a string or a list, got ",
                       DescribeJson(*stop)));
    }
  }
  return native;
}

void TinkerSampleResponse(const SampleResult& result, bool prompt_logprobs,
                          tinker_public::SampleResponse* out) {
  for (const GeneratedSample& sample : result.samples) {
    tinker_public::SampledSequence* sequence = out->add_sequences();
    sequence->set_stop_reason(sample.stop_reason == StopReason::kLength
                                  ? tinker_public::STOP_REASON_LENGTH
                                  : tinker_public::STOP_REASON_STOP);
    std::vector<int32_t> tokens(sample.tokens.begin(), sample.tokens.end());
    sequence->set_tokens(RawBytes(tokens));
    std::vector<float> logprobs(sample.logprobs.begin(), sample.logprobs.end());
    sequence->set_logprobs(RawBytes(logprobs));
  }
  if (prompt_logprobs) {
    // The first prompt token has no logprob: NaN, which the SDK reads as
    // None.
    std::vector<float> values = {std::numeric_limits<float>::quiet_NaN()};
    values.insert(values.end(), result.prompt_logprobs.begin(),
                  result.prompt_logprobs.end());
    out->set_prompt_logprobs(RawBytes(values));
  }
}

}  // namespace loraplex
