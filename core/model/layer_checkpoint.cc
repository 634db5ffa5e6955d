#include "core/model/layer_checkpoint.h"

#include <torch/torch.h>

#include <utility>

namespace loraplex {
namespace {

// The layer's function, carried to the backward pass in the autograd
// context (an IValue capsule holds any CustomClassHolder).
struct LayerClosure : torch::CustomClassHolder {
  explicit LayerClosure(LayerFn fn) : run(std::move(fn)) {}
  LayerFn run;
};

class Recompute : public torch::autograd::Function<Recompute> {
 public:
  // `anchor` requires grad, so the output does even when x does not (the
  // first layer's input, an embedding of frozen weights): the parameters
  // inside the layer are what need this node's backward then.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x,
                               const torch::Tensor& anchor,
                               c10::intrusive_ptr<LayerClosure> closure) {
    (void)anchor;
    ctx->save_for_backward({x});
    ctx->saved_data["run"] = c10::IValue::make_capsule(closure);
    // Function::apply runs forward with grad mode off: nothing is kept.
    return closure->run(x);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    auto closure = c10::static_intrusive_pointer_cast<LayerClosure>(
        ctx->saved_data["run"].toCapsule());
    torch::Tensor input = x.detach();
    if (x.requires_grad()) input.requires_grad_(true);
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      output = closure->run(input);
    }
    torch::autograd::backward({output}, {grads[0]});
    return {x.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CheckpointedLayer(LayerFn run, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled()) return run(x);
  const torch::Tensor anchor =
      torch::empty({}, x.options().requires_grad(true));
  return Recompute::apply(x, anchor,
                          c10::make_intrusive<LayerClosure>(std::move(run)));
}

}  // namespace loraplex
