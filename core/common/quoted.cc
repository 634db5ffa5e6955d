#include "core/common/quoted.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace loraplex {

std::string Quoted(absl::string_view text) {
  constexpr size_t kMaxChars = 100;
  const bool cut = text.size() > kMaxChars;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxChars)),
                      cut ? "...\"" : "\"");
}

}  // namespace loraplex
