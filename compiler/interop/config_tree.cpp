#include "compiler/interop/config_tree.h"

#include <llvm/Support/Error.h>
#include <llvm/Support/JSON.h>
#include <toml++/toml.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <regex>

namespace paraplan::interop {
namespace {

// A position as SourceManager spells it: buffer, line, column.
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
uint32_t Offset(const SourceManager& sm, uint32_t buffer, uint32_t line, uint32_t column) {
  std::string_view text = sm.Text(buffer);
  uint32_t l = 1, i = 0;
  while (i < text.size() && l < line) {
    if (text[i++] == '\n') ++l;
  }
  return std::min<uint32_t>(i + (column > 0 ? column - 1 : 0), text.size());
}

uint32_t LineEnd(const SourceManager& sm, uint32_t buffer, uint32_t offset) {
  std::string_view text = sm.Text(buffer);
  uint32_t i = offset;
  while (i < text.size() && text[i] != '\n' && text[i] != '\r') ++i;
  // Not the trailing comment.
  std::string_view line = text.substr(offset, i - offset);
  size_t hash = line.find(" #");
  if (hash != std::string_view::npos) i = offset + static_cast<uint32_t>(hash);
  while (i > offset && (text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == ',')) --i;
  return i;
}

std::string TypeName(ValueType t) {
  switch (t) {
    case ValueType::kInt:
      return "an integer";
    case ValueType::kReal:
      return "a real number";
    case ValueType::kBool:
      return "a boolean";
    case ValueType::kString:
      return "a string";
    case ValueType::kList:
      return "a list";
    case ValueType::kNull:
      return "null";
    case ValueType::kTable:
      return "a table";
  }
  return "?";
}

// YAML scalars carry no type: read them as YAML 1.2's core schema does.
ValueType ScalarType(const std::string& s) {
  static const std::regex kIntRe(R"(^[-+]?[0-9][0-9_]*$)");
  static const std::regex kRealRe(R"(^[-+]?([0-9][0-9_]*)?\.?[0-9]*([eE][-+]?[0-9]+)?$)");
  if (s == "true" || s == "false" || s == "True" || s == "False") return ValueType::kBool;
  if (s == "null" || s == "~" || s.empty()) return ValueType::kNull;
  if (std::regex_match(s, kIntRe)) return ValueType::kInt;
  if (std::regex_match(s, kRealRe) && s.find_first_of("0123456789") != std::string::npos) {
    return ValueType::kReal;
  }
  return ValueType::kString;
}

// The entry of a key whose value is a table: its keys follow it as entries of their own.
ConfigEntry TableEntry(ConfigEntry e) {
  e.type = ValueType::kTable;
  e.text = "{...}";
  return e;
}

void FlattenToml(const toml::table& table, const std::string& prefix, const SourceManager& sm,
                 uint32_t buffer, std::vector<ConfigEntry>& out) {
  for (const auto& [k, node] : table) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    ConfigEntry e;
    e.key = key;
    const auto& src = k.source().begin ? k.source() : node.source();
    uint32_t begin = Offset(sm, buffer, src.begin.line, src.begin.column);
    e.range = {buffer, begin, LineEnd(sm, buffer, begin)};
    if (const toml::table* t = node.as_table()) {
      out.push_back(TableEntry(std::move(e)));
      FlattenToml(*t, key, sm, buffer, out);
      continue;
    }
    if (auto v = node.as_integer()) {
      e.type = ValueType::kInt;
      e.text = std::to_string(v->get());
    } else if (auto r = node.as_floating_point()) {
      e.type = ValueType::kReal;
      e.text = RealText(r->get());
    } else if (auto b = node.as_boolean()) {
      e.type = ValueType::kBool;
      e.text = b->get() ? "true" : "false";
    } else if (auto s = node.as_string()) {
      e.type = ValueType::kString;
      e.text = s->get();
    } else if (auto a = node.as_array()) {
      e.type = ValueType::kList;
      for (const auto& item : *a) {
        std::string t;
        if (auto is = item.as_string())
          t = is->get();
        else if (auto ii = item.as_integer())
          t = std::to_string(ii->get());
        else if (auto ir = item.as_floating_point())
          t = RealText(ir->get());
        else if (auto ib = item.as_boolean())
          t = ib->get() ? "true" : "false";
        e.items.push_back(t);
        e.text += (e.text.empty() ? "" : ", ") + t;
      }
    } else {
      e.type = ValueType::kNull;
    }
    out.push_back(std::move(e));
  }
}

void FlattenYaml(const YAML::Node& node, const std::string& prefix, uint32_t buffer,
                 const SourceManager& sm, std::vector<ConfigEntry>& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string k = it->first.Scalar();
    std::string key = prefix.empty() ? k : prefix + "." + k;
    const YAML::Node& v = it->second;
    YAML::Mark m = it->first.Mark();
    uint32_t begin = m.pos >= 0 ? static_cast<uint32_t>(m.pos) : 0;
    ConfigEntry e;
    e.key = key;
    e.range = {buffer, begin, LineEnd(sm, buffer, begin)};
    if (v.IsMap()) {
      out.push_back(TableEntry(std::move(e)));
      FlattenYaml(v, key, buffer, sm, out);
      continue;
    }
    if (v.IsSequence()) {
      e.type = ValueType::kList;
      bool lists = true;
      for (const auto& item : v) {
        std::string t = item.IsScalar() ? item.Scalar() : "...";
        e.items.push_back(t);
        e.text += (e.text.empty() ? "" : ", ") + t;
        lists = lists && item.IsSequence();
        if (!lists) continue;
        std::vector<std::string>& inner = e.nested.emplace_back();
        for (const auto& name : item) {
          inner.push_back(name.IsScalar() ? name.Scalar() : "...");
        }
      }
      if (!lists) e.nested.clear();
    } else if (v.IsScalar()) {
      e.text = v.Scalar();
      // A quoted scalar is a string ("2" is not 2).
      e.type = v.Tag() == "!" ? ValueType::kString : ScalarType(e.text);
    } else {
      e.type = ValueType::kNull;
    }
    out.push_back(std::move(e));
  }
}

// JSON keys' positions: LLVM's parser keeps none, so each key is found in the text after its
// parent's position (keys of one object are in order of appearance there).
void FlattenJson(const llvm::json::Object& object, const std::string& prefix, uint32_t from,
                 uint32_t buffer, const SourceManager& sm, std::vector<ConfigEntry>& out) {
  std::string_view text = sm.Text(buffer);
  std::vector<std::pair<uint32_t, std::string>> keys;
  for (const auto& kv : object) {
    std::string quoted = "\"" + std::string(kv.first.str()) + "\"";
    size_t at = text.find(quoted, from);
    keys.push_back(
        {at == std::string_view::npos ? from : static_cast<uint32_t>(at), kv.first.str()});
  }
  std::sort(keys.begin(), keys.end());
  for (const auto& [at, k] : keys) {
    const llvm::json::Value* v = object.get(k);
    std::string key = prefix.empty() ? k : prefix + "." + k;
    ConfigEntry e;
    e.key = key;
    e.range = {buffer, at, LineEnd(sm, buffer, at)};
    if (const llvm::json::Object* o = v->getAsObject()) {
      out.push_back(TableEntry(std::move(e)));
      FlattenJson(*o, key, at, buffer, sm, out);
      continue;
    }
    if (auto i = v->getAsInteger()) {
      e.type = ValueType::kInt;
      e.text = std::to_string(*i);
    } else if (auto d = v->getAsNumber()) {
      e.type = ValueType::kReal;
      e.text = RealText(*d);
    } else if (auto b = v->getAsBoolean()) {
      e.type = ValueType::kBool;
      e.text = *b ? "true" : "false";
    } else if (auto s = v->getAsString()) {
      e.type = ValueType::kString;
      e.text = s->str();
    } else if (const llvm::json::Array* a = v->getAsArray()) {
      e.type = ValueType::kList;
      for (const llvm::json::Value& item : *a) {
        std::string t;
        if (auto n = item.getAsNumber()) t = RealText(*n);
        if (auto n = item.getAsInteger()) t = std::to_string(*n);
        if (auto s = item.getAsString()) t = s->str();
        e.items.push_back(t);
        e.text += (e.text.empty() ? "" : ", ") + t;
      }
    } else {
      e.type = ValueType::kNull;
    }
    out.push_back(std::move(e));
  }
}

void SyntaxError(const SourceManager& sm, uint32_t buffer, uint32_t line, uint32_t column,
                 const std::string& format, const std::string& message, DiagnosticSink& sink) {
  uint32_t at = Offset(sm, buffer, line, column);
  uint32_t end = std::min<uint32_t>(at + 1, static_cast<uint32_t>(sm.Text(buffer).size()));
  sink.Report(Diag(DiagKind::kConfigSyntax, "this is not valid " + format + ": " + message)
                  .At({buffer, at, end}, "the parser stopped here"));
}

}  // namespace

std::optional<std::vector<ConfigEntry>> ReadToml(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink) {
  std::vector<ConfigEntry> out;
  try {
    toml::table table = toml::parse(sm.Text(buffer), std::string_view(sm.Name(buffer)));
    FlattenToml(table, "", sm, buffer, out);
    // toml++ keeps keys sorted; report them in the order of the file.
    std::stable_sort(out.begin(), out.end(), [](const ConfigEntry& a, const ConfigEntry& b) {
      return a.range.begin < b.range.begin;
    });
  } catch (const toml::parse_error& e) {
    SyntaxError(sm, buffer, e.source().begin.line, e.source().begin.column, "TOML",
                std::string(e.description()), sink);
    return std::nullopt;
  }
  return out;
}

std::optional<std::vector<ConfigEntry>> ReadYaml(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink) {
  std::vector<ConfigEntry> out;
  try {
    YAML::Node root = YAML::Load(std::string(sm.Text(buffer)));
    if (!root.IsMap()) {
      sink.Report(Diag(DiagKind::kConfigSyntax, "a configuration must be a YAML mapping of keys")
                      .At({buffer, 0, 0}));
      return std::nullopt;
    }
    FlattenYaml(root, "", buffer, sm, out);
  } catch (const YAML::Exception& e) {
    SyntaxError(sm, buffer, static_cast<uint32_t>(e.mark.line + 1),
                static_cast<uint32_t>(e.mark.column + 1), "YAML", e.msg, sink);
    return std::nullopt;
  }
  return out;
}

std::optional<std::vector<ConfigEntry>> ReadJson(const SourceManager& sm, uint32_t buffer,
                                                 DiagnosticSink& sink) {
  auto value = llvm::json::parse(sm.Text(buffer));
  if (!value) {
    std::string message = llvm::toString(value.takeError());
    // "[3:5, byte=20]: Expected , or }"
    uint32_t line = 1, column = 1;
    std::smatch m;
    if (std::regex_search(message, m, std::regex(R"(\[(\d+):(\d+), byte=\d+\]:\s*(.*))"))) {
      line = static_cast<uint32_t>(std::stoul(m[1]));
      column = static_cast<uint32_t>(std::stoul(m[2]));
      message = m[3];
    }
    SyntaxError(sm, buffer, line, column, "JSON", message, sink);
    return std::nullopt;
  }
  const llvm::json::Object* root = value->getAsObject();
  if (!root) {
    sink.Report(Diag(DiagKind::kConfigSyntax, "a DeepSpeed configuration must be a JSON object")
                    .At({buffer, 0, 0}));
    return std::nullopt;
  }
  std::vector<ConfigEntry> out;
  FlattenJson(*root, "", 0, buffer, sm, out);
  return out;
}

const ConfigEntry* FindEntry(std::span<const ConfigEntry> entries, std::string_view key) {
  const ConfigEntry* found = nullptr;
  for (const ConfigEntry& e : entries) {
    if (e.key == key) found = &e;
  }
  return found;
}

// Spans of four different element types (clang-tidy 14 takes them for one).
// NOLINTNEXTLINE(bugprone-easily-swappable-parameters)
bool ApplyRows(std::span<const ConfigEntry> entries, std::span<const SettingRow> rows,
               std::span<const SkippedRow> skipped, std::span<const std::string_view> handled,
               PlanDraft& draft, DiagnosticSink& sink) {
  bool ok = true;
  for (const ConfigEntry& e : entries) {
    if (std::find(handled.begin(), handled.end(), e.key) != handled.end()) continue;
    if (e.type == ValueType::kNull) continue;  // null: the framework's default, nothing set
    const std::string source =
        e.key + " = " + (e.type == ValueType::kList ? "[" + e.text + "]" : e.text);
    const SettingRow* row = FindRow(rows, e.key);
    if (!row && e.type == ValueType::kTable) continue;  // a section: its keys are listed
    if (!row) {
      const SkippedRow* s = FindSkipped(skipped, e.key);
      draft.Skip(source, e.range, s ? std::string(s->reason) : "not recognised by planc");
      continue;
    }
    ValueType want = ValueType::kString;
    switch (row->convert) {
      case Convert::kInt:
        want = ValueType::kInt;
        break;
      case Convert::kReal:
        want = ValueType::kReal;
        break;
      case Convert::kSwitch:
        want = ValueType::kBool;
        break;
      case Convert::kString:
      case Convert::kEnum:
        want = ValueType::kString;
        break;
    }
    bool type_ok = e.type == want || (want == ValueType::kReal && e.type == ValueType::kInt) ||
                   (row->convert == Convert::kEnum &&
                    (e.type == ValueType::kInt || e.type == ValueType::kBool));
    if (!type_ok) {
      sink.Report(
          Diag(DiagKind::kConfigBadValue,
               "`" + e.key + "` expects " + TypeName(want) + ", got " + TypeName(e.type) +
                   (e.text.empty() || e.type == ValueType::kTable ? "" : " (" + e.text + ")"))
              .At(e.range));
      ok = false;
      continue;
    }
    std::string error;
    auto v = ConvertSetting(*row, e.text, &error);
    if (!v) {
      if (!error.empty()) {
        sink.Report(Diag(DiagKind::kConfigBadValue, "`" + e.key + "` " + error).At(e.range));
        ok = false;
      }
      continue;
    }
    draft.Set(row->path, *v, e.range, source);
  }
  return ok;
}

}  // namespace paraplan::interop
