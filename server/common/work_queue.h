// A few worker threads for slow request work (parsing an uploaded dataset,
// preparing a job's sequences) so gRPC handler threads return at once.
//
//   WorkQueue work(2);
//   work.Post([reactor] { ...; reactor->Finish(status); });
//
// The destructor runs what was already posted, then joins.
#ifndef LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_
#define LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> work_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_COMMON_WORK_QUEUE_H_
