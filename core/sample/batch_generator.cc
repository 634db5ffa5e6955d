#include "core/sample/batch_generator.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/lora/multi_lora.h"

namespace loraplex {
namespace {

// Prompt positions whose logits are computed at once for prompt logprobs.
constexpr int64_t kPromptLogprobChunk = 1024;

// Decoding a sample's last tokens is enough to find a stop string that the
// last token completes: every token but a special one adds at least one
// byte, and a match must end inside the last token.
int64_t StopTailTokens(const SamplingParams& params) {
  size_t longest = 0;
  for (const std::string& stop : params.stop) {
    longest = std::max(longest, stop.size());
  }
  return 2 * static_cast<int64_t>(longest) + 4;
}

}  // namespace

BatchGenerator::BatchGenerator(const LlamaModel& model,
                               std::vector<SampleRequest> requests,
                               const Tokenizer* tokenizer,
                               TokenListener listener)
    : model_(model),
      requests_(std::move(requests)),
      tokenizer_(tokenizer),
      listener_(std::move(listener)) {
  results_.resize(requests_.size());
  // Rows grouped by adapter, adapters in order of first appearance.
  std::vector<const LoraWeights*> adapters;
  for (const SampleRequest& request : requests_) {
    if (std::find(adapters.begin(), adapters.end(), request.adapter) ==
        adapters.end()) {
      adapters.push_back(request.adapter);
    }
  }
  for (const LoraWeights* adapter : adapters) {
    for (size_t r = 0; r < requests_.size(); ++r) {
      if (requests_[r].adapter != adapter) continue;
      for (int64_t i = 0; i < requests_[r].n; ++i) {
        active_.push_back({r, i, SampleStream(requests_[r].params.seed, i)});
      }
    }
  }
  for (size_t r = 0; r < requests_.size(); ++r) {
    results_[r].samples.resize(requests_[r].n);
  }
}

absl::StatusOr<std::unique_ptr<BatchGenerator>> BatchGenerator::Start(
    const LlamaModel& model, std::vector<SampleRequest> requests,
    const Tokenizer* tokenizer, TokenListener listener) {
  for (size_t r = 0; r < requests.size(); ++r) {
    if (requests[r].prompt.empty() || requests[r].n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, " needs a non-empty prompt and n >= 1"));
    }
    if (!requests[r].params.stop.empty() && tokenizer == nullptr) {
      return absl::FailedPreconditionError(
          "stop strings need the model's tokenizer");
    }
  }
  std::unique_ptr<BatchGenerator> generator(new BatchGenerator(
      model, std::move(requests), tokenizer, std::move(listener)));
  if (generator->active_.empty()) return generator;
  LORAPLEX_RETURN_IF_ERROR(generator->Prefill());
  return generator;
}

std::unique_ptr<ProjectionDelta> BatchGenerator::Delta() const {
  std::vector<LoraSegment> segments;
  bool any = false;
  for (const Row& row : active_) {
    const LoraWeights* adapter = requests_[row.request].adapter;
    any = any || adapter != nullptr;
    if (segments.empty() || segments.back().weights != adapter) {
      segments.push_back({.weights = adapter, .rows = 0});
    }
    ++segments.back().rows;
  }
  if (!any) return nullptr;
  return std::make_unique<MultiLoraDelta>(std::move(segments));
}

absl::Status BatchGenerator::Prefill() {
  const int64_t rows = static_cast<int64_t>(active_.size());
  int64_t width = 0;
  int64_t most_tokens = 0;
  for (const Row& row : active_) {
    const SampleRequest& request = requests_[row.request];
    width = std::max(width, static_cast<int64_t>(request.prompt.size()));
    most_tokens = std::max(most_tokens, request.params.max_tokens);
  }
  torch::Tensor ids = torch::zeros({rows, width}, torch::kInt64);
  torch::Tensor valid = torch::zeros({rows, width}, torch::kBool);
  for (int64_t i = 0; i < rows; ++i) {
    const std::vector<int64_t>& prompt = requests_[active_[i].request].prompt;
    const int64_t pad = width - static_cast<int64_t>(prompt.size());
    ids[i]
        .narrow(0, pad, prompt.size())
        .copy_(torch::tensor(prompt, torch::kInt64));
    valid[i].narrow(0, pad, prompt.size()).fill_(true);
  }
  // Left padding makes the cache `width` columns wide plus one per token
  // (the last token drawn is never fed back).
  cache_ =
      std::make_unique<KvCache>(model_.config(), rows, width + most_tokens - 1,
                                model_.dtype(), model_.device());
  std::unique_ptr<ProjectionDelta> delta = Delta();
  LORAPLEX_ASSIGN_OR_RETURN(
      torch::Tensor hidden,
      model_.ForwardCached(ids, valid, *cache_, delta.get()));
  try {
    torch::NoGradGuard no_grad;
    // Prompt logprobs from the first row of each request that asks.
    std::vector<bool> scored(requests_.size(), false);
    for (int64_t i = 0; i < rows; ++i) {
      const size_t r = active_[i].request;
      if (!requests_[r].params.prompt_logprobs || scored[r]) continue;
      scored[r] = true;
      const std::vector<int64_t>& prompt = requests_[r].prompt;
      const int64_t length = static_cast<int64_t>(prompt.size());
      if (length < 2) continue;
      // In chunks of positions, so that a long prompt never holds
      // [length, vocab] logits at once.
      std::vector<double>& out = results_[r].prompt_logprobs;
      out.clear();
      for (int64_t first = 0; first < length - 1;
           first += kPromptLogprobChunk) {
        const int64_t n = std::min(kPromptLogprobChunk, length - 1 - first);
        torch::Tensor logprobs = torch::log_softmax(
            model_
                .Logits(
                    hidden.narrow(0, i, 1).narrow(1, width - length + first, n),
                    delta.get(), /*first_row=*/i)[0]
                .to(torch::kCPU, torch::kFloat64),
            -1);
        torch::Tensor next =
            torch::tensor(std::vector<int64_t>(prompt.begin() + first + 1,
                                               prompt.begin() + first + 1 + n),
                          torch::kInt64);
        torch::Tensor picked =
            logprobs.gather(1, next.unsqueeze(1)).squeeze(1).contiguous();
        out.insert(out.end(), picked.data_ptr<double>(),
                   picked.data_ptr<double>() + n);
      }
    }
    torch::Tensor last = hidden.select(1, width - 1);
    return Advance(model_.Logits(last, delta.get()).to(torch::kCPU));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("prefill failed: ", e.what_without_backtrace()));
  }
}

absl::Status BatchGenerator::Step() {
  if (active_.empty()) return absl::OkStatus();
  const int64_t rows = static_cast<int64_t>(active_.size());
  torch::Tensor ids = torch::empty({rows, 1}, torch::kInt64);
  for (int64_t i = 0; i < rows; ++i) {
    ids[i][0] = SampleOf(active_[i]).tokens.back();
  }
  std::unique_ptr<ProjectionDelta> delta = Delta();
  LORAPLEX_ASSIGN_OR_RETURN(
      torch::Tensor hidden,
      model_.ForwardCached(ids, torch::Tensor(), *cache_, delta.get()));
  try {
    torch::NoGradGuard no_grad;
    return Advance(
        model_.Logits(hidden.select(1, 0), delta.get()).to(torch::kCPU));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("decode step failed: ", e.what_without_backtrace()));
  }
}

void BatchGenerator::Cancel(size_t request) {
  std::vector<int64_t> keep;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (active_[i].request != request) keep.push_back(static_cast<int64_t>(i));
  }
  KeepActive(keep);
}

void BatchGenerator::KeepActive(const std::vector<int64_t>& keep) {
  if (keep.size() == active_.size()) return;
  std::vector<Row> still;
  for (int64_t i : keep) still.push_back(active_[i]);
  if (!still.empty()) cache_->KeepRows(keep);
  active_ = std::move(still);
  if (active_.empty()) cache_.reset();
}

GeneratedSample& BatchGenerator::SampleOf(const Row& row) {
  return results_[row.request].samples[row.sample];
}

bool BatchGenerator::ReachedStopString(const Row& row) {
  const SamplingParams& params = requests_[row.request].params;
  if (params.stop.empty()) return false;
  const std::vector<int64_t>& tokens = SampleOf(row).tokens;
  const int64_t tail = std::min<int64_t>(StopTailTokens(params),
                                         static_cast<int64_t>(tokens.size()));
  absl::StatusOr<std::string> text = tokenizer_->Decode(
      std::vector<int64_t>(tokens.end() - tail, tokens.end()));
  if (!text.ok()) return false;
  return StopStringCut(*text, params.stop) != std::string::npos;
}

void BatchGenerator::Finish(const Row& row) {
  if (tokenizer_ == nullptr) return;
  GeneratedSample& sample = SampleOf(row);
  absl::StatusOr<std::string> text = tokenizer_->Decode(sample.tokens);
  if (!text.ok()) return;
  sample.text = std::move(*text);
  if (sample.stop_reason == StopReason::kStopString) {
    const size_t cut =
        StopStringCut(sample.text, requests_[row.request].params.stop);
    if (cut != std::string::npos) sample.text.resize(cut);
  }
}

absl::Status BatchGenerator::Advance(const torch::Tensor& logits) {
  torch::Tensor all_logprobs =
      torch::log_softmax(logits.to(torch::kFloat64), -1);
  std::vector<int64_t> keep;
  for (size_t i = 0; i < active_.size(); ++i) {
    const Row& row = active_[i];
    const SamplingParams& params = requests_[row.request].params;
    GeneratedSample& sample = SampleOf(row);
    const int64_t step = static_cast<int64_t>(sample.tokens.size());
    const int64_t token =
        ChooseToken(logits[i], params, UniformDraw(row.stream, step));
    torch::Tensor logprobs = all_logprobs[i];
    sample.tokens.push_back(token);
    sample.logprobs.push_back(logprobs[token].item<double>());
    if (params.top_logprobs > 0) {
      sample.top.push_back(TopLogprobs(logprobs, params.top_logprobs));
    }
    bool finished = true;
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                  token) != params.stop_token_ids.end()) {
      sample.stop_reason = StopReason::kStopToken;
    } else if (ReachedStopString(row)) {
      sample.stop_reason = StopReason::kStopString;
    } else if (step + 1 >= params.max_tokens) {
      sample.stop_reason = StopReason::kLength;
    } else {
      finished = false;
    }
    if (finished) Finish(row);
    if (listener_) listener_(row.request, row.sample, sample);
    if (!finished) keep.push_back(static_cast<int64_t>(i));
  }
  KeepActive(keep);
  return absl::OkStatus();
}

std::vector<SampleResult> BatchGenerator::TakeResults() {
  return std::move(results_);
}

absl::StatusOr<std::vector<SampleResult>> BatchGenerator::Generate(
    const LlamaModel& model, std::vector<SampleRequest> requests,
    const Tokenizer* tokenizer) {
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<BatchGenerator> generator,
                            Start(model, std::move(requests), tokenizer));
  while (!generator->done()) LORAPLEX_RETURN_IF_ERROR(generator->Step());
  return generator->TakeResults();
}

}  // namespace loraplex
