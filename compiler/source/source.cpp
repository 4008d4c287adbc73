#include "compiler/source/source.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/format/input_file.h"

namespace paraplan {

SourceManager::SourceManager() = default;
SourceManager::~SourceManager() = default;

uint32_t SourceManager::AddBuffer(std::string name, std::string text, BufferKind kind) {
  auto buf = std::make_unique<Buffer>();
  buf->name = std::move(name);
  buf->text = std::move(text);
  buf->kind = kind;
  buf->line_starts.push_back(0);
  for (uint32_t i = 0; i < buf->text.size(); ++i) {
    if (buf->text[i] == '\n') buf->line_starts.push_back(i + 1);
  }
  buffers_.push_back(std::move(buf));
  return static_cast<uint32_t>(buffers_.size());
}

std::optional<uint32_t> SourceManager::AddFile(const std::string& path, BufferKind kind,
                                               std::string* error, std::string name) {
  // A FIFO, a device (/dev/zero) or a directory is refused before anything is read.
  std::string text, why;
  if (!ReadRegularFile(path, kMaxFileBytes, &text, &why)) {
    if (error)
      *error = why.find("more than") != std::string::npos
                   ? "it holds more than 64 MiB, which is not a plan"
                   : why;
    return std::nullopt;
  }
  return AddBuffer(name.empty() ? path : std::move(name), std::move(text), kind);
}

const SourceManager::Buffer* SourceManager::Get(uint32_t buffer) const {
  if (buffer == 0 || buffer > buffers_.size()) return nullptr;
  return buffers_[buffer - 1].get();
}

bool SourceManager::IsValid(SourceRange r) const {
  const Buffer* b = Get(r.buffer);
  return b && r.begin <= r.end && r.end <= b->text.size();
}

std::string_view SourceManager::Name(uint32_t buffer) const {
  const Buffer* b = Get(buffer);
  return b ? std::string_view(b->name) : std::string_view("<unknown>");
}

std::string_view SourceManager::Text(uint32_t buffer) const {
  const Buffer* b = Get(buffer);
  return b ? std::string_view(b->text) : std::string_view();
}

BufferKind SourceManager::Kind(uint32_t buffer) const {
  const Buffer* b = Get(buffer);
  return b ? b->kind : BufferKind::kMemory;
}

std::string_view SourceManager::Slice(SourceRange r) const {
  if (!IsValid(r)) return {};
  return std::string_view(Get(r.buffer)->text).substr(r.begin, r.end - r.begin);
}

LineColumn SourceManager::Position(uint32_t buffer, uint32_t offset) const {
  const Buffer* b = Get(buffer);
  if (!b) return {0, 0};
  offset = std::min<uint32_t>(offset, b->text.size());
  auto it = std::upper_bound(b->line_starts.begin(), b->line_starts.end(), offset);
  uint32_t line = static_cast<uint32_t>(it - b->line_starts.begin());
  return {line, offset - b->line_starts[line - 1] + 1};
}

std::string_view SourceManager::Line(uint32_t buffer, uint32_t line) const {
  const Buffer* b = Get(buffer);
  if (!b || line == 0 || line > b->line_starts.size()) return {};
  uint32_t begin = b->line_starts[line - 1];
  uint32_t end = line < b->line_starts.size() ? b->line_starts[line] - 1 : b->text.size();
  std::string_view text(b->text);
  std::string_view s = text.substr(begin, end - begin);
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

uint32_t SourceManager::LineCount(uint32_t buffer) const {
  const Buffer* b = Get(buffer);
  return b ? static_cast<uint32_t>(b->line_starts.size()) : 0;
}

}  // namespace paraplan
