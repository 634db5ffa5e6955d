// Tinker wire requests the server tests send: a cross_entropy
// forward_backward over one datum, encoded as the tinker SDK encodes it
// (int32 tokens, dense int64 targets and float32 weights).
#ifndef LORAPLEX_TESTS_SERVER_TINKER_REQUESTS_H_
#define LORAPLEX_TESTS_SERVER_TINKER_REQUESTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tinker/tinker_public.pb.h"

namespace loraplex {

// Position i of `input` predicts targets[i] with weight 1.
inline tinker_public::ForwardBackwardRequest TinkerCrossEntropyRequest(
    const std::string& model_id, int64_t seq_id,
    const std::vector<int32_t>& input, const std::vector<int64_t>& targets,
    bool forward_only = false) {
  const std::vector<float> weights(targets.size(), 1.0f);
  tinker_public::ForwardBackwardRequest request;
  request.set_model_id(model_id);
  request.set_seq_id(seq_id);
  request.set_loss_fn("cross_entropy");
  request.set_forward_only(forward_only);
  tinker_public::Datum* datum = request.add_data();
  datum->add_model_input()->mutable_encoded_text()->set_tokens(
      std::string(reinterpret_cast<const char*>(input.data()),
                  input.size() * sizeof(int32_t)));
  tinker_public::Tensor& t =
      (*datum->mutable_loss_fn_inputs())["target_tokens"];
  t.set_dtype(tinker_public::DTYPE_INT64);
  t.set_dense(std::string(reinterpret_cast<const char*>(targets.data()),
                          targets.size() * sizeof(int64_t)));
  t.add_shape(static_cast<int64_t>(targets.size()));
  tinker_public::Tensor& w = (*datum->mutable_loss_fn_inputs())["weights"];
  w.set_dtype(tinker_public::DTYPE_FLOAT32);
  w.set_dense(std::string(reinterpret_cast<const char*>(weights.data()),
                          weights.size() * sizeof(float)));
  w.add_shape(static_cast<int64_t>(weights.size()));
  return request;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_TINKER_REQUESTS_H_
