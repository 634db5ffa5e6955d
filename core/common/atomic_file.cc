#include "core/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status FsyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return IoError("cannot open directory", dir);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return IoError("cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status PublishDirectory(const std::string& staged,
                              const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::remove_all(path, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot remove ", path, ": ", error.message()));
  }
  LORAPLEX_RETURN_IF_ERROR(FsyncDirectory(staged));
  if (::rename(staged.c_str(), path.c_str()) != 0) {
    return IoError(absl::StrCat("cannot rename ", staged, " to"), path);
  }
  const fs::path parent = fs::path(path).parent_path();
  return FsyncDirectory(parent.empty() ? "." : parent.string());
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& path) {
  std::random_device entropy;
  std::string temp_path = absl::StrCat(path, ".tmp.", ::getpid(), ".",
                                       static_cast<uint32_t>(entropy()));
  int fd =
      ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot create", temp_path);
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(path, std::move(temp_path), fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path,
                                   int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(temp_path_, ": already closed"));
  }
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot write", temp_path_);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(temp_path_, ": already closed"));
  }
  if (::fsync(fd_) != 0) return IoError("cannot fsync", temp_path_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return IoError("cannot close", temp_path_);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return IoError("cannot rename into", path_);
  }
  committed_ = true;
  const std::filesystem::path target(path_);
  return FsyncDirectory(target.has_parent_path() ? target.parent_path().string()
                                                 : ".");
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file,
                            AtomicFileWriter::Create(path));
  LORAPLEX_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
  return file->Commit();
}

}  // namespace loraplex
