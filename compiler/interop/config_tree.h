// TOML, YAML and JSON configurations flattened to dotted keys, each with its value and where it
// is written, so that one table per framework (tables.h) maps them and every diagnostic points
// at the key's line. Parsing is the libraries' (toml++, yaml-cpp, LLVM's JSON); a file that does
// not parse is P0901 at the parser's position.
//
// Made here; read by torchtitan.cpp, deepspeed.cpp and nemo.cpp.
#ifndef PARAPLAN_COMPILER_INTEROP_CONFIG_TREE_H_
#define PARAPLAN_COMPILER_INTEROP_CONFIG_TREE_H_

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compiler/interop/draft.h"
#include "compiler/interop/tables.h"

namespace paraplan::interop {

// kTable: a table, mapping or object, whose own keys are entries of their own after it.
enum class ValueType : uint8_t { kInt, kReal, kBool, kString, kList, kNull, kTable };

struct ConfigEntry {
  std::string key;  // "parallelism.tensor_parallel_degree"
  // The value: "2", "true", "bfloat16", "0.9, 0.95" (lists: items joined by ", "), "{...}" for a
  // table.
  std::string text;
  ValueType type;
  std::vector<std::string> items;  // kList: the items' texts
  // A YAML list of lists of scalars (Megatron-Bridge's pipeline layout): each inner list's
  // texts; empty for any other value.
  std::vector<std::vector<std::string>> nested;
  SourceRange range;  // the key and its value
};

std::optional<std::vector<ConfigEntry>> ReadToml(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink);
std::optional<std::vector<ConfigEntry>> ReadYaml(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink);
std::optional<std::vector<ConfigEntry>> ReadJson(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink);

// Applies `rows` to the entries: a row's key sets its path (a later entry of the same key wins);
// a key in `skipped` or in none of them is listed as not imported (a table through its own keys).
// Entries whose key is in `handled` are left to the caller. A value of the wrong type (a table
// or a list where a row takes a number) is P0902 at its line. false when any value failed.
bool ApplyRows(std::span<const ConfigEntry> entries, std::span<const SettingRow> rows,
               std::span<const SkippedRow> skipped, std::span<const std::string_view> handled,
               PlanDraft& draft, DiagnosticSink& sink);

const ConfigEntry* FindEntry(std::span<const ConfigEntry> entries, std::string_view key);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_CONFIG_TREE_H_
