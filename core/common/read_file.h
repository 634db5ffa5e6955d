// Reading a whole file into memory: the one reader the project uses, so
// every caller reports a missing or unreadable file the same way.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
#ifndef LORAPLEX_CORE_COMMON_READ_FILE_H_
#define LORAPLEX_CORE_COMMON_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace loraplex {

// The file's bytes. NOT_FOUND "<path>: cannot be read" when it cannot be
// opened (missing, a directory's permissions, ...), DATA_LOSS "<path>: read
// failed" when reading it fails part way.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_READ_FILE_H_
