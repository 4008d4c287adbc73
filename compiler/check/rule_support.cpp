#include "compiler/check/rule_support.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "compiler/base/checked.h"

namespace paraplan::rules {

// --- Context ----------------------------------------------------------------------------------

bool RuleContext::Poisoned(const std::vector<FieldId>& fields) const {
  if (plan_.poisoned.empty()) return false;
  for (FieldId f : fields) {
    if (plan_.IsPoisoned(f)) return true;
  }
  return false;
}

std::optional<Plan> RuleContext::Changed(std::initializer_list<FieldChange> changes) const {
  return Changed(std::vector<FieldChange>(changes));
}

std::optional<Plan> RuleContext::Changed(const std::vector<FieldChange>& changes) const {
  Plan p = plan_;
  for (const FieldChange& c : changes) {
    if (c.field.IsRecord()) return std::nullopt;
    const FieldInfo& f = c.field.info();
    // Lists ("[15, 16]") and clearing an optional field ("none") go through the text form.
    const std::string* text = std::get_if<std::string>(&c.value);
    bool as_text =
        text && (f.type == FieldType::kIntList || (f.type == FieldType::kInt && f.nullable));
    std::string error = as_text ? SetFieldText(p, f.path, *text) : SetFieldValue(p, f, c.value);
    if (!error.empty()) return std::nullopt;
  }
  auto touched = [&](FieldId field) {
    for (const FieldChange& c : changes) {
      if (c.field == field) return true;
    }
    return false;
  };
  OriginKind etp_origin = plan_.Origin(fields::kParallelEtp).kind;
  if (!touched(fields::kParallelEtp) &&
      (etp_origin == OriginKind::kDerived || etp_origin == OriginKind::kDefault)) {
    p.parallel.etp = p.parallel.tp;
  }
  OriginKind dp_origin = plan_.Origin(fields::kParallelDp).kind;
  bool dp_derived = dp_origin == OriginKind::kAuto || dp_origin == OriginKind::kDerived ||
                    dp_origin == OriginKind::kDefault;
  if (!touched(fields::kParallelDp) && dp_derived) {
    auto world = WorldSize(p);
    auto model = CheckedProduct({p.parallel.tp, p.parallel.pp, p.parallel.cp});
    if (world && model && *model > 0 && *world % *model == 0) p.parallel.dp = *world / *model;
  }
  return p;
}

const std::vector<DiagKind>& RuleContext::BaselineErrors() {
  if (!baseline_done_) {
    DiagnosticSink scratch;
    RuleContext inner(plan_, scratch, false);
    RunAllRules(inner);
    for (const Diagnostic& d : scratch.diagnostics()) {
      if (d.level == DiagLevel::kError) baseline_.push_back(d.kind);
    }
    baseline_done_ = true;
  }
  return baseline_;
}

bool RuleContext::Fixes(const Plan& candidate, DiagKind kind) {
  const std::vector<DiagKind>& before = BaselineErrors();
  DiagnosticSink scratch;
  RuleContext inner(candidate, scratch, false);
  RunAllRules(inner);
  for (const Diagnostic& d : scratch.diagnostics()) {
    if (d.level != DiagLevel::kError) continue;
    if (d.kind == kind) return false;
    if (std::find(before.begin(), before.end(), d.kind) == before.end()) return false;
  }
  return true;
}

bool RuleContext::Fixes(std::initializer_list<FieldChange> changes, DiagKind kind) {
  std::optional<Plan> p = Changed(changes);
  return p && Fixes(*p, kind);
}

std::vector<int64_t> RuleContext::WorkingValues(FieldId field,
                                                const std::vector<int64_t>& candidates,
                                                DiagKind kind, size_t limit) {
  int64_t current = 0;
  if (!field.IsRecord()) {
    FieldValue v = GetFieldValue(plan_, field.info());
    if (auto* i = std::get_if<int64_t>(&v)) current = *i;
  }
  std::vector<int64_t> sorted = candidates;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  // Nearest first (by ratio, since sizes are multiplicative), then keep the first `limit`.
  std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) {
    auto distance = [&](int64_t x) {
      if (current <= 0 || x <= 0) return static_cast<double>(std::llabs(x - current));
      return x > current ? static_cast<double>(x) / current : static_cast<double>(current) / x;
    };
    return distance(a) < distance(b);
  });
  std::vector<int64_t> out;
  for (int64_t v : sorted) {
    if (out.size() >= limit) break;
    if (v == current) continue;
    if (Fixes({{field, v}}, kind)) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// --- Diagnostic builder ----------------------------------------------------------------------

RuleDiag::RuleDiag(RuleContext& ctx, DiagKind kind, std::string message) : ctx_(ctx) {
  d_.kind = kind;
  d_.level = GetDiagKindInfo(kind).level;
  d_.message = std::move(message);
}

RuleDiag& RuleDiag::At(const std::vector<FieldId>& fields, std::string label) {
  // The user's own lines first (the plan file, --set), then values from the stdlib, then the
  // plan header.
  const Plan& plan = ctx_.plan();
  SourceRange chosen;
  for (int pass = 0; pass < 2 && !chosen.IsValid(); ++pass) {
    for (FieldId f : fields) {
      const FieldOrigin& o = plan.Origin(f);
      bool users = o.kind == OriginKind::kFile || o.kind == OriginKind::kCommandLine;
      if (o.range.IsValid() && (pass == 1 || users)) {
        chosen = o.range;
        break;
      }
    }
  }
  d_.primary = chosen.IsValid() ? chosen : plan.declaration;
  d_.primary_label = std::move(label);
  return *this;
}

void RuleDiag::AddLabel(SourceRange range, std::string text) {
  if (!range.IsValid()) return;
  if (range == d_.primary) {
    // The primary already points here; keep the origin words beside its label.
    if (d_.primary_label.empty()) {
      d_.primary_label = std::move(text);
    } else if (d_.primary_label.find(text) == std::string::npos) {
      d_.primary_label += "; " + text;
    }
    return;
  }
  for (DiagLabel& l : d_.labels) {
    if (l.range == range) {
      if (l.message.find(text) == std::string::npos) l.message += "; " + text;
      return;
    }
  }
  d_.labels.push_back({range, std::move(text)});
}

RuleDiag& RuleDiag::Field(FieldId field, const std::string& value) {
  const Plan& plan = ctx_.plan();
  const std::string_view path = field.path;
  const FieldOrigin& o = plan.Origin(field);
  std::string name(ShortName(path));
  std::string shown = "`" + name + " = " + value + "`";
  switch (o.kind) {
    case OriginKind::kFile:
      AddLabel(o.range, shown + " set here");
      break;
    case OriginKind::kCommandLine:
      AddLabel(o.range, shown + " from --set");
      break;
    case OriginKind::kStdlib: {
      std::string owner = path.rfind("model.", 0) == 0         ? plan.model.name
                          : path.rfind("cluster.gpu.", 0) == 0 ? plan.cluster.gpu.name
                          : path.rfind("cluster.", 0) == 0     ? plan.cluster.name
                                                               : std::string();
      AddLabel(o.range, shown + " in the stdlib" + (owner.empty() ? "" : " (`" + owner + "`)"));
      break;
    }
    case OriginKind::kAuto:
      AddLabel(o.range, "`" + name + " = auto` solved: " +
                            (o.derivation.empty() ? name + " = " + value : o.derivation));
      break;
    case OriginKind::kDerived: {
      std::string from =
          o.derived_from.empty() ? std::string() : std::string(ShortName(o.derived_from.front()));
      std::string words =
          !o.derivation.empty() ? "`" + name + "` is derived: " + o.derivation
          : from.empty()        ? "`" + name + "` is not set and defaults to " + value
                         : "`" + name + "` is not set, so it defaults to `" + from + "` = " + value;
      if (o.range.IsValid()) {
        AddLabel(o.range, words);
      } else {
        Note(words);
      }
      break;
    }
    case OriginKind::kDefault:
      break;
  }
  return *this;
}

RuleDiag& RuleDiag::World() {
  Field(fields::kClusterNodes, ctx_.plan().cluster.nodes);
  Field(fields::kClusterGpusPerNode, ctx_.plan().cluster.gpus_per_node);
  return *this;
}

RuleDiag& RuleDiag::Value(std::string expression, std::string value) {
  d_.values.emplace_back(std::move(expression), std::move(value));
  return *this;
}

RuleDiag& RuleDiag::Note(std::string note) {
  for (const std::string& n : d_.notes) {
    if (n == note) return *this;
  }
  d_.notes.push_back(std::move(note));
  return *this;
}

RuleDiag& RuleDiag::Help(std::string help) {
  d_.helps.push_back(std::move(help));
  return *this;
}

void RuleDiag::Report() { ctx_.sink().Report(std::move(d_)); }

// --- Text helpers ----------------------------------------------------------------------------

std::string Dot(std::initializer_list<int64_t> factors) {
  std::string s;
  for (int64_t f : factors) {
    if (!s.empty()) s += " · ";
    s += std::to_string(f);
  }
  return s;
}

std::string List(const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(values[i]);
  }
  return s;
}

std::string Choices(std::string_view name, const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) s += i + 1 == values.size() ? " or " : ", ";
    s += "`" + std::string(name) + " = " + std::to_string(values[i]) + "`";
  }
  return s;
}

std::string Ratio(int64_t a, int64_t b) {
  if (b == 0) return "undefined";
  if (a % b == 0) return std::to_string(a / b);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(a) / static_cast<double>(b));
  return buf;
}

std::string_view ShortName(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

bool Explicit(const Plan& plan, FieldId field) {
  OriginKind k = plan.Origin(field).kind;
  return k == OriginKind::kFile || k == OriginKind::kCommandLine || k == OriginKind::kStdlib;
}

std::optional<int64_t> WorldSize(const Plan& plan) {
  auto w = CheckedMul(plan.cluster.nodes, plan.cluster.gpus_per_node);
  if (!w || *w <= 0) return std::nullopt;
  return w;
}

std::vector<int64_t> AxisCandidates(const Plan& plan) {
  auto w = WorldSize(plan);
  if (!w || *w > (int64_t{1} << 40)) return {1, 2, 4, 8};
  return Divisors(*w);
}

}  // namespace paraplan::rules
