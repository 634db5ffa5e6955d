// LibTorch reports failures by throwing c10::Error (a std::exception); on
// the trainer thread they stop here as a Status.
//
//   absl::Status status = CatchTorch("export", [&] { return Export(); });
#ifndef LORAPLEX_SERVER_ENGINE_CATCH_TORCH_H_
#define LORAPLEX_SERVER_ENGINE_CATCH_TORCH_H_

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// Runs `fn` (returning a Status or StatusOr); an exception becomes
// INTERNAL "<what>: <its message>".
template <typename Fn>
auto CatchTorch(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(what, ": ", error.what()));
  }
}

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_ENGINE_CATCH_TORCH_H_
