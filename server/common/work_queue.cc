#include "server/common/work_queue.h"

#include <utility>

namespace loraplex {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  for (std::thread& thread : threads_) thread.join();
}

void WorkQueue::Post(std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    work_.push_back(std::move(work));
  }
  wake_.Signal();
}

void WorkQueue::Run() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && work_.empty()) wake_.Wait(&mu_);
      if (work_.empty()) return;  // Stopping and drained.
      work = std::move(work_.front());
      work_.pop_front();
    }
    work();
  }
}

}  // namespace loraplex
