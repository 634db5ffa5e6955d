// Exceptions as Status text: LibTorch throws c10::Error, whose what() ends
// in the C++ source location and a backtrace that must not reach job errors
// or API replies. The one place that turns a caught exception into words.
//
//   absl::Status status = CatchTorch("export", [&] { return Export(); });
//   } catch (const std::exception& e) { ... ExceptionMessage(e) ... }
#ifndef LORAPLEX_CORE_RUNTIME_EXCEPTION_MESSAGE_H_
#define LORAPLEX_CORE_RUNTIME_EXCEPTION_MESSAGE_H_

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// c10::Error's message without backtrace or source location; what() of any
// other exception.
std::string ExceptionMessage(const std::exception& error);

// Runs `fn` (returning a Status or StatusOr); an exception becomes
// INTERNAL "<what>: <ExceptionMessage>".
template <typename Fn>
auto CatchTorch(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& error) {
    return absl::InternalError(
        absl::StrCat(what, ": ", ExceptionMessage(error)));
  }
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_EXCEPTION_MESSAGE_H_
