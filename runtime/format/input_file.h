// Opening and reading input files without hanging on special files, shared by the compiler and
// the runtime (header-only).
//
// Every path the tools read (plan files, program files, data, checkpoints) goes through
// OpenRegularFile: it opens without blocking (a FIFO with no writer would otherwise block
// forever), then refuses anything that is not a regular file (FIFOs, character and block
// devices such as /dev/zero, sockets, directories) with a reason. ReadRegularFile also bounds
// the bytes read, so a file that grows while it is read cannot exhaust memory.
#ifndef PARAPLAN_RUNTIME_FORMAT_INPUT_FILE_H_
#define PARAPLAN_RUNTIME_FORMAT_INPUT_FILE_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace paraplan {

// What kind of file `mode` describes, for messages ("a FIFO", "a directory", ...).
inline const char* FileKindName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// A file descriptor (>= 0, blocking, close-on-exec) of the regular file at `path`, or -1 with
// `error` set ("it is a FIFO, not a regular file", "No such file or directory", ...). `size`
// receives the file's size when given.
inline int OpenRegularFile(const std::string& path, std::string* error, int64_t* size = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = std::string("it is ") + FileKindName(st.st_mode) + ", not a regular file";
    ::close(fd);
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = static_cast<int64_t>(st.st_size);
  return fd;
}

// Reads the regular file at `path` into `out` (replacing it). False with `error` set when the
// file cannot be opened, is not a regular file, holds more than `max_bytes`, or a read fails.
inline bool ReadRegularFile(const std::string& path, uint64_t max_bytes, std::string* out,
                            std::string* error) {
  int64_t size = 0;
  const int fd = OpenRegularFile(path, error, &size);
  if (fd < 0) return false;
  out->clear();
  if (static_cast<uint64_t>(size) > max_bytes) {
    ::close(fd);
    *error = "it holds " + std::to_string(size) + " bytes, more than the " +
             std::to_string(max_bytes) + " allowed";
    return false;
  }
  out->reserve(static_cast<size_t>(size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = std::string("reading it failed: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    if (out->size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      *error = "it holds more than the " + std::to_string(max_bytes) + " bytes allowed";
      return false;
    }
    out->append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

}  // namespace paraplan

#endif  // PARAPLAN_RUNTIME_FORMAT_INPUT_FILE_H_
