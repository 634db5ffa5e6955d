#include "server/common/request_counters.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace loraplex {

void RequestCounters::Count(absl::string_view transport,
                            absl::string_view method, absl::string_view code) {
  absl::MutexLock lock(&mu_);
  ++counts_[{std::string(transport), std::string(method), std::string(code)}];
}

std::vector<RequestCount> RequestCounters::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<RequestCount> out;
  out.reserve(counts_.size());
  for (const auto& [key, count] : counts_) {
    out.push_back(
        {std::get<0>(key), std::get<1>(key), std::get<2>(key), count});
  }
  return out;
}

namespace {

bool PlainWord(absl::string_view segment) {
  if (segment.empty() || !absl::ascii_islower(segment.front())) return false;
  for (char c : segment) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_' &&
        c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string HttpRoute(absl::string_view path) {
  std::vector<std::string> segments;
  for (absl::string_view segment :
       absl::StrSplit(path, '/', absl::SkipEmpty())) {
    segments.push_back(PlainWord(segment) ? std::string(segment) : "{id}");
  }
  return absl::StrCat("/", absl::StrJoin(segments, "/"));
}

}  // namespace loraplex
