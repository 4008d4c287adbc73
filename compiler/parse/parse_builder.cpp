// Builder (parse_builder.h): blocks, members and top-level items, and the streaming build that
// turns each of them into AST as the parser leaves it.
#include "compiler/parse/parse_builder.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/ast/names.h"

namespace paraplan::parse_internal {

std::string Builder::Unescape(const std::string& raw) {
  std::string out;
  for (size_t i = 1; i + 1 < raw.size(); ++i) {
    if (raw[i] == '\\' && i + 2 < raw.size()) {
      char c = raw[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += raw[i];
    }
  }
  return out;
}

std::unique_ptr<ast::Block> Builder::Block(PlanParser::BlockContext* ctx) {
  auto b = std::make_unique<ast::Block>();
  b->range = Range(ctx);
  if (streaming_) {
    auto it = blocks_.find(ctx);
    if (it != blocks_.end()) {
      for (Diagnostic& d : it->second.diags) Report(std::move(d));
      b->members = std::move(it->second.members);
      blocks_.erase(it);
    }
    return b;
  }
  for (auto* m : ctx->member()) b->members.push_back(Member(m));
  return b;
}

void Builder::Released(antlr4::ParserRuleContext* ctx) {
  switch (ctx->getRuleIndex()) {
    case PlanParser::RuleExpr: {
      auto* e = static_cast<PlanParser::ExprContext*>(ctx);
      PendingExpr pending;
      collector_ = &pending.diags;
      pending.expr = Or(e->orExpr());
      collector_ = nullptr;
      if (IsList(ctx->parent)) {
        // An element: the parser frees the list's own nodes as it goes (see LeanParser).
        PendingList& list = lists_[ctx->parent];
        list.elements.push_back(std::move(pending.expr));
        for (Diagnostic& d : pending.diags) list.diags.push_back(std::move(d));
        collector_ = &list.diags;
        AppendRun(e, &list.elements);
        collector_ = nullptr;
      } else {
        exprs_[e] = std::move(pending);
      }
      break;
    }
    case PlanParser::RuleMember: {
      std::vector<Diagnostic> diags;
      collector_ = &diags;
      ast::Member m = Member(static_cast<PlanParser::MemberContext*>(ctx));
      collector_ = nullptr;
      PendingBlock& block = blocks_[ctx->parent];
      block.members.push_back(std::move(m));
      for (Diagnostic& d : diags) block.diags.push_back(std::move(d));
      break;
    }
    case PlanParser::RuleTopItem:
      collector_ = &item_diags_;
      Item(static_cast<PlanParser::TopItemContext*>(ctx), &items_);
      collector_ = nullptr;
      break;
    default:
      break;
  }
}

void Builder::StartParse(bool on) {
  streaming_ = on;
  exprs_.clear();
  blocks_.clear();
  lists_.clear();
  items_ = ast::Module();
  item_diags_.clear();
  depth_.clear();
  too_deep_ = false;
}

ast::Member Builder::Member(PlanParser::MemberContext* ctx) {
  ast::Member m;
  m.range = Range(ctx);
  if (auto* a = dynamic_cast<PlanParser::AssignMemberContext*>(ctx)) {
    m.kind = ast::MemberKind::kAssign;
    m.path = Path(a->path());
    m.value = Expr(a->expr());
  } else if (auto* a = dynamic_cast<PlanParser::AmendMemberContext*>(ctx)) {
    m.kind = ast::MemberKind::kAmend;
    m.path = Path(a->path());
    m.block = Block(a->block());
  } else if (auto* l = dynamic_cast<PlanParser::LetMemberContext*>(ctx)) {
    m.kind = ast::MemberKind::kLet;
    m.path.push_back(NameOf(l->letDecl()->NAME()));
    m.value = Expr(l->letDecl()->expr());
  } else if (auto* r = dynamic_cast<PlanParser::RequireMemberContext*>(ctx)) {
    m.kind = ast::MemberKind::kRequire;
    m.value = Expr(r->expr());
    if (r->STRING()) {
      m.message = Unescape(r->STRING()->getSymbol());
      m.message_range = Range(r->STRING()->getSymbol());
    }
  }
  // A trailing separator is not part of the member.
  if (ctx->children.size() > 1) {
    if (auto* sep = dynamic_cast<PlanParser::SeparatorContext*>(ctx->children.back())) {
      m.range.end = Range(sep).begin;
      while (m.range.end > m.range.begin &&
             (text_[m.range.end - 1] == ' ' || text_[m.range.end - 1] == '\t')) {
        --m.range.end;
      }
    }
  }
  return m;
}

void Builder::Module(PlanParser::FileContext* ctx, ast::Module* module) {
  if (streaming_) {
    // The items were built as the parser left them (Released); their diagnostics come now,
    // in the order of the text, as a walk over the whole tree would report them.
    for (Diagnostic& d : item_diags_) Report(std::move(d));
    item_diags_.clear();
    module->imports = std::move(items_.imports);
    module->decls = std::move(items_.decls);
    return;
  }
  for (auto* item : ctx->topItem()) Item(item, module);
}

void Builder::Item(PlanParser::TopItemContext* item, ast::Module* module) {
  if (auto* i = dynamic_cast<PlanParser::TopImportContext*>(item)) {
    auto* d = i->importDecl();
    ast::Import imp;
    imp.range = Range(d);
    if (d->STRING()) {
      imp.file = Unescape(d->STRING()->getSymbol());
      imp.file_range = Range(d->STRING()->getSymbol());
    } else {
      for (auto* n : d->dottedName()->NAME()) imp.module.push_back(NameOf(n));
      imp.file_range = Range(d->dottedName());
    }
    module->imports.push_back(std::move(imp));
  } else if (auto* l = dynamic_cast<PlanParser::TopLetContext*>(item)) {
    ast::Decl d;
    d.kind = ast::DeclKind::kLet;
    d.range = Range(l->letDecl());
    d.keyword = NameOf(l->letDecl()->LET());
    d.name = NameOf(l->letDecl()->NAME());
    d.base = Expr(l->letDecl()->expr());
    module->decls.push_back(std::move(d));
  } else if (auto* r = dynamic_cast<PlanParser::TopRecordContext*>(item)) {
    ast::Decl d;
    d.range = Join(Range(r->kindName), Range(r->block()));
    d.keyword = NameOf(r->kindName);
    d.name = NameOf(r->recordName);
    static const std::vector<std::string_view> kKinds = {"gpu", "cluster", "model", "plan"};
    const std::string& k = d.keyword.text;
    if (k == "gpu") {
      d.kind = ast::DeclKind::kGpu;
    } else if (k == "cluster") {
      d.kind = ast::DeclKind::kCluster;
    } else if (k == "model") {
      d.kind = ast::DeclKind::kModel;
    } else if (k == "plan") {
      d.kind = ast::DeclKind::kPlan;
    } else {
      Diag diag(DiagKind::kUnknownDeclarationKind, fmt::format("`{}` is not a kind of record", k));
      diag.At(d.keyword.range, "expected `gpu`, `cluster`, `model` or `plan`");
      std::string guess = ast::ClosestName(k, kKinds);
      if (!guess.empty()) diag.Help(fmt::format("did you mean `{} {}`?", guess, d.name.text));
      Report(std::move(diag));
      return;
    }
    if (r->base) {
      auto base = std::make_unique<ast::Expr>();
      base->kind = ast::ExprKind::kPath;
      base->range = Range(r->base);
      base->path = Path(r->base);
      d.base = std::move(base);
    }
    d.body = Block(r->block());
    module->decls.push_back(std::move(d));
  }
}

}  // namespace paraplan::parse_internal
