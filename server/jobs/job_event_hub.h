// Wakes the watchers of a job when new events of it are stored, so
// WatchJob streams can read them without polling.
//
//   int64_t token = hub.Subscribe(job_id, [reactor] { reactor->Wake(); });
//   ... store events, then hub.Notify(job_id) ...
//   hub.Unsubscribe(token);
//
// Listeners run on the notifying thread while the hub's lock is held: they
// must be quick and must not call back into the hub. Unsubscribe returns
// only when no call of that listener is running, so a listener's owner may
// be destroyed right after it.
#ifndef LORAPLEX_SERVER_JOBS_JOB_EVENT_HUB_H_
#define LORAPLEX_SERVER_JOBS_JOB_EVENT_HUB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"

namespace loraplex {

class JobEventHub {
 public:
  using Listener = std::function<void()>;

  int64_t Subscribe(const std::string& job_id, Listener listener);
  void Unsubscribe(int64_t token);
  void Notify(const std::string& job_id);
  // Wakes every listener (e.g. at shutdown).
  void NotifyAll();

 private:
  struct Entry {
    std::string job_id;
    Listener listener;
  };
  absl::Mutex mu_;
  int64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Entry> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_EVENT_HUB_H_
