#include "server/common/work_queue.h"

#include <utility>

namespace loraplex {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void WorkQueue::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
  }
  wake_.notify_one();
}

void WorkQueue::Run() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // Stopping and drained.
      work = std::move(work_.front());
      work_.pop_front();
    }
    work();
  }
}

}  // namespace loraplex
