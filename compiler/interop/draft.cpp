#include "compiler/interop/draft.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "compiler/base/checked.h"
#include "compiler/check/evaluate.h"

namespace paraplan::interop {

void PlanDraft::Set(FieldId field, std::string value, SourceRange origin, std::string source) {
  Erase(field);
  settings_.push_back({std::string(field.path), std::move(value), origin, std::move(source)});
}

const DraftSetting* PlanDraft::FindPath(std::string_view path) const {
  for (const DraftSetting& s : settings_) {
    if (s.path == path) return &s;
  }
  return nullptr;
}

void PlanDraft::Erase(FieldId field) {
  settings_.erase(std::remove_if(settings_.begin(), settings_.end(),
                                 [&](const DraftSetting& s) { return s.path == field.path; }),
                  settings_.end());
}

void PlanDraft::Skip(std::string text, SourceRange range, std::string reason) {
  skipped_.push_back({std::move(text), range, std::move(reason)});
}

void PlanDraft::Unskip(std::string_view text) {
  auto named = [&](const DraftSkip& s) {
    return s.text == text || (s.text.size() > text.size() && s.text.rfind(text, 0) == 0 &&
                              s.text[text.size()] == ' ');
  };
  skipped_.erase(std::remove_if(skipped_.begin(), skipped_.end(), named), skipped_.end());
}

std::optional<int64_t> ParseInteger(std::string_view text) {
  std::string digits;
  for (char c : text) {
    if (c != '_') digits += c;
  }
  if (digits.empty()) return std::nullopt;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec == std::errc() && p == digits.data() + digits.size()) return v;
  // 1e6 or 4096.0 written for an integer.
  auto r = ParseReal(text);
  if (r && std::isfinite(*r) && *r == std::floor(*r) && std::fabs(*r) < 9.0e18) {
    return static_cast<int64_t>(*r);
  }
  return std::nullopt;
}

std::optional<std::string> MoePatternDenseLayers(std::string_view text) {
  static const std::regex kPattern(
      R"(^\(?\s*\[\s*0\s*\]\s*\*\s*(\d+)\s*\+\s*\[\s*1\s*\]\s*\*\s*(\d+)\s*\)?$)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(text.begin(), text.end(), m, kPattern)) return std::nullopt;
  return m[1].str();
}

std::optional<int64_t> MoeListDenseLayers(std::string_view text) {
  std::string t;
  for (char c : text) {
    if (c != ' ') t += c;
  }
  if (t.rfind('[', 0) != 0 || t.back() != ']') return std::nullopt;
  int64_t zeros = 0;
  bool seen_one = false;
  for (size_t i = 1; i + 1 < t.size(); ++i) {
    if (t[i] == ',') continue;
    if (t[i] == '0' && !seen_one) {
      ++zeros;
    } else if (t[i] == '1') {
      seen_one = true;
    } else {
      return std::nullopt;
    }
  }
  return zeros;
}

std::optional<double> ParseReal(std::string_view text) {
  std::string s(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string RealText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Shortest text that reads back to the same double.
  for (int precision = 1; precision <= 17; ++precision) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*g", precision, v);
    if (std::strtod(b, nullptr) == v) {
      std::string t = b;
      // The language needs a digit before an exponent's sign and reads "1e-08" as a real.
      if (t.find_first_of(".e") == std::string::npos) t += ".0";
      return t;
    }
  }
  return buf;
}

std::string QuoteString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

namespace {

// Fields that make a model's shape: an imported model is a stdlib model when all of them agree.
// The others (vocab, seq_len, norm, activation, position, tied_embeddings) become overrides.
constexpr FieldId kShapeFields[] = {
    fields::kModelLayers,        fields::kModelHidden,        fields::kModelFfnHidden,
    fields::kModelHeads,         fields::kModelKvHeads,       fields::kModelHeadDim,
    fields::kModelExperts,       fields::kModelTopk,          fields::kModelMoeFfnHidden,
    fields::kModelSharedExperts, fields::kModelDenseLayers,   fields::kModelQLoraRank,
    fields::kModelKvLoraRank,    fields::kModelQkNopeHeadDim, fields::kModelQkRopeHeadDim,
    fields::kModelVHeadDim,
};

bool IsShapeField(std::string_view path) {
  return std::any_of(std::begin(kShapeFields), std::end(kShapeFields),
                     [&](FieldId f) { return f.path == path; });
}

struct GpuChoice {
  std::string_view name;     // as --gpu takes it
  std::string_view cluster;  // stdlib cluster record
  std::string_view gpu;      // a gpu override (a record of std.gpus), or empty
};

// Every cluster here has 8 GPUs per node (stdlib/clusters.plan), the size a plan takes when the
// file and the command line state none.
constexpr GpuChoice kGpuChoices[] = {
    {"h100", "dgx_h100", ""},      {"h200", "dgx_h200", ""},
    {"h800", "hgx_h800", ""},      {"a100", "dgx_a100", ""},
    {"a100_80gb", "dgx_a100", ""}, {"a100_40gb", "dgx_a100", "a100_40gb"}};
constexpr int64_t kClusterGpusPerNode = 8;

const GpuChoice* ExactGpuChoice(std::string_view name) {
  for (const GpuChoice& c : kGpuChoices) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// The GPU as a file names it ("h100", "A100-80GB", "NVIDIA H100 80GB HBM3").
const GpuChoice* ChooseCluster(std::string_view name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view gpu : {"h100", "h200", "h800"}) {
    if (n.find(gpu) != std::string::npos) return ExactGpuChoice(gpu);
  }
  if (n.find("a100") != std::string::npos) {
    return ExactGpuChoice(n.find("40") != std::string::npos ? "a100_40gb" : "a100");
  }
  return nullptr;
}

struct StdlibModel {
  std::string module;  // "llama" for std.models.llama
  std::string name;
  Plan plan;  // a probe plan holding the evaluated model
};

// Every model record of <stdlib>/models/*.plan, evaluated.
std::vector<StdlibModel> LoadStdlibModels(const std::string& stdlib_dir) {
  std::vector<StdlibModel> out;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(stdlib_dir) / "models", ec)) {
    if (e.path().extension() == ".plan") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const std::regex model_re(R"(^model\s+([A-Za-z_][A-Za-z0-9_]*))");
  for (const fs::path& f : files) {
    std::ifstream in(f);
    std::string line, module = f.stem().string();
    std::vector<std::string> names;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, model_re)) names.push_back(m[1]);
    }
    if (names.empty()) continue;
    std::string text = "import std.models." + module + "\nimport std.clusters\n";
    for (const std::string& n : names) {
      text += "plan probe_" + n + " { model = " + n + "  cluster = dgx_h100 }\n";
    }
    SourceManager sm;
    DiagnosticSink sink;
    LoadOptions load;
    load.stdlib_dir = stdlib_dir;
    auto source = PlanSource::FromText("<stdlib models>", text, load, sm, sink);
    if (!source) continue;
    for (const std::string& n : names) {
      DiagnosticSink s;
      auto plan = source->Evaluate("probe_" + n, {}, EvalOptions{}, s);
      if (plan && !s.has_errors()) out.push_back({module, n, std::move(*plan)});
    }
  }
  return out;
}

// A plan name from a file name: "train_llama3_70b.sh" -> "train_llama3_70b".
std::string PlanNameFromFile(std::string_view buffer_name) {
  std::string stem = std::filesystem::path(std::string(buffer_name)).stem().string();
  std::string out;
  for (char c : stem) {
    out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  }
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "imported_" + out;
  static const std::set<std::string> kKeywords = {"import", "let",  "require", "extends", "true",
                                                  "false",  "auto", "and",     "or",      "not"};
  if (kKeywords.count(out)) out += "_plan";
  return out;
}

class TextWriter {
 public:
  // One line; `origin` maps it back to the user's setting.
  void Line(const std::string& code, const std::string& comment, SourceRange origin) {
    std::string l = code;
    if (!comment.empty()) {
      if (l.size() < 40)
        l.resize(40, ' ');
      else
        l += "  ";
      l += "# " + comment;
    }
    text_ += l + "\n";
    ++line_;
    if (origin.IsValid()) lines_.push_back({line_, origin});
  }
  std::string text_;
  uint32_t line_ = 0;
  std::vector<std::pair<uint32_t, SourceRange>> lines_;
};

std::string Leaf(std::string_view path) { return std::string(path.substr(path.rfind('.') + 1)); }

std::string SourceComment(const DraftSetting& s, const SourceManager& sm) {
  if (!s.origin.IsValid()) return s.source;
  return s.source + " (line " + std::to_string(sm.Position(s.origin.buffer, s.origin.begin).line) +
         ")";
}

// A count from planc's command line replaces the file's.
void SetFromOption(std::vector<DraftSetting>& settings, FieldId field,
                   const std::optional<int64_t>& v, const char* flag) {
  if (!v) return;
  settings.erase(std::remove_if(settings.begin(), settings.end(),
                                [&](const DraftSetting& s) { return s.path == field.path; }),
                 settings.end());
  settings.push_back({std::string(field.path),
                      std::to_string(*v),
                      {},
                      std::string(flag) + " " + std::to_string(*v)});
}

// Writes a draft as plan text: decides the cluster and the model (a stdlib model of the same
// shape, or a record of the file's own), then writes the text and the origins of its lines.
class ImportedPlanWriter {
 public:
  ImportedPlanWriter(const PlanDraft& draft, const ImportOptions& options, uint32_t config_buffer,
                     const SourceManager& sm, DiagnosticSink& sink)
      : draft_(draft),
        options_(options),
        config_buffer_(config_buffer),
        sm_(sm),
        sink_(sink),
        framework_(FrameworkName(draft.kind)),
        file_name_(sm.Name(config_buffer)),
        named_setting_{"model", draft.stdlib_model, draft.stdlib_model_origin,
                       draft.stdlib_model_source} {}

  std::optional<ImportedPlan> Write() {
    ImportedPlan out;
    out.config_buffer = config_buffer_;
    out.plan_name = options_.plan_name.empty() ? PlanNameFromFile(file_name_) : options_.plan_name;
    if (!ChooseGpu()) return std::nullopt;
    CollectSettings();
    if (!CheckWorldSize() || !CheckModelStated()) return std::nullopt;
    stdlib_models_ = LoadStdlibModels(options_.stdlib_dir);
    if (!draft_.stdlib_model.empty() && !ProbeNamedModel()) return std::nullopt;
    if (!named_ && !ProbeModelRecord()) return std::nullopt;
    MatchStdlibModel();
    if (!CheckVocab()) return std::nullopt;
    WriteText(out);
    ReportNotImported();
    return out;
  }

 private:
  // The cluster: the command line wins over the file.
  bool ChooseGpu() {
    std::string gpu = draft_.gpu;
    gpu_comment_ = draft_.gpu_source;
    gpu_origin_ = draft_.gpu_origin;
    if (!options_.gpu.empty()) {
      gpu = options_.gpu;
      gpu_comment_ = "--gpu " + options_.gpu;
      gpu_origin_ = {};
    }
    if (gpu.empty()) {
      gpu = "h100";
      gpu_comment_ = "the file names no GPU: H100 assumed (planc import --gpu NAME)";
    }
    // --gpu is a name of the list; a file's GPU is read as people write it.
    const GpuChoice* cluster = options_.gpu.empty() ? ChooseCluster(gpu) : ExactGpuChoice(gpu);
    if (!cluster) {
      sink_.Report(
          Diag(DiagKind::kConfigBadValue, "no stdlib cluster has the GPU `" + gpu + "`")
              .At(gpu_origin_, "this GPU")
              .Note("the stdlib's clusters hold H100, H200, H800 and A100 (40 or 80 GB) GPUs")
              .Help("pass --gpu " + ImportGpuNamesText()));
      return false;
    }
    cluster_expr_ = std::string(cluster->cluster);
    if (!cluster->gpu.empty()) {
      // The GPU record is std.gpus', which std.clusters does not re-export.
      cluster_imports_ += "import std.gpus\n";
      cluster_expr_ += " { gpu = " + std::string(cluster->gpu) + " }";
    }
    cluster_imports_ += "import std.clusters\n";
    return true;
  }

  // The world, nodes · GPUs per node, in 64 bits: a file's or the command line's counts whose
  // product is past it would wrap in every sum the plan makes.
  bool CheckWorldSize() {
    const DraftSetting* nodes = Find(fields::kClusterNodes);
    const DraftSetting* per_node = Find(fields::kClusterGpusPerNode);
    const std::optional<int64_t> n = nodes ? ParseInteger(nodes->value) : std::nullopt;
    const std::optional<int64_t> g = per_node ? ParseInteger(per_node->value) : kClusterGpusPerNode;
    if (!n || !g || CheckedMul(*n, *g)) return true;  // not a count: the plan's check says so
    const DraftSetting* at = nodes->origin.IsValid() || !per_node ? nodes : per_node;
    Diag d(DiagKind::kConfigBadValue,
           "the cluster's size is out of range: `nodes · gpus_per_node` = " + std::to_string(*n) +
               " · " + std::to_string(*g) + " is past 64 bits");
    d.At(at->origin.IsValid() ? at->origin : SourceRange{config_buffer_, 0, 0}, at->source);
    if (per_node && per_node != at && per_node->origin.IsValid())
      d.Label(per_node->origin, per_node->source);
    d.Help("state the cluster's real size, or pass --nodes N --gpus-per-node G to planc");
    sink_.Report(std::move(d));
    return false;
  }

  // The draft's settings with the command line's counts, and the model's among them.
  void CollectSettings() {
    settings_ = draft_.Settings();
    SetFromOption(settings_, fields::kClusterNodes, options_.nodes, "--nodes");
    SetFromOption(settings_, fields::kClusterGpusPerNode, options_.gpus_per_node,
                  "--gpus-per-node");
    if (!Find(fields::kClusterNodes)) {
      settings_.push_back({std::string(fields::kClusterNodes.path),
                           "1",
                           {},
                           "the file states no node count: 1 assumed (--nodes N)"});
    }
    for (const FieldInfo& f : PlanFields()) {  // in the order of the model's fields
      const DraftSetting* s = f.path.rfind("model.", 0) == 0 ? Find(f.id()) : nullptr;
      if (s) model_settings_.push_back(s);
    }
  }

  // A file that names no model states its shape.
  bool CheckModelStated() {
    if (!draft_.stdlib_model.empty()) return true;
    for (FieldId required :
         {fields::kModelLayers, fields::kModelHidden, fields::kModelHeads, fields::kModelSeqLen}) {
      if (!Find(required)) {
        sink_.Report(
            Diag(DiagKind::kConfigMissing,
                 "`" + std::string(required.path) + "` is not in " + file_name_)
                .At({config_buffer_, 0, 0}, "in this " + framework_ + " configuration")
                .Note("a plan needs the model's layers, hidden size, heads and sequence length")
                .Help("state it in the file, or import a file that names a model flavor"));
        return false;
      }
    }
    return true;
  }

  // The model the file names, with the file's model settings applied to it.
  bool ProbeNamedModel() {
    for (const StdlibModel& m : stdlib_models_) {
      if (m.name == draft_.stdlib_model) named_ = &m;
    }
    if (!named_) {
      sink_.Report(
          Diag(DiagKind::kConfigBadValue, "no stdlib model for " + draft_.stdlib_model_source)
              .At(draft_.stdlib_model_origin)
              .Note("the stdlib's models are in stdlib/models/")
              .Help("state the model's shape in the file instead"));
      return false;
    }
    probe_ = named_->plan;
    for (const DraftSetting* s : model_settings_) {
      std::string error = SetFieldText(*probe_, s->path, s->value);
      if (!error.empty()) {
        sink_.Report(Diag(DiagKind::kConfigBadValue, "`" + s->path + "` " + error).At(s->origin));
        return false;
      }
    }
    return true;
  }

  // The file's model settings as a record, evaluated in a probe plan.
  bool ProbeModelRecord() {
    SourceManager probe_sm;
    DiagnosticSink probe_sink;
    std::string text = cluster_imports_ + "model imported_model {\n";
    for (const DraftSetting* s : model_settings_)
      text += "  " + Leaf(s->path) + " = " + s->value + "\n";
    if (!Find(fields::kModelVocab)) text += "  vocab = 1\n";
    text += "}\nplan probe { model = imported_model  cluster = " + cluster_expr_ + " }\n";
    LoadOptions load;
    load.stdlib_dir = options_.stdlib_dir;
    auto source = PlanSource::FromText("<probe>", text, load, probe_sm, probe_sink);
    if (source) probe_ = source->Evaluate("probe", {}, EvalOptions{}, probe_sink);
    if (probe_ && !probe_sink.has_errors()) return true;
    // A value the language refuses: name the first model setting it could be.
    // The imports, then the record header: model setting k (from 0) is on line k + first.
    const uint32_t first =
        static_cast<uint32_t>(std::count(cluster_imports_.begin(), cluster_imports_.end(), '\n')) +
        2;
    for (const Diagnostic& d : probe_sink.diagnostics()) {
      if (d.level != DiagLevel::kError) continue;
      uint32_t line = probe_sm.Position(d.primary.buffer, d.primary.begin).line;
      SourceRange at;
      if (line >= first && line - first < model_settings_.size())
        at = model_settings_[line - first]->origin;
      sink_.Report(Diag(DiagKind::kConfigBadValue,
                        "this model setting is not a valid plan value: " + d.message)
                       .At(at.IsValid() ? at : SourceRange{config_buffer_, 0, 0}));
      return false;
    }
    sink_.Report(Diag(DiagKind::kConfigBadValue,
                      "the model settings of " + file_name_ + " do not form a model")
                     .At({config_buffer_, 0, 0}));
    return false;
  }

  // Of the stdlib models with the same shape, the one that agrees with most other settings
  // (llama2_70b and llama3_70b share a shape; seq_len and vocab tell them apart).
  void MatchStdlibModel() {
    match_ = named_;
    if (named_) return;
    int best = -1;
    for (const StdlibModel& m : stdlib_models_) {
      bool same = true;
      for (FieldId field : kShapeFields) {
        const FieldInfo& f = field.info();
        if (GetFieldValue(m.plan, f) != GetFieldValue(*probe_, f)) same = false;
      }
      if (!same) continue;
      int agree = 0;
      for (const DraftSetting* s : model_settings_) {
        const FieldInfo* f = FindPlanField(s->path);
        if (f && !IsShapeField(s->path) && GetFieldValue(m.plan, *f) == GetFieldValue(*probe_, *f))
          ++agree;
      }
      if (agree > best) {
        best = agree;
        match_ = &m;
      }
    }
  }

  // A model of the file's own needs its vocabulary from the file.
  bool CheckVocab() {
    if (match_ || Find(fields::kModelVocab)) return true;
    sink_.Report(
        Diag(DiagKind::kConfigMissing, "the vocabulary size is not in " + file_name_ +
                                           " and the model's shape matches no stdlib model")
            .At(Find(fields::kModelLayers)->origin, "a model of this shape")
            .Note("a plan needs `model.vocab`: the embedding and the output layer are sized by it")
            .Help(draft_.vocab_help.empty() ? "state the vocabulary size in the file"
                                            : draft_.vocab_help));
    return false;
  }

  void WriteText(ImportedPlan& out) {
    TextWriter w;
    WriteHeader(w);
    const std::string model_name = out.plan_name + "_model";
    if (!match_) WriteModelRecord(w, model_name);
    w.Line("plan " + out.plan_name + " {", "", {});
    WritePlanModel(w, model_name);
    WritePlanSettings(w);
    w.Line("}", "", {});
    out.text = std::move(w.text_);
    out.line_origins = std::move(w.lines_);
    for (const DraftSetting& s : settings_) {
      if (s.origin.IsValid()) out.field_origins.push_back({s.path, s.origin});
    }
    if (ModelSetting()->origin.IsValid()) {
      out.field_origins.push_back({"model", ModelSetting()->origin});
    }
    if (gpu_origin_.IsValid()) {
      out.field_origins.push_back({"cluster", gpu_origin_});
      out.field_origins.push_back({"cluster.gpu", gpu_origin_});
    }
  }

  // What the plan is made from, the settings not imported, and the imports.
  void WriteHeader(TextWriter& w) const {
    w.Line("# " + file_name_ + ": a " + framework_ +
               " configuration as a plan (planc import --from=" +
               std::string(ToString(draft_.kind)) + ")",
           "", {});
    if (!draft_.Skipped().empty()) {
      w.Line("#", "", {});
      w.Line("# Not imported (no plan field, or not recognised):", "", {});
      for (const DraftSkip& s : draft_.Skipped()) {
        std::string where =
            s.range.IsValid()
                ? "line " + std::to_string(sm_.Position(s.range.buffer, s.range.begin).line) + ": "
                : "";
        w.Line("#   " + where + s.text + "  (" + s.reason + ")", "", {});
      }
    }
    w.Line("", "", {});
    for (size_t at = 0, end; (end = cluster_imports_.find('\n', at)) != std::string::npos;
         at = end + 1) {
      w.Line(cluster_imports_.substr(at, end - at), "", {});
    }
    if (match_) w.Line("import std.models." + match_->module, "", {});
    w.Line("", "", {});
  }

  void WriteModelRecord(TextWriter& w, const std::string& model_name) const {
    w.Line("model " + model_name + " {", "", {});
    for (const DraftSetting* s : model_settings_) {
      w.Line("  " + Leaf(s->path) + " = " + s->value, SourceComment(*s, sm_), s->origin);
    }
    w.Line("}", "", {});
    w.Line("", "", {});
  }

  // The plan's model: the stdlib model with the file's other settings as overrides, or the
  // record written above.
  void WritePlanModel(TextWriter& w, const std::string& model_name) const {
    const DraftSetting* layers = ModelSetting();
    if (!match_) {
      w.Line("  model = " + model_name, "", layers->origin);
      return;
    }
    std::string comment = named_ ? draft_.stdlib_model_source + ": std.models." + match_->module +
                                       "'s " + match_->name
                                 : "the shape of " + layers->source + ", ... is std.models." +
                                       match_->module + "'s " + match_->name;
    if (!Find(fields::kModelVocab)) {
      comment +=
          "; vocab " + std::to_string(match_->plan.model.vocab) + " from it (not in the file)";
    }
    w.Line("  model = " + match_->name, comment, layers->origin);
    for (const DraftSetting* s : model_settings_) {
      if (IsShapeField(s->path)) continue;
      const FieldInfo* f = FindPlanField(s->path);
      if (f && GetFieldValue(match_->plan, *f) == GetFieldValue(*probe_, *f)) continue;
      w.Line("  " + s->path + " = " + s->value, SourceComment(*s, sm_), s->origin);
    }
  }

  // The cluster, the plan's top-level settings, then one block per section.
  void WritePlanSettings(TextWriter& w) const {
    w.Line("  cluster = " + cluster_expr_, gpu_comment_, gpu_origin_);
    for (FieldId path : {FieldId(fields::kClusterNodes), FieldId(fields::kClusterGpusPerNode),
                         FieldId(fields::kFramework), FieldId(fields::kCompile),
                         FieldId(fields::kPrecision), FieldId(fields::kRecompute)}) {
      if (const DraftSetting* s = Find(path)) {
        w.Line("  " + s->path + " = " + s->value, SourceComment(*s, sm_), s->origin);
      }
    }
    for (const char* block : {"mixed_precision", "activations", "fsdp", "moe", "parallel",
                              "pipeline", "optimizer", "batch", "train"}) {
      std::vector<const DraftSetting*> members;
      for (const FieldInfo& f : PlanFields()) {
        if (f.path.rfind(std::string(block) + ".", 0) != 0) continue;
        if (const DraftSetting* s = Find(f.id())) members.push_back(s);
      }
      if (members.empty()) continue;
      w.Line("  " + std::string(block) + " {", "", {});
      for (const DraftSetting* s : members) {
        w.Line("    " + Leaf(s->path) + " = " + s->value, SourceComment(*s, sm_), s->origin);
      }
      w.Line("  }", "", {});
    }
  }

  // One note lists every setting of the file that has no plan field.
  void ReportNotImported() {
    const std::vector<DraftSkip>& skipped = draft_.Skipped();
    if (skipped.empty()) return;
    const bool one = skipped.size() == 1;
    Diag d(DiagKind::kConfigNotImported, std::to_string(skipped.size()) + " setting" +
                                             (one ? "" : "s") + " of " + file_name_ +
                                             (one ? " has" : " have") + " no plan field and " +
                                             (one ? "is" : "are") + " not imported");
    d.At(skipped.front().range, skipped.front().reason);
    for (size_t i = 1; i < skipped.size(); ++i) d.Label(skipped[i].range, skipped[i].reason);
    d.Note("the written plan lists them in its first comment; nothing else was left out");
    sink_.Report(std::move(d));
  }

  const DraftSetting* Find(FieldId field) const {
    for (const DraftSetting& s : settings_) {
      if (s.path == field.path) return &s;
    }
    return nullptr;
  }

  // The setting the plan's model line points at: the layers, or the model the file names.
  const DraftSetting* ModelSetting() const {
    const DraftSetting* layers = Find(fields::kModelLayers);
    return named_ && !layers ? &named_setting_ : layers;
  }

  const PlanDraft& draft_;
  const ImportOptions& options_;
  uint32_t config_buffer_;
  const SourceManager& sm_;
  DiagnosticSink& sink_;
  const std::string framework_;
  const std::string file_name_;
  const DraftSetting named_setting_;  // the model the file names, as a setting
  std::string gpu_comment_;
  SourceRange gpu_origin_;
  std::string cluster_expr_;
  std::string cluster_imports_;  // the imports cluster_expr_ needs, one per line
  std::vector<DraftSetting> settings_;
  std::vector<const DraftSetting*> model_settings_;  // into settings_
  std::vector<StdlibModel> stdlib_models_;
  const StdlibModel* named_ = nullptr;  // the model the file names
  const StdlibModel* match_ = nullptr;  // the stdlib model the plan uses
  std::optional<Plan> probe_;           // the file's model, evaluated
};

}  // namespace

std::optional<ImportedPlan> WriteImportedPlan(const PlanDraft& draft, const ImportOptions& options,
                                              uint32_t config_buffer, SourceManager& sm,
                                              DiagnosticSink& sink) {
  return ImportedPlanWriter(draft, options, config_buffer, sm, sink).Write();
}

}  // namespace paraplan::interop

namespace paraplan {

std::span<const std::string_view> ImportGpuNames() {
  static constexpr auto kNames = [] {
    std::array<std::string_view, std::size(interop::kGpuChoices)> names{};
    for (size_t i = 0; i < names.size(); ++i) names[i] = interop::kGpuChoices[i].name;
    return names;
  }();
  return kNames;
}

std::string ImportGpuNamesText() {
  std::string list;
  const std::span<const std::string_view> names = ImportGpuNames();
  for (size_t i = 0; i < names.size(); ++i) {
    list += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
    list += names[i];
  }
  return list;
}

void ApplyImportedOrigins(const ImportedPlan& imported, uint32_t plan_buffer,
                          const SourceManager& sm, Plan& plan) {
  // Whole-plan facts (memory per stage, ...) point at the configuration's first setting.
  if (plan.declaration.buffer == plan_buffer) {
    SourceRange first;
    for (const auto& [path, range] : imported.field_origins) {
      if (range.buffer == imported.config_buffer && (!first.IsValid() || range.begin < first.begin))
        first = range;
    }
    if (first.IsValid()) plan.declaration = first;
  }
  for (const auto& [path, range] : imported.field_origins) {
    FieldOrigin* found = plan.origins.Mutable(path);
    if (!found) continue;  // the importer's tables name canonical paths only
    FieldOrigin& o = *found;
    // Only values written in the generated text (not --set, not defaults of the language).
    if (o.range.buffer != plan_buffer &&
        !(o.kind == OriginKind::kStdlib && path.rfind("model", 0) == 0)) {
      continue;
    }
    o.kind = OriginKind::kFile;
    o.range = range;
  }
}

Diagnostic RemapImportedDiagnostic(const ImportedPlan& imported, uint32_t plan_buffer,
                                   const SourceManager& sm, Diagnostic d) {
  auto remap = [&](SourceRange& r) {
    if (r.buffer != plan_buffer) return;
    uint32_t line = sm.Position(r.buffer, r.begin).line;
    for (const auto& [l, origin] : imported.line_origins) {
      if (l == line) {
        r = origin;
        return;
      }
    }
  };
  remap(d.primary);
  for (DiagLabel& l : d.labels) remap(l.range);
  return d;
}

}  // namespace paraplan
