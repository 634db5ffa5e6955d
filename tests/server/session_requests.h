// Requests of training sessions for the server tests: a session's
// settings, cross_entropy data over the byte tokenizer's ids, and steps.
#ifndef LORAPLEX_TESTS_SERVER_SESSION_REQUESTS_H_
#define LORAPLEX_TESTS_SERVER_SESSION_REQUESTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "loraplex/v1/sessions.pb.h"

namespace loraplex {

inline v1::CreateSessionRequest SessionRequest(v1::OptimizerFamily family,
                                               double lr, uint64_t seed) {
  v1::CreateSessionRequest request;
  request.mutable_lora()->set_rank(8);
  request.mutable_lora()->set_alpha(16);
  request.mutable_optimizer()->set_family(family);
  request.mutable_optimizer()->set_lr(lr);
  request.set_seed(seed);
  return request;
}

// The byte tokenizer's ids: BOS, then the bytes of `text`.
inline std::vector<int64_t> Bytes(const std::string& text) {
  std::vector<int64_t> ids = {256};
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// A cross_entropy datum teaching `text` (every next byte, weight 1).
inline v1::Datum TextDatum(const std::string& text) {
  const std::vector<int64_t> ids = Bytes(text);
  v1::Datum datum;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    datum.add_input_ids(ids[i]);
    datum.add_target_tokens(ids[i + 1]);
    datum.add_weights(1.0f);
  }
  return datum;
}

inline v1::ForwardBackwardRequest CrossEntropy(const std::string& session,
                                               int64_t seq_id) {
  v1::ForwardBackwardRequest request;
  request.set_session(session);
  request.set_seq_id(seq_id);
  request.set_loss_fn("cross_entropy");
  *request.add_data() = TextDatum("hello world");
  *request.add_data() = TextDatum("sessions");
  return request;
}

inline v1::OptimStepRequest Step(const std::string& session, int64_t seq_id,
                                 double lr) {
  v1::OptimStepRequest request;
  request.set_session(session);
  request.set_seq_id(seq_id);
  request.set_lr(lr);
  return request;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_SESSION_REQUESTS_H_
