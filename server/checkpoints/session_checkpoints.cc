#include "server/checkpoints/session_checkpoints.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "seq-";

// The seq_id a published directory's name carries, or -1 (a staged
// leftover, or anything else).
int64_t SeqOfName(const std::string& name) {
  if (!absl::StartsWith(name, kPrefix)) return -1;
  int64_t seq = -1;
  if (!absl::SimpleAtoi(name.substr(sizeof(kPrefix) - 1), &seq)) return -1;
  return seq;
}

}  // namespace

std::string SessionCheckpointDir(const std::string& root,
                                 const std::string& session_id,
                                 int64_t seq_id) {
  return absl::StrFormat("%s/%s/%s%012d", root, session_id, kPrefix, seq_id);
}

std::optional<SessionCheckpoint> LatestSessionCheckpoint(
    const std::string& root, const std::string& session_id) {
  std::optional<SessionCheckpoint> latest;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(root) / session_id, error)) {
    const int64_t seq = SeqOfName(entry.path().filename().string());
    if (seq < 0 || !entry.is_directory(error)) continue;
    if (!latest || seq > latest->seq_id) {
      latest = SessionCheckpoint{seq, entry.path().string()};
    }
  }
  return latest;
}

void RemoveSessionCheckpointsBefore(const std::string& root,
                                    const std::string& session_id,
                                    int64_t seq_id) {
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(root) / session_id, error)) {
    const int64_t seq = SeqOfName(entry.path().filename().string());
    if (seq >= seq_id) continue;
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

void RemoveSessionCheckpoints(const std::string& root,
                              const std::string& session_id) {
  std::error_code ignored;
  fs::remove_all(fs::path(root) / session_id, ignored);
}

}  // namespace loraplex
