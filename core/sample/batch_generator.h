// Generation for many requests at once: one prefill over every request's
// rows, then one decode step per token for all rows still running, with each
// row's adapter applied to its segment of the batch (docs/DESIGN.md §11).
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto generator,
//                             BatchGenerator::Start(model, requests, &tok));
//   while (!generator->done()) LORAPLEX_RETURN_IF_ERROR(generator->Step());
//   std::vector<SampleResult> results = generator->TakeResults();
//
// A request with n > 1 takes n rows. Rows are ordered by adapter so each
// adapter's rows are one segment (one base GEMM for all rows, as in
// training). The caller keeps the adapters' weights unchanged until the
// generator is done; snapshot them first to sample beside training.
#ifndef LORAPLEX_CORE_SAMPLE_BATCH_GENERATOR_H_
#define LORAPLEX_CORE_SAMPLE_BATCH_GENERATOR_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/lora/lora_weights.h"
#include "core/model/llama_model.h"
#include "core/sample/sample_output.h"
#include "core/sample/sampling_params.h"
#include "core/sample/token_sampler.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

struct SampleRequest {
  std::vector<int64_t> prompt;
  // nullptr: the base model.
  const LoraWeights* adapter = nullptr;
  SamplingParams params;
  // Samples drawn from this prompt.
  int64_t n = 1;
};

class BatchGenerator {
 public:
  // Called after each generated token: request index, sample index, the
  // sample so far.
  using TokenListener = std::function<void(size_t request, int64_t sample,
                                           const GeneratedSample& so_far)>;

  // Runs the prefill and draws every row's first token. `tokenizer` (may be
  // null when no request has stop strings) decodes text and stop strings.
  // Requests must be valid (ValidateSamplingParams).
  static absl::StatusOr<std::unique_ptr<BatchGenerator>> Start(
      const LlamaModel& model, std::vector<SampleRequest> requests,
      const Tokenizer* tokenizer, TokenListener listener = nullptr);

  // One decode step for every unfinished row.
  absl::Status Step();
  // Stops decoding `request` (its rows leave the batch; its result keeps
  // what was drawn so far). The other requests are not affected.
  void Cancel(size_t request);
  bool done() const { return active_.empty(); }
  // The results in request order, once done().
  std::vector<SampleResult> TakeResults();

  // Start, Step until done, TakeResults.
  static absl::StatusOr<std::vector<SampleResult>> Generate(
      const LlamaModel& model, std::vector<SampleRequest> requests,
      const Tokenizer* tokenizer);

 private:
  struct Row {
    size_t request = 0;
    int64_t sample = 0;
    uint64_t stream = 0;
  };

  BatchGenerator(const LlamaModel& model, std::vector<SampleRequest> requests,
                 const Tokenizer* tokenizer, TokenListener listener);

  absl::Status Prefill();
  // The adapters of the active rows, or nullopt when all use the base.
  std::unique_ptr<ProjectionDelta> Delta() const;
  // Appends the token chosen from logits [rows, vocab] to each active row
  // and drops rows that finished.
  absl::Status Advance(const torch::Tensor& logits);
  // Keeps the active rows at indices `keep` (in order), in the cache too.
  void KeepActive(const std::vector<int64_t>& keep);
  GeneratedSample& SampleOf(const Row& row);
  bool ReachedStopString(const Row& row);
  // Decodes a finished sample's text.
  void Finish(const Row& row);

  const LlamaModel& model_;
  std::vector<SampleRequest> requests_;
  const Tokenizer* tokenizer_;
  TokenListener listener_;
  std::vector<SampleResult> results_;
  std::vector<Row> active_;  // In batch order: grouped by adapter.
  std::unique_ptr<KvCache> cache_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_SAMPLE_BATCH_GENERATOR_H_
