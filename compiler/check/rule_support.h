// What every plan rule shares: a context (the plan, the sink, whether to compute helps), a
// builder that labels the fields a rule read by their origin ("`tp = 4` set here", "from
// --set", "solved by `auto`: ...", "in the stdlib"), and fix finding: a candidate change is
// offered only when the changed plan, re-checked by the same rules, no longer fails this
// rule and fails no rule that the original passed.
//
// Private to compiler/check (check_mesh.cpp, check_pipeline.cpp, check_train.cpp, rules.cpp).
//
// Every rule is one function for one diagnostic kind, listed with the fields it reads in its
// topic's table (MeshRules, PipelineRules, TrainRules); RunAllRules applies poisoning and
// chains centrally.
#ifndef PARAPLAN_COMPILER_CHECK_RULE_SUPPORT_H_
#define PARAPLAN_COMPILER_CHECK_RULE_SUPPORT_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/diagnostics/diagnostic.h"
#include "compiler/plan/plan.h"

namespace paraplan::rules {

class RuleContext;

// Rules that exclude each other in the order Megatron checks them: once one rule of a chain
// reports, the later rules of that chain are skipped (the pipeline split reports one problem).
enum class RuleChain : uint8_t { kNone, kPipelineSplit };

// One rule: it checks one diagnostic kind and reports it at most once. `inputs` are the fields
// it reads; the runner skips the rule when any of them is poisoned (failed to evaluate), so one
// bad value yields one error and no rule tests for poisoning itself.
struct Rule {
  DiagKind kind;
  bool (*check)(RuleContext& ctx);  // true when it reported
  std::vector<FieldId> inputs;
  RuleChain chain = RuleChain::kNone;
};

// The rules of each topic, in the order they run.
const std::vector<Rule>& MeshRules();      // check_mesh.cpp
const std::vector<Rule>& PipelineRules();  // check_pipeline.cpp
const std::vector<Rule>& TrainRules();     // check_train.cpp
// Every rule in the order they run (rules.cpp).
const std::vector<Rule>& AllRules();

// Runs every rule; with `helps` false no fixes are searched (used to re-check candidates).
void RunAllRules(RuleContext& ctx);

// One change to try: a field and the value as the field table takes it; a list field takes
// its text ("[15, 16, 15, 14]"), an optional field "none" to clear it.
struct FieldChange {
  FieldId field;
  FieldValue value;
};

class RuleContext {
 public:
  RuleContext(const Plan& plan, DiagnosticSink& sink, bool helps)
      : plan_(plan), sink_(sink), helps_(helps) {}

  const Plan& plan() const { return plan_; }
  DiagnosticSink& sink() { return sink_; }
  bool helps() const { return helps_; }

  // True when any of the fields failed earlier (a rule reading it stays quiet).
  bool Poisoned(const std::vector<FieldId>& fields) const;

  // The plan with `changes` applied and the derived fields re-derived (dp when it was `auto`,
  // etp when it defaulted to tp); nullopt when a value is out of the field's range.
  std::optional<Plan> Changed(std::initializer_list<FieldChange> changes) const;
  std::optional<Plan> Changed(const std::vector<FieldChange>& changes) const;
  // Whether `candidate` fixes `kind` without breaking a rule the original plan passes.
  bool Fixes(const Plan& candidate, DiagKind kind);
  bool Fixes(std::initializer_list<FieldChange> changes, DiagKind kind);
  // The values of an integer field (from `candidates`) that fix `kind`, nearest to the current
  // value first considered, at most `limit`, returned ascending.
  std::vector<int64_t> WorkingValues(FieldId field, const std::vector<int64_t>& candidates,
                                     DiagKind kind, size_t limit = 8);

 private:
  const std::vector<DiagKind>& BaselineErrors();

  const Plan& plan_;
  DiagnosticSink& sink_;
  bool helps_;
  bool baseline_done_ = false;
  std::vector<DiagKind> baseline_;
};

// A diagnostic under construction with plan-aware labels.
class RuleDiag {
 public:
  RuleDiag(RuleContext& ctx, DiagKind kind, std::string message);

  // The primary range: the first of `fields` that was written somewhere; the plan header when
  // none was.
  RuleDiag& At(const std::vector<FieldId>& fields, std::string label);
  // A label on a field by its origin. `value` is its value as text ("4", "true").
  RuleDiag& Field(FieldId field, const std::string& value);
  RuleDiag& Field(FieldId field, int64_t value) { return Field(field, std::to_string(value)); }
  // World size: labels cluster.nodes and cluster.gpus_per_node.
  RuleDiag& World();
  RuleDiag& Value(std::string expression, std::string value);
  RuleDiag& Note(std::string note);
  RuleDiag& Help(std::string help);
  void Report();

 private:
  void AddLabel(SourceRange range, std::string text);

  RuleContext& ctx_;
  Diagnostic d_;
};

// "4 · 32 · 4"
std::string Dot(std::initializer_list<int64_t> factors);
// "1, 2, 4, 8"
std::string List(const std::vector<int64_t>& values);
// "`ep = 1`, `ep = 2` or `ep = 4`" style list of values for one field.
std::string Choices(std::string_view name, const std::vector<int64_t>& values);
// Short name of a canonical path: "parallel.tp" -> "tp".
std::string_view ShortName(std::string_view path);
inline std::string_view ShortName(FieldId field) { return ShortName(field.path); }
// Written in the plan, a stdlib record or --set (not defaulted, derived or solved).
bool Explicit(const Plan& plan, FieldId field);
// "2.67" (a / b with two decimals, for values that are not whole).
std::string Ratio(int64_t a, int64_t b);
// Candidate sizes for a mesh axis: the divisors of the world size, plus 1.
std::vector<int64_t> AxisCandidates(const Plan& plan);
// Checked world size; nullopt on overflow or a non-positive size.
std::optional<int64_t> WorldSize(const Plan& plan);

}  // namespace paraplan::rules

#endif  // PARAPLAN_COMPILER_CHECK_RULE_SUPPORT_H_
