// The mapping tables of each framework: one row per setting, naming the canonical plan path it
// sets and how its value converts. The importers read a file through them and the exporters
// write through the same rows, so a setting maps the same way in both directions.
//
// Made here (tables.cpp); read by the readers and by export.cpp.
#ifndef PARAPLAN_COMPILER_INTEROP_TABLES_H_
#define PARAPLAN_COMPILER_INTEROP_TABLES_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "compiler/plan/plan.h"

namespace paraplan::interop {

enum class Convert : uint8_t {
  kInt,     // an integer, as is
  kReal,    // a real, as is
  kString,  // a string, quoted in the plan
  kSwitch,  // present (or `true`) sets the path to `value`
  kEnum,    // the framework's spelling -> the plan's, through `choices`
};

struct EnumChoice {
  std::string_view framework;  // "RMSNorm"
  std::string_view plan;       // "rmsnorm"
};

struct SettingRow {
  std::string_view key;  // "--tensor-model-parallel-size", "parallelism.tensor_parallel_degree"
  FieldId path;          // "parallel.tp", checked while compiling
  Convert convert;
  std::string_view value = {};               // kSwitch: the value it sets
  std::span<const EnumChoice> choices = {};  // kEnum
};

// A setting the framework has and the plan does not (yet): read, listed in the note with why.
struct SkippedRow {
  std::string_view key;
  std::string_view reason;
  bool takes_value = true;
};

// The plan's value for a setting written as `text` in the framework's file; nullopt and *error
// ("expects an integer, got 'four'") when it does not convert. kSwitch takes "", "true" or
// "false" (false: nullopt with an empty *error, the setting is off).
std::optional<std::string> ConvertSetting(const SettingRow& row, std::string_view text,
                                          std::string* error);
// The framework's spelling of a plan value (the reverse of ConvertSetting, for export).
std::optional<std::string> FrameworkValue(const SettingRow& row, std::string_view plan_value);

std::span<const SettingRow> MegatronRows();
std::span<const SettingRow> TorchtitanRows();
std::span<const SettingRow> DeepSpeedRows();
std::span<const SettingRow> NemoRows();
std::span<const SkippedRow> MegatronSkippedRows();
std::span<const SkippedRow> NemoSkippedRows();
const SettingRow* FindRow(std::span<const SettingRow> rows, std::string_view key);
const SkippedRow* FindSkipped(std::span<const SkippedRow> rows, std::string_view key);

}  // namespace paraplan::interop

#endif  // PARAPLAN_COMPILER_INTEROP_TABLES_H_
