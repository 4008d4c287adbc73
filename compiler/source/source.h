// Source buffers and ranges.
//
// A SourceManager owns every text the compiler reads: plan files, stdlib modules, and one
// buffer per `--set` value (named "<command line>"), so that a diagnostic can point at any of
// them the same way. A SourceRange is a half-open byte range [begin, end) in one buffer;
// buffer id 0 means "no location" (values the compiler invented, such as defaults).
//
// Made by the driver; read by the parser (text), the checker (ranges) and the renderers.
#ifndef PARAPLAN_COMPILER_SOURCE_SOURCE_H_
#define PARAPLAN_COMPILER_SOURCE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace paraplan {

// Where a buffer came from; renderers and labels use it ("from --set", "in the stdlib").
enum class BufferKind : uint8_t { kFile, kStdlib, kCommandLine, kMemory };

struct SourceRange {
  uint32_t buffer = 0;  // 0: no location
  uint32_t begin = 0;
  uint32_t end = 0;

  bool IsValid() const { return buffer != 0; }
  friend bool operator==(const SourceRange&, const SourceRange&) = default;
};

struct LineColumn {
  uint32_t line = 0;    // 1-based
  uint32_t column = 0;  // 1-based, in bytes
};

class SourceManager {
 public:
  SourceManager();
  ~SourceManager();
  SourceManager(const SourceManager&) = delete;
  SourceManager& operator=(const SourceManager&) = delete;

  // Adds a buffer and returns its id (>= 1).
  uint32_t AddBuffer(std::string name, std::string text, BufferKind kind);
  // Reads a file into a new buffer; nullopt (and `error` set) when it cannot be read, is a
  // directory, or holds more than kMaxFileBytes (so `/dev/zero` is refused, not read forever).
  // `name` is what diagnostics show for it (`<stdlib>/clusters.plan` rather than the build
  // machine's absolute path); the path itself when empty.
  static constexpr size_t kMaxFileBytes = size_t{64} << 20;
  std::optional<uint32_t> AddFile(const std::string& path, BufferKind kind, std::string* error,
                                  std::string name = {});

  size_t BufferCount() const { return buffers_.size(); }
  bool IsValid(SourceRange r) const;
  std::string_view Name(uint32_t buffer) const;
  std::string_view Text(uint32_t buffer) const;
  BufferKind Kind(uint32_t buffer) const;
  // The text a valid range covers; empty for an invalid one.
  std::string_view Slice(SourceRange r) const;

  // Line and column of a byte offset (clamped to the buffer).
  LineColumn Position(uint32_t buffer, uint32_t offset) const;
  // The text of a 1-based line without its newline; empty past the end.
  std::string_view Line(uint32_t buffer, uint32_t line) const;
  uint32_t LineCount(uint32_t buffer) const;

 private:
  struct Buffer {
    std::string name;
    std::string text;
    BufferKind kind;
    std::vector<uint32_t> line_starts;
  };
  const Buffer* Get(uint32_t buffer) const;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_SOURCE_SOURCE_H_
