// A few worker threads for slow request work (parsing an uploaded dataset,
// preparing a job's sequences) so gRPC handler threads return at once.
//
//   WorkQueue work(2);
//   work.Post([reactor] { ...; reactor->Finish(status); });
//
// The destructor runs what was already posted, then joins.
#ifndef LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_
#define LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace loraplex {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Post(std::function<void()> work);

 private:
  void Run();

  absl::Mutex mu_;
  absl::CondVar wake_;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_
