// What the server runs on (RuntimeInfo) as labelled lines: the server's
// --version and start-up log and `loraplex info` all write it this way (the
// client converts GetServerInfo's v1::Runtime back into a RuntimeInfo).
#ifndef LORAPLEX_CORE_RUNTIME_RUNTIME_TEXT_H_
#define LORAPLEX_CORE_RUNTIME_RUNTIME_TEXT_H_

#include <string>
#include <utility>
#include <vector>

#include "core/runtime/runtime_info.h"

namespace loraplex {

// {"LibTorch", "2.15.0, CUDA runtime 13.2"}, {"BLAS", ...}, {"CPU", ...},
// then {"CUDA", "not available (...)"} or one {"CUDA device N", ...} each.
std::vector<std::pair<std::string, std::string>> RuntimeFacts(
    const RuntimeInfo& runtime);

// The same as "Label: text" lines.
std::vector<std::string> RuntimeLines(const RuntimeInfo& runtime);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_RUNTIME_TEXT_H_
