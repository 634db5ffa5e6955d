#include "server/common/logger.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "core/common/enum_names.h"

namespace loraplex {

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

std::optional<LogLevel> ParseLogLevel(absl::string_view name) {
  return ParseEnumName(name, kAllLogLevels, &LogLevelName);
}

void Logger::Write(LogLevel level, absl::string_view line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  static constexpr const char* kTags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  absl::MutexLock lock(&mu_);
  std::fprintf(stderr, "%s.%03dZ %s %.*s\n", stamp, millis,
               kTags[static_cast<int>(level)], static_cast<int>(line.size()),
               line.data());
  std::fflush(stderr);
}

}  // namespace loraplex
