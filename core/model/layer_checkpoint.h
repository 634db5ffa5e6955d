// Activation checkpointing of one decoder layer: its forward runs without
// keeping what its backward needs, and the backward pass runs it again from
// its saved input (gradient checkpointing, Chen et al. 2016,
// arXiv:1604.06174), so only the layer's input stays in memory.
//
//   x = CheckpointedLayer(
//       [=](const torch::Tensor& in) { return Layer(layer, in, ...); }, x);
//
// The recomputation runs the same operations on the same inputs, so its
// results, and therefore every gradient, are bit for bit those of a forward
// that kept its activations, provided `run` is deterministic (LoRA dropout
// masks are a function of their seeds, dropout_mask.h). Gradients reach the
// parameters `run` uses (the LoRA matrices) by a nested backward pass in the
// backward of the layer; they accumulate in the parameters' .grad, so the
// outer backward must be torch::autograd::backward (or .backward()), not
// torch::autograd::grad. `run` must keep alive what it captures until that
// backward pass.
#ifndef LORAPLEX_CORE_MODEL_LAYER_CHECKPOINT_H_
#define LORAPLEX_CORE_MODEL_LAYER_CHECKPOINT_H_

#include <torch/types.h>

#include <functional>

namespace loraplex {

using LayerFn = std::function<torch::Tensor(const torch::Tensor&)>;

// run(x) whose backward recomputes run. With grad mode off it is run(x).
torch::Tensor CheckpointedLayer(LayerFn run, const torch::Tensor& x);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_LAYER_CHECKPOINT_H_
