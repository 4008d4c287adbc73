// Internals of the evaluator (check/evaluate*.cpp): record kinds and their schemas, lexical
// scopes, loaded modules, and record instances with their memoised fields.
//
// Loaded state (modules, scopes, schemas) is immutable and shared by every evaluation of a
// PlanSource; an Evaluator holds the per-evaluation state (record instances, memo tables) and
// is thrown away after one plan.
#ifndef PARAPLAN_COMPILER_CHECK_EVAL_INTERNAL_H_
#define PARAPLAN_COMPILER_CHECK_EVAL_INTERNAL_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "compiler/ast/ast.h"
#include "compiler/check/evaluate.h"
#include "compiler/check/value.h"
#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan::eval {

enum class Kind : uint8_t {
  kGpu,
  kCluster,
  kModel,
  kPlan,
  kParallel,
  kPipeline,
  kOptimizer,
  kBatch,
  kTrain,
  kMixedPrecision,
  kActivations,
  kFsdp,
  kMoe,
};
constexpr int kKindCount = 13;

std::string_view KindName(Kind k);

struct SchemaField {
  std::string name;                 // "tp"
  const FieldInfo* info = nullptr;  // scalar fields
  int sub_kind = -1;                // record-valued fields: the Kind
  bool required = false;
};

struct Schema {
  Kind kind;
  std::string prefix;  // canonical path prefix inside a plan: "parallel.", "cluster.gpu.", ""
  std::vector<SchemaField> fields;
  int Find(std::string_view name) const;
  std::vector<std::string_view> Names() const;
};

const Schema& SchemaOf(Kind k);

struct ModuleData;

// The lexical scope of one block: its lets, the enclosing block's scope and the module.
struct Scope {
  const Scope* parent = nullptr;
  const ModuleData* module = nullptr;
  std::unordered_map<std::string_view, const ast::Member*> lets;
};

struct ModuleData {
  std::unique_ptr<ast::Module> ast;
  std::string path;  // file path ("" for in-memory text)
  BufferKind kind = BufferKind::kFile;
  Scope scope;  // module scope (no lets; top-level lets are decls)
  std::unordered_map<std::string_view, const ast::Decl*> decls;
  std::vector<const ModuleData*> imports;
};

// One member applying to a record: member->path[depth] names the record's field; a longer
// path amends that field's record.
struct Entry {
  const ast::Member* member = nullptr;
  uint32_t depth = 0;
  const Scope* scope = nullptr;
  int field = -1;  // the record's schema index of member->path[depth]; -1 for none
};

struct Slot {
  enum State : uint8_t { kUnset, kBusy, kDone } state = kUnset;
  Value value;
  FieldOrigin origin;
};

struct Record {
  Kind kind = Kind::kPlan;
  std::string name;
  SourceRange declared;        // where the record (or its derivation) was written
  std::vector<Entry> entries;  // base first
  Record* parent = nullptr;    // the record holding this one as a field
  bool in_plan = false;        // part of the plan being evaluated: origins and sweeps recorded
  std::string prefix;          // canonical path prefix when in_plan
  std::vector<Slot> slots;     // one per schema field
};

// Everything a PlanSource loaded: modules (main first), block scopes, parsed --set members.
struct SourceData {
  LoadOptions options;
  std::deque<ModuleData> modules;
  std::unordered_map<std::string, ModuleData*> by_path;
  std::unordered_map<const ast::Block*, std::unique_ptr<Scope>> block_scopes;
  std::deque<std::unique_ptr<ast::Member>> set_members;
  const ModuleData* main = nullptr;

  const Scope* ScopeOf(const ast::Block* b) const {
    auto it = block_scopes.find(b);
    return it == block_scopes.end() ? nullptr : it->second.get();
  }
};

class Evaluator {
 public:
  Evaluator(const SourceData& src, const SourceManager& sm, const EvalOptions& options,
            DiagnosticSink& sink)
      : src_(src), sm_(sm), options_(options), sink_(sink) {}

  std::optional<Plan> EvaluatePlan(const ast::Decl& decl, std::span<const SetOverride> sets);
  int EvaluateEverything();

 private:
  // Records.
  Record* NewRecord(Kind kind, std::string name, SourceRange declared) {
    Record& r = records_.emplace_back();
    r.kind = kind;
    r.name = std::move(name);
    r.declared = declared;
    r.slots.resize(SchemaOf(kind).fields.size());
    return &r;
  }
  Record* DeclRecord(const ast::Decl& d);
  static void AddEntry(Record* r, const ast::Member* m, uint32_t depth, const Scope* scope) {
    int field = -1;
    if ((m->kind == ast::MemberKind::kAssign || m->kind == ast::MemberKind::kAmend) &&
        m->path.size() > depth) {
      field = SchemaOf(r->kind).Find(m->path[depth].text);
    }
    r->entries.push_back({m, depth, scope, field});
  }
  Value Field(Record* r, int idx, SourceRange use);
  Value RecordField(Record* r, int idx, int k, FieldOrigin* origin);
  Value ScalarField(Record* r, int idx, int k, FieldOrigin* origin);
  Value DefaultValue(Record* r, int idx, FieldOrigin* origin);
  Value SolveDp(Record* parallel, SourceRange range, FieldOrigin* origin);
  Value AutoField(Record* r, int idx, SourceRange range, FieldOrigin* origin);
  Value SweepField(Record* r, int idx, const Value& list, const ast::Expr& e, FieldOrigin* origin);
  Value Coerce(const Value& v, const FieldInfo& info, SourceRange range, const std::string& path);
  // Coerce's parts. A site is where the value goes: the field's type and limits, the range to
  // point at, the field's path. Each reports what it refuses and returns an error value (or
  // false).
  struct CoerceSite {
    const FieldInfo& info;
    SourceRange range;
    const std::string& path;
  };
  Value CoerceInt(const Value& v, const CoerceSite& site);
  Value CoerceReal(const Value& v, const CoerceSite& site);
  Value CoerceEnum(const Value& v, const CoerceSite& site);
  Value CoerceIntList(const Value& v, const CoerceSite& site);
  Value TypeMismatch(const Value& v, const CoerceSite& site, const std::string& expected);
  bool InIntRange(int64_t x, const CoerceSite& site);
  bool UnitMatches(const Value& v, const CoerceSite& site);
  std::string PathOf(const Record* r, std::string_view field) const {
    if (r->in_plan) return r->prefix + std::string(field);
    if (!r->name.empty()) return r->name + "." + std::string(field);
    return std::string(field);
  }

  // Expressions.
  Value Eval(const ast::Expr& e, const Scope* scope, Record* self,
             const FieldInfo* expect = nullptr);
  Value EvalPath(const ast::Expr& e, const Scope* scope, Record* self, const FieldInfo* expect);
  Value Lookup(const ast::Name& name, const Scope* scope, Record* self);
  bool Resolvable(const std::string& name, const Scope* scope, Record* self) const;
  Value Member(const Value& base, const ast::Name& name, const std::string& base_text);
  Value Derive(const Value& base, const ast::Expr& e, Record* self);
  Value Quantity(const ast::Expr& e);
  Value Unary(const ast::Expr& e, const Scope* scope, Record* self);
  Value Binary(const ast::Expr& e, const Scope* scope, Record* self);
  Value Call(const ast::Expr& e, const Scope* scope, Record* self);
  Value Arith(const ast::Expr& e, const std::string& op, const Value& a, const Value& b);
  Value Compare(const ast::Expr& e, const std::string& op, const Value& a, const Value& b);

  // Plan assembly.
  void Validate(Record* r);
  void CheckRequires(Record* r, const Plan* plan);
  std::string CanonicalPathOf(const ast::Expr& e, const Scope* scope, Record* self);
  void ForEachPlanRecord(Record* r, const std::function<void(Record*)>& fn);

  OriginKind OriginOf(SourceRange r) const {
    if (!r.IsValid()) return OriginKind::kDefault;
    switch (sm_.Kind(r.buffer)) {
      case BufferKind::kStdlib:
        return OriginKind::kStdlib;
      case BufferKind::kCommandLine:
        return OriginKind::kCommandLine;
      default:
        return OriginKind::kFile;
    }
  }
  void Report(Diag d) {
    const Diagnostic& x = d.Get();
    auto key =
        std::make_tuple(static_cast<int>(x.kind), x.primary.buffer, x.primary.begin, x.message);
    if (!reported_.insert(key).second) return;
    sink_.Report(std::move(d));
  }
  std::string Text(SourceRange r) const { return std::string(sm_.Slice(r)); }

  const SourceData& src_;
  const SourceManager& sm_;
  const EvalOptions& options_;
  DiagnosticSink& sink_;
  std::deque<Record> records_;
  std::unordered_map<const ast::Decl*, Record*> decl_records_;
  std::unordered_map<const ast::Decl*, Value> let_values_;
  std::set<const void*> busy_;
  std::set<std::tuple<int, uint32_t, uint32_t, std::string>> reported_;
  std::set<std::pair<const ast::Member*, uint32_t>> validated_;
  std::vector<Sweep> sweeps_;
  int depth_ = 0;
  int expected_kind_ = -1;  // the Kind a record field's bare name should resolve to
  const Plan* plan_for_labels_ = nullptr;
};

// Evaluates one plan declaration with overrides (see PlanSource::Evaluate).
std::optional<Plan> EvaluatePlanDecl(const SourceData& src, const SourceManager& sm,
                                     const ast::Decl& decl, std::span<const SetOverride> sets,
                                     const EvalOptions& options, DiagnosticSink& sink);
// Evaluates every record declared in the loaded modules (see EvaluateAllRecords).
int EvaluateEveryRecord(const SourceData& src, const SourceManager& sm, DiagnosticSink& sink);

}  // namespace paraplan::eval

#endif  // PARAPLAN_COMPILER_CHECK_EVAL_INTERNAL_H_
