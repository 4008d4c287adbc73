// Canonical paths of a plan as values: FieldId (a path with its index), the index enum and the
// path table generated from fields.def, and FieldSet (paths by index). plan.h adds the typed
// handles (`fields::kParallelTp`, with their accessors) once Plan is complete.
#ifndef PARAPLAN_COMPILER_PLAN_FIELD_ID_H_
#define PARAPLAN_COMPILER_PLAN_FIELD_ID_H_

#include <bitset>
#include <cstdint>
#include <optional>
#include <string_view>

namespace paraplan {

struct FieldInfo;

// Every canonical path of a plan has a handle generated from fields.def: `fields::kParallelTp`
// carries the path ("parallel.tp"), its index (into PlanFields(), PlanOrigins and FieldSet) and,
// for fields, a typed accessor (`fields::kParallelTp.Get(plan)` is `plan.parallel.tp`). A
// misspelt handle does not compile, and a string literal where a FieldId is expected is looked
// up at compile time (a misspelt literal does not compile either). Paths that come from outside
// (--set, an importer's table, `explain PATH`) are looked up at run time: FindPlanField,
// FindPlanPath, PlanOrigins::Mutable.
namespace fields {
enum Index : uint16_t {
#define PLAN_FIELD_INDEX(NAME, ...) NAME##Index,
#define PLAN_INT PLAN_FIELD_INDEX
#define PLAN_BYTES PLAN_FIELD_INDEX
#define PLAN_OPT_INT PLAN_FIELD_INDEX
#define PLAN_REAL_IN PLAN_FIELD_INDEX
#define PLAN_BOOL PLAN_FIELD_INDEX
#define PLAN_STRING PLAN_FIELD_INDEX
#define PLAN_LIST PLAN_FIELD_INDEX
#define PLAN_ENUM PLAN_FIELD_INDEX
#include "compiler/plan/fields.def"
#undef PLAN_INT
#undef PLAN_BYTES
#undef PLAN_OPT_INT
#undef PLAN_REAL_IN
#undef PLAN_BOOL
#undef PLAN_STRING
#undef PLAN_LIST
#undef PLAN_ENUM
#undef PLAN_FIELD_INDEX
  kFieldCount,
  // The record-valued paths after the fields: they have origins but no values.
  kModelIndex = kFieldCount,
  kClusterIndex,
  kClusterGpuIndex,
  kPathCount,
};

// Every canonical path by index: the fields in PlanFields() order, then the record paths.
inline constexpr std::string_view kPaths[kPathCount] = {
#define PLAN_FIELD_PATH(NAME, PATH, ...) PATH,
#define PLAN_INT PLAN_FIELD_PATH
#define PLAN_BYTES PLAN_FIELD_PATH
#define PLAN_OPT_INT PLAN_FIELD_PATH
#define PLAN_REAL_IN PLAN_FIELD_PATH
#define PLAN_BOOL PLAN_FIELD_PATH
#define PLAN_STRING PLAN_FIELD_PATH
#define PLAN_LIST PLAN_FIELD_PATH
#define PLAN_ENUM PLAN_FIELD_PATH
#include "compiler/plan/fields.def"
#undef PLAN_INT
#undef PLAN_BYTES
#undef PLAN_OPT_INT
#undef PLAN_REAL_IN
#undef PLAN_BOOL
#undef PLAN_STRING
#undef PLAN_LIST
#undef PLAN_ENUM
#undef PLAN_FIELD_PATH
    "model",
    "cluster",
    "cluster.gpu",
};
}  // namespace fields

// A canonical path of a plan, known to be one: a field or a record path.
struct FieldId {
  constexpr FieldId(uint16_t i, std::string_view p) : index(i), path(p) {}
  // A path written as a literal is checked while compiling: FieldId("parallel.tpp") is an error.
  consteval FieldId(const char* literal) : FieldId(Lookup(literal)) {}

  uint16_t index;
  std::string_view path;

  bool IsRecord() const { return index >= fields::kFieldCount; }
  // The field's entry in PlanFields(); only for fields (not record paths).
  const FieldInfo& info() const;
  friend constexpr bool operator==(FieldId a, FieldId b) { return a.index == b.index; }

 private:
  static consteval FieldId Lookup(std::string_view path) {
    for (uint16_t i = 0; i < fields::kPathCount; ++i) {
      if (fields::kPaths[i] == path) return FieldId(i, fields::kPaths[i]);
    }
    throw "not a canonical path of a plan";  // makes the constant expression fail
  }
};

// A path that comes from outside (--set, an importer, a test); nullopt when it names no field
// and no record.
std::optional<FieldId> FindPlanPath(std::string_view path);

// A set of paths by index (the poisoned fields of a plan).
class FieldSet {
 public:
  void insert(FieldId field) { bits_.set(field.index); }
  size_t count(FieldId field) const { return bits_.test(field.index) ? 1 : 0; }
  bool empty() const { return bits_.none(); }
  size_t size() const { return bits_.count(); }

 private:
  std::bitset<fields::kPathCount> bits_;
};

}  // namespace paraplan

#endif  // PARAPLAN_COMPILER_PLAN_FIELD_ID_H_
