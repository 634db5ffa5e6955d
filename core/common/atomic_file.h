// Writing files so that readers (and a crash) see either the old contents or
// the complete new ones, never a torn file.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto file, AtomicFileWriter::Create(path));
//   LORAPLEX_RETURN_IF_ERROR(file->Append(data, size));
//   LORAPLEX_RETURN_IF_ERROR(file->Commit());
//
// Data goes to a temporary file in the same directory; Commit() fsyncs it,
// renames it over `path` and fsyncs the directory. A writer destroyed without
// a successful Commit() removes its temporary file and leaves `path` alone.
#ifndef LORAPLEX_CORE_COMMON_ATOMIC_FILE_H_
#define LORAPLEX_CORE_COMMON_ATOMIC_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(
      const std::string& path);

  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t size);
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);

  std::string path_;
  std::string temp_path_;
  int fd_;  // -1 once closed.
  bool committed_ = false;
};

// Replaces `path` with `contents` atomically (see AtomicFileWriter).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// fsync(2) on a directory, so renames and new entries in it are durable.
absl::Status FsyncDirectory(const std::string& dir);

// Moves the directory `staged`, whose files are complete and durable (e.g.
// written with WriteFileAtomically), to `path`: any old `path` is removed
// first (a leftover of an interrupted run), then `staged` is renamed and the
// parent directory fsynced. Readers never see a half-written `path`.
absl::Status PublishDirectory(const std::string& staged,
                              const std::string& path);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_ATOMIC_FILE_H_
