// How many sampling requests each tenant has in flight, across the APIs
// that sample (gRPC Sample/StreamSample, the OpenAI API): one quota per
// tenant, whichever edge its requests come through. Thread-safe.
//
//   LORAPLEX_RETURN_IF_ERROR(admissions->Enter(tenant));
//   ... when the request is answered:
//   admissions->Leave(tenant);
#ifndef LORAPLEX_SERVER_EDGES_SAMPLE_ADMISSIONS_H_
#define LORAPLEX_SERVER_EDGES_SAMPLE_ADMISSIONS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace loraplex {

class SampleAdmissions {
 public:
  explicit SampleAdmissions(int64_t limit) : limit_(limit) {}

  // RESOURCE_EXHAUSTED when `tenant` has `limit` requests in flight.
  absl::Status Enter(const std::string& tenant);
  void Leave(const std::string& tenant);

 private:
  const int64_t limit_;
  absl::Mutex mu_;
  std::map<std::string, int64_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_SAMPLE_ADMISSIONS_H_
