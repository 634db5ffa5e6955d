#include "server/edges/sample_admissions.h"

#include "absl/strings/str_cat.h"

namespace loraplex {

absl::Status SampleAdmissions::Enter(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  int64_t& count = in_flight_[tenant];
  if (count >= limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("at most ", limit_,
                     " sample requests per tenant may be in flight; retry "
                     "when one has finished"));
  }
  ++count;
  return absl::OkStatus();
}

void SampleAdmissions::Leave(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  if (--in_flight_[tenant] <= 0) in_flight_.erase(tenant);
}

}  // namespace loraplex
