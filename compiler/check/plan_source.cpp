// Loading: the main file, its imports (stdlib, -I directories, relative files), lexical scopes
// for every block, `--set` overrides, and plan selection.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "compiler/ast/names.h"
#include "compiler/check/eval_internal.h"
#include "compiler/check/evaluate.h"
#include "compiler/parse/parse.h"

namespace paraplan {

// Where an import resolves: the file to read, its kind, and the name diagnostics show for it
// (`<stdlib>/models/llama.plan` for the stdlib, a normalised path otherwise).
struct ResolvedImport {
  std::string path;
  BufferKind kind = BufferKind::kFile;
  std::string display;
};

struct PlanSource::Impl : eval::SourceData {
  eval::ModuleData* AddModule(SourceManager& sm, uint32_t buffer, std::string path, BufferKind kind,
                              DiagnosticSink& sink, bool* ok);
  void AddBlock(const ast::Block& b, const eval::Scope* parent, eval::ModuleData* m);
  void WalkExpr(const ast::Expr& e, const eval::Scope* scope, eval::ModuleData* m);
  // `tried` gets the display name of every place looked at.
  std::optional<ResolvedImport> Resolve(const ast::Import& imp, const eval::ModuleData& from,
                                        std::vector<std::string>* tried) const;
  void ReportCycle(const SourceManager& sm, const eval::ModuleData& target, const ast::Import& imp,
                   DiagnosticSink& sink) const;

  // The files being loaded, outermost first, each with the import it is loading now: an
  // import of one of them closes a cycle.
  std::vector<std::pair<const eval::ModuleData*, const ast::Import*>> loading;
};

namespace {

namespace fs = std::filesystem;

std::string Canonical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  return ec ? path : p.string();
}

bool IsFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// `<stdlib>/models/llama.plan` for a path relative to the stdlib directory.
std::string StdlibDisplayName(const std::string& relative) {
  return "<stdlib>/" + fs::path(relative).lexically_normal().generic_string();
}

std::string ModuleName(const ast::Import& imp) {
  std::string out;
  for (const ast::Name& n : imp.module) out += (out.empty() ? "" : ".") + n.text;
  return out;
}

// stdlib module names (std.a.b) found under the stdlib directory, for "did you mean".
std::vector<std::string> StdlibModules(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".plan") continue;
    std::string rel = fs::relative(it->path(), root, ec).replace_extension("").string();
    for (char& c : rel) c = c == '/' ? '.' : c;
    out.push_back("std." + rel);
  }
  return out;
}

}  // namespace

void PlanSource::Impl::WalkExpr(const ast::Expr& e, const eval::Scope* scope, eval::ModuleData* m) {
  if (e.block) AddBlock(*e.block, scope, m);
  for (const auto& op : e.operands) WalkExpr(*op, scope, m);
}

void PlanSource::Impl::AddBlock(const ast::Block& b, const eval::Scope* parent,
                                eval::ModuleData* m) {
  auto scope = std::make_unique<eval::Scope>();
  scope->parent = parent;
  scope->module = m;
  for (const ast::Member& member : b.members) {
    if (member.kind == ast::MemberKind::kLet) scope->lets[member.path[0].text] = &member;
  }
  const eval::Scope* raw = scope.get();
  block_scopes[&b] = std::move(scope);
  for (const ast::Member& member : b.members) {
    if (member.value) WalkExpr(*member.value, raw, m);
    if (member.block) AddBlock(*member.block, raw, m);
  }
}

std::optional<ResolvedImport> PlanSource::Impl::Resolve(const ast::Import& imp,
                                                        const eval::ModuleData& from,
                                                        std::vector<std::string>* tried) const {
  fs::path dir = from.path.empty() ? fs::path(".") : fs::path(from.path).parent_path();
  if (dir.empty()) dir = ".";
  auto attempt = [&](const fs::path& p, BufferKind kind,
                     std::string display) -> std::optional<ResolvedImport> {
    tried->push_back(display);
    if (IsFile(p.string())) return ResolvedImport{p.string(), kind, std::move(display)};
    return std::nullopt;
  };
  auto user_path = [](const fs::path& p) { return p.lexically_normal().string(); };
  if (!imp.file.empty()) {
    fs::path p = dir / imp.file;
    // A relative file imported from the stdlib is shown under <stdlib> too.
    std::string display = user_path(p);
    if (from.kind == BufferKind::kStdlib) {
      std::error_code ec;
      fs::path rel = fs::relative(p, options.stdlib_dir, ec);
      if (!ec && !rel.empty() && *rel.begin() != "..") display = StdlibDisplayName(rel.string());
    }
    return attempt(p, from.kind, std::move(display));
  }
  fs::path rel;
  size_t first = 0;
  if (imp.module.size() > 1 && imp.module[0].text == "std") first = 1;
  for (size_t i = first; i < imp.module.size(); ++i) rel /= imp.module[i].text;
  rel += ".plan";
  if (first == 1) {
    return attempt(fs::path(options.stdlib_dir) / rel, BufferKind::kStdlib,
                   StdlibDisplayName(rel.string()));
  }
  if (auto r = attempt(dir / rel, from.kind, user_path(dir / rel))) return r;
  for (const std::string& inc : options.include_dirs) {
    if (auto r = attempt(fs::path(inc) / rel, BufferKind::kFile, user_path(fs::path(inc) / rel)))
      return r;
  }
  return std::nullopt;
}

void PlanSource::Impl::ReportCycle(const SourceManager& sm, const eval::ModuleData& target,
                                   const ast::Import& imp, DiagnosticSink& sink) const {
  size_t start = 0;
  while (start < loading.size() && loading[start].first != &target) ++start;
  auto name = [&](const eval::ModuleData* m) {
    return fmt::format("`{}`", sm.Name(m->ast->buffer));
  };
  std::string chain;
  for (size_t i = start; i < loading.size(); ++i) chain += name(loading[i].first) + " → ";
  chain += name(&target);
  const eval::ModuleData* importer = loading.back().first;
  Diag d(DiagKind::kImportCycle, importer == &target
                                     ? fmt::format("{} imports itself", name(&target))
                                     : fmt::format("import cycle: {}", chain));
  d.At(imp.file_range, importer == &target
                           ? "imports the file it is in"
                           : fmt::format("imports {}, which is still being loaded", name(&target)));
  for (size_t i = start; i + 1 < loading.size(); ++i) {
    const ast::Import* step = loading[i].second;
    if (step)
      d.Label(step->file_range,
              fmt::format("{} imports {}", name(loading[i].first), name(loading[i + 1].first)));
  }
  d.Note(
      "files cannot import each other in a cycle; an import brings in the declarations of that "
      "file only, so no file needs one of its importers");
  if (importer != &target) {
    d.Help(
        "remove this import, or move what the files of the cycle share into a file that each of "
        "them imports");
  } else {
    d.Help("remove this import: a file's own declarations are always in scope");
  }
  sink.Report(std::move(d));
}

eval::ModuleData* PlanSource::Impl::AddModule(SourceManager& sm, uint32_t buffer, std::string path,
                                              BufferKind kind, DiagnosticSink& sink, bool* ok) {
  auto parsed = ParseModule(sm, buffer, sink);
  if (!parsed) {
    *ok = false;
    return nullptr;
  }
  eval::ModuleData& m = modules.emplace_back();
  m.ast = std::move(parsed);
  m.path = std::move(path);
  m.kind = kind;
  m.scope.module = &m;
  if (!m.path.empty()) by_path[Canonical(m.path)] = &m;
  loading.emplace_back(&m, nullptr);
  for (const ast::Decl& d : m.ast->decls) {
    auto [it, fresh] = m.decls.emplace(d.name.text, &d);
    if (!fresh) {
      sink.Report(Diag(DiagKind::kDuplicateDefinition,
                       fmt::format("`{}` is declared twice in this file", d.name.text))
                      .At(d.name.range, "second declaration")
                      .Label(it->second->name.range, "first declaration")
                      .Help("rename one of them; to change a record, derive it: "
                            "`plan b extends a { ... }`"));
      // The first declaration stays; checking goes on.
    }
    if (d.body) AddBlock(*d.body, &m.scope, &m);
    if (d.kind == ast::DeclKind::kLet && d.base) WalkExpr(*d.base, &m.scope, &m);
  }
  for (const ast::Import& imp : m.ast->imports) {
    loading.back().second = &imp;
    std::vector<std::string> tried;
    auto found = Resolve(imp, m, &tried);
    if (!found) {
      std::string what = imp.file.empty() ? ModuleName(imp) : imp.file;
      Diag d(DiagKind::kImportNotFound, fmt::format("cannot find `{}` to import", what));
      d.At(imp.file_range, "not found");
      std::string places;
      for (const std::string& t : tried) places += (places.empty() ? "" : ", ") + t;
      d.Note("looked for " + places);
      for (const std::string& t : tried) {
        std::error_code ec;
        if (fs::is_directory(t, ec))
          d.Note(fmt::format("`{}` is a directory; an import names a .plan file", t));
      }
      if (imp.file.empty() && !imp.module.empty() && imp.module[0].text == "std") {
        std::error_code ec;
        if (!fs::is_directory(options.stdlib_dir, ec)) {
          const char* env = std::getenv("PARAPLAN_STDLIB");
          const bool from_env = env && *env && options.stdlib_dir == env;
          d.Note(fmt::format("<stdlib> is `{}`{}, which is not a directory", options.stdlib_dir,
                             from_env ? " (from PARAPLAN_STDLIB)" : ""));
        }
        std::vector<std::string> names = StdlibModules(options.stdlib_dir);
        std::vector<std::string_view> views(names.begin(), names.end());
        std::string guess = ast::ClosestName(what, views);
        if (!guess.empty()) d.Help(fmt::format("did you mean `import {}`?", guess));
      } else if (imp.file.empty()) {
        d.Help("modules outside the stdlib are found beside the importing file or under -I DIR");
      }
      sink.Report(std::move(d));
      *ok = false;
      continue;
    }
    std::string canonical = Canonical(found->path);
    if (auto it = by_path.find(canonical); it != by_path.end()) {
      // Imported before: fine (a diamond, or the same import twice), unless it is still loading.
      bool in_cycle = false;
      for (const auto& [loading_module, unused] : loading) in_cycle |= loading_module == it->second;
      if (in_cycle) {
        ReportCycle(sm, *it->second, imp, sink);
        *ok = false;
        continue;
      }
      m.imports.push_back(it->second);
      continue;
    }
    std::string error;
    auto b = sm.AddFile(found->path, found->kind, &error, found->display);
    if (!b) {
      sink.Report(Diag(DiagKind::kImportNotFound,
                       fmt::format("cannot read `{}`: {}", found->display, error))
                      .At(imp.file_range, "imported here"));
      *ok = false;
      continue;
    }
    if (eval::ModuleData* child = AddModule(sm, *b, found->path, found->kind, sink, ok)) {
      m.imports.push_back(child);
    }
  }
  loading.pop_back();
  return &m;
}

PlanSource::PlanSource(SourceManager& sm) : sm_(sm), impl_(std::make_unique<Impl>()) {}
PlanSource::~PlanSource() = default;

std::unique_ptr<PlanSource> PlanSource::Load(const std::string& file, const LoadOptions& options,
                                             SourceManager& sm, DiagnosticSink& sink) {
  std::string error;
  auto buffer = sm.AddFile(file, BufferKind::kFile, &error);
  if (!buffer) {
    sink.Report(Diag(DiagKind::kFileNotReadable, fmt::format("cannot read `{}`: {}", file, error)));
    return nullptr;
  }
  std::unique_ptr<PlanSource> src(new PlanSource(sm));
  src->impl_->options = options;
  bool ok = true;
  src->impl_->main = src->impl_->AddModule(sm, *buffer, file, BufferKind::kFile, sink, &ok);
  if (!ok || !src->impl_->main) return nullptr;
  return src;
}

std::unique_ptr<PlanSource> PlanSource::FromText(std::string name, std::string text,
                                                 const LoadOptions& options, SourceManager& sm,
                                                 DiagnosticSink& sink) {
  uint32_t buffer = sm.AddBuffer(std::move(name), std::move(text), BufferKind::kMemory);
  std::unique_ptr<PlanSource> src(new PlanSource(sm));
  src->impl_->options = options;
  bool ok = true;
  src->impl_->main = src->impl_->AddModule(sm, buffer, "", BufferKind::kMemory, sink, &ok);
  if (!ok || !src->impl_->main) return nullptr;
  return src;
}

std::optional<SetOverride> PlanSource::ParseSet(std::string_view text, SourceManager& sm,
                                                DiagnosticSink& sink) {
  uint32_t buffer = sm.AddBuffer("<command line>", std::string(text), BufferKind::kCommandLine);
  auto member = ParseSetOverride(sm, buffer, sink);
  if (!member) return std::nullopt;
  SetOverride o;
  for (const ast::Name& n : member->path) o.path += (o.path.empty() ? "" : ".") + n.text;
  o.member = member.get();
  o.range = {buffer, 0, static_cast<uint32_t>(text.size())};
  impl_->set_members.push_back(std::move(member));
  return o;
}

const ast::Module& PlanSource::main_module() const { return *impl_->main->ast; }

std::vector<std::string> PlanSource::PlanNames() const {
  std::vector<std::string> out;
  for (const ast::Decl& d : impl_->main->ast->decls) {
    if (d.kind == ast::DeclKind::kPlan) out.push_back(d.name.text);
  }
  return out;
}

std::optional<Plan> PlanSource::Evaluate(std::string_view plan_name,
                                         std::span<const SetOverride> sets,
                                         const EvalOptions& options, DiagnosticSink& sink) const {
  const ast::Module& main = *impl_->main->ast;
  const ast::Decl* chosen = nullptr;
  std::vector<std::string_view> names;
  for (const ast::Decl& d : main.decls) {
    if (d.kind != ast::DeclKind::kPlan) continue;
    names.push_back(d.name.text);
    if (plan_name.empty() || d.name.text == plan_name) chosen = &d;
  }
  if (!chosen && !plan_name.empty()) {
    // A plan from an imported file can be checked by name too.
    for (const eval::ModuleData* imp : impl_->main->imports) {
      auto it = imp->decls.find(plan_name);
      if (it != imp->decls.end() && it->second->kind == ast::DeclKind::kPlan) chosen = it->second;
    }
  }
  if (!chosen) {
    std::string file(sm_.Name(main.buffer));
    Diag d(DiagKind::kPlanNotFound,
           plan_name.empty() ? fmt::format("`{}` declares no plan", file)
                             : fmt::format("no plan named `{}` in `{}`", plan_name, file));
    d.At({main.buffer, 0, 0});
    std::string list;
    for (std::string_view n : names) list += (list.empty() ? "" : ", ") + fmt::format("`{}`", n);
    if (!names.empty()) d.Note("the plans in it are " + list);
    std::string guess = ast::ClosestName(plan_name, names);
    if (!guess.empty()) d.Help(fmt::format("did you mean `--plan {}`?", guess));
    if (names.empty()) d.Help("declare one: `plan NAME { model = ...  cluster = ... }`");
    sink.Report(std::move(d));
    return std::nullopt;
  }
  return eval::EvaluatePlanDecl(*impl_, sm_, *chosen, sets, options, sink);
}

int EvaluateAllRecords(const PlanSource& source, DiagnosticSink& sink) {
  return eval::EvaluateEveryRecord(*source.impl_, source.sm_, sink);
}

}  // namespace paraplan
