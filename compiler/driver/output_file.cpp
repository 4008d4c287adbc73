#include "compiler/driver/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace paraplan {
namespace {

namespace fs = std::filesystem;

// Writes all of `bytes` to `fd`; false with `error` set on a short or failed write.
bool WriteAll(int fd, std::string_view bytes, const std::string& path, std::string* error) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = "cannot write '" + path + "': " + std::strerror(n < 0 ? errno : EIO);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool WriteInPlace(const std::string& path, std::string_view bytes, std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) {
    *error = "cannot open '" + path + "' for writing: " + std::strerror(errno);
    return false;
  }
  bool ok = WriteAll(fd, bytes, path, error);
  if (::close(fd) != 0 && ok) {
    *error = "cannot write '" + path + "': " + std::strerror(errno);
    ok = false;
  }
  return ok;
}

}  // namespace

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec) && !ec;
}

std::string SourceFileAt(const SourceManager& sm, const std::string& path) {
  for (uint32_t b = 1; b <= sm.BufferCount(); ++b) {
    if (sm.Kind(b) == BufferKind::kCommandLine) continue;
    const std::string name(sm.Name(b));
    if (SameFile(path, name)) return name;
  }
  return "";
}

bool WriteOutputFile(const std::string& path, std::string_view bytes, std::string* error) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);  // follows symbolic links
  if (fs::is_directory(status)) {
    *error = "cannot write '" + path + "': it is a directory";
    return false;
  }
  if (fs::exists(status) && !fs::is_regular_file(status)) return WriteInPlace(path, bytes, error);
  // A link to a regular file: replace the target, keep the link.
  std::string target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path resolved = fs::canonical(path, ec);
    if (!ec) target = resolved.string();
  }
  const std::string tmp = target + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd < 0) {
    *error = "cannot write '" + path + "': " + std::strerror(errno);
    return false;
  }
  bool ok = WriteAll(fd, bytes, path, error);
  if (ok && ::fsync(fd) != 0 && errno != EINVAL) {
    *error = "cannot write '" + path + "': " + std::strerror(errno);
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    *error = "cannot write '" + path + "': " + std::strerror(errno);
    ok = false;
  }
  if (ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
    *error = "cannot rename '" + tmp + "' to '" + target + "': " + std::strerror(errno);
    ok = false;
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace paraplan
