// What the server runs on (v1::Runtime) as labelled lines: the server's
// --version and start-up log and `loraplex info` all write it this way.
#ifndef LORAPLEX_PROTO_RUNTIME_TEXT_H_
#define LORAPLEX_PROTO_RUNTIME_TEXT_H_

#include <string>
#include <utility>
#include <vector>

#include "loraplex/v1/server.pb.h"

namespace loraplex {

// {"LibTorch", "2.15.0, CUDA runtime 13.2"}, {"BLAS", ...}, {"CPU", ...},
// then {"CUDA", "not available (...)"} or one {"CUDA device N", ...} each.
std::vector<std::pair<std::string, std::string>> RuntimeFacts(
    const v1::Runtime& runtime);

// The same as "Label: text" lines.
std::vector<std::string> RuntimeLines(const v1::Runtime& runtime);

}  // namespace loraplex

#endif  // LORAPLEX_PROTO_RUNTIME_TEXT_H_
