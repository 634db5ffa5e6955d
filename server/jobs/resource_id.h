// Fresh resource ids: a kind prefix and 16 random lowercase base-32
// characters ("job-k3v9q0d2m7x1c8fa"), unguessable so one tenant cannot
// probe another's ids.
#ifndef LORAPLEX_SERVER_JOBS_RESOURCE_ID_H_
#define LORAPLEX_SERVER_JOBS_RESOURCE_ID_H_

#include <string>

#include "absl/strings/string_view.h"

namespace loraplex {

std::string NewResourceId(absl::string_view prefix);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_RESOURCE_ID_H_
