// Reading a program file into memory, for the compiler's `planc dump` and the runtime's loader.
// Refuses a directory, a FIFO or a device; stops reading as soon as the first 8 bytes lack the
// FlatBuffers file identifier "PPLN" (the decoder then says "not a paraplan program"), so
// `/dev/zero` or a huge unrelated file is not read to the end; refuses more than 2 GiB, the
// FlatBuffers limit. Header-only (paraplan_format is an interface library).
#ifndef PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_
#define PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/format/input_file.h"

namespace paraplan::prog {

inline constexpr uint64_t kMaxProgramBytes = uint64_t{1} << 31;

// False with `error` set ("is a directory", "cannot open", "holds more than 2 GiB") when the
// file cannot be read; true otherwise, with `bytes` holding the file (or its first bytes when
// they are not a program).
inline bool ReadProgramFile(const std::string& path, std::vector<uint8_t>* bytes,
                            std::string* error) {
  std::string why;
  const int fd = OpenRegularFile(path, &why);  // a FIFO or a device is refused unread
  if (fd < 0) {
    *error = why.rfind("it is ", 0) == 0 ? why : "cannot open it: " + why;
    return false;
  }
  bytes->clear();
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      *error = "reading it failed";
      return false;
    }
    if (n == 0) break;
    bytes->insert(bytes->end(), chunk, chunk + n);
    if (bytes->size() >= 8 && std::memcmp(bytes->data() + 4, "PPLN", 4) != 0) break;
    if (bytes->size() > kMaxProgramBytes) {
      ::close(fd);
      *error = "it holds more than 2 GiB, more than a program file can";
      return false;
    }
  }
  ::close(fd);
  return true;
}

}  // namespace paraplan::prog

#endif  // PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_
