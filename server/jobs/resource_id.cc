#include "server/jobs/resource_id.h"

#include <random>

#include "absl/strings/str_cat.h"

namespace loraplex {

std::string NewResourceId(absl::string_view prefix) {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuv";
  std::random_device entropy;
  std::string id = absl::StrCat(prefix, "-");
  for (int i = 0; i < 4; ++i) {
    uint32_t bits = entropy();
    for (int j = 0; j < 4; ++j) {
      id += kAlphabet[bits & 31];
      bits >>= 5;
    }
  }
  return id;
}

}  // namespace loraplex
