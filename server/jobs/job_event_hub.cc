#include "server/jobs/job_event_hub.h"

#include <utility>

namespace loraplex {

int64_t JobEventHub::Subscribe(const std::string& job_id, Listener listener) {
  absl::MutexLock lock(&mu_);
  const int64_t token = next_token_++;
  listeners_[token] = Entry{job_id, std::move(listener)};
  return token;
}

void JobEventHub::Unsubscribe(int64_t token) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(token);
}

void JobEventHub::Notify(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [token, entry] : listeners_) {
    if (entry.job_id == job_id) entry.listener();
  }
}

void JobEventHub::NotifyAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [token, entry] : listeners_) entry.listener();
}

}  // namespace loraplex
