// A checkpoint directory's frozen tensors read against a config
// (docs/DESIGN.md §2): every missing, misshapen, unexpected or unreadable
// tensor is reported at once when it opens; then each tensor of
// ModelTensorSpecs is read as the model holds it, whole (LoadModelWeights)
// or by a range of its elements (a sharded base, sharded_base.h).
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto checkpoint,
//                             CheckpointWeights::Open(dir, config, dtype));
//   LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor w, checkpoint.Load(name, device));
#ifndef LORAPLEX_CORE_MODEL_CHECKPOINT_WEIGHTS_H_
#define LORAPLEX_CORE_MODEL_CHECKPOINT_WEIGHTS_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"
#include "core/safetensors/safetensors.h"

namespace loraplex {

class CheckpointWeights {
 public:
  // INVALID_ARGUMENT naming every tensor that does not match `config`.
  static absl::StatusOr<CheckpointWeights> Open(const std::string& dir,
                                                const ModelConfig& config,
                                                torch::ScalarType dtype);

  // Tensor `name` of ModelTensorSpecs as the model holds it, in the compute
  // dtype on `device`, frozen (requires_grad false). Stored in that dtype on
  // the CPU, it shares the file's mapping (safetensors.h).
  absl::StatusOr<torch::Tensor> Load(const std::string& name,
                                     torch::Device device) const;

  // Whether the elements of `name` in memory order are those of its stored
  // parts one after the other, so that LoadRange reads only the bytes it
  // returns: every tensor but MXFP4 experts, which are dequantized whole.
  bool RangeReadable(const std::string& name) const;
  // A tensor on the meta device with the sizes and strides Load(name)
  // gives, read from the headers alone; RangeReadable(name) only.
  torch::Tensor Meta(const std::string& name) const;
  // Elements [begin, begin + count) of Load(name) in memory order (its
  // dimensions by decreasing stride), a new contiguous tensor in the compute
  // dtype on `device`, reading only their bytes of the files (mapped);
  // RangeReadable(name) only.
  absl::StatusOr<torch::Tensor> LoadRange(const std::string& name,
                                          int64_t begin, int64_t count,
                                          torch::Device device) const;

 private:
  // A tensor of ModelTensorSpecs as the checkpoint stores it: the stored
  // tensors it is made of, and how they make it (unset: the one part as is).
  struct StoredTensor {
    std::vector<TensorSpec> parts;
    std::function<torch::Tensor(std::vector<torch::Tensor>)> assemble;
    // The parts are MXFP4 blocks and scales: uint8, passed to `assemble` as
    // stored instead of in the compute dtype.
    bool mxfp4 = false;
    // Why the tensor cannot be read as stored, when it cannot.
    std::string problem;
  };
  static StoredTensor StoredExperts(const ModelConfig& config,
                                    const SafetensorsCheckpoint& checkpoint,
                                    int64_t layer, Projection projection,
                                    const TensorSpec& spec,
                                    torch::ScalarType dtype);

  CheckpointWeights(SafetensorsCheckpoint checkpoint, torch::ScalarType dtype)
      : checkpoint_(std::move(checkpoint)), dtype_(dtype) {}

  SafetensorsCheckpoint checkpoint_;
  torch::ScalarType dtype_;
  std::map<std::string, StoredTensor> stored_;  // By ModelTensorSpecs name.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_CHECKPOINT_WEIGHTS_H_
