// Results of calls that finish later, keyed by (owner, sequence id): the
// one place a caller waits for one, with or without a deadline (a long
// poll), and where finished results are kept for repeats and late readers.
// Training sessions keep their operations' results here (RetrieveResult, a
// repeated seq_id) and the Tinker API its futures (retrieve_future), the
// sampler's included. No gRPC, no LibTorch.
//
//   ResultHub<Outcome> hub(options);
//   hub.Expect({"session-1", 7});                 // Wait now waits.
//   hub.Wait({"session-1", 7}, std::chrono::seconds(30),
//            [](absl::StatusOr<std::optional<Outcome>> r) {...});
//   hub.Put({"session-1", 7}, outcome);           // Answers the waiters.
//
// A waiter gets the result once it is put, std::nullopt when its wait ends
// first, NOT_FOUND for a key neither expected nor kept, and UNAVAILABLE
// when the hub stops while it waits with a deadline (waiters without one,
// the callers of the operation itself, are answered by its Put). Finished
// results are kept (Options) the newest `max_kept_per_owner` of an owner,
// for `kept_for` after they are put and for `kept_after_delivery` after a
// long poll first delivered them. Callbacks run outside the hub's lock, on
// the caller's thread, the putter's or the hub's timer thread; they must
// return quickly. Thread-safe.
#ifndef LORAPLEX_SERVER_RESULTS_RESULT_HUB_H_
#define LORAPLEX_SERVER_RESULTS_RESULT_HUB_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loraplex {

struct ResultKey {
  std::string owner;  // A session's id, a tenant, ...
  int64_t seq = 0;    // Ordered within the owner: older results go first.

  friend bool operator<(const ResultKey& a, const ResultKey& b) {
    return std::tie(a.owner, a.seq) < std::tie(b.owner, b.seq);
  }
};

struct ResultHubOptions {
  // Finished results kept per owner, the newest first; 0: no limit.
  int64_t max_kept_per_owner = 0;
  // How long a finished result is kept; 0: until max_kept_per_owner drops
  // it.
  std::chrono::milliseconds kept_for{0};
  // How long it is kept once a long poll delivered it (a client whose
  // answer was lost on the way asks again); 0: as kept_for.
  std::chrono::milliseconds kept_after_delivery{0};
};

template <typename T>
class ResultHub {
 public:
  using Answer = absl::StatusOr<std::optional<T>>;
  using Waiter = std::function<void(Answer)>;
  enum class State {
    kUnknown,   // Neither expected nor kept.
    kPending,   // Expected, not put yet.
    kFinished,  // Put and still kept.
  };

  explicit ResultHub(ResultHubOptions options)
      : options_(options), timer_([this] { RunTimer(); }) {}
  ~ResultHub() {
    Stop();
    timer_.join();
  }
  ResultHub(const ResultHub&) = delete;
  ResultHub& operator=(const ResultHub&) = delete;

  // Answers the waiters with a deadline UNAVAILABLE and refuses new ones,
  // so that a server shutting down has no long poll left waiting.
  // Idempotent.
  void Stop() {
    std::vector<Waiter> answered;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      for (auto& [key, entry] : entries_) {
        for (auto it = entry.waiters.begin(); it != entry.waiters.end();) {
          if (it->deadline.has_value()) {
            answered.push_back(std::move(it->done));
            it = entry.waiters.erase(it);
          } else {
            ++it;
          }
        }
      }
      wake_.SignalAll();
    }
    for (Waiter& done : answered) done(Stopped());
  }

  // Announces the result of `key`: Wait on it waits for its Put.
  void Expect(const ResultKey& key) {
    absl::MutexLock lock(&mu_);
    Drop(Now());
    entries_.try_emplace(key);
  }

  // Finishes `key` with `value` (once; a second Put is ignored) and
  // answers everyone waiting on it.
  void Put(const ResultKey& key, T value) {
    std::vector<Waiter> answered;
    std::optional<T> kept;
    {
      absl::MutexLock lock(&mu_);
      const auto now = Now();
      Entry& entry = entries_[key];
      if (entry.value.has_value()) return;
      entry.value = std::move(value);
      entry.finished = now;
      for (WaitingCall& waiting : entry.waiters) {
        if (waiting.deadline.has_value()) MarkDelivered(entry, now);
        answered.push_back(std::move(waiting.done));
      }
      entry.waiters.clear();
      kept = entry.value;
      KeepNewest(key.owner);
      Drop(now);
    }
    for (Waiter& done : answered) done(Answer(kept));
  }

  // Where `key` stands, and its value when finished.
  State Find(const ResultKey& key, T* value = nullptr) {
    absl::MutexLock lock(&mu_);
    Drop(Now());
    auto it = entries_.find(key);
    if (it == entries_.end()) return State::kUnknown;
    if (!it->second.value.has_value()) return State::kPending;
    if (value != nullptr) *value = *it->second.value;
    return State::kFinished;
  }

  // Hands `done` the result of `key`: now when it is kept, once it is put
  // when it is expected, or std::nullopt when `wait` ends first (no
  // `wait`: no deadline). NOT_FOUND when `key` is unknown.
  void Wait(const ResultKey& key, std::optional<std::chrono::milliseconds> wait,
            Waiter done) {
    Answer answer = std::optional<T>();
    {
      absl::MutexLock lock(&mu_);
      const auto now = Now();
      Drop(now);
      auto it = entries_.find(key);
      if (it == entries_.end()) {
        answer = absl::NotFoundError("no such result");
      } else if (it->second.value.has_value()) {
        if (wait.has_value()) MarkDelivered(it->second, now);
        answer = it->second.value;
      } else if (wait.has_value() && stopped_) {
        answer = Stopped();
      } else if (wait.has_value() && wait->count() <= 0) {
        // Not finished, and no time to wait.
      } else {
        std::optional<Clock::time_point> deadline;
        if (wait.has_value()) deadline = now + *wait;
        it->second.waiters.push_back({std::move(done), deadline});
        if (deadline.has_value()) wake_.SignalAll();
        return;
      }
    }
    done(std::move(answer));
  }

  // Forgets every result of `owner`, answering its waiters UNAVAILABLE.
  void ForgetOwner(const std::string& owner) {
    std::vector<Waiter> answered;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.lower_bound(ResultKey{owner, INT64_MIN});
      while (it != entries_.end() && it->first.owner == owner) {
        for (WaitingCall& waiting : it->second.waiters) {
          answered.push_back(std::move(waiting.done));
        }
        it = entries_.erase(it);
      }
    }
    for (Waiter& done : answered) {
      done(absl::UnavailableError("the result is no longer kept"));
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct WaitingCall {
    Waiter done;
    std::optional<Clock::time_point> deadline;
  };
  struct Entry {
    std::optional<T> value;
    Clock::time_point finished;
    std::optional<Clock::time_point> delivered;
    std::vector<WaitingCall> waiters;
  };

  static Clock::time_point Now() { return Clock::now(); }
  static absl::Status Stopped() {
    return absl::UnavailableError("the server is shutting down");
  }
  static void MarkDelivered(Entry& entry, Clock::time_point now) {
    if (!entry.delivered.has_value()) entry.delivered = now;
  }

  // Drops the finished results past their time.
  void Drop(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.kept_for.count() <= 0 &&
        options_.kept_after_delivery.count() <= 0) {
      return;
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      const Entry& entry = it->second;
      bool expired = false;
      if (entry.value.has_value()) {
        expired = options_.kept_for.count() > 0 &&
                  now - entry.finished > options_.kept_for;
        if (entry.delivered.has_value() &&
            options_.kept_after_delivery.count() > 0) {
          expired =
              expired || now - *entry.delivered > options_.kept_after_delivery;
        }
      }
      it = expired ? entries_.erase(it) : std::next(it);
    }
  }

  // Drops `owner`'s oldest finished results beyond max_kept_per_owner.
  void KeepNewest(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.max_kept_per_owner <= 0) return;
    const auto first = entries_.lower_bound(ResultKey{owner, INT64_MIN});
    int64_t finished = 0;
    for (auto it = first; it != entries_.end() && it->first.owner == owner;
         ++it) {
      if (it->second.value.has_value()) ++finished;
    }
    for (auto it = first; finished > options_.max_kept_per_owner &&
                          it != entries_.end() && it->first.owner == owner;) {
      if (it->second.value.has_value()) {
        it = entries_.erase(it);
        --finished;
      } else {
        ++it;
      }
    }
  }

  // Answers std::nullopt to each waiter whose deadline passed.
  void RunTimer() {
    absl::MutexLock lock(&mu_);
    while (!stopped_) {
      const auto now = Now();
      std::vector<Waiter> expired;
      std::optional<Clock::time_point> next;
      for (auto& [key, entry] : entries_) {
        for (auto it = entry.waiters.begin(); it != entry.waiters.end();) {
          if (it->deadline.has_value() && *it->deadline <= now) {
            expired.push_back(std::move(it->done));
            it = entry.waiters.erase(it);
            continue;
          }
          if (it->deadline.has_value() && (!next || *it->deadline < *next)) {
            next = *it->deadline;
          }
          ++it;
        }
      }
      if (!expired.empty()) {
        mu_.Unlock();
        for (Waiter& done : expired) done(std::optional<T>());
        mu_.Lock();
        continue;
      }
      if (next) {
        wake_.WaitWithTimeout(&mu_, absl::FromChrono(*next - Now()));
      } else {
        wake_.Wait(&mu_);
      }
    }
  }

  const ResultHubOptions options_;
  absl::Mutex mu_;
  absl::CondVar wake_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::map<ResultKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;  // Last: it starts with the rest set.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_RESULTS_RESULT_HUB_H_
