// Line-oriented server log on stderr: "2026-11-29T21:40:03.120Z INFO job
// job-x: QUEUED -> RUNNING (slot 2)". One Logger is created in main and
// passed to the components that log; lines from several threads never
// interleave.
#ifndef LORAPLEX_SERVER_COMMON_LOGGER_H_
#define LORAPLEX_SERVER_COMMON_LOGGER_H_

#include <array>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace loraplex {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

inline constexpr std::array<LogLevel, 4> kAllLogLevels = {
    LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError};

absl::string_view LogLevelName(LogLevel level);  // "debug", "info", ...
std::optional<LogLevel> ParseLogLevel(absl::string_view name);

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kInfo) : level_(level) {}

  bool Enabled(LogLevel level) const { return level >= level_; }
  void Write(LogLevel level, absl::string_view line);

  template <typename... Args>
  void Info(const Args&... args) {
    if (Enabled(LogLevel::kInfo)) Write(LogLevel::kInfo, absl::StrCat(args...));
  }
  template <typename... Args>
  void Warning(const Args&... args) {
    if (Enabled(LogLevel::kWarning)) {
      Write(LogLevel::kWarning, absl::StrCat(args...));
    }
  }
  template <typename... Args>
  void Error(const Args&... args) {
    if (Enabled(LogLevel::kError)) {
      Write(LogLevel::kError, absl::StrCat(args...));
    }
  }
  template <typename... Args>
  void Debug(const Args&... args) {
    if (Enabled(LogLevel::kDebug)) {
      Write(LogLevel::kDebug, absl::StrCat(args...));
    }
  }

 private:
  LogLevel level_;
  absl::Mutex mu_;  // Serializes the lines on stderr.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_COMMON_LOGGER_H_
