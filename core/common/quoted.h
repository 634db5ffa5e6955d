// Untrusted text inside an error message: quoted, escaped and cut to a
// readable length, so a 20 kB value or control characters from a request
// never reach a reply as they are.
//
//   absl::StrCat("name must be ..., got ", Quoted(name))  // got "x\n..."
#ifndef LORAPLEX_CORE_COMMON_QUOTED_H_
#define LORAPLEX_CORE_COMMON_QUOTED_H_

#include <string>

#include "absl/strings/string_view.h"

namespace loraplex {

// `text` in double quotes, C-escaped, its first 100 bytes followed by "..."
// when longer.
std::string Quoted(absl::string_view text);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_QUOTED_H_
