// Wall-clock time as Unix milliseconds, the unit of every stored time.
#ifndef LORAPLEX_SERVER_COMMON_CLOCK_H_
#define LORAPLEX_SERVER_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace loraplex {

inline int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_COMMON_CLOCK_H_
