// Reading a program file into memory, for the compiler's `planc dump` and the runtime's loader.
// Refuses a directory; stops reading as soon as the first 8 bytes lack the FlatBuffers file
// identifier "PPLN" (the decoder then says "not a paraplan program"), so `/dev/zero` or a huge
// unrelated file is not read to the end; refuses more than 2 GiB, the FlatBuffers limit.
// Header-only (paraplan_format is an interface library).
#ifndef PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_
#define PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace paraplan::prog {

inline constexpr uint64_t kMaxProgramBytes = uint64_t{1} << 31;

// False with `error` set ("is a directory", "cannot open", "holds more than 2 GiB") when the
// file cannot be read; true otherwise, with `bytes` holding the file (or its first bytes when
// they are not a program).
inline bool ReadProgramFile(const std::string& path, std::vector<uint8_t>* bytes, std::string* error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    *error = "it is a directory, not a program file";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open it";
    return false;
  }
  bytes->clear();
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    bytes->insert(bytes->end(), chunk, chunk + in.gcount());
    if (bytes->size() >= 8 && std::memcmp(bytes->data() + 4, "PPLN", 4) != 0) return true;
    if (bytes->size() > kMaxProgramBytes) {
      *error = "it holds more than 2 GiB, more than a program file can";
      return false;
    }
  }
  if (in.bad()) {
    *error = "reading it failed";
    return false;
  }
  return true;
}

}  // namespace paraplan::prog

#endif  // PARAPLAN_RUNTIME_FORMAT_READ_PROGRAM_H_
